"""``nacktracker plan`` at scale: wall time, and the peak resident memory of
the driver, the JVM and the largest Python worker, with the size of what it
writes.

    python -m bench.plan_scale --case 200m-1 --out bench/results/plan-scale
    python -m bench.plan_scale --case 8m-20000 --out bench/results/plan-scale

Generates the case's trace with ``nacktracker trace generate`` when missing
(timed: wall time of the command, JVM start included), runs ``plan`` on it
in a fresh process, and samples every 0.5 s the resident memory (``VmRSS``)
of every process the command started: the driver (the ``nacktracker``
Python process), the JVM, and the Python workers (each on its own: the
figure a worker's memory is judged by is the largest one's peak). Writes
``plan_scale-<case>.json`` and ``.md`` into ``--out``; ``--delete-trace``
removes the trace afterwards (they are large).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

#: case -> (trace generate arguments, plan arguments)
CASES = {
    "200m-1": (["--events", "200000000", "--consumers", "1"], ["--bits", "0,4,8,10,12,15"]),
    "100m-1": (["--events", "100000000", "--consumers", "1"], ["--bits", "0,4,8,10,12,15"]),
    "50m-1": (["--events", "50000000", "--consumers", "1"], ["--bits", "0,4,8,10,12,15"]),
    "8m-20000": (["--events", "8000000", "--consumers", "20000"], ["--bits", "0,4,8,10,12,15"]),
    "8m-1-whole": (["--events", "8000000", "--consumers", "1"], ["--bits", "0,4,8,10,12,15",
                                                                 "--stream-nacks", "1000000000"]),
    "8m-1-streamed": (["--events", "8000000", "--consumers", "1"], ["--bits", "0,4,8,10,12,15",
                                                                    "--stream-nacks", "0"]),
    "2m-1": (["--events", "2000000", "--consumers", "1"], ["--bits", "0,8", "--stream-nacks", "0"]),
}


def _rss_tree(root: int) -> dict[int, tuple[str, int]]:
    """pid -> (kind, resident bytes) for ``root`` and its descendants."""
    parent, info = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", encoding="ascii", errors="replace") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        pid = int(name)
        parent[pid] = int(status.get("PPid", "0").strip() or 0)
        rss = int(status.get("VmRSS", "0 kB").split()[0]) * 1024 if "VmRSS" in status else 0
        kind = "jvm" if "java" in cmd.split(" ")[0] else ("worker" if "pyspark" in cmd or "daemon" in cmd else "python")
        info[pid] = (kind, rss)
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, pp in parent.items():
            if pp in tree and pid not in tree:
                tree.add(pid)
                grew = True
    out = {}
    for pid in tree:
        if pid in info:
            kind, rss = info[pid]
            out[pid] = ("driver" if pid == root else kind, rss)
    return out


def run_sampled(cmd: list[str], source: Path = HERE) -> dict:
    """Run ``cmd`` with ``source``'s package; its wall time and peak RSS per kind of process."""
    env = dict(os.environ, PYTHONPATH=str(source))
    peaks = {"driver": 0, "jvm": 0, "worker": 0, "python": 0, "tree": 0}
    started = time.perf_counter()
    # from a neutral directory: ``python -m`` puts the working directory before PYTHONPATH, so a
    # run from a checkout would import that checkout's package whatever ``source`` says
    with subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          cwd=tempfile.gettempdir()) as proc:
        reader = threading.Thread(target=lambda: setattr(proc, "err_text", proc.stderr.read()), daemon=True)
        reader.start()
        while proc.poll() is None:
            tree = _rss_tree(proc.pid)
            for kind, rss in tree.values():
                peaks[kind] = max(peaks[kind], rss)
            peaks["tree"] = max(peaks["tree"], sum(r for _, r in tree.values()))
            time.sleep(0.5)
        reader.join()
    wall = time.perf_counter() - started
    err = getattr(proc, "err_text", "")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    return {"wall_s": round(wall, 1), "peak_rss_mb": {k: round(v / 2**20) for k, v in peaks.items()},
            "stderr_tail": err[-600:]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=sorted(CASES), required=True)
    p.add_argument("--trace-dir", type=Path, default=Path("/tmp/nacktracker-plan-scale"))
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out", type=Path, default=HERE / "bench" / "results" / "plan-scale")
    p.add_argument("--delete-trace", action="store_true", help="remove the trace afterwards")
    args = p.parse_args(argv)
    gen, plan = CASES[args.case]
    trace = args.trace_dir / args.case.replace("-whole", "").replace("-streamed", "")
    result: dict = {"case": args.case, "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M")}
    nk = [sys.executable, "-m", "nacktracker.cli"]
    if not trace.exists():
        load = os.getloadavg()[0]
        g = run_sampled([*nk, "trace", "generate", "--out", str(trace), *gen, "--master", args.master, "--quiet"])
        result["generate"] = {"command": " ".join(["nacktracker", "trace", "generate", *gen]), "wall_s": g["wall_s"],
                              "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}
        print(f"generated {trace} in {g['wall_s']} s (load {load:.2f})", flush=True)
    out = args.trace_dir / f"out-{args.case}"
    load = os.getloadavg()[0]
    r = run_sampled([*nk, "plan", str(trace), *plan, "--master", args.master, "--out", str(out), "--quiet"])
    result["plan"] = {"command": " ".join(["nacktracker", "plan", "TRACE", *plan, "--master", args.master]),
                      "wall_s": r["wall_s"], "peak_rss_mb": r["peak_rss_mb"], "load_before": round(load, 2),
                      "load_after": round(os.getloadavg()[0], 2), "stderr_tail": r["stderr_tail"]}
    sizes = {name: (out / name).stat().st_size for name in ("report.md", "consumers.md", "consumers.csv",
                                                             "consumers.parquet") if (out / name).exists()}
    result["outputs_bytes"] = sizes
    with open(out / "consumers.csv", encoding="utf-8") as f:
        result["consumers_csv_rows"] = sum(1 for _ in f) - 1
    print(json.dumps(result, indent=1), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"plan_scale-{args.case}.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    pr = result["plan"]
    lines = [f"`python -m bench.plan_scale --case {args.case}` on {result['cores']} cores, {result['date']}", "",
             "| step | wall (s) | driver RSS (MB) | JVM RSS (MB) | largest Python worker RSS (MB) | load average |",
             "|---|---:|---:|---:|---:|---|"]
    if "generate" in result:
        g = result["generate"]
        lines.append(f"| `{g['command']}` | {g['wall_s']} | | | | {g['load_before']}-{g['load_after']} |")
    m = pr["peak_rss_mb"]
    lines.append(f"| `{pr['command']}` | {pr['wall_s']} | {m['driver']:,} | {m['jvm']:,} | {m['worker']:,} "
                 f"| {pr['load_before']}-{pr['load_after']} |")
    lines += ["", "Outputs: " + ", ".join(f"{k} {v:,} B" for k, v in sizes.items())
              + f"; consumers.csv rows: {result['consumers_csv_rows']:,}."]
    (args.out / f"plan_scale-{args.case}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    shutil.copy(out / "report.md", args.out / f"plan_scale-{args.case}-report.md")  # the figures it planned
    print("\n".join(lines))
    if args.delete_trace:
        shutil.rmtree(trace, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
