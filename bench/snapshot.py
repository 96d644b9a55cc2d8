"""Snapshot size and save/restore time of NegativeAcksTracker at N pending.

Workloads (as bench/memory.py, seed 000):

* ``sequential``: entry ids 0..49,999 of a ledger, then the next ledger; the due
  time advances 1 ms every 8 nacks (x=8);
* ``random``: 10% of each ledger's entries, drawn at random, x=8.

The tracker (precision_bits=8, ManualClock held still so nothing fires) is
filled through ``tracker.add``; then, on one core:

* ``snapshot``: ``tracker.snapshot()`` (bytes in memory);
* ``save``: ``tracker.save(path)`` (snapshot + temp file + fsync + rename + fsync dir);
* ``decode``: ``snapshot.decode(data)`` (checksums, parse, deserialise bitmaps);
* ``restore``: ``NegativeAcksTracker.restore(data, adapter)`` (decode + rebuild);
* ``load``: ``NegativeAcksTracker.load(path, adapter)`` (read file + restore).

    python -m bench.snapshot                     # 10M pending, both workloads
    python -m bench.snapshot --pending 1000000 --workload random --json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import sys
import tempfile
import time

from nacktracker import ManualClock, MessageKey, NegativeAcksTracker
from nacktracker import snapshot as snap

ENTRIES_PER_LEDGER = 50_000
X = 8  # nacks per ms


class NullAdapter:
    lead_ms = 0

    async def redeliver(self, keys) -> None:  # never called: the clock stands still
        raise AssertionError("nothing should fire")


def fill(tracker: NegativeAcksTracker, workload: str, n: int) -> None:
    add = tracker.add
    if workload == "sequential":
        for i in range(n):
            add(MessageKey(10_000 + i // ENTRIES_PER_LEDGER, i % ENTRIES_PER_LEDGER), delay_ms=1000 + i // X)
        return
    rng = random.Random(1)
    per_ledger = ENTRIES_PER_LEDGER // 10
    i, ledger = 0, 10_000
    while i < n:
        for entry in rng.sample(range(ENTRIES_PER_LEDGER), min(per_ledger, n - i)):
            add(MessageKey(ledger, entry), delay_ms=1000 + i // X)
            i += 1
        ledger += 1


def timed(fn):
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


async def one(workload: str, n: int, directory: str) -> dict:
    clock = ManualClock(start_ms=1_000_000)
    tracker = NegativeAcksTracker(NullAdapter(), clock=clock, precision_bits=8)
    _, t_fill = timed(lambda: fill(tracker, workload, n))
    assert tracker.pending == n
    data, t_snap = timed(tracker.snapshot)
    path = os.path.join(directory, f"{workload}.snap")
    _, t_save = timed(lambda: tracker.save(path))
    decoded, t_decode = timed(lambda: snap.decode(data))
    restored, t_restore = timed(lambda: NegativeAcksTracker.restore(data, NullAdapter(), clock=clock,
                                                                    elapsed="none"))
    assert restored.pending == n and restored.next_fire_ms() == tracker.next_fire_ms()
    del restored
    loaded, t_load = timed(lambda: NegativeAcksTracker.load(path, NullAdapter(), clock=clock, elapsed="none"))
    assert loaded.pending == n
    result = {
        "workload": workload, "pending": n, "bitmaps": tracker._index.bitmap_count(),
        "tracker_nbytes": tracker.nbytes(), "restored_nbytes": loaded.nbytes(),
        "snapshot_bytes": len(data), "file_bytes": os.path.getsize(path),
        "bytes_per_pending": round(len(data) / n, 4),
        "fill_s": round(t_fill, 2), "snapshot_s": round(t_snap, 4), "save_s": round(t_save, 4),
        "decode_s": round(t_decode, 4), "restore_s": round(t_restore, 4), "load_s": round(t_load, 4),
        "records": len(decoded.records),
    }
    os.unlink(path)
    return result


def run(quick: bool = False, pending: int | None = None, workloads=("sequential", "random"),
        directory: str | None = None) -> dict:
    """``bench/suite.py`` calls ``run(quick=...)``: 10M pending, or 200k when quick."""
    n = pending or (200_000 if quick else 10_000_000)
    with tempfile.TemporaryDirectory(dir=directory) as d:
        rows = [asyncio.run(one(w, n, d)) for w in workloads]
    return {"pending": n, "rows": rows, "python": sys.version.split()[0], "quick": quick}


def table(result: dict) -> str:
    out = [f"`python -m bench.snapshot --pending {result['pending']}` — precision_bits=8, x={X} nacks/ms, "
           "one core", "",
           "| workload | pending | bitmaps | tracker MB | snapshot MB | B/pending | snapshot s | save s "
           "| decode s | restore s | load s | restored MB |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        out.append(f"| {r['workload']} | {r['pending']:,} | {r['bitmaps']:,} | {r['tracker_nbytes'] / 1e6:.2f} "
                   f"| {r['snapshot_bytes'] / 1e6:.2f} | {r['bytes_per_pending']} | {r['snapshot_s']} "
                   f"| {r['save_s']} | {r['decode_s']} | {r['restore_s']} | {r['load_s']} "
                   f"| {r['restored_nbytes'] / 1e6:.2f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pending", type=int, default=10_000_000)
    p.add_argument("--workload", choices=("sequential", "random", "both"), default="both")
    p.add_argument("--dir", default=None, help="where to write the snapshot file (default: the temp dir)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    workloads = ("sequential", "random") if a.workload == "both" else (a.workload,)
    result = run(pending=a.pending, workloads=workloads, directory=a.dir)
    print(json.dumps(result, indent=1) if a.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
