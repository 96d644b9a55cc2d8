"""nacktracker: a small, exact, asyncio-native negative-ack tracker for Apache Pulsar.

Pending nacks live in a PIP-393 time-bucket index (trimmed due time -> ledger
-> Roaring bitmap of entry ids); one timer wakes exactly at the earliest
bucket; a pluggable adapter asks the broker to redeliver.
"""

from .index import DictIndex, HeapIndex, TimeBucketIndex

__all__ = ["TimeBucketIndex", "DictIndex", "HeapIndex"]
__version__ = "0.1.0"
