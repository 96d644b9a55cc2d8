"""pulsar-lite, the embedded test broker: starts in under a second, nothing to download.

:class:`EmbeddedBroker` runs the ``pulsar-lite`` broker binary (shipped in the
``pulsar_lite`` wheel) as a child process that this object alone owns: its own
data directory, its own free 127.0.0.1 port, metrics switched off, and a log
file of everything the broker prints.  :func:`pulsar_service` yields a URL:
``$PULSAR_URL`` when it is set (a real cluster), else a fresh embedded broker.

Why not ``pulsar_lite.start_broker``?  It scans the fixed range 6650-6700 for a
port, shares one refcounted process per db path across the whole interpreter
(a process-wide singleton), writes to ``/tmp/pulsar-lite.log`` and prints, and
the broker binds its metrics endpoint on 8080 unless ``pulsar-lite.toml`` in
its working directory says otherwise -- so a second broker (another test run,
a CI neighbour) fails or, worse, talks to the wrong one.

Caveats of pulsar-lite (what tests built on this can and cannot show):

* it redelivers negatively acknowledged messages only on ``Shared`` and
  ``Key_Shared`` subscriptions (the client's default is ``Exclusive``);
* it cannot redeliver on partitioned topics (and has no admin API to make
  one): partitioned topics are tested on Apache Pulsar;
* it redelivers whole entries: a nack of one message of a batch brings back
  every message of the entry, acknowledged ones included;
* it ignores batch-index acks: with ``batch_index_ack_enabled=True`` acking
  one message of a batch acks the whole entry (the others are lost);
* redelivery counts restart at 0 when the broker restarts (as on Apache
  Pulsar), but grow when a consumer closes (Apache Pulsar's restart at 0);
* on Key_Shared it redelivers one nacked message per key at a time (the
  plain client loses the others there too);
* it answers a seek to a timestamp and then sends nothing until a restart;
* it ignores ``deliver_after``/``deliver_at`` (delayed delivery).

Example::

    with EmbeddedBroker() as broker:
        client = pulsar.Client(broker.url)
        ...
        broker.restart()          # same data dir, same port
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Optional, Union

from ._process import BrokerStartError, free_port, kill_quietly, log_tail, port_in_use, spawn, stop

__all__ = ["EmbeddedBroker"]

log = logging.getLogger(__name__)

_CONFIG = "pulsar-lite.toml"
_LOG = "broker.log"
_DB = "broker"  # the broker stores <data_dir>/broker.rocksdb and broker.metadata.json
_PROBE_TOPIC = "persistent://public/default/__embedded_broker_probe"


class EmbeddedBroker:
    """One pulsar-lite broker process on 127.0.0.1, owned by this object.

    ``data_dir`` holds the broker's storage, its ``pulsar-lite.toml`` (metrics
    disabled; it is the process's working directory) and ``broker.log``
    (stdout and stderr).  Without ``data_dir`` a fresh temporary directory is
    created and removed by :meth:`stop` unless ``keep_data=True``; a given
    ``data_dir`` is never removed.  Without ``port`` a free one is picked on
    the first start and kept, so :meth:`restart` (and :meth:`start` after
    :meth:`kill`) comes back on the same URL with the same data.

    :meth:`start` returns only once the port accepts connections *and* a real
    ``pulsar.Client`` can create a producer; otherwise it raises
    :class:`BrokerStartError` with the log tail and leaves nothing running.
    Use as a context manager, or call :meth:`start` / :meth:`stop`.

    See the module docstring for pulsar-lite's caveats (Shared/Key_Shared
    only, no partitioned topics, whole-entry redelivery).
    """

    kind = "lite"

    def __init__(
        self,
        data_dir: Union[str, os.PathLike, None] = None,
        *,
        port: Optional[int] = None,
        keep_data: bool = False,
        startup_timeout: float = 20.0,
        stop_timeout: float = 5.0,
        log_level: str = "info",
    ) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="nacktracker-broker-")).absolute()
        self.port = port
        self.keep_data = keep_data
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.log_level = log_level
        self._proc: Optional[subprocess.Popen] = None
        self._finalizer: Optional[weakref.finalize] = None

    # -- public surface -------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("broker has not been started yet")
        return f"pulsar://127.0.0.1:{self.port}"

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

    def start(self) -> "EmbeddedBroker":
        """Launch the broker and wait until it serves producers. Idempotent."""
        if self.running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / _CONFIG).write_text("[metrics]\nenabled = false\n")
        # A port picked by free_port() can be taken before the broker binds it: retry
        # with another one, but only if we chose it and never served on it.
        attempts = 3 if self.port is None else 1
        for attempt in range(attempts):
            chosen = self.port or free_port()
            try:
                self._launch(chosen)
                self.port = chosen
                return self
            except BrokerStartError as error:  # its text includes the log tail
                if attempt == attempts - 1 or "in use" not in str(error).lower():
                    raise
                log.warning("port %d was taken before the broker bound it; retrying", chosen)
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """SIGTERM the broker, SIGKILL it after ``stop_timeout``, wait; remove an owned temp dir."""
        self._terminate(signal.SIGTERM)
        if self._owns_dir and not self.keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the broker (a crash, for fault tests). Data is kept; :meth:`start` resumes."""
        self._terminate(signal.SIGKILL)

    def restart(self) -> "EmbeddedBroker":
        """Stop gracefully and start again on the same data dir and port."""
        self._terminate(signal.SIGTERM)
        return self.start()

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines the broker printed (stdout and stderr)."""
        return log_tail(self.log_path, lines)

    def __enter__(self) -> "EmbeddedBroker":
        try:
            return self.start()
        except BaseException:
            self.stop()  # __exit__ will not run: do not leak an owned temp dir
            raise

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<EmbeddedBroker port={self.port} {state} data_dir={str(self.data_dir)!r}>"

    # -- internals ------------------------------------------------------------

    def _launch(self, port: int) -> None:
        from pulsar_lite.binary_finder import find_pulsar_lite_binary

        if port_in_use(port):
            raise BrokerStartError(f"127.0.0.1:{port} is already in use by another process")
        cmd = [
            find_pulsar_lite_binary(),
            "--addr", f"127.0.0.1:{port}",
            "--db-path", str(self.data_dir / _DB),
            "--config", str(self.data_dir / _CONFIG),
            "--log-level", self.log_level,
        ]
        with open(self.log_path, "ab") as out:  # the child keeps its own copy of the fd
            out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(cmd)}\n".encode())
            out.flush()
            self._proc = spawn(cmd, cwd=self.data_dir, log_file=out)
        self._finalizer = weakref.finalize(self, kill_quietly, self._proc)
        log.info("started pulsar-lite pid=%d on 127.0.0.1:%d (%s)", self._proc.pid, port, self.data_dir)
        try:
            self._wait_ready(port)
        except BrokerStartError:
            self._terminate(signal.SIGKILL)
            raise

    def _wait_ready(self, port: int) -> None:
        deadline = time.monotonic() + self.startup_timeout
        last_error: object = None
        import pulsar

        proc = self._proc
        if proc is None:
            raise BrokerStartError("the broker process is not running")
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                last_error = f"broker exited with code {proc.returncode}"
                break
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    pass
                # Short attempts, so a broker that died meanwhile is noticed quickly.
                self._probe(port, min(2.0, max(1.0, deadline - time.monotonic())))
                return
            except (OSError, pulsar.PulsarException) as error:  # connection refused, or the client's timeout
                last_error = error
                time.sleep(0.05)
        raise BrokerStartError(
            f"pulsar-lite on 127.0.0.1:{port} did not become ready "
            f"(startup_timeout={self.startup_timeout:g}s): {last_error}\n"
            f"--- tail of {self.log_path} ---\n{self.log_tail()}"
        )

    def _probe(self, port: int, timeout: float) -> None:
        """Prove the broker works end to end: a real client creates a producer."""
        import pulsar

        client = pulsar.Client(
            f"pulsar://127.0.0.1:{port}",
            operation_timeout_seconds=max(1, round(timeout)),
            connection_timeout_ms=int(timeout * 1000),
            logger=logging.getLogger(__name__ + ".probe"),
        )
        try:
            client.create_producer(_PROBE_TOPIC).close()
        finally:
            client.close()

    def _terminate(self, sig: int) -> None:
        proc, self._proc = self._proc, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if proc is not None:
            stop(proc, sig, self.stop_timeout, "pulsar-lite")
