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
  bitmap: :func:`~nacktracker.pipeline.memory_model.index_states`).

Many consumers at once (:func:`analyse_group`): a Spark task hands the kernel
a group of whole consumers (up to about a million rows), and every step above
runs once over the group with the consumer as the leading key — the sweep
counts starts and fires per millisecond on a dense timeline (or sorts
``consumer × span + time`` keys when the timeline is sparse), histograms and
quantiles are segment reductions, and the memory model takes every
consumer's index at once (one numpy pass over the group; only the bitmaps
it measures are built one by one, in C) — so a thousand small consumers
cost what their nacks cost, not a thousand numpy round trips.

It also samples pending over time on a :class:`Grid` (the same instants for
every consumer): the value at each bin start and the maximum within the bin.

Cost per group of n nacks: O(n log n) per bits (numpy sorts, ~0.1 s per
million), plus building the bitmaps of the occurrences seen by each
consumer's peak (a live ``BitMap`` per consumer and one per dense cell),
plus O(consumers × bins) for the series. Memory: the 40 bytes per nack of
the input plus about 60 of temporaries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from ..precision import Precision
from .memory_model import IndexCosts, index_states

__all__ = ["BitsResult", "Grid", "analyse_group", "analyse_consumer", "quantile", "bucket_times",
           "SCALAR_COLUMNS", "LIST_COLUMNS"]

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
    return Precision.of(bits, rounding).buckets(due)


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


def _indexes_at(occ_c: np.ndarray, seen: np.ndarray, now: np.ndarray, ledger: np.ndarray,
                entry: np.ndarray, bucket: np.ndarray, start: np.ndarray, k: int, bits: int,
                costs: IndexCosts) -> np.ndarray:
    """What a live index per consumer holds at that consumer's peak instant.

    ``occ_c``: consumer index (0..k-1, non-decreasing) of each occurrence;
    ``seen``: added by the consumer's peak instant; ``now``: still pending
    there. Returns a ``5 × k`` array: index bytes, roaring bytes, buckets,
    cells, ledgers (:class:`~nacktracker.pipeline.memory_model.IndexState`;
    a consumer never pending gets an empty index). Runtime: one
    :func:`~nacktracker.pipeline.memory_model.index_states` over the whole
    group, O(m log m) numpy plus the bitmaps for the m occurrences seen by
    the consumers' peaks.
    """
    return index_states(occ_c[seen], ledger[seen], entry[seen], bucket[seen], start[seen], now[seen], k, bits,
                        costs)


@dataclass(frozen=True)
class Grid:
    """Instants at which pending is sampled: ``start_ms + k × step_ms``, k < bins."""

    start_ms: int
    step_ms: int
    bins: int

    @classmethod
    def spanning(cls, first_ms: int, last_ms: int, bins: int = 200) -> "Grid":
        """``bins`` equal bins covering ``[first_ms, last_ms]``."""
        step = max(1, math.ceil((last_ms - first_ms + 1) / bins))
        return cls(int(first_ms), int(step), int(bins))

    def times(self) -> np.ndarray:
        return self.start_ms + self.step_ms * np.arange(self.bins, dtype=np.int64)


#: Per (consumer, bits) integer columns of :func:`analyse_group`, besides ``cid`` and ``bits``.
SCALAR_COLUMNS = ("nacks", "occurrences", "immediate", "merged", "peak_pending", "peak_at_ms", "buckets",
                  "bitmaps", "ledgers", "roaring_bytes", "index_bytes", "dict_index_bytes",
                  "err_p50", "err_p90", "err_p99", "err_max")
_QUANTILES = (("err_p50", 0.5), ("err_p90", 0.9), ("err_p99", 0.99), ("err_max", 1.0))
#: Per (consumer, bits) list columns: the pending series on the grid.
LIST_COLUMNS = ("pending_at", "pending_max")


def _is_sorted(cid: np.ndarray, ledger: np.ndarray, entry: np.ndarray, due: np.ndarray) -> bool:
    """Rows sorted by ``(cid, ledger, entry, due)``? Runtime: O(n)."""
    if len(cid) < 2:
        return True
    keys = (cid, ledger, entry, due)
    tie = np.ones(len(cid) - 1, dtype=bool)
    for k in keys:
        d = np.diff(k)
        if (tie & (d < 0)).any():
            return False
        tie &= d == 0
    return True


def _sweep(lc: np.ndarray, start: np.ndarray, fire: np.ndarray, k: int,
           grid: Optional[Grid]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Exact peak of pending per consumer, its first instant, and the series.

    ``lc``: consumer index (0..k-1, non-decreasing) of each live occurrence,
    pending from ``start`` until ``fire``. Keys ``consumer × span + time``
    make one sort serve all consumers; when they would overflow int64 the
    consumers are swept in slices (numpy's sort is fast on the nearly sorted
    keys logs give). Returns ``(peak, at, pending_at,
    pending_max)``; ``at`` is -1 for a consumer never pending; the series are
    ``k × bins`` (empty without a grid).
    """
    bins = grid.bins if grid else 0
    peak = np.zeros(k, dtype=np.int64)
    at = np.full(k, -1, dtype=np.int64)
    p_at = np.zeros((k, bins), dtype=np.int64)
    p_max = np.zeros((k, bins), dtype=np.int64)
    if len(lc) == 0:
        return peak, at, p_at, p_max
    tmin = int(start.min())
    span = int(fire.max()) - tmin + 1
    if k * span <= DENSE_SWEEP_FACTOR * len(lc) + (1 << 16):
        _sweep_dense(lc, start - tmin, fire - tmin, k, tmin, span, grid, peak, at, p_at, p_max)
        return peak, at, p_at, p_max
    per_slice = max(1, (1 << 62) // span)
    if per_slice >= k:  # one slice: the keys fit
        base = lc * span if k > 1 else 0
        sk, fk = np.sort(base + (start - tmin)), np.sort(base + (fire - tmin))
        _sweep_keys(sk, fk, k, tmin, span, grid, peak, at, p_at, p_max)
        return peak, at, p_at, p_max
    c_lo = 0
    while c_lo < k:
        c_hi = min(k, c_lo + per_slice)
        lo, hi = np.searchsorted(lc, [c_lo, c_hi])
        if hi > lo:
            _sweep_slice(lc[lo:hi] - c_lo, start[lo:hi], fire[lo:hi], c_hi - c_lo, tmin, span, grid,
                         peak[c_lo:c_hi], at[c_lo:c_hi], p_at[c_lo:c_hi], p_max[c_lo:c_hi])
        c_lo = c_hi
    return peak, at, p_at, p_max


#: :func:`_sweep` counts starts and fires per millisecond (no sort) when the
#: group's timeline, consumers × span in ms, is at most this many times the
#: number of occurrences (plus 64k): dense logs, e.g. a few big consumers.
#: Its two timeline arrays then take at most 32 bytes per occurrence.
DENSE_SWEEP_FACTOR = 2


def _sweep_dense(lc: np.ndarray, s: np.ndarray, f: np.ndarray, k: int, tmin: int, span: int, grid: Any,
                 peak: np.ndarray, at: np.ndarray, p_at: Any, p_max: Any) -> None:
    """:func:`_sweep` on a dense timeline: ``value[c × span + t]`` = pending of
    consumer c at ``tmin + t`` (its starts at or before t minus its fires at or
    before t: a fire at t ends before t), from two bincounts and one cumsum.
    Every occurrence fires inside its consumer's block, so consumers before
    it cancel out of the cumsum. The peak is the block's maximum, first
    reached at a start (pending only grows at starts), so the first argmax is
    the instant the sort-based sweep reports. Runtime: O(n + k × span)."""
    base = lc * span if k > 1 else 0
    size = k * span
    value = np.bincount(base + s, minlength=size)
    value -= np.bincount(base + f, minlength=size)
    np.cumsum(value, out=value)  # in place: two timeline arrays at most (16 bytes per ms of it)
    blocks = value.reshape(k, span)
    has = np.bincount(lc, minlength=k) > 0
    peak[:] = np.where(has, blocks.max(axis=1), 0)
    at[:] = np.where(has, blocks.argmax(axis=1) + tmin, -1)
    if grid is None:
        return
    times = grid.times()
    q = np.clip(times - tmin, 0, span - 1)
    p_at[:] = np.where(times >= tmin, blocks[:, q], 0)
    # the maximum within a bin [q_b, q_b+1) (the last bin: to the block's end);
    # between starts pending only falls, so this is the sort-based sweep's figure
    lo = np.arange(k)[:, None] * span + q[None, :]
    hi = np.empty_like(lo)
    hi[:, :-1] = lo[:, 1:]
    hi[:, -1] = (np.arange(k) + 1) * span
    lo, hi = lo.reshape(-1), hi.reshape(-1)
    filled = hi > lo
    highs = np.zeros(k * grid.bins, dtype=np.int64)
    if filled.any():
        padded = np.append(value, 0)  # reduceat needs a valid index for a slice ending at the end
        pairs = np.stack([lo[filled], hi[filled]], axis=1).reshape(-1)
        highs[filled] = np.maximum.reduceat(padded, pairs)[::2]
    p_max[:] = np.maximum(highs.reshape(k, grid.bins), p_at)


def _sweep_slice(lc: np.ndarray, start: np.ndarray, fire: np.ndarray, k: int, tmin: int, span: int,
                 grid: Any, peak: np.ndarray, at: np.ndarray, p_at: Any, p_max: Any) -> None:
    """:func:`_sweep` for consumers whose keys fit in int64; fills the output views."""
    _sweep_keys(np.sort(lc * span + (start - tmin)), np.sort(lc * span + (fire - tmin)), k, tmin, span, grid,
                peak, at, p_at, p_max)


def _sweep_keys(sk: np.ndarray, fk: np.ndarray, k: int, tmin: int, span: int, grid: Any, peak: np.ndarray,
                at: np.ndarray, p_at: Any, p_max: Any) -> None:
    """The sweep over sorted ``consumer × span + (time - tmin)`` keys of starts and fires."""
    m = len(sk)
    base = np.arange(k, dtype=np.int64) * span
    s_off = np.searchsorted(sk, base)
    f_off = np.searchsorted(fk, base)
    per = np.diff(np.append(s_off, m))  # live occurrences per consumer
    # pending just after the i-th start of its consumer = its starts so far -
    # its fires so far (a fire at t ends before t)
    pending = np.arange(1, m + 1) - np.searchsorted(fk, sk, side="right")
    if k > 1:
        pending += np.repeat(f_off - s_off, per)
    has = per > 0
    segs = s_off[has]
    seg_max = np.maximum.reduceat(pending, segs)
    if k == 1:
        first_hit = np.array([int(pending.argmax())])
    else:
        hit = np.where(pending == np.repeat(seg_max, per[has]), np.arange(m), m)
        first_hit = np.minimum.reduceat(hit, segs)
    peak[has] = seg_max
    at[has] = sk[first_hit] - base[has] + tmin
    if grid is None:
        return
    times = grid.times()
    inside = times >= tmin
    q = base[:, None] + np.clip(times - tmin, 0, span - 1)[None, :]
    values = ((np.searchsorted(sk, q, side="right") - s_off[:, None])
              - (np.searchsorted(fk, q, side="right") - f_off[:, None]))
    values[:, ~inside] = 0
    p_at[:] = values
    # the maximum within a bin: its start value, or a value just after a start
    # inside it. Starts are sorted by (consumer, time): a bin's starts are one
    # slice of them, found by a search per (consumer, bin), maxed by one reduceat.
    lo = np.searchsorted(sk, q, side="left")
    hi = np.empty_like(lo)
    hi[:, :-1] = lo[:, 1:]
    hi[:, -1] = s_off + per
    lo, hi = lo.reshape(-1), hi.reshape(-1)
    filled = hi > lo
    highs = np.zeros(k * grid.bins, dtype=np.int64)
    if filled.any():
        padded = np.append(pending, 0)  # reduceat needs a valid index for a slice ending at m
        pairs = np.stack([lo[filled], hi[filled]], axis=1).reshape(-1)
        highs[filled] = np.maximum.reduceat(padded, pairs)[::2]
    p_max[:] = np.maximum(highs.reshape(k, grid.bins), values)


def _histogram_pairs(owner: np.ndarray, value: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct ``(owner, value)`` pairs with their counts, sorted by owner then
    value: counted in one bincount when the keys ``owner × span + value`` are
    few, else one int64 sort of them (a lexsort if they would overflow)."""
    if len(value) == 0:
        return owner, value, np.zeros(0, dtype=np.int64)
    low = int(value.min())
    span = int(value.max()) - low + 1
    if k == 1 or k * span <= max(4 * len(value), 1 << 16):
        keys = value - low if k == 1 else owner * span + (value - low)
        if span <= max(4 * len(value), 1 << 16):  # few distinct keys: count, do not sort
            counts = np.bincount(keys, minlength=k * span if k > 1 else span)
            nz = np.flatnonzero(counts)
            return nz // span, nz % span + low, counts[nz]
    if k * span < (1 << 62):
        keys = np.sort(owner * span + (value - low))
        return _runs(keys // span, keys % span + low)
    order = np.lexsort((value, owner))
    return _runs(owner[order], value[order])


def _runs(owner: np.ndarray, value: np.ndarray,
          counts: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Collapse sorted pairs into distinct ``(owner, value)`` with summed counts."""
    new = np.ones(len(value), dtype=bool)
    new[1:] = (owner[1:] != owner[:-1]) | (value[1:] != value[:-1])
    heads = np.flatnonzero(new)
    summed = np.diff(np.append(heads, len(value))) if counts is None else np.add.reduceat(counts, heads)
    return owner[heads], value[heads], summed


def _error_histograms(lcid: np.ndarray, err: np.ndarray,
                      k: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The group's error histogram (signed, distinct values with counts) and
    each consumer's nearest-rank quantiles of ``|error|``.
    Returns ``(values, counts, {quantile name: array of k})``."""
    owners, values, counts = _histogram_pairs(lcid, err, k)
    # the group's histogram: per-consumer histograms summed by value
    distinct, inverse = np.unique(values, return_inverse=True)
    group_counts = np.bincount(inverse.reshape(-1), weights=counts, minlength=len(distinct)).astype(np.int64)
    # |error| per consumer (floor mode is all <= 0, ceil mixes signs)
    a = np.abs(values)
    if (values > 0).any() and (values < 0).any():
        order = np.lexsort((a, owners))
        ao, aa, ac = _runs(owners[order], a[order], counts[order])
    else:  # one sign: |value| order is value order, reversed within each consumer when <= 0
        order = np.lexsort((a, owners)) if (values < 0).any() else np.arange(len(a))
        ao, aa, ac = owners[order], a[order], counts[order]
    cum = np.cumsum(ac)
    a_off = np.searchsorted(ao, np.arange(k))
    before = np.where(a_off > 0, cum[np.maximum(a_off - 1, 0)], 0)
    total = np.bincount(owners, weights=counts, minlength=k).astype(np.int64)
    quantiles = {}
    for name, q in _QUANTILES:
        rank = np.maximum(1, np.ceil(q * total).astype(np.int64))
        quantiles[name] = aa[np.searchsorted(cum, before + rank)]
    quantiles["err_mean"] = np.bincount(owners, weights=values * counts, minlength=k) / np.maximum(total, 1)
    return distinct, group_counts, quantiles


def analyse_group(cid: np.ndarray, ledger: np.ndarray, entry: np.ndarray, ts: np.ndarray, due: np.ndarray,
                  bits_list: Sequence[int], costs: IndexCosts, rounding: str = "floor",
                  grid: Optional[Grid] = None) -> dict[str, Any]:
    """:func:`analyse_consumer` for many consumers at once, vectorised over the group.

    Arrays: nacks of whole consumers (int64), consumer id ``cid`` first;
    sorted by ``(cid, ledger, entry, due)`` is expected (the Spark job sorts
    once), unsorted input is sorted here. Returns columns with one row per
    (consumer, bits), bits-major: ``cid``, ``bits``, :data:`SCALAR_COLUMNS`
    (``peak_at_ms`` -1 when never pending), ``err_mean``, for each of
    :data:`LIST_COLUMNS` ``(offsets, values)`` of the per-row lists, and
    ``histograms``: per bits, the group's error histogram ``(values, counts)``.
    Runtime: see the module docstring.
    """
    cid, ledger, entry, ts, due = (np.asarray(a, dtype=np.int64) for a in (cid, ledger, entry, ts, due))
    n = len(ts)
    if not _is_sorted(cid, ledger, entry, due):
        order = _row_order(cid, ledger, entry, due)
        cid, ledger, entry, ts, due = cid[order], ledger[order], entry[order], ts[order], due[order]
    change = np.ones(n, dtype=bool)
    change[1:] = cid[1:] != cid[:-1]
    lcid = np.cumsum(change) - 1
    heads = np.flatnonzero(change)
    k = len(heads)
    nacks = np.diff(np.append(heads, n))
    new_message = change.copy()
    if n > 1:
        new_message[1:] |= (ledger[1:] != ledger[:-1]) | (entry[1:] != entry[:-1])
    parts = [_group_bits(lcid, k, nacks, ledger, entry, ts, due, new_message, int(b), costs, rounding, grid)
             for b in bits_list]
    out: dict[str, Any] = {"cid": np.tile(cid[heads], len(parts)),
                 "bits": np.repeat(np.asarray([int(b) for b in bits_list], dtype=np.int64), k),
                 "histograms": [p["histogram"] for p in parts]}
    for name in (*SCALAR_COLUMNS, "err_mean"):
        out[name] = np.concatenate([p[name] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    for name in LIST_COLUMNS:
        offsets, values, shift = [np.zeros(1, dtype=np.int64)], [], 0
        for p in parts:
            off, val = p[name]
            offsets.append(off[1:] + shift)
            values.append(val)
            shift += len(val)
        out[name] = (np.concatenate(offsets), np.concatenate(values) if values else np.zeros(0, np.int64))
    return out


def _row_order(cid: np.ndarray, ledger: np.ndarray, entry: np.ndarray, due: np.ndarray) -> np.ndarray:
    """The permutation sorting rows by ``(cid, ledger, entry, due)``: one argsort
    of a mixed-radix int64 key when the four ranges fit in 63 bits (logs are
    like that: a few ledgers, entry ids and a time window per group), else a
    lexsort. Runtime: O(n log n)."""
    keys = np.zeros(len(cid), dtype=np.int64)
    room = 1
    for col in (due, entry, ledger, cid):  # least significant first
        low = int(col.min())
        span = int(col.max()) - low + 1
        if room * span >= (1 << 63) // max(1, span) or room * span >= 1 << 62:
            return np.lexsort((due, entry, ledger, cid))
        keys += (col - low) * room
        room *= span
    return np.argsort(keys, kind="stable")


def _series_lists(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    k, bins = matrix.shape
    return np.arange(k + 1, dtype=np.int64) * bins, matrix.reshape(-1)


def _group_bits(lcid: np.ndarray, k: int, nacks: np.ndarray, ledger: np.ndarray, entry: np.ndarray, ts: np.ndarray,
                due: np.ndarray, new_message: np.ndarray, bits: int, costs: IndexCosts, rounding: str,
                grid: Optional[Grid]) -> dict[str, Any]:
    """Every consumer of the group at one precision."""
    n = len(ts)
    bucket = bucket_times(due, bits, rounding)
    # occurrence = run of one (consumer, ledger, entry) into one bucket: rows are
    # sorted by (consumer, ledger, entry, due) and the bucket grows with due
    new_occ = new_message.copy()
    if n > 1:
        new_occ[1:] |= bucket[1:] != bucket[:-1]
    first = np.flatnonzero(new_occ)
    if len(first) == n:  # the common case: no message nacked twice into one bucket
        start, occ_bucket, occ_ledger, occ_entry, occ_c = ts, bucket, ledger, entry, lcid
    else:
        start = np.minimum.reduceat(ts, first)
        occ_bucket, occ_ledger, occ_entry, occ_c = bucket[first], ledger[first], entry[first], lcid[first]
    live = occ_bucket > start  # else the bucket had passed: fired at once, never pending
    occurrences = np.bincount(occ_c[live], minlength=k) if k > 1 else np.array([np.count_nonzero(live)])
    if len(first) == n:  # rows are occurrences: the ones not live are exactly the immediate ones
        immediate = nacks - occurrences
    else:
        immediate = np.bincount(lcid[bucket <= ts], minlength=k)
    peak, at, p_at, p_max = _sweep(occ_c[live], start[live], occ_bucket[live], k, grid)

    # memory at each consumer's peak: the live layout depends on what arrived
    # up to that instant (dense cells come from runs of adds), so the model
    # gets every occurrence seen by then and which of them are still pending
    at_occ = at[occ_c] if k > 1 else at[0]
    seen = start <= at_occ  # immediate ones too: the timer's pops gather the front bucket
    now = seen & (occ_bucket > at_occ)
    assert np.array_equal(np.bincount(occ_c[now], minlength=k), peak), "pending at the peak instant != peak"
    mem = _indexes_at(occ_c, seen, now, occ_ledger, occ_entry, occ_bucket, start, k, bits, costs)

    err = np.maximum(bucket, ts) - due  # redelivered at its bucket, or at once if that had passed
    values, counts, quantiles = _error_histograms(lcid, err, k)
    out = {
        "nacks": nacks, "occurrences": occurrences, "immediate": immediate,
        "merged": nacks - immediate - occurrences, "peak_pending": peak, "peak_at_ms": at,
        "index_bytes": mem[0], "roaring_bytes": mem[1], "buckets": mem[2], "bitmaps": mem[3], "ledgers": mem[4],
        "dict_index_bytes": np.round(costs.dict_index_per_entry * peak).astype(np.int64),
        "histogram": (values, counts),
        "pending_at": _series_lists(p_at), "pending_max": _series_lists(p_max),
    }
    out.update(quantiles)
    return out


def analyse_consumer(ledger: np.ndarray, entry: np.ndarray, ts: np.ndarray, due: np.ndarray,
                     bits_list: Sequence[int], costs: IndexCosts,
                     rounding: str = "floor") -> list[BitsResult]:
    """Peak pending, memory at the peak and redelivery errors for every ``bits``,
    for one consumer's nacks (int64 arrays; any order). The same code as
    :func:`analyse_group`, with one consumer.
    """
    n = len(np.asarray(ts))
    cols = analyse_group(np.zeros(n, dtype=np.int64), ledger, entry, ts, due, bits_list, costs, rounding)
    out = []
    for i in range(len(cols["bits"])):
        row = {name: int(cols[name][i]) for name in SCALAR_COLUMNS}
        at = row.pop("peak_at_ms")
        for q in ("err_p50", "err_p90", "err_p99", "err_max"):
            row.pop(q)
        out.append(BitsResult(bits=int(cols["bits"][i]), peak_at_ms=None if at < 0 else at,
                              err_values=cols["histograms"][i][0], err_counts=cols["histograms"][i][1],
                              **row))
    return out


def analyse_rows(rows: Iterable[tuple[int, int, int, int]], bits_list: Sequence[int],
                 costs: IndexCosts, rounding: str = "floor") -> list[BitsResult]:
    """:func:`analyse_consumer` for ``(ledger, entry, ts, due)`` tuples (tests, small data)."""
    cols = list(zip(*rows)) or [(), (), (), ()]
    arrays = [np.array(c, dtype=np.int64) for c in cols]
    ledger, entry, ts, due = arrays
    return analyse_consumer(ledger, entry, ts, due, bits_list=bits_list, costs=costs, rounding=rounding)
