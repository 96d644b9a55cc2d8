"""Message identity as the tracker sees it, duck-typed from Pulsar objects.

No ``pulsar`` import here: a ``pulsar.Message`` is anything with
``message_id()``; a message id (``pulsar.MessageId`` or ``_pulsar.MessageId``)
is anything with ``ledger_id()`` and ``entry_id()``.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from ._checks import check_int

__all__ = ["MessageKey", "key_of"]

_new_tuple = tuple.__new__
_MAX = (1 << 63) - 1  # as check_int's


class MessageKey(NamedTuple):
    """A message's position: ``(ledger_id, entry_id)`` names the entry,
    ``batch_index`` the message inside a batch entry (-1: not batched),
    ``partition`` and ``topic`` where it lives (needed by multi-topic and
    partitioned consumers to route the redelivery)."""

    ledger_id: int
    entry_id: int
    partition: int = -1
    batch_index: int = -1
    topic: Optional[str] = None

    @property
    def entry(self) -> "MessageKey":
        """The whole entry this message belongs to (``batch_index=-1``). O(1)
        (one tuple: ``_replace`` costs a Python-level ``_make`` per call)."""
        return self if self[3] == -1 else _new_tuple(MessageKey, (self[0], self[1], self[2], -1, self[4]))

    def with_batch_index(self, batch_index: int) -> "MessageKey":
        """This key with ``batch_index`` (a message of this key's entry: ``-1``, the entry). O(1),
        one tuple (as :attr:`entry`)."""
        return _new_tuple(MessageKey, (self[0], self[1], self[2], batch_index, self[4]))

    def with_topic(self, topic: Optional[str]) -> "MessageKey":
        """This key with ``topic``. O(1), one tuple (as :attr:`entry`)."""
        return _new_tuple(MessageKey, (self[0], self[1], self[2], self[3], topic))


def _signed(name: str, value: object) -> int:
    """Partition and batch index: -1 means "none"."""
    if type(value) is int and value == -1:
        return -1
    return check_int(name, value)


def key_of(obj: object) -> tuple[MessageKey, Optional[int]]:
    """``(MessageKey, redelivery_count or None)`` for a message, a message id
    or a :class:`MessageKey`. Raises ``TypeError`` for anything else and
    ``ValueError`` for out-of-range ids."""
    if type(obj) is MessageKey:
        led, ent, part, bat, topic = obj  # a valid key as it is: no copy, no attribute reads
        if (type(led) is int and type(ent) is int and not (led | ent) >> 63 and type(part) is int
                and type(bat) is int and -1 <= part <= _MAX and -1 <= bat <= _MAX
                and (topic is None or type(topic) is str)):
            return obj, None
        key, count = obj, None
    else:
        count = None
        topic = None
        message_id = getattr(obj, "message_id", None)
        if callable(message_id):  # a Message
            count_of = getattr(obj, "redelivery_count", None)
            count = count_of() if callable(count_of) else None
            topic_of = getattr(obj, "topic_name", None)
            topic = topic_of() if callable(topic_of) else None
            obj = message_id()
        if type(obj) is MessageKey:
            return key_of(obj.with_topic(topic or obj.topic))[0], count
        ledger = getattr(obj, "ledger_id", None)
        entry = getattr(obj, "entry_id", None)
        if not (callable(ledger) and callable(entry)):
            raise TypeError(
                f"expected a pulsar Message, MessageId or nacktracker.MessageKey, not {type(obj).__name__}")
        partition = getattr(obj, "partition", None)
        batch = getattr(obj, "batch_index", None)
        key = MessageKey(ledger(), entry(), partition() if callable(partition) else -1,
                         batch() if callable(batch) else -1, topic or None)
    if not (topic is None or isinstance(topic, str)):
        raise TypeError(f"topic must be a str or None, not {type(topic).__name__}")
    if type(key.ledger_id) is not int or type(key.entry_id) is not int or (key.ledger_id | key.entry_id) >> 63:
        key = MessageKey(check_int("ledger_id", key.ledger_id), check_int("entry_id", key.entry_id), key.partition,
                         key.batch_index, key.topic)
    partition, batch = key[2], key[3]
    if not (type(partition) is int and type(batch) is int and -1 <= partition <= _MAX and -1 <= batch <= _MAX):
        key = MessageKey(key.ledger_id, key.entry_id, _signed("partition", key.partition),
                         _signed("batch_index", key.batch_index), key.topic)
    return key, count
