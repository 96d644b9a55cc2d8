"""Redelivery backoff: pure functions of the redelivery count.

Any callable ``backoff(redelivery_count) -> delay_ms`` works with the tracker;
these two are the shapes Pulsar's Java client ships.
"""

from __future__ import annotations

import math
import random
from typing import Optional

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

    ``jitter``: a fraction in [0, 1]. With ``jitter > 0`` each call draws the
    delay uniformly from ``[d * (1 - jitter), d]`` (whole ms, ``d`` the
    un-jittered delay above), so consumers that fail together do not retry
    together; never above ``max_delay_ms``, never below 0. ``rng``: a
    ``random.Random`` to draw from (seed it for reproducible tests; default: a
    private one seeded from the OS). With ``jitter=0`` (the default) no random
    number is drawn and the delay is exact. O(1) per call.

    >>> b = MultiplierBackoff(100, 1000)
    >>> [b(n) for n in range(6)]
    [100, 200, 400, 800, 1000, 1000]
    >>> j = MultiplierBackoff(1000, 8000, jitter=0.5, rng=random.Random(7))
    >>> all(500 <= j(0) <= 1000 for _ in range(100))
    True
    """

    __slots__ = ("min_delay_ms", "max_delay_ms", "multiplier", "jitter", "_rng")

    def __init__(self, min_delay_ms: int, max_delay_ms: int, multiplier: float = 2.0, jitter: float = 0.0,
                 rng: Optional[random.Random] = None) -> None:
        self.min_delay_ms = check_default_delay("min_delay_ms", min_delay_ms)
        self.max_delay_ms = check_default_delay("max_delay_ms", max_delay_ms)
        if self.max_delay_ms < self.min_delay_ms:
            raise ValueError("max_delay_ms must be >= min_delay_ms")
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)):
            raise TypeError(f"multiplier must be a number, not {type(multiplier).__name__}")
        if not math.isfinite(multiplier) or multiplier < 1:
            raise ValueError(f"multiplier must be a finite number >= 1, got {multiplier}")
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)):
            raise TypeError(f"jitter must be a number in [0, 1], not {type(jitter).__name__}")
        if not 0 <= jitter <= 1:  # NaN fails this too
            raise ValueError(f"jitter must be in [0, 1], got {jitter}")
        if rng is not None and not isinstance(rng, random.Random):
            raise TypeError(f"rng must be a random.Random, not {type(rng).__name__}")
        self.multiplier = float(multiplier)
        self.jitter = float(jitter)
        self._rng = rng if rng is not None else (random.Random() if jitter else None)

    def __call__(self, redelivery_count: int) -> int:
        delay = self._delay(check_int("redelivery_count", redelivery_count))
        if not self.jitter or not delay:
            return delay
        assert self._rng is not None  # set in __init__ whenever jitter > 0
        low = math.ceil(delay * (1 - self.jitter))
        return self._rng.randint(low, delay)  # both ends included: [d * (1 - jitter), d] in whole ms

    def _delay(self, n: int) -> int:
        if self.min_delay_ms == 0:
            return 0
        # log-space comparison: no float overflow for large counts
        if n * math.log(self.multiplier) >= math.log(self.max_delay_ms / self.min_delay_ms or 1) + 1e-12:
            return self.max_delay_ms
        return min(self.max_delay_ms, math.ceil(self.min_delay_ms * self.multiplier ** n))

    def __repr__(self) -> str:
        jitter = f", jitter={self.jitter}" if self.jitter else ""
        return f"MultiplierBackoff({self.min_delay_ms}, {self.max_delay_ms}, multiplier={self.multiplier}{jitter})"
