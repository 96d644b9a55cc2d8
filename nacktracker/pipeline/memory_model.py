"""Bytes of a live :class:`~nacktracker.TimeBucketIndex` from the pending nacks
at one instant, as a Spark task can compute them (numpy + real bitmaps).

The index's layout (``nacktracker/index/_parts.py``) and what ``nbytes()``
counts for it, piece by piece:

* per window of ``2^max(bits, 14)`` ms holding pending nacks: the window
  object, its id, its slot in the windows dict and heap, and one
  ``array('Q')`` with 8 bytes per *sparse* copy (grown by appends:
  :func:`array_bytes`);
* *dense* cells: a ``(bucket, ledger)`` cell turns into a Roaring bitmap when
  a run of :data:`PROMOTE` adds in a row (arrival order, other cells' adds
  break a run) reaches it; the run's copies and every later add to that cell
  go there. Wide ids (>= 2^32) are always dense. Each dense cell costs its
  bitmap (built for real here: compacted, except the cell the last add went
  to, which a live tracker leaves filling), a dict slot, a key and a heap slot;
* the earliest bucket: the timer's ``next_due_ms()`` has gathered all its
  copies into dense cells (not compacted: they fire next);
* the index-wide live bitmap (``slot << 32 | entry`` of every live id, a
  ``BitMap64``, built for real) and one small record per ledger;
* the ids pending in two buckets (``_multi`` and per-ledger sets);
* the fixed part of an empty index.

:meth:`IndexCosts.measure` checks the model against ``nbytes()`` of indexes
built *live* (adds and pops in time order) at bits 0, 8, 12 and 15 and
raises if it misses one by more than 10%, so a layout change cannot silently
skew the plan. DictIndex bytes per pending message are measured the same
way: one in-process build, ``nbytes() / len()``, scaled by the pending count.
"""

from __future__ import annotations

import array
import sys
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np
from pyroaring import BitMap, BitMap64

from ..index import DictIndex, TimeBucketIndex, _roaring_bytes
from ..index._parts import PROMOTE, Layout, Ledger, Window

__all__ = ["IndexCosts", "IndexState", "index_state", "array_bytes", "dict_bytes", "dict_bytes_many",
           "set_bytes", "list_bytes"]

_SIZES: dict[str, list[int]] = {"literal": [], "empty": [], "set": [], "list": []}


def _sizes(kind: str, k: int) -> list[int]:
    """``getsizeof`` of a container after 0..k insertions, measured by growing one.

    ``literal``: a dict that starts as ``{key: value}``; ``empty``: a dict
    that starts as ``{}``; ``set``: a set that starts empty; ``list``: a list
    grown by appends. Grows by doubling, so the total cost is O(largest k).
    """
    table = _SIZES[kind]
    if len(table) > k:
        return table
    upto = max(k + 1, 2 * len(table), 1024)
    if kind == "literal":
        obj: dict | set | list = {0: None}
        table[:] = [0, sys.getsizeof(obj)]
        for i in range(1, upto - 1):
            obj[i] = None
            table.append(sys.getsizeof(obj))
    else:
        obj = {"empty": {}, "set": set(), "list": []}[kind]
        table[:] = [sys.getsizeof(obj)]
        put = {"empty": lambda i: obj.__setitem__(i, None), "set": lambda i: obj.add(i),
               "list": lambda i: obj.append(i)}[kind]
        for i in range(upto - 1):
            put(i)
            table.append(sys.getsizeof(obj))
    return table


def dict_bytes(k: int, literal: bool = True) -> int:
    """``sys.getsizeof`` of an int-keyed dict after ``k`` insertions. Runtime: O(1) amortised."""
    return _sizes("literal" if literal else "empty", k)[k]


def dict_bytes_many(ks: np.ndarray, literal: bool = True) -> int:
    """Sum of :func:`dict_bytes` over an array of key counts. Runtime: O(len)."""
    if len(ks) == 0:
        return 0
    table = np.asarray(_sizes("literal" if literal else "empty", int(ks.max())), dtype=np.int64)
    return int(table[ks].sum())


def set_bytes(k: int) -> int:
    """``sys.getsizeof`` of a set after ``k`` adds. Runtime: O(1) amortised."""
    return _sizes("set", k)[k]


def list_bytes(k: int) -> int:
    """``sys.getsizeof`` of a list after ``k`` appends. Runtime: O(1) amortised."""
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
    """``sys.getsizeof`` of an ``array('Q')`` after ``n`` appends, for an
    array of counts. Runtime: O(len log) numpy."""
    n = np.asarray(n, dtype=np.int64)
    caps = _array_caps(int(n.max()) if len(n) else 0)
    return _ARRAY_EMPTY + 8 * caps[np.searchsorted(caps, n)]


class IndexState(NamedTuple):
    """What the model says a live index holds."""

    index_bytes: int
    roaring_bytes: int  # the live bitmap and the dense cells
    buckets: int
    bitmaps: int  # (bucket, ledger) cells, sparse or dense
    ledgers: int


def _cells_in_arrival_order(ledger: np.ndarray, bucket: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Which occurrences sit in a dense cell (see the module docstring)."""
    n = len(ledger)
    if n == 0:
        return np.zeros(0, dtype=bool)
    order = np.argsort(start, kind="stable")
    _, code = np.unique(np.stack((bucket, ledger), axis=1), axis=0, return_inverse=True)
    code = code.reshape(-1)[order]
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = code[1:] != code[:-1]
    run_start = np.flatnonzero(new_run)
    run_len = np.diff(np.append(run_start, n))
    promoting = run_len >= PROMOTE
    first = np.full(code.max() + 1, n, dtype=np.int64)  # position where each cell turns dense
    np.minimum.at(first, code[run_start[promoting]], run_start[promoting])
    dense_sorted = np.arange(n) >= first[code]
    dense = np.empty(n, dtype=bool)
    dense[order] = dense_sorted
    return dense


def _bitmap(ids: np.ndarray, compact: bool) -> BitMap | BitMap64:
    if int(ids.max()) >> 32:
        bm: BitMap | BitMap64 = BitMap64(array.array("Q", ids.astype(np.uint64).tobytes()))
    else:
        bm = BitMap()
        bm.update(array.array("I", ids.astype(np.uint32).tobytes()))
    if compact:
        bm.run_optimize()
        bm.shrink_to_fit()
    return bm


def index_state(ledger: np.ndarray, entry: np.ndarray, bucket: np.ndarray, start: np.ndarray,
                pending: np.ndarray, bits: int, costs: "IndexCosts") -> IndexState:
    """Bytes of a live index at one instant.

    Arrays: every occurrence that was ever pending up to that instant (in any
    order), its first nack time ``start`` (arrival order decides dense cells)
    and whether it is ``pending`` at the instant. Runtime: O(n log n) numpy,
    plus building the live bitmap and the dense cells' bitmaps (C).
    """
    ledger, entry, bucket, start = (np.asarray(a, dtype=np.int64) for a in (ledger, entry, bucket, start))
    dense = _cells_in_arrival_order(ledger, bucket, start) | (entry >> 32 > 0)
    p = np.asarray(pending, dtype=bool)
    ledger, entry, bucket, start, dense = ledger[p], entry[p], bucket[p], start[p], dense[p]
    if len(ledger) == 0:
        return IndexState(costs.empty_index, 0, 0, 0, 0)
    front = bucket == bucket.min()
    dense |= front  # the timer's next_due_ms() gathers the earliest bucket into cells
    lay = Layout.for_bits(bits)
    total = costs.index_fixed
    # ledgers: a record each, slots by first arrival, one live BitMap64 of slot << 32 | entry
    ledgers, first_seen, slot_of = np.unique(ledger, return_index=True, return_inverse=True)
    slot_of = np.argsort(np.argsort(first_seen))[slot_of.reshape(-1)]
    n_led = len(ledgers)
    total += n_led * costs.ledger_bytes + dict_bytes(n_led, literal=False) + list_bytes(n_led)
    narrow = entry >> 32 == 0
    keys = np.unique((slot_of[narrow].astype(np.uint64) << np.uint64(32)) | entry[narrow].astype(np.uint64))
    live = BitMap64(array.array("Q", keys.tobytes()))
    live.run_optimize()
    live.shrink_to_fit()
    roaring = _roaring_bytes(live)
    for lg in np.unique(ledger[~narrow]).tolist():  # wide ids: a BitMap64 per ledger
        roaring += _roaring_bytes(_bitmap(np.unique(entry[~narrow & (ledger == lg)]), True))
    # ids pending in two or more buckets
    pair = np.stack((ledger, entry), axis=1)
    uniq_pairs, counts = np.unique(pair, axis=0, return_counts=True)
    multi = counts > 1
    if multi.any():
        m = int(multi.sum())
        total += dict_bytes(m, literal=False) + m * costs.multi_entry_bytes
        per_ledger = np.unique(uniq_pairs[multi, 0], return_counts=True)[1]
        total += sum(set_bytes(int(k)) + int(k) * costs.int_bytes for k in per_ledger)
    # windows: object, id, dict and heap slots, and an array of the sparse copies
    wid = bucket >> lay.window_shift
    wids, w_inv = np.unique(wid, return_inverse=True)
    w_inv = w_inv.reshape(-1)
    sparse_per_window = np.bincount(w_inv[~dense], minlength=len(wids))
    total += len(wids) * costs.window_bytes + dict_bytes(len(wids), literal=False) + list_bytes(len(wids))
    total += int(array_bytes(sparse_per_window).sum())
    # dense cells: a bitmap each (the last add's cell still filling), plus dict/heap/key per window
    cell_keys = np.stack((bucket, ledger), axis=1)
    if dense.any():
        dk = cell_keys[dense]
        order = np.lexsort((entry[dense], dk[:, 1], dk[:, 0]))
        dk, de = dk[order], entry[dense][order]
        cut = np.flatnonzero((dk[1:] != dk[:-1]).any(axis=1)) + 1
        last = start[dense].argmax()
        hot, first = tuple(cell_keys[dense][last]), int(bucket.min())
        for lo, hi in zip([0, *cut.tolist()], [*cut.tolist(), len(dk)]):
            filling = tuple(dk[lo]) == hot or int(dk[lo][0]) == first  # not compacted yet
            roaring += _roaring_bytes(_bitmap(np.unique(de[lo:hi]), not filling))
        cells_per_window = np.bincount(w_inv[dense][order][np.r_[0, cut]], minlength=len(wids))
        has = cells_per_window > 0
        total += int(dict_bytes_many(cells_per_window[has], literal=False))
        total += sum(list_bytes(int(c)) for c in cells_per_window[has])
        total += int(cells_per_window.sum()) * costs.cell_key_bytes
    total += roaring
    cells = len(np.unique(cell_keys, axis=0))
    return IndexState(int(total), int(roaring), len(np.unique(bucket)), cells, n_led)


@dataclass(frozen=True)
class IndexCosts:
    """Constants of the memory model (bytes), each measured with ``sys.getsizeof``
    on the real objects, and the model's worst error on live calibration builds."""

    dict_index_per_entry: float
    max_model_error: float
    empty_index: int           # nbytes() of an empty TimeBucketIndex
    index_fixed: int           # the same without its empty live bitmap (the model builds that)
    window_bytes: int          # a Window object and its id
    ledger_bytes: int          # a Ledger record and its three ints
    cell_key_bytes: int        # the int key of a dense cell
    multi_entry_bytes: int     # a (slot, entry) tuple and its count
    int_bytes: int             # one int in a per-ledger set

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def constants(cls) -> "IndexCosts":
        """The measured constants, without the calibration check. Runtime: ~0.1 s."""
        size = sys.getsizeof
        empty = TimeBucketIndex(precision_bits=0)
        big = 1_000_003 << 20
        return cls(
            dict_index_per_entry=_dict_index_per_entry(), max_model_error=0.0, empty_index=empty.nbytes(),
            index_fixed=(empty.nbytes() - _roaring_bytes(BitMap64())  # the model builds the live bitmap,
                         - 2 * dict_bytes(0, literal=False) - 2 * list_bytes(0)),  # and sizes these containers
            window_bytes=size(Window()) + size(big), ledger_bytes=size(Ledger(big, 1_000)) + 3 * size(big),
            cell_key_bytes=size(big << 20), multi_entry_bytes=size((1, 2)) + 2 * size(big), int_bytes=size(big))

    @classmethod
    def measure(cls) -> "IndexCosts":
        """:meth:`constants`, then the model against ``nbytes()`` of indexes
        built live (adds and pops in time order) at bits 0, 8, 12 and 15.

        Cost: about 1-2 s. Raises ``RuntimeError`` if the model misses any
        build by more than 10% (the index layout changed).
        """
        base = cls.constants()
        worst = 0.0
        for bits in (0, 8, 12, 15):
            model, real = calibration_build(bits, base)
            worst = max(worst, abs(model - real) / real)
        if worst > 0.10:
            raise RuntimeError(f"memory model misses TimeBucketIndex.nbytes() by {worst:.1%}: "
                               "the index layout changed; update nacktracker/pipeline/memory_model.py")
        return cls(**{**base.as_dict(), "max_model_error": float(worst)})


def synthetic_nacks(n: int = 40_000, rate: int = 1_000, ledgers: int = 16, k: int = 3, seed: int = 5):
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


def calibration_build(bits: int, costs: IndexCosts, nacks=None) -> tuple[int, int]:
    """``(model bytes, nbytes())`` for a live build from ``nacks`` (default
    :func:`synthetic_nacks`) stopped at its peak pending instant."""
    from .pending import analyse_consumer

    ledger, entry, ts, due = synthetic_nacks() if nacks is None else nacks
    (r,) = analyse_consumer(ledger, entry, ts, due, [bits], costs)
    idx = live_replay(ledger, entry, ts, due, bits, stop_at=r.peak_at_ms)
    return r.index_bytes, idx.nbytes()


def live_replay(ledger, entry, ts, due, bits: int, stop_at=None, rounding: str = "floor") -> TimeBucketIndex:
    """A TimeBucketIndex fed the nacks in time order, popping due buckets as a
    tracker's timer would, up to and including instant ``stop_at``."""
    idx = TimeBucketIndex(precision_bits=bits, rounding=rounding)
    order = np.argsort(ts, kind="stable")
    for i in order.tolist():
        t = int(ts[i])
        if stop_at is not None and t > stop_at:
            break
        idx.pop_due(t)
        idx.add(int(ledger[i]), int(entry[i]), int(due[i]))
        idx.pop_due(t)  # a bucket already in the past fires at once
    return idx


def _dict_index_per_entry(n: int = 100_000) -> float:
    """DictIndex bytes per pending message: a build of ``n`` epoch-time nacks."""
    idx = DictIndex(precision_bits=0)
    t0 = 1_700_000_000_000
    for i in range(n):
        idx.add(100_000 + i // 50_000, i % 50_000, t0 + i)
    return idx.nbytes() / len(idx)
