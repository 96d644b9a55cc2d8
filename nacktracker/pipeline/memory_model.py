"""Bytes of a :class:`~nacktracker.TimeBucketIndex` from the pieces a Spark
task can build: real bitmaps, plus the Python structure around them.

``TimeBucketIndex.nbytes()`` counts, for an index holding ``n`` bitmaps over
``L`` ledgers:

* CRoaring + Python bytes of each bitmap: :func:`nacktracker.index._roaring_bytes`
  on the real, run-optimised, shrunk bitmap (the task builds them);
* one composite key int per bitmap (``bucket << 64 | ledger``) and one ledger
  int per ledger: ``sys.getsizeof`` of the same ints;
* a dict per ledger (its keys -> bitmaps), the dict of ledgers, and the set of
  keys touched since the last compaction (the newest bucket's): ``sys.getsizeof``
  of dicts/sets grown the same way, looked up in tables measured once per
  process (:func:`dict_bytes`, :func:`set_bytes`);
* the :class:`~sortedcontainers.SortedList` of keys: the one part with no
  cheap exact twin, modelled as ``base + per_bitmap * n`` with both constants
  **measured** from real ``TimeBucketIndex`` builds (:meth:`IndexCosts.measure`).

:meth:`IndexCosts.measure` also checks the whole model against ``nbytes()``
on its calibration builds and raises if they disagree by more than 2%, so a
change of the index layout cannot silently skew the plan.

DictIndex bytes per pending message are measured the same way: one in-process
build, ``nbytes() / len()``, scaled by the pending count.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import numpy as np

from ..index import DictIndex, TimeBucketIndex, _roaring_bytes

__all__ = ["IndexCosts", "dict_bytes", "set_bytes", "index_bytes_exact_parts"]

_SIZES: dict[str, list[int]] = {"literal": [], "empty": [], "set": []}


def _sizes(kind: str, k: int) -> list[int]:
    """``getsizeof`` of a container after 0..k insertions, measured by growing one.

    ``literal``: a dict that starts as ``{key: value}`` (how the index makes a
    ledger's dict); ``empty``: a dict that starts as ``{}`` (the dict of
    ledgers); ``set``: a set that starts empty. Index 0 of ``literal`` is
    unused. Grows by doubling, so the total cost is O(largest k).
    """
    table = _SIZES[kind]
    if len(table) > k:
        return table
    upto = max(k + 1, 2 * len(table), 1024)
    if kind == "literal":
        obj: dict | set = {0: None}
        table[:] = [0, sys.getsizeof(obj)]
        for i in range(1, upto - 1):
            obj[i] = None
            table.append(sys.getsizeof(obj))
    else:
        obj = {} if kind == "empty" else set()
        table[:] = [sys.getsizeof(obj)]
        put = obj.__setitem__ if kind == "empty" else (lambda i, _: obj.add(i))
        for i in range(upto - 1):
            put(i, None)
            table.append(sys.getsizeof(obj))
    return table


def dict_bytes(k: int, literal: bool = True) -> int:
    """``sys.getsizeof`` of an int-keyed dict after ``k`` insertions.

    ``literal``: the dict started as a one-item literal (a ledger's dict of
    keys) rather than ``{}`` (the dict of ledgers). Runtime: O(1) after the
    table has grown to ``k`` (O(k) once).
    """
    return _sizes("literal" if literal else "empty", k)[k]


def dict_bytes_many(ks: np.ndarray) -> int:
    """Sum of :func:`dict_bytes` over an array of key counts. Runtime: O(len)."""
    if len(ks) == 0:
        return 0
    table = np.asarray(_sizes("literal", int(ks.max())), dtype=np.int64)
    return int(table[ks].sum())


def set_bytes(k: int) -> int:
    """``sys.getsizeof`` of a set after ``k`` adds. Runtime: O(1) amortised."""
    return _sizes("set", k)[k]


def index_bytes_exact_parts(n_ledgers: int, ledger_key_counts: np.ndarray, newest_bitmaps: int) -> int:
    """The dict/set parts of ``nbytes()`` for a freshly built index."""
    return dict_bytes_many(ledger_key_counts) + dict_bytes(n_ledgers, literal=False) + set_bytes(newest_bitmaps)


@dataclass(frozen=True)
class IndexCosts:
    """Measured constants of the memory model (bytes).

    ``sorted_base``/``sorted_per_bitmap``: the SortedList of keys, fitted to
    real ``TimeBucketIndex.nbytes()``; ``dict_index_per_entry``: DictIndex
    bytes per pending message; ``max_model_error``: worst relative error of
    the full model on the calibration builds.
    """

    sorted_base: float
    sorted_per_bitmap: float
    dict_index_per_entry: float
    max_model_error: float
    empty_index: int = 0  # nbytes() of an empty TimeBucketIndex, measured

    def index_bytes(self, exact_bytes: int, n_bitmaps: int) -> int:
        """Model total: the exactly computed parts plus the SortedList estimate
        (``empty_index`` for an index with no bitmaps)."""
        if n_bitmaps == 0:
            return self.empty_index
        return exact_bytes + round(self.sorted_base + self.sorted_per_bitmap * n_bitmaps)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def measure(cls) -> "IndexCosts":
        """Build a few indexes in-process and fit the SortedList constants.

        Shapes: one ledger over many buckets, many ledgers in one bucket, and
        grids in between, with epoch-sized bucket times, 1-30,000 bitmaps.
        Cost: about 0.3 s. Raises ``RuntimeError`` if the fitted model misses
        any build by more than 2% (the index layout changed).
        """
        t0 = 1_700_000_000_000
        shapes = [(1, 1), (1, 10), (3, 40), (1, 2_000), (2_000, 1), (200, 10), (50, 100), (20, 500),
                  (1, 30_000), (300, 100)]
        rows = []
        for ledgers, buckets in shapes:
            idx = TimeBucketIndex(precision_bits=0)
            for k in range(buckets):
                for j in range(ledgers):
                    idx.add(100_000 + 7 * j, (k * 31 + j) % 50_000, t0 + k)
            idx.compact()
            exact, n = _exact_from_index(idx)
            rows.append((idx.nbytes(), exact, n))
        # least squares on relative error: small and large indexes count alike
        w = np.array([1.0 / nb for nb, _, _ in rows])
        a = np.array([[1.0, n] for _, _, n in rows]) * w[:, None]
        y = np.array([nb - ex for nb, ex, _ in rows], dtype=float) * w
        (base, per), *_ = np.linalg.lstsq(a, y, rcond=None)
        model = cls(float(base), float(per), _dict_index_per_entry(), 0.0)
        worst = max(abs(model.index_bytes(ex, n) - nb) / nb for nb, ex, n in rows)
        if worst > 0.02:
            raise RuntimeError(f"memory model misses TimeBucketIndex.nbytes() by {worst:.1%}: "
                               "the index layout changed; update nacktracker/pipeline/memory_model.py")
        return cls(float(base), float(per), model.dict_index_per_entry, float(worst),
                   TimeBucketIndex().nbytes())


def _exact_from_index(idx: TimeBucketIndex) -> tuple[int, int]:
    """The model's exact parts for an existing index (calibration only)."""
    per_ledger: dict[int, int] = {}
    total = 0
    newest, newest_n = -1, 0
    for bucket, ledger, bm in idx.iter_bitmaps():
        per_ledger[ledger] = per_ledger.get(ledger, 0) + 1
        total += _roaring_bytes(bm) + sys.getsizeof(bucket << 64 | ledger)
        if bucket > newest:
            newest, newest_n = bucket, 0
        if bucket == newest:
            newest_n += 1
    total += sum(sys.getsizeof(ledger) for ledger in per_ledger)
    ks = np.fromiter(per_ledger.values(), dtype=np.int64, count=len(per_ledger))
    total += index_bytes_exact_parts(len(per_ledger), ks, newest_n)
    return total, idx.bitmap_count()


def _dict_index_per_entry(n: int = 100_000) -> float:
    """DictIndex bytes per pending message: a build of ``n`` epoch-time nacks."""
    idx = DictIndex(precision_bits=0)
    t0 = 1_700_000_000_000
    for i in range(n):
        idx.add(100_000 + i // 50_000, i % 50_000, t0 + i)
    return idx.nbytes() / len(idx)
