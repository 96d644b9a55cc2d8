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
scenario checks them all; ``testDeadLetterTopicWithBinaryMessageKey`` and the ordering key's bytes in a
second), ``testDeadLetterTopic`` (non-chunked), ``testDeadLetterTopicWithMultiTopic``
(disabled in Java; it holds here), ``testDeadLetterTopicByCustomTopicName``,
``testDeadLetterTopicWithInitialSubscription``, ``testDeadLetterTopicUnderPartitionedTopicWithKeyShareType``,
``testDeadLetterWithoutConsumerReceiveImmediately``, ``testMultipleSameNameConsumersToDeadLetterTopic``,
``testDeadLetterTopicWithInitialSubscriptionAndMultiConsumers``, ``testDeadLetterTopicWithMaxUnackedMessagesBlocking``
(topic policies: Apache Pulsar), ``testAckedBatchMessageNotSentToDeadLetterTopicOnFinalRedeliveryRound``
(batch-index acks: Apache Pulsar) and ``testDeadLetterTopicWithProducerBuilder`` (its retries and initial
subscription; the producer customizer is Java's API). Elsewhere: ``testDuplicatedMessageSendToDeadLetterTopic``
(three consumers dead-lettering once, ``tests/brokers/test_brokers.py``), chunked messages (the
chunked-message tests). Not ported: the schema cases (``testAutoConsumeSchemaDeadLetter``,
``testCloseDeadLetterTopicProducerOnExceptionToPreventProducerLeak`` and
``sendDeadLetterTopicWithMismatchSchemaProducer`` need Java's AUTO_CONSUME and AUTO_PRODUCE_BYTES schemas
or an incompatible Avro schema on one topic, which pulsar-client's Python client lacks), ``testDeadLetterPolicyDeserialize`` (the Java builder's ``loadConf``) and
``testCheckUnnecessaryGetPartitionedTopicMetadataWhenUseRetryAndDQL`` (a mocked Java client's lookups).
"""

from __future__ import annotations

import asyncio
import re
import uuid

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


async def test_binary_keys_reach_the_dead_letter_topic(client, topic):
    """``testDeadLetterTopicWithBinaryMessageKey`` and the ordering-key case's bytes: keys made of the bytes
    1, 2, 3, 4 (pulsar-client's Python keys are str: the same bytes on the wire) come through unchanged."""
    t = topic("dead-letter-topic")
    key = "\x01\x02\x03\x04"
    consumer = await nacktracker.subscribe(client, t, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                           initial_position=Earliest, ack_timeout_ms=1000,
                                           dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(1))
    letters = await nacktracker.subscribe(client, f"{t}-{SUB}-DLQ", SUB, initial_position=Earliest)
    producer = await client.create_producer(t, batching_enabled=False)
    for i in range(N):
        await producer.send(f"Hello Pulsar [{i}]".encode(), partition_key=key, ordering_key=key)
    await producer.close()
    async with consumer:
        await never_ack(consumer, N * 2)
        dead = await drain(letters, N)
        assert {(m.partition_key(), m.ordering_key()) for m in dead} == {(key, key)}
    await letters.close()


async def test_same_named_consumers_dead_letter_each_message_once(client, topic):
    """``testMultipleSameNameConsumersToDeadLetterTopic``: three consumers of one Shared subscription, all
    named ``my-consumer``, never acking (ack timeout and nack delay 1001 ms), one dead-letter topic: each
    message is received twice in all and reaches the dead-letter topic once (the three dead-letter
    producers' names differ, or the broker would refuse two of them)."""
    t = topic("same-name-consumers-dead-letter-topic")
    dlq = f"{t}-DLQ"
    consumers = [await nacktracker.subscribe(client, t, "my-subscription-DuplicatedMessage",
                                             consumer_type=pulsar.ConsumerType.Shared, consumer_name="my-consumer",
                                             ack_timeout_ms=1001, delay_ms=1001, initial_position=Earliest,
                                             dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(1, dlq))
                 for _ in range(3)]
    received = []

    async def never_acking(consumer):
        while True:
            received.append(await consumer.receive())

    tasks = [asyncio.get_running_loop().create_task(never_acking(c)) for c in consumers]
    try:
        producer = await client.create_producer(t)
        for i in range(N // 2):
            await producer.send(f"Message [{i}]".encode())
        await producer.close()
        letters = await nacktracker.subscribe(client, dlq, "my-subscription-DuplicatedMessage-DLQ",
                                              initial_position=Earliest)
        async with letters:
            dead = []
            while True:  # until 3 s pass without a letter (Java: 10 s)
                try:
                    msg = await letters.receive(timeout_ms=3000)
                except ReceiveTimeout:
                    break
                await letters.acknowledge(msg)
                dead.append(msg.data())
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert sorted(dead) == sorted(f"Message [{i}]".encode() for i in range(N // 2))
    assert len(received) == (N // 2) * 2
    for c in consumers:
        await c.close()


async def test_two_consumers_with_an_initial_subscription_both_publish_dead_letters(client, topic, session_broker,
                                                                                    broker_kind):
    """``testDeadLetterTopicWithInitialSubscriptionAndMultiConsumers``: two consumers of one subscription, one
    dead-letter policy with an initial subscription: both publish dead letters (on Apache Pulsar, two publishers
    on the dead-letter topic: the second's creating the same initial subscription does not fail it), and the
    initial subscription holds every letter."""
    t = topic("dead-letter-topic")
    dlq = f"{t}-{SUB}-DLQ"
    n = 100
    policy = pulsar.ConsumerDeadLetterPolicy(1, None, "init-sub")
    consumers = [await nacktracker.subscribe(client, t, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                             receiver_queue_size=20, ack_timeout_ms=1000, initial_position=Earliest,
                                             dead_letter_policy=policy) for _ in range(2)]
    producer = await client.create_producer(t, batching_enabled=False)
    for i in range(n):
        await producer.send(f"Hello Pulsar [{i}]".encode())
    await producer.close()
    received = []

    async def never_acking(consumer):
        while len(received) < n * 2:
            try:
                received.append(await consumer.receive(timeout_ms=3000))
            except ReceiveTimeout:
                return

    await asyncio.wait_for(asyncio.gather(*[never_acking(c) for c in consumers]), 30)
    for _ in range(100):
        if sum(c.stats()["dead_letter_published"] for c in consumers) == n:
            break
        await asyncio.sleep(0.1)
    assert [c.stats()["dead_letter_published"] > 0 for c in consumers] == [True, True]
    if broker_kind == "apache" and session_broker is not None:
        stats = session_broker.admin("GET", f"/admin/v2/persistent/{dlq.removeprefix('persistent://')}/stats")
        assert len(stats["publishers"]) == 2
        assert "init-sub" in stats["subscriptions"]
    letters = await nacktracker.subscribe(client, dlq, "init-sub")
    assert sorted(m.data() for m in await drain(letters, n)) == sorted(f"Hello Pulsar [{i}]".encode()
                                                                       for i in range(n))
    await letters.close()
    for c in consumers:
        await c.close()


async def test_dead_letters_with_max_unacked_messages_blocking(client, topic, session_broker, broker_kind):
    """``testDeadLetterTopicWithMaxUnackedMessagesBlocking``: the topic's policies block a consumer (and the
    subscription) at 30 unacknowledged messages; 300 messages (Java: 1000, blocking at 100), each nacked at
    every delivery (1 ms delay), maxRedeliverCount 3: every message still reaches the dead-letter topic."""
    if broker_kind != "apache" or session_broker is None:
        pytest.skip("topic policies need Apache Pulsar's admin API (pulsar-lite has none)")
    t = topic("dead-letter-topic-unacked-blocking")
    dlq = f"{t}-{SUB}-DLQ"
    path = f"/admin/v2/persistent/{t.removeprefix('persistent://')}"
    n, blocking = 300, 30
    session_broker.admin("PUT", path)
    session_broker.admin("POST", f"{path}/maxUnackedMessagesOnConsumer", blocking)
    session_broker.admin("POST", f"{path}/maxUnackedMessagesOnSubscription", blocking)
    for _ in range(100):  # topic policies apply asynchronously
        if session_broker.admin("GET", f"{path}/maxUnackedMessagesOnSubscription") == blocking:
            break
        await asyncio.sleep(0.1)
    consumer = await nacktracker.subscribe(client, t, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                           receiver_queue_size=200, delay_ms=1, initial_position=Earliest,
                                           dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(3, dlq))
    letters = await nacktracker.subscribe(client, dlq, SUB, initial_position=Earliest)
    producer = await client.create_producer(t)
    for i in range(n):
        await producer.send(f"Hello Pulsar [{i}]".encode())
    await producer.close()
    async with consumer:
        for _ in range(n * 4):
            await consumer.negative_acknowledge(await consumer.receive(timeout_ms=10_000))
        dead = await drain(letters, n)
        assert sorted(m.data() for m in dead) == sorted(f"Hello Pulsar [{i}]".encode() for i in range(n))
    await letters.close()


async def test_batch_messages_acked_on_their_last_round_are_not_dead_lettered(broker_kind, own_broker,
                                                                                pulsar_logger):
    """``testAckedBatchMessageNotSentToDeadLetterTopicOnFinalRedeliveryRound``: one batch of five,
    batch-index acks at both ends, ack timeout 1 s, maxRedeliverCount 3; three messages acked at once, two
    left to time out until their last round (redelivery count 3), then acked: none is dead-lettered."""
    if broker_kind != "apache":
        pytest.skip("pulsar-lite ignores batch-index acks (it redelivers whole entries)")
    with own_broker(settings={"acknowledgmentAtBatchIndexLevelEnabled": True}) as broker:
        client = pulsar.asyncio.Client(broker.url, logger=pulsar_logger, operation_timeout_seconds=10)
        try:
            t = f"persistent://public/default/acked-batch-final-round-{uuid.uuid4().hex[:10]}"
            consumer = await nacktracker.subscribe(client, t, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                                   initial_position=Earliest, batch_index_ack_enabled=True,
                                                   ack_timeout_ms=1000,
                                                   dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(3))
            letters = await nacktracker.subscribe(client, f"{t}-{SUB}-DLQ", SUB, initial_position=Earliest)
            producer = await client.create_producer(t, batching_enabled=True, batching_max_publish_delay_ms=1000)
            await asyncio.gather(*[producer.send(f"message-{i}".encode()) for i in range(5)])
            await producer.close()
            async with consumer:
                deliveries = []
                while len(deliveries) < 3 + 2 * 4:
                    msg = await consumer.receive(timeout_ms=5000)
                    index, count = msg.message_id().batch_index(), msg.redelivery_count()
                    deliveries.append((index, count))
                    if index in (1, 2) and count < 3:
                        continue  # left to time out
                    await consumer.acknowledge(msg)
                assert sorted(deliveries) == sorted([(0, 0), (3, 0), (4, 0)] + [(i, c) for i in (1, 2)
                                                                             for c in range(4)])
                with pytest.raises(ReceiveTimeout):
                    await letters.receive(timeout_ms=2000)
                assert consumer.stats()["dead_letter_published"] == 0
            await letters.close()
        finally:
            await client.close()


async def test_retries_then_dead_letters_into_an_initial_subscription(client, topic):
    """``testDeadLetterTopicWithProducerBuilder`` without its Java-only producer customizer: batched
    messages with keys, reconsumed at every delivery (``enable_retry``), maxRedeliverCount 2 and a
    dead-letter initial subscription: the subscription, read only afterwards, holds every message once,
    keys and payloads intact; nothing is left on the topic."""
    t = topic("dead-letter-topic-with-producer-builder")
    consumer = await nacktracker.subscribe(client, t, SUB, consumer_type=pulsar.ConsumerType.Shared,
                                           enable_retry=True, initial_position=Earliest,
                                           dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(2, None,
                                                                                              f"{SUB}-DLQ"))
    producer = await client.create_producer(t, batching_enabled=True)
    sent = {str(i): f"Hello Pulsar [{i}]".encode() for i in range(N)}
    await asyncio.gather(*[producer.send(data, partition_key=key) for key, data in sent.items()])
    await producer.close()
    async with consumer:
        for _ in range(N * 3):
            await consumer.reconsume_later(await consumer.receive(timeout_ms=15_000), delay_ms=100)
        for _ in range(100):
            if consumer.stats()["reconsume_dead_lettered"] == N:
                break
            await asyncio.sleep(0.1)
    letters = await nacktracker.subscribe(client, f"{t}-{SUB}-DLQ", f"{SUB}-DLQ")
    dead = await drain(letters, N)
    assert {m.partition_key(): m.data() for m in dead} == sent
    await letters.close()
    await nothing_left(client, t)
