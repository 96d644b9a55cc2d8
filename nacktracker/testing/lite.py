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
* it ignores ``deliver_after``/``deliver_at`` (delayed delivery);
* it cannot seek a consumer to a message id: the plain client's seek lands on another message and
  leaves the consumer ``NotConnected``;
* it cannot list a namespace's topics, so a pattern subscription fails its lookup;
* it keeps no schema registry: it refuses no consumer's schema;
* it serves no HTTP lookups (its only HTTP endpoint is metrics, switched off here): a client needs the
  ``pulsar://`` URL;
* it authenticates and authorizes nobody: a client's credentials, valid or not, are taken;
* it does not refuse a second consumer on an ``Exclusive`` subscription: the subscribe gets no answer
  and times out (``pulsar.Timeout``), where Apache Pulsar answers ``ConsumerBusy`` (the plain client's
  too);
* on ``Exclusive`` and ``Failover`` subscriptions (the client's default type among them) a chunked
  message never reaches the application: the client drops its chunks as out of order (the plain
  client too; on ``Shared`` and ``Key_Shared`` it arrives whole).

Example::

    with EmbeddedBroker() as broker:
        client = pulsar.Client(broker.url)
        ...
        broker.restart()          # same data dir, same port
"""

from __future__ import annotations

import os
import socket
import time
from typing import Optional, Union

from ..errors import BrokerStartError
from .owned import OwnedBroker, probe

__all__ = ["EmbeddedBroker"]

_CONFIG = "pulsar-lite.toml"
_DB = "broker"  # the broker stores <data_dir>/broker.rocksdb and broker.metadata.json


class EmbeddedBroker(OwnedBroker):
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
    name = "pulsar-lite"

    def __init__(
        self,
        data_dir: Union[str, "os.PathLike[str]", None] = None,
        *,
        port: Optional[int] = None,
        keep_data: bool = False,
        startup_timeout: float = 20.0,
        stop_timeout: float = 5.0,
        log_level: str = "info",
    ) -> None:
        super().__init__(data_dir, prefix="nacktracker-broker-", keep_data=keep_data,
                         startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self.port = port
        self.log_level = log_level

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("broker has not been started yet")
        return f"pulsar://127.0.0.1:{self.port}"

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<EmbeddedBroker port={self.port} {state} data_dir={str(self.data_dir)!r}>"

    # -- what OwnedBroker asks ---------------------------------------------------

    def _ports(self) -> tuple[Optional[int], ...]:
        return (self.port,)

    def _keep_ports(self, ports: tuple[int, ...]) -> None:
        (self.port,) = ports

    def _prepare(self) -> None:
        (self.data_dir / _CONFIG).write_text("[metrics]\nenabled = false\n")

    def _command(self, ports: tuple[int, ...], prepared: object) -> tuple[list[str], None]:
        from pulsar_lite.binary_finder import find_pulsar_lite_binary

        return [
            find_pulsar_lite_binary(),
            "--addr", f"127.0.0.1:{ports[0]}",
            "--db-path", str(self.data_dir / _DB),
            "--config", str(self.data_dir / _CONFIG),
            "--log-level", self.log_level,
        ], None

    def _wait_ready(self, ports: tuple[int, ...]) -> None:
        import pulsar

        (port,) = ports
        deadline = time.monotonic() + self.startup_timeout
        last_error: object = None
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
                probe(f"pulsar://127.0.0.1:{port}", min(2.0, max(1.0, deadline - time.monotonic())))
                return
            except (OSError, pulsar.PulsarException) as error:  # connection refused, or the client's timeout
                last_error = error
                time.sleep(0.05)
        raise self._not_ready(port, last_error)
