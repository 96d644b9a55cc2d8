"""Message ids as the consumer meets them: the :class:`~nacktracker.keys.MessageKey`
of a Message or id the application passes, a ``seek`` target, and the batch size
of a received batch message id (a protobuf field the Python client has no getter for)."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import _pulsar
import pulsar

from ..keys import MessageKey, key_of
from .direct import ReceivedMessage, message_key_of

__all__ = ["key_and_count", "message_key", "seek_target", "batch_size"]


def key_and_count(message: Any, own_topic: Optional[str],
                  held: Iterable[MessageKey]) -> tuple[MessageKey, Optional[int]]:
    """The key and redelivery count of a Message or id the application passed;
    a bare id gets ``own_topic``, or on a multi-topic consumer (``None``) the
    topic of the ``held`` message it names (O(held)). A MessageKey: TypeError."""
    if type(message) is ReceivedMessage:  # its key was built on arrival
        return message_key_of(message), message.redelivery_count()
    if isinstance(message, MessageKey):
        raise TypeError("pass a pulsar Message or MessageId, not a MessageKey")
    if isinstance(message, pulsar.MessageId):
        message = message._msg_id
    key, count = key_of(message)
    if key.topic is None:
        if own_topic is not None:
            key = key._replace(topic=own_topic)
        else:
            key = next((k for k in held if k._replace(topic=None) == key), key)
    return key, count


def message_key(message: Any, own_topic: Optional[str], held: Iterable[MessageKey]) -> MessageKey:
    """:func:`key_and_count` without the count; a received ``pulsar.Message``
    (the hot path: every receive and ack) skips the generic checks. O(1)."""
    if type(message) is ReceivedMessage:
        return message_key_of(message)  # built once, on arrival
    if type(message) is pulsar.Message:
        mid = message.message_id()
        return MessageKey(mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index(), message.topic_name())
    return key_and_count(message, own_topic, held)[0]


def seek_target(target: object) -> Union[pulsar.MessageId, int]:
    """What ``pulsar.asyncio.Consumer.seek`` takes, from what users pass: a
    received Message (its id), a ``pulsar.MessageId``, a ``_pulsar.MessageId``
    (what ``Message.message_id()`` and ``MessageId.earliest/latest`` are, which
    ``pulsar.asyncio`` refuses), or a publish timestamp in ms (an int >= 0).
    Anything else: ``TypeError``. O(1)."""
    if isinstance(target, pulsar.Message):
        target = target.message_id()
    if isinstance(target, pulsar.MessageId):
        return target
    if isinstance(target, _pulsar.MessageId):
        wrapped = pulsar.MessageId.__new__(pulsar.MessageId)  # the wrapper asyncio's seek unwraps again
        wrapped._msg_id = target
        return wrapped
    if isinstance(target, int) and not isinstance(target, bool):
        if not 0 <= target < 2**63:
            raise ValueError(f"a seek timestamp must be ms since the epoch (0 <= t < 2**63), got {target}")
        return target
    raise TypeError("seek takes a pulsar Message, a MessageId (pulsar.MessageId.earliest/latest too) or a "
                    f"publish timestamp in ms (int), not {type(target).__name__}")


def batch_size(mid: Any) -> int:
    """Messages in the entry of a received batch message id: ``mid.batch_size()``
    where it exists, else protobuf field 6 of its serialized form (the Python
    client has no getter). 0 if absent. Runtime: ~2 us."""
    getter = getattr(mid, "batch_size", None)
    if callable(getter):
        return int(getter())
    data = mid.serialize()
    i, n = 0, len(data)
    while i < n:
        tag = data[i]
        if tag & 7 == 0:  # varint
            value, i = _varint(data, i + 1)
            if tag >> 3 == 6:
                return value
        elif tag & 7 == 2:  # length-delimited: skip
            length, i = _varint(data, i + 1)
            i += length
        else:
            return 0
    return 0


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """A protobuf varint at ``data[i:]``: ``(value, index after it)``."""
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i
