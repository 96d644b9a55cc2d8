"""What one consumer's tracker would hold, for every candidate precision: the
numeric kernel a Spark task runs on one consumer's nack events (numpy +
pyroaring, no Spark here, so it is testable and timeable on its own).

The model, per precision ``bits`` (``rounding="floor"``; ``"ceil"`` rounds up):

* a ``nack`` at ``ts`` with ``delay`` is due at ``due = ts + delay`` and lands
  in bucket ``B = (due >> bits) << bits``; the tracker fires that bucket at time
  ``B``. A message is stored once per bucket: all nacks of one ``(ledger,
  entry)`` into one bucket form one *occurrence*, pending from its first nack
  until ``B``. A bucket already in the past (``B <= ts``) fires at once, so
  that nack is never pending (it is redelivered at ``ts``: early by its
  whole delay). No acks are in the log: an occurrence ends when it fires.
* every nack is redelivered at ``max(B, ts)``; its error is that minus ``due``
  (negative: early).
* pending(t) = occurrences with ``start <= t < B``; the peak is its maximum
  over all t, found exactly by a sweep over sorted starts and sorted fire
  times. Fire times change with ``bits``, so the peak does too.
* memory at the peak: the occurrences pending at the (first) peak instant,
  laid out as a live :class:`~nacktracker.TimeBucketIndex` holds them
  (sparse copies in window arrays, dense cells for runs of adds, the live
  bitmap: :func:`~nacktracker.pipeline.memory_model.index_state`).

Cost per consumer with n nacks: O(n) per bits plus two sorts of n
(numpy, ~0.1 s per million), plus ~10 µs per bitmap pending at the peak.
Memory: the 32 bytes per nack of the input plus about 50 of temporaries.
"""

from __future__ import annotations

import array
import sys
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import numpy as np
from pyroaring import BitMap, BitMap64

from .memory_model import IndexCosts, index_state

__all__ = ["BitsResult", "analyse_consumer", "quantile", "bucket_times"]

_U32 = 1 << 32


@dataclass
class BitsResult:
    """One consumer at one precision."""

    bits: int
    nacks: int
    occurrences: int          # pending occurrences (an entry pending in 2 buckets counts twice)
    immediate: int            # nacks whose bucket had passed: redelivered at once, never pending
    merged: int               # nacks absorbed by an occurrence already pending in the same bucket
    peak_pending: int
    peak_at_ms: Optional[int]  # first instant at which the peak is reached
    buckets: int              # at the peak instant
    bitmaps: int
    ledgers: int
    roaring_bytes: int        # CRoaring + Python bytes of the bitmaps
    index_bytes: int          # the whole TimeBucketIndex (model: roaring + structure)
    dict_index_bytes: int     # DictIndex holding the same pending messages (measured bytes/entry x peak)
    err_values: np.ndarray = field(repr=False)   # distinct redelivery errors (ms, fire - due)
    err_counts: np.ndarray = field(repr=False)   # nacks with that error

    def error_quantile(self, q: float) -> int:
        return quantile(self.err_values, self.err_counts, q, absolute=True)


def bucket_times(due: np.ndarray, bits: int, rounding: str = "floor") -> np.ndarray:
    """Bucket time of each due time (the index's ``bucket_of``, vectorised)."""
    add = 0 if rounding == "floor" else (1 << bits) - 1
    return ((due + add) >> bits) << bits


def quantile(values: np.ndarray, counts: np.ndarray, q: float, absolute: bool = False) -> int:
    """Exact nearest-rank quantile of a histogram (``values`` with ``counts``).

    ``absolute``: of ``|value|``. Returns 0 for an empty histogram.
    Runtime: O(k log k) for k distinct values.
    """
    values = np.asarray(values, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if len(values) == 0 or counts.sum() == 0:
        return 0
    if absolute:
        values = np.abs(values)
        order = np.argsort(values, kind="stable")
        values, counts = values[order], counts[order]
    cum = np.cumsum(counts)
    rank = max(1, int(np.ceil(q * cum[-1])))
    return int(values[np.searchsorted(cum, rank)])


def _is_sorted(ledger: np.ndarray, entry: np.ndarray, due: np.ndarray) -> bool:
    if len(ledger) < 2:
        return True
    dl = np.diff(ledger)
    if (dl < 0).any():
        return False
    same_l = dl == 0
    de = np.diff(entry)
    if (same_l & (de < 0)).any():
        return False
    return not (same_l & (de == 0) & (np.diff(due) < 0)).any()


def analyse_consumer(ledger: np.ndarray, entry: np.ndarray, ts: np.ndarray, due: np.ndarray,
                     bits_list: Sequence[int], costs: IndexCosts,
                     rounding: str = "floor") -> list[BitsResult]:
    """Peak pending, memory at the peak and redelivery errors for every ``bits``.

    Arrays: one consumer's nacks (int64). Sorted by ``(ledger, entry, due)``
    is expected (the Spark job sorts once); unsorted input is sorted here.
    Runtime: O(n log n) per bits (two numpy sorts), plus the bitmaps at the peak.
    """
    ledger, entry, ts, due = (np.asarray(a, dtype=np.int64) for a in (ledger, entry, ts, due))
    if not _is_sorted(ledger, entry, due):
        order = np.lexsort((due, entry, ledger))
        ledger, entry, ts, due = ledger[order], entry[order], ts[order], due[order]
    n = len(ts)
    new_message = np.ones(n, dtype=bool)
    if n > 1:
        new_message[1:] = (ledger[1:] != ledger[:-1]) | (entry[1:] != entry[:-1])
    out = []
    for bits in bits_list:
        out.append(_one_bits(ledger, entry, ts, due, new_message, int(bits), costs, rounding))
    return out


def _one_bits(ledger, entry, ts, due, new_message, bits, costs, rounding) -> BitsResult:
    n = len(ts)
    bucket = bucket_times(due, bits, rounding)
    # occurrence = run of one (ledger, entry) into one bucket: rows are sorted by
    # (ledger, entry, due) and the bucket grows with due, so runs are contiguous
    new_occ = new_message.copy()
    if n > 1:
        new_occ[1:] |= bucket[1:] != bucket[:-1]
    first = np.flatnonzero(new_occ)
    if len(first) == n:  # the common case: no message nacked twice into one bucket
        start, occ_bucket, occ_ledger, occ_entry = ts, bucket, ledger, entry
    else:
        start = np.minimum.reduceat(ts, first)
        occ_bucket, occ_ledger, occ_entry = bucket[first], ledger[first], entry[first]
    live = occ_bucket > start  # else the bucket had passed: fired at once, never pending
    fire_row = np.maximum(bucket, ts)
    immediate = int(np.count_nonzero(bucket <= ts))
    starts = np.sort(start[live])
    fires = np.sort(occ_bucket[live])
    m = len(starts)
    peak, at = 0, None
    if m:
        # pending just after the i-th start = starts so far - fires so far (fires at t end before t)
        pending = np.arange(1, m + 1) - np.searchsorted(fires, starts, side="right")
        i = int(pending.argmax())
        peak, at = int(pending[i]), int(starts[i])
    if at is not None:
        seen = live & (start <= at)  # every occurrence added by the peak instant
        now = seen & (occ_bucket > at)
        assert int(now.sum()) == peak, (int(now.sum()), peak)
        nbytes, roaring, nbuckets, nbitmaps, nledgers = index_state(
            occ_ledger[seen], occ_entry[seen], occ_bucket[seen], start[seen], now[seen], bits, costs)
    else:
        nbytes, roaring, nbuckets, nbitmaps, nledgers = index_state(
            ledger[:0], entry[:0], bucket[:0], ts[:0], ts[:0] > 0, bits, costs)
    err_values, err_counts = np.unique(fire_row - due, return_counts=True)
    return BitsResult(
        bits=bits, nacks=n, occurrences=m, immediate=immediate, merged=n - immediate - m,
        peak_pending=peak, peak_at_ms=at, buckets=nbuckets, bitmaps=nbitmaps, ledgers=nledgers,
        roaring_bytes=roaring, index_bytes=nbytes,
        dict_index_bytes=round(costs.dict_index_per_entry * peak),
        err_values=err_values.astype(np.int64), err_counts=err_counts.astype(np.int64))


def analyse_rows(rows: Iterable[tuple[int, int, int, int]], bits_list: Sequence[int],
                 costs: IndexCosts, rounding: str = "floor") -> list[BitsResult]:
    """:func:`analyse_consumer` for ``(ledger, entry, ts, due)`` tuples (tests, small data)."""
    cols = list(zip(*rows)) or [(), (), (), ()]
    arrays = [np.array(c, dtype=np.int64) for c in cols]
    return analyse_consumer(*arrays, bits_list=bits_list, costs=costs, rounding=rounding)
