"""The streaming kernel (nacktracker.pipeline.stream): one consumer's nacks in
time order, a chunk at a time, holding only what is pending. Checked against
the batch kernel (every column) and an independent replay through a live
TimeBucketIndex (the peaks); no Spark."""

from __future__ import annotations

import numpy as np
import pytest

from nacktracker.pipeline.pending import SCALAR_COLUMNS, Grid, analyse_group
from nacktracker.pipeline.plan import measured_costs
from nacktracker.pipeline.stream import ConsumerStream
from pipeline_helpers import replay

T0 = 1_700_000_000_000
BITS = (0, 3, 8, 11)
MEMORY = ("index_bytes", "roaring_bytes", "buckets", "bitmaps", "ledgers")


@pytest.fixture(scope="module")
def costs():
    return measured_costs()


def _nacks(seed: int, n: int, entries: int, wide: bool = False):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(T0, T0 + 30_000, n))
    ledger = rng.integers(100, 104, n)
    entry = rng.integers(0, entries, n) + ((1 << 23) if wide else 0)
    due = ts + rng.integers(0, 4000, n)  # sub-bucket delays, repeats, buckets already passed
    return ledger, entry, ts, due


def _stream(costs, cols, rounding, grid, chunk, history=10 ** 9, feed=333):
    s = ConsumerStream(BITS, costs, rounding, grid, chunk_rows=chunk, history_rows=history)
    ledger, entry, ts, due = cols
    for i in range(0, len(ts), feed):
        s.feed(ledger[i:i + feed], entry[i:i + feed], ts[i:i + feed], due[i:i + feed])
    return s, s.finish()


@pytest.mark.parametrize("seed, entries, rounding, wide", [
    (1, 5000, "floor", False), (2, 300, "floor", False), (3, 300, "ceil", False), (4, 5000, "ceil", True)])
def test_streamed_in_chunks_equals_the_batch_kernel(costs, seed, entries, rounding, wide):
    cols = _nacks(seed, 12_000, entries, wide)
    ledger, entry, ts, due = cols
    grid = Grid.spanning(int(ts.min()), int(due.max()) + (1 << 11), 50)
    ref = analyse_group(np.zeros(len(ts), np.int64), ledger, entry, ts, due, BITS, costs, rounding, grid)
    for chunk in (len(ts) + 1, 997, 150):
        _, got = _stream(costs, cols, rounding, grid, chunk)
        for c in SCALAR_COLUMNS:
            if chunk > len(ts) or c not in MEMORY:  # one chunk: the memory model sees all, equal too
                assert got[c].tolist() == ref[c].tolist(), (chunk, c)
        # several chunks: the history the memory model sees starts at the oldest pending
        # nack, so what older ones did (ids pending twice, runs) is partly lost
        assert got["index_bytes"] == pytest.approx(ref["index_bytes"], rel=0.15)
        assert got["roaring_bytes"].tolist() == ref["roaring_bytes"].tolist()
        assert np.allclose(got["err_mean"], ref["err_mean"])
        for c in ("pending_at", "pending_max"):
            assert got[c][0].tolist() == ref[c][0].tolist() and got[c][1].tolist() == ref[c][1].tolist()
        for (v, n), (gv, gn) in zip(ref["histograms"], got["histograms"]):
            assert gv.tolist() == v.tolist() and gn.tolist() == n.tolist()


def test_streamed_peaks_equal_an_independent_replay(costs):
    ledger, entry, ts, due = _nacks(9, 6000, 400)
    _, got = _stream(costs, (ledger, entry, ts, due), "floor", None, 500)
    rows = list(zip(ts.tolist(), ledger.tolist(), entry.tolist(), due.tolist()))
    for i, bits in enumerate(BITS):
        peak, at, _ = replay(rows, bits)
        assert (got["peak_pending"][i], got["peak_at_ms"][i]) == (peak, at), bits


def test_memory_held_is_pending_plus_a_chunk_not_the_stream(costs):
    """A sequential workload (1 nack/ms, 2 s delay: ~2,000 pending) ten times
    longer than before: the rows held at once stay where they were."""
    def held(n):
        ts = T0 + np.arange(n, dtype=np.int64)
        entry = np.arange(n, dtype=np.int64) % 50_000
        ledger = 7 + np.arange(n, dtype=np.int64) // 50_000
        s, got = _stream(costs, (ledger, entry, ts, ts + 2000), "floor", None, 4096, history=8192, feed=1000)
        assert got["nacks"].tolist() == [n] * len(BITS) and got["peak_pending"][0] == 2000
        return s.peak_rows_held

    small, large = held(20_000), held(200_000)
    assert large == small and large < 2000 + 4096 + 8192 + 2 * 4096


def test_rows_must_come_in_time_order(costs):
    s = ConsumerStream(BITS, costs)
    s.feed([1], [1], [T0 + 5], [T0 + 9])
    with pytest.raises(ValueError, match="time order"):
        s.feed([1], [2], [T0 + 4], [T0 + 9])
