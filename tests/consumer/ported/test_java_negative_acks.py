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
``negative_acknowledge(msg, delay_ms=...)`` here). Not ported:
``testNegativeAcksDeleteFromUnackedTracker`` (the Java client's internal maps).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid

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


async def test_negative_acks_with_batch_ack_enabled(broker_kind, own_broker, pulsar_logger):
    if broker_kind != "apache":
        pytest.skip("pulsar-lite ignores batch-index acks (and loses a batch's other messages to one)")
    with own_broker(settings={"acknowledgmentAtBatchIndexLevelEnabled": True}) as broker:
        client = pulsar.asyncio.Client(broker.url, logger=pulsar_logger, operation_timeout_seconds=10)
        try:
            t = f"persistent://public/default/testNegativeAcksWithBatchAckEnabled-{uuid.uuid4().hex[:10]}"
            # Java's case relies on its 1 s ack timeout (its nack delay is the default minute); ours nacks at 100 ms
            await nack_all_then_receive_all_again(client, t, True, Types.Shared, batch_index_ack_enabled=True,
                                                  delay_ms=100)
        finally:
            await client.close()
