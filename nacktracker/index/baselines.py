"""The baselines and reference models: :class:`DictIndex` (one dict entry per
message, polled by scanning: the client before PIP-393) and :class:`HeapIndex`
(a heap of ``(due, ledger, entry)`` triples: the broker's
``TripleLongPriorityQueue``). Same protocol as
:class:`~nacktracker.index.TimeBucketIndex`, exactly to the millisecond."""

from __future__ import annotations

import heapq
import sys
from typing import Iterable

from .._checks import MAX_DUE, check_int, entry_array, message_id

__all__ = ["DictIndex", "HeapIndex"]


class _PerMessageIndex:
    """Shared part of the baselines: ``(ledger, entry) -> bucket(s)``.

    The value is the bucket time, or a sorted tuple of them when a message is
    pending in several buckets.

    These are the reference models the tests compare :class:`TimeBucketIndex`
    against, so their bucket arithmetic is written here from the definition
    (a bucket is a multiple of ``2^bits`` ms: the largest one at or below the
    due time for ``"floor"``, the smallest one at or above it for ``"ceil"``)
    with integer division, and shares nothing with the index's add-and-mask.
    """

    __slots__ = ("precision_bits", "rounding", "_width", "_ceil", "_pending", "_count", "_heap")

    def __init__(self, precision_bits: int = 0, rounding: str = "floor") -> None:
        bits = check_int("precision_bits", precision_bits, 30)
        if rounding not in ("floor", "ceil"):
            raise ValueError(f"rounding must be 'floor' or 'ceil', got {rounding!r}")
        self._width: int = 2 ** bits
        self._ceil = rounding == "ceil"
        self.precision_bits = precision_bits
        self.rounding = rounding
        self._pending: dict[tuple[int, int], int | tuple[int, ...]] = {}
        self._count = 0
        self._heap: list[tuple[int, int, int]] | None = None  # HeapIndex only

    def bucket_of(self, due_ms: int) -> int:
        """The bucket time of a nack due at ``due_ms``: a multiple of ``2^bits``,
        the one at or below it (floor) or at or above it (ceil).

        >>> DictIndex(3, "floor").bucket_of(17), DictIndex(3, "ceil").bucket_of(17)
        (16, 24)
        """
        return self._bucket(check_int("due_ms", due_ms, MAX_DUE))

    def _bucket(self, due_ms: int) -> int:
        width = self._width
        whole, rest = divmod(due_ms, width)
        return (whole + 1) * width if self._ceil and rest else whole * width

    def add(self, ledger_id: int, entry_id: int, due_ms: int) -> None:
        """Track one message. Runtime complexity: O(1) (dict) or O(log n) (heap)."""
        if (type(ledger_id) is not int or type(entry_id) is not int or type(due_ms) is not int
                or (ledger_id | entry_id) >> 63 or due_ms >> 62):
            ledger_id = check_int("ledger_id", ledger_id)
            entry_id = check_int("entry_id", entry_id)
            due_ms = check_int("due_ms", due_ms, MAX_DUE)
        key = (ledger_id, entry_id)
        rest = due_ms % self._width  # _bucket, inline: add is what the benchmarks time
        bucket = due_ms - rest + self._width if rest and self._ceil else due_ms - rest
        pending = self._pending
        old = pending.get(key)
        if old is None:
            pending[key] = bucket
            self._count += 1
            if self._heap is not None:
                heapq.heappush(self._heap, (bucket, ledger_id, entry_id))
        elif old != bucket:
            self._put(key, bucket)

    def add_many(self, ledger_id: int, entry_ids: Iterable[int], due_ms: int) -> None:
        """Track many entries of one ledger. Runtime complexity: O(k)."""
        ledger_id = check_int("ledger_id", ledger_id)
        bucket = self._bucket(check_int("due_ms", due_ms, MAX_DUE))
        for entry_id in entry_array(entry_ids):
            self._put((ledger_id, entry_id), bucket)

    def _put(self, key: tuple[int, int], bucket: int) -> bool:
        old = self._pending.get(key)
        if old is None:
            self._pending[key] = bucket
        elif isinstance(old, int):
            if old == bucket:
                return False
            self._pending[key] = (old, bucket) if old < bucket else (bucket, old)
        else:
            if bucket in old:
                return False
            self._pending[key] = tuple(sorted(old + (bucket,)))
        self._count += 1
        if self._heap is not None:
            heapq.heappush(self._heap, (bucket, *key))
        return True

    def discard(self, ledger_id: int, entry_id: int) -> bool:
        """Remove every pending occurrence. Runtime complexity: O(1)."""
        key = (check_int("ledger_id", ledger_id), check_int("entry_id", entry_id))
        old = self._pending.pop(key, None)
        if old is None:
            return False
        self._count -= 1 if isinstance(old, int) else len(old)
        return True

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return bool(self._pending)

    def __contains__(self, item: object) -> bool:
        """Runtime complexity: O(1). Not an id pair (``bool``, negative, ...): False."""
        ids = message_id(item)
        return ids is not None and ids in self._pending

    def _nbytes_pending(self) -> int:
        seen: set[int] = set()
        total = sys.getsizeof(self._pending)
        for key, value in self._pending.items():
            total += sys.getsizeof(key)
            for obj in (key[0], key[1], value):
                if id(obj) not in seen and not (type(obj) is int and -5 <= obj <= 256):
                    seen.add(id(obj))
                    total += sys.getsizeof(obj)
        return total

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(precision_bits={self.precision_bits}, "
                f"rounding={self.rounding!r}, pending={len(self)})")


class DictIndex(_PerMessageIndex):
    """The client before PIP-393: one dict entry per message, polled by scanning.

    ``pop_due`` and ``next_due_ms`` scan every pending message: O(n).
    """

    __slots__ = ()

    def pop_due(self, now_ms: int) -> list[tuple[int, int]]:
        """Scan everything, remove and return what is due. Runtime: O(n + d log d)."""
        now_ms = check_int("now_ms", now_ms)
        pending = self._pending
        due: list[tuple[int, int, int]] = []
        gone: list[tuple[int, int]] = []
        later: dict[tuple[int, int], int | tuple[int, ...]] = {}
        for key, value in pending.items():
            if isinstance(value, int):
                if value <= now_ms:
                    due.append((value, *key))
                    gone.append(key)
            elif value[0] <= now_ms:
                due.extend((b, *key) for b in value if b <= now_ms)
                rest = tuple(b for b in value if b > now_ms)
                if not rest:
                    gone.append(key)
                else:
                    later[key] = rest[0] if len(rest) == 1 else rest
        for key in gone:
            del pending[key]
        pending.update(later)
        self._count -= len(due)
        due.sort()
        return [(ledger, entry) for _, ledger, entry in due]

    def next_due_ms(self) -> int | None:
        """Scan for the earliest bucket. Runtime complexity: O(n)."""
        if not self._pending:
            return None
        return min(v if isinstance(v, int) else v[0] for v in self._pending.values())

    def nbytes(self) -> int:
        """Bytes of the dict, its key tuples and the ints they hold. Runtime: O(n)."""
        return self._nbytes_pending()


class HeapIndex(_PerMessageIndex):
    """A heap of ``(bucket, ledger, entry)`` triples, as the broker's
    ``TripleLongPriorityQueue``, plus the per-message map that dedupes within a
    bucket and lets ``discard`` work (heap copies of discarded messages are
    skipped lazily when they surface).
    """

    __slots__ = ()

    def __init__(self, precision_bits: int = 0, rounding: str = "floor") -> None:
        super().__init__(precision_bits, rounding)
        self._heap = []

    def _skip_stale(self) -> None:
        heap, pending = self._heap, self._pending
        while heap:
            bucket, ledger, entry = heap[0]
            value = pending.get((ledger, entry))
            if value is not None and (value == bucket if isinstance(value, int) else bucket in value):
                return
            heapq.heappop(heap)

    def pop_due(self, now_ms: int) -> list[tuple[int, int]]:
        """Pop triples while the top is due. Runtime: O(d log n)."""
        now_ms = check_int("now_ms", now_ms)
        heap, pending = self._heap, self._pending
        out: list[tuple[int, int]] = []
        while True:
            self._skip_stale()
            if not heap or heap[0][0] > now_ms:
                return out
            bucket, ledger, entry = heapq.heappop(heap)
            key = (ledger, entry)
            value = pending[key]
            if isinstance(value, int):
                del pending[key]
            else:
                rest = tuple(b for b in value if b != bucket)
                pending[key] = rest[0] if len(rest) == 1 else rest
            self._count -= 1
            out.append(key)

    def next_due_ms(self) -> int | None:
        """The earliest bucket. Runtime complexity: O(1) amortised."""
        self._skip_stale()
        return self._heap[0][0] if self._heap else None

    def nbytes(self) -> int:
        """Bytes of the heap list, its triples and the per-message map."""
        heap = self._heap
        assert heap is not None
        total = sys.getsizeof(heap) + sum(sys.getsizeof(t) for t in heap)
        # the bucket ints in the triples are shared with the map's values
        return total + self._nbytes_pending()
