"""Read a nack event log into Spark and check it before anything runs on it.

A trace is a Parquet file or directory (what :class:`~nacktracker.events.
EventLogWriter` and ``nacktracker trace generate`` write) or JSON Lines. The
schema is checked on the driver from the file metadata (free); values are
checked in one aggregation pass that also yields the per-consumer counts the
report prints, so validation costs one scan of the log, not one per check.
For local Parquet, the id columns' nulls, minima and maxima come from the
files' own statistics (:func:`footer_stats`) when every row group has them:
the pass then reads only ``consumer``, ``kind``, ``ts_ms`` and ``delay_ms``.
Every problem raises a :class:`~nacktracker.events.TraceError` subclass that
names the column.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..events import (
    COLUMN_TYPES,
    COLUMNS,
    KINDS,
    MAX_TIME_MS,
    NON_NEGATIVE_COLUMNS,
    NOT_NULL_COLUMNS,
    ColumnTypeError,
    EmptyTraceError,
    TraceError,
    check_schema,
    check_stats,
)
from .spark import quiet_pandas_check

if TYPE_CHECKING:  # pyarrow and pyspark are imported where they are used (the `spark` extra)
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["TraceSummary", "read_events", "summarize", "load_trace", "check_trace_path", "parquet_tasks", "ReadTask",
           "UNNAMED", "FORMATS"]

#: Consumer name used for events whose ``consumer`` is null.
UNNAMED = "(unnamed)"
#: What ``plan`` reads, in the words its errors use.
FORMATS = ("Parquet (a file or a directory of them) or JSON Lines (.jsonl, .json or .ndjson, "
           "optionally .gz, or a directory of them)")
#: The largest id a signed 64-bit column holds: an unsigned 64-bit column is read when its values fit.
_INT64_MAX = (1 << 63) - 1
#: Prefix of the raw (decimal) copy of an unsigned 64-bit column, checked by :func:`summarize`.
_RAW = "__unsigned_"


@dataclass
class TraceSummary:
    """What one validation pass learned about a trace."""

    path: str
    rows: int
    kinds: dict[str, int]
    #: consumer -> {"events", "nacks", "redeliver", "dead_letter", "first_ms", "last_ms", "last_due_ms"}
    consumers: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the largest ``ledger_id`` and ``entry_id`` (None when unknown)
    maxima: dict[str, Optional[int]] = field(default_factory=dict)

    @property
    def nacks(self) -> int:
        return self.kinds.get("nack", 0)


def _detect_format(path: str) -> str:
    low = path.rstrip("/").lower()
    if low.endswith((".jsonl", ".json", ".ndjson", ".jsonl.gz", ".json.gz")):
        return "jsonl"
    if low.endswith(".parquet"):
        return "parquet"
    if os.path.isdir(path):  # a local directory: look at what it holds
        names = [n for n in os.listdir(path) if not n.startswith((".", "_"))]
        if names and all(".json" in n.lower() for n in names):
            return "jsonl"
    return "parquet"


def check_trace_path(path: str, fmt: str = "auto") -> None:
    """Check a local trace before any Spark work: it exists, holds files, and
    (Parquet) each file starts as Parquet files do. Raises
    :class:`EmptyTraceError` or :class:`TraceError` naming the file and the
    formats read. Remote paths are checked by Spark as it reads them. Cost:
    a directory listing and 4 bytes per file."""
    if not _is_local_path(path):
        return
    files = _local_files(path)
    if (_detect_format(path) if fmt == "auto" else fmt) != "parquet":
        return
    for f in files:
        try:
            with open(f, "rb") as fh:
                head = fh.read(4)
        except OSError as e:
            raise TraceError(f"{f}: cannot be read ({e.strerror})") from None
        if head != b"PAR1":
            raise TraceError(f"{f}: not a Parquet file; plan reads {FORMATS}")


def _spark_logical(dt: Any) -> str:
    from pyspark.sql import types as T

    if isinstance(dt, (T.LongType, T.IntegerType, T.ShortType, T.ByteType)):
        return "integer"
    if isinstance(dt, T.DecimalType) and dt.scale == 0 and dt.precision == 20:  # unsigned 64-bit Parquet
        return "integer"
    if isinstance(dt, (T.StringType, T.NullType)):
        return "string" if isinstance(dt, T.StringType) else "null"
    return str(dt.simpleString())


def _is_local_path(path: str) -> bool:
    return "://" not in path or path.startswith("file:")


def _local_files(path: str) -> list[str]:
    """The event files of a local trace path (a file, a folder or a glob; ``file:`` prefix allowed).
    Raises :class:`EmptyTraceError` when it names nothing or holds no event file. O(files)."""
    local = path[5:] if path.startswith("file:") else path
    if not glob.glob(local):
        raise EmptyTraceError(f"{path}: no such file or directory")
    files = [f for g in sorted(glob.glob(local)) for f in _data_files(g)]
    if not files:
        raise EmptyTraceError(f"{path}: no event files in this directory")
    return files


#: A read task of a local Parquet log: ``(file, row groups)`` pairs, read one after the other.
ReadTask = list[tuple[str, list[int]]]
#: Rows a read task gathers (consecutive row groups of a file, or several small files) before the next begins.
TASK_ROWS = 1 << 21


def parquet_tasks(path: str, fmt: str = "auto", task_rows: Optional[int] = None) -> Optional[list[ReadTask]]:
    """How the tasks read a local Parquet log themselves with pyarrow: its row
    groups, in file order, gathered into tasks of about ``task_rows`` rows
    (default :data:`TASK_ROWS`; a larger row group is a task of its own), so a log written in many small
    row groups or files is not thousands of tasks. None for any other log (a
    remote path, JSON Lines, partition folders such as ``date=…/``), which
    Spark reads. Cost: one footer read per file."""
    import pyarrow.parquet as pq

    if not _is_local_path(path) or (_detect_format(path) if fmt == "auto" else fmt) != "parquet":
        return None
    files = _local_files(path)
    local = path[5:] if path.startswith("file:") else path
    if os.path.isdir(local) and any("=" in part for f in files
                                    for part in Path(os.path.relpath(os.path.dirname(f), local)).parts):
        return None  # partition folders (key=value): Spark reads their values as columns, a file alone has not
    task_rows = TASK_ROWS if task_rows is None else task_rows
    tasks: list[ReadTask] = []
    task: ReadTask = []
    rows = 0
    for f in files:
        meta = pq.ParquetFile(f).metadata
        for g in range(meta.num_row_groups):
            if task and task[-1][0] == f:
                task[-1][1].append(g)
            else:
                task.append((f, [g]))
            rows += meta.row_group(g).num_rows
            if rows >= task_rows:
                tasks.append(task)
                task, rows = [], 0
    if task:
        tasks.append(task)
    return tasks


def _data_files(local: str) -> list[str]:
    """Data files Spark would read under a local path: the file itself, or the
    directory's files (partition subdirectories too), hidden and ``_`` names skipped."""
    if os.path.isfile(local):
        return [local]
    out = []
    for folder, dirs, files in os.walk(local):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        out += [os.path.join(folder, f) for f in sorted(files)
                if not f.startswith((".", "_")) and os.path.getsize(os.path.join(folder, f)) > 0]
    return out


def _parquet_schema(paths: list[str]) -> StructType:
    """Check every Parquet file's own columns (its footer, not the Spark schema
    a writer may have left in its metadata) and return the Spark schema to read
    them all with: each known column present, integers at the widest width
    any file uses. Raises :class:`TraceError` subclasses naming the file.
    Cost: one footer read per file (~1 ms each)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import types as T

    from ..events import _arrow_logical

    present: set[str] = set()
    wide: set[str] = set()
    unsigned: set[str] = set()
    for path in paths:
        try:
            schema = pq.read_schema(path)
        except Exception as e:  # noqa: BLE001  (not Parquet at all, or truncated: re-raised as TraceError)
            raise TraceError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]}); "
                             f"plan reads {FORMATS}") from None
        types = {}
        for f in schema:
            t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
            kind = _arrow_logical(t)
            types[f.name] = "string" if kind == "null" and f.name in ("topic", "consumer") else kind
            if kind == "integer" and t.bit_width > 32:
                wide.add(f.name)
            if pa.types.is_uint64(t):
                unsigned.add(f.name)
        check_schema(types, path)  # every file on its own: so files agree on every logical type
        present.update(c for c in types if c in COLUMN_TYPES)
    fields = []
    for c in COLUMNS:
        if c in present:
            if COLUMN_TYPES[c] == "string":
                t = T.StringType()
            elif c in unsigned:  # Spark reads unsigned 64-bit as decimal(20, 0): checked, then cast
                t = T.DecimalType(20, 0)
            else:
                t = T.LongType() if c in wide or COLUMN_TYPES[c] == "int64" else T.IntegerType()
            fields.append(T.StructField(c, t, True))
    return T.StructType(fields)


#: Columns whose nulls, minimum and maximum the files' own statistics can
#: give (the validation pass reads ``consumer``, ``kind``, ``ts_ms`` and
#: ``delay_ms`` anyway: the per-consumer counts and times need them).
FOOTER_COLUMNS = ("ledger_id", "entry_id", "redelivery_count")


def footer_stats(paths: list[str]) -> dict[str, dict[str, Optional[int]]]:
    """``{column: {"nulls", "min", "max"}}`` of the :data:`FOOTER_COLUMNS` that
    every file's every row group has statistics for (Parquet writers record a
    null count, minimum and maximum per column chunk); a column without them
    in one file, missing from one, or unsigned 64-bit is left out and checked
    by the validation pass instead. Cost: one footer read per file (~1 ms
    each), no data read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out: dict[str, dict[str, Optional[int]]] = {c: {"nulls": 0, "min": None, "max": None} for c in FOOTER_COLUMNS}
    for path in paths:
        pf = pq.ParquetFile(path)
        meta, arrow = pf.metadata, pf.schema_arrow
        where = {meta.schema.column(j).path: j for j in range(meta.num_columns)}
        for c in list(out):
            j = where.get(c)
            if j is None or c not in arrow.names or not pa.types.is_signed_integer(arrow.field(c).type):
                del out[c]
                continue
            for g in range(meta.num_row_groups):
                chunk = meta.row_group(g).column(j)
                st: Any = chunk.statistics  # Any: pyarrow-stubs 20 have no has_null_count
                if st is None or not st.has_null_count:
                    del out[c]
                    break
                out[c]["nulls"] = (out[c]["nulls"] or 0) + st.null_count
                if not st.has_min_max:
                    if st.null_count == chunk.num_values:  # all null: no minimum or maximum
                        continue
                    del out[c]
                    break
                low, high = out[c]["min"], out[c]["max"]
                out[c]["min"] = st.min if low is None else min(low, st.min)
                out[c]["max"] = st.max if high is None else max(high, st.max)
    return out


_READ_ERROR = re.compile(r"Error while reading file (\S+?)\.? .*?(?:column|Column) \[?`?([\w.]+)`?\]?", re.S)


def one_line_read_error(exc: BaseException, path: str) -> TraceError:
    """A Spark read failure (a page of JVM trace) as one line naming the file and column."""
    text = str(exc)
    m = _READ_ERROR.search(text)
    if m:
        column = m.group(2).split(".")[-1]
        detail = re.search(r"(Expected Spark type [^.]+, actual Parquet type [^.]+)", text)
        return ColumnTypeError(f"{m.group(1)}: column {column!r} cannot be read"
                               f"{': ' + detail.group(1) if detail else ''}", column)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return TraceError(f"{path}: cannot read the log: {first[:300]}")


def read_events(spark: SparkSession, path: str, fmt: str = "auto") -> DataFrame:
    """Open a trace and check its schema. Returns a DataFrame with the
    :data:`~nacktracker.events.COLUMNS` that are present, integer columns cast
    to their on-disk width and a null ``consumer`` named :data:`UNNAMED`.

    Raises :class:`EmptyTraceError` (no such path, no files),
    :class:`MissingColumnError`, :class:`ColumnTypeError`. Lazy: nothing is
    scanned yet (JSON Lines is scanned once to infer its schema).
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    if fmt == "auto":
        fmt = _detect_format(path)
    if fmt not in ("parquet", "jsonl"):
        raise ValueError(f"format must be parquet, jsonl or auto, got {fmt!r}")
    schema = None
    if _is_local_path(path):
        files = _local_files(path)
        if fmt == "parquet":  # each file on its own: mixed schemas and stale metadata name the file
            schema = _parquet_schema(files)
    try:
        reader = spark.read if schema is None else spark.read.schema(schema)
        df = reader.parquet(path) if fmt == "parquet" else reader.json(path)
        types = {f.name: _spark_logical(f.dataType) for f in df.schema.fields}
    except AnalysisException as e:
        text = str(e)
        if "UNABLE_TO_INFER_SCHEMA" in text or "Unable to infer schema" in text or "PATH_NOT_FOUND" in text:
            raise EmptyTraceError(f"{path}: no {fmt} events here ({text.splitlines()[0]})") from None
        raise TraceError(f"{path}: cannot read as {fmt}: {text.splitlines()[0]}") from None
    if fmt == "jsonl" and "_corrupt_record" in types:
        raise TraceError(f"{path}: some lines are not JSON objects (Spark put them in _corrupt_record)")
    # a JSON column that is null on every row has no type: fine for the text columns only
    for c in ("topic", "consumer"):
        if types.get(c) == "null":
            types[c] = "string"
    check_schema(types, path)
    from pyspark.sql import types as T

    cols, raw = [], []
    for c in COLUMNS:
        if c not in types:
            continue
        spark_type = {"int64": "bigint", "int32": "int", "string": "string"}[COLUMN_TYPES[c]]
        col = F.col(c)
        if isinstance(df.schema[c].dataType, T.DecimalType):  # unsigned 64-bit: read when it fits
            raw.append(F.col(c).alias(_RAW + c))
            col = F.when(col <= F.lit(_INT64_MAX), col)
        col = col.cast(spark_type)
        if c == "consumer":
            col = F.coalesce(col, F.lit(UNNAMED))
        cols.append(col.alias(c))
    return df.select(*cols, *raw)


def _aggregates(present: set[str], known: dict[str, dict[str, Optional[int]]],
                unsigned: list[str]) -> list[tuple[str, str, Optional[str]]]:
    """What :func:`summarize` computes per ``(consumer, kind)``: ``(name, op,
    column)`` with op ``rows`` (every row), ``count`` (non-null values),
    ``min``, ``max``, ``max_due`` (the largest ``ts_ms + delay_ms``): one list
    for both readers of the log."""
    out: list[tuple[str, str, Optional[str]]] = [("rows", "rows", None)]
    out += [(f"n_{c}", "count", c) for c in NOT_NULL_COLUMNS if c != "kind" and c not in known]
    out += [(f"min_{c}", "min", c) for c in NON_NEGATIVE_COLUMNS if c in present and c not in known]
    out += [(f"max_{_RAW}{c}", "max", _RAW + c) for c in unsigned]
    out += [(f"max_{c}", "max", c) for c in ("ledger_id", "entry_id") if c not in known]  # fit 32 bits?
    out += [("last_ms", "max", "ts_ms"), ("max_delay_ms", "max", "delay_ms"), ("last_due_ms", "max_due", None)]
    return out


def _spark_rows(events: DataFrame, aggregates: list[tuple[str, str, Optional[str]]]) -> list[dict[str, Any]]:
    """The ``(consumer, kind)`` aggregates, computed by Spark from ``events``."""
    from pyspark.sql import functions as F

    spark_op = {"count": F.count, "min": F.min, "max": F.max}
    aggs = [F.count(F.lit(1)).alias(name) if op == "rows" else
            F.max(_in_time_range(F.col("ts_ms"), F.col("delay_ms"))).alias(name) if op == "max_due" else
            spark_op[op](str(column)).alias(name) for name, op, column in aggregates]
    return [r.asDict() for r in events.groupBy("consumer", "kind").agg(*aggs).collect()]


def _in_time_range(ts: Any, delay: Any) -> Any:
    """``ts + delay`` where both are within :data:`~nacktracker.events.MAX_TIME_MS`, else null: a sum that
    cannot overflow (a value out of range is refused by the check that follows, naming its column)."""
    from pyspark.sql import functions as F

    return F.when((ts <= MAX_TIME_MS) & (delay <= MAX_TIME_MS), ts + delay)


def _arrow_rows(spark: SparkSession, tasks: list[ReadTask],
                aggregates: list[tuple[str, str, Optional[str]]]) -> list[dict[str, Any]]:
    """The ``(consumer, kind)`` aggregates of a local Parquet log, computed by
    the tasks with pyarrow, each reading its row groups (:func:`parquet_tasks`)
    a batch at a time: columnar from the file, no row converted between Spark
    and Python; the driver merges one small table per batch. Raises
    :class:`TraceError` naming the file a task cannot read."""
    import json

    work = list(tasks)
    wanted = list(aggregates)
    batch_rows = TASK_ROWS

    def aggregate(batches: Any) -> Any:
        import pyarrow as pa
        import pyarrow.parquet as pq

        need = {"consumer", "kind", "ts_ms", "delay_ms"} | {c for _, _, c in wanted if c}
        for batch in batches:
            for number in batch.column("id").to_numpy().tolist():
                for path, groups in work[number]:
                    try:  # a batch at a time; a file pyarrow cannot read is one line (below)
                        pf = pq.ParquetFile(path, read_dictionary=["consumer", "kind"])
                        names = set(pf.schema_arrow.names)
                        read = pf.iter_batches(batch_size=batch_rows, row_groups=groups,
                                               columns=[c for c in COLUMNS if c in need and c in names])
                        while (table := next(read, None)) is not None:
                            yield pa.RecordBatch.from_pydict({"stats": [json.dumps({"rows": _grouped(table, names)})]})
                    except Exception as e:  # noqa: BLE001  (re-raised on the driver as a TraceError)
                        yield pa.RecordBatch.from_pydict({"stats": [json.dumps({"error": f"{path}: cannot read "
                                                          f"the log: {str(e).splitlines()[0][:300]}"})]})
                        return

    def _grouped(table: Any, names: set[str]) -> list[dict[str, Any]]:
        import pyarrow as pa
        import pyarrow.compute as pc

        n = table.num_rows
        # grouped by the dictionary codes of the two text columns (every file has them: checked):
        # a string per distinct value, not per row; a null consumer is the unnamed one (below)
        cols: dict[str, Any] = {"consumer": table.column("consumer"), "kind": table.column("kind"),
                                "__due": pc.add(table.column("ts_ms"), table.column("delay_ms"))}
        specs: list[Any] = []
        for name, op, column in wanted:
            if op == "rows":
                specs.append(([], "count_all", name))
                continue
            source = "__due" if op == "max_due" else column
            assert source is not None
            if source not in cols:
                cols[source] = table.column(source) if source in names else pa.nulls(n, pa.int64())
            specs.append((source, "max" if op == "max_due" else op, name))
        pairs: Any = [(s, op) for s, op, _ in specs]
        grouped = pa.table(cols).group_by(["consumer", "kind"], use_threads=False).aggregate(pairs)
        # pyarrow names an aggregate "<column>_<op>", "count_all" alone
        renamed = {(f"{s}_{op}" if s else op): name for s, op, name in specs}
        rows = [{renamed.get(k, k): v for k, v in r.items()} for r in grouped.to_pylist()]
        for r in rows:
            r["consumer"] = UNNAMED if r["consumer"] is None else r["consumer"]
        return rows

    merged: dict[tuple[Any, Any], dict[str, Any]] = {}
    ops = {name: op for name, op, _ in aggregates}
    with quiet_pandas_check():  # mapInArrow checks the pandas version too (plan --quiet printed its warning)
        stats = spark.range(len(work), numPartitions=max(1, len(work))).mapInArrow(aggregate, "stats string").collect()
    for row in stats:
        part = json.loads(row["stats"])
        if "error" in part:
            raise TraceError(part["error"])
        for r in part["rows"]:
            key = (r["consumer"], r["kind"])
            into = merged.get(key)
            if into is None:
                merged[key] = r
                continue
            for name, op in ops.items():
                a, b = into[name], r[name]
                if op in ("rows", "count"):
                    into[name] = a + b
                elif a is None or b is None:
                    into[name] = a if b is None else b
                else:
                    into[name] = min(a, b) if op == "min" else max(a, b)
    return list(merged.values())


def summarize(events: DataFrame, path: str, known: Optional[dict[str, dict[str, Optional[int]]]] = None,
              tasks: Optional[list[ReadTask]] = None) -> TraceSummary:
    """Check values (nulls, negatives, kinds, empty) in one pass; return counts.

    One aggregation per ``(consumer, kind)`` of counts, minima and maxima
    (:func:`_aggregates`; kinds are checked on the driver from the group
    keys), so the driver only sees a consumers x kinds table: Spark's
    ``groupBy`` over ``events``, or, given ``tasks`` (the row groups of a
    local Parquet log, :func:`parquet_tasks`), pyarrow in the tasks
    (:func:`_arrow_rows`: several times faster, no row crosses between Spark
    and Python). Raises :class:`EmptyTraceError` /
    :class:`BadValueError`. ``known``: the nulls, minimum and maximum of
    columns the files' statistics gave (:func:`footer_stats`): checked from
    those, not aggregated (those columns are not read at all). Cost: one scan.
    """
    known = known or {}
    present = set(events.columns)
    unsigned = [c[len(_RAW):] for c in events.columns if c.startswith(_RAW)]
    known = {c: v for c, v in known.items() if c in present and c not in unsigned}
    aggregates = _aggregates(present, known, unsigned)
    lows = [c for c in NON_NEGATIVE_COLUMNS if c in present and c not in known]
    try:
        rows = _arrow_rows(events.sparkSession, tasks, aggregates) if tasks is not None and not unsigned \
            else _spark_rows(events, aggregates)
    except Exception as e:  # a file Spark cannot read after all (remote paths are not pre-checked)
        if type(e).__name__ in ("Py4JJavaError", "SparkException", "AnalysisException",
                                "SparkRuntimeException", "SparkUpgradeException"):
            raise one_line_read_error(e, path) from None
        raise
    for c in unsigned:  # before the null check: a value too large was read as null
        top = max((r[f"max_{_RAW}{c}"] for r in rows if r[f"max_{_RAW}{c}"] is not None), default=None)
        if top is not None and top > _INT64_MAX:
            raise ColumnTypeError(f"{path}: column {c!r} is unsigned 64-bit and holds {int(top)}, above "
                                  f"2^63 - 1: store it as signed 64-bit (int64) ids", c)
    bad = [r for r in rows if r["kind"] not in KINDS]
    stats = {
        "rows": sum(r["rows"] for r in rows),
        "nulls": {c: known[c]["nulls"] if c in known else sum(r["rows"] - r[f"n_{c}"] for r in rows)
                  for c in NOT_NULL_COLUMNS if c != "kind"},
        "min": {c: known[c]["min"] if c in known else
                min((r[f"min_{c}"] for r in rows if r[f"min_{c}"] is not None), default=None)
                for c in NON_NEGATIVE_COLUMNS if c in lows or c in known},
        "max": {"ts_ms": max((r["last_ms"] for r in rows if r["last_ms"] is not None), default=None),
                "delay_ms": max((r["max_delay_ms"] for r in rows if r["max_delay_ms"] is not None), default=None)},
        "bad_kinds": sum(r["rows"] for r in bad if r["kind"] is not None),
        "bad_kind": next((r["kind"] for r in bad if r["kind"] is not None), None),
    }
    stats["nulls"]["kind"] = sum(r["rows"] for r in rows if r["kind"] is None)
    check_stats(stats, path)
    kinds = {k: sum(r["rows"] for r in rows if r["kind"] == k) for k in KINDS}
    consumers: dict[str, dict[str, int]] = {}
    for r in rows:
        seen = consumers.setdefault(r["consumer"], {"events": 0, "nacks": 0, "redeliver": 0, "dead_letter": 0,
                                                    "first_ms": r["min_ts_ms"], "last_ms": r["last_ms"],
                                                    "last_due_ms": r["last_due_ms"]})
        seen["events"] += r["rows"]
        seen["nacks" if r["kind"] == "nack" else r["kind"]] += r["rows"]
        seen["first_ms"] = min(seen["first_ms"], r["min_ts_ms"])
        seen["last_ms"] = max(seen["last_ms"], r["last_ms"])
        if r["kind"] == "nack":
            seen["last_due_ms"] = max(seen["last_due_ms"], r["last_due_ms"])
    maxima = {c: known[c]["max"] if c in known else
              max((r[f"max_{c}"] for r in rows if r[f"max_{c}"] is not None), default=None)
              for c in ("ledger_id", "entry_id")}
    return TraceSummary(path=path, rows=stats["rows"], kinds=kinds, consumers=consumers, maxima=maxima)


def load_trace(spark: SparkSession, path: str, fmt: str = "auto") -> tuple[DataFrame, TraceSummary]:
    """:func:`read_events` + :func:`summarize`: ``(events DataFrame, TraceSummary)``;
    for local Parquet, the columns the files' statistics cover are checked
    from those (:func:`footer_stats`), so the validation pass reads four
    columns and aggregates fewer."""
    events = read_events(spark, path, fmt)
    known = None
    tasks = parquet_tasks(path, fmt)
    if tasks is not None:
        known = footer_stats(list(dict.fromkeys(f for task in tasks for f, _ in task)))
    return events, summarize(events, path, known, tasks)
