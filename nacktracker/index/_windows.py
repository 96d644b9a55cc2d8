"""The time order of :class:`~nacktracker.index.TimeBucketIndex`: its
windows by id and their order, and the window-level work at the front
(opening a window, taking a bucket's sparse copies out of its segments and
tail, grouping them by ledger slot), counts and bytes."""

from __future__ import annotations

import array
import bisect
import heapq
import math
import mmap
import sys
from typing import Any, Final, Iterator

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap

from . import layout
from .bitmaps import SCRATCH_MAP, bitmap_of, distinct, has, merge_into, sort_across, u32_array, u64_array
from .layout import (
    CELL_FIXED,
    CONTAINER_FIXED,
    M32,
    NO_CELLS,
    NO_KEYS,
    NO_PACKED,
    NO_SEGMENTS,
    PACKED,
    SCAN_PER_CELL,
    SCAN_SEGMENTS,
    Cell,
    Layout,
    U64Array,
    Window,
    dense_pays,
    held_size,
    roaring_bytes,
)

#: Windows with at most this many copies left (sparse plus dense cells) are
#: counted exactly by the count bounds: a constant cost per window.
SMALL_WINDOW = 64


class Windows:
    """Windows by id (``by_id``) and the id of the earliest (``first_id``, -1
    when there is none): the time order is one entry per window, not per
    bucket or per (bucket, ledger). A window's id is ``bucket >>
    window_shift``; an empty window leaves when it reaches the front.

    Why no ordered structure: an index holds a handful of windows (60 s of
    delays is four at 2^14 ms), and only the earliest is ever asked for.
    Keeping its id is O(1) per new window and O(W) when the front window
    leaves (once per window), and costs one slot. With four windows a heap
    of the ids cost 88 bytes more (the list and its items), and a sorted map
    (``sortedcontainers.SortedDict``, Java's AVL map) 1,649 bytes more
    (``python -m bench.lab.time_order``): at 10 nacks/s an index holds ~175-300
    pending messages at ~20-30 bytes each, so a ``SortedDict`` would add
    20-30% to its memory. Ordered iteration (snapshots, ``iter_bitmaps``)
    sorts the few ids instead.
    """

    __slots__ = ("lay", "by_id", "first_id")

    def __init__(self, lay: Layout) -> None:
        self.lay = lay
        self.by_id: dict[int, Window] = {}
        self.first_id = -1  # the smallest key of by_id (the same int object), -1 when empty

    def window(self, bucket: int) -> Window:
        """The window of a bucket time, made if new. Runtime: O(1)."""
        wid = bucket >> self.lay.window_shift
        w = self.by_id.get(wid)
        if w is None:
            w = self.by_id[wid] = Window()
            if self.first_id < 0 or wid < self.first_id:
                self.first_id = wid
        return w

    def first(self) -> tuple[int, Window] | None:
        """The earliest window (maybe empty), or None. Runtime: O(1)."""
        wid = self.first_id
        return None if wid < 0 else (wid, self.by_id[wid])

    def drop_first(self) -> None:
        """The earliest window, empty, leaves. Runtime: O(W) for the W windows left."""
        del self.by_id[self.first_id]
        self.first_id = min(self.by_id) if self.by_id else -1

    def in_order(self) -> Iterator[tuple[int, Window]]:
        """``(id, window)`` in time order. Runtime: O(W log W)."""
        for wid in sorted(self.by_id):
            yield wid, self.by_id[wid]

    # -- a window's look for cells that pay as bitmaps ---------------------------------

    def scan(self, w: Window, listed: list[int]) -> tuple[list[int], list[int], array.array[int]]:
        """Take out of a window not yet open the sparse copies of the cells
        that pay as bitmaps: those with a dense cell already, and those
        whose copies cost more packed than as a bitmap (:func:`dense_pays`).
        Returns ``(keys, ends, entries)``: the cells' ``offset << 32 |
        slot`` keys, in order, and their entry ids, sorted, each cell's
        ending at ``ends[i]`` in ``entries``. The copies left are written back sorted
        into the window's own segments (the emptied ones go); ``scan_at`` is
        set for the next look. The cells keyed in ``listed`` (listed cells:
        they hold live copies only, and a sparse copy may be of an id acked
        since) keep their sparse copies, to be gathered with their bucket. Runtime: O(w log w) in C for the window's w
        sparse copies."""
        assert not w.opened
        lay = self.lay
        parts = w.parts()
        if not w.dense and parts:  # no bitmap yet: can any cell pay? A bound first, in O(w) (no sort)
            fullest = np.array([_fullest_bound(parts)])
            one = np.ones(1, dtype=np.intp)
            if not dense_pays(fullest, one)[0]:  # none can: look again once the window has grown enough
                del parts
                segments = len(w.full)
                w.scan_at = max(segments + SCAN_SEGMENTS, math.ceil(segments * _growth_needed(fullest, one)))
                return [], [], array.array("I")
        # Temporaries of the window's size would raise glibc's mmap threshold for good, and the heap
        # would then keep free what later ones leave: the copies sort in a scratch map (given back
        # whole), and what follows reads them through views, with temporaries of a byte per copy.
        vals = scratch_u64(sum(map(len, parts)))
        if parts:
            np.concatenate(parts, out=vals)
        del parts
        vals.sort()
        n = len(vals)
        top = _high32(vals)  # offset | slot: a cell (a view)
        edge = _edges(top)
        starts = np.flatnonzero(edge)
        copies = np.diff(starts, append=n)
        # containers: distinct high 16 bits of the entry ids of a cell, counted per cell
        edge |= _edges(_bits_16_31(vals))
        containers = np.add.reduceat(edge, starts, dtype=np.intp) if n else np.zeros(0, dtype=np.intp)
        del edge
        tops = top[starts].astype(np.uint64)
        del top
        cut = np.uint64(32 - lay.offset_bits)
        keys = (tops >> cut) << np.uint64(32) | (tops & np.uint64(lay.slot_limit - 1))
        move = dense_pays(copies, containers)
        if w.dense:  # a cell that is a bitmap already takes its copies whatever their number
            move |= _member(keys, np.fromiter(w.dense, dtype=np.uint64, count=len(w.dense)))
        if listed:
            move &= ~_member(keys, np.asarray(listed, dtype=np.uint64))
        if not move.any():
            out: tuple[list[int], list[int], array.array[int]] = ([], [], array.array("I"))
        else:
            taken = np.repeat(move, copies)
            out = (keys[move].tolist(), np.cumsum(copies[move]).tolist(), u32_array(_low32(vals)[taken]))
            np.logical_not(taken, out=taken)
            self._refill(w, vals[:_compact(vals, taken)])
            del taken
        segments = len(w.full)
        cells = len(w.dense) + len(out[0])  # bitmaps after this look (at most)
        if cells:  # the next look merges the copies of the bitmaps' cells
            w.scan_at = segments + max(SCAN_SEGMENTS, segments, -(-SCAN_PER_CELL * cells // layout.SEGMENT))
        else:  # none pays yet: look again once the window has grown enough for its fullest cell to pay
            w.scan_at = max(segments + SCAN_SEGMENTS, math.ceil(segments * _growth_needed(copies, containers)))
        del vals
        return out

    @staticmethod
    def _refill(w: Window, kept: U64Array) -> None:
        """Write ``kept`` into the window's segments in order, in place (new
        arrays per look fragmented the heap); the segments left empty go, and
        appends start a new array."""
        arrays = [*w.full, w.packed] if w.packed else list(w.full)
        left, at = len(kept), 0
        full: list[array.array[int]] = []
        for a in arrays:
            k = min(len(a), left - at)
            if k <= 0:
                break
            np.frombuffer(a, dtype=np.uint64)[:k] = kept[at:at + k]  # a view that dies with this statement
            if len(a) > k:
                try:
                    del a[k:]
                except BufferError:  # someone else holds a view of it (a debugger's frame): copy
                    a = a[:k]
            full.append(a)
            at += k
        w.full = full if full else NO_SEGMENTS
        w.packed = NO_PACKED

    # -- the front window -------------------------------------------------------

    @staticmethod
    def needs_sort(w: Window) -> bool:
        """First time at the front, or a long unsorted tail."""
        return not w.opened or w.tail_size() > max(layout.SEGMENT, w.sorted_left() >> 5)

    def front_offset(self, w: Window) -> int:
        """The earliest offset holding a copy in an opened window (sparse or dense)."""
        best = w.tail_min
        if w.full:
            best = min(best, self.lay.offset_of(w.full[0][w.pos]))
        cells = w.first_cell_offset()
        return best if cells is None else min(best, cells)

    def surely_live(self, w: Window, off: int) -> bool:
        """With no ghost copy anywhere, whether bucket ``off`` (the window's
        earliest) holds a live copy without gathering it: the sorted part
        starts with it or a dense cell holds it (dense cells left in a
        window are never empty then). Only the tail's ``tail_min`` can be
        stale (a run promoted out of the tail), so that case is gathered."""
        if w.full and self.lay.offset_of(w.full[0][w.pos]) == off:
            return True
        keys = w.dense_keys
        return bool(keys) and keys[0] >> 32 == off

    @staticmethod
    def sort(w: Window) -> None:
        """Sort the window's copies not taken yet across its segments, in C
        (the unsorted tail becomes the last segment); the window is open from
        now on. Runtime: O(w log w) in C."""
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

    def take_sparse(self, w: Window, off: int) -> list[array.array[int]]:
        """Remove and return the sparse copies of bucket ``off`` (packed).
        Runtime: O(log w + k) for k copies from the sorted part; O(t) in C
        more when the unsorted tail of t has some."""
        lay, full = self.lay, w.full
        parts: list[array.array[int]] = []  # packed values of this bucket
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
        return parts

    def _take_from_tail(self, w: Window, off: int) -> array.array[int]:
        """Remove and return the tail's copies of bucket ``off``; update
        ``tail_min``. Runtime: O(t): a Python loop for a short tail (numpy's
        per-call cost would dominate), numpy for a long one."""
        lay, packed = self.lay, w.packed
        if not w.spill and len(packed) <= 64:
            got, keep, low = array.array(PACKED), array.array(PACKED), Window.NO_TAIL
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
            kept: list[array.array[int]] = []
            for a in arrays:
                if left <= 0:
                    break
                if len(a) > left:
                    try:
                        del a[left:]
                    except BufferError:  # someone else holds a view of it (a debugger's frame): copy
                        a = a[:left]
                kept.append(a)
                left -= len(a)
            w.packed = kept.pop() if kept else NO_PACKED
            w.spill = kept if kept else NO_SEGMENTS
        w.tail_min = low
        return got

    def _split_tail(self, w: Window, off: int) -> tuple[array.array[int], U64Array, int]:
        """The tail's copies of bucket ``off`` (a new array), the others (a
        copy, in order) and their smallest offset, changing nothing. Only
        copies leave this frame: a view of the tail's arrays kept past here
        (even in a frame's ``f_locals`` dict, which a profiler or debugger
        reading locals fills and keeps until the frame goes) would make the
        resize that follows raise ``BufferError``. Runtime: O(t) in C."""
        tail = np.concatenate(w.tail())  # a copy, even of one array; the views were a temporary
        offs = self.lay.offsets(tail)
        hit = offs == off
        rest = tail[~hit]
        low = int(offs[~hit].min()) if len(rest) else Window.NO_TAIL
        return u64_array(tail[hit]), rest, low

    def by_slot(self, parts: list[array.array[int]]) -> Iterator[tuple[int, BitMap]]:
        """Packed values of one bucket as ``(slot, bitmap of entry ids)``: a
        Python loop for a few values, numpy (no object per value) for many,
        one part at a time (temporaries of one part's size: a bucket's all at
        once, ~400 KB at 10,000 nacks/s and bits 10, grew the top of the C
        heap, which keeps what it grew to)."""
        smask = self.lay.slot_limit - 1
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

    def holds(self, slot: int, entry_id: int, bucket: int) -> bool:
        """Whether cell ``(bucket, slot)`` physically holds a copy of the id."""
        lay = self.lay
        w = self.by_id.get(bucket >> lay.window_shift)
        if w is None:
            return False
        off = (bucket >> lay.bits) & lay.offset_mask
        cell = w.dense.get(off << 32 | slot)
        if cell is not None and has(cell, entry_id):
            return True
        if entry_id >> 32 or slot >= lay.slot_limit or not (w.packed or w.full or w.spill):
            return False
        v = (off << (lay.offset_shift - 32) | slot) << 32 | entry_id
        if w.opened and w.full:  # the sorted segments: the one that could hold it
            i = bisect.bisect_left(w.full, v, key=_last)
            if i < len(w.full):
                seg = w.full[i]
                j = bisect.bisect_left(seg, v, w.pos if i == 0 else 0)
                if j < len(seg) and seg[j] == v:
                    return True
            return any(bool((part == np.uint64(v)).any()) for part in w.tail())
        return any(bool((part == np.uint64(v)).any()) for part in w.parts())

    # -- counts -------------------------------------------------------------------

    def cells_of(self, w: Window, buckets_only: bool) -> set[int]:
        """The window's distinct offsets (or ``offset << 32 | slot`` cells)."""
        lay = self.lay
        view = w.values()
        if buckets_only:
            found = set(distinct(lay.offsets(view)).tolist()) if len(view) else set()
            return found | {key >> 32 for key in w.dense}
        top = distinct(view >> np.uint64(32)).tolist() if len(view) else []  # offset | slot
        cut, smask = 32 - lay.offset_bits, lay.slot_limit - 1
        return {(t >> cut) << 32 | (t & smask) for t in top} | set(w.dense)

    def count(self, buckets_only: bool) -> int:
        """Distinct buckets (or cells) pending, ghost copies included. Runtime: O(n log n) in C."""
        return sum(len(self.cells_of(w, buckets_only)) for w in self.by_id.values())

    def count_bound(self, cap: int, buckets_only: bool) -> int:
        """An upper bound on :meth:`count`: a window with at most
        :data:`SMALL_WINDOW` copies left counted exactly, a larger one as the
        fewer of its copies and ``cap``. Runtime: O(windows)."""
        total = 0
        for w in self.by_id.values():
            n = w.size() + len(w.dense)
            total += len(self.cells_of(w, buckets_only)) if n <= SMALL_WINDOW else min(n, cap)
        return total

    def cells_in(self, w: Window) -> dict[tuple[int, int], Cell]:
        """Fresh bitmaps of every copy in the window by ``(offset, slot)``,
        ghost copies included. Runtime: O(w log w)."""
        lay = self.lay
        cells: dict[tuple[int, int], Cell] = {}
        for key, cell in w.dense.items():
            cells[key >> 32, key & M32] = type(cell)(cell)
        view = w.values()
        if len(view):
            offs = lay.offsets(view)
            slots = (view >> np.uint64(32)) & np.uint64(lay.slot_limit - 1)
            order = np.lexsort((slots, offs))
            keys = np.stack((offs[order], slots[order]), axis=1)
            cut = np.flatnonzero((keys[1:] != keys[:-1]).any(axis=1)) + 1
            entries = (view & np.uint64(M32))[order]
            for lo, hi in zip([0, *cut.tolist()], [*cut.tolist(), len(order)]):
                at = (int(keys[lo, 0]), int(keys[lo, 1]))
                ids = bitmap_of(entries[lo:hi])
                cells[at] = ids if at not in cells else merge_into(cells[at], ids)
        del view
        return cells

    def nbytes(self) -> int:
        """Bytes of the time order and the windows: objects, ids, segments,
        dense cells (CRoaring's heap included). Runtime: O(windows + cells)."""
        size = held_size
        total = size(self) + layout.time_order_bytes(self.by_id)
        for wid, w in self.by_id.items():
            total += size(wid) + size(w) + (size(w.packed) if w.packed is not NO_PACKED else 0)
            for segments in (w.full, w.spill):
                if segments is not NO_SEGMENTS:
                    total += size(segments) + sum(map(size, segments))
            if w.dense_keys is not NO_KEYS:
                total += size(w.dense_keys)
            if w.dense is not NO_CELLS:
                total += size(w.dense) + sum(map(size, w.dense))
                total += sum(map(roaring_bytes, w.dense.values()))
        return total


def _growth_needed(copies: npt.NDArray[np.intp], containers: npt.NDArray[np.intp]) -> float:
    """By how much a window's sparse copies must grow (at least 2x, at most
    64x) before its most promising cell pays as a bitmap, its cells growing
    with the window: at bits 0 on sparse traffic a window looks twice, not
    once per doubling (each look sorts the window; those temporaries also
    grew the C heap)."""
    if not len(copies):
        return 2.0
    need = (CELL_FIXED + CONTAINER_FIXED * containers) / 6  # the copies at the crossover (dense_pays)
    return min(64.0, max(2.0, float((need / copies).min())))


#: Bins of a look's first, cheap bound on its fullest cell (:func:`_fullest_bound`): 4,096 counts, 32 KB.
BOUND_BITS: Final = 12
#: Segments per step of that bound: 8 of 256 copies, temporaries of 16 KB.
BOUND_PARTS: Final = 8
#: Fibonacci hashing's multiplier (2^64 / the golden ratio): a cell key times it, its top bits, spread keys over the bins.
_SPREAD = np.uint64(0x9E3779B97F4A7C15)


def _fullest_bound(parts: list[U64Array]) -> int:
    """An upper bound on the sparse copies of the fullest cell among packed
    values in any order: the cells hashed into 2^BOUND_BITS bins, whose
    counts collisions only raise. On sparse traffic (bits 0: a window spans
    16,384 buckets) no cell comes near paying, and this spares the look its
    sort. A few segments at a time: temporaries of a window's size (above
    glibc's mmap threshold) raise that threshold for good, and the heap then
    keeps free what later ones leave (the grid's RSS over ``nbytes()``).
    Runtime: O(w) in C."""
    counts = np.zeros(1 << BOUND_BITS, dtype=np.int64)
    for i in range(0, len(parts), BOUND_PARTS):
        cells = np.concatenate(parts[i:i + BOUND_PARTS]) >> np.uint64(32)
        cells *= _SPREAD  # wraps modulo 2^64, as hashing wants
        cells >>= np.uint64(64 - BOUND_BITS)
        counts += np.bincount(cells.view(np.int64), minlength=1 << BOUND_BITS)
        del cells
    return int(counts.max())


def scratch_u64(n: int) -> U64Array:
    """An uninitialised uint64 array of ``n``: in a memory map of its own from
    ``SCRATCH_MAP`` bytes (unmapped when its last view goes), else from the heap."""
    if 8 * n >= SCRATCH_MAP:
        return np.frombuffer(mmap.mmap(-1, 8 * n), dtype=np.uint64)
    return np.empty(n, dtype=np.uint64)


def _high32(vals: U64Array) -> npt.NDArray[np.uint32]:
    """The high 32 bits of each value, a strided view where the machine is little-endian."""
    if sys.byteorder == "little":
        return vals.view(np.uint32)[1::2]
    return (vals >> np.uint64(32)).astype(np.uint32)


def _low32(vals: U64Array) -> npt.NDArray[np.uint32]:
    """The low 32 bits of each value (an entry id), a strided view where the machine is little-endian."""
    if sys.byteorder == "little":
        return vals.view(np.uint32)[0::2]
    return (vals & np.uint64(M32)).astype(np.uint32)


def _bits_16_31(vals: U64Array) -> npt.NDArray[np.uint16]:
    """Bits 16-31 of each value (an entry id's Roaring container), a strided view where the machine is little-endian."""
    if sys.byteorder == "little":
        return vals.view(np.uint16)[1::4]
    return ((vals >> np.uint64(16)) & np.uint64(0xFFFF)).astype(np.uint16)


def _edges(values: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.bool_]:
    """Where each run of equal values starts in a sorted array (True there)."""
    edge = np.empty(len(values), dtype=bool)
    if len(values):
        edge[0] = True
        np.not_equal(values[1:], values[:-1], out=edge[1:])
    return edge


#: Values per step of :func:`_compact` (temporaries of 32 KB).
COMPACT_STEP: Final = 4096


def _compact(vals: U64Array, keep: npt.NDArray[np.bool_]) -> int:
    """Move the values to keep to the front, in order, in place; return how
    many. A step at a time (writing never passes reading), so no temporary
    of the array's size."""
    at = 0
    for i in range(0, len(vals), COMPACT_STEP):
        part = vals[i:i + COMPACT_STEP][keep[i:i + COMPACT_STEP]]
        vals[at:at + len(part)] = part
        at += len(part)
    return at


def _member(values: U64Array, known: U64Array) -> npt.NDArray[np.bool_]:
    """Whether each value is one of ``known`` (``np.isin`` without its hashing and imports)."""
    if not len(values) or not len(known):
        return np.zeros(len(values), dtype=bool)
    known = np.sort(known)
    out: npt.NDArray[np.bool_] = known[np.minimum(np.searchsorted(known, values), len(known) - 1)] == values
    return out


def _run_starts(values: U64Array) -> npt.NDArray[np.intp]:
    """Where each run of equal values starts in a sorted array."""
    if not len(values):
        return np.zeros(0, dtype=np.intp)
    edge = np.empty(len(values), dtype=bool)
    edge[0] = True
    np.not_equal(values[1:], values[:-1], out=edge[1:])
    return np.flatnonzero(edge)


def _last(segment: array.array[int]) -> int:
    return segment[-1]
