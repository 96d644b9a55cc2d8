"""Dead letters through TrackedConsumer, on the embedded broker:
one producer per dead-letter topic under concurrency, in order, the initial
subscription, and a dead letter that fails while the consumer closes."""

from __future__ import annotations

import asyncio

import pytest

pulsar = pytest.importorskip("pulsar")
import pulsar.asyncio  # noqa: E402

import nacktracker  # noqa: E402
from nacktracker import ManualClock, NegativeAcksTracker  # noqa: E402
from nacktracker.adapters import MemoryAdapter  # noqa: E402
from nacktracker.consumer import PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_REAL_SUBSCRIPTION, PROPERTY_REAL_TOPIC  # noqa: E402

Shared = pulsar.ConsumerType.Shared
Earliest = pulsar.InitialPosition.Earliest


class CountingClient(pulsar.asyncio.Client):
    """A real client that records every producer it is asked to create."""

    def __init__(self, url, logger, fail_creates: bool = False) -> None:
        super().__init__(url, logger=logger, operation_timeout_seconds=10)
        self.created: list[tuple[str, str]] = []
        self.fail_creates = fail_creates

    async def create_producer(self, topic, **options):
        self.created.append((topic, options.get("producer_name")))
        if self.fail_creates:  # a broker that takes its time, then refuses
            await asyncio.sleep(0.3)
            raise pulsar.asyncio.PulsarException(pulsar.Result.ConnectError, "cannot connect")
        return await super().create_producer(topic, **options)


@pytest.fixture
async def make_client(broker_url, pulsar_logger):
    made = []

    def make(**kw) -> CountingClient:
        made.append(CountingClient(broker_url, pulsar_logger, **kw))
        return made[-1]

    yield make
    for c in made:
        try:
            await c.close()
        except Exception:
            pass


async def publish(client, t, n):
    producer = await client.create_producer(t, batching_enabled=False)
    ids = [await producer.send(b"m%d" % i) for i in range(n)]
    await producer.close()
    return ids


async def receive_n(consumer, n, timeout_ms=10_000):
    return [await consumer.receive(timeout_ms=timeout_ms) for _ in range(n)]


@pytest.mark.broker
async def test_100_concurrent_dead_letters_make_one_producer_and_100_messages_in_order(make_client, client, topic,
                                                                                        pumps):
    """100 messages reach max_redeliveries at once: one producer on the DLQ
    topic (named as Java's), 100 dead letters, in the order they were decided,
    all retained by the initial subscription made before the first one."""
    n = 100
    t = topic()
    dlq = f"{t}-sub-DLQ"
    await publish(client, t, n)
    counting = make_client()
    consumer = await nacktracker.subscribe(counting, t, "sub", consumer_type=Shared,
                                           initial_position=Earliest, precision_bits=0,
                                           max_redeliveries=1, dead_letter_initial_subscription="audit")
    async with consumer:
        for m in await receive_n(consumer, n):
            await consumer.negative_acknowledge(m, delay_ms=100)
        copies = await receive_n(consumer, n)
        assert {m.redelivery_count() for m in copies} == {1}
        # all at once: each nack decides a dead letter while the producer is still being made
        await asyncio.gather(*[consumer.negative_acknowledge(m) for m in copies])
        for _ in range(200):  # the tracker counts a dead letter once its hook has returned, a step after publishing
            stats = consumer.stats()
            if stats["dead_letter_published"] == n and stats["dead_lettered"] == n:
                break
            await asyncio.sleep(0.05)
        stats = consumer.stats()
        assert (stats["dead_letter_published"], stats["dead_letter_failed"], stats["dead_lettered"]) == (n, 0, n)
        assert (stats["dead_letter_producers_created"], stats["dead_letter_producers_open"]) == (1, 1)
        assert [topic_ for topic_, _ in counting.created] == [dlq]
        [(_, name)] = counting.created
        assert name.startswith(f"{t}-sub-{consumer.consumer_name()}-") and name.endswith("-DLQ")
        assert consumer.tracker.pending == 0
    assert consumer.stats()["dead_letter_producers_open"] == 0  # closed with the consumer
    audit = pumps(await client.subscribe(dlq, "audit", consumer_type=Shared))
    dead = [(await audit.get(10))[1] for _ in range(n)]
    assert [d.data() for d in dead] == [m.data() for m in copies]  # in the order decided
    props = dead[0].properties()
    assert (props[PROPERTY_REAL_TOPIC], props[PROPERTY_REAL_SUBSCRIPTION]) == (t, "sub")
    mid = copies[0].message_id()
    assert props[PROPERTY_ORIGIN_MESSAGE_ID] == f"{mid.ledger_id()}:{mid.entry_id()}:-1"
    with pytest.raises(asyncio.TimeoutError):
        await audit.get(1.0)  # exactly 100: none twice


@pytest.mark.broker
async def test_a_dead_letter_failing_during_close_stays_pending_and_in_the_snapshot(make_client, client, topic,
                                                                                     tmp_path, pumps, broker_kind):
    t = topic()
    path = str(tmp_path / "nacks.snap")
    await publish(client, t, 1)
    refusing = make_client(fail_creates=True)
    consumer = await nacktracker.subscribe(refusing, t, "sub", consumer_type=Shared,
                                           initial_position=Earliest, precision_bits=0,
                                           max_redeliveries=1, snapshot_path=path, snapshot_interval_s=None)
    first = await consumer.receive(timeout_ms=10_000)
    await consumer.negative_acknowledge(first, delay_ms=100)
    copy = await consumer.receive(timeout_ms=10_000)
    assert copy.redelivery_count() == 1
    await consumer.negative_acknowledge(copy, delay_ms=300)  # dead: its publish is under way...
    await consumer.close()  # ...and fails while the consumer closes
    stats = consumer.stats()
    assert (stats["dead_letter_failed"], stats["dead_lettered"], stats["pending"]) == (1, 0, 1)
    assert copy in consumer.tracker
    restored = NegativeAcksTracker.load(path, MemoryAdapter(), elapsed="none", clock=ManualClock())
    assert restored.pending == 1 and copy in restored
    # a restart finds it: it comes back (not acknowledged), and its next nack dead-letters it. Apache
    # Pulsar resends a closed consumer's messages with the redelivery count reset to 0 (pulsar-lite
    # counts the close as a redelivery); the consumer's own count, restored with the snapshot, still
    # says at least 1 (docs/retries.md), so on both brokers the next nack dead-letters it.
    dlq = f"{t}-sub-DLQ"
    inspect = pumps(await client.subscribe(dlq, "inspect", consumer_type=Shared, initial_position=Earliest))
    async with await nacktracker.subscribe(client, t, "sub", consumer_type=Shared,
                                           initial_position=Earliest, precision_bits=0,
                                           max_redeliveries=1, snapshot_path=path) as again:
        assert again.stats()["restored"] == 1
        back = await again.receive(timeout_ms=10_000)
        assert back.data() == b"m0"  # (its broker count: 0 or more on Apache Pulsar, 1 or more on pulsar-lite)
        await again.negative_acknowledge(back)
        _, dead = await inspect.get(10)
        assert dead.data() == b"m0"
