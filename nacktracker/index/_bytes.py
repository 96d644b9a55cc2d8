"""Byte accounting shared by the index and the Spark memory model: what a
Roaring bitmap, an ``array('Q')`` and a window really take on the heap."""

from __future__ import annotations

from pyroaring import BitMap, BitMap64


def _malloc(n: int) -> int:
    """Bytes glibc's malloc really takes for a request of ``n`` bytes."""
    return max(32, (n + 8 + 15) & ~15)


#: malloc bytes of an empty ``BitMap64`` (CRoaring's ``roaring64_bitmap_t`` with
#: its ART), measured by ``python bench/roaring_bytes.py`` (pyroaring 1.2.0,
#: CRoaring 5.2.2: 210 B, where the 32-bit header's 64 B were counted before).
BITMAP64_EMPTY = 210


def _roaring_bytes(bm: BitMap | BitMap64) -> int:
    """CRoaring heap bytes behind one bitmap (tracemalloc does not see them).

    From ``get_statistics()`` (container payloads) plus the C structs CRoaring
    allocates: the bitmap header, the key/container/typecode arrays and one
    struct per container, each rounded to a malloc chunk. Runtime: O(1).
    """
    s = bm.get_statistics()
    n = s["n_containers"]
    header = BITMAP64_EMPTY if type(bm) is BitMap64 else _malloc(48)  # roaring(64)_bitmap_t
    total = header + (_malloc(11 * n) if n else 0)  # + high-low arrays (64-bit: container array and ART pools)
    for count, payload in (("n_array_containers", "n_bytes_array_containers"),
                           ("n_run_containers", "n_bytes_run_containers"),
                           ("n_bitset_containers", "n_bytes_bitset_containers")):
        c = s[count]
        if c:
            total += c * _malloc(16) + c * _malloc(s[payload] // c)
    if type(bm) is BitMap64:
        total += n * 24  # ART leaf per container
    return total + type(bm).__basicsize__
