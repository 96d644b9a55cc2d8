"""A consumer's memory per pending nack at scale, end to end: the process's RSS growth
with real traffic (pulsar-lite), and ``stats()["nbytes"]`` against it.

Runs ``python -m bench.consumer_memory``'s measurement of one TrackedConsumer in a
fresh process (nothing of the test session in its RSS)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("pulsar")

from bench import consumer_memory  # noqa: E402
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
