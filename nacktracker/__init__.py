"""nacktracker: a small, exact, asyncio-native negative-ack tracker for Apache Pulsar.

Pending nacks live in a PIP-393 time-bucket index (trimmed due time -> ledger
-> Roaring bitmap of entry ids); one timer wakes exactly at the earliest
bucket; a pluggable adapter asks the broker to redeliver.
"""

from typing import TYPE_CHECKING

from .backoff import FixedBackoff, MultiplierBackoff
from .clock import LoopClock, ManualClock
from .dedup import Deduplicator
from .errors import PULSAR_TYPED as _PULSAR_TYPED
from .errors import (
    AdapterError,
    DeadLetterError,
    MissingExtraError,
    NacktrackerError,
    NotReceivedError,
    SnapshotError,
    TraceError,
    TrackerClosedError,
)
from .events import NackEvent
from .index import DictIndex, HeapIndex, TimeBucketIndex
from .keys import MessageKey
from .tracker import NegativeAcksTracker, TrackerStats

if TYPE_CHECKING:
    # The Pulsar layer is imported lazily at run time (below) so the core never
    # needs pulsar-client; type checkers see the real classes all the same.
    from .consumer.shell import TrackedConsumer
    from .consumer.subscription import subscribe
    from .errors import ConsumerClosed, ReceiveTimeout

__all__ = [
    "TimeBucketIndex", "DictIndex", "HeapIndex",
    "NegativeAcksTracker", "TrackerClosedError", "TrackerStats", "MessageKey", "NackEvent",
    "FixedBackoff", "MultiplierBackoff", "LoopClock", "ManualClock",
    "TrackedConsumer", "subscribe", "ReceiveTimeout", "ConsumerClosed", "Deduplicator",
    "NacktrackerError", "SnapshotError", "NotReceivedError", "DeadLetterError", "AdapterError", "TraceError",
    "MissingExtraError",
]
__version__ = "0.1.0"

#: Names that live in the Pulsar layer (``nacktracker.consumer``): loaded on first use.
_PULSAR_NAMES = frozenset({"TrackedConsumer", "subscribe"})

if not TYPE_CHECKING:  # type checkers see the imports above: every name resolves to what it is

    def __getattr__(name: str) -> object:
        if name in _PULSAR_NAMES or name in _PULSAR_TYPED:
            from ._extras import explain

            try:
                if name in _PULSAR_TYPED:  # made by the error module on first use (it imports pulsar-client)
                    from . import errors

                    return getattr(errors, name)
                from . import consumer

                return getattr(consumer, name)  # the package loads its Pulsar shell lazily too
            except ModuleNotFoundError as exc:
                err = explain(exc, f"nacktracker.{name}")
                if err is exc:
                    raise
                raise err from None
        raise AttributeError(f"module 'nacktracker' has no attribute {name!r}")
