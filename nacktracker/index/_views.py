"""Reading :class:`~nacktracker.index.TimeBucketIndex` without changing it:
counts and their cheap bounds, the pending bitmaps in order, and ``nbytes()``.
A mixin, state in the index's slots."""

from __future__ import annotations

from typing import Iterator

import numpy as np
from pyroaring import BitMap, BitMap64

from ._bytes import _roaring_bytes, held_size
from ._parts import M32, NO_CELLS, NO_ENTRIES, NO_KEYS, NO_PACKED, NO_SEGMENTS, NO_SLOTS, bitmap_of, common, distinct, merge_into

#: CPython keeps one shared object for each int up to this: a slot below it costs no int object.
SMALL_INT = 256
#: Int slots of an index counted by ``nbytes()`` whatever their value (``_count``, ``_churn``, ``_hot_bucket``).
COUNTER_INTS = 3


class ViewsMixin:
    """Counts, bitmaps in order and bytes held; see :mod:`.buckets`."""

    __slots__ = ()

    def bucket_count(self) -> int:
        """Distinct bucket times pending. Runtime complexity: O(n log n) in C
        (numpy over the window arrays), no Python object per message. Copies
        of messages acked while pending count until their bucket is taken."""
        return sum(len(self._cells_of(w, buckets_only=True)) for w in self._windows.values())

    def bitmap_count(self) -> int:
        """``(bucket, ledger)`` cells pending. Runtime complexity: O(n log n)
        in C, as :meth:`bucket_count` (and the same caveat)."""
        return sum(len(self._cells_of(w, buckets_only=False)) for w in self._windows.values())

    #: Windows with at most this many copies left (sparse plus dense cells) are
    #: counted exactly by the bounds below: a constant cost per window.
    SMALL_WINDOW = 64

    def bucket_count_bound(self) -> int:
        """An upper bound on :meth:`bucket_count` for gauges read often
        (``NegativeAcksTracker.stats()``, every metrics scrape): a window with
        at most :data:`SMALL_WINDOW` copies left is counted exactly, a larger
        one as the fewer of its copies (sparse copies left plus dense cells)
        and the buckets one window spans (at least 8). Exact when each window
        is small; ghosts count as in
        :meth:`bucket_count`. Runtime complexity: O(windows) (at most
        :data:`SMALL_WINDOW` copies read per window), never O(messages)."""
        span = 1 << self._lay.offset_bits
        total = 0
        for w in self._windows.values():
            n = w.size() + len(w.dense)
            total += len(self._cells_of(w, buckets_only=True)) if n <= self.SMALL_WINDOW else min(n, span)
        return total

    def bitmap_count_bound(self) -> int:
        """An upper bound on :meth:`bitmap_count`, as :meth:`bucket_count_bound`:
        small windows exactly, a larger one as the fewer of its copies and the
        cells it can hold (buckets one window spans × ledger slots ever handed
        out, which no slot in a window reaches). Exact when each window is
        small or each copy is alone in its ``(bucket, ledger)`` cell.
        Runtime complexity: O(windows), never O(messages)."""
        cap = (1 << self._lay.offset_bits) * len(self._lid)
        total = 0
        for w in self._windows.values():
            n = w.size() + len(w.dense)
            total += len(self._cells_of(w, buckets_only=False)) if n <= self.SMALL_WINDOW else min(n, cap)
        return total

    def _cells_of(self, w, buckets_only: bool) -> set[int]:
        """The window's distinct offsets (or ``offset << 32 | slot`` cells)."""
        lay = self._lay
        view = w.values()
        if buckets_only:
            found = set(distinct(lay.offsets(view)).tolist()) if len(view) else set()
            return found | {key >> 32 for key in w.dense}
        top = distinct(view >> np.uint64(32)).tolist() if len(view) else []  # offset | slot
        cut, smask = 32 - lay.offset_bits, self._slot_limit - 1
        return {(t >> cut) << 32 | (t & smask) for t in top} | set(w.dense)

    def iter_bitmaps(self) -> Iterator[tuple[int, int, BitMap | BitMap64]]:
        """``(bucket_ms, ledger_id, bitmap)`` of the live copies in order, without
        removing them. The bitmaps are fresh: mutating them changes nothing.
        Runtime complexity: O(n log n) for n copies."""
        lay = self._lay
        for wid in sorted(self._windows):
            w = self._windows[wid]
            cells: dict[tuple[int, int], BitMap | BitMap64] = {}
            for key, cell in w.dense.items():
                cells[key >> 32, key & M32] = type(cell)(cell)
            view = w.values()
            if len(view):
                offs = lay.offsets(view)
                slots = (view >> np.uint64(32)) & np.uint64(self._slot_limit - 1)
                order = np.lexsort((slots, offs))
                keys = np.stack((offs[order], slots[order]), axis=1)
                cut = np.flatnonzero((keys[1:] != keys[:-1]).any(axis=1)) + 1
                entries = (view & np.uint64(M32))[order]
                for lo, hi in zip([0, *cut.tolist()], [*cut.tolist(), len(order)]):
                    key = (int(keys[lo, 0]), int(keys[lo, 1]))
                    ids = bitmap_of(entries[lo:hi])
                    cells[key] = ids if key not in cells else merge_into(cells[key], ids)
            del view
            rows = []
            for (off, slot), cell in cells.items():
                bucket = wid << self._wshift | off << self.precision_bits
                ext = self._ext_at(slot)
                if ext is not None and ext.ghost is not None:
                    for e in common(cell, ext.ghost):
                        if not self._ghosts[(slot, e)].is_live_in(bucket):
                            cell.discard(e)
                if cell:
                    rows.append((bucket, self._lid[slot], cell))
            rows.sort(key=lambda r: r[:2])
            yield from rows

    def nbytes(self) -> int:
        """Bytes this index holds: Python objects, arrays and CRoaring's C heap,
        each allocation as the allocators take it (pymalloc's 16-byte
        classes, malloc chunks, the live bitmap's containers at the capacity
        CRoaring grows them to).

        A process that has added and popped for a while holds a little more
        (free chunks between live ones): anonymous RSS growth was 0.995-1.28x
        this, median 1.18x, in ``bench/index_grid.py``'s cells.

        Runtime complexity: O(windows + cells + ledgers + ids pending in two
        buckets or acked while pending); never O(messages).
        """
        size = held_size
        total = _roaring_bytes(self._live, grown=True, refit=self._refitted) + (
            size(self) + size(self._windows) + size(self._wheap) + size(self._by_id) + size(self._lid))
        # its counters and the hot bucket's time, each as an int object of its own whatever its value
        # (shared small ints below 257: up to 64 B more than held), so an empty index always reads the same
        total += COUNTER_INTS * size(1 << 40)
        total += sum(size(c) for c in (self._free, self._multi, self._ghosts, self._ext)
                     if c is not NO_SLOTS and c is not NO_ENTRIES)
        for wid, w in self._windows.items():
            total += size(wid) + size(w) + (size(w.packed) if w.packed is not NO_PACKED else 0)
            for segments in (w.full, w.spill):
                if segments is not NO_SEGMENTS:
                    total += size(segments) + sum(map(size, segments))
            if w.dense_keys is not NO_KEYS:
                total += size(w.dense_keys)
            if w.dense is not NO_CELLS:
                total += size(w.dense) + sum(map(size, w.dense))
                total += sum(map(_roaring_bytes, w.dense.values()))
        for slot, lid in enumerate(self._lid):
            if lid is None:
                continue
            total += size(lid) + (size(slot) if slot > SMALL_INT else 0)  # CPython shares the ints up to 256
            ext = self._ext_at(slot)
            if ext is not None:
                total += size(ext)
                if ext.wide is not None:
                    total += _roaring_bytes(ext.wide)
                if ext.cells is not None:  # its bitmaps, windows and keys are counted with the windows
                    total += size(ext.cells) + size(ext.hi)
                for extra in (ext.multi, ext.ghost):
                    if extra is not None:
                        total += size(extra) + sum(map(size, extra))
        for key, ghost in self._ghosts.items():
            total += size(key) + size(ghost) + (size(ghost.revived) if ghost.revived is not None else 0)
        total += sum(size(key) + size(n) for key, n in self._multi.items())
        return total
