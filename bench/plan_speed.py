"""Wall time of ``nacktracker plan`` against a baseline checkout, side by side.

    python bench/plan_speed.py --baseline /tmp/nacktracker-main --out bench/results/plan-speed

For each trace (generated once with ``trace generate`` if missing), runs the
same ``plan`` command with this tree's package and with ``--baseline``'s (a
checkout of another commit, e.g. ``git archive main | tar -x -C DIR``),
alternating (baseline, this, baseline, this, ...) so both see the same load;
records each run's wall time (process start to exit: JVM start included),
the load average before it, and writes ``plan_speed.json`` and
``plan_speed.md`` into ``--out``. Each run is a fresh process with its own
Spark session, so caches do not carry over.
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

#: name -> (trace generate arguments, plan arguments)
TRACES = {
    "20m-8": (["--events", "20000000", "--consumers", "8"], ["--bits", "0,4,8,10,12,15"]),
    "4m-2000": (["--events", "4000000", "--consumers", "2000"], ["--bits", "0,4,8,10,12,15"]),
}


def _run(cmd: list[str], source: Path) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=str(source))
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} (PYTHONPATH={source}) failed:\n{done.stderr[-3000:]}")
    return wall, done.stderr


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="source tree of the baseline (holds nacktracker/)")
    p.add_argument("--traces", default=",".join(TRACES), help=f"which traces (default {','.join(TRACES)})")
    p.add_argument("--trace-dir", type=Path, default=Path("/tmp/nacktracker-plan-speed"))
    p.add_argument("--repeats", type=int, default=2, help="runs of each side per trace (default 2)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out", type=Path, default=HERE / "bench" / "results" / "plan-speed")
    args = p.parse_args(argv)
    if not (args.baseline / "nacktracker").is_dir():
        p.error(f"{args.baseline} holds no nacktracker package")
    sides = {"baseline": args.baseline.resolve(), "this": HERE}
    results = []
    for name in args.traces.split(","):
        gen, plan = TRACES[name]
        trace = args.trace_dir / name
        if not trace.exists():
            wall, _ = _run([sys.executable, "-m", "nacktracker.cli", "trace", "generate", "--out", str(trace),
                            *gen, "--master", args.master, "--quiet"], HERE)
            print(f"generated {trace} in {wall:.1f} s", flush=True)
        for i in range(args.repeats):
            for side, source in sides.items():
                out = args.trace_dir / f"out-{name}-{side}"
                cmd = [sys.executable, "-m", "nacktracker.cli", "plan", str(trace), *plan, "--master", args.master,
                       "--out", str(out)]
                cmd += ["--quiet"]
                load = os.getloadavg()[0]
                wall, _ = _run(cmd, source)
                results.append({"trace": name, "side": side, "run": i, "wall_s": round(wall, 2),
                                 "load_before": round(load, 2), "command": " ".join(cmd[1:])})
                print(f"{name} {side:8s} run {i}: {wall:6.1f} s (load average {load:.2f})", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plan_speed.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    lines = [f"`python bench/plan_speed.py --baseline {args.baseline} --repeats {args.repeats} "
             f"--master '{args.master}'` on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}", "",
             "| trace | baseline (s) | this (s) | this / baseline | load average (1 min) |",
             "|---|---:|---:|---:|---|"]
    for name in args.traces.split(","):
        base = [r["wall_s"] for r in results if r["trace"] == name and r["side"] == "baseline"]
        mine = [r["wall_s"] for r in results if r["trace"] == name and r["side"] == "this"]
        loads = [r["load_before"] for r in results if r["trace"] == name]
        lines.append(f"| {name} | {' / '.join(f'{v:.1f}' for v in base)} | {' / '.join(f'{v:.1f}' for v in mine)} "
                     f"| {statistics.median(mine) / statistics.median(base):.2f} "
                     f"| {min(loads):.1f}-{max(loads):.1f} |")
    (args.out / "plan_speed.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
