"""A synchronous pulsar consumer with a ``message_listener``, nacking through nacktracker.

The client calls the listener on its own listener thread. The tracker lives
on an asyncio loop in the main thread (its one timer and the PulsarAdapter's
bursts run there); the listener thread hands a nack over with
``tracker.add_threadsafe(msg, delay_ms=…)``, which checks the arguments in the
calling thread and schedules the add on the loop. The PulsarAdapter redelivers
through the sync consumer's own nack path, which is why the consumer is
subscribed with ``negative_ack_redelivery_delay_ms=100`` (the client's minimum).

    python examples/sync_listener_thread.py

Uses ``$PULSAR_URL`` when set, else starts an embedded pulsar-lite broker.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid

import pulsar

from nacktracker import NegativeAcksTracker
from nacktracker.adapters.pulsar import MIN_NACK_DELAY_MS, PulsarAdapter
from nacktracker.testing import pulsar_service

TASKS = [f"task-{i}" for i in range(5)]
FLAKY = {"task-1", "task-3"}  # fail on their first delivery
RETRY_MS = 400


async def main(url: str) -> int:
    loop = asyncio.get_running_loop()
    finished = asyncio.Event()
    acked: set[str] = set()
    nacked_at: dict[str, float] = {}
    lock = threading.Lock()
    topic = f"persistent://public/default/example-sync-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    tracker: NegativeAcksTracker

    def listener(consumer: pulsar.Consumer, msg: pulsar.Message) -> None:
        # Runs on the client's listener thread, not the event loop's.
        task = msg.data().decode()
        thread = "main thread" if threading.current_thread() is threading.main_thread() else "listener thread"
        if task in FLAKY and msg.redelivery_count() == 0:
            nacked_at[task] = time.monotonic()
            tracker.add_threadsafe(msg, delay_ms=RETRY_MS)
            print(f"[{thread}] {task}: failed -> tracker.add_threadsafe(delay_ms={RETRY_MS})")
            return
        consumer.acknowledge(msg)
        # An ack must cancel a pending nack of the same message; the tracker is the loop's.
        loop.call_soon_threadsafe(tracker.discard, msg.message_id())
        late = "" if task not in nacked_at else \
            f", redelivered after {(time.monotonic() - nacked_at[task]) * 1000:.0f} ms (asked for {RETRY_MS} ms)"
        print(f"[{thread}] {task}: acknowledged (redelivery_count={msg.redelivery_count()}{late})")
        with lock:
            acked.add(task)
            if len(acked) == len(TASKS):
                loop.call_soon_threadsafe(finished.set)

    try:
        consumer = client.subscribe(topic, "sync-workers", consumer_type=pulsar.ConsumerType.Shared,
                                    initial_position=pulsar.InitialPosition.Earliest,
                                    negative_ack_redelivery_delay_ms=MIN_NACK_DELAY_MS, message_listener=listener)
        adapter = PulsarAdapter(consumer)
        tracker = NegativeAcksTracker(adapter, precision_bits=0)  # made inside the loop: bound to it
        print(f"publishing {len(TASKS)} tasks; {sorted(FLAKY)} fail once")
        producer = client.create_producer(topic, batching_enabled=False)
        for task in TASKS:  # published after the tracker exists: the listener may use it at once
            producer.send(task.encode())
        producer.close()
        try:
            await asyncio.wait_for(finished.wait(), 15)
        except asyncio.TimeoutError:
            print(f"timed out: acknowledged only {sorted(acked)}")
            return 1
        stats = tracker.stats()
        print(f"all {len(TASKS)} tasks acknowledged; tracker: {stats['nacks']} nacks, "
              f"{stats['redelivered']} redelivered, {stats['pending']} pending")
        consumer.close()
        await tracker.close()
        await adapter.aclose()
        return 0
    finally:
        client.close()


if __name__ == "__main__":
    with pulsar_service() as service_url:
        sys.exit(asyncio.run(main(service_url)))
