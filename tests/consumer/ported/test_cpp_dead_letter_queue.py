"""The C++ client's parametrised dead-letter tests (``DeadLetterQueueTest`` in apache/pulsar-client-cpp,
``tests/DeadLetterQueueTest.cc``), ported onto the sync face, whose calls are the C++ consumer's: each body
is the original's with ``client.subscribe(topic, sub, conf, consumer)`` replaced by
``nacktracker.sync.subscribe(client, topic, sub, **conf)`` (the configuration's settings as the Python
client's keywords: ``consumer_type``, ``dead_letter_policy``, ``negative_ack_redelivery_delay_ms``).

Every case runs over the original's parameters: producer batching on or off, a plain topic or one of 5
partitions (``isMultiTopics``), Shared or Key_Shared. Ported: ``testSendDLQTriggerByNegativeAcknowledge``,
``testSendDLQTriggerByRedeliverUnacknowledgedMessages``, ``testInitSubscription``. Not ported:
``testSendDLQTriggerByAckTimeOutAndNeAck`` sets a 200 ms ack timeout through ``PulsarFriend`` (the C++
test's back door); the Python client refuses one below 10 s.

The C++ ``sendAsync`` with a callback asserting ``ResultOk`` is ``send_async`` with the same check, then a
flush. ``getMessageId().batchSize() == 0`` reads ``message_id().batch_index() == -1`` here (the Python id has
no batch size getter; a non-batched id has both). Skips on pulsar-lite only, for its documented limits
(``nacktracker.testing.lite``): no partitioned topics (no admin API), one nacked message per key at a time
on Key_Shared.
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import pytest

pulsar = pytest.importorskip("pulsar")
from pulsar import ConsumerDeadLetterPolicy, ConsumerType, InitialPosition  # noqa: E402

import nacktracker.sync  # noqa: E402
from conftest import quiet_logger  # noqa: E402

pytestmark = [pytest.mark.broker, pytest.mark.timeout(90)]

SYSTEM_PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"

PARAMS = list(itertools.product([True, False], [True, False], [ConsumerType.Shared, ConsumerType.KeyShared]))


def param_id(p: tuple[bool, bool, Any]) -> str:
    return f"isBatch_{int(p[0])}_isMultiTopics_{int(p[1])}_subType_{'KeyShared' if p[2] == ConsumerType.KeyShared else 'Shared'}"


class Setup:
    """The fixture's ``SetUp``: topic, subscription, dead-letter topic, producer and consumer configuration."""

    def __init__(self, param: tuple[bool, bool, Any], name: str, admin: Any) -> None:
        is_producer_batch, is_multi_consumer, consumer_type = param
        self.topic = f"{name}-{uuid.uuid4().hex[:10]}"
        self.sub_name = "test-sub"
        self.dlq_topic = f"{self.topic}-{self.sub_name}-DLQ"
        if is_multi_consumer:
            admin("PUT", f"/admin/v2/persistent/public/default/{self.topic}/partitions", 5)
        self.producer_conf = {"batching_enabled": is_producer_batch}
        self.consumer_conf: dict[str, Any] = {
            "consumer_type": consumer_type,
            "dead_letter_policy": ConsumerDeadLetterPolicy(max_redeliver_count=3, dead_letter_topic=self.dlq_topic)}


#: A known defect, measured on both brokers: nacks of one batch entry spread over time (20-50 ms apart, as
#: under load) are asked for in separate redelivery requests, and each bumps the broker's per-entry count of
#: every message of the entry, so some reach the dead-letter topic after fewer deliveries than
#: max_redeliver_count + 1 (the original's receive loop then waits for deliveries that never come). The plain
#: client groups nacks per timer tick and does not (test_nacks_of_one_batch_spread_over_time_... below).
BATCH_COUNT_DEFECT = ("nacks of one batch entry asked for in separate requests each bump the entry's redelivery count: "
                      "under load a message can be dead-lettered after fewer deliveries than the policy allows")


@pytest.fixture(params=PARAMS, ids=param_id)
def setup(request, session_broker, broker_kind) -> Setup:
    if request.param[1] and (broker_kind != "apache" or session_broker is None):
        pytest.skip("pulsar-lite has no partitioned topics (no admin API)")
    if request.param[2] == ConsumerType.KeyShared and broker_kind == "lite":
        pytest.skip("pulsar-lite redelivers one nacked message per key at a time on Key_Shared (every message here "
                    "has one key): the rest never come back, for the plain client too")
    if request.param[0] and request.function.__name__ != "test_send_dlq_trigger_by_redeliver_unacknowledged_messages":
        request.applymarker(pytest.mark.xfail(reason=BATCH_COUNT_DEFECT, strict=False))
    return Setup(request.param, request.function.__name__, session_broker.admin if request.param[1] else None)


@pytest.fixture
def client(broker_url):
    c = pulsar.Client(broker_url, logger=quiet_logger(), operation_timeout_seconds=10)
    made: list[Any] = []
    yield c, made
    for consumer in made:
        consumer.close()
    c.close()


def subscribe(made: list[Any], *args: Any, **kwargs: Any) -> Any:
    consumer = nacktracker.sync.subscribe(*args, **kwargs)
    made.append(consumer)
    return consumer


def send_all(producer: Any, num: int, keyed: bool = True) -> None:
    results: list[Any] = []
    for i in range(num):
        options = {"partition_key": "p-key", "ordering_key": "o-key", "properties": {"pk-1": "pv-1"}} if keyed else {}
        producer.send_async(str(i).encode(), lambda res, msg_id: results.append(res), **options)
    producer.flush()
    assert results == [pulsar.Result.Ok] * num


def check_letter(msg: Any, topic: str, keyed: bool = True) -> None:
    assert msg.data()
    if keyed:
        assert msg.partition_key() == "p-key"
        assert msg.ordering_key() == "o-key"
        assert msg.properties()["pk-1"] == "pv-1"
    assert topic in msg.properties()[SYSTEM_PROPERTY_REAL_TOPIC]
    assert msg.properties()[PROPERTY_ORIGIN_MESSAGE_ID]


def test_send_dlq_trigger_by_redeliver_unacknowledged_messages(client, setup):
    client, made = client
    consumer = subscribe(made, client, setup.topic, setup.sub_name, **setup.consumer_conf)
    producer = client.create_producer(setup.topic, **setup.producer_conf)
    num = 10
    send_all(producer, num)

    # nack all msg.
    for i in range(1, 3 * num + num + 1):
        consumer.receive()
        if i % num == 0:
            consumer.redeliver_unacknowledged_messages()

    # assert dlq msg.
    dlq = subscribe(made, client, setup.dlq_topic, setup.sub_name, initial_position=InitialPosition.Earliest)
    for _ in range(num):
        msg = dlq.receive()
        check_letter(msg, setup.topic)
        assert msg.message_id().batch_index() == -1
    with pytest.raises(pulsar.Timeout):
        dlq.receive(200)


def test_send_dlq_trigger_by_negative_acknowledge(client, setup):
    client, made = client
    consumer = subscribe(made, client, setup.topic, setup.sub_name, negative_ack_redelivery_delay_ms=100,
                         **setup.consumer_conf)
    producer = client.create_producer(setup.topic, **setup.producer_conf)
    num = 10
    send_all(producer, num)

    # nack all msg.
    for _ in range(3 * num + num):
        msg = consumer.receive()
        consumer.negative_acknowledge(msg)

    # assert dlq msg.
    dlq = subscribe(made, client, setup.dlq_topic, "dlq-sub", initial_position=InitialPosition.Earliest)
    for _ in range(num):
        check_letter(dlq.receive(), setup.topic)
    with pytest.raises(pulsar.Timeout):
        dlq.receive(200)


def test_init_subscription(client, setup):
    client, made = client
    dlq_init_sub = "dlq-init-sub"
    conf = dict(setup.consumer_conf, negative_ack_redelivery_delay_ms=100,
                dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=3, dead_letter_topic=setup.dlq_topic,
                                                            initial_subscription_name=dlq_init_sub))
    consumer = subscribe(made, client, setup.topic, setup.sub_name, **conf)
    dlq = subscribe(made, client, setup.dlq_topic, setup.sub_name, initial_position=InitialPosition.Earliest)
    producer = client.create_producer(setup.topic, **setup.producer_conf)
    num = 10
    for i in range(num):
        producer.send(str(i).encode())

    # nack all msg.
    for _ in range(3 * num + num):
        msg = consumer.receive()
        consumer.negative_acknowledge(msg)

    # Use this subscription to ensure that messages are sent to the DLQ.
    for _ in range(num):
        check_letter(dlq.receive(), setup.topic, keyed=False)

    # If there is no initial subscription, then the subscription will not receive the DLQ messages sent
    # before the subscription.
    init_dlq = subscribe(made, client, setup.dlq_topic, dlq_init_sub)
    for _ in range(num):
        check_letter(init_dlq.receive(1000), setup.topic, keyed=False)
    with pytest.raises(pulsar.Timeout):
        init_dlq.receive(200)


@pytest.mark.xfail(reason=BATCH_COUNT_DEFECT, strict=False)
def test_nacks_of_one_batch_spread_over_time_each_get_every_delivery_before_the_dead_letter(client, topic):
    """Not a port: the defect the batched cases above can meet under load, made certain. Ten messages in one
    batch entry, each nacked 20 ms after the one before (100 ms delay, max 3 redeliveries): each should be
    delivered 4 times, its broker count 0, 1, 2, 3, before its dead letter, as with the plain client."""
    client, made = client
    t = topic("batch-spread-nacks")
    consumer = subscribe(made, client, t, "sub", consumer_type=ConsumerType.Shared, negative_ack_redelivery_delay_ms=100,
                         dead_letter_policy=ConsumerDeadLetterPolicy(max_redeliver_count=3, dead_letter_topic=t + "-DLQ"))
    producer = client.create_producer(t, batching_enabled=True)
    send_all(producer, 10, keyed=False)
    counts: dict[bytes, list[int]] = {}
    try:
        while True:
            msg = consumer.receive(3000)
            counts.setdefault(msg.data(), []).append(msg.redelivery_count())
            consumer.negative_acknowledge(msg)
            time.sleep(0.02)
    except pulsar.Timeout:
        pass
    assert counts == {str(i).encode(): [0, 1, 2, 3] for i in range(10)}
