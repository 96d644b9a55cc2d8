"""Nack event logs: the EventLogWriter hook and the schema checks (no Spark here)."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nacktracker import ManualClock, MessageKey, NegativeAcksTracker
from nacktracker.adapters import MemoryAdapter
from nacktracker.events import (
    COLUMNS,
    KINDS,
    REQUIRED_COLUMNS,
    BadValueError,
    ColumnTypeError,
    EmptyTraceError,
    EventLogWriter,
    MissingColumnError,
    NackEvent,
    TraceError,
    arrow_schema,
    check_schema,
    validate_table,
)

T0 = 1_700_000_000_000


def ev(i=0, kind="nack", **kw):
    base = dict(ts_ms=T0 + i, kind=kind, ledger_id=42, entry_id=i, delay_ms=1000, consumer="c1", topic="t")
    base.update(kw)
    return NackEvent(**base)


def read_dir(path):
    files = sorted(p for p in os.listdir(path) if not p.startswith("."))
    return pa.concat_tables([pq.read_table(os.path.join(path, f)) for f in files]) if files else None


# -- the record ------------------------------------------------------------------

def test_record_columns_and_kinds_are_stable():
    assert COLUMNS == ("ts_ms", "kind", "ledger_id", "entry_id", "delay_ms", "redelivery_count",
                       "partition", "batch_index", "topic", "consumer")
    assert KINDS == ("nack", "redeliver", "dead_letter")
    assert [f.name for f in arrow_schema()] == list(COLUMNS)


# -- the writer ------------------------------------------------------------------

def test_writer_round_trips_parquet(tmp_path):
    events = [ev(i) for i in range(10)] + [ev(10, "redeliver", delay_ms=0), ev(11, "dead_letter", consumer=None)]
    with EventLogWriter(tmp_path) as w:
        w.write_many(events)
    table = read_dir(tmp_path)
    assert table.schema.equals(arrow_schema())
    assert table.to_pylist() == [e.to_dict() for e in events]
    validate_table(table)
    assert w.rows_written == 12 and len(w.files) == 1


def test_writer_rolls_files_by_rows_and_flushes_in_row_groups(tmp_path):
    w = EventLogWriter(tmp_path, rows_per_file=10, buffer_rows=4)
    for i in range(25):
        w(ev(i))
    assert len(w.files) == 2  # 20 rows done, 5 rows in an open file or the buffer
    w.close()
    assert [pq.read_metadata(f).num_rows for f in w.files] == [10, 10, 5]
    assert pq.read_metadata(w.files[0]).num_row_groups == 3  # flushes of 4, 4 and 2 rows
    assert read_dir(tmp_path).column("entry_id").to_pylist() == list(range(25))


def test_an_open_file_is_hidden_until_it_is_complete(tmp_path):
    w = EventLogWriter(tmp_path, buffer_rows=2)
    w.write_many([ev(0), ev(1), ev(2)])  # one flush: a file is open
    visible = [p for p in os.listdir(tmp_path) if not p.startswith((".", "_"))]
    assert visible == [] and any(p.endswith(".inprogress") for p in os.listdir(tmp_path))
    w.roll()
    assert [p.name for p in w.files] == os.listdir(tmp_path)
    assert read_dir(tmp_path).num_rows == 3
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        w(ev(9))


def test_writer_rolls_old_files(tmp_path):
    w = EventLogWriter(tmp_path, buffer_rows=1, roll_after_s=0.05)
    w(ev(0))
    time.sleep(0.06)
    w(ev(1))  # the file is older than roll_after_s: completed after this flush
    assert len(w.files) == 1
    w.close()
    assert read_dir(tmp_path).num_rows == 2


def test_writer_jsonl(tmp_path):
    with EventLogWriter(tmp_path, format="jsonl", rows_per_file=2) as w:
        w.write_many([ev(0), ev(1), ev(2, consumer=None)])
    lines = [json.loads(line) for f in w.files for line in f.read_text().splitlines()]
    assert [f.suffix for f in w.files] == [".jsonl", ".jsonl"]
    assert lines == [ev(0).to_dict(), ev(1).to_dict(), ev(2, consumer=None).to_dict()]


@pytest.mark.parametrize("field, value, error", [
    ("kind", "ack", BadValueError), ("kind", None, BadValueError),
    ("ledger_id", -1, BadValueError), ("entry_id", -5, BadValueError), ("ts_ms", -1, BadValueError),
    ("delay_ms", -1, BadValueError), ("entry_id", 1 << 63, BadValueError),
    ("ts_ms", (1 << 63) - 10, BadValueError), ("delay_ms", 1 << 61, BadValueError),
    ("ledger_id", "7", ColumnTypeError), ("ts_ms", 1.5, ColumnTypeError), ("entry_id", None, ColumnTypeError),
    ("consumer", 7, ColumnTypeError), ("ts_ms", True, ColumnTypeError),
])
def test_writer_rejects_bad_events_naming_the_field(tmp_path, field, value, error):
    w = EventLogWriter(tmp_path)
    with pytest.raises(error, match=field) as info:
        w(ev(1, **{field: value}) if field != "kind" else ev(1, kind=value))
    assert info.value.column == field
    assert isinstance(info.value, TraceError)
    assert w.rows_written == 0 and w._buffered == 0
    with pytest.raises(ColumnTypeError):
        w({"ts_ms": 1})
    w.close()


def test_writer_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="format"):
        EventLogWriter(tmp_path, format="csv")
    with pytest.raises(ValueError):
        EventLogWriter(tmp_path, rows_per_file=0)


async def test_writer_is_the_trackers_on_event_hook(tmp_path):
    clock = ManualClock(start_ms=1_000_000)
    writer = EventLogWriter(tmp_path)
    tracker = NegativeAcksTracker(MemoryAdapter(clock=clock.now_ms), clock=clock, precision_bits=0,
                                  on_event=writer, max_redeliveries=3, on_dead_letter=lambda key: None,
                                  consumer_name="orders-1")
    tracker.add(MessageKey(7, 1, topic="t"), delay_ms=10)
    tracker.add(MessageKey(7, 2, topic="t"), redelivery_count=3)
    clock.advance(11)
    for _ in range(5):
        await asyncio.sleep(0)
    await tracker.close()
    writer.close()
    table = read_dir(tmp_path)
    validate_table(table)
    rows = table.to_pylist()
    assert [(r["kind"], r["entry_id"]) for r in rows] == [("nack", 1), ("dead_letter", 2), ("redeliver", 1)]
    assert {r["consumer"] for r in rows} == {"orders-1"} and rows[0]["delay_ms"] == 10


# -- the checks ------------------------------------------------------------------

def table_of(**columns):
    good = {"ts_ms": [T0, T0 + 1], "kind": ["nack", "redeliver"], "ledger_id": [1, 1], "entry_id": [0, 1],
            "delay_ms": [10, 0], "consumer": ["a", None]}
    good.update(columns)
    return pa.table({k: v for k, v in good.items() if v is not None})


def test_validate_accepts_the_minimum_and_any_integer_width():
    validate_table(table_of())
    validate_table(table_of(ledger_id=pa.array([1, 2], pa.int32()), entry_id=pa.array([0, 1], pa.uint16())))
    validate_table(table_of(consumer=pa.array([None, None], pa.null())))


@pytest.mark.parametrize("column", REQUIRED_COLUMNS)
def test_missing_column_is_named(column):
    with pytest.raises(MissingColumnError, match=repr(column)) as info:
        validate_table(table_of(**{column: None}))
    assert info.value.column == column


@pytest.mark.parametrize("column, values", [
    ("ledger_id", ["1", "2"]), ("entry_id", [0.5, 1.0]), ("ts_ms", [True, False]), ("kind", [1, 2]),
    ("consumer", [1, 2]), ("delay_ms", ["10", "0"]),
])
def test_wrong_type_is_named(column, values):
    with pytest.raises(ColumnTypeError, match=repr(column)) as info:
        validate_table(table_of(**{column: values}))
    assert info.value.column == column and isinstance(info.value, TypeError)


def test_optional_columns_are_type_checked_when_present():
    with pytest.raises(ColumnTypeError, match="'partition'"):
        validate_table(table_of(partition=["p0", "p1"]))


@pytest.mark.parametrize("column, values", [
    ("ledger_id", [1, -1]), ("entry_id", [-3, 1]), ("ts_ms", [-1, 2]), ("delay_ms", [-10, 0]),
])
def test_negative_values_are_named(column, values):
    with pytest.raises(BadValueError, match=repr(column)) as info:
        validate_table(table_of(**{column: values}))
    assert info.value.column == column


@pytest.mark.parametrize("column, values", [
    ("ts_ms", [T0, (1 << 63) - 10]), ("ts_ms", [T0, 1 << 61]), ("delay_ms", [0, 1 << 61]),
])
def test_times_beyond_the_due_time_range_are_named_with_the_limit(column, values):
    """ts_ms + delay_ms must fit the tracker's due times and an int64: each at most 2^61 - 1 ms."""
    with pytest.raises(BadValueError, match=rf"'{column}' must be <= 2305843009213693951 \(2\^61 - 1 ms") as info:
        validate_table(table_of(**{column: values}))
    assert info.value.column == column
    validate_table(table_of(**{column: [v if v < 1 << 61 else (1 << 61) - 1 for v in values]}))  # the limit itself


def test_nulls_and_unknown_kinds_are_named():
    with pytest.raises(BadValueError, match="'ts_ms'.*null"):
        validate_table(table_of(ts_ms=[T0, None]))
    with pytest.raises(BadValueError, match="'kind'.*'ack'"):
        validate_table(table_of(kind=["nack", "ack"]))


def test_empty_table():
    with pytest.raises(EmptyTraceError, match="no events"):
        validate_table(table_of().slice(0, 0))


def test_check_schema_lists_every_missing_column():
    with pytest.raises(MissingColumnError, match="missing: kind, delay_ms") as info:
        check_schema({"ts_ms": "integer", "ledger_id": "integer", "entry_id": "integer", "consumer": "string"})
    assert info.value.column == "kind"
