"""A synchronous consumer with a ``message_listener``, nacking through nacktracker.

Plain ``pulsar.Client`` code: ``nacktracker.sync.subscribe`` is the only change from
``client.subscribe``. The listener runs on the consumer's listener thread, as the
client's own would; the ``consumer`` it is given is the tracked one, so its
``negative_acknowledge(msg, delay_ms=…)`` comes back exactly at its time and its
``acknowledge`` cancels what is pending. No event loop in sight: the consumer runs
its tracker on a thread of its own.

    python examples/sync_listener_thread.py

Uses ``$PULSAR_URL`` when set, else starts an embedded pulsar-lite broker.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

import pulsar

import nacktracker.sync
from nacktracker.testing import pulsar_service

TASKS = [f"task-{i}" for i in range(5)]
FLAKY = {"task-1", "task-3"}  # fail on their first delivery
RETRY_MS = 400


def main(url: str) -> int:
    finished = threading.Event()
    acked: set[str] = set()
    nacked_at: dict[str, float] = {}
    lock = threading.Lock()
    topic = f"persistent://public/default/example-sync-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))

    def listener(consumer: nacktracker.sync.SyncConsumer, msg: pulsar.Message) -> None:
        task = msg.data().decode()
        thread = threading.current_thread().name
        if task in FLAKY and task not in nacked_at:
            nacked_at[task] = time.monotonic()
            consumer.negative_acknowledge(msg, delay_ms=RETRY_MS)
            print(f"[{thread}] {task}: failed -> negative_acknowledge(delay_ms={RETRY_MS})")
            return
        consumer.acknowledge(msg)
        late = "" if task not in nacked_at else \
            f", redelivered after {(time.monotonic() - nacked_at[task]) * 1000:.0f} ms (asked for {RETRY_MS} ms)"
        print(f"[{thread}] {task}: acknowledged (redelivery_count={msg.redelivery_count()}{late})")
        with lock:
            acked.add(task)
            if len(acked) == len(TASKS):
                finished.set()

    try:
        consumer = nacktracker.sync.subscribe(client, topic, "sync-workers", consumer_type=pulsar.ConsumerType.Shared,
                                              initial_position=pulsar.InitialPosition.Earliest,
                                              message_listener=listener)
        with consumer:
            print(f"publishing {len(TASKS)} tasks; {sorted(FLAKY)} fail once")
            producer = client.create_producer(topic, batching_enabled=False)
            for task in TASKS:
                producer.send(task.encode())
            producer.close()
            if not finished.wait(15):
                print(f"timed out: acknowledged only {sorted(acked)}")
                return 1
            stats = consumer.stats()
            print(f"all {len(TASKS)} tasks acknowledged; tracker: {stats['nacks']} nacks, "
                  f"{stats['redelivered']} redelivered, {stats['pending']} pending")
        return 0
    finally:
        client.close()


if __name__ == "__main__":
    with pulsar_service() as service_url:
        sys.exit(main(service_url))
