"""Monotonic millisecond clocks with one-shot timers.

The tracker is the only part of nacktracker that knows time, and it knows it
only through a :class:`Clock`: ``now_ms()`` and ``call_at(when_ms, fn)``.
:class:`LoopClock` is the asyncio event loop's monotonic clock (the default: a
wall-clock jump moves nothing); :class:`ManualClock` is the injectable fake
for tests, advanced by hand.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Callable, Optional, Protocol

from sortedcontainers import SortedList


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


_Timer = tuple[float, int, "_ManualHandle", Callable[[], None]]  # (when, order of call_at, handle, callback)


class _ManualHandle:
    __slots__ = ("cancelled", "_timer", "_timers")

    def __init__(self, when_ms: float, seq: int, callback: Callable[[], None], timers: "SortedList[_Timer]") -> None:
        """Arm: the timer joins its clock's ``timers``. O(log n)."""
        self.cancelled = False
        self._timer: Optional[_Timer] = (when_ms, seq, self, callback)
        self._timers: Optional["SortedList[_Timer]"] = timers
        timers.add(self._timer)

    def fired(self) -> None:
        """Its clock ran it: a cancel now changes nothing. O(1)."""
        self._timers = self._timer = None

    def cancel(self) -> None:
        """Cancel the timer: it leaves its clock at once. O(log n). Idempotent."""
        self.cancelled = True
        if self._timers is not None:
            self._timers.discard(self._timer)
            self._timers = self._timer = None


class ManualClock:
    """A fake clock for tests: time moves only when :meth:`advance` is called,
    and due timers run, in order, at their own times.

    The timers are a ``sortedcontainers.SortedList`` ordered by (due time, order of
    :meth:`call_at`): a cancelled timer leaves it at once, so :meth:`timers` is
    exactly what is armed (a test can assert "one timer, at the earliest
    bucket") and a long simulation that re-arms often holds no dead timers.

    >>> clock = ManualClock(); fired = []
    >>> _ = clock.call_at(10, lambda: fired.append(clock.now_ms()))
    >>> clock.call_at(40, lambda: None).cancel()
    >>> clock.timers()
    [10.0]
    >>> clock.advance(25); fired
    [10.0]
    """

    def __init__(self, start_ms: float = 0.0) -> None:
        self._now = float(start_ms)
        self._timers: SortedList[_Timer] = SortedList()
        self._seq = itertools.count()

    def now_ms(self) -> float:
        return self._now

    def call_at(self, when_ms: float, callback: Callable[[], None]) -> _ManualHandle:
        """Run ``callback`` at ``when_ms`` (when :meth:`advance` passes it). O(log n)."""
        return _ManualHandle(float(when_ms), next(self._seq), callback, self._timers)

    def next_timer_ms(self) -> float | None:
        """When the earliest armed timer is due, or ``None``. O(1)."""
        return self._timers[0][0] if self._timers else None

    def timers(self) -> list[float]:
        """The due times of the armed timers, earliest first. O(n)."""
        return [timer[0] for timer in self._timers]

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
            _, _, handle, callback = self._timers.pop(0)
            handle.fired()
            self._now = max(self._now, when)
            callback()
        self._now = target_ms
