"""Nack event records: what the tracker reports through ``on_event`` and what
the Spark pipeline (``nacktracker plan``) reads back from Parquet / JSON Lines.

One row per event. ``ts_ms`` is wall-clock epoch milliseconds (for humans and
joins across machines); the tracker's own scheduling uses a monotonic clock and
never reads this field.

This module holds three things, all free of Spark:

* :class:`NackEvent`, :data:`KINDS`, :data:`COLUMNS`: the record;
* the on-disk schema (:data:`COLUMN_TYPES`, :func:`arrow_schema`) and the checks
  every reader applies (:func:`check_schema`, :func:`check_stats`,
  :func:`validate_table`), raising :class:`TraceError` subclasses that name the
  offending column;
* :class:`EventLogWriter`: an ``on_event`` hook that buffers events and writes
  rolling Parquet (or JSON Lines) files.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d, EventLogWriter(d) as log:
...     log(NackEvent(1_700_000_000_000, "nack", 7, 1, delay_ms=1000, consumer="c1"))
...     log.close()
...     [p.suffix for p in log.files]
['.parquet']
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

from .errors import BadValueError, ColumnTypeError, EmptyTraceError, MissingColumnError, TraceError

if TYPE_CHECKING:  # pyarrow is imported where it is used (the `spark` extra)
    import pyarrow as pa

__all__ = [
    "NackEvent", "KINDS", "COLUMNS", "COLUMN_TYPES", "REQUIRED_COLUMNS",
    "TraceError", "MissingColumnError", "ColumnTypeError", "BadValueError", "EmptyTraceError",
    "arrow_schema", "check_schema", "check_stats", "validate_table", "EventLogWriter",
]

#: ``nack``: the application nacked (scheduled for ``delay_ms`` later);
#: ``redeliver``: the tracker asked the broker to redeliver;
#: ``dead_letter``: ``max_redeliveries`` was reached, handed to the dead-letter hook.
KINDS = ("nack", "redeliver", "dead_letter")


@dataclass(frozen=True, slots=True)
class NackEvent:
    ts_ms: int
    kind: str
    ledger_id: int
    entry_id: int
    delay_ms: int = 0
    redelivery_count: int = 0
    partition: int = -1
    batch_index: int = -1
    topic: Optional[str] = None
    consumer: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Column order of the on-disk event log.
COLUMNS = tuple(f.name for f in fields(NackEvent))

# -- the on-disk schema --------------------------------------------------------

#: Arrow/Parquet type of every column (readers accept any integer width for
#: the integer columns: a JSON reader infers int64 for all of them).
COLUMN_TYPES: dict[str, str] = {
    "ts_ms": "int64", "kind": "string", "ledger_id": "int64", "entry_id": "int64",
    "delay_ms": "int64", "redelivery_count": "int32", "partition": "int32",
    "batch_index": "int32", "topic": "string", "consumer": "string",
}
assert tuple(COLUMN_TYPES) == COLUMNS

#: What ``nacktracker plan`` needs; the other columns are optional but, when
#: present, must have the right type.
REQUIRED_COLUMNS = ("ts_ms", "kind", "ledger_id", "entry_id", "delay_ms", "consumer")
#: Columns that may not hold nulls (``consumer`` may: a null is the unnamed consumer).
NOT_NULL_COLUMNS = ("ts_ms", "kind", "ledger_id", "entry_id", "delay_ms")
#: Integer columns that must be >= 0 (``partition`` and ``batch_index`` use -1 for "none").
NON_NEGATIVE_COLUMNS = ("ts_ms", "ledger_id", "entry_id", "delay_ms", "redelivery_count")
#: The largest ``ts_ms`` and ``delay_ms`` an event log may hold: 2^61 - 1 ms (73 million years), so that
#: ``ts_ms + delay_ms`` stays inside the tracker's due-time range (below 2^62 ms) and a 64-bit integer.
MAX_TIME_MS = (1 << 61) - 1
#: Columns checked against :data:`MAX_TIME_MS`.
TIME_COLUMNS = ("ts_ms", "delay_ms")


def _logical(type_name: str) -> str:
    """``int64``/``int32`` -> ``integer``, ``string`` -> ``string``."""
    return "integer" if type_name.startswith("int") else type_name


def check_schema(types: Mapping[str, str], source: str = "trace") -> None:
    """Check column names and logical types of an event log.

    ``types`` maps each column present to ``"integer"``, ``"string"`` or any
    other name (``"double"``, ``"boolean"``...: always wrong). Raises
    :class:`MissingColumnError` for the first required column absent (the
    message lists all of them) and :class:`ColumnTypeError` for the first
    column of the wrong type. Extra columns are ignored. Runtime: O(columns).
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in types]
    if missing:
        raise MissingColumnError(
            f"{source}: missing column {missing[0]!r} (missing: {', '.join(missing)}; "
            f"an event log needs {', '.join(REQUIRED_COLUMNS)})", missing[0])
    for column in COLUMNS:
        if column in types:
            want, got = _logical(COLUMN_TYPES[column]), types[column]
            if got != want:
                raise ColumnTypeError(
                    f"{source}: column {column!r} must hold {want}s, found {got}", column)


def check_stats(stats: Mapping[str, Any], source: str = "trace") -> None:
    """Check value statistics computed by a reader in one pass over the log.

    ``stats``: ``rows`` (int), ``nulls`` ({column: count}), ``min``
    ({column: smallest value or None}), ``max`` (the same, largest; the
    :data:`TIME_COLUMNS` are checked against :data:`MAX_TIME_MS`), ``bad_kind`` (an example of a kind not
    in :data:`KINDS`, or None) and ``bad_kinds`` (their count). Raises
    :class:`EmptyTraceError` or :class:`BadValueError`. Runtime: O(columns).
    """
    if not stats.get("rows"):
        raise EmptyTraceError(f"{source}: no events", None)
    for column, n in stats.get("nulls", {}).items():
        if n and column in NOT_NULL_COLUMNS:
            raise BadValueError(f"{source}: column {column!r} has {n:,} null values", column)
    for column, low in stats.get("min", {}).items():
        if low is not None and low < 0 and column in NON_NEGATIVE_COLUMNS:
            raise BadValueError(f"{source}: column {column!r} must be >= 0, found {low}", column)
    for column, high in stats.get("max", {}).items():
        if high is not None and high > MAX_TIME_MS and column in TIME_COLUMNS:
            raise BadValueError(f"{source}: column {column!r} must be <= {MAX_TIME_MS} (2^61 - 1 ms, so that "
                                f"ts_ms + delay_ms fits), found {high}", column)
    if stats.get("bad_kinds"):
        raise BadValueError(
            f"{source}: column 'kind' must be one of {', '.join(KINDS)}; found {stats['bad_kind']!r} "
            f"in {stats['bad_kinds']:,} rows", "kind")


def arrow_schema() -> "pa.Schema":
    """The :mod:`pyarrow` schema the writer uses (imports pyarrow lazily)."""
    import pyarrow as pa

    kinds = {"int64": pa.int64(), "int32": pa.int32(), "string": pa.string()}
    return pa.schema([pa.field(c, kinds[t], nullable=c not in NOT_NULL_COLUMNS)
                      for c, t in COLUMN_TYPES.items()])


def _arrow_logical(t: "pa.DataType") -> str:
    import pyarrow as pa

    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    return "null" if pa.types.is_null(t) else str(t)


def validate_table(table: "pa.Table", source: str = "trace") -> None:
    """Check a :class:`pyarrow.Table` of events (schema, nulls, negatives, kinds).

    The in-process twin of the Spark reader's check (same errors, same
    messages). A column of all-null values read from JSON has Arrow type
    ``null`` and is accepted only for ``topic``/``consumer``.
    Runtime: O(rows) in C.
    """
    import pyarrow.compute as pc

    types = {}
    for f in table.schema:
        kind = _arrow_logical(f.type)
        if kind == "null" and f.name in ("topic", "consumer"):
            kind = "string"
        types[f.name] = kind
    check_schema(types, source)
    stats: dict[str, Any] = {"rows": table.num_rows, "nulls": {}, "min": {}, "max": {}}
    if table.num_rows:
        for c in NOT_NULL_COLUMNS:
            stats["nulls"][c] = table.column(c).null_count
        for c in NON_NEGATIVE_COLUMNS:
            if c in types:
                stats["min"][c] = pc.min(table.column(c)).as_py()
        for c in TIME_COLUMNS:
            stats["max"][c] = pc.max(table.column(c)).as_py()
        # Any: pyarrow-stubs type is_in over a column as returning a scalar
        unknown: Any = pc.invert(pc.is_in(table.column("kind"), value_set=_kinds_array()))
        bad = pc.fill_null(unknown, False)
        stats["bad_kinds"] = pc.sum(bad).as_py() or 0
        if stats["bad_kinds"]:
            stats["bad_kind"] = pc.filter(table.column("kind"), bad)[0].as_py()
    check_stats(stats, source)


def _kinds_array() -> "pa.StringArray":
    import pyarrow as pa

    return pa.array(KINDS)


# -- the writer ----------------------------------------------------------------

_INT_COLUMNS = tuple(c for c, t in COLUMN_TYPES.items() if t != "string")


class EventLogWriter:
    """An ``on_event`` hook that writes :class:`NackEvent` records to rolling files.

    Events are buffered in memory (one Python list per column) and written
    every ``buffer_rows`` events as one Parquet row group (or a block of JSON
    lines). A file is closed and a new one started after ``rows_per_file``
    rows, or on the first write after ``roll_after_s`` seconds, so a
    long-running consumer's log becomes readable piece by piece. A file being
    written is hidden (``.name.inprogress``) and renamed into place when it is
    complete; Spark and pyarrow skip hidden files, so readers never see a
    half-written Parquet file.

    Cost: about 1 µs per event to check and buffer; a flush blocks the
    caller (the tracker's event loop) for the encode and write of one buffer,
    about 5-15 ms per 10,000 rows with Parquet/zstd. Thread-safe.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> w = EventLogWriter(d, rows_per_file=2)
    >>> for i in range(5):
    ...     w(NackEvent(1_700_000_000_000 + i, "nack", 9, i, delay_ms=100, consumer="c"))
    >>> w.close(); len(w.files), w.rows_written
    (3, 5)

    Use it as ``NegativeAcksTracker(..., on_event=writer)`` and call
    :meth:`close` (or use ``with``) when the consumer stops.
    """

    def __init__(self, directory: str | os.PathLike[str], *, format: str = "parquet",
                 rows_per_file: int = 1_000_000, buffer_rows: int = 10_000,
                 roll_after_s: Optional[float] = 600.0, prefix: str = "nacks",
                 compression: str = "zstd") -> None:
        if format not in ("parquet", "jsonl"):
            raise ValueError(f"format must be 'parquet' or 'jsonl', got {format!r}")
        if rows_per_file < 1 or buffer_rows < 1:
            raise ValueError("rows_per_file and buffer_rows must be >= 1")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.format = format
        self.rows_per_file = rows_per_file
        self.buffer_rows = min(buffer_rows, rows_per_file)
        self.roll_after_s = roll_after_s
        self.prefix = prefix
        self.compression = compression
        #: Completed files, oldest first.
        self.files: list[Path] = []
        self.rows_written = 0
        self._lock = threading.Lock()
        self._columns: dict[str, list[Any]] = {c: [] for c in COLUMNS}
        self._buffered = 0
        # one run id per writer: two writers (or processes) can share a directory
        self._run = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{id(self) & 0xFFFF:04x}"
        self._seq = 0
        self._file: Any = None  # open pyarrow ParquetWriter or text file
        self._file_path: Optional[Path] = None
        self._file_rows = 0
        self._file_opened = 0.0
        self._closed = False

    # -- the hook ---------------------------------------------------------------

    def __call__(self, event: NackEvent) -> None:
        """Buffer one event (the ``on_event`` signature)."""
        self.write(event)

    def write(self, event: NackEvent) -> None:
        """Buffer one event; flush when the buffer is full or the file is old.

        Raises :class:`ColumnTypeError`/:class:`BadValueError` naming the field
        for a malformed event (nothing is buffered then).
        """
        row = _check_event(event)
        with self._lock:
            if self._closed:
                raise ValueError("EventLogWriter is closed")
            for column, value in zip(COLUMNS, row):
                self._columns[column].append(value)
            self._buffered += 1
            if self._buffered >= self.buffer_rows or self._file_too_old():
                self._flush_locked()

    def write_many(self, events: Iterable[NackEvent]) -> None:
        """Buffer many events. Runtime: O(k)."""
        for event in events:
            self.write(event)

    def flush(self) -> None:
        """Write the buffer to the current file (a Parquet file stays hidden
        until it is rolled or the writer is closed)."""
        with self._lock:
            self._flush_locked()

    def roll(self) -> None:
        """Flush and complete the current file, making it visible to readers."""
        with self._lock:
            self._flush_locked()
            self._finish_file()

    def close(self) -> None:
        """Flush, complete the current file and refuse further events. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._flush_locked()
            self._finish_file()
            self._closed = True

    def __enter__(self) -> "EventLogWriter":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"EventLogWriter({str(self.directory)!r}, format={self.format!r}, "
                f"files={len(self.files)}, rows_written={self.rows_written}, buffered={self._buffered})")

    # -- files ------------------------------------------------------------------

    def _file_too_old(self) -> bool:
        return (self.roll_after_s is not None and self._file is not None
                and time.monotonic() - self._file_opened >= self.roll_after_s)

    def _flush_locked(self) -> None:
        start = 0
        n = self._buffered
        while start < n:
            if self._file is None:
                self._open_file()
            take = min(n - start, self.rows_per_file - self._file_rows)
            self._write_rows(start, start + take)
            start += take
            self._file_rows += take
            self.rows_written += take
            if self._file_rows >= self.rows_per_file or self._file_too_old():
                self._finish_file()
        for values in self._columns.values():
            values.clear()
        self._buffered = 0

    def _open_file(self) -> None:
        suffix = ".parquet" if self.format == "parquet" else ".jsonl"
        name = f"{self.prefix}-{self._run}-{self._seq:05d}{suffix}"
        self._seq += 1
        self._file_path = self.directory / name
        hidden = self.directory / f".{name}.inprogress"
        if self.format == "parquet":
            import pyarrow.parquet as pq

            # the stubs list the codecs as a Literal; the writer takes any str and names a bad one itself
            self._file = pq.ParquetWriter(hidden, arrow_schema(),
                                          compression=self.compression)  # type: ignore[arg-type]
        else:
            self._file = open(hidden, "w", encoding="utf-8")
        self._file_rows = 0
        self._file_opened = time.monotonic()

    def _write_rows(self, lo: int, hi: int) -> None:
        cols = self._columns
        if self.format == "parquet":
            import pyarrow as pa

            batch = pa.table({c: cols[c][lo:hi] for c in COLUMNS}, schema=arrow_schema())
            self._file.write_table(batch)
        else:
            dumps = json.dumps
            lines = [dumps(dict(zip(COLUMNS, row)), separators=(",", ":"))
                     for row in zip(*(cols[c][lo:hi] for c in COLUMNS))]
            self._file.write("\n".join(lines) + "\n")

    def _finish_file(self) -> None:
        path = self._file_path
        if self._file is None or path is None:
            return
        self._file.close()
        hidden = path.parent / f".{path.name}.inprogress"
        os.replace(hidden, path)
        self.files.append(path)
        self._file = None
        self._file_path = None
        self._file_rows = 0


def _check_event(event: Any) -> tuple[Any, ...]:
    """The event's fields as a tuple in :data:`COLUMNS` order, checked."""
    try:
        row = tuple(getattr(event, c) for c in COLUMNS)
    except AttributeError as e:
        raise ColumnTypeError(f"event must be a NackEvent, got {type(event).__name__} ({e})",
                              getattr(e, "name", None)) from None
    for column, value in zip(COLUMNS, row):
        if column in _INT_COLUMNS:
            if type(value) is not int:
                raise ColumnTypeError(f"event field {column!r} must be an int, not {type(value).__name__}",
                                      column)
            if value < 0 and column in NON_NEGATIVE_COLUMNS:
                raise BadValueError(f"event field {column!r} must be >= 0, got {value}", column)
            if value >= 1 << (63 if COLUMN_TYPES[column] == "int64" else 31):
                raise BadValueError(f"event field {column!r} is too large: {value}", column)
            if value > MAX_TIME_MS and column in TIME_COLUMNS:
                raise BadValueError(f"event field {column!r} must be <= {MAX_TIME_MS} (2^61 - 1 ms), got {value}",
                                    column)
        elif value is not None and type(value) is not str:
            raise ColumnTypeError(f"event field {column!r} must be a str, not {type(value).__name__}", column)
    if row[1] not in KINDS:
        raise BadValueError(f"event field 'kind' must be one of {', '.join(KINDS)}, got {row[1]!r}", "kind")
    return row
