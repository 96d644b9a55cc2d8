"""The named pieces :class:`~nacktracker.index.TimeBucketIndex` is made of.

A *window* covers ``2^max(bits + 3, 14)`` ms of bucket times. It holds the
*sparse* copies of its messages packed 8 bytes each in ``array('Q')``
segments of :data:`SEGMENT` (``offset | ledger slot | entry id``, see
:class:`Layout`), and the *dense*
cells — a Roaring bitmap per ``(bucket, ledger)`` — for cells that received a
run of :data:`PROMOTE` adds in a row, hold 64-bit entry ids, or are being
fired. An index-wide "pending anywhere" bitmap of ``ledger slot << 22 |
entry`` (32-bit; ``slot << 32 | entry`` once widened: :data:`LIVE_ENTRY_BITS`)
makes an ack of a message that is not pending O(1).
"""

from __future__ import annotations

import array
import mmap
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from pyroaring import BitMap, BitMap64

from .._checks import U32

#: A window spans at least 2^14 ms (16 s): big enough that sparse traffic
#: shares one window's segments (4 windows cover 60 s of delays), small enough
#: that sorting one window when it comes to the front (in C) stays near a
#: millisecond at 10,000 nacks/s.
WINDOW_BITS = 14
#: ... and at least 2^3 buckets: at coarse precisions (bits >= 12) a window of
#: one bucket paid its fixed cost (the window object and id, its dict of dense
#: cells: ~370 bytes) per bucket, where seed 000's bursts fill a bucket with a
#: handful of bitmaps (``bench/memory.py`` x=1 y=15: 0.029 -> 0.021 B/msg by
#: ``nbytes()``). The longer window costs a larger sort when it reaches the
#: front (``index_grid.parked(bits=12)``: the longest ``pop_due`` grows by
#: about a quarter at 10,000 nacks/s; at bits 15 taking one 32 s bucket dominates).
MIN_OFFSET_BITS = 3
#: A (bucket, ledger) cell that gets this many adds in a row becomes a Roaring
#: bitmap (2 bytes per id or less, runs for consecutive ids) instead of 8 bytes
#: per id in the window's array.
PROMOTE = 32
M32 = (1 << 32) - 1
#: A window keeps its sparse copies in segments of about this many (4 KiB):
#: the array appended to is set aside and a new one started once it holds
#: SEGMENT when a new run of adds starts (``Window.roll``), and segments are
#: dropped whole as buckets are taken. Windows fill while earlier ones drain;
#: with one array per window, grown in small steps and cut from the front,
#: the C heap was left fragmented: uniform k=3 L=1 1,000/s bits 0 grew 5.8
#: B/pending of free C heap beside 9.8 in use, and with segments none
#: (``python bench/heap_breakdown.py '<cell>' 0`` here and in a copy of 4bee518).
SEGMENT = 512
#: The live bitmap ("pending anywhere") starts as a 32-bit ``BitMap`` of
#: ``slot << LIVE_ENTRY_BITS | entry``: it holds the ids of ledger slots below
#: 2^LIVE_SLOT_BITS (1,024 ledgers pending at once) with entry ids below
#: 2^LIVE_ENTRY_BITS (4,194,304; a broker rolls a ledger over at 50,000
#: entries by default). The first id below 2^32 that does not fit widens it,
#: once and for good, to a ``BitMap64`` of ``slot << 32 | entry`` (O(n) in C).
#: The ``BitMap64`` costs ~40 bytes more per ledger (its ART leaf and node)
#: and ~200 for its header: 2,376 against 1,683 bytes of malloc for 16 ledgers
#: of 11 ids built by adds (``python bench/roaring_bytes.py``), ~3.9 bytes per
#: pending message where a consumer nacks 10/s over 16 ledgers. Ids >= 2^32 are in their ledger's ``wide`` bitmap either way.
LIVE_ENTRY_BITS = 22
LIVE_SLOT_BITS = 10
WIDE_LIVE_SHIFT = 32
#: Changes to a ledger's live bitmap between compactions (at least).
COMPACT_CHURN = 4096
#: A ledger keeps up to this many of its dense cells *listed*: their ids stay
#: out of the live bitmap (stored once, not twice) and a lookup checks them one
#: by one. The next one flushes the list into the live bitmap, so a lookup
#: costs at most LISTED bitmap probes however many buckets a ledger spans.
LISTED = 8
#: Items per listed cell in a ledger's flat list: the bitmap, its window and
#: its key. No per-cell id bounds: a bitmap probe (``in``, in C) costs less
#: than testing two bounds in Python, and two bound ints cost ~64 bytes.
LISTING = 3


@dataclass(frozen=True)
class Layout:
    """How a bucket time and a ``(slot, entry)`` pack into one uint64.

    ``offset`` (the bucket's index inside its window) takes the top
    ``offset_bits``, the ledger slot the next ``32 - offset_bits`` bits, the
    entry id the low 32. Sorted packed values are therefore in
    ``(bucket, slot, entry)`` order.
    """

    bits: int
    offset_bits: int

    @classmethod
    def for_bits(cls, bits: int) -> "Layout":
        """The layout of a precision, one shared object per precision (with the
        int objects the index copies from it: an index of a few pending ids
        does not pay ~150 bytes for its own)."""
        lay = _LAYOUTS.get(bits)
        if lay is None:
            lay = _LAYOUTS[bits] = cls(bits, max(MIN_OFFSET_BITS, WINDOW_BITS - bits))
        return lay

    @property
    def window_shift(self) -> int:
        return self.bits + self.offset_bits

    @property
    def offset_shift(self) -> int:
        return 64 - self.offset_bits

    @cached_property
    def slot_limit(self) -> int:
        return 1 << (32 - self.offset_bits)

    @cached_property
    def offset_mask(self) -> int:
        return (1 << self.offset_bits) - 1

    def offsets(self, values: np.ndarray) -> np.ndarray:
        """The offset of each packed value (vectorised)."""
        if self.offset_bits == 0:
            return np.zeros(len(values), dtype=np.uint64)
        return values >> np.uint64(self.offset_shift)

    def offset_of(self, value: int) -> int:
        return value >> self.offset_shift if self.offset_bits else 0


_LAYOUTS: dict[int, Layout] = {}
NO_CELLS: dict = {}
NO_KEYS: list = []
#: The index's rarely used containers (ids pending in two buckets, ghosts,
#: freed ledger slots) start as these shared empties (never written to) and
#: are made on first use: an index with a few ids does not pay for them.
NO_ENTRIES: dict = {}
NO_SLOTS: list = []
#: A window's array until its first sparse copy, and again once emptied
#: (never written to): a window holding dense cells only (seed 000's bursts)
#: does not pay for an empty array object.
NO_PACKED = array.array("Q")
#: A window's list of segments until it has one (never written to).
NO_SEGMENTS: list = []


class Window:
    """One time window: packed sparse copies plus dense cells.

    Sparse copies sit in *segments*: ``array('Q')`` of about
    :data:`SEGMENT` values each (``full``), plus ``packed``, the array
    being appended to. Before the window reaches the front of the time order
    (``opened`` false) they are in arrival order, and ``packed`` becomes a
    segment of ``full`` once it holds SEGMENT values when a new run of adds
    starts (``roll``). Opening the window sorts its copies across its
    segments (one C sort; the sorted values go back into the same arrays, so
    nothing of the window's size is allocated and kept); then ``full`` is the
    sorted remainder, ``pos`` the taken prefix of ``full[0]`` (a segment is
    dropped whole once taken), and the unsorted tail of adds since is
    ``spill`` (its rolled segments) plus ``packed``, ``tail_min`` the smallest
    offset in it; taking from the tail compacts it in place, and a long tail
    is sorted into ``full``. Why segments: see :data:`SEGMENT`.

    ``dense``: ``offset << 32 | slot`` -> bitmap (one flat dict: a cell costs a
    dict slot and a key, not a dict per bucket); ``dense_keys``: a heap of
    those keys (stale ones skipped), so the earliest cells come first, kept
    only once the window is open (only the front window takes cells in
    order: the others would pay ~90 bytes for nothing); both are the shared
    empties :data:`NO_CELLS`/:data:`NO_KEYS` (never written to) until
    needed, so a sparse window costs its object and its array only. The
    window is empty when nothing is left in either.
    """

    __slots__ = ("packed", "full", "spill", "pos", "opened", "tail_min", "dense", "dense_keys")

    NO_TAIL = 1 << 64

    def __init__(self) -> None:
        self.packed = NO_PACKED  # made on the first sparse copy
        self.full: list[array.array] = NO_SEGMENTS
        self.spill: list[array.array] = NO_SEGMENTS
        self.pos = 0
        self.opened = False
        self.tail_min = self.NO_TAIL
        self.dense: dict[int, BitMap | BitMap64] = NO_CELLS  # made on the first cell
        self.dense_keys: list[int] = NO_KEYS

    def tail(self) -> list[np.ndarray]:
        """Zero-copy uint64 views of the unsorted tail of an open window
        (``spill`` then ``packed``); drop them before appending."""
        out = [np.frombuffer(s, dtype=np.uint64) for s in self.spill]
        if self.packed:
            out.append(np.frombuffer(self.packed, dtype=np.uint64))
        return out

    def tail_size(self) -> int:
        """Copies in the unsorted tail. Runtime: O(segments)."""
        return sum(map(len, self.spill)) + len(self.packed)

    def parts(self) -> list[np.ndarray]:
        """Zero-copy uint64 views of every copy not taken yet, in storage
        order (sorted segments first once opened); drop them before appending."""
        out = [np.frombuffer(s, dtype=np.uint64) for s in self.full]
        if out and self.pos:
            out[0] = out[0][self.pos:]
        return out + self.tail()

    def values(self) -> np.ndarray:
        """Every copy not taken yet as one uint64 array (a copy unless one
        array holds them). Runtime: O(w) in C."""
        parts = self.parts()
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)

    def size(self) -> int:
        """Sparse copies not taken yet. Runtime: O(segments)."""
        return sum(map(len, self.full)) - self.pos + self.tail_size()

    def sorted_left(self) -> int:
        """About how many sorted copies are left: SEGMENT per segment. O(1)."""
        return len(self.full) * SEGMENT

    def roll(self) -> array.array:
        """Start a new segment; return it. ``packed`` joins ``full`` (arrival
        order) or, once the window is open, the tail's ``spill``."""
        if self.opened:
            if self.spill is NO_SEGMENTS:
                self.spill = []
            self.spill.append(self.packed)
        else:
            if self.full is NO_SEGMENTS:
                self.full = []
            self.full.append(self.packed)
        self.packed = array.array("Q")
        return self.packed

    def empty(self) -> bool:
        return not self.full and not self.packed and not self.spill and not self.dense


class LedgerExt:
    """The rare state of one ledger; most ledgers have none.

    A ledger is its slot: the index maps ledger id -> slot (``_by_id``) and
    slot -> ledger id (``_lid``), and its live ids ("pending anywhere") below
    2^32 share one index-wide bitmap keyed ``slot << 22 | entry`` (or ``slot <<
    32 | entry``: see :data:`LIVE_ENTRY_BITS`), so a
    ledger with a handful of pending ids costs a dict slot, a list slot and a
    bitmap container, not an object (a record per ledger was ~96 bytes: 8-9
    bytes per pending message where a consumer nacks 10/s over 16 ledgers).
    This record, in ``_ext[slot]``, exists only while one of its fields is set
    (``_ext`` itself, a list by slot, only once some ledger has needed one):

    * ``cells``/``hi``: up to :data:`LISTED` of the ledger's dense cells, in
      one flat list of :data:`LISTING` items each (bitmap, window, ``key``
      the very int object keying the window's ``dense`` dict: no record
      object, ~48 bytes less per listed cell), whose ids need not be in the live
      bitmap (a run of adds into a listed cell skips it: seed 000's bursts
      are stored once); they hold live copies only (an ack takes the id out
      of them, a cell emptied so leaves its window), and ``hi`` is at least
      every id in them, so a lookup of a larger id skips them;
    * ``wide``: its live ids >= 2^32 (listed or not);
    * ``multi``: the few ids pending in two or more buckets (their counts
      live in the index's ``_multi``);
    * ``ghost``: ids acked while pending whose copies still sit in cells
      (records in the index's ``_ghosts``).

    The ledger (its slot) goes when it has no live id and no ghost: no copy
    of it is left in any cell.
    """

    __slots__ = ("wide", "multi", "ghost", "cells", "hi")

    def __init__(self) -> None:
        self.wide: BitMap64 | None = None
        self.multi: set[int] | None = None
        self.ghost: set[int] | None = None
        self.cells: list | None = None  # [bitmap, window, key, bitmap, ...]
        self.hi = -1

    def empty(self) -> bool:
        return self.cells is None and self.wide is None and self.multi is None and self.ghost is None


class Ghost:
    """Copies of an acked message still in cells (dropped when their bucket
    is taken). ``count``: ghost copies; ``revived``: buckets where the message
    was nacked again after the ack (those copies are live)."""

    __slots__ = ("count", "revived")

    def __init__(self, count: int) -> None:
        self.count = count
        self.revived: set[int] | None = None

    def revive(self, bucket: int) -> None:
        if self.revived is None:
            self.revived = set()
        self.revived.add(bucket)

    def is_live_in(self, bucket: int) -> bool:
        return self.revived is not None and bucket in self.revived


#: A sort across segments of at least this many bytes uses a scratch array in
#: its own memory map, given back to the system when done: from the C heap it
#: would leave a hole of a window's size that later segments split up.
SCRATCH_MAP = 1 << 16


def sort_across(parts: list[np.ndarray]) -> None:
    """Sort the values of several uint64 arrays as one sequence, in place:
    into one scratch array, sorted in C, written back (each part keeps its
    length). numpy's default sort: its stable one (timsort) takes a scratch
    buffer of its own on every call. Runtime: O(n log n) in C."""
    if len(parts) == 1:
        parts[0].sort()
        return
    n = sum(map(len, parts))
    if not n:
        return
    buf = mmap.mmap(-1, 8 * n) if 8 * n >= SCRATCH_MAP else None
    scratch = np.frombuffer(buf, dtype=np.uint64) if buf is not None else np.empty(n, dtype=np.uint64)
    np.concatenate(parts, out=scratch)
    scratch.sort()
    at = 0
    for part in parts:
        part[:] = scratch[at:at + len(part)]
        at += len(part)
    del scratch
    if buf is not None:
        buf.close()


def has(bm: BitMap | BitMap64, entry_id: int) -> bool:
    """``entry_id in bm``; a 32-bit bitmap cannot hold ids >= 2^32 (and raises)."""
    return (entry_id < U32 or type(bm) is BitMap64) and entry_id in bm


def common(bm: BitMap | BitMap64, ids: set[int]) -> list[int]:
    """Ids in both, iterating the smaller side. Runtime: O(min(len))."""
    if len(ids) <= len(bm):
        return [e for e in ids if has(bm, e)]
    return [e for e in bm if e in ids]


def overlaps(a: BitMap | BitMap64, b: BitMap | BitMap64) -> bool:
    """Whether two bitmaps share an id, widening one when only one is 64-bit
    (pyroaring refuses to mix them). Runtime: O(containers) in C."""
    if type(a) is not type(b):
        a, b = BitMap64(a), BitMap64(b)
    return a.intersect(b)


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-d array: ``np.unique`` without its
    first-call import of ``numpy.ma`` (over 1 MB of RSS that a process using
    the index never needs), and without numpy 2's hashing first, which took
    ~50x longer than this sort on half a million distinct keys (the planner's
    fire keys at 1 ms buckets). Runtime: O(n log n) in C."""
    if len(values) < 2:
        return values.copy()
    s = np.sort(values)
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def u32_array(values: np.ndarray) -> array.array:
    """The low 32 bits of integer values as ``array('I')`` (what a bitmap's
    ``update`` takes in one C call), copied once more than needed at most
    (``tobytes`` would add a copy). Runtime: O(n) in C."""
    out = array.array("I")
    out.frombytes(values.astype(np.uint32, copy=False).view(np.uint8))
    return out


def u64_array(values: np.ndarray) -> array.array:
    """Integer values as ``array('Q')`` (what a ``BitMap64`` takes in one
    C call); see :func:`u32_array`. Runtime: O(n) in C."""
    out = array.array("Q")
    out.frombytes(values.astype(np.uint64, copy=False).view(np.uint8))
    return out


def bitmap_of(ids: np.ndarray) -> BitMap | BitMap64:
    """A bitmap of uint64 entry ids, 32-bit when they all fit. Runtime: O(k) in C."""
    if len(ids) and int(ids.max()) >> 32:
        return BitMap64(u64_array(ids))
    out = BitMap()
    out.update(u32_array(ids))
    return out


def merge_into(cell: BitMap | BitMap64, other: BitMap | BitMap64) -> BitMap | BitMap64:
    """``cell |= other``, widening ``cell`` to 64 bits when needed; returns the cell."""
    if type(cell) is type(other):
        cell |= other
        return cell
    if type(cell) is BitMap:
        cell = BitMap64(cell)
    cell |= BitMap64(other)
    return cell
