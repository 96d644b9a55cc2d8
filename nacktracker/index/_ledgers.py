"""The ledger table of :class:`~nacktracker.index.TimeBucketIndex`: ledger
id <-> slot, and each slot's rare state (:class:`~.layout.LedgerExt`)."""

from __future__ import annotations

from typing import Final

from .layout import SMALL_INT, LedgerExt, held_size, roaring_bytes

#: Shared empties (never written to): an index that never frees a slot or
#: never needs a ledger record does not pay for the list.
NO_SLOTS: Final[list[int]] = []
NO_EXTS: Final[list[LedgerExt | None]] = []


class Ledgers:
    """Ledger ids by slot and slots by ledger id, recycled as ledgers leave.

    Invariants: ``by_id`` and ``lid`` mirror each other (a freed slot holds
    None and is in ``free``); ``ext`` is the shared empty until some ledger
    needs a record, then holds one item per slot, a record only while it has
    something in it (see :meth:`tidy`).
    """

    __slots__ = ("by_id", "lid", "ext", "free")

    def __init__(self) -> None:
        self.by_id: dict[int, int] = {}  # ledger id -> its slot
        self.lid: list[int | None] = []  # slot -> ledger id (None: a free slot)
        # slot -> the ledger's rare state or None; the shared empty until a ledger needs one
        self.ext: list[LedgerExt | None] = NO_EXTS
        self.free: list[int] = NO_SLOTS  # freed slots, made on first use

    def slot(self, ledger_id: int) -> int:
        """The ledger's slot, a new one (a freed slot first) if it has none. Runtime: O(1)."""
        slot = self.by_id.get(ledger_id)
        if slot is not None:
            return slot
        lids = self.lid
        slot = self.free.pop() if self.free else len(lids)
        if slot == len(lids):
            lids.append(ledger_id)
            if self.ext is not NO_EXTS:
                self.ext.append(None)
        else:
            lids[slot] = ledger_id
        self.by_id[ledger_id] = slot
        return slot

    def ledger_id(self, slot: int) -> int:
        """The ledger id of a slot in use."""
        lid = self.lid[slot]
        assert lid is not None, slot
        return lid

    def ext_at(self, slot: int) -> LedgerExt | None:
        """The ledger's rare state, or None. Runtime: O(1)."""
        exts = self.ext
        return exts[slot] if exts else None

    def ext_of(self, slot: int) -> LedgerExt:
        """The ledger's rare state, made on first use."""
        ext = self.ext_at(slot)
        if ext is None:
            if self.ext is NO_EXTS:  # the first record: a list slot per ledger from now on
                self.ext = [None] * len(self.lid)
            ext = self.ext[slot] = LedgerExt()
        return ext

    def tidy(self, slot: int) -> None:
        """Drop the ledger's rare state once nothing is left in it (call at the
        end of an operation: callers may hold the record until then)."""
        ext = self.ext_at(slot)
        if ext is not None and ext.empty():
            self.ext[slot] = None

    def drop(self, slot: int) -> None:
        """The ledger leaves (no live id, no copy in any cell); its slot is free."""
        lid = self.lid[slot]
        assert lid is not None, slot
        del self.by_id[lid]
        self.lid[slot] = None
        if self.ext:
            self.ext[slot] = None
        if self.free is NO_SLOTS:
            self.free = []
        self.free.append(slot)

    def nbytes(self) -> int:
        """Bytes of the table and the ledgers' records (their bitmaps
        included; listed cells are counted with their windows). Runtime:
        O(ledgers + ids in their records)."""
        size = held_size
        total = size(self) + size(self.by_id) + size(self.lid)
        total += sum(size(c) for c in (self.free, self.ext) if c is not NO_SLOTS and c is not NO_EXTS)
        for slot, lid in enumerate(self.lid):
            if lid is None:
                continue
            total += size(lid) + (size(slot) if slot > SMALL_INT else 0)  # CPython shares the ints up to 256
            ext = self.ext_at(slot)
            if ext is not None:
                total += size(ext)
                if ext.wide is not None:
                    total += roaring_bytes(ext.wide)
                if ext.cells is not None:  # its bitmaps, windows and keys are counted with the windows
                    total += size(ext.cells) + size(ext.hi)
                for extra in (ext.multi, ext.ghost):
                    if extra is not None:
                        total += size(extra) + sum(map(size, extra))
        return total
