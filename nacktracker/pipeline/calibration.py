"""The memory model checked against the real index: :func:`measure_index_costs`
measures :class:`~.memory_model.IndexCosts` and compares the model with
``nbytes()`` of indexes built live from :func:`synthetic_nacks`
(:func:`live_replay`). Its own module: it runs the analysis kernel
(:mod:`.pending`), which runs the model."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..index import TimeBucketIndex
from .memory_model import IndexCosts
from .pending import analyse_consumer

__all__ = ["measure_index_costs", "calibration_build", "live_replay", "synthetic_nacks"]


def measure_index_costs() -> IndexCosts:
    """:meth:`IndexCosts.constants`, then the model against ``nbytes()`` of indexes
    built live (adds and pops in time order) at bits 0, 8, 12 and 15.

    Cost: about 1-2 s. Raises ``RuntimeError`` if the model misses any
    build by more than 10% (the index layout changed).
    """
    base = IndexCosts.constants()
    worst = 0.0
    for bits in (0, 8, 12, 15):
        model, real = calibration_build(bits, base)
        worst = max(worst, abs(model - real) / real)
    if worst > 0.10:
        raise RuntimeError(f"memory model misses TimeBucketIndex.nbytes() by {worst:.1%}: "
                           "the index layout changed; update nacktracker/pipeline/memory_model.py")
    return IndexCosts(**{**base.as_dict(), "max_model_error": float(worst)})


def synthetic_nacks(n: int = 40_000, rate: int = 1_000, ledgers: int = 16, k: int = 3,
                    seed: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A consumer's nacks as arrays ``(ledger, entry, ts, due)``: ``rate``/s
    round-robin over interleaved ledgers, ids ``k`` apart, delays uniform in
    0.1-60 s, with every tenth ledger getting bursts of 64 (dense cells)."""
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    ts = 1_700_000_000_000 + i * 1000 // rate
    lane = i % ledgers
    burst = (i // 64) % 10 == 0  # runs of 64 adds to one cell
    ledger = np.where(burst, 9_000, 100_000 + 7 * lane)
    entry = np.where(burst, i, (i // ledgers) * k)
    delay = np.where(burst, 30_000, rng.integers(100, 60_000, n))
    due = ts + np.where(burst, delay - (i % 64), delay)  # a burst shares one due time
    return ledger, entry, ts, due


def calibration_build(bits: int, costs: IndexCosts,
                      nacks: Optional[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = None) -> tuple[int, int]:
    """``(model bytes, nbytes())`` for a live build from ``nacks`` (default
    :func:`synthetic_nacks`) stopped at its peak pending instant."""
    ledger, entry, ts, due = synthetic_nacks() if nacks is None else nacks
    (r,) = analyse_consumer(ledger, entry, ts, due, [bits], costs)
    idx = live_replay(ledger, entry, ts, due, bits, stop_at=r.peak_at_ms)
    return r.index_bytes, idx.nbytes()


def live_replay(ledger: np.ndarray, entry: np.ndarray, ts: np.ndarray, due: np.ndarray, bits: int,
                stop_at: Optional[int] = None, rounding: str = "floor") -> TimeBucketIndex:
    """A TimeBucketIndex fed the nacks in time order, popping due buckets as a
    tracker's timer does, up to and including instant ``stop_at``: the timer
    is armed at the earliest bucket added; when it fires it pops what is due
    and re-arms at ``next_due_ms()`` (only then, as in the tracker, not after
    every add)."""
    idx = TimeBucketIndex(precision_bits=bits, rounding=rounding)
    order = np.argsort(ts, kind="stable")
    timer = None
    for i in order.tolist():
        t = int(ts[i])
        if stop_at is not None and t > stop_at:
            break
        if timer is not None and timer <= t:
            idx.pop_due(t)
            timer = idx.next_due_ms()
        idx.add(int(ledger[i]), int(entry[i]), int(due[i]))
        b = idx.bucket_of(int(due[i]))
        if b <= t:  # a bucket already in the past fires at once
            idx.pop_due(t)
            timer = idx.next_due_ms()
        elif timer is None or b < timer:
            timer = b
    return idx
