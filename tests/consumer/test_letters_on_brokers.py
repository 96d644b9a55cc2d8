"""Retry and dead letters on both test brokers: a retry topic holding anything
any producer wrote never stops a consumer, before and after a restart; after a
mixed run every counter equals what the broker's retry and dead-letter topics
received."""

from __future__ import annotations

import asyncio
import random

import pytest

pulsar = pytest.importorskip("pulsar")

import nacktracker  # noqa: E402
from test_consumer_letters import WORST_VALUES  # noqa: E402

SHARED = pulsar.ConsumerType.Shared
EARLIEST = pulsar.InitialPosition.Earliest


def random_properties(rng: random.Random) -> dict[str, str]:
    """A property dict as a careless producer might write one: the retry properties' names with any text."""
    names = ["RECONSUMETIMES", "DELAY_TIME", "REAL_TOPIC", "ORIGIN_MESSAGE_ID", "REAL_SUBSCRIPTION", "x"]
    alphabet = "0123456789-:;²٣ abcxyz\u00e9\u4e2d"
    return {rng.choice(names): "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 25)))
            for _ in range(rng.randrange(1, 4))}


async def read_topic(client, pumps, topic: str, n: int, timeout_s: float = 10.0) -> list:
    """The first ``n`` messages of ``topic`` (a plain consumer from the earliest, pumped: never a
    cancelled receive), then a check that no more come."""
    pump = pumps(await client.subscribe(topic, "check", consumer_type=SHARED, initial_position=EARLIEST))
    out = [(await pump.get(timeout_s))[1] for _ in range(n)]
    with pytest.raises(asyncio.TimeoutError):
        await pump.get(1.0)
    return out


async def receive_all(consumer, quiet_ms: int = 1500) -> list:
    out = []
    while True:
        try:
            out.append(await consumer.receive(timeout_ms=quiet_ms))
        except pulsar.Timeout:
            return out


async def test_the_retry_topics_worst_never_stops_a_consumer_before_or_after_a_restart(client, topic):
    t = topic("worst")
    options = dict(enable_retry=True, max_redeliveries=3, retry_lead_ms=0, initial_position=EARLIEST)
    consumer = await nacktracker.subscribe(client, t, "sub", **options)
    retry = consumer.options.retry_letter_topic
    bad = await client.create_producer(retry, batching_enabled=False)
    good = await client.create_producer(t, batching_enabled=False)
    rng = random.Random(38)
    sent = []
    try:
        for i, value in enumerate(WORST_VALUES):
            for props in ({"DELAY_TIME": value, "RECONSUMETIMES": "1"}, {"RECONSUMETIMES": value}):
                await bad.send(b"bad-%d-%d" % (i, len(sent)), properties=props)
                sent.append(props)
        for i in range(30):
            await bad.send(b"rand-%d" % i, properties=random_properties(rng))
        await bad.send(b"good-retry", properties={"DELAY_TIME": "300", "RECONSUMETIMES": "1"})
        await good.send(b"good")
        got = await receive_all(consumer)
        names = sorted(m.data() for m in got)
        assert b"good" in names and b"good-retry" in names and len(names) == len(sent) + 30 + 2
        for m in got:
            if m.data().startswith(b"good"):
                await consumer.acknowledge(m)
        assert consumer.stats()["bad_properties"] >= len(WORST_VALUES)
        await consumer.close()  # the bad ones unacknowledged: the broker sends them to the next consumer

        again = await nacktracker.subscribe(client, t, "sub", **options)
        try:
            await good.send(b"after")
            got = await receive_all(again)
            names = sorted(m.data() for m in got)
            assert b"after" in names and len(names) == len(sent) + 30 + 1, names
            # and each one can be settled: a reconsume either retries it or dead-letters it naming the property
            for m in got:
                if m.data() != b"after":
                    await again.reconsume_later(m, delay_ms=60_000)
            stats = again.stats()
            assert stats["retry_letters"] + stats["dead_letters_bad_property"] + stats[
                "dead_letters_max_redeliveries"] == len(got) - 1
        finally:
            await again.close()
    finally:
        await bad.close()
        await good.close()


async def test_after_a_mixed_run_every_counter_equals_what_the_brokers_topics_received(client, topic, pumps):
    """Nacks until max_redeliveries, dead_letter() calls, reconsumes until they run out, ack timeouts
    until their last delivery: each counter against the retry and dead-letter topics' messages. Shared: the
    nacks are counted from the broker's redelivery count (a local redelivery leaves it as it was)."""
    t = topic("mixed")
    consumer = await nacktracker.subscribe(client, t, "sub", consumer_type=SHARED,
                                           enable_retry=True, max_redeliveries=2,
                                           ack_timeout_ms=300, retry_lead_ms=0, initial_position=EARLIEST)
    producer = await client.create_producer(t, batching_enabled=False)
    # the client names a consumer of the topic and its retry topic ...-TopicsConsumerFakeName-<random>: the
    # metrics' pulsar.topic and the snapshot's owner are the topic subscribed to
    assert consumer.topics == [t] and consumer.topic() != t
    groups = ("nack", "dead", "retry", "slow")
    n = 5
    try:
        for group in groups:
            for i in range(n):
                await producer.send(b"%s-%d" % (group.encode(), i))
        nacks = slow_deliveries = 0
        while True:
            try:
                m = await consumer.receive(timeout_ms=3000)
            except pulsar.Timeout:
                break
            group = m.data().split(b"-")[0].decode()
            if group == "nack":
                nacks += m.redelivery_count() < 2  # the third delivery's nack dead-letters it at once
                await consumer.negative_acknowledge(m, delay_ms=100)
            elif group == "dead":
                await consumer.dead_letter(m, reason="poison")
            elif group == "retry":
                await consumer.reconsume_later(m, delay_ms=100)
            else:  # "slow": never settled, its ack timeouts pass
                slow_deliveries += 1
        stats = consumer.stats()
    finally:
        await producer.close()
        await consumer.close()
    dead = await read_topic(client, pumps, f"{t}-sub-DLQ", 4 * n)
    retries = await read_topic(client, pumps, consumer.options.retry_letter_topic, 2 * n)
    by_group = {g: sum(1 for m in dead if m.data().startswith(g.encode())) for g in groups}
    assert by_group == {"nack": n, "dead": n, "retry": n, "slow": n}
    assert stats["dead_letters_max_redeliveries"] == by_group["nack"] + by_group["retry"]
    assert stats["reconsume_dead_lettered"] == by_group["retry"]
    assert stats["dead_letters_dead_letter"] == by_group["dead"]
    assert stats["dead_letters_ack_timeout"] == by_group["slow"]
    assert stats["dead_lettered"] == len(dead) == stats["dead_letter_published"]
    assert stats["retry_letters"] == len(retries) == 2 * n
    assert stats["nacks"] == nacks == 2 * n
    # each slow message's ack timeout redelivered it until its last delivery (max_redeliveries 2)
    assert stats["ack_timeout_redeliveries"] == slow_deliveries - n == 2 * n
