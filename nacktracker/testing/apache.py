"""Apache Pulsar itself as a test broker: the standalone broker from Maven Central.

:class:`ApacheBroker` runs ``org.apache.pulsar.PulsarStandaloneStarter`` (the
broker, one bookie and RocksDB metadata in one JVM; no functions worker, no
stream storage) as a child process this object alone owns: its own data
directory, free 127.0.0.1 ports for the binary protocol and the admin REST
API, a log file, and broker settings written by the code, so a test can ask
for batch-index acks, partitioned auto-created topics, a delayed-delivery
tick and so on.

The broker's class path comes from Maven (``mvn`` on the PATH and Java 17+):
the first start resolves ``apache_pulsar/pom.xml`` beside this module from
Maven Central into the Maven cache (~260 MB, about a minute); the class path
is then kept in ``$NACKTRACKER_CACHE_DIR/apache-pulsar/`` (default
``~/.cache/nacktracker``), keyed by the pom's content, so a warm start needs
no Maven at all and takes a few seconds.

Where pulsar-lite and Apache Pulsar differ, Apache Pulsar is the truth for
what nacktracker promises.

Example::

    with ApacheBroker(settings={"acknowledgmentAtBatchIndexLevelEnabled": True}) as broker:
        client = pulsar.Client(broker.url)
        broker.admin("PUT", "/admin/v2/persistent/public/default/orders/partitions", 2)
        ...
        broker.kill()             # kill -9; data kept
        broker.start()            # same ports, same data
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from ..errors import BrokerStartError
from .owned import OwnedBroker, probe

__all__ = ["ApacheBroker", "PULSAR_VERSION", "DEFAULT_SETTINGS", "resolve_classpath"]

log = logging.getLogger(__name__)

#: The Apache Pulsar release the tests run on (the 4.0 LTS line); pinned in apache_pulsar/pom.xml too.
PULSAR_VERSION = "4.0.7"

#: Broker settings written before every start; ``settings=`` overrides or adds keys.
#: One bookie, so every quorum is 1; no load balancing; the journal not synced
#: (a test broker: speed over durability against power loss, not against a crash
#: of the process, which the journal still covers); topics never deleted for
#: inactivity (a test may pause longer than a minute between two steps).
DEFAULT_SETTINGS: dict[str, object] = {
    "clusterName": "standalone",
    "bindAddress": "127.0.0.1",
    "advertisedAddress": "127.0.0.1",
    "listeningInterface": "lo",  # the bookie's listener: loopback only
    "allowLoopback": True,
    "managedLedgerDefaultEnsembleSize": 1,
    "managedLedgerDefaultWriteQuorum": 1,
    "managedLedgerDefaultAckQuorum": 1,
    "loadManagerClassName": "org.apache.pulsar.broker.loadbalance.NoopLoadManager",
    "loadBalancerEnabled": False,
    "ledgerStorageClass": "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage",
    "dbStorage_writeCacheMaxSizeMb": 32,
    "dbStorage_readAheadCacheMaxSizeMb": 32,
    "journalSyncData": False,
    "journalMaxGroupWaitMSec": 1,
    "diskUsageThreshold": 0.99,
    "diskUsageWarnThreshold": 0.99,
    "functionsWorkerEnabled": False,
    "brokerDeleteInactiveTopicsEnabled": False,
    "brokerShutdownTimeoutMs": 3000,
    "delayedDeliveryEnabled": True,
    "allowAutoTopicCreationType": "non-partitioned",
    "acknowledgmentAtBatchIndexLevelEnabled": False,  # 4.0.x's default, written so a test sees it
    "managedLedgerCacheSizeMB": 64,
}

#: The flags Pulsar's own launch script gives the JVM on Java 17 (module opens for Netty and
#: BookKeeper), with a heap sized for tests rather than production.
_JVM_FLAGS = (
    "-XX:+UseG1GC",
    "-Djava.net.preferIPv4Stack=true",
    "-Djute.maxbuffer=10485760",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dpulsar.allocator.exit_on_oom=true",
    "-Dlog4j.shutdownHookEnabled=false",
    "-Dlog4j2.is.webapp=false",
    "--add-opens", "java.base/java.io=ALL-UNNAMED",
    "--add-opens", "java.base/java.nio=ALL-UNNAMED",
    "--add-opens", "java.base/java.util.zip=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.platform=ALL-UNNAMED",
    "--add-opens", "java.management/sun.management=ALL-UNNAMED",
    "--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED",
)
_MAIN = "org.apache.pulsar.PulsarStandaloneStarter"
_CONF = "standalone.conf"


def _resource(name: str) -> bytes:
    return resources.files(__package__).joinpath("apache_pulsar", name).read_bytes()


def _cache_dir() -> Path:
    root = os.environ.get("NACKTRACKER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "nacktracker")
    return Path(root) / "apache-pulsar"


def _require(tool: str, why: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise BrokerStartError(f"Apache Pulsar needs `{tool}` on the PATH ({why}); none found")
    return found


def resolve_classpath(*, refresh: bool = False) -> list[str]:
    """The broker's class path: jar paths in the Maven cache.

    Cached by the pom's content; resolved again by Maven when the cache is
    missing, a jar of it has gone (the Maven cache was cleaned) or ``refresh``.
    Raises :class:`BrokerStartError` with Maven's output when it fails.
    """
    pom = _resource("pom.xml")
    folder = _cache_dir() / f"{PULSAR_VERSION}-{hashlib.sha256(pom).hexdigest()[:12]}"
    cached = folder / "classpath.txt"
    if not refresh and cached.is_file():
        jars = cached.read_text().strip().split(os.pathsep)
        if jars and all(os.path.isfile(j) for j in jars):
            return jars
    mvn = _require("mvn", f"it resolves org.apache.pulsar:pulsar-broker:{PULSAR_VERSION} from Maven Central")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pom.xml").write_bytes(pom)
    partial = folder / f"classpath.{os.getpid()}.tmp"
    started = time.monotonic()
    log.info("resolving Apache Pulsar %s with Maven (first start; ~260 MB into the Maven cache)", PULSAR_VERSION)
    done = subprocess.run(
        [mvn, "-B", "-q", "-f", str(folder / "pom.xml"), "dependency:build-classpath",
         f"-Dmdep.outputFile={partial}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        tail = "\n".join(done.stdout.splitlines()[-30:])
        raise BrokerStartError(
            f"Maven could not resolve org.apache.pulsar:pulsar-broker:{PULSAR_VERSION} "
            f"(exit {done.returncode}):\n{tail}")
    os.replace(partial, cached)  # atomic: a concurrent start reads the old file or the new one
    log.info("resolved Apache Pulsar's class path in %.1f s", time.monotonic() - started)
    return cached.read_text().strip().split(os.pathsep)


def _render(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class ApacheBroker(OwnedBroker):
    """One Apache Pulsar standalone broker on 127.0.0.1, owned by this object.

    ``settings`` are broker configuration keys (``standalone.conf``; see
    :data:`DEFAULT_SETTINGS` for what is written by default), values as
    Python scalars. ``data_dir`` holds the metadata store, the bookie's
    journal and ledgers, ``standalone.conf`` and ``broker.log``; without it a
    fresh temporary directory is made and removed by :meth:`stop` unless
    ``keep_data``. Ports are picked free on the first start and kept, so
    :meth:`restart` and :meth:`start` after :meth:`kill` come back on the same
    URLs with the same data.

    ``token``: for a broker that authenticates and authorizes (``settings``
    such as ``authenticationEnabled``, ``authorizationEnabled``,
    ``tokenSecretKey``), a token of one of its ``superUserRoles``: the start's
    readiness checks and :meth:`admin` present it (``Authorization: Bearer``).

    :meth:`start` returns once the admin API answers ``/admin/v2/brokers/ready``
    and the ``public/default`` namespace exists (standalone creates it just
    after the broker starts) and a real client can create a producer;
    otherwise it raises :class:`BrokerStartError` with the log tail and leaves
    nothing running. The JVM runs in its own process group and is SIGKILLed
    by the kernel if the process that started it dies.
    """

    kind = "apache"
    name = f"Apache Pulsar {PULSAR_VERSION}"

    def __init__(
        self,
        data_dir: Union[str, "os.PathLike[str]", None] = None,
        *,
        settings: Optional[Mapping[str, object]] = None,
        port: Optional[int] = None,
        admin_port: Optional[int] = None,
        keep_data: bool = False,
        heap: str = "768m",
        jvm_options: Sequence[str] = (),
        startup_timeout: float = 120.0,
        stop_timeout: float = 10.0,
        token: Optional[str] = None,
    ) -> None:
        settings = {**DEFAULT_SETTINGS, **(settings or {})}
        for key in ("brokerServicePort", "webServicePort"):
            if key in settings:
                raise ValueError(f"set the port with port= / admin_port=, not settings[{key!r}]")
        super().__init__(data_dir, prefix="nacktracker-apache-", keep_data=keep_data,
                         startup_timeout=startup_timeout, stop_timeout=stop_timeout)
        self.settings: dict[str, object] = settings
        self.port = port
        self.admin_port = admin_port
        self.heap = heap
        self.jvm_options = tuple(jvm_options)
        self.token = token

    @property
    def url(self) -> str:
        """``pulsar://127.0.0.1:<port>``, the binary protocol's service URL."""
        if self.port is None:
            raise RuntimeError("broker has not been started yet")
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        """``http://127.0.0.1:<admin_port>``, the admin REST API's base URL."""
        if self.admin_port is None:
            raise RuntimeError("broker has not been started yet")
        return f"http://127.0.0.1:{self.admin_port}"

    def admin(self, method: str, path: str, body: Any = None, *, timeout: float = 30.0) -> Any:
        """Call the admin REST API: ``admin("GET", "/admin/v2/brokers/version")``.

        ``body`` is sent as JSON. Returns the decoded JSON answer (a string
        when it is not JSON, None when empty); an HTTP error raises
        :class:`urllib.error.HTTPError` with the broker's reason in its message.
        """
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.admin_url + path, data=data, method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json", **self._auth_header()})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                text = answer.read().decode()
        except urllib.error.HTTPError as error:
            reason = error.read().decode(errors="replace")
            raise urllib.error.HTTPError(
                error.url, error.code, f"{method} {path}: {error.code} {reason}", error.headers, None) from None
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def version(self) -> str:
        """The version the running broker reports (``/admin/v2/brokers/version``)."""
        return str(self.admin("GET", "/admin/v2/brokers/version"))

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<ApacheBroker {PULSAR_VERSION} port={self.port} admin_port={self.admin_port} {state}>"

    # -- what OwnedBroker asks ---------------------------------------------------

    def _ports(self) -> tuple[Optional[int], ...]:
        return (self.port, self.admin_port)

    def _keep_ports(self, ports: tuple[int, ...]) -> None:
        self.port, self.admin_port = ports

    def _prepare(self) -> tuple[str, list[str]]:
        classpath = resolve_classpath()
        return _require("java", "Apache Pulsar's broker is a Java program (Java 17+)"), classpath

    def _write_config(self, port: int, admin_port: int) -> Path:
        lines = [f"{k}={_render(v)}" for k, v in self.settings.items()]
        lines += [f"brokerServicePort={port}", f"webServicePort={admin_port}"]
        conf = self.data_dir / _CONF
        conf.write_text("\n".join(lines) + "\n")
        (self.data_dir / "log4j2.properties").write_bytes(_resource("log4j2.properties"))
        return conf

    def _command(self, ports: tuple[int, ...], prepared: tuple[str, list[str]]) -> tuple[list[str], dict[str, str]]:
        java, classpath = prepared
        conf = self._write_config(*ports)
        first = not (self.data_dir / "metadata").exists()
        cmd = [
            java, f"-Xms{self.heap}", f"-Xmx{self.heap}", "-XX:MaxDirectMemorySize=512m", *_JVM_FLAGS,
            f"-Dlog4j.configurationFile={self.data_dir / 'log4j2.properties'}", *self.jvm_options,
            "-cp", os.pathsep.join(classpath), _MAIN,
            "-c", str(conf), "--no-functions-worker", "--no-stream-storage",
            "--metadata-dir", str(self.data_dir / "metadata"),
            "--bookkeeper-dir", str(self.data_dir / "bookkeeper"),
            # absent on purpose: its existence would switch standalone to ZooKeeper metadata
            "--zookeeper-dir", str(self.data_dir / "zookeeper-unused"),
            *(["--wipe-data"] if first else []),
        ]
        return cmd, {k: v for k, v in os.environ.items() if k != "PULSAR_STANDALONE_USE_ZOOKEEPER"}

    def _auth_header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _get_status(self, url: str) -> int:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=self._auth_header()), timeout=2) as answer:
                status: int = answer.status
                return status
        except urllib.error.HTTPError as error:
            return error.code

    def _wait_ready(self, ports: tuple[int, ...]) -> None:
        import pulsar

        port, admin_port = ports
        deadline = time.monotonic() + self.startup_timeout
        base = f"http://127.0.0.1:{admin_port}"
        proc = self._proc
        assert proc is not None
        last_error: object = "no answer yet"
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                last_error = f"the JVM exited with code {proc.returncode}"
                break
            try:
                if self._get_status(base + "/admin/v2/brokers/ready") != 200:
                    last_error = "/admin/v2/brokers/ready: not ready"
                elif self._get_status(base + "/admin/v2/namespaces/public/default") != 200:
                    last_error = "namespace public/default not created yet"
                else:
                    probe(f"pulsar://127.0.0.1:{port}", min(10.0, max(1.0, deadline - time.monotonic())),
                          authentication=pulsar.AuthenticationToken(self.token) if self.token else None)
                    return
            except (OSError, pulsar.PulsarException) as error:
                last_error = error
            time.sleep(0.2)
        raise self._not_ready(port, last_error)
