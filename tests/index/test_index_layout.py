"""TimeBucketIndex v2 layout: a rule-based differential test against DictIndex
over the transitions of the new layout (sparse -> dense promotion, 64-bit ids,
ids pending in two buckets, acks of pending ids (ghosts) and of absent ones,
windows opening at the front), plus direct checks of each transition."""

from __future__ import annotations

import array
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from pyroaring import BitMap, BitMap64

from nacktracker import DictIndex, TimeBucketIndex
from nacktracker.index import _live, _windows, layout
from nacktracker.index._ledgers import NO_EXTS, NO_SLOTS
from nacktracker.index._live import NO_GHOSTS, NO_MULTI
from nacktracker.index._windows import SMALL_WINDOW, Windows
from nacktracker.index.layout import (
    LISTED,
    LISTING,
    LIVE_ENTRY_BITS,
    LIVE_SLOT_BITS,
    NO_CELLS,
    NO_KEYS,
    NO_PACKED,
    NO_SEGMENTS,
    PACKED,
    PROMOTE,
    SEGMENT,
    Layout,
)

ledgers = st.sampled_from([1, 2, 7, 2**40 + 3])
# around the live bitmap's narrow bound (2^22) and 32 bits, and the largest id
entries = st.one_of(st.integers(0, 60), st.integers(2**22 - 3, 2**22 + 3), st.integers(2**32 - 3, 2**32 + 3),
                    st.just(2**63 - 1))
dues = st.one_of(st.integers(0, 400), st.integers(4000, 4200), st.integers(60_000, 60_100))


class Differential(RuleBasedStateMachine):
    """Every operation on TimeBucketIndex answers exactly as on DictIndex."""

    def __init__(self) -> None:
        super().__init__()
        self.bits = 0
        self.tb = self.ref = None
        self.crowded = False

    @rule(bits=st.sampled_from([0, 3, 8, 12]), rounding=st.sampled_from(["floor", "ceil"]))
    def start(self, bits, rounding):
        if self.tb is None:
            self.tb = TimeBucketIndex(precision_bits=bits, rounding=rounding)
            self.ref = DictIndex(precision_bits=bits, rounding=rounding)

    def both(self, name, *args):
        if self.tb is None:
            self.start(0, "floor")
        a, b = getattr(self.tb, name)(*args), getattr(self.ref, name)(*args)
        assert a == b, (name, args, a, b)
        return a

    @rule(ledger=ledgers, entry=entries, due=dues)
    def add(self, ledger, entry, due):
        self.both("add", ledger, entry, due)

    @rule(ledger=ledgers, first=st.integers(0, 50), n=st.integers(PROMOTE - 2, PROMOTE + 8),
          step=st.sampled_from([1, 3]), due=dues, descending=st.booleans())
    def run_of_adds(self, ledger, first, n, step, due, descending):
        """A burst into one cell: promotes it to a bitmap past PROMOTE; a
        descending one keeps adding below its listed cell's lower bound."""
        ids = range(first, first + n * step, step)
        for e in reversed(ids) if descending else ids:
            self.both("add", ledger, e, due)

    @rule(due=dues)
    def crowd(self, due):
        """Over 2^LIVE_SLOT_BITS other ledgers, one id each: a ledger first seen
        after this gets a slot >= 2^10, and its first id widens the live bitmap."""
        if not self.crowded:
            self.crowded = True
            for i in range((1 << LIVE_SLOT_BITS) + 8):
                self.both("add", 10_000 + i, i, due + i % 7)

    @rule(ledger=ledgers, first=st.sampled_from([0, 5, 2**22 - 20, 2**32 - 20]), cells=st.integers(1, LISTED + 3),
          gap=st.sampled_from([1, 300]), overlap=st.booleans())
    def runs_into_many_buckets(self, ledger, first, cells, gap, overlap):
        """Runs of adds of one ledger into many buckets: listed dense cells,
        the ledger crossing LISTED (its list flushed into the live bitmap),
        overlapping id ranges (an id pending in two listed cells), 64-bit ids."""
        for c in range(cells):
            start = first if overlap else first + c * (PROMOTE + 2)
            for e in range(start, start + PROMOTE + 2):
                self.both("add", ledger, e, 100 + c * gap)

    @rule(ledger=ledgers, ids=st.lists(entries, max_size=40), due=dues)
    def add_many(self, ledger, ids, due):
        self.both("add_many", ledger, ids, due)

    @rule(ledger=ledgers, entry=entries)
    def discard(self, ledger, entry):
        self.both("discard", ledger, entry)

    @rule(now=st.integers(0, 70_000))
    def pop_due(self, now):
        self.both("pop_due", now)

    @rule(now=st.integers(0, 70_000))
    def pop_due_bitmaps(self, now):
        if self.tb is None:
            return
        got = [(ledger, e) for _, ledger, bm in self.tb.pop_due_bitmaps(now) for e in bm]
        assert got == self.ref.pop_due(now)

    @rule()
    def next_due(self):
        self.both("next_due_ms")

    @rule(ledger=ledgers, entry=entries)
    def contains(self, ledger, entry):
        if self.tb is not None:
            assert ((ledger, entry) in self.tb) == ((ledger, entry) in self.ref)

    @invariant()
    def same_length(self):
        if self.tb is not None:
            assert len(self.tb) == len(self.ref)
            assert bool(self.tb) == bool(self.ref)

    @invariant()
    def listed_cells_are_consistent(self):
        if self.tb is not None:
            check_listed(self.tb)

    @invariant()
    def shared_empties_stay_empty(self):
        """The containers made on first use (NO_* placeholders) are never written to."""
        assert NO_CELLS == {} and NO_KEYS == [] and NO_MULTI == {} == NO_GHOSTS and NO_SLOTS == [] == NO_EXTS and not NO_PACKED
        assert NO_SEGMENTS == []

    @invariant()
    def segments_are_consistent(self):
        if self.tb is not None:
            check_segments(self.tb)

    def teardown(self):
        if self.tb is not None:
            snapshot = [(b, ledger, list(bm)) for b, ledger, bm in self.tb.iter_bitmaps()]
            flat = [(ledger, e) for _, ledger, es in snapshot for e in es]
            assert flat == self.ref.pop_due(2**62) == self.tb.pop_due(2**62)
            assert len(self.tb) == 0 and self.tb.next_due_ms() is None


class SmallSegments(Differential):
    """The same with segments of 4 copies: windows roll, open across many
    segments, take buckets across segment ends and merge long tails."""

    def __init__(self) -> None:
        super().__init__()
        self.saved = [(m, m.SEGMENT) for m in (layout,)]
        for m, _ in self.saved:
            m.SEGMENT = 4

    def teardown(self):
        try:
            super().teardown()
        finally:
            for m, value in self.saved:
                m.SEGMENT = value


TestSmallSegments = SmallSegments.TestCase
TestSmallSegments.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)


class LookingWindows(SmallSegments):
    """The same with segments of 4 copies and a window's look moving every
    cell with two sparse copies or more into a bitmap (the real crossover is
    ~41 copies): cells hold copies in a bitmap and sparse ones at once,
    listed cells take sparse copies, looks meet ghosts and ids pending twice."""

    def __init__(self) -> None:
        super().__init__()
        self.crossover = _windows.dense_pays
        _windows.dense_pays = lambda copies, containers: copies >= 2

    def teardown(self):
        try:
            super().teardown()
        finally:
            _windows.dense_pays = self.crossover


TestLookingWindows = LookingWindows.TestCase
TestLookingWindows.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)


def test_interleaved_cells_end_in_bitmaps():
    """Consecutive ids of 4 ledgers, round robin, into 8 buckets in turn (no
    run of adds to any cell): a window's looks move the cells into bitmaps,
    so the cells hold ~2 bytes per id, not 8; the copies added since the
    last look wait in the window's segments. Pops match DictIndex."""
    idx, ref = TimeBucketIndex(precision_bits=8), DictIndex(precision_bits=8)
    n = 40_000
    for i in range(n):
        for m in (idx, ref):
            m.add(i % 4, i // 4, 1_000 + 256 * (i // 4 % 8))
    (w,) = idx._windows.values()
    assert len(w.dense) == 32 and w.size() <= layout.SCAN_PER_CELL * 32 + 2 * SEGMENT
    assert idx.nbytes() < 4 * n  # the cells ~2 B per id, the live bitmap ~1 (packed: 8 per id and the live bitmap)
    for now in range(1_000, 1_000 + 256 * 8, 256):
        assert idx.pop_due(now) == ref.pop_due(now)
    assert not idx and idx.next_due_ms() is None


def test_sparse_cells_stay_packed():
    """Ids far apart, each cell with a few copies: no look moves a cell
    (a bitmap would cost more), the copies stay 8 bytes each."""
    idx = TimeBucketIndex(precision_bits=0)
    for i in range(20_000):
        idx.add(i % 4, (i // 4) * 3, 1_000 + i % 5_000)
    assert all(not w.dense for w in idx._windows.values())
    assert sum(w.size() for w in idx._windows.values()) == 20_000


def check_segments(idx: TimeBucketIndex) -> None:
    """A window not yet open keeps its copies in arrival order (no position
    taken); an open one keeps its sorted segments non-empty past ``pos`` and
    sorted across, its tail's offsets at or above ``tail_min``."""
    for w in idx._windows.values():
        if not w.opened:
            assert w.pos == 0 and w.tail_min == w.NO_TAIL and not w.spill
            continue
        if w.full:
            assert 0 <= w.pos < len(w.full[0]) and all(w.full)
            flat = [v for i, seg in enumerate(w.full) for v in (seg[w.pos:] if i == 0 else seg)]
            assert flat == sorted(flat)
        else:
            assert w.pos == 0
        tail = [v for seg in (*w.spill, w.packed) for v in seg]
        assert all(w.spill) and (min(map(idx._lay.offset_of, tail)) >= w.tail_min if tail else True)


def test_a_window_fills_in_segments_and_opens_across_them():
    """Sparse copies past SEGMENT roll into a new array; opening the window
    sorts across them in place, and taking its buckets drops whole segments."""
    idx = TimeBucketIndex(precision_bits=0)
    n = 3 * SEGMENT + 10
    for i in range(n):  # one copy per bucket: no run, every add a new sparse cell
        idx.add(7, i, 1_000 + (i * 7919) % 8000)
    (w,) = idx._windows.values()
    assert len(w.full) == 3 and all(len(seg) == SEGMENT for seg in w.full) and len(w.packed) == 10
    assert idx.next_due_ms() == 1_000
    assert w.opened and len(w.full) == 4 and not w.packed and w.size() == n
    check_segments(idx)
    got = idx.pop_due(1_000 + 4000)
    assert len(got) == sum(1 for i in range(n) if (i * 7919) % 8000 <= 4000)
    assert 1 <= len(w.full) < 4  # the segments taken whole were dropped
    check_segments(idx)
    assert len(idx.pop_due(10**6)) == n - len(got) and not idx._windows


def ext_of(idx: TimeBucketIndex, ledger_id: int):
    """The ledger's rare state (listed cells, wide ids, ...), or None."""
    return idx._ledgers.ext_at(idx._by_id[ledger_id])


def check_listed(idx: TimeBucketIndex) -> None:
    """The listing's invariants: at most LISTED cells a ledger, each non-empty,
    still in its window under its key, none of its ids above ``hi``, no ghost
    copy; and the ledger slots: ``_by_id`` and ``_lid`` mirror each other, a
    ledger's rare state exists only while something is in it."""
    assert {lid: slot for slot, lid in enumerate(idx._ledgers.lid) if lid is not None} == idx._by_id
    # the live bitmap keys ids of ledgers that exist (32-bit while narrow), ``wide`` those >= 2^32
    assert all(idx._ledgers.lid[key >> idx._ids.shift] is not None for key in idx._ids.bits)
    assert (type(idx._ids.bits) is BitMap) == (idx._ids.shift == LIVE_ENTRY_BITS)
    assert len(idx._ledgers.ext) in (0, len(idx._ledgers.lid))  # made with the first record, then a slot per ledger
    assert all(idx._ledgers.lid[slot] is not None for slot, ext in enumerate(idx._ledgers.ext) if ext is not None)
    for ext in idx._ledgers.ext:
        if ext is not None and ext.wide is not None:
            assert ext.wide and ext.wide.min() >> 32
    for slot, lid in enumerate(idx._ledgers.lid):
        ext = idx._ledgers.ext_at(slot)
        if lid is None or ext is None:
            assert ext is None
            continue
        assert not ext.empty()
        if ext.cells is None:
            assert ext.hi == -1
            continue
        assert 0 < len(ext.cells) <= LISTED * LISTING and len(ext.cells) % LISTING == 0
        for i in range(0, len(ext.cells), LISTING):
            cell, w, key = ext.cells[i:i + LISTING]
            assert cell and w.dense.get(key) is cell and key & 0xFFFFFFFF == slot
            assert cell.max() <= ext.hi
            assert ext.ghost is None or not any(e in ext.ghost and not idx._ids.ghosts[(slot, e)].revived
                                                for e in cell)
    if idx._hot_listed:
        ext = idx._ledgers.ext[idx._hot_slot]
        assert any(c is idx._hot_dense for c in ext.cells[::LISTING])
    if idx._hot_slot >= 0:
        assert idx._ledgers.lid[idx._hot_slot] == idx._hot_lid


TestDifferential = Differential.TestCase
TestDifferential.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


def test_sparse_copies_are_8_byte_arrays_of_one_typecode_from_add_to_take():
    """Every array of sparse copies (new, rolled, refilled by a look, split from the tail) holds 8-byte
    values of PACKED, whose largest value (64 bits) round-trips."""
    assert array.array(PACKED).itemsize == 8 and NO_PACKED.typecode == PACKED
    idx = TimeBucketIndex(precision_bits=0)
    for i in range(3 * SEGMENT + 10):
        idx.add(7, i, 1_000 + (i * 7919) % 8000)
    idx.add(2**40 + 3, 2**63 - 1, 1_000)  # a 64-bit id of a ledger slot: a wide copy
    (w,) = idx._windows.values()
    assert {a.typecode for a in (*w.full, w.packed)} == {PACKED}
    seg = array.array(PACKED, [2**64 - 1])
    assert seg[0] == 2**64 - 1 and seg.tobytes() == b"\xff" * 8
    idx.pop_due(1_000 + 100)
    assert {a.typecode for a in (*w.full, *w.spill, w.packed) if a is not NO_PACKED} <= {PACKED}
    check_segments(idx)


def test_a_new_cell_after_a_full_segment_starts_a_new_segment():
    """A window's array holds SEGMENT copies; a new cell's first copy starts a
    new segment, whether it comes by add's inline path or by a switch away from
    a hot bitmap, and a run from there becomes a bitmap at exactly PROMOTE adds."""
    ones = [("add", lid, 1, 100) for lid in range(SEGMENT)]  # one copy per ledger
    idx, ref = _same_as_dict(ones)
    (w,) = idx._windows.values()
    assert len(w.packed) == SEGMENT and not w.dense
    idx, ref = _same_as_dict([*ones, *[("add", SEGMENT, e, 100) for e in range(PROMOTE)]])
    (w,) = idx._windows.values()
    assert w.full and len(w.packed) == 0  # the run went to a new segment, then into its bitmap
    assert list(w.dense.values()) == [BitMap(range(PROMOTE))]
    assert idx.pop_due(100) == ref.pop_due(100) and not idx
    # the other way into a new cell: a switch away from a hot bitmap rolls a full segment too
    dense_run = [("add", 10**6, e, 100) for e in range(PROMOTE)]  # then the first of `ones` switches away
    idx, ref = _same_as_dict([*dense_run, *ones, ("add", 10**6, PROMOTE, 100), ("add", 10**7, 1, 100)])
    (w,) = idx._windows.values()
    assert [len(seg) for seg in w.full] == [SEGMENT] and len(w.packed) == 1
    assert idx.pop_due(100) == ref.pop_due(100) and not idx


def test_due_times_far_apart_keep_their_own_windows():
    """Windows are keyed by ``bucket >> window_shift``: an id due days after
    another (2^28 ms, about 3 days, at precision 0) lives in a window of
    its own, and the early one pops on time."""
    for bits in (0, 3):
        # the window a mix-up of shifts (bucket << window_shift) would read for the early bucket
        far = 1 << (bits + 2 * TimeBucketIndex(precision_bits=bits)._wshift)
        idx, ref = _same_as_dict([("add", 1, 5, far), ("add", 2, 5, 1 << bits), ("add", 2, 6, 1 << bits)])
        assert len(idx._windows) == 2
        assert idx.next_due_ms() == ref.next_due_ms() == 1 << bits
        assert idx.pop_due(1 << bits) == ref.pop_due(1 << bits) == [(2, 5), (2, 6)]
        assert idx.pop_due(far) == ref.pop_due(far) == [(1, 5)] and not idx


def test_a_run_of_adds_becomes_a_bitmap_and_stays_exact():
    idx = TimeBucketIndex(precision_bits=0)
    for e in range(PROMOTE * 3):
        idx.add(5, e, 100)
    w = idx._windows[100 >> idx._wshift]
    assert len(w.packed) == 0 and len(w.dense[idx._hot_off << 32 | 0]) == PROMOTE * 3
    idx.add(5, 7, 100)  # already pending in that cell
    assert len(idx) == PROMOTE * 3
    assert idx.pop_due(100) == [(5, e) for e in range(PROMOTE * 3)]


def test_sparse_cells_cost_about_ten_bytes_per_message():
    idx = TimeBucketIndex(precision_bits=0)
    for i in range(20_000):  # 16 interleaved ledgers, ids 7 apart, one per ms
        idx.add(1000 + i % 16, 7 * i, 10_000 + (i * 7919) % 60_000)
    assert 8 * len(idx) < idx.nbytes() < 16 * len(idx)


def test_ack_of_a_pending_id_leaves_a_ghost_that_never_fires():
    idx = TimeBucketIndex(precision_bits=0)
    idx.add(1, 1, 10)
    idx.add(1, 1, 20)  # pending in two buckets
    idx.add(1, 2, 10)
    assert idx.discard(1, 1) and not idx.discard(1, 1)
    assert len(idx) == 1 and (1, 1) not in idx and idx._ids.ghost_copies == 2
    idx.add(1, 1, 20)  # nacked again into a bucket holding its ghost: revived once
    assert len(idx) == 2 and (1, 1) in idx
    assert idx.next_due_ms() == 10
    assert idx.pop_due(15) == [(1, 2)]
    assert idx.pop_due(25) == [(1, 1)]
    assert idx._ids.ghost_copies == 0 and not idx._ids.ghosts and not idx._by_id


def test_a_ghost_only_front_bucket_is_skipped():
    idx = TimeBucketIndex(precision_bits=0)
    idx.add(1, 1, 10)
    idx.add(1, 2, 30)
    idx.discard(1, 1)
    assert idx.next_due_ms() == 30 and idx.pop_due(20) == []


def test_wide_ids_live_in_64_bit_cells():
    idx = TimeBucketIndex(precision_bits=0)
    idx.add(1, 5, 10)
    idx.add(1, 2**32 + 7, 10)
    idx.add(2, 3, 10)
    kinds = {ledger: type(bm) for _, ledger, bm in idx.iter_bitmaps()}
    assert kinds == {1: BitMap64, 2: BitMap}
    assert idx.discard(1, 2**32 + 7) and not idx.discard(1, 2**32 + 8)
    assert idx.pop_due(10) == [(1, 5), (2, 3)]


def test_windows_open_at_the_front_and_take_late_adds():
    idx = TimeBucketIndex(precision_bits=0)
    for i in range(0, 4000, 2):
        idx.add(1, i, 10_000 + i)
    assert idx.next_due_ms() == 10_000  # the front window is now sorted
    for i in range(1, 4000, 2):  # adds into the open window land in its unsorted tail
        idx.add(1, i, 10_000 + i)
    got = []
    for now in range(10_000, 14_000, 250):
        got += idx.pop_due(now)
    got += idx.pop_due(20_000)
    assert got == [(1, i) for i in range(4000)]


def test_slots_are_recycled_and_state_ends_empty():
    idx = TimeBucketIndex(precision_bits=4)
    for round_ in range(3):
        for ledger in range(100):
            idx.add(10**12 + ledger + round_, ledger, 1000 * round_ + ledger)
        assert len(idx.pop_due(10**6)) == 100
    assert idx.next_due_ms() is None and not idx._windows
    assert not idx._by_id and len(idx._ledgers.lid) == 100  # three rounds of 100 ledgers, 100 slots
    assert idx._ledgers.ext is NO_EXTS  # no ledger ever needed rare state: no per-slot list either


@pytest.mark.parametrize("ids", [array.array("I", range(100)), list(range(10, 50))])
def test_add_many_of_a_pending_id_counts_it_once(ids):
    idx, ref = TimeBucketIndex(precision_bits=0), DictIndex(precision_bits=0)
    for m in (idx, ref):
        m.add(3, 20, 50)
        m.add_many(3, ids, 50)
        m.add_many(3, ids, 60)
    assert len(idx) == len(ref) and idx.pop_due(100) == ref.pop_due(100)


@pytest.mark.parametrize("bits", [0, 4, 8, 14])
def test_count_bounds_are_cheap_upper_bounds_of_the_exact_counts(bits):
    """stats() reads the O(windows) bounds; they never undercount, and are exact
    where a window is one bucket or each copy is alone in its bucket/cell."""
    idx = TimeBucketIndex(precision_bits=bits)
    assert (idx.bucket_count_bound(), idx.bitmap_count_bound()) == (0, 0)
    for i in range(3_000):
        idx.add(100 + i % 7, i * 3, 1_000_000 + (i * 37) % 90_000)
    idx.add_many(500, range(64), 1_050_000)  # a dense cell
    assert idx.bucket_count_bound() >= idx.bucket_count() > 0
    assert idx.bitmap_count_bound() >= idx.bitmap_count() > 0
    assert idx.bucket_count_bound() <= len(idx._windows) << idx._lay.offset_bits  # no more than windows span
    assert idx.bitmap_count_bound() <= (len(idx._windows) << idx._lay.offset_bits) * 8  # ... times the 8 ledgers
    idx.pop_due(1_040_000)
    assert idx.bucket_count_bound() >= idx.bucket_count()
    assert idx.bitmap_count_bound() >= idx.bitmap_count()
    few = TimeBucketIndex(precision_bits=bits)  # a small window is counted exactly
    for e in range(10):
        few.add(7, e * 5, 5_000)
    few.add(8, 1, 5_000)
    assert (few.bucket_count_bound(), few.bitmap_count_bound()) == (few.bucket_count(), few.bitmap_count()) == (1, 2)


@pytest.mark.parametrize("bits", [0, 4, 14])
def test_count_bounds_count_a_window_exactly_up_to_64_copies_then_cheaply(bits):
    """The bound's rule itself: a window of at most SMALL_WINDOW (64) copies
    is counted exactly, one more and it is the fewer of its copies and the
    buckets the window spans (here above the exact count: one bucket)."""
    for n in (SMALL_WINDOW, SMALL_WINDOW + 1):
        idx = TimeBucketIndex(precision_bits=bits)
        for i in range(n):  # n ledgers, one copy each, all in one bucket
            idx.add(1_000 + i, 1, 5_000)
        assert (idx.bucket_count(), idx.bitmap_count()) == (1, n)
        span = 1 << idx._lay.offset_bits
        expected = 1 if n <= SMALL_WINDOW else min(n, span)
        assert expected > 1 or n == SMALL_WINDOW
        assert (idx.bucket_count_bound(), idx.bitmap_count_bound()) == (expected, n)


@pytest.mark.parametrize("bits", [0, 4, 14])
def test_counts_take_a_bucket_with_sparse_and_dense_copies_once(bits):
    """A bucket (and a cell) holding both a dense cell and sparse copies is
    one bucket (one cell) for the exact counts."""
    idx = TimeBucketIndex(precision_bits=bits)
    idx.add_many(500, range(64), 5_000)  # a dense cell
    idx.add(7, 1, 5_000)  # a sparse copy of another ledger in the same bucket
    assert (idx.bucket_count(), idx.bitmap_count()) == (1, 2)
    idx.add(500, 1_000, 5_000)  # a sparse copy in the dense cell's (bucket, ledger)
    assert (idx.bucket_count(), idx.bitmap_count()) == (1, 2)
    later = TimeBucketIndex(precision_bits=bits)  # the sparse copy first, the dense cell made after it
    later.add(7, 1, 5_000)
    later.add(500, 1_000, 5_000)
    later.add_many(500, range(64), 5_000)
    assert (later.bucket_count(), later.bitmap_count()) == (1, 2)


def test_a_burst_is_stored_once_in_a_listed_cell():
    """Seed 000's case: a ledger's run of ids in one bucket sits in its dense
    cell only, not in the live bitmap too; acks and re-adds still answer
    exactly, with the non-pending ack one lookup plus the listed cells."""
    idx = TimeBucketIndex(precision_bits=10)
    for e in range(0, 20_000, 2):
        idx.add(9, e, 5_000)
    led = ext_of(idx, 9)
    assert len(led.cells) == LISTING and len(idx._ids.bits) == 0 and led.hi == 19_998
    assert (9, 4) in idx and (9, 5) not in idx and (9, 20_000) not in idx
    idx.add(9, 4, 5_000)  # already pending in that cell
    idx.add(9, 4, 9_000)  # now pending in two buckets (the second copy sparse, in the live bitmap)
    assert len(idx) == 10_001 and idx._ids.multi == {(idx._by_id[9], 4): 2}
    assert idx.discard(9, 4) and not idx.discard(9, 4) and not idx.discard(9, 5)
    assert (9, 4) not in idx and len(idx) == 9_999 and idx._ids.ghost_copies == 1  # the sparse copy
    check_listed(idx)
    assert idx.pop_due(6_000) == [(9, e) for e in range(0, 20_000, 2) if e != 4]
    assert idx.pop_due(10_000) == [] and not idx._by_id  # the ghost copy went when its bucket came to the front


def test_a_ledger_crossing_listed_flushes_its_cells_into_the_live_bitmap():
    idx = TimeBucketIndex(precision_bits=0)
    ref = DictIndex(precision_bits=0)
    for c in range(LISTED + 2):  # one run per bucket, disjoint id ranges
        for e in range(c * 100, c * 100 + PROMOTE + 10):
            idx.add(3, e, 1_000 + c)
            ref.add(3, e, 1_000 + c)
        check_listed(idx)
    assert len(ext_of(idx, 3).cells) == 2 * LISTING  # LISTED flushed, then two more listed
    assert len(idx._ids.bits) == LISTED * (PROMOTE + 10)
    for e in (5, 105, (LISTED + 1) * 100 + 3, 99, 2**32 + 1):
        assert ((3, e) in idx) == ((3, e) in ref)
        assert idx.discard(3, e) == ref.discard(3, e)
    check_listed(idx)
    for now in range(1_000, 1_000 + LISTED + 2):  # popped back under LISTED, then empty
        assert idx.pop_due(now) == ref.pop_due(now)
        check_listed(idx)
    assert not idx and not idx._ids.bits and not idx._by_id


def test_an_ack_emptying_a_listed_cell_removes_it_from_its_window():
    idx = TimeBucketIndex(precision_bits=0)
    for e in range(PROMOTE + 1):
        idx.add(1, e, 50)
    idx.add(1, 500, 60)
    for e in range(PROMOTE + 1):
        assert idx.discard(1, e)
    check_listed(idx)
    assert ext_of(idx, 1) is None and idx.next_due_ms() == 60
    assert idx.pop_due(100) == [(1, 500)] and not idx._by_id


def test_listed_cells_take_64_bit_ids():
    idx, ref = TimeBucketIndex(precision_bits=0), DictIndex(precision_bits=0)
    for m in (idx, ref):
        for e in range(PROMOTE + 5):
            m.add(2, e, 70)
        m.add(2, 2**40, 70)  # widens the listed cell to 64 bits
        m.add(2, 7, 80)
        m.add_many(2, list(range(100, 140)), 90)  # a 32-bit batch checked against the 64-bit listed cell
        m.add_many(2, [3, 2**33] + list(range(200, 240)), 70)
    check_listed(idx)
    assert idx.discard(2, 2**40) and (2, 2**40) not in idx and idx.discard(2, 7) == ref.discard(2, 7)
    ref.discard(2, 2**40)
    assert idx.pop_due(100) == ref.pop_due(100)


def test_listed_cells_answer_lookups_between_and_inside_their_ranges():
    """Adds below or above a listed cell's ids, a batch merged into a listed
    cell, and lookups between two cells' ranges (or in a cell's gap) answer
    exactly; the ledger's ``hi`` follows the largest listed id."""
    idx, ref = TimeBucketIndex(precision_bits=0), DictIndex(precision_bits=0)
    for m in (idx, ref):
        m.add(4, 9, 100)  # a sparse copy in A's bucket before the run: gathered into A when taken
        m.add(5, 1, 100)  # another ledger's add: the run below starts afresh
        for e in range(1_000, 1_000 + 2 * PROMOTE, 2):  # listed cell A: even ids 1000..1062 at 100
            m.add(4, e, 100)
        for e in range(5_000, 5_000 + PROMOTE):  # listed cell B at 200
            m.add(4, e, 200)
        m.add(4, 4_000, 200)  # hot in B: widens B's lo
    check_listed(idx)
    a, b = ext_of(idx, 4).cells[::LISTING]
    assert (a.min(), a.max(), b.min()) == (1_000, 1_062, 4_000)
    assert ext_of(idx, 4).hi == 5_000 + PROMOTE - 1
    for e in (3_000, 1_001, 4_001, 999, 9, 4_000, 1_062, 6_000):  # between, gaps, ends, above hi
        assert ((4, e) in idx) == ((4, e) in ref)
    assert not idx.discard(4, 3_000) and not idx.discard(4, 1_001) and idx.discard(4, 4_000)
    ref.discard(4, 4_000)
    assert idx.next_due_ms() == 100  # the front bucket is left sparse until it is taken
    for m in (idx, ref):
        m.add_many(4, list(range(2, 2 + PROMOTE)), 100)  # merged into listed cell A: its bounds widen
    check_listed(idx)
    assert ext_of(idx, 4).cells[0].min() == 2
    assert (4, 9) in idx and idx.discard(4, 9) and ref.discard(4, 9)
    assert idx.discard(4, 2_000) == ref.discard(4, 2_000)  # between A and B after the widening
    assert idx.pop_due(300) == ref.pop_due(300)
    check_listed(idx)
    assert not idx and not idx._by_id


def test_distinct_is_numpy_unique():
    import numpy as np

    from nacktracker.index.bitmaps import distinct

    rng = np.random.default_rng(3)
    for n in (0, 1, 2, 7, 500):
        a = rng.integers(0, 40, n).astype(np.uint64)
        assert distinct(a).tolist() == np.unique(a).tolist()
    for values, want in (([5, 5], [5]), ([9, 3], [3, 9]), ([4, 4, 4], [4]), ([7], [7]), ([], [])):
        a = np.array(values, dtype=np.uint64)
        assert distinct(a).tolist() == want, values
        assert a.tolist() == values  # its input untouched


def test_bitmap_helpers_as_worked_by_hand():
    """The bitmap helpers the index's bulk path and windows use, on each mix of
    32- and 64-bit bitmaps (pyroaring refuses to mix them): a union keeps both
    sides' ids, widens to 64 bits when either side is 64-bit and otherwise
    updates the cell itself; an overlap is found across widths; a bitmap of ids
    is 64-bit exactly when one is >= 2^32."""
    from nacktracker.index.bitmaps import bitmap_of, common, merge_into, overlaps

    big = 1 << 32
    for a_wide in (False, True):
        for b_wide in (False, True):
            a = (BitMap64 if a_wide else BitMap)([1, 5] + ([big + 1] if a_wide else []))
            b = (BitMap64 if b_wide else BitMap)([5, 9] + ([big + 9] if b_wide else []))
            want = set(a) | set(b)
            a_ids, b_ids = set(a), set(b)
            assert overlaps(a, b) and overlaps(b, a)
            assert not overlaps(a, (BitMap64 if b_wide else BitMap)([2, 3]))
            out = merge_into(a, b)
            assert set(out) == want and set(b) == b_ids, (a_wide, b_wide)
            assert type(out) is (BitMap64 if a_wide or b_wide else BitMap)
            if a_wide:
                assert out is a  # 64-bit already: the cell itself, updated
            elif not b_wide:
                assert out is a
            else:
                assert set(a) == a_ids  # widened: a new bitmap, the 32-bit cell as it was
    assert set(merge_into(BitMap(), BitMap64([big]))) == {big}
    for ids, wide in (([], False), ([0, 7], False), ([big - 1], False), ([3, big], True), ([big + big // 2], True),
                      ([1 << 40], True)):
        bm = bitmap_of(np.array(ids, dtype=np.uint64))
        assert (type(bm) is BitMap64) == wide and sorted(bm) == ids, ids
    cell = BitMap([1, 2, 3, 4])
    assert sorted(common(cell, {2, 4, 9})) == [2, 4] and sorted(common(cell, {1, 2, 3, 4, 5, 6})) == [1, 2, 3, 4]
    assert common(BitMap([1]), {big}) == [] and common(BitMap64([big]), {big}) == [big]


def test_a_sort_across_segments_of_64_kib_or_more_uses_a_memory_map_of_its_own(monkeypatch):
    """``sort_across`` sorts several arrays as one sequence; from SCRATCH_MAP
    bytes of values on, its scratch array lives in a memory map of exactly their
    size (given back to the system when done, not a hole left in the C heap),
    below that in an ordinary array."""
    import mmap as mmap_module

    from nacktracker.index import bitmaps

    maps: list[int] = []
    real_mmap = mmap_module.mmap

    def recording_mmap(fileno, length, *args, **kwargs):
        maps.append(length)
        return real_mmap(fileno, length, *args, **kwargs)

    monkeypatch.setattr(bitmaps.mmap, "mmap", recording_mmap)
    assert bitmaps.SCRATCH_MAP == 1 << 16
    rng = np.random.default_rng(5)
    for n, mapped in ((10, False), (8191, False), (8192, True), (20_000, True)):
        maps.clear()
        parts = [rng.integers(0, 1 << 60, k).astype(np.uint64) for k in (n // 3, n - n // 3)]
        want = np.sort(np.concatenate(parts))
        bitmaps.sort_across(parts)
        assert np.concatenate(parts).tolist() == want.tolist() and [len(p) for p in parts] == [n // 3, n - n // 3]
        assert maps == ([8 * n] if mapped else []), n


def test_taking_a_big_bucket_does_not_import_numpy_ma():
    """np.unique imports numpy.ma on first use (over 1 MB of RSS, counted
    against the index by the grid's RSS growth); the index never needs it."""
    import subprocess
    import sys

    code = ("import sys\nfrom nacktracker import TimeBucketIndex\nidx = TimeBucketIndex(precision_bits=8)\n"
            "for e in range(300):\n    idx.add(e % 7, e, 1000 + e % 3)\n    idx.add(99, e, 5000 + e * 40)\n"
            "assert len(idx.pop_due(10**6)) == 600 and idx.bucket_count() == 0\n"
            "assert 'numpy.ma' not in sys.modules, 'numpy.ma imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("cls", [TimeBucketIndex, DictIndex])
def test_membership_takes_the_ids_add_takes_and_nothing_else(cls):
    """``in`` answers for the ids ``add`` accepts (numpy integers too) and is
    False for what ``add`` refuses (bool, negative, float, not a pair), the
    same in the index and its reference model (a fuzz case: (6, True) matched
    the dict's (6, 1))."""
    import numpy as np

    idx = cls(precision_bits=0)
    idx.add(6, 1, 0)
    assert (6, 1) in idx and (np.int64(6), np.uint32(1)) in idx
    for item in [(6, True), (True, 1), (6, -1), (6, 1.0), (6,), (6, 1, 0), [6, 1], "ab", None]:
        assert item not in idx, item


def test_the_live_bitmap_widens_for_ids_it_cannot_key():
    """The live bitmap starts 32-bit (``slot << 22 | entry``); the first id
    below 2^32 it cannot key (entry >= 2^22, or a ledger slot >= 2^10)
    re-keys it as a BitMap64 (``slot << 32 | entry``), and every id keeps
    answering as in DictIndex across the change; ids >= 2^32 never widen it."""
    for trigger in ("entry", "slot", "add_many"):
        idx, ref = TimeBucketIndex(precision_bits=0), DictIndex(precision_bits=0)
        for m in (idx, ref):
            m.add(3, 7, 100)
            m.add_many(3, range(100, 200), 100)  # a listed cell
            m.add(4, 2**40, 100)  # 64-bit: in ``wide``, the live bitmap stays narrow
        assert type(idx._ids.bits) is BitMap and idx._ids.shift == LIVE_ENTRY_BITS
        assert (4, (1 << LIVE_ENTRY_BITS) + 1) not in idx and (4, 1 << LIVE_SLOT_BITS) not in idx
        assert not idx.discard(5 << LIVE_ENTRY_BITS, 7)  # no ledger: no key collision either
        for m in (idx, ref):
            if trigger == "entry":
                m.add(3, (1 << LIVE_ENTRY_BITS) + 1, 200)
            elif trigger == "slot":
                for i in range(1 << LIVE_SLOT_BITS):  # slots 2 .. 1025
                    m.add(10_000 + i, 1, 300)
            else:
                m.add_many(4, range((1 << LIVE_ENTRY_BITS) - 50, (1 << LIVE_ENTRY_BITS) + 50), 200)
        assert type(idx._ids.bits) is BitMap64 and idx._ids.shift == 32
        for probe in [(3, 7), (3, 150), (3, (1 << LIVE_ENTRY_BITS) + 1), (4, 2**40), (4, (1 << LIVE_ENTRY_BITS) - 1),
                      (10_000 + 1000, 1), (10_000 + 1000, 2)]:
            assert (probe in idx) == (probe in ref), (trigger, probe)
        for probe in [(3, 7), (4, 2**40), (10_000 + 1022, 1)]:
            assert idx.discard(*probe) == ref.discard(*probe)
        check_listed(idx)
        assert idx.pop_due(10**6) == ref.pop_due(10**6) and not idx and not idx._ids.bits


@pytest.mark.parametrize("first", ["add", "add_many"])
def test_an_index_whose_first_id_is_past_the_narrow_bound_starts_wide(first):
    """A ledger past 4,194,304 entries nacked into a fresh index: the empty
    narrow live bitmap widens before the first id is stored."""
    idx, ref = TimeBucketIndex(precision_bits=0), DictIndex(precision_bits=0)
    big = 5_000_000
    for m in (idx, ref):
        if first == "add":
            m.add(1, big, 10)
        else:
            m.add_many(1, range(big, big + 100), 10)
        m.add(1, 3, 20)
    assert type(idx._ids.bits) is BitMap64
    assert ((1, big) in idx) and ((1, 3) in idx) and (1, big - 1) not in idx
    assert idx.discard(1, big) == ref.discard(1, big)
    assert idx.pop_due(20) == ref.pop_due(20) and not idx


def test_widening_and_popping_more_ids_than_one_re_keying_step():
    """More live ids than one ``KEY_SLICE`` step re-key in several steps (the
    narrow bitmap emptied as they go); buckets holding more than a step, from
    sparse copies of several ledgers and from a dense run, leave the wide
    live bitmap in several; every id answers as in DictIndex throughout."""
    step = _live.KEY_SLICE
    idx, ref = TimeBucketIndex(precision_bits=10), DictIndex(precision_bits=10)
    n = 3 * step + 17
    for m in (idx, ref):
        for i in range(n):  # three ledgers interleaved, ids 3 apart, five buckets
            m.add(1 + i % 3, 3 * i, 1_000 + (i % 5) * 1_024)
        m.add_many(5, range(10**6, 10**6 + 2 * step + 1), 2_100)  # a dense cell
    assert type(idx._ids.bits) is BitMap
    for m in (idx, ref):
        m.add(2, (1 << LIVE_ENTRY_BITS) + 5, 9_000)
    assert type(idx._ids.bits) is BitMap64 and len(idx) == len(ref)
    probes = [(1 + i % 3, 3 * i + d) for i in range(0, n, 37) for d in (0, 1)] + [(5, 10**6 + step), (5, 10**6 - 1)]
    for probe in probes:
        assert (probe in idx) == (probe in ref), probe
    for due in (1_000, 2_100, 3_100, 10_000):
        assert idx.pop_due(due) == ref.pop_due(due)
        assert len(idx) == len(ref)
        for probe in probes:
            assert (probe in idx) == (probe in ref), (due, probe)
    assert not idx and not idx._ids.bits


def test_an_ack_emptying_one_of_two_listed_cells_keeps_the_other():
    """Two ledgers' bursts in one window: the acks that empty one ledger's cell take that cell out
    of the window and leave the other ledger's cell, whole, to be taken when due."""
    idx = TimeBucketIndex(precision_bits=0)
    for ledger, bucket in ((1, 50), (2, 51)):
        for e in range(PROMOTE + 1):
            idx.add(ledger, e, bucket)
    for e in range(PROMOTE + 1):
        assert idx.discard(1, e)
    assert len(idx) == PROMOTE + 1 and idx.next_due_ms() == 51
    assert idx.pop_due(100) == [(2, e) for e in range(PROMOTE + 1)] and len(idx) == 0


@pytest.mark.parametrize("gone", [1, 2])
def test_acks_emptying_a_cell_of_the_open_front_window_leave_the_other_cell_of_its_bucket(gone):
    """The front window is open (its cells' keys in a heap); two ledgers' bursts share
    one bucket there and acks empty one ledger's cell: its key is left stale in the
    heap, on top of the other's (ledger 1, the lower slot) or behind it (ledger 2).
    The next pop takes the remaining cell, whole, after the earlier bucket."""
    idx = TimeBucketIndex(precision_bits=0)
    idx.add(9, 0, 10)
    idx.add(9, 1, 20)
    assert idx.pop_due(10) == [(9, 0)]  # the window opens at the front
    for ledger in (1, 2):
        for e in range(PROMOTE + 1):
            idx.add(ledger, e, 50)
    for e in range(PROMOTE + 1):
        assert idx.discard(gone, e)
    kept = 3 - gone
    assert len(idx) == PROMOTE + 2 and idx.next_due_ms() == 20
    assert idx.pop_due(30) == [(9, 1)] and idx.next_due_ms() == 50
    assert idx.pop_due(100) == [(kept, e) for e in range(PROMOTE + 1)] and len(idx) == 0 and not idx


@pytest.mark.parametrize("bits", [0, 4, 14])
def test_count_bounds_count_only_what_a_pop_left_in_a_window(bits):
    """A window partly taken by pop_due is bounded by the copies left in it: 40 copies left of
    100 (at most SMALL_WINDOW) are counted exactly, as the one bucket and the 40 cells they are."""
    idx = TimeBucketIndex(precision_bits=bits)
    width = 1 << bits
    for i in range(100):  # one copy per ledger: no dense cell
        idx.add(1_000 + i, 1, 5 * width if i < 60 else 6 * width)
    assert len(idx.pop_due(5 * width)) == 60
    assert (idx.bucket_count(), idx.bitmap_count()) == (1, 40)
    assert (idx.bucket_count_bound(), idx.bitmap_count_bound()) == (1, 40)


@pytest.mark.parametrize("listed_wide,batch_wide", [(False, True), (True, False)])
def test_a_bulk_add_meeting_a_listed_cell_of_the_other_width_counts_each_id_once(listed_wide, batch_wide):
    """add_many's bulk path is taken only when none of its ids is pending: a listed cell of 32-bit
    ids checked against a batch holding 64-bit ids (or the other way round) still finds the id they
    share, which then is pending in both buckets, as the reference model says."""
    idx, ref = TimeBucketIndex(precision_bits=0), DictIndex(precision_bits=0)
    base = 2**32 if listed_wide else 0
    for m in (idx, ref):
        for e in range(PROMOTE + 1):  # a burst: a listed cell
            m.add(1, base + e, 50)
        shared = base + 5
        batch = [shared] + [(2**32 if batch_wide else 0) + 100 + i for i in range(40)]
        m.add_many(1, batch, 60)
    assert len(idx) == len(ref) == PROMOTE + 42
    assert ((1, shared) in idx) and idx.pop_due(50) == ref.pop_due(50) and ((1, shared) in idx)
    assert idx.pop_due(60) == ref.pop_due(60) and len(idx) == 0


@pytest.mark.parametrize("bits,offset_bits,window_shift,offset_shift,slot_limit", [
    (0, 14, 14, 50, 1 << 18), (8, 6, 14, 58, 1 << 26), (11, 3, 14, 61, 1 << 29), (14, 3, 17, 61, 1 << 29),
    (30, 3, 33, 61, 1 << 29),
])
def test_the_layout_of_each_precision_as_worked_by_hand(monkeypatch, bits, offset_bits, window_shift, offset_shift,
                                                         slot_limit):
    """A window spans 2^14 ms and at least 8 buckets: a packed copy's top ``14 - bits`` bits (at
    least 3) are its bucket's offset in the window, the next ones its ledger slot, the low 32 its
    entry id."""
    monkeypatch.setattr(layout, "_LAYOUTS", {})  # made here, not an object an earlier test made
    lay = Layout.for_bits(bits)
    assert (lay.bits, lay.offset_bits, lay.window_shift, lay.offset_shift) == (bits, offset_bits, window_shift, offset_shift)
    assert (lay.slot_limit, lay.offset_mask) == (slot_limit, (1 << offset_bits) - 1)
    assert Layout.for_bits(bits) is lay
    packed = ((5 << (64 - offset_bits)) | ((slot_limit - 1) << 32) | 7)
    assert lay.offset_of(packed) == 5 and lay.offsets(np.array([packed, 7], dtype=np.uint64)).tolist() == [5, 0]


def _packed(lay: Layout, *copies: tuple[int, int, int]) -> array.array:
    """``(offset, slot, entry)`` copies packed as the index packs them."""
    return array.array("Q", [off << lay.offset_shift | slot << 32 | entry for off, slot, entry in copies])


def test_a_narrow_layout_never_reads_a_slot_past_its_limit_as_the_next_bucket():
    """``holds`` of a slot the packed copies cannot hold (a ledger at or past the
    layout's slot limit keeps dense cells only) is False, though its bits, packed,
    would read as slot 0 of the next bucket, where a copy of that entry sits."""
    lay = Layout(0, 30)  # 4 slots per bucket: slot 4 of bucket 0 packs as slot 0 of bucket 1
    assert lay.slot_limit == 4
    wins = Windows(lay)
    w = wins.window(0)
    w.packed = _packed(lay, (1, 0, 5))
    assert wins.holds(0, 5, 1) and not wins.holds(4, 5, 0) and not wins.holds(5, 5, 0)


def test_holds_finds_a_copy_in_any_segment_of_a_sorted_or_unsorted_window():
    """A window not opened keeps its segments in arrival order: each is scanned;
    an open one's are sorted across, and a copy is found in any of them, before
    or after the first segment's taken part (``pos``)."""
    lay = Layout.for_bits(0)
    wins = Windows(lay)
    w = wins.window(0)
    w.full = [_packed(lay, (0, 0, 9), (0, 0, 3)), _packed(lay, (0, 0, 1))]  # arrival order
    assert all(wins.holds(0, e, 0) for e in (9, 3, 1)) and not wins.holds(0, 2, 0)
    w = wins.window(1 << lay.window_shift)
    w.full = [_packed(lay, (0, 0, 1), (0, 0, 2), (0, 0, 3)), _packed(lay, (0, 0, 4), (0, 0, 5), (0, 0, 6))]
    w.opened, w.pos = True, 2  # entries 1 and 2 were taken
    base = 1 << lay.window_shift
    assert [e for e in range(8) if wins.holds(0, e, base)] == [3, 4, 5, 6]


def _tail_window(lay: Layout, spill: list, packed: list, off_min: int):
    w = Windows(lay).window(0)
    w.opened = True
    w.spill = [_packed(lay, *s) for s in spill]
    w.packed = _packed(lay, *packed) if packed else NO_PACKED
    w.tail_min = off_min
    return w


def test_taking_a_bucket_from_a_tail_with_spilled_segments_takes_them_all_and_keeps_the_rest_in_order():
    """The open front window's unsorted tail: rolled segments (``spill``) and
    ``packed``. Taking bucket 0 takes its copies from every array (even with a
    short ``packed``) and leaves the others in their order, refilling the arrays
    from the first: here exactly one copy lands in the last array."""
    lay = Layout.for_bits(0)
    wins = Windows(lay)
    w = _tail_window(lay, [[(1, 0, 1), (1, 0, 2), (0, 0, 3)]], [(1, 0, 4), (2, 0, 5)], 0)
    got = wins.take_sparse(w, 0)
    assert [list(p) for p in got] == [list(_packed(lay, (0, 0, 3)))]
    assert [list(a) for a in w.spill] == [list(_packed(lay, (1, 0, 1), (1, 0, 2), (1, 0, 4)))]
    assert list(w.packed) == list(_packed(lay, (2, 0, 5))) and w.tail_min == 1
    assert [v & 0xFFFFFFFF for v in wins.take_sparse(w, 1)[0]] == [1, 2, 4] and w.tail_min == 2


def test_a_short_tail_taken_whole_goes_back_to_the_shared_empty_array():
    """A window whose tail a take empties holds the shared empty array again, as
    before its first sparse copy: its bytes are those of a window with none."""
    lay = Layout.for_bits(0)
    wins = Windows(lay)
    w = _tail_window(lay, [], [(0, 0, 1), (0, 1, 2)], 0)
    w.spill = NO_SEGMENTS
    wins.take_sparse(w, 0)
    assert w.packed is NO_PACKED and w.tail_min == w.NO_TAIL and w.empty()


def test_a_take_refills_three_tail_arrays_in_order_and_drops_those_left_empty():
    """Bucket 0's copies leave a tail of three arrays: the others move up in
    order across all three (the last keeps one), and the arrays a take leaves
    with nothing go (in the second case the first holds all that is left)."""
    lay = Layout.for_bits(0)
    wins = Windows(lay)
    w = _tail_window(lay, [[(0, 0, 1), (1, 0, 2)], [(1, 0, 3), (1, 0, 4)]], [(1, 0, 5), (2, 0, 6), (0, 0, 7)], 0)
    assert [v & 0xFFFFFFFF for v in wins.take_sparse(w, 0)[0]] == [1, 7]
    assert [[v & 0xFFFFFFFF for v in a] for a in [*w.spill, w.packed]] == [[2, 3], [4, 5], [6]]
    w = _tail_window(lay, [[(1, 0, 1), (0, 0, 2), (1, 0, 3)], [(0, 0, 4), (0, 0, 5)]], [(0, 0, 6), (0, 0, 7)], 0)
    assert len(wins.take_sparse(w, 0)[0]) == 5
    assert w.spill is NO_SEGMENTS and [v & 0xFFFFFFFF for v in w.packed] == [1, 3]  # exactly the first array
    w = _tail_window(lay, [[(1, 0, 1), (0, 0, 2), (1, 0, 3)]], [(1, 0, 4), (0, 0, 5), (2, 0, 6)], 0)
    wins.take_sparse(w, 0)
    assert [[v & 0xFFFFFFFF for v in a] for a in [*w.spill, w.packed]] == [[1, 3, 4], [6]]


def test_a_take_shrinks_a_copy_of_an_array_something_holds_a_view_of():
    """An array someone else holds a view of (a debugger's frame) cannot shrink:
    the take keeps a copy of what is left in its place, and the view still reads
    the old array (refilled in place, not shrunk)."""
    lay = Layout.for_bits(0)
    wins = Windows(lay)
    w = _tail_window(lay, [[(1, 0, 1), (0, 0, 2), (1, 0, 3)]], [(0, 0, 4)], 0)
    held = memoryview(w.spill[0])
    assert [v & 0xFFFFFFFF for v in wins.take_sparse(w, 0)[0]] == [2, 4]
    assert w.spill is NO_SEGMENTS and [v & 0xFFFFFFFF for v in w.packed] == [1, 3] and w.tail_min == 1
    assert held.tolist() == list(_packed(lay, (1, 0, 1), (1, 0, 3), (1, 0, 3)))
    held.release()


def test_a_tail_taken_whole_leaves_the_shared_empties():
    """A take that empties a long tail (rolled segments and ``packed``) leaves
    the window the shared empty array and list, as before its first copy."""
    lay = Layout.for_bits(0)
    wins = Windows(lay)
    w = _tail_window(lay, [[(0, 0, e) for e in range(3)]], [(0, 1, 9)], 0)
    assert len(wins.take_sparse(w, 0)[0]) == 4
    assert w.spill is NO_SEGMENTS and w.packed is NO_PACKED and w.tail_min == w.NO_TAIL and w.empty()


def test_a_front_bucket_known_from_a_stale_tail_mark_is_checked_not_trusted():
    """In the open front window, a run of adds promoted out of the tail into a
    dense cell leaves the tail's earliest-offset mark behind; acks then empty
    that cell (dense cells drop acked ids at once: no ghost). The mark now
    names a bucket with nothing in it: the front is the next dense cell's
    bucket, one ms later, not the stale one."""
    idx = TimeBucketIndex(precision_bits=0)
    base = 1 << 14  # window 1, offset 0
    idx.add(1, 0, base + 10)
    assert idx.next_due_ms() == base + 10  # the window opens (sorted)
    run = range(PROMOTE + 5)
    for e in run:
        idx.add(2, e, base)  # offset 0: a run, promoted into a dense cell
    for e in run:
        idx.add(3, e, base + 1)  # offset 1: another
    (w,) = idx._windows.values()
    assert w.tail_min == 0 and sorted(key >> 32 for key in w.dense) == [0, 1]
    for e in run:
        assert idx.discard(2, e)
    assert not idx._ids.ghost_copies and [key >> 32 for key in w.dense] == [1] and w.tail_min == 0
    assert idx.next_due_ms() == base + 1
    assert idx.pop_due(base) == [] and len(idx.pop_due(base + 1)) == len(run) and idx.next_due_ms() == base + 10


def test_a_window_is_made_once_per_id_and_the_earliest_id_is_kept():
    """``Windows.window(bucket)``: the window of the bucket's id, made if new and
    the same object after (with what it holds); the earliest id follows the
    windows made and dropped."""
    lay = Layout.for_bits(0)
    wins = Windows(lay)
    w = wins.window(5 << lay.window_shift)
    w.packed = _packed(lay, (0, 0, 1))
    assert wins.window((5 << lay.window_shift) + 7) is w and list(w.packed) == list(_packed(lay, (0, 0, 1)))
    assert wins.first() == (5, w)
    early = wins.window(2 << lay.window_shift)
    assert wins.first() == (2, early) and wins.window(9 << lay.window_shift) is not w and wins.first_id == 2
    wins.drop_first()
    assert wins.first() == (5, w) and [wid for wid, _ in wins.in_order()] == [5, 9]


def _same_as_dict(ops) -> tuple[TimeBucketIndex, DictIndex]:
    """Apply ``(method, *args)`` to a TimeBucketIndex and a DictIndex; each answer must agree."""
    idx, ref = TimeBucketIndex(precision_bits=0), DictIndex(precision_bits=0)
    for name, *args in ops:
        assert getattr(idx, name)(*args) == getattr(ref, name)(*args), (name, args)
        check_listed(idx)
        assert idx._ids.ghost_copies == sum(g.count for g in idx._ids.ghosts.values())
    return idx, ref


def test_an_id_acked_nacked_again_and_acked_again_leaves_only_ghosts():
    """An ack leaves ghost copies in their cells; a nack after it revives the id
    in its new bucket; a second ack turns that copy into a ghost too: the id's
    ghost then counts both copies, and no pop returns it."""
    ops = [("add", 1, 5, 100), ("discard", 1, 5), ("add", 1, 5, 200), ("discard", 1, 5),
           ("add", 1, 6, 250), ("pop_due", 150), ("pop_due", 300)]
    idx, _ = _same_as_dict(ops)
    assert not idx and not idx._ids.ghosts and not idx._ids.ghost_copies
    # an id pending twice acked (two ghosts), then another id of its ledger acked
    idx, _ = _same_as_dict([("add", 1, 5, 100), ("add", 1, 5, 200), ("add", 1, 6, 300), ("discard", 1, 5),
                            ("discard", 1, 6), ("pop_due", 400)])
    assert not idx and not idx._ids.ghosts and not idx._ids.multi
    # the second copy in a dense cell: a run of adds after the ack
    run = [("add", 1, e, 200) for e in range(PROMOTE + 5)]
    idx, _ = _same_as_dict([("add", 1, 5, 100), ("discard", 1, 5), *run, ("discard", 1, 5),
                            ("pop_due", 150), ("pop_due", 300)])
    assert not idx and not idx._ids.ghosts and not idx._ids.ghost_copies
    # the copies the acks take out of a listed cell (listed before the first ack) leave no live one
    idx, _ = _same_as_dict([*run, ("add", 1, 5, 100), ("discard", 1, 5), ("add", 1, 5, 200), ("discard", 1, 5),
                            ("__contains__", (1, 5)), ("pop_due", 150), ("pop_due", 300)])
    assert not idx and not idx._ids.ghosts and not idx._ids.ghost_copies


def test_a_ledger_with_ghosts_widens_the_live_bitmap_for_an_id_it_cannot_key():
    """A ledger with a ghost takes its next ids through the slower add; an id
    the narrow live bitmap cannot key (entry >= 2^22) still widens it first,
    so it is not mistaken for another ledger's id."""
    big = 2**LIVE_ENTRY_BITS + 7
    idx, _ = _same_as_dict([("add", 1, 5, 100), ("discard", 1, 5), ("add", 2, 7, 100), ("add", 1, big, 200),
                            ("__contains__", (1, big)), ("__contains__", (2, 7)), ("discard", 2, 7),
                            ("__contains__", (1, big)), ("pop_due", 300)])
    assert type(idx._ids.bits) is BitMap64


def test_an_id_pending_twice_keeps_the_live_bitmap_narrow():
    """A second copy of an id the narrow live bitmap keys (a re-nack into another
    bucket) does not widen it: every id of every ledger here fits."""
    idx, _ = _same_as_dict([("add", 1, 5, 100), ("add", 2, 5, 100), ("add", 1, 5, 200), ("add", 2, 5, 200),
                            ("__contains__", (2, 5)), ("pop_due", 150), ("__contains__", (2, 5))])
    assert type(idx._ids.bits) is BitMap and idx._ids.shift == LIVE_ENTRY_BITS
    # a ledger with listed cells (slot 1) takes its next ids through the rarer path: still narrow
    run = [("add", 2, e, 100) for e in range(PROMOTE + 5)]
    idx, _ = _same_as_dict([("add", 1, 5, 100), *run, ("add", 2, 500, 200), ("__contains__", (2, 500))])
    assert ext_of(idx, 2).cells is not None and type(idx._ids.bits) is BitMap


def test_the_largest_entry_id_and_slot_the_narrow_live_bitmap_keys_keep_it_narrow():
    """Entry id 2^22 - 1 and ledger slot 2^10 - 1 are the largest the narrow live
    bitmap keys (``slot << 22 | entry``): adding them, as a burst into the last
    cell or as a ledger's first add, leaves it narrow and every answer as in
    DictIndex."""
    top = (1 << LIVE_ENTRY_BITS) - 1
    idx, _ = _same_as_dict([("add", 1, 0, 100), ("add", 1, top, 100),  # a burst into the hot cell
                            ("add", 2, top, 200), ("add", 1, top - 1, 300),  # a ledger's first add; another bucket
                            ("__contains__", (1, top)), ("discard", 2, top), ("pop_due", 150)])
    assert type(idx._ids.bits) is BitMap and idx._ids.shift == LIVE_ENTRY_BITS
    last = 1 << LIVE_SLOT_BITS  # ledgers 1 .. last take slots 0 .. last - 1
    firsts = [("add", lid, 0, 100) for lid in range(1, last + 1)]
    idx, ref = _same_as_dict([*firsts, ("add", last, 1, 100), ("add", last, top, 100),  # bursts at the last slot
                              ("__contains__", (last, top)), ("discard", last, 1)])
    assert idx._by_id[last] == last - 1
    assert type(idx._ids.bits) is BitMap and idx._ids.shift == LIVE_ENTRY_BITS
    assert idx.pop_due(150) == ref.pop_due(150) and not idx


def test_a_burst_into_a_sparse_cell_meets_the_copy_in_its_ledgers_listed_cell():
    """A ledger with a listed cell (its ids kept there only, not in the live
    bitmap) adds into a new sparse hot cell: re-adding an id the listed cell
    holds, its top one included, is found there (pending twice, as in
    DictIndex), not counted as a new id."""
    run = [("add", 1, e, 100) for e in range(PROMOTE + 5)]
    for probe in (5, PROMOTE + 4):
        idx, ref = _same_as_dict([*run, ("add", 1, 1000, 200), ("add", 1, 1001, 200)])
        assert ext_of(idx, 1).cells is not None and idx._hot_lid == 1 and idx._hot_dense is None
        for m in (idx, ref):
            m.add(1, probe, 200)  # a burst into the hot sparse cell
        assert len(idx) == len(ref) and idx.pop_due(150) == ref.pop_due(150)
        assert (1, probe) in idx and (1, probe) in ref
        assert idx.pop_due(300) == ref.pop_due(300) and not idx


def test_an_id_past_32_bits_acked_in_a_ledger_with_32_and_64_bit_listed_cells():
    """A ledger lists a 32-bit cell and a 64-bit one (a run widened by an id past
    2^32): an ack of an id past 2^32 below the listed ids' top looks through
    both without asking the 32-bit one for a 64-bit id."""
    for wide in (2**32 + 5, 2**39):
        low = [("add", 1, e, 100) for e in range(PROMOTE + 5)]
        high = [("add", 1, e, 200) for e in range(1000, 1000 + PROMOTE + 5)]
        idx, _ = _same_as_dict([*low, *high, ("add", 1, 2**40, 200), ("add", 1, wide, 300), ("discard", 1, wide),
                                ("__contains__", (1, wide)), ("discard", 1, 2**40), ("discard", 1, 3),
                                ("pop_due", 300)])
        assert not idx


def test_a_hot_listed_cell_emptied_by_acks_takes_no_more_adds():
    """Acks empty the listed cell the run of adds is filling: it leaves its
    window, so the next adds to that bucket go into a new cell, not the gone one."""
    run = [("add", 1, e, 100) for e in range(PROMOTE + 5)]
    acks = [("discard", 1, e) for e in range(PROMOTE + 5)]
    idx, _ = _same_as_dict([("add", 1, 5000, 300), *run, *acks, ("add", 1, 50, 100), ("add", 1, 51, 100),
                            ("__contains__", (1, 51)), ("pop_due", 300)])
    assert not idx


def test_a_gathered_bucket_merges_its_sparse_copies_into_its_listed_cell_and_lists_them():
    """A copy added before its cell became a listed run stays sparse until the
    bucket is gathered (here for a ghost in it, before its time): it then joins
    the listed cell, whose top id follows, so an ack finds it there."""
    run = [("add", 1, e, 100) for e in range(PROMOTE + 5)]
    idx, _ = _same_as_dict([("add", 1, 900, 100), ("add", 2, 1, 100), *run, ("discard", 2, 1),
                            ("next_due_ms",), ("__contains__", (1, 900)), ("discard", 1, 900),
                            ("__contains__", (1, 900)), ("pop_due", 100)])
    assert not idx
    # with a listed cell of higher ids in a later bucket: the top id stays the higher one
    high = [("add", 1, e, 200) for e in range(5000, 5000 + PROMOTE + 5)]
    idx, _ = _same_as_dict([*high, ("add", 1, 900, 100), ("add", 2, 1, 100), *run, ("discard", 2, 1),
                            ("next_due_ms",), ("__contains__", (1, 5010)), ("discard", 1, 5010), ("discard", 1, 900),
                            ("pop_due", 200)])
    assert not idx


def test_a_hot_cell_of_a_ledger_with_ghosts_widened_to_64_bits_keeps_its_ids_live():
    """A run of adds in a ledger with a ghost makes a dense cell that is not
    listed; a 64-bit id widens it mid-run, and the acked copy in that cell is
    nacked again (the ledger's last ghost goes): the run's next ids still count
    as pending (they go through the live bitmap, as the cell is not listed)."""
    run = [("add", 1, e, 100) for e in range(PROMOTE + 5)]
    more = [("add", 1, e, 100) for e in range(50, 60)]
    idx, _ = _same_as_dict([("add", 1, 999, 100), ("discard", 1, 999), *run, ("add", 1, 2**40, 100),
                            ("add", 1, 999, 100), *more,
                            *[("__contains__", (1, e)) for e in (3, 50, 59, 999, 2**40)], ("discard", 1, 55),
                            ("pop_due", 100)])
    assert not idx


def test_widening_re_keys_every_live_id_across_slices():
    """More live ids than one re-keying slice, consecutive (no gap between two
    slices): widening keeps every one."""
    n = _live.KEY_SLICE + 300
    idx = TimeBucketIndex(precision_bits=0)
    for e in range(n):
        idx.add(1, e, 100 + 50 * (e % 2))  # two buckets in turn: no run, every id in the live bitmap
    assert type(idx._ids.bits) is BitMap and len(idx._ids.bits) == n
    idx.add(1, 2**LIVE_ENTRY_BITS, 300)
    assert type(idx._ids.bits) is BitMap64
    assert all((1, e) in idx for e in range(n)) and len(idx.pop_due(1_000)) == n + 1


def test_flushing_listed_cells_counts_their_ids_as_changes_to_the_live_bitmap():
    """``flush_listed`` puts the listed cells' ids into the live bitmap, counts
    each as a change (the live bitmap compacts every so many) and unlists them:
    no listed cell, ``hi`` back to -1."""
    from nacktracker.index._ledgers import Ledgers
    from nacktracker.index._live import LiveIds

    ledgers = Ledgers()
    slot = ledgers.slot(42)
    ids = LiveIds(ledgers)
    ext = ledgers.ext_of(slot)
    w = layout.Window()
    ext.cells, ext.hi = [BitMap(range(10)), w, 1 << 32 | slot, BitMap(range(20, 25)), w, 2 << 32 | slot], 24
    ids.churn = 3
    ids.flush_listed(slot, ext)
    assert ids.churn == 3 + 15 and sorted(e & (2**LIVE_ENTRY_BITS - 1) for e in ids.bits) == [*range(10), *range(20, 25)]
    assert ext.cells is None and ext.hi == -1


def test_an_id_the_narrow_live_bitmap_cannot_key_is_not_read_as_another_ledgers():
    """While the live bitmap is narrow (``slot << 22 | entry``), an id of 2^22 or
    more was never added (its add would have widened it): asking for one is
    not answered with the next slot's id that its bits would spell."""
    idx, _ = _same_as_dict([("add", 1, 5, 100), ("add", 2, 7, 100), ("__contains__", (1, 2**LIVE_ENTRY_BITS + 7)),
                            ("discard", 1, 2**LIVE_ENTRY_BITS + 7), ("__contains__", (2, 7))])
    assert type(idx._ids.bits) is BitMap


def test_compacting_the_live_bitmap_refits_it_and_sets_the_next_compaction():
    """``compact()``: the live bitmap shrunk to fit (its bytes are counted as
    refit from then on), the change count back to 0, the next compaction a
    quarter of its size in changes away (at least COMPACT_CHURN)."""
    from nacktracker.index._ledgers import Ledgers
    from nacktracker.index._live import LiveIds
    from nacktracker.index.layout import COMPACT_CHURN, roaring_bytes

    ids = LiveIds(Ledgers())
    ids.bits.update(range(0, 40_000 * 8, 8))
    ids.churn = 123
    ids.compact()
    assert ids.refitted is True and ids.churn == 0 and ids.compact_at == max(COMPACT_CHURN, 40_000 >> 2) == 10_000
    assert ids.nbytes() == layout.held_size(ids) + roaring_bytes(ids.bits, grown=True, refit=True)
    small = LiveIds(Ledgers())
    small.bits.update(range(10))
    small.compact()
    assert small.compact_at == COMPACT_CHURN
    small.churn, small.refitted = COMPACT_CHURN - 1, False
    small.release(0, BitMap([3]))  # one change short of it: no compaction
    assert small.churn == COMPACT_CHURN - 1 and not small.refitted
    small.churn = COMPACT_CHURN
    small.release(0, BitMap([4]))  # as many changes as the next compaction is away: compacted
    assert small.churn == 0 and small.refitted and 4 not in small.bits


def test_a_ledger_holding_only_a_ghost_has_nothing_pending_beside_the_previous_slots_top_id():
    """``has_ledger`` counts the live ids in the ledger's key range of the live
    bitmap: the previous slot's largest narrow id sits just below that range."""
    idx, _ = _same_as_dict([("add", 1, 2**LIVE_ENTRY_BITS - 1, 100), ("add", 2, 5, 100), ("discard", 2, 5)])
    assert idx.has_ledger(1) and not idx.has_ledger(2) and not idx.has_ledger(3)


def test_a_bucket_drops_every_ghost_but_the_revived_ones():
    """A cell holding two acked ids, one of them nacked again into that very
    bucket (its other copy, elsewhere, is still a ghost): the pop returns the
    revived one only."""
    idx, _ = _same_as_dict([("add", 1, 5, 100), ("add", 1, 5, 200), ("discard", 1, 5), ("add", 1, 5, 100),
                            ("add", 1, 6, 100), ("discard", 1, 6), ("pop_due", 100), ("pop_due", 200)])
    assert not idx and not idx._ids.ghosts


def test_a_hot_dense_cell_emptied_of_its_ghosts_takes_no_more_adds():
    """A run in a ledger with a ghost (in a later window) fills a dense cell that
    is not listed; once its window is open, an add makes it the hot cell again
    and acks leave ghosts in it. Gathering the bucket (no sparse copy there)
    drops them all and the cell with them (the ledger stays: its ghost waits in
    the later window): the next adds there go into a new cell."""
    run = [("add", 1, e, 100) for e in range(PROMOTE + 5)]
    acks = [("discard", 1, e) for e in range(PROMOTE + 5)]
    acks = [("discard", 1, e) for e in range(PROMOTE + 6)]
    later = [("add", 2, e, 300) for e in range(PROMOTE + 5)]  # the next bucket: dense only, nothing to gather
    idx, _ = _same_as_dict([("add", 1, 999, 20_000), ("discard", 1, 999), *run, *later,
                            ("next_due_ms",), ("add", 1, PROMOTE + 5, 100), *acks, ("next_due_ms",),
                            ("add", 1, 40, 100), ("__contains__", (1, 40)), ("pop_due", 20_000)])
    assert not idx


def test_a_ledger_keeps_its_slot_while_a_ghost_of_it_waits_in_a_later_bucket():
    """Popping a bucket that empties a ledger of live ids does not free its slot
    while a ghost copy of it waits elsewhere: a new ledger does not inherit it."""
    idx, _ = _same_as_dict([("add", 1, 5, 100), ("add", 1, 6, 200), ("discard", 1, 5), ("discard", 1, 6),
                            ("pop_due", 100), ("add", 2, 6, 300), ("__contains__", (2, 6)), ("pop_due", 200),
                            ("__contains__", (2, 6)), ("pop_due", 300)])
    assert not idx and not idx._by_id


def test_an_id_pending_in_three_buckets_acked_and_nacked_again_into_one_keeps_two_ghosts():
    """Three copies acked are three ghosts; a nack back into one of their cells
    brings that copy back to life and leaves the other two ghosts."""
    idx, _ = _same_as_dict([("add", 1, 5, 100), ("add", 1, 5, 200), ("add", 1, 5, 300), ("discard", 1, 5),
                            ("add", 1, 5, 200), ("pop_due", 100), ("pop_due", 200), ("pop_due", 300)])
    assert not idx and not idx._ids.ghosts


def test_acking_a_ledgers_last_listed_ids_frees_its_slot_unless_a_ghost_of_it_waits():
    """A ledger whose only copies were in a listed cell leaves as its last id is
    acked; one with a ghost waiting in a later bucket stays until that goes."""
    run = [("add", 1, e, 100) for e in range(PROMOTE + 5)]
    acks = [("discard", 1, e) for e in range(PROMOTE + 5)]
    idx, _ = _same_as_dict([*run, *acks])
    assert not idx._by_id and not idx
    idx, _ = _same_as_dict([*run, ("add", 1, 999, 300), ("discard", 1, 999), *acks, ("add", 2, 999, 400),
                            ("__contains__", (2, 999)), ("pop_due", 300), ("__contains__", (2, 999)),
                            ("pop_due", 400)])
    assert not idx._by_id and not idx


def test_add_many_refuses_a_ledger_id_or_due_time_past_its_range():
    """``add_many``'s fast path takes only ids and times in range: a ledger id of
    2^63 or a due time of 2^62 (or a ledger id that is not an int) is refused as
    ``add`` refuses it, and nothing is added; with a few ids or a bulk of them
    (the bulk path adds no id one by one, so nothing after it checks again)."""
    for batch in ([1], list(range(PROMOTE + 1))):
        for idx in (TimeBucketIndex(precision_bits=0), DictIndex(precision_bits=0)):
            with pytest.raises(ValueError, match="ledger_id"):
                idx.add_many(2**63, batch, 5)
            with pytest.raises(ValueError, match="due_ms"):
                idx.add_many(1, batch, 2**62)
            with pytest.raises(TypeError, match="ledger_id"):
                idx.add_many("7", batch, 5)
            assert not idx


def test_bulk_adds_into_a_new_cell_then_the_same_cell_then_single_adds():
    """``add_many``'s bulk path (PROMOTE ids or more, none pending): a new dense
    cell, a second batch merged into that cell, then single adds to it; each
    batch counts its ids as changes to the live bitmap."""
    idx, _ = _same_as_dict([("add_many", 1, list(range(0, 40)), 100)])
    churn = idx._ids.churn
    idx.add_many(1, list(range(100, 150)), 100)
    assert idx._ids.churn == churn + 50
    _same_as_dict([("add_many", 1, list(range(0, 40)), 100), ("add_many", 1, list(range(100, 150)), 100),
                   ("add", 1, 200, 100), ("add", 1, 201, 100), *[("__contains__", (1, e)) for e in (0, 39, 120, 201)],
                   ("discard", 1, 120), ("pop_due", 100)])


def test_bulk_adds_with_ids_past_32_bits_keep_narrow_ids_narrow_and_wide_ids_in_wide():
    """A batch holding ids past 2^32 becomes a 64-bit cell (a batch of 64-bit
    values that all fit 32 bits is taken as 32-bit): its ids past 2^32 join
    the ledger's ``wide`` set, its ids below stay keyed in the narrow live
    bitmap; an id in [2^22, 2^32) widens the live bitmap first."""
    idx, _ = _same_as_dict([("add_many", 1, array.array("Q", range(1, 41)), 100), ("__contains__", (1, 7))])
    assert ext_of(idx, 1) is None and type(idx._ids.bits) is BitMap
    mixed = array.array("Q", [*range(1, 40), 2**32 + 1, 2**40])
    idx, _ = _same_as_dict([("add_many", 1, mixed, 100), ("__contains__", (1, 2**40)), ("__contains__", (1, 3))])
    assert sorted(ext_of(idx, 1).wide) == [2**32 + 1, 2**40] and type(idx._ids.bits) is BitMap
    for keyless in ([*range(1, 40), 2**LIVE_ENTRY_BITS + 5], [*range(1, 40), 2**LIVE_ENTRY_BITS + 5, 2**40]):
        idx, _ = _same_as_dict([("add_many", 1, array.array("Q", keyless), 100),
                                ("__contains__", (1, 2**LIVE_ENTRY_BITS + 5)), ("add", 2, 5, 50),
                                ("__contains__", (2, 5)), ("pop_due", 100)])
        assert type(idx._ids.bits) is BitMap64 and not idx


def test_bulk_adds_past_the_narrow_live_bitmaps_slots_widen_it_only_for_narrow_ids():
    """The narrow live bitmap keys slots below 2^10: a batch for the ledger in
    slot 1024 widens it when the batch has ids below 2^32 (alone or with ids
    past 2^32), and not for a batch of ids past 2^32 only (they live in the
    ledger's ``wide`` set)."""
    base = [("add", ledger, 1, 50) for ledger in range(1, 1025)]  # slots 0-1023
    idx, _ = _same_as_dict([*base, ("add_many", 5000, array.array("Q", [2**32 + e for e in range(1, 41)]), 100),
                            ("__contains__", (5000, 2**32 + 3))])
    assert idx._by_id[5000] == 1024 and type(idx._ids.bits) is BitMap
    for batch in (list(range(3, 43)), array.array("Q", [*range(3, 43), 2**40])):
        idx, _ = _same_as_dict([*base, ("add_many", 5000, batch, 100), ("__contains__", (5000, 7)),
                                ("__contains__", (1, 7)), ("discard", 5000, 7), ("pop_due", 100)])
        assert type(idx._ids.bits) is BitMap64 and not idx


def test_a_bulk_add_into_a_ledger_with_ghosts_brings_back_the_acked_copy_in_its_cell():
    """A ledger with a ghost in the batch's cell takes the batch id by id: the
    acked copy there comes back to life once, and pops once."""
    idx, _ = _same_as_dict([("add", 1, 5, 100), ("discard", 1, 5), ("add_many", 1, list(range(0, 40)), 100),
                            ("__contains__", (1, 5)), ("pop_due", 100)])
    assert not idx and not idx._ids.ghosts


def test_a_run_promoted_to_a_listed_cell_counts_its_ids_as_changes_to_the_live_bitmap():
    """The run's ids leave the live bitmap when it becomes a listed cell: each
    is a change counted towards the live bitmap's next compaction (adds on the
    fast path count none)."""
    idx = TimeBucketIndex(precision_bits=0)
    idx.add(2, 1, 50)
    churn = idx._ids.churn
    for e in range(PROMOTE - 1):
        idx.add(1, e, 100)
    assert idx._ids.churn == churn
    idx.add(1, PROMOTE - 1, 100)  # the run is promoted
    assert ext_of(idx, 1).cells is not None and idx._ids.churn == churn + PROMOTE
    idx.add(1, 500, 200)
    churn = idx._ids.churn
    assert len(idx.pop_due(100)) == PROMOTE + 1  # each id popped is a change too (ledger 2's and the run's)
    assert idx._ids.churn == churn + PROMOTE + 1
    idx.add(3, 5, 300)
    idx.discard(3, 5)  # a ghost: ledger 3's next adds take the slower path, each counted as one change
    churn = idx._ids.churn
    idx.add(3, 77, 400)
    idx.add(3, 78, 400)
    assert idx._ids.churn == churn + 2


def test_popping_a_listed_cell_leaves_the_hot_listed_cell_of_another_ledger_listed():
    """Ledger 2's listed cell is the hot one (its run still going, in a window
    already open) when ledger 1's listed cell pops: the next ids of the run are
    still stored in the listed cell only, its top id following them."""
    run1 = [("add", 1, e, 100) for e in range(PROMOTE + 5)]
    run2 = [("add", 2, e, 300) for e in range(PROMOTE + 5)]
    _same_as_dict([*run1, ("next_due_ms",), *run2, ("pop_due", 100), ("add", 2, 999, 300), ("add", 2, 1000, 300),
                   ("__contains__", (2, 1000)), ("discard", 2, 999), ("pop_due", 300)])


def test_a_bucket_popped_while_its_cell_is_the_hot_one_takes_later_adds_in_a_new_cell():
    """Adds fill a cell of bucket 100, the hot one (a sparse run, or a dense
    cell made before its window opened); popping bucket 100 takes that cell
    (the ledger stays: it has an id due later): an add due at 100 after the pop
    goes into a new cell and pops with the next pop."""
    run = [("add", 1, e, 100) for e in range(PROMOTE + 5)]
    for before, after in (([], [("add", 1, 7, 100)]), (run, [("add", 1, 40, 100)])):
        _same_as_dict([*before, ("add", 1, 9999, 5000), ("next_due_ms",), *after, ("pop_due", 100), ("add", 1, 50, 100),
                       ("add", 1, 51, 100), ("__contains__", (1, 51)), ("pop_due", 100), ("pop_due", 5000)])


def test_a_run_on_the_slower_path_becomes_a_32_bit_dense_cell_at_exactly_promote_adds():
    """In a ledger with a ghost, adds take the slower path: the run becomes a
    dense cell at its PROMOTE-th add, and while its ids fit 32 bits the cell
    stays a 32-bit bitmap (an id past 2^32 widens it)."""
    idx = TimeBucketIndex(precision_bits=0)
    idx.add(1, 5, 50)
    idx.discard(1, 5)
    for e in range(100, 100 + PROMOTE - 1):
        idx.add(1, e, 300)
    (w,) = idx._windows.values()
    assert not w.dense
    idx.add(1, 100 + PROMOTE - 1, 300)
    assert [type(c) for c in w.dense.values()] == [BitMap]
    idx.add(1, 500, 300)
    assert [type(c) for c in w.dense.values()] == [BitMap] and len(next(iter(w.dense.values()))) == PROMOTE + 1
    idx.add(1, 2**40, 300)
    assert [type(c) for c in w.dense.values()] == [BitMap64]


def test_a_ledger_at_the_packed_slot_limit_keeps_dense_32_bit_cells():
    """A packed copy holds ledger slots below the layout's limit (2^18 at bits
    0); the ledger given that slot keeps its copies in dense cells, 32-bit for
    ids below 2^32, and nothing of it is read as slot 0 of the next bucket."""
    idx, ref = TimeBucketIndex(precision_bits=0), DictIndex(precision_bits=0)
    limit = idx._lay.slot_limit
    assert limit == 2**18
    for m in (idx, ref):
        for ledger in range(limit):
            m.add(ledger, 7, 5000)
        m.add(limit, 7, 100)  # slot `limit`: dense only
        m.add(limit, 8, 100)
        m.add(0, 7, 101)  # bucket 101, slot 0: what slot `limit` of bucket 100 would pack as
    assert idx._by_id[limit] == limit
    (w,) = idx._windows.values()
    assert [type(c) for k, c in w.dense.items() if k & 0xFFFFFFFF == limit] == [BitMap]
    assert ((limit, 7) in idx) and idx.discard(0, 7) == ref.discard(0, 7)
    assert len(idx) == len(ref) == limit + 1  # its first id counted once; (0, 7) acked
    assert idx.pop_due(101) == ref.pop_due(101) == [(limit, 7), (limit, 8)]
    assert len(idx) == len(ref) == limit - 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**6 - 1), st.integers(0, 40), st.integers(0, 2**32 - 1)), max_size=600),
       st.integers(1, 70))
def test_a_looks_bound_on_its_fullest_cell_is_never_below_it(copies, per_part):
    """The look's first step, a hashed count of copies per cell, can only
    overcount the fullest cell (collisions add), whatever the cut into
    segments: a cell that could pay is never missed."""
    lay = Layout.for_bits(8)
    values = [off << lay.offset_shift | slot << 32 | entry for off, slot, entry in copies]
    parts = [np.asarray(values[i:i + per_part], dtype=np.uint64) for i in range(0, len(values), per_part)]
    fullest = max(Counter(v >> 32 for v in values).values(), default=0)
    assert _windows._fullest_bound(parts) >= fullest


def test_a_look_with_no_cell_that_can_pay_sorts_nothing_and_waits_for_growth():
    """Sparse traffic at bits 0 (each cell a copy or two): the look's bound
    says no cell can pay, so the window's copies stay as they came (no sort,
    no move) and the next look waits for the window to grow."""
    idx = TimeBucketIndex(precision_bits=0)
    for i in range(2 * SEGMENT + 1):  # the third segment's first copy: the window's first look
        idx.add(i % 16, i, 20_000 + i % 5_000)
    (w,) = idx._windows.values()
    assert not w.dense and w.scan_at > 2 * layout.SCAN_SEGMENTS
    lay = Layout.for_bits(0)
    arrival = [(20_000 + i % 5_000) & lay.offset_mask for i in range(2 * SEGMENT)]  # the buckets' offsets
    assert [lay.offset_of(v) for seg in w.full for v in seg] == arrival  # in arrival order: not sorted
