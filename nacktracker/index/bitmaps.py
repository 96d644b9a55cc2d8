"""Roaring bitmaps and uint64 arrays as the index builds and reads them:
conversions in C without a Python object per id, and the few set
operations that must work across 32- and 64-bit bitmaps (pyroaring refuses
to mix them). The planner's memory model builds its bitmaps with these too."""

from __future__ import annotations

import array
import mmap

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap, BitMap64

from .._checks import U32
from .layout import Cell, U64Array

__all__ = ["has", "common", "overlaps", "distinct", "u32_array", "u64_array", "bitmap_of", "merge_into", "sort_across"]

#: A sort across segments of at least this many bytes uses a scratch array in
#: its own memory map, given back to the system when done: from the C heap it
#: would leave a hole of a window's size that later segments split up.
SCRATCH_MAP = 1 << 16


def sort_across(parts: list[U64Array]) -> None:
    """Sort the values of several uint64 arrays as one sequence, in place:
    into one scratch array, sorted in C, written back (each part keeps its
    length). numpy's default sort: its stable one (timsort) takes a scratch
    buffer of its own on every call. Runtime: O(n log n) in C."""
    if len(parts) == 1:
        parts[0].sort()
        return
    n = sum(map(len, parts))
    if not n:
        return
    buf = mmap.mmap(-1, 8 * n) if 8 * n >= SCRATCH_MAP else None
    scratch = np.frombuffer(buf, dtype=np.uint64) if buf is not None else np.empty(n, dtype=np.uint64)
    np.concatenate(parts, out=scratch)
    scratch.sort()
    at = 0
    for part in parts:
        part[:] = scratch[at:at + len(part)]
        at += len(part)
    # No buf.close(): a profiler or debugger that read this frame's f_locals keeps a view of
    # the map in that dict (Python 3.11), and close() would raise BufferError halfway through a
    # pop. The map is unmapped when its last view goes, at the latest with this frame.


def has(bm: Cell, entry_id: int) -> bool:
    """``entry_id in bm``; a 32-bit bitmap cannot hold ids >= 2^32 (and raises)."""
    return (entry_id < U32 or type(bm) is BitMap64) and entry_id in bm


def common(bm: Cell, ids: set[int]) -> list[int]:
    """Ids in both, iterating the smaller side. Runtime: O(min(len))."""
    if len(ids) <= len(bm):
        return [e for e in ids if has(bm, e)]
    return [e for e in bm if e in ids]


def overlaps(a: Cell, b: Cell) -> bool:
    """Whether two bitmaps share an id, widening one when only one is 64-bit
    (pyroaring refuses to mix them). Runtime: O(containers) in C."""
    return BitMap64(a).intersect(BitMap64(b)) if type(a) is not type(b) else a.intersect(b)  # type: ignore[arg-type]


def distinct(values: npt.NDArray[np.integer]) -> npt.NDArray[np.integer]:
    """The sorted distinct values of a 1-d array: ``np.unique`` without its
    first-call import of ``numpy.ma`` (over 1 MB of RSS that a process using
    the index never needs), and without numpy 2's hashing first, which took
    ~50x longer than this sort on half a million distinct keys (the planner's
    fire keys at 1 ms buckets). Runtime: O(n log n) in C."""
    if len(values) < 2:
        return values.copy()
    s = np.sort(values)
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def u32_array(values: npt.NDArray[np.integer]) -> array.array[int]:
    """The low 32 bits of integer values as ``array('I')`` (what a bitmap's
    ``update`` takes in one C call), copied once more than needed at most
    (``tobytes`` would add a copy). Runtime: O(n) in C."""
    out = array.array("I")
    out.frombytes(values.astype(np.uint32, copy=False).view(np.uint8))  # type: ignore[arg-type]  # numpy arrays are buffers
    return out


def u64_array(values: npt.NDArray[np.integer]) -> array.array[int]:
    """Integer values as ``array('Q')`` (what a ``BitMap64`` takes in one
    C call); see :func:`u32_array`. Runtime: O(n) in C."""
    out = array.array("Q")
    out.frombytes(values.astype(np.uint64, copy=False).view(np.uint8))  # type: ignore[arg-type]  # numpy arrays are buffers
    return out


def bitmap_of(ids: npt.NDArray[np.integer]) -> Cell:
    """A bitmap of entry ids, 32-bit when they all fit. Runtime: O(k) in C."""
    if len(ids) and int(ids.max()) >> 32:
        return BitMap64(u64_array(ids))
    out = BitMap()
    out.update(u32_array(ids))
    return out


def merge_into(cell: Cell, other: Cell) -> Cell:
    """``cell |= other``, widening ``cell`` to 64 bits when needed; returns the cell."""
    if type(cell) is BitMap and type(other) is BitMap:
        cell |= other
        return cell
    if type(cell) is BitMap64 and type(other) is BitMap64:
        cell |= other
        return cell
    wide = BitMap64(cell) if type(cell) is BitMap else cell
    assert isinstance(wide, BitMap64)
    wide |= BitMap64(other)
    return wide
