"""LeadEstimator: how early to fire so a redelivered copy arrives before it is due.

Pure (no clock of its own, no I/O): the adapter feeds it each latency sample
(hand-over to arrival, ms) with the time it was taken; ``tests/adapters/test_lead.py``
drives it with explicit times.

Why a *time* memory and not a window of the last N samples: samples come in
waves (one per tracker fire, e.g. 20 back to back), so 256 samples are a dozen
waves, a few seconds of a bursty workload. Measured with
``bench/lab/precision_diagnose.py --cpu-hog``: after a calm stretch the
256-sample maximum had fallen to ~105-115 ms (lead ~130-137 ms), then a
scheduling stall made the path take 143-167 ms and whole waves arrived
12-29 ms after their due time. Load spikes recur on the scale of seconds to
minutes, not of samples, so the lead remembers the worst latency of the last
:data:`MEMORY_MS` (kept as one maximum per second: O(1) memory whatever the
rate). An early copy is parked by the consumer until due, so a lead on the
high side costs a longer wait in memory, never precision; only copies that
land at *another* consumer of a Shared subscription can surface up to the
lead early there.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

__all__ = ["LeadEstimator", "MEMORY_MS", "MIN_SAMPLES"]

#: How long the worst latency seen is remembered.
MEMORY_MS = 60_000
#: Samples needed before the learned lead replaces the initial one.
MIN_SAMPLES = 20
#: The headroom over the remembered worst latency: a quarter of it plus 20 ms.
#: Measured under two busy-looping processes plus other load (load average
#: 3-5 on 2 cores): the path's worst stretched 20-45 ms past the maximum of
#: the preceding calm seconds; an eighth plus 10 ms (the previous rule) left
#: 3-5% of copies late by up to 29 ms.
HEADROOM_SHIFT = 2
HEADROOM_MS = 20
_SLOT_MS = 1_000


class _Slot(NamedTuple):
    second: int        # now_ms // 1000 of the samples it holds
    worst_ms: float    # their largest latency


class LeadEstimator:
    """The lead (ms) a redelivery path needs: the largest latency observed in
    the last :data:`MEMORY_MS` plus a quarter and 20 ms, clamped to
    ``bounds``; ``initial_ms`` until :data:`MIN_SAMPLES` samples were seen.

    Every method is O(1) amortised: a sample updates the current second's
    maximum; the overall maximum is recomputed (over at most 60 slots) only
    when a second ends or an old one leaves the memory.
    """

    def __init__(self, initial_ms: int, bounds: tuple[int, int]) -> None:
        self._low, self._high = bounds
        self.lead_ms = initial_ms
        self.samples = 0
        self._slots: deque[_Slot] = deque()
        self._worst = 0.0  # the largest latency remembered

    def observe(self, latency_ms: float, now_ms: float) -> int:
        """Record one sample taken at ``now_ms``; returns the new lead."""
        self.samples += 1
        second = int(now_ms // _SLOT_MS)
        slots = self._slots
        if slots and slots[-1].second == second:
            if latency_ms > slots[-1].worst_ms:
                slots[-1] = _Slot(second, latency_ms)
        else:
            slots.append(_Slot(second, latency_ms))
            self._forget(second)
        self._worst = max(self._worst, latency_ms)
        return self._update()

    @property
    def worst_ms(self) -> float:
        """The largest latency remembered (0 before any sample)."""
        return self._worst

    def _forget(self, second: int) -> bool:
        slots, oldest = self._slots, second - MEMORY_MS // _SLOT_MS
        dropped = False
        while slots and slots[0].second <= oldest:
            slots.popleft()
            dropped = True
        if dropped:
            self._worst = max((s.worst_ms for s in slots), default=0.0)
        return dropped

    def _update(self) -> int:
        if self.samples >= MIN_SAMPLES:
            top = int(-(-self._worst // 1))  # ceil
            self.lead_ms = min(self._high, max(self._low, top + (top >> HEADROOM_SHIFT) + HEADROOM_MS))
        return self.lead_ms
