"""The planner's byte model (nacktracker/pipeline/memory_model.py) against
real indexes and trackers built live from the same events: no Spark needed."""

from __future__ import annotations

import numpy as np
import pytest

from nacktracker import ManualClock, MessageKey, NegativeAcksTracker, TimeBucketIndex
from nacktracker.adapters import MemoryAdapter
from nacktracker.pipeline.memory_model import (IndexCosts, array_bytes, calibration_build, index_state,
                                               live_replay, synthetic_nacks)
from nacktracker.pipeline.pending import analyse_consumer


@pytest.fixture(scope="module")
def costs() -> IndexCosts:
    return IndexCosts.measure()


def test_measure_checks_itself_on_live_builds(costs):
    assert costs.max_model_error < 0.10
    assert costs.empty_index == TimeBucketIndex().nbytes()
    assert 100 < costs.dict_index_per_entry < 400


def test_array_bytes_follows_cpython_growth():
    import array
    import sys

    a = array.array("Q")
    for n in range(200):
        assert array_bytes(np.array([n]))[0] == sys.getsizeof(a), n
        a.append(n)


@pytest.mark.parametrize("bits", [0, 8, 12, 15])
async def test_plan_memory_within_10_percent_of_a_tracker_built_live(costs, bits):
    """Plan memory within 10% of nbytes() of a tracker built live (add + pops)
    from the same events, at bits 0, 8, 12, 15."""
    ledger, entry, ts, due = synthetic_nacks()
    (r,) = analyse_consumer(ledger, entry, ts, due, [bits], costs)
    clock = ManualClock(start_ms=float(ts[0]))
    tracker = NegativeAcksTracker(MemoryAdapter(clock=clock.now_ms), clock=clock, precision_bits=bits)
    for i in np.argsort(ts, kind="stable").tolist():
        t = int(ts[i])
        if t > r.peak_at_ms:
            break
        clock.advance_to(t)  # the tracker's timer pops what is due
        tracker.add(MessageKey(int(ledger[i]), int(entry[i])), delay_ms=int(due[i]) - t)
    assert tracker.pending == r.peak_pending
    assert r.index_bytes == pytest.approx(tracker.nbytes(), rel=0.10), (r.index_bytes, tracker.nbytes())
    await tracker.close()


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
