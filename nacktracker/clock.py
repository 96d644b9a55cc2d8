"""Monotonic millisecond clocks with one-shot timers.

The tracker is the only part of nacktracker that knows time, and it knows it
only through a :class:`Clock`: ``now_ms()`` and ``call_at(when_ms, fn)``.
:class:`LoopClock` is the asyncio event loop's monotonic clock (the default: a
wall-clock jump moves nothing); :class:`ManualClock` is the injectable fake
for tests, advanced by hand.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Callable, Protocol


def wall_ms() -> float:
    """Wall-clock milliseconds since the epoch: only to place a time another
    process wrote (a retry letter's publish time plus its delay) on a monotonic
    clock, never to schedule by."""
    return time.time() * 1000.0


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now_ms(self) -> float:
        """Monotonic milliseconds (arbitrary origin)."""

    def call_at(self, when_ms: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` once, at ``when_ms`` or as soon after as possible."""


class LoopClock:
    """The event loop's clock (``loop.time()``, monotonic) in milliseconds."""

    __slots__ = ("loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.get_running_loop()

    def now_ms(self) -> float:
        return self.loop.time() * 1000.0

    def call_at(self, when_ms: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self.loop.call_at(when_ms / 1000.0, callback)


class _ManualHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A fake clock for tests: time moves only when :meth:`advance` is called,
    and due timers run, in order, at their own times.

    >>> clock = ManualClock(); fired = []
    >>> _ = clock.call_at(10, lambda: fired.append(clock.now_ms()))
    >>> clock.advance(25); fired
    [10.0]
    """

    def __init__(self, start_ms: float = 0.0) -> None:
        self._now = float(start_ms)
        self._timers: list[tuple[float, int, _ManualHandle, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now_ms(self) -> float:
        return self._now

    def call_at(self, when_ms: float, callback: Callable[[], None]) -> _ManualHandle:
        handle = _ManualHandle()
        heapq.heappush(self._timers, (float(when_ms), next(self._seq), handle, callback))
        return handle

    def next_timer_ms(self) -> float | None:
        """When the earliest live timer is due, or ``None``."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def advance(self, ms: float) -> None:
        """Move time forward by ``ms``, running each due timer at its own time."""
        self.advance_to(self._now + ms)

    def stall(self, ms: float) -> None:
        """Move time forward without running timers (a blocked event loop),
        then run everything that fell due, late, as a real loop would."""
        self._now += ms
        self.advance(0)

    def advance_to(self, target_ms: float) -> None:
        if target_ms < self._now:
            raise ValueError("a monotonic clock does not go back")
        while True:
            when = self.next_timer_ms()
            if when is None or when > target_ms:
                break
            _, _, handle, callback = heapq.heappop(self._timers)
            self._now = max(self._now, when)
            callback()
        self._now = target_ms
