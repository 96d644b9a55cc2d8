"""``nacktracker sweep``: the memory benchmark's parameter grid as Spark tasks.

Each configuration (index, x nacks per ms, y precision bits, entries per
ledger, nack share) is one Spark task, and each task measures in a fresh
Python interpreter, exactly as ``bench/memory.py`` does: build the index
message by message from seed 000's workload, then report ``nbytes()`` and the
growth of the process's resident set. A fresh interpreter per configuration
keeps RSS honest (Spark reuses its Python workers, whose heap remembers
earlier tasks). Spark does the scheduling: ``local[*]`` runs as many
configurations at once as there are cores, a cluster as many as it has.

The workloads are the benchmark's, generator for generator (a test checks
that they yield the same messages): ``share == 1`` is the sequential
workload, ``share < 1`` the random one.

Cost per configuration: about 1 µs per message for TimeBucketIndex (10 M
messages: ~10 s), about 2 µs and 200-270 B per message for the baselines
(10 M messages: ~2-3 GB each).
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Iterator, Sequence

__all__ = ["SweepConfig", "grid", "workload", "measure", "measure_fresh", "run_sweep", "table",
           "seed_estimate", "INDEXES"]

INDEXES = ("TimeBucketIndex", "DictIndex", "HeapIndex")
#: Java's measured figures for 10M messages, seed 000 (MB).
JAVA_MB = {(1, 10): 25.0, (4, 10): 20.48, (8, 10): 11.0, (8, 15): 2.25}
JAVA_HEAP_MB = 240.0


@dataclass(frozen=True)
class SweepConfig:
    index: str
    x: int                      # nacks per ms (the due time advances 1 ms every x messages)
    y: int                      # precision bits
    entries_per_ledger: int
    share: float                # nacked share of each ledger; 1.0 = the sequential workload
    messages: int

    @property
    def workload(self) -> str:
        return "sequential" if self.share >= 1.0 else "random"


def grid(xs: Sequence[int], ys: Sequence[int], entries: Sequence[int], shares: Sequence[float],
         indexes: Sequence[str], messages: int) -> list[SweepConfig]:
    """Every combination, in a stable order (index, share, entries, x, y)."""
    for name in indexes:
        if name not in INDEXES:
            raise ValueError(f"unknown index {name!r}; choose from {', '.join(INDEXES)}")
    return [SweepConfig(i, x, y, e, float(s), messages)
            for i, s, e, x, y in itertools.product(indexes, shares, entries, xs, ys)]


def seed_estimate(x: int, y: int, entries_per_ledger: int = 50_000) -> float:
    """Seed 000's analytic bytes/message for M = x * 2^y messages per bucket."""
    m = x * (1 << y)
    if m < 4096:
        return 2.0
    if m < entries_per_ledger:
        return 8192 / m
    return 8192 / entries_per_ledger


def workload(kind: str, messages: int, x: int, entries_per_ledger: int, share: float,
             seed: int = 1) -> Iterator[tuple[int, int, int]]:
    """Yield ``(ledger_id, entry_id, due_ms)`` in arrival order (bench/memory.py's workload)."""
    t0 = 1_000_000
    if kind == "sequential":
        for i in range(messages):
            yield 10_000 + i // entries_per_ledger, i % entries_per_ledger, t0 + i // x
        return
    rng = random.Random(seed)
    per_ledger = max(1, int(entries_per_ledger * share))
    i, ledger = 0, 10_000
    while i < messages:
        for entry in sorted(rng.sample(range(entries_per_ledger), per_ledger)):
            if i == messages:
                return
            yield ledger, entry, t0 + i // x
            i += 1
        ledger += 1


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(cfg: SweepConfig) -> dict:
    """Build one index in this process and measure it (bench/memory.py's row)."""
    import nacktracker

    cls = getattr(nacktracker, cfg.index)
    gc.collect()
    before = _rss_bytes()
    idx = cls(precision_bits=cfg.y)
    add = idx.add
    started = time.perf_counter()
    for ledger, entry, due in workload(cfg.workload, cfg.messages, cfg.x, cfg.entries_per_ledger, cfg.share):
        add(ledger, entry, due)
    if hasattr(idx, "compact"):
        idx.compact()
    build_s = time.perf_counter() - started
    gc.collect()
    grown = _rss_bytes() - before
    nbytes = idx.nbytes()
    assert len(idx) == cfg.messages, (len(idx), cfg.messages)
    row = {
        "index": cfg.index, "workload": cfg.workload, "messages": cfg.messages, "x": cfg.x, "y": cfg.y,
        "entries_per_ledger": cfg.entries_per_ledger, "share": cfg.share,
        "nbytes": nbytes, "rss_growth": grown,
        "nbytes_per_msg": nbytes / cfg.messages, "rss_per_msg": grown / cfg.messages,
        "build_s": round(build_s, 2),
    }
    if hasattr(idx, "bucket_count"):
        row["buckets"] = idx.bucket_count()
        row["bitmaps"] = idx.bitmap_count()
    return row


def measure_fresh(cfg: SweepConfig) -> dict:
    """:func:`measure` in a fresh interpreter (what a Spark task runs)."""
    cmd = [sys.executable, "-m", "nacktracker.pipeline.sweep", "--one", json.dumps(asdict(cfg))]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_sweep(spark, configs: Sequence[SweepConfig]) -> list[dict]:
    """One Spark task per configuration; rows come back in ``configs`` order."""
    if not configs:
        return []
    # biggest first: with fewer cores than tasks, the long ones should not start last
    order = sorted(range(len(configs)), key=lambda i: -_weight(configs[i]))
    rdd = spark.sparkContext.parallelize([(i, configs[i]) for i in order], len(configs))
    rows = dict(rdd.map(lambda pair: (pair[0], measure_fresh(pair[1]))).collect())
    return [rows[i] for i in range(len(configs))]


def _weight(cfg: SweepConfig) -> float:
    return cfg.messages * (1.0 if cfg.index == "TimeBucketIndex" else 3.0)


def table(rows: list[dict]) -> str:
    """bench/memory.py's table, plus the entries-per-ledger and share columns."""
    head = ("| index | workload | x | y | messages | nbytes B/msg | RSS B/msg | total MB (RSS) "
            "| seed estimate B/msg | Java MB (seed 000) | entries/ledger | share |")
    lines = [head, "|" + "---|" * 12]
    if rows and min(r["messages"] for r in rows) < 5_000_000:
        lines.insert(0, "RSS is page-granular: below ~1 MB of growth trust nbytes more than RSS.\n")
    for r in rows:
        seq = r["index"] == "TimeBucketIndex" and r["workload"] == "sequential"
        java = None
        if seq and r["entries_per_ledger"] == 50_000:
            java = JAVA_MB.get((r["x"], r["y"]))
        elif r["index"] == "HeapIndex":
            java = f"{JAVA_HEAP_MB} (heap of triples)"
        est = seed_estimate(r["x"], r["y"], r["entries_per_ledger"]) if seq else None
        lines.append(
            f"| {r['index']} | {r['workload']} | {r['x']} | {r['y']} | {r['messages']:,} "
            f"| {r['nbytes_per_msg']:.3f} | {r['rss_per_msg']:.3f} | {r['rss_growth'] / 2**20:.1f} "
            f"| {'' if est is None else f'{est:.3f}'} | {'' if java is None else java} "
            f"| {r['entries_per_ledger']:,} | {r['share']:g} |")
    return "\n".join(lines)


def write_outputs(rows: list[dict], out_dir: str, command: str) -> dict:
    """``sweep.parquet``, ``sweep.json`` and ``sweep.md`` in ``out_dir``."""
    import pandas as pd
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"parquet": out / "sweep.parquet", "json": out / "sweep.json", "markdown": out / "sweep.md"}
    pd.DataFrame(rows).to_parquet(paths["parquet"], index=False)
    paths["json"].write_text(json.dumps(rows, indent=1), encoding="utf-8")
    paths["markdown"].write_text(f"`{command}`\n\n{table(rows)}\n", encoding="utf-8")
    return paths


def _main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--one":
        print(json.dumps(measure(SweepConfig(**json.loads(argv[1])))))
        return 0
    print("usage: python -m nacktracker.pipeline.sweep --one '<SweepConfig as JSON>'\n"
          "(the sweep itself: nacktracker sweep --help)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
