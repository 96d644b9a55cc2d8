"""``nacktracker plan --bits 0`` against the single-process pandas script a
user would write for the same figure (each consumer's peak of pending nacks
at bits 0), side by side on one trace, alternating.

    python -m bench.plan_pandas --out bench/results/plan-pandas

The pandas script (:func:`pandas_peaks`, run in a fresh process by
``--pandas-only TRACE``): read the needed columns, keep the nacks, one
occurrence per (consumer, ledger, entry, due) from its first nack, +1 at its
start and -1 at its due time, sort, cumulative sum per consumer, maximum.
Its peaks are checked equal to ``plan``'s. Records wall time (process start
to exit), peak RSS of each process tree (driver, JVM, workers summed) and
the load average; writes ``plan_pandas.json`` and ``.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

from bench.plan_scale import run_sampled


def pandas_peaks(trace: str) -> dict[str, int]:
    """Each consumer's peak of pending nacks at bits 0, in pandas."""
    import numpy as np
    import pandas as pd

    df = pd.read_parquet(trace, columns=["consumer", "kind", "ts_ms", "delay_ms", "ledger_id", "entry_id"])
    df = df[df["kind"] == "nack"].drop(columns="kind")
    df["due"] = df["ts_ms"] + df["delay_ms"]
    occ = df.groupby(["consumer", "ledger_id", "entry_id", "due"], sort=False, observed=True)["ts_ms"].min()
    occ = occ.reset_index()
    occ = occ[occ["due"] > occ["ts_ms"]]
    codes, names = pd.factorize(occ["consumer"])
    n = len(occ)
    who = np.concatenate([codes, codes])
    when = np.concatenate([occ["ts_ms"].to_numpy(), occ["due"].to_numpy()])
    step = np.concatenate([np.ones(n, dtype=np.int64), -np.ones(n, dtype=np.int64)])
    order = np.lexsort((step, when, who))  # a fire at t ends before a start at t
    who, step = who[order], step[order]
    level = np.cumsum(step)
    starts = np.r_[0, np.flatnonzero(np.diff(who)) + 1]
    base = np.repeat(level[starts] - step[starts], np.diff(np.r_[starts, len(level)]))
    peaks = pd.Series(level - base).groupby(who).max()
    return {str(names[i]): int(v) for i, v in peaks.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pandas-only", metavar="TRACE", help="run the pandas script on TRACE, print JSON")
    p.add_argument("--events", type=int, default=20_000_000)
    p.add_argument("--consumers", type=int, default=8)
    p.add_argument("--trace-dir", type=Path, default=Path("/tmp/nacktracker-plan-pandas"))
    p.add_argument("--trace", type=Path, default=None,
                   help="an existing trace to use (default: generate one into --trace-dir)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out", type=Path, default=HERE / "bench" / "results" / "plan-pandas")
    args = p.parse_args(argv)
    if args.pandas_only:
        print(json.dumps(pandas_peaks(args.pandas_only)))
        return 0
    trace = args.trace or args.trace_dir / f"{args.events}-{args.consumers}"
    nk = [sys.executable, "-m", "nacktracker.cli"]
    if not trace.exists():
        run_sampled([*nk, "trace", "generate", "--out", str(trace), "--events", str(args.events),
                     "--consumers", str(args.consumers), "--master", args.master, "--quiet"])
    out = args.trace_dir / "out"
    sides = {
        "pandas": [sys.executable, "-m", "bench.plan_pandas", "--pandas-only", str(trace)],
        "plan --bits 0": [*nk, "plan", str(trace), "--bits", "0", "--master", args.master, "--out", str(out),
                          "--quiet"],
    }
    runs = []
    for i in range(args.repeats):
        for side, cmd in sides.items():
            load = os.getloadavg()[0]
            r = run_sampled(cmd)
            runs.append({"side": side, "run": i, "wall_s": r["wall_s"], "peak_rss_mb": r["peak_rss_mb"]["tree"],
                         "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)})
            print(runs[-1], flush=True)
    # the same figures: pandas' peaks against plan's
    got = subprocess.run(sides["pandas"], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(HERE)))
    theirs = json.loads(got.stdout.strip().splitlines()[-1])
    import pandas as pd

    ours = pd.read_parquet(out / "consumers.parquet")
    ours = dict(zip(ours["consumer"], ours["peak_pending"].astype(int)))
    equal = ours == theirs
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"trace": f"{args.events} events, {args.consumers} consumers", "runs": runs, "peaks_equal": equal,
              "date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count()}
    (args.out / "plan_pandas.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    med = {s: statistics.median(r["wall_s"] for r in runs if r["side"] == s) for s in sides}
    loads = [r[k] for r in runs for k in ("load_before", "load_after")]
    lines = [f"`python -m bench.plan_pandas --events {args.events} --consumers {args.consumers} --repeats "
             f"{args.repeats}` (trace: `trace generate --events {args.events} --consumers {args.consumers}`) on "
             f"{os.cpu_count()} cores, {result['date']}; load average "
             f"{min(loads):.1f}-{max(loads):.1f}", "",
             "| side | wall (s), each run | median (s) | peak RSS (MB), each run |", "|---|---|---:|---|"]
    for s in sides:
        mine = [r for r in runs if r["side"] == s]
        lines.append(f"| {s} | {' / '.join(str(r['wall_s']) for r in mine)} | {med[s]:.1f} "
                     f"| {' / '.join(str(r['peak_rss_mb']) for r in mine)} |")
    lines += ["", f"plan / pandas (median wall): {med['plan --bits 0'] / med['pandas']:.2f}; "
                  f"per-consumer peaks equal: {'yes' if equal else 'NO'}."]
    (args.out / "plan_pandas.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
