"""Memory per tracked nack: seed 000's experiment, in fresh processes.

Workloads (seed 000, "Experimental verification"):

* ``sequential``: entry ids 0..E-1 of a ledger, then the next ledger; the due
  time advances 1 ms every ``x`` messages (``x`` nacks per ms);
* ``random``: the consumer nacks ``share`` of the entries at random (each
  ledger's nacked ids drawn without replacement); the due time advances 1 ms
  every ``x`` nacks, so bytes/message is per tracked nack, as in the seed.

Each configuration is built in a fresh subprocess and reports ``nbytes()`` and
the growth of the process's resident set (RSS) while building, per message.

    python bench/memory.py                       # the seed grid, 10M messages
    python bench/memory.py --x 8 --y 10 --json   # one row, machine-readable
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time

INDEXES = ("TimeBucketIndex", "DictIndex", "HeapIndex")
GRID = [(x, y) for x in (1, 4, 8) for y in (8, 10, 15)]
#: Java's measured figures for 10M messages, seed 000 (MB).
JAVA_MB = {(1, 10): 25.0, (4, 10): 20.48, (8, 10): 11.0, (8, 15): 2.25}
JAVA_HEAP_MB = 240.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def seed_estimate(x: int, y: int, entries_per_ledger: int = 50_000) -> float:
    """Seed 000's analytic bytes/message for M = x * 2^y messages per bucket."""
    m = x * (1 << y)
    if m < 4096:
        return 2.0
    if m < entries_per_ledger:
        return 8192 / m
    return 8192 / entries_per_ledger


def workload(kind: str, messages: int, x: int, entries_per_ledger: int, share: float, seed: int = 1):
    """Yield ``(ledger_id, entry_id, due_ms)`` in arrival order."""
    t0 = 1_000_000
    if kind == "sequential":
        for i in range(messages):
            yield 10_000 + i // entries_per_ledger, i % entries_per_ledger, t0 + i // x
        return
    rng = random.Random(seed)
    per_ledger = max(1, int(entries_per_ledger * share))
    i, ledger = 0, 10_000
    while i < messages:
        for entry in sorted(rng.sample(range(entries_per_ledger), per_ledger)):
            if i == messages:
                return
            yield ledger, entry, t0 + i // x
            i += 1
        ledger += 1


def measure_one(index: str, kind: str, messages: int, x: int, y: int,
                entries_per_ledger: int, share: float) -> dict:
    """Build one index in this process and measure it."""
    import nacktracker

    cls = getattr(nacktracker, index)
    gc.collect()
    before = rss_bytes()
    idx = cls(precision_bits=y)
    add = idx.add
    started = time.perf_counter()
    for ledger, entry, due in workload(kind, messages, x, entries_per_ledger, share):
        add(ledger, entry, due)
    if hasattr(idx, "compact"):
        idx.compact()
    build_s = time.perf_counter() - started
    gc.collect()
    grown = rss_bytes() - before
    nbytes = idx.nbytes()
    assert len(idx) == messages, (len(idx), messages)
    row = {
        "index": index, "workload": kind, "messages": messages, "x": x, "y": y,
        "entries_per_ledger": entries_per_ledger, "share": share if kind == "random" else 1.0,
        "nbytes": nbytes, "rss_growth": grown,
        "nbytes_per_msg": nbytes / messages, "rss_per_msg": grown / messages,
        "build_s": round(build_s, 2),
    }
    if hasattr(idx, "bucket_count"):
        row["buckets"] = idx.bucket_count()
        row["bitmaps"] = idx.bitmap_count()
    return row


def run_fresh(index: str, kind: str, messages: int, x: int, y: int,
              entries_per_ledger: int = 50_000, share: float = 0.1) -> dict:
    """Run :func:`measure_one` in a fresh interpreter and return its row."""
    cmd = [sys.executable, __file__, "--one", "--index", index, "--workload", kind,
           "--messages", str(messages), "--x", str(x), "--y", str(y),
           "--entries-per-ledger", str(entries_per_ledger), "--share", str(share)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def configurations(messages: int, indexes, grid, random_y=(10,), baselines_at=None):
    """``(index, workload, messages, x, y)`` to run. ``baselines_at``: run the
    per-message baselines only at these (x, y) — their bytes/message does not
    depend on x or y (a quick run uses it)."""
    for x, y in grid:
        for index in indexes:
            if index != "TimeBucketIndex" and baselines_at is not None and (x, y) not in baselines_at:
                continue
            yield index, "sequential", messages, x, y
    for y in random_y:
        for index in indexes:
            yield index, "random", messages, 1, y


def table(rows: list[dict]) -> str:
    head = ("| index | workload | x | y | messages | nbytes B/msg | RSS B/msg | total MB (RSS) "
            "| seed estimate B/msg | Java MB (seed 000) |")
    lines = [head, "|" + "---|" * 10]
    if rows and rows[0]["messages"] < 5_000_000:
        lines.insert(0, "RSS is page-granular: below ~1 MB of growth trust nbytes more than RSS.\n")
    for r in rows:
        java = None
        if r["index"] == "TimeBucketIndex" and r["workload"] == "sequential":
            java = JAVA_MB.get((r["x"], r["y"]))
        elif r["index"] == "HeapIndex":
            java = f"{JAVA_HEAP_MB} (heap of triples)"
        est = seed_estimate(r["x"], r["y"]) if r["index"] == "TimeBucketIndex" and r["workload"] == "sequential" else None
        lines.append(
            f"| {r['index']} | {r['workload']} | {r['x']} | {r['y']} | {r['messages']:,} "
            f"| {r['nbytes_per_msg']:.3f} | {r['rss_per_msg']:.3f} | {r['rss_growth'] / 2**20:.1f} "
            f"| {'' if est is None else f'{est:.3f}'} | {'' if java is None else java} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", choices=INDEXES + ("all",), default="all")
    p.add_argument("--workload", choices=("sequential", "random", "all"), default="all")
    p.add_argument("--messages", type=int, default=10_000_000)
    p.add_argument("--x", type=int, help="messages per ms (default: the seed grid)")
    p.add_argument("--y", type=int, help="precision bits (default: the seed grid)")
    p.add_argument("--entries-per-ledger", type=int, default=50_000)
    p.add_argument("--share", type=float, default=0.1, help="nacked share, random workload")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(measure_one(a.index, a.workload, a.messages, a.x, a.y,
                                     a.entries_per_ledger, a.share)))
        return 0
    indexes = INDEXES if a.index == "all" else (a.index,)
    grid = [(a.x or x, a.y or y) for x, y in GRID] if (a.x is None or a.y is None) else [(a.x, a.y)]
    grid = list(dict.fromkeys(grid))
    rows = []
    for index, kind, messages, x, y in configurations(a.messages, indexes, grid, random_y=(a.y or 10,)):
        if a.workload not in ("all", kind):
            continue
        row = run_fresh(index, kind, messages, x, y, a.entries_per_ledger, a.share)
        rows.append(row)
        if not a.json:
            print(f"  {index:16} {kind:10} x={x} y={y:<2} {row['nbytes_per_msg']:.3f} B/msg "
                  f"(RSS {row['rss_per_msg']:.3f})", file=sys.stderr)
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"`python bench/memory.py --messages {a.messages}`\n")
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
