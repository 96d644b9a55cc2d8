"""The ``plan`` kernel alone, without Spark: where its time goes, and whether
two checkouts compute the same figures.

    python -m bench.lab.plan_kernel /tmp/nacktracker-plan-speed/4m-2000 --consumers 200 --profile
    PYTHONPATH=/tmp/base:. python -P -m bench.lab.plan_kernel TRACE --save /tmp/base.pkl  # /tmp/base's package
    python -m bench.lab.plan_kernel TRACE --compare /tmp/base.pkl

Reads a trace's ``nack`` rows with pyarrow (the first ``--consumers`` by name,
default all), spreads the consumers over 8 partitions and cuts them into
groups of whole consumers as the Spark job does (``plan._assign_partitions``,
``plan.GROUP_ROWS``), sorts each group by consumer only (the order Spark hands
the kernel), and runs ``pending.analyse_group`` on every group for the bench
bits, timing the kernel calls (reading and grouping not included).
``--profile`` prints cProfile's top functions; ``--save`` pickles every
output array, ``--compare`` checks them against such a file and exits 1 on
any difference. Needs a checkout with ``analyse_group`` (the grouped kernel).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pickle
import pstats
import sys
import time

import numpy as np

BITS = (0, 4, 8, 10, 12, 15)
PARTITIONS = 8


def _groups(path: str, limit: int):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from nacktracker.pipeline.plan import GROUP_ROWS, _assign_partitions

    t = pq.read_table(path, columns=["ts_ms", "kind", "ledger_id", "entry_id", "delay_ms", "consumer"])
    t = t.filter(pc.equal(t["kind"], "nack"))
    names, cid = np.unique(t["consumer"].to_numpy(zero_copy_only=False).astype(str), return_inverse=True)
    cols = [cid.astype(np.int64)] + [t[c].to_numpy().astype(np.int64) for c in ("ledger_id", "entry_id", "ts_ms")]
    cols.append(cols[3] + t["delay_ms"].to_numpy().astype(np.int64))  # due
    if limit:
        keep = cols[0] < limit
        cols = [c[keep] for c in cols]
    cid = cols[0]
    k = int(cid.max()) + 1
    sizes = np.bincount(cid, minlength=k)
    pid = _assign_partitions({c: int(n) for c, n in enumerate(sizes.tolist())}, min(k, PARTITIONS))
    part = np.asarray([pid[c] for c in range(k)])[cid]
    groups = []
    for p in range(min(k, PARTITIONS)):
        rows = np.flatnonzero(part == p)
        rows = rows[np.argsort(cid[rows], kind="stable")]  # by consumer only, as Spark sorts
        lo = 0
        while lo < len(rows):  # whole consumers, about GROUP_ROWS rows each
            hi = min(len(rows), lo + GROUP_ROWS)
            if hi < len(rows):
                hi = max(int(np.searchsorted(cid[rows], cid[rows[hi - 1]])),
                         int(np.searchsorted(cid[rows], cid[rows[lo]], side="right")))
            groups.append([c[rows[lo:hi]] for c in cols])
            lo = hi
    return groups, len(cid), k


def _differences(mine: list, theirs: list) -> int:
    def flat(out: dict):
        for key, value in sorted(out.items()):
            if key == "histograms":
                for values, counts in value:
                    yield key, values
                    yield key, counts
            elif isinstance(value, tuple):
                yield from ((key, v) for v in value)
            else:
                yield key, value

    bad = 0
    for a, b in zip(mine, theirs):
        for (key, x), (_, y) in zip(flat(a), flat(b)):
            if not np.array_equal(x, y):
                bad += 1
                print(f"differs: {key}", file=sys.stderr)
    return bad + abs(len(mine) - len(theirs))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--consumers", type=int, default=0, help="only the first N consumers (default all)")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--save")
    p.add_argument("--compare")
    args = p.parse_args(argv)
    import nacktracker
    from nacktracker.pipeline.pending import Grid, analyse_group
    from nacktracker.pipeline.plan import SERIES_BINS, measured_costs

    groups, nacks, k = _groups(args.trace, args.consumers)
    costs = measured_costs()
    grid = Grid.spanning(min(int(g[3].min()) for g in groups), max(int(g[4].max()) for g in groups) + 1,
                         SERIES_BINS)
    prof = cProfile.Profile() if args.profile else None
    outs, seconds = [], 0.0
    for g in groups:
        started = time.perf_counter()
        if prof:
            prof.enable()
        outs.append(analyse_group(*g, bits_list=BITS, costs=costs, grid=grid))
        if prof:
            prof.disable()
        seconds += time.perf_counter() - started
    print(f"{os.path.dirname(os.path.dirname(nacktracker.__file__))}: {nacks:,} nacks, {k:,} consumers, "
          f"{len(groups)} groups, bits {','.join(map(str, BITS))}: kernel {seconds:.2f} s "
          f"(load average {os.getloadavg()[0]:.2f})")
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    if args.save:
        with open(args.save, "wb") as f:
            pickle.dump(outs, f)
    if args.compare:
        with open(args.compare, "rb") as f:
            bad = _differences(outs, pickle.load(f))
        print("identical" if not bad else f"{bad} arrays differ")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
