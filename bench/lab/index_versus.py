"""Two checkouts' TimeBucketIndex side by side: grid cells (``bench.index_grid
--one``) and seed-table rows (``bench.memory --one``), each a fresh process,
the two codes alternating (the order flipped every round), so a comparison
is a ratio measured in one run.

``before``/``after``: roots of two checkouts (e.g. ``git archive main | tar -x
-C /tmp/before``); each row runs that checkout's own bench script with its
package first on ``PYTHONPATH``. Prints a Markdown table per kind: nbytes
and RSS per pending message, ``add`` ns (best round in its process) and
``add`` over a DictIndex copy in the same process, per round and their
median ratio. Run it under ``flock /work/bench.lock`` on a shared machine.

    python -m bench.lab.index_versus /tmp/before /tmp/after [--rounds 2] [--no-seed]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CELLS = [({"delays": "uniform", "k": 3, "ledgers": 16, "rate": 1000, "seconds": 70}, 0),
         ({"delays": "uniform", "k": 3, "ledgers": 16, "rate": 1000, "seconds": 70}, 10),
         ({"delays": "backoff", "k": 1, "ledgers": 1, "rate": 10, "seconds": 70}, 10),
         ({"delays": "uniform", "k": 8, "ledgers": 16, "rate": 100, "seconds": 70}, 4),
         ({"delays": "backoff", "k": 20, "ledgers": 1, "rate": 10000, "seconds": 70}, 10)]
SEED_ROWS = [("sequential", 1, 8), ("sequential", 4, 10), ("sequential", 8, 15), ("random", 1, 10)]


def run(root: Path, script: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, str(root / "bench" / script), *args], check=True, capture_output=True,
                         text=True, env=env, cwd="/tmp")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-seed", action="store_true")
    a = p.parse_args(argv)
    print(f"load average at the start: {Path('/proc/loadavg').read_text().strip()}")
    codes = {"before": a.before, "after": a.after}
    grid: dict[tuple[str, int], dict[str, list[dict]]] = {}
    for r in range(a.rounds):
        for cell, bits in CELLS:
            for code in (("before", "after") if r % 2 == 0 else ("after", "before")):
                row = run(codes[code], "index_grid.py", "--one", "TimeBucketIndex", json.dumps(cell), str(bits), "50000")
                grid.setdefault((json.dumps(cell), bits), {}).setdefault(code, []).append(row)
    print("\n| cell | bits | nbytes B/pending before -> after | RSS B/pending | add ns per round | add/DictIndex |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for (cell, bits), got in grid.items():
        b, f = got["before"], got["after"]
        c = json.loads(cell)
        per = [y["add_ns"] / x["add_ns"] for x, y in zip(b, f)]
        ratios += per
        adds = ["/".join(format(x["add_ns"], ".0f") for x in rows) for rows in (b, f)]
        per_round = ", ".join(format(x, ".3f") for x in per)
        print(f"| {c['delays']} k={c['k']} L={c['ledgers']} {c['rate']}/s | {bits} "
              f"| {b[0]['nbytes_per_pending']:.3f} -> {f[0]['nbytes_per_pending']:.3f} "
              f"({f[0]['nbytes'] / f[0]['pending'] / (b[0]['nbytes'] / b[0]['pending']):.3f}) "
              f"| {b[0]['rss_per_pending']:.2f} -> {f[0]['rss_per_pending']:.2f} "
              f"| {adds[0]} -> {adds[1]} ({per_round}) "
              f"| {statistics.median(x['add_vs_dict'] for x in b):.2f} -> {statistics.median(x['add_vs_dict'] for x in f):.2f} |")
    print(f"\nadd after/before: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")
    if not a.no_seed:
        print("\n| workload | x | y | nbytes B/msg before -> after | RSS B/msg before -> after |")
        print("|---|---|---|---|---|")
        for kind, x, y in SEED_ROWS:
            rows = {code: run(root, "memory.py", "--one", "--index", "TimeBucketIndex", "--workload", kind,
                              "--messages", "10000000", "--x", str(x), "--y", str(y)) for code, root in codes.items()}
            b, f = rows["before"], rows["after"]
            print(f"| {kind} | {x} | {y} | {b['nbytes_per_msg']:.4f} -> {f['nbytes_per_msg']:.4f} "
                  f"({f['nbytes'] / b['nbytes']:.4f}) | {b['rss_per_msg']:.4f} -> {f['rss_per_msg']:.4f} |")
    print(f"\nload average at the end: {Path('/proc/loadavg').read_text().strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
