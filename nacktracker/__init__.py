"""nacktracker: a small, exact, asyncio-native negative-ack tracker for Apache Pulsar.

Pending nacks live in a PIP-393 time-bucket index (trimmed due time -> ledger
-> Roaring bitmap of entry ids); one timer wakes exactly at the earliest
bucket; a pluggable adapter asks the broker to redeliver.
"""

from typing import TYPE_CHECKING, Any

from .backoff import FixedBackoff, MultiplierBackoff
from .clock import LoopClock, ManualClock
from .dedup import Deduplicator
from .events import NackEvent
from .index import DictIndex, HeapIndex, TimeBucketIndex
from .keys import MessageKey
from .snapshot import SnapshotError
from .tracker import NegativeAcksTracker, TrackerClosedError, TrackerStats

if TYPE_CHECKING:
    # The Pulsar layer is imported lazily at run time (below) so the core never
    # needs pulsar-client; type checkers see the real classes all the same.
    from .consumer import ConsumerClosed, ReceiveTimeout, TrackedConsumer, subscribe

__all__ = [
    "TimeBucketIndex", "DictIndex", "HeapIndex",
    "NegativeAcksTracker", "TrackerClosedError", "TrackerStats", "MessageKey", "NackEvent",
    "FixedBackoff", "MultiplierBackoff", "LoopClock", "ManualClock",
    "TrackedConsumer", "subscribe", "ReceiveTimeout", "ConsumerClosed", "Deduplicator", "SnapshotError",
]
__version__ = "0.1.0"

#: Names that live in the Pulsar layer (``nacktracker.consumer``): loaded on first use.
_PULSAR_NAMES = frozenset({"TrackedConsumer", "subscribe", "ReceiveTimeout", "ConsumerClosed"})


def __getattr__(name: str) -> Any:
    if name in _PULSAR_NAMES:
        from ._extras import explain

        try:
            from . import consumer

            return getattr(consumer, name)  # the package loads its Pulsar shell lazily too
        except ModuleNotFoundError as exc:
            err = explain(exc, f"nacktracker.{name}")
            if err is exc:
                raise
            raise err from None
    raise AttributeError(f"module 'nacktracker' has no attribute {name!r}")
