"""Memory per tracked nack: seed 000's experiment, in fresh processes.

The workloads and the measurement live in ``nacktracker/workloads.py``
(shared with the Spark ``nacktracker sweep``).

Each configuration is built in a fresh subprocess and reports ``nbytes()`` and
the growth of the process's resident set (RSS) while building, per message.

    python bench/memory.py                       # the seed grid, 10M messages
    python bench/memory.py --x 8 --y 10 --json   # one row, machine-readable
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from nacktracker.workloads import JAVA_HEAP_MB, JAVA_MB, measure as measure_one, seed_estimate, table, workload  # noqa: F401

INDEXES = ("TimeBucketIndex", "DictIndex", "HeapIndex")
GRID = [(x, y) for x in (1, 4, 8) for y in (8, 10, 15)]


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
