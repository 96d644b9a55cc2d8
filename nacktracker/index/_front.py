"""The front of the time order of :class:`~nacktracker.index.TimeBucketIndex`:
opening windows, gathering the earliest bucket into cells, dropping ghosts,
releasing popped cells. A mixin, state in the index's slots."""

from __future__ import annotations

import array
import bisect
import heapq
from typing import Iterator

import numpy as np
from pyroaring import BitMap, BitMap64

from ._parts import M32, NO_PACKED, NO_SEGMENTS, NO_SLOTS, SEGMENT, LedgerExt, Window, common, distinct, merge_into, sort_across, u32_array, u64_array


class FrontMixin:
    """Taking buckets off the front; see :mod:`.buckets`."""

    __slots__ = ()

    def _unghost(self, ext: LedgerExt, key: tuple[int, int]) -> None:
        del self._ghosts[key]
        ext.ghost.discard(key[1])
        if not ext.ghost:
            ext.ghost = None

    def _release(self, slot: int, w: Window, bucket: int, cell: BitMap | BitMap64) -> None:
        """Account for a popped cell (ghost copies already dropped)."""
        n = len(cell)
        self._churn += n
        self._count -= n
        gone = cell
        ext = self._ext_at(slot)
        if ext is not None:
            if ext.cells is not None:
                self._unlist(ext, cell)
            if ext.ghost is not None:
                for e in common(cell, ext.ghost):
                    self._ghosts[(slot, e)].revived.discard(bucket)
            if ext.multi is not None:
                gone = self._release_multi(slot, ext, cell)
            if ext.wide is not None and type(gone) is BitMap64:
                ext.wide.difference_update(gone)
                if not ext.wide:
                    ext.wide = None
        self._live.difference_update(self._keyed(slot, gone))
        if self._churn >= self._compact_at:
            self._compact_live()
        if (ext is None or ext.ghost is None) and not self._has_live(slot):
            self._drop_ledger(slot)
        else:
            self._tidy(slot)

    def _release_multi(self, slot: int, ext: LedgerExt, cell: BitMap | BitMap64) -> BitMap | BitMap64:
        """A popped cell's ids also pending in another bucket lose one copy;
        return the cell's ids that leave the live state (those pending here only)."""
        still = []
        for e in common(cell, ext.multi):
            key = (slot, e)
            left = self._multi[key] - 1
            if left == 1:
                del self._multi[key]
                ext.multi.discard(e)
            else:
                self._multi[key] = left
            still.append(e)
        if not ext.multi:
            ext.multi = None
        if not still:
            return cell
        gone = type(cell)(cell)
        for e in still:
            gone.discard(e)
        return gone

    def _drop_ledger(self, slot: int) -> None:
        del self._by_id[self._lid[slot]]
        self._lid[slot] = None
        if self._ext:
            self._ext[slot] = None
        if self._free is NO_SLOTS:
            self._free = []
        self._free.append(slot)
        if self._hot_slot == slot:
            self._reset_hot()

    def _front(self, taking: int = -1) -> tuple[int, Window, int] | None:
        """``(bucket, window, offset)`` of the earliest bucket holding a live
        copy; None if empty. A bucket at or before ``taking`` (about to be
        taken) is gathered into dense cells with its ghosts dropped; a later
        one only when ghosts exist or its offset comes from the tail alone
        (to know whether it holds a live copy)."""
        heap, windows = self._wheap, self._windows
        while heap:
            wid = heap[0]
            w = windows[wid]
            if w.empty():
                heapq.heappop(heap)
                del windows[wid]
                if self._hot_win is w:
                    self._reset_hot()
                continue
            off = self._front_offset(w)
            bucket = wid << self._wshift | off << self.precision_bits
            if bucket > taking and not self._ghost_copies and self._surely_live(w, off):
                return bucket, w, off  # not taken now: left sparse (no bitmap per front bucket between pops)
            if self._gather(w, off, bucket):
                return bucket, w, off
        return None

    def _surely_live(self, w: Window, off: int) -> bool:
        """With no ghost copy anywhere, whether bucket ``off`` (the window's
        earliest) holds a live copy without gathering it: the sorted part
        starts with it or a dense cell holds it (dense cells left in a
        window are never empty then). Only the tail's ``tail_min`` can be
        stale (a run promoted out of the tail), so that case is gathered."""
        if w.full and self._lay.offset_of(w.full[0][w.pos]) == off:
            return True
        keys = w.dense_keys
        return bool(keys) and keys[0] >> 32 == off

    def _front_offset(self, w: Window) -> int:
        if not w.opened or w.tail_size() > max(SEGMENT, w.sorted_left() >> 5):
            self._sort(w)  # first time at the front, or a long unsorted tail
        best = w.tail_min
        if w.full:
            best = min(best, self._lay.offset_of(w.full[0][w.pos]))
        keys = w.dense_keys
        while keys and keys[0] not in w.dense:
            heapq.heappop(keys)
        return min(best, keys[0] >> 32) if keys else best

    def _sort(self, w: Window) -> None:
        """Sort the window's copies not taken yet across its segments, in C
        (the unsorted tail becomes the last segment). Runtime: O(w log w) in C."""
        self._reset_hot()  # the hot run's copies no longer sit at the tail
        if not w.opened and w.dense:  # opened: its dense cells' keys get their heap
            w.dense_keys = list(w.dense)
            heapq.heapify(w.dense_keys)
        w.opened = True
        tail = [*w.spill, w.packed] if w.packed else w.spill
        if tail:
            if w.full is NO_SEGMENTS:
                w.full = []
            w.full.extend(tail)
            w.packed, w.spill = NO_PACKED, NO_SEGMENTS
        w.tail_min = Window.NO_TAIL
        sort_across(w.parts())

    def _gather(self, w: Window, off: int, bucket: int) -> bool:
        """Move the sparse copies of bucket ``off`` into its dense cells and
        drop its ghost copies. Runtime: O(log w + k) for k copies from the
        sorted part; O(t) in C more when the unsorted tail of t has some.
        Returns whether the bucket holds a live copy."""
        lay, full = self._lay, w.full
        parts: list[array.array] = []  # packed values of this bucket
        while full and lay.offset_of(full[0][w.pos]) == off:
            seg = full[0]
            if lay.offset_of(seg[-1]) == off:  # the rest of the segment: drop it whole
                parts.append(seg[w.pos:] if w.pos else seg)
                del full[0]
                w.pos = 0
            else:
                j = bisect.bisect_left(seg, (off + 1) << lay.offset_shift, w.pos)
                parts.append(seg[w.pos:j])
                w.pos = j
                break
        if w.tail_min == off:
            parts.append(self._take_from_tail(w, off))
        if parts:
            self._reset_hot()
            for s, ids in self._by_slot(parts):
                cell = w.dense.get(off << 32 | s)
                self._set_cell(w, off, s, ids if cell is None else merge_into(cell, ids))
        if self._ghost_copies:
            return self._drop_ghosts(w, off, bucket)
        return bool(w.dense_keys) and w.dense_keys[0] >> 32 == off

    def _take_from_tail(self, w: Window, off: int) -> array.array:
        """Remove and return the tail's copies of bucket ``off``; update
        ``tail_min``. Runtime: O(t): a Python loop for a short tail (numpy's
        per-call cost would dominate), numpy for a long one."""
        lay, packed = self._lay, w.packed
        if not w.spill and len(packed) <= 64:
            got, keep, low = array.array("Q"), array.array("Q"), Window.NO_TAIL
            for v in packed:
                o = lay.offset_of(v)
                if o == off:
                    got.append(v)
                else:
                    keep.append(v)
                    low = min(low, o)
            w.packed = keep if keep else NO_PACKED
        else:  # compacted in place, into the tail's own arrays (new arrays per take fragmented the heap)
            got, rest, low = self._split_tail(w, off)
            arrays = [*w.spill, packed] if packed else list(w.spill)
            left, at = len(rest), 0
            for a in arrays:  # refill the arrays in order; the emptied ones at the end go
                k = min(len(a), left - at)
                if k > 0:  # through a view that dies with this statement (none is kept in a local)
                    np.frombuffer(a, dtype=np.uint64)[:k] = rest[at:at + k]
                at += k
            keep = []
            for a in arrays:
                if left <= 0:
                    break
                if len(a) > left:
                    try:
                        del a[left:]
                    except BufferError:  # someone else holds a view of it (a debugger's frame): copy
                        a = a[:left]
                keep.append(a)
                left -= len(a)
            w.packed = keep.pop() if keep else NO_PACKED
            w.spill = keep if keep else NO_SEGMENTS
        w.tail_min = low
        return got

    def _split_tail(self, w: Window, off: int) -> tuple[array.array, np.ndarray, int]:
        """The tail's copies of bucket ``off`` (a new array), the others (a
        copy, in order) and their smallest offset, changing nothing. Only
        copies leave this frame: a view of the tail's arrays kept past here
        (even in a frame's ``f_locals`` dict, which a profiler or debugger
        reading locals fills and keeps until the frame goes) would make the
        resize that follows raise ``BufferError``. Runtime: O(t) in C."""
        tail = np.concatenate(w.tail())  # a copy, even of one array; the views were a temporary
        offs = self._lay.offsets(tail)
        hit = offs == off
        rest = tail[~hit]
        low = int(offs[~hit].min()) if len(rest) else Window.NO_TAIL
        return u64_array(tail[hit]), rest, low

    def _by_slot(self, parts: list[array.array]) -> Iterator[tuple[int, BitMap]]:
        """Packed values of one bucket as ``(slot, bitmap of entry ids)``: a
        Python loop for a few values, numpy (no object per value) for many,
        one part at a time (temporaries of one part's size: a bucket's all at
        once, ~400 KB at 10,000 nacks/s and bits 10, grew the top of the C
        heap, which keeps what it grew to)."""
        smask = self._slot_limit - 1
        if sum(map(len, parts)) <= 64:
            small: dict[int, list[int]] = {}
            for part in parts:
                for v in part:
                    small.setdefault(v >> 32 & smask, []).append(v & M32)
            for s, entries in small.items():
                yield s, BitMap(entries)
            return
        by_slot: dict[int, BitMap] = {}
        for part in parts:
            if not part:
                continue
            vals = np.frombuffer(part, dtype=np.uint64)
            # a bucket's values share their top bits but for the slot
            if int(vals.min()) >> 32 == int(vals.max()) >> 32:
                groups = [(int(vals[0]) >> 32 & smask, vals)]
            else:
                slots = (vals >> np.uint64(32)) & np.uint64(smask)
                groups = [(s, vals[slots == s]) for s in distinct(slots).tolist()]
            for s, values in groups:
                got = by_slot.get(s)
                if got is None:
                    got = by_slot[s] = BitMap()
                got.update(u32_array(values))
            del vals, groups, values  # no view of a part outlives its turn
        yield from by_slot.items()

    def _drop_ghosts(self, w: Window, off: int, bucket: int) -> bool:
        """Drop the ghost copies of bucket ``off`` (all its copies are in dense
        cells by now); return whether a live copy is left."""
        cells = self._take_cells(w, off)
        for slot, cell in cells.items():
            ext = self._ext_at(slot)
            if ext is not None and ext.ghost is not None:
                for e in common(cell, ext.ghost):
                    key = (slot, e)
                    ghost = self._ghosts[key]
                    if ghost.is_live_in(bucket):
                        continue
                    cell.discard(e)
                    self._ghost_copies -= 1
                    ghost.count -= 1
                    if not ghost.count:
                        self._unghost(ext, key)
            if cell:
                self._set_cell(w, off, slot, cell)
            else:
                if self._hot_dense is cell:
                    self._reset_hot()
                if ext is not None and ext.cells is not None:
                    self._unlist(ext, cell)
                if (ext is None or ext.ghost is None) and not self._has_live(slot):
                    self._drop_ledger(slot)
                    continue
            self._tidy(slot)
        return bool(w.dense_keys) and w.dense_keys[0] >> 32 == off
