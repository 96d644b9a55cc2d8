"""pulsar-client-python's own ``pulsar.asyncio`` tests (apache/pulsar-client-python, ``tests/asyncio_test.py``,
as of pulsar-client 3.13), ported by intent onto the async face: each test that subscribes is the original's
body with ``await self._client.subscribe(topic, sub, **kwargs)`` replaced by ``await
nacktracker.subscribe(client, topic, sub, **kwargs)`` (the same arguments, keyword forms included) and nothing
else changed in what it checks; ``self.assertEqual(a, b)`` reads ``assert a == b``.

Ported: ``test_batch_end_to_end``, ``test_send_keyed_message``, ``test_get_partitioned_topic_name``,
``test_consumer_cumulative_acknowledge``, ``test_consumer_individual_acknowledge``,
``test_consumer_negative_acknowledge``, ``test_multi_topic_consumer``, ``test_consumer_get_last_message_id``,
``test_async_dead_letter_policy``, ``test_unsubscribe``, ``test_seek_message_id``, ``test_seek_timestamp``,
``test_schema``, ``test_token_auth_supplier_exception``. The rest of the file tests producers, readers and the
client alone (no subscribe).

The originals run on one broker with names made unique by ``time.time()`` (some fixed: the partitioned and the
multi-topic ones); here every topic is fresh. Skips on pulsar-lite only, for its documented limits
(``nacktracker.testing.lite``): no admin API or partitioned topics, no namespace listing for a pattern, no seek
to a message id, nothing after a seek to a timestamp.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, List

import pytest

pulsar = pytest.importorskip("pulsar")
import _pulsar  # noqa: E402
from pulsar.asyncio import Client, Consumer, Producer, PulsarException  # noqa: E402
from pulsar.schema import AvroSchema, Integer, Record, String  # noqa: E402

import nacktracker  # noqa: E402
from conftest import quiet_logger  # noqa: E402

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]

TIMEOUT_MS = 10000  # Do not wait forever in tests


@pytest.fixture
async def client(broker_url):
    """The original's ``self._client`` (``asyncSetUp``/``asyncTearDown``)."""
    c = Client(broker_url, operation_timeout_seconds=5, logger=quiet_logger())
    yield c
    await c.close()


@pytest.fixture
async def subscribe():
    """``nacktracker.subscribe``; every consumer it made is closed after the test (the originals leave some
    open and close the client)."""
    made: list[Any] = []

    async def make(*args: Any, **kwargs: Any) -> Any:
        consumer = await nacktracker.subscribe(*args, **kwargs)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        await consumer.close()


def lite_skip(broker_kind: str, reason: str) -> None:
    if broker_kind == "lite":
        pytest.skip(f"pulsar-lite {reason}")


def name(prefix: str) -> str:
    """A fresh short topic name, as the originals' ``f'{prefix}-{time.time()}'``."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def _prepare_messages(producer: Producer) -> List[pulsar.MessageId]:
    msg_ids = []
    for i in range(5):
        msg_ids.append(await producer.send(f'msg-{i}'.encode()))
    return msg_ids


async def test_batch_end_to_end(client, subscribe):
    topic = name('asyncio-test-batch-e2e')
    producer = await client.create_producer(topic, producer_name="my-producer")
    assert producer.topic() == f'persistent://public/default/{topic}'
    assert producer.producer_name() == "my-producer"
    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(producer.send(f'msg-{i}'.encode())))
    msg_ids = await asyncio.gather(*tasks)
    assert len(msg_ids) == 5
    assert producer.last_sequence_id() == 4
    ledger_id = msg_ids[0].ledger_id()
    entry_id = msg_ids[0].entry_id()
    # These messages should be in the same entry
    for i in range(5):
        msg_id = msg_ids[i]
        assert isinstance(msg_id, pulsar.MessageId)
        assert msg_ids[i].ledger_id() == ledger_id
        assert msg_ids[i].entry_id() == entry_id
        assert msg_ids[i].batch_index() == i

    consumer = await subscribe(client, topic, 'sub', initial_position=pulsar.InitialPosition.Earliest)
    for i in range(5):
        msg = await consumer.receive()
        assert msg.data() == f'msg-{i}'.encode()
    await consumer.close()

    # create a different subscription to verify initial position is latest by default
    consumer = await subscribe(client, topic, 'sub2')
    await producer.send(b'final-message')
    msg = await consumer.receive()
    assert msg.data() == b'final-message'


async def test_send_keyed_message(client, subscribe):
    topic = name('asyncio-test-send-keyed-message')
    producer = await client.create_producer(topic)
    consumer = await subscribe(client, topic, 'sub')
    await producer.send(b'msg', partition_key='key0', ordering_key="key1", properties={'my-prop': 'my-value'})

    msg = await consumer.receive()
    assert msg.data() == b'msg'
    assert msg.partition_key() == 'key0'
    assert msg.ordering_key() == 'key1'
    assert msg.properties() == {'my-prop': 'my-value'}


async def test_get_partitioned_topic_name(client, subscribe, session_broker, broker_kind):
    lite_skip(broker_kind, "has no admin API to make a partitioned topic")
    base = name("partitioned_topic_name_test")
    session_broker.admin("PUT", f"/admin/v2/persistent/public/default/{base}/partitions", 3)

    partitions = [f"persistent://public/default/{base}-partition-{i}" for i in range(3)]
    assert await client.get_topic_partitions(f"persistent://public/default/{base}") == partitions

    consumer = await subscribe(
        client,
        f"persistent://public/default/{base}",
        "partitioned_topic_name_test_sub",
        consumer_type=pulsar.ConsumerType.Shared,
    )
    producer = await client.create_producer(f"persistent://public/default/{base}")
    await producer.send(b"hello")

    msg = await asyncio.wait_for(consumer.receive(), TIMEOUT_MS / 1000)
    assert msg.topic_name() in partitions


async def test_consumer_cumulative_acknowledge(client, subscribe):
    topic = name('asyncio-test-consumer-cumulative-ack')
    sub = 'sub'
    consumer = await subscribe(client, topic, sub)
    producer = await client.create_producer(topic)
    await _prepare_messages(producer)
    last_msg = None
    for _ in range(5):
        last_msg = await consumer.receive()
    await consumer.acknowledge_cumulative(last_msg)
    await consumer.close()

    consumer = await subscribe(client, topic, sub)
    await producer.send(b'final-message')
    msg = await consumer.receive()
    assert msg.data() == b'final-message'


async def test_consumer_individual_acknowledge(client, subscribe):
    topic = name('asyncio-test-consumer-individual-ack')
    sub = 'sub'
    consumer = await subscribe(client, topic, sub, consumer_type=pulsar.ConsumerType.Shared)
    producer = await client.create_producer(topic)
    await _prepare_messages(producer)
    msgs = []
    for _ in range(5):
        msg = await consumer.receive()
        msgs.append(msg)

    await consumer.acknowledge(msgs[0])
    await consumer.acknowledge(msgs[2])
    await consumer.acknowledge(msgs[4])
    await consumer.close()

    consumer = await subscribe(client, topic, sub, consumer_type=pulsar.ConsumerType.Shared)
    msg = await consumer.receive()
    assert msg.data() == b'msg-1'
    msg = await consumer.receive()
    assert msg.data() == b'msg-3'


async def test_consumer_negative_acknowledge(client, subscribe):
    topic = name('asyncio-test-consumer-negative-ack')
    sub = 'sub'
    consumer = await subscribe(client, topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                               negative_ack_redelivery_delay_ms=100)

    producer = await client.create_producer(topic)
    await _prepare_messages(producer)
    msgs = []
    for _ in range(5):
        msg = await consumer.receive()
        msgs.append(msg)

    await consumer.acknowledge(msgs[1])
    await consumer.acknowledge(msgs[3])

    await consumer.negative_acknowledge(msgs[0])
    await consumer.negative_acknowledge(msgs[2])
    await consumer.negative_acknowledge(msgs[4])
    await asyncio.sleep(0.2)

    received = []
    for _ in range(3):
        msg = await consumer.receive()
        received.append(msg.data())

    assert sorted(received) == [b'msg-0', b'msg-2', b'msg-4']
    await consumer.close()


async def test_multi_topic_consumer(client, subscribe, broker_kind):
    base = name('asyncio-test-multi-topic')  # the original's names are fixed: 'asyncio-test-multi-topic-1', '-2'
    topics = [f'{base}-1', f'{base}-2']
    producers = []

    for topic in topics:
        producer = await client.create_producer(topic)
        producers.append(producer)

    consumer = await subscribe(client, topics, 'test-multi-subscription')

    await producers[0].send(b'message-from-topic-1')
    await producers[1].send(b'message-from-topic-2')

    async def verify_receive(consumer: Consumer):
        received_messages = {}
        for _ in range(2):
            msg = await consumer.receive()
            received_messages[msg.data()] = None
            await consumer.acknowledge(msg.message_id())
        assert received_messages == {
            b'message-from-topic-1': None,
            b'message-from-topic-2': None
        }

    await verify_receive(consumer)
    await consumer.close()

    lite_skip(broker_kind, "cannot list a namespace's topics, so a pattern subscription fails its lookup")
    consumer = await subscribe(client, f'public/default/{base}-.*',
                               'test-multi-subscription-2',
                               is_pattern_topic=True,
                               initial_position=pulsar.InitialPosition.Earliest)
    await verify_receive(consumer)
    await consumer.close()


async def test_consumer_get_last_message_id(client, subscribe):
    topic = name('asyncio-test-get-last-message-id')
    sub = 'sub'
    consumer = await subscribe(client, topic, sub, consumer_type=pulsar.ConsumerType.Shared)
    producer = await client.create_producer(topic)
    for i in range(5):
        msg = f'msg-{i}'.encode()
        await producer.send(msg)
        last_msg_id = await consumer.get_last_message_id()
        assert isinstance(last_msg_id, _pulsar.MessageId)
        assert last_msg_id.entry_id() == i
        await consumer.acknowledge(last_msg_id)
    await consumer.close()


async def test_async_dead_letter_policy(client, subscribe):
    topic = name('asyncio-test-dlq')
    dlq_topic = 'dlq-' + topic
    max_redeliver_count = 5

    dlq_consumer = await subscribe(client, dlq_topic, "my-sub", consumer_type=pulsar.ConsumerType.Shared)
    consumer = await subscribe(client, topic, "my-sub", consumer_type=pulsar.ConsumerType.Shared,
                               dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count, dlq_topic,
                                                                                  'init-sub'))
    producer = await client.create_producer(topic)

    # Sen num msgs.
    num = 10
    for i in range(num):
        await producer.send(b"hello-%d" % i)
    await producer.flush()

    # Redelivery all messages maxRedeliverCountNum time.
    for i in range(1, num * max_redeliver_count + num + 1):
        msg = await consumer.receive()
        if i % num == 0:
            consumer.redeliver_unacknowledged_messages()

    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(consumer.receive(), 0.1)

    for i in range(num):
        msg = await dlq_consumer.receive()
        assert msg
        assert msg.data() == b"hello-%d" % i
        dlq_consumer.acknowledge(msg)  # noqa: RUF006  # as written: never awaited, so never run (the plain client's too)

    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(dlq_consumer.receive(), 0.1)

    await consumer.close()
    await dlq_consumer.close()


async def test_unsubscribe(client, subscribe):
    topic = name('asyncio-test-unsubscribe')
    sub = 'sub'
    consumer = await subscribe(client, topic, sub)
    await consumer.unsubscribe()
    # Verify the consumer can be created successfully with the same subscription name
    consumer = await subscribe(client, topic, sub)
    await consumer.close()


async def test_seek_message_id(client, subscribe, broker_kind):
    lite_skip(broker_kind, "cannot seek a consumer to a message id")
    topic = name('asyncio-test-seek-message-id')
    sub = 'sub'

    producer = await client.create_producer(topic)
    msg_ids = await _prepare_messages(producer)

    consumer = await subscribe(client, topic, sub, initial_position=pulsar.InitialPosition.Earliest)
    await consumer.seek(msg_ids[2])
    msg = await consumer.receive()
    assert msg.data() == b'msg-3'
    await consumer.close()

    consumer = await subscribe(client, topic, sub, initial_position=pulsar.InitialPosition.Earliest,
                               start_message_id_inclusive=True)
    await consumer.seek(msg_ids[2])
    msg = await consumer.receive()
    assert msg.data() == b'msg-2'
    await consumer.close()


async def test_seek_timestamp(client, subscribe, broker_kind):
    lite_skip(broker_kind, "answers a seek to a timestamp and then sends nothing until a restart")
    topic = name('asyncio-test-seek-timestamp')
    sub = 'sub'
    consumer = await subscribe(client, topic, sub, initial_position=pulsar.InitialPosition.Earliest)

    producer = await client.create_producer(topic)

    # Send first 3 messages
    for i in range(3):
        await producer.send(f'msg-{i}'.encode())

    seek_time = int(time.time() * 1000)

    # Send 2 more messages
    for i in range(3, 5):
        await producer.send(f'msg-{i}'.encode())

    # Consume all messages first
    for i in range(5):
        msg = await consumer.receive()
        assert msg.data() == f'msg-{i}'.encode()

    # Seek to the timestamp (should start from msg-3)
    await consumer.seek(seek_time)

    msg = await consumer.receive()
    assert msg.data() == b'msg-3'


async def test_schema(client, subscribe):
    pytest.importorskip("fastavro")

    class ExampleRecord(Record):  # pylint: disable=too-few-public-methods
        """Example record schema for testing."""
        str_field = String()
        int_field = Integer()

    topic = name('asyncio-test-schema')
    producer = await client.create_producer(topic, schema=AvroSchema(ExampleRecord))
    consumer = await subscribe(client, topic, 'sub', schema=AvroSchema(ExampleRecord))
    await producer.send(ExampleRecord(str_field='test', int_field=42))
    msg = await consumer.receive()
    assert isinstance(msg.value(), ExampleRecord)
    assert msg.value().str_field == 'test'
    assert msg.value().int_field == 42


async def test_token_auth_supplier_exception(broker_url, subscribe):
    def raise_exception():
        raise Exception("token supplier failed")

    client = Client(broker_url, authentication=pulsar.AuthenticationToken(raise_exception), logger=quiet_logger())
    topic = "private/auth/asyncio-test-token-auth"

    with pytest.raises(PulsarException) as e:
        await client.create_producer(topic)
    assert e.value.error() == pulsar.Result.AuthenticationError
    assert "token supplier failed" in str(e.value)

    with pytest.raises(PulsarException) as e:
        await subscribe(client, topic, 'sub')
    assert e.value.error() == pulsar.Result.AuthenticationError
    assert "token supplier failed" in str(e.value)

    with pytest.raises(PulsarException) as e:
        await subscribe(client, "private/auth/.*", 'sub', is_pattern_topic=True)
    assert e.value.error() == pulsar.Result.AuthenticationError

    await client.close()
