"""The Spark pipeline: trace generation, plan (peak pending, memory, errors),
sweep, bad traces. The kernel tests need no Spark; the rest share one
session-scoped ``local[2]`` SparkSession and a few small traces."""

from __future__ import annotations

import importlib.util
import itertools
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nacktracker import DictIndex, TimeBucketIndex
from nacktracker.events import (
    BadValueError,
    ColumnTypeError,
    EmptyTraceError,
    EventLogWriter,
    MissingColumnError,
    NackEvent,
    TraceError,
)
from nacktracker.pipeline.memory_model import IndexCosts
from nacktracker.pipeline.pending import analyse_rows, quantile
from nacktracker.pipeline.plan import measured_costs, recommend
from pipeline_helpers import nacks_by_consumer, replay

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000
BITS = (0, 4, 8, 12)


# -- the kernel, no Spark -----------------------------------------------------------

@pytest.fixture(scope="module")
def costs() -> IndexCosts:
    return measured_costs()


def test_kernel_hand_made_case(costs):
    rows = [  # (ledger, entry, ts, due)
        (1, 1, 100, 1100),   # pending 100..1100 at bits 0
        (1, 1, 300, 1100),   # same message, same bucket, while pending: merged
        (1, 2, 200, 1500),
        (1, 2, 1600, 1700),  # same message, a later bucket: a second occurrence
        (2, 9, 150, 160),
    ]
    r0, r8 = analyse_rows(rows, [0, 8], costs)
    assert (r0.nacks, r0.occurrences, r0.merged, r0.immediate) == (5, 4, 1, 0)
    assert (r0.peak_pending, r0.peak_at_ms) == (2, 150)  # 1:1 and 2:9 from 150 until 160
    assert r0.err_values.tolist() == [0] and r0.err_counts.tolist() == [5]
    # bits 8: buckets 1024, 1024, 1280, 1536, 0; the last two had passed when nacked: fired at once
    assert (r8.occurrences, r8.immediate, r8.merged, r8.peak_pending, r8.peak_at_ms) == (2, 2, 1, 2, 200)
    assert r8.err_values.tolist() == [-220, -100, -76, -10] and r8.err_counts.tolist() == [1, 1, 2, 1]
    for r in (r0, r8):
        peak, at, _ = replay([(ts, l, e, d) for l, e, ts, d in rows], r.bits)
        assert (peak, at) == (r.peak_pending, r.peak_at_ms)


def test_kernel_matches_replay_on_random_nacks(costs):
    rng = np.random.default_rng(7)
    n = 3000
    ts = np.sort(rng.integers(T0, T0 + 20_000, n))
    rows = [(int(rng.integers(100, 104)), int(rng.integers(0, 300)), int(t), int(t + rng.integers(0, 5000)))
            for t in ts]
    for rounding in ("floor", "ceil"):
        results = analyse_rows(rows, [0, 3, 8, 11], costs, rounding=rounding)
        for r in results:
            peak, at, idx = replay([(t, l, e, d) for l, e, t, d in rows], r.bits, rounding)
            assert (r.peak_pending, r.peak_at_ms) == (peak, at)
            _, _, then = replay([(t, l, e, d) for l, e, t, d in rows], r.bits, rounding, stop_at=at)
            assert len(then) == peak
            # the model follows a live index (worst here: ceil, bits 11, many re-nacks: +17%)
            assert r.index_bytes == pytest.approx(then.nbytes(), rel=0.20)
            errors = sorted(max(b, t) - d for l, e, t, d in rows
                            for b in [idx.bucket_of(d)])
            assert r.error_quantile(1.0) == max(abs(x) for x in errors)
            assert int(r.err_counts.sum()) == n


def test_kernel_with_nothing_ever_pending(costs):
    (r,) = analyse_rows([(1, i, T0 + i, T0 + i) for i in range(10)], [0], costs)  # delay 0
    assert (r.peak_pending, r.peak_at_ms, r.occurrences, r.immediate, r.bitmaps) == (0, None, 0, 10, 0)
    assert r.index_bytes == TimeBucketIndex().nbytes()


def test_packed_rows_come_back_as_groups_of_whole_consumers():
    """The shuffle's packed rows (a row per map-side batch and consumer, in any
    order) are gathered per consumer and cut into groups of whole consumers,
    in consumer order, each consumer's rows in the order they were read."""
    from nacktracker.pipeline.plan import _pack, _packed_groups

    names = ("ledger_id", "entry_id", "ts_ms", "due")
    lookup = np.zeros(5, dtype=np.int32)

    def packed(cids, start):
        n = len(cids)
        named = {"ledger_id": np.arange(start, start + n), "entry_id": np.zeros(n, dtype=np.int64),
                 "ts_ms": np.zeros(n, dtype=np.int64), "due": np.ones(n, dtype=np.int64)}
        return _pack(np.array(cids), named, names, lookup)

    stream = [packed([0, 1, 0], 0), packed([1, 4], 3), packed([3, 4, 4, 0], 5)]
    got = [(g[0].tolist(), g[1].tolist()) for g in _packed_groups(iter(stream), names, target_rows=3)]
    assert got == [([0, 0, 0], [0, 2, 8]), ([1, 1, 3], [1, 3, 5]), ([4, 4, 4], [4, 6, 7])]
    (whole,) = _packed_groups(iter(stream), names, target_rows=100)
    assert whole[0].tolist() == [0, 0, 0, 1, 1, 3, 4, 4, 4]
    assert _pack(np.zeros(0, dtype=np.int64), {n: np.zeros(0, dtype=np.int64) for n in names}, names, lookup) is None


def test_narrow_packing_gives_back_every_value():
    """Ids below 2^31 share an int64, and so do the times of a trace spanning
    less than 24 days (relative to its first instant): unpacked, every value
    is what was read."""
    from nacktracker.pipeline.plan import _narrowed, _pack, _packed_groups

    base = 1_700_000_000_000
    ledger = np.array([0, 7, (1 << 31) - 1], dtype=np.int64)
    entry = np.array([(1 << 31) - 1, 0, 5], dtype=np.int64)
    ts = np.array([base, base + 1, base + (1 << 31) - 2], dtype=np.int64)
    due = ts + np.array([0, 60_000, 1], dtype=np.int64)
    named = _narrowed(ledger, entry, ts, due, True, base)
    assert list(named) == ["ids", "times"]
    (group,) = _packed_groups(iter([_pack(np.array([2, 2, 2]), named, ("ids", "times"), np.zeros(3, np.int32))]),
                              ("ids", "times"), base_ms=base)
    for got, want in zip(group, (np.full(3, 2), ledger, entry, ts, due)):
        assert got.tolist() == want.tolist()


def test_a_group_gives_each_consumer_what_it_gets_alone(costs):
    """analyse_group over many consumers == analyse_consumer one by one, and
    the pending series agrees with the exact replay at every grid instant."""
    from nacktracker.pipeline.pending import Grid, analyse_consumer, analyse_group

    rng = np.random.default_rng(5)
    cols = {k: [] for k in ("cid", "ledger", "entry", "ts", "due")}
    for c in range(40):
        n = int(rng.integers(1, 300))
        ts = np.sort(rng.integers(T0, T0 + 5_000, n))
        cols["cid"] += [c * 7] * n  # ids need not be dense
        cols["ledger"] += rng.integers(1, 4, n).tolist()
        cols["entry"] += rng.integers(0, 50, n).tolist()  # repeats: merges and re-nacks
        cols["ts"] += ts.tolist()
        cols["due"] += (ts + rng.integers(0, 3000, n)).tolist()
    arrays = {k: np.array(v, dtype=np.int64) for k, v in cols.items()}
    order = rng.permutation(len(arrays["cid"]))  # unsorted input is sorted by the kernel
    grid = Grid.spanning(T0, T0 + 9_000, 30)
    bits = [0, 5, 9]
    out = analyse_group(*(arrays[k][order] for k in ("cid", "ledger", "entry", "ts", "due")),
                        bits_list=bits, costs=costs, grid=grid)
    row = {(int(c), int(b)): i for i, (c, b) in enumerate(zip(out["cid"], out["bits"]))}
    fleet = {b: {} for b in bits}  # the group's error histogram = the consumers' summed
    for c in range(40):
        mine = arrays["cid"] == c * 7
        alone = analyse_consumer(*(arrays[k][mine] for k in ("ledger", "entry", "ts", "due")),
                                 bits_list=bits, costs=costs)
        nacks = [(t, l, e, d) for l, e, t, d in zip(*(arrays[k][mine].tolist()
                                                      for k in ("ledger", "entry", "ts", "due")))]
        for r in alone:
            i = row[(c * 7, r.bits)]
            assert out["peak_pending"][i] == r.peak_pending and out["index_bytes"][i] == r.index_bytes
            assert out["peak_at_ms"][i] == (-1 if r.peak_at_ms is None else r.peak_at_ms)
            assert out["err_p99"][i] == r.error_quantile(0.99) and out["err_max"][i] == r.error_quantile(1.0)
            for v, n in zip(r.err_values.tolist(), r.err_counts.tolist()):
                fleet[r.bits][v] = fleet[r.bits].get(v, 0) + n
            lo, hi = out["pending_at"][0][i:i + 2]
            series = out["pending_at"][1][lo:hi]
            highs = out["pending_max"][1][lo:hi]
            for t, got, high in zip(grid.times().tolist(), series.tolist(), highs.tolist()):
                assert got == len_pending_at(nacks, r.bits, t), (c, r.bits, t)
                assert got <= high <= r.peak_pending
            assert highs.max() == r.peak_pending
    for b, (values, counts) in zip(bits, out["histograms"]):
        assert dict(zip(values.tolist(), counts.tolist())) == fleet[b]


@pytest.mark.parametrize("spread_ms", [5_000, 400_000])
def test_dense_and_sorted_sweeps_agree(costs, monkeypatch, spread_ms):
    """The per-millisecond sweep (dense timelines) and the sort-based one give
    the same peaks, instants and series, for a group and for one consumer."""
    from nacktracker.pipeline import pending
    from nacktracker.pipeline.pending import Grid, analyse_group

    rng = np.random.default_rng(11)
    n = 3_000
    cid = np.sort(rng.integers(0, 25, n))
    ts = T0 + rng.integers(0, spread_ms, n)
    cols = (cid, rng.integers(1, 5, n), rng.integers(0, 400, n), ts, ts + rng.integers(0, 4_000, n))
    grid = Grid.spanning(T0 - 1_000, T0 + spread_ms + 6_000, 40)  # bins before the first nack too
    runs = {}
    for name, factor in (("dense", 1 << 40), ("sorted", -(1 << 40))):
        monkeypatch.setattr(pending, "DENSE_SWEEP_FACTOR", factor)
        runs[name] = [analyse_group(*cols, bits_list=[0, 6, 11], costs=costs, grid=grid),
                      analyse_group(*(c[cid == 3] for c in cols), bits_list=[0, 6, 11], costs=costs, grid=grid)]
    for dense, ordered in zip(runs["dense"], runs["sorted"]):
        for key in ("peak_pending", "peak_at_ms", "index_bytes", "bitmaps"):
            assert np.array_equal(dense[key], ordered[key]), key
        for key in ("pending_at", "pending_max"):
            assert all(np.array_equal(a, b) for a, b in zip(dense[key], ordered[key])), key
        assert dense["peak_pending"].max() > 0


def len_pending_at(nacks, bits, t):
    """Pending at instant t by the model's definition, by brute force: occurrences
    (message, bucket) whose first nack is at or before t and whose bucket fires after t."""
    first = {}
    for ts, ledger, entry, due in nacks:
        b = (due >> bits) << bits
        key = (ledger, entry, b)
        first[key] = min(first.get(key, ts), ts)
    return sum(1 for (_, _, b), start in first.items() if start <= t < b)


def test_a_group_sends_back_its_busiest_series_and_its_total(costs):
    """40 consumers in one group: the series of the 16 with the highest peak per
    bits come back, and the group's total at each instant over all 40."""
    from nacktracker.pipeline import plan
    from nacktracker.pipeline.pending import Grid, analyse_group

    rng = np.random.default_rng(11)
    cid = np.repeat(np.arange(40), rng.integers(5, 60, 40))
    n = len(cid)
    ts = T0 + rng.integers(0, 5000, n)
    due = ts + rng.integers(0, 3000, n)
    grid = Grid.spanning(T0, T0 + 9000, 30)
    cols = analyse_group(cid, np.full(n, 3), np.arange(n), ts, due, [0, 8], costs, "floor", grid)
    batch = plan._result_batch(cols, 0.1)
    table = pa.Table.from_batches([batch])
    rows, series, _, totals = plan._split(table)
    for i, b in enumerate((0, 8)):
        sel = cols["bits"] == b
        peaks = cols["peak_pending"][sel]
        got, p_at, p_max = series[b]
        assert len(got) == plan.SERIES_TOP
        assert sorted(peaks[got], reverse=True) == sorted(peaks, reverse=True)[:plan.SERIES_TOP]
        everyone = cols["pending_at"][1][i * 40 * 30:(i + 1) * 40 * 30].reshape(40, 30)
        assert totals[b].tolist() == everyone.sum(axis=0).tolist()
        assert p_at.tolist() == everyone[np.searchsorted(cols["cid"][sel], got)].tolist()


def test_quantile_is_nearest_rank():
    v, c = np.array([-3, -1, 0]), np.array([1, 1, 2])
    assert [quantile(v, c, q, absolute=True) for q in (0.25, 0.5, 0.75, 1.0)] == [0, 0, 1, 3]
    assert quantile(v, c, 0.25) == -3 and quantile([], [], 0.5) == 0


def test_recommend_takes_the_largest_bits_within_the_bound():
    assert recommend({0: 0, 4: 15, 8: 253, 10: 1013}, 1000) == 8
    assert recommend({8: 253, 10: 1013}, 100) is None


def test_memory_model_constants_are_measured_and_tight(costs):
    assert 0 < costs.window_bytes < 256 and costs.max_model_error < 0.10
    d = DictIndex()
    for i in range(20_000):  # fresh int objects per message, as message ids give them
        d.add(100_000 + i // 50_000, i, T0 + i)
    assert costs.dict_index_per_entry == pytest.approx(d.nbytes() / len(d), rel=0.25)


# -- Spark ----------------------------------------------------------------------------

def _spark_available() -> bool:
    return importlib.util.find_spec("pyspark") is not None and shutil.which("java") is not None


needs_spark = pytest.mark.skipif(not _spark_available(), reason="needs pyspark and Java")


@pytest.fixture(scope="session")
def spark():
    """One quiet local[2] session for every Spark test in the run."""
    if not _spark_available():
        pytest.skip("needs pyspark and Java")
    from nacktracker.pipeline.spark import get_spark, stop_spark

    session = get_spark("local[2]", shuffle_partitions=4, driver_memory="2g")
    yield session
    stop_spark(session)  # and its JVM: no process of the run outlives it


SPEC = dict(events=45_000, consumers=3, rate=2000, rate_spread=2.0, delay_ms=1000, delay_jitter_ms=1000,
            nack_share=0.3, entries_per_ledger=2000, batch_size=2, renack_share=0.05, seed=3)


@pytest.fixture(scope="session")
def trace(spark, tmp_path_factory):
    from nacktracker.pipeline.trace import TraceSpec, generate_trace

    out = str(tmp_path_factory.mktemp("traces") / "gen.parquet")
    generate_trace(spark, TraceSpec(**SPEC), out, files=3)
    return out


@pytest.fixture(scope="session")
def planned(spark, trace):
    from nacktracker.pipeline.plan import run_plan

    return run_plan(spark, trace, BITS, max_early_ms=300)


@pytest.mark.spark
@needs_spark
def test_generated_trace_has_the_shape_asked_for(trace):
    t = pq.read_table(trace).to_pandas()
    assert len(t) == SPEC["events"] and set(t["kind"]) == {"nack"}
    assert sorted(t["consumer"].unique()) == ["consumer-000", "consumer-001", "consumer-002"]
    assert t["delay_ms"].between(1000, 2000).all() and t["delay_ms"].nunique() > 900
    assert 0.01 < (t["redelivery_count"] == 1).mean() < 0.05  # re-nacks start one delay into the trace
    per = t.groupby("consumer")["ts_ms"].agg(["min", "max"])
    # consumer 0 nacks 2000/s, consumer 2 twice as fast: the same count in half the time
    span0 = per.loc["consumer-000", "max"] - per.loc["consumer-000", "min"]
    span2 = per.loc["consumer-002", "max"] - per.loc["consumer-002", "min"]
    assert span0 == pytest.approx(7500, rel=0.01) and span2 == pytest.approx(3750, rel=0.01)
    fresh = t[t["redelivery_count"] == 0]
    assert fresh.groupby(["consumer", "ledger_id"])["entry_id"].max().max() < SPEC["entries_per_ledger"]
    assert set(t["batch_index"]) == {0, 1}


@pytest.mark.spark
@needs_spark
def test_many_consumers_are_generated_without_literal_arrays_alike(spark, monkeypatch):
    """Above a thousand consumers each row computes its consumer's name, topic
    and rate instead of looking them up in literal arrays (a plan of C literals
    each): the same trace (times within the last bit of a double's pow)."""
    from nacktracker.pipeline import trace as tr

    spec = tr.TraceSpec(events=6000, consumers=60, rate=500, rate_spread=3.0, topics=7, renack_share=0.1, seed=4)
    literal = tr.trace_frame(spark, spec).toPandas()
    monkeypatch.setattr(tr, "_LITERAL_CONSUMERS", 10)
    computed = tr.trace_frame(spark, spec).toPandas()
    for c in literal.columns:
        if c != "ts_ms":
            assert computed[c].tolist() == literal[c].tolist(), c
    assert (computed["ts_ms"] - literal["ts_ms"]).abs().max() <= 1
    assert computed["consumer"].nunique() == 60 and computed["topic"].nunique() == 7


@pytest.mark.spark
@needs_spark
def test_peak_pending_equals_an_exact_replay(planned, trace):
    rows = planned.consumers
    for name, nacks in nacks_by_consumer(trace).items():
        for bits in BITS:
            r = rows[(rows["consumer"] == name) & (rows["bits"] == bits)].iloc[0]
            peak, at, _ = replay(nacks, bits)
            assert (r["peak_pending"], r["peak_at_ms"]) == (peak, at), (name, bits)
            assert r["nacks"] == len(nacks)
    # the peak depends on bits (fire times move), and merging shows up at coarse buckets
    c0 = rows[rows["consumer"] == "consumer-000"].set_index("bits")
    assert c0.loc[12, "peak_pending"] != c0.loc[0, "peak_pending"]
    assert c0.loc[12, "merged"] > c0.loc[0, "merged"]


@pytest.mark.spark
@needs_spark
def test_partitions_sorted_and_streamed_in_groups_give_the_same_tables(spark, planned, trace, monkeypatch):
    from nacktracker.pipeline import plan

    # small groups: a partition holds two consumers of more than a group's rows, so
    # Spark sorts it by consumer and the kernel cuts it into groups as it streams
    monkeypatch.setattr(plan, "GROUP_ROWS", 1000)
    streamed = plan.run_plan(spark, trace, BITS, max_early_ms=300, partitions=2)
    assert streamed.partitions == 2
    drop = lambda t: t.drop(columns=["kernel_s"]).reset_index(drop=True)  # noqa: E731
    assert drop(streamed.consumers).equals(drop(planned.consumers))
    assert streamed.fleet_errors.equals(planned.fleet_errors)
    assert streamed.series.equals(planned.series)


@pytest.mark.spark
@needs_spark
def test_consumers_streamed_in_time_order_give_the_same_tables(spark, planned, trace):
    """Consumers above the streaming threshold go through the streaming kernel
    (time-sorted in Spark, a chunk at a time): here all three. One chunk each
    at this size: every column equal (several chunks: tests/pipeline/test_pipeline_stream.py)."""
    from nacktracker.pipeline import plan

    drop = lambda t: t.drop(columns=["kernel_s"]).reset_index(drop=True)  # noqa: E731
    for limit in (0,):
        streamed = plan.run_plan(spark, trace, BITS, max_early_ms=300, stream_nacks=limit)
        assert drop(streamed.consumers).equals(drop(planned.consumers)), limit
        assert streamed.fleet_errors.equals(planned.fleet_errors)
        assert streamed.series.equals(planned.series)


@pytest.mark.spark
@needs_spark
@pytest.mark.parametrize("bits", [0, 4, 8, 12])
def test_peak_memory_agrees_with_an_index_built_in_process(planned, trace, bits):
    name = "consumer-001"
    r = planned.consumers.query("consumer == @name and bits == @bits").iloc[0]
    nacks = nacks_by_consumer(trace)[name]
    _, _, at_peak = replay(nacks, bits, stop_at=int(r["peak_at_ms"]))
    assert len(at_peak) == r["peak_pending"]
    assert (r["bitmaps"], r["buckets"]) == (at_peak.bitmap_count(), at_peak.bucket_count())
    # the model follows the replayed index as it was at that instant (adds and pops);
    # on this trace it measured 10.1% under at bits 8 (tests/pipeline/test_memory_model.py holds 10%)
    assert r["index_bytes"] == pytest.approx(at_peak.nbytes(), rel=0.15)


@pytest.mark.spark
@needs_spark
def test_errors_fleet_totals_and_recommendation(planned, trace):
    f = planned.fleet.set_index("bits")
    c = planned.consumers
    for bits in BITS:
        assert f.loc[bits, "err_max"] <= (1 << bits) - 1 or bits == 0
        assert f.loc[bits, "peak_pending"] == c[c["bits"] == bits]["peak_pending"].sum()
        assert f.loc[bits, "index_bytes"] == c[c["bits"] == bits]["index_bytes"].sum()
        assert f.loc[bits, "nacks"] == SPEC["events"]
    assert f.loc[0, "err_p99"] == 0 and f.loc[8, "err_p99"] in range(240, 256)
    assert planned.recommended == 8  # p99 ~ 253 ms <= 300 ms; bits 12 ~ 4 s
    assert c[c["recommended"]]["bits"].tolist() == [8, 8, 8]
    assert f.loc[0, "dict_index_bytes"] == pytest.approx(
        planned.costs.dict_index_per_entry * f.loc[0, "peak_pending"], rel=1e-3)
    # the fleet histogram holds every nack once per bits
    h = planned.fleet_errors
    assert (h.groupby("bits")["nacks"].sum() == SPEC["events"]).all()


@pytest.mark.spark
@needs_spark
def test_report_outputs(planned, tmp_path):
    import pandas as pd

    from nacktracker.pipeline.report import markdown, write_outputs

    paths = write_outputs(planned, tmp_path)
    text = markdown(planned)
    assert "**precision_bits = 8**" in text and "consumer-002" in text
    # every candidate against the bound, in exact ms: bits 12 misses it, 8 is taken
    assert re.search(r"- bits 12 \(4\.10 s buckets, [^)]*\): \*\*rejected\*\*: fleet p99 error [\d,]+ ms "
                     r"early > bound 300 ms \([\d,]+ ms over\)", text)
    assert re.search(r"- bits 8 .*\*\*recommended\*\*: fleet p99 error 2\d\d ms early <= bound 300 ms", text)
    for name in ("plot", "pending_plot"):
        assert paths[name].read_bytes()[:4] == b"\x89PNG"
    table = pq.read_table(paths["consumers"]).to_pandas()
    assert len(table) == 3 * len(BITS)
    csv = pd.read_csv(paths["consumers_csv"])
    assert len(csv) == 3 * len(BITS) and set(csv["bits"]) == set(BITS)
    assert {"peak_at_utc", "bytes_per_pending", "within_bound", "own_best_bits"} <= set(csv.columns)
    md = paths["consumers_md"].read_text()
    assert sum(line.startswith("| consumer-") for line in md.splitlines()) == 3 * len(BITS)
    assert "| peak pending | " in md and "| tracker memory | " in md  # the distribution over consumers
    assert "## Consumers, distribution at precision_bits=8" in text
    r = table[(table["consumer"] == "consumer-000") & (table["bits"] == 8)].iloc[0]
    assert r["peak_at_utc"] in md and r["peak_at_utc"].startswith("2023-11-14 ")
    assert pq.read_table(paths["fleet"]).column("bits").to_pylist() == list(BITS)
    # pending over time at the recommended bits: every consumer, and its maximum is its peak
    series = pq.read_table(paths["pending"]).to_pandas()
    assert set(series["bits"]) == {8} and series["consumer"].nunique() == 3
    peaks = table[table["bits"] == 8].set_index("consumer")["peak_pending"]
    assert (series.groupby("consumer")["pending_max"].max() == peaks).all()
    assert (series["pending_at"] <= series["pending_max"]).all()


@pytest.mark.spark
@needs_spark
def test_reports_at_fleet_scale_summarise_and_the_tables_hold_everyone(planned, tmp_path):
    """21,000 consumers (the planned ones, copied under other names): the
    Markdown files stay small and readable, the CSV and Parquet hold them all."""
    import dataclasses

    import pandas as pd

    from nacktracker.pipeline.report import write_outputs

    copies = []
    for i in range(7000):
        c = planned.consumers.copy()
        c["consumer"] = c["consumer"] + f"-{i:04d}"
        c["index_bytes"] += i  # distinct sizes: a definite order
        copies.append(c)
    fleet = dataclasses.replace(planned, consumers=pd.concat(copies, ignore_index=True), series=None)
    paths = write_outputs(fleet, tmp_path)
    md = paths["consumers_md"].read_text()
    assert paths["consumers_md"].stat().st_size <= 200_000 and paths["report"].stat().st_size <= 50_000
    assert sum(line.startswith("| consumer-") for line in md.splitlines()) == 100 * len(BITS)
    assert "The 100 of 21,000 consumers" in md and "| peak pending |" in md
    at8 = fleet.consumers[fleet.consumers["bits"] == 8]
    top = at8.sort_values("index_bytes", ascending=False)["consumer"].iloc[0]
    first = next(line for line in md.splitlines() if line.startswith("| consumer-"))
    assert first.startswith(f"| {top} |")  # the most memory first
    assert len(pd.read_csv(paths["consumers_csv"])) == 21_000 * len(BITS)
    assert pq.read_table(paths["consumers"]).num_rows == 21_000 * len(BITS)


def _report_claims_hold(result) -> None:
    """Each sentence of the report's recommendation and candidate list against the fleet table it reports."""
    import re

    from nacktracker.pipeline.report import markdown

    text = markdown(result)
    fleet = result.fleet.set_index("bits")
    bound, rec = result.max_early_ms, result.recommended
    within = [b for b in fleet.index if fleet.loc[b, "err_p99"] <= bound]
    assert rec == (max(within) if within else None)
    candidates = [line for line in text.splitlines() if line.startswith("- bits ")]
    assert len(candidates) == len(fleet)
    for line in candidates:
        b, verdict = re.match(r"- bits (\d+) \(.*?\): (.*)$", line).groups()
        b, p99 = int(b), fleet.loc[int(b), "err_p99"]
        if "**rejected**" in verdict:
            assert p99 > bound, line
        elif "**recommended**" in verdict:
            assert b == rec and p99 <= bound, line
        else:
            assert "within the bound" in verdict and p99 <= bound and b != rec, line
            m = re.search(r"bits (\d+) is the largest within it, with (less|more|the same) memory "
                          r"\(([\d,]+) B(?: against ([\d,]+) B)?\)$", verdict)
            theirs, mine = fleet.loc[rec, "index_bytes"], fleet.loc[b, "index_bytes"]
            assert m and int(m[1]) == rec, line
            assert m[2] == ("less" if theirs < mine else "more" if theirs > mine else "the same"), (line, theirs, mine)
            assert int(m[3].replace(",", "")) == int(theirs) and (m[4] is None or int(m[4].replace(",", "")) == int(mine))
    leaner = re.search(r"precision_bits=(\d+) is within the bound too and holds less memory \(([\d,]+) B against "
                       r"([\d,]+) B\), with (a smaller|the same|a larger) p99 error", text)
    if rec is None:
        assert f"even precision_bits={min(result.bits)} has a fleet p99 error" in text and leaner is None
        return
    f = fleet.loc[rec]
    m = re.search(r"\*\*precision_bits = (\d+)\*\* .*? hold at most \*\*(.+?)\*\* for ([\d,]+) pending nacks .*?"
                  r"\(DictIndex\): ([\d,.]+)x (less|more)\.", text, re.S)
    shown = re.search(rf"^- bits {rec} \(.*?, (.+?)\):", text, re.M)[1]  # the recommended one's memory, as listed
    assert m and int(m[1]) == rec and m[2] == shown and int(m[3].replace(",", "")) == f["peak_pending"]
    ratio = f["dict_index_bytes"] / f["index_bytes"]
    assert (m[5], float(m[4].replace(",", ""))) == (("less", round(ratio, 1)) if ratio >= 1 else ("more", round(1 / ratio, 1)))
    least = min(within, key=lambda b: fleet.loc[b, "index_bytes"])
    if fleet.loc[least, "index_bytes"] < f["index_bytes"]:
        assert leaner and int(leaner[1]) == least and int(leaner[2].replace(",", "")) == fleet.loc[least, "index_bytes"]
        e, er = fleet.loc[least, "err_p99"], f["err_p99"]
        assert leaner[4] == ("a smaller" if e < er else "the same" if e == er else "a larger")
    else:
        assert leaner is None


@pytest.mark.spark
@needs_spark
def test_the_report_says_only_what_its_tables_show(spark, planned, tmp_path):
    """Over several traces and bounds (and the case where the largest bits within the bound holds more
    memory than a smaller one), each claim of the report's sentences matches the fleet table."""
    import dataclasses

    from nacktracker.pipeline.plan import run_plan
    from nacktracker.pipeline.trace import TraceSpec, generate_trace

    sparse = str(tmp_path / "sparse.parquet")
    generate_trace(spark, TraceSpec(events=20_000, consumers=2, rate=500, delay_ms=5_000, delay_jitter_ms=50_000,
                                    nack_share=0.05, entries_per_ledger=5_000, seed=7), sparse)
    results = [planned, run_plan(spark, sparse, BITS, max_early_ms=100)]
    for base in list(results):
        for bound in (0.0, 20.0, 1e9):  # none, some and every candidate within the bound
            p99 = dict(zip(base.fleet["bits"], base.fleet["err_p99"]))
            results.append(dataclasses.replace(base, max_early_ms=bound, recommended=recommend(p99, bound)))
    # the largest bits holding more memory than bits 0 (as real traces can): the sentences must say so
    fleet = planned.fleet.copy()
    fleet.loc[fleet["bits"] == max(BITS), "index_bytes"] = fleet["index_bytes"].max() + 8960
    results.append(dataclasses.replace(planned, fleet=fleet, max_early_ms=1e9, recommended=max(BITS)))
    for result in results:
        _report_claims_hold(result)


@pytest.mark.spark
@needs_spark
def test_error_plot_draws_zero_at_zero(planned, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nacktracker.pipeline.report import plot

    seen = {}
    real = plt.Figure.savefig

    def grab(fig, *a, **k):
        seen["axes"] = fig.axes
        return real(fig, *a, **k)

    plt.Figure.savefig = grab
    try:
        plot(planned, tmp_path / "p.png")
    finally:
        plt.Figure.savefig = real
    err = seen["axes"][1]
    assert err.get_yscale() == "symlog"
    p50 = next(line for line in err.get_lines() if line.get_label() == "p50")
    assert p50.get_ydata()[0] == 0  # bits 0: a 0 ms error is drawn at 0
    assert err.get_ylim()[0] == 0


@pytest.mark.spark
@needs_spark
def test_jsonl_and_writer_logs_plan_too(spark, tmp_path):
    """A log from EventLogWriter (Parquet and JSON Lines), with redeliveries,
    dead letters and an unnamed consumer: only nacks are tracked."""
    from nacktracker.pipeline.plan import run_plan

    events = []
    for i in range(200):
        events.append(NackEvent(T0 + i, "nack", 7, i, delay_ms=1000, consumer="a"))
        events.append(NackEvent(T0 + i, "nack", 8, i, delay_ms=500, consumer=None))
    events += [NackEvent(T0 + 1000, "redeliver", 7, 0, consumer="a"),
               NackEvent(T0 + 1001, "dead_letter", 7, 1, redelivery_count=5, consumer="a")]
    results = {}
    for fmt in ("parquet", "jsonl"):
        with EventLogWriter(tmp_path / fmt, format=fmt, rows_per_file=150) as w:
            w.write_many(events)
        results[fmt] = run_plan(spark, str(tmp_path / fmt), [0, 6])
    a, b = results["parquet"], results["jsonl"]
    assert a.trace.kinds == {"nack": 400, "redeliver": 1, "dead_letter": 1}
    assert set(a.consumers["consumer"]) == {"a", "(unnamed)"}
    cols = ["consumer", "bits", "peak_pending", "peak_at_ms", "index_bytes", "err_p99"]
    assert a.consumers[cols].equals(b.consumers[cols])
    assert a.consumers.query("consumer == 'a' and bits == 0")["peak_pending"].item() == 200


@pytest.mark.spark
@needs_spark
def test_row_group_tasks_and_spark_reading_the_log_plan_alike(spark, tmp_path, monkeypatch):
    """A local Parquet log is read by the tasks themselves with pyarrow, a row
    group each (validation and analysis); any other log by Spark. Both give
    the same summary and tables, here on a log with several files and row
    groups, 32-bit ids, an unnamed consumer, re-nacks into one bucket and
    redeliver/dead-letter rows."""
    from nacktracker.pipeline import load, plan

    rng = np.random.default_rng(3)
    events = []
    for i in range(3000):
        consumer = ("a", "b", None)[i % 3]
        events.append(NackEvent(T0 + i, "nack", 5 + i % 4, int(rng.integers(0, 400)),
                                delay_ms=int(rng.integers(0, 900)), consumer=consumer))
        if i % 97 == 0:
            events.append(NackEvent(T0 + i, "redeliver", 5, i, consumer=consumer))
        if i % 389 == 0:
            events.append(NackEvent(T0 + i, "dead_letter", 6, i, redelivery_count=3, consumer=consumer))
    with EventLogWriter(tmp_path / "log", rows_per_file=1000, buffer_rows=300) as w:
        w.write_many(events)
    n = 500  # and a file of 32-bit ids, from another writer
    pq.write_table(pa.table({"ts_ms": pa.array([T0 + 5 * i for i in range(n)], pa.int64()), "kind": ["nack"] * n,
                             "ledger_id": pa.array([9] * n, pa.int32()), "entry_id": pa.array(range(n), pa.int32()),
                             "delay_ms": pa.array([300] * n, pa.int64()), "consumer": ["b"] * n}),
                   tmp_path / "log" / "other.parquet", row_group_size=200)
    # tasks of at least 700 rows: consecutive row groups of a file, several files, batches of 700 rows
    monkeypatch.setattr(load, "TASK_ROWS", 700)
    tasks = load.parquet_tasks(str(tmp_path / "log"))
    assert len(tasks) > 2 and any(len(groups) > 1 for task in tasks for _, groups in task)
    assert any(len(task) > 1 for task in tasks)  # a task reading the end of one file and the start of the next
    sizes = [sum(pq.ParquetFile(f).metadata.row_group(g).num_rows for f, groups in task for g in groups)
             for task in tasks]
    assert all(n >= 700 for n in sizes[:-1]) and sum(sizes) == len(events) + n
    read = [(f, g) for task in tasks for f, groups in task for g in groups]
    assert read == [(f, g) for f in sorted(str(p) for p in (tmp_path / "log").iterdir())
                    for g in range(pq.ParquetFile(f).metadata.num_row_groups)]  # each row group once, in order
    by_tasks = plan.run_plan(spark, str(tmp_path / "log"), [0, 4, 9])
    monkeypatch.setattr(load, "parquet_tasks", lambda *a, **k: None)
    monkeypatch.setattr(plan, "parquet_tasks", lambda *a, **k: None)
    by_spark = plan.run_plan(spark, str(tmp_path / "log"), [0, 4, 9])
    assert by_tasks.trace == by_spark.trace
    assert set(by_tasks.consumers["consumer"]) == {"a", "b", "(unnamed)"}
    drop = lambda t: t.drop(columns=["kernel_s"]).reset_index(drop=True)  # noqa: E731
    assert drop(by_tasks.consumers).equals(drop(by_spark.consumers))
    assert by_tasks.fleet_errors.equals(by_spark.fleet_errors)
    assert by_tasks.series.equals(by_spark.series)
    assert (by_tasks.consumers["merged"] > 0).any()  # re-nacks of one message into one bucket happened


# -- bad traces -------------------------------------------------------------------------

def good_table(n=5):
    return {"ts_ms": [T0 + i for i in range(n)], "kind": ["nack"] * n, "ledger_id": [1] * n,
            "entry_id": list(range(n)), "delay_ms": [100] * n, "consumer": ["c"] * n}


@pytest.mark.spark
@needs_spark
@pytest.mark.parametrize("change, error, column", [
    (dict(delay_ms=None), MissingColumnError, "delay_ms"),
    (dict(consumer=None), MissingColumnError, "consumer"),
    (dict(ledger_id=["1", "1", "1", "1", "1"]), ColumnTypeError, "ledger_id"),
    (dict(ts_ms=[1.0, 2.0, 3.0, 4.0, 5.0]), ColumnTypeError, "ts_ms"),
    (dict(entry_id=[0, 1, -2, 3, 4]), BadValueError, "entry_id"),
    (dict(ledger_id=[1, 1, 1, -1, 1]), BadValueError, "ledger_id"),
    (dict(kind=["nack", "nack", "ack", "nack", "nack"]), BadValueError, "kind"),
    (dict(ts_ms=[T0, None, T0, T0, T0]), BadValueError, "ts_ms"),
    # ts_ms + delay_ms would overflow an int64 (err_max read 1,340,433,484 ms at bits 0): refused, the limit named
    (dict(ts_ms=[T0, T0, (1 << 63) - 10, T0, T0]), BadValueError, "ts_ms"),
    (dict(delay_ms=[100, 100, 100, 1 << 62, 100]), BadValueError, "delay_ms"),
])
def test_bad_parquet_traces_name_the_column(spark, tmp_path, change, error, column):
    from nacktracker.pipeline.plan import run_plan

    cols = good_table()
    cols.update(change)
    pq.write_table(pa.table({k: v for k, v in cols.items() if v is not None}), tmp_path / "t.parquet")
    with pytest.raises(error, match=repr(column)) as info:
        run_plan(spark, str(tmp_path / "t.parquet"), [0])
    assert info.value.column == column and isinstance(info.value, TraceError)


def test_footer_statistics_cover_only_columns_every_file_has_them_for(tmp_path):
    from nacktracker.pipeline.load import footer_stats

    cols = good_table()
    cols["redelivery_count"] = [0, 2, None, 1, 0]
    pq.write_table(pa.table(cols), tmp_path / "a.parquet", row_group_size=2)
    more = dict(good_table(), ledger_id=[9, 3, 4, 5, 6])
    pq.write_table(pa.table(more), tmp_path / "b.parquet", write_statistics=["ledger_id"])
    both = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    assert footer_stats(both[:1]) == {"ledger_id": {"nulls": 0, "min": 1, "max": 1},
                                      "entry_id": {"nulls": 0, "min": 0, "max": 4},
                                      "redelivery_count": {"nulls": 1, "min": 0, "max": 2}}
    # b.parquet has statistics for ledger_id only, and no redelivery_count column
    assert footer_stats(both) == {"ledger_id": {"nulls": 0, "min": 1, "max": 9}}


@pytest.mark.spark
@needs_spark
@pytest.mark.parametrize("statistics", [True, False])
@pytest.mark.parametrize("change, column", [
    (dict(entry_id=[0, 1, -2, 3, 4]), "entry_id"),
    (dict(ledger_id=[1, None, 1, 1, 1]), "ledger_id"),
    (dict(redelivery_count=[0, 0, -1, 0, 0]), "redelivery_count"),
])
def test_bad_values_are_found_with_or_without_file_statistics(spark, tmp_path, statistics, change, column):
    """Columns the files' statistics cover are checked from them, the others
    (and every column of files written without statistics) by the scan: the
    same error either way."""
    from nacktracker.pipeline.plan import run_plan

    cols = dict(good_table(), **change)
    pq.write_table(pa.table(cols), tmp_path / "t.parquet", write_statistics=statistics)
    with pytest.raises(BadValueError, match=repr(column)) as info:
        run_plan(spark, str(tmp_path / "t.parquet"), [0])
    assert info.value.column == column


@pytest.mark.spark
@needs_spark
def test_unsigned_64_bit_ids_are_read_when_they_fit(spark, tmp_path):
    """pyarrow writes uint64 as Parquet's unsigned 64-bit: read as the int64
    it holds when every value fits, else an error naming the column."""
    from nacktracker.pipeline.plan import run_plan

    n = 200
    cols = good_table(n)
    cols["ledger_id"] = [7 + i // 50 for i in range(n)]
    signed = run_plan(spark, _write(tmp_path / "signed.parquet", cols), [0, 4]).consumers
    unsigned = pa.table(cols).set_column(2, "ledger_id", pa.array(cols["ledger_id"], pa.uint64()))
    pq.write_table(unsigned, tmp_path / "unsigned.parquet")
    got = run_plan(spark, str(tmp_path / "unsigned.parquet"), [0, 4]).consumers
    assert got.drop(columns=["kernel_s"]).equals(signed.drop(columns=["kernel_s"]))
    big = unsigned.set_column(2, "ledger_id", pa.array([7] * (n - 1) + [(1 << 63) + 5], pa.uint64()))
    pq.write_table(big, tmp_path / "big.parquet")
    with pytest.raises(ColumnTypeError, match="'ledger_id'.*9223372036854775813") as info:
        run_plan(spark, str(tmp_path / "big.parquet"), [0])
    assert info.value.column == "ledger_id"


@pytest.mark.spark
@needs_spark
def test_ids_and_times_too_wide_for_32_bits_plan_alike(spark, tmp_path, costs):
    """The kernel's columns cross into Python as 32-bit ints when they fit;
    ids past 2^31 and a trace spanning more than 24 days keep 64 bits and give
    the kernel's figures all the same."""
    from nacktracker.pipeline.plan import run_plan

    rng = np.random.default_rng(5)
    n = 400
    ts = np.sort(T0 + rng.integers(0, 40 * 86_400_000, n))  # 40 days
    cols = {"ts_ms": ts.tolist(), "kind": ["nack"] * n,
            "ledger_id": (3_000_000_000 + rng.integers(0, 3, n)).tolist(),
            "entry_id": (5_000_000_000 + rng.integers(0, 50, n)).tolist(),
            "delay_ms": rng.integers(0, 5_000, n).tolist(), "consumer": ["c"] * n}
    got = run_plan(spark, _write(tmp_path / "wide.parquet", cols), [0, 8]).consumers
    rows = [(l, e, t, t + d) for l, e, t, d in zip(cols["ledger_id"], cols["entry_id"], cols["ts_ms"],
                                                   cols["delay_ms"])]
    for r in analyse_rows(rows, [0, 8], costs):
        g = got[got["bits"] == r.bits].iloc[0]
        assert (g["peak_pending"], g["peak_at_ms"], g["index_bytes"], g["err_max"]) == (
            r.peak_pending, r.peak_at_ms, r.index_bytes, r.error_quantile(1.0))


def _write(path, cols) -> str:
    pq.write_table(pa.table(cols), path)
    return str(path)


def test_plan_on_another_format_says_which_it_reads_first_and_alone(tmp_path, capsys):
    from nacktracker.cli import main

    (tmp_path / "log.csv").write_text("ts_ms,kind\n1,nack\n")
    assert main(["plan", str(tmp_path / "log.csv"), "--out", str(tmp_path / "p")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1  # no progress line, no JVM started
    assert "log.csv: not a Parquet file" in err and "JSON Lines (.jsonl" in err and "Parquet (a file" in err
    assert not (tmp_path / "p").exists()


def test_plan_without_the_spark_extra_says_so_first_and_alone(tmp_path, capsys, monkeypatch):
    import nacktracker._extras as extras
    from nacktracker.cli import main

    real = extras.importlib.import_module

    def without_pyspark(name, *a, **k):
        if name.split(".")[0] == "pyspark":
            raise ModuleNotFoundError("No module named 'pyspark'", name="pyspark")
        return real(name, *a, **k)

    monkeypatch.setattr(extras.importlib, "import_module", without_pyspark)
    for argv in (["plan", str(tmp_path)], ["trace", "generate", "--out", str(tmp_path / "t"), "--events", "9"],
                 ["sweep"]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "pip install '.[spark]' in the nacktracker checkout" in err, (out, err)


@pytest.mark.spark
@needs_spark
def test_bad_jsonl_traces_name_the_column(spark, tmp_path):
    from nacktracker.pipeline.plan import run_plan

    (tmp_path / "a.jsonl").write_text('{"ts_ms": 1, "kind": "nack", "ledger_id": "x", "entry_id": 1, '
                                      '"delay_ms": 5, "consumer": "c"}\n')
    with pytest.raises(ColumnTypeError, match="'ledger_id'"):
        run_plan(spark, str(tmp_path / "a.jsonl"), [0])
    (tmp_path / "b.jsonl").write_text('{"ts_ms": 1, "kind": "nack", "ledger_id": 1, "entry_id": 1, '
                                      '"consumer": "c"}\n')
    with pytest.raises(MissingColumnError, match="'delay_ms'"):
        run_plan(spark, str(tmp_path / "b.jsonl"), [0])
    (tmp_path / "c.jsonl").write_text('{"ts_ms": 9223372036854775000, "kind": "nack", "ledger_id": 1, '
                                      '"entry_id": 1, "delay_ms": 100, "consumer": "c"}\n')
    with pytest.raises(BadValueError, match="'ts_ms' must be <= 2305843009213693951"):  # Spark's own scan
        run_plan(spark, str(tmp_path / "c.jsonl"), [0])


@pytest.mark.spark
@needs_spark
def test_a_damaged_data_page_is_one_line_naming_the_file(spark, tmp_path):
    """A Parquet file whose footer reads but whose data does not: the tasks
    reading the log with pyarrow report it as one TraceError naming the file."""
    from nacktracker.pipeline.plan import run_plan

    n = 20_000
    path = tmp_path / "log" / "a.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"ts_ms": pa.array(np.arange(n) + T0), "kind": ["nack"] * n,
                             "ledger_id": pa.array(np.arange(n) % 7), "entry_id": pa.array(np.arange(n)),
                             "delay_ms": pa.array(np.full(n, 100)), "consumer": ["c"] * n}),
                   path, compression="zstd", use_dictionary=False)
    data = bytearray(path.read_bytes())
    footer = 8 + int.from_bytes(data[-8:-4], "little")
    for i in range(200, len(data) - footer - 200, 97):  # scramble the column chunks, keep the footer
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match=r"a\.parquet") as e:
        run_plan(spark, str(tmp_path / "log"), [0])
    assert "cannot read the log" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.spark
@needs_spark
def test_empty_traces(spark, tmp_path):
    from nacktracker.pipeline.plan import run_plan

    with pytest.raises(EmptyTraceError, match="no such file"):
        run_plan(spark, str(tmp_path / "nothing-here"), [0])
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(EmptyTraceError, match="no event files"):
        run_plan(spark, str(tmp_path / "empty-dir"), [0])
    schema = pa.table(good_table()).schema
    pq.write_table(pa.table(good_table()).slice(0, 0).cast(schema), tmp_path / "zero.parquet")
    with pytest.raises(EmptyTraceError, match="no events"):
        run_plan(spark, str(tmp_path / "zero.parquet"), [0])
    only = good_table()
    only["kind"] = ["redeliver"] * 5
    pq.write_table(pa.table(only), tmp_path / "no-nacks.parquet")
    with pytest.raises(EmptyTraceError, match="no 'nack' events"):
        run_plan(spark, str(tmp_path / "no-nacks.parquet"), [0])


# -- the command line and the sweep --------------------------------------------------------

@pytest.mark.spark
@needs_spark
def test_cli_generates_and_plans(spark, tmp_path, capsys):
    from nacktracker.pipeline.cli import main

    out = tmp_path / "t"
    assert main(["trace", "generate", "--out", str(out), "--events", "6000", "--consumers", "2",
                 "--delay-ms", "2000", "--format", "jsonl"]) == 0
    assert main(["plan", str(out), "--bits", "0,6,10", "--out", str(tmp_path / "plan"),
                 "--max-early-ms", "100"]) == 0
    text = capsys.readouterr().out
    assert "**precision_bits = 6**" in text
    report = (tmp_path / "plan" / "report.md").read_text()
    assert report.rstrip("\n") in text  # printed whole, after the progress lines
    assert "[plan] validate:" in text and "[plan] analyse: done in" in text
    assert main(["plan", str(out), "--bits", "0,6", "--out", str(tmp_path / "q"), "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")  # quiet: no report, no progress, no summary line
    assert main(["trace", "generate", "--out", str(out), "--events", "10"]) == 2  # exists
    assert main(["plan", str(tmp_path / "missing"), "--out", str(tmp_path / "p2")]) == 2
    assert "no such file" in capsys.readouterr().err


def _processes_with(marker: str) -> list[str]:
    """Processes whose environment holds ``marker`` (a command's children inherit it)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker.encode() in f.read():
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        found.append(f"{pid}: {c.read()[:120]!r}")
        except OSError:
            continue
    return found


@pytest.mark.spark
@pytest.mark.slow
@needs_spark
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_plan_quiet_prints_nothing_and_no_process_outlives_it(trace, tmp_path):
    """The commands stop their JVM and wait for it (it writes its class archive as it exits): when
    ``plan`` returns, nothing it started runs (``sweep``: the test of the command as a user types it;
    every command starts and stops its session the same way). ``--quiet`` in a fresh process (whose
    warnings show once each, as a user's do): nothing on stdout, nothing on stderr but the JVM's own
    line for the incubator module Spark 4 adds (printed by the JVM at its start, before any setting applies)."""
    marker = f"NACKTRACKER_TEST_MARK={uuid.uuid4().hex}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **dict([marker.split("=")]))
    done = subprocess.run([sys.executable, "-m", "nacktracker.pipeline.cli", "plan", trace, "--bits", "0,8",
                           "--out", str(tmp_path / "p"), "--master", "local[1]", "--driver-memory", "1g", "--quiet"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _processes_with(marker) == []
    assert done.stdout == ""
    assert [line for line in done.stderr.splitlines() if not line.startswith("WARNING: Using incubator modules")] == []


@pytest.mark.skipif(not (ROOT / "bench" / "memory.py").exists(), reason="needs the source tree")
def test_sweep_uses_the_benchmarks_workloads():
    from bench import memory as bench
    from nacktracker.pipeline import sweep

    for args in [("sequential", 3000, 4, 1000, 1.0), ("random", 3000, 1, 500, 0.1), ("random", 700, 2, 50, 0.5)]:
        assert list(sweep.workload(*args)) == list(bench.workload(*args))
    for x, y, e in itertools.product((1, 4, 8), (8, 10, 15), (50_000, 1000)):
        assert sweep.seed_estimate(x, y, e) == bench.seed_estimate(x, y, e)
    rows = [sweep.measure(sweep.SweepConfig(index, 4, 10, 50_000, 1.0, 20_000)) for index in sweep.INDEXES]
    text = sweep.table(rows)
    ours = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(ours) == 1 + len(rows)
    header = [c.strip() for c in ours[0].strip("|").split("|")]
    for name in header:  # every column is explained, in words
        assert re.search(rf"^- \*\*{re.escape(name)}\*\*: \w.{{20,}}", text, re.M), name
    assert "seed" not in text.lower()
    for r, line in zip(rows, ours[1:]):  # the benchmark's figures, cell for cell
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:3] == [r["index"], r["workload"], "4"] and cells[7] == f"{r['nbytes_per_msg']:.3f}"
        if r["rss_growth"] < 2**20:
            assert cells[8] == "< 1 MB"
        else:
            assert cells[8] == f"{r['rss_per_msg']:.3f}"
    tb = [c.strip() for c in ours[1].strip("|").split("|")]
    assert tb[10] == f"{bench.seed_estimate(4, 10, 50_000):.3f}" and tb[11] == "20.48"


@pytest.mark.spark
@needs_spark
def test_sweep_runs_the_grid_as_spark_tasks(spark):
    from nacktracker.pipeline.sweep import grid, run_sweep, table

    configs = grid([1, 8], [8], [50_000], [1.0, 0.1], ["TimeBucketIndex", "DictIndex"], 20_000)
    rows = run_sweep(spark, configs)
    assert [(r["index"], r["x"], r["share"]) for r in rows] == [(c.index, c.x, c.share) for c in configs]
    tb = {(r["x"], r["workload"]): r for r in rows if r["index"] == "TimeBucketIndex"}
    assert tb[(8, "sequential")]["nbytes_per_msg"] < tb[(1, "sequential")]["nbytes_per_msg"]
    assert all(r["rss_growth"] > 0 for r in rows if r["index"] == "DictIndex")
    text = table(rows)
    assert sum(line.startswith("| ") for line in text.splitlines()) == len(rows) + 1
    assert "| 2.000 |" in text  # seed 000's estimate for x=1, y=8


def test_a_failing_measurement_brings_its_child_s_stderr():
    """The child's own error reaches the user: in the exception, and found again in Spark's wrapping of it."""
    from nacktracker.pipeline.sweep import SweepConfig, child_failure, measure_fresh

    with pytest.raises(RuntimeError) as info:
        measure_fresh(SweepConfig("NoSuchIndex", 1, 8, 50_000, 1.0, 100))
    message = str(info.value)
    assert "exit status 1" in message and "NoSuchIndex" in message.split("its stderr ends:", 1)[1], message
    wrapped = RuntimeError(f"[PYTHON_EXCEPTION] Traceback (most recent call last):\n  File ...\n"
                           f"RuntimeError: {message}\n SQLSTATE: 38000\n\tat org.apache.spark...")
    assert child_failure(wrapped) == message.rsplit("\n", 1)[0]
    assert child_failure(RuntimeError("something else")) is None


def test_measuring_from_the_checkout_s_parent_folder_imports_the_installed_package(tmp_path, monkeypatch):
    """Run from the folder that holds a checkout named ``nacktracker`` (as README clones it), the child must
    not import that folder as a namespace package."""
    from nacktracker.pipeline.sweep import SweepConfig, measure_fresh

    (tmp_path / "nacktracker").symlink_to(ROOT, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    row = measure_fresh(SweepConfig("TimeBucketIndex", 1, 8, 50_000, 1.0, 1000))
    assert row["messages"] == 1000 and row["index"] == "TimeBucketIndex"


@pytest.mark.spark
@pytest.mark.slow
@needs_spark
def test_sweep_runs_from_the_checkout_s_parent_folder(tmp_path):
    """``nacktracker sweep`` as a user types it, in the folder holding the checkout: the table, exit 0."""
    (tmp_path / "nacktracker").symlink_to(ROOT, target_is_directory=True)
    command = Path(sys.executable).parent / "nacktracker"
    marker = f"NACKTRACKER_TEST_MARK={uuid.uuid4().hex}"
    done = subprocess.run([str(command), "sweep", "--x", "1", "--y", "8", "--shares", "1", "--messages", "1000",
                           "--master", "local[1]", "--driver-memory", "1g", "--quiet"], cwd=tmp_path,
                          env=dict(os.environ, **dict([marker.split("=")])), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| TimeBucketIndex | sequential | 1 | 8 (256 ms) | 1,000 |" in done.stdout
    if os.path.isdir("/proc"):  # nothing it started outlives it
        assert _processes_with(marker) == []


# -- traces whose files disagree ------------------------------------------------------------

@pytest.mark.spark
@needs_spark
def test_a_directory_mixing_file_schemas_names_the_file_and_column(spark, tmp_path, capsys):
    from nacktracker.pipeline.cli import main
    from nacktracker.pipeline.plan import run_plan

    folder = tmp_path / "mixed"
    folder.mkdir()
    pq.write_table(pa.table(good_table()), folder / "a.parquet")
    bad = good_table()
    bad["ledger_id"] = [str(v) for v in bad["ledger_id"]]
    pq.write_table(pa.table(bad), folder / "b.parquet")
    with pytest.raises(ColumnTypeError, match=r"mixed/b\.parquet: column 'ledger_id' must hold integers, found string"):
        run_plan(spark, str(folder), [0])
    assert main(["plan", str(folder), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "b.parquet: column 'ledger_id'" in err[0]


@pytest.mark.spark
@needs_spark
def test_integer_widths_may_differ_between_files(spark, tmp_path):
    from nacktracker.pipeline.plan import run_plan

    folder = tmp_path / "widths"
    folder.mkdir()
    pq.write_table(pa.table(good_table()), folder / "a.parquet")  # int64 from Python ints
    narrow = pa.table(good_table()).cast(pa.schema([
        ("ts_ms", pa.int64()), ("kind", pa.string()), ("ledger_id", pa.int32()), ("entry_id", pa.int32()),
        ("delay_ms", pa.int32()), ("consumer", pa.string())]))
    pq.write_table(narrow, folder / "b.parquet")
    result = run_plan(spark, str(folder), [0])
    assert result.consumers["nacks"].tolist() == [10]
    assert result.consumers["peak_pending"].tolist() == [5]  # a's and b's messages are the same 5


@pytest.mark.spark
@needs_spark
def test_stale_spark_schema_metadata_is_not_trusted(spark, tmp_path):
    """A Spark-written file rewritten with pyarrow keeps Spark's schema in its
    metadata; a column dropped since must be reported missing, not null."""
    from nacktracker.pipeline.plan import run_plan

    folder = tmp_path / "stale"
    cols = good_table()
    spark.createDataFrame(list(zip(*cols.values())), "ts_ms long, kind string, ledger_id long, entry_id long, "
                          "delay_ms long, consumer string").coalesce(1).write.parquet(str(folder))
    (written,) = [p for p in folder.iterdir() if p.suffix == ".parquet"]
    table = pq.read_table(written)
    assert b"org.apache.spark.sql.parquet.row.metadata" in table.schema.metadata
    pq.write_table(table.drop_columns(["delay_ms"]), written)  # the metadata goes along
    with pytest.raises(MissingColumnError, match=rf"{written.name}: missing column 'delay_ms'"):
        run_plan(spark, str(folder), [0])
    table = table.set_column(table.schema.get_field_index("entry_id"), "entry_id",
                             pa.array([str(v) for v in good_table()["entry_id"]]))
    pq.write_table(table, written)
    with pytest.raises(ColumnTypeError, match=rf"{written.name}: column 'entry_id' must hold integers"):
        run_plan(spark, str(folder), [0])
