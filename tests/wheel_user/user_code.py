"""What a user's type checker sees of nacktracker installed from its wheel
(tests/test_typing_wheel.py runs mypy --strict on this file). Never run.

``assert_type`` checks that each public name resolves to what it is, not ``Any``; each
``# type: ignore[code]`` is an error that must be reported (``warn_unused_ignores``:
if the error went away, the ignore itself is reported).
"""

from __future__ import annotations

from typing import Any, assert_type

import pulsar
import pulsar.asyncio

import nacktracker
from nacktracker import (
    ConsumerClosed,
    NacktrackerError,
    NegativeAcksTracker,
    ReceiveTimeout,
    SnapshotError,
    TrackedConsumer,
    TrackerStats,
    subscribe,
)
from nacktracker.adapters import MemoryAdapter
from nacktracker.consumer import subscribe as consumer_subscribe
from nacktracker.errors import DeadLetterError, NotReceivedError, TrackerClosedError


async def consume(client: pulsar.asyncio.Client) -> None:
    consumer = await nacktracker.subscribe(client, "topic", "subscription", delay_ms=500, precision_bits=8,
                                           max_redeliveries=3, receiver_queue_size=100)
    assert_type(consumer, TrackedConsumer)
    assert_type(await subscribe(client, ["a", "b"], "s"), TrackedConsumer)
    assert_type(await consumer_subscribe(client, "t", "s", snapshot_path="/tmp/x"), TrackedConsumer)
    assert_type(nacktracker.TrackedConsumer, type[TrackedConsumer])

    msg = await consumer.receive(timeout_ms=100)
    assert_type(msg, pulsar.Message)
    async for each in consumer:
        assert_type(each, pulsar.Message)
    await consumer.acknowledge(msg)
    await consumer.negative_acknowledge(msg, delay_ms=1_000)
    await consumer.reconsume_later(msg, 5_000)
    assert_type(consumer.stats(), dict[str, Any])
    assert_type(consumer.topic(), str)
    assert_type(consumer.closed, bool)
    assert_type(consumer.tracker, NegativeAcksTracker)
    await consumer.close()

    # mistakes a type checker must catch
    await subscribe(client, "t", "s", delay_ms="soon")  # type: ignore[arg-type]
    await subscribe(client, "t", "s", precison_bits=8)  # type: ignore[call-arg]
    await subscribe(client, "t", "s", redelivery="sometimes")  # type: ignore[arg-type]
    consumer.no_such_method()  # type: ignore[attr-defined]
    print(nacktracker.no_such_name)  # type: ignore[attr-defined]


def tracker_side() -> None:
    tracker = NegativeAcksTracker(MemoryAdapter(), delay_ms=1_000)
    assert_type(tracker.stats(), TrackerStats)
    assert_type(tracker.pending, int)


def errors() -> None:
    for error in (ConsumerClosed, ReceiveTimeout, SnapshotError, DeadLetterError, NotReceivedError,
                  TrackerClosedError):
        assert issubclass(error, NacktrackerError)
    try:
        pass
    except ReceiveTimeout as timeout:
        assert_type(timeout, ReceiveTimeout)
    except NacktrackerError as error:
        assert_type(error, NacktrackerError)
    assert_type(SnapshotError("bad"), SnapshotError)
    ok: ValueError = SnapshotError("bad")  # each error is also the built-in it stands for
    closed: pulsar.asyncio.PulsarException = ConsumerClosed()  # and the pulsar one
    del ok, closed
