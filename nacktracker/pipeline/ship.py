"""What the executors need, shipped with the job, and checked before it runs.

A Spark cluster's workers start their own Python (``spark.pyspark.python``,
default ``python3``) that knows nothing of this machine: not nacktracker, not
pyroaring, numpy or pyarrow. ``plan`` and ``sweep`` run Python on the
executors, so before the job starts:

1. :func:`build_executor_env` packs the ``nacktracker`` package the driver
   imported plus the site-packages files of the distributions the executors
   import (:data:`EXECUTOR_DISTRIBUTIONS` and what they require) into one
   ``.tar.gz`` — not pyspark (the cluster has its own), not pandas (Arrow
   UDFs need only pyarrow), no tests or C headers. It is built once and kept
   under a name made of its content hash (``$NACKTRACKER_CACHE_DIR`` or
   ``~/.cache/nacktracker``): a second run reuses it, a changed file makes a
   new one, and only the :data:`KEEP_EXECUTOR_ENVS` most recently used stay.
2. :func:`ship` adds it as a Spark archive (``SparkContext.addArchive``, what
   ``spark.archives`` does): every executor unpacks it into its working
   directory as ``nacktracker-env/``, which goes on the executors' Python path
   (``PYTHONPATH``). Compiled extensions load from an unpacked directory as
   long as the workers' Python has the driver's minor version (PySpark
   insists on it anyway) and the same platform.
3. :func:`probe_executors` runs a one-task job that imports
   :data:`PROBE_MODULES` on the executors and reports, in one line, what is
   missing and the flag that fixes it — seconds after the session starts,
   not after a scan and a shuffle. It also fails, in one line, when the
   executors' Python cannot start, is another Python version, or no executor
   comes up at all.

``--no-ship`` skips 1-2: the cluster's own environment is used (point
``--executor-python`` at it); the probe still runs.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from ..errors import ExecutorCheckError
from .cache_dirs import cache_root

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["EXECUTOR_DISTRIBUTIONS", "PROBE_MODULES", "ALIAS", "ExecutorEnv", "ExecutorCheckError",
           "ProbeReport", "build_executor_env", "ship", "probe_executors", "prepare_executors",
           "package_fingerprint", "cache_dir", "prune_executor_envs", "KEEP_EXECUTOR_ENVS"]

#: Distributions the executors import (with their own requirements). pyspark
#: is the cluster's; pandas is not needed by mapInArrow or the kernel.
EXECUTOR_DISTRIBUTIONS = ("pyroaring", "sortedcontainers", "numpy", "pyarrow")
#: Modules the probe imports on the executors: the kernel and what it loads.
PROBE_MODULES = ("nacktracker", "nacktracker.pipeline.pending", "pyroaring", "sortedcontainers",
                 "numpy", "pyarrow")
#: Directory name of the unpacked archive in each executor's working directory.
ALIAS = "nacktracker-env"

# Files no executor imports: test suites, C/Cython sources and headers, bytecode
# (rebuilt on first import), console scripts outside site-packages.
_SKIP_DIRS = {"__pycache__", "tests", "include"}
_SKIP_SUFFIXES = (".pyc", ".pyx", ".pxd", ".pxi", ".h", ".hpp", ".cc", ".cpp", ".c")


@dataclass(frozen=True)
class ExecutorEnv:
    """A packed executor environment in the cache."""

    path: Path
    digest: str
    files: int
    bytes: int
    built: bool          # False: found in the cache
    seconds: float = 0.0


def cache_dir() -> Path:
    """``$NACKTRACKER_CACHE_DIR/executor-env`` or ``~/.cache/nacktracker/executor-env``."""
    return cache_root() / "executor-env"


def _keep(rel: str) -> bool:
    parts = rel.split("/")
    if parts[0] == ".." or any(p in _SKIP_DIRS for p in parts[:-1]):
        return False
    return not rel.endswith(_SKIP_SUFFIXES)


def _requirement_names(dist: metadata.Distribution) -> list[str]:
    """Names of a distribution's unconditional requirements (extras skipped,
    other markers evaluated when ``packaging`` is importable)."""
    out = []
    for req in dist.requires or []:
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        if not name:
            continue
        marker = req.partition(";")[2].strip()
        if "extra" in marker:
            continue
        if marker:
            try:
                from packaging.markers import Marker

                if not Marker(marker).evaluate():
                    continue
            except ImportError:  # no packaging: ship it, a spare package costs only bytes
                pass
        out.append(name.group(1))
    return out


def _closure(names: Iterable[str]) -> list[metadata.Distribution]:
    """The distributions ``names`` and everything they require, pyspark and py4j excluded."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen or key in ("pyspark", "py4j"):
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise ExecutorCheckError(f"cannot ship {name!r} to the executors: it is not installed here "
                                     f"({sys.executable}); pip install it, or use --no-ship") from None
        seen[key] = dist
        todo += _requirement_names(dist)
    return [seen[k] for k in sorted(seen)]


def _dist_files(dist: metadata.Distribution) -> list[tuple[str, Path]]:
    if dist.files is None:
        raise ExecutorCheckError(f"cannot ship {dist.metadata['Name']!r}: its install has no file list "
                                 "(RECORD); reinstall it with pip, or use --no-ship")
    out = []
    for f in dist.files:
        rel = str(f).replace(os.sep, "/")
        if _keep(rel):
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                out.append((rel, path))
    return out


def _package_files() -> list[tuple[str, Path]]:
    """The nacktracker package this process imported (a source tree, an editable
    or a regular install): every file but bytecode."""
    import nacktracker

    root = Path(nacktracker.__file__).resolve().parent
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root.parent).as_posix()
        if path.is_file() and _keep(rel):
            out.append((rel, path))
    return out


def package_fingerprint() -> str:
    """sha256 of the driver's nacktracker ``.py`` files (the probe compares the executors')."""
    h = hashlib.sha256()
    for rel, path in _package_files():
        if rel.endswith(".py"):
            h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _digest(dists: list[metadata.Distribution], package: list[tuple[str, Path]]) -> str:
    """Content hash of what the archive would hold: Python minor version and
    platform, each distribution's RECORD (per-file sha256 written by pip) and
    the bytes of the nacktracker files."""
    h = hashlib.sha256()
    h.update(f"{sys.version_info[0]}.{sys.version_info[1]} {sys.platform} {platform.machine()}\n".encode())
    for d in dists:
        h.update(f"{d.metadata['Name']}=={d.version}\n".encode())
        h.update((d.read_text("RECORD") or "").encode())
    for rel, path in package:
        h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def build_executor_env(cache: Optional[Path] = None) -> ExecutorEnv:
    """The packed executor environment, from the cache or built now.

    Cost: hashing the RECORD files and the package (~50 ms); building, once
    per content hash, ~5-10 s for ~80 MB (gzip level 1).
    """
    started = time.perf_counter()
    dists = _closure(EXECUTOR_DISTRIBUTIONS)
    package = _package_files()
    digest = _digest(dists, package)
    folder = Path(cache) if cache is not None else cache_dir()
    path = folder / f"nacktracker-executor-env-{digest[:20]}.tar.gz"
    files = package + [f for d in dists for f in _dist_files(d)]
    if path.exists():
        os.utime(path)  # marks it used: pruning keeps the most recently used archives
        return ExecutorEnv(path, digest, len(files), path.stat().st_size, False,
                           time.perf_counter() - started)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
    try:
        with open(tmp, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1) as tar:
            for rel, src in sorted(files):
                tar.add(src, arcname=rel, recursive=False)
        os.replace(tmp, path)  # atomic: a concurrent run sees the whole archive or none
    finally:
        tmp.unlink(missing_ok=True)
    prune_executor_envs(folder, keep=KEEP_EXECUTOR_ENVS)
    return ExecutorEnv(path, digest, len(files), path.stat().st_size, True, time.perf_counter() - started)


#: Packed environments kept in the cache (most recently used first): each is
#: ~80 MB and every package edit makes a new one, so without a bound a
#: developer's cache grew by ~80 MB per edit (23 of them, 1.8 GB, were seen).
KEEP_EXECUTOR_ENVS = 3


def prune_executor_envs(folder: Path, keep: int = KEEP_EXECUTOR_ENVS) -> list[Path]:
    """Delete all but the ``keep`` most recently used packed environments in
    ``folder`` (used = built or reused: :func:`build_executor_env` touches the
    one it returns). Returns what was deleted. Cost: one ``stat`` per archive.
    A run that already shipped an archive is unaffected (Spark copied it)."""
    def used(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except FileNotFoundError:  # another run pruned it first
            return 0.0
    archives = sorted(folder.glob("nacktracker-executor-env-*.tar.gz"), key=used, reverse=True)
    removed = []
    for old in archives[keep:]:
        old.unlink(missing_ok=True)
        removed.append(old)
    return removed


def ship(spark: SparkSession, env: ExecutorEnv) -> None:
    """Add ``env`` as an archive every executor unpacks into ``nacktracker-env/``,
    and put that directory first on the executors' Python path.

    ``sc.environment`` is what PySpark hands every Python function it sends
    (RDD and Arrow UDFs alike), so it applies to sessions started by
    ``spark-submit`` too; a relative entry resolves against the executor's
    working directory, where Spark unpacks archives.
    """
    sc = spark.sparkContext
    sc.addArchive(f"{env.path}#{ALIAS}")
    old = sc.environment.get("PYTHONPATH", "")
    parts = [ALIAS] + [p for p in old.split(os.pathsep) if p and p != ALIAS]
    sc.environment["PYTHONPATH"] = os.pathsep.join(parts)


# -- the probe ---------------------------------------------------------------------

# Compiled here from source, under a module name no executor can import, so
# cloudpickle ships the function by value: it runs even where nacktracker is
# missing (a function of this module would fail to unpickle there instead).
_PROBE_SOURCE = '''
def probe(_index, _rows, modules=MODULES):
    import hashlib, importlib, os, socket, sys
    out = {"host": socket.gethostname(), "python": sys.executable,
           "version": "%d.%d.%d" % sys.version_info[:3], "missing": {}, "fingerprint": None}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:
            out["missing"][name] = "%s: %s" % (type(e).__name__, e)
    if "nacktracker" not in out["missing"]:
        import nacktracker
        root = os.path.dirname(os.path.abspath(nacktracker.__file__))
        h = hashlib.sha256()
        paths = []
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "tests", "include")]
            paths += [os.path.join(folder, f) for f in files if f.endswith(".py")]
        for p in sorted(paths, key=lambda p: os.path.relpath(p, os.path.dirname(root)).replace(os.sep, "/")):
            rel = os.path.relpath(p, os.path.dirname(root)).replace(os.sep, "/")
            with open(p, "rb") as f:
                h.update(rel.encode() + b"\\0" + f.read() + b"\\0")
        out["fingerprint"] = h.hexdigest()
        out["nacktracker"] = root
    yield out
'''


@dataclass
class ProbeReport:
    """What one probe task found on its executor."""

    host: str
    python: str
    version: str
    missing: dict[str, str] = field(default_factory=dict)
    fingerprint: Optional[str] = None
    nacktracker: Optional[str] = None


def _probe_function() -> Callable[..., Any]:
    namespace: dict[str, Any] = {"__name__": "nacktracker_executor_probe", "MODULES": PROBE_MODULES}
    exec(compile(_PROBE_SOURCE, "<nacktracker executor probe>", "exec"), namespace)
    probe: Callable[..., Any] = namespace["probe"]
    return probe


def _fix(shipped: bool) -> str:
    if shipped:
        return ("the shipped environment did not load there: check that the workers run Python "
                f"{sys.version_info[0]}.{sys.version_info[1]} on {platform.machine()} "
                "(--executor-python), or use --no-ship with an environment the cluster has")
    return ("drop --no-ship to ship them with the job, or point --executor-python at a Python on the "
            "workers that has them")


def _job_failure(exc: BaseException, python: str) -> ExecutorCheckError:
    """One line for a failed probe job (the JVM's error is a page long)."""
    text = str(exc)
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    m = re.search(r'Cannot run program "([^"]+)"[^:]*: error=\d+, ([^\n]+)', text)
    if m:
        return ExecutorCheckError(
            f"executors cannot start their Python {m.group(1)!r} ({m.group(2).strip()}): set "
            f"--executor-python to a Python {want} the workers have")
    m = re.search(r"Python in worker has different version:? \(?([\d.]+)\)? than that in driver:? \(?([\d.]+)",
                  text)
    if m or "PYTHON_VERSION_MISMATCH" in text:
        got = m.group(1) if m else "another version"
        return ExecutorCheckError(
            f"executors run Python {got}, the driver {want}: PySpark and the shipped compiled packages "
            f"need the same minor version; set --executor-python to a Python {want} on the workers")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)]
    return ExecutorCheckError(f"the executor probe job failed ({python}): {(errors or lines or ['?'])[-1]}")


def probe_executors(spark: SparkSession, timeout_s: float = 60.0, tasks: Optional[int] = None) -> list[ProbeReport]:
    """Run the import probe on the executors (``tasks`` one-row partitions,
    default the cluster's parallelism, so most executors take one).

    Raises :class:`ExecutorCheckError` when the job fails (Python missing or
    of another version) or no executor ran it within ``timeout_s``. Cost: one
    tiny job, a second or two once executors are up.
    """
    sc = spark.sparkContext
    n = tasks or max(1, min(64, sc.defaultParallelism))
    probe = _probe_function()
    group = f"nacktracker-probe-{uuid.uuid4().hex[:8]}"
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            sc.setJobGroup(group, "nacktracker: check the executors' Python", interruptOnCancel=True)
            box["rows"] = sc.parallelize(range(n), n).mapPartitionsWithIndex(probe).collect()
        except BaseException as e:  # noqa: BLE001  (handed to the caller's thread)
            box["error"] = e

    from pyspark import InheritableThread

    thread = InheritableThread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    python = sc.pythonExec
    if thread.is_alive():
        sc.cancelJobGroup(group)
        thread.join(10)
        raise ExecutorCheckError(
            f"no executor ran the probe task within {timeout_s:g} s: does the master "
            f"({sc.master}) have a live worker with free cores and memory for this application "
            "(spark.executor.memory, spark.executor.cores, spark.cores.max)?")
    if "error" in box:
        raise _job_failure(box["error"], python) from None
    return [ProbeReport(**{k: r.get(k) for k in ("host", "python", "version", "missing", "fingerprint",
                                                    "nacktracker")}) for r in box["rows"]]


def check_reports(reports: list[ProbeReport], shipped: bool, fingerprint: str) -> None:
    """Raise :class:`ExecutorCheckError` naming what the executors lack."""
    for r in reports:
        if r.missing:
            names = ", ".join(r.missing)
            first = next(iter(r.missing.values()))
            raise ExecutorCheckError(
                f"executors on {r.host} ({r.python}, Python {r.version}) cannot import {names} "
                f"({first}); {_fix(shipped)}")
    for r in reports:
        if r.fingerprint != fingerprint:
            raise ExecutorCheckError(
                f"executors on {r.host} import another nacktracker ({r.nacktracker}) than this driver's: "
                "drop --no-ship to ship this one, or install the same version on the workers")


def prepare_executors(spark: SparkSession, *, ship_env: bool = True, timeout_s: float = 60.0,
                      cache: Optional[Path] = None,
                      say: Callable[[str], None] = lambda _: None) -> Optional[ExecutorEnv]:
    """Ship (unless ``ship_env`` is False) and probe; return the shipped env.

    Raises :class:`ExecutorCheckError` with a one-line message.
    """
    env = None
    if ship_env:
        say("packing the executors' Python packages (cached by content hash)")
        env = build_executor_env(cache)
        say(f"executor environment {env.path.name}: {env.files:,} files, {env.bytes / 2**20:.0f} MB, "
            f"{'built' if env.built else 'from the cache'} in {env.seconds:.1f} s")
        ship(spark, env)
    say(f"checking the executors' Python ({spark.sparkContext.pythonExec})")
    started = time.perf_counter()
    reports = probe_executors(spark, timeout_s)
    check_reports(reports, ship_env, package_fingerprint())
    hosts = sorted({r.host for r in reports})
    say(f"executors ready in {time.perf_counter() - started:.1f} s: Python {reports[0].version} "
        f"on {', '.join(hosts)}")
    return env
