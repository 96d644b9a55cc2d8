"""How much of the index's RSS on real traffic is churn: one cell of
``bench/index_grid.py``, its memory measured two ways, each in a fresh process.

* ``churned``: as the grid plays it (adds and pops, millisecond by
  millisecond, for the cell's 70 s), then RSS growth and ``nbytes()`` per
  pending message (``index_grid.py --one``);
* ``settled``: only the messages still pending at the end, added in arrival
  order with no pop: the same pending set, the same structures, without
  the allocations and frees that 70 s of traffic leave behind.

Both start from the same baseline (warm-up, numpy's block cache filled, the
C heap trimmed). The gap between the two RSS readings is what the
allocators keep after churn (partly used pymalloc pools and free glibc
chunks), not what the index holds. The DictIndex figure is its own
``--one`` run (its memory does not depend on ``bits``).

    python -m bench.lab.index_churn                      # the grid's tightest cells, bits 0
    python -m bench.lab.index_churn --cell backoff 3 16 10 --bits 8
"""

from __future__ import annotations

import argparse
import array
import gc
import json
import os
import sys
from dataclasses import asdict

from bench import index_grid as grid
from bench import run_module

CELLS = [("backoff", 1, 16, 10), ("backoff", 3, 16, 10), ("uniform", 3, 16, 100), ("uniform", 3, 1, 1000)]


def settled(cell: grid.Cell, bits: int, target_pending: int) -> dict:
    """Build, in this process, the pending set a live run of ``cell`` ends with,
    by adds only (run it in a fresh process)."""
    import nacktracker

    cls = nacktracker.TimeBucketIndex
    n = grid.replicas_for(cell, target_pending)
    t0, arrivals = 1_000_000_000, cell.rate * cell.seconds
    end = t0 + cell.seconds * 1000
    # the pending set, as arrays (no object per message while measuring)
    bucket_of = cls(precision_bits=bits).bucket_of
    rows = []
    for j in range(n):
        stream, kept = grid.Traffic(cell, seed=j + 1), (array.array("q"), array.array("q"), array.array("q"))
        for i in range(arrivals):
            ledger, entry, delay = stream.nack()
            due = t0 + i * 1000 // cell.rate + delay
            if bucket_of(due) > end:  # what the live run still holds after its last pop
                for col, v in zip(kept, (ledger, entry, due)):
                    col.append(v)
        rows.append(kept)
    grid._warm_up(cls, cell, bits)
    gc.collect()
    grid.trim_heap()
    before = grid.rss_bytes()
    indexes = [cls(precision_bits=bits) for _ in range(n)]
    for idx, (ledgers, entries, dues) in zip(indexes, rows):
        for ledger, entry, due in zip(ledgers, entries, dues):
            idx.add(ledger, entry, due)
        idx.next_due_ms()  # the front window opened, as the live run leaves it
    gc.collect()
    grown = grid.rss_bytes() - before
    pending = sum(map(len, indexes))
    return {"pending": pending, "rss_per_pending": grown / max(1, pending),
            "nbytes_per_pending": sum(i.nbytes() for i in indexes) / max(1, pending)}


def _fresh(module: str, *args: str) -> dict:
    return json.loads(run_module(module, *args).stdout.strip().splitlines()[-1])


def compare(cell: grid.Cell, bits: int, target_pending: int) -> dict:
    spec = json.dumps(asdict(cell))
    churned = _fresh("bench.index_grid", "--one", "TimeBucketIndex", spec, str(bits), str(target_pending))
    calm = _fresh("bench.lab.index_churn", "--settled", spec, str(bits), str(target_pending))
    base = _fresh("bench.index_grid", "--one", "DictIndex", spec, "0", str(target_pending))
    if calm["pending"] != churned["pending"]:
        raise AssertionError(f"settled build holds {calm['pending']}, the live run {churned['pending']}")
    return {"cell": cell.label(), "bits": bits, "pending": churned["pending"],
            "churned_rss": churned["rss_per_pending"], "churned_nbytes": churned["nbytes_per_pending"],
            "settled_rss": calm["rss_per_pending"], "settled_nbytes": calm["nbytes_per_pending"],
            "dict_rss": base["rss_per_pending"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cell", nargs=4, metavar=("DELAYS", "K", "LEDGERS", "RATE"), action="append",
                   help="one grid cell (repeatable); default: the grid's tightest cells")
    p.add_argument("--bits", type=int, default=0)
    p.add_argument("--target-pending", type=int, default=grid.FULL["target_pending"])
    p.add_argument("--settled", nargs=3, metavar=("CELL_JSON", "BITS", "TARGET"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.settled:
        print(json.dumps(settled(grid.Cell(**json.loads(a.settled[0])), int(a.settled[1]), int(a.settled[2]))))
        return 0
    cells = [(d, int(k), int(n), int(r)) for d, k, n, r in a.cell] if a.cell else CELLS
    print(f"load average {os.getloadavg()[0]:.2f}; B per pending message, bits {a.bits}")
    print("| cell | pending | RSS churned | RSS settled | nbytes churned | nbytes settled | DictIndex RSS |")
    print("|---|---|---|---|---|---|---|")
    for d, k, n, r in cells:
        row = compare(grid.Cell(d, k, n, r, grid.FULL["seconds"]), a.bits, a.target_pending)
        print(f"| {row['cell']} | {row['pending']:,} | {row['churned_rss']:.1f} | {row['settled_rss']:.1f} "
              f"| {row['churned_nbytes']:.1f} | {row['settled_nbytes']:.1f} | {row['dict_rss']:.0f} |")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
