"""``nacktracker sweep``: the memory benchmark's parameter grid as Spark tasks.

Each configuration (index, x nacks per ms, y precision bits, entries per
ledger, nack share) is one Spark task, and each task measures in a fresh
Python interpreter, exactly as ``bench/memory.py`` does: build the index
message by message from the benchmark's workload, then report ``nbytes()`` and the
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
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from . import memory_experiment

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SweepConfig", "grid", "workload", "measure", "measure_fresh", "child_failure", "run_sweep", "table",
           "seed_estimate", "INDEXES", "COLUMNS"]

INDEXES = ("TimeBucketIndex", "DictIndex", "HeapIndex")
seed_estimate, workload = memory_experiment.seed_estimate, memory_experiment.workload


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


def measure(cfg: SweepConfig) -> dict[str, Any]:
    """Build one index in this process and measure it (bench/memory.py's row)."""
    return memory_experiment.measure(cfg.index, cfg.workload, cfg.messages, cfg.x, cfg.y, cfg.entries_per_ledger, cfg.share)


#: How a failed measurement's message ends (:func:`measure_fresh`): what :func:`child_failure` looks for.
_END_OF_STDERR = "-- end of its stderr"


def measure_fresh(cfg: SweepConfig) -> dict[str, Any]:
    """:func:`measure` in a fresh interpreter (what a Spark task runs). ``-P``: the working directory is
    not put on the child's ``sys.path``, so a folder named ``nacktracker`` there (the checkout, seen from
    its parent folder) cannot shadow the installed package. A child that fails raises ``RuntimeError``
    carrying the end of its stderr (:func:`child_failure` finds it in Spark's error)."""
    cmd = [sys.executable, "-P", "-m", "nacktracker.pipeline.sweep", "--one", json.dumps(asdict(cfg))]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-20:]) or "(nothing)"
        raise RuntimeError(f"sweep: measuring {cfg.index} x={cfg.x} y={cfg.y} share={cfg.share:g} in a fresh "
                           f"interpreter ({sys.executable}) failed with exit status {out.returncode}; its "
                           f"stderr ends:\n{tail}\n{_END_OF_STDERR}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def child_failure(error: BaseException) -> Optional[str]:
    """The message :func:`measure_fresh` raised, found in the error Spark gave the driver for the failed
    task (it wraps it in the worker's traceback and the JVM's), or None when ``error`` is not that."""
    match = re.search(rf"(sweep: measuring .*?)\n{re.escape(_END_OF_STDERR)}", str(error), re.S)
    return match.group(1) if match else None


def run_sweep(spark: SparkSession, configs: Sequence[SweepConfig]) -> list[dict[str, Any]]:
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


#: The sweep table's columns and what each means, in the words its legend prints.
COLUMNS = (
    ("index", "the store of pending nacks measured: TimeBucketIndex (nacktracker's: time buckets of "
              "Roaring bitmaps), DictIndex (one dict entry per message, as the Java client kept them "
              "before PIP-393) or HeapIndex (a heap of (due time, ledger, entry) triples)"),
    ("workload", "sequential: every entry of each ledger is nacked, in order; random: the nacked share "
                 "of each ledger's entries, picked at random"),
    ("nacks per ms", "how many nacks fall due in one millisecond (the due time moves on 1 ms after this many)"),
    ("precision bits", "the tracker's precision_bits: due times are rounded to buckets of 2^bits ms"),
    ("messages", "messages nacked and all pending at once when measured"),
    ("entries per ledger", "entries a ledger holds before the next ledger starts"),
    ("nacked share", "share of each ledger's entries that are nacked (1 for the sequential workload)"),
    ("bytes/msg (nbytes)", "the index's own count of its memory (nbytes()) divided by the messages"),
    ("bytes/msg (RSS)", "growth of the measuring process's resident memory divided by the messages; "
                        "'< 1 MB' when it grew by less than a megabyte, below what RSS can resolve "
                        "(memory comes in pages: trust nbytes then)"),
    ("total MB (RSS)", "that growth of resident memory, in megabytes"),
    ("formula bytes/msg", "what a closed formula for the sequential workload predicts per message "
                          "(bitmap containers per bucket and ledger); '-' where it does not apply"),
    ("Java client MB", "the Java client's memory for the same workload, from its published "
                       "measurements; '-' where none was published"),
)


def table(rows: list[dict[str, Any]]) -> str:
    """The measured grid as Markdown, then what every column means."""
    head = "| " + " | ".join(name for name, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * 4 + "---:|" * (len(COLUMNS) - 4)]
    for r in rows:
        seq = r["index"] == "TimeBucketIndex" and r["workload"] == "sequential"
        entries = r.get("entries_per_ledger", 50_000)
        java: object = None
        if seq and entries == 50_000:
            java = memory_experiment.JAVA_MB.get((r["x"], r["y"]))
        elif r["index"] == "HeapIndex":
            java = f"{memory_experiment.JAVA_HEAP_MB:g} (heap of triples)"
        est = memory_experiment.seed_estimate(r["x"], r["y"], entries) if seq else None
        floor = r["rss_growth"] < 2**20
        cells = [r["index"], r["workload"], str(r["x"]), f"{r['y']} ({1 << r['y']:,} ms)", f"{r['messages']:,}",
                 f"{entries:,}", f"{r.get('share', 1.0):g}", f"{r['nbytes_per_msg']:.3f}",
                 "< 1 MB" if floor else f"{r['rss_per_msg']:.3f}",
                 "< 1" if floor else f"{r['rss_growth'] / 2**20:.1f}",
                 "-" if est is None else f"{est:.3f}", "-" if java is None else f"{java}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Columns:", ""] + [f"- **{name}**: {meaning}." for name, meaning in COLUMNS]
    return "\n".join(lines)


def write_outputs(rows: list[dict[str, Any]], out_dir: str, command: str) -> dict[str, Any]:
    """``sweep.parquet``, ``sweep.json`` and ``sweep.md`` in ``out_dir``."""
    from pathlib import Path

    import pandas as pd

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
