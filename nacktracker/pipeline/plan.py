"""``nacktracker plan``: size trackers from a nack event log, per consumer and
fleet-wide, for every candidate ``precision_bits``.

The Spark job, end to end:

1. read the log and check it (:mod:`.load`): one aggregation pass, which also
   counts events per consumer; for a local Parquet log each task reads its
   row groups itself with pyarrow (:func:`~.load.parquet_tasks`);
2. number the consumers and spread those of at most :data:`STREAM_NACKS`
   nacks over partitions by size (largest first onto the emptiest
   partition), so each task gets whole consumers and the tasks weigh about
   the same;
3. map side: the ``nack`` rows, only the columns the kernel reads, two
   32-bit values to an int64 when they fit (:func:`_layout`), reach Python
   once and leave it packed (:func:`_pack`): a row per (batch, consumer)
   holding its values as raw bytes. A local Parquet log is read by the tasks
   with pyarrow, ~2M rows each (:func:`_make_file_packer`: columnar from
   the file, no row converted between Spark and Arrow, which is most of
   what moving a row through Spark costs); any other log by Spark
   (:func:`_make_packer`);
4. shuffle the packed rows once (``repartitionById`` on the partition chosen
   in 2); ``mapInArrow``: a task gathers its consumers' rows
   (:func:`_packed_groups`) and runs
   :func:`~nacktracker.pipeline.pending.analyse_group` on groups of whole
   consumers (:data:`GROUP_ROWS` nacks) for every bits value (one numpy sort
   of the group by ``(consumer, ledger, entry, due)`` when not in that order
   already, numpy sweeps for the exact peaks, pyroaring bitmaps for the
   memory), emitting one row per (consumer, bits) and the group's error
   histogram; a consumer above :data:`STREAM_NACKS` gets a partition of its
   own, sorted by time in Spark (external sort), and its task reads it a
   chunk at a time (:class:`~nacktracker.pipeline.stream.ConsumerStream`:
   what is pending and a chunk held, never the consumer);
5. the driver collects those small rows (the series of each group's busiest
   consumers and the group's total, not every consumer's); the fleet's error
   histogram is the sum of the groups'.

Why whole consumers per task: the peak of pending nacks is a property of a
consumer's whole timeline, and so is the set of messages pending at that
peak; a task that holds one consumer's rows computes both exactly in one
pass, with no second shuffle — up to a size a worker holds comfortably
(docs/pipeline.md, "How big a log it plans", has the bytes per nack); past
it, time order makes one pass enough with only the pending set in memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Sequence

from ..events import EmptyTraceError
from . import DEFAULT_BITS, DEFAULT_MAX_EARLY_MS
from .caches import cached_costs
from .load import ReadTask, TraceSummary, load_trace, parquet_tasks
from .memory_model import IndexCosts
from .pending import LIST_COLUMNS, SCALAR_COLUMNS, Grid
from .progress import Progress
from .spark import default_parallelism, quiet_pandas_check

if TYPE_CHECKING:  # pandas, pyarrow and pyspark are imported where they are used (the `spark` extra)
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

    #: A mapInArrow function: Arrow batches in, Arrow batches out.
    ArrowKernel = Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]

__all__ = ["PlanResult", "run_plan", "recommend", "DEFAULT_BITS", "DEFAULT_MAX_EARLY_MS"]


#: The kernel's output: a row per (consumer, bits) with pending.SCALAR_COLUMNS and
#: the series, and a row per (group, bits) with cid -1 holding the group's error
#: histogram (the fleet's is their sum: small, however many consumers).
_HISTOGRAM = ("hist_values", "hist_counts")
_RESULT_SCHEMA = ", ".join(
    ["cid int", "bits int"] + [f"{c} long" for c in SCALAR_COLUMNS]
    + ["err_mean double", "kernel_s double"] + [f"{c} array<long>" for c in (*LIST_COLUMNS, *_HISTOGRAM)])
#: Rows per kernel call: whole consumers are gathered until a group holds this
#: many nacks (one consumer larger than that is a group of its own).
GROUP_ROWS = 1 << 20
#: Samples of pending over time, per consumer (the report's series and plot).
SERIES_BINS = 200
#: Consumers per group and bits whose series come back to the driver (the
#: busiest, by peak); the fleet's total comes back whole, summed per group. So
#: what the driver collects does not grow with the number of consumers.
SERIES_TOP = 16


@dataclass
class PlanResult:
    """Everything the report shows; the tables are pandas DataFrames."""

    trace: TraceSummary
    bits: tuple[int, ...]
    rounding: str
    max_early_ms: float
    consumers: pd.DataFrame     # one row per (consumer, bits)
    fleet: pd.DataFrame         # one row per bits
    fleet_errors: pd.DataFrame  # bits, error_ms, nacks
    recommended: Optional[int]  # fleet-wide bits, None when no candidate meets the bound
    costs: IndexCosts
    master: str
    partitions: int
    seconds: dict[str, float] = field(default_factory=dict)
    series: Optional[pd.DataFrame] = None  # consumer, bits, t_ms, pending_at, pending_max (series_bits only;
    #                            the busiest consumers: SERIES_TOP per group of each task)
    series_bits: Optional[int] = None
    fleet_series: Optional[pd.DataFrame] = None  # bits, t_ms, pending_at summed over every consumer


def measured_costs() -> IndexCosts:
    """:func:`~.calibration.measure_index_costs`, once per process, and read from the cache
    of an earlier run measured with the same code and libraries
    (:func:`~.caches.cached_costs`: ~20 ms; measuring is 2-3 s)."""
    costs: IndexCosts = cached_costs()
    return costs


def recommend(p99_by_bits: dict[int, float], max_early_ms: float) -> Optional[int]:
    """The largest bits whose p99 redelivery error is within ``max_early_ms``."""
    ok = [b for b, p99 in p99_by_bits.items() if p99 <= max_early_ms]
    return max(ok) if ok else None


def _assign_partitions(sizes: dict[int, int], partitions: int) -> dict[int, int]:
    """Consumer id -> partition: largest first onto the lightest partition (LPT;
    ties to the lowest partition number). Runtime: O(c log c + c log p)."""
    import heapq

    heap = [(0, p) for p in range(partitions)]
    out = {}
    for cid, n in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        load, p = heapq.heappop(heap)
        out[cid] = p
        heapq.heappush(heap, (load + n, p))
    return out


def _lookup(key: Column, mapping: dict[Any, Any], type_name: str) -> Column:
    """``mapping[key]`` as a Spark expression (a literal map: no join, no shuffle)."""
    from pyspark.sql import functions as F

    pairs: list[Column] = []
    for k, v in mapping.items():
        pairs += [F.lit(k), F.lit(v).cast(type_name)]
    return F.create_map(*pairs)[key]


_INT32_MAX = (1 << 31) - 1


#: The kernel's columns when two 31-bit values share one int64 (:func:`_narrow_columns`).
_PACKED = {"ids": ("ledger_id", "entry_id"), "times": ("ts_ms", "due")}


def _layout(summary: TraceSummary, first_ms: int, last_ms: int) -> tuple[bool, Optional[int]]:
    """How narrow the kernel's columns can be: ``(narrow_ids, base_ms)``.
    ``narrow_ids``: every ``ledger_id`` and ``entry_id`` is below 2^31, so
    they share one int64 (``ids``: ledger in the high half). ``base_ms``: when
    the trace spans less than 24 days, the times are milliseconds since it
    and the nack time and due time share one int64 (``times``: the nack time
    high, so ``times`` sorts in time order); None otherwise."""
    narrow_ids = all((top := summary.maxima.get(c)) is not None and top <= _INT32_MAX
                     for c in ("ledger_id", "entry_id"))
    return narrow_ids, (int(first_ms) if last_ms - first_ms <= _INT32_MAX else None)


def _narrow_columns(summary: TraceSummary, first_ms: int, last_ms: int) -> tuple[list[Column], int, str]:
    """The columns the kernel reads as Spark expressions, as narrow as
    :func:`_layout` allows, the base to add back to the times and the column
    that orders a consumer's rows in time. A row is then two or three 8-byte
    fields instead of five, and as many Arrow columns reach Python
    (:func:`_unpacked` takes them apart). Returns ``(columns, base_ms,
    time_column)``."""
    from pyspark.sql import functions as F

    narrow_ids, base = _layout(summary, first_ms, last_ms)
    due = F.col("ts_ms") + F.col("delay_ms")
    cols = ([F.shiftleft(F.col("ledger_id").cast("long"), 32).bitwiseOR(F.col("entry_id").cast("long")).alias("ids")]
            if narrow_ids else [F.col("ledger_id"), F.col("entry_id")])
    if base is not None:
        ts = F.col("ts_ms").cast("long") - F.lit(base)
        return cols + [F.shiftleft(ts, 32).bitwiseOR(due - F.lit(base)).alias("times")], base, "times"
    return cols + [F.col("ts_ms"), due.alias("due")], 0, "ts_ms"


def _narrowed(ledger: np.ndarray[Any, Any], entry: np.ndarray[Any, Any], ts: np.ndarray[Any, Any],
              due: np.ndarray[Any, Any], narrow_ids: bool, base_ms: Optional[int]) -> dict[str, np.ndarray[Any, Any]]:
    """:func:`_narrow_columns` in numpy: the kernel's columns by name from int64 arrays."""
    out = {"ids": (ledger << 32) | entry} if narrow_ids else {"ledger_id": ledger, "entry_id": entry}
    if base_ms is not None:
        out["times"] = ((ts - base_ms) << 32) | (due - base_ms)
    else:
        out.update(ts_ms=ts, due=due)
    return out


def _unpacked(named: dict[str, np.ndarray[Any, Any]], base_ms: int) -> list[np.ndarray[Any, Any]]:
    """``ledger_id, entry_id, ts_ms, due`` as int64 numpy arrays from the
    kernel's columns by name, the packed pairs (:data:`_PACKED`) taken apart
    and the times back in epoch milliseconds."""
    import numpy as np

    out: list[np.ndarray[Any, Any]] = []
    for packed, (high, low) in _PACKED.items():
        if packed in named:
            both = named[packed]
            pair = [both >> 32, both & 0xFFFFFFFF]
        else:
            pair = [named[high].astype(np.int64), named[low].astype(np.int64)]
        if packed == "times" and base_ms:
            for a in pair:
                a += base_ms
        out += pair
    return out


def _int64(batch: pa.RecordBatch, base_ms: int) -> list[np.ndarray[Any, Any]]:
    """``cid, ledger_id, entry_id, ts_ms, due`` of an Arrow batch as int64 numpy
    arrays (:func:`_unpacked`)."""
    import numpy as np

    named = {name: batch.column(name).to_numpy() for name in batch.schema.names if name != "cid"}
    return [batch.column("cid").to_numpy().astype(np.int64, copy=False), *_unpacked(named, base_ms)]


#: The schema of the packed rows crossing the shuffle (:func:`_make_packer`).
_PACKED_SCHEMA = "pid int, cid int, rows int, data binary"


def _pack(cid: np.ndarray[Any, Any], named: dict[str, np.ndarray[Any, Any]], names: Sequence[str],
          partition_of: np.ndarray[Any, Any]) -> Optional[pa.RecordBatch]:
    """Rows of several consumers as packed rows: one per consumer, with its
    partition ``pid`` (``partition_of[cid]``), ``cid``, its number of rows and
    ``data``, its rows' values (``named[n]`` for ``n`` in ``names``) as raw
    int64 bytes, one column after the other. None for no rows. Runtime: one
    stable argsort of ``cid`` and a copy of the values."""
    import numpy as np
    import pyarrow as pa

    n = len(cid)
    if n == 0:
        return None
    order = np.argsort(cid, kind="stable")
    cid = cid[order]
    starts = np.flatnonzero(np.r_[True, cid[1:] != cid[:-1]])
    counts = np.diff(np.r_[starts, n])
    width = len(names)
    matrix = np.empty((width, n), dtype=np.int64)
    for k, name in enumerate(names):
        matrix[k] = named[name][order]
    # consumer after consumer, each its columns one after the other
    data = np.concatenate([matrix[:, s:s + c].reshape(-1) for s, c in zip(starts.tolist(), counts.tolist())])
    offsets: Any = np.r_[0, np.cumsum(counts * (8 * width))].astype(np.int32)
    values: Any = data  # pyarrow-stubs: an ndarray is no SupportPyBuffer
    blobs = pa.Array.from_buffers(pa.binary(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(values)])
    owners = cid[starts]
    return pa.RecordBatch.from_arrays(
        [pa.array(partition_of[owners].astype(np.int32)), pa.array(owners.astype(np.int32)),
         pa.array(counts.astype(np.int32)), blobs], names=["pid", "cid", "rows", "data"])


def _make_packer(pid_of: Sequence[int], names: Sequence[str]) -> ArrowKernel:
    """The map-side mapInArrow function of the shuffle when Spark reads the
    log: ``cid`` and the kernel's ``names`` columns (:func:`_narrow_columns`)
    in, packed rows (:func:`_pack`) out: one per (Arrow batch, consumer). So
    the shuffle moves a few rows of about a hundred kilobytes each instead of
    a row per nack."""
    partition_of = list(pid_of)
    value_names = tuple(names)

    def pack(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import numpy as np

        lookup = np.asarray(partition_of, dtype=np.int32)
        for batch in batches:
            out = _pack(batch.column("cid").to_numpy(), {n: batch.column(n).to_numpy() for n in value_names},
                        value_names, lookup)
            if out is not None:
                yield out

    return pack


#: Rows per Arrow batch read from a Parquet row group by :func:`_make_file_packer`.
_READ_ROWS = 1 << 20


def _make_file_packer(tasks: Sequence[ReadTask], cid_of: dict[str, int], pid_of: Sequence[int],
                      narrow_ids: bool, base_ms: Optional[int]) -> ArrowKernel:
    """The map-side mapInArrow function when the log is local Parquet: the
    ids of ``spark.range`` in (task numbers), packed rows (:func:`_pack`) out.
    Each task reads its row groups (:func:`~.load.parquet_tasks`) itself with
    pyarrow (``consumer``, ``kind``, ``ledger_id``, ``entry_id``, ``ts_ms``,
    ``delay_ms``), a batch at a time, keeping the nacks of the consumers in
    ``cid_of``: columnar from the file to numpy, with no row of the log
    converted from Spark's rows to Arrow (that conversion is most of what
    moving a row costs). Values were validated by :func:`~.load.summarize`
    before."""
    partition_of = list(pid_of)
    work = list(tasks)
    chosen = dict(cid_of)

    def pack(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq

        from nacktracker.pipeline.load import UNNAMED

        lookup = np.asarray(partition_of, dtype=np.int32)
        wanted = pa.array(list(chosen), pa.string())
        codes = np.asarray(list(chosen.values()), dtype=np.int64)
        columns = ["consumer", "kind", "ledger_id", "entry_id", "ts_ms", "delay_ms"]
        for batch in batches:
            for number in batch.column("id").to_numpy().tolist():
                for path, groups in work[number]:
                    pf = pq.ParquetFile(path, read_dictionary=["consumer", "kind"])
                    for rb in pf.iter_batches(batch_size=_READ_ROWS, row_groups=groups, columns=columns):
                        keep = _codes_of(rb.column("kind"), pa.array(["nack"]), np.zeros(1, dtype=np.int64)) == 0
                        cid = _codes_of(rb.column("consumer"), wanted, codes, UNNAMED)  # every file has it (checked)
                        keep &= cid >= 0
                        if not keep.any():
                            continue
                        at = np.flatnonzero(keep)
                        ints = {c: np.asarray(rb.column(c).to_numpy(zero_copy_only=False)).astype(np.int64, copy=False)[at]
                                for c in ("ledger_id", "entry_id", "ts_ms", "delay_ms")}
                        named = _narrowed(ints["ledger_id"], ints["entry_id"], ints["ts_ms"],
                                          ints["ts_ms"] + ints["delay_ms"], narrow_ids, base_ms)
                        out = _pack(cid[at], named, tuple(named), lookup)
                        if out is not None:
                            yield out

    return pack


def _codes_of(column: Any, wanted: Any, codes: np.ndarray[Any, Any],
              null_as: Optional[str] = None) -> np.ndarray[Any, Any]:
    """``codes[i]`` for each value equal to ``wanted[i]``, -1 for any other
    value; a null counts as ``null_as``. A dictionary column is looked up once
    per distinct value. Runtime: O(rows + distinct values)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    def lookup(values: Any) -> np.ndarray[Any, Any]:
        if null_as is not None:
            values = pc.fill_null(values, null_as)
        if pa.types.is_large_string(values.type):
            values = values.cast(pa.string())
        at = pc.index_in(values, value_set=wanted).to_numpy(zero_copy_only=False)
        found = ~np.isnan(at) if at.dtype.kind == "f" else np.ones(len(at), dtype=bool)
        out = np.full(len(at), -1, dtype=np.int64)
        out[found] = codes[at[found].astype(np.int64)]
        return out

    if pa.types.is_dictionary(column.type):
        per_value = lookup(column.dictionary)
        indices = column.indices
        if indices.null_count:
            default = lookup(pa.array([None], pa.string()))[0] if null_as is not None else -1
            filled = pc.fill_null(indices, 0).to_numpy()
            out = per_value[filled] if len(per_value) else np.full(len(filled), -1, dtype=np.int64)
            out[~indices.is_valid().to_numpy(zero_copy_only=False)] = default
            return out
        return per_value[indices.to_numpy()] if len(per_value) else np.full(len(indices), -1, dtype=np.int64)
    return lookup(column)


def _packed_groups(batches: Iterable[pa.RecordBatch], names: Sequence[str], target_rows: int = GROUP_ROWS,
                   base_ms: int = 0) -> Iterator[list[np.ndarray[Any, Any]]]:
    """A partition's packed rows (:func:`_make_packer`, any order) gathered per
    consumer, then yielded in groups of whole consumers of about
    ``target_rows`` nacks, in consumer order: ``[cid, ledger_id, entry_id,
    ts_ms, due]`` int64 arrays. Holds the partition's packed values (8 bytes
    per value) and one group unpacked."""
    import numpy as np

    width = len(names)
    pieces: dict[int, list[np.ndarray[Any, Any]]] = {}
    for batch in batches:
        if batch.num_rows == 0:
            continue
        blobs: Any = batch.column("data")
        buffer: Any = blobs.buffers()[2]
        offsets = np.frombuffer(blobs.buffers()[1], dtype=np.int32)[blobs.offset:blobs.offset + len(blobs) + 1]
        for owner, rows, at in zip(batch.column("cid").to_numpy().tolist(), batch.column("rows").to_numpy().tolist(),
                                   offsets[:-1].tolist()):
            values = np.frombuffer(buffer, dtype=np.int64, count=width * rows, offset=at) if rows else \
                np.zeros(0, dtype=np.int64)
            pieces.setdefault(owner, []).append(values.reshape(width, rows))
    group: list[tuple[int, np.ndarray[Any, Any]]] = []
    rows = 0

    def flush() -> list[np.ndarray[Any, Any]]:
        cids = np.concatenate([np.full(m.shape[1], c, dtype=np.int64) for c, m in group])
        matrix = np.concatenate([m for _, m in group], axis=1)
        return [cids, *_unpacked(dict(zip(names, matrix)), base_ms)]

    for owner in sorted(pieces):
        matrix = np.concatenate(pieces.pop(owner), axis=1)
        group.append((owner, matrix))
        rows += matrix.shape[1]
        if rows >= target_rows:
            yield flush()
            group, rows = [], 0
    if group:
        yield flush()


def _result_batch(cols: dict[str, Any], seconds: float) -> pa.RecordBatch:
    """One Arrow batch of the kernel's rows: consumers × bits, then the group's
    histogram per bits (cid -1)."""
    import numpy as np
    import pyarrow as pa

    rows = len(cols["cid"])
    hists = cols["histograms"]
    bits = np.concatenate([cols["bits"], [b for b in dict.fromkeys(cols["bits"].tolist())]]).astype(np.int32)
    extra = len(hists)
    arrays: list[Any] = [pa.array(np.concatenate([cols["cid"], np.full(extra, -1)]).astype(np.int32)),
                         pa.array(bits)]
    arrays += [pa.array(np.concatenate([cols[c], np.zeros(extra, dtype=np.int64)]), pa.int64())
               for c in SCALAR_COLUMNS]
    nacks = cols["nacks"].astype(np.float64)
    share = nacks / nacks.sum() if rows else nacks  # the group's time, split by nacks
    arrays += [pa.array(np.concatenate([cols["err_mean"], np.zeros(extra)]), pa.float64()),
               pa.array(np.concatenate([seconds * share, np.zeros(extra)]), pa.float64())]
    # series: the group's busiest consumers per bits, and (histogram rows) the group's total at each instant
    bits_rows = cols["bits"]
    order_bits = list(dict.fromkeys(bits_rows.tolist()))
    keep = np.zeros(rows, dtype=bool)
    for b in order_bits:
        at = np.flatnonzero(bits_rows == b)
        keep[at[np.argsort(-cols["peak_pending"][at], kind="stable")[:SERIES_TOP]]] = True
    for c in LIST_COLUMNS:
        offsets, values = cols[c]
        bins = int(offsets[1] - offsets[0]) if rows else 0
        matrix = values.reshape(rows, bins)
        lengths = np.where(keep, bins, 0)
        total = [matrix[bits_rows == b].sum(axis=0) if c == "pending_at" else np.zeros(0, np.int64)
                 for b in order_bits]
        lengths = np.concatenate([lengths, [len(t) for t in total]])
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        flat = np.concatenate([matrix[keep].reshape(-1), *total]) if rows else np.zeros(0, np.int64)
        arrays.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.astype(np.int64), pa.int64())))
    for j in range(2):  # and the consumer rows empty histograms
        lengths = np.concatenate([np.zeros(rows, dtype=np.int64), [len(h[j]) for h in hists]])
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = np.concatenate([h[j] for h in hists]) if hists else np.zeros(0, dtype=np.int64)
        arrays.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64())))
    names = ["cid", "bits", *SCALAR_COLUMNS, "err_mean", "kernel_s", *LIST_COLUMNS, *_HISTOGRAM]
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _make_kernel(bits: Sequence[int], costs: IndexCosts, rounding: str, grid: Grid, names: Sequence[str],
                 base_ms: int = 0) -> ArrowKernel:
    """The reduce-side mapInArrow function: a partition's packed rows
    (:func:`_make_packer`, values ``names``) -> one row per (consumer, bits),
    a group of whole consumers (:func:`_packed_groups`) per kernel call. Runs
    in the executors' Python workers."""
    bits_list = tuple(bits)
    target_rows = GROUP_ROWS
    value_names = tuple(names)

    def kernel(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from nacktracker.pipeline.pending import analyse_group

        for group in _packed_groups(batches, value_names, target_rows, base_ms):
            started = time.perf_counter()
            cid, ledger_id, entry_id, ts_ms, due = group
            cols = analyse_group(cid, ledger_id, entry_id, ts_ms, due, bits_list=bits_list, costs=costs,
                                 rounding=rounding, grid=grid)
            yield _result_batch(cols, time.perf_counter() - started)

    return kernel


def _make_stream_kernel(bits: Sequence[int], costs: IndexCosts, rounding: str, grid: Grid,
                        chunk_rows: Optional[int] = None, base_ms: int = 0) -> ArrowKernel:
    """The mapInArrow function for consumers streamed in time order
    (:class:`~.stream.ConsumerStream`): ``(cid, ledger, entry, ts, due)``
    batches sorted by ``(cid, ts)`` -> one batch of rows per consumer, as
    :func:`_make_kernel` gives them. Holds one consumer's pending
    occurrences and a chunk, never the consumer whole."""
    bits_list = tuple(bits)

    def kernel(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import numpy as np

        from nacktracker.pipeline.stream import CHUNK_ROWS, ConsumerStream

        stream: Optional[ConsumerStream] = None
        cid: Optional[int] = None
        started = 0.0

        def done(stream: ConsumerStream) -> pa.RecordBatch:
            cols = stream.finish()
            cols["cid"] = np.full(len(cols["bits"]), cid, dtype=np.int64)
            return _result_batch(cols, time.perf_counter() - started)

        for batch in batches:
            if batch.num_rows == 0:
                continue
            cols = _int64(batch, base_ms)
            cuts = np.flatnonzero(np.diff(cols[0])) + 1
            for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(cols[0])].tolist()):
                if int(cols[0][lo]) != cid:
                    if stream is not None:
                        yield done(stream)
                    cid, started = int(cols[0][lo]), time.perf_counter()
                    stream = ConsumerStream(bits_list, costs, rounding, grid, chunk_rows=chunk_rows or CHUNK_ROWS)
                assert stream is not None  # made at the first row
                stream.feed(*(c[lo:hi] for c in cols[1:]))
        if stream is not None:
            yield done(stream)

    return kernel


#: A consumer with more nacks than this is streamed in time order
#: (:mod:`.stream`: memory O(pending + a chunk)) instead of analysed whole
#: (about 180 bytes per nack in the worker, docs/pipeline.md: about 3 GB at this size).
STREAM_NACKS = 1 << 24


def run_plan(spark: SparkSession, trace: str, bits: Sequence[int] = DEFAULT_BITS, *,
             max_early_ms: float = DEFAULT_MAX_EARLY_MS, rounding: str = "floor",
             fmt: str = "auto", partitions: Optional[int] = None, progress: Optional[Progress] = None,
             stream_nacks: Optional[int] = None) -> PlanResult:
    """Run the whole plan job on ``trace``; return the tables for the report.

    Raises :class:`~nacktracker.events.TraceError` for unusable traces.
    Cost: two scans of the log (the validation's reads four columns of a
    Parquet log with statistics, :func:`~.load.load_trace`), one shuffle of
    its nack rows, packed (:func:`_packed_nacks`), and the per-consumer
    kernel (see :mod:`.pending`).
    """
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
    # one time grid for every consumer's pending series: first nack to last fire
    first = min(summary.consumers[n]["first_ms"] for n in names)
    last = max(summary.consumers[n]["last_due_ms"] for n in names)
    last += (1 << max(bits)) if rounding == "ceil" else 1  # ceil fires up to a bucket after the due time
    grid = Grid.spanning(first, last, SERIES_BINS)
    # at least 4 tasks a core (no core idles long at the end), and tasks of at
    # most about GROUP_ROWS nacks but for one consumer larger than that alone
    limit = STREAM_NACKS if stream_nacks is None else stream_nacks
    big = [n for n in names if summary.consumers[n]["nacks"] > limit]
    whole = [n for n in names if summary.consumers[n]["nacks"] <= limit]
    whole_nacks = sum(summary.consumers[n]["nacks"] for n in whole)
    parts = partitions or min(len(whole), max(4 * default_parallelism(spark), -(-whole_nacks // GROUP_ROWS)))
    results: Optional[DataFrame] = None
    columns, base_ms, time_column = _narrow_columns(summary, first, last)
    with quiet_pandas_check():
        if whole:
            packed, value_names = _packed_nacks(spark, events, names, summary, max(1, parts), columns,
                                                _layout(summary, first, last), only=whole,
                                                tasks=parquet_tasks(trace, fmt))
            results = packed.mapInArrow(_make_kernel(bits, costs, rounding, grid, value_names, base_ms),
                                        _RESULT_SCHEMA)
        if big:
            streamed = _streamed_nacks(events, names, big, columns, time_column).mapInArrow(
                _make_stream_kernel(bits, costs, rounding, grid, base_ms=base_ms), _RESULT_SCHEMA)
            results = streamed if results is None else results.unionByName(streamed)
    parts += len(big)

    t1 = time.perf_counter()
    with progress.phase("analyse", f"{summary.nacks:,} nacks of {len(names):,} consumers: shuffle, "
                                   f"{len(bits)} bits per consumer in {parts} tasks"):
        assert results is not None  # there is a consumer with nacks: whole or big
        table = _collect_arrow(results)  # one job: everything the report needs comes back at once
    seconds["analyse"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    rows, series_lists, fleet_errors, totals = _split(table)
    seconds["fleet"] = time.perf_counter() - t2

    rows.insert(0, "consumer", rows["cid"].map(dict(enumerate(names))))  # cid = index in sorted names
    rows = rows.drop(columns=["cid"]).sort_values(["consumer", "bits"]).reset_index(drop=True)
    rows["peak_at_ms"] = rows["peak_at_ms"].astype("Int64").mask(rows["peak_at_ms"] < 0)  # never pending
    rows["bytes_per_pending"] = rows["index_bytes"] / rows["peak_pending"].where(rows["peak_pending"] > 0)
    # each consumer's own recommendation: its largest bits within the bound
    best = rows[rows["err_p99"] <= max_early_ms].groupby("consumer")["bits"].max()
    rows["recommended"] = rows["bits"] == rows["consumer"].map(best)
    fleet = _fleet(rows, fleet_errors, bits)
    recommended = recommend(dict(zip(fleet["bits"], fleet["err_p99"])), max_early_ms)
    series_bits = recommended if recommended is not None else min(bits)
    series = _series(series_lists, series_bits, grid, names)
    import numpy as np
    import pandas as pd

    total = totals.get(series_bits, np.zeros(0, dtype=np.int64))
    fleet_series = pd.DataFrame({"bits": series_bits, "t_ms": grid.times()[:len(total)], "pending_at": total})
    seconds["total"] = time.perf_counter() - t0
    master = str(spark.sparkContext.master)
    return PlanResult(trace=summary, bits=bits, rounding=rounding, max_early_ms=max_early_ms,
                      consumers=rows, fleet=fleet, fleet_errors=fleet_errors, recommended=recommended,
                      costs=costs, master=master, partitions=parts, seconds=seconds, series=series,
                      series_bits=series_bits, fleet_series=fleet_series)


def _streamed_nacks(events: DataFrame, names: list[str], big: list[str], columns: list[Column],
                    time_column: str = "ts_ms") -> DataFrame:
    """The nack rows of the ``big`` consumers, one consumer per partition,
    sorted by time (Spark's external sort: spills to disk, never holds a
    consumer in memory), as ``cid`` and ``columns`` (:func:`_narrow_columns`)."""
    from pyspark.sql import functions as F

    cids = {name: i for i, name in enumerate(names)}
    rank = {cids[n]: r for r, n in enumerate(big)}
    nacks = events.where((F.col("kind") == "nack") & F.col("consumer").isin(big))
    nacks = nacks.select(_lookup(F.col("consumer"), {n: cids[n] for n in big}, "int").alias("cid"), *columns)
    where = _lookup(F.col("cid"), rank, "int")
    if hasattr(nacks, "repartitionById"):
        nacks = nacks.repartitionById(len(big), where)
    else:
        nacks = nacks.repartition(len(big), where)
    return nacks.sortWithinPartitions("cid", time_column)


def _packed_nacks(spark: SparkSession, events: DataFrame, names: list[str], summary: TraceSummary, parts: int,
                  columns: Sequence[Column], layout: tuple[bool, Optional[int]], only: Optional[list[str]] = None,
                  tasks: Optional[list[ReadTask]] = None) -> tuple[DataFrame, list[str]]:
    """The nack rows of ``only`` (default: every consumer), each consumer whole
    in one of ``parts`` partitions, packed (:func:`_pack`): a row per (Arrow
    batch, consumer) crosses the shuffle. ``columns`` and ``layout``: the
    kernel's columns (:func:`_narrow_columns`, :func:`_layout`).
    ``tasks``: the row groups of a local Parquet log, by task
    (:func:`~.load.parquet_tasks`): the tasks read them with pyarrow
    (:func:`_make_file_packer`); else Spark reads ``events`` and hands the
    kernel's columns to Python (:func:`_make_packer`). Returns the packed
    rows, partitioned, and the names of the packed values in their order."""
    from pyspark.sql import functions as F

    cids = {name: i for i, name in enumerate(names)}
    chosen = names if only is None else only
    sizes = {cids[n]: summary.consumers[n]["nacks"] for n in chosen}
    pid = _assign_partitions(sizes, parts)
    pid_of = [0] * len(names)
    for c, p in pid.items():
        pid_of[c] = p
    narrow_ids, base = layout
    if tasks is not None:
        value_names = (["ids"] if narrow_ids else ["ledger_id", "entry_id"]) + \
            (["times"] if base is not None else ["ts_ms", "due"])
        reader = _make_file_packer(tasks, {n: cids[n] for n in chosen}, pid_of, narrow_ids, base)
        packed = spark.range(len(tasks), numPartitions=max(1, len(tasks))).mapInArrow(reader, _PACKED_SCHEMA)
    else:
        nacks = events.where(F.col("kind") == "nack")
        if len(chosen) < len(names) and len(chosen) <= 64:
            nacks = nacks.where(F.col("consumer").isin(chosen))
        if len(chosen) <= 64:  # a literal map lookup per row: no join
            nacks = nacks.select(_lookup(F.col("consumer"), {n: cids[n] for n in chosen}, "int").alias("cid"),
                                 *columns)
        else:  # a literal map is a linear scan per row: join a broadcast table (only's consumers: a filter too)
            nacks = nacks.join(F.broadcast(_codes(spark, chosen, cids, pid)), "consumer").select("cid", *columns)
        value_names = [c for c in nacks.columns if c != "cid"]
        packed = nacks.mapInArrow(_make_packer(pid_of, value_names), _PACKED_SCHEMA)
    if hasattr(packed, "repartitionById"):  # Spark >= 4.1: exactly the partition we chose
        return packed.repartitionById(parts, F.col("pid")), value_names
    return packed.repartition(parts, F.col("pid")), value_names  # older Spark: hash partitioning, a little less even


def _codes(spark: SparkSession, names: list[str], cids: dict[str, int], pid: dict[int, int]) -> DataFrame:
    """The ``consumer, cid, pid`` table to join, built from Arrow on the JVM side:
    a list of Python rows would be a job of its own, run by Python workers
    (started for it alone, ~2 s on a cold session)."""
    import pyarrow as pa
    import pyspark

    table = pa.table({"consumer": pa.array(names, pa.string()),
                      "cid": pa.array([cids[n] for n in names], pa.int32()),
                      "pid": pa.array([pid[cids[n]] for n in names], pa.int32())})
    if int(pyspark.__version__.split(".")[0]) >= 4:
        return spark.createDataFrame(table)
    return spark.createDataFrame(table.to_pandas())  # PySpark 3.5: from pandas, converted with Arrow


def _collect_arrow(df: DataFrame) -> pa.Table:
    """A DataFrame's rows as one pyarrow Table (Arrow batches straight from the
    executors; no pandas conversion, no Row objects)."""
    import pyarrow as pa

    with quiet_pandas_check():
        if hasattr(df, "toArrow"):  # PySpark >= 4.0
            table: pa.Table = df.toArrow()
            return table
        batches = df._collect_as_arrow()  # type: ignore[operator]  # PySpark 3.5 (4.x stubs: a column)
    return pa.Table.from_batches(batches) if batches else pa.table({})


def _split(table: pa.Table) -> tuple[pd.DataFrame, dict[int, tuple[Any, ...]], pd.DataFrame,
                                    dict[int, np.ndarray[Any, Any]]]:
    """The kernel's rows -> (consumer rows as pandas, {bits: (cids, k × bins
    series matrices)}, fleet error histogram as pandas ``bits, error_ms, nacks``)."""
    import numpy as np
    import pandas as pd
    import pyarrow.compute as pc

    # Any: pyarrow-stubs type equal() and invert() on a column and a Python int as no overload, flatten() as absent
    is_hist: Any = pc.equal(table.column("cid"), -1)  # type: ignore[call-overload]
    hist: Any = table.filter(is_hist)
    mine: Any = table.filter(pc.invert(is_hist))
    rows = mine.drop_columns([*LIST_COLUMNS, *_HISTOGRAM]).to_pandas()
    series: dict[int, tuple[Any, ...]] = {}
    bits_col = mine.column("bits").to_numpy()
    cids = mine.column("cid").to_numpy()
    lists = {c: mine.column(c).combine_chunks() for c in LIST_COLUMNS}
    lengths: Any = pc.list_value_length(lists["pending_at"])
    has = pc.greater(lengths, 0).to_numpy(zero_copy_only=False)  # type: ignore[call-overload]
    for b in np.unique(bits_col).tolist():
        at = np.flatnonzero((bits_col == b) & has)  # the consumers whose series came back
        mats = []
        for c in LIST_COLUMNS:
            chosen = lists[c].take(at)
            flat = chosen.flatten().to_numpy()
            mats.append(flat.reshape(len(at), -1) if len(at) else flat.reshape(0, 0))
        series[b] = (cids[at], *mats)
    fleet = []
    totals: dict[int, np.ndarray] = {}
    hb = hist.column("bits").to_numpy()
    hist_at: Any = hist.column("pending_at").combine_chunks() if hist.num_rows else None
    for b in np.unique(hb).tolist():
        at = np.flatnonzero(hb == b)
        sums = hist_at.take(at).flatten().to_numpy()
        totals[b] = sums.reshape(len(at), -1).sum(axis=0) if len(sums) else sums
        values = hist.column("hist_values").take(at).combine_chunks().flatten().to_numpy()
        counts = hist.column("hist_counts").take(at).combine_chunks().flatten().to_numpy()
        distinct, inverse = np.unique(values, return_inverse=True)
        summed = np.bincount(inverse.reshape(-1), weights=counts, minlength=len(distinct)).astype(np.int64)
        fleet.append(pd.DataFrame({"bits": b, "error_ms": distinct, "nacks": summed}))
    fleet_errors = pd.concat(fleet, ignore_index=True) if fleet else pd.DataFrame(
        columns=["bits", "error_ms", "nacks"])
    return rows, series, fleet_errors, totals


def _series(series_lists: dict[int, tuple[Any, ...]], bits: int, grid: Grid, names: list[str]) -> pd.DataFrame:
    """Pending over time of every consumer at ``bits``, long format: at each
    grid instant ``t_ms`` (``pending_at``) and the maximum until the next one
    (``pending_max``)."""
    import numpy as np
    import pandas as pd

    cids, p_at, p_max = series_lists[bits]
    k, bins = p_at.shape
    out = pd.DataFrame({"consumer": np.repeat(np.asarray(names, dtype=object)[cids], bins),
                        "bits": bits, "t_ms": np.tile(grid.times(), k),
                        "pending_at": p_at.reshape(-1), "pending_max": p_max.reshape(-1)})
    return out.sort_values(["consumer", "t_ms"], kind="stable").reset_index(drop=True)


def _fleet(rows: pd.DataFrame, fleet_errors: pd.DataFrame, bits: Sequence[int]) -> pd.DataFrame:
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
