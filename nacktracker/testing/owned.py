"""A broker process owned by one object: what both test brokers share.

:class:`OwnedBroker` keeps the life cycle -- a data directory (a temporary
one removed on :meth:`~OwnedBroker.stop` unless kept), free 127.0.0.1 ports
picked on the first start and kept after it, a log file, readiness, graceful
and hard stops, a context manager -- and leaves to a subclass what differs:
its ports, its command line and what "ready" means.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Optional, Self, Union

from ..errors import BrokerStartError
from ._process import free_port, kill_quietly, log_tail, port_in_use, spawn, stop

__all__ = ["OwnedBroker", "probe"]

log = logging.getLogger(__name__)

_LOG = "broker.log"


class OwnedBroker:
    """A broker process on 127.0.0.1 that this object starts and stops (see the module doc).

    Subclasses set :attr:`kind` and :attr:`name` and implement
    :meth:`_ports`, :meth:`_keep_ports`, :meth:`_command` and
    :meth:`_wait_ready` (and :meth:`_prepare` for work before any launch).
    """

    kind = ""
    name = ""

    def __init__(self, data_dir: Union[str, "os.PathLike[str]", None], *, prefix: str, keep_data: bool,
                 startup_timeout: float, stop_timeout: float) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix=prefix)).absolute()
        self.keep_data = keep_data
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._finalizer: Optional["weakref.finalize[Any, Any]"] = None
        self._started_once = False

    # -- what a subclass says ----------------------------------------------------------------

    def _ports(self) -> tuple[Optional[int], ...]:
        """The ports asked for or kept (None: pick a free one)."""
        raise NotImplementedError

    def _keep_ports(self, ports: tuple[int, ...]) -> None:
        raise NotImplementedError

    def _prepare(self) -> Any:
        """Work before the first launch attempt; its result goes to :meth:`_command`."""
        return None

    def _command(self, ports: tuple[int, ...], prepared: Any) -> tuple[list[str], Optional[dict[str, str]]]:
        """The command line and environment (None: this process's) of a launch on ``ports``."""
        raise NotImplementedError

    def _wait_ready(self, ports: tuple[int, ...]) -> None:
        """Return once the broker serves; raise :meth:`_not_ready` when it does not in time."""
        raise NotImplementedError

    # -- the life cycle ----------------------------------------------------------------------

    @property
    def pid(self) -> Optional[int]:
        """The broker's process id while it runs, else None."""
        return self._proc.pid if self._proc is not None and self.running else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path:
        return self.data_dir / _LOG

    def start(self) -> Self:
        """Launch the broker and wait until it serves producers. Idempotent."""
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        prepared = self._prepare()
        # Ports we picked can be taken before the broker binds them: retry with others, but only
        # before the first start (after it, the data belongs to these URLs).
        attempts = 3 if not self._started_once and all(p is None for p in self._ports()) else 1
        for attempt in range(attempts):
            ports = tuple(p or free_port() for p in self._ports())
            try:
                self._launch(ports, prepared)
            except BrokerStartError as error:  # its text includes the log tail
                if attempt == attempts - 1 or "in use" not in str(error).lower():
                    raise
                log.warning("a port was taken before %s bound it; retrying with others", self.name)
                continue
            self._keep_ports(ports)
            self._started_once = True
            return self
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """SIGTERM the broker's process group, SIGKILL it after ``stop_timeout``; remove an owned temp dir."""
        self._terminate(signal.SIGTERM)
        if self._owns_dir and not self.keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the broker (a crash, ``kill -9``). Data is kept; :meth:`start` resumes on it."""
        self._terminate(signal.SIGKILL)

    def restart(self) -> Self:
        """Stop gracefully and start again on the same data and ports."""
        self._terminate(signal.SIGTERM)
        return self.start()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines the broker printed (stdout and stderr)."""
        return log_tail(self.log_path, lines)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()  # __exit__ will not run: do not leak an owned temp dir
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- internals ---------------------------------------------------------------------------

    def _launch(self, ports: tuple[int, ...], prepared: Any) -> None:
        for port in ports:
            if port_in_use(port):
                raise BrokerStartError(f"127.0.0.1:{port} is already in use by another process")
        cmd, env = self._command(ports, prepared)
        with open(self.log_path, "ab") as out:  # the child keeps its own copy of the fd
            out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {self.name} on 127.0.0.1:{ports}\n".encode())
            out.flush()
            self._proc = spawn(cmd, cwd=self.data_dir, log_file=out, env=env)
        self._finalizer = weakref.finalize(self, kill_quietly, self._proc)
        log.info("started %s pid=%d on 127.0.0.1 ports %s (%s)", self.name, self._proc.pid, ports, self.data_dir)
        try:
            self._wait_ready(ports)
        except BaseException:
            self._terminate(signal.SIGKILL)
            raise

    def _not_ready(self, port: int, last_error: object) -> BrokerStartError:
        if "Address already in use" in self.log_tail(200):
            last_error = f"{last_error} (a port is already in use)"
        return BrokerStartError(
            f"{self.name} on 127.0.0.1:{port} did not become ready (startup_timeout={self.startup_timeout:g}s): "
            f"{last_error}\n--- tail of {self.log_path} ---\n{self.log_tail()}")

    def _terminate(self, sig: int) -> None:
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is not None:
            stop(proc, sig, self.stop_timeout, self.name)


def probe(url: str, timeout: float, authentication: Any = None) -> None:
    """Prove a broker works end to end: a real client creates a producer.

    Its logger is the client's own console logger (errors only), never a ``logging.Logger``: the C++
    client keeps the first logger factory a process gives it, so one client made with a Python logger
    makes every later client of the process call into Python (taking the GIL) for its log checks on
    every message, its own logger notwithstanding (about 5x the CPU per received message)."""
    import pulsar

    client = pulsar.Client(url, authentication=authentication, operation_timeout_seconds=max(1, round(timeout)),
                           connection_timeout_ms=int(timeout * 1000),
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        client.create_producer("persistent://public/default/__nacktracker_broker_probe").close()
    finally:
        client.close()
