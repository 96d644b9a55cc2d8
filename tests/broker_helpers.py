"""Helpers shared by the broker tests (not fixtures, so a plain module)."""

from __future__ import annotations

import asyncio


async def receive_all(consumer, ms=1000):
    """Everything the consumer surfaces until ``ms`` pass without a message."""
    from nacktracker.consumer import ReceiveTimeout

    got = []
    while True:
        try:
            got.append(await consumer.receive(timeout_ms=ms))
        except ReceiveTimeout:
            return got


async def publish_batch(client, topic, n, prefix=b"b"):
    """``n`` messages in one batch entry."""
    producer = await client.create_producer(topic, batching_enabled=True, batching_max_messages=n,
                                            batching_max_publish_delay_ms=5000)
    await asyncio.gather(*[producer.send(prefix + b"%d" % i) for i in range(n)])
    await producer.close()


async def redelivery_errors(consumer, due, now_ms, timeout_ms=4000):
    """Receive and acknowledge until as many messages as ``due`` (data -> due
    time, ms) came back; check they are exactly those; return data -> arrival
    − due (ms, rounded)."""
    back = {}
    while len(back) < len(due):
        msg = await consumer.receive(timeout_ms=timeout_ms)
        back[msg.data()] = now_ms()
        await consumer.acknowledge(msg)
    assert set(back) == set(due)
    return {d: round(back[d] - due[d]) for d in due}


async def settle_before_restart(consumer, msgs, now_ms):
    """The restart scenario (tests/brokers/test_reliability.py, tests/brokers/test_pulsar_local.py):
    nack m0 (2500 ms), m1 (3500 ms) and b1 (3000 ms, one message of a batch
    entry), ack m2, b0 and b3 (``msgs``: data -> received message); b2 stays
    held. Returns data -> due time (ms) of the nacked ones."""
    due = {}
    for data, delay in ((b"m0", 2500), (b"m1", 3500), (b"b1", 3000)):
        nacked_at = now_ms()  # the nack is stamped inside the call: its due time is never before this
        await consumer.negative_acknowledge(msgs[data], delay_ms=delay)
        due[data] = nacked_at + delay
    for data in (b"m2", b"b0", b"b3"):
        await consumer.acknowledge(msgs[data])
    return due
