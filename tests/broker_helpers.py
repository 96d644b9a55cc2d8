"""Helpers shared by the broker tests (not fixtures, so a plain module)."""

from __future__ import annotations

import asyncio


async def publish_batch(client, topic, n, prefix=b"b"):
    """``n`` messages in one batch entry."""
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_messages=n,
                                            batching_max_publish_delay_ms=5000)
    await asyncio.gather(*[producer.send(prefix + b"%d" % i) for i in range(n)])
    await producer.close()
