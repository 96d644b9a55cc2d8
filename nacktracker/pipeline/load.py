"""Read a nack event log into Spark and check it before anything runs on it.

A trace is a Parquet file or directory (what :class:`~nacktracker.events.
EventLogWriter` and ``nacktracker trace generate`` write) or JSON Lines. The
schema is checked on the driver from the file metadata (free); values are
checked in one aggregation pass that also yields the per-consumer counts the
report prints, so validation costs one scan of the log, not one per check.
Every problem raises a :class:`~nacktracker.events.TraceError` subclass that
names the column.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

from ..events import (COLUMN_TYPES, COLUMNS, KINDS, NON_NEGATIVE_COLUMNS, NOT_NULL_COLUMNS,
                      EmptyTraceError, TraceError, check_schema, check_stats)

__all__ = ["TraceSummary", "read_events", "summarize", "load_trace", "UNNAMED"]

#: Consumer name used for events whose ``consumer`` is null.
UNNAMED = "(unnamed)"


@dataclass
class TraceSummary:
    """What one validation pass learned about a trace."""

    path: str
    rows: int
    kinds: dict[str, int]
    #: consumer -> {"events", "nacks", "redeliver", "dead_letter", "first_ms", "last_ms"}
    consumers: dict[str, dict[str, int]] = field(default_factory=dict)

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


def _spark_logical(dt) -> str:
    from pyspark.sql import types as T

    if isinstance(dt, (T.LongType, T.IntegerType, T.ShortType, T.ByteType)):
        return "integer"
    if isinstance(dt, (T.StringType, T.NullType)):
        return "string" if isinstance(dt, T.StringType) else "null"
    return dt.simpleString()


def _is_local_path(path: str) -> bool:
    return "://" not in path or path.startswith("file:")


def read_events(spark, path: str, fmt: str = "auto"):
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
    if _is_local_path(path):
        local = path[5:] if path.startswith("file:") else path
        if not glob.glob(local):
            raise EmptyTraceError(f"{path}: no such file or directory")
        if os.path.isdir(local) and not any(
                not n.startswith((".", "_")) and os.path.getsize(os.path.join(local, n)) > 0
                for n in os.listdir(local)):
            raise EmptyTraceError(f"{path}: no event files in this directory")
    try:
        reader = spark.read
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
    cols = []
    for c in COLUMNS:
        if c not in types:
            continue
        spark_type = {"int64": "bigint", "int32": "int", "string": "string"}[COLUMN_TYPES[c]]
        col = F.col(c).cast(spark_type)
        if c == "consumer":
            col = F.coalesce(col, F.lit(UNNAMED))
        cols.append(col.alias(c))
    return df.select(*cols)


def summarize(events, path: str) -> TraceSummary:
    """Check values (nulls, negatives, kinds, empty) in one pass; return counts.

    One ``groupBy(consumer, kind)`` aggregation of counts and minima (the
    cheapest aggregates Spark has; kinds are checked on the driver from the
    group keys), so the driver only sees a consumers x kinds table. Raises
    :class:`EmptyTraceError` / :class:`BadValueError`. Cost: one scan.
    """
    from pyspark.sql import functions as F

    present = set(events.columns)
    aggs = [F.count(F.lit(1)).alias("rows")]
    for c in NOT_NULL_COLUMNS:
        if c != "kind":
            aggs.append(F.count(c).alias(f"n_{c}"))  # non-null values: nulls = rows - n
    lows = [c for c in NON_NEGATIVE_COLUMNS if c in present]
    aggs += [F.min(c).alias(f"min_{c}") for c in lows]
    aggs.append(F.max("ts_ms").alias("last_ms"))
    rows = [r.asDict() for r in events.groupBy("consumer", "kind").agg(*aggs).collect()]
    bad = [r for r in rows if r["kind"] not in KINDS]
    stats = {
        "rows": sum(r["rows"] for r in rows),
        "nulls": {c: sum(r["rows"] - r[f"n_{c}"] for r in rows) for c in NOT_NULL_COLUMNS if c != "kind"},
        "min": {c: min((r[f"min_{c}"] for r in rows if r[f"min_{c}"] is not None), default=None) for c in lows},
        "bad_kinds": sum(r["rows"] for r in bad if r["kind"] is not None),
        "bad_kind": next((r["kind"] for r in bad if r["kind"] is not None), None),
    }
    stats["nulls"]["kind"] = sum(r["rows"] for r in rows if r["kind"] is None)
    check_stats(stats, path)
    kinds = {k: sum(r["rows"] for r in rows if r["kind"] == k) for k in KINDS}
    consumers: dict[str, dict[str, int]] = {}
    for r in rows:
        c = consumers.setdefault(r["consumer"], {"events": 0, "nacks": 0, "redeliver": 0, "dead_letter": 0,
                                                 "first_ms": r["min_ts_ms"], "last_ms": r["last_ms"]})
        c["events"] += r["rows"]
        c["nacks" if r["kind"] == "nack" else r["kind"]] += r["rows"]
        c["first_ms"] = min(c["first_ms"], r["min_ts_ms"])
        c["last_ms"] = max(c["last_ms"], r["last_ms"])
    return TraceSummary(path=path, rows=stats["rows"], kinds=kinds, consumers=consumers)


def load_trace(spark, path: str, fmt: str = "auto") -> tuple:
    """:func:`read_events` + :func:`summarize`: ``(events DataFrame, TraceSummary)``."""
    events = read_events(spark, path, fmt)
    return events, summarize(events, path)
