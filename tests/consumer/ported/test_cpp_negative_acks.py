"""The C++ client's own nack tests (``BasicEndToEndTest`` in apache/pulsar-client-cpp), ported by intent.

``testNegativeAcks`` (batched or not) and ``testNegativeAcksWithPartitions``: ten messages received,
nothing more pending; then all nacked at once *by id* (``msg.message_id()``); all ten come back (in
order on a plain topic), are acked, and nothing more comes, on the default type (Exclusive: the C++
consumer's and ``subscribe``'s). ``testRedeliveryCount`` (a Shared consumer, the type passed as the
original sets it, nacking one message four times sees the broker's count reach 3; the client's
``negative_ack_redelivery_delay_ms=500``, which is the consumer's ``delay_ms``). The precision
test is Go's, with more cases: ``test_go_negative_acks.py``.

On pulsar-lite: the redelivery count case only (on Exclusive a nack by id asks the broker to resend
what is unacknowledged, which pulsar-lite ignores; it has no partitioned topics either).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

pulsar = pytest.importorskip("pulsar")
import pulsar.asyncio  # noqa: E402

import nacktracker  # noqa: E402
from nacktracker.consumer import ReceiveTimeout  # noqa: E402

pytestmark = pytest.mark.broker

N = 10
EXPECTED = [f"test-{i}".encode() for i in range(N)]


async def expect_timeout_on_receive(consumer) -> None:
    with pytest.raises(ReceiveTimeout):
        await consumer.receive(timeout_ms=100)


@pytest.mark.parametrize("batching,partitions", [(False, 0), (True, 0), (True, 3)],
                         ids=["single", "batched", "partitioned"])
async def test_negative_acks_by_id_all_at_once(client, session_broker, broker_kind, batching, partitions):
    if broker_kind != "apache" or session_broker is None:
        pytest.skip("Exclusive nacks by id need the broker's resend of what is unacknowledged (pulsar-lite "
                    "ignores it) and partitioned topics need Apache Pulsar's admin API")
    t = f"persistent://public/default/testNegativeAcks-{uuid.uuid4().hex[:10]}"
    if partitions:
        session_broker.admin("PUT", f"/admin/v2/persistent/{t.removeprefix('persistent://')}/partitions", partitions)
    ordered = not partitions
    consumer = await nacktracker.subscribe(client, t, "test", negative_ack_redelivery_delay_ms=100)
    async with consumer:
        producer = await client.create_producer(t, batching_enabled=batching)
        await asyncio.gather(*[producer.send(d) for d in EXPECTED])
        await producer.close()
        first = [await consumer.receive(timeout_ms=10_000) for _ in range(N)]
        assert [m.data() for m in first] == EXPECTED if ordered else sorted(m.data() for m in first) == EXPECTED
        await expect_timeout_on_receive(consumer)
        for mid in [m.message_id() for m in first]:  # all at once
            await consumer.negative_acknowledge(mid)
        again = []
        for _ in range(N):
            msg = await consumer.receive(timeout_ms=10_000)
            again.append(msg.data())
            await consumer.acknowledge(msg)
        assert again == EXPECTED if ordered else sorted(again) == EXPECTED
        await expect_timeout_on_receive(consumer)


async def test_redelivery_count(client, topic):
    t = topic("test-redelivery-count")
    consumer = await nacktracker.subscribe(client, t, "my-sub-name", consumer_type=pulsar.ConsumerType.Shared,
                                           negative_ack_redelivery_delay_ms=500)
    async with consumer:
        assert consumer.topic() == t and consumer.subscription_name() == "my-sub-name"
        producer = await client.create_producer(t)
        await producer.send(b"msg-content")
        await producer.close()
        counts = []
        for _ in range(4):
            msg = await consumer.receive(timeout_ms=10_000)
            await consumer.negative_acknowledge(msg)
            counts.append(msg.redelivery_count())
        assert counts == [0, 1, 2, 3]
        again = await consumer.receive(timeout_ms=10_000)  # the last nack's copy, acked
        await consumer.acknowledge(again)
