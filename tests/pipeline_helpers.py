"""Independent references for the pipeline tests: an exact replay of nacks
through the real TimeBucketIndex, and a trace read back with pyarrow."""

from __future__ import annotations

import array
import itertools

import pyarrow.parquet as pq

from nacktracker import TimeBucketIndex


def replay(rows, bits, rounding="floor", stop_at=None):
    """Feed ``(ts, ledger, entry, due)`` nacks to a TimeBucketIndex in time order,
    firing every bucket whose time has come as a tracker's timer does: armed
    at the earliest bucket added, it pops what is due and re-arms at
    ``next_due_ms()`` (which gathers the front bucket into dense cells: only
    then, not after every add). Returns ``(peak, first instant, index)``;
    with ``stop_at`` the index is the state at that instant."""
    idx = TimeBucketIndex(precision_bits=bits, rounding=rounding)
    peak, at, timer = 0, None, None
    for ts, group in itertools.groupby(sorted(rows), key=lambda r: r[0]):
        if stop_at is not None and ts > stop_at:
            break
        if timer is not None and timer <= ts:
            idx.pop_due(ts)
            timer = idx.next_due_ms()
        for _, ledger, entry, due in group:
            idx.add(ledger, entry, due)
            bucket = idx.bucket_of(due)
            timer = bucket if timer is None else min(timer, bucket)
        if timer is not None and timer <= ts:  # a bucket already in the past fires at once
            idx.pop_due(ts)
            timer = idx.next_due_ms()
        if len(idx) > peak:
            peak, at = len(idx), ts
    return peak, at, idx


def fresh_copy(idx: TimeBucketIndex) -> TimeBucketIndex:
    """The same pending messages in a freshly built index."""
    out = TimeBucketIndex(precision_bits=idx.precision_bits, rounding=idx.rounding)
    for bucket, ledger, bm in idx.iter_bitmaps():
        out.add_many(ledger, array.array("Q", bm) if bm.max() >= 1 << 32 else array.array("I", bm), bucket)
    out.compact()
    return out


def nacks_by_consumer(path):
    table = pq.read_table(path).to_pandas()
    table = table[table["kind"] == "nack"]
    out = {}
    for name, g in table.groupby("consumer"):
        out[name] = list(zip(g["ts_ms"].tolist(), g["ledger_id"].tolist(), g["entry_id"].tolist(),
                             (g["ts_ms"] + g["delay_ms"]).tolist()))
    return out
