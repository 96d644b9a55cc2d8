"""Code written for the plain ``pulsar.asyncio`` consumer keeps working when only ``subscribe``
changes: every form of call it accepts (a Message or its ``message_id()``), from every topic form
(plain, partitioned, a list, a pattern) and subscription type, the client's own options
(``unacked_messages_timeout_ms``), and ``batch_receive`` with the client's policy. On both brokers
where pulsar-lite can do it; each skip says why."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

pulsar = pytest.importorskip("pulsar")
import pulsar.asyncio  # noqa: E402

import nacktracker  # noqa: E402
from nacktracker.consumer import NotReceivedError, ReceiveTimeout  # noqa: E402

pytestmark = pytest.mark.broker

Types = pulsar.ConsumerType
N = 10


def partitioned(session_broker, broker_kind, t: str, partitions: int = 2) -> str:
    if broker_kind != "apache" or session_broker is None:
        pytest.skip("partitioned topics need Apache Pulsar's admin API (pulsar-lite has none)")
    session_broker.admin("PUT", f"/admin/v2/persistent/{t.removeprefix('persistent://')}/partitions", partitions)
    return t


def needs_redeliver_all(broker_kind, kind) -> None:
    if kind in (Types.Exclusive, Types.Failover) and broker_kind == "lite":
        pytest.skip("on Exclusive/Failover a nack by id asks the broker to resend what is unacknowledged, "
                    "which pulsar-lite ignores")


async def publish(client, topics, n=N, batched=False, producers=None) -> set[bytes]:
    sent = set()
    for t in topics:
        producer = producers[t] if producers else await client.create_producer(t, batching_enabled=batched)
        data = [f"{t.rsplit('/', 1)[-1]}-{i}".encode() for i in range(n)]
        await asyncio.gather(*[producer.send(d) for d in data])
        await producer.close()
        sent.update(data)
    return sent


async def receive_set(consumer, n, timeout_ms=10_000) -> list:
    return [await consumer.receive(timeout_ms=timeout_ms) for _ in range(n)]


async def back_once_then_nothing(consumer, sent: set[bytes]) -> None:
    """Every message of ``sent`` comes back, once; acked, nothing more comes."""
    back = await receive_set(consumer, len(sent))
    assert sorted(m.data() for m in back) == sorted(sent)
    for m in back:
        await consumer.acknowledge(m)
    with pytest.raises(ReceiveTimeout):
        await consumer.receive(timeout_ms=500)


CASES = [(Types.Shared, True), (Types.KeyShared, True), (Types.Shared, False), (Types.Exclusive, False),
         (Types.Failover, False), (Types.Failover, True)]


@pytest.mark.parametrize("kind,partitions", CASES, ids=[f"{k.name}-{'partitioned' if p else 'plain'}" for k, p in CASES])
async def test_each_message_nacked_by_its_id_comes_back_once(client, topic, session_broker, broker_kind, kind,
                                                              partitions):
    needs_redeliver_all(broker_kind, kind)
    t = partitioned(session_broker, broker_kind, topic("ids")) if partitions else topic("ids")
    async with await nacktracker.subscribe(client, t, "sub", consumer_type=kind, delay_ms=100) as consumer:
        sent = await publish(client, [t])
        for m in await receive_set(consumer, N):
            await consumer.negative_acknowledge(m.message_id())
        await back_once_then_nothing(consumer, sent)
        assert consumer.stats()["pending"] == 0


@pytest.mark.parametrize("form", ["list", "pattern"])
async def test_ids_from_a_multi_topic_consumer_nack_and_ack_on_their_own_topic(client, session_broker, broker_kind,
                                                                                form):
    """A list of topics (one of them partitioned on Apache Pulsar) or a pattern: half the messages
    nacked by id, half acked by id; only the nacked ones come back, once each."""
    if form == "pattern" and broker_kind == "lite":
        pytest.skip("pulsar-lite cannot list a namespace's topics (a pattern subscription's lookup)")
    base = f"persistent://public/default/forms-{uuid.uuid4().hex[:8]}"
    topics = [f"{base}-a", f"{base}-b"]
    if broker_kind == "apache" and session_broker is not None:
        partitioned(session_broker, broker_kind, topics[1])
    # a pattern consumer finds topics that exist when it subscribes (new ones only at its next discovery)
    producers = {t: await client.create_producer(t) for t in topics}
    if form == "list":
        consumer = await nacktracker.subscribe(client, topics, "sub", consumer_type=Types.Shared, delay_ms=100)
    else:
        consumer = await nacktracker.subscribe(client, f"{base}-.*", "sub", consumer_type=Types.Shared,
                                               delay_ms=100, is_pattern_topic=True)
    async with consumer:
        sent = await publish(client, topics, n=4, producers=producers)
        nacked = set()
        for i, m in enumerate(await receive_set(consumer, len(sent))):
            if i % 2:
                await consumer.acknowledge(m.message_id())
            else:
                nacked.add(m.data())
                await consumer.negative_acknowledge(m.message_id())
        await back_once_then_nothing(consumer, nacked)


async def test_an_id_this_consumer_never_handed_out_is_refused(client, topic, session_broker, broker_kind):
    """An id another consumer handed out (of another topic), and a made-up one: a clear
    NotReceivedError in the caller, nothing tracked changes."""
    t = partitioned(session_broker, broker_kind, topic("foreign")) if broker_kind == "apache" else topic("foreign")
    elsewhere = topic("elsewhere")
    other = await client.subscribe(elsewhere, "other", consumer_type=Types.Shared)
    async with await nacktracker.subscribe(client, t, "sub", delay_ms=100) as consumer:
        await publish(client, [t, elsewhere], n=1)
        mine = await consumer.receive(timeout_ms=10_000)
        theirs = await other.receive()
        await consumer.acknowledge(mine)
        made_up = pulsar.MessageId(0, 999_999, 999, -1)
        for foreign in (theirs.message_id(), made_up):
            with pytest.raises(NotReceivedError):
                await consumer.negative_acknowledge(foreign)
        assert consumer.tracker.pending == 0
    await other.close()


async def test_unacked_messages_timeout_ms_brings_the_message_back_to_the_application(client, topic, broker_kind):
    """The client's ack timeout is the consumer's ack_timeout_ms: unacknowledged for 10 s, the
    message is received again (the plain client's resend would be dropped as a copy still held)."""
    if broker_kind == "lite":
        pytest.skip("the consumer times acks itself, on any broker: run once, on Apache Pulsar (10 s)")
    t = topic("ack-timeout")
    async with await nacktracker.subscribe(client, t, "sub", unacked_messages_timeout_ms=10_000) as consumer:
        await publish(client, [t], n=1)
        first = await consumer.receive(timeout_ms=10_000)
        start = time.monotonic()
        again = await consumer.receive(timeout_ms=15_000)
        waited = time.monotonic() - start
        assert again.data() == first.data() and 9.9 <= waited < 12
        await consumer.acknowledge(again)
        with pytest.raises(ReceiveTimeout):
            await consumer.receive(timeout_ms=500)


async def test_batch_receive_gives_batches_within_the_policy_and_each_message_is_its_own(client, topic,
                                                                                         broker_kind):
    """A policy of 5 messages, 12 published: batches of at most 5, 12 received; one message of a
    batch nacked, one dead-lettered, the rest acked: the nacked one alone comes back."""
    t = topic("batch-receive")
    dlq = topic("batch-receive-dlq")
    policy = pulsar.ConsumerBatchReceivePolicy(5, -1, 500)
    async with await nacktracker.subscribe(client, t, "sub", delay_ms=100, batch_receive_policy=policy,
                                           max_redeliveries=3, dead_letter_topic=dlq) as consumer:
        letters = await client.subscribe(dlq, "audit", initial_position=pulsar.InitialPosition.Earliest)
        sent = await publish(client, [t], n=12, batched=True)
        batches = []
        while sum(map(len, batches)) < 12:
            batch = await consumer.batch_receive()
            assert len(batch) <= 5
            batches.append(batch)
        got = [m for b in batches for m in b]
        assert sorted(m.data() for m in got) == sorted(sent) and max(map(len, batches)) == 5
        nacked, dead = got[3], got[7]
        await consumer.negative_acknowledge(nacked)
        await consumer.dead_letter(dead, "bad payload")
        for m in got:
            if m is not nacked and m is not dead:
                await consumer.acknowledge(m)
        back = []
        while not back:
            back = await consumer.batch_receive()
        assert [m.data() for m in back] == [nacked.data()]
        await consumer.acknowledge(back[0])
        assert (await letters.receive()).data() == dead.data()
        await letters.close()


@pytest.mark.parametrize("partitions", [False, True], ids=["plain", "partitioned"])
async def test_a_cumulative_ack_by_id_settles_its_partition(client, topic, session_broker, broker_kind, partitions):
    """Failover: the last id received of each partition, acknowledged cumulatively, settles all of them:
    a nack by id made before it is cancelled, and a new consumer of the subscription gets nothing."""
    t = partitioned(session_broker, broker_kind, topic("cumulative")) if partitions else topic("cumulative")
    async with await nacktracker.subscribe(client, t, "sub", consumer_type=Types.Failover, delay_ms=300) as consumer:
        await publish(client, [t])
        got = await receive_set(consumer, N)
        await consumer.negative_acknowledge(got[0].message_id())
        last = {}
        for m in got:
            last[m.topic_name()] = m.message_id()
        for mid in last.values():
            await consumer.acknowledge_cumulative(mid)
        assert consumer.tracker.pending == 0
        with pytest.raises(ReceiveTimeout):
            await consumer.receive(timeout_ms=600)
    async with await nacktracker.subscribe(client, t, "sub", consumer_type=Types.Failover) as again:
        with pytest.raises(ReceiveTimeout):
            await again.receive(timeout_ms=1000)
