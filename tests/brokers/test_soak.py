"""Smoke test of bench/soak.py: the quick variant runs, loses nothing, gives memory back (nbytes and RSS)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


@pytest.mark.slow  # a benchmark run in a subprocess: `make test` runs it, `make check` does not
def test_quick_soak_redelivers_everything_and_returns_to_its_start():
    out = subprocess.run([sys.executable, "-m", "bench.soak", "--quick", "--json"], capture_output=True, text=True,
                         timeout=20, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert len(result["cycles"]) == 3
    for cycle in result["cycles"]:
        assert cycle["redelivered"] == cycle["unique"] == cycle["nacks"] == 20_000
        assert cycle["duplicates"] == 0 and cycle["pending_end"] == 0
        assert cycle["peak_pending"] > 1_000  # it really held a backlog
        assert cycle["nbytes_end"] == result["start"]["nbytes"]  # the pending set is gone, exactly
    assert result["checks"]["no_loss_no_duplicates"]
    # "memory comes back": the process's RSS too, not only the tracker's own count
    # (bench/soak.py: every cycle's RSS within 5% of the start, no growth across cycles)
    assert all(abs(cycle["rss_vs_start"]) <= 0.05 for cycle in result["cycles"]), result["cycles"]
    assert result["checks"]["rss_within_5pct"] and result["checks"]["no_growth_across_cycles"], (
        result["checks"], result["start"], [(c["peak_pending"], c["peak_rss"], c["rss_end"]) for c in result["cycles"]])
