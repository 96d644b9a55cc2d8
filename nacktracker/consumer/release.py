"""The consumer's release timer: one timer, on the tracker's clock, at the
delivery core's next wakeup (a parked copy's time or an expiry)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..clock import Clock, TimerHandle
from .core import DeliveryCore

__all__ = ["ReleaseTimer"]


class ReleaseTimer:
    """Keeps one timer armed at ``core.next_wakeup_ms()``; when it fires,
    hands the copies :meth:`DeliveryCore.release` gives to ``put`` (the
    receive pump's queue). ``clock`` is the tracker's (read when needed: the
    tracker binds it to the loop on first use)."""

    def __init__(self, core: DeliveryCore, clock: Callable[[], Clock], put: Callable[[Any], None]) -> None:
        self._core = core
        self._clock = clock
        self._put = put
        self._handle: Optional[TimerHandle] = None
        self._at: Optional[float] = None
        self.stopped = False

    def rearm(self) -> None:
        """Arm at the core's next wakeup (nothing when it is unchanged). O(1) amortised."""
        when = self._core.next_wakeup_ms()
        if when == self._at or self.stopped:
            return
        if self._handle is not None:
            self._handle.cancel()
        self._at = when
        self._handle = None
        if when is not None:
            clock = self._clock()
            self._handle = clock.call_at(when, self._on_wake)

    def stop(self) -> None:
        """Cancel the timer for good (the consumer closes). Idempotent."""
        self.stopped = True
        if self._handle is not None:
            self._handle.cancel()

    def _on_wake(self) -> None:
        armed, self._handle, self._at = self._at, None, None
        if self.stopped:
            return
        # the loop may wake a hair before the armed time: the armed time counts as reached
        for msg in self._core.release(max(self._clock().now_ms(), armed or 0)):
            self._put(msg)
        self.rearm()
