"""``nacktracker plan``: size trackers from a nack event log, per consumer and
fleet-wide, for every candidate ``precision_bits``.

The Spark job, end to end:

1. read the log and check it (:mod:`.load`): one aggregation pass, which also
   counts events per consumer;
2. keep the ``nack`` rows, number the consumers and spread them over
   partitions by size (largest first onto the emptiest partition), so each
   task gets whole consumers and the tasks weigh about the same;
3. shuffle once (``repartitionById`` on that number) and sort within each
   partition by ``(consumer, ledger, entry, due)`` — the only sort;
4. ``mapInArrow``: a task streams its sorted rows, and for each consumer runs
   :func:`~nacktracker.pipeline.pending.analyse_consumer` for every bits value
   in the same pass (numpy sweep for the exact peak, pyroaring bitmaps for the
   memory), emitting one row per (consumer, bits) with the error histogram;
5. the driver collects those small rows; the fleet's error histogram is summed
   in Spark (one row per distinct error value).

Why whole consumers per task: the peak of pending nacks is a property of a
consumer's whole timeline, and so is the set of messages pending at that
peak; a task that holds one consumer's rows computes both exactly in one
pass, with no second shuffle. A task holds one consumer at a time (about 100
bytes per nack, in the Python worker); thousands of consumers spread over as
many tasks as the cluster has cores. One consumer with more nacks than a
worker can hold (50 M nacks: ~5 GB) needs a shorter trace window.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..events import EmptyTraceError
from . import DEFAULT_BITS, DEFAULT_MAX_EARLY_MS
from .load import TraceSummary, load_trace
from .memory_model import IndexCosts
from .progress import Progress
from .spark import default_parallelism, quiet_pandas_check

__all__ = ["PlanResult", "run_plan", "recommend", "DEFAULT_BITS", "DEFAULT_MAX_EARLY_MS"]


#: Per (consumer, bits) columns the kernel returns, besides cid, bits and the histogram.
_COUNTS = ("nacks", "occurrences", "immediate", "merged", "peak_pending", "peak_at_ms", "buckets",
           "bitmaps", "ledgers", "roaring_bytes", "index_bytes", "dict_index_bytes")
_QUANTILES = ((0.5, "err_p50"), (0.9, "err_p90"), (0.99, "err_p99"), (1.0, "err_max"))
_RESULT_SCHEMA = ", ".join(
    ["cid int", "bits int"] + [f"{c} long" for c in _COUNTS] + [f"{q} long" for _, q in _QUANTILES]
    + ["err_mean double", "kernel_s double", "err_values array<long>", "err_counts array<long>"])


@dataclass
class PlanResult:
    """Everything the report shows; the tables are pandas DataFrames."""

    trace: TraceSummary
    bits: tuple[int, ...]
    rounding: str
    max_early_ms: float
    consumers: "object"        # pandas: one row per (consumer, bits)
    fleet: "object"            # pandas: one row per bits
    fleet_errors: "object"     # pandas: bits, error_ms, nacks
    recommended: Optional[int]  # fleet-wide bits, None when no candidate meets the bound
    costs: IndexCosts
    master: str
    partitions: int
    seconds: dict[str, float] = field(default_factory=dict)


@functools.lru_cache(maxsize=1)
def measured_costs() -> IndexCosts:
    """:meth:`IndexCosts.measure`, once per process (about 1-2 s)."""
    return IndexCosts.measure()


def recommend(p99_by_bits: dict[int, float], max_early_ms: float) -> Optional[int]:
    """The largest bits whose p99 redelivery error is within ``max_early_ms``."""
    ok = [b for b, p99 in p99_by_bits.items() if p99 <= max_early_ms]
    return max(ok) if ok else None


def _assign_partitions(sizes: dict[int, int], partitions: int) -> dict[int, int]:
    """Consumer id -> partition: largest first onto the lightest partition (LPT)."""
    load = [0] * partitions
    out = {}
    for cid, n in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        p = min(range(partitions), key=load.__getitem__)
        out[cid] = p
        load[p] += n
    return out


def _lookup(key, mapping: dict, type_name: str):
    """``mapping[key]`` as a Spark expression (a literal map: no join, no shuffle)."""
    from pyspark.sql import functions as F

    pairs = []
    for k, v in mapping.items():
        pairs += [F.lit(k), F.lit(v).cast(type_name)]
    return F.create_map(*pairs)[key]


def _consumers(batches):
    """Split a partition's Arrow batches, sorted by cid, into one consumer at a
    time: yields ``(cid, [ledger_id, entry_id, ts_ms, due])`` numpy arrays."""
    import numpy as np

    current, parts = None, []
    for batch in batches:
        cid = batch.column("cid").to_numpy()
        cols = [batch.column(c).to_numpy() for c in ("ledger_id", "entry_id", "ts_ms", "due")]
        cuts = np.flatnonzero(cid[1:] != cid[:-1]) + 1  # where the consumer changes
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(cid)]):
            if lo == hi:
                continue
            c = int(cid[lo])
            if c != current and parts:
                yield current, _concat(parts)
            current = c
            parts.append([col[lo:hi] for col in cols])
    if parts:
        yield current, _concat(parts)


def _concat(parts: list) -> list:
    """Concatenate and empty ``parts`` (the Arrow batches go before the kernel allocates)."""
    import numpy as np

    cols = [np.concatenate([p[k] for p in parts]) for k in range(4)]
    parts.clear()
    return cols


def _result_batch(cid: int, results, seconds: float):
    """One Arrow batch: a row per bits for one consumer."""
    import pyarrow as pa

    rows: dict[str, list] = {"cid": [cid] * len(results), "bits": [r.bits for r in results]}
    for name in _COUNTS:
        rows[name] = [getattr(r, name) for r in results]
    for q, name in _QUANTILES:
        rows[name] = [r.error_quantile(q) for r in results]
    rows["err_mean"] = [float((r.err_values * r.err_counts).sum() / max(1, int(r.err_counts.sum())))
                        for r in results]
    rows["kernel_s"] = [seconds / len(results)] * len(results)
    rows["err_values"] = [r.err_values for r in results]
    rows["err_counts"] = [r.err_counts for r in results]
    ints = [(n, pa.int64()) for n in (*_COUNTS, *(q for _, q in _QUANTILES))]
    schema = pa.schema([("cid", pa.int32()), ("bits", pa.int32()), *ints, ("err_mean", pa.float64()),
                        ("kernel_s", pa.float64()), ("err_values", pa.list_(pa.int64())),
                        ("err_counts", pa.list_(pa.int64()))])
    return pa.RecordBatch.from_pydict(rows, schema=schema)


def _make_kernel(bits: Sequence[int], costs: IndexCosts, rounding: str):
    """The mapInArrow function: sorted (cid, ledger, entry, ts, due) batches ->
    one row per (consumer, bits). Runs in the executors' Python workers."""
    bits = tuple(bits)

    def kernel(batches):
        from nacktracker.pipeline.pending import analyse_consumer

        for cid, cols in _consumers(batches):
            started = time.perf_counter()
            results = analyse_consumer(*cols, bits_list=bits, costs=costs, rounding=rounding)
            yield _result_batch(cid, results, time.perf_counter() - started)

    return kernel


def run_plan(spark, trace: str, bits: Sequence[int] = DEFAULT_BITS, *,
             max_early_ms: float = DEFAULT_MAX_EARLY_MS, rounding: str = "floor",
             fmt: str = "auto", partitions: Optional[int] = None, progress=None) -> PlanResult:
    """Run the whole plan job on ``trace``; return the tables for the report.

    Raises :class:`~nacktracker.events.TraceError` for unusable traces.
    Cost: two scans of the log, one shuffle + sort of its nack rows, and the
    per-consumer kernel (see :mod:`.pending`).
    """
    from pyspark.sql import functions as F

    bits = tuple(sorted(set(int(b) for b in bits)))
    if not bits or min(bits) < 0 or max(bits) > 30:
        raise ValueError(f"bits must be between 0 and 30, got {bits}")
    if rounding not in ("floor", "ceil"):
        raise ValueError(f"rounding must be 'floor' or 'ceil', got {rounding!r}")
    progress = progress or Progress("plan", enabled=False)
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    with progress.phase("validate", f"checking {trace} (one scan)"):
        events, summary = load_trace(spark, trace, fmt)
    seconds["validate"] = time.perf_counter() - t0
    if summary.nacks == 0:
        raise EmptyTraceError(f"{trace}: no 'nack' events (found {summary.kinds})", "kind")
    costs = measured_costs()

    names = sorted(c for c, s in summary.consumers.items() if s["nacks"])
    parts = partitions or min(len(names), 4 * default_parallelism(spark))
    nacks = _sorted_nacks(spark, events, names, summary, parts)
    with quiet_pandas_check():
        results = nacks.mapInArrow(_make_kernel(bits, costs, rounding), _RESULT_SCHEMA).persist()

    t1 = time.perf_counter()
    with progress.phase("analyse", f"{summary.nacks:,} nacks of {len(names):,} consumers: shuffle, sort, "
                                   f"{len(bits)} bits per consumer in {parts} tasks"):
        rows = _to_pandas(results.drop("err_values", "err_counts"))
    seconds["analyse"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    fleet_errors = (results.select("bits", F.explode(F.arrays_zip("err_values", "err_counts")).alias("h"))
                    .groupBy("bits", F.col("h.err_values").alias("error_ms"))
                    .agg(F.sum("h.err_counts").alias("nacks"))
                    .orderBy("bits", "error_ms"))
    with progress.phase("fleet", "error histogram over all nacks"):
        fleet_errors = _to_pandas(fleet_errors)
    results.unpersist()
    seconds["fleet"] = time.perf_counter() - t2

    rows.insert(0, "consumer", rows["cid"].map(dict(enumerate(names))))  # cid = index in sorted names
    rows = rows.drop(columns=["cid"]).sort_values(["consumer", "bits"]).reset_index(drop=True)
    rows["bytes_per_pending"] = rows["index_bytes"] / rows["peak_pending"].where(rows["peak_pending"] > 0)
    # each consumer's own recommendation: its largest bits within the bound
    best = rows[rows["err_p99"] <= max_early_ms].groupby("consumer")["bits"].max()
    rows["recommended"] = rows["bits"] == rows["consumer"].map(best)
    fleet = _fleet(rows, fleet_errors, bits)
    recommended = recommend(dict(zip(fleet["bits"], fleet["err_p99"])), max_early_ms)
    seconds["total"] = time.perf_counter() - t0
    master = spark.sparkContext.master
    return PlanResult(trace=summary, bits=bits, rounding=rounding, max_early_ms=max_early_ms,
                      consumers=rows, fleet=fleet, fleet_errors=fleet_errors, recommended=recommended,
                      costs=costs, master=master, partitions=parts, seconds=seconds)


def _sorted_nacks(spark, events, names: list[str], summary: TraceSummary, parts: int):
    """The nack rows as ``(cid, ledger_id, entry_id, ts_ms, due)``, each
    consumer whole in one of ``parts`` partitions, sorted by
    ``(cid, ledger_id, entry_id, due)``: one shuffle, one sort."""
    from pyspark.sql import functions as F

    cids = {name: i for i, name in enumerate(names)}
    pid = _assign_partitions({cids[n]: summary.consumers[n]["nacks"] for n in names}, parts)
    nacks = events.where(F.col("kind") == "nack")
    due = (F.col("ts_ms") + F.col("delay_ms")).alias("due")
    if len(names) <= 64:  # a literal map lookup per row: no join, no extra column shuffled
        nacks = nacks.select(_lookup(F.col("consumer"), cids, "int").alias("cid"),
                             "ledger_id", "entry_id", "ts_ms", due)
        where = _lookup(F.col("cid"), {cids[n]: pid[cids[n]] for n in names}, "int")
    else:  # a literal map is a linear scan per row: join a broadcast table instead
        codes = spark.createDataFrame([(n, cids[n], pid[cids[n]]) for n in names],
                                      "consumer string, cid int, pid int")
        nacks = (nacks.join(F.broadcast(codes), "consumer")
                 .select("pid", "cid", "ledger_id", "entry_id", "ts_ms", due))
        where = F.col("pid")
    if hasattr(nacks, "repartitionById"):  # Spark >= 4.1: exactly the partition we chose
        nacks = nacks.repartitionById(parts, where)
    else:  # older Spark: hash partitioning, a little less even
        nacks = nacks.repartition(parts, where)
    return nacks.sortWithinPartitions("cid", "ledger_id", "entry_id", "due")


def _to_pandas(df):
    """A small result table as pandas, via ``collect`` (PySpark's own conversion
    warns about pandas 3 on every call)."""
    import pandas as pd

    return pd.DataFrame.from_records([tuple(r) for r in df.collect()], columns=df.columns)


def _fleet(rows, fleet_errors, bits):
    """Per-bits fleet totals (sums of per-consumer peaks) and fleet error quantiles."""
    import pandas as pd

    from .pending import quantile

    agg = rows.groupby("bits").agg(
        consumers=("consumer", "nunique"), nacks=("nacks", "sum"), peak_pending=("peak_pending", "sum"),
        index_bytes=("index_bytes", "sum"), roaring_bytes=("roaring_bytes", "sum"),
        dict_index_bytes=("dict_index_bytes", "sum"), bitmaps=("bitmaps", "sum")).reset_index()
    qs = []
    for b in agg["bits"]:
        h = fleet_errors[fleet_errors["bits"] == b]
        v, c = h["error_ms"].to_numpy(), h["nacks"].to_numpy()
        total = c.sum()
        qs.append({"bits": b, "err_p50": quantile(v, c, 0.5, True), "err_p90": quantile(v, c, 0.9, True),
                   "err_p99": quantile(v, c, 0.99, True), "err_max": quantile(v, c, 1.0, True),
                   "err_mean": float((v * c).sum() / total) if total else 0.0})
    fleet = agg.merge(pd.DataFrame(qs), on="bits")
    fleet["bytes_per_pending"] = fleet["index_bytes"] / fleet["peak_pending"].where(fleet["peak_pending"] > 0)
    fleet["dict_over_index"] = fleet["dict_index_bytes"] / fleet["index_bytes"]
    return fleet
