"""``nacktracker trace generate`` with this tree and a baseline checkout, side
by side (alternating, so both see the same load): wall time from process
start to exit (JVM start and exit included) and the load average.

    python -m bench.plan_generate --baseline /tmp/nacktracker-main --events 8000000 --consumers 20000

Writes ``plan_generate.json`` and ``.md`` into ``--out``; the traces are
written under ``--trace-dir`` and removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

from bench.plan_scale import run_sampled


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="source tree of the baseline")
    p.add_argument("--events", type=int, default=8_000_000)
    p.add_argument("--consumers", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--trace-dir", type=Path, default=Path("/tmp/nacktracker-plan-generate"))
    p.add_argument("--out", type=Path, default=HERE / "bench" / "results" / "plan-scale")
    args = p.parse_args(argv)
    runs = []
    for i in range(args.repeats):
        for side, source in (("baseline", args.baseline.resolve()), ("this", HERE)):
            out = args.trace_dir / f"{side}-{i}"
            shutil.rmtree(out, ignore_errors=True)
            cmd = [sys.executable, "-m", "nacktracker.cli", "trace", "generate", "--out", str(out), "--events",
                   str(args.events), "--consumers", str(args.consumers), "--master", args.master, "--quiet"]
            load = os.getloadavg()[0]
            r = run_sampled(cmd, source)
            runs.append({"side": side, "run": i, "wall_s": r["wall_s"], "load_before": round(load, 2),
                         "load_after": round(os.getloadavg()[0], 2)})
            print(runs[-1], flush=True)
            shutil.rmtree(out, ignore_errors=True)
    result = {"events": args.events, "consumers": args.consumers, "runs": runs,
              "date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plan_generate.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    lines = [f"`python -m bench.plan_generate --baseline {args.baseline} --events {args.events} --consumers "
             f"{args.consumers} --repeats {args.repeats}` on {os.cpu_count()} cores, {result['date']}", "",
             "| side | run | wall (s) | load average before-after |", "|---|---:|---:|---|"]
    lines += [f"| {r['side']} | {r['run']} | {r['wall_s']} | {r['load_before']}-{r['load_after']} |" for r in runs]
    (args.out / "plan_generate.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
