"""Shared fixtures. Tests that need a broker run on both test brokers: one
pulsar-lite and one Apache Pulsar per session (or only ``$PULSAR_URL``); the
tracker is tested with an injectable clock.

``NACKTRACKER_TEST_BROKERS`` (``lite,apache`` by default) chooses the kinds;
a test on a broker carries the marker of its kind (``-m lite``, ``-m apache``).
A broker that cannot start is an error, never a skip.

The tests live in one folder per room of the package (``index/``, ``tracker/``,
``adapters/``, ``consumer/``, ``brokers/``, ``pipeline/``), the checks of the
whole (docs, layers, public surface, CLI, benchmarks) here. A test module may
import another's fakes by module name (``from test_consumer_shell import
FakeBroker``): every room's folder is on ``sys.path``, whichever runs first.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from nacktracker.testing import BROKER_KINDS, make_broker

TESTS = Path(__file__).resolve().parent
#: The rooms' test folders (each on sys.path: see above).
ROOMS = sorted({path.parent for path in TESTS.rglob("test_*.py")} - {TESTS})
sys.path[:0] = [str(room) for room in ROOMS if str(room) not in sys.path]

# nacktracker's cache ($NACKTRACKER_CACHE_DIR: the pipeline's constants and JVM
# class archive, the Apache broker's class path): tests never read or write the
# user's ~/.cache/nacktracker, but one of their own under the temp dir, kept
# between runs (so a JVM archive or class path is reused) and bounded as any is.
os.environ["NACKTRACKER_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"nacktracker-test-cache-{os.getuid()}")


def broker_kinds() -> list[str]:
    """The broker kinds this session runs on: ``external`` when ``$PULSAR_URL`` is set."""
    if os.environ.get("PULSAR_URL"):
        return ["external"]
    kinds = [k.strip() for k in os.environ.get("NACKTRACKER_TEST_BROKERS", ",".join(BROKER_KINDS)).split(",")]
    unknown = [k for k in kinds if k not in BROKER_KINDS]
    if unknown or not kinds:
        raise pytest.UsageError(f"NACKTRACKER_TEST_BROKERS: unknown kinds {unknown}; expected {BROKER_KINDS}")
    return kinds


# hypothesis profiles, timeouts, required dependencies: see run_checks.py
from run_checks import apply_run_settings, pytest_configure, pytest_report_header  # noqa: E402, F401

# pulsar-client is imported inside the fixtures: tests that need no broker must
# not depend on it.


def quiet_logger():
    """The C++ client logs at INFO to stdout by default: keep test output readable."""
    import pulsar

    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


@pytest.fixture(scope="session", params=broker_kinds())
def broker_kind(request) -> str:
    """``lite``, ``apache`` or ``external`` (``$PULSAR_URL``): every broker test runs once per kind."""
    return request.param


@pytest.fixture(scope="session")
def session_broker(broker_kind):
    """One broker of ``broker_kind`` for the whole session (None for ``$PULSAR_URL``)."""
    if broker_kind == "external":
        yield None
        return
    with make_broker(broker_kind) as broker:
        yield broker


@pytest.fixture(scope="session")
def broker_url(broker_kind, session_broker) -> str:
    """The session broker's service URL (``$PULSAR_URL`` when set)."""
    return os.environ["PULSAR_URL"] if session_broker is None else session_broker.url


@pytest.fixture
def own_broker(broker_kind, tmp_path):
    """``own_broker(**options)``: a broker of this test's kind that the test may stop,
    kill and restart (data in ``tmp_path``); stopped after the test. Skips with
    ``$PULSAR_URL``, which names a broker this session cannot restart."""
    if broker_kind == "external":
        pytest.skip("needs a broker it can stop and start itself ($PULSAR_URL is set)")
    made = []

    def make(**options):
        options.setdefault("data_dir", tmp_path / f"broker-{len(made)}")
        made.append(make_broker(broker_kind, **options))
        return made[-1]

    yield make
    for broker in made:
        broker.stop()


#: Fixtures that start brokers of the test's own (test_reliability's ``crashable`` and the ported client tests'
#: ``auth_broker``: one per module).
OWN_BROKER_FIXTURES = {"own_broker", "crashable", "auth_broker"}


def pytest_collection_modifyitems(config, items):
    """Mark each test that runs on a broker with its kind (``lite`` / ``apache`` / ``external``), and
    each that starts brokers of its own (``own_broker``: ``make test`` runs those in a session of their own)."""
    for item in items:
        kind = getattr(item, "callspec", None) and item.callspec.params.get("broker_kind")
        if kind:
            item.add_marker(getattr(pytest.mark, kind))
        if OWN_BROKER_FIXTURES.intersection(item.fixturenames):
            item.add_marker(pytest.mark.own_broker)
    apply_run_settings(items)


#: make test's record of failed tests (tools/run_tests.py): one JSON line per failed phase of a test.
FAILURES_ENV = "NACKTRACKER_TEST_FAILURES"


def pytest_runtest_logreport(report):
    """Under ``make test``: note each failure, and whether the test is marked ``timing`` (a millisecond
    lateness check: ``make test`` runs such a test again alone if it failed beside the other sessions)."""
    path = os.environ.get(FAILURES_ENV)
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"nodeid": report.nodeid, "when": report.when,
                                  "timing": "timing" in report.keywords}) + "\n")


@pytest.fixture
def topic():
    """A factory of fresh topic names (no test sees another's messages)."""

    def make(prefix: str = "t") -> str:
        return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:10]}"

    return make


@pytest.fixture
async def client(broker_url):
    """A ``pulsar.asyncio.Client`` on the session broker, closed after the test."""
    import pulsar.asyncio

    c = pulsar.asyncio.Client(broker_url, logger=quiet_logger(), operation_timeout_seconds=10)
    yield c
    try:
        await c.close()
    except Exception:
        pass


class Pump:
    """Receives from a plain ``pulsar.asyncio.Consumer`` in one background task
    (its ``receive()`` loses a message when cancelled), stamping arrival times
    on the loop clock (ms)."""

    def __init__(self, consumer) -> None:
        self.consumer = consumer
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            msg = await self.consumer.receive()
            self.queue.put_nowait((loop.time() * 1000.0, msg))

    async def get(self, timeout: float = 5.0):
        """``(arrival_ms, message)``; ``asyncio.TimeoutError`` when none comes."""
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
async def pumps():
    """``pumps(consumer) -> Pump``; every pump is stopped after the test."""
    made: list[Pump] = []

    def make(consumer) -> Pump:
        made.append(Pump(consumer))
        return made[-1]

    yield make
    for p in made:
        await p.close()


@pytest.fixture
def pulsar_logger():
    """A quiet logger for clients a test makes itself."""
    return quiet_logger()


@pytest.fixture(scope="session", autouse=True)
def _pulsar_client_exit_grace():
    """pulsar-client 3.13's threads can still be releasing callbacks right after
    ``close()``; an interpreter that finalizes meanwhile can abort. A short pause
    at the end of the session avoids it (measured: nacktracker.demo.CLOSE_GRACE_S)."""
    yield
    import time

    time.sleep(0.2)
