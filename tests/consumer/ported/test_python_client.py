"""pulsar-client-python's own consumer tests (apache/pulsar-client-python, ``tests/pulsar_test.py`` and
``tests/schema_test.py``), ported by intent onto the sync face: each test body is the original's with
``client.subscribe(topic, sub, **kwargs)`` replaced by ``nacktracker.sync.subscribe(client, topic, sub,
**kwargs)`` (the same arguments, keyword forms included) and nothing else changed in what it checks.

Ported: ``test_producer_consumer``, ``test_ordering_key``, ``test_redelivery_count``, ``test_deliver_at``,
``test_deliver_after``, ``test_consumer_initial_position``, ``test_consumer_queue_size_is_zero``,
``test_message_properties``, ``test_message_listener``, ``test_consumer_is_connected``,
``test_consumer_argument_errors``, ``test_get_last_message_id``, ``test_seek`` and ``test_seek_inclusive``
(the consumer's half: the reader's does not subscribe), ``test_topics_consumer``,
``test_topics_pattern_consumer``, ``test_batch_receive``, ``test_message_id``, ``test_get_topic_name``,
``test_get_partitioned_topic_name``, ``test_negative_acks``, ``test_keyshared_autosplit``,
``test_sticky_autosplit``, ``test_acknowledge_failed``, ``test_batch_index_ack``, ``test_dead_letter_policy``,
``test_regex_subscription``, ``test_consumer_name``, ``test_deserialize_msg_id_with_topic``, the null-value
tests, ``test_chunking``, ``test_producer_send``, ``test_encryption``, ``test_encryption_failure``,
``test_producer_deduplication``, ``test_publish_compact_and_consume``, ``test_null_value_compaction``,
``test_v2_topics``, ``test_v2_topics_http``, ``test_producer_consumer_zstd``, ``test_keyshared_invalid_sticky_ranges``,
``test_message_router``, ``test_invalid_chunking_config`` (it subscribes nothing: ported whole),
``test_auth_junk_params``, ``test_token_auth``, ``test_token_auth_supplier``, ``test_basic_auth``,
``test_basic_auth_method``, ``test_invalid_basic_auth``; from ``schema_test.py``: ``test_json_schema``,
``test_string_schema``, ``test_bytes_schema``, ``test_avro_schema``.

Not ported: the TLS tests (``test_tls_auth``, ``test_tls_auth2``, ``test_tls_auth3``,
``test_tls_encryption_with_other_auth``): they need a broker serving TLS with the original's certificates.
``test_auth_junk_params`` keeps its TLS URL (``pulsar+ssl://``, on the test's broker): the junk plugin fails the
subscribe before any connection. The encryption tests make their RSA key pair with ``openssl`` (the original reads
its repository's). The authentication tests run on an Apache Pulsar broker of their own configured as the original's
CI broker is (token and basic authentication, authorization, ``private/auth`` open to ``token-principal``), TLS
aside; compaction, deduplication (a namespace policy) and the message router (a partitioned topic) use Apache
Pulsar's admin API.

The original tests run on one broker with fixed topic names (and unsubscribe so that reruns start clean);
here every topic is fresh. Where the original sleeps and then expects a result (``time.sleep(0.1)`` in the
listener test), the port waits for the result with a bound instead: the thing checked is the same.

Skips on pulsar-lite only, for its documented limits (``nacktracker.testing.lite``): no partitioned topics or
admin API, delayed delivery ignored, batch-index acks ignored, a seek to a timestamp answered but followed by
nothing, no chunked message on an Exclusive subscription (the default), no HTTP service (lookups), no
authentication or authorization (it takes any credentials). On Apache Pulsar 4.0 ``test_null_value_compaction``
stops before its tombstone checks: that broker's compaction keeps a non-batched null value as the key's last value.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import subprocess
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, Callable, Iterator, Optional

import pytest

pulsar = pytest.importorskip("pulsar")
from pulsar import (  # noqa: E402
    CompressionType,
    ConsumerBatchReceivePolicy,
    ConsumerDeadLetterPolicy,
    ConsumerType,
    InitialPosition,
    MessageId,  # noqa: E402
)
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String, StringSchema  # noqa: E402

import nacktracker.sync  # noqa: E402
from conftest import quiet_logger  # noqa: E402
from nacktracker.testing import make_broker  # noqa: E402

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]

TM = 10_000  # as the original: do not wait forever


@pytest.fixture
def client(broker_url):
    """The test's ``pulsar.Client`` (closed after it, if the test did not)."""
    c = pulsar.Client(broker_url, logger=quiet_logger(), operation_timeout_seconds=10)
    yield c
    try:
        c.close()
    except pulsar.AlreadyClosed:  # the test closed it, as its original does
        pass


@pytest.fixture
def subscribe():
    """``nacktracker.sync.subscribe``, every consumer it made closed after the test (the originals
    leave some open and close the client: the sync face's threads must not outlive the test)."""
    made: list[nacktracker.sync.SyncConsumer] = []

    def make(*args: Any, **kwargs: Any) -> nacktracker.sync.SyncConsumer:
        consumer = nacktracker.sync.subscribe(*args, **kwargs)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


@pytest.fixture
def admin(session_broker, broker_kind) -> Callable[[str, str, Any], Any]:
    """The broker's admin API (Apache Pulsar's; pulsar-lite has none: the test is skipped there)."""
    if broker_kind != "apache" or session_broker is None:
        pytest.skip("needs Apache Pulsar's admin API (partitioned topics, namespaces): pulsar-lite has none")
    return session_broker.admin


def partitioned(admin: Callable[..., Any], t: str, n: int) -> str:
    admin("PUT", f"/admin/v2/persistent/{t.removeprefix('persistent://')}/partitions", n)
    return t


#: measured with the plain pulsar.Client too: its seek to a message id lands on another message, then the consumer
#: is left NotConnected
SEEK_BY_ID = "cannot seek a consumer to a message id"


def lite_skip(broker_kind: str, reason: str) -> None:
    if broker_kind == "lite":
        pytest.skip(f"pulsar-lite {reason}")


# -- tests/pulsar_test.py ---------------------------------------------------------------


def test_producer_consumer(client, subscribe, topic):
    t = topic("my-python-topic-producer-consumer")
    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(t, producer_name="my-producer")
    producer.send(b"hello")

    msg = consumer.receive(TM)
    assert msg
    assert msg.data() == b"hello"
    assert msg.producer_name() == "my-producer"

    with pytest.raises(pulsar.Timeout):
        consumer.receive(100)

    consumer.unsubscribe()


def test_ordering_key(client, subscribe, topic):
    t = topic("my-python-topic-ordering-key")
    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.KeyShared)
    producer = client.create_producer(t)
    producer.send(b"ordered-hello", ordering_key="random-ordering-key")

    msg = consumer.receive(TM)
    assert msg
    assert msg.data() == b"ordered-hello"
    assert msg.ordering_key() == "random-ordering-key"
    consumer.unsubscribe()
    producer.close()


def test_redelivery_count(client, subscribe, topic):
    t = topic("my-python-topic-redelivery-count")
    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.Shared,
                         negative_ack_redelivery_delay_ms=500)
    producer = client.create_producer(t)
    producer.send(b"hello")

    redelivery_count = 0
    for i in range(4):
        msg = consumer.receive(TM)
        if i % 2 == 0:
            consumer.negative_acknowledge(msg)
        else:
            consumer.negative_acknowledge(msg.message_id())
        redelivery_count = msg.redelivery_count()

    assert msg
    assert msg.data() == b"hello"
    assert redelivery_count == 3
    consumer.unsubscribe()
    producer.close()


@pytest.mark.parametrize("when", ["deliver_at", "deliver_after"])
def test_deliver_at_and_after(client, subscribe, topic, broker_kind, when):
    lite_skip(broker_kind, "ignores deliver_at/deliver_after (delayed delivery)")
    t = topic(f"my-python-topic-{when.replace('_', '-')}")
    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(t)
    delay_ms = 2500  # as the original: more than receive(1000) plus the broker's early-delivery slack
    if when == "deliver_at":
        producer.send(b"hello", deliver_at=int(round(time.time() * 1000)) + delay_ms)
    else:
        producer.send(b"hello", deliver_after=timedelta(milliseconds=delay_ms))

    with pytest.raises(pulsar.Timeout):  # not in the next second
        consumer.receive(1000)

    msg = consumer.receive(TM)
    assert msg
    assert msg.data() == b"hello"
    consumer.unsubscribe()
    producer.close()


def test_consumer_initial_position(client, subscribe, topic):
    t = topic("consumer-initial-position")
    producer = client.create_producer(t)
    for i in range(5):  # before the consumer: received with Earliest
        producer.send(b"hello-%d" % i)

    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.Shared,
                         initial_position=InitialPosition.Earliest)

    for i in range(5, 10):
        producer.send(b"hello-%d" % i)

    for i in range(10):
        msg = consumer.receive(TM)
        assert msg
        assert msg.data() == b"hello-%d" % i

    with pytest.raises(pulsar.Timeout):
        consumer.receive(100)

    consumer.unsubscribe()


def test_consumer_queue_size_is_zero(client, subscribe, topic):
    t = topic("my-python-topic-consumer-init-queue-size-is-zero")
    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.Shared, receiver_queue_size=0,
                         initial_position=InitialPosition.Earliest)
    producer = client.create_producer(t)
    producer.send(b"hello")
    time.sleep(0.1)
    msg = consumer.receive()
    assert msg
    assert msg.data() == b"hello"

    consumer.unsubscribe()


def test_message_properties(client, subscribe, topic):
    t = topic("my-python-test-message-properties")
    # the client's keyword form: topic=, subscription_name=
    consumer = subscribe(client, topic=t, subscription_name="my-subscription", schema=pulsar.schema.StringSchema())
    producer = client.create_producer(topic=t, schema=pulsar.schema.StringSchema())
    producer.send("hello", properties={"a": "1", "b": "2"})

    msg = consumer.receive(TM)
    assert msg
    assert msg.value() == "hello"
    assert msg.properties() == {"a": "1", "b": "2"}

    consumer.unsubscribe()


def test_message_listener(client, subscribe, topic):
    t = topic("my-python-topic-listener")
    received_messages: list[Any] = []
    three = threading.Event()

    def listener(consumer, msg):
        received_messages.append(msg)
        consumer.acknowledge(msg)
        if len(received_messages) == 3:
            three.set()

    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.Exclusive, message_listener=listener)
    producer = client.create_producer(t)
    producer.send(b"hello-1")
    producer.send(b"hello-2")
    producer.send(b"hello-3")

    assert three.wait(10)  # the original sleeps 0.1 s, then expects the three
    assert len(received_messages) == 3
    assert received_messages[0].data() == b"hello-1"
    assert received_messages[1].data() == b"hello-2"
    assert received_messages[2].data() == b"hello-3"
    client.close()  # as the original: the client closes under the open consumer
    consumer.close()  # (the original's process ends here; a test must not leave the listener running)
    assert not [th for th in threading.enumerate() if th.name.startswith("nacktracker-sync")]


def test_message_listener_positional(client, subscribe, topic):
    """The same listener given as the client takes it by position (topic, subscription_name, consumer_type,
    schema, message_listener)."""
    t = topic("my-python-topic-listener-positional")
    got = threading.Event()

    def listener(consumer, msg):
        consumer.acknowledge(msg)
        got.set()

    subscribe(client, t, "my-sub", ConsumerType.Exclusive, pulsar.schema.BytesSchema(), listener)
    client.create_producer(t).send(b"hello-1")
    assert got.wait(10)


def test_consumer_is_connected(client, subscribe, topic):
    t = topic("test_consumer_is_connected")
    consumer = subscribe(client, t, "sub")
    assert consumer.is_connected()
    consumer.close()
    assert not consumer.is_connected()


def test_consumer_argument_errors(client, subscribe, topic):
    t = topic("my-python-test-producer")
    sub_name = "my-sub-name"

    for call in [lambda: subscribe(client, None, sub_name),
                 lambda: subscribe(client, t, None),
                 lambda: subscribe(client, t, sub_name, consumer_type=None),
                 lambda: subscribe(client, t, sub_name, receiver_queue_size="test"),
                 lambda: subscribe(client, t, sub_name, consumer_name=5),
                 lambda: subscribe(client, t, sub_name, unacked_messages_timeout_ms="test"),
                 lambda: subscribe(client, t, sub_name, broker_consumer_stats_cache_time_ms="test")]:
        with pytest.raises(ValueError):
            call()
    assert not [th for th in threading.enumerate() if th.name.startswith("nacktracker-sync")]


def test_get_last_message_id(client, subscribe, topic):
    t = topic("topic_name_test")
    consumer = subscribe(client, t, "topic_name_test_sub", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(t)
    msg_id = producer.send(b"hello")

    msg = consumer.receive(TM)
    assert msg.message_id() == msg_id
    # what the name promises, on the consumer (the original checks only the id above)
    last = consumer.get_last_message_id()
    assert (last.ledger_id(), last.entry_id()) == (msg_id.ledger_id(), msg_id.entry_id())


def test_seek(client, subscribe, topic, broker_kind):
    lite_skip(broker_kind, SEEK_BY_ID)
    t = topic("my-python-topic-seek")
    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(t)

    for i in range(100):
        if i > 0:
            time.sleep(0.02)
        producer.send(b"hello-%d" % i)

    ids = []
    timestamps = []
    for i in range(100):
        msg = consumer.receive(TM)
        assert msg.data() == b"hello-%d" % i
        ids.append(msg.message_id())
        timestamps.append(msg.publish_timestamp())
        consumer.acknowledge(msg)

    consumer.seek(MessageId.earliest)  # after the reconnect: the first message
    msg = consumer.receive(TM)
    assert msg.data() == b"hello-0"

    with pytest.raises(ValueError):  # a seek argument of the wrong type
        consumer.seek(1.0)

    consumer.seek(ids[50])
    msg = consumer.receive(TM)
    assert msg.data() == b"hello-51"

    msg_id = MessageId(ledger_id=ids[60].ledger_id(), entry_id=ids[60].entry_id())  # a user-made id
    consumer.seek(msg_id)
    msg = consumer.receive(TM)
    assert msg.data() == b"hello-61"

    lite_skip(broker_kind, "answers a seek to a timestamp and then sends nothing until a restart")
    consumer.seek(timestamps[42])
    msg = consumer.receive(TM)
    assert msg.data() == b"hello-42"


def test_seek_inclusive(client, subscribe, topic, broker_kind):
    lite_skip(broker_kind, SEEK_BY_ID)
    t = topic("my-python-topic-seek-inclusive")
    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.Shared, start_message_id_inclusive=True)
    producer = client.create_producer(t)

    for i in range(100):
        if i > 0:
            time.sleep(0.02)
        producer.send(b"hello-%d" % i)

    ids = []
    for i in range(100):
        msg = consumer.receive(TM)
        assert msg.data() == b"hello-%d" % i
        ids.append(msg.message_id())
        consumer.acknowledge(msg)

    consumer.seek(MessageId.earliest)
    time.sleep(0.5)
    msg = consumer.receive(TM)
    assert msg.data() == b"hello-0"

    consumer.seek(ids[50])
    time.sleep(0.5)
    msg = consumer.receive(TM)
    assert msg.data() == b"hello-50"


def test_topics_consumer(client, subscribe, admin):
    suffix = uuid.uuid4().hex[:8]
    admin("PUT", "/admin/v2/namespaces/public/default-2", None) if not _namespace_exists(admin) else None
    topic1 = partitioned(admin, f"persistent://public/default/my-python-topics-consumer-1-{suffix}", 2)
    topic2 = partitioned(admin, f"persistent://public/default/my-python-topics-consumer-2-{suffix}", 3)
    topic3 = partitioned(admin, f"persistent://public/default-2/my-python-topics-consumer-3-{suffix}", 4)

    producer1 = client.create_producer(topic1)
    producer2 = client.create_producer(topic2)
    producer3 = client.create_producer(topic3)

    consumer = subscribe(client, [topic1, topic2, topic3], "my-topics-consumer-sub",
                         consumer_type=ConsumerType.Shared, receiver_queue_size=10)

    send_100_each_then_receive_all_300(consumer, producer1, producer2, producer3)


def send_100_each_then_receive_all_300(consumer, *producers) -> None:
    """The originals' common end: 100 messages on each topic, all 300 received and acked, then nothing."""
    for n, producer in enumerate(producers, 1):
        for i in range(100):
            producer.send(b"hello-%d-%d" % (n, i))
    for _ in range(300):
        msg = consumer.receive(TM)
        consumer.acknowledge(msg)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(100)


def _namespace_exists(admin) -> bool:
    return "public/default-2" in admin("GET", "/admin/v2/namespaces/public", None)


def test_topics_pattern_consumer(client, subscribe, admin):
    suffix = uuid.uuid4().hex[:8]
    topics_pattern = f"persistent://public/default/my-python-pattern-consumer-{suffix}.*"
    topic1 = partitioned(admin, f"persistent://public/default/my-python-pattern-consumer-{suffix}-1", 2)
    topic2 = partitioned(admin, f"persistent://public/default/my-python-pattern-consumer-{suffix}-2", 3)
    topic3 = partitioned(admin, f"persistent://public/default/my-python-pattern-consumer-{suffix}-3", 4)

    producer1 = client.create_producer(topic1)
    producer2 = client.create_producer(topic2)
    producer3 = client.create_producer(topic3)

    consumer = subscribe(client, re.compile(topics_pattern), "my-pattern-consumer-sub",
                         consumer_type=ConsumerType.Shared, receiver_queue_size=10, pattern_auto_discovery_period=1)

    time.sleep(2)  # wait enough time to trigger auto discovery, as the original

    send_100_each_then_receive_all_300(consumer, producer1, producer2, producer3)


def test_batch_receive(client, subscribe, topic):
    t = topic("my-python-topic-batch-receive")
    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.Shared, start_message_id_inclusive=True,
                         batch_receive_policy=ConsumerBatchReceivePolicy(10, -1, -1))
    producer = client.create_producer(t)

    for i in range(10):
        if i > 0:
            time.sleep(0.02)
        producer.send(b"hello-%d" % i)

    msgs = consumer.batch_receive()
    for i, msg in enumerate(msgs):
        assert msg.data() == b"hello-%d" % i


def test_message_id(client, subscribe, topic):
    s = MessageId.earliest.serialize()
    assert MessageId.deserialize(s) == MessageId.earliest
    s = MessageId.latest.serialize()
    assert MessageId.deserialize(s) == MessageId.latest

    t = topic("test-message-id-compare")
    producer = client.create_producer(t)
    consumer = subscribe(client, t, "sub")

    sent_ids = []
    received_ids = []
    for i in range(5):
        sent_ids.append(MessageId.wrap(producer.send(b"msg-%d" % i)))
        msg = consumer.receive(TM)
        received_ids.append(MessageId.wrap(msg.message_id()))
        assert sent_ids[i] == received_ids[i]
        consumer.acknowledge(received_ids[i])
    consumer.acknowledge_cumulative(received_ids[4])

    for i in range(4):
        assert sent_ids[i] < sent_ids[i + 1]
        assert sent_ids[i] <= sent_ids[i + 1]
        assert sent_ids[i + 1] > sent_ids[i]
        assert sent_ids[i + 1] >= sent_ids[i]
        assert sent_ids[i] != sent_ids[i + 1]


def test_get_topic_name(client, subscribe, topic):
    t = topic("topic_name_test")
    consumer = subscribe(client, t, "topic_name_test_sub", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(t)
    producer.send(b"hello")

    msg = consumer.receive(TM)
    assert msg.topic_name() == t
    assert consumer.topic() == t


def test_get_partitioned_topic_name(client, subscribe, admin, topic):
    t = partitioned(admin, topic("partitioned_topic_name_test"), 3)
    partitions = [f"{t}-partition-{i}" for i in range(3)]
    assert client.get_topic_partitions(t) == partitions

    consumer = subscribe(client, t, "partitioned_topic_name_test_sub", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(t)
    producer.send(b"hello")

    msg = consumer.receive(TM)
    assert msg.topic_name() in partitions


def test_negative_acks(client, subscribe, topic):
    t = topic("test_negative_acks")
    consumer = subscribe(client, t, "test", schema=pulsar.schema.StringSchema(),
                         negative_ack_redelivery_delay_ms=1000)
    producer = client.create_producer(t, schema=pulsar.schema.StringSchema())
    for i in range(10):
        producer.send_async("hello-%d" % i, callback=None)

    producer.flush()

    for i in range(10):
        msg = consumer.receive()
        assert msg.value() == "hello-%d" % i
        consumer.negative_acknowledge(msg)

    for i in range(10):
        msg = consumer.receive()
        assert msg.value() == "hello-%d" % i
        consumer.acknowledge(msg)

    with pytest.raises(pulsar.Timeout):
        consumer.receive(100)


def drain(consumer) -> list[Any]:
    msgs = []
    while True:
        try:
            msg = consumer.receive(100)
        except pulsar.Timeout:
            return msgs
        msgs.append(msg)
        consumer.acknowledge(msg)


@pytest.mark.parametrize("mode", ["autosplit", "sticky"])
def test_keyshared_autosplit_and_sticky(client, subscribe, topic, mode):
    t = topic(f"my-python-topic-keyshare-{mode}")
    if mode == "autosplit":
        policies = [pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.AutoSplit,
                                                   allow_out_of_order_delivery=True)] * 2
    else:
        policies = [pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.Sticky,
                                                   allow_out_of_order_delivery=True, sticky_ranges=ranges)
                    for ranges in ([(0, 30000)], [(30001, 65535)])]
    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.KeyShared, consumer_name="con-1",
                         start_message_id_inclusive=True, key_shared_policy=policies[0])
    consumer2 = subscribe(client, t, "my-sub", consumer_type=ConsumerType.KeyShared, consumer_name="con-2",
                          start_message_id_inclusive=True, key_shared_policy=policies[1])
    producer = client.create_producer(t)

    for i in range(10):
        if i > 0:
            time.sleep(0.02)
        producer.send(b"hello-%d" % i)

    msgs = drain(consumer) + drain(consumer2)
    assert len(msgs) == 10


def test_acknowledge_failed(client, subscribe, topic):
    t = topic("test_acknowledge_failed")
    producer = client.create_producer(t)
    consumer1 = subscribe(client, t, "sub1", consumer_type=ConsumerType.Shared)
    consumer2 = subscribe(client, t, "sub2", consumer_type=ConsumerType.KeyShared)
    msg_id = producer.send(b"hello")
    msg1 = consumer1.receive()
    with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
        consumer1.acknowledge_cumulative(msg1)
    with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
        consumer1.acknowledge_cumulative(msg1.message_id())
    msg2 = consumer2.receive()
    with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
        consumer2.acknowledge_cumulative(msg2)
    with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
        consumer2.acknowledge_cumulative(msg2.message_id())
    consumer = subscribe(client, [t, t + "-another"], "sub")
    with pytest.raises(pulsar.OperationNotSupported):  # the message id names no topic
        consumer.acknowledge(msg_id)


def test_batch_index_ack(subscribe, topic, broker_kind, own_broker):
    """On a broker with batch-index acks on (the original's CI broker has them: Pulsar 4.1's default; the
    session's Apache broker has 4.0's default, off, where the plain client gets all five back too)."""
    lite_skip(broker_kind, "ignores batch-index acks (an index ack acks the whole entry)")
    with own_broker(settings={"acknowledgmentAtBatchIndexLevelEnabled": True}) as broker:
        client = pulsar.Client(broker.url, logger=quiet_logger(), operation_timeout_seconds=10)
        t = topic("test-batch-index-ack")
        producer = client.create_producer(t, batching_enabled=True, batching_max_messages=100,
                                          batching_max_publish_delay_ms=10000)
        consumer = subscribe(client, t, subscription_name="test-batch-index-ack", batch_index_ack_enabled=True)

        for i in range(5):  # one batch of 5
            producer.send_async(b"hello-%d" % i, callback=None)
        producer.flush()

        results = []
        for _ in range(5):
            results.append(consumer.receive())
        assert len(results) == 5
        for i in range(2):  # ack 0 and 1 only
            consumer.acknowledge(results[i])
            time.sleep(0.2)

        consumer.close()  # restarted: only 2..4 come
        consumer = subscribe(client, t, subscription_name="test-batch-index-ack", batch_index_ack_enabled=True)
        results2 = []
        for _ in range(2, 5):
            results2.append(consumer.receive())
        assert len(results2) == 3
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1000)
        consumer.close()
        client.close()


def test_dead_letter_policy(client, subscribe, topic):
    """The broker's redelivery of everything unacknowledged (``redeliver_unacknowledged_messages``) brings
    each message back until the policy's count, then it goes to the dead-letter topic."""
    t = topic("my-python-topic-test-dlq")
    dlq_topic = t + "-dlq"
    max_redeliver_count = 5
    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.Shared,
                         dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count, dlq_topic, "init-sub"))
    dlq_consumer = subscribe(client, dlq_topic, "my-sub", consumer_type=ConsumerType.Shared)

    producer = client.create_producer(t)
    num = 10
    for i in range(num):
        producer.send(b"hello-%d" % i)
    producer.flush()

    # every message redelivered max_redeliver_count times
    for i in range(1, num * max_redeliver_count + num + 1):
        consumer.receive()
        if i % num == 0:
            consumer.redeliver_unacknowledged_messages()
    with pytest.raises(pulsar.Timeout):
        consumer.receive(100)

    for i in range(num):
        msg = dlq_consumer.receive()
        assert msg
        assert msg.data() == b"hello-%d" % i
        dlq_consumer.acknowledge(msg)
    with pytest.raises(pulsar.Timeout):
        dlq_consumer.receive(100)


def test_regex_subscription(client, subscribe, broker_kind):
    from _pulsar import RegexSubscriptionMode

    lite_skip(broker_kind, "cannot list a namespace's topics (a pattern subscription's lookup)")

    suffix = uuid.uuid4().hex[:8]
    topic1 = f"persistent://public/default/test-regex-sub-{suffix}-1"
    topic2 = f"persistent://public/default/test-regex-sub-{suffix}-2"
    topic3 = f"non-persistent://public/default/test-regex-sub-{suffix}-3"
    topic4 = f"persistent://public/default/no-match-test-regex-sub-{suffix}-3"  # matches no pattern

    producer1 = client.create_producer(topic1)
    producer2 = client.create_producer(topic2)
    producer3 = client.create_producer(topic3)
    producer4 = client.create_producer(topic4)

    pattern = re.compile(f"public/default/test-regex-sub-{suffix}-.*")
    consumer_all = subscribe(client, pattern, "regex-sub-all", consumer_type=ConsumerType.Shared,
                             regex_subscription_mode=RegexSubscriptionMode.AllTopics)
    consumer_persistent = subscribe(client, pattern, "regex-sub-persistent", consumer_type=ConsumerType.Shared,
                                    regex_subscription_mode=RegexSubscriptionMode.PersistentOnly)
    consumer_non_persistent = subscribe(client, pattern, "regex-sub-non-persistent",
                                        consumer_type=ConsumerType.Shared,
                                        regex_subscription_mode=RegexSubscriptionMode.NonPersistentOnly)

    num = 10
    for i in range(num):
        producer1.send(b"hello-1-%d" % i)
        producer2.send(b"hello-2-%d" % i)
        producer3.send(b"hello-3-%d" % i)
        producer4.send(b"hello-4-%d" % i)

    for consumer, expected in [(consumer_all, {topic1, topic2, topic3}), (consumer_persistent, {topic1, topic2}),
                               (consumer_non_persistent, {topic3})]:
        received_topics = set()
        for i in range(len(expected) * num):
            try:
                msg = consumer.receive(TM)
            except pulsar.Timeout:
                raise AssertionError(f"{consumer.subscription_name()}: {i} of {len(expected) * num}") from None
            assert msg.topic_name() in expected
            received_topics.add(msg.topic_name())
            consumer.acknowledge(msg)
        assert received_topics == expected
        with pytest.raises(pulsar.Timeout):
            consumer.receive(100)


def test_consumer_name(client, subscribe, topic):
    name = "my-consumer-name"
    consumer = subscribe(client, topic("test_consumer_name"), "sub", consumer_name=name)
    assert consumer.consumer_name() == name


def test_deserialize_msg_id_with_topic(client, subscribe, topic):
    topic1 = topic("deserialize-msg-id-with-topic1")
    topic2 = topic("deserialize-msg-id-with-topic2")
    consumer = subscribe(client, [topic1, topic2], "sub")
    producer1 = client.create_producer(topic1)
    producer2 = client.create_producer(topic2)
    producer1.send(b"msg-1")
    producer2.send(b"msg-2")

    serialized_msg_ids = dict()
    for _ in range(2):
        msg = consumer.receive(TM)
        serialized_msg_ids[msg.topic_name()] = msg.message_id().serialize()
    for t, serialized_msg_id in serialized_msg_ids.items():
        deserialized_msg_id = MessageId.deserialize(serialized_msg_id, topic=t)
        consumer.acknowledge_cumulative(deserialized_msg_id)
    consumer.close()

    consumer = subscribe(client, [topic1, topic2], "sub")
    producer1.send(b"msg-3")
    msg = consumer.receive(TM)
    assert msg.value() == b"msg-3"


@pytest.mark.parametrize("case", ["message", "vs-empty-bytes", "with-properties"])
def test_null_value(client, subscribe, topic, case):
    t = topic(f"null-value-{case}")
    producer = client.create_producer(t, batching_enabled=False)
    consumer = subscribe(client, t, "sub", initial_position=InitialPosition.Earliest)
    if case == "message":
        producer.send(b"not null", partition_key="k1")
        producer.send(None, partition_key="k2")
        producer.send(b"also not null", partition_key="k3")
        msg1 = consumer.receive(TM)
        assert msg1.data() == b"not null" and not msg1.has_null_value()
        msg2 = consumer.receive(TM)
        assert msg2.has_null_value() and msg2.data() == b""
        msg3 = consumer.receive(TM)
        assert msg3.data() == b"also not null" and not msg3.has_null_value()
    elif case == "vs-empty-bytes":
        producer.send(b"", partition_key="k1")
        producer.send(None, partition_key="k2")
        msg1 = consumer.receive(TM)
        assert not msg1.has_null_value() and msg1.data() == b""
        msg2 = consumer.receive(TM)
        assert msg2.has_null_value()
    else:
        producer.send(None, partition_key="k1", properties={"action": "delete"})
        msg = consumer.receive(TM)
        assert msg.has_null_value()
        assert msg.properties() == {"action": "delete"}
        assert msg.partition_key() == "k1"
    consumer.close()
    producer.close()


def test_chunking(client, subscribe, topic, broker_kind):
    if broker_kind == "apache":
        pytest.skip("the session's Apache broker takes no multi-MiB message in time, from the plain producer "
                    "either (measured: 6 and 10 MiB sends time out at 30 s); chunking on Apache Pulsar: "
                    "tests/consumer/test_chunked.py, on a broker of its own with a small maxMessageSize")
    lite_skip(broker_kind, "delivers no chunked message on an Exclusive subscription, the default type (measured "
              "with the plain pulsar.Client too: its client drops the chunks as out of order; on Shared it arrives "
              "whole, tests/consumer/test_chunked.py)")
    t = topic("test_chunking")
    data_size = 10 * 1024 * 1024
    producer = client.create_producer(t, chunking_enabled=True, batching_enabled=False)
    consumer = subscribe(client, t, "my-subscription", max_pending_chunked_message=10,
                         auto_ack_oldest_chunked_message_on_queue_full=False)

    producer.send(bytes(bytearray(os.urandom(data_size))), None)
    msg = consumer.receive(TM)
    assert len(msg.data()) == data_size


def test_producer_send(client, subscribe, topic):
    t = topic("test_producer_send")
    producer = client.create_producer(t)
    consumer = subscribe(client, t, "sub-name")
    msg_id = producer.send(b"hello")
    msg = consumer.receive(TM)
    consumer.acknowledge(msg)
    assert msg_id == msg.message_id()
    assert msg.encryption_context() is None
    client.close()


@pytest.fixture
def crypto_key_reader(tmp_path) -> pulsar.CryptoKeyReader:
    """An RSA key pair made for the test (the original reads its repository's ``client-rsa.pem`` pair)."""
    private_key, public_key = tmp_path / "private-key.client-rsa.pem", tmp_path / "public-key.client-rsa.pem"
    subprocess.run(["openssl", "genrsa", "-traditional", "-out", str(private_key), "2048"], check=True,
                   capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", str(private_key), "-pubout", "-out", str(public_key)], check=True,
                   capture_output=True)
    return pulsar.CryptoKeyReader(str(public_key), str(private_key))


def test_encryption(client, subscribe, topic, crypto_key_reader):
    t = topic("my-python-test-end-to-end-encryption")
    consumer = subscribe(client, topic=t, subscription_name="my-subscription", crypto_key_reader=crypto_key_reader)
    producer = client.create_producer(topic=t, encryption_key="client-rsa.pem", crypto_key_reader=crypto_key_reader)
    reader = client.create_reader(topic=t, start_message_id=MessageId.earliest, crypto_key_reader=crypto_key_reader)
    producer.send(b"hello")
    msg = consumer.receive(TM)
    assert msg
    assert msg.value() == b"hello"
    consumer.unsubscribe()

    msg = reader.read_next(TM)
    assert msg
    assert msg.data() == b"hello"

    with pytest.raises(pulsar.Timeout):
        reader.read_next(100)

    reader.close()
    client.close()


def test_encryption_failure(client, subscribe, topic, crypto_key_reader):
    t = topic("my-python-test-end-to-end-encryption-failure")
    producer = client.create_producer(topic=t, encryption_key="client-rsa.pem", crypto_key_reader=crypto_key_reader,
                                      compression_type=CompressionType.LZ4)
    producer.send(b"msg-0")

    def verify_encryption_context(context: Optional[pulsar.EncryptionContext], failed: bool, batch_size: int):
        assert context is not None, "Encryption context is None"
        keys = context.keys()
        assert len(keys) == 1
        key = keys[0]
        assert key.key == "client-rsa.pem"
        assert len(key.value) > 0
        assert key.metadata == {}
        assert len(context.param()) > 0
        assert context.algorithm() == ""
        assert context.compression_type() == CompressionType.LZ4
        if batch_size == -1:
            assert context.uncompressed_message_size() == len(b"msg-0")
        else:
            assert context.uncompressed_message_size() > len(b"msg-0")
        assert context.batch_size() == batch_size
        assert context.is_decryption_failed() == failed

    def verify_next_message(value: bytes):
        consumer = subscribe(client, t, subscription, crypto_key_reader=crypto_key_reader)
        msg = consumer.receive(3000)
        assert msg.data() == value
        verify_encryption_context(msg.encryption_context(), False, -1)
        consumer.acknowledge(msg)
        consumer.close()

    subscription = "my-sub"
    consumer = subscribe(client, t, subscription, initial_position=InitialPosition.Earliest,
                         crypto_failure_action=pulsar.ConsumerCryptoFailureAction.FAIL)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(3000)
    consumer.close()
    producer.send(b"msg-1")
    verify_next_message(b"msg-0")  # msg-0 won't be skipped

    consumer = subscribe(client, t, subscription, initial_position=InitialPosition.Earliest,
                         crypto_failure_action=pulsar.ConsumerCryptoFailureAction.DISCARD)
    with pytest.raises(pulsar.Timeout):
        consumer.receive(3000)
    consumer.close()

    producer.send(b"msg-2")
    verify_next_message(b"msg-2")  # msg-1 is skipped since the crypto failure action is DISCARD
    producer.close()

    # send batched messages
    producer = client.create_producer(topic=t, encryption_key="client-rsa.pem", crypto_key_reader=crypto_key_reader,
                                      compression_type=CompressionType.LZ4, batching_enabled=True)
    producer.send_async(b"msg-3", None)
    producer.send_async(b"msg-4", None)
    producer.flush()

    def verify_undecrypted_message(msg: pulsar.Message, i: int):
        assert msg.data() != f"msg-{i}".encode()
        assert len(msg.data()) > 5, f"msg.data() is {msg.data()}"
        verify_encryption_context(msg.encryption_context(), True, 2 if i >= 3 else -1)

    # Encrypted messages are consumed since the crypto failure action is CONSUME. Only 4 messages arrive:
    # msg-3 and msg-4 were sent in one batch, delivered as a single message when decryption fails.
    consumer = subscribe(client, t, "another-sub", initial_position=InitialPosition.Earliest,
                         crypto_failure_action=pulsar.ConsumerCryptoFailureAction.CONSUME)
    for i in range(4):
        msg = consumer.receive(3000)
        verify_undecrypted_message(msg, i)

    reader = client.create_reader(t, MessageId.earliest, crypto_failure_action=pulsar.ConsumerCryptoFailureAction.CONSUME)
    for i in range(4):
        msg = reader.read_next(3000)
        verify_undecrypted_message(msg, i)

    client.close()


def test_producer_deduplication(client, subscribe, topic, admin):
    admin("POST", "/admin/v2/namespaces/public/default/deduplication", True)  # enable deduplication on the namespace
    try:
        t = topic("my-python-test-producer-deduplication")

        producer = client.create_producer(t, producer_name="my-producer-name")
        assert producer.last_sequence_id() == -1

        consumer = subscribe(client, t, "my-sub")

        producer.send(b"hello-0", sequence_id=0)
        producer.send(b"hello-1", sequence_id=1)
        producer.send(b"hello-2", sequence_id=2)
        assert producer.last_sequence_id() == 2

        # Repeat the messages and verify they're not received by consumer
        producer.send(b"hello-1", sequence_id=1)
        producer.send(b"hello-2", sequence_id=2)
        assert producer.last_sequence_id() == 2

        for i in range(3):
            msg = consumer.receive(TM)
            assert msg.data() == b"hello-%d" % i
            consumer.acknowledge(msg)

        with pytest.raises(pulsar.Timeout):
            consumer.receive(100)

        producer.close()

        producer = client.create_producer(t, producer_name="my-producer-name")
        assert producer.last_sequence_id() == 2

        # Repeat the messages and verify they're not received by consumer
        producer.send(b"hello-1", sequence_id=1)
        producer.send(b"hello-2", sequence_id=2)
        assert producer.last_sequence_id() == 2

        with pytest.raises(pulsar.Timeout):
            consumer.receive(100)

        client.close()
    finally:  # the session's other tests share the namespace
        admin("POST", "/admin/v2/namespaces/public/default/deduplication", False)


def compact(admin: Callable[..., Any], short_topic: str) -> None:
    """The originals' compaction: issue the command, wait for its success."""
    path = f"/admin/v2/persistent/public/default/{short_topic}/compaction"
    admin("PUT", path, None)
    while True:
        s = str(admin("GET", path, None))
        if "RUNNING" in s:
            time.sleep(0.2)
        else:
            assert "SUCCESS" in s
            break


def test_publish_compact_and_consume(client, subscribe, admin):
    t = "compaction_%s" % (uuid.uuid4())
    producer = client.create_producer(t, producer_name="my-producer-name", batching_enabled=False)
    assert producer.last_sequence_id() == -1
    consumer = subscribe(client, t, "my-sub1", is_read_compacted=True)
    consumer.close()
    consumer2 = subscribe(client, t, "my-sub2", is_read_compacted=False)

    # producer create 2 messages with same key.
    producer.send(b"hello-0", partition_key="key0")
    producer.send(b"hello-1", partition_key="key0")
    producer.close()

    compact(admin, t)

    # the compacted ledger is recorded as a property of a cursor, persisted asynchronously: as the original,
    # wait a second for it to be updated on the broker
    time.sleep(1.0)

    # after compact, consumer with `is_read_compacted=True`, expected read only the second message for same key.
    consumer1 = subscribe(client, t, "my-sub1", is_read_compacted=True)
    msg0 = consumer1.receive(TM)
    assert msg0.data() == b"hello-1"
    consumer1.acknowledge(msg0)
    consumer1.close()

    # ditto for reader
    reader1 = client.create_reader(t, MessageId.earliest, is_read_compacted=True)
    msg0 = reader1.read_next(TM)
    assert msg0.data() == b"hello-1"
    reader1.close()

    # after compact, consumer with `is_read_compacted=False`, expected read 2 messages for same key.
    msg0 = consumer2.receive(TM)
    assert msg0.data() == b"hello-0"
    consumer2.acknowledge(msg0)
    msg1 = consumer2.receive(TM)
    assert msg1.data() == b"hello-1"
    consumer2.acknowledge(msg1)
    consumer2.close()

    # ditto for reader
    reader2 = client.create_reader(t, MessageId.earliest, is_read_compacted=False)
    msg0 = reader2.read_next(TM)
    assert msg0.data() == b"hello-0"
    msg1 = reader2.read_next(TM)
    assert msg1.data() == b"hello-1"
    reader2.close()
    client.close()


def test_v2_topics(subscribe, broker_url):
    _v2_topics(subscribe, broker_url)


def test_v2_topics_http(subscribe, session_broker, broker_kind):
    """The client on the HTTP service URL (the admin port): topic lookups over HTTP."""
    lite_skip(broker_kind, "has no HTTP service (lookups go over the binary protocol only)")
    if session_broker is None:
        pytest.skip("$PULSAR_URL names no HTTP service URL")
    _v2_topics(subscribe, session_broker.admin_url)


def _v2_topics(subscribe, url):
    client = pulsar.Client(url, logger=quiet_logger(), operation_timeout_seconds=10)
    t = f"my-v2-topic-producer-consumer-{uuid.uuid4().hex[:10]}"  # a short (v2) name, fresh
    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(t)
    producer.send(b"hello")

    msg = consumer.receive(TM)
    assert msg
    assert msg.data() == b"hello"
    consumer.acknowledge(msg)

    with pytest.raises(pulsar.Timeout):
        consumer.receive(100)

    client.close()


def test_producer_consumer_zstd(client, subscribe, topic):
    t = topic("my-python-topic-producer-consumer-zstd")
    consumer = subscribe(client, t, "my-sub", consumer_type=ConsumerType.Shared)
    producer = client.create_producer(t, compression_type=CompressionType.ZSTD)
    producer.send(b"hello")

    msg = consumer.receive(TM)
    assert msg
    assert msg.data() == b"hello"

    with pytest.raises(pulsar.Timeout):
        consumer.receive(100)

    consumer.unsubscribe()
    client.close()


def test_invalid_chunking_config(client):
    """(Its one call is the producer's; nothing here subscribes: ported whole as it is.)"""
    with pytest.raises(ValueError):
        client.create_producer("test_invalid_chunking_config", chunking_enabled=True, batching_enabled=True)


def test_keyshared_invalid_sticky_ranges(client, subscribe, topic):
    t = topic("my-python-topic-keyshare-invalid")
    with pytest.raises(ValueError):
        consumer_key_shared_policy = pulsar.ConsumerKeySharedPolicy(
            key_shared_mode=pulsar.KeySharedMode.Sticky, allow_out_of_order_delivery=False,
            sticky_ranges=[(0, 65536)])
        subscribe(client, t, "my-sub", consumer_type=ConsumerType.KeyShared, start_message_id_inclusive=True,
                  key_shared_policy=consumer_key_shared_policy)

    with pytest.raises(ValueError):
        consumer_key_shared_policy = pulsar.ConsumerKeySharedPolicy(
            key_shared_mode=pulsar.KeySharedMode.Sticky, allow_out_of_order_delivery=False,
            sticky_ranges=[(0, 100), (50, 150)])
        subscribe(client, t, "my-sub", consumer_type=ConsumerType.KeyShared, start_message_id_inclusive=True,
                  key_shared_policy=consumer_key_shared_policy)


def test_message_router(client, subscribe, admin):
    topic_name = f"public/default/test_message_router-{uuid.uuid4().hex[:10]}"
    admin("PUT", f"/admin/v2/persistent/{topic_name}/partitions", 5)

    def router(msg: pulsar.Message, num_partitions: int):
        s = msg.value().decode("utf-8")
        if s.startswith("hello-"):
            return 10 % num_partitions
        else:
            return 11 % num_partitions

    producer = client.create_producer(topic_name, message_router=router)
    producer.send(b"hello-0")
    producer.send(b"hello-1")
    producer.send(b"world-0")
    producer.send(b"world-1")
    consumer = subscribe(client, topic_name, "sub", initial_position=InitialPosition.Earliest)
    partition_to_values: dict[int, list[str]] = dict()
    for _ in range(4):
        msg = consumer.receive(TM)
        partition = msg.message_id().partition()
        if partition in partition_to_values:
            partition_to_values[partition].append(msg.value().decode("utf-8"))
        else:
            partition_to_values[partition] = [msg.value().decode("utf-8")]
    assert partition_to_values[0] == ["hello-0", "hello-1"]
    assert partition_to_values[1] == ["world-0", "world-1"]

    client.close()


def test_null_value_compaction(client, subscribe, admin, session_broker):
    t = "null-compact-%s" % uuid.uuid4()
    producer = client.create_producer(t, batching_enabled=False)

    consumer = subscribe(client, t, "my-sub1", is_read_compacted=True)
    consumer.close()

    # key1: value then tombstone -> removed after compaction
    producer.send(b"hello-1", partition_key="key1")
    producer.send(None, partition_key="key1")

    # key2: value only -> survives
    producer.send(b"hello-2", partition_key="key2")

    # key3: value then tombstone -> removed
    producer.send(b"hello-3", partition_key="key3")
    producer.send(None, partition_key="key3")

    # key4: value only -> survives
    producer.send(b"hello-4", partition_key="key4")
    producer.close()

    compact(admin, t)

    # The compacted ledger cursor update is async on the broker side, wait for it to be persisted before reading.
    time.sleep(1.0)

    consumer = subscribe(client, t, "my-sub1", is_read_compacted=True)
    messages = []
    while True:
        try:
            msg = consumer.receive(2000)
            messages.append(msg)
        except pulsar.Timeout:
            break

    keys = [m.partition_key() for m in messages]
    assert "key2" in keys
    assert "key4" in keys
    if session_broker.version().startswith("4.0."):
        pytest.skip("Apache Pulsar 4.0's compaction keeps a non-batched null-value message as the key's last value "
                    "(measured with the plain pulsar.Client too: key1 and key3 come back, null), a broker "
                    "defect fixed in later releases")
    assert "key1" not in keys
    assert "key3" not in keys
    assert len(messages) == 2

    consumer.close()
    client.close()


def test_auth_junk_params(client, subscribe, broker_url, tmp_path):
    """The client's TLS URL (``pulsar+ssl://``) of the test's broker, which serves no TLS: the junk plugin fails
    the subscribe before any connection is made (measured with the plain client too, on both brokers)."""
    authPlugin = "someoldjunk.so"
    authParams = "blah"
    client = pulsar.Client(
        broker_url.replace("pulsar://", "pulsar+ssl://"),
        tls_trust_certs_file_path=str(tmp_path / "cacert.pem"),
        tls_allow_insecure_connection=False,
        authentication=pulsar.Authentication(authPlugin, authParams),
        logger=quiet_logger(),
    )

    with pytest.raises(pulsar.AuthenticationError):
        subscribe(client, "my-python-topic-auth-junk-params", "my-sub", consumer_type=ConsumerType.Shared)
    client.close()


class AuthBroker:
    """An Apache Pulsar broker that authenticates (tokens, basic) and authorizes, as the original's CI broker
    does: its service and HTTP URLs and the token of ``token-principal``, the one role that may produce and
    consume on the ``private/auth`` namespace."""

    def __init__(self, broker: Any, token: str) -> None:
        self.serviceUrl = broker.url
        self.adminUrl = broker.admin_url
        self.token = token


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_token(secret: bytes, subject: str) -> str:
    """A JSON web token for ``subject`` signed with ``secret`` (what ``pulsar tokens create`` makes)."""
    header = _b64url(json.dumps({"alg": "HS256"}).encode())
    claims = _b64url(json.dumps({"sub": subject}).encode())
    signature = _b64url(hmac.new(secret, f"{header}.{claims}".encode(), hashlib.sha256).digest())
    return f"{header}.{claims}.{signature}"


@pytest.fixture(scope="module")
def auth_broker(broker_kind, tmp_path_factory) -> Iterator[AuthBroker]:
    """The original's broker configuration, but TLS: token and basic authentication (user ``admin``), a client
    that sends no credentials (or credentials that fail) is ``anonymous``, authorization on, ``superUser`` (the
    broker's own client and the test's admin calls) and ``admin`` super-users, ``private/auth`` open to
    ``token-principal`` (and the super-users) only."""
    lite_skip(broker_kind, "authenticates and authorizes nobody: it takes every client's credentials, valid or not")
    if broker_kind == "external":
        pytest.skip("needs a broker configured for authentication of its own ($PULSAR_URL names one it cannot)")
    tmp_path = tmp_path_factory.mktemp("auth-broker")
    secret = os.urandom(32)
    super_token = hs256_token(secret, "superUser")
    htpasswd = tmp_path / ".htpasswd"
    hashed = subprocess.run(["openssl", "passwd", "-apr1", "123456"], check=True, capture_output=True, text=True)
    htpasswd.write_text(f"admin:{hashed.stdout.strip()}\n")
    settings = {
        "authenticationEnabled": True,
        "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken,"
                                   "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic",
        "tokenSecretKey": "data:;base64," + base64.b64encode(secret).decode(),
        "basicAuthConf": str(htpasswd),
        "anonymousUserRole": "anonymous",
        "authorizationEnabled": True,
        "superUserRoles": "superUser,admin",
        "brokerClientAuthenticationPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
        "brokerClientAuthenticationParameters": f"token:{super_token}",
    }
    # one broker for the module's auth tests, as the original's CI runs them all on one
    with make_broker(broker_kind, data_dir=tmp_path / "broker", settings=settings, token=super_token) as broker:
        broker.admin("PUT", "/admin/v2/tenants/private", {"adminRoles": [], "allowedClusters": ["standalone"]})
        broker.admin("PUT", "/admin/v2/namespaces/private/auth", None)
        broker.admin("POST", "/admin/v2/namespaces/private/auth/permissions/token-principal", ["produce", "consume"])
        yield AuthBroker(broker, hs256_token(secret, "token-principal"))


def test_token_auth(subscribe, auth_broker):
    token = auth_broker.token

    # Use adminUrl to test both HTTP request and binary protocol
    client = pulsar.Client(auth_broker.adminUrl, authentication=pulsar.AuthenticationToken(token),
                           logger=quiet_logger())

    consumer = subscribe(client, "persistent://private/auth/my-python-topic-token-auth", "my-sub",
                         consumer_type=ConsumerType.Shared)
    producer = client.create_producer("persistent://private/auth/my-python-topic-token-auth")
    producer.send(b"hello")

    msg = consumer.receive(TM)
    assert msg
    assert msg.data() == b"hello"
    client.close()


def test_token_auth_supplier(subscribe, auth_broker):
    def read_token():
        return auth_broker.token

    client = pulsar.Client(auth_broker.serviceUrl, authentication=pulsar.AuthenticationToken(read_token),
                           logger=quiet_logger())
    consumer = subscribe(client, "persistent://private/auth/my-python-topic-token-auth", "my-sub",
                         consumer_type=ConsumerType.Shared)
    producer = client.create_producer("persistent://private/auth/my-python-topic-token-auth")
    producer.send(b"hello")

    msg = consumer.receive(TM)
    assert msg
    assert msg.data() == b"hello"
    client.close()


def _test_basic_auth(subscribe, auth_broker: AuthBroker, topic_id: int, auth: Any) -> None:
    """(The original's TLS form, ``use_tls=True``, is ``test_tls_encryption_with_other_auth``'s: not ported.)"""
    client = pulsar.Client(auth_broker.adminUrl, authentication=auth, logger=quiet_logger())
    try:  # closed when the subscribe fails too (the original leaves that client to the process's exit)
        topic = "persistent://private/auth/my-python-topic-basic-auth-" + str(topic_id)
        consumer = subscribe(client, topic, "my-sub", consumer_type=ConsumerType.Shared)
        producer = client.create_producer(topic)
        producer.send(b"hello")

        msg = consumer.receive(TM)
        assert msg
        assert msg.data() == b"hello"
    finally:
        client.close()


def test_basic_auth(subscribe, auth_broker):
    username = "admin"
    password = "123456"
    _test_basic_auth(subscribe, auth_broker, 0, pulsar.AuthenticationBasic(username, password))
    _test_basic_auth(subscribe, auth_broker, 1, pulsar.AuthenticationBasic(
        auth_params_string='{{"username": "{}","password": "{}"}}'.format(username, password)
    ))


def test_basic_auth_method(subscribe, auth_broker):
    username = "admin"
    password = "123456"
    _test_basic_auth(subscribe, auth_broker, 2, pulsar.AuthenticationBasic(username, password, "basic"))
    with pytest.raises(pulsar.AuthorizationError):
        _test_basic_auth(subscribe, auth_broker, 3, pulsar.AuthenticationBasic(username, password, "unknown"))
    _test_basic_auth(subscribe, auth_broker, 4, pulsar.AuthenticationBasic(
        auth_params_string='{{"username": "{}","password": "{}", "method": "basic"}}'.format(username, password)
    ))
    with pytest.raises(pulsar.AuthorizationError):
        _test_basic_auth(subscribe, auth_broker, 5, pulsar.AuthenticationBasic(
            auth_params_string='{{"username": "{}","password": "{}", "method": "unknown"}}'.format(username,
                                                                                                 password)
        ))


def test_invalid_basic_auth(subscribe, auth_broker):
    username = "invalid"
    password = "123456"
    client = pulsar.Client(auth_broker.adminUrl, authentication=pulsar.AuthenticationBasic(username, password),
                           logger=quiet_logger())
    topic = "persistent://private/auth/my-python-topic-invalid-basic-auth"
    with pytest.raises(pulsar.ConnectError):
        subscribe(client, topic, "my-sub", consumer_type=ConsumerType.Shared)
    client.close()  # (the original leaves its clients to the process's exit)
    client = pulsar.Client(auth_broker.adminUrl, authentication=pulsar.AuthenticationBasic(
        auth_params_string='{{"username": "{}","password": "{}"}}'.format(username, password)
    ), logger=quiet_logger())
    with pytest.raises(pulsar.ConnectError):
        subscribe(client, topic, "my-sub", consumer_type=ConsumerType.Shared)
    client.close()
    with pytest.raises(RuntimeError):
        pulsar.AuthenticationBasic(auth_params_string="invalid auth params")


# -- tests/schema_test.py -----------------------------------------------------------------


class Example(Record):
    a = Integer()
    b = Integer()


class BadExample(Record):  # an incompatible variation of Example
    a = String()
    b = Integer()


def _has_avro() -> bool:
    try:
        import fastavro  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("kind", ["json", "avro"])
def test_json_and_avro_schema(client, subscribe, topic, broker_kind, kind):
    if kind == "avro" and not _has_avro():
        pytest.skip("pulsar-client's Avro schemas need pulsar-client[avro] (fastavro), not installed here")
    schema = JsonSchema if kind == "json" else AvroSchema
    t = topic(f"my-{kind}-python-topic")
    producer = client.create_producer(t, schema=schema(Example))

    if broker_kind != "lite":  # pulsar-lite keeps no schema registry: it refuses no schema (measured)
        bad_schemas = ([JsonSchema(BadExample), StringSchema(), *([AvroSchema(BadExample)] if _has_avro() else [])]
                       if kind == "json" else [AvroSchema(BadExample), JsonSchema(Example)])
        for bad in bad_schemas:
            with pytest.raises(pulsar.PulsarException):  # (the original: any Exception)
                subscribe(client, t, f"sub-bad-{uuid.uuid4().hex[:6]}", schema=bad)

    consumer = subscribe(client, t, "sub-1", schema=schema(Example))
    r = Example(a=1, b=2)
    producer.send(r)
    msg = consumer.receive()
    assert msg.value() == r
    producer.close()
    consumer.close()


def test_string_and_bytes_schema(client, subscribe, topic):
    t = topic("my-string-python-topic")
    producer = client.create_producer(t, schema=StringSchema())
    consumer = subscribe(client, t, "sub-1", schema=StringSchema())
    producer.send("Hello")
    msg = consumer.receive()
    assert msg.value() == "Hello"
    assert msg.data() == b"Hello"

    t = topic("my-bytes-python-topic")
    producer = client.create_producer(t, schema=pulsar.schema.BytesSchema())
    consumer = subscribe(client, t, "sub-1", schema=pulsar.schema.BytesSchema())
    producer.send(b"Hello")
    msg = consumer.receive()
    assert msg.value() == b"Hello"
