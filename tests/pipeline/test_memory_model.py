"""The planner's byte model (nacktracker/pipeline/memory_model.py) against
real indexes and trackers built live from the same events: no Spark needed."""

from __future__ import annotations

import array

import numpy as np
import pytest

from nacktracker import ManualClock, MessageKey, NegativeAcksTracker, TimeBucketIndex
from nacktracker.adapters import MemoryAdapter
from nacktracker.index.layout import LISTED, LISTING
from nacktracker.pipeline.calibration import calibration_build, live_replay, measure_index_costs, synthetic_nacks
from nacktracker.pipeline.memory_experiment import workload
from nacktracker.pipeline.memory_model import IndexCosts, array_bytes, index_state
from nacktracker.pipeline.pending import analyse_consumer


@pytest.fixture(scope="module")
def costs() -> IndexCosts:
    return measure_index_costs()


def test_measure_checks_itself_on_live_builds(costs):
    assert costs.max_model_error < 0.10
    assert costs.empty_index == TimeBucketIndex().nbytes()
    assert 100 < costs.dict_index_per_entry < 400


def test_array_bytes_follows_cpython_growth():
    import array

    from nacktracker.index.layout import held_size

    a = array.array("Q")
    for n in range(200):
        assert array_bytes(np.array([n]))[0] == held_size(a), n
        a.append(n)


def test_held_size_is_what_the_allocators_take():
    """Rounded to pymalloc's 16-byte classes (<= 512 bytes) or a malloc chunk;
    a container's item storage is a second allocation, rounded on its own."""
    import array
    import sys

    from nacktracker.index.layout import held, held_size

    assert [held(n) for n in (1, 16, 17, 512, 513, 1000, 1001)] == [16, 16, 32, 512, 528, 1008, 1024]
    assert held_size(7 << 40) == 32  # an int of 34 bytes
    big = array.array("Q", range(100))
    assert held_size(big) == held(sys.getsizeof(array.array("Q"))) + held(sys.getsizeof(big) - sys.getsizeof(array.array("Q")))
    assert held_size(set()) == held(sys.getsizeof(set()))
    # a list: its 56-byte object and its item array (8 B per slot), each rounded on its own
    assert held_size([None]) == 64 + 16 and held_size([None] * 3) == 64 + 32 and held_size([]) == 64


# CRoaring's array container growth, worked by hand: by adds from 16 (x2 below 64, x1.5 below 1,024,
# x1.25 above, at most 4,096), and by one step from its size when shrunk to fit ("refit")
ARRAY_GROWTH = [  # (ids in the container, capacity grown by adds, capacity regrown after a refit)
    (10, 16, 20), (63, 64, 126), (64, 64, 96), (1000, 1093, 1500), (1023, 1093, 1534), (1024, 1093, 1280),
    (4000, 4096, 4096),
]


def test_capacity_growth_as_worked_by_hand():
    """CRoaring's growth rules as ``layout`` replays them (called here, not only
    at import): from the first capacity, each step's result capped at the top,
    until the top. An array container: 16, doubling below 64, x1.5 below 1,024,
    x1.25 up to 4,096; container arrays: twice the slots needed below 1,024,
    then 1.25x, up to 65,536."""
    from nacktracker.index import layout

    assert layout._growth(16, lambda c: c * 2, 100) == [16, 32, 64, 100]
    assert layout._growth(7, lambda c: c + 1, 7) == [7] and layout._growth(7, lambda c: c + 1, 9) == [7, 8, 9]
    array_rule = lambda c: c * 2 if c < 64 else c * 3 // 2 if c < 1024 else c * 5 // 4  # noqa: E731
    assert layout._growth(16, array_rule, 4096) == layout.ARRAY_CAPS == [
        16, 32, 64, 96, 144, 216, 324, 486, 729, 1093, 1366, 1707, 2133, 2666, 3332, 4096]
    slot_rule = lambda c: 2 * (c + 1) if c < 1024 else 5 * (c + 1) // 4  # noqa: E731
    slots = layout._growth(2, slot_rule, 1 << 16)
    assert slots == layout.SLOT_CAPS and slots[:11] == [2, 6, 14, 30, 62, 126, 254, 510, 1022, 2046, 2558]
    assert slots[-3:] == [46577, 58222, 65536] and len(slots) == 26


@pytest.mark.parametrize("card,grown,regrown", ARRAY_GROWTH)
def test_roaring_bytes_count_an_array_container_at_its_grown_capacity(card, grown, regrown):
    """One array container of ``card`` ids (2 bytes each): counted at its size, or (the live
    bitmap, built by adds) at the capacity CRoaring grew it to; only its payload chunk differs."""
    from pyroaring import BitMap

    from nacktracker.index.layout import malloc_bytes, roaring_bytes

    bm = BitMap(range(0, 2 * card, 2))  # every other id: an array container, not a run
    exact = roaring_bytes(bm)
    assert roaring_bytes(bm, grown=True) - exact == malloc_bytes(2 * grown) - malloc_bytes(2 * card)
    assert roaring_bytes(bm, grown=True, refit=True) - exact == malloc_bytes(2 * regrown) - malloc_bytes(2 * card)


def random_share_nacks(n: int = 40_000, delay_ms: int = 60_000):
    """Seed 000's random-10% workload (10% of each ledger's 50,000 entries, at
    random, 1 nack per ms) as nacks ``delay_ms`` ahead: scattered ids, so each
    bucket's cell of a ledger is a burst of scattered ids (listed cells whose
    ids are stored once, not in the live bitmap)."""
    ledger, entry, due = np.array(list(workload("random", n, 1)), dtype=np.int64).T
    return ledger, entry, due - delay_ms, due


def bursts_past_the_listing_limit(bursts: int = 60, gap: int = 300, size: int = 64, ledgers: int = 4,
                                  seed: int = 3):
    """Ledger 7 gets ``bursts`` bursts of ``size`` nacks in one millisecond
    (a batch; one due time each, ten delays taking turns: more than LISTED of
    its cells pending at once, some firing between bursts); ``ledgers`` other
    ledgers get sparse nacks (0.1-20 s), one per ms, in between."""
    rng = np.random.default_rng(seed)
    per = gap + size
    i = np.arange(bursts * per)
    k, j = i // per, i % per
    burst = j < size
    ts = 1_700_000_000_000 + k * (gap + 1) + np.maximum(j - size + 1, 0)
    delays = np.array([3_000, 40_000, 9_000, 25_000, 1_500, 60_000, 15_000, 5_000, 33_000, 12_000])
    due = np.where(burst, ts + delays[k % len(delays)], ts + rng.integers(100, 20_000, len(i)))
    return np.where(burst, 7, 100 + i % ledgers), np.where(burst, k * size + j, i * 3), ts, due


async def _tracker_nbytes(nacks, upto_ms: int, bits: int) -> tuple[int, int]:
    """``(pending, nbytes())`` of a tracker fed ``nacks`` in time order up to
    ``upto_ms``, its timer popping what is due (a ManualClock)."""
    ledger, entry, ts, due = nacks
    clock = ManualClock(start_ms=float(ts[0]))
    tracker = NegativeAcksTracker(MemoryAdapter(clock=clock.now_ms), clock=clock, precision_bits=bits)
    for i in np.argsort(ts, kind="stable").tolist():
        t = int(ts[i])
        if t > upto_ms:
            break
        clock.advance_to(t)  # the tracker's timer pops what is due
        tracker.add(MessageKey(int(ledger[i]), int(entry[i])), delay_ms=int(due[i]) - t)
    out = tracker.pending, tracker.nbytes()
    await tracker.close()
    return out


def entry_ids_past_the_narrow_live_bitmap(n: int = 20_000):
    """Sparse nacks over 16 ledgers (0.1-40 s) whose entry ids pass 2^22
    a tenth of the way in: the index widens its live bitmap to 64 bits."""
    i = np.arange(n)
    ts = 1_700_000_000_000 + i
    return 100 + i % 16, (1 << 22) - 2_000 + i * 3, ts, ts + 100 + (i * 7919) % 40_000


TRACES = {"calibration": synthetic_nacks, "random-10%": random_share_nacks,
          "bursts past LISTED": bursts_past_the_listing_limit,
          "entry ids past 2^22": entry_ids_past_the_narrow_live_bitmap}


@pytest.mark.parametrize("bits", [0, 8, 12, 15])
@pytest.mark.parametrize("trace", list(TRACES))
async def test_plan_memory_within_10_percent_of_a_tracker_built_live(costs, trace, bits):
    """Plan memory within 10% of nbytes() of a tracker built live (add + pops)
    from the same events, at bits 0, 8, 12, 15: on the calibration traffic, on
    seed 000's scattered random-10% bursts (the model overstated them 1.6x
    before it knew listed cells), on a ledger listing more than LISTED
    cells with pops in between, and on entry ids that widen the live bitmap."""
    nacks = TRACES[trace]()
    (r,) = analyse_consumer(*nacks, [bits], costs)
    pending, nbytes = await _tracker_nbytes(nacks, r.peak_at_ms, bits)
    assert pending == r.peak_pending
    assert r.index_bytes == pytest.approx(nbytes, rel=0.10), (r.index_bytes, nbytes)


def test_the_bursts_trace_crosses_the_listing_limit_with_pops_between():
    """What the trace above is for: ledger 7 fills its list (LISTED cells),
    its next promotion flushes the list, and listed cells fire in between."""
    def listed(idx):
        slot = idx._by_id.get(7)
        ext = None if slot is None else idx._ledgers.ext_at(slot)
        return [] if ext is None or ext.cells is None else ext.cells[::LISTING]

    ledger, entry, ts, due = bursts_past_the_listing_limit()
    idx = TimeBucketIndex(precision_bits=0)
    flushes, popped = 0, 0
    for i in np.argsort(ts, kind="stable").tolist():
        t = int(ts[i])
        before = listed(idx)
        idx.pop_due(t)
        popped += len(before) - len(listed(idx))
        before = listed(idx)
        idx.add(int(ledger[i]), int(entry[i]), int(due[i]))
        flushes += len(before) == LISTED and len(listed(idx)) == 1
    assert flushes >= 2 and popped >= 3 and listed(idx)


@pytest.mark.parametrize("bits", [0, 8, 12, 15])
def test_model_matches_a_live_index_on_the_calibration_traffic(costs, bits):
    model, real = calibration_build(bits, costs)
    assert model == pytest.approx(real, rel=0.10)


def test_dense_bursts_and_sparse_traffic_are_both_modelled(costs):
    """Half bursts (one cell, 200 adds in a row), half interleaved sparse nacks."""
    n = 8_000
    i = np.arange(n)
    burst = (i // 200) % 2 == 0
    ledger = np.where(burst, 5, 100 + i % 16)
    entry = np.where(burst, i, i * 3)
    ts = 1_700_000_000_000 + i
    due = np.where(burst, ts + 50_000 - (i % 200), ts + 1_000 + (i * 7919) % 40_000)
    for bits in (0, 10):
        (r,) = analyse_consumer(ledger, entry, ts, due, [bits], costs)
        idx = live_replay(ledger, entry, ts, due, bits, stop_at=r.peak_at_ms)
        assert len(idx) == r.peak_pending
        # an adversarial mixture (bursts racing sparse traffic for the front): measured 11% off
        assert r.index_bytes == pytest.approx(idx.nbytes(), rel=0.15)
        assert (r.bitmaps, r.buckets) == (idx.bitmap_count(), idx.bucket_count())


def test_an_empty_instant_costs_an_empty_index(costs):
    z = np.zeros(0, dtype=np.int64)
    assert index_state(z, z, z, z, z > 0, 8, costs).index_bytes == costs.empty_index


def test_the_ledger_table_counts_its_containers_ledger_ints_and_records_exactly():
    """The ledger table's bytes, worked from its definition: the table object, the
    dict by ledger id and the list by slot (built the same way, so of the same
    capacity), the free-slot list once a slot was freed, each ledger id's int (ids
    above 256 are ints of their own) and each slot number past 256 (below, CPython's
    shared ints); each ledger's record with the containers it holds (its listed
    cells' bitmaps are counted with their windows)."""
    from pyroaring import BitMap, BitMap64

    from nacktracker.index._ledgers import Ledgers
    from nacktracker.index.layout import held_size, roaring_bytes

    table = Ledgers()
    assert table.nbytes() == held_size(table) + held_size({}) + held_size([])
    ids = [10**12 + i for i in range(300)]
    by_id: dict[int, int] = {}
    lid: list[int | None] = []
    for i, ledger in enumerate(ids):
        assert table.slot(ledger) == i
        by_id[ledger] = i
        lid.append(ledger)
    assert table.slot(ids[5]) == 5 and table.ledger_id(299) == ids[299]
    slots = sum(held_size(s) for s in range(257, 300))  # 257.. are ints of their own
    assert held_size(256) > 0 and slots > 0
    base = held_size(table) + held_size(by_id) + held_size(lid)
    assert table.nbytes() == base + sum(map(held_size, ids)) + slots
    table.drop(3)
    table.drop(280)
    del by_id[ids[3]], by_id[ids[280]]
    lid[3] = lid[280] = None
    free: list[int] = []
    free.append(3)
    free.append(280)
    live = sum(map(held_size, ids)) - held_size(ids[3]) - held_size(ids[280]) + slots - held_size(280)
    assert table.nbytes() == held_size(table) + held_size(by_id) + held_size(lid) + held_size(free) + live
    # records: one with every container, one with a wide bitmap only
    rich, wide = table.ext_of(7), table.ext_of(290)
    rich.wide = BitMap64([1 << 40, (1 << 40) + 5])
    rich.cells, rich.hi = [BitMap([1, 2]), None, 12345678], 2
    rich.multi, rich.ghost = {10**9, 10**9 + 1}, {10**9 + 7}
    wide.wide = BitMap64([1 << 33])
    exts: list = [None] * 300
    records = (2 * held_size(rich) + roaring_bytes(rich.wide) + roaring_bytes(wide.wide)
               + held_size(rich.cells) + held_size(2)  # hi, a shared int
               + held_size(rich.multi) + 2 * held_size(10**9) + held_size(rich.ghost) + held_size(10**9 + 7))
    assert table.nbytes() == (held_size(table) + held_size(by_id) + held_size(lid) + held_size(free)
                              + held_size(exts) + live + records)
    # a record emptied goes at tidy(); the list of records stays
    rich.wide = rich.cells = rich.multi = rich.ghost = None
    table.tidy(7)
    assert table.ext_at(7) is None
    assert table.nbytes() == (held_size(table) + held_size(by_id) + held_size(lid) + held_size(free)
                              + held_size(exts) + live + held_size(wide) + roaring_bytes(wide.wide))


def test_the_windows_count_their_objects_ids_segments_and_dense_cells_exactly():
    """The time order's bytes, worked from its definition: the object and its dict
    of windows; per window its id's int, its object, its array once it has one
    (not the shared empty), each list of segments with its arrays, the heap of
    dense keys once it has one, and the dict of dense cells with its keys' ints
    and each bitmap's CRoaring heap."""
    from pyroaring import BitMap

    from nacktracker.index._windows import Windows
    from nacktracker.index.layout import NO_PACKED, Layout, held_size, roaring_bytes

    lay = Layout.for_bits(8)

    def _packed(*copies):  # (offset, slot, entry) as the index packs them
        return array.array("Q", [off << lay.offset_shift | slot << 32 | entry for off, slot, entry in copies])
    wins = Windows(lay)
    assert wins.nbytes() == held_size(wins) + held_size({})
    bare = wins.window(1000 << lay.window_shift)  # a window of shared empties costs its object and its id
    wid = 1000
    assert wins.nbytes() == held_size(wins) + held_size(wins.by_id) + held_size(wid) + held_size(bare)
    rich = wins.window(1001 << lay.window_shift)
    rich.packed = _packed((3, 1, 7), (2, 1, 8))
    rich.full = [_packed(*[(1, 0, e) for e in range(40)]), _packed((2, 0, 1))]
    rich.spill = [_packed((5, 2, 9))]
    rich.dense = {4 << 32 | 1: BitMap([1, 2, 3]), 6 << 32 | 2: BitMap(range(100, 900))}
    rich.dense_keys = list(rich.dense)
    keys = held_size(rich.dense_keys) + held_size(rich.dense) + sum(map(held_size, rich.dense))
    cells = sum(map(roaring_bytes, rich.dense.values()))
    segments = (held_size(rich.full) + sum(map(held_size, rich.full))
                + held_size(rich.spill) + sum(map(held_size, rich.spill)))
    expected = (held_size(wins) + held_size(wins.by_id) + held_size(1000) + held_size(bare)
                + held_size(1001) + held_size(rich) + held_size(rich.packed) + segments + keys + cells)
    assert segments > 0 and keys > 0 and cells > 0 and held_size(rich.packed) > held_size(NO_PACKED)
    assert wins.nbytes() == expected



def test_the_live_ids_count_their_bitmap_multi_and_ghost_records_exactly():
    """The live-id set's bytes, worked from its definition: the object, the live
    bitmap at the capacity CRoaring grows it to (or refit), each record dict once
    it is not the shared empty, and per record its key tuple and its count or
    ghost (with the ghost's set of revived buckets)."""
    from nacktracker.index._ledgers import Ledgers
    from nacktracker.index._live import LiveIds
    from nacktracker.index.layout import COMPACT_CHURN, Ghost, held_size, roaring_bytes

    ids = LiveIds(Ledgers())
    assert (ids.churn, ids.compact_at, ids.refitted) == (0, COMPACT_CHURN, False)  # no change made, never refit
    assert ids.nbytes() == held_size(ids) + roaring_bytes(ids.bits, grown=True)
    ids.bits.update([*range(0, 4000, 3), *range(70_000, 75_000)])
    base = held_size(ids) + roaring_bytes(ids.bits, grown=True)
    assert ids.nbytes() == base
    ids.refitted = True
    assert ids.nbytes() == held_size(ids) + roaring_bytes(ids.bits, grown=True, refit=True) != base
    ids.refitted = False
    ghost, lone = Ghost(2), Ghost(1)
    ghost.revive(100)
    ghost.revive(10**9)
    ids.ghosts = {(2, 7): ghost, (4, 10**6): lone}  # the ids pending twice still the shared empty
    ghosts = held_size(ids.ghosts) + 2 * held_size((2, 7)) + 2 * held_size(ghost) + held_size(ghost.revived)
    assert ids.nbytes() == base + ghosts
    ids.multi = {(1, 5): 2, (3, 10**6): 3}
    multi = held_size(ids.multi) + 2 * held_size((1, 5)) + 2 * held_size(2)
    assert ids.nbytes() == base + ghosts + multi
    ids.ghosts = {}
    assert ids.nbytes() == base + held_size({}) + multi


def test_an_index_counts_its_object_counters_and_components():
    """``TimeBucketIndex.nbytes()``: its object, its three counter ints (each
    an int of its own, whatever its value), the ledger table, the live ids and
    the time order, each of which counts itself (the tests above)."""
    from nacktracker.index.layout import COUNTER_INTS, held_size

    idx = TimeBucketIndex(precision_bits=4)
    empty = held_size(idx) + 3 * 32 + idx._ledgers.nbytes() + idx._ids.nbytes() + idx._time.nbytes()
    assert COUNTER_INTS == 3 and held_size(1 << 40) == 32 and idx.nbytes() == empty
    for e in range(300):
        idx.add(1 + e % 3, e * 7, 1_000 + (e % 5) * 20_000)
    idx.add_many(9, range(5000), 70_000)
    idx.discard(1, 0)
    idx.pop_due(1_000)
    parts = idx._ledgers.nbytes(), idx._ids.nbytes(), idx._time.nbytes()
    assert all(parts) and idx.nbytes() == held_size(idx) + 3 * 32 + sum(parts)


def test_an_empty_window_and_a_ledger_record_cost_their_objects():
    """What the planner's model charges per window and per ledger record: the
    object as allocated (64-bit CPython: a 16-byte header, a 16-byte GC header,
    a pointer per slot, rounded to pymalloc's 16-byte classes); its containers
    are counted as they are made."""
    from nacktracker.index.layout import LedgerExt, Window, held, ledger_record_bytes, window_bytes

    assert window_bytes() == held(16 + 16 + 8 * len(Window.__slots__)) == 112
    assert ledger_record_bytes() == held(16 + 16 + 8 * len(LedgerExt.__slots__)) == 80


def test_roaring_bytes_of_each_container_kind_as_worked_by_hand():
    """CRoaring's heap behind a bitmap, worked by hand from glibc's chunks
    (``malloc_bytes``: at least 32, n + 8 rounded up to 16): the bitmap header
    (48 B, or 210 B for a 64-bit one), the container arrays (11 B per slot),
    16 B and the payload per container (an array container 2 B per id, a run
    2 + 4 B per run, a bitset 8 KiB), 24 B of ART leaf per 64-bit container,
    and the Python object (48 B held). ``grown``: the container arrays and
    array containers at the capacity adds grow them to; ``refit``: array
    containers regrown one step from their size."""
    from pyroaring import BitMap, BitMap64

    from nacktracker.index.layout import roaring_bytes

    py = 48
    assert roaring_bytes(BitMap()) == 64 + py
    assert roaring_bytes(BitMap64()) == 210 + py
    three = BitMap([1, 2, 3])  # one array container of 6 B
    assert roaring_bytes(three) == 64 + 32 + 32 + 32 + py
    assert roaring_bytes(three, grown=True) == 64 + 32 + 32 + 48 + py  # 16 ids (32 B) grown
    assert roaring_bytes(three, grown=True, refit=True) == 64 + 32 + 32 + 32 + py  # 6 ids (12 B) regrown
    spread = BitMap([1, 1 << 16, 2 << 16])  # three containers of one id
    assert roaring_bytes(spread) == 64 + 48 + 3 * 32 + 3 * 32 + py  # 33 B of arrays: a 48 B chunk
    assert roaring_bytes(spread, grown=True) == 64 + 80 + 3 * 32 + 3 * 48 + py  # 6 slots (66 B)
    assert roaring_bytes(spread, grown=True, refit=True) == 64 + 80 + 3 * 32 + 3 * 32 + py
    twenty = BitMap([k << 16 for k in range(20)])  # 220 B of arrays: a 240 B chunk (30 slots grown: 352 B)
    assert roaring_bytes(twenty) == 64 + 240 + 20 * 32 + 20 * 32 + py
    assert roaring_bytes(twenty, grown=True) == 64 + 352 + 20 * 32 + 20 * 48 + py
    runs = BitMap(range(100_000))  # two run containers of one run each (6 B)
    assert roaring_bytes(runs) == roaring_bytes(runs, grown=True) == 64 + 32 + 2 * 32 + 2 * 32 + py
    bitset = BitMap(range(0, 1 << 16, 2))  # one bitset container
    assert roaring_bytes(bitset) == roaring_bytes(bitset, grown=True, refit=True) == 64 + 32 + 32 + 8208 + py
    wide = BitMap64([1 << 40, 2, 3])  # two array containers (3 ids: 3 B each on average)
    assert roaring_bytes(wide) == 210 + 32 + 2 * 32 + 2 * 32 + 2 * 24 + py
    assert roaring_bytes(wide, grown=True) == 210 + 32 + 2 * 32 + 2 * 48 + 2 * 24 + py


def test_the_time_order_costs_its_dict_as_allocated():
    """The index's time order is a dict of windows by id: its object (64 B on
    64-bit CPython) and, once it holds windows, its keys table, each rounded as
    allocated (the ids' ints and the windows are counted with each window)."""
    import sys

    from nacktracker.index.layout import Window, held, time_order_bytes

    assert time_order_bytes({}) == held(sys.getsizeof({})) == 64
    windows = {w << 20: Window() for w in range(6)}
    assert time_order_bytes(windows) == 64 + held(sys.getsizeof(windows) - sys.getsizeof({}))
