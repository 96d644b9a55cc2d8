"""What ``plan`` caches between runs: the memory model's constants and the
driver JVM's class archive; each keyed so a stale entry is never used."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nacktracker.pipeline import caches, calibration

needs_spark = pytest.mark.skipif(importlib.util.find_spec("pyspark") is None or shutil.which("java") is None,
                                 reason="needs pyspark and Java")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NACKTRACKER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NACKTRACKER_CACHE", raising=False)
    caches.cached_costs.cache_clear()
    yield tmp_path
    caches.cached_costs.cache_clear()


@pytest.fixture
def counted_measure(monkeypatch):
    """measure_index_costs, counting its calls (the real one, run once, then reused)."""
    real = calibration.measure_index_costs()
    calls = []

    def measure():
        calls.append(1)
        return real

    monkeypatch.setattr(calibration, "measure_index_costs", measure)
    return real, calls


def test_costs_are_measured_once_then_read_back_equal(cache, counted_measure):
    real, calls = counted_measure
    assert caches.cached_costs() == real and len(calls) == 1
    (stored,) = (cache / "index-costs").iterdir()
    caches.cached_costs.cache_clear()  # a new process: reads the file
    assert caches.cached_costs() == real and len(calls) == 1
    stored.write_text("{not json", encoding="utf-8")  # damaged: measured again and rewritten
    caches.cached_costs.cache_clear()
    assert caches.cached_costs() == real and len(calls) == 2
    caches.cached_costs.cache_clear()
    assert caches.cached_costs() == real and len(calls) == 2


def test_a_changed_package_file_or_library_means_another_key(cache, counted_measure, monkeypatch):
    _, calls = counted_measure
    caches.cached_costs()
    from nacktracker.pipeline import ship

    monkeypatch.setattr(ship, "package_fingerprint", lambda: "another memory_model.py")
    caches.cached_costs.cache_clear()
    caches.cached_costs()
    assert len(calls) == 2 and len(list((cache / "index-costs").iterdir())) == 2


def test_cache_off_measures_every_process(cache, counted_measure, monkeypatch):
    _, calls = counted_measure
    monkeypatch.setenv("NACKTRACKER_CACHE", "0")
    caches.cached_costs()
    caches.cached_costs.cache_clear()
    caches.cached_costs()
    assert len(calls) == 2 and not (cache / "index-costs").exists()
    assert caches.class_archive_options("4g", {}) == ""


def _archive_paths(cache: Path) -> tuple[Path, str]:
    opts = caches.class_archive_options("4g", {})
    assert opts.startswith("-XX:ArchiveClassesAtExit="), opts
    return Path(opts.split()[0].split("=", 1)[1]), opts


def test_class_archive_dumped_once_adopted_when_whole(cache):
    if caches._java() is None:
        pytest.skip("no java")
    dump, opts = _archive_paths(cache)
    assert dump.parent == cache / "jvm-classes" and str(os.getpid()) in dump.name and "-Xlog:cds=off" in opts
    dump.write_bytes(b"\0" * 64)  # being written: the header comes last
    assert caches.class_archive_options("4g", {}) == ""  # nobody dumps twice, nobody maps it
    dump.write_bytes(caches._DYNAMIC_MAGIC + b"\0" * 60)
    assert caches.class_archive_options("4g", {}) == ""  # header just written: wait a moment
    old = time.time() - 10
    os.utime(dump, (old, old))
    opts = caches.class_archive_options("2g", {})  # any heap under 32 GB shares it
    final = cache / "jvm-classes" / dump.name.lstrip(".").replace(f".{os.getpid()}.jsa", ".jsa")
    assert opts.split()[0] == f"-XX:SharedArchiveFile={final}" and final.exists() and not dump.exists()
    assert caches.class_archive_options("64g", {}).startswith("-XX:ArchiveClassesAtExit=")  # another kind of heap


def test_a_dump_cut_short_is_removed_after_a_while(cache):
    if caches._java() is None:
        pytest.skip("no java")
    dump, _ = _archive_paths(cache)
    dump.write_bytes(b"\0" * 64)
    old = time.time() - caches._STALE_DUMP_S - 1
    os.utime(dump, (old, old))
    assert caches.class_archive_options("4g", {}).startswith("-XX:ArchiveClassesAtExit=")
    assert not dump.exists()


def test_another_class_path_means_another_archive(cache):
    if caches._java() is None:
        pytest.skip("no java")
    a, _ = _archive_paths(cache)
    b = Path(caches.class_archive_options("4g", {"spark.driver.extraClassPath": "/opt/x.jar"}).split()[0]
             .split("=", 1)[1])
    assert a.name != b.name


@pytest.mark.spark
@pytest.mark.slow
@needs_spark
def test_a_second_session_maps_the_first_ones_classes_without_a_word(tmp_path):
    """Real JVMs: the first session dumps its classes at exit, the second
    adopts the archive and starts with it; neither prints anything about CDS."""
    script = textwrap.dedent("""
        from nacktracker.pipeline.spark import get_spark
        spark = get_spark("local[1]", driver_memory="1g")
        print(spark.sparkContext._conf.get("spark.driver.extraJavaOptions"))
        print(spark.version)  # no job: the archive holds the session's classes (~110 MB, not ~185)
    """)
    env = dict(os.environ, NACKTRACKER_CACHE_DIR=str(tmp_path), PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("NACKTRACKER_CACHE", None)

    def run():
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "cds" not in done.stderr.lower() and "shared archive" not in done.stderr.lower(), done.stderr
        return done.stdout

    folder = tmp_path / "jvm-classes"
    try:
        _dump_then_adopt(run, folder)
    finally:  # ~185 MB: not left in pytest's kept temporary directories
        for path in folder.glob("*"):
            path.unlink()


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(4)


def _dump_then_adopt(run, folder: Path) -> None:
    first = run()
    assert "-XX:ArchiveClassesAtExit=" in first and first.strip().split()[-1][0].isdigit()
    deadline = time.time() + 120  # the JVM dumps after the Python that started it has exited
    while time.time() < deadline:
        dumps = list(folder.glob(".*.jsa"))
        if dumps and _head(dumps[0]) == caches._DYNAMIC_MAGIC:
            break
        time.sleep(1)
    else:
        pytest.fail(f"no finished dump in {folder}: {list(folder.iterdir())}")
    time.sleep(2.5)  # adopted once its header has been written a moment ago
    second = run()
    assert "-XX:SharedArchiveFile=" in second and second.strip().split()[-1][0].isdigit()
    assert [p.name for p in folder.iterdir()] == [dumps[0].name.lstrip(".").rsplit(".", 2)[0] + ".jsa"]


# -- the bound, and whose cache the tests use --------------------------------------------

def _finished_archive(path: Path, size: int) -> None:
    """A whole archive of ``size`` bytes (sparse: no disk is written for it)."""
    with open(path, "wb") as f:
        f.write(caches._DYNAMIC_MAGIC)
        f.truncate(size)


def _du(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_cache_stays_under_its_bound_after_ten_runs_with_different_versions(cache, monkeypatch, counted_measure):
    """Ten runs, each with other package versions (another key for both
    entries), each leaving a finished 180 MB class archive and a costs file:
    the cache never exceeds its bound and keeps the newest archive."""
    if caches._java() is None:
        pytest.skip("no java")
    folder = cache / "jvm-classes"
    for run in range(10):
        monkeypatch.setattr(caches, "_jvm_key", lambda *a, run=run: f"version{run}")
        monkeypatch.setattr(caches, "costs_key", lambda run=run: f"version{run}")
        caches.cached_costs.cache_clear()
        caches.cached_costs()  # measures (another key) and stores, then prunes
        dump, _ = _archive_paths(cache)
        _finished_archive(dump, 180 << 20)  # the JVM wrote it as it exited
        old = time.time() - 10 * (10 - run)  # runs one after another: older first
        os.utime(dump, (old, old))
        caches.prune(own_jvm_exited=True)  # as stop_spark does once the JVM is gone
        assert _du(cache) <= caches.MAX_BYTES, sorted(p.name for p in cache.rglob("*"))
        assert dump.exists()  # the newest is kept: the next run with these versions uses it
    assert len(counted_measure[1]) == 10
    assert len(list(folder.iterdir())) == caches.MAX_BYTES // (180 << 20)


def test_a_dump_its_jvm_left_unfinished_is_removed_at_once(cache):
    folder = cache / "jvm-classes"
    folder.mkdir(parents=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead = int(gone.stdout)
    partial = folder / f".spark-driver-abc.{dead}.jsa"
    partial.write_bytes(b"\0" * 1024)  # no header: cut short
    whole = folder / f".spark-driver-def.{dead}.jsa"
    _finished_archive(whole, 1024)
    mine = folder / f".spark-driver-ghi.{os.getpid()}.jsa"
    mine.write_bytes(b"\0" * 1024)  # this process's JVM may still be writing it
    caches.prune()
    assert not partial.exists() and whole.exists() and mine.exists()
    caches.prune(own_jvm_exited=True)  # once it has exited, an unfinished one never will be
    assert not mine.exists()


def test_the_bound_removes_the_least_recently_used_first(cache, monkeypatch):
    monkeypatch.setenv("NACKTRACKER_CACHE_MAX_MB", "3")
    (cache / "jvm-classes").mkdir()
    (cache / "index-costs").mkdir()
    files = [cache / ("jvm-classes" if i % 2 else "index-costs") / f"f{i}" for i in range(5)]
    for i, f in enumerate(files):
        f.write_bytes(b"x" * (1 << 20))
        os.utime(f, (1000 + i, 1000 + i))
    other = cache / "apache-pulsar" / "classpath.txt"  # another tool's entry: not the pipeline's to prune
    other.parent.mkdir()
    other.write_bytes(b"y" * (2 << 20))
    os.utime(other, (1, 1))
    assert caches.prune() == 3 << 20
    assert [f.exists() for f in files] == [False, False, True, True, True] and other.exists()


def test_tests_never_use_the_users_cache():
    home_cache = Path(os.path.expanduser("~/.cache/nacktracker")).resolve()
    root = caches.cache_root().resolve()
    assert root != home_cache and home_cache not in root.parents
