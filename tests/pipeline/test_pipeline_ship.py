"""Shipping the executors' environment, without a cluster: what the archive
holds, its cache key, and the one-line messages of the executor check."""

from __future__ import annotations

import sys
import tarfile

import pytest

from nacktracker.pipeline import ship
from nacktracker.pipeline.ship import ExecutorCheckError, ProbeReport


def test_the_closure_holds_the_kernels_packages_but_not_pyspark_or_pandas():
    names = {d.metadata["Name"].lower() for d in ship._closure(ship.EXECUTOR_DISTRIBUTIONS)}
    assert {"pyroaring", "sortedcontainers", "numpy", "pyarrow"} <= names
    assert not names & {"pyspark", "py4j", "pandas"}


def test_tests_headers_and_bytecode_stay_behind():
    assert ship._keep("numpy/linalg/linalg.py") and ship._keep("pyarrow/libarrow.so.2600")
    for rel in ("numpy/_core/tests/test_x.py", "pyarrow/include/arrow/api.h", "a/__pycache__/m.cpython-311.pyc",
                "pyarrow/lib.pyx", "../../bin/f2py"):
        assert not ship._keep(rel), rel


def test_the_probe_runs_where_nacktracker_is_not_importable():
    """It is shipped by value: its module is not importable anywhere."""
    probe = ship._probe_function()
    assert probe.__module__ not in sys.modules
    (report,) = list(probe(0, iter([0])))
    assert report["missing"] == {} and report["fingerprint"] == ship.package_fingerprint()
    bad = ship._PROBE_SOURCE
    namespace = {"__name__": "x_probe", "MODULES": ("no_such_module_here",)}
    exec(compile(bad, "<probe>", "exec"), namespace)
    (report,) = list(namespace["probe"](0, iter([0])))
    assert list(report["missing"]) == ["no_such_module_here"] and "ModuleNotFoundError" in report["missing"][
        "no_such_module_here"]


def test_missing_modules_give_one_line_naming_them_and_the_flag():
    reports = [ProbeReport("w1", "/usr/bin/python3", "3.11.2",
                           {"nacktracker": "ModuleNotFoundError: No module named 'nacktracker'",
                            "numpy": "ModuleNotFoundError: No module named 'numpy'"})]
    with pytest.raises(ExecutorCheckError) as info:
        ship.check_reports(reports, shipped=False, fingerprint="f")
    text = str(info.value)
    assert "\n" not in text and "cannot import nacktracker, numpy" in text and "--no-ship" in text
    with pytest.raises(ExecutorCheckError, match="--executor-python"):
        ship.check_reports(reports, shipped=True, fingerprint="f")
    other = [ProbeReport("w1", "p", "3.11.2", {}, fingerprint="old", nacktracker="/opt/nt")]
    with pytest.raises(ExecutorCheckError, match="another nacktracker"):
        ship.check_reports(other, shipped=False, fingerprint="new")
    ship.check_reports([ProbeReport("w1", "p", "3.11.2", {}, fingerprint="f")], shipped=True, fingerprint="f")


@pytest.mark.parametrize("jvm_text, expected", [
    ('org.apache.spark.SparkException: Job aborted ... java.io.IOException: Cannot run program '
     '"/opt/py/bin/python3": error=2, No such file or directory\n\tat java.base/...',
     "executors cannot start their Python '/opt/py/bin/python3' (No such file or directory)"),
    ("pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in worker has "
     "different version: 3.12 than that in driver: 3.11, PySpark cannot run with different minor versions.",
     "executors run Python 3.12, the driver"),
    ("Job aborted\nTraceback (most recent call last):\n  File x\nValueError: something odd\n\tat org.apache",
     "the executor probe job failed (python3): ValueError: something odd"),
])
def test_job_failures_become_one_line(jvm_text, expected):
    err = ship._job_failure(RuntimeError(jvm_text), "python3")
    assert expected in str(err) and "\n" not in str(err)


@pytest.mark.slow
def test_the_archive_is_built_once_per_content_and_holds_what_executors_import(tmp_path):
    first = ship.build_executor_env(tmp_path)
    again = ship.build_executor_env(tmp_path)
    assert first.built and not again.built and again.path == first.path
    with tarfile.open(first.path) as tar:
        names = tar.getnames()
    tops = {n.split("/")[0] for n in names}
    assert {"nacktracker", "numpy", "pyarrow", "sortedcontainers"} <= tops
    assert any(n.startswith("pyroaring") and n.endswith(".so") for n in names)
    assert not any(t.startswith(("pyspark", "pandas", "py4j")) for t in tops)
    assert "nacktracker/pipeline/pending.py" in names
    assert not any("/tests/" in n or n.endswith(".pyc") for n in names)


def test_only_the_most_recently_used_archives_stay(tmp_path):
    import os
    names = [f"nacktracker-executor-env-{i:020d}.tar.gz" for i in range(5)]
    for age, name in enumerate(names):  # names[0] the newest
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (1_000_000 - age, 1_000_000 - age))
    (tmp_path / "unrelated.txt").write_text("kept")
    removed = ship.prune_executor_envs(tmp_path, keep=3)
    assert sorted(p.name for p in removed) == sorted(names[3:])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[:3] + ["unrelated.txt"])
    # reusing an old archive marks it used, so a later build keeps it over older ones
    os.utime(tmp_path / names[2])
    assert [p.name for p in ship.prune_executor_envs(tmp_path, keep=2)] == [names[1]]
