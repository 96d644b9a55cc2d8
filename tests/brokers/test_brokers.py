"""What the consumer promises where the two test brokers differ, proven on each.

Every test runs on pulsar-lite and on Apache Pulsar (``broker_kind``). Where a
broker cannot show a behaviour the test says so and which broker decides:
Apache Pulsar is the truth for Pulsar's semantics.
"""

from __future__ import annotations

import asyncio
import collections
import uuid

import pytest

pulsar = pytest.importorskip("pulsar")
import pulsar.asyncio  # noqa: E402

import nacktracker  # noqa: E402
from broker_helpers import publish_batch, receive_all  # noqa: E402
from nacktracker.consumer import PROPERTY_ORIGIN_MESSAGE_ID  # noqa: E402
from nacktracker.consumer.letters.publisher import dead_letter_topic  # noqa: E402

pytestmark = pytest.mark.broker

Types = pulsar.ConsumerType
Earliest = pulsar.InitialPosition.Earliest
EARLY_MS = 5  # copies that arrive early are parked until due: only timer jitter
LATE_MS = 250  # a loaded 2-core CI machine


def now_ms() -> float:
    return asyncio.get_running_loop().time() * 1000.0


def admin_of(session_broker, broker_kind):
    """The Apache broker's admin API; skip where a broker has none to make partitioned topics."""
    if broker_kind == "lite":
        pytest.skip("pulsar-lite has no partitioned topics (no admin API makes one, and it cannot redeliver on "
                    "them); Apache Pulsar shows the behaviour")
    if session_broker is None:
        pytest.skip("needs the admin API of a broker this session started ($PULSAR_URL is set)")
    return session_broker


def partitioned(broker, t: str, partitions: int = 2) -> str:
    name = t.removeprefix("persistent://")
    broker.admin("PUT", f"/admin/v2/persistent/{name}/partitions", partitions)
    return t


async def publish(client, t, n, prefix=b"m", **options):
    producer = await client.create_producer(t, batching_enabled=False, **options)
    await asyncio.gather(*[producer.send(prefix + b"%d" % i) for i in range(n)])
    await producer.close()


async def until(condition, timeout_s=20.0, what="condition"):
    deadline = now_ms() + timeout_s * 1000
    while not condition():
        assert now_ms() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def read_subscription(client, t, subscription, expected, idle_ms=1500):
    """Every message on ``t``'s existing ``subscription``: until ``expected`` came, then ``idle_ms`` of quiet."""
    reader = await client.subscribe(t, subscription, consumer_type=Types.Shared, initial_position=Earliest)
    got = []
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def pump():  # a plain consumer's receive() must never be cancelled
        while True:
            queue.put_nowait(await reader.receive())

    task = loop.create_task(pump())
    try:
        while True:
            try:
                msg = await asyncio.wait_for(queue.get(), 30 if len(got) < expected else idle_ms / 1000)
            except asyncio.TimeoutError:
                return got
            got.append(msg)
            await reader.acknowledge(msg)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await reader.close()


# -- dead letters ------------------------------------------------------------------------

async def test_multi_topic_subscription_without_consumer_name_dead_letters_each_topic(client, topic):
    """A multi-topic subscription with a dead-letter policy and no consumer_name: the
    client leaves the consumer unnamed, as Java would not; the consumer names itself
    and dead-letters each message to its own topic's dead-letter topic."""
    topics = [topic("a"), topic("b")]
    for t in topics:
        await publish(client, t, 2)
    consumer = await nacktracker.subscribe(
        client, topics, "sub", consumer_type=Types.Shared, initial_position=Earliest, delay_ms=100, max_redeliveries=1,
        dead_letter_initial_subscription="audit")
    assert consumer.consumer_name() == ""  # as the client made it; dead letters still get Java's names
    async with consumer:
        for _ in range(4 + 4):  # each message once fresh and once redelivered, then dead-lettered
            msg = await consumer.receive(timeout_ms=10_000)
            await consumer.negative_acknowledge(msg)
        await until(lambda: consumer.stats()["dead_lettered"] == 4, what="4 dead letters")
        assert await receive_all(consumer, 500) == []
    for t in topics:
        letters = await read_subscription(client, dead_letter_topic(t, "sub"), "audit", expected=2)
        assert sorted(m.data() for m in letters) == [b"m0", b"m1"]
        assert all(m.properties()["REAL_TOPIC"] == t for m in letters)


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
async def test_three_shared_consumers_always_nacking_dead_letter_each_message_exactly_once(
        client, topic, broker_kind, batched):
    """Three consumers of one Shared subscription nack every message they get;
    max_redeliveries=1: every message reaches the dead-letter topic exactly once,
    and nothing is left on the subscription."""
    t = topic("three")
    n = 300
    consumers = [await nacktracker.subscribe(
        client, t, "sub", consumer_type=Types.Shared, initial_position=Earliest, delay_ms=200, max_redeliveries=1,
        dead_letter_initial_subscription="audit", consumer_name=f"c{i}") for i in range(3)]
    producer = await client.create_producer(
        t, batching_enabled=batched, batching_max_messages=10, batching_max_publish_delay_ms=50)
    await asyncio.gather(*[producer.send(b"m%03d" % i) for i in range(n)])
    await producer.close()

    async def nack_everything(consumer):
        while True:
            msg = await consumer.receive()
            await consumer.negative_acknowledge(msg)

    tasks = [asyncio.get_running_loop().create_task(nack_everything(c)) for c in consumers]
    try:
        letters = await read_subscription(client, dead_letter_topic(t, "sub"), "audit", expected=n, idle_ms=2500)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    counts = collections.Counter(m.data() for m in letters)
    twice = {k: v for k, v in counts.items() if v != 1}
    assert not twice, f"{broker_kind}: dead-lettered more than once: {len(twice)} messages, e.g. {list(twice)[:5]}"
    assert len(counts) == n
    for c in consumers:
        await c.close()
    left = await nacktracker.subscribe(client, t, "sub", consumer_type=Types.Shared, initial_position=Earliest)
    async with left:
        assert await receive_all(left, 1500) == []


# -- partitioned topics (Apache Pulsar) -------------------------------------------------

@pytest.mark.timing
async def test_partitioned_topic_nacks_come_back_once_on_time(client, topic, session_broker, broker_kind):
    broker = admin_of(session_broker, broker_kind)
    t = partitioned(broker, topic("part"))
    await publish(client, t, 10)
    async with await nacktracker.subscribe(client, t, "sub", consumer_type=Types.Shared,
                                           initial_position=Earliest) as consumer:
        msgs = [await consumer.receive(timeout_ms=10_000) for _ in range(10)]
        assert {m.topic_name() for m in msgs} == {f"{t}-partition-0", f"{t}-partition-1"}
        due = {}
        for i, m in enumerate(msgs):
            delay = 300 + 100 * i
            nacked_at = now_ms()  # the nack is stamped inside the call: its due time is never before this
            await consumer.negative_acknowledge(m, delay_ms=delay)
            due[m.data()] = nacked_at + delay
        errors = {}
        while len(errors) < len(due):
            back = await consumer.receive(timeout_ms=5000)
            assert back.data() not in errors, f"{back.data()!r} came back twice"
            errors[back.data()] = round(now_ms() - due[back.data()])
            assert back.redelivery_count() == 1
            await consumer.acknowledge(back)
        assert all(-EARLY_MS <= e <= LATE_MS for e in errors.values()), errors
        assert await receive_all(consumer, 800) == []


async def test_partitioned_topic_dead_letters_go_to_each_partitions_dead_letter_topic(
        client, topic, session_broker, broker_kind):
    broker = admin_of(session_broker, broker_kind)
    t = partitioned(broker, topic("partdlq"))
    await publish(client, t, 6)
    consumer = await nacktracker.subscribe(client, t, "sub", consumer_type=Types.Shared,
                                           initial_position=Earliest, delay_ms=100,
                                           max_redeliveries=1, dead_letter_initial_subscription="audit")
    async with consumer:
        topics = collections.Counter()
        for _ in range(6 + 6):
            msg = await consumer.receive(timeout_ms=10_000)
            if msg.redelivery_count() == 0:
                topics[msg.topic_name()] += 1
            await consumer.negative_acknowledge(msg)
        await until(lambda: consumer.stats()["dead_lettered"] == 6, what="6 dead letters")
    assert set(topics) == {f"{t}-partition-0", f"{t}-partition-1"}
    for part, count in topics.items():
        letters = await read_subscription(client, dead_letter_topic(part, "sub"), "audit", expected=count)
        assert len(letters) == count
        assert all(m.properties()["REAL_TOPIC"] == part for m in letters)
        assert all(m.properties()[PROPERTY_ORIGIN_MESSAGE_ID] for m in letters)


async def test_partitioned_topic_restart_on_a_snapshot_holds_resent_copies_until_due(
        client, topic, session_broker, broker_kind, tmp_path):
    broker = admin_of(session_broker, broker_kind)
    t = partitioned(broker, topic("partsnap"))
    await publish(client, t, 6)
    path = tmp_path / "nacks.snap"
    a = await nacktracker.subscribe(client, t, "sub", consumer_type=Types.Shared,
                                    initial_position=Earliest, snapshot_path=path)
    msgs = [await a.receive(timeout_ms=10_000) for _ in range(6)]
    due = {}
    for i, m in enumerate(msgs):
        if i % 2:
            await a.acknowledge(m)
        else:
            await a.negative_acknowledge(m, delay_ms=2000 + 300 * i)
            due[m.data()] = now_ms() + 2000 + 300 * i
    await asyncio.sleep(0.3)  # let the acks land
    await a.close()
    b = await nacktracker.subscribe(client, t, "sub", consumer_type=Types.Shared,
                                    initial_position=Earliest, snapshot_path=path)
    async with b:
        assert b.stats()["restored"] == 3
        errors = {}
        while len(errors) < 3:
            back = await b.receive(timeout_ms=5000)
            errors[back.data()] = round(now_ms() - due[back.data()])
            await b.acknowledge(back)
        assert set(errors) == set(due)
        assert all(-EARLY_MS <= e <= LATE_MS for e in errors.values()), errors
        assert await receive_all(b, 800) == []


# -- batch-index acknowledgements ------------------------------------------------------

async def test_batch_index_acks_on_a_broker_with_them_bring_back_only_the_nacked_message(
        topic, broker_kind, own_broker, pulsar_logger):
    """With ``acknowledgmentAtBatchIndexLevelEnabled`` at the broker and
    ``batch_index_ack_enabled=True``: b0 acked, b1 nacked, b2 and b3 held: b1
    alone comes back, at its time (its request waits for the held ones until it
    is due: the broker sends every unacknowledged message of the entry);
    the held ones once the application nacks them."""
    if broker_kind == "lite":
        pytest.skip("pulsar-lite ignores batch-index acks (tests/brokers/test_pulsar.py shows what it does instead)")
    with own_broker(settings={"acknowledgmentAtBatchIndexLevelEnabled": True}) as broker:
        client = pulsar.asyncio.Client(broker.url, logger=pulsar_logger, operation_timeout_seconds=10)
        try:
            t = topic("bia")
            await publish_batch(client, t, 4)
            consumer = await nacktracker.subscribe(client, t, "sub", consumer_type=Types.Shared,
                                                   initial_position=Earliest,
                                                   batch_index_ack_enabled=True)
            async with consumer:
                b0, b1, b2, b3 = [await consumer.receive(timeout_ms=10_000) for _ in range(4)]
                await consumer.acknowledge(b0)
                await consumer.negative_acknowledge(b1, delay_ms=300)
                due = now_ms() + 300
                back = await consumer.receive(timeout_ms=3000)
                assert back.data() == b1.data() and -EARLY_MS <= now_ms() - due <= consumer.stats()["lead_ms"] + LATE_MS
                await consumer.acknowledge(back)
                assert await receive_all(consumer, 800) == []
                for m in (b2, b3):
                    await consumer.negative_acknowledge(m, delay_ms=100)
                again = sorted(m.data() for m in [await consumer.receive(timeout_ms=3000) for _ in range(2)])
                assert again == sorted([b2.data(), b3.data()])
                assert consumer.stats()["siblings_dropped"] >= 1  # b0 and b1's copies with the entry
        finally:
            await client.close()


# -- what a broker restart does to redelivery counts -------------------------------------

async def test_a_broker_restart_resets_the_brokers_redelivery_count(topic, own_broker, pulsar_logger):
    """Pulsar keeps a message's redelivery count in the broker's memory: after a
    restart a nacked message comes back with count 0 again, on both brokers."""
    with own_broker() as broker:
        client = pulsar.asyncio.Client(broker.url, logger=pulsar_logger, operation_timeout_seconds=10)
        try:
            t = topic("count")
            await publish(client, t, 1)
            consumer = await nacktracker.subscribe(client, t, "sub", consumer_type=Types.Shared,
                                                   initial_position=Earliest, delay_ms=100)
            msg = await consumer.receive(timeout_ms=10_000)
            await consumer.negative_acknowledge(msg)
            again = await consumer.receive(timeout_ms=5000)
            assert again.redelivery_count() == 1
            await asyncio.get_running_loop().run_in_executor(None, broker.restart)
            # the broker resends it on reconnection; the application still holds it: that copy is dropped
            await until(lambda: consumer.stats()["held_copies_dropped"] == 1, 60, "the resend after the restart")
            await consumer.negative_acknowledge(again, delay_ms=100)
            after = await consumer.receive(timeout_ms=10_000)
            # without the restart it would be 2: the restart set it back to 0, the nack made it 1
            assert after.data() == msg.data() and after.redelivery_count() == 1
            await consumer.acknowledge(after)
            await consumer.close()
        finally:
            await client.close()


# -- Key_Shared ------------------------------------------------------------------------

@pytest.mark.timing
async def test_key_shared_nacked_messages_come_back_on_time(client, topic, broker_kind):
    if broker_kind == "lite":
        pytest.skip("pulsar-lite redelivers on Key_Shared only one nacked message per key at a time "
                    "(the plain client loses the others there the same way)")
    t = topic("ks")
    producer = await client.create_producer(t, batching_enabled=False)
    for i in range(8):
        await producer.send(b"m%d" % i, partition_key=f"k{i % 3}")
    await producer.close()
    consumer = await nacktracker.subscribe(client, t, "sub", consumer_type=Types.KeyShared,
                                           initial_position=Earliest, consumer_name=uuid.uuid4().hex[:6])
    async with consumer:
        msgs = [await consumer.receive(timeout_ms=10_000) for _ in range(8)]
        due = {}
        for i, m in enumerate(msgs):
            await consumer.negative_acknowledge(m, delay_ms=200 + 50 * i)
            due[m.data()] = now_ms() + 200 + 50 * i
        errors = {}
        while len(errors) < 8:
            back = await consumer.receive(timeout_ms=5000)
            errors[back.data()] = round(now_ms() - due[back.data()])
            await consumer.acknowledge(back)
        assert all(-EARLY_MS <= e <= LATE_MS for e in errors.values()), errors
        assert await receive_all(consumer, 800) == []


# -- why Exclusive and Failover redeliver from the consumer's memory ---------------------

@pytest.mark.parametrize("kind", [Types.Exclusive, Types.Failover], ids=lambda k: k.name)
async def test_on_exclusive_and_failover_the_plain_clients_nack_resends_everything_unacknowledged(
        topic, broker_url, broker_kind, kind, pulsar_logger):
    """The plain client, one nack among 20 held messages: Apache Pulsar resends
    all 20 (the only redelivery these subscription types have is "everything
    unacknowledged"); pulsar-lite resends nothing. TrackedConsumer therefore
    redelivers locally there (README, "Subscription types")."""
    sync = pulsar.Client(broker_url, logger=pulsar_logger)
    loop = asyncio.get_running_loop()
    try:
        t = topic("excl")
        consumer = sync.subscribe(t, "sub", consumer_type=kind, negative_ack_redelivery_delay_ms=100)
        producer = sync.create_producer(t, batching_enabled=False)
        for i in range(20):
            producer.send(b"m%d" % i)
        held = [consumer.receive(5000) for _ in range(20)]
        consumer.negative_acknowledge(held[0])

        def drain():
            got = []
            while True:
                try:
                    got.append(consumer.receive(1500))
                except pulsar.Timeout:
                    return got

        back = await loop.run_in_executor(None, drain)
        assert len(back) == (0 if broker_kind == "lite" else 20), (broker_kind, len(back))
    finally:
        sync.close()
