"""Retry and dead letters on both test brokers: a retry topic holding anything
any producer wrote never stops a consumer, before and after a restart; after a
mixed run every counter equals what the broker's retry and dead-letter topics
received."""

from __future__ import annotations

import asyncio
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pulsar = pytest.importorskip("pulsar")

import nacktracker  # noqa: E402
from test_consumer_letters import WORST_VALUES, letter_call_pairs, property_dicts  # noqa: E402

SHARED = pulsar.ConsumerType.Shared
EARLIEST = pulsar.InitialPosition.Earliest

#: Property dicts as any producer may write them (the broker-less tests' strategy), less a DELAY_TIME the
#: consumer can read: such a copy is held until its due time (the good retry below stands for it), every
#: other one surfaces at once. Keys the client cannot send (empty) left out.
surfacing_property_dicts = property_dicts.map(lambda d: {k: v for k, v in d.items() if k and not (
    k == "DELAY_TIME" and re.fullmatch("[0-9]+", v))})


async def read_topic(client, pumps, topic: str, n: int, timeout_s: float = 10.0, consumer_type=SHARED) -> list:
    """The first ``n`` messages of ``topic`` (a plain consumer from the earliest, pumped: never a
    cancelled receive), then a check that no more come. (An Exclusive ``consumer_type`` reads a retry
    letter before its ``deliver_after``: the broker delays deliveries to Shared subscriptions only.)"""
    pump = pumps(await client.subscribe(topic, "check", consumer_type=consumer_type, initial_position=EARLIEST))
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


@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(drawn=st.lists(surfacing_property_dicts, min_size=30, max_size=30))
async def test_the_retry_topics_worst_never_stops_a_consumer_before_or_after_a_restart(client, topic, drawn):
    """The worst values as DELAY_TIME and RECONSUMETIMES, then 30 property dicts drawn by hypothesis, on the
    retry topic ahead of a good retry and a good message: the good ones are delivered, the bad ones surface;
    the next consumer (the bad ones were not acknowledged) gets them again and keeps going too. Each
    example on a topic of its own."""
    t = topic("worst")
    options = dict(enable_retry=True, max_redeliveries=3, retry_lead_ms=0, initial_position=EARLIEST)
    consumer = await nacktracker.subscribe(client, t, "sub", **options)
    retry = consumer.options.retry_letter_topic
    bad = await client.create_producer(retry, batching_enabled=False)
    good = await client.create_producer(t, batching_enabled=False)
    sent = []
    try:
        for i, value in enumerate(WORST_VALUES):
            for props in ({"DELAY_TIME": value, "RECONSUMETIMES": "1"}, {"RECONSUMETIMES": value}):
                await bad.send(b"bad-%d-%d" % (i, len(sent)), properties=props)
                sent.append(props)
        for i, props in enumerate(drawn):
            await bad.send(b"drawn-%d" % i, properties=props)
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
    until their last delivery, a reconsume of a retry copy whose RECONSUMETIMES cannot be read: each
    counter, in stats() and as the OpenTelemetry counter an operator reads, against the retry and
    dead-letter topics' messages; the metrics' pulsar.topic is the topic subscribed to. Shared: the nacks
    are counted from the broker's redelivery count (a local redelivery leaves it as it was)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from nacktracker.metrics import INSTRUMENTS, instrument_consumer

    t = topic("mixed")
    consumer = await nacktracker.subscribe(client, t, "sub", consumer_type=SHARED,
                                           enable_retry=True, max_redeliveries=2,
                                           ack_timeout_ms=300, retry_lead_ms=0, initial_position=EARLIEST)
    reader = InMemoryMetricReader()
    registration = instrument_consumer(consumer, meter_provider=MeterProvider(metric_readers=[reader]))
    producer = await client.create_producer(t, batching_enabled=False)
    foreign = await client.create_producer(consumer.options.retry_letter_topic, batching_enabled=False)
    # the client names a consumer of the topic and its retry topic ...-TopicsConsumerFakeName-<random>: the
    # metrics' pulsar.topic and the snapshot's owner are the topic subscribed to
    assert consumer.topics == [t] and consumer.topic() != t
    groups = ("nack", "dead", "retry", "slow")
    n = 5
    try:
        for group in groups:
            for i in range(n):
                await producer.send(b"%s-%d" % (group.encode(), i))
        await foreign.send(b"bad-0", properties={"RECONSUMETIMES": "\u00b2"})  # another client's unreadable count
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
            elif group in ("retry", "bad"):
                await consumer.reconsume_later(m, delay_ms=100)
            else:  # "slow": never settled, its ack timeouts pass
                slow_deliveries += 1
        stats = consumer.stats()
        exported = {m.name: m.data.data_points for rm in reader.get_metrics_data().resource_metrics
                    for sm in rm.scope_metrics for m in sm.metrics}
    finally:
        registration.close()
        await producer.close()
        await foreign.close()
        await consumer.close()
    dead = await read_topic(client, pumps, f"{t}-sub-DLQ", 4 * n + 1)
    retry_topic = await read_topic(client, pumps, consumer.options.retry_letter_topic, 2 * n + 1)
    retries = [m for m in retry_topic if not m.data().startswith(b"bad")]  # the consumer's own letters
    by_group = {g: sum(1 for m in dead if m.data().startswith(g.encode())) for g in groups + ("bad",)}
    assert by_group == {"nack": n, "dead": n, "retry": n, "slow": n, "bad": 1}
    assert stats["dead_letters_bad_property"] == by_group["bad"]
    # every counter an operator reads is the stat it names, on one series: the topic subscribed to
    checked = []
    for spec in INSTRUMENTS:
        if spec.name in exported and isinstance(stats.get(spec.stat), int):
            [point] = exported[spec.name]
            assert point.value == stats[spec.stat], spec.name
            assert point.attributes["pulsar.topic"] == t, point.attributes
            checked.append(spec.name.removeprefix("nacktracker."))
    assert {"nacks", "ack_timeout.redeliveries", "retry_letters", "dead_lettered", "dead_letters.max_redeliveries",
            "dead_letters.dead_letter_call", "dead_letters.ack_timeout", "dead_letters.bad_property"} <= set(checked)
    assert stats["dead_letters_max_redeliveries"] == by_group["nack"] + by_group["retry"]
    assert stats["reconsume_dead_lettered"] == by_group["retry"]
    assert stats["dead_letters_dead_letter"] == by_group["dead"]
    assert stats["dead_letters_ack_timeout"] == by_group["slow"]
    assert stats["dead_lettered"] == len(dead) == stats["dead_letter_published"]
    assert stats["retry_letters"] == len(retries) == 2 * n
    assert stats["nacks"] == nacks == 2 * n
    # each slow message's ack timeout redelivered it until its last delivery (max_redeliveries 2)
    assert stats["ack_timeout_redeliveries"] == slow_deliveries - n == 2 * n


async def test_1000_concurrent_letter_call_pairs_on_1000_messages_publish_exactly_1000_letters(client, topic, pumps):
    """1,000 messages, on each two letter calls at once (dead_letter twice, reconsume_later then dead_letter,
    dead_letter then reconsume_later, reconsume_later twice), all 2,000 calls gathered: each first call
    publishes, each second is refused as in flight, and the retry and dead-letter topics received exactly
    one letter per message, 1,000 in all (read by a consumer of their own)."""
    t = topic("pairs")
    n = 1000
    consumer = await nacktracker.subscribe(client, t, "sub", enable_retry=True, max_redeliveries=3,
                                           retry_lead_ms=0, initial_position=EARLIEST)
    producer = await client.create_producer(t, batching_enabled=False)
    try:
        await asyncio.gather(*[producer.send(b"%d" % i) for i in range(n)])
        msgs = [await consumer.receive(timeout_ms=10_000) for _ in range(n)]
        assert sorted(int(m.data()) for m in msgs) == list(range(n))
        await letter_call_pairs(consumer, msgs)
        stats = consumer.stats()
        retry_topic = consumer.options.retry_letter_topic
    finally:
        await producer.close()
        await consumer.close()
    exclusive = pulsar.ConsumerType.Exclusive  # the 60 s retries too, before their deliver_after
    retries = await read_topic(client, pumps, retry_topic, n // 2, consumer_type=exclusive)
    dead = await read_topic(client, pumps, f"{t}-sub-DLQ", n // 2, consumer_type=exclusive)
    letters = sorted(int(m.data()) for m in retries + dead)
    assert len(retries) + len(dead) == n and letters == list(range(n))  # one letter per message, none twice
    assert sorted(int(m.data()) % 4 for m in retries) == sorted([1, 3] * (n // 4))  # the first call decided
    assert stats["retry_letters"] == n // 2 and stats["dead_letters_dead_letter"] == n // 2
