"""TimeBucketIndex: PIP-393's trimmed due time -> ledger -> entry ids, laid
out to stay small on real client traffic (sparse cells) and on seed 000's
dense bursts alike (:mod:`.layout`). Three components own its state:

* :class:`~._ledgers.Ledgers`: ledger id <-> slot, and each ledger's rare
  state (listed cells, 64-bit ids, ids pending twice, ghosts);
* :class:`~._live.LiveIds`: "pending anywhere", an index-wide bitmap of
  ``slot << 22 | entry`` (32-bit; ``slot << 32 | entry`` in a ``BitMap64``
  once an id needs it), plus, per ledger, up to ``LISTED`` (8) *listed*
  dense cells whose ids are not in it (a burst into one cell, seed 000's
  case, is stored once): an ack of a message that is not pending is one
  bitmap lookup plus at most 8 (none for an id above the ledger's listed
  ids), and an ack of a pending one takes it out of the listed cells and
  marks its other copies as ghosts that are dropped when their bucket is
  taken (no search);
* :class:`~._windows.Windows`: windows of ``2^max(bits + 3, 14)`` ms by id,
  in time order (one heap entry per window, not per bucket or per (bucket,
  ledger)); inside a window, sparse copies packed 8 bytes each in
  8-byte ``array`` segments of 256 (sorted across them in C when the window
  comes to the front, dropped whole as its buckets are taken), and dense
  cells (one Roaring bitmap per (bucket, ledger)) for runs of adds to one
  cell, and for the cells a look over a window's sparse copies finds
  cheaper as bitmaps (many ids of one ledger in one bucket, in any order:
  coarse precision; ``layout.dense_pays``), so bytes follow the pending
  set's information: 8 bytes per sparse id, ~2 or less per dense one. A
  look first bounds its fullest cell's copies without sorting, and skips
  the sort when none can pay.

The index composes them: ``add`` runs inline with local references (its
common paths touch the components' containers directly), and the
operations that span components (placing a copy, taking a bucket, an ack)
are its methods.
"""

from __future__ import annotations

import array
import sys
from typing import Any, Final, Iterable, Iterator, cast

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap, BitMap64

from .._checks import MAX_DUE, check_int, entry_array, message_id
from ..precision import Precision
from . import layout
from ._ledgers import Ledgers
from ._live import LiveIds, in_listed, listed_cells
from ._windows import Windows
from .bitmaps import common, distinct, merge_into, overlaps, u32_array, u64_array
from .layout import (
    COUNTER_INTS,
    LISTING,
    LIVE_ENTRY_BITS,
    LIVE_SLOT_BITS,
    M32,
    NO_CELLS,
    NO_PACKED,
    NO_WINDOW,
    PACKED,
    PROMOTE,
    WIDE_LIVE_SHIFT,
    Cell,
    Layout,
    LedgerExt,
    Window,
    held_size,
)

__all__ = ["TimeBucketIndex"]
#: The largest entry id and ledger slot the narrow live bitmap keys (``slot << 22 | entry``).
NARROW_ENTRY_MAX: Final = (1 << LIVE_ENTRY_BITS) - 1
NARROW_SLOT_MAX: Final = (1 << LIVE_SLOT_BITS) - 1
#: ``add`` stages its arguments (three list items an add) and stores them once this many items are
#: staged, or when any other method is called (``_fold``): a batch of 1,024 adds.
STAGED = 3 * 1024
#: Fewer staged adds than this are stored one by one (a batch's numpy and bitmap calls cost ~50 us).
#: Read as a module global at each fold, so a test can set it to 1 (every fold tries the bulk path).
BULK_MIN = 64


def extend_as_appends(a: array.array[int], values: npt.NDArray[Any]) -> None:
    """Extend an 8-byte array by ``values`` leaving it the capacity appends of
    one value at a time leave. CPython grows an array past its capacity to
    ``n + n // 16 + 7`` (``+ 3`` while it held fewer than 8), so one extend
    grows it once, to a capacity of its own (up to ~4% more bytes per sparse
    copy on the bulk path): only the last growth an append would make
    decides the capacity, so the values go in three steps at most: up to 8
    items one by one, up to that last growth point, the rest.
    Runtime: O(k) in C, O(1) Python steps (at most 10)."""
    data = values.view(np.uint8)
    n, end, at = len(a), len(a) + len(values), 0
    while n < 8 and n < end:  # the small growths read the size before: one value at a time
        a.frombytes(data[at:at + 8])  # type: ignore[arg-type]  # numpy arrays are buffers
        at, n = at + 8, n + 1
    if n == end:
        return
    cap = (sys.getsizeof(a) - _EMPTY_ARRAY) // 8
    grow = 0  # the size at which appends would grow the array the last time, if they would
    while cap < end:
        grow = cap + 1
        cap = grow + (grow >> 4) + 7
    if grow:
        a.frombytes(data[at:(grow - n) * 8 + at])  # type: ignore[arg-type]
        at += (grow - n) * 8
    a.frombytes(data[at:])  # type: ignore[arg-type]


_EMPTY_ARRAY: Final = sys.getsizeof(array.array(PACKED))


def _checked(ledger_id: object, entry_id: object, due_ms: object) -> tuple[int, int, int]:
    """``add``'s arguments checked (a clear error for anything but ints in range)."""
    return check_int("ledger_id", ledger_id), check_int("entry_id", entry_id), check_int("due_ms", due_ms, MAX_DUE)


class TimeBucketIndex:
    """Pending nacks by bucket time, ledger and entry id.

    The bucket of a due time is the time with its low ``precision_bits``
    cleared (``rounding="floor"``, Pulsar's ``negativeAckPrecisionBitCnt``: up
    to 2^bits-1 ms early, never late) or rounded up to the next multiple
    (``"ceil"``: never early, up to 2^bits-1 ms late). A message is stored once
    per bucket; ``discard`` removes every occurrence; ``pop_due`` returns
    ``(ledger, entry)`` in ``(bucket, ledger, entry)`` order. Memory: about
    10 bytes per sparse pending message, ~2-3 where many ids of a ledger
    share a bucket (Java's PIP-393 tracker's own workload at its default
    8 bits: 2.6 bytes per nack at 1M pending), a fraction of a byte for
    dense runs.

    >>> idx = TimeBucketIndex(precision_bits=0)
    >>> idx.add(7, 1, due_ms=100); idx.add(7, 2, due_ms=100); idx.add(3, 9, due_ms=50)
    >>> idx.next_due_ms(), len(idx)
    (50, 3)
    >>> idx.pop_due(100)
    [(3, 9), (7, 1), (7, 2)]
    """

    __slots__ = ("precision", "precision_bits", "_add", "_mask", "_lay", "_wshift", "_cshift", "_omask", "_slot_limit",
                 "_ledgers", "_ids", "_time", "_windows", "_by_id", "_count", "_stage",
                 "_hot_bucket", "_hot_slot", "_hot_lid", "_hot_win", "_hot_off", "_hot_dense", "_hot_start", "_hot_listed")

    def __init__(self, precision_bits: int = 8, rounding: str = "floor") -> None:
        # add() inlines Precision.bucket with these (no call on its hottest path)
        precision = self.precision = Precision.of(precision_bits, rounding)
        self._add, self._mask = precision.add, precision.mask
        self.precision_bits: int = precision.bits
        lay = self._lay = Layout.for_bits(precision.bits)
        # the layout's ints, copied for add() (shared objects: see Layout.for_bits)
        self._wshift, self._slot_limit = lay.window_shift, lay.slot_limit
        # a copy packs as (offset << _cshift | slot) << 32 | entry: two small-int ops, then the 64-bit ones
        self._cshift = lay.offset_shift - 32
        self._omask = lay.offset_mask
        self._ledgers = Ledgers()
        self._ids = LiveIds(self._ledgers)
        self._time = Windows(lay)
        # add()'s local references to containers its components own and never replace
        self._windows: dict[int, Window] = self._time.by_id
        self._by_id: dict[int, int] = self._ledgers.by_id
        self._count = 0  # live occurrences
        self._stage: list[int] = []  # staged adds, flat (ledger, entry, due) triples: see add()
        # the fast path: the cell the last add went to (bucket, slot, ledger id, window, offset), its
        # bitmap if dense and whether its ledger lists it, and where its run of adds started
        self._hot_bucket, self._hot_slot, self._hot_lid, self._hot_off = -1, -1, -1, -1
        self._hot_win: Window = NO_WINDOW
        self._hot_dense: Cell | None = None
        self._hot_start, self._hot_listed = 0, False

    def bucket_of(self, due_ms: int) -> int:
        """The bucket time a due time maps to. Runtime complexity: O(1)."""
        return self.precision.bucket(check_int("due_ms", due_ms, MAX_DUE))

    def add(self, ledger_id: int, entry_id: int, due_ms: int) -> None:
        """Track ``(ledger_id, entry_id)`` as due at ``due_ms`` (monotonic ms).

        Ids are ints in ``[0, 2^63)``, ``due_ms`` in ``[0, 2^62)``; anything
        else raises ``TypeError``/``ValueError`` and changes nothing.

        The add is staged: its arguments join a short list that every other
        method first stores (:meth:`_fold`), in order, as one-by-one adds
        would have: a batch of new ids of plain ledgers in a few numpy and
        bitmap calls, anything else one by one. So nothing an add does is
        ever seen late, and no operation sees a different index.

        Runtime complexity: O(1) amortised: an append here, and in the fold
        O(1) amortised per add: an append of its copy, or a bitmap add for
        a cell in a run (or a listed cell), after one bitmap lookup (plus at
        most ``LISTED`` for an id not above its ledger's listed cells). A
        message already pending: see ``_add_again``; the live bitmap's
        one-time re-keying: ``layout.LIVE_ENTRY_BITS``.
        """
        if (type(ledger_id) is not int or type(entry_id) is not int or type(due_ms) is not int
                or (ledger_id | entry_id) >> 63 or due_ms >> 62):  # negative or too large
            ledger_id, entry_id, due_ms = _checked(ledger_id, entry_id, due_ms)
        stage = self._stage
        stage += (ledger_id, entry_id, due_ms)  # one flat list: the cheapest append, one C call to read back
        if len(stage) >= STAGED:
            self._fold()

    def _fold(self) -> None:
        """Store the staged adds, in order (every method but :meth:`add` and
        :meth:`bucket_of` calls it first), leaving exactly what one-by-one
        adds leave (:meth:`_add_one`): the same copies in the same arrays,
        the same looks, the same fast-path cell. Fewer than ``BULK_MIN``
        adds go one by one; a batch tries :meth:`_add_bulk` (once), and a
        run of adds into the fast path's listed dense cell takes
        :meth:`_add_listed_run`; whatever neither takes goes one by one.
        Runtime: O(k) for k staged adds: in C for the bulk steps, plus
        O(ledgers + windows + segments) Python steps."""
        stage = self._stage
        self._stage = []
        n = len(stage) // 3
        add = self._add_one
        if n < BULK_MIN:
            it = iter(stage)
            for ledger_id, entry_id, due_ms in zip(it, it, it):
                add(ledger_id, entry_id, due_ms)
            return
        # one C loop to int64, one copy to three contiguous columns (numpy on strided views is slower)
        lids, entries, dues = np.frombuffer(array.array("q", stage), dtype=np.int64).reshape(-1, 3).T.copy()
        buckets = (dues + self._add) & self._mask
        i, bulk = 0, True
        while i < n:
            if self._hot_dense is not None:  # a dense cell: a run into it if listed, else _add_one leaves it
                if self._hot_listed:
                    k = self._add_listed_run(lids, entries, buckets, i)
                    if k:
                        i += k
                        continue
                add(stage[3 * i], stage[3 * i + 1], stage[3 * i + 2])
                i += 1
                continue
            if bulk and n - i >= BULK_MIN:
                if self._add_bulk(stage, 3 * i, lids[i:], entries[i:], buckets[i:]):
                    return
                bulk = False  # not tried again in this batch: a try costs about what storing it does
            while i < n and self._hot_dense is None:
                add(stage[3 * i], stage[3 * i + 1], stage[3 * i + 2])
                i += 1

    def _add_listed_run(self, lids: npt.NDArray[np.int64], entries: npt.NDArray[np.int64],
                        buckets: npt.NDArray[np.int64], i: int) -> int:
        """The staged adds from ``i`` on that fall into the fast path's cell, a
        listed dense cell (a burst, seed 000's case), stored at once if each
        would take ``add``'s listed step (a narrow id new to the index and to
        the run, a ledger without ghosts): into the cell, its ledger's
        ``hi`` following. Returns how many (0: none stored, one by one then).
        Runtime: O(k) in C, plus O(LISTED) bitmap calls."""
        lid, bucket, slot = self._hot_lid, self._hot_bucket, self._hot_slot
        other = np.flatnonzero((lids[i:] != lid) | (buckets[i:] != bucket))
        k = int(other[0]) if len(other) else len(lids) - i
        if k < 2:
            return 0
        run = entries[i:i + k]
        ext = self._ledgers.ext[slot]
        ids = self._ids
        if ext is None or ext.ghost is not None or ext.cells is None or slot > NARROW_SLOT_MAX or int(run.max()) > NARROW_ENTRY_MAX:
            return 0
        fresh = BitMap()
        fresh.update(u32_array(run))
        if len(fresh) != k or any(overlaps(fresh, c) for c in listed_cells(ext)):
            return 0  # an id twice, or pending in a listed cell already
        keyed = fresh.shift(slot << ids.shift) if ids.shift == LIVE_ENTRY_BITS else ids.keyed(slot, fresh)
        if keyed.intersect(ids.bits):  # type: ignore[arg-type]
            return 0  # pending elsewhere
        cell = cast(Cell, self._hot_dense)
        cell.update(u32_array(run) if type(cell) is BitMap else u64_array(run))
        top = int(run.max())
        if top > ext.hi:
            ext.hi = top
        self._count += k
        return k

    def _add_bulk(self, stage: list[int], at: int, lids: npt.NDArray[np.int64], entries: npt.NDArray[np.int64],
                  buckets: npt.NDArray[np.int64]) -> bool:
        """The adds ``stage[at:]`` (flat triples; their ids and buckets as
        arrays) as a batch, if each would take ``add``'s common step or its
        fast step (an append to the cell the add before went to) without a
        run reaching ``PROMOTE``: ids new to the index and to the batch, of
        ledgers without rare state, narrow keys. False, having changed
        nothing, if one would not. Runtime: O(k) in C for k adds, plus O(1)
        Python steps per distinct ledger, window and segment filled."""
        if int(entries.max()) > NARROW_ENTRY_MAX:
            return False
        n = len(lids)
        # runs: an add into the cell of the add before it (the first: into the fast path's cell) is add's
        # fast step, an append to that cell's array with no new segment; a run of PROMOTE becomes a bitmap
        cont = np.empty(n, dtype=np.bool_)
        cont[0] = int(lids[0]) == self._hot_lid and int(buckets[0]) == self._hot_bucket
        np.logical_and(lids[1:] == lids[:-1], buckets[1:] == buckets[:-1], out=cont[1:])
        starts: npt.NDArray[np.intp] | None = None  # where runs start (None: every add)
        prior = len(self._hot_win.packed) - self._hot_start if cont[0] else 0  # the fast path's run so far
        if cont.any():
            starts = np.flatnonzero(~cont)
            lead = int(starts[0]) if len(starts) else n
            if prior + lead >= PROMOTE or (len(starts) and int(np.diff(starts, append=n).max()) >= PROMOTE):
                return False  # a run becomes a bitmap: one by one
        new: list[int] = []
        slots = self._bulk_slots(stage, at, lids, new)
        if slots is None:
            return False  # a wide key or a ledger with rare state: one by one
        ids = self._ids
        keys = slots << ids.shift | entries
        fresh: Cell = BitMap() if ids.shift == LIVE_ENTRY_BITS else BitMap64()
        fresh.update(u32_array(keys) if type(fresh) is BitMap else u64_array(keys))
        if len(fresh) != n or fresh.intersect(ids.bits):  # type: ignore[arg-type]
            return False  # an id twice in the batch, or pending already: one by one
        del fresh
        for lid in new:
            self._ledgers.slot(lid)
        ids.bits.update(u32_array(keys) if ids.shift == LIVE_ENTRY_BITS else u64_array(keys))
        self._count += n
        lay = self._lay
        offs = (buckets >> self.precision_bits) & self._omask
        packed = (offs.astype(np.uint64) << np.uint64(lay.offset_shift) | slots.astype(np.uint64) << np.uint64(32)
                  | entries.astype(np.uint64))
        wids = buckets >> self._wshift
        windows, segment = self._windows, layout.SEGMENT
        # the fast path's cell at the end: the last add's, its run started that many copies back
        last = int(wids[-1]), int(buckets[-1]), int(slots[-1]), int(offs[-1]), int(lids[-1])
        last_run = prior + n if starts is not None and not len(starts) else (n - int(starts[-1]) if starts is not None else 1)
        first = ~cont  # the adds that start a run (add's general step: a new segment when the array is full)
        low_wid, top_wid = int(wids.min()), int(wids.max())
        groups: list[tuple[int, npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]]]  # (window id, copies, offsets, run starts)
        if low_wid == top_wid:
            groups = [(low_wid, packed, offs, first)]
        elif top_wid - low_wid < 1 << 16:  # by window, in the batch's order within each (a radix sort)
            rel = (wids - low_wid).astype(np.uint16)
            order = np.argsort(rel, kind="stable")
            packed, offs, first = packed[order], offs[order], first[order]
            ends = np.cumsum(np.bincount(rel)).tolist()
            groups, start = [], 0
            for j, end in enumerate(ends):
                if end > start:
                    groups.append((low_wid + j, packed[start:end], offs[start:end], first[start:end]))
                start = end
        else:
            order = np.argsort(wids, kind="stable")
            cuts = np.flatnonzero(np.diff(wids[order])) + 1
            groups = [(int(wids[part[0]]), packed[part], offs[part], first[part]) for part in np.split(order, cuts)]
        for wid, vals, woffs, wfirst in groups:
            w = windows.get(wid)
            if w is None:  # a new window: _put's path (which counts the copy's churn)
                w = self._time.window(wid << self._wshift)
                ids.churn += 1
            if w.opened:
                low = int(woffs.min())
                if low < w.tail_min:
                    w.tail_min = low
            run_starts = None if starts is None else np.flatnonzero(wfirst)
            i, m = 0, len(vals)
            while i < m:
                copies = w.packed
                if wfirst[i] and (copies is NO_PACKED or len(copies) >= segment):
                    copies = self._segment_for(w)  # a new segment, and the window's look when due
                # up to the first run start that finds the array full (a run never straddles two segments)
                full_at = i + max(segment - len(copies), 1)
                if run_starts is None:
                    end = min(m, full_at)
                else:
                    k = int(np.searchsorted(run_starts, full_at))
                    end = int(run_starts[k]) if k < len(run_starts) else m
                extend_as_appends(copies, vals[i:end])
                i = end
        wid, self._hot_bucket, self._hot_slot, self._hot_off, self._hot_lid = last
        w = self._hot_win = windows[wid]
        self._hot_start = len(w.packed) - last_run
        return True

    def _bulk_slots(self, stage: list[int], at: int, lids: npt.NDArray[np.int64],
                    new: list[int]) -> npt.NDArray[np.int64] | None:
        """The ledger slot of each add of a bulk batch, or None if a ledger's
        adds cannot take the common step (a slot the narrow live key or a
        packed copy cannot hold, or rare state). New ledgers are appended to
        ``new`` in order of first appearance, with the slots one-by-one adds
        would hand them; the caller gives them those slots once the batch is
        sure to be stored (giving them earlier would change when the ledger
        table's lists grow). Runtime: O(k) in C, plus O(1) Python steps per
        distinct ledger."""
        ledgers, by_id = self._ledgers, self._by_id
        low, top = int(lids.min()), int(lids.max())
        if top - low < 1 << 16:  # ids close together (the tracker's slots): a table, no sort
            seen = np.zeros(top - low + 1, dtype=np.bool_)
            seen[lids - low] = True
            uniq = (np.flatnonzero(seen) + low).tolist()
        else:
            uniq = distinct(lids).tolist()
        known = by_id
        if any(lid not in by_id for lid in uniq):  # new ledgers: the slots Ledgers.slot will hand them, in order
            known = dict(by_id)
            free, fresh = list(ledgers.free), len(ledgers.lid)
            for lid in dict.fromkeys(stage[at::3]):
                if lid not in known:
                    new.append(lid)
                    if free:
                        known[lid] = free.pop()
                    else:
                        known[lid], fresh = fresh, fresh + 1
        exts, limit = ledgers.ext, min(NARROW_SLOT_MAX + 1, self._slot_limit)
        slot_of = [known[lid] for lid in uniq]
        for slot in slot_of:
            if slot >= limit or (exts and slot < len(exts) and exts[slot] is not None):
                return None
        if top - low < 1 << 16:
            table = np.zeros(top - low + 1, dtype=np.int64)
            table[np.asarray(uniq) - low] = slot_of
            return table[lids - low]
        return np.asarray(slot_of, dtype=np.int64)[np.searchsorted(np.asarray(uniq), lids)]

    def _add_one(self, ledger_id: int, entry_id: int, due_ms: int) -> None:
        """One staged add (checked already), stored. Runtime: see :meth:`add`."""
        bucket = (due_ms + self._add) & self._mask  # Precision.bucket, inlined
        # the common steps inline (a call costs about as much as the rest of an add); the rare ones are helpers
        ids = self._ids
        if ledger_id == self._hot_lid:
            slot = self._hot_slot
            if bucket == self._hot_bucket:  # a burst into the last cell
                exts = self._ledgers.ext
                ext = exts[slot] if exts else None
                if entry_id > NARROW_ENTRY_MAX or slot > NARROW_SLOT_MAX or (ext is not None and ext.ghost is not None):
                    key = self._wide_key(slot, entry_id, bucket, ext)
                    if key < 0:  # added again
                        return
                else:
                    key = slot << ids.shift | entry_id
                if self._hot_listed:  # a listed dense cell (so ext and the cell are set): the id is stored there only
                    if key in ids.bits or (entry_id <= ext.hi and in_listed(ext, entry_id)):  # type: ignore[union-attr, arg-type]
                        self._add_again(slot, entry_id, bucket)
                        return
                    self._hot_dense.add(entry_id)  # type: ignore[union-attr]
                    if entry_id > ext.hi:  # type: ignore[union-attr]
                        ext.hi = entry_id  # type: ignore[union-attr]
                    self._count += 1
                    return
                try:
                    ids.bits.add_checked(key)
                except KeyError:  # already pending somewhere
                    self._add_again(slot, entry_id, bucket)
                    return
                if ext is not None and ext.cells is not None and entry_id <= ext.hi and in_listed(ext, entry_id):
                    ids.bits.discard(key)  # pending in a listed cell
                    self._add_again(slot, entry_id, bucket)
                    return
                self._count += 1
                cell = self._hot_dense
                if cell is not None:
                    cell.add(entry_id)
                    return
                packed = self._hot_win.packed
                packed.append((self._hot_off << self._cshift | slot) << 32 | entry_id)
                if len(packed) - self._hot_start >= PROMOTE:
                    self._promote(self._hot_win)
                return
        else:
            try:  # a subscript, not .get(): no method call on the common path
                slot = self._by_id[ledger_id]
            except KeyError:
                slot = self._ledgers.slot(ledger_id)
        exts = self._ledgers.ext
        if entry_id > NARROW_ENTRY_MAX or slot > NARROW_SLOT_MAX or (exts and exts[slot] is not None):
            if not self._claim_rare(slot, entry_id, bucket):  # a wide key, or the ledger has rare state
                return  # stored already (or it was pending)
            rare = True
        else:
            try:
                ids.bits.add_checked(slot << ids.shift | entry_id)
            except KeyError:  # already pending somewhere
                self._add_again(slot, entry_id, bucket)
                return
            rare = False
        self._count += 1
        try:
            w = self._windows[bucket >> self._wshift]
        except KeyError:  # a new window
            self._put(slot, entry_id, bucket)
            return
        if self._hot_dense is not None:  # leaving a dense cell: _put compacts it
            self._put(slot, entry_id, bucket)
            return
        off = (bucket >> self.precision_bits) & self._omask
        if rare and w.dense and (off << 32 | slot) in w.dense:  # a listed cell (a look leaves it be): into it
            self._put(slot, entry_id, bucket)
            return
        # another cell of an existing window (interleaved traffic): a sparse copy, also where the cell is a
        # bitmap already: the next look or the gather merges them (a bitmap add here read add 1.62x DictIndex
        # against 1.13x, index_grid --one, uniform k=3 L=16 10,000/s bits 8)
        packed = w.packed
        n = len(packed)
        if n >= layout.SEGMENT or packed is NO_PACKED:
            packed, n = self._segment_for(w), len(w.packed)
        packed.append((off << self._cshift | slot) << 32 | entry_id)
        if w.opened and off < w.tail_min:  # an add into a window already open
            w.tail_min = off
        self._hot_start, self._hot_bucket, self._hot_slot = n, bucket, slot  # the fast path's cell now (as _make_hot)
        self._hot_lid, self._hot_win, self._hot_off = ledger_id, w, off

    def _wide_key(self, slot: int, entry_id: int, bucket: int, ext: LedgerExt | None) -> int:
        """The live bitmap's key of an id of the hot cell that the narrow
        key cannot hold (widening the live bitmap on the first one); -1 once
        it is added again instead (a 64-bit id, or its ledger has ghosts)."""
        if entry_id >> 32 or (ext is not None and ext.ghost is not None):
            self._add_again(slot, entry_id, bucket)
            return -1
        if self._ids.shift == LIVE_ENTRY_BITS:  # the first id the narrow live bitmap cannot key
            self._ids.widen()
        return slot << WIDE_LIVE_SHIFT | entry_id

    def _claim_rare(self, slot: int, entry_id: int, bucket: int) -> bool:
        """``add``'s "already pending?" step for an id the narrow live bitmap
        cannot key, or of a ledger with rare state (listed cells, ghosts, ids
        pending twice). False when it is done with the id (added again, or
        stored in the dense cells of a ledger past the slots a packed copy
        holds); True when the caller places its copy."""
        if not self._ids.claim_rare(slot, entry_id):
            self._add_again(slot, entry_id, bucket)
            return False
        if slot >= self._slot_limit:  # past the slots a packed copy holds: dense cells only (_put)
            self._count += 1
            self._put(slot, entry_id, bucket)
            return False
        return True

    def _segment_for(self, w: Window) -> array.array[int]:
        """The array a new sparse copy of ``w`` goes to: a new segment once
        the current one is full (and the window's look when it is due), a
        first one in place of the shared empty."""
        if w.packed is NO_PACKED:
            w.packed = array.array(PACKED)
            return w.packed
        packed = w.roll()
        if len(w.full) >= w.scan_at and not w.opened:
            self._scan(w)
            packed = w.packed = array.array(PACKED)
        return packed

    def add_many(self, ledger_id: int, entry_ids: Iterable[int], due_ms: int) -> None:
        """Track many entries of one ledger, all due at ``due_ms``.

        ``entry_ids``: ``array.array('I')`` or a numpy integer array (converted
        without a per-element Python loop), any integer ``array.array``, or any
        iterable of ints. Runtime complexity: O(k) in C for k ids none of which
        is pending; O(k) adds otherwise (and below 32 ids).
        """
        if self._stage:
            self._fold()
        if type(ledger_id) is not int or type(due_ms) is not int or ledger_id >> 63 or due_ms >> 62:
            ledger_id = check_int("ledger_id", ledger_id)
            due_ms = check_int("due_ms", due_ms, MAX_DUE)
        batch = entry_array(entry_ids)
        if len(batch) < PROMOTE:
            for e in batch:
                self._add_one(ledger_id, e, due_ms)
            return
        new: Cell = BitMap(batch) if batch.typecode == "I" else BitMap64(batch)
        slot = self._ledgers.slot(ledger_id)
        ext = self._ledgers.ext_at(slot)
        ids = self._ids
        if ids.shift == LIVE_ENTRY_BITS:  # ids below 2^32 the narrow live bitmap cannot key?
            narrow = type(new) is BitMap
            if (new.max() >> LIVE_ENTRY_BITS if narrow else new.range_cardinality(1 << LIVE_ENTRY_BITS, 1 << 32)) or (
                    slot >> LIVE_SLOT_BITS and (narrow or new.min() >> 32 == 0)):
                ids.widen()
        keyed = ids.keyed(slot, new)
        if keyed.intersect(ids.bits) or (ext is not None and (ext.ghost is not None or (  # type: ignore[arg-type]
                ext.wide is not None and type(new) is BitMap64 and new.intersect(ext.wide)) or (
                any(overlaps(new, c) for c in listed_cells(ext))))):
            for e in new:
                self._add_one(ledger_id, e, due_ms)
            return
        bucket = self.precision.bucket(due_ms)
        ids.bits |= keyed  # type: ignore[operator]
        if type(new) is BitMap64 and new.max() >> 32:
            ext = self._ledgers.ext_of(slot)
            ext.wide = merge_into(ext.wide or BitMap64(), BitMap64(e for e in new if e >> 32))  # type: ignore[assignment]
        n = len(new)
        ids.churn += n
        self._count += n
        w, off, cell = self._make_hot(slot, bucket)
        self._hot_dense = self._set_cell(w, off, slot, new if cell is None else merge_into(cell, new))
        if cell is None:
            self._hot_start = 0  # the new cell's size before this batch

    def discard(self, ledger_id: int, entry_id: int) -> bool:
        """Remove every pending occurrence of ``(ledger_id, entry_id)`` (an ack).

        Returns whether anything was pending. Runtime complexity: O(1): one
        bitmap lookup when the message is not pending, plus at most
        :data:`~.layout.LISTED` for an id not above its ledger's listed dense
        cells; when it is pending, it leaves the listed cells holding it and
        its other copies become ghosts (a small record each) dropped when
        their bucket is taken.
        """
        if self._stage:
            self._fold()
        if type(ledger_id) is not int or type(entry_id) is not int or (ledger_id | entry_id) >> 63:
            ledger_id = check_int("ledger_id", ledger_id)
            entry_id = check_int("entry_id", entry_id)
        slot = self._by_id.get(ledger_id)
        if slot is None:
            return False
        ledgers, ids = self._ledgers, self._ids
        exts = ledgers.ext  # ext_at() inlined: every acknowledge comes here
        ext = exts[slot] if exts else None
        if entry_id >> 32:
            in_bits = ext is not None and ext.wide is not None and entry_id in ext.wide
        elif ids.shift == LIVE_ENTRY_BITS and (entry_id >> LIVE_ENTRY_BITS or slot >> LIVE_SLOT_BITS):
            in_bits = False  # the narrow live bitmap cannot key it: it was never added
        else:
            in_bits = (slot << ids.shift | entry_id) in ids.bits
        taken = 0  # copies removed from listed cells (no ghost left for them)
        if ext is not None and ext.cells is not None and entry_id <= ext.hi:
            taken, emptied = ids.drop_listed_id(ext, entry_id)
            if self._hot_dense is not None and any(c is self._hot_dense for c in emptied):
                self._reset_hot()
        if not in_bits and not taken:
            return False
        n = ids.acked(slot, entry_id, in_bits, taken)
        self._count -= n
        if n == taken and (slot, entry_id) not in ids.ghosts and (ext is None or ext.ghost is None) and not ids.has_live(slot):
            self._drop_ledger(slot)  # its only copies were in listed cells, now gone
            return True
        ledgers.tidy(slot)
        return True

    def pop_due_bitmaps(self, now_ms: int) -> list[tuple[int, int, Cell]]:
        """Remove everything due at ``now_ms``; return ``(bucket_ms, ledger_id,
        bitmap)`` triples in ``(bucket, ledger)`` order.

        The bulk form of :meth:`pop_due`: no Python object per message.
        Runtime complexity: O(w log w) in C per window reached (one sort
        across its segments the first time; again, merging its unsorted tail,
        when that tail grows past max(``layout.SEGMENT``, w/32)), then O(log w + k) per
        bucket taken for its k copies, plus O(c log c) for the c cells taken.
        """
        if self._stage:
            self._fold()
        now_ms = check_int("now_ms", now_ms)
        out: list[tuple[int, int, Cell]] = []
        lid = self._ledgers.lid
        while True:
            front = self._front(now_ms)
            if front is None or front[0] > now_ms:
                return out
            bucket, w, off = front
            if self._hot_win is w and self._hot_off == off:
                self._reset_hot()  # its cell leaves the index
            rows: list[tuple[int, Cell]] = []
            for slot, cell in w.take_cells(off).items():
                rows.append((lid[slot], cell))  # type: ignore[arg-type]  # a slot holding a copy is in use
                self._release(slot, bucket, cell)
            rows.sort(key=lambda r: r[0])
            out.extend((bucket, ledger, cell) for ledger, cell in rows)

    def pop_due(self, now_ms: int) -> list[tuple[int, int]]:
        """Remove and return every ``(ledger_id, entry_id)`` whose bucket time is
        ``<= now_ms``, ordered by ``(bucket, ledger, entry)``.

        Runtime complexity: that of :meth:`pop_due_bitmaps` plus O(k) for k messages.
        """
        out: list[tuple[int, int]] = []
        for _, ledger, cell in self.pop_due_bitmaps(now_ms):
            out.extend((ledger, e) for e in cell)
        return out

    def next_due_ms(self) -> int | None:
        """The earliest bucket time, or ``None`` when empty.

        Runtime complexity: O(1) amortised; the first call after a window
        reaches the front sorts it (O(w log w) in C). The front bucket is
        gathered into bitmaps only when taken, or here when acked copies
        (ghosts) are pending or it is known from the unsorted tail only
        (O(t) in C for a tail of t).
        """
        if self._stage:
            self._fold()
        front = self._front()
        return None if front is None else front[0]

    @property
    def rounding(self) -> str:
        """``"floor"`` or ``"ceil"`` (see :class:`~nacktracker.precision.Precision`)."""
        return self.precision.rounding

    def __len__(self) -> int:
        """Pending occurrences (a message pending in two buckets counts twice). O(1)."""
        if self._stage:
            self._fold()
        return self._count

    def __bool__(self) -> bool:
        if self._stage:
            self._fold()
        return self._count > 0

    def __contains__(self, item: object) -> bool:
        """``(ledger_id, entry_id) in index``. Runtime complexity: O(1): a
        bitmap lookup plus at most ``LISTED`` (the ledger's listed cells)."""
        if self._stage:
            self._fold()
        pair = message_id(item)
        if pair is None:
            return False
        ledger_id, entry_id = pair
        slot = self._by_id.get(ledger_id)
        return slot is not None and self._ids.has(slot, entry_id)

    def has_ledger(self, ledger_id: int) -> bool:
        """Whether anything of this ledger is pending. Runtime complexity:
        O(1) with listed cells or 64-bit ids, else O(log n) (two ranks of the
        live bitmap, in C)."""
        if self._stage:
            self._fold()
        slot = self._by_id.get(ledger_id)
        return slot is not None and self._ids.has_live(slot)

    def compact(self) -> None:
        """Run-optimise and shrink the dense cells, shrink the live bitmap
        (never run-optimised: see ``LiveIds.compact``).

        Never needed for correctness: the index compacts a cell when a run of
        adds to it ends and a ledger's live set every few thousand changes.
        Runtime complexity: O(all containers).
        """
        if self._stage:
            self._fold()
        self._ids.compact()
        for w in self._windows.values():
            for cell in w.dense.values():
                cell.run_optimize()
                cell.shrink_to_fit()

    # -- counts, the pending set in order, bytes -------------------------------------

    def bucket_count(self) -> int:
        """Distinct bucket times pending. Runtime complexity: O(n log n) in C
        (numpy over the window arrays), no Python object per message. Copies
        of messages acked while pending count until their bucket is taken."""
        if self._stage:
            self._fold()
        return self._time.count(buckets_only=True)

    def bitmap_count(self) -> int:
        """``(bucket, ledger)`` cells pending. Runtime complexity: O(n log n)
        in C, as :meth:`bucket_count` (and the same caveat)."""
        if self._stage:
            self._fold()
        return self._time.count(buckets_only=False)

    def bucket_count_bound(self) -> int:
        """An upper bound on :meth:`bucket_count` for gauges read often
        (``NegativeAcksTracker.stats()``, every metrics scrape): a window with
        at most ``SMALL_WINDOW`` (64) copies left is counted exactly, a larger
        one as the fewer of its copies (sparse copies left plus dense cells)
        and the buckets one window spans (at least 8). Exact when each window
        is small; ghosts count as in :meth:`bucket_count`. Runtime
        complexity: O(windows), never O(messages)."""
        if self._stage:
            self._fold()
        return self._time.count_bound(1 << self._lay.offset_bits, buckets_only=True)

    def bitmap_count_bound(self) -> int:
        """An upper bound on :meth:`bitmap_count`, as :meth:`bucket_count_bound`:
        small windows exactly, a larger one as the fewer of its copies and the
        cells it can hold (buckets one window spans × ledger slots ever handed
        out, which no slot in a window reaches). Exact when each window is
        small or each copy is alone in its ``(bucket, ledger)`` cell.
        Runtime complexity: O(windows), never O(messages)."""
        if self._stage:
            self._fold()
        return self._time.count_bound((1 << self._lay.offset_bits) * len(self._ledgers.lid), buckets_only=False)

    def iter_bitmaps(self) -> Iterator[tuple[int, int, Cell]]:
        """``(bucket_ms, ledger_id, bitmap)`` of the live copies in order, without
        removing them. The bitmaps are fresh: mutating them changes nothing.
        Runtime complexity: O(n log n) for n copies."""
        if self._stage:
            self._fold()
        ledgers, ids = self._ledgers, self._ids
        for wid, w in self._time.in_order():
            rows = []
            for (off, slot), cell in self._time.cells_in(w).items():
                bucket = wid << self._wshift | off << self.precision_bits
                ext = ledgers.ext_at(slot)
                if ext is not None and ext.ghost is not None:
                    for e in common(cell, ext.ghost):
                        if not ids.ghosts[(slot, e)].is_live_in(bucket):
                            cell.discard(e)
                if cell:
                    rows.append((bucket, ledgers.ledger_id(slot), cell))
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
        if self._stage:
            self._fold()
        # its counters and the hot bucket's time, each as an int object of its own whatever its value
        # (shared small ints below 257: up to 64 B more than held), so an empty index always reads the same
        return (held_size(self) + COUNTER_INTS * held_size(1 << 40) + held_size(self._stage)
                + self._ledgers.nbytes() + self._ids.nbytes() + self._time.nbytes())

    def __repr__(self) -> str:
        return (f"TimeBucketIndex(precision_bits={self.precision_bits}, "
                f"rounding={self.rounding!r}, pending={len(self)}, windows={len(self._windows)})")

    # -- placing copies -------------------------------------------------------------

    def _add_again(self, slot: int, entry_id: int, bucket: int) -> None:
        """An add that may meet a copy already in its cell (pending, acked or
        wide). Runtime: O(log w + t) for the cell's window of w sparse copies
        with an unsorted tail of t."""
        ids = self._ids
        ext = self._ledgers.ext_at(slot)
        ghost = ids.ghost_of(slot, entry_id, ext)
        if (ids.has(slot, entry_id) or ghost is not None) and self._time.holds(slot, entry_id, bucket):
            if ghost is None or ghost.is_live_in(bucket):
                return  # already pending in this bucket
            assert ext is not None
            ghost.count -= 1  # the acked copy in this cell comes back to life
            ids.ghost_copies -= 1
            if ghost.count:
                ghost.revive(bucket)
            else:
                ids.unghost(ext, (slot, entry_id))
            ids.add(slot, entry_id)
            self._count += 1
            self._ledgers.tidy(slot)
            return
        if ghost is not None:
            ghost.revive(bucket)
        ids.add(slot, entry_id)
        self._count += 1
        self._put(slot, entry_id, bucket)

    def _put(self, slot: int, entry_id: int, bucket: int) -> None:
        """Store one new physical copy (live state already updated)."""
        if bucket == self._hot_bucket and slot == self._hot_slot:
            w, off, cell = self._hot_win, self._hot_off, self._hot_dense
        else:
            w, off, cell = self._make_hot(slot, bucket)
        self._ids.churn += 1
        if cell is None and (entry_id >> 32 or slot >= self._slot_limit):
            # the cell may be a bitmap already while the fast path appended sparse copies to it
            cell = w.dense.get(off << 32 | slot)
            if cell is None:
                cell = self._set_cell(w, off, slot, BitMap64() if entry_id >> 32 else BitMap())
                self._hot_start = 0
            else:
                self._hot_start = len(cell)
                ext = self._ledgers.ext_at(slot)
                self._hot_listed = ext is not None and any(c is cell for c in listed_cells(ext))
        if cell is not None:
            if entry_id >> 32 and type(cell) is BitMap:
                cell = self._set_cell(w, off, slot, BitMap64(cell))
            cell.add(entry_id)
            self._hot_dense = cell
            if self._hot_listed:
                ext = self._ledgers.ext_at(slot)
                assert ext is not None
                if entry_id > ext.hi:
                    ext.hi = entry_id
            return
        w.packed.append((off << self._cshift | slot) << 32 | entry_id)
        if off < w.tail_min and w.opened:
            w.tail_min = off
        if len(w.packed) - self._hot_start >= PROMOTE:
            self._promote(w)

    def _make_hot(self, slot: int, bucket: int) -> tuple[Window, int, Cell | None]:
        """Switch the fast path to the cell ``(bucket, slot)``; compact the dense
        cell it leaves if it grew past a power of two while hot (a run just
        ended, or its size doubled since: amortised O(1) per add, where
        compacting at every switch cost O(cell) per add to cells that many
        streams take turns at)."""
        old_cell = self._hot_dense
        if old_cell is not None:
            n = len(old_cell)
            if n >= PROMOTE and n.bit_length() > self._hot_start.bit_length():
                old_cell.run_optimize()
                old_cell.shrink_to_fit()
        w = self._windows.get(bucket >> self._wshift)
        if w is None:
            w = self._time.window(bucket)
        off = (bucket >> self.precision_bits) & self._omask
        cell = None
        if w.dense:
            cell = w.dense.get(off << 32 | slot)
        self._hot_bucket, self._hot_slot, self._hot_win, self._hot_off = bucket, slot, w, off
        if cell is None:
            if w.packed is NO_PACKED:
                w.packed = array.array(PACKED)
            elif len(w.packed) >= layout.SEGMENT:
                w.roll()
                if len(w.full) >= w.scan_at and not w.opened:
                    self._scan(w)  # resets the fast path: set again below
                    w.packed = array.array(PACKED)
                    self._hot_bucket, self._hot_slot, self._hot_win, self._hot_off = bucket, slot, w, off
                    cell = w.dense.get(off << 32 | slot)  # the look may have made the cell a bitmap
        self._hot_lid = self._ledgers.lid[slot]  # type: ignore[assignment]  # a slot in use holds its ledger id
        # _hot_start: where the hot run starts in the array, or the dense cell's size
        self._hot_dense, self._hot_start = cell, len(w.packed) if cell is None else len(cell)
        ext = self._ledgers.ext_at(slot) if cell is not None else None
        self._hot_listed = ext is not None and any(c is cell for c in listed_cells(ext))
        return w, off, cell

    def _scan(self, w: Window) -> None:
        """A window's look (``Windows.scan``): the sparse copies of the cells
        that pay as bitmaps join their cell's bitmap (made if new, shrunk to
        fit); a listed cell's ``hi`` follows. Resets the fast path (its run's
        copies moved). Runtime: O(w log w) in C for the window's w sparse
        copies, plus O(1) Python calls per cell moved."""
        if self._hot_win is w:
            self._reset_hot()
        exts = self._ledgers.ext
        listed = [cast(int, ext.cells[i + 2]) for ext in exts if ext is not None and ext.cells is not None
                  for i in range(0, len(ext.cells), LISTING) if ext.cells[i + 1] is w]
        keys, ends, entries = self._time.scan(w, listed)
        dense, start = w.dense, 0
        for key, end in zip(keys, ends):
            part = entries[start:end]
            start = end
            cell = dense.get(key)
            if cell is None:
                cell = BitMap()
                cell.update(part)
                cell.shrink_to_fit()
                self._set_cell(w, key >> 32, key & M32, cell)
                dense = w.dense  # made by the first cell
                continue
            cell.update(part if type(cell) is BitMap else array.array("Q", part))
            cell.shrink_to_fit()
            if exts:
                ext = exts[key & M32]
                if ext is not None and ext.cells is not None:
                    self._ids.relist(ext, cell, cell)  # its hi follows the cell's ids

    def _reset_hot(self) -> None:
        self._hot_bucket, self._hot_slot, self._hot_lid, self._hot_off = -1, -1, -1, -1
        self._hot_win, self._hot_dense, self._hot_start, self._hot_listed = NO_WINDOW, None, 0, False

    def _set_cell(self, w: Window, off: int, slot: int, cell: Cell) -> Cell:
        """Put ``cell`` at ``(off, slot)``; a listed cell replaced by a new
        object (widened to 64 bits) stays listed, and the ledger's ``hi``
        follows a listed cell's new ids (merged in by a gather or ``add_many``).
        Runtime complexity: O(log c) (heap push) + O(LISTED)."""
        if w.dense is NO_CELLS:
            w.dense = {}
        key = off << 32 | slot
        old = w.dense.get(key)
        if old is None:
            w.push_key(key)
        else:
            ext = self._ledgers.ext_at(slot)
            if ext is not None and self._ids.relist(ext, old, cell) and self._hot_dense is old:
                self._hot_listed = True
        w.dense[key] = cell
        return cell

    def _promote(self, w: Window) -> None:
        """The hot cell got a run of PROMOTE adds: move its copies (the tail of
        the window's array) into a bitmap. Runtime complexity: O(PROMOTE)."""
        start = self._hot_start
        run = array.array("I", [v & M32 for v in w.packed[start:]])
        del w.packed[start:]
        if not w.packed:  # the run was all of it
            w.packed = NO_PACKED
        cell: Cell = BitMap()
        cell.update(run)
        slot, off = self._hot_slot, self._hot_off
        self._hot_start = 0  # now the dense cell's size when the run started
        key = off << 32 | slot
        ext = self._ledgers.ext_at(slot)
        old = w.dense.get(key)
        if old is not None:  # the cell is a bitmap already (a look moved copies into it): one bitmap
            cell = merge_into(old, cell)
        if (ext is not None and ext.ghost is not None) or old is not None:
            self._hot_dense = self._set_cell(w, off, slot, cell)
            # a listed cell stays listed: its hi follows the ids added to it from now on
            self._hot_listed = ext is not None and any(c is cell for c in listed_cells(ext))
            return
        if w.dense is NO_CELLS:
            w.dense = {}
        w.push_key(key)
        w.dense[key] = self._hot_dense = cell
        # listed: the run's ids leave the live bitmap and its next ids skip it
        # (stored once); the listing shares the dict's key object. An id also
        # pending elsewhere (multi) would need its live bit when this cell pops:
        # a ledger with such ids keeps the run's first ids in the live bitmap.
        ids = self._ids
        ids.list_cell(slot, cell, w, key)
        self._hot_listed = True
        if self._ledgers.ext_of(slot).multi is None:
            ids.bits.difference_update(ids.keyed(slot, cell))  # type: ignore[arg-type]
            ids.churn += len(cell)

    # -- taking buckets off the front --------------------------------------------------

    def _front(self, taking: int = -1) -> tuple[int, Window, int] | None:
        """``(bucket, window, offset)`` of the earliest bucket holding a live
        copy; None if empty. A bucket at or before ``taking`` (about to be
        taken) is gathered into dense cells with its ghosts dropped; a later
        one only when ghosts exist or its offset comes from the tail alone
        (to know whether it holds a live copy)."""
        time = self._time
        while True:
            first = time.first()
            if first is None:
                return None
            wid, w = first
            if w.empty():
                time.drop_first()
                if self._hot_win is w:
                    self._reset_hot()
                continue
            if time.needs_sort(w):
                self._reset_hot()  # the hot run's copies no longer sit at the tail
                time.sort(w)
            off = time.front_offset(w)
            bucket = wid << self._wshift | off << self.precision_bits
            if bucket > taking and not self._ids.ghost_copies and time.surely_live(w, off):
                return bucket, w, off  # not taken now: left sparse (no bitmap per front bucket between pops)
            if self._gather(w, off, bucket):
                return bucket, w, off

    def _gather(self, w: Window, off: int, bucket: int) -> bool:
        """Move the sparse copies of bucket ``off`` into its dense cells and
        drop its ghost copies. Runtime: O(log w + k) for k copies from the
        sorted part; O(t) in C more when the unsorted tail of t has some.
        Returns whether the bucket holds a live copy."""
        parts = self._time.take_sparse(w, off)
        if parts:
            self._reset_hot()
            for s, got in self._time.by_slot(parts):
                cell = w.dense.get(off << 32 | s)
                self._set_cell(w, off, s, got if cell is None else merge_into(cell, got))
        if self._ids.ghost_copies:
            return self._drop_ghosts(w, off, bucket)
        return bool(w.dense_keys) and w.dense_keys[0] >> 32 == off

    def _drop_ghosts(self, w: Window, off: int, bucket: int) -> bool:
        """Drop the ghost copies of bucket ``off`` (all its copies are in dense
        cells by now); return whether a live copy is left."""
        ledgers, ids = self._ledgers, self._ids
        for slot, cell in w.take_cells(off).items():
            ext = ledgers.ext_at(slot)
            if ext is not None and ext.ghost is not None:
                for e in common(cell, ext.ghost):
                    key = (slot, e)
                    ghost = ids.ghosts[key]
                    if ghost.is_live_in(bucket):
                        continue
                    cell.discard(e)
                    ids.ghost_copies -= 1
                    ghost.count -= 1
                    if not ghost.count:
                        ids.unghost(ext, key)
            if cell:
                self._set_cell(w, off, slot, cell)
            else:
                if self._hot_dense is cell:
                    self._reset_hot()
                if ext is not None and ext.cells is not None:
                    ids.unlist(ext, cell)
                if (ext is None or ext.ghost is None) and not ids.has_live(slot):
                    self._drop_ledger(slot)
                    continue
            ledgers.tidy(slot)
        return bool(w.dense_keys) and w.dense_keys[0] >> 32 == off

    def _release(self, slot: int, bucket: int, cell: Cell) -> None:
        """Account for a popped cell (ghost copies already dropped)."""
        ids = self._ids
        n = len(cell)
        ids.churn += n
        self._count -= n
        gone = cell
        ext = self._ledgers.ext_at(slot)
        if ext is not None:
            if ext.cells is not None:
                ids.unlist(ext, cell)
                if self._hot_dense is cell:
                    self._hot_listed = False
            if ext.ghost is not None:
                for e in common(cell, ext.ghost):
                    revived = ids.ghosts[(slot, e)].revived
                    assert revived is not None
                    revived.discard(bucket)
            if ext.multi is not None:
                gone = ids.release_multi(slot, ext, cell)
            if ext.wide is not None and type(gone) is BitMap64:
                ext.wide.difference_update(gone)
                if not ext.wide:
                    ext.wide = None
        ids.release(slot, gone)
        if (ext is None or ext.ghost is None) and not ids.has_live(slot):
            self._drop_ledger(slot)
        else:
            self._ledgers.tidy(slot)

    def _drop_ledger(self, slot: int) -> None:
        self._ledgers.drop(slot)
        if self._hot_slot == slot:
            self._reset_hot()

