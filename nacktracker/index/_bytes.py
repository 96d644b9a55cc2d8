"""Byte accounting shared by the index and the Spark memory model: what a
Roaring bitmap, an ``array('Q')``, a window and a Python object really take
on the heap (allocator rounding and growth slack included)."""

from __future__ import annotations

import array
import bisect
import sys

from pyroaring import BitMap, BitMap64


def _malloc(n: int) -> int:
    """Bytes glibc's malloc really takes for a request of ``n`` bytes."""
    return max(32, (n + 8 + 15) & ~15)


def held(n: int) -> int:
    """Bytes one allocation of ``n`` bytes by CPython really takes: pymalloc's
    16-byte size classes up to 512 bytes, a malloc chunk above."""
    return (n + 15) & ~15 if n <= 512 else _malloc(n)


#: ``sys.getsizeof`` of the empty object of each container type whose items
#: live in a second allocation (a list's item array, a dict's keys table, a
#: set's table past its 8 inline slots, an array's buffer).
_BASE = {list: sys.getsizeof([]), dict: sys.getsizeof({}), set: sys.getsizeof(set()),
         array.array: sys.getsizeof(array.array("Q"))}


def held_size(obj: object) -> int:
    """``sys.getsizeof(obj)`` as allocated: the object and, for a container,
    its item storage, each rounded as :func:`held` says. Runtime: O(1)."""
    n = sys.getsizeof(obj)
    base = _BASE.get(type(obj))
    if base is not None and n > base:
        return held(base) + held(n - base)
    return held(n)


#: malloc bytes of an empty ``BitMap64`` (CRoaring's ``roaring64_bitmap_t`` with
#: its ART), measured by ``python bench/roaring_bytes.py`` (pyroaring 1.2.0,
#: CRoaring 5.2.2: 210 B, where the 32-bit header's 64 B were counted before).
BITMAP64_EMPTY = 210


def _growth(first: int, step, top: int) -> list[int]:
    caps = [first]
    while caps[-1] < top:
        caps.append(min(top, step(caps[-1])))
    return caps


#: Capacities of an array container grown by adds (CRoaring's
#: ``array_container_grow``: 16, then x2 below 64, x1.5 below 1,024, x1.25, at
#: most 4,096).
ARRAY_CAPS = _growth(16, lambda c: c * 2 if c < 64 else c * 3 // 2 if c < 1024 else c * 5 // 4, 4096)
#: Slots of the container arrays of a bitmap grown one container at a time
#: (CRoaring's ``extend_array``: twice the size needed below 1,024, then 1.25x).
SLOT_CAPS = _growth(2, lambda c: 2 * (c + 1) if c < 1024 else 5 * (c + 1) // 4, 1 << 16)


def _regrown(card: int) -> int:
    """Capacity of an array container that was shrunk to fit at about
    ``card`` ids and has had adds since: CRoaring's ``grow_capacity`` of its
    size then (x2 below 64, x1.5 below 1,024, x1.25; at most 4,096)."""
    return min(4096, card * 2 if card < 64 else card * 3 // 2 if card < 1024 else card * 5 // 4)


def _roaring_bytes(bm: BitMap | BitMap64, grown: bool = False, refit: bool = False) -> int:
    """CRoaring heap bytes behind one bitmap (tracemalloc does not see them).

    From ``get_statistics()`` (container payloads) plus the C structs CRoaring
    allocates: the bitmap header, the key/container/typecode arrays and one
    struct per container, each rounded to a malloc chunk. ``grown``: the
    bitmap was built by adds and only shrunk now and then (the index's live
    bitmap), so its array containers and container arrays have the capacity
    CRoaring grows them to (the average container's), not their size
    (``python bench/roaring_bytes.py``, "live bitmap by adds" rows: counted
    against malloc). ``refit`` (with ``grown``): it has been shrunk to fit
    since (the index's live bitmap after its first compaction), so each array
    container has grown from its size at the shrink, by one step of
    CRoaring's growth, not along the steps from 16 (``python
    bench/heap_breakdown.py``, backoff k=3 L=16 1000/s bits 10: the live
    bitmaps freed 2.59 B/pending, counted so 2.56; ``bench/roaring_bytes.py``,
    "refit" rows). Runtime: O(1).
    """
    s = bm.get_statistics()
    n = s["n_containers"]
    header = BITMAP64_EMPTY if type(bm) is BitMap64 else _malloc(48)  # roaring(64)_bitmap_t
    slots = SLOT_CAPS[bisect.bisect_left(SLOT_CAPS, n)] if grown else n
    total = header + (_malloc(11 * slots) if n else 0)  # + high-low arrays (64-bit: container array and ART pools)
    for count, payload in (("n_array_containers", "n_bytes_array_containers"),
                           ("n_run_containers", "n_bytes_run_containers"),
                           ("n_bitset_containers", "n_bytes_bitset_containers")):
        c = s[count]
        if c:
            each = s[payload] // c
            if grown and count == "n_array_containers":
                card = each // 2
                each = 2 * (_regrown(card) if refit else ARRAY_CAPS[bisect.bisect_left(ARRAY_CAPS, card)])
            total += c * _malloc(16) + c * _malloc(each)
    if type(bm) is BitMap64:
        total += n * 24  # ART leaf per container
    return total + held(type(bm).__basicsize__)
