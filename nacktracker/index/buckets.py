"""TimeBucketIndex: PIP-393's trimmed due time -> ledger -> entry ids, laid
out to stay small on real client traffic (sparse cells) and on seed 000's
dense bursts alike. The pieces are in :mod:`._parts`, placing copies in
:mod:`._cells`, taking buckets off the front in :mod:`._front`, counts,
ordered bitmaps and ``nbytes()`` in :mod:`._views`; the layout is:

* windows of ``2^max(bits + 3, 14)`` ms in a dict, their ids in a heap (the time
  order: one entry per window, not per bucket or per (bucket, ledger));
* inside a window, sparse copies packed 8 bytes each in ``array('Q')``
  segments of 512 (sorted across them in C when the window comes to the
  front, dropped whole as its buckets are taken), and dense cells (one
  Roaring bitmap per (bucket, ledger)) for runs of adds to one cell;
* an index-wide "pending anywhere" bitmap of ``slot << 22 | entry`` (32-bit;
  ``slot << 32 | entry`` in a ``BitMap64`` once an id needs it), plus,
  per ledger, up to ``LISTED`` (8) *listed* dense cells whose ids are not in
  it (a burst into one cell, seed 000's case, is stored once): an ack of a
  message that is not pending is one bitmap lookup plus at most 8 (none for
  an id above the ledger's listed ids), and an ack of a pending one takes it
  out of the listed cells and marks its other copies as ghosts that are
  dropped when their bucket is taken (no search).
"""

from __future__ import annotations

import array
from typing import Iterable

from pyroaring import BitMap, BitMap64

from .._checks import MAX_DUE, check_int, check_precision, entry_array, message_id
from ._cells import CellsMixin
from ._front import FrontMixin
from ._parts import COMPACT_CHURN, LIVE_ENTRY_BITS, LIVE_SLOT_BITS, WIDE_LIVE_SHIFT, NO_ENTRIES, NO_PACKED, NO_SLOTS, PROMOTE, SEGMENT, Ghost, Layout, LedgerExt, LISTING, Window, merge_into, overlaps
from ._views import ViewsMixin

__all__ = ["TimeBucketIndex"]
# add() inlines the narrow bounds of the live bitmap (a literal, not a
# global name lookup, on its hottest path)
assert LIVE_ENTRY_BITS == 22 and LIVE_SLOT_BITS == 10 and WIDE_LIVE_SHIFT == 32


class TimeBucketIndex(FrontMixin, CellsMixin, ViewsMixin):
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

    __slots__ = ("precision_bits", "rounding", "_add", "_mask", "_lay", "_wshift", "_cshift", "_omask",
                 "_slot_limit", "_windows", "_wheap", "_by_id", "_lid", "_ext", "_free", "_multi", "_ghosts",
                 "_ghost_copies", "_count", "_live", "_live_shift", "_churn", "_compact_at", "_refitted", "_hot_bucket", "_hot_slot", "_hot_lid",
                 "_hot_win", "_hot_off", "_hot_dense", "_hot_start", "_hot_listed")

    def __init__(self, precision_bits: int = 8, rounding: str = "floor") -> None:
        self._add, self._mask = check_precision(precision_bits, rounding)
        self.precision_bits: int = precision_bits
        self.rounding: str = rounding
        lay = self._lay = Layout.for_bits(precision_bits)
        self._wshift, self._slot_limit = lay.window_shift, lay.slot_limit
        # a copy packs as (offset << _cshift | slot) << 32 | entry: two small-int ops, then the 64-bit ones
        self._cshift = lay.offset_shift - 32
        self._omask = lay.offset_mask
        self._windows: dict[int, Window] = {}
        self._wheap: list[int] = []  # window ids; one per window in _windows
        self._by_id: dict[int, int] = {}  # ledger id -> its slot
        self._lid: list[int | None] = []  # slot -> ledger id (None: a free slot)
        # slot -> the ledger's rare state or None; the shared empty until a ledger needs one
        self._ext: list[LedgerExt | None] = NO_SLOTS
        # made on first use (shared empties until then: see NO_ENTRIES)
        self._free: list[int] = NO_SLOTS  # freed slots
        self._multi: dict[tuple[int, int], int] = NO_ENTRIES  # (slot, entry) -> live occurrences (>= 2)
        self._ghosts: dict[tuple[int, int], Ghost] = NO_ENTRIES  # (slot, entry) -> acked copies still in cells
        self._ghost_copies = 0
        self._count = 0  # live occurrences
        # slot << _live_shift | entry of every live id < 2^32: 22 in a BitMap, then 32 (see LIVE_ENTRY_BITS)
        self._live: BitMap | BitMap64 = BitMap()
        self._live_shift = LIVE_ENTRY_BITS
        self._churn, self._compact_at = 0, COMPACT_CHURN  # changes to _live until its next compaction
        self._refitted = False  # _live shrunk to fit at least once (its containers grew back from there)
        self._reset_hot()

    def bucket_of(self, due_ms: int) -> int:
        """The bucket time a due time maps to. Runtime complexity: O(1)."""
        return (check_int("due_ms", due_ms, MAX_DUE) + self._add) & self._mask

    def add(self, ledger_id: int, entry_id: int, due_ms: int) -> None:
        """Track ``(ledger_id, entry_id)`` as due at ``due_ms`` (monotonic ms).

        Ids are ints in ``[0, 2^63)``, ``due_ms`` in ``[0, 2^62)``; anything
        else raises ``TypeError``/``ValueError`` and changes nothing.

        Runtime complexity: O(1) amortised (an append, or a bitmap add for a
        cell in a run; the "already pending?" check is one bitmap lookup plus
        at most ``LISTED`` for an id not above its ledger's listed cells). A
        message already pending (or acked while pending) also checks its
        cell: O(log w + t) for a window of w sparse copies with an unsorted
        tail of t. Once per index, the first entry id in ``[2^22, 2^32)`` (or
        the first ledger past 1,024 pending at once) re-keys the live bitmap as
        64-bit: O(n) in C for n live ids (see ``_parts.LIVE_ENTRY_BITS``).
        """
        if (type(ledger_id) is not int or type(entry_id) is not int or type(due_ms) is not int
                or (ledger_id | entry_id) >> 63 or due_ms >> 62):  # negative or too large
            ledger_id = check_int("ledger_id", ledger_id)
            entry_id = check_int("entry_id", entry_id)
            due_ms = check_int("due_ms", due_ms, MAX_DUE)
        bucket = (due_ms + self._add) & self._mask
        if ledger_id == self._hot_lid:
            slot = self._hot_slot
            if bucket == self._hot_bucket:  # a burst into the last cell
                exts = self._ext
                ext = exts[slot] if exts else None
                if entry_id > 4194303 or slot > 1023 or (ext is not None and ext.ghost is not None):
                    if entry_id >> 32 or (ext is not None and ext.ghost is not None):
                        self._add_again(slot, entry_id, bucket)
                        return
                    if self._live_shift == 22:  # the first id the narrow live bitmap cannot key
                        self._widen_live()
                    key = slot << 32 | entry_id
                else:
                    key = slot << self._live_shift | entry_id
                live = self._live
                if self._hot_listed:  # a listed dense cell (so ext is set): the id is stored there only
                    if key in live or (entry_id <= ext.hi and self._in_listed(ext, entry_id)):
                        self._add_again(slot, entry_id, bucket)
                        return
                    self._hot_dense.add(entry_id)
                    if entry_id > ext.hi:
                        ext.hi = entry_id
                    self._count += 1
                    return
                try:
                    live.add_checked(key)
                except KeyError:  # already pending somewhere
                    self._add_again(slot, entry_id, bucket)
                    return
                if ext is not None and ext.cells is not None and entry_id <= ext.hi and self._in_listed(ext, entry_id):
                    live.discard(key)  # pending in a listed cell
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
                slot = self._ledger(ledger_id)
        exts = self._ext
        if entry_id > 4194303 or slot > 1023 or (exts and exts[slot] is not None):  # compares: specialised for small ints
            if not self._live_add_rare(slot, entry_id, bucket):  # a wide key, or the ledger has rare state
                return
        else:
            try:
                self._live.add_checked(slot << self._live_shift | entry_id)
            except KeyError:  # already pending somewhere
                self._add_again(slot, entry_id, bucket)
                return
        self._count += 1
        try:
            w = self._windows[bucket >> self._wshift]
        except KeyError:  # a new window
            self._put(slot, entry_id, bucket)
            return
        if self._hot_dense is not None:
            self._put(slot, entry_id, bucket)
            return
        off = (bucket >> self.precision_bits) & self._omask
        dense = w.dense
        if dense and (off << 32 | slot) in dense:  # the cell is a bitmap
            self._put(slot, entry_id, bucket)
            return
        # another sparse cell of an existing window (interleaved traffic): inline
        # _make_hot. The live bitmap's compaction is paced by pops (adds only grow it).
        packed = w.packed
        n = len(packed)
        if n >= SEGMENT:
            packed, n = w.roll(), 0
        elif packed is NO_PACKED:
            packed = w.packed = array.array("Q")
        packed.append((off << self._cshift | slot) << 32 | entry_id)
        if w.opened and off < w.tail_min:  # an add into a window already open
            w.tail_min = off
        self._hot_start = n
        self._hot_bucket = bucket
        self._hot_slot = slot
        self._hot_lid = ledger_id
        self._hot_win = w
        self._hot_off = off

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
        slot = self._ledger(ledger_id)
        ext = self._ext_at(slot)
        if self._live_shift == LIVE_ENTRY_BITS:  # ids below 2^32 the narrow live bitmap cannot key?
            narrow = type(new) is BitMap
            if (new.max() >> LIVE_ENTRY_BITS if narrow else new.range_cardinality(1 << LIVE_ENTRY_BITS, 1 << 32)) or (
                    slot >> LIVE_SLOT_BITS and (narrow or new.min() >> 32 == 0)):
                self._widen_live()
        keyed = self._keyed(slot, new)
        if keyed.intersect(self._live) or (ext is not None and (ext.ghost is not None or (
                ext.wide is not None and type(new) is BitMap64 and new.intersect(ext.wide)) or (
                ext.cells is not None and any(overlaps(new, c) for c in ext.cells[::LISTING])))):
            for e in new:
                self.add(ledger_id, e, due_ms)
            return
        bucket = (due_ms + self._add) & self._mask
        self._live |= keyed
        if type(new) is BitMap64 and new.max() >> 32:
            ext = self._ext_of(slot)
            ext.wide = merge_into(ext.wide or BitMap64(), BitMap64(e for e in new if e >> 32))
        n = len(new)
        self._churn += n
        self._count += n
        w, off, cell = self._make_hot(slot, bucket)
        self._hot_dense = self._set_cell(w, off, slot, new if cell is None else merge_into(cell, new))
        if cell is None:
            self._hot_start = 0  # the new cell's size before this batch

    def discard(self, ledger_id: int, entry_id: int) -> bool:
        """Remove every pending occurrence of ``(ledger_id, entry_id)`` (an ack).

        Returns whether anything was pending. Runtime complexity: O(1): one
        bitmap lookup when the message is not pending, plus at most
        :data:`~._parts.LISTED` for an id not above its ledger's listed dense
        cells; when it is pending, it leaves the listed cells holding it and
        its other copies become ghosts (a small record each) dropped when
        their bucket is taken.
        """
        if type(ledger_id) is not int or type(entry_id) is not int or (ledger_id | entry_id) >> 63:
            ledger_id = check_int("ledger_id", ledger_id)
            entry_id = check_int("entry_id", entry_id)
        slot = self._by_id.get(ledger_id)
        if slot is None:
            return False
        exts = self._ext  # _ext_at() inlined: every acknowledge comes here
        ext = exts[slot] if exts else None
        if entry_id >> 32:
            in_live = ext is not None and ext.wide is not None and entry_id in ext.wide
        elif self._live_shift == LIVE_ENTRY_BITS and (entry_id >> LIVE_ENTRY_BITS or slot >> LIVE_SLOT_BITS):
            in_live = False  # the narrow live bitmap cannot key it: it was never added
        else:
            in_live = (slot << self._live_shift | entry_id) in self._live
        taken = 0  # copies removed from listed cells (no ghost left for them)
        if ext is not None and ext.cells is not None and entry_id <= ext.hi:
            taken = self._drop_listed_id(ext, entry_id)
        if not in_live and not taken:
            return False
        key = (slot, entry_id)
        n = 1
        if ext is not None and ext.multi is not None and entry_id in ext.multi:
            n = self._multi.pop(key)
            ext.multi.discard(entry_id)
            if not ext.multi:
                ext.multi = None
        if in_live:
            self._live_discard(slot, entry_id)
        self._count -= n
        n -= taken
        if n:
            self._ghost_copies += n
            ghost = self._ghosts.get(key)
            if ghost is None:
                if self._ghosts is NO_ENTRIES:
                    self._ghosts = {}
                self._ghosts[key] = Ghost(n)
                ext = self._ext_of(slot)
                if ext.ghost is None:
                    ext.ghost = set()
                ext.ghost.add(entry_id)
            else:  # its live copies were exactly the revived ones
                ghost.count += n
                ghost.revived = None
        elif key in self._ghosts:  # no live copy left: none of its copies is revived
            self._ghosts[key].revived = None
        elif (ext is None or ext.ghost is None) and not self._has_live(slot):
            self._drop_ledger(slot)  # its only copies were in listed cells, now gone
            return True
        self._tidy(slot)
        return True

    def pop_due_bitmaps(self, now_ms: int) -> list[tuple[int, int, BitMap | BitMap64]]:
        """Remove everything due at ``now_ms``; return ``(bucket_ms, ledger_id,
        bitmap)`` triples in ``(bucket, ledger)`` order.

        The bulk form of :meth:`pop_due`: no Python object per message.
        Runtime complexity: O(w log w) in C per window reached (one sort
        across its segments the first time; again, merging its unsorted tail,
        when that tail grows past max(512, w/32)), then O(log w + k) per
        bucket taken for its k copies, plus O(c log c) for the c cells taken.
        """
        now_ms = check_int("now_ms", now_ms)
        out: list[tuple[int, int, BitMap | BitMap64]] = []
        while True:
            front = self._front(now_ms)
            if front is None or front[0] > now_ms:
                return out
            bucket, w, off = front
            if self._hot_win is w and self._hot_off == off:
                self._reset_hot()  # its cell leaves the index
            rows = []
            for slot, cell in self._take_cells(w, off).items():
                rows.append((self._lid[slot], cell))
                self._release(slot, w, bucket, cell)
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
        front = self._front()
        return None if front is None else front[0]

    def __len__(self) -> int:
        """Pending occurrences (a message pending in two buckets counts twice). O(1)."""
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, item: object) -> bool:
        """``(ledger_id, entry_id) in index``. Runtime complexity: O(1): a
        bitmap lookup plus at most ``LISTED`` (the ledger's listed cells)."""
        ids = message_id(item)
        if ids is None:
            return False
        ledger_id, entry_id = ids
        slot = self._by_id.get(ledger_id)
        return slot is not None and self._has(slot, entry_id)

    def has_ledger(self, ledger_id: int) -> bool:
        """Whether anything of this ledger is pending. Runtime complexity:
        O(1) with listed cells or 64-bit ids, else O(log n) (two ranks of the
        live bitmap, in C)."""
        slot = self._by_id.get(ledger_id)
        return slot is not None and self._has_live(slot)

    def compact(self) -> None:
        """Run-optimise and shrink the dense cells, shrink the live bitmap
        (never run-optimised: see ``_compact_live``).

        Never needed for correctness: the index compacts a cell when a run of
        adds to it ends and a ledger's live set every few thousand changes.
        Runtime complexity: O(all containers).
        """
        self._compact_live()
        for w in self._windows.values():
            for cell in w.dense.values():
                cell.run_optimize()
                cell.shrink_to_fit()

    def __repr__(self) -> str:
        return (f"TimeBucketIndex(precision_bits={self.precision_bits}, "
                f"rounding={self.rounding!r}, pending={len(self)}, windows={len(self._windows)})")
