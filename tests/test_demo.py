"""``nacktracker demo --quick`` end to end: it runs against the session's broker
and prints every row of its table. No timing assertions: the figures are the
demo's to measure and show (bench/pulsar_precision.py holds the targets)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pulsar")

ROOT = Path(__file__).resolve().parents[1]

SCENARIOS = ["workload", "precision 1 s", "steady stream"]
METRICS = ["failing once / twice / always", "nack delay", "nacks", "redeliveries",
           "dead-lettered (max_redeliveries=3)", "error p50 / p99 / max",
           "first deliveries: publish→receive", "every message settled after",
           "memory for pending nacks, stats()['nbytes'] peak", "|error| p99", "redelivered",
           "redelivered during the stream", "first redelivery"]


@pytest.mark.broker
@pytest.mark.slow
def test_demo_quick_prints_the_whole_table(broker_url):
    env = {**os.environ, "PULSAR_URL": broker_url, "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "nacktracker.cli", "demo", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    out = proc.stdout
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{proc.stderr}"
    assert f"$PULSAR_URL={broker_url}" in out
    assert "TrackedConsumer" in out and "built-in nack" in out
    for label in SCENARIOS + METRICS:
        assert label in out, f"{label!r} missing from:\n{out}"
    rows = {line for line in out.splitlines() if "│" in line}
    # every measured row carries a figure for both consumers (no empty cells)
    for metric in ("nacks", "redeliveries", "error p50 / p99 / max", "|error| p99"):
        row = next(r for r in rows if f"│ {metric} " in r)
        cells = [c.strip() for c in row.split("│")[1:-1]]
        assert len(cells) == 4 and all(re.search(r"\d", c) for c in cells[2:]), row
    assert "memory for pending nacks" in out and re.search(r"[\d,]+ B \(\d+ pending\)", out)
