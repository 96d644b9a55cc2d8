"""Pulsar's own NegativeAcksTest (the Java client's, in apache/pulsar), ported by intent.

Each case: N messages (batched or not, on a plain or a 2-partition topic), all
received and nacked -- half by the Message, half by its id (``msg.message_id()``),
as code written for the plain client does -- then every one received again and
acknowledged, and nothing more comes. Run on both brokers; the partitioned cases
need Apache Pulsar (pulsar-lite has no partitioned topics), and on pulsar-lite the
Failover cases nack every message by the Message (a nack by id there asks the broker
to resend what is unacknowledged, which pulsar-lite ignores). Shared subscriptions
redeliver through the broker, Failover ones from the consumer's memory (a nacked
Message) or the broker's resend (an id).

Ported: ``testNegativeAcks`` (nack delay 100 ms and 0 ms; with a 1 s ack timeout
too: the consumer's own ``ack_timeout_ms``, as ``unacked_messages_timeout_ms``
maps to it; the C++ client refuses ack timeouts under 10 s),
``testNegativeAcksWithBackoff`` (a multiplier backoff from 0 or 100 ms to 1 s),
``testNegativeAcksWithBatchAckEnabled`` (batch-index acks at both ends) and a
per-nack custom delay (the Java client's ``negativeAcknowledge`` with a delay is
``negative_acknowledge(msg, delay_ms=...)`` here: ``testNegativeAcknowledgeWithCustomDelay``; Java's
fallback to the consumer's delay on Failover/Exclusive is its client's limit, not kept),
``testNegativeAcksWithBackoff`` as it is now (five rounds of nacks; on Shared the whole takes the
backoff's delays summed), ``testNegativeAcksWithBatch`` (batch-index acks: two messages of one batch
nacked apart come back each at its own time), ``testFailoverConsumerBatchCumulateAck``,
``testMultiTopicConsumerConcurrentRedeliverAndReceive`` and ``testConfigureNegativeAckPrecisionBitCnt``
(``precision_bits``). Not ported: ``testNegativeAcksDeleteFromUnackedTracker`` (the Java client's
internal maps: its unacked-message tracker and nack map, made-up ids).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from typing import Any, AsyncIterator

import pytest

pulsar = pytest.importorskip("pulsar")
import pulsar.asyncio  # noqa: E402

import nacktracker  # noqa: E402
from nacktracker.consumer import ReceiveTimeout  # noqa: E402

pytestmark = pytest.mark.broker

N = 10
Types = pulsar.ConsumerType
VARIATIONS = list(itertools.product([False, True], [False, True], [Types.Shared, Types.Failover]))


def ids(batching, partitions, kind):
    return f"{'batched' if batching else 'single'}-{'partitioned' if partitions else 'plain'}-{kind.name}"


def by_id(broker_kind, kind) -> bool:
    """Whether half the nacks go by id: not on pulsar-lite's Failover (it ignores the resend they ask for)."""
    return kind == Types.Shared or broker_kind != "lite"


async def make_topic(session_broker, broker_kind, partitions: bool) -> str:
    t = f"persistent://public/default/testNegativeAcks-{uuid.uuid4().hex[:10]}"
    if partitions:
        if broker_kind != "apache" or session_broker is None:
            pytest.skip("partitioned topics need Apache Pulsar's admin API (pulsar-lite has none)")
        session_broker.admin("PUT", f"/admin/v2/persistent/{t.removeprefix('persistent://')}/partitions", 2)
    return t


async def nack_all_then_receive_all_again(client, t, batching, kind, delays=None, half_by_id=True, **options):
    """``delays``: a custom delay per nack (``negative_acknowledge(msg, delay_ms=...)``), by message;
    ``half_by_id``: every other nack by ``msg.message_id()``."""
    consumer = await nacktracker.subscribe(client, t, "sub1", consumer_type=kind, **options)
    async with consumer:
        producer = await client.create_producer(t, batching_enabled=batching)
        sent = {f"test-{i}".encode() for i in range(N)}
        await asyncio.gather(*[producer.send(m) for m in sorted(sent)])
        await producer.close()
        for i in range(N):
            msg = await consumer.receive(timeout_ms=10_000)
            delay = None if delays is None else delays[msg.data()]
            await consumer.negative_acknowledge(msg.message_id() if half_by_id and i % 2 else msg, delay_ms=delay)
        received = set()
        for _ in range(N):
            msg = await consumer.receive(timeout_ms=10_000)
            received.add(msg.data())
            await consumer.acknowledge(msg)
        assert received == sent
        with pytest.raises(ReceiveTimeout):  # there should be no more messages
            await consumer.receive(timeout_ms=300)


@pytest.mark.parametrize("delay_ms", [100, 0])
@pytest.mark.parametrize("batching,partitions,kind", VARIATIONS, ids=[ids(*v) for v in VARIATIONS])
async def test_negative_acks(client, session_broker, broker_kind, batching, partitions, kind, delay_ms):
    t = await make_topic(session_broker, broker_kind, partitions)
    await nack_all_then_receive_all_again(client, t, batching, kind, half_by_id=by_id(broker_kind, kind),
                                          delay_ms=delay_ms)


@pytest.mark.parametrize("batching,partitions,kind", VARIATIONS, ids=[ids(*v) for v in VARIATIONS])
async def test_negative_acks_with_ack_timeout(client, session_broker, broker_kind, batching, partitions, kind):
    """Java's variants with a 1 s ack timeout (nack delay 100 ms): every nacked message is back well
    before it, once; nothing comes after the acks (an ack timeout of an acknowledged message is void)."""
    t = await make_topic(session_broker, broker_kind, partitions)
    await nack_all_then_receive_all_again(client, t, batching, kind, half_by_id=by_id(broker_kind, kind),
                                          delay_ms=100, ack_timeout_ms=1000)


@pytest.mark.parametrize("partitions,kind", list(itertools.product([False, True], [Types.Shared, Types.Failover])))
async def test_negative_acknowledge_with_custom_delay(client, session_broker, broker_kind, partitions, kind):
    """A delay per nack overrides the consumer's (a minute here): every message is back, none twice."""
    t = await make_topic(session_broker, broker_kind, partitions)
    delays = {f"test-{i}".encode(): 100 + 50 * i for i in range(N)}
    await nack_all_then_receive_all_again(client, t, False, kind, delays=delays, half_by_id=by_id(broker_kind, kind),
                                          delay_ms=60_000)


@pytest.mark.parametrize("min_delay_ms", [100, 0])
@pytest.mark.parametrize("batching,partitions,kind", VARIATIONS, ids=[ids(*v) for v in VARIATIONS])
async def test_negative_acks_with_backoff(client, session_broker, broker_kind, batching, partitions, kind,
                                          min_delay_ms):
    t = await make_topic(session_broker, broker_kind, partitions)
    await nack_all_then_receive_all_again(client, t, batching, kind, half_by_id=by_id(broker_kind, kind),
                                          backoff=nacktracker.MultiplierBackoff(min_delay_ms, 1000))


@contextlib.asynccontextmanager
async def batch_index_ack_client(broker_kind: str, own_broker: Any, pulsar_logger: Any,
                                 why: str) -> AsyncIterator[Any]:
    """A client of an Apache broker of the test's own with batch-index acks on (pulsar-lite ignores them:
    skipped there, saying ``why``); closed, and the broker stopped, after the block."""
    if broker_kind != "apache":
        pytest.skip(why)
    with own_broker(settings={"acknowledgmentAtBatchIndexLevelEnabled": True}) as broker:
        client = pulsar.asyncio.Client(broker.url, logger=pulsar_logger, operation_timeout_seconds=10)
        try:
            yield client
        finally:
            await client.close()


async def test_negative_acks_with_batch_ack_enabled(broker_kind, own_broker, pulsar_logger):
    async with batch_index_ack_client(broker_kind, own_broker, pulsar_logger,
                                      "pulsar-lite ignores batch-index acks (and loses a batch's other messages "
                                      "to one)") as client:
        t = f"persistent://public/default/testNegativeAcksWithBatchAckEnabled-{uuid.uuid4().hex[:10]}"
        # Java's case relies on its 1 s ack timeout (its nack delay is the default minute); ours nacks at 100 ms
        await nack_all_then_receive_all_again(client, t, True, Types.Shared, batch_index_ack_enabled=True,
                                              delay_ms=100)


def backoff_rounds_total_ms(min_delay_ms: int, rounds: int) -> int:
    """Java's ``MultiplierRedeliveryBackoff(min, 1 s)``: min * 2^i, at most 1 s; 0 when min is 0."""
    return sum(min(min_delay_ms * 2 ** i, 1000) for i in range(rounds))


@pytest.mark.parametrize("min_delay_ms", [100, 0])
@pytest.mark.parametrize("batching,partitions,kind", VARIATIONS, ids=[ids(*v) for v in VARIATIONS])
async def test_negative_acks_with_backoff_over_five_rounds(client, session_broker, broker_kind, batching, partitions,
                                                           kind, min_delay_ms):
    """Java's ``testNegativeAcksWithBackoff`` as it is now: every message nacked at each of five deliveries,
    then acknowledged; on Shared the whole takes at least the backoff's five delays summed. (Java nacks one
    message per batch, relying on its client to resend a whole batch's unacknowledged messages; this consumer
    surfaces only what was nacked, so every message is nacked here.)"""
    t = await make_topic(session_broker, broker_kind, partitions)
    consumer = await nacktracker.subscribe(client, t, "sub1", consumer_type=kind,
                                           backoff=nacktracker.MultiplierBackoff(min_delay_ms, 1000))
    async with consumer:
        producer = await client.create_producer(t, batching_enabled=batching)
        sent = {f"test-{i}".encode() for i in range(N)}
        await asyncio.gather(*[producer.send(m) for m in sorted(sent)])
        await producer.close()
        started = asyncio.get_running_loop().time()
        for _ in range(5):
            for _ in range(N):
                await consumer.negative_acknowledge(await consumer.receive(timeout_ms=10_000))
        received = set()
        for _ in range(N):
            msg = await consumer.receive(timeout_ms=10_000)
            received.add(msg.data())
            await consumer.acknowledge(msg)
        elapsed_ms = (asyncio.get_running_loop().time() - started) * 1000
        assert received == sent
        if kind == Types.Shared:
            assert elapsed_ms >= backoff_rounds_total_ms(min_delay_ms, 5)
        with pytest.raises(ReceiveTimeout):
            await consumer.receive(timeout_ms=300)


async def test_negative_acks_with_batch(broker_kind, own_broker, pulsar_logger):
    """``testNegativeAcksWithBatch``: two messages of one batch, batch-index acks at both ends, nacked
    1 s apart with a 1.5 s delay: the first comes back at its own time (0.5 s after the second nack),
    not with the second. (Java: a 3 s delay, nacks 2 s apart.)"""
    async with batch_index_ack_client(broker_kind, own_broker, pulsar_logger,
                                      "pulsar-lite ignores batch-index acks (it redelivers whole entries)") as client:
        t = f"persistent://public/default/testNegativeAcksWithBatch-{uuid.uuid4().hex[:10]}"
        consumer = await nacktracker.subscribe(client, t, "sub1", consumer_type=Types.Shared,
                                               batch_index_ack_enabled=True, delay_ms=1500)
        async with consumer:
            producer = await client.create_producer(t, batching_enabled=True, batching_max_messages=2,
                                                    batching_max_publish_delay_ms=3_600_000)
            sends = [asyncio.ensure_future(producer.send(f"test-{i}".encode())) for i in range(2)]
            await asyncio.gather(*sends)
            assert sends[0].result().ledger_id() == sends[1].result().ledger_id()
            assert sends[0].result().entry_id() == sends[1].result().entry_id()  # one batch
            await producer.close()
            first = await consumer.receive(timeout_ms=10_000)
            await consumer.negative_acknowledge(first)
            await asyncio.sleep(1.0)
            await consumer.negative_acknowledge(await consumer.receive(timeout_ms=10_000))
            again = await consumer.receive(timeout_ms=1000)  # due 0.5 s from now
            assert again.data() == first.data()
            await consumer.acknowledge(again)
            second = await consumer.receive(timeout_ms=5000)
            assert second.data() != first.data()
            await consumer.acknowledge(second)


async def test_failover_consumer_batch_cumulative_ack(client, session_broker, broker_kind):
    """``testFailoverConsumerBatchCumulateAck``: a 2-partition topic, batches of 10 on Failover; the
    first message received is acknowledged cumulatively, then the consumer asks the broker to resend
    what is unacknowledged: the other nine come (each once), acknowledged cumulatively one by one."""
    t = await make_topic(session_broker, broker_kind, True)
    consumer = await nacktracker.subscribe(client, t, "sub", consumer_type=Types.Failover, receiver_queue_size=10)
    async with consumer:
        producer = await client.create_producer(t, batching_enabled=True, batching_max_messages=10,
                                                batching_max_publish_delay_ms=3000)
        await asyncio.gather(*[producer.send(str(i).encode()) for i in range(10)])
        await producer.close()
        left = {str(i).encode() for i in range(10)}
        first = await consumer.receive(timeout_ms=10_000)
        left.discard(first.data())
        await consumer.acknowledge_cumulative(first)
        await asyncio.sleep(0.5)
        consumer.redeliver_unacknowledged_messages()
        await asyncio.sleep(0.5)
        count = 0
        while True:
            try:
                msg = await consumer.receive(timeout_ms=3000)
            except ReceiveTimeout:
                break
            await consumer.acknowledge_cumulative(msg)
            left.discard(msg.data())
            count += 1
        assert (count, left) == (9, set())


@pytest.mark.parametrize("round_", range(3))
async def test_multi_topic_consumer_redeliver_with_a_full_receive_queue(client, session_broker, broker_kind, round_):
    """``testMultiTopicConsumerConcurrentRedeliverAndReceive`` (run 5 times in Java; 3 here): a
    2-partition topic, the receive queue full (10), then ``redeliver_unacknowledged_messages``: all ten
    come, none lost. (Java injects its race on the client's internal executor; here the call runs while
    the consumer's pump holds the queue.)"""
    t = await make_topic(session_broker, broker_kind, True)
    consumer = await nacktracker.subscribe(client, t, "sub", consumer_type=Types.Exclusive, receiver_queue_size=10)
    async with consumer:
        producer = await client.create_producer(t, batching_enabled=False)
        for i in range(10):
            await producer.send(str(i).encode())
        await producer.close()
        await asyncio.sleep(1.0)  # the queue fills
        consumer.redeliver_unacknowledged_messages()
        got = set()
        while True:
            try:
                got.add((await consumer.receive(timeout_ms=2000)).data())
            except ReceiveTimeout:
                break
        assert got == {str(i).encode() for i in range(10)}


@pytest.mark.parametrize("bits", range(1, 13))
async def test_configure_negative_ack_precision_bits(client, topic, bits):
    """``testConfigureNegativeAckPrecisionBitCnt``: with ``precision_bits=k`` a nacked message may come
    back up to 2^k ms early, never earlier (Java: a 2 s delay; 1 s here)."""
    t = topic("testConfigureNegativeAckPrecisionBitCnt")
    consumer = await nacktracker.subscribe(client, t, "sub1", consumer_type=Types.Shared, delay_ms=1000,
                                           precision_bits=bits)
    async with consumer:
        producer = await client.create_producer(t)
        await producer.send(b"test-0")
        await producer.close()
        loop = asyncio.get_running_loop()
        await consumer.negative_acknowledge(await consumer.receive(timeout_ms=10_000))
        expected = loop.time() + 1.0
        back = await consumer.receive(timeout_ms=10_000)
        assert back.data() == b"test-0"
        assert loop.time() >= expected - (1 << bits) / 1000
