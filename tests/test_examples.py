"""The examples run standalone and say what happened: each one as a
subprocess, against the session's broker (``$PULSAR_URL``, which
``pulsar_service`` honours), plus one on its own embedded broker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pulsar")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# example -> lines its output must contain (what the example exists to show)
EXPECTED = {
    "wrap_existing_consumer.py": ["received order-1 -> nacked, retry in 300 ms",
                                  "redelivered order-1 after", "redelivery_count=1"],
    "worker_backoff_dlq.py": ["job-2: attempt 3 succeeded", "dead-lettered job-4 after 4 deliveries",
                              "done: 5 acknowledged, 1 dead-lettered"],
    "sync_listener_thread.py": ["[nacktracker-sync-listener] task-1: failed -> negative_acknowledge(delay_ms=400)",
                                "task-1: acknowledged (redelivery_count=1", "all 5 tasks acknowledged"],
}


def run_example(name: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


#: examples that need no broker, run by their own module's tests
ELSEWHERE = {"prometheus_metrics.py": "tests/test_metrics.py"}


def test_the_sync_example_uses_no_asyncio():
    source = (EXAMPLES / "sync_listener_thread.py").read_text()
    assert "asyncio" not in source


def test_every_example_is_covered():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted([*EXPECTED, *ELSEWHERE])


@pytest.mark.broker
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs_and_reports(name, broker_url):
    proc = run_example(name, {**os.environ, "PULSAR_URL": broker_url})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    for line in EXPECTED[name]:
        assert line in proc.stdout, f"{line!r} missing from:\n{proc.stdout}"


@pytest.mark.broker
@pytest.mark.skipif(bool(os.environ.get("PULSAR_URL")), reason="checks the embedded-broker path")
def test_example_starts_its_own_broker():
    env = {k: v for k, v in os.environ.items() if k != "PULSAR_URL"}
    proc = run_example("wrap_existing_consumer.py", env)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "redelivered order-1 after" in proc.stdout
