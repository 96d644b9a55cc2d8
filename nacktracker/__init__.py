"""nacktracker: a small, exact, asyncio-native negative-ack tracker for Apache Pulsar.

Pending nacks live in a PIP-393 time-bucket index (trimmed due time -> ledger
-> Roaring bitmap of entry ids); one timer wakes exactly at the earliest
bucket; a pluggable adapter asks the broker to redeliver.
"""

from .backoff import FixedBackoff, MultiplierBackoff
from .clock import LoopClock, ManualClock
from .dedup import Deduplicator
from .events import NackEvent
from .index import DictIndex, HeapIndex, TimeBucketIndex
from .keys import MessageKey
from .snapshot import SnapshotError
from .tracker import NegativeAcksTracker, TrackerClosedError

__all__ = [
    "TimeBucketIndex", "DictIndex", "HeapIndex",
    "NegativeAcksTracker", "TrackerClosedError", "MessageKey", "NackEvent",
    "FixedBackoff", "MultiplierBackoff", "LoopClock", "ManualClock",
    "TrackedConsumer", "subscribe", "Deduplicator", "SnapshotError",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    # The Pulsar layer imports pulsar-client; load it only when asked for.
    if name in ("TrackedConsumer", "subscribe"):
        from . import consumer

        return getattr(consumer, name)
    raise AttributeError(f"module 'nacktracker' has no attribute {name!r}")
