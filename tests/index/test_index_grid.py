"""Smoke run of the real-traffic grid benchmark (bench/index_grid.py --quick):
the script runs end to end in seconds and writes every file with the right
shape. Its targets are the benchmark's to judge, not this test's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a benchmark run in a subprocess: `make test` runs it, `make check` does not
def test_grid_quick_writes_results(tmp_path):
    out = tmp_path / "grid"
    subprocess.run([sys.executable, "-m", "bench.index_grid", "--quick", "--out", str(out)],
                   check=True, cwd=ROOT, capture_output=True, text=True, timeout=120)
    result = json.loads((out / "results.json").read_text())
    for name in ("results.json", "RESULTS.md", "grid.png"):
        assert (out / name).stat().st_size > 0, name
    rows = result["rows"]
    assert {r["index"] for r in rows} == {"TimeBucketIndex", "DictIndex"}
    assert {r["bits"] for r in rows if r["index"] == "TimeBucketIndex"} == set(result["spec"]["bits"])
    for r in rows:
        assert r["pending"] > 0 and r["nbytes"] > 0
    for r in (r for r in rows if r["index"] == "TimeBucketIndex"):  # timed beside a DictIndex copy of its state
        assert min(r[f"{p}{op}_ns"] for p in ("", "dict_") for op in ("add", "discard_miss", "discard_hit")) > 0
        assert r["timed_pending"] > 0
        assert min(r[f"{op}_vs_dict"] for op in ("add", "discard_miss", "discard_hit")) > 0  # median of paired rounds
    tb = [r for r in rows if r["index"] == "TimeBucketIndex"]
    d = next(r for r in rows if r["index"] == "DictIndex")
    assert all(r["pending"] == d["pending"] for r in tb if r["bits"] == 0)  # same end state
    assert {r["pending"] for r in result["flatness"]} and result["parked"]["adds"] > 0
    md = (out / "RESULTS.md").read_text()
    assert "`python -m bench.index_grid --quick`" in md and "## Targets" in md
