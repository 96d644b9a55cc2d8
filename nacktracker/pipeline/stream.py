"""One consumer's nacks in time order, a chunk at a time, holding only what is
pending: the kernel for a consumer too large to hold whole (numpy + pyroaring,
no Spark here).

:func:`~.pending.analyse_group` holds a consumer's every nack (~40 bytes of
input each, plus temporaries); this one holds, per candidate ``bits``, the
occurrences pending at the end of the last chunk (``ledger, entry, bucket,
start``: 32 bytes each), the occurrences seen since the oldest of them started
(the memory model's history, at most :data:`HISTORY_ROWS`), the error
histogram (one count per distinct error) and the series on the grid — so its
memory is O(peak pending + a chunk), whatever the consumer's length.

The model is :mod:`.pending`'s, streamed. Rows come sorted by time; a chunk
ends at a change of time (rows of one instant are never split). Per chunk
and bits:

* a nack whose bucket had passed (``bucket <= ts``) is redelivered at once;
  the others are *candidates*. Time only grows, so a candidate whose
  ``(ledger, entry, bucket)`` is pending (carried in, or an earlier candidate
  of the chunk) merges into it, and the first candidate of a key starts an
  occurrence pending from its time until its bucket — exactly the batch
  kernel's occurrences (all nacks of a key into one bucket, from the first);
* pending at an instant of the chunk's window (after the previous chunk's
  last instant, up to this chunk's last; the last chunk's window is open) is
  the carried occurrences (still pending) plus the chunk's own: the batch
  sweep over them is exact inside the window and never above the truth
  outside it, so the peak (first reached at a start: pending only grows at
  starts) and the series (maxima over chunks) are the batch kernel's;
* the memory at the peak is the model of :func:`~.memory_model.index_states`
  over the occurrences seen by the peak instant: exact when they all are in
  the history (the occurrences since the oldest pending one started, up to
  :data:`HISTORY_ROWS`; older ones are popped, and only their count and
  whether they widened the index matter to the model — both carried).

Cost per chunk of c nacks and p pending, per bits: O((p + c) log(p + c)) numpy;
the memory model runs once per bits, at the end, on the history kept at the
peak.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ..index.layout import LIVE_ENTRY_BITS
from .memory_model import IndexCosts, index_states
from .pending import _QUANTILES, LIST_COLUMNS, SCALAR_COLUMNS, Grid, _sweep, bucket_times

__all__ = ["ConsumerStream", "CHUNK_ROWS", "HISTORY_ROWS"]

#: Rows per chunk (a chunk ends at a change of time, so it may hold a few more).
CHUNK_ROWS = 1 << 20
#: The memory model's history is cut to this many occurrences (the oldest go).
HISTORY_ROWS = 1 << 21


def _keys(ledger: np.ndarray, entry: np.ndarray, bucket: np.ndarray) -> np.ndarray:
    """One int64 per ``(ledger, entry, bucket)``, equal iff the triples are
    equal: mixed radix over the ranges when they fit in 63 bits, else ranks
    of the distinct triples (a lexsort). Runtime: O(n) or O(n log n)."""
    n = len(ledger)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    keys = np.zeros(n, dtype=np.int64)
    room = 1
    for col in (bucket, entry, ledger):
        low = int(col.min())
        span = int(col.max()) - low + 1
        if room * span >= 1 << 62:
            order = np.lexsort((bucket, entry, ledger))
            new = np.ones(n, dtype=bool)
            new[1:] = ((ledger[order][1:] != ledger[order][:-1]) | (entry[order][1:] != entry[order][:-1])
                       | (bucket[order][1:] != bucket[order][:-1]))
            out = np.empty(n, dtype=np.int64)
            out[order] = np.cumsum(new) - 1
            return out
        keys += (col - low) * room
        room *= span
    return keys


class _Bits:
    """What one bits value carries from chunk to chunk."""

    def __init__(self, bits: int, bins: int) -> None:
        self.bits = bits
        # pending at the end of the last chunk: ledger, entry, bucket, start
        self.pend = [np.zeros(0, dtype=np.int64) for _ in range(4)]
        # occurrences seen since the oldest pending one started: ledger, entry, bucket, start
        self.hist = [np.zeros(0, dtype=np.int64) for _ in range(4)]
        self.dropped = 0          # occurrences cut from the history (all popped)
        self.wide = False         # an id the narrow live bitmap cannot key was seen
        self.occurrences = 0
        self.immediate = 0
        self.peak = 0
        self.at = -1
        self.snapshot: Optional[tuple[list[np.ndarray], int, bool]] = None  # (history rows seen by the peak, dropped, wide)
        self.err: dict[int, int] = {}
        self.p_at = np.zeros(bins, dtype=np.int64)
        self.p_max = np.zeros(bins, dtype=np.int64)


class ConsumerStream:
    """Feed one consumer's nacks in time order (:meth:`feed`, any batch sizes),
    then :meth:`finish` for one row per bits, as :func:`~.pending.analyse_group`
    gives them."""

    def __init__(self, bits_list: Sequence[int], costs: IndexCosts, rounding: str = "floor",
                 grid: Optional[Grid] = None, chunk_rows: int = CHUNK_ROWS, history_rows: int = HISTORY_ROWS) -> None:
        self.bits_list = [int(b) for b in bits_list]
        self.costs = costs
        self.rounding = rounding
        self.grid = grid
        self.chunk_rows = chunk_rows
        self.history_rows = history_rows
        self.state = [_Bits(b, grid.bins if grid else 0) for b in self.bits_list]
        self.nacks = 0
        self.lo: Optional[int] = None  # the current window starts here (None: before the first row)
        self._parts: list[list[np.ndarray]] = []
        self._rows = 0
        self._last_ts: Optional[int] = None
        self.peak_rows_held = 0  # the most rows held at once (input and state): the memory bound's witness

    # -- input ------------------------------------------------------------------------

    def feed(self, ledger: np.ndarray, entry: np.ndarray, ts: np.ndarray, due: np.ndarray) -> None:
        """Append rows (int64 arrays, time order, continuing the previous batch)."""
        cols = [np.asarray(a, dtype=np.int64) for a in (ledger, entry, ts, due)]
        if len(cols[2]) == 0:
            return
        if self._last_ts is not None and cols[2][0] < self._last_ts or (np.diff(cols[2]) < 0).any():
            raise ValueError("rows must come in time order")
        self._last_ts = int(cols[2][-1])
        self._parts.append(cols)
        self._rows += len(cols[2])
        if self._rows >= self.chunk_rows:
            rows = [np.concatenate([p[k] for p in self._parts]) for k in range(4)]
            t = rows[2]
            cut = int(np.searchsorted(t, t[-1]))  # the last instant's rows wait for the next batch
            if cut == 0:
                self._parts = [rows]
                return
            self._chunk([r[:cut] for r in rows], last=False)
            self._parts = [[r[cut:] for r in rows]]
            self._rows = len(t) - cut

    def finish(self) -> dict[str, Any]:
        """The rows: ``bits``, :data:`~.pending.SCALAR_COLUMNS`, ``err_mean``,
        the series (``pending_at``, ``pending_max``, one array per bits) and
        the error histogram ``(values, counts)`` per bits."""
        rows = ([np.concatenate([p[k] for p in self._parts]) for k in range(4)] if self._parts
                else [np.zeros(0, dtype=np.int64) for _ in range(4)])
        self._parts = []
        self._chunk(rows, last=True)
        return self._result()

    # -- one chunk --------------------------------------------------------------------

    def _chunk(self, rows: list[np.ndarray], last: bool) -> None:
        ledger, entry, ts, due = rows
        n = len(ts)
        self.nacks += n
        if n == 0 and self.lo is None:
            return
        lo = int(ts[0]) if self.lo is None else self.lo
        hi = None if last else int(ts[-1])
        for s in self.state:
            self._chunk_bits(s, ledger, entry, ts, due, lo, hi)
        if hi is not None:
            self.lo = hi + 1

    def _chunk_bits(self, s: _Bits, ledger: np.ndarray, entry: np.ndarray, ts: np.ndarray, due: np.ndarray, lo: int,
                    hi: Optional[int]) -> None:
        bucket = bucket_times(due, s.bits, self.rounding)
        err = np.maximum(bucket, ts) - due
        values, counts = np.unique(err, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist()):
            s.err[v] = s.err.get(v, 0) + c
        cand = bucket > ts
        s.immediate += int(len(ts) - np.count_nonzero(cand))
        p_led, p_ent, p_buc, p_start = s.pend
        np_ = len(p_led)
        # candidates: the first of each key not already pending starts an occurrence
        c_led, c_ent, c_buc, c_ts = ledger[cand], entry[cand], bucket[cand], ts[cand]
        keys = _keys(np.concatenate([p_led, c_led]), np.concatenate([p_ent, c_ent]),
                     np.concatenate([p_buc, c_buc]))
        _, first = np.unique(keys, return_index=True)  # the first index of each key: carried ones first
        new = np.sort(first[first >= np_]) - np_
        o_led, o_ent, o_buc, o_start = c_led[new], c_ent[new], c_buc[new], c_ts[new]
        s.occurrences += len(new)
        # immediate-only keys (never a candidate): occurrences that were never pending, for the history
        imm = ~cand
        if imm.any():
            i_led, i_ent, i_buc, i_ts = ledger[imm], entry[imm], bucket[imm], ts[imm]
            all_keys = _keys(np.concatenate([p_led, c_led, i_led]), np.concatenate([p_ent, c_ent, i_ent]),
                             np.concatenate([p_buc, c_buc, i_buc]))
            live = np.zeros(len(all_keys), dtype=bool)
            _, inv = np.unique(all_keys, return_inverse=True)
            inv = inv.reshape(-1)
            seen_live = np.zeros(int(inv.max()) + 1, dtype=bool)
            seen_live[inv[:np_ + len(c_led)]] = True
            live[np_ + len(c_led):] = seen_live[inv[np_ + len(c_led):]]
            tail = inv[np_ + len(c_led):]
            _, ifirst = np.unique(tail, return_index=True)
            keep = np.sort(ifirst[~live[np_ + len(c_led):][ifirst]])
            h_new = [np.concatenate([o_led, i_led[keep]]), np.concatenate([o_ent, i_ent[keep]]),
                     np.concatenate([o_buc, i_buc[keep]]), np.concatenate([o_start, i_ts[keep]])]
            order = np.argsort(h_new[3], kind="stable")
            h_new = [a[order] for a in h_new]
        else:
            h_new = [o_led, o_ent, o_buc, o_start]

        # the sweep over this chunk's view: carried occurrences from the window's start
        v_start = np.concatenate([np.maximum(p_start, lo), o_start])
        v_fire = np.concatenate([p_buc, o_buc])
        live_v = v_fire > v_start
        lc = np.zeros(int(np.count_nonzero(live_v)), dtype=np.int64)
        peak, at, p_at, p_max = _sweep(lc, v_start[live_v], v_fire[live_v], 1, self.grid)
        hist = [np.concatenate([a, b]) for a, b in zip(s.hist, h_new)]
        if int(peak[0]) > s.peak:
            s.peak, s.at = int(peak[0]), int(at[0])
            upto = int(np.searchsorted(hist[3], s.at, side="right"))  # history is in start order
            s.snapshot = ([a[:upto].copy() for a in hist], s.dropped, s.wide)
        if self.grid is not None:
            np.maximum(s.p_at, p_at[0], out=s.p_at)
            np.maximum(s.p_max, p_max[0], out=s.p_max)
        if hi is None:
            return
        # carry what is still pending after this chunk's last instant
        still = v_fire > hi
        s.pend = [np.concatenate([p_led, o_led])[still], np.concatenate([p_ent, o_ent])[still],
                  v_fire[still], np.concatenate([p_start, o_start])[still]]
        # the history: from the oldest pending occurrence's start, at most history_rows
        oldest = int(s.pend[3].min()) if len(s.pend[3]) else hi + 1
        cut = int(np.searchsorted(hist[3], oldest, side="left"))
        cut = max(cut, len(hist[3]) - self.history_rows)
        s.dropped += cut
        gone = hist[1][:cut]
        s.wide = s.wide or bool(((gone >> LIVE_ENTRY_BITS > 0) & (gone >> 32 == 0)).any())
        s.hist = [a[cut:] for a in hist]
        held = len(s.pend[0]) + len(s.hist[0]) + len(ts)
        self.peak_rows_held = max(self.peak_rows_held, held)

    # -- the rows -----------------------------------------------------------------------

    def _result(self) -> dict[str, Any]:
        costs = self.costs
        out: dict[str, Any] = {name: [] for name in (*SCALAR_COLUMNS, "err_mean")}
        out["bits"] = np.asarray(self.bits_list, dtype=np.int64)
        series: dict[str, list[np.ndarray]] = {c: [] for c in LIST_COLUMNS}
        out["histograms"] = []
        for s in self.state:
            mem = [0, 0, 0, 0, 0]
            if s.snapshot is not None and s.peak > 0:
                (led, ent, buc, start), dropped, wide = s.snapshot
                order = np.lexsort((buc, ent, led))  # the batch kernel's order: (ledger, entry, bucket)
                led, ent, buc, start = led[order], ent[order], buc[order], start[order]
                now = buc > s.at
                m = index_states(np.zeros(len(led), dtype=np.int64), led, ent, buc, start, now, 1, s.bits, costs,
                                 popped_before=np.array([dropped]), widened_before=np.array([wide]))
                mem = [int(v) for v in m[:, 0]]
            elif s.peak == 0:
                mem = [int(costs.empty_index), 0, 0, 0, 0]
            values = np.asarray(sorted(s.err), dtype=np.int64)
            counts = np.asarray([s.err[v] for v in values.tolist()], dtype=np.int64)
            out["histograms"].append((values, counts))
            a = np.abs(values)
            order = np.argsort(a, kind="stable")
            cum = np.cumsum(counts[order])
            total = int(cum[-1]) if len(cum) else 0
            row: dict[str, float] = {"nacks": self.nacks, "occurrences": s.occurrences, "immediate": s.immediate,
                   "merged": self.nacks - s.immediate - s.occurrences, "peak_pending": s.peak,
                   "peak_at_ms": s.at, "index_bytes": mem[0], "roaring_bytes": mem[1], "buckets": mem[2],
                   "bitmaps": mem[3], "ledgers": mem[4],
                   "dict_index_bytes": int(np.round(costs.dict_index_per_entry * s.peak))}
            for name, q in _QUANTILES:
                rank = max(1, int(np.ceil(q * total)))
                row[name] = int(a[order][np.searchsorted(cum, rank)]) if total else 0
            row["err_mean"] = float((values * counts).sum() / max(total, 1))
            for name in (*SCALAR_COLUMNS, "err_mean"):
                out[name].append(row[name])
            series["pending_at"].append(s.p_at)
            series["pending_max"].append(s.p_max)
        for name in SCALAR_COLUMNS:
            out[name] = np.asarray(out[name], dtype=np.int64)
        out["err_mean"] = np.asarray(out["err_mean"], dtype=np.float64)
        k = len(self.state)
        for c in LIST_COLUMNS:
            bins = self.grid.bins if self.grid else 0
            out[c] = (np.arange(k + 1, dtype=np.int64) * bins,
                      np.concatenate(series[c]) if series[c] else np.zeros(0, dtype=np.int64))
        return out
