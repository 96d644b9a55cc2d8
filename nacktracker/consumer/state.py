"""The delivery core's state, in named types (see :mod:`.core`)."""

from __future__ import annotations

import enum
import sys
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple, Optional

from ..keys import MessageKey

__all__ = ["Verdict", "Held", "HELD", "FRESH", "ACKED", "ACKED_FRESH", "Nacked", "Parked", "NackedIndices", "EntryRecord", "AckResult", "Positions", "ALL_INDICES",
           "Token", "core_stats"]

Token = Any  # a received copy, opaque to the core


class Verdict(enum.Enum):
    """What to do with a copy that arrived."""

    SURFACE = "surface"      # hand it to the application now
    PARK = "park"            # keep it: :meth:`DeliveryCore.release` hands it over at its time
    DROP_ACKED = "acked"     # the application acknowledged it: ack this copy too
    DROP_HELD = "held"       # the application still holds an earlier copy
    DROP_EARLY = "early"     # nacked, its bucket has not fired: that bucket asks for it again
    DROP_TWIN = "twin"       # a copy of it is already parked

    #: The verdict's value, as a plain attribute: the key it is counted under (``.value`` is a property
    #: that costs ~70 ns more on the hot path).
    label: str

    def __init__(self, value: str) -> None:
        self.label = value


@dataclass(slots=True)
class Held:
    """A message in the application's hands (surfaced, not acked or nacked)."""

    tokens: list[Token] = field(default_factory=list)  # dropped copies to ack with it


#: The state of a held message with no dropped copies to ack with it: one shared
#: object (a first delivery allocates nothing for it); its tokens are an empty tuple,
#: so the one place that appends makes the message its own :class:`Held` first.
HELD = Held(())  # type: ignore[arg-type]
#: The same for a message held since its first delivery and not nacked since:
#: nothing of it can be pending in the tracker (its ack need not ask).
FRESH = Held(())  # type: ignore[arg-type]


@dataclass(slots=True)
class Nacked:
    """A nacked message whose copy has not surfaced yet. Non-batched messages
    get one only once their bucket fired (until then the tracker's index alone
    knows them); batch messages get one per nack, in their entry's record."""

    release_ms: int            # the bucket's time: the earliest it may surface
    fired: bool                # the tracker handed the bucket to the adapter
    tokens: list[Token] = field(default_factory=list)


@dataclass(slots=True)
class Parked:
    """A copy that arrived before its release time."""

    release_ms: int
    token: Token
    tokens: list[Token] = field(default_factory=list)  # earlier dropped copies


class NackedIndices:
    """The pending nacks of one batch entry: batch index -> ``(release_ms, fired)``.

    Two flat arrays sorted by batch index (4 B for the index, 8 B for the
    release time with the ``fired`` flag in its lowest bit): 12 B per nacked
    message plus the arrays' over-allocation, where a dict of :class:`Nacked`
    objects took ~150 B (``python -m bench.consumer_memory`` measures the
    consumer end to end). Nacks come in batch-index order as a rule (the
    application works through an entry in order), so adding one appends;
    a lookup is a binary search. Costs: ``in``/:meth:`get` O(log n); :meth:`set`
    and :meth:`pop` O(log n) plus a move of the later items (O(1) at the end);
    :meth:`mark_fired`, :meth:`max_release` and iteration O(n); ``len`` and
    :attr:`unfired` O(1), for n nacked messages of the entry.

    >>> nacks = NackedIndices()
    >>> nacks.set(3, 1000, False); nacks.set(1, 900, True)
    >>> list(nacks.items()), nacks.unfired
    ([(1, 900, True), (3, 1000, False)], 1)
    >>> nacks.min_release(), nacks.max_release()
    (900, 1000)
    >>> nacks.pop(3), len(nacks), 3 in nacks
    ((1000, False), 1, False)
    """

    __slots__ = ("_index", "_packed", "unfired")

    def __init__(self) -> None:
        self._index = array("I")   # batch indices, ascending
        self._packed = array("q")  # release_ms << 1 | fired, per index
        #: nacks whose bucket has not fired yet (not fired: their own bucket will ask for the entry)
        self.unfired = 0

    def __len__(self) -> int:
        return len(self._index)

    def _find(self, batch_index: int) -> int:
        """Position of ``batch_index``, or -1."""
        index = self._index
        if index and index[-1] == batch_index:  # the latest nack: the usual question
            return len(index) - 1
        at = bisect_left(index, batch_index)
        return at if at < len(index) and index[at] == batch_index else -1

    def __contains__(self, batch_index: object) -> bool:
        return type(batch_index) is int and batch_index >= 0 and self._find(batch_index) >= 0

    def get(self, batch_index: int) -> Optional[tuple[int, bool]]:
        """``(release_ms, fired)`` of the message's nack, or ``None``."""
        at = self._find(batch_index)
        if at < 0:
            return None
        packed = self._packed[at]
        return packed >> 1, bool(packed & 1)

    def set(self, batch_index: int, release_ms: int, fired: bool) -> None:
        """Nack the message (replacing its earlier nack, if any)."""
        packed = release_ms << 1 | fired
        index = self._index
        if batch_index >> 32 and index.typecode == "I":  # not a Pulsar batch index (an int32), but no error here
            index = self._index = array("Q", index)
        if not index or batch_index > index[-1]:
            index.append(batch_index)
            self._packed.append(packed)
        else:
            at = bisect_left(index, batch_index)
            if at < len(index) and index[at] == batch_index:
                self.unfired -= not self._packed[at] & 1
                self._packed[at] = packed
            else:
                index.insert(at, batch_index)
                self._packed.insert(at, packed)
        self.unfired += not fired

    def pop(self, batch_index: int) -> Optional[tuple[int, bool]]:
        """Remove the message's nack: its ``(release_ms, fired)``, or ``None``."""
        at = self._find(batch_index)
        if at < 0:
            return None
        packed = self._packed.pop(at)
        del self._index[at]
        self.unfired -= not packed & 1
        return packed >> 1, bool(packed & 1)

    def mark_fired(self) -> None:
        """The entry's bucket fired: its copy answers every nack so far."""
        if self.unfired:
            self._packed = array("q", [p | 1 for p in self._packed])
            self.unfired = 0

    def max_release(self) -> Optional[int]:
        return max(self._packed) >> 1 if self._packed else None

    def min_release(self) -> Optional[int]:
        return min(self._packed) >> 1 if self._packed else None

    def indices(self) -> list[int]:
        return self._index.tolist()

    def items(self) -> Iterator[tuple[int, int, bool]]:
        """``(batch_index, release_ms, fired)``, by batch index."""
        for i, packed in zip(self._index.tolist(), self._packed.tolist()):
            yield i, packed >> 1, bool(packed & 1)

    def nbytes(self) -> int:
        """Bytes of this object and its arrays (allocated, not only used). O(1)."""
        return sys.getsizeof(self) + sys.getsizeof(self._index) + sys.getsizeof(self._packed)


@dataclass(slots=True)
class EntryRecord:
    """A batch entry with nacked messages (Pulsar redelivers whole entries)."""

    nacked: NackedIndices = field(default_factory=NackedIndices)  # batch index -> its pending nack
    acked: Optional[set[int]] = None   # dedup=False only: indices acknowledged while the record lives
    linger_until: float = -1.0         # dedup=False only: a requested copy may arrive until then
    size: int = 0                      # messages in the entry (0: not known)
    #: batch index -> copies of that nacked message dropped meanwhile (each delivery of a batch entry is
    #: acknowledged through its own batch acker: they are acked with the message); None while there are none
    copies: Optional[dict[int, list[Token]]] = None

    def keep(self, batch_index: int, tokens: list[Token]) -> None:
        """Keep dropped ``tokens`` of the nacked message ``batch_index`` for its ack."""
        if tokens:
            if self.copies is None:
                self.copies = {}
            self.copies.setdefault(batch_index, []).extend(tokens)

    def take(self, batch_index: int) -> list[Token]:
        """The copies kept for ``batch_index`` (now the caller's), possibly none."""
        if self.copies is None:
            return []
        tokens = self.copies.pop(batch_index, [])
        if not self.copies:
            self.copies = None
        return tokens

    def kept(self) -> int:
        """Copies kept. O(messages with copies)."""
        return sum(map(len, self.copies.values())) if self.copies else 0

    def nbytes(self) -> int:
        """Bytes of the record (not of the copies it keeps: :meth:`kept`). O(messages with copies)."""
        total = sys.getsizeof(self) + self.nacked.nbytes()
        if self.acked is not None:
            total += sys.getsizeof(self.acked)
        if self.copies is not None:
            total += sys.getsizeof(self.copies) + sum(map(sys.getsizeof, self.copies.values()))
        return total


#: A batch index above any real one: the position ``(ledger, entry, ALL_INDICES)``
#: covers every message of the entry.
ALL_INDICES = 1 << 31


class Positions:
    """Per topic partition, a position ``(ledger, entry, batch_index)`` at or
    beyond every copy the delivery core has state for there. First
    deliveries arrive in position order, so a copy beyond it is one:
    nothing of it is known (:meth:`~.core.DeliveryCore.first_delivery`).
    Arrivals move it (:meth:`advance`), and so does everything else that
    creates state for a copy that may not have arrived yet (:meth:`cover`).
    The last partition's position is kept at hand: a consumer of one
    partition checks a copy with a few compares, no lookup."""

    __slots__ = ("_by_partition", "_topic", "_partition", "_at")

    def __init__(self) -> None:
        self._by_partition: dict[tuple[Optional[str], int], list[int]] = {}
        self._topic: Optional[str] = None
        self._partition: Optional[int] = None  # None: nothing at hand yet
        self._at: list[int] = [-1, -1, -1]

    def advance(self, key: MessageKey) -> bool:
        """Whether ``key`` lies beyond its partition's position; if so the
        position moves to it. O(1), no allocation."""
        ledger, entry, partition, index, topic = key
        high = self._at
        if partition != self._partition or topic != self._topic:
            high = self._at_hand(topic, partition)
        if ledger <= high[0]:
            if ledger < high[0]:
                return False
            if entry <= high[1] and (entry < high[1] or index <= high[2]):
                return False
        high[0], high[1], high[2] = ledger, entry, index
        return True

    def cover(self, topic: Optional[str], partition: int, ledger: int, entry: int, index: int) -> None:
        """Move the partition's position at or beyond ``(ledger, entry, index)``. O(1)."""
        high = self._at if partition == self._partition and topic == self._topic else self._at_hand(topic, partition)
        if (ledger, entry, index) > (high[0], high[1], high[2]):
            high[0], high[1], high[2] = ledger, entry, index

    def nbytes(self) -> int:
        """Bytes of the positions kept (one list per partition seen). O(partitions)."""
        return sys.getsizeof(self._by_partition) + sum(
            sys.getsizeof(where) + sys.getsizeof(high) for where, high in self._by_partition.items())

    def _at_hand(self, topic: Optional[str], partition: int) -> list[int]:
        high = self._by_partition.get((topic, partition))
        if high is None:
            high = self._by_partition[(topic, partition)] = [-1, -1, -1]
        self._topic, self._partition, self._at = topic, partition, high
        return high


class AckResult(NamedTuple):
    tokens: list[Token]   # dropped copies to acknowledge as well
    discard: bool         # cancel the entry's pending nack in the tracker


#: What :meth:`~.core.DeliveryCore.acked` answers when no copy waits and the
#: tracker's entry may be discarded (the common ack): one shared object.
ACKED = AckResult((), True)  # type: ignore[arg-type]
#: ... and when nothing of the message can be pending in the tracker.
ACKED_FRESH = AckResult((), False)  # type: ignore[arg-type]


class _Deadline(NamedTuple):
    at_ms: float
    seq: int
    key: MessageKey       # a message key (park, request) or an entry key (record)
    state: object         # the object that must still be current for this deadline to act


def core_stats(core: Any) -> dict[str, int]:
    """The consumer's stats that come from its :class:`~.core.DeliveryCore`
    (each key: the docs' "Stats and metrics" page). O(1)."""
    c = core.counts
    return {"surfaced": c["surface"] + c["released"], "early_copies_dropped": c["early"] + c["twin"],
            "held_copies_dropped": c["held"], "acked_copies_dropped": c["acked"],
            "dedup_dropped": c["acked"], "siblings_dropped": c["acked"] + c["held"],
            "copies_parked": c["park"], "copies_released": c["released"], "copies_overdue": c["expired"],
            "nacks_after_ack": c["nacks_after_ack"], "batch_records": len(core.records), "held": len(core.held),
            "parked": len(core.parked)}
