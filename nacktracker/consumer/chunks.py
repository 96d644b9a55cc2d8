"""Chunked messages: a request for one names the entry of every chunk.

A message larger than the broker's ``maxMessageSize``, sent by a producer with
``chunking_enabled=True`` (batching off), is stored as several entries, its
*chunks*, written in order on the topic's ledger (another producer's entries
may lie between them). The client joins them and hands over one message,
whose id names the last chunk's entry (its ``ledger_id()`` and ``entry_id()``)
and, in its serialized form, the first chunk's (``first_chunk_message_id``).

The broker redelivers entries, and the client can join a chunked message only
from all of its chunks, the first one first. Pulsar's Java client remembers the
id of every chunk of each message it received and asks for all of them when it
redelivers one (nack or ack timeout). The C++ client under pulsar-client 3.x
asks only for the last chunk's entry: the broker resends that one chunk, the
client cannot join it (it has no first chunk) and drops it, and the message
never comes back (measured on Apache Pulsar 4.0.7, for the plain client too).

The Python client shows only the first and the last chunk of a message. So a
request for a chunked message here names every entry of its ledger from the
first chunk to the last, leaving out the entries of messages this consumer
knows as other messages (held by the application, acknowledged, nacked and
pending, or waiting for their time here): asking for those would send them
again, to another consumer of a Shared subscription. The broker redelivers
only entries that are unacknowledged and dispatched to this consumer, and
ignores the rest. The chunks come back in order, the client joins them again,
and the message reaches the application whole at its time, with the id it had
(measured on Apache Pulsar 4.0.7 and pulsar-lite).

Costs: one small record per nacked chunked message whose redelivery has not
been requested yet (a dict entry: its key and first chunk's position; the
payload is never kept), counted in the consumer's ``stats()["chunked_nacks"]``;
serializing the id of each nacked message that is not in a batch, and one byte
search in it, to tell whether it is chunked.

Limits, where the client hides what the broker would need:

* chunks on two ledgers (the topic's ledger rolled over while the message was
  written): the first ledger's entries from the first chunk on, up to
  :data:`CROSS_LEDGER_SPAN` of them, and the last ledger's up to the last
  chunk are named;
* entries between the chunks that hold middle chunks of another chunked
  message, or a batch whose messages this consumer does not hold, are named
  too: the broker resends them if they are still this consumer's (a chunk the
  client cannot join is dropped by the client, as it drops any).

Pure: no pulsar import, no clock, no I/O; the shell passes serialized ids.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from ..keys import MessageKey

__all__ = ["ChunkedNacks", "first_chunk_position", "chunk_entries", "serialized_id", "known_entries", "CROSS_LEDGER_SPAN"]

#: Entries named on the first ledger of a message whose chunks span two ledgers (its
#: last entry there is not known to the client): entries that do not exist, or are not
#: this consumer's, are ignored by the broker.
CROSS_LEDGER_SPAN = 1024
#: The field of ``MessageIdData`` holding the first chunk's id (Pulsar's PulsarApi.proto), and its tag
#: byte (length-delimited): an id without that byte anywhere is not a chunked message's (the common case,
#: told by one C-level byte search instead of a parse).
_FIRST_CHUNK_FIELD = 7
_FIRST_CHUNK_TAG = bytes([_FIRST_CHUNK_FIELD << 3 | 2])


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """A protobuf varint at ``data[i:]``: ``(value, index after it)``; ``IndexError`` when cut short."""
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _fields(data: bytes) -> Iterable[tuple[int, int, object]]:
    """``(field number, wire type, value)`` of a protobuf message: ints for varints, bytes for
    length-delimited fields; stops at any other wire type (an id has none)."""
    i, n = 0, len(data)
    while i < n:
        tag, i = _varint(data, i)
        if tag & 7 == 0:
            value, i = _varint(data, i)
            yield tag >> 3, 0, value
        elif tag & 7 == 2:
            length, i = _varint(data, i)
            yield tag >> 3, 2, data[i:i + length]
            i += length
        else:
            return


def first_chunk_position(serialized: bytes) -> Optional[tuple[int, int]]:
    """``(ledger_id, entry_id)`` of the first chunk named in a serialized message id
    (``MessageId.serialize()``), or ``None`` for an id of a message that is not chunked.
    Malformed bytes: ``ValueError``. O(len(serialized)).

    >>> first_chunk_position(bytes([8, 4, 16, 3, 58, 4, 8, 4, 16, 1]))  # chunks at (4, 1) .. (4, 3)
    (4, 1)
    >>> first_chunk_position(bytes([8, 4, 16, 3])) is None
    True
    """
    if type(serialized) is not bytes:
        if not isinstance(serialized, (bytes, bytearray)):
            raise TypeError(f"serialized must be bytes, not {type(serialized).__name__}")
        serialized = bytes(serialized)
    if _FIRST_CHUNK_TAG not in serialized:
        return None
    try:
        for number, wire, value in _fields(serialized):
            if number == _FIRST_CHUNK_FIELD and wire == 2:
                assert isinstance(value, bytes)
                found = {n: v for n, w, v in _fields(value) if w == 0}
                return int(found.get(1, 0)), int(found.get(2, 0))  # type: ignore[call-overload]
    except IndexError:
        raise ValueError(f"not a serialized message id: {serialized!r}") from None
    return None


def chunk_entries(key: MessageKey, first: tuple[int, int], known: Callable[[MessageKey], bool]) -> list[MessageKey]:
    """The entries a request for the chunked message ``key`` (its last chunk's entry) names: its
    ledger's entries from the ``first`` chunk's ``(ledger_id, entry_id)`` on, up to ``key``'s, each
    as an entry key of ``key``'s topic and partition, in order; ``key`` itself always, the others
    unless ``known(entry)`` (a message this consumer knows, not a chunk of this one). Chunks on two
    ledgers: see the module doc. O(entries named).

    >>> last = MessageKey(4, 5, topic="t")
    >>> [k.entry_id for k in chunk_entries(last, (4, 1), lambda k: k.entry_id == 3)]
    [1, 2, 4, 5]
    """
    ledger, entry = first
    if ledger == key.ledger_id:
        spans = [(ledger, range(entry, key.entry_id))]
    else:  # the ledger rolled over between the chunks
        spans = [(ledger, range(entry, entry + CROSS_LEDGER_SPAN)), (key.ledger_id, range(0, key.entry_id))]
    named = []
    for at, entries in spans:
        for e in entries:
            other = MessageKey(at, e, key.partition, -1, key.topic)
            if e == entry and at == ledger or not known(other):  # the first chunk is never another message
                named.append(other)
    named.append(key.entry)
    return named


class ChunkedNacks:
    """The first chunk of each nacked chunked message, from its nack until its redelivery is
    requested (:meth:`entries`), acknowledged (:meth:`forget`) or forgotten otherwise.

    ``known() -> f(entry) -> bool``: for one request, whether an entry holds a message this consumer
    knows as a message of its own (:func:`known_entries`: the consumer's delivery core and tracker).
    Every method is O(1) unless its docstring says otherwise.

    >>> class Id:  # a chunked message's id, as the client serializes it: chunks at (4, 1) .. (4, 3)
    ...     def serialize(self): return bytes([8, 4, 16, 3, 58, 4, 8, 4, 16, 1])
    >>> nacks = ChunkedNacks(lambda: lambda entry: False)
    >>> nacks.note(MessageKey(4, 3, topic="t"), Id())
    True
    >>> len(nacks), [k.entry_id for k in nacks.entries(MessageKey(4, 3, topic="t"))], len(nacks)
    (1, [1, 2, 3], 0)
    """

    __slots__ = ("_first", "_known", "requested")

    def __init__(self, known: Callable[[], Callable[[MessageKey], bool]]) -> None:
        self._first: dict[MessageKey, tuple[int, int]] = {}  # last chunk's entry -> first chunk's position
        self._known = known
        #: requests for chunked messages that named every chunk (one per message)
        self.requested = 0

    def __len__(self) -> int:
        return len(self._first)

    def note(self, key: MessageKey, message: object) -> bool:
        """``message`` (a received Message or its id) of ``key`` is pending a redelivery (nacked, its ack
        timed out, or a copy of it dropped until its nack is due): remember its first chunk if it is a
        chunked message (never one in a batch). Returns whether it is. O(1): its id serialized and
        searched for one byte, parsed only where found."""
        if key.batch_index >= 0:
            return False
        first = first_chunk_position(serialized_id(message))
        if first is None:
            return False
        self._first[key.entry] = first
        return True

    def forget(self, key: MessageKey) -> None:
        """``key`` was acknowledged (or dead-lettered): nothing to ask for."""
        if self._first:
            self._first.pop(key.entry, None)

    def entries(self, key: MessageKey) -> list[MessageKey]:
        """The entries to ask the broker for, for due ``key``: every chunk's entry for a chunked
        message (:func:`chunk_entries`; then forgotten: a later nack notes it again), else ``[key]``.
        O(1) for a message that is not chunked, O(entries named + held) for one that is."""
        first = self._first.pop(key.entry, None) if self._first else None
        if first is None:
            return [key]
        self.requested += 1
        return chunk_entries(key, first, self._known())

    def clear(self) -> None:
        self._first.clear()


def serialized_id(message: object) -> bytes:
    """The serialized id of a received message or of a message id (anything with ``message_id()``,
    else with ``serialize()``), as :func:`first_chunk_position` reads it. O(1)."""
    message_id = getattr(message, "message_id", None)
    mid = message_id() if callable(message_id) else message
    serialize = getattr(mid, "serialize", None)
    if not callable(serialize):
        raise TypeError(f"expected a pulsar Message or MessageId, not {type(message).__name__}")
    data = serialize()
    if type(data) is bytes:
        return data
    if not isinstance(data, bytearray):
        raise TypeError(f"serialize() returned {type(data).__name__}, not bytes")
    return bytes(data)


def known_entries(core: object,
                  pending: Callable[[MessageKey], bool]) -> Callable[[], Callable[[MessageKey], bool]]:
    """What :class:`ChunkedNacks` asks, for one request: whether ``entry`` holds a message this consumer
    knows as one of its own, from a :class:`~.core.DeliveryCore` (seen: held, parked, requested,
    acknowledged; a batch entry with a record, or with a message the application holds) and
    ``pending(entry)``, the tracker's. Each request costs O(held) once (the batch entries held), then
    O(1) per entry."""
    from .core import DeliveryCore

    if not isinstance(core, DeliveryCore):
        raise TypeError(f"core must be a DeliveryCore, not {type(core).__name__}")

    def for_request() -> Callable[[MessageKey], bool]:
        held_batches = {k.entry for k in core.held if k[3] >= 0}

        def known(entry: MessageKey) -> bool:
            return core.seen(entry) or pending(entry) or core.awaits_copy(entry) or entry in held_batches

        return known

    return for_request
