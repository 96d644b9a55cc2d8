"""The layout of :class:`~nacktracker.index.TimeBucketIndex`: its named
pieces, their constants and what each costs in bytes.

This module is the index's documented layout API: ``nbytes()`` counts the
pieces with the functions below, and the planner's memory model
(:mod:`nacktracker.pipeline.memory_model`) rebuilds the same accounting from
a trace with them, so a layout change shows up in both at once.

A *window* covers ``2^max(bits + 3, 14)`` ms of bucket times. It holds the
*sparse* copies of its messages packed 8 bytes each in ``array``
segments (:data:`PACKED`) of :data:`SEGMENT` (``offset | ledger slot | entry id``, see
:class:`Layout`), and the *dense* cells, a Roaring bitmap per ``(bucket,
ledger)``, for cells that received a run of :data:`PROMOTE` adds in a row,
hold 64-bit entry ids, or are being fired. An index-wide "pending anywhere"
bitmap of ``ledger slot << 22 | entry`` (32-bit; ``slot << 32 | entry`` once
widened: :data:`LIVE_ENTRY_BITS`) makes an ack of a message that is not
pending O(1).

Byte accounting: :func:`held` and :func:`held_size` (Python objects as the
allocators take them), :func:`roaring_bytes` (CRoaring's C heap behind a
bitmap), :func:`window_bytes`, :func:`ledger_record_bytes` and
:func:`time_order_bytes` (the index's own containers).
"""

from __future__ import annotations

import array
import bisect
import heapq
import sys
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Final, Union

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap, BitMap64

__all__ = [
    "WINDOW_BITS", "MIN_OFFSET_BITS", "PROMOTE", "SEGMENT", "LIVE_ENTRY_BITS", "LIVE_SLOT_BITS", "WIDE_LIVE_SHIFT",
    "PACKED", "COMPACT_CHURN", "SCAN_SEGMENTS", "SCAN_PER_CELL", "LISTED", "LISTING", "SMALL_INT", "COUNTER_INTS", "BITMAP64_EMPTY",
    "Layout", "Window", "LedgerExt", "Ghost", "Cell", "U64Array",
    "held", "held_size", "malloc_bytes", "roaring_bytes", "window_bytes", "ledger_record_bytes", "time_order_bytes",
]

#: A dense cell: the entry ids of one ``(bucket, ledger)``, 64-bit once one needs it.
Cell = Union[BitMap, BitMap64]
#: A numpy array of packed copies or ids.
U64Array = npt.NDArray[np.uint64]

#: A window spans at least 2^14 ms (16 s): big enough that sparse traffic
#: shares one window's segments (4 windows cover 60 s of delays), small enough
#: that sorting one window when it comes to the front (in C) stays near a
#: millisecond at 10,000 nacks/s.
WINDOW_BITS: Final = 14
#: ... and at least 2^3 buckets: at coarse precisions (bits >= 12) a window of
#: one bucket paid its fixed cost (the window object and id, its dict of dense
#: cells: ~370 bytes) per bucket, where seed 000's bursts fill a bucket with a
#: handful of bitmaps (``bench/memory.py`` x=1 y=15: 0.029 -> 0.021 B/msg by
#: ``nbytes()``). The longer window costs a larger sort when it reaches the
#: front (``index_grid.parked(bits=12)``: the longest ``pop_due`` grows by
#: about a quarter at 10,000 nacks/s; at bits 15 taking one 32 s bucket dominates).
MIN_OFFSET_BITS: Final = 3
#: A (bucket, ledger) cell that gets this many adds in a row becomes a Roaring
#: bitmap (2 bytes per id or less, runs for consecutive ids) instead of 8 bytes
#: per id in the window's array.
PROMOTE: Final = 32
M32: Final = (1 << 32) - 1
#: A window keeps its sparse copies in segments of about this many (2 KiB):
#: the array appended to is set aside and a new one started once it holds
#: SEGMENT when a new run of adds starts (``Window.roll``), and segments are
#: dropped whole as buckets are taken. Windows fill while earlier ones drain;
#: with one array per window, grown in small steps and cut from the front,
#: the C heap was left fragmented: uniform k=3 L=1 1,000/s bits 0 grew 5.8
#: B/pending of free C heap beside 9.8 in use, and with segments none
#: (``python -m bench.lab.heap_breakdown '<cell>' 0`` here and in a copy of 4bee518).
#: 256 rather than 512: the heap keeps less free between segments (RSS per
#: pending at the grid's median cells, ``index_grid --one``: uniform k=3 L=16
#: 1,000/s bits 4 15.4 -> 14.2 B, backoff k=3 L=16 1,000/s bits 8 15.7 ->
#: 14.5, uniform k=3 L=1 100/s bits 4 15.0 -> 13.3; 128 was worse at 10,000/s).
#: Read as ``layout.SEGMENT`` wherever it is used, so a test can set it here
#: alone (small segments exercise rolling and taking across segment ends).
SEGMENT = 256
#: The live bitmap ("pending anywhere") starts as a 32-bit ``BitMap`` of
#: ``slot << LIVE_ENTRY_BITS | entry``: it holds the ids of ledger slots below
#: 2^LIVE_SLOT_BITS (1,024 ledgers pending at once) with entry ids below
#: 2^LIVE_ENTRY_BITS (4,194,304; a broker rolls a ledger over at 50,000
#: entries by default). The first id below 2^32 that does not fit widens it,
#: once and for good, to a ``BitMap64`` of ``slot << 32 | entry`` (O(n) in C).
#: The ``BitMap64`` costs ~40 bytes more per ledger (its ART leaf and node)
#: and ~200 for its header: 2,376 against 1,683 bytes of malloc for 16 ledgers
#: of 11 ids built by adds (``python -m bench.roaring_bytes``), ~3.9 bytes per
#: pending message where a consumer nacks 10/s over 16 ledgers. Ids >= 2^32 are in their ledger's ``wide`` bitmap either way.
LIVE_ENTRY_BITS: Final = 22
LIVE_SLOT_BITS: Final = 10
WIDE_LIVE_SHIFT: Final = 32
#: A window not yet at the front looks over its sparse copies once it has
#: rolled this many segments more than it kept at its last look (at least:
#: as many again as it kept, and while none of its cells pays, until its
#: fullest cell could: see ``Windows.scan``), and moves each ``(bucket, ledger)`` cell whose
#: copies cost more packed than as a bitmap (:func:`dense_pays`) into one:
#: where many copies share a bucket and a ledger (coarse precision, dense
#: ids), they end in bitmaps at ~2 bytes per id or less, whatever order they
#: came in; sparse cells stay packed. Each look is O(w) in C for the w sparse
#: copies of the window, plus a bitmap update per cell moved.
SCAN_SEGMENTS: Final = 2
#: ... and at least this many new sparse copies per dense cell of the window
#: since its last look: a look updates every dense cell that got a copy, so
#: this bounds the Python calls per add (1/16), and the copies waiting in the
#: segments for the next look to a bounded share of the window.
SCAN_PER_CELL: Final = 8
#: Changes to a ledger's live bitmap between compactions (at least).
COMPACT_CHURN: Final = 4096
#: A ledger keeps up to this many of its dense cells *listed*: their ids stay
#: out of the live bitmap (stored once, not twice) and a lookup checks them one
#: by one. The next one flushes the list into the live bitmap, so a lookup
#: costs at most LISTED bitmap probes however many buckets a ledger spans.
LISTED: Final = 8
#: Items per listed cell in a ledger's flat list: the bitmap, its window and
#: its key. No per-cell id bounds: a bitmap probe (``in``, in C) costs less
#: than testing two bounds in Python, and two bound ints cost ~64 bytes.
LISTING: Final = 3
#: CPython keeps one shared object for each int up to this: a slot below it costs no int object.
SMALL_INT: Final = 256
#: Int slots of an index counted by ``nbytes()`` whatever their value (its count, churn, hot bucket).
COUNTER_INTS: Final = 3


@dataclass(frozen=True)
class Layout:
    """How a bucket time and a ``(slot, entry)`` pack into one uint64.

    ``offset`` (the bucket's index inside its window) takes the top
    ``offset_bits``, the ledger slot the next ``32 - offset_bits`` bits, the
    entry id the low 32. Sorted packed values are therefore in
    ``(bucket, slot, entry)`` order.

    >>> from nacktracker.index.layout import Layout
    >>> lay = Layout.for_bits(8)
    >>> lay.offset_bits, lay.window_shift, lay.slot_limit
    (6, 14, 67108864)
    """

    bits: int
    offset_bits: int

    @classmethod
    def for_bits(cls, bits: int) -> Layout:
        """The layout of a precision, one shared object per precision (with the
        int objects the index copies from it: an index of a few pending ids
        does not pay ~150 bytes for its own)."""
        lay = _LAYOUTS.get(bits)
        if lay is None:
            lay = _LAYOUTS[bits] = cls(bits, max(MIN_OFFSET_BITS, WINDOW_BITS - bits))
        return lay

    @property
    def window_shift(self) -> int:
        """A bucket time ``>>`` this is its window's id."""
        return self.bits + self.offset_bits

    @property
    def offset_shift(self) -> int:
        """A packed copy ``>>`` this is its bucket's offset in the window."""
        return 64 - self.offset_bits

    @cached_property
    def slot_limit(self) -> int:
        """Ledger slots a packed copy can hold; a ledger at or past it keeps dense cells only."""
        return 1 << (32 - self.offset_bits)

    @cached_property
    def offset_mask(self) -> int:
        return (1 << self.offset_bits) - 1

    def offsets(self, values: U64Array) -> U64Array:
        """The offset of each packed value (vectorised; offset_bits is at least MIN_OFFSET_BITS)."""
        return values >> np.uint64(self.offset_shift)

    def offset_of(self, value: int) -> int:
        return value >> self.offset_shift


_LAYOUTS: dict[int, Layout] = {}
#: A window's dense cells and their key heap until it has one (never written to).
NO_CELLS: Final[dict[int, Cell]] = {}
NO_KEYS: Final[list[int]] = []
#: The typecode of the arrays of sparse copies: 8-byte unsigned ints, ``"L"`` where a C long is 8 bytes
#: (Linux, macOS): its append converts a 64-bit int in ~27 ns against ~45 for ``"Q"`` (CPython 3.11
#: reads a ``"Q"`` value through the generic byte-array path); the bytes are the same (numpy reads
#: both as uint64).
PACKED: Final = "L" if array.array("L").itemsize == 8 else "Q"
#: A window's array until its first sparse copy, and again once emptied
#: (never written to): a window holding dense cells only (seed 000's bursts)
#: does not pay for an empty array object.
NO_PACKED: Final = array.array(PACKED)
#: A window's list of segments until it has one (never written to).
NO_SEGMENTS: Final[list[array.array[int]]] = []


class Window:
    """One time window: packed sparse copies plus dense cells.

    Sparse copies sit in *segments*: ``array(PACKED)`` of about
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

    Until it opens, a window looks over its sparse copies now and then
    (``scan_at``: see :data:`SCAN_SEGMENTS`) and moves the cells that are
    cheaper as bitmaps into ``dense``; a cell may then hold copies in both
    (a bitmap and sparse copies added since), until the next look or until
    its bucket is taken merges them.

    ``dense``: ``offset << 32 | slot`` -> bitmap (one flat dict: a cell costs a
    dict slot and a key, not a dict per bucket); ``dense_keys``: a heap of
    those keys (stale ones skipped), so the earliest cells come first, kept
    only once the window is open (only the front window takes cells in
    order: the others would pay ~90 bytes for nothing); both are the shared
    empties :data:`NO_CELLS`/:data:`NO_KEYS` (never written to) until
    needed, so a sparse window costs its object and its array only. The
    window is empty when nothing is left in either.
    """

    __slots__ = ("packed", "full", "spill", "pos", "opened", "tail_min", "dense", "dense_keys", "scan_at")

    NO_TAIL: Final = 1 << 64

    def __init__(self) -> None:
        self.packed: array.array[int] = NO_PACKED  # made on the first sparse copy
        self.full: list[array.array[int]] = NO_SEGMENTS
        self.spill: list[array.array[int]] = NO_SEGMENTS
        self.pos = 0
        self.opened = False
        self.tail_min = self.NO_TAIL
        self.dense: dict[int, Cell] = NO_CELLS  # made on the first cell
        self.dense_keys: list[int] = NO_KEYS
        self.scan_at = SCAN_SEGMENTS  # segments in ``full`` at which to look for cells to move into bitmaps

    def tail(self) -> list[U64Array]:
        """Zero-copy uint64 views of the unsorted tail of an open window
        (``spill`` then ``packed``); drop them before appending."""
        out = [np.frombuffer(s, dtype=np.uint64) for s in self.spill]
        if self.packed:
            out.append(np.frombuffer(self.packed, dtype=np.uint64))
        return out

    def tail_size(self) -> int:
        """Copies in the unsorted tail. Runtime: O(segments)."""
        return sum(map(len, self.spill)) + len(self.packed)

    def parts(self) -> list[U64Array]:
        """Zero-copy uint64 views of every copy not taken yet, in storage
        order (sorted segments first once opened); drop them before appending."""
        out = [np.frombuffer(s, dtype=np.uint64) for s in self.full]
        if out and self.pos:
            out[0] = out[0][self.pos:]
        return out + self.tail()

    def values(self) -> U64Array:
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

    def roll(self) -> array.array[int]:
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
        self.packed = array.array(PACKED)
        return self.packed

    def empty(self) -> bool:
        return not self.full and not self.packed and not self.spill and not self.dense

    def first_cell_offset(self) -> int | None:
        """The offset of the earliest dense cell of an open window, dropping
        the stale keys on top of its heap (cells acked away). Runtime: O(log c)
        amortised."""
        keys, dense = self.dense_keys, self.dense
        while keys and keys[0] not in dense:
            heapq.heappop(keys)
        return keys[0] >> 32 if keys else None

    def push_key(self, key: int) -> None:
        """A new dense cell's key into the heap of an open window (one at the
        front: the others keep no heap). Runtime: O(log c)."""
        if self.opened:
            if self.dense_keys is NO_KEYS:
                self.dense_keys = []
            heapq.heappush(self.dense_keys, key)

    def take_cells(self, off: int) -> dict[int, Cell]:
        """Remove and return the dense cells of bucket ``off`` by slot. Runtime: O(c log c)."""
        keys, dense = self.dense_keys, self.dense
        out: dict[int, Cell] = {}
        while keys and keys[0] >> 32 <= off:
            key = heapq.heappop(keys)
            cell = dense.pop(key, None)
            if cell is not None:
                out[key & M32] = cell
        if not dense:  # a dict never shrinks: drop it (and its heap of stale keys) for the shared empties
            self.dense, self.dense_keys = NO_CELLS, NO_KEYS
        return out

    def drop_cell(self, key: int) -> None:
        """An emptied cell leaves the window (its key in ``dense_keys``, if
        any, is stale now: skipped there)."""
        del self.dense[key]
        if not self.dense:  # a dict never shrinks: drop it with its heap of stale keys
            self.dense, self.dense_keys = NO_CELLS, NO_KEYS


#: The fast path's window when it has none (never written to: no bucket maps to its cell).
NO_WINDOW: Final = Window()


class LedgerExt:
    """The rare state of one ledger; most ledgers have none.

    A ledger is its slot: the index maps ledger id -> slot and slot -> ledger
    id, and its live ids ("pending anywhere") below 2^32 share one
    index-wide bitmap keyed ``slot << 22 | entry`` (or ``slot << 32 |
    entry``: see :data:`LIVE_ENTRY_BITS`), so a ledger with a handful of
    pending ids costs a dict slot, a list slot and a bitmap container, not an
    object (a record per ledger was ~96 bytes: 8-9 bytes per pending message
    where a consumer nacks 10/s over 16 ledgers). This record exists only
    while one of its fields is set:

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
      live in the live-id set's ``multi``);
    * ``ghost``: ids acked while pending whose copies still sit in cells
      (records in the live-id set's ``ghosts``).

    The ledger (its slot) goes when it has no live id and no ghost: no copy
    of it is left in any cell.
    """

    __slots__ = ("wide", "multi", "ghost", "cells", "hi")

    def __init__(self) -> None:
        self.wide: BitMap64 | None = None
        self.multi: set[int] | None = None
        self.ghost: set[int] | None = None
        self.cells: list[Cell | Window | int] | None = None  # [bitmap, window, key, bitmap, ...]
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


# -- bytes ----------------------------------------------------------------------

def malloc_bytes(n: int) -> int:
    """Bytes glibc's malloc really takes for a request of ``n`` bytes."""
    return max(32, (n + 8 + 15) & ~15)


def held(n: int) -> int:
    """Bytes one allocation of ``n`` bytes by CPython really takes: pymalloc's
    16-byte size classes up to 512 bytes, a malloc chunk above."""
    return (n + 15) & ~15 if n <= 512 else malloc_bytes(n)


#: ``sys.getsizeof`` of the empty object of each container type whose items
#: live in a second allocation (a list's item array, a dict's keys table, a
#: set's table past its 8 inline slots, an array's buffer).
_BASE: dict[type, int] = {list: sys.getsizeof([]), dict: sys.getsizeof({}), set: sys.getsizeof(set()),
                          array.array: sys.getsizeof(array.array("Q"))}


def held_size(obj: object) -> int:
    """``sys.getsizeof(obj)`` as allocated: the object and, for a container,
    its item storage, each rounded as :func:`held` says. Runtime: O(1)."""
    n = sys.getsizeof(obj)
    base = _BASE.get(type(obj))
    if base is not None and n > base:
        return held(base) + held(n - base)
    return held(n)


def window_bytes() -> int:
    """Bytes of an empty :class:`Window` object (its containers are counted
    as they are made)."""
    return held_size(Window())


def ledger_record_bytes() -> int:
    """Bytes of a :class:`LedgerExt` record (a ledger's rare state)."""
    return held_size(LedgerExt())


def time_order_bytes(windows: dict[int, Window]) -> int:
    """Bytes of the index's time order: the dict of windows by id (each id's
    int is counted with its window; the earliest id is one of them)."""
    return held_size(windows)


#: malloc bytes of an empty ``BitMap64`` (CRoaring's ``roaring64_bitmap_t`` with
#: its ART), measured by ``python -m bench.roaring_bytes`` (pyroaring 1.2.0,
#: CRoaring 5.2.2: 210 B, where the 32-bit header's 64 B were counted before).
BITMAP64_EMPTY: Final = 210


def _growth(first: int, step: Callable[[int], int], top: int) -> list[int]:
    caps = [first]
    while caps[-1] < top:
        caps.append(min(top, step(caps[-1])))
    return caps


#: Capacities of an array container grown by adds (CRoaring's
#: ``array_container_grow``: 16, then x2 below 64, x1.5 below 1,024, x1.25, at
#: most 4,096).
ARRAY_CAPS: Final = _growth(16, lambda c: c * 2 if c < 64 else c * 3 // 2 if c < 1024 else c * 5 // 4, 4096)
#: Slots of the container arrays of a bitmap grown one container at a time
#: (CRoaring's ``extend_array``: twice the size needed below 1,024, then 1.25x).
SLOT_CAPS: Final = _growth(2, lambda c: 2 * (c + 1) if c < 1024 else 5 * (c + 1) // 4, 1 << 16)


def _regrown(card: int) -> int:
    """Capacity of an array container that was shrunk to fit at about
    ``card`` ids and has had adds since: CRoaring's ``grow_capacity`` of its
    size then (x2 below 64, x1.5 below 1,024, x1.25; at most 4,096)."""
    return min(4096, card * 2 if card < 64 else card * 3 // 2 if card < 1024 else card * 5 // 4)


_CONTAINERS: Final = (("n_array_containers", "n_bytes_array_containers"),
                      ("n_run_containers", "n_bytes_run_containers"),
                      ("n_bitset_containers", "n_bytes_bitset_containers"))


def roaring_bytes(bm: Cell, grown: bool = False, refit: bool = False) -> int:
    """CRoaring heap bytes behind one bitmap (tracemalloc does not see them).

    From ``get_statistics()`` (container payloads) plus the C structs CRoaring
    allocates: the bitmap header, the key/container/typecode arrays and one
    struct per container, each rounded to a malloc chunk. ``grown``: the
    bitmap was built by adds and only shrunk now and then (the index's live
    bitmap), so its array containers and container arrays have the capacity
    CRoaring grows them to (the average container's), not their size
    (``python -m bench.roaring_bytes``, "live bitmap by adds" rows: counted
    against malloc). ``refit`` (with ``grown``): it has been shrunk to fit
    since (the index's live bitmap after its first compaction), so each array
    container has grown from its size at the shrink, by one step of
    CRoaring's growth, not along the steps from 16 (``python -m
    bench.lab.heap_breakdown``, backoff k=3 L=16 1000/s bits 10: the live
    bitmaps freed 2.59 B/pending, counted so 2.56; ``python -m bench.roaring_bytes``,
    "refit" rows). Runtime: O(1).
    """
    s = bm.get_statistics()
    n = s["n_containers"]
    header = BITMAP64_EMPTY if type(bm) is BitMap64 else malloc_bytes(48)  # roaring(64)_bitmap_t
    slots = SLOT_CAPS[bisect.bisect_left(SLOT_CAPS, n)] if grown else n
    total = header + (malloc_bytes(11 * slots) if n else 0)  # + high-low arrays (64-bit: container array and ART pools)
    for count, payload in _CONTAINERS:
        c: int = s[count]  # type: ignore[literal-required]  # one of the statistics' int fields
        if c:
            each: int = s[payload] // c  # type: ignore[literal-required]
            if grown and count == "n_array_containers":
                card = each // 2
                each = 2 * (_regrown(card) if refit else ARRAY_CAPS[bisect.bisect_left(ARRAY_CAPS, card)])
            total += c * malloc_bytes(16) + c * malloc_bytes(each)
    if type(bm) is BitMap64:
        total += n * 24  # ART leaf per container
    return total + held(type(bm).__basicsize__)


#: What a dense cell costs beyond its containers: the bitmap's Python object,
#: CRoaring's header, the cell's key (an int past the shared small ones) and
#: its slot in the window's dict (about 1.5 entries of 24 bytes, and its
#: index byte).
CELL_FIXED: Final = held(BitMap.__basicsize__) + malloc_bytes(48) + held(32) + 40
#: ... and per container: CRoaring's container struct, its key/typecode/pointer
#: slots (11 bytes) and the rounding of its payload's malloc chunk (~16).
CONTAINER_FIXED: Final = malloc_bytes(16) + 11 + 16


def dense_pays(copies: npt.NDArray[np.integer[Any]], containers: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.bool_]:
    """Whether a cell of ``copies`` sparse copies (8 bytes each, packed)
    costs less as a bitmap of ``containers`` Roaring containers (2 bytes per
    id in array containers, plus :data:`CELL_FIXED` and
    :data:`CONTAINER_FIXED` each): the crossover a window's look applies per
    cell (vectorised). With one container, 41 copies or more move."""
    return 6 * copies.astype(np.int64) > CELL_FIXED + CONTAINER_FIXED * containers.astype(np.int64)
