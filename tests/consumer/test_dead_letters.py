"""nacktracker.consumer.letters.publisher: dead letters as Pulsar's Java client publishes
them. Against the embedded broker where it can show the behaviour; against a
fake client where it cannot (partitioned topics: pulsar-lite cannot redeliver
on them, and a broken producer on demand)."""

from __future__ import annotations

import asyncio
import re

import pytest

pulsar = pytest.importorskip("pulsar")
import pulsar.asyncio  # noqa: E402
import pulsar.schema  # noqa: E402

from nacktracker.consumer.letters.publisher import (  # noqa: E402
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_SUBSCRIPTION,
    PROPERTY_REAL_TOPIC,
    DeadLetterError,
    DeadLetterPublisher,
    DeadLetterPublisherClosed,
    dead_letter_topic,
)

Shared = pulsar.ConsumerType.Shared
Earliest = pulsar.InitialPosition.Earliest


class CountingClient(pulsar.asyncio.Client):
    """A real client that records every producer it is asked to create."""

    def __init__(self, url, logger) -> None:
        super().__init__(url, logger=logger, operation_timeout_seconds=10)
        self.created: list[str] = []

    async def create_producer(self, topic, **options):
        self.created.append(topic)
        return await super().create_producer(topic, **options)


@pytest.fixture
async def counting_client(broker_url, pulsar_logger):
    c = CountingClient(broker_url, pulsar_logger)
    yield c
    try:
        await c.close()
    except Exception:
        pass


async def received(client, t, n, **send_options):
    """Publish ``n`` messages (unbatched) to ``t`` and return them as a Shared consumer receives them."""
    consumer = await client.subscribe(t, "sub", consumer_type=Shared, initial_position=Earliest)
    producer = await client.create_producer(t, batching_enabled=False)
    for i in range(n):
        await producer.send(b"m%d" % i, **send_options)
    await producer.close()
    msgs = [await asyncio.wait_for(consumer.receive(), 10) for _ in range(n)]
    return consumer, msgs


async def drain(pump, timeout=1.0):
    """Everything ``pump`` (conftest's Pump: a plain consumer's receive() must
    never be cancelled) gets until ``timeout`` s pass without a message."""
    got = []
    while True:
        try:
            got.append((await pump.get(timeout))[1])
        except asyncio.TimeoutError:
            return got


# -- against the embedded broker ---------------------------------------------------

@pytest.mark.broker
async def test_100_concurrent_dead_letters_make_one_producer_and_arrive_once_in_order(counting_client, topic, pumps):
    client, t = counting_client, topic("dl")
    dlq = dead_letter_topic(t, "sub")
    inspect = pumps(await client.subscribe(dlq, "inspect", consumer_type=Shared, initial_position=Earliest))
    consumer, msgs = await received(client, t, 100)
    publisher = DeadLetterPublisher(client, subscription="sub", consumer_name="c1")

    async def dead_letter(msg):  # as the tracker does: one task per dead letter, all at once
        return await publisher.publish(msg)

    ids = await asyncio.gather(*[asyncio.create_task(dead_letter(m)) for m in msgs])
    assert len({(i.ledger_id(), i.entry_id()) for i in ids}) == 100
    assert client.created.count(dlq) == 1
    dead = [(await inspect.get(10))[1] for _ in range(100)]
    assert [m.data() for m in dead] == [b"m%d" % i for i in range(100)]
    assert len({m.producer_name() for m in dead}) == 1
    assert await drain(inspect, 0.5) == []
    assert publisher.stats() == {"published": 100, "failed": 0, "producers_created": 1, "producers_open": 1,
                                 "pending": 0}
    await publisher.close()
    assert publisher.stats()["producers_open"] == 0
    await consumer.close()


@pytest.mark.broker
async def test_names_and_properties_are_javas(client, topic):
    t = topic("dl")
    dlq = f"{t}-sub-DLQ"
    inspect = await client.subscribe(dlq, "inspect", consumer_type=Shared, initial_position=Earliest)
    consumer, [plain, origin] = await received(client, t, 2, properties={"k": "v"}, partition_key="pk",
                                               ordering_key="ok", event_timestamp=1_700_000_000_123)
    publisher = DeadLetterPublisher(client, subscription="sub", consumer_name="worker-7")
    assert publisher.topic_for(t) == dlq
    await publisher.publish(plain)
    dead = await asyncio.wait_for(inspect.receive(), 10)
    mid = plain.message_id()
    assert dead.data() == b"m0"
    assert re.fullmatch(re.escape(f"{t}-sub-worker-7-") + "[A-Za-z0-9]{5}-DLQ", dead.producer_name())
    assert dead.properties() == {"k": "v", PROPERTY_REAL_TOPIC: t, PROPERTY_REAL_SUBSCRIPTION: "sub",
                                 PROPERTY_ORIGIN_MESSAGE_ID: f"{mid.ledger_id()}:{mid.entry_id()}:-1"}
    assert (dead.partition_key(), dead.ordering_key(), dead.event_timestamp()) == ("pk", "ok", 1_700_000_000_123)
    await publisher.close()
    await consumer.close()


@pytest.mark.broker
async def test_a_batch_message_carries_its_batch_index_and_an_earlier_origin_is_kept(client, topic):
    from broker_helpers import publish_batch

    t, origin = topic("dl"), "persistent://public/default/first-home"
    inspect = await client.subscribe(f"{t}-sub-DLQ", "inspect", consumer_type=Shared, initial_position=Earliest)
    consumer = await client.subscribe(t, "sub", consumer_type=Shared, initial_position=Earliest)
    await publish_batch(client, t, 3)
    msgs = [await asyncio.wait_for(consumer.receive(), 10) for _ in range(3)]
    producer = await client.create_producer(t, batching_enabled=False)
    await producer.send(b"again", properties={PROPERTY_REAL_TOPIC: origin})  # dead-lettered once before
    again = await asyncio.wait_for(consumer.receive(), 10)
    publisher = DeadLetterPublisher(client, subscription="sub", consumer_name="c")
    await asyncio.gather(publisher.publish(msgs[2]), publisher.publish(again))
    first, second = [await asyncio.wait_for(inspect.receive(), 10) for _ in range(2)]
    mid = msgs[2].message_id()
    assert first.properties()[PROPERTY_ORIGIN_MESSAGE_ID] == f"{mid.ledger_id()}:{mid.entry_id()}:-1:2"
    assert second.data() == b"again" and second.properties()[PROPERTY_REAL_TOPIC] == origin
    await producer.close()
    await publisher.close()
    await consumer.close()


@pytest.mark.broker
async def test_the_initial_subscription_retains_the_first_dead_letter(client, topic, pumps):
    """Nobody is subscribed to the dead-letter topics before the dead letters
    are published. With ``initial_subscription`` the subscription exists
    first and keeps the very first dead letter, even for a subscriber that
    starts at the latest position; without it (the control) that dead letter
    is gone for such a subscriber."""
    t, control = topic("dl"), topic("dl-control")
    consumer, [msg] = await received(client, t, 1)
    control_consumer, [control_msg] = await received(client, control, 1)
    keeping = DeadLetterPublisher(client, subscription="sub", consumer_name="c", initial_subscription="audit")
    plain = DeadLetterPublisher(client, subscription="sub", consumer_name="c")
    await keeping.publish(msg)
    await plain.publish(control_msg)
    audit = await client.subscribe(keeping.topic_for(t), "audit", consumer_type=Shared)  # Latest: the default
    late = await client.subscribe(plain.topic_for(control), "audit", consumer_type=Shared)
    kept = await asyncio.wait_for(audit.receive(), 10)
    assert kept.data() == b"m0" and kept.properties()[PROPERTY_REAL_TOPIC] == t
    assert await drain(pumps(late), 0.5) == []
    for closable in (keeping, plain, consumer, control_consumer, audit):
        await closable.close()


@pytest.mark.broker
async def test_the_consumers_schema_is_declared_and_the_payload_kept_as_is(client, topic):
    t = topic("dl")
    schema = pulsar.schema.StringSchema()
    inspect = await client.subscribe(f"{t}-sub-DLQ", "inspect", consumer_type=Shared, initial_position=Earliest,
                                     schema=schema)
    consumer = await client.subscribe(t, "sub", consumer_type=Shared, initial_position=Earliest, schema=schema)
    producer = await client.create_producer(t, schema=schema, batching_enabled=False)
    await producer.send("héllo")
    msg = await asyncio.wait_for(consumer.receive(), 10)
    publisher = DeadLetterPublisher(client, subscription="sub", consumer_name="c", schema=schema)
    await publisher.publish(msg)
    dead = await asyncio.wait_for(inspect.receive(), 10)
    assert dead.value() == "héllo" and dead.data() == "héllo".encode()
    for closable in (publisher, producer, consumer, inspect):
        await closable.close()


# -- against a fake client ----------------------------------------------------------

class FakeId:
    def __init__(self, ledger, entry, partition=-1, batch=-1) -> None:
        self._v = (ledger, entry, partition, batch)

    def ledger_id(self):
        return self._v[0]

    def entry_id(self):
        return self._v[1]

    def partition(self):
        return self._v[2]

    def batch_index(self):
        return self._v[3]


class FakeMessage(pulsar.Message):
    """A received message as far as the publisher looks at one."""

    def __init__(self, topic, mid, data=b"x", properties=None) -> None:
        self._topic, self._mid, self._data, self._props = topic, mid, data, properties or {}

    def topic_name(self):
        return self._topic

    def message_id(self):
        return self._mid

    def data(self):
        return self._data

    def properties(self):
        return dict(self._props)

    def partition_key(self):
        return ""

    def ordering_key(self):
        return ""

    def event_timestamp(self):
        return 0


class FakeProducer:
    def __init__(self, client, topic, name) -> None:
        self.client, self.topic, self.name = client, topic, name
        self.sent: list = []
        self.closed = False

    async def send(self, payload, **options):
        await asyncio.sleep(0)
        if self.client.fail_sends:
            self.client.fail_sends -= 1
            raise pulsar.asyncio.PulsarException(pulsar.Result.Timeout, "send timed out")
        self.sent.append((payload, options))
        return FakeId(9, len(self.sent))

    async def close(self):
        self.closed = True


class FakeClient(pulsar.asyncio.Client):
    """Records producers and subscriptions; no broker behind it."""

    def __init__(self) -> None:  # no real client
        self.producers: list[FakeProducer] = []
        self.subscriptions: list[tuple[str, str]] = []
        self.fail_sends = 0
        self.fail_creates = 0

    async def create_producer(self, topic, producer_name=None, **options):
        await asyncio.sleep(0.01)  # long enough for every concurrent dead letter to be queued meanwhile
        if self.fail_creates:
            self.fail_creates -= 1
            raise pulsar.asyncio.PulsarException(pulsar.Result.ConnectError, "cannot connect")
        self.producers.append(FakeProducer(self, topic, producer_name))
        return self.producers[-1]

    async def subscribe(self, topic, subscription_name, **options):
        self.subscriptions.append((topic, subscription_name))
        client = self

        class Closing:
            async def close(self):
                client.subscriptions.append(("closed", subscription_name))
        return Closing()


P = "persistent://public/default/orders"


async def test_partitioned_topics_get_a_dead_letter_topic_and_producer_per_partition():
    client = FakeClient()
    publisher = DeadLetterPublisher(client, subscription="sub", consumer_name="c", initial_subscription="audit")
    msgs = [FakeMessage(f"{P}-partition-{p}", FakeId(7, e, p)) for p, e in ((0, 1), (3, 2), (0, 3))]
    await asyncio.gather(*[publisher.publish(m) for m in msgs])
    assert [(p.topic, len(p.sent)) for p in client.producers] == [(f"{P}-partition-0-sub-DLQ", 2),
                                                                   (f"{P}-partition-3-sub-DLQ", 1)]
    for p, n in zip(client.producers, (0, 3)):
        assert re.fullmatch(re.escape(f"{P}-partition-{n}-sub-c-") + "[A-Za-z0-9]{5}-DLQ", p.name)
    assert client.producers[1].sent[0][1]["properties"] == {
        PROPERTY_REAL_TOPIC: f"{P}-partition-3", PROPERTY_REAL_SUBSCRIPTION: "sub",
        PROPERTY_ORIGIN_MESSAGE_ID: "7:2:3"}
    # the initial subscription is made once per dead-letter topic, before its producer
    assert client.subscriptions == [(f"{P}-partition-0-sub-DLQ", "audit"), ("closed", "audit"),
                                    (f"{P}-partition-3-sub-DLQ", "audit"), ("closed", "audit")]
    await publisher.close()
    assert all(p.closed for p in client.producers)


async def test_a_given_dead_letter_topic_serves_every_partition_with_one_producer():
    client = FakeClient()
    publisher = DeadLetterPublisher(client, subscription="sub", consumer_name="c", dead_letter_topic="dlq")
    await asyncio.gather(*[publisher.publish(FakeMessage(f"{P}-partition-{p}", FakeId(1, p, p))) for p in range(4)])
    assert [(p.topic, len(p.sent)) for p in client.producers] == [("dlq", 4)]
    await publisher.close()


async def test_dead_letters_queued_while_the_producer_is_created_share_it_in_call_order():
    client = FakeClient()
    publisher = DeadLetterPublisher(client, subscription="sub", consumer_name="c")
    futures = [publisher.publish(FakeMessage(P, FakeId(1, i), b"%d" % i)) for i in range(50)]
    assert publisher.pending == 50
    await asyncio.gather(*reversed(futures))  # awaited in any order: published in the order of the calls
    [producer] = client.producers
    assert [payload for payload, _ in producer.sent] == [b"%d" % i for i in range(50)]
    await publisher.close()


async def test_a_failed_publish_is_reported_and_the_broken_producer_replaced():
    client = FakeClient()
    publisher = DeadLetterPublisher(client, subscription="sub", consumer_name="c")
    client.fail_sends = 1
    first = publisher.publish(FakeMessage(P, FakeId(1, 1), b"a"))
    second = publisher.publish(FakeMessage(P, FakeId(1, 2), b"b"))
    with pytest.raises(DeadLetterError, match="1:1:-1 not published") as failure:
        await first
    assert isinstance(failure.value.__cause__, pulsar.asyncio.PulsarException)
    await second  # the next one does not wait for a retry of the first
    broken, fresh = client.producers
    assert broken.closed and not fresh.closed and fresh.sent[0][0] == b"b"
    client.fail_sends = client.fail_creates = 1  # the producer breaks, then its replacement cannot be made
    for n in (3, 4):
        with pytest.raises(DeadLetterError):
            await publisher.publish(FakeMessage(P, FakeId(1, n)))
    assert publisher.stats() == {"published": 1, "failed": 3, "producers_created": 2, "producers_open": 0,
                                 "pending": 0}
    await publisher.publish(FakeMessage(P, FakeId(1, 5), b"e"))  # and the next dead letter makes a fresh one
    assert [len(p.sent) for p in client.producers] == [0, 1, 1] and publisher.stats()["producers_open"] == 1
    await publisher.close()


async def test_close_publishes_what_is_queued_and_reports_each_outcome():
    """A dead letter that fails during close is reported to its caller (which
    keeps the message pending); one queued after it is still published."""
    client = FakeClient()
    publisher = DeadLetterPublisher(client, subscription="sub", consumer_name="c")
    client.fail_sends = 1
    failing = publisher.publish(FakeMessage(P, FakeId(1, 1), b"a"))
    passing = publisher.publish(FakeMessage(P, FakeId(1, 2), b"b"))
    await publisher.close()
    assert isinstance(failing.exception(), DeadLetterError) and passing.result() is not None
    assert publisher.closed and all(p.closed for p in client.producers)
    with pytest.raises(DeadLetterPublisherClosed) as closed:
        publisher.publish(FakeMessage(P, FakeId(1, 3)))
    assert isinstance(closed.value, pulsar.AlreadyClosed)
    await publisher.close()  # idempotent


async def test_a_cancelled_dead_letter_not_yet_handed_over_is_withdrawn():
    client = FakeClient()
    publisher = DeadLetterPublisher(client, subscription="sub", consumer_name="c")
    keep = publisher.publish(FakeMessage(P, FakeId(1, 1), b"keep"))
    withdrawn = publisher.publish(FakeMessage(P, FakeId(1, 2), b"withdrawn"))
    withdrawn.cancel()
    await keep
    await publisher.close()
    assert [payload for payload, _ in client.producers[0].sent] == [b"keep"]


async def test_boundary_errors():
    client = FakeClient()
    with pytest.raises(TypeError, match="pulsar.asyncio.Client"):
        DeadLetterPublisher(pulsar.Client.__new__(pulsar.Client), subscription="s", consumer_name="c")
    with pytest.raises(TypeError, match="subscription"):
        DeadLetterPublisher(client, subscription=None, consumer_name="c")
    with pytest.raises(ValueError, match="initial_subscription"):
        DeadLetterPublisher(client, subscription="s", consumer_name="c", initial_subscription="")
    with pytest.raises(TypeError, match="schema"):
        DeadLetterPublisher(client, subscription="s", consumer_name="c", schema="string")
    with pytest.raises(ValueError, match="send_timeout_ms"):
        DeadLetterPublisher(client, subscription="s", consumer_name="c", send_timeout_ms=0)
    publisher = DeadLetterPublisher(client, subscription="s", consumer_name="c")
    with pytest.raises(TypeError, match="received pulsar Message"):
        publisher.publish(FakeId(1, 1))
    loop = asyncio.get_running_loop()
    with pytest.raises(RuntimeError, match="event loop"):  # from a thread without the loop
        await loop.run_in_executor(None, publisher.publish, FakeMessage(P, FakeId(1, 1)))
    assert publisher.stats()["pending"] == 0 and client.producers == []
    await publisher.close()
