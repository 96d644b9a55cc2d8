"""Where a new copy goes (the window array, a dense cell, the fast path) and
the live ids of :class:`~nacktracker.index.TimeBucketIndex`: a mixin, state
in the index's slots."""

from __future__ import annotations

import array
import bisect
import heapq

import numpy as np
from pyroaring import BitMap, BitMap64

from ._parts import (COMPACT_CHURN, LISTED, LIVE_ENTRY_BITS, LIVE_SLOT_BITS, M32, NO_CELLS, NO_ENTRIES, NO_KEYS, NO_PACKED, NO_SLOTS,
                     PROMOTE, SEGMENT, WIDE_LIVE_SHIFT, LISTING, LedgerExt, Window, has, u32_array, u64_array)


#: Ids re-keyed per step into the wide live bitmap (``_widen_live``,
#: ``_keyed``): temporaries of 20 bytes per id, 40 KB a step, below glibc's
#: 64 KB, so they come from the heap's free chunks and go back to them
#: instead of growing its top (which the heap keeps).
KEY_SLICE = 2048


class CellsMixin:
    """Placing copies and keeping the live ids; see :mod:`.buckets`."""

    __slots__ = ()

    def _ledger(self, ledger_id: int) -> int:
        """The ledger's slot, a new one (a freed slot first) if it has none. Runtime: O(1)."""
        slot = self._by_id.get(ledger_id)
        if slot is not None:
            return slot
        lids = self._lid
        slot = self._free.pop() if self._free else len(lids)
        if slot == len(lids):
            lids.append(ledger_id)
            if self._ext is not NO_SLOTS:
                self._ext.append(None)
        else:
            lids[slot] = ledger_id
        self._by_id[ledger_id] = slot
        return slot

    def _ext_of(self, slot: int) -> LedgerExt:
        """The ledger's rare state, made on first use."""
        ext = self._ext_at(slot)
        if ext is None:
            if self._ext is NO_SLOTS:  # the first record: a list slot per ledger from now on
                self._ext = [None] * len(self._lid)
            ext = self._ext[slot] = LedgerExt()
        return ext

    def _ext_at(self, slot: int) -> LedgerExt | None:
        """The ledger's rare state, or None. Runtime: O(1)."""
        exts = self._ext
        return exts[slot] if exts else None

    def _tidy(self, slot: int) -> None:
        """Drop the ledger's rare state once nothing is left in it (call at the
        end of an operation: callers may hold the record until then)."""
        ext = self._ext_at(slot)
        if ext is not None and ext.empty():
            self._ext[slot] = None

    def _live_add_rare(self, slot: int, entry_id: int, bucket: int) -> bool:
        """``add``'s "already pending?" step for an id the narrow live bitmap
        cannot key, or of a ledger with rare state (ghosts, listed cells, ids
        pending twice): True if the id was not pending (it is live now and
        the caller stores its copy), False if this took the add whole.
        Runtime: as ``add``."""
        ext = self._ext_at(slot)
        if entry_id >> 32 or (ext is not None and ext.ghost is not None):
            self._add_again(slot, entry_id, bucket)
            return False
        if entry_id >> LIVE_ENTRY_BITS or slot >> LIVE_SLOT_BITS:
            if self._live_shift == LIVE_ENTRY_BITS:  # the first id the narrow live bitmap cannot key
                self._widen_live()
            key = slot << WIDE_LIVE_SHIFT | entry_id
        else:
            key = slot << self._live_shift | entry_id
        try:
            self._live.add_checked(key)
        except KeyError:  # already pending somewhere
            self._add_again(slot, entry_id, bucket)
            return False
        if ext is not None and ext.cells is not None and entry_id <= ext.hi and self._in_listed(ext, entry_id):
            self._live.discard(key)  # pending in a listed cell
            self._add_again(slot, entry_id, bucket)
            return False
        return True

    def _add_again(self, slot: int, entry_id: int, bucket: int) -> None:
        """An add that may meet a copy already in its cell (pending, acked or wide)."""
        ext = self._ext_at(slot)
        key = (slot, entry_id)
        ghost = self._ghosts.get(key) if ext is not None and ext.ghost is not None and entry_id in ext.ghost else None
        if (self._has(slot, entry_id) or ghost is not None) and self._holds(slot, entry_id, bucket):
            if ghost is None or ghost.is_live_in(bucket):
                return  # already pending in this bucket
            ghost.count -= 1  # the acked copy in this cell comes back to life
            self._ghost_copies -= 1
            if ghost.count:
                ghost.revive(bucket)
            else:
                self._unghost(ext, key)
            self._inc_live(slot, entry_id)
            self._tidy(slot)
            return
        if ghost is not None:
            ghost.revive(bucket)
        self._inc_live(slot, entry_id)
        self._put(slot, entry_id, bucket)

    def _inc_live(self, slot: int, entry_id: int) -> None:
        """One more live copy. An id pending in two buckets is always in the
        live bitmap (not only in a listed cell): releasing one copy keeps it
        there for the other."""
        if self._has(slot, entry_id):
            key = (slot, entry_id)
            if self._multi is NO_ENTRIES:
                self._multi = {}
            self._multi[key] = self._multi.get(key, 1) + 1
            ext = self._ext_of(slot)
            if ext.multi is None:
                ext.multi = set()
            ext.multi.add(entry_id)
        self._live_add(slot, entry_id)
        self._count += 1

    def _has(self, slot: int, entry_id: int) -> bool:
        """Whether the id is pending. Runtime: O(1): a bitmap lookup, plus at
        most LISTED more for an id not above the ledger's listed ids."""
        exts = self._ext  # _ext_at() inlined (membership tests)
        ext = exts[slot] if exts else None
        if entry_id >> 32:
            return ext is not None and ext.wide is not None and entry_id in ext.wide
        shift = self._live_shift
        if shift == LIVE_ENTRY_BITS and (entry_id >> LIVE_ENTRY_BITS or slot >> LIVE_SLOT_BITS):
            return False  # not pending: its first add would have widened the live bitmap
        return (slot << shift | entry_id) in self._live or (
            ext is not None and ext.cells is not None and entry_id <= ext.hi and self._in_listed(ext, entry_id))

    @staticmethod
    def _in_listed(ext: LedgerExt, entry_id: int) -> bool:
        """Whether a listed cell of the ledger holds the id (a live copy: listed
        cells hold no ghost); the id is below 2^32 (64-bit ids are in ``wide``).
        Runtime: O(LISTED) bitmap lookups in C."""
        for cell in ext.cells[::LISTING]:
            if entry_id in cell:
                return True
        return False

    def _list(self, slot: int, cell: BitMap | BitMap64, w: Window, key: int) -> None:
        """List a new dense cell (its later ids skip the live bitmap); a ledger
        with LISTED cells listed already first flushes them into the live
        bitmap. Runtime: O(1), or O(ids in the flushed cells) in C."""
        ext = self._ext_of(slot)
        if ext.cells is not None and len(ext.cells) >= LISTED * LISTING:
            self._flush_listed(slot, ext)
        # a new list of the exact size, not an append: no growth slack (a ledger
        # lists a cell once per run of adds, and the list holds at most 24 items)
        ext.cells = [cell, w, key] if ext.cells is None else ext.cells + [cell, w, key]
        if cell and cell.max() > ext.hi:
            ext.hi = cell.max()
        if self._hot_dense is cell:
            self._hot_listed = True

    def _flush_listed(self, slot: int, ext: LedgerExt) -> None:
        """Put the ids of the ledger's listed cells into the live bitmap and
        unlist them (ids >= 2^32 are in ``wide`` already). Runtime: O(ids) in C."""
        for cell in ext.cells[::LISTING]:
            keyed = self._keyed(slot, cell)
            self._live |= keyed
            self._churn += len(keyed)
            if self._hot_dense is cell:
                self._hot_listed = False
        ext.cells, ext.hi = None, -1

    def _unlist(self, ext: LedgerExt, cell: BitMap | BitMap64) -> None:
        """The cell leaves the index (popped or emptied). Runtime: O(LISTED)."""
        cells = ext.cells
        for i in range(0, len(cells), LISTING):
            if cells[i] is cell:
                del cells[i:i + LISTING]
                if self._hot_dense is cell:
                    self._hot_listed = False
                break
        if not cells:
            ext.cells, ext.hi = None, -1

    def _drop_listed_id(self, ext: LedgerExt, entry_id: int) -> int:
        """An ack: remove the id from the ledger's listed cells (a cell emptied
        leaves its window); return how many held it. Runtime: O(LISTED)
        bitmap lookups in C."""
        cells, held = ext.cells, None
        narrow = not entry_id >> 32  # a 32-bit cell cannot hold a wider id (and would raise): has()
        for i in range(0, len(cells), LISTING):
            if (entry_id in cells[i]) if narrow else has(cells[i], entry_id):
                if held is None:
                    held = []
                held.append(i)
        if held is None:
            return 0
        for i in reversed(held):  # back to front: unlisting shifts the later cells
            cell, w, key = cells[i], cells[i + 1], cells[i + 2]
            cell.discard(entry_id)
            if not cell:
                del cells[i:i + LISTING]
                del w.dense[key]  # its key in dense_keys is stale now: skipped there
                if not w.dense:  # a dict never shrinks: drop it with its heap of stale keys
                    w.dense, w.dense_keys = NO_CELLS, NO_KEYS
                if self._hot_dense is cell:
                    self._reset_hot()
        if not cells:
            ext.cells, ext.hi = None, -1
        return len(held)

    def _live_add(self, slot: int, entry_id: int) -> None:
        if entry_id >> 32:
            ext = self._ext_of(slot)
            if ext.wide is None:
                ext.wide = BitMap64()
            ext.wide.add(entry_id)
            return
        if self._live_shift == LIVE_ENTRY_BITS and (entry_id >> LIVE_ENTRY_BITS or slot >> LIVE_SLOT_BITS):
            self._widen_live()
        self._live.add(slot << self._live_shift | entry_id)

    def _live_discard(self, slot: int, entry_id: int) -> None:
        if entry_id >> 32:
            ext = self._ext_at(slot)
            ext.wide.discard(entry_id)
            if not ext.wide:
                ext.wide = None
        else:
            self._live.discard(slot << self._live_shift | entry_id)

    def _widen_live(self) -> None:
        """An id below 2^32 that ``slot << 22 | entry`` cannot hold (entry >=
        2^22 or slot >= 2^10) is about to be live: re-key the live bitmap as
        a ``BitMap64`` of ``slot << 32 | entry``, for good. In slices of
        KEY_SLICE ids (by rank): converting all at once made temporaries of
        ~40 bytes per live id, which left the heap that much larger for good
        (a consumer at 10,000 nacks/s, ids 8 apart: RSS 2x ``nbytes()``).
        Each slice leaves the narrow bitmap as it joins the wide one, so the
        containers it frees make room for the wide one's: with the narrow
        bitmap kept whole until the end, the heap grew by its size at once
        and kept that as a hole.
        Runtime: O(n) in C, once per index."""
        narrow, live = self._live, BitMap64()
        low = np.uint64((1 << LIVE_ENTRY_BITS) - 1)
        while narrow:
            part = narrow[0:KEY_SLICE]
            keys = np.frombuffer(part.to_array(), dtype=np.uint32).astype(np.uint64)
            keys = (keys >> np.uint64(LIVE_ENTRY_BITS)) << np.uint64(WIDE_LIVE_SHIFT) | (keys & low)
            live.update(u64_array(keys))
            narrow.remove_range(part.min(), part.max() + 1)
        self._live, self._live_shift = live, WIDE_LIVE_SHIFT

    def _has_live(self, slot: int) -> bool:
        """Whether the ledger has a live id. Runtime: O(log n) (two ranks)."""
        ext = self._ext_at(slot)
        if ext is not None and (ext.wide is not None or ext.cells is not None):  # listed cells are never empty
            return True
        shift = self._live_shift
        if shift == LIVE_ENTRY_BITS and slot >> LIVE_SLOT_BITS:
            return False  # the live bitmap is narrow: none of its ids can be live
        key = slot << shift
        below = self._live.rank(key - 1) if key else 0
        return self._live.rank(key | ((1 << shift) - 1)) > below

    def _keyed(self, slot: int, ids: BitMap | BitMap64) -> BitMap | BitMap64:
        """``ids`` below 2^32 as keys of ``_live`` (narrow ones, while it is:
        every id below 2^32 in a cell went through the live bitmap, which
        widened for any other). Runtime: O(k) in C."""
        if type(ids) is BitMap64:  # its ids below 2^32, as a 32-bit bitmap
            values = np.asarray(ids.to_array(), dtype=np.uint64)
            ids = BitMap()
            ids.update(u32_array(values[:np.searchsorted(values, 1 << 32)]))
        if self._live_shift == LIVE_ENTRY_BITS:
            return ids.shift(slot << LIVE_ENTRY_BITS) if ids else BitMap()
        if len(ids) < 16:
            return BitMap64(slot << WIDE_LIVE_SHIFT | e for e in ids)
        # in slices: a popped bucket of 10,000 ids made ~360 KB of temporaries
        # at once, freed to the top of the C heap, which keeps what it grew to
        # (backoff k=20 L=1 10,000/s bits 10: that heap's growth came from pops)
        out, base = BitMap64(), np.uint64(slot << WIDE_LIVE_SHIFT)
        for i in range(0, len(ids), KEY_SLICE):
            keys = np.frombuffer((ids[i:i + KEY_SLICE] if len(ids) > KEY_SLICE else ids).to_array(),
                                 dtype=np.uint32).astype(np.uint64)
            keys += base
            out.update(u64_array(keys))
        return out

    def _compact_live(self) -> None:
        """Shrink ``_live`` to fit: every quarter of its size in changes (at
        least COMPACT_CHURN), so amortised O(1) per change. Never
        run-optimised: ``add_checked`` on a run container costs O(runs) (CRoaring
        counts its cardinality), and consecutive nacks (k=1) left runs of
        runs: uniform k=1 L=1 100/s bits 10 (``index_grid.py --one``) read
        add 2.08x DictIndex with it, 1.67x without. Without it, four k=1 cells
        read 0.4 B per pending more RSS in one, the same in one, 2 B less in two."""
        self._live.shrink_to_fit()
        self._refitted = True
        self._churn, self._compact_at = 0, max(COMPACT_CHURN, len(self._live) >> 2)

    def _put(self, slot: int, entry_id: int, bucket: int) -> None:
        """Store one new physical copy (live state already updated)."""
        if bucket == self._hot_bucket and slot == self._hot_slot:
            w, off, cell = self._hot_win, self._hot_off, self._hot_dense
        else:
            w, off, cell = self._make_hot(slot, bucket)
        self._churn += 1
        if cell is None and (entry_id >> 32 or slot >= self._slot_limit):
            cell = self._set_cell(w, off, slot, BitMap64() if entry_id >> 32 else BitMap())
            self._hot_start = 0
        if cell is not None:
            if entry_id >> 32 and type(cell) is BitMap:
                cell = self._set_cell(w, off, slot, BitMap64(cell))
            cell.add(entry_id)
            self._hot_dense = cell
            if self._hot_listed:
                ext = self._ext_at(slot)
                if entry_id > ext.hi:
                    ext.hi = entry_id
            return
        w.packed.append((off << self._cshift | slot) << 32 | entry_id)
        if off < w.tail_min and w.opened:
            w.tail_min = off
        if len(w.packed) - self._hot_start >= PROMOTE:
            self._promote(w)

    def _make_hot(self, slot: int, bucket: int) -> tuple[Window, int, BitMap | BitMap64 | None]:
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
        wid = bucket >> self._wshift
        w = self._windows.get(wid)
        if w is None:
            w = self._windows[wid] = Window()
            heapq.heappush(self._wheap, wid)
        off = (bucket >> self.precision_bits) & self._omask
        cell = None
        if w.dense:
            cell = w.dense.get(off << 32 | slot)
        self._hot_bucket, self._hot_slot, self._hot_win, self._hot_off = bucket, slot, w, off
        if cell is None:
            if w.packed is NO_PACKED:
                w.packed = array.array("Q")
            elif len(w.packed) >= SEGMENT:
                w.roll()
        self._hot_lid = self._lid[slot]
        # _hot_start: where the hot run starts in the array, or the dense cell's size
        self._hot_dense, self._hot_start = cell, len(w.packed) if cell is None else len(cell)
        ext = self._ext_at(slot) if cell is not None else None
        self._hot_listed = ext is not None and ext.cells is not None and any(c is cell for c in ext.cells[::LISTING])
        return w, off, cell

    def _reset_hot(self) -> None:
        self._hot_bucket, self._hot_slot, self._hot_lid, self._hot_win, self._hot_off = -1, -1, -1, None, -1
        self._hot_dense, self._hot_start, self._hot_listed = None, 0, False

    def _set_cell(self, w: Window, off: int, slot: int, cell):
        """Put ``cell`` at ``(off, slot)``; a listed cell replaced by a new
        object (widened to 64 bits) stays listed, and the ledger's ``hi``
        follows a listed cell's new ids (merged in by a gather or ``add_many``).
        Runtime: O(log c) (heap push) + O(LISTED)."""
        if w.dense is NO_CELLS:
            w.dense = {}
        key = off << 32 | slot
        old = w.dense.get(key)
        if old is None:
            self._push_key(w, key)
        else:
            ext = self._ext_at(slot)
            cells = ext.cells if ext is not None else None
            if cells is not None:
                for i in range(0, len(cells), LISTING):
                    if cells[i] is old:
                        cells[i] = cell
                        if self._hot_dense is old:
                            self._hot_listed = True
                        if cell and cell.max() > ext.hi:
                            ext.hi = cell.max()
                        break
        w.dense[key] = cell
        return cell

    @staticmethod
    def _push_key(w: Window, key: int) -> None:
        """A new dense cell's key into the heap of an open window (one at the
        front: see :class:`~._parts.Window`). Runtime: O(log c)."""
        if w.opened:
            if w.dense_keys is NO_KEYS:
                w.dense_keys = []
            heapq.heappush(w.dense_keys, key)

    def _take_cells(self, w: Window, off: int) -> dict[int, BitMap | BitMap64]:
        """Remove and return the dense cells of bucket ``off`` by slot. Runtime: O(c log c)."""
        keys, dense, out = w.dense_keys, w.dense, {}
        while keys and keys[0] >> 32 <= off:
            key = heapq.heappop(keys)
            cell = dense.pop(key, None)
            if cell is not None:
                out[key & M32] = cell
        if not dense:  # a dict never shrinks: drop it (and its heap of stale keys) for the shared empties
            w.dense, w.dense_keys = NO_CELLS, NO_KEYS
        return out

    def _promote(self, w: Window) -> None:
        """The hot cell got a run of PROMOTE adds: move its copies (the tail of
        the window's array) into a bitmap. Runtime: O(PROMOTE)."""
        start = self._hot_start
        ids = array.array("I", [v & M32 for v in w.packed[start:]])
        del w.packed[start:]
        if not w.packed:  # the run was all of it
            w.packed = NO_PACKED
        cell = BitMap()
        cell.update(ids)
        slot, off = self._hot_slot, self._hot_off
        self._hot_start = 0  # now the dense cell's size when the run started
        key = off << 32 | slot
        ext = self._ext_at(slot)
        if (ext is not None and ext.ghost is not None) or key in w.dense:
            self._hot_dense = self._set_cell(w, off, slot, cell)
            return
        if w.dense is NO_CELLS:
            w.dense = {}
        self._push_key(w, key)
        w.dense[key] = self._hot_dense = cell
        # listed: the run's ids leave the live bitmap and its next ids skip it
        # (stored once); the listing shares the dict's key object. An id also
        # pending elsewhere (multi) would need its live bit when this cell pops:
        # a ledger with such ids keeps the run's first ids in the live bitmap.
        self._list(slot, cell, w, key)
        if self._ext_at(slot).multi is None:
            self._live.difference_update(self._keyed(slot, cell))
            self._churn += len(cell)

    def _holds(self, slot: int, entry_id: int, bucket: int) -> bool:
        """Whether cell ``(bucket, slot)`` physically holds a copy of the id."""
        w = self._windows.get(bucket >> self._wshift)
        if w is None:
            return False
        off = (bucket >> self.precision_bits) & self._omask
        cell = w.dense.get(off << 32 | slot)
        if cell is not None and has(cell, entry_id):
            return True
        if entry_id >> 32 or slot >= self._slot_limit or not (w.packed or w.full or w.spill):
            return False
        v = (off << self._cshift | slot) << 32 | entry_id
        if w.opened and w.full:  # the sorted segments: the one that could hold it
            i = bisect.bisect_left(w.full, v, key=_last)
            if i < len(w.full):
                seg = w.full[i]
                j = bisect.bisect_left(seg, v, w.pos if i == 0 else 0)
                if j < len(seg) and seg[j] == v:
                    return True
            return any(bool((part == np.uint64(v)).any()) for part in w.tail())
        return any(bool((part == np.uint64(v)).any()) for part in w.parts())


def _last(segment: array.array) -> int:
    return segment[-1]
