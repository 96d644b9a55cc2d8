"""Child processes that cannot outlive their owner: the brokers' common ground.

A broker started here runs in a process group of its own (so a stop reaches
whatever it started) and, on Linux, asks the kernel to SIGKILL it when the
process that started it dies (``PR_SET_PDEATHSIG``), so a test session or a
``python -m nacktracker.testing`` killed with SIGKILL leaves nothing behind.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Callable, Optional, Sequence

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A currently free 127.0.0.1 TCP port (bind to port 0, then release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_in_use(port: int) -> bool:
    """True when something listens on 127.0.0.1:``port``.

    SO_REUSEADDR: TIME_WAIT leftovers of an earlier run do not count, a live
    listener does (on Linux the bind then still fails).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def _prctl() -> Optional[Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn: Callable[..., int] = libc.prctl
    return fn


_PRCTL = _prctl()  # loaded here: the child must not load libraries between fork and exec


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(cmd: Sequence[str], *, cwd: Path, log_file: IO[bytes], env: Optional[dict[str, str]] = None
          ) -> "subprocess.Popen[bytes]":
    """Start ``cmd`` in its own process group, killed if this process dies.

    stdout and stderr go to ``log_file`` (the child keeps its own copy of the fd).
    The kernel's parent-death signal follows the *thread* that forked, so every
    child is forked by one thread that lives as long as the process: a broker
    restarted from a short-lived thread (an event loop's executor) would
    otherwise die with that thread.
    """
    return _spawner().submit(
        subprocess.Popen, list(cmd), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
        stderr=log_file, start_new_session=True, preexec_fn=_die_with_parent,
    ).result()


_SPAWNER: Optional[concurrent.futures.ThreadPoolExecutor] = None
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> concurrent.futures.ThreadPoolExecutor:
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            _SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nacktracker-broker-spawner")
        return _SPAWNER


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the child is its group's leader (setsid)
    except ProcessLookupError:
        pass


def stop(proc: "subprocess.Popen[bytes]", sig: int, timeout: float, what: str) -> None:
    """Send ``sig`` to the child's process group; SIGKILL the group after ``timeout`` s; reap."""
    if proc.poll() is not None:
        _signal_group(proc.pid, signal.SIGKILL)  # anything the leader left behind
        return
    _signal_group(proc.pid, sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log.warning("%s pid=%d ignored %s for %.0f s; sending SIGKILL",
                    what, proc.pid, signal.Signals(sig).name, timeout)
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
    _signal_group(proc.pid, signal.SIGKILL)
    log.info("%s pid=%d exited with %s", what, proc.pid, proc.returncode)


def kill_quietly(proc: "subprocess.Popen[bytes]") -> None:
    """Safety net (garbage collection, interpreter exit): never leave a broker behind."""
    _signal_group(proc.pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ("" when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
