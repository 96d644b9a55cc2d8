"""Ack timeout with backoff (Java's ``ackTimeout`` + ``ackTimeoutRedeliveryBackoff``,
PIP-130), on the tracker's index and timer.

When the application receives a message, its ack timeout starts: the
message is scheduled in the tracker as a nack due ``ack_timeout_backoff(n)``
ms later (``n``: its redelivery count, the larger of the broker's and the
consumer's own) or ``ack_timeout_ms`` without a backoff, while the
application still holds it. An ack, a nack, a ``reconsume_later`` or a
``dead_letter`` of it cancels that (the tracker's discard); otherwise its
bucket fires at the due time exactly and the broker redelivers it, as any
nack (counted as a redelivery, for ``max_redeliveries`` and the consumer's
own counts). So the cost per message is the index's: no map entry, no timer
of its own.

The one exception is a message already at its last delivery (``n >=
max_redeliveries``): when its timeout passes it is dead-lettered (as Java's
``processPossibleToDLQ`` on an ack-timeout redelivery), so it cannot be
handed to the tracker at receive time (that would dead-letter it at once).
Those few wait on a timer each (the tracker's clock) and are nacked at their
time, which dead-letters them.

Java differs in timing: it checks timeouts on a tick (``ackTimeoutTickTime``,
1 s by default) and, with a backoff, waits the backoff on top of the timeout;
here the backoff *is* the timeout of that delivery, and it is exact.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from .._checks import check_delay_ms
from ..keys import MessageKey

__all__ = ["AckTimeouts"]


class AckTimeouts:
    """``timeout_ms``: the timeout without a backoff; ``backoff(n) -> ms``:
    the timeout of a delivery with redelivery count ``n``; ``schedule(key,
    delay_ms, count, token) -> due``: schedules it in the tracker (and tells
    the core); ``discard(key)``: cancels it in the tracker; ``last(token)``:
    what to do with a last delivery whose time has passed (nack it);
    ``clock``: the tracker's clock; ``max_redeliveries``: or ``None``."""

    def __init__(self, timeout_ms: int, backoff: Optional[Callable[[int], int]], *,
                 schedule: Callable[[MessageKey, int, int, Any], Any], discard: Callable[[MessageKey], bool],
                 last: Callable[[Any], None], clock: Callable[[], Any], max_redeliveries: Optional[int]) -> None:
        self.timeout_ms = timeout_ms
        self.backoff = backoff
        self._schedule = schedule
        self._discard = discard
        self._last_call = last
        self._clock = clock
        self.max_redeliveries = max_redeliveries
        self._last: dict[MessageKey, Any] = {}  # last deliveries only: key -> timer handle
        self.counts = {"ack_timeouts_started": 0, "ack_timeouts_cancelled": 0, "ack_timeouts_last": 0}

    def started(self, key: MessageKey, count: int, token: Any) -> None:
        """The application received ``key`` (redelivery count ``count``). O(1) amortised."""
        delay = self.timeout_ms if self.backoff is None else check_delay_ms("ack_timeout_backoff result",
                                                                            self.backoff(count))
        self.counts["ack_timeouts_started"] += 1
        if self.max_redeliveries is not None and count >= self.max_redeliveries:
            clock = self._clock()
            old = self._last.pop(key, None)
            if old is not None:
                old.cancel()
            self._last[key] = clock.call_at(clock.now_ms() + delay, lambda: self._expire_last(key, token))
            self.counts["ack_timeouts_last"] += 1
            return
        self._schedule(key, delay, count, token)

    def cancel(self, key: MessageKey) -> None:
        """An ack, nack, reconsume or dead letter of ``key``: its timeout ends.
        O(b) for the b buckets holding its ledger (the tracker's discard)."""
        handle = self._last.pop(key, None) if self._last else None
        if handle is not None:
            handle.cancel()
            self.counts["ack_timeouts_cancelled"] += 1
        elif self._discard(key):
            self.counts["ack_timeouts_cancelled"] += 1

    def _expire_last(self, key: MessageKey, token: Any) -> None:
        self._last.pop(key, None)
        self._last_call(token)

    def close(self) -> None:
        for handle in self._last.values():
            handle.cancel()
        self._last.clear()
