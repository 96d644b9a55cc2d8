"""The benchmark suite: one command, every table, committed results.

    nacktracker bench [--quick] [--out DIR] [--skip pulsar,...]
    python -m bench.suite --quick --out /tmp/b

Runs, in order: memory (seed 000's grid, a fresh process per configuration),
the index on real client traffic (issue 12's grid, a fresh process per cell:
``bench/index_grid.py``, its files in ``DIR/index-grid``), throughput, tracker
precision and starvation (MemoryAdapter), and — when the
Pulsar layer is present — broker precision/starvation beside the built-in
client (idle, and with a CPU hog unless --quick), consume throughput, soak,
snapshot, dedup, and the traffic benchmark (bench/traffic.py). Writes
``results.json``, ``RESULTS.md`` and PNG plots into ``--out``. ``--quick``: 1M messages, fewer repeats (< 2 min
without the broker parts).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import ROOT, index_grid, index_grid_report, memory, precision, throughput

PACKAGES = ("nacktracker", "pyroaring", "sortedcontainers", "pulsar-client", "pulsar-lite", "pyspark", "numpy")
from nacktracker.cli import BENCH_PARTS  # one list: `nacktracker bench --help` shows it

PARTS = tuple(BENCH_PARTS)


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "packages": versions}


class Progress:
    """A rich progress display when rich is installed, plain lines otherwise."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0
        try:
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(TextColumn("{task.description:<48}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                      TimeElapsedColumn(), transient=False)
            self._task = self._rich.add_task("starting", total=total)
            self._rich.start()
        except ImportError:
            self._rich = None

    def step(self, what: str, advance: int = 1) -> None:
        self.done += advance
        if self._rich:
            self._rich.update(self._task, description=what, advance=advance)
        else:
            print(f"[{self.done}/{self.total}] {what}", file=sys.stderr, flush=True)

    def note(self, what: str) -> None:
        if self._rich:
            self._rich.update(self._task, description=what)
        else:
            print(f"  {what}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._rich:
            self._rich.stop()


def memory_configs(quick: bool) -> list:
    return list(memory.configurations(1_000_000 if quick else 10_000_000, memory.INDEXES, memory.GRID,
                                      baselines_at={(8, 10)} if quick else None))


def run_memory(quick: bool, progress: Progress, workers: int = 2) -> list[dict]:
    """Each configuration in its own fresh process, ``workers`` at a time:
    RSS is per process, so neighbours do not disturb the figures (only the
    build times, which this table does not report as results)."""
    configs = memory_configs(quick)

    def one(cfg):
        index, kind, n, x, y = cfg
        row = memory.run_fresh(index, kind, n, x, y)
        progress.step(f"memory {index} {kind} x={x} y={y}")
        return row

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, configs))


def _optional(name: str):
    """``bench.<name>`` if it imports (the broker parts need pulsar-client) and has ``run``, else None."""
    try:
        mod = importlib.import_module(f"bench.{name}")
    except ImportError:
        return None
    return mod if callable(getattr(mod, "run", None)) else None


def plot_memory(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), sharey=True)
    for ax, x in zip(axes, (1, 4, 8)):
        for index, style in (("TimeBucketIndex", "o-"), ("DictIndex", "s--"), ("HeapIndex", "^:")):
            pts = sorted((r["y"], r["rss_per_msg"]) for r in rows
                         if r["index"] == index and r["x"] == x and r["workload"] == "sequential")
            if pts:
                ax.plot(*zip(*pts), style, label=f"{index} (RSS)")
        ys = (8, 10, 15)
        ax.plot(ys, [memory.seed_estimate(x, y) for y in ys], "k-.", alpha=.5, label="seed 000 estimate")
        java = [(y, mb * 2**20 / 1e7) for (jx, y), mb in memory.JAVA_MB.items() if jx == x]
        if java:
            ax.plot(*zip(*java), "r*", markersize=12, label="Java TimeBucket (seed 000)")
        ax.set_yscale("log")
        ax.set_title(f"x = {x} messages/ms")
        ax.set_xlabel("precision bits y")
        ax.set_xticks((8, 10, 15))
        ax.grid(True, which="both", alpha=.3)
    axes[0].set_ylabel("bytes per tracked nack (log)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Memory per nack, 10M-message seed workload" if rows and rows[0]["messages"] >= 10**7
                 else f"Memory per nack, {rows[0]['messages']:,}-message seed workload" if rows else "")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_precision(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    rows = result["precision"]
    labels = [f"{r['delay_ms']}ms b{r['bits']} {r['rounding']}" for r in rows]
    for i, r in enumerate(rows):
        e = r["error_ms"]
        ax.plot([i, i], [e["p1"], e["max"]], "k-", alpha=.4)
        ax.plot(i, e["p50"], "o", color="C0")
        ax.plot(i, e["p99"], "_", color="C3", markersize=14)
    ax.axhline(0, color="grey", lw=.8)
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("error vs requested due (ms)\n(dot p50, bar p99, line p1..max)")
    ax.set_title("Tracker precision, real event loop, MemoryAdapter")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(results: dict) -> str:
    m = results["machine"]
    out = ["# nacktracker benchmark results", "",
           f"Produced by `{results['command']}` in {results['duration_s']:.0f} s on "
           f"{m['cpu']} ({m['cores']} cores), Python {m['python']}.",
           "Package versions: " + ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v), ""]
    if "memory" in results:
        rows = results["memory"]
        n = rows[0]["messages"] if rows else 0
        out += ["## Memory per tracked nack (seed 000 workload)", "",
                f"`python -m bench.memory --messages {n}` — bytes per tracked nack, each configuration "
                "in a fresh process", "", memory.table(rows), ""]
        out += headline_memory(rows) + [""]
        out += ["![memory](memory.png)", ""]
    if "index_grid" in results:
        out += ["## Index on real client traffic", "",
                "Full tables, targets and plot: [index-grid/RESULTS.md](index-grid/RESULTS.md).", ""]
        out += [f"- {'✅' if t['pass'] else '❌'} {t['target']}: worst {t['worst']:.3g} (bound {t['bound']:g}; {t['cell']})"
                for t in index_grid_report.targets(results["index_grid"])] + [""]
    if "throughput" in results:
        out += ["## Index throughput", "", throughput.table(results["throughput"]), ""]
    if "precision" in results:
        out += ["## Tracker precision and starvation (MemoryAdapter)", "", precision.table(results["precision"]), "",
                "![precision](precision.png)", ""]
    for part in ("pulsar_precision", "consume_throughput", "soak", "snapshot", "dedup", "traffic"):
        if part in results and results[part].get("markdown"):
            out += [results[part]["markdown"], ""]
    return "\n".join(out)


def headline_memory(rows: list[dict]) -> list[str]:
    """Ratios the README links to: TimeBucketIndex vs DictIndex and vs Java."""
    def get(index, kind, x, y):
        return next((r for r in rows if (r["index"], r["workload"], r["x"], r["y"]) == (index, kind, x, y)), None)

    lines = ["Headline ratios (RSS growth):", ""]
    for kind, x, y in (("sequential", 8, 10), ("random", 1, 10)):
        tb, d = get("TimeBucketIndex", kind, x, y), get("DictIndex", kind, x, y)
        if tb and d:
            lines.append(f"- {kind} x={x} y={y}: TimeBucketIndex {tb['rss_per_msg']:.3f} B/msg vs DictIndex "
                         f"{d['rss_per_msg']:.1f} B/msg → **{d['rss_per_msg'] / tb['rss_per_msg']:.0f}× smaller**")
    for (x, y), mb in memory.JAVA_MB.items():
        tb = get("TimeBucketIndex", "sequential", x, y)
        if tb:
            java = mb * 2**20 / 1e7
            lines.append(f"- x={x} y={y}: TimeBucketIndex {tb['rss_per_msg']:.3f} B/msg vs Java TimeBucket "
                         f"{java:.3f} B/msg ({mb} MB per 10M) → **{java / tb['rss_per_msg']:.0f}× smaller**")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", help="default: build/bench, or build/bench-quick with --quick (not committed: each "
                                 "benchmark commits its own results under bench/results/)")
    p.add_argument("--skip", default="", help=f"comma-separated parts to skip: {','.join(PARTS)}")
    a = p.parse_args(argv)
    skip = set(filter(None, a.skip.split(",")))
    out = Path(a.out) if a.out else ROOT / "build" / ("bench-quick" if a.quick else "bench")
    out.mkdir(parents=True, exist_ok=True)
    command = "nacktracker bench" + (" --quick" if a.quick else "") + (f" --skip {a.skip}" if a.skip else "")
    started = time.time()
    results: dict = {"command": command, "quick": a.quick, "machine": machine()}

    extras = {name: _optional(mod) for name, mod in (("pulsar", "pulsar_precision"), ("consume", "consume_throughput"),
                                                      ("soak", "soak"), ("snapshot", "snapshot"), ("dedup", "dedup"),
                                                      ("traffic", "traffic"))}
    n_memory = len(memory_configs(a.quick))
    total = (0 if "memory" in skip else n_memory) + 3 + sum(1 for k, m in extras.items() if m and k not in skip)
    progress = Progress(total)
    try:
        if "memory" not in skip:
            results["memory"] = run_memory(a.quick, progress)
            plot_memory(results["memory"], out / "memory.png")
        if "grid" not in skip:
            grid_started = time.time()
            results["index_grid"] = index_grid.run(a.quick, progress=progress.note)
            results["index_grid"].update(duration_s=round(time.time() - grid_started, 1), workers=2,
                                         cores=os.cpu_count())
            index_grid_report.write(results["index_grid"], out / "index-grid")
        progress.step("index grid")
        if "throughput" not in skip:
            results["throughput"] = throughput.run(a.quick, progress=progress.note)
        progress.step("throughput")
        if "precision" not in skip:
            progress.note("precision (real loop)")
            results["precision"] = precision.run(a.quick)
            plot_precision(results["precision"], out / "precision.png")
        progress.step("precision")
        for key, name in (("pulsar", "pulsar_precision"), ("consume", "consume_throughput"), ("soak", "soak"),
                          ("snapshot", "snapshot"), ("dedup", "dedup"), ("traffic", "traffic")):
            mod = extras[key]
            if mod is None or key in skip or (key == "pulsar" and "pulsar" in skip):
                continue
            progress.note(name)
            res = mod.run(quick=a.quick)
            res.setdefault("markdown", mod.table(res) if hasattr(mod, "table") else "")
            results[name] = res
            progress.step(name)
    finally:
        progress.close()
    results["duration_s"] = round(time.time() - started, 1)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "RESULTS.md").write_text(render(results))
    print(f"wrote {out / 'RESULTS.md'} in {results['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
