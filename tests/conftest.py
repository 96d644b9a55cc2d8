"""Shared fixtures. Tests that need a broker get one embedded pulsar-lite per
session (or $PULSAR_URL); the tracker is tested with an injectable clock."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from nacktracker.testing import pulsar_service

# hypothesis profiles, timeouts, required dependencies: see run_checks.py
from run_checks import pytest_collection_modifyitems, pytest_configure, pytest_report_header  # noqa: F401

# pulsar-client is imported inside the fixtures: tests that need no broker must
# not depend on it.


def quiet_logger():
    """The C++ client logs at INFO to stdout by default: keep test output readable."""
    import pulsar

    return pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


@pytest.fixture(scope="session")
def broker_url():
    """One broker for the whole session: ``$PULSAR_URL`` or an embedded pulsar-lite."""
    with pulsar_service() as url:
        yield url


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
