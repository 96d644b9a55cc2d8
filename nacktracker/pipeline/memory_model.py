"""Bytes of a live :class:`~nacktracker.TimeBucketIndex` from the pending nacks
at one instant, as a Spark task can compute them (numpy + real bitmaps).

The index's layout (:mod:`nacktracker.index.layout`, its documented layout API) and what ``nbytes()``
counts for it, piece by piece:

* per window of ``2^max(bits + 3, 14)`` ms holding pending nacks: the window
  object, its id, its slot in the windows dict, and, while it
  holds *sparse* copies, ``array('Q')`` segments with 8 bytes each: full
  ones of :data:`~nacktracker.index.layout.SEGMENT` copies in a list, and
  the one being grown by appends (:func:`segmented_bytes`);
* *dense* cells: a ``(bucket, ledger)`` cell turns into a Roaring bitmap when
  a run of :data:`~nacktracker.index.layout.PROMOTE` adds in a row reaches
  it (arrival order; another cell's add or a pop ends a run; the index
  gathers a bucket's sparse copies as it takes it), or when a look of its
  window, not open yet, finds its sparse copies cheaper as a bitmap
  (:func:`_looked`); 64-bit ids
  (>= 2^32) are always dense. Each costs its bitmap (built for real: the ids
  up to its last compaction compacted, the rest added since), a dict slot,
  a key and, in the front window, a heap slot. Which cells are dense, listed and compacted is
  replayed from arrival order by :mod:`.dense_cells`;
* the index-wide live bitmap (``slot << 22 | entry`` in a 32-bit ``BitMap``,
  or ``slot << 32 | entry`` in a ``BitMap64`` for an index that has seen an
  id below 2^32 the narrow one cannot key; built for real, not run-optimised:
  see :func:`index_states`) holds every live id below 2^32 (the others: a
  ``BitMap64`` per ledger) but those stored in a *listed* cell only: a ledger
  lists the cells its
  runs promote (up to ``LISTED``; the next promotion moves the listed ids
  into the live bitmap), and a listed cell's ids skip the live bitmap but
  the first add of each later run into it; ids pending in two buckets stay;
* per ledger, its id (an int), its slot's int past CPython's shared small
  ints, a dict slot and two list slots; a ledger with listed cells, wide ids
  or ids pending in two buckets also has a record
  (:class:`~nacktracker.index.layout.LedgerExt`), and with listed cells
  their flat list (bitmap, window, key per cell) and the int ``hi``;
* the ids pending in two buckets (``_multi`` and per-ledger sets);
* the fixed part of an empty index.

:func:`index_states` is that accounting, for the indexes of many consumers
at once (a numpy pass over all of them; :func:`index_state` is the same for
one). :func:`~.calibration.measure_index_costs` checks the model against ``nbytes()`` of indexes
built *live* (adds in time order, pops as a tracker's timer does them:
:func:`~.calibration.live_replay`) at bits 0, 8, 12 and 15 and
raises if it misses one by more than 10%, so a layout change cannot silently
skew the plan. DictIndex bytes per pending message are measured the same
way: one in-process build, ``nbytes() / len()``, scaled by the pending count.
"""

from __future__ import annotations

import array
import sys
from dataclasses import asdict, dataclass
from typing import Any, Callable, NamedTuple, Optional

import numpy as np
from pyroaring import BitMap, BitMap64

from ..index import DictIndex, TimeBucketIndex
from ..index.bitmaps import bitmap_of, u32_array, u64_array
from ..index.layout import (
    COMPACT_CHURN,
    LIVE_ENTRY_BITS,
    LIVE_SLOT_BITS,
    SCAN_PER_CELL,
    SCAN_SEGMENTS,
    SEGMENT,
    SMALL_INT,
    WIDE_LIVE_SHIFT,
    Layout,
    dense_pays,
    held,
    held_size,
    ledger_record_bytes,
    roaring_bytes,
    window_bytes,
)
from .dense_cells import arrival_cells, compacted_prefix, list_cells

__all__ = ["IndexCosts", "IndexState", "index_state", "index_states", "array_bytes", "segmented_bytes", "dict_bytes", "dict_bytes_many",
           "set_bytes", "list_bytes"]

_SIZES: dict[str, list[int]] = {"literal": [], "empty": [], "set": [], "list": []}


def _sizes(kind: str, k: int) -> list[int]:
    """Bytes of a container after 0..k insertions (:func:`held_size`), measured by growing one.

    ``literal``: a dict that starts as ``{key: value}``; ``empty``: a dict
    that starts as ``{}``; ``set``: a set that starts empty; ``list``: a list
    grown by appends. Grows by doubling, so the total cost is O(largest k).
    """
    table = _SIZES[kind]
    if len(table) > k:
        return table
    upto = max(k + 1, 2 * len(table), 1024)
    if kind == "literal":
        literal: dict[int, None] = {0: None}
        table[:] = [0, held_size(literal)]
        for i in range(1, upto - 1):
            literal[i] = None
            table.append(held_size(literal))
    else:
        obj: Any = {"empty": {}, "set": set(), "list": []}[kind]  # grown by the matching put below
        table[:] = [held_size(obj)]
        put: Callable[[int], None] = {"empty": lambda i: obj.__setitem__(i, None), "set": lambda i: obj.add(i),
               "list": lambda i: obj.append(i)}[kind]
        for i in range(upto - 1):
            put(i)
            table.append(held_size(obj))
    return table


def dict_bytes(k: int, literal: bool = True) -> int:
    """Bytes of an int-keyed dict after ``k`` insertions (:func:`held_size`). Runtime: O(1) amortised."""
    return _sizes("literal" if literal else "empty", k)[k]


def dict_bytes_many(ks: np.ndarray, literal: bool = True) -> int:
    """Sum of :func:`dict_bytes` over an array of key counts. Runtime: O(len)."""
    if len(ks) == 0:
        return 0
    table = np.asarray(_sizes("literal" if literal else "empty", int(ks.max())), dtype=np.int64)
    return int(table[ks].sum())


def set_bytes(k: int) -> int:
    """Bytes of a set after ``k`` adds (:func:`held_size`). Runtime: O(1) amortised."""
    return _sizes("set", k)[k]


def list_bytes(k: int) -> int:
    """Bytes of a list after ``k`` appends (:func:`held_size`). Runtime: O(1) amortised."""
    return _sizes("list", k)[k]


_ARRAY_EMPTY = sys.getsizeof(array.array("Q"))
_ARRAY_CAPS: list[int] = [0]


def _array_caps(n: int) -> np.ndarray:
    """Capacities an ``array('Q')`` passes through when grown by appends, up
    to ``n``: CPython resizes to ``size + size/16 + (3 if size < 8 else 7)``."""
    caps = _ARRAY_CAPS
    while caps[-1] < n:
        size, new = caps[-1], caps[-1] + 1
        caps.append((new >> 4) + (3 if size < 8 else 7) + new)
    return np.asarray(caps, dtype=np.int64)


def array_bytes(n: np.ndarray) -> np.ndarray:
    """Bytes of an ``array('Q')`` after ``n`` appends (:func:`held_size`:
    the object and its buffer, each as allocated), for an array of counts.
    Runtime: O(len log) numpy."""
    n = np.asarray(n, dtype=np.int64)
    caps = _array_caps(int(n.max()) if len(n) else 0)
    held_caps = np.asarray([held(8 * c) if c else 0 for c in caps.tolist()], dtype=np.int64)
    return held(_ARRAY_EMPTY) + held_caps[np.searchsorted(caps, n)]


def segmented_bytes(n: np.ndarray) -> np.ndarray:
    """Bytes of a window's ``n`` sparse copies as the index stores them:
    ``n // SEGMENT`` full segments in a list and the rest in the array being
    appended to (a window that has not rolled has no list), for an array of
    counts. Runtime: O(len log) numpy."""
    n = np.asarray(n, dtype=np.int64)
    full, rest = n // SEGMENT, n % SEGMENT
    out: np.ndarray = np.where(rest > 0, array_bytes(rest), 0) + full * int(array_bytes(np.asarray([SEGMENT]))[0])
    if len(n) and full.max() > 0:
        out += np.where(full > 0, np.asarray(_sizes("list", int(full.max())), dtype=np.int64)[full], 0)
    return out


class IndexState(NamedTuple):
    """What the model says a live index holds."""

    index_bytes: int
    roaring_bytes: int  # the live bitmap and the dense cells
    buckets: int
    bitmaps: int  # (bucket, ledger) cells, sparse or dense
    ledgers: int


def _tuple_ids(*cols: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids (0..m-1, in lexicographic order of the tuples) of the rows of
    ``cols``, and m. One int64 ``np.unique`` of a mixed-radix key when the
    columns' ranges fit in 62 bits (they do for a group's ids and times), else
    one lexsort. Runtime: O(n log n)."""
    n = len(cols[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64), 0
    key = np.zeros(n, dtype=np.int64)
    room = 1
    for col in reversed(cols):  # the last column is the least significant
        low = int(col.min())
        span = int(col.max()) - low + 1
        if room * span >= 1 << 62:
            break
        key += (col - low) * room
        room *= span
    else:
        uniq, inverse = np.unique(key, return_inverse=True)
        return inverse.reshape(-1).astype(np.int64, copy=False), len(uniq)
    order = np.lexsort(cols[::-1])
    new = np.zeros(n, dtype=bool)
    new[0] = True
    for col in cols:
        s = col[order]
        new[1:] |= s[1:] != s[:-1]
    ids = np.empty(n, dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    return ids, int(new.sum())


def _prefix_ids(fine: np.ndarray, n_fine: int, *prefix: np.ndarray) -> tuple[np.ndarray, int]:
    """:func:`_tuple_ids` of a prefix of the columns that numbered ``fine``
    (e.g. ``(owner, bucket)`` from ``(owner, bucket, ledger)``), or of columns
    that order as such a prefix does, without another sort: fine ids are in
    lexicographic order, so the prefix's ids step where its values change
    from one fine id to the next. Runtime: O(n)."""
    row = np.empty(n_fine, dtype=np.int64)
    row[fine] = np.arange(len(fine))  # a row of each fine id
    new = np.zeros(n_fine, dtype=bool)
    new[0] = True
    for col in prefix:
        v = col[row]
        new[1:] |= v[1:] != v[:-1]
    coarse = np.cumsum(new) - 1
    return coarse[fine], int(coarse[-1]) + 1


def _bitmap(ids: np.ndarray, compact: bool) -> BitMap | BitMap64:
    bm = bitmap_of(ids)
    if compact:
        bm.run_optimize()
        bm.shrink_to_fit()
    return bm


class _MultiHistory(NamedTuple):
    """Ids pending in two buckets (the index's ``_multi`` dict and the ledgers'
    ``multi`` sets hold them) over time, by the instant: an id is so from the
    start of an occurrence while its previous one is pending until the earlier
    of the two fires."""

    peak: np.ndarray         # per owner: the most at once
    ledger_peak: np.ndarray  # per (owner, ledger) of ``ledger_ids``: the most at once


def _level_peak(group: np.ndarray, t0: np.ndarray, t1: np.ndarray, g: int, since_empty: bool = False) -> np.ndarray:
    """The most intervals ``[t0, t1)`` open at once, per group (``since_empty``:
    since the last time none was; ``t1 < 0``: still open). Runtime: O(m log m)."""
    out = np.zeros(g, dtype=np.int64)
    if len(group) == 0:
        return out
    closed = t1 >= 0
    ev_g, ev_t = np.r_[group, group[closed]], np.r_[t0, t1[closed]]
    step = np.r_[np.ones(len(group), dtype=np.int64), -np.ones(int(closed.sum()), dtype=np.int64)]
    order = np.lexsort((step, ev_t, ev_g))  # at one time, ends (-1) before starts
    ev_g, step = ev_g[order], step[order]
    level = np.cumsum(step)
    heads = np.flatnonzero(np.r_[True, ev_g[1:] != ev_g[:-1]])
    level -= np.repeat(level[heads] - step[heads], np.diff(np.append(heads, len(level))))  # per group
    keep = np.ones(len(level), dtype=bool)
    if since_empty:
        pos = np.arange(len(level))
        last_empty = np.full(g, -1, dtype=np.int64)
        np.maximum.at(last_empty, ev_g[level == 0], pos[level == 0])
        keep = pos > last_empty[ev_g]
    np.maximum.at(out, ev_g[keep], level[keep])
    return out


def _multi_history(owner: np.ndarray, ledger_ids: np.ndarray, n_ledgers: int, entry: np.ndarray,
                   bucket: np.ndarray, start: np.ndarray, k: int) -> _MultiHistory:
    """:class:`_MultiHistory` of every occurrence seen (``ledger_ids``: their
    ``(owner, ledger)`` ids, 0..n_ledgers-1). Runtime: O(n log n)."""
    span = int(entry.max()) + 1
    if n_ledgers * span < 1 << 62:  # first the ids nacked more than once (often none): one sort
        key = ledger_ids * span + entry
        by_key = np.argsort(key, kind="stable")
        sk = key[by_key]
        dup = np.r_[sk[1:] == sk[:-1], False] | np.r_[False, sk[1:] == sk[:-1]]
        rows = by_key[dup]
    else:
        rows = np.arange(len(entry))
    order = rows[np.lexsort((start[rows], entry[rows], ledger_ids[rows]))]
    led, ent, b, s = ledger_ids[order], entry[order], bucket[order], start[order]
    again = np.flatnonzero(np.r_[False, (led[1:] == led[:-1]) & (ent[1:] == ent[:-1]) & (s[1:] < b[:-1])])
    o = owner[order][again]
    now = np.zeros(k, dtype=np.int64)
    np.maximum.at(now, owner, start)  # the instant: its owner's last add
    ends = np.minimum(b[again - 1], b[again])
    ends = np.where(ends > now[o], -1, ends)  # still pending in two buckets at the instant
    return _MultiHistory(_level_peak(o, s[again], ends, k), _level_peak(led[again], s[again], ends, n_ledgers,
                                                                       since_empty=True))


def _cell_bitmap(ids: np.ndarray, compacted: int) -> BitMap | BitMap64:
    """A dense cell's bitmap: ``ids[:compacted]`` added then compacted (run-optimised
    and shrunk) as the index does when a run into the cell ends, the rest added since."""
    if compacted == 0 or int(ids.max()) >> 32:
        return _bitmap(ids, compact=compacted == len(ids))
    bm = _bitmap(ids[:compacted], compact=True)
    if compacted < len(ids):
        bm.update(u32_array(ids[compacted:]))
    return bm


def _looked(cid: np.ndarray, n_cid: int, wid: np.ndarray, n_wid: int, entry: np.ndarray, start: np.ndarray,
            dense: np.ndarray, unopened: np.ndarray) -> np.ndarray:
    """Rows (pending copies) a window's look has moved into their cell's
    bitmap: sparse copies, added while their window was not open, of a cell
    that has a bitmap or whose sparse copies cost more packed
    (:func:`~nacktracker.index.layout.dense_pays`, with its Roaring
    containers counted), but for the copies added since the window's last
    look: counted as the copies between two looks (``SCAN_SEGMENTS``
    segments, or ``SCAN_PER_CELL`` per bitmap of the window), the window's
    latest (live builds at bits 0-15 read within 6% of ``nbytes()`` so).
    Runtime: O(n log n) numpy."""
    sparse = ~dense & unopened
    copies = np.bincount(cid[sparse], minlength=n_cid)
    containers = np.zeros(n_cid, dtype=np.int64)
    if sparse.any():  # distinct (cell, entry >> 16) per cell
        c_ids, n_c = _tuple_ids(cid[sparse], entry[sparse] >> 16)
        cell_of = np.empty(n_c, dtype=np.int64)
        cell_of[c_ids] = cid[sparse]
        containers = np.bincount(cell_of, minlength=n_cid)
    has_bitmap = np.bincount(cid[dense], minlength=n_cid) > 0
    moves = (copies > 0) & (has_bitmap | dense_pays(copies, containers))
    moved = sparse & moves[cid]
    rows = np.flatnonzero(moved)
    if len(rows):
        cell_wid = np.zeros(n_cid, dtype=np.int64)
        cell_wid[cid] = wid
        bitmaps = np.bincount(cell_wid[(moves | has_bitmap)], minlength=n_wid)
        lag = np.maximum(SCAN_SEGMENTS * SEGMENT, SCAN_PER_CELL * bitmaps)
        order = rows[np.lexsort((-start[rows], wid[rows]))]  # by window, latest first
        w = wid[order]
        heads = np.searchsorted(w, w, side="left")
        latest = np.arange(len(order)) - heads < lag[w]
        moved[order[latest]] = False
    out: np.ndarray = moved
    return out


def _per_owner(owner: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """Sum of ``values`` per owner (0..k-1), exact int64."""
    out = np.zeros(k, dtype=np.int64)
    np.add.at(out, owner, values)
    return out


def _table(kind: str, ks: np.ndarray) -> np.ndarray:
    """:func:`_sizes` looked up for an array of counts."""
    if len(ks) == 0:
        return np.zeros(0, dtype=np.int64)
    sizes: np.ndarray = np.asarray(_sizes(kind, int(ks.max())), dtype=np.int64)[ks]
    return sizes


def index_state(ledger: np.ndarray, entry: np.ndarray, bucket: np.ndarray, start: np.ndarray,
                pending: np.ndarray, bits: int, costs: "IndexCosts") -> IndexState:
    """Bytes of a live index at one instant: :func:`index_states` for one index.

    Arrays: every occurrence added up to that instant (in any order; those
    whose bucket had passed too: the timer's pop they cause ends runs), its
    first nack time ``start`` (arrival order decides dense and listed cells)
    and whether it is ``pending`` at the instant.
    """
    owner = np.zeros(len(np.asarray(ledger)), dtype=np.int64)
    out = index_states(owner, ledger, entry, bucket, start, pending, 1, bits, costs)
    return IndexState(*(int(v) for v in out[:, 0]))


class _Rows(NamedTuple):
    """The pending occurrences of :func:`index_states`, rows of one owner
    together in input order, with what the replay of every occurrence seen
    decided for each (dense, stored in a listed cell only, ...), and per
    owner the history the live bitmap depends on."""

    o: np.ndarray  # owner
    ledger: np.ndarray
    entry: np.ndarray
    bucket: np.ndarray
    start: np.ndarray
    dense: np.ndarray  # in a dense cell (by a run or a gather, or a 64-bit id)
    by_add: np.ndarray  # ... reached by its own add (not gathered)
    listed_only: np.ndarray  # stored in a listed cell only, not in the live bitmap
    run_start: np.ndarray
    reset_after: np.ndarray
    rank: np.ndarray
    last: np.ndarray  # the index's last add
    seen_lid: np.ndarray  # (owner, ledger) among every occurrence seen
    has: np.ndarray  # per owner: anything pending
    widened: np.ndarray  # per owner: the live bitmap is 64-bit
    refit: np.ndarray  # per owner: the live bitmap has been shrunk to fit
    multi_seen: _MultiHistory


class _LedgerIds(NamedTuple):
    """Messages and ledgers of the pending rows, and each ledger's slot."""

    pid: np.ndarray  # per row: its message (owner, ledger, entry)
    pid_rows: np.ndarray  # per message: its pending occurrences
    lid: np.ndarray  # per row: its ledger (owner, ledger)
    lid_first: np.ndarray  # per ledger: its first row
    lid_owner: np.ndarray
    slot: np.ndarray  # per ledger: its slot, by first arrival
    n_led: np.ndarray  # per owner: ledgers


def index_states(owner: np.ndarray, ledger: np.ndarray, entry: np.ndarray, bucket: np.ndarray,
                 start: np.ndarray, pending: np.ndarray, k: int, bits: int, costs: "IndexCosts",
                 popped_before: Optional[np.ndarray] = None, widened_before: Optional[np.ndarray] = None) -> np.ndarray:
    """Bytes of ``k`` live indexes, each at its own instant, in one pass: the
    model's accounting, piece by piece as the module docstring lists them.

    ``owner`` (0..k-1): whose index each occurrence is in; the other arrays as
    for :func:`index_state`, rows of one owner in their input order (it breaks
    ties of arrival and orders ledger slots). Returns a ``5 × k`` int64 array,
    the :class:`IndexState` fields as rows (an owner with nothing pending gets
    an empty index). Runtime: O(n log n) numpy over all owners together, plus
    a sequential pass over the promoted cells (each ledger's list,
    :func:`~.dense_cells.list_cells`) and building the bitmaps (C): one live
    bitmap per owner with pending occurrences and one per dense cell.

    ``popped_before`` (per owner) and ``widened_before``: occurrences seen
    earlier and not passed here (all popped by the instant), and whether one of
    them had an id the narrow live bitmap cannot key — what a streamed
    consumer (:mod:`.stream`) knows of the history it no longer holds.
    """
    owner, ledger, entry, bucket, start = (np.asarray(a, dtype=np.int64)
                                           for a in (owner, ledger, entry, bucket, start))
    out = np.zeros((5, k), dtype=np.int64)
    out[0] = costs.empty_index
    p = np.asarray(pending, dtype=bool)
    if not p.any():
        return out
    rows, listing = _pending_rows(owner, ledger, entry, bucket, start, p, k, popped_before, widened_before)
    total = np.zeros(k, dtype=np.int64)
    total[rows.has] = costs.index_fixed  # its counters included (nbytes() counts them whatever their values)
    ids = _ledger_ids(rows, k)
    total += _ledger_bytes(rows, ids, listing, k, costs)
    roaring = _live_bitmap_bytes(rows, ids, k) + _wide_bytes(rows, ids, k)
    total += _multi_bytes(rows, ids, k, costs)
    window_total, cell_roaring = _time_bytes(rows, Layout.for_bits(bits), k, costs, out)
    total += window_total
    roaring += cell_roaring
    total += roaring
    out[0, rows.has] = total[rows.has]
    out[1] = roaring
    out[4] = ids.n_led
    return out


def _pending_rows(owner: np.ndarray, ledger: np.ndarray, entry: np.ndarray, bucket: np.ndarray, start: np.ndarray,
                  p: np.ndarray, k: int, popped_before: Optional[np.ndarray],
                  widened_before: Optional[np.ndarray]) -> tuple[_Rows, Any]:
    """Dense cells and the ledgers' lists, replayed over every occurrence seen
    (popped ones too), then the pending rows with what the replay decided."""
    arrival = arrival_cells(*_tuple_ids(owner, bucket, ledger), owner, bucket, start, p)
    listing = list_cells(arrival, owner, ledger, bucket, entry, p, start)
    dense = arrival.dense | (entry >> 32 > 0)
    # stored in a listed cell only (not in the live bitmap): the promoting run, and later
    # runs into the cell but for their first add
    listed_only = dense & listing.listed[arrival.code] & (arrival.promoting | ~arrival.run_start)
    seen_lid, n_seen_lid = _tuple_ids(owner, ledger)
    widened = np.bincount(owner[(entry >> LIVE_ENTRY_BITS > 0) & (entry >> 32 == 0)], minlength=k) > 0
    if widened_before is not None:
        widened |= np.asarray(widened_before, dtype=bool)
    multi_seen = _multi_history(owner, seen_lid, n_seen_lid, entry, bucket, start, k)
    # the live bitmap is shrunk to fit every few thousand changes, paced by pops
    # (``_compact_live``): once it has been, its containers grew back from there
    popped = np.bincount(owner[~p], minlength=k)
    if popped_before is not None:
        popped = popped + np.asarray(popped_before, dtype=np.int64)
    cols = [a[p] for a in (owner, ledger, entry, bucket, start, dense, arrival.dense, listed_only, arrival.run_start,
                           arrival.reset_after, arrival.rank, arrival.last, seen_lid)]
    o = cols[0]
    if len(o) > 1 and (np.diff(o) < 0).any():  # rows of one owner together, in input order
        order = np.argsort(o, kind="stable")
        cols = [a[order] for a in cols]
    has = np.bincount(cols[0], minlength=k) > 0
    o, led, ent, bkt, st, dense_, by_add, listed, run_start, reset_after, rank, last, seen_lid = cols
    return _Rows(o, led, ent, bkt, st, dense_, by_add, listed, run_start, reset_after, rank, last, seen_lid, has,
                 widened, popped >= COMPACT_CHURN, multi_seen), listing


def _ledger_ids(rows: _Rows, k: int) -> _LedgerIds:
    """Messages and ledgers of the pending rows; slots by first arrival."""
    o, n = rows.o, len(rows.o)
    pid, n_pid = _tuple_ids(o, rows.ledger, rows.entry)  # (owner, ledger, entry): the ids of messages
    lid, n_lid = _prefix_ids(pid, n_pid, o, rows.ledger)
    lid_first = np.full(n_lid, n, dtype=np.int64)
    np.minimum.at(lid_first, lid, np.arange(n))
    lid_owner = o[lid_first]
    by_arrival = np.argsort(lid_first)  # owners' rows are contiguous: arrival order within each owner
    slot = np.empty(n_lid, dtype=np.int64)
    lid_heads = np.searchsorted(lid_owner[by_arrival], np.arange(k))
    slot[by_arrival] = np.arange(n_lid) - lid_heads[lid_owner[by_arrival]]
    return _LedgerIds(pid, np.bincount(pid, minlength=n_pid), lid, lid_first, lid_owner, slot,
                      np.bincount(lid_owner, minlength=k))


def _ledger_bytes(rows: _Rows, ids: _LedgerIds, listing: Any, k: int, costs: "IndexCosts") -> np.ndarray:
    """Per owner: the ledger table (a record each, slots by first arrival), the
    listed cells' flat lists and ``hi``, and the ledgers' rare-state records."""
    n_led = ids.n_led
    # a ledger is its slot: its id's int (a dict key and a list item), the slot's int past
    # CPython's shared small ints, and the dict and the per-slot list sized for them
    total = n_led * costs.ledger_bytes + np.maximum(n_led - 1 - SMALL_INT, 0) * costs.int_bytes
    total += np.where(rows.has, _table("empty", n_led) + _table("list", n_led), 0)
    # a ledger's listed cells: its flat list and its hi
    total += _per_owner(listing.owner, listing.list_bytes + listing.hi_bytes, k)
    # a LedgerExt record for each ledger with listed cells, wide ids or ids pending twice,
    # in a list by slot (made with the first record: an index without one has none)
    rare = np.zeros(len(ids.lid_first), dtype=bool)
    rare[ids.lid[(rows.entry >> 32 > 0) | (ids.pid_rows[ids.pid] > 1)]] = True
    with_ext = set(zip(listing.owner.tolist(), listing.ledger.tolist()))
    with_ext.update(zip(ids.lid_owner[rare].tolist(), rows.ledger[ids.lid_first[rare]].tolist()))
    if with_ext:
        n_ext = np.bincount(np.fromiter((o_ for o_, _ in with_ext), dtype=np.int64), minlength=k)
        total += n_ext * costs.ext_bytes + np.where(n_ext > 0, _table("list", n_led), 0)
    out: np.ndarray = total
    return out


def _live_bitmap_bytes(rows: _Rows, ids: _LedgerIds, k: int) -> np.ndarray:
    """Per owner: the live bitmap, built for real. It holds every narrow id but
    those stored in a listed cell only (an id pending in two buckets is in it
    whatever its cells)."""
    o, entry = rows.o, rows.entry
    in_live = (entry >> 32 == 0) & ~(rows.listed_only & (ids.pid_rows[ids.pid] == 1))
    # narrow (slot << 22 | entry, a BitMap) unless the index widened it: an id it could not
    # key seen (popped ones too), or a ledger slot past 2^10 (more ledgers than that now)
    wide_live = rows.widened | (ids.n_led > 1 << LIVE_SLOT_BITS)
    shift = np.where(wide_live[o], WIDE_LIVE_SHIFT, LIVE_ENTRY_BITS).astype(np.uint64)
    keys = (ids.slot[ids.lid].astype(np.uint64) << shift) | entry.astype(np.uint64)
    keys, key_owner = keys[in_live], o[in_live]
    order = np.lexsort((keys, key_owner))  # sorted and distinct per owner, as np.unique gives them
    keys, key_owner = keys[order], key_owner[order]
    distinct = np.r_[True, (keys[1:] != keys[:-1]) | (key_owner[1:] != key_owner[:-1])][:len(keys)]
    keys, key_owner = keys[distinct], key_owner[distinct]
    key_heads = np.searchsorted(key_owner, np.arange(k + 1))
    roaring = np.zeros(k, dtype=np.int64)
    for c in np.flatnonzero(rows.has).tolist():  # every index has one, empty when all is listed
        # not run-optimised, as the index never does (its compaction only shrinks it);
        # and not BitMap(values), which run-optimises
        if wide_live[c]:
            live: BitMap | BitMap64 = BitMap64()
            live.update(u64_array(keys[key_heads[c]:key_heads[c + 1]]))
        else:
            live = BitMap()
            live.update(u32_array(keys[key_heads[c]:key_heads[c + 1]]))
        roaring[c] += roaring_bytes(live, grown=True, refit=bool(rows.refit[c]))
    return roaring


def _wide_bytes(rows: _Rows, ids: _LedgerIds, k: int) -> np.ndarray:
    """Per owner: ids >= 2^32, a BitMap64 per ledger."""
    roaring = np.zeros(k, dtype=np.int64)
    wide = rows.entry >> 32 > 0
    if wide.any():
        for w in np.unique(ids.lid[wide]).tolist():
            roaring[ids.lid_owner[w]] += roaring_bytes(_bitmap(np.unique(rows.entry[wide & (ids.lid == w)]), True))
    return roaring


def _multi_bytes(rows: _Rows, ids: _LedgerIds, k: int, costs: "IndexCosts") -> np.ndarray:
    """Per owner: ids pending in two or more buckets, a ``_multi`` entry each, and per-ledger sets."""
    total = np.zeros(k, dtype=np.int64)
    multi = np.flatnonzero(ids.pid_rows > 1)
    if not len(multi):
        return total
    n = len(rows.o)
    pid_first = np.full(len(ids.pid_rows), n, dtype=np.int64)
    np.minimum.at(pid_first, ids.pid, np.arange(n))
    first = pid_first[multi]
    m = np.bincount(rows.o[first], minlength=k)
    # the dict never shrinks on deletion: grown for the most ids it held at once
    # (a resize on an insert after many deletions, to 3x the ids held then, is
    # not modelled: how many it held then is not known here)
    grown = np.maximum(m, rows.multi_seen.peak)
    total += np.where(m > 0, _table("empty", grown) + m * costs.multi_entry_bytes, 0)
    per_ledger = np.bincount(ids.lid[first], minlength=len(ids.lid_first))
    used = np.flatnonzero(per_ledger)
    kl = per_ledger[used]
    # a set never shrinks either: sized for the most it held (while it was not emptied)
    held = np.maximum(kl, rows.multi_seen.ledger_peak[rows.seen_lid[ids.lid_first[used]]])
    total += _per_owner(ids.lid_owner[used], _table("set", held) + kl * costs.int_bytes, k)
    return total


def _time_bytes(rows: _Rows, lay: Layout, k: int, costs: "IndexCosts", out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per owner: the windows (object, id, dict slot, the sparse copies'
    segments) and the dense cells' dict slots, keys and heap, and apart the
    dense cells' bitmaps; writes the bucket and cell counts into ``out``."""
    o, bucket = rows.o, rows.bucket
    total = np.zeros(k, dtype=np.int64)
    cid, n_cid = _tuple_ids(o, bucket, rows.ledger)  # (owner, bucket, ledger): the cells
    bid, n_bid = _prefix_ids(cid, n_cid, o, bucket)
    wid, n_wid = _prefix_ids(bid, n_bid, o, bucket >> lay.window_shift)  # windows order as buckets do
    wid_owner = np.empty(n_wid, dtype=np.int64)
    wid_owner[wid] = o
    n_win = np.bincount(wid_owner, minlength=k)
    # the windows' looks: a window not open yet (it opens about when the clock reaches its first
    # bucket) moves a cell's sparse copies into its bitmap when it has one or when they cost more
    # packed (layout.dense_pays); copies added after it opened stay sparse
    wshift = lay.window_shift
    dense = rows.dense | _looked(cid, n_cid, wid, n_wid, rows.entry, rows.start, rows.dense,
                                 rows.start < (bucket >> wshift) << wshift)
    front = np.full(k, n_wid, dtype=np.int64)
    np.minimum.at(front, wid_owner, np.arange(n_wid))
    sparse_per_window = np.bincount(wid[~dense], minlength=n_wid)
    total += n_win * costs.window_bytes + np.where(rows.has, _table("empty", n_win), 0)  # layout.time_order_bytes: the dict
    total += _per_owner(wid_owner, np.where(sparse_per_window > 0, segmented_bytes(sparse_per_window), 0), k)
    cid_owner = np.empty(n_cid, dtype=np.int64)
    cid_owner[cid] = o
    out[3] = np.bincount(cid_owner, minlength=k)
    bid_owner = np.empty(n_bid, dtype=np.int64)
    bid_owner[bid] = o
    out[2] = np.bincount(bid_owner, minlength=k)
    roaring = np.zeros(k, dtype=np.int64)
    d = np.flatnonzero(dense)
    if len(d):
        cells_total, roaring = _dense_cell_bytes(rows, d, cid, n_cid, cid_owner, wid, n_wid, wid_owner, front, k, costs)
        total += cells_total
    return total, roaring


def _dense_cell_bytes(rows: _Rows, d: np.ndarray, cid: np.ndarray, n_cid: int, cid_owner: np.ndarray, wid: np.ndarray,
                      n_wid: int, wid_owner: np.ndarray, front: np.ndarray, k: int,
                      costs: "IndexCosts") -> tuple[np.ndarray, np.ndarray]:
    """Per owner: the dense cells (rows ``d``), each a bitmap (not compacted
    while filling: the last add's cell and the front bucket's), plus a dict
    slot, a key and (front window) a heap slot in their window; and apart
    their bitmaps' bytes."""
    # each dense cell's ids in the order they reached it: its own adds by arrival,
    # then the sparse copies the front gathered into it; compacted up to its
    # last compaction (dense_cells.compacted_prefix), the rest added since
    hot = np.zeros(n_cid, dtype=bool)
    hot[cid[rows.last]] = True  # the index's last add went to this cell: its run goes on
    gathered = ~rows.by_add[d]
    order = np.lexsort((rows.rank[d], gathered, cid[d]))
    picked = d[order]
    cell_sorted, entries, gathered = cid[picked], rows.entry[picked], gathered[order]
    cut = compacted_prefix(cell_sorted, rows.run_start[picked], rows.reset_after[picked], ~gathered, hot, n_cid)
    new_cell = np.r_[True, cell_sorted[1:] != cell_sorted[:-1]]
    cuts = np.flatnonzero(new_cell)
    cells = cell_sorted[cuts]
    cells_per_window = np.bincount(wid[picked[cuts]], minlength=n_wid)
    bounds = np.append(cuts, len(picked)).tolist()
    roaring = np.zeros(k, dtype=np.int64)
    for c, upto, lo, hi in zip(cid_owner[cells].tolist(), cut[cells].tolist(), bounds[:-1], bounds[1:]):
        roaring[c] += roaring_bytes(_cell_bitmap(entries[lo:hi], upto))
    used = np.flatnonzero(cells_per_window)
    cw = cells_per_window[used]
    # the heap of keys: the front window's only (the index keeps one once a window is open)
    heap = np.where(used == front[wid_owner[used]], _table("list", cw), 0)
    total = _per_owner(wid_owner[used], _table("empty", cw) + heap + cw * costs.cell_key_bytes, k)
    return total, roaring


@dataclass(frozen=True)
class IndexCosts:
    """Constants of the memory model (bytes), each measured with ``held_size``
    on the real objects, and the model's worst error on live calibration builds."""

    dict_index_per_entry: float
    max_model_error: float
    empty_index: int           # nbytes() of an empty TimeBucketIndex
    index_fixed: int           # the same without its empty live bitmap (the model builds that)
    window_bytes: int          # a Window object and its id
    ledger_bytes: int          # a ledger's id (an int; its slot's int only past SMALL_INT)
    ext_bytes: int             # a LedgerExt record (a ledger's rare state)
    cell_key_bytes: int        # the int key of a dense cell
    multi_entry_bytes: int     # a (slot, entry) tuple and its count (nbytes() counts the tuple, not its ints)
    int_bytes: int             # one int in a per-ledger set

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def constants(cls) -> "IndexCosts":
        """The measured constants, without the calibration check
        (:func:`~.calibration.measure_index_costs` adds it). Runtime: ~0.1 s."""
        size = held_size
        empty = TimeBucketIndex(precision_bits=0)
        big = 1_000_003 << 20
        return cls(
            dict_index_per_entry=_dict_index_per_entry(), max_model_error=0.0, empty_index=empty.nbytes(),
            index_fixed=(empty.nbytes() - roaring_bytes(BitMap(), grown=True)  # the model builds the live bitmap,
                         - 2 * dict_bytes(0, literal=False) - list_bytes(0)),  # and sizes these containers
            window_bytes=window_bytes() + size(big), ledger_bytes=size(big), ext_bytes=ledger_record_bytes(),
            cell_key_bytes=size(big << 20), multi_entry_bytes=size((1, 2)) + size(2), int_bytes=size(big))


def _dict_index_per_entry(n: int = 100_000) -> float:
    """DictIndex bytes per pending message: a build of ``n`` epoch-time nacks."""
    idx = DictIndex(precision_bits=0)
    t0 = 1_700_000_000_000
    for i in range(n):
        idx.add(100_000 + i // 50_000, i % 50_000, t0 + i)
    return idx.nbytes() / len(idx)
