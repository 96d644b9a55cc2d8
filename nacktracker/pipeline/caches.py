"""What ``plan`` keeps between runs, so a second run skips the work a first did.

Two things, both under :func:`cache_root` (``$NACKTRACKER_CACHE_DIR`` or
``~/.cache/nacktracker``), each keyed by everything it depends on, so a
stale entry is never used — a changed key just makes a new entry:

* :func:`cached_costs`: the memory model's measured constants
  (:func:`~.calibration.measure_index_costs`, 2-3 s of driver CPU per run), as JSON. The
  key hashes every ``.py`` file of the nacktracker package (the index layout
  and the model's code), the Python version and the versions of pyroaring
  and numpy (the bitmaps and arrays it measures).
* :func:`class_archive_options`: a JVM class-data-sharing archive (AppCDS)
  of the classes the Spark driver loaded, for the JVM ``plan`` starts: mapped
  from the file at start instead of read from 280 jars and verified, which
  halves the JVM's CPU for the session start and its first job. JDK 17 has no
  ``-XX:+AutoCreateSharedArchive`` (JDK 19+), so the first run dumps its
  classes at exit (``-XX:ArchiveClassesAtExit``) into a file of its own, and
  a later run adopts a finished one (:func:`_adopt`) before using it. The key
  hashes the ``java`` binary and its JDK ``release`` file, the Spark jars
  (names, sizes, times), whether the driver heap is under 32 GB (compressed
  pointers) and the class path settings: the
  JVM refuses an archive made with other classes or heap settings (silently:
  the options below turn its CDS warnings off), but it would crash on a
  truncated one, hence the adoption rule.

The cache is bounded: :func:`prune` keeps its files under
:data:`MAX_BYTES` (400 MB, ``$NACKTRACKER_CACHE_MAX_MB`` to change it) by
removing the least recently used first (an archive is 170-190 MB, so two
fit), and removes a dump its JVM left unfinished (its process is gone) at
once. It runs before a session starts and after its JVM exits.

``NACKTRACKER_CACHE=0`` turns both off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional

from .cache_dirs import cache_root

if TYPE_CHECKING:
    from .memory_model import IndexCosts

__all__ = ["cache_root", "enabled", "cached_costs", "class_archive_options", "prune", "MAX_BYTES"]

#: Bumped when a cached format or what it is keyed by changes.
_FORMAT = 1
#: The first bytes of a finished dynamic CDS archive (JDK 17's CDS_DYNAMIC_ARCHIVE_MAGIC, little-endian).
_DYNAMIC_MAGIC = (0xF00BABA8).to_bytes(4, "little")
#: A dump whose header is still missing after this long was cut short (its JVM was killed).
_STALE_DUMP_S = 600.0
#: The folders :func:`prune` manages under :func:`cache_root` (others there belong to other tools).
_FOLDERS = ("index-costs", "jvm-classes")
#: The cache's bound in bytes (:func:`prune`); ``$NACKTRACKER_CACHE_MAX_MB`` overrides it.
MAX_BYTES = 400 << 20


def max_bytes() -> int:
    """:data:`MAX_BYTES`, or ``$NACKTRACKER_CACHE_MAX_MB`` megabytes."""
    text = os.environ.get("NACKTRACKER_CACHE_MAX_MB", "").strip()
    try:
        return int(float(text) * (1 << 20)) if text else MAX_BYTES
    except ValueError:
        return MAX_BYTES


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _dump_pid(path: Path) -> Optional[int]:
    """The process writing a dump ``.<prefix>.<pid>.jsa``; None for other files."""
    parts = path.name.split(".")
    if not path.name.startswith(".") or len(parts) < 4 or parts[-1] != "jsa" or not parts[-2].isdigit():
        return None
    return int(parts[-2])


def prune(root: Optional[Path] = None, limit: Optional[int] = None, own_jvm_exited: bool = False) -> int:
    """Keep the pipeline's cache (:data:`_FOLDERS`) under ``limit`` bytes (default :func:`max_bytes`):
    remove unfinished dumps whose JVM is gone, then the least recently used
    files (modification time: a used archive is touched) until the rest fit.
    A dump still being written by a live JVM is never removed. Returns the
    bytes left. ``own_jvm_exited``: this process's JVM has exited, so its
    own dump is finished or never will be. Cost: a listing of the cache (a
    few dozen files)."""
    root = cache_root() if root is None else root
    limit = max_bytes() if limit is None else limit
    files = []
    walked = [w for sub in _FOLDERS for w in os.walk(root / sub)]  # the pipeline's own: not other tools' entries
    for folder, _dirs, names in walked:
        for name in names:
            path = Path(folder) / name
            try:
                st = path.stat()
                pid = _dump_pid(path)
                gone = pid is not None and (own_jvm_exited if pid == os.getpid() else not _alive(pid))
                if gone:
                    with open(path, "rb") as f:
                        whole = f.read(4) == _DYNAMIC_MAGIC
                    if not whole:  # its JVM died mid-dump: never finished, never used
                        path.unlink()
                        continue
                busy = pid is not None and not gone
                files.append((st.st_mtime, st.st_size, path, busy))
            except OSError:  # removed meanwhile
                continue
    total = sum(size for _, size, _, _ in files)
    for _mtime, size, path, busy in sorted(files, key=lambda f: f[0]):
        if total <= limit:
            break
        if busy:
            continue
        try:
            path.unlink()
            total -= size
        except OSError:
            continue
    return total


def enabled() -> bool:
    """False when ``NACKTRACKER_CACHE`` is ``0``/``no``/``off``/``false``."""
    return os.environ.get("NACKTRACKER_CACHE", "1").strip().lower() not in ("0", "no", "off", "false")


def _hash(*parts: object) -> str:
    return hashlib.sha256("\0".join(map(str, (_FORMAT, *parts))).encode()).hexdigest()[:24]


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all (a concurrent run reads the old file or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# -- the memory model's constants ---------------------------------------------------

def costs_key() -> str:
    """What :func:`~.calibration.measure_index_costs` depends on: the package's code, Python, pyroaring, numpy."""
    from importlib import metadata

    from .ship import package_fingerprint

    versions = [f"{d}=={metadata.version(d)}" for d in ("pyroaring", "numpy")]
    return _hash(package_fingerprint(), sys.version, platform.machine(), *versions)


_costs_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def cached_costs() -> IndexCosts:
    """:func:`~.calibration.measure_index_costs`'s result, read from the cache when one was
    measured with the same key (~30 ms), else measured (~2-3 s) and stored.
    Once per process (a thread asking while another measures waits for it,
    then reads what it stored)."""
    with _costs_lock:
        return _load_or_measure_costs()


def _load_or_measure_costs() -> IndexCosts:
    from . import calibration  # numpy and the index: loaded when costs are first needed
    from .memory_model import IndexCosts

    if not enabled():
        return calibration.measure_index_costs()
    path = cache_root() / "index-costs" / f"{costs_key()}.json"
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        return IndexCosts(**stored)
    except (OSError, ValueError, TypeError):  # none yet, unreadable, or other fields: measure
        pass
    costs = calibration.measure_index_costs()
    try:
        _write_atomic(path, json.dumps(costs.as_dict(), sort_keys=True).encode())
        prune()
    except OSError:  # a read-only home: measure every time, as without a cache
        pass
    return costs


# -- the driver JVM's class archive -------------------------------------------------

def _java() -> Optional[Path]:
    """The ``java`` Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return Path(found).resolve() if found and os.path.exists(found) else None


def _jvm_key(java: Path, driver_memory: str, conf: Mapping[str, str]) -> Optional[str]:
    """Key of the driver's archive; None when the Spark jars are not found."""
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    jars = Path(home) / "jars"
    if not jars.is_dir():
        return None
    listing = []
    for entry in sorted(os.scandir(jars), key=lambda e: e.name):
        st = entry.stat()
        listing.append(f"{entry.name}:{st.st_size}:{st.st_mtime_ns}")
    release = java.parent.parent / "release"
    java_id = release.read_text(errors="replace") if release.is_file() else str(java.stat().st_mtime_ns)
    paths = [conf.get(k, "") for k in ("spark.driver.extraClassPath", "spark.jars", "spark.jars.packages")]
    env = [os.environ.get(k, "") for k in ("SPARK_DIST_CLASSPATH", "SPARK_CONF_DIR", "SPARK_HOME")]
    return _hash(java, java_id, home, *listing, _oops(driver_memory), *paths, *env)


def _oops(memory: str) -> str:
    """What of the heap size an archive depends on: below 32 GB the JVM
    compresses pointers, above it does not, and refuses an archive of the
    other kind (any heap size of one kind shares an archive)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = memory.strip().lower().rstrip("b")
    try:
        size = float(text[:-1]) * units[text[-1]] if text[-1:] in units else float(text)
    except ValueError:
        return memory
    return "compressed" if size < 32 * (1 << 30) else "wide"


def _adopt(folder: Path, final: Path, prefix: str) -> None:
    """Make a finished dump ``final``. A dump's header is written last (JDK 17
    seeks past it, writes the classes, then the header), so its magic number
    at offset 0 means the file is whole; a dump without it is still being
    written, or was cut short (removed once older than :data:`_STALE_DUMP_S`)."""
    now = time.time()
    for path in folder.glob(f".{prefix}.*.jsa"):
        try:
            with open(path, "rb") as f:
                head = f.read(4)
            age = now - path.stat().st_mtime
            if head == _DYNAMIC_MAGIC and age > 2.0:  # whole, and the header's tail is written too
                os.replace(path, final)
            elif head != _DYNAMIC_MAGIC and age > _STALE_DUMP_S:
                path.unlink()
        except OSError:  # another run adopted or removed it meanwhile
            continue


def class_archive_options(driver_memory: str, conf: Mapping[str, str]) -> str:
    """JVM options for the driver: use the cached class archive, or dump one at
    exit when there is none yet; ``""`` when caching is off or Java/Spark's
    jars are not found. Cost: a stat of the Spark jars (~5 ms)."""
    if not enabled():
        return ""
    java = _java()
    key = _jvm_key(java, driver_memory, conf) if java else None
    if key is None:
        return ""
    quiet = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # an archive the JVM refuses is skipped without a word
    folder = cache_root() / "jvm-classes"
    prefix = f"spark-driver-{key}"
    final = folder / f"{prefix}.jsa"
    try:
        if not final.exists():
            folder.mkdir(parents=True, exist_ok=True)
            _adopt(folder, final, prefix)
        if final.exists():
            os.utime(final)  # used now: the last the bound removes
        prune()
    except OSError:
        return ""
    if final.exists():
        return f"-XX:SharedArchiveFile={final} {quiet}"
    if any(folder.glob(f".{prefix}.*.jsa")):  # another run's dump is on its way: do not dump twice
        return ""
    return f"-XX:ArchiveClassesAtExit={folder / f'.{prefix}.{os.getpid()}.jsa'} {quiet}"
