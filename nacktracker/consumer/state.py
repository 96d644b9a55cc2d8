"""The delivery core's state, in named types (see :mod:`.core`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from ..keys import MessageKey

__all__ = ["Verdict", "Held", "Nacked", "Parked", "EntryRecord", "AckResult", "Token", "core_stats"]

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


class AckResult(NamedTuple):
    tokens: list[Token]   # dropped copies to acknowledge as well
    discard: bool         # cancel the entry's pending nack in the tracker


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
