"""An in-process adapter that records what it was asked: the mock transport
that makes the tracker testable without a broker."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..errors import AdapterError
from ..keys import MessageKey


@dataclass(frozen=True)
class RedeliveryCall:
    at_ms: float  # the recording clock's time when the call arrived
    keys: tuple[MessageKey, ...]


class MemoryAdapter:
    """Records each ``redeliver`` call with its arrival time.

    Failure injection for tests: :meth:`fail_next` (the next ``n`` calls
    raise), ``delay_s`` (every call takes that long: a slow adapter) and
    ``lead_ms`` (declared latency, honoured by the tracker).

    ``clock``: a callable returning ms for ``at_ms`` (default: the running
    loop's ``time()`` in ms; pass ``ManualClock().now_ms`` in fake-clock tests).
    """

    def __init__(self, *, lead_ms: int = 0, delay_s: float = 0.0,
                 clock: Optional[Callable[[], float]] = None) -> None:
        self.lead_ms = lead_ms
        self.delay_s = delay_s
        self.calls: list[RedeliveryCall] = []
        self.failed_calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._clock = clock
        self._fail_next = 0
        self._fail_with: BaseException | type[BaseException] = AdapterError

    def fail_next(self, n: int = 1, exc: BaseException | type[BaseException] = AdapterError) -> None:
        """Make the next ``n`` calls raise ``exc``."""
        self._fail_next = n
        self._fail_with = exc

    def _now(self) -> float:
        return self._clock() if self._clock else asyncio.get_running_loop().time() * 1000.0

    async def redeliver(self, keys: Sequence[MessageKey]) -> None:
        at = self._now()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self._fail_next:
                self._fail_next -= 1
                self.failed_calls += 1
                exc = self._fail_with
                raise exc("injected failure") if isinstance(exc, type) else exc
            self.calls.append(RedeliveryCall(at, tuple(keys)))
        finally:
            self.in_flight -= 1

    @property
    def redelivered(self) -> list[MessageKey]:
        """Every key successfully handed over, in call order."""
        return [k for call in self.calls for k in call.keys]

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[MessageKey]:
        """Wait (real time) until ``count`` keys have been redelivered."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.redelivered) < count:
            if loop.time() > deadline:
                raise TimeoutError(f"{len(self.redelivered)} of {count} keys redelivered after {timeout}s")
            await asyncio.sleep(0.001)
        return self.redelivered
