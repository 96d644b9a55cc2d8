"""Wrap a ``pulsar.asyncio`` consumer you already have in a TrackedConsumer.

Your code keeps subscribing as it does; two settings matter: a Shared (or
Key_Shared) subscription, and ``negative_ack_redelivery_delay_ms=100`` (the
client's minimum): nacktracker does the delaying, the client's own nack path
only carries the redeliveries it asks for. Everything else (``receive``,
``acknowledge``, ``async with``/``async for``) stays as it was, and
``negative_acknowledge`` takes a per-message ``delay_ms``.

    python examples/wrap_existing_consumer.py

Uses ``$PULSAR_URL`` when set, else starts an embedded pulsar-lite broker.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import pulsar
import pulsar.asyncio

from nacktracker import TrackedConsumer
from nacktracker.consumer import ConsumerOptions
from nacktracker.testing import pulsar_service

RETRY_MS = 300


async def main(url: str) -> int:
    topic = f"persistent://public/default/example-wrap-{uuid.uuid4().hex[:8]}"
    # ConsoleLogger at Error: the C++ client would log every connection on stdout.
    client = pulsar.asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = await client.create_producer(topic, batching_enabled=False)
        for i in range(3):
            await producer.send(f"order-{i}".encode())
        await producer.close()
        print(f"published order-0..order-2 to {topic}")

        # The consumer your application already has...
        raw = await client.subscribe(topic, "billing", consumer_type=pulsar.ConsumerType.Shared,
                                     initial_position=pulsar.InitialPosition.Earliest,
                                     negative_ack_redelivery_delay_ms=100)
        # ...wrapped: same calls, tracked nacks. client= is only needed for dead letters.
        async with TrackedConsumer(raw, client=client, options=ConsumerOptions(delay_ms=1000, precision_bits=0)) as consumer:
            loop = asyncio.get_running_loop()
            nacked_at = 0.0
            for _ in range(3):
                msg = await consumer.receive(timeout_ms=5000)
                if msg.data() == b"order-1":
                    # this one, this delay: not "the consumer's delay + up to a third of it"
                    await consumer.negative_acknowledge(msg, delay_ms=RETRY_MS)
                    nacked_at = loop.time()
                    print(f"received {msg.data().decode()} -> nacked, retry in {RETRY_MS} ms")
                else:
                    await consumer.acknowledge(msg)
                    print(f"received {msg.data().decode()} -> acknowledged")
            msg = await consumer.receive(timeout_ms=5000)
            waited_ms = (loop.time() - nacked_at) * 1000
            print(f"redelivered {msg.data().decode()} after {waited_ms:.0f} ms (asked for {RETRY_MS} ms), "
                  f"redelivery_count={msg.redelivery_count()}")
            await consumer.acknowledge(msg)
            stats = consumer.stats()
            print(f"tracker: {stats['nacks']} nack, {stats['redelivered']} redelivered, {stats['pending']} pending, "
                  f"{stats['nbytes']} bytes")
            return 0 if msg.data() == b"order-1" and msg.redelivery_count() == 1 else 1
    finally:
        await client.close()


if __name__ == "__main__":
    with pulsar_service() as service_url:
        sys.exit(asyncio.run(main(service_url)))
