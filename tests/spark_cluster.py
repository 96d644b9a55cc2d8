"""A real Spark standalone cluster on 127.0.0.1 for the tests: one master and
one worker, started from the pyspark in this environment (``spark-class``,
as docs/pipeline.md shows), whose executors run a *bare* Python of this minor
version: none of this project's packages importable, none of this
environment's paths. Stopped (process groups terminated) on exit."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

#: What a bare executor Python must NOT be able to import.
PROJECT_MODULES = ("nacktracker", "pyroaring", "sortedcontainers", "numpy", "pyarrow", "pandas")


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _is_bare(python: str) -> bool:
    """Same minor version as this interpreter, and none of PROJECT_MODULES importable."""
    probe = ("import importlib.util, sys; "
             f"ok = sys.version_info[:2] == {tuple(sys.version_info[:2])!r} and not any("
             f"importlib.util.find_spec(m) for m in {PROJECT_MODULES!r}); sys.exit(0 if ok else 1)")
    try:
        return subprocess.run([python, "-c", probe], env={"PATH": "/usr/bin:/bin"}, cwd="/",
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def bare_python_dir(tmp: Path) -> Path:
    """A directory holding ``python3``: the system Python if it is bare and of
    this minor version, else a fresh ``venv --without-pip`` (no system
    site-packages) of this interpreter's base install."""
    major, minor = sys.version_info[:2]
    chosen: Optional[str] = None
    for candidate in (f"/usr/bin/python{major}.{minor}", "/usr/bin/python3"):
        if os.path.exists(candidate) and _is_bare(candidate):
            chosen = candidate
            break
    if chosen is None:
        venv = tmp / "bare-venv"
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True,
                       env={"PATH": "/usr/bin:/bin"}, cwd="/")
        chosen = str(venv / "bin" / "python")
        assert _is_bare(chosen), f"{chosen} is not bare"
    folder = tmp / "bare-bin"
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec {chosen} "$@"\n')
    wrapper.chmod(0o755)
    return folder


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise RuntimeError(f"Spark daemon did not log {text!r} within {timeout} s (exit {proc.poll()}):\n{tail}")


@dataclass
class Cluster:
    master_url: str
    bare_bin: Path
    work_dir: Path
    logs: Path


def daemon_env(bare_bin: Path) -> dict:
    """A clean environment: no PYTHONPATH, no venv, only the bare python3 and the system on PATH."""
    env = {"HOME": os.environ.get("HOME", "/tmp"), "PATH": f"{bare_bin}:/usr/bin:/bin",
           "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", "LANG": "C.UTF-8"}
    if os.environ.get("JAVA_HOME"):
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    return env


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@contextlib.contextmanager
def standalone_cluster(tmp: Path, cores: int = 2, memory: str = "2g") -> Iterator[Cluster]:
    """Master + worker on free 127.0.0.1 ports; both stopped on exit."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise RuntimeError("needs Java")
    tmp.mkdir(parents=True, exist_ok=True)
    bare_bin = bare_python_dir(tmp)
    env = daemon_env(bare_bin)
    # the master's REST submission server would take a fixed port (6066): off
    env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
    spark_class = str(spark_home() / "bin" / "spark-class")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    master_log, worker_log = tmp / "master.log", tmp / "worker.log"
    work = tmp / "work"
    procs = []
    try:
        with open(master_log, "wb") as out:
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(free_port())],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True))
        _wait_for(master_log, "I have been elected leader", procs[0], 90)
        with open(worker_log, "wb") as out:
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", str(cores),
                 "--memory", memory, "--work-dir", str(work)],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True))
        _wait_for(worker_log, "Successfully registered with master", procs[1], 90)
        yield Cluster(url, bare_bin, work, tmp)
    finally:
        for proc in reversed(procs):
            _stop(proc)
