"""Nack event records: what the tracker reports through ``on_event`` and what
the Spark pipeline (``nacktracker plan``) reads back from Parquet / JSON Lines.

One row per event. ``ts_ms`` is wall-clock epoch milliseconds (for humans and
joins across machines); the tracker's own scheduling uses a monotonic clock and
never reads this field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Optional

__all__ = ["NackEvent", "KINDS", "COLUMNS"]

#: ``nack``: the application nacked (scheduled for ``delay_ms`` later);
#: ``redeliver``: the tracker asked the broker to redeliver;
#: ``dead_letter``: ``max_redeliveries`` was reached, handed to the dead-letter hook.
KINDS = ("nack", "redeliver", "dead_letter")


@dataclass(frozen=True, slots=True)
class NackEvent:
    ts_ms: int
    kind: str
    ledger_id: int
    entry_id: int
    delay_ms: int = 0
    redelivery_count: int = 0
    partition: int = -1
    batch_index: int = -1
    topic: Optional[str] = None
    consumer: Optional[str] = None

    def to_dict(self) -> dict:
        return asdict(self)


#: Column order of the on-disk event log.
COLUMNS = tuple(f.name for f in fields(NackEvent))
