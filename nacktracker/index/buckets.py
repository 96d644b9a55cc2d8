"""TimeBucketIndex: PIP-393's trimmed due time -> ledger -> entry ids, laid
out to stay small on real client traffic (sparse cells) and on seed 000's
dense bursts alike. The pieces are in :mod:`._parts`; the layout is:

* windows of ``2^max(bits, 14)`` ms in a dict, their ids in a heap (the time
  order: one entry per window, not per bucket or per (bucket, ledger));
* inside a window, sparse copies packed 8 bytes each in one ``array('Q')``
  (sorted in C when the window comes to the front), and dense cells (one
  Roaring bitmap per (bucket, ledger)) for runs of adds to one cell;
* per ledger, a "pending anywhere" bitmap: an ack of a message that is not
  pending is one bitmap lookup, and an ack of a pending one marks its copies
  as ghosts that are dropped when their bucket is taken (no search).
"""

from __future__ import annotations

import array
import bisect
import heapq
import sys
from typing import Iterable, Iterator

import numpy as np
from pyroaring import BitMap, BitMap64

from .._checks import MAX_DUE, check_int, check_precision, entry_array
from ._bytes import _roaring_bytes
from ._parts import COMPACT_CHURN, M32, NO_CELLS, PROMOTE, Ghost, Layout, Ledger, Window, bitmap_of, common, has, merge_into

__all__ = ["TimeBucketIndex"]


class TimeBucketIndex:
    """Pending nacks by bucket time, ledger and entry id.

    The bucket of a due time is the time with its low ``precision_bits``
    cleared (``rounding="floor"``, Pulsar's ``negativeAckPrecisionBitCnt``: up
    to 2^bits-1 ms early, never late) or rounded up to the next multiple
    (``"ceil"``: never early, up to 2^bits-1 ms late). A message is stored once
    per bucket; ``discard`` removes every occurrence; ``pop_due`` returns
    ``(ledger, entry)`` in ``(bucket, ledger, entry)`` order. Memory: about
    10 bytes per sparse pending message, a fraction of a byte for dense runs.

    >>> idx = TimeBucketIndex(precision_bits=0)
    >>> idx.add(7, 1, due_ms=100); idx.add(7, 2, due_ms=100); idx.add(3, 9, due_ms=50)
    >>> idx.next_due_ms(), len(idx)
    (50, 3)
    >>> idx.pop_due(100)
    [(3, 9), (7, 1), (7, 2)]
    """

    __slots__ = ("precision_bits", "rounding", "_add", "_mask", "_lay", "_wshift", "_oshift", "_omask",
                 "_slot_limit", "_windows", "_wheap", "_by_id", "_ledgers", "_free", "_multi", "_ghosts",
                 "_ghost_copies", "_count", "_live", "_churn", "_compact_at", "_hot_bucket", "_hot_led", "_hot_win", "_hot_off", "_hot_dense",
                 "_hot_start")

    def __init__(self, precision_bits: int = 8, rounding: str = "floor") -> None:
        self._add, self._mask = check_precision(precision_bits, rounding)
        self.precision_bits: int = precision_bits
        self.rounding: str = rounding
        lay = self._lay = Layout.for_bits(precision_bits)
        self._wshift, self._oshift, self._slot_limit = lay.window_shift, lay.offset_shift, lay.slot_limit
        self._omask = (1 << lay.offset_bits) - 1
        self._windows: dict[int, Window] = {}
        self._wheap: list[int] = []  # window ids; one per window in _windows
        self._by_id: dict[int, Ledger] = {}  # ledger id -> its record
        self._ledgers: list[Ledger | None] = []  # by slot
        self._free: list[int] = []  # freed slots
        self._multi: dict[tuple[int, int], int] = {}  # (slot, entry) -> live occurrences (>= 2)
        self._ghosts: dict[tuple[int, int], Ghost] = {}  # (slot, entry) -> acked copies still in cells
        self._ghost_copies = 0
        self._count = 0  # live occurrences
        self._live = BitMap64()  # slot << 32 | entry of every live id < 2^32 (see Ledger)
        self._churn, self._compact_at = 0, COMPACT_CHURN  # changes to _live until its next compaction
        self._reset_hot()

    # -- adding ---------------------------------------------------------------

    def bucket_of(self, due_ms: int) -> int:
        """The bucket time a due time maps to. Runtime complexity: O(1)."""
        return (check_int("due_ms", due_ms, MAX_DUE) + self._add) & self._mask

    def add(self, ledger_id: int, entry_id: int, due_ms: int) -> None:
        """Track ``(ledger_id, entry_id)`` as due at ``due_ms`` (monotonic ms).

        Ids are ints in ``[0, 2^63)``, ``due_ms`` in ``[0, 2^62)``; anything
        else raises ``TypeError``/``ValueError`` and changes nothing.

        Runtime complexity: O(1) amortised (an append, or a bitmap add for a
        cell in a run). A message already pending (or acked while pending)
        also checks its cell: O(log w + t) for a window of w sparse copies
        with an unsorted tail of t.
        """
        if (type(ledger_id) is not int or type(entry_id) is not int or type(due_ms) is not int
                or (ledger_id | entry_id) >> 63 or due_ms >> 62):  # negative or too large
            ledger_id = check_int("ledger_id", ledger_id)
            entry_id = check_int("entry_id", entry_id)
            due_ms = check_int("due_ms", due_ms, MAX_DUE)
        bucket = (due_ms + self._add) & self._mask
        led = self._hot_led
        if led is None or led.ledger_id != ledger_id:
            led = self._by_id.get(ledger_id)
            if led is None:
                led = self._ledger(ledger_id)
        if entry_id >> 32 or led.ghost is not None:
            self._add_again(led, entry_id, bucket)
            return
        try:
            self._live.add_checked(led.key | entry_id)
        except KeyError:  # already pending somewhere
            self._add_again(led, entry_id, bucket)
            return
        self._count += 1
        if bucket == self._hot_bucket and led is self._hot_led:  # a burst into the last cell
            w = self._hot_win
            cell = self._hot_dense
            if cell is not None:
                cell.add(entry_id)
                return
            w.packed.append(self._hot_off << self._oshift | led.slot << 32 | entry_id)
            if len(w.packed) - self._hot_start >= PROMOTE:
                self._promote(w)
            return
        w = self._windows.get(bucket >> self._wshift)
        if w is None or w.dense or self._hot_dense is not None or led.slot >= self._slot_limit:
            self._put(led, entry_id, bucket)
            return
        # another sparse cell of an existing window (interleaved traffic): inline _make_hot
        self._churn += 1
        if self._churn >= self._compact_at:
            self._compact_live()
        off = (bucket >> self.precision_bits) & self._omask
        packed = w.packed
        self._hot_start = len(packed)
        packed.append(off << self._oshift | led.slot << 32 | entry_id)
        if off < w.tail_min and w.upto >= 0:  # an add into a window already open
            w.tail_min = off
        self._hot_bucket, self._hot_led, self._hot_win, self._hot_off = bucket, led, w, off

    def add_many(self, ledger_id: int, entry_ids: Iterable[int], due_ms: int) -> None:
        """Track many entries of one ledger, all due at ``due_ms``.

        ``entry_ids``: ``array.array('I')`` or a numpy integer array (converted
        without a per-element Python loop), any integer ``array.array``, or any
        iterable of ints. Runtime complexity: O(k) in C for k ids none of which
        is pending; O(k) adds otherwise (and below 32 ids).
        """
        if type(ledger_id) is not int or type(due_ms) is not int or ledger_id >> 63 or due_ms >> 62:
            ledger_id = check_int("ledger_id", ledger_id)
            due_ms = check_int("due_ms", due_ms, MAX_DUE)
        ids = entry_array(entry_ids)
        if len(ids) < PROMOTE:
            for e in ids:
                self.add(ledger_id, e, due_ms)
            return
        new = BitMap(ids) if ids.typecode == "I" else BitMap64(ids)
        led = self._ledger(ledger_id)
        keyed = self._keyed(led, new)
        if led.ghost is not None or keyed.intersect(self._live) or (
                led.wide is not None and type(new) is BitMap64 and new.intersect(led.wide)):
            for e in new:
                self.add(ledger_id, e, due_ms)
            return
        bucket = (due_ms + self._add) & self._mask
        self._live |= keyed
        if type(new) is BitMap64 and new.max() >> 32:
            led.wide = merge_into(led.wide or BitMap64(), BitMap64(e for e in new if e >> 32))
        n = len(new)
        self._churn += n
        self._count += n
        w, off, cell = self._make_hot(led, bucket)
        self._hot_dense = self._set_cell(w, off, led.slot, new if cell is None else merge_into(cell, new))

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

    # -- live ids: one BitMap64 keyed slot << 32 | entry, plus per-ledger wide ids ----

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
        old, old_cell = self._hot_led, self._hot_dense
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

    # -- removing -------------------------------------------------------------

    def discard(self, ledger_id: int, entry_id: int) -> bool:
        """Remove every pending occurrence of ``(ledger_id, entry_id)`` (an ack).

        Returns whether anything was pending. Runtime complexity: O(1): one
        bitmap lookup when the message is not pending; when it is, its copies
        become ghosts (a small record each) dropped when their bucket is taken.
        """
        if type(ledger_id) is not int or type(entry_id) is not int or (ledger_id | entry_id) >> 63:
            ledger_id = check_int("ledger_id", ledger_id)
            entry_id = check_int("entry_id", entry_id)
        led = self._by_id.get(ledger_id)
        if led is None or not self._has(led, entry_id):
            return False
        key = (led.slot, entry_id)
        n = 1
        if led.multi is not None and entry_id in led.multi:
            n = self._multi.pop(key)
            led.multi.discard(entry_id)
            if not led.multi:
                led.multi = None
        self._live_discard(led, entry_id)
        self._count -= n
        self._ghost_copies += n
        ghost = self._ghosts.get(key)
        if ghost is None:
            self._ghosts[key] = Ghost(n)
            if led.ghost is None:
                led.ghost = set()
            led.ghost.add(entry_id)
        else:  # its live copies were exactly the revived ones
            ghost.count += n
            ghost.revived = None
        return True

    def _unghost(self, led: Ledger, key: tuple[int, int]) -> None:
        del self._ghosts[key]
        led.ghost.discard(key[1])
        if not led.ghost:
            led.ghost = None

    def pop_due_bitmaps(self, now_ms: int) -> list[tuple[int, int, BitMap | BitMap64]]:
        """Remove everything due at ``now_ms``; return ``(bucket_ms, ledger_id,
        bitmap)`` triples in ``(bucket, ledger)`` order.

        The bulk form of :meth:`pop_due`: no Python object per message.
        Runtime complexity: O(w) per window reached (one C sort of its array
        the first time, then an O(w) C rebuild per bucket taken) plus
        O(c log c) for the c cells taken.
        """
        now_ms = check_int("now_ms", now_ms)
        out: list[tuple[int, int, BitMap | BitMap64]] = []
        while True:
            front = self._front()
            if front is None or front[0] > now_ms:
                return out
            bucket, w, off = front
            if self._hot_win is w and self._hot_off == off:
                self._reset_hot()  # its cell leaves the index
            rows = []
            for slot, cell in self._take_cells(w, off).items():
                led = self._ledgers[slot]
                self._release(led, w, bucket, cell)
                rows.append((led.ledger_id, cell))
            rows.sort(key=lambda r: r[0])
            out.extend((bucket, ledger, cell) for ledger, cell in rows)

    def _release(self, led: Ledger, w: Window, bucket: int, cell: BitMap | BitMap64) -> None:
        """Account for a popped cell (ghost copies already dropped)."""
        n = len(cell)
        self._churn += n
        self._count -= n
        gone = cell
        if led.ghost is not None:
            for e in common(cell, led.ghost):
                self._ghosts[(led.slot, e)].revived.discard(bucket)
        if led.multi is not None:
            still = []
            for e in common(cell, led.multi):
                key = (led.slot, e)
                left = self._multi[key] - 1
                if left == 1:
                    del self._multi[key]
                    led.multi.discard(e)
                else:
                    self._multi[key] = left
                still.append(e)
            if not led.multi:
                led.multi = None
            if still:
                gone = type(cell)(cell)
                for e in still:
                    gone.discard(e)
        self._live.difference_update(self._keyed(led, gone))
        if led.wide is not None and type(gone) is BitMap64:
            led.wide.difference_update(gone)
            if not led.wide:
                led.wide = None
        if self._churn >= self._compact_at:
            self._compact_live()
        if led.ghost is None and not self._has_live(led):
            self._drop_ledger(led)

    def _drop_ledger(self, led: Ledger) -> None:
        del self._by_id[led.ledger_id]
        self._ledgers[led.slot] = None
        self._free.append(led.slot)
        if self._hot_led is led:
            self._reset_hot()

    def pop_due(self, now_ms: int) -> list[tuple[int, int]]:
        """Remove and return every ``(ledger_id, entry_id)`` whose bucket time is
        ``<= now_ms``, ordered by ``(bucket, ledger, entry)``.

        Runtime complexity: that of :meth:`pop_due_bitmaps` plus O(k) for k messages.
        """
        out: list[tuple[int, int]] = []
        for _, ledger, cell in self.pop_due_bitmaps(now_ms):
            out.extend((ledger, e) for e in cell)
        return out

    # -- the front of the time order ------------------------------------------

    def _front(self) -> tuple[int, Window, int] | None:
        """``(bucket, window, offset)`` of the earliest bucket holding a live
        copy, gathered into dense cells with its ghosts dropped; None if empty."""
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
            if self._gather(w, off, bucket):
                return bucket, w, off
        return None

    def _front_offset(self, w: Window) -> int:
        tail = len(w.packed) - w.upto
        if w.upto < 0 or tail > max(256, (w.upto - w.pos) >> 3):
            self._sort(w)  # first time at the front, or a long unsorted tail
        best = w.tail_min
        if w.pos < w.upto:
            best = min(best, self._lay.offset_of(w.packed[w.pos]))
        keys = w.dense_keys
        while keys and keys[0] not in w.dense:
            heapq.heappop(keys)
        return min(best, keys[0] >> 32) if keys else best

    def _sort(self, w: Window) -> None:
        """Sort what is left of the window's array in place, in C. Runtime: O(w log w)."""
        self._reset_hot()  # the hot run's copies no longer sit at the tail
        if w.pos:
            del w.packed[:w.pos]
        if w.packed:
            w.view().sort()
        w.pos, w.upto, w.tail_min = 0, len(w.packed), Window.NO_TAIL

    def _gather(self, w: Window, off: int, bucket: int) -> bool:
        """Move the sparse copies of bucket ``off`` into its dense cells and
        drop its ghost copies. Runtime: O(log w + k) for k copies from the
        sorted part; O(t) in C more when the unsorted tail of t has some.
        Returns whether the bucket holds a live copy."""
        lay, packed = self._lay, w.packed
        parts: list[array.array] = []  # packed values of this bucket
        if w.pos < w.upto and lay.offset_of(packed[w.pos]) == off:
            j = w.upto if off == self._omask else bisect.bisect_left(
                packed, (off + 1) << lay.offset_shift, w.pos, w.upto)
            parts.append(packed[w.pos:j])
            w.pos = j
        if w.tail_min == off:
            view = w.view()
            tail = view[w.upto:]
            offs = lay.offsets(tail)
            hit = offs == off
            got = array.array("Q")
            got.frombytes(tail[hit].tobytes())
            parts.append(got)
            rest, rest_offs = tail[~hit], offs[~hit]
            del view, tail
            del packed[w.upto:]
            packed.frombytes(rest.tobytes())
            w.tail_min = int(rest_offs.min()) if len(rest_offs) else Window.NO_TAIL
        if parts:
            self._reset_hot()
            if w.pos * 8 >= len(packed):  # cut the taken prefix (an eighth): amortised O(1)
                del packed[:w.pos]
                w.upto -= w.pos
                w.pos = 0
            for s, ids in self._by_slot(parts):
                cell = w.dense.get(off << 32 | s)
                self._set_cell(w, off, s, ids if cell is None else merge_into(cell, ids))
        if self._ghost_copies:
            return self._drop_ghosts(w, off, bucket)
        return bool(w.dense_keys) and w.dense_keys[0] >> 32 == off

    def _by_slot(self, parts: list[array.array]) -> Iterator[tuple[int, BitMap]]:
        """Packed values of one bucket as ``(slot, bitmap of entry ids)``: a
        Python loop for a few values, numpy (no object per value) for many."""
        smask = self._slot_limit - 1
        if sum(map(len, parts)) <= 64:
            by_slot: dict[int, list[int]] = {}
            for part in parts:
                for v in part:
                    by_slot.setdefault(v >> 32 & smask, []).append(v & M32)
            for s, ids in by_slot.items():
                yield s, BitMap(ids)
            return
        vals = np.concatenate([np.frombuffer(p, dtype=np.uint64) for p in parts if p])
        slots = (vals >> np.uint64(32)) & np.uint64(smask)
        entries = (vals & np.uint64(M32)).astype(np.uint32)
        for s in np.unique(slots).tolist():
            ids = BitMap()
            ids.update(array.array("I", entries[slots == s].tobytes()))
            yield s, ids

    def _drop_ghosts(self, w: Window, off: int, bucket: int) -> bool:
        """Drop the ghost copies of bucket ``off`` (all its copies are in dense
        cells by now); return whether a live copy is left."""
        cells = self._take_cells(w, off)
        for slot, cell in cells.items():
            led = self._ledgers[slot]
            if led.ghost is not None:
                for e in common(cell, led.ghost):
                    key = (slot, e)
                    ghost = self._ghosts[key]
                    if ghost.is_live_in(bucket):
                        continue
                    cell.discard(e)
                    self._ghost_copies -= 1
                    ghost.count -= 1
                    if not ghost.count:
                        self._unghost(led, key)
            if cell:
                self._set_cell(w, off, slot, cell)
            else:
                if self._hot_dense is cell:
                    self._reset_hot()
                if led.ghost is None and not self._has_live(led):
                    self._drop_ledger(led)
        return bool(w.dense_keys) and w.dense_keys[0] >> 32 == off

    # -- looking --------------------------------------------------------------

    def next_due_ms(self) -> int | None:
        """The earliest bucket time, or ``None`` when empty.

        Runtime complexity: O(1) amortised; the first call after a window
        reaches the front sorts it (O(w log w) in C) and each call with a
        bucket taken since costs O(w) in C to gather the front bucket.
        """
        front = self._front()
        return None if front is None else front[0]

    def __len__(self) -> int:
        """Pending occurrences (a message pending in two buckets counts twice). O(1)."""
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, item: object) -> bool:
        """``(ledger_id, entry_id) in index``. Runtime complexity: O(1)."""
        try:
            ledger_id, entry_id = item  # type: ignore[misc]
        except (TypeError, ValueError):
            return False
        if type(ledger_id) is not int or type(entry_id) is not int or entry_id < 0:
            return False
        led = self._by_id.get(ledger_id)
        return led is not None and self._has(led, entry_id)

    def has_ledger(self, ledger_id: int) -> bool:
        """Whether anything of this ledger is pending. Runtime complexity: O(1)."""
        led = self._by_id.get(ledger_id)
        return led is not None and self._has_live(led)

    def bucket_count(self) -> int:
        """Distinct bucket times pending. Runtime complexity: O(n log n) (walks everything)."""
        return len({bucket for bucket, _, _ in self.iter_bitmaps()})

    def bitmap_count(self) -> int:
        """``(bucket, ledger)`` cells pending. Runtime complexity: O(n log n) (walks everything)."""
        return sum(1 for _ in self.iter_bitmaps())

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
            view = w.view()[w.pos:]
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
                led = self._ledgers[slot]
                if led.ghost is not None:
                    for e in common(cell, led.ghost):
                        if not self._ghosts[(slot, e)].is_live_in(bucket):
                            cell.discard(e)
                if cell:
                    rows.append((bucket, led.ledger_id, cell))
            rows.sort(key=lambda r: r[:2])
            yield from rows

    def compact(self) -> None:
        """Run-optimise and shrink every bitmap (live sets and dense cells).

        Never needed for correctness: the index compacts a cell when a run of
        adds to it ends and a ledger's live set every few thousand changes.
        Runtime complexity: O(all containers).
        """
        self._compact_live()
        for w in self._windows.values():
            for cell in w.dense.values():
                cell.run_optimize()
                cell.shrink_to_fit()

    def nbytes(self) -> int:
        """Bytes this index holds: Python objects, arrays and CRoaring's C heap.

        Runtime complexity: O(windows + cells + ledgers + ids pending in two
        buckets or acked while pending); never O(messages).
        """
        size = sys.getsizeof
        total = _roaring_bytes(self._live) + (size(self) + size(self._windows) + size(self._wheap) + size(self._by_id)
                 + size(self._ledgers) + size(self._free) + size(self._multi) + size(self._ghosts))
        for wid, w in self._windows.items():
            total += size(wid) + size(w) + size(w.packed)
            if w.dense is not NO_CELLS:
                total += size(w.dense) + size(w.dense_keys) + sum(map(size, w.dense))
                total += sum(map(_roaring_bytes, w.dense.values()))
        for led in self._ledgers:
            if led is not None:
                total += size(led) + size(led.ledger_id) + size(led.slot) + size(led.key)
                if led.wide is not None:
                    total += _roaring_bytes(led.wide)
                for extra in (led.multi, led.ghost):
                    if extra is not None:
                        total += size(extra) + sum(map(size, extra))
        for key, ghost in self._ghosts.items():
            total += size(key) + size(ghost) + (size(ghost.revived) if ghost.revived is not None else 0)
        total += sum(size(key) + size(n) for key, n in self._multi.items())
        return total

    def __repr__(self) -> str:
        return (f"TimeBucketIndex(precision_bits={self.precision_bits}, "
                f"rounding={self.rounding!r}, pending={len(self)}, windows={len(self._windows)})")
