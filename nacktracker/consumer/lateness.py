"""How late each redelivered message reaches the application: the consumer's ``lateness_ms``.

The delivery core reports every redelivered copy as it surfaces (handed to the
application at once, or released from parking at its time) with ``now - its
bucket's time``: the error against the requested due time at
``precision_bits=0`` (the default; with more bits the due time is up to
``2^bits - 1`` ms after the bucket's). This is the figure a user reads as
"late"; the tracker's ``timer_lag_ms`` is the timer's own, apart.
"""

from __future__ import annotations

import logging
from typing import Callable

from ..tracker import LatencyHistogram, LatencySummary
from .core import DeliveryCore

__all__ = ["RedeliveryLateness"]

log = logging.getLogger("nacktracker.consumer")

LatenessListener = Callable[[float], None]


class RedeliveryLateness:
    """The figures of one consumer (``TrackedConsumer.lateness``), fed by its ``core``.

    >>> from nacktracker.consumer.core import DeliveryCore
    >>> from nacktracker.precision import Precision
    >>> lateness = RedeliveryLateness(DeliveryCore(Precision.of(0)))
    >>> seen = []
    >>> remove = lateness.add_listener(seen.append)
    >>> lateness.record(3.0); remove(); lateness.record(1.0)
    >>> seen, lateness.summary()["count"]
    ([3.0], 2)
    """

    def __init__(self, core: DeliveryCore) -> None:
        self._histogram = LatencyHistogram()
        self._listeners: list[LatenessListener] = []
        core.on_redelivered = self.record

    def record(self, lateness_ms: float) -> None:
        """One redelivered message surfaced ``lateness_ms`` after its bucket's time. O(listeners)."""
        self._histogram.add(lateness_ms)
        for listener in self._listeners:
            try:
                listener(lateness_ms)
            except Exception:  # a metrics listener must not break delivery
                log.exception("lateness listener %r failed; kept", listener)

    def summary(self) -> LatencySummary:
        """``{"count", "p50", "p99", "max"}`` in ms (the consumer's ``stats()["lateness_ms"]``)."""
        return self._histogram.summary()

    def add_listener(self, listener: LatenessListener) -> Callable[[], None]:
        """Call ``listener(lateness_ms)`` on the loop for every redelivered message
        as it surfaces (:mod:`nacktracker.metrics` records them into
        ``nacktracker.redelivery.lateness``). Returns a function that removes it;
        a listener that raises is logged and kept."""
        if not callable(listener):
            raise TypeError(f"listener must be callable, not {type(listener).__name__}")
        listeners = self._listeners

        def remove() -> None:
            if listener in listeners:
                listeners.remove(listener)

        listeners.append(listener)
        return remove
