"""A consumer's memory per pending nack at scale, end to end: the process's RSS growth
with real traffic (pulsar-lite), and ``stats()["nbytes"]`` against it.

Runs ``python -m bench.consumer_memory``'s measurement of one TrackedConsumer in a
fresh process (nothing of the test session in its RSS)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("pulsar")
import pulsar  # noqa: E402

import nacktracker  # noqa: E402
from bench import consumer_memory  # noqa: E402
from nacktracker.consumer import ReceiveTimeout  # noqa: E402
from nacktracker.demo.sides import produce  # noqa: E402

MESSAGES = 100_000


@pytest.mark.slow
@pytest.mark.broker
async def test_a_pending_nack_of_a_batch_message_costs_bytes_and_nbytes_says_how_many(broker_url, broker_kind, topic):
    """100,000 messages from a batching producer, each received and nacked (600 s): RSS grows
    at most 32 B per pending nack (a received message kept would be ~1 KB), and the consumer's
    ``stats()["nbytes"]`` grows within 25% of that."""
    if broker_kind != "lite":
        pytest.skip("Apache Pulsar stops dispatching at 50,000 unacknowledged messages per consumer "
                    "(maxUnackedMessagesPerConsumer): 100,000 pending nacks need pulsar-lite")
    t = topic("memory")
    await produce(broker_url, t, consumer_memory.WARMUP + MESSAGES + consumer_memory.TAIL, batching=True,
                  payload_bytes=consumer_memory.PAYLOAD_BYTES)
    row = await asyncio.to_thread(consumer_memory.run_one, "tracked", broker_url, t, MESSAGES,
                                  consumer_memory.WARMUP, False)
    print({k: row[k] for k in ("rss_per_nack", "nbytes_per_nack", "nbytes_parts_per_nack", "messages_per_entry")})
    assert row["messages_per_entry"] > 10  # the producer really batched
    assert row["tracker_pending"] > 0
    assert row["rss_per_nack"] <= 32, row
    assert abs(row["nbytes_off"]) <= 0.25, row
    assert row["nbytes_parts_per_nack"]["delivery"] >= 12  # each nack is in its entry's record


@pytest.mark.broker
async def test_a_batch_of_one_keeps_no_record_and_comes_back_once_at_its_time(client, topic):
    """What a batching producer sends at a low rate: entries of one message. Its nack is followed
    as a message that is not batched (no batch record), it comes back once, not before its time,
    and once acknowledged it never comes back."""
    t = topic("one")
    producer = await client.create_producer(t, batching_enabled=True, batching_max_publish_delay_ms=1)
    await producer.send(b"alone")  # sent alone: flushed as an entry of one message
    await producer.close()
    loop = asyncio.get_running_loop()
    async with await nacktracker.subscribe(client, t, "sub", consumer_type=pulsar.ConsumerType.Shared, precision_bits=0,
                                           initial_position=pulsar.InitialPosition.Earliest) as consumer:
        msg = await consumer.receive(timeout_ms=5000)
        assert msg.message_id().batch_index() == 0  # batched, alone in its entry
        await consumer.negative_acknowledge(msg, delay_ms=400)
        due = loop.time() * 1000 + 400
        assert consumer.stats()["batch_records"] == 0 and consumer.stats()["nbytes_parts"]["kept_messages"] == 0
        back = await consumer.receive(timeout_ms=5000)
        assert loop.time() * 1000 >= due - 1  # parked until due if its copy came early
        assert (back.data(), back.redelivery_count()) == (msg.data(), 1)
        await consumer.acknowledge(back)
        with pytest.raises(ReceiveTimeout):
            await consumer.receive(timeout_ms=800)
        assert consumer.tracker.pending == 0
