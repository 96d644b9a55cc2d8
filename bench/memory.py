"""Memory per tracked nack: seed 000's experiment, in fresh processes.

The workloads and the measurement live in
``nacktracker/pipeline/memory_experiment.py`` (shared with the Spark
``nacktracker sweep``).

Each configuration is built in a fresh subprocess and reports ``nbytes()`` and
the growth of the process's resident set (RSS) while building, per message.

    python -m bench.memory                       # the seed grid, 10M messages
    python -m bench.memory --x 8 --y 10 --json   # one row, machine-readable
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

from bench import run_module
from nacktracker.pipeline.memory_experiment import JAVA_HEAP_MB, JAVA_MB, seed_estimate, workload  # noqa: F401
from nacktracker.pipeline.memory_experiment import measure as measure_one

INDEXES = ("TimeBucketIndex", "DictIndex", "HeapIndex")
GRID = [(x, y) for x in (1, 4, 8) for y in (8, 10, 15)]


def run_fresh(index: str, kind: str, messages: int, x: int, y: int,
              entries_per_ledger: int = 50_000, share: float = 0.1) -> dict:
    """Run :func:`measure_one` in a fresh interpreter and return its row."""
    out = run_module("bench.memory", "--one", "--index", index, "--workload", kind, "--messages", str(messages),
                     "--x", str(x), "--y", str(y), "--entries-per-ledger", str(entries_per_ledger), "--share", str(share))
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


def table(rows: list[dict], grid_columns: bool = False) -> str:
    """The memory table; ``grid_columns`` adds entries/ledger and share (the sweep's)."""
    head = ("| index | workload | x | y | messages | nbytes B/msg | RSS B/msg | total MB (RSS) "
            "| seed estimate B/msg | Java MB (seed 000) |")
    if grid_columns:
        head += " entries/ledger | share |"
    lines = [head, "|" + "---|" * head.count(" |")]
    if rows and min(r["messages"] for r in rows) < 5_000_000:
        lines.insert(0, "RSS is page-granular: below ~1 MB of growth trust nbytes more than RSS.\n")
    for r in rows:
        seq = r["index"] == "TimeBucketIndex" and r["workload"] == "sequential"
        java: float | str | None = None
        if seq and r.get("entries_per_ledger", 50_000) == 50_000:
            java = JAVA_MB.get((r["x"], r["y"]))
        elif r["index"] == "HeapIndex":
            java = f"{JAVA_HEAP_MB} (heap of triples)"
        est = seed_estimate(r["x"], r["y"], r.get("entries_per_ledger", 50_000)) if seq else None
        line = (f"| {r['index']} | {r['workload']} | {r['x']} | {r['y']} | {r['messages']:,} "
                f"| {r['nbytes_per_msg']:.3f} | {r['rss_per_msg']:.3f} | {r['rss_growth'] / 2**20:.1f} "
                f"| {'' if est is None else f'{est:.3f}'} | {'' if java is None else java} |")
        if grid_columns:
            line += f" {r['entries_per_ledger']:,} | {r['share']:g} |"
        lines.append(line)
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
    p.add_argument("--save", metavar="DIR", help="also write DIR/results.json (the rows, the command, the date "
                   "and the load) and DIR/RESULTS.md (bench/results/seed-table for the seed table; "
                   "python -m bench.figures renders it into docs/benchmarks.md)")
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
    before = os.getloadavg()
    for index, kind, messages, x, y in configurations(a.messages, indexes, grid, random_y=(a.y or 10,)):
        if a.workload not in ("all", kind):
            continue
        row = run_fresh(index, kind, messages, x, y, a.entries_per_ledger, a.share)
        rows.append(row)
        if not a.json:
            print(f"  {index:16} {kind:10} x={x} y={y:<2} {row['nbytes_per_msg']:.3f} B/msg "
                  f"(RSS {row['rss_per_msg']:.3f})", file=sys.stderr)
    if a.save:
        out = Path(a.save)
        out.mkdir(parents=True, exist_ok=True)
        record = {"command": "python -m bench.memory " + " ".join(argv if argv is not None else sys.argv[1:]),
                  "recorded": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "messages": a.messages, "loadavg_before": [round(v, 2) for v in before],
                  "loadavg_after": [round(v, 2) for v in os.getloadavg()], "cores": os.cpu_count(), "rows": rows}
        (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
        (out / "RESULTS.md").write_text(
            f"## bytes per tracked nack: `{record['command']}`\n\n{a.messages:,} nacks per row, each a fresh process, "
            f"recorded {record['recorded']}, load average {record['loadavg_before'][0]:.2f} → "
            f"{record['loadavg_after'][0]:.2f} on {record['cores']} cores (memory figures, not timings). `nbytes()` "
            f"counts each allocation as pymalloc and malloc take it. Earlier runs: HISTORY.md, where there is one."
            f"\n\n{table(rows)}\n")
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"`python -m bench.memory --messages {a.messages}`\n")
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
