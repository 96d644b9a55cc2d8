"""Pure data structures that hold pending negative acks: no clock, no I/O.

:class:`TimeBucketIndex` is the PIP-393 design: trimmed due time -> ledger id
-> Roaring bitmap of entry ids. :class:`DictIndex` (one dict entry per message,
polled by scanning: the client before PIP-393) and :class:`HeapIndex` (a heap of
``(due, ledger, entry)`` triples: the broker's ``TripleLongPriorityQueue``) are
the baselines; all three follow one protocol exactly to the millisecond, so the
baselines double as reference models in the property tests.

Semantics shared by all three:

* a due time maps to a bucket (``precision_bits``, ``rounding``); a message is
  stored once per bucket, and a message nacked again into another bucket is
  pending in both and comes back once per bucket (two messages of one batch
  entry nacked with different delays must both fire);
* ``discard`` removes every pending occurrence (an ack);
* ``pop_due(now_ms)`` removes and returns every ``(ledger, entry)`` whose bucket
  time is ``<= now_ms``, ordered by ``(bucket, ledger, entry)``.
"""

from __future__ import annotations

import array
import heapq
import sys
from itertools import repeat
from typing import Iterable, Iterator

from pyroaring import BitMap, BitMap64
from sortedcontainers import SortedList

from ._checks import MAX_DUE, U32, check_int, check_precision, entry_array

__all__ = ["TimeBucketIndex", "DictIndex", "HeapIndex"]

_SHIFT = 64  # composite key = bucket_ms << 64 | ledger_id (ledger ids < 2^63)
_LEDGER = (1 << _SHIFT) - 1
_NO_KEY = -1


def _has(bm: BitMap | BitMap64, entry_id: int) -> bool:
    """``entry_id in bm``; a 32-bit bitmap cannot hold ids >= 2^32 (and raises)."""
    return (entry_id < U32 or type(bm) is BitMap64) and entry_id in bm


def _malloc(n: int) -> int:
    """Bytes glibc's malloc really takes for a request of ``n`` bytes."""
    return max(32, (n + 8 + 15) & ~15)


def _roaring_bytes(bm: BitMap | BitMap64) -> int:
    """CRoaring heap bytes behind one bitmap (tracemalloc does not see them).

    From ``get_statistics()`` (container payloads) plus the C structs CRoaring
    allocates: the bitmap header, the key/container/typecode arrays and one
    struct per container, each rounded to a malloc chunk.
    """
    s = bm.get_statistics()
    n = s["n_containers"]
    total = _malloc(48) + (_malloc(11 * n) if n else 0)  # roaring_bitmap_t + high-low arrays
    for count, payload in (("n_array_containers", "n_bytes_array_containers"),
                           ("n_run_containers", "n_bytes_run_containers"),
                           ("n_bitset_containers", "n_bytes_bitset_containers")):
        c = s[count]
        if c:
            total += c * _malloc(16) + c * _malloc(s[payload] // c)
    if type(bm) is BitMap64:
        total += n * 24  # ART leaf per container
    return total + type(bm).__basicsize__


class TimeBucketIndex:
    """Pending nacks as ``bucket -> ledger -> Roaring bitmap of entry ids``.

    The bucket of a due time is the time with its low ``precision_bits``
    cleared (``rounding="floor"``, Pulsar's ``negativeAckPrecisionBitCnt``: up
    to 2^bits-1 ms early, never late) or rounded up to the next multiple
    (``"ceil"``: never early, up to 2^bits-1 ms late).

    Layout: one :class:`~sortedcontainers.SortedDict` keyed by the composite
    int ``bucket << 64 | ledger_id``, so keys sort by ``(bucket, ledger)`` and a
    bucket holding one ledger (the common case) costs one key and one bitmap.
    Entry ids live in a 32-bit :class:`~pyroaring.BitMap` until an id >= 2^32
    arrives for that ledger in that bucket, which switches it to ``BitMap64``.
    A bitmap that stops receiving adds is compacted (``run_optimize`` +
    ``shrink_to_fit``) once time moves on to a newer bucket, so consecutive
    entry ids cost a run, not 2 bytes each.

    >>> idx = TimeBucketIndex(precision_bits=0)
    >>> idx.add(7, 1, due_ms=100); idx.add(7, 2, due_ms=100); idx.add(3, 9, due_ms=50)
    >>> idx.next_due_ms(), len(idx)
    (50, 3)
    >>> idx.pop_due(100)
    [(3, 9), (7, 1), (7, 2)]
    """

    __slots__ = ("precision_bits", "rounding", "_add", "_mask", "_keys", "_ledgers",
                 "_count", "_hot_key", "_hot_bucket", "_hot_ledger", "_hot_bm", "_hot_len0", "_dirty", "_newest")

    def __init__(self, precision_bits: int = 8, rounding: str = "floor") -> None:
        self._add, self._mask = check_precision(precision_bits, rounding)
        self.precision_bits: int = precision_bits
        self.rounding: str = rounding
        self._keys: SortedList = SortedList()  # composite keys in (bucket, ledger) order
        self._ledgers: dict[int, dict[int, BitMap | BitMap64]] = {}  # ledger -> its keys -> bitmaps
        self._count = 0  # occurrences, not counting the hot bitmap's growth
        self._hot_key = _NO_KEY  # fast path: the bitmap the last add went to,
        self._hot_bucket = self._hot_ledger = _NO_KEY  # and its key's two halves
        self._hot_bm: BitMap | BitMap64 | None = None
        self._hot_len0 = 0
        self._dirty: set[int] = set()  # keys added to since the last compaction
        self._newest = -1  # newest bucket that got a bitmap

    # -- adding ---------------------------------------------------------------

    def bucket_of(self, due_ms: int) -> int:
        """The bucket time a due time maps to. Runtime complexity: O(1)."""
        return (check_int("due_ms", due_ms, MAX_DUE) + self._add) & self._mask

    def add(self, ledger_id: int, entry_id: int, due_ms: int) -> None:
        """Track ``(ledger_id, entry_id)`` as due at ``due_ms`` (monotonic ms).

        Ids are ints in ``[0, 2^63)``, ``due_ms`` in ``[0, 2^62)``; anything
        else raises ``TypeError``/``ValueError`` and changes nothing.

        Runtime complexity: O(1) when the bitmap of the previous add is hit
        (nacks come in bursts for one bucket and ledger), else O(log n) for
        n bitmaps.
        """
        if (type(ledger_id) is not int or type(entry_id) is not int or type(due_ms) is not int
                or (ledger_id | entry_id) >> 63 or due_ms >> 62):  # negative or too large
            ledger_id = check_int("ledger_id", ledger_id)
            entry_id = check_int("entry_id", entry_id)
            due_ms = check_int("due_ms", due_ms, MAX_DUE)
        bucket = (due_ms + self._add) & self._mask
        if bucket == self._hot_bucket and ledger_id == self._hot_ledger:
            bm = self._hot_bm
        else:
            bm = self._make_hot(bucket << _SHIFT | ledger_id)
        try:
            bm.add(entry_id)
        except OverflowError:  # an id >= 2^32 in a 32-bit bitmap
            self._widen().add(entry_id)

    def add_many(self, ledger_id: int, entry_ids: Iterable[int], due_ms: int) -> None:
        """Track many entries of one ledger, all due at ``due_ms``.

        ``entry_ids``: ``array.array('I')`` or a numpy integer array (converted
        without a per-element Python loop), any integer ``array.array``, or any
        iterable of ints. Runtime complexity: O(k) in C for k ids, plus
        O(log n) to find the bitmap.
        """
        if type(ledger_id) is not int or type(due_ms) is not int or ledger_id >> 63 or due_ms >> 62:
            ledger_id = check_int("ledger_id", ledger_id)
            due_ms = check_int("due_ms", due_ms, MAX_DUE)
        if type(entry_ids) is array.array and entry_ids.typecode == "I":
            ids = entry_ids  # the fast path: already what a 32-bit bitmap takes
        else:
            ids = entry_array(entry_ids)
        if not len(ids):
            return
        bucket = (due_ms + self._add) & self._mask
        if bucket == self._hot_bucket and ledger_id == self._hot_ledger:
            bm = self._hot_bm
        else:
            bm = self._make_hot(bucket << _SHIFT | ledger_id)
        if ids.typecode == "I":
            bm.update(ids if type(bm) is BitMap else array.array("Q", ids))
        else:
            self._widen().update(ids)

    def _settle(self) -> None:
        """Fold the hot bitmap's growth into ``_count`` and drop the fast path."""
        if self._hot_bm is not None:
            self._count += len(self._hot_bm) - self._hot_len0
            self._hot_bm = None
            self._hot_key = self._hot_bucket = self._hot_ledger = _NO_KEY

    def _make_hot(self, key: int) -> BitMap | BitMap64:
        self._settle()
        ledger = key & _LEDGER
        mine = self._ledgers.get(ledger)
        bm = None if mine is None else mine.get(key)
        if bm is None:
            bm = BitMap()
            self._keys.add(key)
            if mine is None:
                self._ledgers[ledger] = {key: bm}
            else:
                mine[key] = bm
            bucket = key >> _SHIFT
            if bucket > self._newest:
                self._newest = bucket
                self.compact()
        self._dirty.add(key)
        self._hot_key, self._hot_bm, self._hot_len0 = key, bm, len(bm)
        self._hot_bucket, self._hot_ledger = key >> _SHIFT, key & _LEDGER
        return bm

    def _widen(self) -> BitMap64:
        """Switch the hot bitmap to 64 bits (an entry id >= 2^32 arrived)."""
        bm = self._hot_bm
        if type(bm) is not BitMap64:
            bm = BitMap64(bm)
            key = self._hot_key
            self._ledgers[key & _LEDGER][key] = self._hot_bm = bm
        return bm

    def compact(self) -> None:
        """Run-optimise and shrink every bitmap added to since the last call,
        except those of the newest bucket (still filling).

        Called automatically when a newer bucket gets its first bitmap.
        Runtime complexity: O(touched bitmaps x their containers).
        """
        newest = self._newest
        keep = set()
        for key in self._dirty:
            if key >> _SHIFT == newest:
                keep.add(key)
                continue
            bm = self._ledgers.get(key & _LEDGER, {}).get(key)
            if bm is not None:
                bm.run_optimize()
                bm.shrink_to_fit()
        self._dirty = keep

    # -- removing -------------------------------------------------------------

    def discard(self, ledger_id: int, entry_id: int) -> bool:
        """Remove every pending occurrence of ``(ledger_id, entry_id)`` (an ack).

        Returns whether anything was pending. Runtime complexity: O(b log n)
        for the b buckets that hold this ledger; O(1) when the ledger has
        nothing pending.
        """
        if type(ledger_id) is not int or type(entry_id) is not int or (ledger_id | entry_id) >> 63:
            ledger_id = check_int("ledger_id", ledger_id)
            entry_id = check_int("entry_id", entry_id)
        mine = self._ledgers.get(ledger_id)
        if mine is None:
            return False
        if entry_id < U32:
            hits = [(k, bm) for k, bm in mine.items() if entry_id in bm]
        else:
            hits = [(k, bm) for k, bm in mine.items() if _has(bm, entry_id)]
        if not hits:
            return False
        self._settle()
        for key, bm in hits:
            bm.discard(entry_id)
            self._count -= 1
            if not bm:
                self._drop(key)
        return True

    def _drop(self, key: int) -> None:
        self._keys.remove(key)
        self._dirty.discard(key)
        ledger = key & _LEDGER
        mine = self._ledgers[ledger]
        del mine[key]
        if not mine:
            del self._ledgers[ledger]

    def pop_due_bitmaps(self, now_ms: int) -> list[tuple[int, int, BitMap | BitMap64]]:
        """Remove everything due at ``now_ms``; return ``(bucket_ms, ledger_id,
        bitmap)`` triples in ``(bucket, ledger)`` order.

        The bulk form of :meth:`pop_due`: no Python object per message.
        Runtime complexity: O(d log n) for d popped bitmaps.
        """
        now_ms = check_int("now_ms", now_ms)
        self._settle()
        limit = (now_ms + 1) << _SHIFT
        out = []
        keys = self._keys
        while keys:
            key = keys[0]
            if key >= limit:
                break
            bm = self._ledgers[key & _LEDGER][key]
            self._drop(key)
            self._count -= len(bm)
            out.append((key >> _SHIFT, key & _LEDGER, bm))
        return out

    def pop_due(self, now_ms: int) -> list[tuple[int, int]]:
        """Remove and return every ``(ledger_id, entry_id)`` whose bucket time is
        ``<= now_ms``, ordered by ``(bucket, ledger, entry)``.

        Runtime complexity: O(d log n + k) for d bitmaps holding k messages.
        """
        out: list[tuple[int, int]] = []
        for _, ledger, bm in self.pop_due_bitmaps(now_ms):
            out.extend(zip(repeat(ledger), bm))
        return out

    # -- looking --------------------------------------------------------------

    def next_due_ms(self) -> int | None:
        """The earliest bucket time, or ``None`` when empty. Runtime: O(1)."""
        return self._keys[0] >> _SHIFT if self._keys else None

    def __len__(self) -> int:
        """Pending occurrences (a message pending in two buckets counts twice)."""
        if self._hot_bm is None:
            return self._count
        return self._count + len(self._hot_bm) - self._hot_len0

    def __contains__(self, item: object) -> bool:
        """``(ledger_id, entry_id) in index``. Runtime: O(b) for b buckets of the ledger."""
        try:
            ledger_id, entry_id = item  # type: ignore[misc]
        except (TypeError, ValueError):
            return False
        if type(ledger_id) is not int or type(entry_id) is not int or entry_id < 0:
            return False
        mine = self._ledgers.get(ledger_id)
        if mine is None:
            return False
        if entry_id < U32:
            for bm in mine.values():
                if entry_id in bm:
                    return True
            return False
        return any(_has(bm, entry_id) for bm in mine.values())

    def __bool__(self) -> bool:
        return bool(self._keys)

    def has_ledger(self, ledger_id: int) -> bool:
        """Whether anything of this ledger is pending. Runtime complexity: O(1)."""
        return ledger_id in self._ledgers

    def bucket_count(self) -> int:
        """Distinct bucket times pending. Runtime complexity: O(n) bitmaps."""
        return len({key >> _SHIFT for key in self._keys})

    def bitmap_count(self) -> int:
        """``(bucket, ledger)`` bitmaps pending. Runtime complexity: O(1)."""
        return len(self._keys)

    def iter_bitmaps(self) -> Iterator[tuple[int, int, BitMap | BitMap64]]:
        """``(bucket_ms, ledger_id, bitmap)`` in order, without removing them.
        Do not mutate the bitmaps."""
        self._settle()
        for key in self._keys:
            ledger = key & _LEDGER
            yield key >> _SHIFT, ledger, self._ledgers[ledger][key]

    def nbytes(self) -> int:
        """Bytes this index holds: Python objects plus CRoaring's C heap.

        Counts the sorted dict (hash table, key lists, positional index), the
        composite keys, the per-ledger key lists, the bitmap objects and what
        CRoaring allocated for them (``_roaring_bytes``). Runtime: O(n) bitmaps.
        """
        sl = self._keys
        total = sys.getsizeof(sl) + sys.getsizeof(sl._lists) + sys.getsizeof(sl._maxes)
        total += sys.getsizeof(sl._index) + sum(map(sys.getsizeof, sl._lists))
        total += sum(map(sys.getsizeof, sl))
        total += sys.getsizeof(self._ledgers) + sys.getsizeof(self._dirty)
        for ledger, mine in self._ledgers.items():
            total += sys.getsizeof(ledger) + sys.getsizeof(mine)
            total += sum(map(_roaring_bytes, mine.values()))
        return total

    def __repr__(self) -> str:
        return (f"TimeBucketIndex(precision_bits={self.precision_bits}, "
                f"rounding={self.rounding!r}, pending={len(self)}, bitmaps={len(self._keys)})")


class _PerMessageIndex:
    """Shared part of the baselines: ``(ledger, entry) -> bucket(s)``.

    The value is the bucket time, or a sorted tuple of them when a message is
    pending in several buckets.
    """

    __slots__ = ("precision_bits", "rounding", "_add", "_mask", "_pending", "_count", "_heap")

    def __init__(self, precision_bits: int = 0, rounding: str = "floor") -> None:
        self._add, self._mask = check_precision(precision_bits, rounding)
        self.precision_bits = precision_bits
        self.rounding = rounding
        self._pending: dict[tuple[int, int], int | tuple[int, ...]] = {}
        self._count = 0
        self._heap: list[tuple[int, int, int]] | None = None  # HeapIndex only

    def bucket_of(self, due_ms: int) -> int:
        return (check_int("due_ms", due_ms, MAX_DUE) + self._add) & self._mask

    def add(self, ledger_id: int, entry_id: int, due_ms: int) -> None:
        """Track one message. Runtime complexity: O(1) (dict) or O(log n) (heap)."""
        if (type(ledger_id) is not int or type(entry_id) is not int or type(due_ms) is not int
                or (ledger_id | entry_id) >> 63 or due_ms >> 62):
            ledger_id = check_int("ledger_id", ledger_id)
            entry_id = check_int("entry_id", entry_id)
            due_ms = check_int("due_ms", due_ms, MAX_DUE)
        key = (ledger_id, entry_id)
        bucket = (due_ms + self._add) & self._mask
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
        bucket = (check_int("due_ms", due_ms, MAX_DUE) + self._add) & self._mask
        for entry_id in entry_array(entry_ids):
            self._put((ledger_id, entry_id), bucket)

    def _put(self, key: tuple[int, int], bucket: int) -> bool:
        old = self._pending.get(key)
        if old is None:
            self._pending[key] = bucket
        elif type(old) is int:
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
        self._count -= 1 if type(old) is int else len(old)
        return True

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return bool(self._pending)

    def __contains__(self, item: object) -> bool:
        try:
            return item in self._pending
        except TypeError:
            return False

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
            if type(value) is int:
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
        return min(v if type(v) is int else v[0] for v in self._pending.values())

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
            if value is not None and (value == bucket if type(value) is int else bucket in value):
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
            if type(value) is int:
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
        total = sys.getsizeof(heap) + sum(map(sys.getsizeof, heap))
        # the bucket ints in the triples are shared with the map's values
        return total + self._nbytes_pending()
