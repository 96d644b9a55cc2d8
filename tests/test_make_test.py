"""``make test``'s runner (tools/run_tests.py): which failures it runs again alone."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("run_tests", ROOT / "tools" / "run_tests.py")
assert spec is not None and spec.loader is not None
run_tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_tests)


def write(path: Path, *failures: dict) -> Path:
    path.write_text("".join(json.dumps(f) + "\n" for f in failures))
    return path


def test_only_a_session_whose_every_failure_is_a_timing_test_s_call_is_run_again(tmp_path):
    timing = {"nodeid": "tests/a.py::t[lite]", "when": "call", "timing": True}
    other = {"nodeid": "tests/a.py::u", "when": "call", "timing": False}
    in_setup = {"nodeid": "tests/a.py::v", "when": "setup", "timing": True}
    ok = write(tmp_path / "ok", timing, timing)
    assert run_tests.timing_only({"s": 1}, {"s": ok}) == ["tests/a.py::t[lite]"]
    assert run_tests.timing_only({"s": 1}, {"s": write(tmp_path / "b", timing, other)}) is None
    assert run_tests.timing_only({"s": 1}, {"s": write(tmp_path / "c", in_setup)}) is None
    assert run_tests.timing_only({"s": 2}, {"s": ok}) is None  # interrupted, or pytest's own error
    assert run_tests.timing_only({"s": 1}, {"s": tmp_path / "none"}) is None  # failed without a test failing
    assert run_tests.timing_only({"s": 1, "t": 1}, {"s": ok, "t": write(tmp_path / "d", other)}) is None


def test_the_suite_notes_each_failure_and_whether_it_is_a_timing_test(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "@pytest.mark.timing\n"
        "def test_late():\n    assert False\n"
        "def test_wrong():\n    assert False\n"
        "def test_fine():\n    pass\n")
    (tmp_path / "conftest.py").write_text(  # the suite's hook, in a suite of its own
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('suite_conftest', {str(ROOT / 'tests' / 'conftest.py')!r})\n"
        "suite = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(suite)\n"
        "pytest_runtest_logreport = suite.pytest_runtest_logreport\n")
    noted = tmp_path / "failures"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "-o", "markers=timing: t", str(tmp_path / "test_x.py")], cwd=tmp_path,
                          env={**os.environ, run_tests.FAILURES_ENV: str(noted), "PYTHONPATH": str(ROOT / "tests")}, capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [json.loads(line) for line in noted.read_text().splitlines()]
    assert lines == [{"nodeid": "test_x.py::test_late", "when": "call", "timing": True},
                     {"nodeid": "test_x.py::test_wrong", "when": "call", "timing": False}]
