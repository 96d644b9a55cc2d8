"""Message ids as the consumer meets them, and every key the consumer derives (one module):
the :class:`~nacktracker.keys.MessageKey` of a received message (built once, on arrival), of a
Message or id the application passes (:class:`MessageKeys`: one consumer's, bare ids given their
topic), a ``seek`` target, and the batch size of a received batch message id (a protobuf field the
Python client has no getter for)."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import _pulsar
import pulsar

from ..adapters.pulsar_layout import raw_message
from ..errors import ArgumentError
from ..keys import MessageKey, key_of
from .direct import ReceivedMessage

__all__ = ["BareIds", "MessageKeys", "names_several_topics", "key_and_count", "message_key", "message_key_of", "is_bare_id", "seek_target", "batch_size"]


#: Ledgers remembered per multi-topic consumer (oldest forgotten first): a ledger holds up to
#: 50 000 entries by default (``managedLedgerMaxEntriesPerLedger``), so this covers far more
#: messages than a consumer holds unacknowledged; a few dozen bytes each.
MAX_LEDGERS = 65_536

_new_key = tuple.__new__  # a MessageKey of five fields without the namedtuple's Python-level __new__


class BareIds:
    """The topic of a bare message id (``msg.message_id()``, which names no topic in
    Python) as this consumer received it, from the id's own fields and what the
    consumer knows: a single-topic consumer's topic (``own_topic``), or its partition's
    (``<topic>-partition-<n>``, from the id's partition index, as the client names them);
    on a multi-topic consumer (``own_topic`` ``None``: a list or a pattern), the topic
    whose messages of the id's ledger it received (ledger ids are unique in a cluster;
    :meth:`saw` records each ledger's topic on arrival, a dict entry per ledger, not per
    message). Pure: no pulsar-client. Every method is O(1)."""

    __slots__ = ("own_topic", "_ledgers")

    def __init__(self, own_topic: Optional[str]) -> None:
        self.own_topic = own_topic
        self._ledgers: Optional[dict[int, object]] = None if own_topic is not None else {}

    @property
    def learns(self) -> bool:
        """Whether :meth:`saw` must see every arrival (a multi-topic consumer)."""
        return self._ledgers is not None

    def saw(self, key: MessageKey) -> None:
        """A copy of ``key`` arrived (multi-topic consumers: remember its ledger's topic)."""
        ledgers = self._ledgers
        if ledgers is None or key.topic is None:
            return
        known = ledgers.get(key.ledger_id)
        if known is None:
            if len(ledgers) >= MAX_LEDGERS:
                del ledgers[next(iter(ledgers))]
            ledgers[key.ledger_id] = key.topic
        elif known != key.topic and not (isinstance(known, frozenset) and key.topic in known):
            # two topics with one ledger id (a broker whose ledger ids are not unique): ask the consumer
            ledgers[key.ledger_id] = (known if isinstance(known, frozenset) else frozenset([known])) | {key.topic}

    def topics(self, key: MessageKey) -> tuple[str, ...]:
        """The topics a bare id's ``key`` (topic ``None``) may have been received from: one,
        or on a broker that reuses ledger ids across topics each candidate; none when this
        consumer received nothing of its ledger (it never handed this id out)."""
        own = self.own_topic
        if own is not None:
            partition = key.partition
            if partition < 0 or own.endswith(f"-partition-{partition}"):
                return (own,)
            return (f"{own}-partition-{partition}",)
        assert self._ledgers is not None
        known = self._ledgers.get(key.ledger_id)
        if known is None:
            return ()
        return tuple(sorted(known)) if isinstance(known, frozenset) else (str(known),)


#: Characters no topic name has (Pulsar's names take letters, digits and ``_-=:.%``) and regular
#: expressions use: a pattern consumer's ``topic()`` is its pattern.
_PATTERN_CHARS = frozenset("*+?[](){}|\\^$")


def names_several_topics(topic: str) -> bool:
    """Whether a consumer's ``topic()`` names no single topic: a regex pattern (a multi-topic
    consumer of a list has the client's made-up name instead, see ``adapters.pulsar.is_multi_topic``).
    O(len(topic))."""
    return not _PATTERN_CHARS.isdisjoint(topic.rsplit("/", 1)[-1])


def message_key_of(msg: ReceivedMessage) -> MessageKey:
    """The key of a received message, built once (from the C++ message: two
    Python frames fewer than through the wrapper). O(1)."""
    key: Optional[MessageKey] = msg.nacktracker_key
    if key is None:
        raw = raw_message(msg)
        mid = raw.message_id()
        key = msg.nacktracker_key = _new_key(MessageKey, (mid.ledger_id(), mid.entry_id(), mid.partition(),
                                                          mid.batch_index(), raw.topic_name()))
    return key


class MessageKeys:
    """One consumer's keys of what its application passes: ``ids``, the topics of its bare ids;
    ``knows(key)``, whether it received ``key`` (picks the topic of a bare id several topics may hold).
    O(1) each."""

    __slots__ = ("ids", "knows")

    def __init__(self, ids: BareIds, knows: Callable[[MessageKey], bool]) -> None:
        self.ids = ids
        self.knows = knows

    def key(self, message: Any) -> MessageKey:
        """:func:`message_key` for this consumer."""
        return message_key(message, self.ids, self.knows)

    def key_and_count(self, message: Any) -> tuple[MessageKey, Optional[int]]:
        """:func:`key_and_count` for this consumer."""
        return key_and_count(message, self.ids, self.knows)


def key_and_count(message: Any, ids: BareIds,
                  knows: Callable[[MessageKey], bool] = lambda key: True) -> tuple[MessageKey, Optional[int]]:
    """The key and redelivery count of a Message or id the application passed;
    a bare id gets the topic it was received from (:class:`BareIds`; where several
    topics may hold it, the one ``knows(key)`` says this consumer received; none:
    the key keeps topic ``None``, which the consumer takes as never received).
    A MessageKey: TypeError. O(1)."""
    if type(message) is ReceivedMessage:  # its key was built on arrival; the broker's count (local hand-backs
        return message_key_of(message), message.broker_redelivery_count()  # are added by consumer/local.py)
    if isinstance(message, MessageKey):
        raise TypeError("pass a pulsar Message or MessageId, not a MessageKey")
    key, count = key_of(message)  # a pulsar.MessageId too: its getters give the C++ id's fields
    if key.topic is None:
        topics = ids.topics(key)
        if len(topics) == 1:
            key = key.with_topic(topics[0])
        else:
            key = next((k for k in (key.with_topic(t) for t in topics) if knows(k)), key)
    return key, count


def message_key(message: Any, ids: BareIds, knows: Callable[[MessageKey], bool] = lambda key: True) -> MessageKey:
    """:func:`key_and_count` without the count; a received ``pulsar.Message``
    (the hot path: every receive and ack) skips the generic checks. O(1)."""
    if type(message) is ReceivedMessage:
        return message_key_of(message)  # built once, on arrival
    if type(message) is pulsar.Message:
        mid = message.message_id()
        return MessageKey(mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index(), message.topic_name())
    return key_and_count(message, ids, knows)[0]


def is_bare_id(message: Any) -> bool:
    """Whether the application passed a message id rather than a Message (no payload, no
    redelivery count). O(1)."""
    return not callable(getattr(message, "message_id", None))  # as keys.key_of tells a message from an id


def names_no_message(message: Any) -> bool:
    """Whether the application passed an id that names a position rather than a message:
    ``pulsar.MessageId.earliest`` (ledger and entry -1), or any id with a negative ledger or entry.
    The client takes such an id in an ack and the broker acknowledges nothing with it. O(1)."""
    if type(message) is ReceivedMessage or isinstance(message, MessageKey):
        return False
    ledger, entry = getattr(message, "ledger_id", None), getattr(message, "entry_id", None)
    if not (callable(ledger) and callable(entry)):  # a Message (or not an id at all: the key says what is wrong)
        return False
    led, ent = ledger(), entry()
    return type(led) is int and type(ent) is int and (led < 0 or ent < 0)


def seek_target(target: object) -> Union[pulsar.MessageId, int]:
    """What ``pulsar.asyncio.Consumer.seek`` takes, from what users pass: a
    received Message (its id), a ``pulsar.MessageId``, a ``_pulsar.MessageId``
    (what ``Message.message_id()`` and ``MessageId.earliest/latest`` are, which
    ``pulsar.asyncio`` refuses), or a publish timestamp in ms (an int >= 0).
    Anything else: :class:`~nacktracker.errors.ArgumentError` (a ``TypeError``, and the ``ValueError``
    the client raises). O(1)."""
    if isinstance(target, pulsar.Message):
        target = target.message_id()
    if isinstance(target, pulsar.MessageId):
        return target
    if isinstance(target, _pulsar.MessageId):
        return pulsar.MessageId.wrap(target)  # the wrapper asyncio's seek unwraps again
    if isinstance(target, int) and not isinstance(target, bool):
        if not 0 <= target < 2**63:
            raise ValueError(f"a seek timestamp must be ms since the epoch (0 <= t < 2**63), got {target}")
        return target
    raise ArgumentError("seek takes a pulsar Message, a MessageId (pulsar.MessageId.earliest/latest too) or a "
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
