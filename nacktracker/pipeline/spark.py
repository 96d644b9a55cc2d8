"""One place that builds the SparkSession: offline, quiet, small-data friendly.

Local runs (``local[*]``, the default) need no network and print nothing but
errors: the UI is off, the driver binds the loopback interface, log4j logs at
ERROR from the first line (a log4j2 file is handed to the JVM at launch, so
not even the start-up warnings show), the console progress bar is off, and
Python workers run this interpreter (the one that has pyroaring). Shuffles use
a few partitions, because a nack log of a few million rows is small data.
The driver JVM this process starts maps the classes it needs from a cached
class-data-sharing archive (:func:`~.caches.class_archive_options`: about
half the JVM's start-up CPU).

On a cluster (``--master spark://…``, ``yarn``, ``k8s://…``, or under
``spark-submit``) only the quiet settings apply: the driver must be reachable
from the executors, so its address, memory and Python are left to the cluster
configuration; ``plan`` and ``sweep`` then ship and check what the executors'
Python imports (:mod:`.ship`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from typing import TYPE_CHECKING, Iterator, Mapping, Optional

from .caches import class_archive_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["get_spark", "stop_spark", "is_local", "default_parallelism", "quiet_pandas_check"]


@contextlib.contextmanager
def quiet_pandas_check() -> Iterator[None]:
    """Silence PySpark 4.3's "does not yet fully support pandas >= 3" warning.

    PySpark checks the pandas version when a session starts and whenever a
    pandas/Arrow function is planned; nothing here relies on what that warns
    about (the pipeline moves Arrow batches and flat numeric frames)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas",
                                category=FutureWarning)
        yield


_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
# PySpark's gateway counts as a shell: unless its logger is configured, Spark
# switches the console to WARN and prints a "Setting default log level" banner
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
# a failed task's error reaches the driver, whose command prints it (once, and in its own words)
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = fatal
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = fatal
"""


def _log4j2_file() -> str:
    """A log4j2 config at ERROR, written once per process (the JVM reads a file)."""
    path = os.path.join(tempfile.gettempdir(), f"nacktracker-log4j2-{os.getuid()}.properties")
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == _LOG4J2:
                return path
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(_LOG4J2)
    os.replace(tmp, path)
    return path


def is_local(master: Optional[str]) -> bool:
    return master is None or master.startswith("local")


def get_spark(master: Optional[str] = None, *, app_name: str = "nacktracker",
              shuffle_partitions: Optional[int] = None, driver_memory: str = "4g",
              conf: Optional[Mapping[str, str]] = None) -> SparkSession:
    """Return a SparkSession (the active one if a session already runs).

    ``master``: a Spark master URL; None means ``local[*]``, unless the
    process runs under ``spark-submit`` (which set the master already).
    ``shuffle_partitions``: default ``2 x cores`` locally (at least 4), else
    Spark's own. ``driver_memory`` applies to local runs only (the driver
    is the whole cluster there). ``conf``: extra ``spark.*`` settings.

    Cost: the first call starts a JVM (3-8 s; about half that with the class
    archive cached by an earlier run); later calls return the same session.
    """
    with quiet_pandas_check():
        from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this Python
    if master is None and not under_submit:
        master = "local[*]"
    b = SparkSession.builder.appName(app_name)
    if master is not None:
        b = b.master(master)
    log4j = f"-Dlog4j.configurationFile=file:{_log4j2_file()} -Dlog4j2.level=error"
    driver_java = log4j
    if not under_submit:  # this process starts the driver JVM: give it the cached class archive
        driver_java = f"{log4j} {class_archive_options(driver_memory, conf or {})}".strip()
    settings = {
        "spark.ui.enabled": "false",
        "spark.log.level": "ERROR",  # Spark >= 3.5: setLogLevel at start, also under spark-submit
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": driver_java,
        "spark.executor.extraJavaOptions": log4j,
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Arrow batches of 64k rows: big enough to amortise the JVM <-> Python hop,
        # small enough to stream a partition without holding it twice.
        "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
        "spark.sql.session.timeZone": "UTC",
    }
    if is_local(master) and not under_submit:
        cores = _local_cores(master)
        settings.update({
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.memory": driver_memory,
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.sql.shuffle.partitions": str(shuffle_partitions or max(4, 2 * cores)),
            "spark.default.parallelism": str(max(2, cores)),
            "spark.sql.adaptive.coalescePartitions.enabled": "true",
        })
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    elif shuffle_partitions:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    settings.update(conf or {})
    # PySpark takes the executors' Python from $PYSPARK_PYTHON, not from this
    # setting (spark-submit translates it; a session started here must too)
    if conf is not None and "spark.pyspark.python" in conf:
        os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    for key, value in settings.items():
        b = b.config(key, value)
    with quiet_pandas_check():
        spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _local_cores(master: Optional[str]) -> int:
    """Cores of ``local``, ``local[n]``, ``local[*]``, ``local[n,retries]``."""
    if master is None or master in ("local", "local[*]") or master.startswith("local[*"):
        return 1 if master == "local" else (os.cpu_count() or 1)
    inner = master[master.find("[") + 1:master.find("]")].split(",")[0]
    try:
        return max(1, int(inner))
    except ValueError:
        return os.cpu_count() or 1


def default_parallelism(spark: SparkSession) -> int:
    """Task slots Spark reports (``spark.default.parallelism`` or cores)."""
    return max(1, int(spark.sparkContext.defaultParallelism))


#: How long :func:`stop_spark` lets the driver JVM finish on its own (writing
#: its class archive takes a few seconds) before it is killed.
JVM_EXIT_TIMEOUT_S = 60.0


def stop_spark(spark: SparkSession, timeout_s: float = JVM_EXIT_TIMEOUT_S) -> None:
    """Stop the session and wait until the driver JVM this process started has
    exited, so a command returns with no process of its own left running.

    The JVM writes its class archive as it exits (:func:`~.caches.
    class_archive_options`); it gets ``timeout_s`` for that, then it is killed
    and its unfinished archive removed (:func:`~.caches.prune`). A JVM this
    process did not start (``spark-submit``, a cluster) is left alone.
    """
    from pyspark import SparkContext

    from .caches import prune

    # PySpark (checked on 4.3) has no public handle on the driver JVM it launched, nor a public way to forget a
    # stopped one so that the next session launches its own: the three reads and writes of SparkContext's
    # _gateway and _jvm below are the only ones in the package.
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None) if gateway is not None else None
    with contextlib.suppress(Exception):
        spark.stop()
    if proc is None:
        return
    with contextlib.suppress(Exception):
        gateway.shutdown()  # type: ignore[union-attr]  # proc is not None: a gateway exists
    with contextlib.suppress(Exception):
        proc.stdin.close()  # the launcher exits when its stdin closes
    try:
        proc.wait(timeout=timeout_s)
    except Exception:  # noqa: BLE001  (still running: kill it, and its half-written archive goes)
        with contextlib.suppress(Exception):
            proc.kill()
            proc.wait(timeout=10)
    SparkContext._gateway = None
    SparkContext._jvm = None
    from .caches import enabled

    if enabled():
        with contextlib.suppress(OSError):
            prune(own_jvm_exited=True)
