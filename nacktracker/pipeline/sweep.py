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

import itertools
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Sequence

from .. import workloads

__all__ = ["SweepConfig", "grid", "workload", "measure", "measure_fresh", "run_sweep", "table",
           "seed_estimate", "INDEXES"]

INDEXES = ("TimeBucketIndex", "DictIndex", "HeapIndex")
seed_estimate, workload = workloads.seed_estimate, workloads.workload


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


def measure(cfg: SweepConfig) -> dict:
    """Build one index in this process and measure it (bench/memory.py's row)."""
    return workloads.measure(cfg.index, cfg.workload, cfg.messages, cfg.x, cfg.y, cfg.entries_per_ledger, cfg.share)


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
    return workloads.table(rows, grid_columns=True)


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
