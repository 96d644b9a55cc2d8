"""Index throughput: ns per message for add, add_many, pop_due, pop_due_bitmaps
and discard (of pending ids, and of ids that are not pending), for TimeBucketIndex, DictIndex and HeapIndex in the same run;
and the dict baseline's cost of one poll tick (a full scan) at 1M and 10M pending.

Every figure is the median of ``--repeats`` runs (min and max beside it), each
run on a fresh index.

    python -m bench.throughput              # full
    python -m bench.throughput --quick      # smaller, fewer repeats
    python -m bench.throughput --json
"""

from __future__ import annotations

import argparse
import array
import gc
import json
import statistics
import sys
import time

import nacktracker

INDEXES = ("TimeBucketIndex", "DictIndex", "HeapIndex")


def sequential(n: int, x: int = 8, per_ledger: int = 50_000):
    """Seed 000's workload as three lists: ledgers, entries, due times."""
    return ([10_000 + i // per_ledger for i in range(n)], [i % per_ledger for i in range(n)],
            [1_000_000 + i // x for i in range(n)])


def timed(fn) -> float:
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    finally:
        gc.enable()


def stat(samples_ns: list[float]) -> dict:
    return {"median": statistics.median(samples_ns), "min": min(samples_ns), "max": max(samples_ns),
            "runs": len(samples_ns)}


def bench_add(cls, n: int, repeats: int) -> dict:
    ledgers, entries, dues = sequential(n)
    out = []
    for _ in range(repeats):
        idx = cls(precision_bits=10)
        add = idx.add
        out.append(timed(lambda: [add(l, e, d) for l, e, d in zip(ledgers, entries, dues)]) / n * 1e9)
    return stat(out)


def bench_add_many(cls, n: int, batch: int, repeats: int) -> dict:
    batches = [(10_000 + (i * batch) // 50_000, array.array("I", range(i * batch % 50_000, i * batch % 50_000 + batch)),
                1_000_000 + i) for i in range(max(1, n // batch))]
    total = len(batches) * batch
    out = []
    for _ in range(repeats):
        idx = cls(precision_bits=10)
        add_many = idx.add_many
        out.append(timed(lambda: [add_many(l, ids, d) for l, ids, d in batches]) / total * 1e9)
    return stat(out)


def _filled(cls, n: int, bits: int = 10):
    idx = cls(precision_bits=bits)
    ledgers, entries, dues = sequential(n)
    for l, e, d in zip(ledgers, entries, dues):
        idx.add(l, e, d)
    return idx


def bench_pop_due(cls, n: int, repeats: int) -> dict:
    out = []
    for _ in range(repeats):
        idx = _filled(cls, n)
        out.append(timed(lambda: idx.pop_due(2**62)) / n * 1e9)
        assert len(idx) == 0
    return stat(out)


def bench_pop_due_bitmaps(n: int, repeats: int) -> dict:
    """One bucket holding n messages (consecutive ids across ledgers)."""
    out = []
    for _ in range(repeats):
        idx = nacktracker.TimeBucketIndex(precision_bits=20)
        for start in range(0, n, 50_000):
            idx.add_many(10_000 + start // 50_000, array.array("I", range(min(50_000, n - start))), 1 << 20)
        assert idx.bucket_count() == 1 and len(idx) == n
        out.append(timed(lambda: idx.pop_due_bitmaps(2**62)) / n * 1e9)
    return stat(out)


def bench_discard(cls, n: int, k: int, repeats: int) -> dict:
    ledgers, entries, _ = sequential(n)
    step = max(1, n // k)
    picks = list(zip(ledgers[::step], entries[::step]))
    out = []
    for _ in range(repeats):
        idx = _filled(cls, n)
        discard = idx.discard
        out.append(timed(lambda: [discard(l, e) for l, e in picks]) / len(picks) * 1e9)
    return stat(out)


def bench_discard_miss(cls, n: int, k: int, repeats: int) -> dict:
    """``discard`` of ids that are not pending (what every ``acknowledge`` of a
    message that was never nacked does): ids of ledgers that hold nacks, each
    one past the ledger's nacked range."""
    ledgers, entries, _ = sequential(n)
    step = max(1, n // k)
    picks = [(l, 50_000 + e) for l, e in zip(ledgers[::step], entries[::step])]
    out = []
    for _ in range(repeats):
        idx = _filled(cls, n)
        discard = idx.discard
        out.append(timed(lambda: [discard(l, e) for l, e in picks]) / len(picks) * 1e9)
        assert len(idx) == n
    return stat(out)


def bench_scan_tick(n: int, repeats: int) -> dict:
    """One poll of the pre-PIP-393 design with n pending and nothing due."""
    idx = _filled(nacktracker.DictIndex, n)
    out = [timed(lambda: idx.pop_due(0)) * 1e9 for _ in range(repeats)]
    return stat(out)


def run(quick: bool = False, repeats: int | None = None, progress=None) -> dict:
    repeats = repeats or 3
    n = 200_000 if quick else 1_000_000
    slow_n = n // 5  # the baselines' add_many is a Python loop
    rows: list[dict] = []

    def note(what):
        if progress:
            progress(what)

    for name in INDEXES:
        cls = getattr(nacktracker, name)
        note(f"add {name}")
        rows.append({"op": "add", "index": name, "n": n, **bench_add(cls, n, repeats)})
        for batch in (64, 1024, 16384):
            note(f"add_many[{batch}] {name}")
            m = n if name == "TimeBucketIndex" else slow_n
            rows.append({"op": f"add_many[{batch}]", "index": name, "n": m, **bench_add_many(cls, m, batch, repeats)})
        note(f"pop_due {name}")
        rows.append({"op": "pop_due", "index": name, "n": n, **bench_pop_due(cls, n, repeats)})
        note(f"discard {name}")
        rows.append({"op": "discard", "index": name, "n": n, **bench_discard(cls, n, 10_000, repeats)})
        note(f"discard (not pending) {name}")
        rows.append({"op": "discard (not pending)", "index": name, "n": n,
                     **bench_discard_miss(cls, n, 10_000, repeats)})
    note("pop_due_bitmaps")
    rows.append({"op": "pop_due_bitmaps (one bucket)", "index": "TimeBucketIndex", "n": n * 1,
                 **bench_pop_due_bitmaps(1_000_000, repeats)})
    ticks = []
    for pending in ((1_000_000,) if quick else (1_000_000, 10_000_000)):
        note(f"scan tick {pending:,}")
        ticks.append({"pending": pending, **bench_scan_tick(pending, repeats)})
    return {"rows": rows, "scan_ticks": ticks, "repeats": repeats, "quick": quick}


def table(result: dict) -> str:
    cmd = "python -m bench.throughput" + (" --quick" if result["quick"] else "")
    lines = [f"`{cmd}` — ns per message, median of {result['repeats']} runs (min–max)", "",
             "| operation | " + " | ".join(INDEXES) + " |", "|---|" + "---|" * len(INDEXES)]
    ops = dict.fromkeys(r["op"] for r in result["rows"])
    for op in ops:
        cells = []
        for name in INDEXES:
            r = next((r for r in result["rows"] if r["op"] == op and r["index"] == name), None)
            cells.append("—" if r is None else f"{r['median']:.1f} ({r['min']:.1f}–{r['max']:.1f})")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    lines += ["", "DictIndex: one poll tick (a full scan, nothing due); TimeBucketIndex needs no scan "
              "(`next_due_ms()` is O(1))", "", "| pending | ms per tick (min–max) |", "|---|---|"]
    for t in result["scan_ticks"]:
        lines.append(f"| {t['pending']:,} | {t['median'] / 1e6:.1f} ({t['min'] / 1e6:.1f}–{t['max'] / 1e6:.1f}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeats", type=int)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    result = run(a.quick, a.repeats, progress=lambda s: print(f"  {s}", file=sys.stderr))
    print(json.dumps(result, indent=1) if a.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
