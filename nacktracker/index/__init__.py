"""Pure data structures that hold pending negative acks: no clock, no I/O.

:class:`TimeBucketIndex` is the PIP-393 design (trimmed due time -> ledger ->
entry ids) laid out for real client traffic (:mod:`.buckets`).
:class:`DictIndex` and :class:`HeapIndex` are the baselines (:mod:`.baselines`);
all three follow one protocol exactly to the millisecond, so the baselines
double as reference models in the property tests. :mod:`.layout` documents
the index's layout and byte accounting (the planner's memory model builds
on it), :mod:`.bitmaps` the bitmap and array conversions both use.

Semantics shared by all three:

* a due time maps to a bucket (``precision_bits``, ``rounding``); a message is
  stored once per bucket, and a message nacked again into another bucket is
  pending in both and comes back once per bucket (two messages of one batch
  entry nacked with different delays must both fire);
* ``discard`` removes every pending occurrence (an ack);
* ``pop_due(now_ms)`` removes and returns every ``(ledger, entry)`` whose bucket
  time is ``<= now_ms``, ordered by ``(bucket, ledger, entry)``.
"""

from .baselines import DictIndex, HeapIndex
from .buckets import TimeBucketIndex

__all__ = ["TimeBucketIndex", "DictIndex", "HeapIndex"]
