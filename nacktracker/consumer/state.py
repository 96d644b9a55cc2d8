"""The delivery core's state, in named types (see :mod:`.core`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from ..keys import MessageKey

__all__ = ["Verdict", "Held", "HELD", "FRESH", "ACKED", "ACKED_FRESH", "Nacked", "Parked", "EntryRecord", "AckResult", "Positions", "ALL_INDICES",
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


@dataclass(slots=True)
class EntryRecord:
    """A batch entry with nacked messages (Pulsar redelivers whole entries)."""

    nacked: dict[int, Nacked] = field(default_factory=dict)  # batch index -> nack
    acked: Optional[set[int]] = None   # dedup=False only: indices acknowledged while the record lives
    linger_until: float = -1.0         # dedup=False only: a requested copy may arrive until then
    size: int = 0                      # messages in the entry (0: not known)


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
