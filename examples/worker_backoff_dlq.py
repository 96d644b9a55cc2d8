"""An asyncio worker with exponential backoff and a dead-letter topic.

Six jobs; ``job-2`` fails twice before it succeeds, ``job-4`` always fails.
Each failure is nacked without a delay, so ``MultiplierBackoff(100, 1000)``
picks it from the redelivery count (100, 200, 400 ms, ...). After
``max_redeliveries=3`` redeliveries the next nack publishes the message to the
dead-letter topic (with ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID`` properties,
as Pulsar's Java client does) and acknowledges it.

    python examples/worker_backoff_dlq.py

Uses ``$PULSAR_URL`` when set, else starts an embedded pulsar-lite broker.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import pulsar
import pulsar.asyncio

import nacktracker
from nacktracker import MultiplierBackoff
from nacktracker.testing import pulsar_service

JOBS = [f"job-{i}" for i in range(6)]
FAILURES = {"job-2": 2, "job-4": 1_000}  # how many attempts fail before one succeeds
MAX_REDELIVERIES = 3


class JobFailed(Exception):
    pass


def process(job: str, attempt: int) -> None:
    """The application's work: raises for the attempts that fail."""
    if attempt <= FAILURES.get(job, 0):
        raise JobFailed(f"{job} failed on attempt {attempt}")


async def main(url: str) -> int:
    topic = f"persistent://public/default/example-jobs-{uuid.uuid4().hex[:8]}"
    dlq = f"{topic}-DLQ"
    client = pulsar.asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    backoff = MultiplierBackoff(100, 1000)
    done: set[str] = set()
    all_done = asyncio.Event()
    try:
        # Watch the dead-letter topic from the start (a TrackedConsumer: its receive(timeout_ms=)
        # is safe to time out, unlike the plain client's receive() under asyncio.wait_for).
        dead_letters = await nacktracker.subscribe(client, dlq, "inspect",
                                                   initial_position=pulsar.InitialPosition.Earliest)
        # Shared: the workload nacks message by message, and the broker redelivers each (its
        # redelivery_count drives the backoff); the client's default type, Exclusive, would keep them here.
        consumer = await nacktracker.subscribe(client, topic, "workers", consumer_type=pulsar.ConsumerType.Shared,
                                               backoff=backoff,
                                               max_redeliveries=MAX_REDELIVERIES, dead_letter_topic=dlq,
                                               precision_bits=0)
        producer = await client.create_producer(topic, batching_enabled=False)
        for job in JOBS:
            await producer.send(job.encode())
        await producer.close()
        print(f"published {len(JOBS)} jobs; backoff {backoff}, max_redeliveries={MAX_REDELIVERIES}, DLQ {dlq}")

        loop = asyncio.get_running_loop()
        start = loop.time()

        async def worker() -> None:
            async for msg in consumer:  # ends when the consumer is closed
                job, attempt = msg.data().decode(), msg.redelivery_count() + 1
                try:
                    process(job, attempt)
                except JobFailed:
                    # no delay_ms: the consumer's backoff picks it from the redelivery count
                    await consumer.negative_acknowledge(msg)
                    fate = "dead-letter topic" if attempt > MAX_REDELIVERIES else \
                        f"retry in {backoff(msg.redelivery_count())} ms"
                    print(f"  +{(loop.time() - start) * 1000:4.0f} ms  {job}: attempt {attempt} failed -> nack, {fate}")
                    continue
                await consumer.acknowledge(msg)
                print(f"  +{(loop.time() - start) * 1000:4.0f} ms  {job}: attempt {attempt} succeeded -> ack")
                done.add(job)
                if len(done) == len(JOBS) - 1:
                    all_done.set()

        task = asyncio.create_task(worker())
        dead = await dead_letters.receive(timeout_ms=15_000)
        await dead_letters.acknowledge(dead)
        props = dead.properties()
        print(f"dead-lettered {dead.data().decode()} after {MAX_REDELIVERIES + 1} deliveries "
              f"(REAL_TOPIC={props.get('REAL_TOPIC')}, ORIGIN_MESSAGE_ID={props.get('ORIGIN_MESSAGE_ID')})")
        await asyncio.wait_for(all_done.wait(), 15)
        stats = consumer.stats()
        await consumer.close()
        await task
        await dead_letters.close()
        print(f"done: {len(done)} acknowledged, {stats['dead_letter_published']} dead-lettered, "
              f"{stats['nacks']} nacks, {stats['redelivered']} redeliveries, {stats['pending']} pending")
        return 0 if dead.data() == b"job-4" and done == set(JOBS) - {"job-4"} else 1
    finally:
        await client.close()


if __name__ == "__main__":
    with pulsar_service() as service_url:
        sys.exit(asyncio.run(main(service_url)))
