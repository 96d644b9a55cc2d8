"""The dense cells of a live :class:`~nacktracker.TimeBucketIndex`, replayed
from arrival order for the memory model: which cells are dense, which are
*listed* by their ledger (ids stored once, out of the live bitmap) and how
much of each was compacted. The rules are those of
``nacktracker/index/buckets.py`` (``_promote``, ``_make_hot``) and ``_live.py`` (``list_cell``):

* a ``(bucket, ledger)`` cell becomes a Roaring bitmap (is *promoted*) at the
  :data:`PROMOTE`-th add of a run of adds in a row to it (arrival order; an
  add to another cell of the same index ends the run);
* the promoted cell is listed by its ledger; a ledger lists up to
  :data:`LISTED` cells, and the next promotion first moves the listed cells'
  ids into the live bitmap (they stay dense cells, unlisted) and starts a new
  list; a popped cell leaves the list;
* a listed cell's ids skip the live bitmap except the first add of each later
  run back into it (that add goes through the live bitmap's check-and-add);
* a dense cell is compacted (run-optimised, shrunk) when the run of adds into
  it ends, if its size crossed a power of two during the run (a promoting run
  counts from 0); the cell of the index's last add is still in its run.

Not replayed: acks (the plan's logs have none, so no ghost keeps a cell from
being listed), a pop between two adds ending a run early, and the run of a
ledger that has ids pending in two buckets keeping its first ids in the live
bitmap (those ids are counted in it: see ``index_states``).
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import numpy as np

from ..index.bitmaps import distinct
from ..index.layout import LISTED, LISTING, PROMOTE

__all__ = ["ArrivalCells", "Listing", "arrival_cells", "list_cells", "compacted_prefix"]


class ArrivalCells(NamedTuple):
    """Per occurrence (input order) unless said per cell."""

    code: np.ndarray         # its (owner, bucket, ledger) cell, 0..n-1
    n: int                   # cells
    dense: np.ndarray        # in a bitmap by arrival: added at or after its cell's first run of PROMOTE
    rank: np.ndarray         # position in arrival order (owners one after another)
    run_start: np.ndarray    # first add of a run into its cell
    promoting: np.ndarray    # in the run that promoted its cell
    last: np.ndarray         # its owner's last add (the cell a live index still has hot)
    reset_after: np.ndarray  # a pop came before its owner's next add (the hot cell was dropped, not compacted)
    promoted_at: np.ndarray  # per cell: arrival rank of the add that promoted it (-1: never)


def arrival_cells(code: np.ndarray, n_cells: int, owner: np.ndarray, bucket: np.ndarray, start: np.ndarray,
                  pending: np.ndarray) -> ArrivalCells:
    """Runs of adds per cell in arrival order (``start``, ties in input order),
    for many indexes at once. ``code``: each occurrence's cell (0..n_cells-1).
    The index gathers a bucket's copies into bitmaps only as it takes it, so
    no pending cell is gathered. Runtime: O(n log n)."""
    n = len(code)
    order = _arrival_order(owner, start)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    sc, so = code[order], owner[order]
    fires = _Fires(owner, bucket, start)
    done = fires.upto(so, start[order])  # buckets fired by each add
    reset = np.r_[False, done[1:] > done[:-1]]  # a pop since the owner's previous add (same owner: same keys)
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = (sc[1:] != sc[:-1]) | (so[1:] != so[:-1]) | reset[1:]
    run_start = np.flatnonzero(new_run)
    run_len = np.diff(np.append(run_start, n))
    promoting = run_len >= PROMOTE
    first = np.full(n_cells, n, dtype=np.int64)  # arrival rank where each cell's promoting run starts
    np.minimum.at(first, sc[run_start[promoting]], run_start[promoting])
    dense = np.empty(n, dtype=bool)
    dense[order] = np.arange(n) >= first[sc]
    run_id = np.cumsum(new_run) - 1
    in_promoting = np.zeros(n, dtype=bool)
    in_promoting[order] = run_start[run_id] == first[sc]
    starts = np.empty(n, dtype=bool)
    starts[order] = new_run
    last = np.zeros(n, dtype=bool)
    owner_last = np.r_[so[1:] != so[:-1], True]
    last[order[owner_last]] = True
    reset_after = np.zeros(n, dtype=bool)  # the owner's next add comes after a pop
    reset_after[order[:-1]] = reset[1:] & ~owner_last[:-1]
    promoted_at = np.where(first < n, first + PROMOTE - 1, -1)
    # no pending cell was gathered: the index gathers a bucket's sparse copies
    # into bitmaps only as it takes it (or, rarely, to check a front bucket
    # known from an unsorted tail only, or with acked copies pending: neither
    # is modelled)
    return ArrivalCells(code, n_cells, dense, rank, starts, in_promoting, last, reset_after, promoted_at)


def _arrival_order(owner: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``np.lexsort((start, owner))`` (stable: equal starts stay in input
    order), without the sort when the rows are in that order already (a
    group's messages often come in time order). Runtime: O(n) then, else
    O(n log n)."""
    n = len(owner)
    if n > 1:
        step = np.diff(owner)
        if (step >= 0).all() and ((step > 0) | (np.diff(start) >= 0)).all():
            return np.arange(n)
    return np.lexsort((start, owner))


def fire_times(bucket: np.ndarray, start: np.ndarray) -> np.ndarray:
    """When each occurrence's cell is popped: at its bucket time, or, for a
    nack whose bucket had passed, by the next add after it (the tracker's
    timer, armed in the past, fires at the clock's next step)."""
    return np.where(bucket > start, bucket, start + 1)


class _Fires:
    """The owners' pops (the tracker's timer pops a bucket at its time),
    keyed ``owner × span + time offset`` (or, when that would not fit 62
    bits, ``owner × span + time rank``)."""

    def __init__(self, owner: np.ndarray, bucket: np.ndarray, start: np.ndarray) -> None:
        fire = fire_times(bucket, start)
        self.low = int(min(bucket.min(), start.min()))
        self.span = int(max(bucket.max(), fire.max())) - self.low + 2
        self.ub: np.ndarray | None = None
        if (int(owner.max()) + 1) * self.span >= 1 << 62:  # rank the times instead
            self.ub = distinct(np.r_[bucket, fire])
            self.span = len(self.ub) + 1
        self.keys = distinct(owner * self.span + self._at(fire))

    def _at(self, t: np.ndarray) -> np.ndarray:
        """The key offset of times that occur (bucket or fire times)."""
        return t - self.low if self.ub is None else np.searchsorted(self.ub, t)

    def _after(self, t: np.ndarray) -> np.ndarray:
        """An offset above every time <= t and none later (any t)."""
        if self.ub is None:
            clipped: np.ndarray = np.clip(t - self.low + 1, 0, self.span - 1)
            return clipped
        return np.searchsorted(self.ub, t, side="right")

    def upto(self, owner: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Position after the owner's last bucket time <= t (in ``keys``)."""
        at: np.ndarray = np.searchsorted(self.keys, owner * self.span + self._after(t))
        return at


class Listing(NamedTuple):
    """The ledgers' lists of dense cells at the instant."""

    listed: np.ndarray      # per cell: listed by its ledger at the instant
    owner: np.ndarray       # per ledger with a list: its owner
    ledger: np.ndarray      # and its ledger id
    list_bytes: np.ndarray  # ``sys.getsizeof`` of that list (appends and removals replayed on a real list)
    n: np.ndarray           # cells in it
    hi_bytes: np.ndarray    # ``sys.getsizeof`` of the ledger's ``hi`` (the largest listed id)


def list_cells(cells: ArrivalCells, owner: np.ndarray, ledger: np.ndarray, bucket: np.ndarray,
               entry: np.ndarray, pending: np.ndarray, start: np.ndarray) -> Listing:
    """Replay each ledger's list over its promotions and the pops of its
    promoted cells before the instant (a cell's bucket fires before an add at
    a time >= the bucket), in time order. A sequential pass over promoted
    cells only: O(c log c) for c promoted cells, no work per message."""
    code, n_cells = cells.code, cells.n
    first_row = np.full(n_cells, len(code), dtype=np.int64)
    np.minimum.at(first_row, code, np.arange(len(code)))
    promo = np.flatnonzero(cells.promoted_at >= 0)
    listed = np.zeros(n_cells, dtype=bool)
    empty = np.zeros(0, dtype=np.int64)
    if len(promo) == 0:
        return Listing(listed, empty, empty, empty, empty, empty)
    rows = first_row[promo]
    by_rank = np.empty(len(code), dtype=np.int64)
    by_rank[cells.rank] = np.arange(len(code))
    promote_row = by_rank[cells.promoted_at[promo]]
    popped = ~pending[rows]  # every occurrence of a cell shares its bucket: pending together
    top = np.zeros(n_cells, dtype=np.int64)
    np.maximum.at(top, code, entry)
    # events: promotions (kind 1, at the promoting add's start, by rank) and
    # pops of cells gone by the instant (kind 0, at their bucket: before adds at that time)
    ev_cell = np.r_[promo, promo[popped]]
    ev_time = np.r_[start[promote_row], fire_times(bucket[rows[popped]], start[rows[popped]])]
    ev_kind = np.r_[np.ones(len(promo), dtype=np.int64), np.zeros(int(popped.sum()), dtype=np.int64)]
    ev_rank = np.r_[cells.promoted_at[promo], np.zeros(int(popped.sum()), dtype=np.int64)]
    ev_row = first_row[ev_cell]
    order = np.lexsort((ev_rank, ev_kind, ev_time, ledger[ev_row], owner[ev_row]))
    ev_cell, ev_kind, ev_row = ev_cell[order], ev_kind[order], ev_row[order]
    ev_owner, ev_ledger = owner[ev_row], ledger[ev_row]
    group_end = np.r_[(ev_owner[1:] != ev_owner[:-1]) | (ev_ledger[1:] != ev_ledger[:-1]), True]
    out_owner, out_ledger, out_list, out_n, out_hi = [], [], [], [], []
    cur: list[int] | None = None
    for c, kind, end, o, lg in zip(ev_cell.tolist(), ev_kind.tolist(), group_end.tolist(), ev_owner.tolist(),
                                   ev_ledger.tolist()):
        # cur: the ledger's flat list as the index keeps it (LISTING items a cell: the
        # cell's id here, then two placeholders for its window and key), so its
        # getsizeof grows and shrinks as the real one does
        if kind:
            if cur is not None and len(cur) >= LISTED * LISTING:
                cur = None  # flushed: its cells' ids move to the live bitmap
            cur = [c, -1, -1] if cur is None else cur + [c, -1, -1]  # exact size, as the index makes it
        elif cur is not None and c in cur[::LISTING]:
            i = cur[::LISTING].index(c) * LISTING
            del cur[i:i + LISTING]
            if not cur:
                cur = None
        if end:
            if cur is not None:
                held = cur[::LISTING]
                listed[held] = True
                out_owner.append(o)
                out_ledger.append(lg)
                out_list.append(sys.getsizeof(cur))
                out_n.append(len(held))
                out_hi.append(sys.getsizeof(int(top[held].max())))
            cur = None
    def as_array(v: list[int]) -> np.ndarray:
        return np.asarray(v, dtype=np.int64)

    return Listing(listed, as_array(out_owner), as_array(out_ledger), as_array(out_list), as_array(out_n),
                   as_array(out_hi))


def _bit_length(x: np.ndarray) -> np.ndarray:
    """``int.bit_length`` of non-negative int64 values below 2^53, vectorised."""
    return np.frexp(x.astype(np.float64))[1].astype(np.int64)


def compacted_prefix(cell: np.ndarray, run_start: np.ndarray, reset_after: np.ndarray, arrival: np.ndarray,
                     hot: np.ndarray, n_cells: int) -> np.ndarray:
    """How many of each dense cell's ids (in arrival order) were added before
    its last compaction. Rows: the cell's ids sorted by ``(cell, not arrival,
    rank)``; ``arrival``: added into the bitmap by adds (the others were
    gathered into it at the front later: never compacted); ``run_start``: the
    first add of a run; ``reset_after``: a pop came before the owner's next add
    (a run ending so is not compacted); ``hot``: per cell, its current run
    has not ended.
    Runtime: O(rows) numpy."""
    cut = np.zeros(n_cells, dtype=np.int64)
    if len(cell) == 0:
        return cut
    new_cell = np.r_[True, cell[1:] != cell[:-1]]
    heads = np.flatnonzero(new_cell)
    pos = np.arange(len(cell)) - np.repeat(heads, np.diff(np.append(heads, len(cell))))
    n_arrival = np.bincount(cell[arrival], minlength=n_cells)
    starts = np.flatnonzero((new_cell | run_start) & arrival)
    if len(starts) == 0:
        return cut
    sc, s_pos = cell[starts], pos[starts]
    end = n_arrival[sc].copy()
    same = sc[1:] == sc[:-1]
    end[:-1] = np.where(same, s_pos[1:], end[:-1])
    first_run = new_cell[starts]
    last_run = np.r_[~same, True]
    size_before = np.where(first_run, 0, s_pos)  # a promoting run counts from 0 (_promote: _hot_start = 0)
    ended_by_pop = reset_after[starts + (end - s_pos) - 1]  # the run's last add (arrival rows lead each cell)
    crossed = ((end >= PROMOTE) & (_bit_length(end) > _bit_length(size_before)) & ~(last_run & hot[sc])
               & ~ended_by_pop)
    np.maximum.at(cut, sc[crossed], end[crossed])
    return cut
