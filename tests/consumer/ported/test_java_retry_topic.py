"""Pulsar's own RetryTopicTest (the Java client's, in apache/pulsar), ported by intent.

Each case, on a Shared subscription as the Java test's: messages reconsumed (``reconsume_later``,
Java's ``reconsumeLater``) at every delivery until their ``max_redeliver_count`` is spent (the
client's ``dead_letter_policy``, here the consumer's ``max_redeliveries``), so each is received
``max + 1`` times, then reaches the
dead-letter topic once, and nothing is left on the subscription or its retry topic. Java's
delay is 1 s; 100 ms here (a retry the broker delivers early is held until due). Run on both
brokers.

Ported: ``testRetryTopic``, ``testRetryTopicWithMultiTopic`` (with retries rather than an ack
timeout: the dead-letter cases test that, ``test_java_dead_letter_topic.py``) and
``testRetryTopicByCustomTopicName`` (``retry_letter_topic``: pulsar-client's Python
``ConsumerDeadLetterPolicy`` has no retry topic field). Java's topic names (``<topic>-<subscription>-RETRY``,
``-DLQ``) and properties are checked against the Java client itself in ``test_java_interop.py``.
"""

from __future__ import annotations

import pytest

pulsar = pytest.importorskip("pulsar")
import pulsar.asyncio  # noqa: E402

import nacktracker  # noqa: E402
from nacktracker.consumer import ReceiveTimeout  # noqa: E402

pytestmark = pytest.mark.broker

N = 10
SUB = "my-subscription"
Earliest = pulsar.InitialPosition.Earliest


async def reconsume_every_delivery(consumer, deliveries: int) -> list[bytes]:
    got = []
    for _ in range(deliveries):
        msg = await consumer.receive(timeout_ms=15_000)
        got.append(msg.data())
        await consumer.reconsume_later(msg, delay_ms=100)
    return got


async def drain(client, dlq: str, n: int) -> list[bytes]:
    letters = await nacktracker.subscribe(client, dlq, SUB, initial_position=Earliest)
    async with letters:
        out = []
        for _ in range(n):
            msg = await letters.receive(timeout_ms=15_000)
            await letters.acknowledge(msg)
            out.append(msg.data())
        with pytest.raises(ReceiveTimeout):  # once each
            await letters.receive(timeout_ms=500)
        return out


async def nothing_left(client, topics) -> None:
    check = await nacktracker.subscribe(client, topics, SUB, initial_position=Earliest)
    async with check:
        with pytest.raises(ReceiveTimeout):
            await check.receive(timeout_ms=1500)


async def publish(client, t: str, n: int = N) -> list[bytes]:
    producer = await client.create_producer(t)
    sent = [f"{t.rsplit('/', 1)[-1]} [{i}]".encode() for i in range(n)]
    for data in sent:
        await producer.send(data)
    await producer.close()
    return sent


async def test_retry_topic(client, topic):
    t = topic("retry-topic")
    consumer = await nacktracker.subscribe(client, t, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                           enable_retry=True, initial_position=Earliest,
                                           dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(2))
    async with consumer:
        sent = await publish(client, t)
        got = await reconsume_every_delivery(consumer, N * 3)
        assert sorted(got) == sorted(sent * 3)
        assert sorted(await drain(client, f"{t}-{SUB}-DLQ", N)) == sorted(sent)
    await nothing_left(client, [t, f"{t}-{SUB}-RETRY"])


async def test_retry_topic_with_multi_topic(client, topic):
    """Two topics: the retry and dead-letter topics are the first topic's (Java's names)."""
    t1, t2 = topic("retry-topic-1"), topic("retry-topic-2")
    consumer = await nacktracker.subscribe(client, [t1, t2], SUB, consumer_type=pulsar.ConsumerType.Shared,
                                           enable_retry=True, initial_position=Earliest,
                                           dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(2))
    async with consumer:
        sent = await publish(client, t1, N // 2) + await publish(client, t2, N // 2)
        got = await reconsume_every_delivery(consumer, N * 3)
        assert sorted(got) == sorted(sent * 3)
        assert sorted(await drain(client, f"{t1}-{SUB}-DLQ", N)) == sorted(sent)
    await nothing_left(client, [t1, t2, f"{t1}-{SUB}-RETRY"])


async def test_retry_topic_by_custom_topic_name(client, topic):
    t = topic("retry-topic")
    custom = topic("my-subscription-custom-Retry")
    consumer = await nacktracker.subscribe(client, t, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                           enable_retry=True, retry_letter_topic=custom,
                                           initial_position=Earliest,
                                           dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(2))
    async with consumer:
        sent = await publish(client, t)
        got = await reconsume_every_delivery(consumer, N * 3)
        assert sorted(got) == sorted(sent * 3)
        assert sorted(await drain(client, f"{t}-{SUB}-DLQ", N)) == sorted(sent)
    await nothing_left(client, [t, custom])
