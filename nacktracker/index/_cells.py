"""Where a new copy goes (the window array, a dense cell, the fast path) and
the live ids of :class:`~nacktracker.index.TimeBucketIndex`: a mixin, state
in the index's slots."""

from __future__ import annotations

import array
import bisect
import heapq

import numpy as np
from pyroaring import BitMap, BitMap64

from ._parts import COMPACT_CHURN, M32, NO_CELLS, PROMOTE, Ledger, Window, has


class CellsMixin:
    """Placing copies and keeping the live ids; see :mod:`.buckets`."""

    __slots__ = ()

    def _ledger(self, ledger_id: int) -> Ledger:
        led = self._by_id.get(ledger_id)
        if led is not None:
            return led
        slot = self._free.pop() if self._free else len(self._ledgers)
        led = Ledger(ledger_id, slot)
        if slot == len(self._ledgers):
            self._ledgers.append(led)
        else:
            self._ledgers[slot] = led
        self._by_id[ledger_id] = led
        return led

    def _add_again(self, led: Ledger, entry_id: int, bucket: int) -> None:
        """An add that may meet a copy already in its cell (pending, acked or wide)."""
        key = (led.slot, entry_id)
        ghost = self._ghosts.get(key) if led.ghost is not None and entry_id in led.ghost else None
        if (self._has(led, entry_id) or ghost is not None) and self._holds(led, entry_id, bucket):
            if ghost is None or ghost.is_live_in(bucket):
                return  # already pending in this bucket
            ghost.count -= 1  # the acked copy in this cell comes back to life
            self._ghost_copies -= 1
            if ghost.count:
                ghost.revive(bucket)
            else:
                self._unghost(led, key)
            self._inc_live(led, entry_id)
            return
        if ghost is not None:
            ghost.revive(bucket)
        self._inc_live(led, entry_id)
        self._put(led, entry_id, bucket)

    def _inc_live(self, led: Ledger, entry_id: int) -> None:
        if self._has(led, entry_id):
            key = (led.slot, entry_id)
            self._multi[key] = self._multi.get(key, 1) + 1
            if led.multi is None:
                led.multi = set()
            led.multi.add(entry_id)
        else:
            self._live_add(led, entry_id)
        self._count += 1

    def _has(self, led: Ledger, entry_id: int) -> bool:
        if entry_id >> 32:
            return led.wide is not None and entry_id in led.wide
        return (led.key | entry_id) in self._live

    def _live_add(self, led: Ledger, entry_id: int) -> None:
        if entry_id >> 32:
            if led.wide is None:
                led.wide = BitMap64()
            led.wide.add(entry_id)
        else:
            self._live.add(led.key | entry_id)

    def _live_discard(self, led: Ledger, entry_id: int) -> None:
        if entry_id >> 32:
            led.wide.discard(entry_id)
            if not led.wide:
                led.wide = None
        else:
            self._live.discard(led.key | entry_id)

    def _has_live(self, led: Ledger) -> bool:
        """Whether the ledger has a live id. Runtime: O(log n) (two ranks)."""
        if led.wide is not None:
            return True
        below = self._live.rank(led.key - 1) if led.key else 0
        return self._live.rank(led.key | M32) > below

    @staticmethod
    def _keyed(led: Ledger, ids: BitMap | BitMap64) -> BitMap64:
        """``ids`` below 2^32 as keys of ``_live``. Runtime: O(k) in C."""
        if type(ids) is BitMap64 and ids and ids.max() >> 32:
            ids = BitMap(e for e in ids if not e >> 32)
        if len(ids) < 16:
            return BitMap64(led.key | e for e in ids)
        keys = np.asarray(ids.to_array(), dtype=np.uint64) + np.uint64(led.key)
        return BitMap64(array.array("Q", keys.tobytes()))

    def _compact_live(self) -> None:
        """Run-optimise and shrink ``_live``: every quarter of its size in
        changes (at least COMPACT_CHURN), so amortised O(1) per change."""
        self._live.run_optimize()
        self._live.shrink_to_fit()
        self._churn, self._compact_at = 0, max(COMPACT_CHURN, len(self._live) >> 2)

    def _put(self, led: Ledger, entry_id: int, bucket: int) -> None:
        """Store one new physical copy (live state already updated)."""
        if bucket == self._hot_bucket and led is self._hot_led:
            w, off, cell = self._hot_win, self._hot_off, self._hot_dense
        else:
            w, off, cell = self._make_hot(led, bucket)
        self._churn += 1
        slot = led.slot
        if cell is None and (entry_id >> 32 or slot >= self._slot_limit):
            cell = self._set_cell(w, off, slot, BitMap64() if entry_id >> 32 else BitMap())
        if cell is not None:
            if entry_id >> 32 and type(cell) is BitMap:
                cell = self._set_cell(w, off, slot, BitMap64(cell))
            cell.add(entry_id)
            self._hot_dense = cell
            return
        w.packed.append(off << self._oshift | slot << 32 | entry_id)
        if off < w.tail_min and w.upto >= 0:
            w.tail_min = off
        if len(w.packed) - self._hot_start >= PROMOTE:
            self._promote(w)

    def _make_hot(self, led: Ledger, bucket: int) -> tuple[Window, int, BitMap | BitMap64 | None]:
        """Switch the fast path to the cell ``(bucket, led)``; compact what it leaves."""
        old_cell = self._hot_dense
        if old_cell is not None and len(old_cell) >= PROMOTE:
            old_cell.run_optimize()  # a run just ended: bounded by one bitmap
            old_cell.shrink_to_fit()
        wid = bucket >> self._wshift
        w = self._windows.get(wid)
        if w is None:
            w = self._windows[wid] = Window()
            heapq.heappush(self._wheap, wid)
        off = (bucket >> self.precision_bits) & self._omask
        cell = None
        if w.dense:
            cell = w.dense.get(off << 32 | led.slot)
        self._hot_bucket, self._hot_led, self._hot_win, self._hot_off = bucket, led, w, off
        self._hot_dense, self._hot_start = cell, len(w.packed)
        return w, off, cell

    def _reset_hot(self) -> None:
        self._hot_bucket, self._hot_led, self._hot_win, self._hot_off = -1, None, None, -1
        self._hot_dense, self._hot_start = None, 0

    def _set_cell(self, w: Window, off: int, slot: int, cell):
        if w.dense is NO_CELLS:
            w.dense, w.dense_keys = {}, []
        key = off << 32 | slot
        if key not in w.dense:
            heapq.heappush(w.dense_keys, key)
        w.dense[key] = cell
        return cell

    def _take_cells(self, w: Window, off: int) -> dict[int, BitMap | BitMap64]:
        """Remove and return the dense cells of bucket ``off`` by slot. Runtime: O(c log c)."""
        keys, dense, out = w.dense_keys, w.dense, {}
        while keys and keys[0] >> 32 <= off:
            key = heapq.heappop(keys)
            cell = dense.pop(key, None)
            if cell is not None:
                out[key & M32] = cell
        return out

    def _promote(self, w: Window) -> None:
        """The hot cell got a run of PROMOTE adds: move its copies (the tail of
        the window's array) into a bitmap. Runtime: O(PROMOTE)."""
        start = self._hot_start
        ids = array.array("I", [v & M32 for v in w.packed[start:]])
        del w.packed[start:]
        cell = BitMap()
        cell.update(ids)
        self._hot_dense = self._set_cell(w, self._hot_off, self._hot_led.slot, cell)

    def _holds(self, led: Ledger, entry_id: int, bucket: int) -> bool:
        """Whether cell ``(bucket, led)`` physically holds a copy of the id."""
        w = self._windows.get(bucket >> self._wshift)
        if w is None:
            return False
        off = (bucket >> self.precision_bits) & self._omask
        cell = w.dense.get(off << 32 | led.slot)
        if cell is not None and has(cell, entry_id):
            return True
        if entry_id >> 32 or led.slot >= self._slot_limit or not w.packed:
            return False
        v = off << self._oshift | led.slot << 32 | entry_id
        if w.upto < 0:
            return bool((w.view() == np.uint64(v)).any())
        i = bisect.bisect_left(w.packed, v, w.pos, w.upto)
        if i < w.upto and w.packed[i] == v:
            return True
        return len(w.packed) > w.upto and bool((w.view()[w.upto:] == np.uint64(v)).any())
