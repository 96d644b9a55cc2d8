"""nacktracker.adapters.pulsar_layout against the installed pulsar-client: the private layout it knows is the
one the client's own classes make and read (no broker: the client's wrappers around stand-in C++ objects)."""

from __future__ import annotations

import pytest

pulsar = pytest.importorskip("pulsar")
import _pulsar  # noqa: E402
import pulsar.asyncio  # noqa: E402
from pulsar.schema import BytesSchema, StringSchema  # noqa: E402

from nacktracker.adapters.pulsar_layout import (  # noqa: E402
    asyncio_client,
    consumer_schema,
    fill_message,
    raw_client,
    raw_consumer,
    raw_message,
)
from nacktracker.consumer.direct import DirectConsumer, ReceivedMessage, message_length  # noqa: E402
from nacktracker.consumer.ids import BareIds, key_and_count, seek_target  # noqa: E402
from nacktracker.keys import MessageKey  # noqa: E402

UNUSED_URL = "pulsar://127.0.0.1:1"  # a client connects on first use only: none here


class RawMessage:
    """Stands in for a ``_pulsar.Message``: what the client's ``pulsar.Message`` methods call."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def data(self) -> bytes:
        return self.payload

    def length(self) -> int:
        return len(self.payload)

    def message_id(self) -> _pulsar.MessageId:
        return _pulsar.MessageId(2, 7, 9, -1)

    def topic_name(self) -> str:
        return "persistent://public/default/t-partition-2"


class RawConsumer:
    """Stands in for a ``_pulsar.Consumer``: answers each call at once, as the client does from its queue."""

    def __init__(self, message: RawMessage) -> None:
        self.message = message
        self.acked: list[object] = []

    def receive_async(self, callback) -> None:
        callback(_pulsar.Result.Ok, self.message)

    def acknowledge_async(self, msg, callback) -> None:
        self.acked.append(msg)
        callback(_pulsar.Result.Ok)


def test_clients_keep_their_cpp_client_where_the_layout_says():
    client = pulsar.Client(UNUSED_URL)
    try:
        raw = raw_client(client)
        assert isinstance(raw, _pulsar.Client)
        wrapper = asyncio_client(raw)
        assert type(wrapper) is pulsar.asyncio.Client and raw_client(wrapper) is raw
        own = pulsar.asyncio.Client(UNUSED_URL)  # the client's own asyncio client: laid out the same
        assert isinstance(raw_client(own), _pulsar.Client)
        raw_client(own).close()  # its blocking close: nothing was opened
    finally:
        client.close()
    assert raw_client(object()) is None


async def test_an_asyncio_consumer_keeps_its_cpp_consumer_and_schema_where_the_layout_says():
    raw = RawConsumer(RawMessage(b"payload"))
    schema = StringSchema()
    consumer = pulsar.asyncio.Consumer(raw, schema)  # as pulsar.asyncio.Client.subscribe makes it
    assert raw_consumer(consumer) is raw and consumer_schema(consumer) is schema
    assert raw_consumer(object()) is None and consumer_schema(object()) is None

    received = await consumer.receive()  # the client's own wrapper: the layout reads what it wrote
    assert raw_message(received) is raw.message and received.value() == "payload"


async def test_a_filled_message_is_what_the_clients_own_methods_read():
    raw = RawConsumer(RawMessage(b"payload"))
    consumer = pulsar.asyncio.Consumer(raw, BytesSchema())
    msg = pulsar.Message()
    fill_message(msg, raw.message, BytesSchema())
    assert msg.data() == b"payload" and msg.value() == b"payload" and raw_message(msg) is raw.message
    await consumer.acknowledge(msg)  # the client unwraps the message it was given
    assert raw.acked == [raw.message]
    with pytest.raises(AttributeError):
        raw_message(object())


async def test_direct_receives_and_acks_use_the_layout():
    raw = RawConsumer(RawMessage(b"abc"))
    consumer = pulsar.asyncio.Consumer(raw, BytesSchema())
    direct = DirectConsumer.of(consumer)
    assert direct is not None
    got = direct.receive()
    assert type(got) is ReceivedMessage and got.value() == b"abc" and message_length(got) == 3
    assert direct.acknowledge(got) is None and raw.acked == [raw.message]


def test_message_ids_need_no_private_name():
    wrapped = seek_target(_pulsar.MessageId.earliest)
    assert type(wrapped) is pulsar.MessageId and str(wrapped) == str(_pulsar.MessageId.earliest)
    key, count = key_and_count(pulsar.MessageId(3, 11, 12, 4), BareIds("persistent://public/default/t"))
    assert key == MessageKey(11, 12, 3, 4, "persistent://public/default/t-partition-3") and count is None
