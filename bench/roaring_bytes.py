"""What a Roaring bitmap really takes from malloc, beside what ``nbytes()``
counts for it (``nacktracker.index.layout.roaring_bytes``), one structure
at a time: ``n`` copies built in this process, glibc's ``mallinfo2()`` in-use
bytes before and after, per copy (CRoaring allocates with malloc; the
pyroaring object itself is a small Python object, counted apart).

    python -m bench.roaring_bytes

Linux/glibc only (``mallinfo2``). The constant ``BITMAP64_EMPTY`` in
``layout.py`` is the first row's measured figure. Two rows build the index's
live bitmap as the index does (one add at a time: containers grow by
doubling), keyed both ways (``_parts.LIVE_ENTRY_BITS``), and one as it is
after a compaction (``refit``); a last line gives
the Python heap of an empty ``TimeBucketIndex`` (tracemalloc).
"""

from __future__ import annotations

import ctypes
import gc
import tracemalloc

from pyroaring import BitMap, BitMap64

from nacktracker import TimeBucketIndex
from nacktracker.index.layout import held, roaring_bytes


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _MallInfo2


def mallinfo() -> _MallInfo2:
    """glibc's ``mallinfo2()``: the C heap's bytes in use and free."""
    return _libc.mallinfo2()


def malloc_in_use() -> int:
    info = mallinfo()
    return info.uordblks + info.hblkhd


def measure(make, copies: int = 200, grown: bool = False, refit: bool = False) -> tuple[float, int]:
    """(malloc bytes per copy, what roaring_bytes counts for its C part);
    ``grown``/``refit``: counted as the index counts its live bitmap (built
    by adds; shrunk to fit since)."""
    gc.collect()
    before = malloc_in_use()
    objs = [make() for _ in range(copies)]
    real = (malloc_in_use() - before) / copies
    return real, roaring_bytes(objs[0], grown=grown, refit=refit) - held(type(objs[0]).__basicsize__)


def by_adds(cls, shift: int, slots: int = 16, ids: int = 11):
    """A live bitmap as the index grows it: ``slot << shift | entry``, one add at a time."""
    def make():
        bm = cls()
        for e in range(ids):
            for s in range(slots):
                bm.add(s << shift | e * 3)
        return bm
    return make


def refit_then_adds(slots: int = 16, ids: int = 1_000, more: int = 30):
    """A live bitmap the index has compacted: built by adds, shrunk to fit
    (``_compact_live``), then ``more`` adds per slot (each container grows
    once from its size at the shrink)."""
    def make():
        bm = by_adds(BitMap, 22, slots, ids)()
        bm.shrink_to_fit()
        for e in range(ids, ids + more):
            for s in range(slots):
                bm.add(s << 22 | e * 3)
        return bm
    return make


def empty_index_python_bytes(copies: int = 1000) -> float:
    """Python heap per empty TimeBucketIndex (precision 0), tracemalloc."""
    TimeBucketIndex(precision_bits=0)  # one-time costs (caches) first
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    keep = [TimeBucketIndex(precision_bits=0) for _ in range(copies)]
    grown = sum(d.size_diff for d in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    del keep
    return grown / copies


STRUCTURES = [
    ("BitMap64 empty", BitMap64),
    ("BitMap64, 1 id", lambda: BitMap64([5])),
    ("BitMap64, 16 containers (16 ledger slots x 11 ids)", lambda: BitMap64([s << 32 | e * 3 for s in range(16) for e in range(11)])),
    ("BitMap64, 256 containers", lambda: BitMap64([c << 16 for c in range(256)])),
    ("BitMap64, 1 container x 176 ids", lambda: BitMap64([e * 3 for e in range(176)])),
    ("BitMap, 1 id", lambda: BitMap([5])),
    ("BitMap, 40 ids", lambda: BitMap(range(0, 120, 3))),
    ("BitMap, run of 1000", lambda: BitMap(range(1000))),
    ("BitMap, 3 containers", lambda: BitMap([0, 70_000, 140_000])),
    ("live bitmap by adds, BitMap64 keyed (slot << 32) + entry, 16 slots x 11 ids", by_adds(BitMap64, 32)),
    ("live bitmap by adds, BitMap keyed (slot << 22) + entry, 16 slots x 11 ids", by_adds(BitMap, 22)),
    ("live bitmap by adds, BitMap keyed (slot << 22) + entry, 16 slots x 1,000 ids", by_adds(BitMap, 22, 16, 1_000)),
    ("live bitmap refit: the row above shrunk to fit, then 30 adds per slot", refit_then_adds()),
    ("live bitmap refit: 16 slots x 700 ids by adds, shrunk to fit, then 30 adds per slot", refit_then_adds(ids=700)),
]


def main() -> None:
    print("| structure | malloc B per copy | counted B | counted / malloc |")
    print("|---|---|---|---|")
    for name, make in STRUCTURES:
        real, counted = measure(make, grown=name.startswith("live bitmap"), refit=name.startswith("live bitmap refit"))
        print(f"| {name} | {real:.0f} | {counted} | {counted / real:.2f} |")
    print(f"\nAn empty TimeBucketIndex: {empty_index_python_bytes():.0f} B of Python heap (tracemalloc)")


if __name__ == "__main__":
    main()
