"""The live-id set of :class:`~nacktracker.index.TimeBucketIndex`: which
``(ledger slot, entry)`` are pending anywhere, the ledgers' listed dense
cells (ids stored there only), the ids pending in two or more buckets and
the ghosts (copies of acked ids still sitting in cells)."""

from __future__ import annotations

from typing import Final, cast

import numpy as np
from pyroaring import BitMap, BitMap64

from ._ledgers import Ledgers
from .bitmaps import common, has, u32_array, u64_array
from .layout import (
    COMPACT_CHURN,
    LISTED,
    LISTING,
    LIVE_ENTRY_BITS,
    LIVE_SLOT_BITS,
    WIDE_LIVE_SHIFT,
    Cell,
    Ghost,
    LedgerExt,
    Window,
    held_size,
    roaring_bytes,
)

#: Ids re-keyed per step into the wide live bitmap (``widen``, ``keyed``):
#: temporaries of 20 bytes per id, 40 KB a step, below glibc's 64 KB, so they
#: come from the heap's free chunks and go back to them instead of growing
#: its top (which the heap keeps).
KEY_SLICE = 2048
#: The shared empties of the rarely used dicts (never written to): an index
#: with a few ids does not pay for them.
NO_MULTI: Final[dict[tuple[int, int], int]] = {}
NO_GHOSTS: Final[dict[tuple[int, int], Ghost]] = {}


class LiveIds:
    """"Pending anywhere", by ledger slot.

    ``bits``: ``slot << shift | entry`` of every live id below 2^32 but those
    stored in a listed cell only (``shift`` 22 in a ``BitMap``, then 32 in a
    ``BitMap64``: see :data:`~.layout.LIVE_ENTRY_BITS`); ids >= 2^32 are in
    their ledger's ``wide``. ``multi``: ``(slot, entry)`` -> live occurrences
    (>= 2), mirrored by the ledger's ``multi`` set; such an id is always in
    ``bits``. ``ghosts``: ``(slot, entry)`` -> :class:`~.layout.Ghost`,
    mirrored by the ledger's ``ghost`` set; ``ghost_copies`` counts their
    copies. ``churn``: changes to ``bits`` since its last compaction.
    """

    __slots__ = ("ledgers", "bits", "shift", "churn", "compact_at", "refitted", "multi", "ghosts", "ghost_copies")

    def __init__(self, ledgers: Ledgers) -> None:
        self.ledgers = ledgers
        self.bits: BitMap | BitMap64 = BitMap()
        self.shift = LIVE_ENTRY_BITS
        self.churn, self.compact_at = 0, COMPACT_CHURN  # changes to bits until its next compaction
        self.refitted = False  # bits shrunk to fit at least once (its containers grew back from there)
        self.multi: dict[tuple[int, int], int] = NO_MULTI
        self.ghosts: dict[tuple[int, int], Ghost] = NO_GHOSTS
        self.ghost_copies = 0

    # -- membership -----------------------------------------------------------

    def has(self, slot: int, entry_id: int) -> bool:
        """Whether the id is pending. Runtime: O(1): a bitmap lookup, plus at
        most LISTED more for an id not above the ledger's listed ids."""
        exts = self.ledgers.ext  # ext_at() inlined (membership tests)
        ext = exts[slot] if exts else None
        if entry_id >> 32:
            return ext is not None and ext.wide is not None and entry_id in ext.wide
        shift = self.shift
        if shift == LIVE_ENTRY_BITS and (entry_id >> LIVE_ENTRY_BITS or slot >> LIVE_SLOT_BITS):
            return False  # not pending: its first add would have widened the live bitmap
        return (slot << shift | entry_id) in self.bits or (
            ext is not None and ext.cells is not None and entry_id <= ext.hi and in_listed(ext, entry_id))

    def has_live(self, slot: int) -> bool:
        """Whether the ledger has a live id. Runtime: O(log n) (two ranks)."""
        ext = self.ledgers.ext_at(slot)
        if ext is not None and (ext.wide is not None or ext.cells is not None):  # listed cells are never empty
            return True
        shift = self.shift
        if shift == LIVE_ENTRY_BITS and slot >> LIVE_SLOT_BITS:
            return False  # the live bitmap is narrow: none of its ids can be live
        key = slot << shift
        below = self.bits.rank(key - 1) if key else 0
        return self.bits.rank(key | ((1 << shift) - 1)) > below

    def claim_rare(self, slot: int, entry_id: int) -> bool:
        """``add``'s "already pending?" step for an id the narrow live bitmap
        cannot key, or of a ledger with rare state (ghosts, listed cells, ids
        pending twice): True if the id was not pending (it is live now and
        the caller stores its copy), False if the caller must add it again
        (it may meet a copy in its cell). Runtime: as ``add``."""
        ext = self.ledgers.ext_at(slot)
        if entry_id >> 32 or (ext is not None and ext.ghost is not None):
            return False
        if entry_id >> LIVE_ENTRY_BITS or slot >> LIVE_SLOT_BITS:
            if self.shift == LIVE_ENTRY_BITS:  # the first id the narrow live bitmap cannot key
                self.widen()
            key = slot << WIDE_LIVE_SHIFT | entry_id
        else:
            key = slot << self.shift | entry_id
        try:
            self.bits.add_checked(key)
        except KeyError:  # already pending somewhere
            return False
        if ext is not None and ext.cells is not None and entry_id <= ext.hi and in_listed(ext, entry_id):
            self.bits.discard(key)  # pending in a listed cell
            return False
        return True

    # -- one id in or out ---------------------------------------------------------

    def add(self, slot: int, entry_id: int) -> None:
        """One more live copy of the id (an id pending in two buckets is
        always in the live bitmap, not only in a listed cell: releasing one
        copy keeps it there for the other)."""
        if self.has(slot, entry_id):
            key = (slot, entry_id)
            if self.multi is NO_MULTI:
                self.multi = {}
            self.multi[key] = self.multi.get(key, 1) + 1
            ext = self.ledgers.ext_of(slot)
            if ext.multi is None:
                ext.multi = set()
            ext.multi.add(entry_id)
        if entry_id >> 32:
            ext = self.ledgers.ext_of(slot)
            if ext.wide is None:
                ext.wide = BitMap64()
            ext.wide.add(entry_id)
            return
        if self.shift == LIVE_ENTRY_BITS and (entry_id >> LIVE_ENTRY_BITS or slot >> LIVE_SLOT_BITS):
            self.widen()
        self.bits.add(slot << self.shift | entry_id)

    def remove(self, slot: int, entry_id: int) -> None:
        """The id is no longer live (its listed copies are handled apart)."""
        if entry_id >> 32:
            ext = self.ledgers.ext_at(slot)
            assert ext is not None and ext.wide is not None
            ext.wide.discard(entry_id)
            if not ext.wide:
                ext.wide = None
        else:
            self.bits.discard(slot << self.shift | entry_id)

    def acked(self, slot: int, entry_id: int, in_bits: bool, taken: int) -> int:
        """An ack of a pending id: leave the live state; the copies not taken
        out of listed cells (``taken``) become ghosts. Returns the live
        occurrences it had."""
        ext = self.ledgers.ext_at(slot)
        key = (slot, entry_id)
        n = 1
        if ext is not None and ext.multi is not None and entry_id in ext.multi:
            n = self.multi.pop(key)
            ext.multi.discard(entry_id)
            if not ext.multi:
                ext.multi = None
        if in_bits:
            self.remove(slot, entry_id)
        left = n - taken
        if left:
            self.ghost_copies += left
            ghost = self.ghosts.get(key)
            if ghost is None:
                if self.ghosts is NO_GHOSTS:
                    self.ghosts = {}
                self.ghosts[key] = Ghost(left)
                ext = self.ledgers.ext_of(slot)
                if ext.ghost is None:
                    ext.ghost = set()
                ext.ghost.add(entry_id)
            else:  # its live copies were exactly the revived ones
                ghost.count += left
                ghost.revived = None
        elif key in self.ghosts:  # no live copy left: none of its copies is revived
            self.ghosts[key].revived = None
        return n

    def ghost_of(self, slot: int, entry_id: int, ext: LedgerExt | None) -> Ghost | None:
        if ext is not None and ext.ghost is not None and entry_id in ext.ghost:
            return self.ghosts.get((slot, entry_id))
        return None

    def unghost(self, ext: LedgerExt, key: tuple[int, int]) -> None:
        """The last ghost copy of an id is gone."""
        del self.ghosts[key]
        assert ext.ghost is not None
        ext.ghost.discard(key[1])
        if not ext.ghost:
            ext.ghost = None

    def release_multi(self, slot: int, ext: LedgerExt, cell: Cell) -> Cell:
        """A popped cell's ids also pending in another bucket lose one copy;
        return the cell's ids that leave the live state (those pending here only)."""
        assert ext.multi is not None
        still = []
        for e in common(cell, ext.multi):
            key = (slot, e)
            left = self.multi[key] - 1
            if left == 1:
                del self.multi[key]
                ext.multi.discard(e)
            else:
                self.multi[key] = left
            still.append(e)
        if not ext.multi:
            ext.multi = None
        if not still:
            return cell
        gone = type(cell)(cell)
        for e in still:
            gone.discard(e)
        return gone

    def release(self, slot: int, ids: Cell) -> None:
        """Ids of a popped cell leave the live bitmap; compacts it when due."""
        self.bits.difference_update(self.keyed(slot, ids))  # type: ignore[arg-type]
        if self.churn >= self.compact_at:
            self.compact()

    # -- the listed cells -----------------------------------------------------------

    def list_cell(self, slot: int, cell: Cell, w: Window, key: int) -> None:
        """List a new dense cell (its later ids skip the live bitmap); a ledger
        with LISTED cells listed already first flushes them into the live
        bitmap. Runtime: O(1), or O(ids in the flushed cells) in C."""
        ext = self.ledgers.ext_of(slot)
        if ext.cells is not None and len(ext.cells) >= LISTED * LISTING:
            self.flush_listed(slot, ext)
        # a new list of the exact size, not an append: no growth slack (a ledger
        # lists a cell once per run of adds, and the list holds at most 24 items)
        ext.cells = [cell, w, key] if ext.cells is None else ext.cells + [cell, w, key]
        if cell and cell.max() > ext.hi:
            ext.hi = cell.max()

    def flush_listed(self, slot: int, ext: LedgerExt) -> None:
        """Put the ids of the ledger's listed cells into the live bitmap and
        unlist them (ids >= 2^32 are in ``wide`` already). Runtime: O(ids) in C."""
        for cell in listed_cells(ext):
            keyed = self.keyed(slot, cell)
            self.bits |= keyed  # type: ignore[operator]
            self.churn += len(keyed)
        ext.cells, ext.hi = None, -1

    def relist(self, ext: LedgerExt, old: Cell, new: Cell) -> bool:
        """A listed cell replaced by a new object (widened to 64 bits) stays
        listed, and ``hi`` follows a listed cell's new ids. Returns whether
        ``old`` was listed. Runtime: O(LISTED)."""
        cells = ext.cells
        if cells is None:
            return False
        for i in range(0, len(cells), LISTING):
            if cells[i] is old:
                cells[i] = new
                if new and new.max() > ext.hi:
                    ext.hi = new.max()
                return True
        return False

    @staticmethod
    def unlist(ext: LedgerExt, cell: Cell) -> None:
        """The cell leaves the index (popped or emptied). Runtime: O(LISTED)."""
        cells = ext.cells
        assert cells is not None
        for i in range(0, len(cells), LISTING):
            if cells[i] is cell:
                del cells[i:i + LISTING]
                break
        if not cells:
            ext.cells, ext.hi = None, -1

    @staticmethod
    def drop_listed_id(ext: LedgerExt, entry_id: int) -> tuple[int, list[Cell]]:
        """An ack: remove the id from the ledger's listed cells (a cell emptied
        leaves its window); return how many held it and the cells emptied.
        Runtime: O(LISTED) bitmap lookups in C."""
        cells = ext.cells
        assert cells is not None
        held: list[int] | None = None
        narrow = not entry_id >> 32  # a 32-bit cell cannot hold a wider id (and would raise): has()
        for i in range(0, len(cells), LISTING):
            cell = cast(Cell, cells[i])
            if (entry_id in cell) if narrow else has(cell, entry_id):
                if held is None:
                    held = []
                held.append(i)
        if held is None:
            return 0, []
        emptied: list[Cell] = []
        for i in reversed(held):  # back to front: unlisting shifts the later cells
            cell, w, key = cast(Cell, cells[i]), cast(Window, cells[i + 1]), cast(int, cells[i + 2])
            cell.discard(entry_id)
            if not cell:
                del cells[i:i + LISTING]
                w.drop_cell(key)
                emptied.append(cell)
        if not cells:
            ext.cells, ext.hi = None, -1
        return len(held), emptied

    # -- the live bitmap's keys -----------------------------------------------------

    def widen(self) -> None:
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
        narrow, live = self.bits, BitMap64()
        assert type(narrow) is BitMap
        low = np.uint64((1 << LIVE_ENTRY_BITS) - 1)
        while narrow:
            part = narrow[0:KEY_SLICE]
            keys = np.frombuffer(part.to_array(), dtype=np.uint32).astype(np.uint64)
            keys = (keys >> np.uint64(LIVE_ENTRY_BITS)) << np.uint64(WIDE_LIVE_SHIFT) | (keys & low)
            live.update(u64_array(keys))
            narrow.remove_range(part.min(), part.max() + 1)
        self.bits, self.shift = live, WIDE_LIVE_SHIFT

    def keyed(self, slot: int, ids: Cell) -> BitMap | BitMap64:
        """``ids`` below 2^32 as keys of ``bits`` (narrow ones, while it is:
        every id below 2^32 in a cell went through the live bitmap, which
        widened for any other). Runtime: O(k) in C."""
        if type(ids) is BitMap64:  # its ids below 2^32, as a 32-bit bitmap
            values = np.asarray(ids.to_array(), dtype=np.uint64)
            narrow = BitMap()
            narrow.update(u32_array(values[:np.searchsorted(values, 1 << 32)]))
            ids = narrow
        if self.shift == LIVE_ENTRY_BITS:
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

    def compact(self) -> None:
        """Shrink ``bits`` to fit: every quarter of its size in changes (at
        least COMPACT_CHURN), so amortised O(1) per change. Never
        run-optimised: ``add_checked`` on a run container costs O(runs) (CRoaring
        counts its cardinality), and consecutive nacks (k=1) left runs of
        runs: uniform k=1 L=1 100/s bits 10 (``index_grid.py --one``) read
        add 2.08x DictIndex with it, 1.67x without. Without it, four k=1 cells
        read 0.4 B per pending more RSS in one, the same in one, 2 B less in two."""
        self.bits.shrink_to_fit()
        self.refitted = True
        self.churn, self.compact_at = 0, max(COMPACT_CHURN, len(self.bits) >> 2)

    def nbytes(self) -> int:
        """Bytes of the live bitmap (at the capacity CRoaring grows it to), the
        multi and ghost records. Runtime: O(ids pending twice or acked while pending)."""
        size = held_size
        total = size(self) + roaring_bytes(self.bits, grown=True, refit=self.refitted)
        total += sum(size(c) for c in (self.multi, self.ghosts) if c is not NO_MULTI and c is not NO_GHOSTS)
        for key, ghost in self.ghosts.items():
            total += size(key) + size(ghost) + (size(ghost.revived) if ghost.revived is not None else 0)
        total += sum(size(key) + size(n) for key, n in self.multi.items())
        return total


def in_listed(ext: LedgerExt, entry_id: int) -> bool:
    """Whether a listed cell of the ledger holds the id (a live copy: listed
    cells hold no ghost); the id is below 2^32 (64-bit ids are in ``wide``).
    Runtime: O(LISTED) bitmap lookups in C."""
    for cell in ext.cells[::LISTING]:  # type: ignore[index]
        if entry_id in cell:  # type: ignore[operator]
            return True
    return False


def listed_cells(ext: LedgerExt) -> list[Cell]:
    """The ledger's listed cells (none: empty)."""
    return cast(list[Cell], ext.cells[::LISTING]) if ext.cells is not None else []

