"""Wall time of ``nacktracker plan`` against a baseline checkout, side by side.

    python -m bench.plan_speed --baseline /tmp/nacktracker-main --out bench/results/plan-speed

For each trace (generated once with ``trace generate`` if missing), runs the
same ``plan`` command with this tree's package and with ``--baseline``'s (a
checkout of another commit, e.g. ``git archive main | tar -x -C DIR``),
alternating (baseline, this, baseline, this, ...) so both see the same load;
before them, one untimed ``plan`` with this tree fills its caches (the memory
model's constants, the driver JVM's class archive: what every later run on
this machine finds, :mod:`nacktracker.pipeline.caches`; ``--cold`` skips it
and clears neither, so a first run's cost can be measured with an empty
``NACKTRACKER_CACHE_DIR``);
records each run's wall time (process start to exit: JVM start included),
the CPU seconds of its process tree (driver, JVM, Python workers: less
sensitive than wall time to other jobs on a shared machine, though not
immune), the load average before and after it, and writes ``plan_speed.json`` and
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
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

#: name -> (trace generate arguments, plan arguments)
TRACES = {
    "20m-8": (["--events", "20000000", "--consumers", "8"], ["--bits", "0,4,8,10,12,15"]),
    "4m-2000": (["--events", "4000000", "--consumers", "2000"], ["--bits", "0,4,8,10,12,15"]),
    "100m-8": (["--events", "100000000", "--consumers", "8"], ["--bits", "0,4,8,10,12,15"]),
}


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _tree_cpu(root: int, seen: dict[int, float]) -> None:
    """Add to ``seen`` (pid -> CPU seconds) every process descended from
    ``root`` (a pid once seen stays followed: the JVM outlives the Python
    that started it), with its user + system time so far."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # exited meanwhile
                continue
            stats[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK)  # ppid, utime+stime
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _) in stats.items():
            if pid not in seen and (pid == root or ppid in seen):
                seen[pid] = 0.0
                grew = True
    for pid in seen:
        if pid in stats:
            seen[pid] = max(seen[pid], stats[pid][1])


def _run(cmd: list[str], source: Path) -> tuple[float, float, str]:
    """Run ``cmd``: its wall time, the CPU seconds of its process tree
    (the JVM and Python workers included; sampled every 0.2 s, so a lower
    bound: a process's last 0.2 s before it exits is missed) and stderr."""
    env = dict(os.environ, PYTHONPATH=str(source))
    started = time.perf_counter()
    seen: dict[int, float] = {}
    # from a neutral directory: ``python -m`` puts the working directory before PYTHONPATH, so a
    # run from a checkout would import that checkout's package whatever ``source`` says
    with subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          cwd=tempfile.gettempdir()) as proc:
        reader = threading.Thread(target=lambda: setattr(proc, "err_text", proc.stderr.read()), daemon=True)
        reader.start()
        while proc.poll() is None:
            if sys.platform.startswith("linux"):
                _tree_cpu(proc.pid, seen)
            time.sleep(0.2)
        reader.join()
    wall = time.perf_counter() - started
    err = getattr(proc, "err_text", "")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} (PYTHONPATH={source}) failed:\n{err[-3000:]}")
    return wall, sum(seen.values()), err


_ARCHIVE_READY = """
import sys, time
from nacktracker.pipeline.caches import class_archive_options, enabled
deadline = time.time() + float(sys.argv[1])
while enabled() and time.time() < deadline:
    if class_archive_options("4g", {}).startswith("-XX:SharedArchiveFile="):
        sys.exit(0)
    time.sleep(1)
sys.exit(1)
"""


def warm_caches(trace: Path, plan: list[str], master: str, out: Path) -> float:
    """One untimed ``plan`` with this tree, then wait (up to 2 min) for its
    JVM to finish dumping the class archive after exit: the timed runs start
    with the caches every run after a first one finds. Returns its wall time."""
    wall, _, _ = _run([sys.executable, "-m", "nacktracker.cli", "plan", str(trace), *plan, "--master", master,
                       "--out", str(out), "--quiet"], HERE)
    env = dict(os.environ, PYTHONPATH=str(HERE))
    ready = subprocess.run([sys.executable, "-c", _ARCHIVE_READY, "120"], env=env).returncode == 0
    print(f"warm-up run {wall:.1f} s; class archive {'ready' if ready else 'NOT ready (runs without it)'}",
          flush=True)
    return wall


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="source tree of the baseline (holds nacktracker/)")
    p.add_argument("--traces", default=",".join(TRACES), help=f"which traces (default {','.join(TRACES)})")
    p.add_argument("--trace-dir", type=Path, default=Path("/tmp/nacktracker-plan-speed"))
    p.add_argument("--repeats", type=int, default=2, help="runs of each side per trace (default 2)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out", type=Path, default=HERE / "bench" / "results" / "plan-speed")
    p.add_argument("--cold", action="store_true", help="no untimed warm-up run first (see above)")
    args = p.parse_args(argv)
    if not (args.baseline / "nacktracker").is_dir():
        p.error(f"{args.baseline} holds no nacktracker package")
    sides = {"baseline": args.baseline.resolve(), "this": HERE}
    results = []
    warm_s = None
    for name in args.traces.split(","):
        gen, plan = TRACES[name]
        trace = args.trace_dir / name
        if not trace.exists():
            wall, _, _ = _run([sys.executable, "-m", "nacktracker.cli", "trace", "generate", "--out", str(trace),
                            *gen, "--master", args.master, "--quiet"], HERE)
            print(f"generated {trace} in {wall:.1f} s", flush=True)
        if warm_s is None and not args.cold:
            warm_s = warm_caches(trace, plan, args.master, args.trace_dir / f"out-{name}-warm-up")
        for i in range(args.repeats):
            for side, source in sides.items():
                out = args.trace_dir / f"out-{name}-{side}"
                cmd = [sys.executable, "-m", "nacktracker.cli", "plan", str(trace), *plan, "--master", args.master,
                       "--out", str(out)]
                cmd += ["--quiet"]
                load = os.getloadavg()[0]
                wall, cpu, _ = _run(cmd, source)
                results.append({"trace": name, "side": side, "run": i, "wall_s": round(wall, 2),
                                "cpu_s": round(cpu, 1), "load_before": round(load, 2),
                                "load_after": round(os.getloadavg()[0], 2), "command": " ".join(cmd[1:])})
                print(f"{name} {side:8s} run {i}: {wall:6.1f} s, CPU {cpu:6.1f} s (load average {load:.2f})",
                      flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "plan_speed.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    lines = [f"`python -m bench.plan_speed --baseline {args.baseline} --repeats {args.repeats} "
             f"--master '{args.master}'{' --cold' if args.cold else ''}` on {os.cpu_count()} cores, "
             f"{time.strftime('%Y-%m-%d %H:%M')}"
             + ("" if warm_s is None else f"; after one untimed warm-up run of this tree ({warm_s:.1f} s) "
                "that filled its caches"), "",
             "| trace | baseline (s) | this (s) | this / baseline | CPU baseline (s) | CPU this (s) "
             "| CPU this / baseline | load average (1 min) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name in args.traces.split(","):
        base = [r["wall_s"] for r in results if r["trace"] == name and r["side"] == "baseline"]
        mine = [r["wall_s"] for r in results if r["trace"] == name and r["side"] == "this"]
        cpu_base = [r["cpu_s"] for r in results if r["trace"] == name and r["side"] == "baseline"]
        cpu_mine = [r["cpu_s"] for r in results if r["trace"] == name and r["side"] == "this"]
        loads = [r[k] for r in results if r["trace"] == name for k in ("load_before", "load_after")]
        lines.append(f"| {name} | {' / '.join(f'{v:.1f}' for v in base)} | {' / '.join(f'{v:.1f}' for v in mine)} "
                     f"| {statistics.median(mine) / statistics.median(base):.2f} "
                     f"| {' / '.join(f'{v:.1f}' for v in cpu_base)} | {' / '.join(f'{v:.1f}' for v in cpu_mine)} "
                     f"| {statistics.median(cpu_mine) / statistics.median(cpu_base):.2f} "
                     f"| {min(loads):.1f}-{max(loads):.1f} |")
    (args.out / "plan_speed.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
