"""Smoke test of the benchmark suite: `nacktracker bench --quick` end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_quick_writes_results(tmp_path):
    out = tmp_path / "bench"
    subprocess.run([sys.executable, "-m", "nacktracker.cli", "bench", "--quick", "--out", str(out),
                    "--skip", "pulsar,consume,soak,snapshot,dedup,grid"],  # grid: tests/test_index_grid.py
                   check=True, cwd=ROOT, capture_output=True, text=True, timeout=300)
    results = json.loads((out / "results.json").read_text())
    for name in ("results.json", "RESULTS.md", "memory.png", "precision.png"):
        assert (out / name).stat().st_size > 0, name
    assert results["machine"]["cores"] >= 1 and results["duration_s"] > 0
    mem = {(r["index"], r["workload"], r["x"], r["y"]): r for r in results["memory"]}
    tb, d = mem[("TimeBucketIndex", "sequential", 8, 10)], mem[("DictIndex", "sequential", 8, 10)]
    assert tb["nbytes_per_msg"] * 100 < d["nbytes_per_msg"]
    ops = {(r["op"], r["index"]): r for r in results["throughput"]["rows"]}
    assert all(r["runs"] >= 3 and r["min"] <= r["median"] <= r["max"] for r in ops.values())
    # timing targets are the benchmark's to check, not a unit test's: only the shape here
    assert {r["bits"] for r in results["precision"]["starvation"]} == {0, 8}
    md = (out / "RESULTS.md").read_text()
    assert "`python bench/memory.py" in md and "`python bench/throughput.py --quick`" in md
