"""Redelivery backoff: pure functions of the redelivery count.

Any callable ``backoff(redelivery_count) -> delay_ms`` works with the tracker;
these two are the shapes Pulsar's Java client ships.
"""

from __future__ import annotations

import math

from ._checks import check_default_delay, check_int

__all__ = ["FixedBackoff", "MultiplierBackoff"]


class FixedBackoff:
    """The same delay for every redelivery.

    >>> FixedBackoff(1000)(5)
    1000
    """

    __slots__ = ("delay_ms",)

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = check_default_delay("delay_ms", delay_ms)

    def __call__(self, redelivery_count: int) -> int:
        check_int("redelivery_count", redelivery_count)
        return self.delay_ms

    def __repr__(self) -> str:
        return f"FixedBackoff({self.delay_ms})"


class MultiplierBackoff:
    """``min_delay_ms * multiplier ** redelivery_count``, capped at
    ``max_delay_ms`` (the shape of Java's ``MultiplierRedeliveryBackoff``).

    >>> b = MultiplierBackoff(100, 1000)
    >>> [b(n) for n in range(6)]
    [100, 200, 400, 800, 1000, 1000]
    """

    __slots__ = ("min_delay_ms", "max_delay_ms", "multiplier")

    def __init__(self, min_delay_ms: int, max_delay_ms: int, multiplier: float = 2.0) -> None:
        self.min_delay_ms = check_default_delay("min_delay_ms", min_delay_ms)
        self.max_delay_ms = check_default_delay("max_delay_ms", max_delay_ms)
        if self.max_delay_ms < self.min_delay_ms:
            raise ValueError("max_delay_ms must be >= min_delay_ms")
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)):
            raise TypeError(f"multiplier must be a number, not {type(multiplier).__name__}")
        if not math.isfinite(multiplier) or multiplier < 1:
            raise ValueError(f"multiplier must be a finite number >= 1, got {multiplier}")
        self.multiplier = float(multiplier)

    def __call__(self, redelivery_count: int) -> int:
        n = check_int("redelivery_count", redelivery_count)
        if self.min_delay_ms == 0:
            return 0
        # log-space comparison: no float overflow for large counts
        if n * math.log(self.multiplier) >= math.log(self.max_delay_ms / self.min_delay_ms or 1) + 1e-12:
            return self.max_delay_ms
        return min(self.max_delay_ms, math.ceil(self.min_delay_ms * self.multiplier ** n))

    def __repr__(self) -> str:
        return f"MultiplierBackoff({self.min_delay_ms}, {self.max_delay_ms}, multiplier={self.multiplier})"
