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
from typing import Final, Iterable, Iterator, cast

from pyroaring import BitMap, BitMap64

from .._checks import MAX_DUE, check_int, entry_array, message_id
from ..precision import Precision
from . import layout
from ._ledgers import Ledgers
from ._live import LiveIds, in_listed, listed_cells
from ._windows import Windows
from .bitmaps import common, merge_into, overlaps
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
                 "_ledgers", "_ids", "_time", "_windows", "_by_id", "_count",
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

        Runtime complexity: O(1) amortised: an append, or a bitmap add for a
        cell in a run (or a listed cell), after one bitmap
        lookup (plus at most ``LISTED`` for an id not above its ledger's
        listed cells). A message already pending: see ``_add_again``; the
        live bitmap's one-time re-keying: ``layout.LIVE_ENTRY_BITS``.
        """
        if (type(ledger_id) is not int or type(entry_id) is not int or type(due_ms) is not int
                or (ledger_id | entry_id) >> 63 or due_ms >> 62):  # negative or too large
            ledger_id, entry_id, due_ms = _checked(ledger_id, entry_id, due_ms)
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
        if type(ledger_id) is not int or type(due_ms) is not int or ledger_id >> 63 or due_ms >> 62:
            ledger_id = check_int("ledger_id", ledger_id)
            due_ms = check_int("due_ms", due_ms, MAX_DUE)
        batch = entry_array(entry_ids)
        if len(batch) < PROMOTE:
            for e in batch:
                self.add(ledger_id, e, due_ms)
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
                self.add(ledger_id, e, due_ms)
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
        front = self._front()
        return None if front is None else front[0]

    @property
    def rounding(self) -> str:
        """``"floor"`` or ``"ceil"`` (see :class:`~nacktracker.precision.Precision`)."""
        return self.precision.rounding

    def __len__(self) -> int:
        """Pending occurrences (a message pending in two buckets counts twice). O(1)."""
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, item: object) -> bool:
        """``(ledger_id, entry_id) in index``. Runtime complexity: O(1): a
        bitmap lookup plus at most ``LISTED`` (the ledger's listed cells)."""
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
        slot = self._by_id.get(ledger_id)
        return slot is not None and self._ids.has_live(slot)

    def compact(self) -> None:
        """Run-optimise and shrink the dense cells, shrink the live bitmap
        (never run-optimised: see ``LiveIds.compact``).

        Never needed for correctness: the index compacts a cell when a run of
        adds to it ends and a ledger's live set every few thousand changes.
        Runtime complexity: O(all containers).
        """
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
        return self._time.count(buckets_only=True)

    def bitmap_count(self) -> int:
        """``(bucket, ledger)`` cells pending. Runtime complexity: O(n log n)
        in C, as :meth:`bucket_count` (and the same caveat)."""
        return self._time.count(buckets_only=False)

    def bucket_count_bound(self) -> int:
        """An upper bound on :meth:`bucket_count` for gauges read often
        (``NegativeAcksTracker.stats()``, every metrics scrape): a window with
        at most ``SMALL_WINDOW`` (64) copies left is counted exactly, a larger
        one as the fewer of its copies (sparse copies left plus dense cells)
        and the buckets one window spans (at least 8). Exact when each window
        is small; ghosts count as in :meth:`bucket_count`. Runtime
        complexity: O(windows), never O(messages)."""
        return self._time.count_bound(1 << self._lay.offset_bits, buckets_only=True)

    def bitmap_count_bound(self) -> int:
        """An upper bound on :meth:`bitmap_count`, as :meth:`bucket_count_bound`:
        small windows exactly, a larger one as the fewer of its copies and the
        cells it can hold (buckets one window spans × ledger slots ever handed
        out, which no slot in a window reaches). Exact when each window is
        small or each copy is alone in its ``(bucket, ledger)`` cell.
        Runtime complexity: O(windows), never O(messages)."""
        return self._time.count_bound((1 << self._lay.offset_bits) * len(self._ledgers.lid), buckets_only=False)

    def iter_bitmaps(self) -> Iterator[tuple[int, int, Cell]]:
        """``(bucket_ms, ledger_id, bitmap)`` of the live copies in order, without
        removing them. The bitmaps are fresh: mutating them changes nothing.
        Runtime complexity: O(n log n) for n copies."""
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
        # its counters and the hot bucket's time, each as an int object of its own whatever its value
        # (shared small ints below 257: up to 64 B more than held), so an empty index always reads the same
        return (held_size(self) + COUNTER_INTS * held_size(1 << 40)
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

