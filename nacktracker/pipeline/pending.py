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
  grouped into ``(bucket, ledger)`` bitmaps exactly as a freshly built
  :class:`~nacktracker.TimeBucketIndex` holds them (real pyroaring bitmaps,
  ``run_optimize`` + ``shrink_to_fit``), sized by
  :mod:`~nacktracker.pipeline.memory_model`.

Many consumers at once (:func:`analyse_group`): a Spark task hands the kernel
a group of whole consumers (up to about a million rows), and every step above
runs once over the group with the consumer as the leading sort key — the
sweep sorts ``consumer × span + time`` keys, histograms and quantiles are
segment reductions — so a thousand small consumers cost what their nacks
cost, not a thousand numpy round trips. Only the memory at the peak loops in
Python, per consumer and per bitmap pending there.

It also samples pending over time on a :class:`Grid` (the same instants for
every consumer): the value at each bin start and the maximum within the bin.

Cost per group of n nacks: O(n log n) per bits (numpy sorts, ~0.1 s per
million), plus ~10 µs per bitmap pending at a peak, plus O(consumers × bins)
for the series. Memory: the 40 bytes per nack of the input plus about 60 of
temporaries.
"""

from __future__ import annotations

import array
import math
import sys
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import numpy as np
from pyroaring import BitMap, BitMap64

from ..index import _roaring_bytes
from .memory_model import IndexCosts, dict_bytes, dict_bytes_many, set_bytes

__all__ = ["BitsResult", "Grid", "analyse_group", "analyse_consumer", "quantile", "bucket_times",
           "SCALAR_COLUMNS", "LIST_COLUMNS"]

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


_ONE_BITMAP_BYTES: dict[type, int] = {}


def _one_entry_bytes(cls: type) -> int:
    """Bytes of a compacted bitmap holding one id (the same for any id of one width)."""
    if cls not in _ONE_BITMAP_BYTES:
        bm = cls()
        bm.add(12_345 if cls is BitMap else _U32 + 12_345)
        bm.run_optimize()
        bm.shrink_to_fit()
        _ONE_BITMAP_BYTES[cls] = _roaring_bytes(bm)
    return _ONE_BITMAP_BYTES[cls]


def _bitmap_bytes(ids: np.ndarray) -> int:
    """Build the bitmap the index would hold for sorted unique ``ids``; its bytes."""
    wide = int(ids[-1]) >= _U32
    if len(ids) == 1:
        return _one_entry_bytes(BitMap64 if wide else BitMap)
    if wide:
        bm = BitMap64()
        bm.update(array.array("Q", ids.astype(np.uint64).tobytes()))
    else:
        bm = BitMap()
        bm.update(array.array("I", ids.astype(np.uint32).tobytes()))
    bm.run_optimize()
    bm.shrink_to_fit()
    return _roaring_bytes(bm)


def _index_at(ledger: np.ndarray, entry: np.ndarray, bucket: np.ndarray,
              costs: IndexCosts) -> tuple[int, int, int, int, int]:
    """Bytes of a fresh index holding these occurrences (sorted by ledger, entry).

    Returns ``(index_bytes, roaring_bytes, buckets, bitmaps, ledgers)``.
    """
    if len(ledger) == 0:
        return costs.index_bytes(0, 0), 0, 0, 0, 0
    order = np.argsort(bucket, kind="stable")  # stable: keeps (ledger, entry) order per bucket
    b, l, e = bucket[order], ledger[order], entry[order]
    cut = np.flatnonzero((b[1:] != b[:-1]) | (l[1:] != l[:-1])) + 1
    lo = np.concatenate(([0], cut))
    hi = np.concatenate((cut, [len(b)]))
    roaring = 0
    keys = 0
    getsizeof = sys.getsizeof
    for i, j in zip(lo.tolist(), hi.tolist()):
        roaring += _bitmap_bytes(e[i:j])
        keys += getsizeof(int(b[i]) << 64 | int(l[i]))
    run_ledgers = l[lo]
    ledgers, per_ledger = np.unique(run_ledgers, return_counts=True)
    ledger_ints = sum(getsizeof(int(x)) for x in ledgers.tolist())
    newest = int(np.count_nonzero(b[lo] == b[-1]))
    exact = (roaring + keys + ledger_ints + dict_bytes_many(per_ledger)
             + dict_bytes(len(ledgers), literal=False) + set_bytes(newest))
    buckets = len(np.unique(b[lo]))
    return costs.index_bytes(exact, len(lo)), roaring, buckets, len(lo), len(ledgers)


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
#: Per (consumer, bits) list columns: the signed error histogram and the pending series.
LIST_COLUMNS = ("err_values", "err_counts", "pending_at", "pending_max")


def _is_sorted(cid, ledger, entry, due) -> bool:
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


def _sweep(lc: np.ndarray, start: np.ndarray, fire: np.ndarray, k: int, grid: Optional[Grid]):
    """Exact peak of pending per consumer, its first instant, and the series.

    ``lc``: consumer index (0..k-1, non-decreasing) of each live occurrence,
    pending from ``start`` until ``fire``. Keys ``consumer × span + time``
    make one sort serve all consumers; when they would overflow int64 the
    consumers are swept in slices. Returns ``(peak, at, pending_at,
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
    per_slice = max(1, (1 << 62) // span)
    c_lo = 0
    while c_lo < k:
        c_hi = min(k, c_lo + per_slice)
        lo, hi = np.searchsorted(lc, [c_lo, c_hi])
        if hi > lo:
            _sweep_slice(lc[lo:hi] - c_lo, start[lo:hi], fire[lo:hi], c_hi - c_lo, tmin, span, grid,
                         peak[c_lo:c_hi], at[c_lo:c_hi], p_at[c_lo:c_hi], p_max[c_lo:c_hi])
        c_lo = c_hi
    return peak, at, p_at, p_max


def _sweep_slice(lc, start, fire, k, tmin, span, grid, peak, at, p_at, p_max) -> None:
    """:func:`_sweep` for consumers whose keys fit in int64; fills the output views."""
    m = len(lc)
    base = np.arange(k, dtype=np.int64) * span
    sk = np.sort(lc * span + (start - tmin))
    fk = np.sort(lc * span + (fire - tmin))
    s_off = np.searchsorted(sk, base)
    f_off = np.searchsorted(fk, base)
    owner = sk // span
    # pending just after the i-th start of its consumer = its starts so far -
    # its fires so far (a fire at t ends before t)
    pending = (np.arange(m) - s_off[owner] + 1) - (np.searchsorted(fk, sk, side="right") - f_off[owner])
    has = np.bincount(owner, minlength=k) > 0
    segs = s_off[has]
    seg_max = np.maximum.reduceat(pending, segs)
    lengths = np.diff(np.append(segs, m))
    first_hit = np.minimum.reduceat(np.where(pending == np.repeat(seg_max, lengths), np.arange(m), m), segs)
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
    # the maximum within a bin: its start value, or a value just after a start inside it
    b = (sk - base[owner] + tmin - grid.start_ms) // grid.step_ms
    ok = (b >= 0) & (b < grid.bins)
    flat = np.zeros(k * grid.bins, dtype=np.int64)
    np.maximum.at(flat, owner[ok] * grid.bins + b[ok], pending[ok])
    p_max[:] = np.maximum(flat.reshape(k, grid.bins), values)


def _error_histograms(lcid: np.ndarray, err: np.ndarray, k: int):
    """Per consumer: distinct errors with counts (signed), and the nearest-rank
    quantiles of ``|error|``. Returns ``(offsets, values, counts, {name: array})``."""
    order = np.lexsort((err, lcid))
    c, e = lcid[order], err[order]
    n = len(e)
    new = np.ones(n, dtype=bool)
    new[1:] = (c[1:] != c[:-1]) | (e[1:] != e[:-1])
    heads = np.flatnonzero(new)
    values, owners = e[heads], c[heads]
    counts = np.diff(np.append(heads, n))
    offsets = np.searchsorted(owners, np.arange(k + 1))
    # |error|: the same with the signs dropped (floor mode is all <= 0, ceil mixes)
    a = np.abs(values)
    order = np.lexsort((a, owners))
    ao, aa, ac = owners[order], a[order], counts[order]
    new = np.ones(len(aa), dtype=bool)
    new[1:] = (ao[1:] != ao[:-1]) | (aa[1:] != aa[:-1])
    heads = np.flatnonzero(new)
    ao, aa, ac = ao[heads], aa[heads], np.add.reduceat(ac, heads)
    cum = np.cumsum(ac)
    a_off = np.searchsorted(ao, np.arange(k))
    before = np.where(a_off > 0, cum[np.maximum(a_off - 1, 0)], 0)
    total = np.bincount(lcid, minlength=k)
    quantiles = {}
    for name, q in _QUANTILES:
        rank = np.maximum(1, np.ceil(q * total).astype(np.int64))
        quantiles[name] = aa[np.searchsorted(cum, before + rank)]
    return offsets, values, counts, quantiles


def analyse_group(cid: np.ndarray, ledger: np.ndarray, entry: np.ndarray, ts: np.ndarray, due: np.ndarray,
                  bits_list: Sequence[int], costs: IndexCosts, rounding: str = "floor",
                  grid: Optional[Grid] = None) -> dict:
    """:func:`analyse_consumer` for many consumers at once, vectorised over the group.

    Arrays: nacks of whole consumers (int64), consumer id ``cid`` first;
    sorted by ``(cid, ledger, entry, due)`` is expected (the Spark job sorts
    once), unsorted input is sorted here. Returns columns with one row per
    (consumer, bits), bits-major: ``cid``, ``bits``, :data:`SCALAR_COLUMNS`
    (``peak_at_ms`` -1 when never pending), ``err_mean`` and, for each of
    :data:`LIST_COLUMNS`, ``(offsets, values)`` of the per-row lists.
    Runtime: see the module docstring.
    """
    cid, ledger, entry, ts, due = (np.asarray(a, dtype=np.int64) for a in (cid, ledger, entry, ts, due))
    n = len(ts)
    if not _is_sorted(cid, ledger, entry, due):
        order = np.lexsort((due, entry, ledger, cid))
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
    out: dict = {"cid": np.tile(cid[heads], len(parts)),
                 "bits": np.repeat(np.asarray([int(b) for b in bits_list], dtype=np.int64), k)}
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


def _series_lists(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    k, bins = matrix.shape
    return np.arange(k + 1, dtype=np.int64) * bins, matrix.reshape(-1)


def _group_bits(lcid, k, nacks, ledger, entry, ts, due, new_message, bits, costs, rounding, grid) -> dict:
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
    immediate = np.bincount(lcid[bucket <= ts], minlength=k)
    occurrences = np.bincount(occ_c[live], minlength=k)
    peak, at, p_at, p_max = _sweep(occ_c[live], start[live], occ_bucket[live], k, grid)

    # memory at each consumer's peak: the occurrences pending at that instant
    at_occ = at[occ_c]
    sel = np.flatnonzero(live & (start <= at_occ) & (occ_bucket > at_occ))
    cuts = np.searchsorted(occ_c[sel], np.arange(k + 1))
    assert np.array_equal(np.diff(cuts), peak), "pending at the peak instant != peak"
    mem = np.zeros((5, k), dtype=np.int64)  # index, roaring, buckets, bitmaps, ledgers
    mem[:, :] = np.asarray(_index_at(ledger[:0], entry[:0], bucket[:0], costs))[:, None]  # never pending
    for c in np.flatnonzero(peak).tolist():  # Python per consumer and bitmap: the one loop left
        s = sel[cuts[c]:cuts[c + 1]]
        mem[:, c] = _index_at(occ_ledger[s], occ_entry[s], occ_bucket[s], costs)

    err = np.maximum(bucket, ts) - due  # redelivered at its bucket, or at once if that had passed
    offsets, values, counts, quantiles = _error_histograms(lcid, err, k)
    out = {
        "nacks": nacks, "occurrences": occurrences, "immediate": immediate,
        "merged": nacks - immediate - occurrences, "peak_pending": peak, "peak_at_ms": at,
        "index_bytes": mem[0], "roaring_bytes": mem[1], "buckets": mem[2], "bitmaps": mem[3], "ledgers": mem[4],
        "dict_index_bytes": np.round(costs.dict_index_per_entry * peak).astype(np.int64),
        "err_mean": np.bincount(lcid, weights=err.astype(np.float64), minlength=k) / nacks,
        "err_values": (offsets, values), "err_counts": (offsets, counts),
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
        lo, hi = cols["err_values"][0][i:i + 2]
        at = row.pop("peak_at_ms")
        for q in ("err_p50", "err_p90", "err_p99", "err_max"):
            row.pop(q)
        out.append(BitsResult(bits=int(cols["bits"][i]), peak_at_ms=None if at < 0 else at,
                              err_values=cols["err_values"][1][lo:hi], err_counts=cols["err_counts"][1][lo:hi],
                              **row))
    return out


def analyse_rows(rows: Iterable[tuple[int, int, int, int]], bits_list: Sequence[int],
                 costs: IndexCosts, rounding: str = "floor") -> list[BitsResult]:
    """:func:`analyse_consumer` for ``(ledger, entry, ts, due)`` tuples (tests, small data)."""
    cols = list(zip(*rows)) or [(), (), (), ()]
    arrays = [np.array(c, dtype=np.int64) for c in cols]
    return analyse_consumer(*arrays, bits_list=bits_list, costs=costs, rounding=rounding)
