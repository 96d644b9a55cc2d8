"""What a TrackedConsumer holds for its pending nacks, in bytes, by part.

``stats()["nbytes"]`` (the metrics' ``nacktracker.memory.usage``) is the sum of
:func:`nbytes_parts`, and ``stats()["nbytes_parts"]`` the split:

* ``tracker``: the tracker's pending set (index and ledger routing);
* ``delivery``: the delivery core's own state (batch records, requests,
  parked states, deadlines, its tables: :meth:`~.core.DeliveryCore.nbytes`);
* ``kept_messages``: received messages kept in memory, at
  :data:`KEPT_MESSAGE_BYTES` each: copies the core parks or keeps to ack with
  a message, messages kept for local redelivery (Exclusive/Failover), retry
  copies held until due, dead letters waiting to be published;
* ``dedup``: the deduplicator of acknowledged ids;
* ``delivery_counts``: the consumer's own redelivery counts.

``python -m bench.consumer_memory`` checks the sum against the process's RSS
growth with real traffic.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["KEPT_MESSAGE_BYTES", "nbytes_parts"]

#: A received message kept by Python (its wrapper, the client's C++ message,
#: its share of the entry's payload): the resident memory it holds, measured
#: with 64-byte payloads (``python -m bench.consumer_memory``, the rows of a
#: plain consumer keeping every message it receives: ~1.09 KB batched, ~1.14 KB
#: not). An estimate: a bigger payload costs more, and a batch message kept
#: alone keeps its whole entry's payload.
KEPT_MESSAGE_BYTES = 1_100


def nbytes_parts(*, tracker: int, core: Any, kept_elsewhere: int, dedup: Any = None,
                 counts: Any = None) -> dict[str, int]:
    """The parts (see the module docstring): ``tracker``: the tracker's ``nbytes()``; ``core``: the
    :class:`~.core.DeliveryCore`; ``kept_elsewhere``: received messages kept outside the core;
    ``dedup``: a :class:`~nacktracker.Deduplicator` or ``None``; ``counts``: the
    :class:`~.counts.DeliveryCounts` or ``None``. O(the core's :meth:`~.core.DeliveryCore.nbytes`
    + the deduplicator's ``nbytes()``)."""
    dedup_bytes: Optional[int] = dedup.nbytes() if dedup is not None else 0
    return {"tracker": tracker, "delivery": core.nbytes(),
            "kept_messages": (core.kept_copies() + kept_elsewhere) * KEPT_MESSAGE_BYTES,
            "dedup": dedup_bytes or 0, "delivery_counts": counts.nbytes() if counts is not None else 0}
