"""Pulsar's own DeadLetterTopicTest (the Java client's, in apache/pulsar), ported by intent.

Each case subscribes as the plain client's code would -- Shared, as the Java test does, an ack
timeout and a ``dead_letter_policy`` (``pulsar.ConsumerDeadLetterPolicy``), done here by the consumer's
``ack_timeout_ms`` and ``max_redeliveries`` -- receives every message without ever acking,
and checks that each message was delivered ``max_redeliver_count + 1`` times, then reached the
dead-letter topic once, with what it carried (key, ordering key, event time, payload) and Java's
properties (``REAL_TOPIC``, ``REAL_SUBSCRIPTION``, ``ORIGIN_MESSAGE_ID``), and that nothing is
left on the subscription. The ack timeout is Java's 1 s (the C++ client refuses less than 10 s;
the consumer times acks itself). Run on both brokers; the partitioned case needs Apache Pulsar.

Ported: the message-key, ordering-key, event-time, producer-name and original-info cases (one
scenario checks them all), ``testDeadLetterTopic`` (non-chunked), ``testDeadLetterTopicWithMultiTopic``
(disabled in Java; it holds here), ``testDeadLetterTopicByCustomTopicName``,
``testDeadLetterTopicWithInitialSubscription``, ``testDeadLetterTopicUnderPartitionedTopicWithKeyShareType``
and ``testDeadLetterWithoutConsumerReceiveImmediately``. Elsewhere: three consumers dead-lettering
once (``test_brokers.py``), chunked messages (the chunked-message tests). Not ported: the schema
cases (Avro, AUTO_CONSUME: pulsar-client's Python schemas differ), the Java client's internals.
"""

from __future__ import annotations

import asyncio
import re

import pytest

pulsar = pytest.importorskip("pulsar")
import pulsar.asyncio  # noqa: E402

import nacktracker  # noqa: E402
from nacktracker.consumer import (  # noqa: E402
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_SUBSCRIPTION,
    PROPERTY_REAL_TOPIC,
    ReceiveTimeout,
)

pytestmark = pytest.mark.broker

N = 20
SUB = "my-subscription"
Earliest = pulsar.InitialPosition.Earliest


def java_id(mid) -> str:
    text = f"{mid.ledger_id()}:{mid.entry_id()}:{mid.partition()}"
    return text if mid.batch_index() < 0 else f"{text}:{mid.batch_index()}"


async def never_ack(consumer, deliveries: int) -> list:
    """Receive ``deliveries`` messages, acking none (the ack timeout redelivers, then dead-letters)."""
    return [await consumer.receive(timeout_ms=10_000) for _ in range(deliveries)]


async def drain(consumer, n: int) -> list:
    letters = []
    for _ in range(n):
        msg = await consumer.receive(timeout_ms=10_000)
        await consumer.acknowledge(msg)
        letters.append(msg)
    return letters


async def nothing_left(client, topics, subscription=SUB, kind=pulsar.ConsumerType.Shared) -> None:
    """Java's check consumer: the subscription has nothing left once every message is dead-lettered."""
    check = await nacktracker.subscribe(client, topics, subscription, consumer_type=kind, initial_position=Earliest)
    async with check:
        with pytest.raises(ReceiveTimeout):
            await check.receive(timeout_ms=1500)


async def test_dead_letters_keep_what_the_message_carried_and_name_their_origin(client, topic):
    t = topic("dead-letter-topic")
    consumer = await nacktracker.subscribe(client, t, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                           consumer_name="my-consumer", initial_position=Earliest,
                                           unacked_messages_timeout_ms=1000,  # Java's ackTimeout(1 s)
                                           dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(1))
    letters = await nacktracker.subscribe(client, f"{t}-{SUB}-DLQ", SUB, initial_position=Earliest)
    producer = await client.create_producer(t, batching_enabled=False)
    sent = {}
    for i in range(N):
        mid = await producer.send(f"Hello Pulsar [{i}]".encode(), partition_key="test-key", ordering_key="order",
                                  event_timestamp=1_700_000_000_000 + i)
        sent[f"Hello Pulsar [{i}]".encode()] = java_id(mid)
    await producer.close()
    async with consumer:
        got = await never_ack(consumer, N * 2)
        assert sorted(m.data() for m in got) == sorted(list(sent) * 2)  # each twice: first delivery, one more
        dead = await drain(letters, N)
        assert sorted(m.data() for m in dead) == sorted(sent)
        for m in dead:
            assert (m.partition_key(), m.ordering_key()) == ("test-key", "order")
            assert m.event_timestamp() == 1_700_000_000_000 + int(m.data()[14:-1])
            props = m.properties()
            assert (props[PROPERTY_REAL_TOPIC], props[PROPERTY_REAL_SUBSCRIPTION]) == (t, SUB)
            assert props[PROPERTY_ORIGIN_MESSAGE_ID] == sent[m.data()]
            assert re.fullmatch(rf"{re.escape(t)}-{SUB}-my-consumer-[a-zA-Z0-9]{{5}}-DLQ", m.producer_name())
        with pytest.raises(ReceiveTimeout):
            await consumer.receive(timeout_ms=1500)  # every message dead-lettered: nothing more comes
    await letters.close()
    await nothing_left(client, t)


async def test_batched_messages_each_reach_the_dead_letter_topic_once(client, topic):
    """``testDeadLetterTopic`` (not chunked): batched messages, maxRedeliverCount 2, keys carried."""
    t = topic("dead-letter-topic")
    consumer = await nacktracker.subscribe(client, t, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                           initial_position=Earliest, ack_timeout_ms=1000,
                                           dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(2))
    letters = await nacktracker.subscribe(client, f"{t}-{SUB}-DLQ", SUB, initial_position=Earliest)
    producer = await client.create_producer(t, batching_enabled=True)
    await asyncio.gather(*[producer.send(f"Hello Pulsar [{i}]".encode(), partition_key=str(i)) for i in range(N)])
    await producer.close()
    async with consumer:
        await never_ack(consumer, N * 3)
        dead = await drain(letters, N)
        assert sorted((m.partition_key(), m.data()) for m in dead) == \
            sorted((str(i), f"Hello Pulsar [{i}]".encode()) for i in range(N))
    await letters.close()
    await nothing_left(client, t)


async def test_a_multi_topic_consumer_dead_letters_each_topics_messages_beside_it(client, topic):
    """Java's ``testDeadLetterTopicWithMultiTopic`` (disabled there): each topic's letters go to its own
    ``<topic>-<subscription>-DLQ``."""
    t1, t2 = topic("dead-letter-topic-1"), topic("dead-letter-topic-2")
    consumer = await nacktracker.subscribe(client, [t1, t2], SUB, consumer_type=pulsar.ConsumerType.Shared,
                                           initial_position=Earliest, ack_timeout_ms=1000,
                                           dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(2))
    letters = await nacktracker.subscribe(client, [f"{t1}-{SUB}-DLQ", f"{t2}-{SUB}-DLQ"], SUB, initial_position=Earliest)
    sent = set()
    for t in (t1, t2):
        producer = await client.create_producer(t)
        for i in range(N // 2):
            await producer.send(f"{t}[{i}]".encode())
            sent.add((f"{t}-{SUB}-DLQ", f"{t}[{i}]".encode()))
        await producer.close()
    async with consumer:
        await never_ack(consumer, N * 3)
        dead = await drain(letters, N)
        assert sorted((m.topic_name(), m.data()) for m in dead) == sorted(sent)
    await letters.close()
    await nothing_left(client, [t1, t2])


async def test_a_custom_dead_letter_topic_and_an_initial_subscription_made_before_the_first_letter(client, topic):
    """``testDeadLetterTopicByCustomTopicName`` and ``testDeadLetterTopicWithInitialSubscription``: the
    policy's topic and initial subscription; a consumer of that subscription, subscribing only once
    the letters were published (its position: Latest), still gets every one."""
    t = topic("dead-letter-topic")
    custom = topic("dead-letter-custom-topic-my-subscription-custom-DLQ")
    policy = pulsar.ConsumerDeadLetterPolicy(1, custom, "init-sub")
    consumer = await nacktracker.subscribe(client, t, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                           initial_position=Earliest, ack_timeout_ms=1000,
                                           dead_letter_policy=policy)
    producer = await client.create_producer(t)
    for i in range(N):
        await producer.send(f"Hello Pulsar [{i}]".encode())
    await producer.close()
    async with consumer:
        await never_ack(consumer, N * 2)
        for _ in range(100):  # published and acknowledged by the consumer
            if consumer.stats()["dead_letter_published"] == N:
                break
            await asyncio.sleep(0.1)
        assert consumer.stats()["dead_letter_published"] == N
    letters = await nacktracker.subscribe(client, custom, "init-sub")  # Latest: it sees only what its subscription kept
    dead = await drain(letters, N)
    assert sorted(m.data() for m in dead) == sorted(f"Hello Pulsar [{i}]".encode() for i in range(N))
    await letters.close()
    await nothing_left(client, t)


async def test_partitioned_key_shared_dead_letters_go_to_each_partitions_topic(client, topic, session_broker,
                                                                               broker_kind):
    if broker_kind != "apache" or session_broker is None:
        pytest.skip("partitioned topics need Apache Pulsar's admin API (pulsar-lite has none)")
    t = topic("dead-letter-topic-with-partitioned-topic")
    session_broker.admin("PUT", f"/admin/v2/persistent/{t.removeprefix('persistent://')}/partitions", 2)
    Key_Shared = pulsar.ConsumerType.KeyShared
    consumer = await nacktracker.subscribe(client, t, SUB, consumer_type=Key_Shared, initial_position=Earliest,
                                           ack_timeout_ms=1000, dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(2))
    dlqs = [f"{t}-partition-{p}-{SUB}-DLQ" for p in (0, 1)]
    letters = await nacktracker.subscribe(client, dlqs, SUB, initial_position=Earliest)
    producer = await client.create_producer(t, batching_enabled=False)
    for i in range(4):
        await producer.send(f"Hello Pulsar [{i}]".encode(), partition_key=f"k{i}")
    await producer.close()
    async with consumer:
        got = await never_ack(consumer, 4 * 3)
        dead = await drain(letters, 4)
        where = {m.data(): m.topic_name() for m in got}
        assert {m.data(): m.topic_name() for m in dead} == {d: f"{where[d]}-{SUB}-DLQ" for d in where}
    await letters.close()
    await nothing_left(client, t, kind=Key_Shared)


async def test_nothing_is_dead_lettered_while_the_application_has_not_received_it(client, topic):
    """``testDeadLetterWithoutConsumerReceiveImmediately``: the ack timeout starts when the application
    receives the message, not when the consumer does."""
    t = topic("dead-letter-topic-without-consumer-receive-immediately")
    consumer = await nacktracker.subscribe(client, t, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                           ack_timeout_ms=1000,
                                           dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(1))
    async with consumer:
        producer = await client.create_producer(t)
        await producer.send(b"a message")
        await producer.close()
        await asyncio.sleep(2.5)  # more than two ack timeouts
        assert (await consumer.receive(timeout_ms=1000)).data() == b"a message"
        assert consumer.stats()["dead_letter_published"] == 0
