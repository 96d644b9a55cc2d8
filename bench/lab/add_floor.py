"""How low a pure-Python ``TimeBucketIndex.add`` can go: stripped adds beside the real one and ``DictIndex.add``.

On the streams of ``bench.index_add`` (``sparse`` at bits 0, ``anchor`` at bits 8), side by side in one
process, the order rotating every round, CPU time of the add calls alone:

* ``entry``: the call, ``add``'s argument checks and the bucket, nothing stored;
* ``claim``: ``entry`` plus the ledger's slot (a dict) and the live bitmap's "already pending?" claim
  (``BitMap.add_checked``), what answers an ack in O(1);
* ``minimal``: ``claim`` plus a packed 8-byte copy appended to its time window's array (a dict of windows,
  segments of 256): the least an add of a new sparse id does in the index's layout; no hot cell, no dense
  cells, no rare ids, so it is not a usable index;
* ``TimeBucketIndex`` and ``DictIndex``: the real ones.

Prints ns per add (each one's best round) and the median over rounds of each over ``DictIndex`` in the same
round. Diagnostic only: no target, no results file.

    python -m bench.lab.add_floor [--rounds 7]
"""

from __future__ import annotations

import argparse
import array
import os
import statistics
import sys
from typing import Any, Callable, Optional

from pyroaring import BitMap

from bench.index_add import anchor, sparse, timed_adds
from nacktracker.index import DictIndex, TimeBucketIndex
from nacktracker.index.layout import LIVE_ENTRY_BITS, PACKED, SEGMENT, Layout
from nacktracker.precision import Precision

NARROW_ENTRY_MAX = (1 << LIVE_ENTRY_BITS) - 1


class Entry:
    """The call, the argument checks and the bucket."""

    __slots__ = ("_add", "_mask", "_by_id", "_bits", "_count", "_windows", "_wshift", "_pbits", "_omask", "_cshift")

    def __init__(self, bits: int) -> None:
        precision, lay = Precision.of(bits), Layout.for_bits(bits)
        self._add, self._mask, self._pbits = precision.add, precision.mask, bits
        self._wshift, self._omask, self._cshift = lay.window_shift, lay.offset_mask, lay.offset_shift - 32
        self._by_id: dict[int, int] = {}
        self._bits = BitMap()
        self._count = 0
        self._windows: dict[int, list[Any]] = {}

    def add(self, ledger_id: int, entry_id: int, due_ms: int) -> None:
        if (type(ledger_id) is not int or type(entry_id) is not int or type(due_ms) is not int
                or (ledger_id | entry_id) >> 63 or due_ms >> 62):
            raise TypeError("ints in range only")
        (due_ms + self._add) & self._mask


class Claim(Entry):
    """Entry, then the slot and the live bitmap's claim."""

    __slots__ = ()

    def add(self, ledger_id: int, entry_id: int, due_ms: int) -> None:
        if (type(ledger_id) is not int or type(entry_id) is not int or type(due_ms) is not int
                or (ledger_id | entry_id) >> 63 or due_ms >> 62):
            raise TypeError("ints in range only")
        (due_ms + self._add) & self._mask
        try:
            slot = self._by_id[ledger_id]
        except KeyError:
            slot = self._by_id[ledger_id] = len(self._by_id)
        if entry_id > NARROW_ENTRY_MAX:
            raise ValueError("narrow ids only")
        try:
            self._bits.add_checked(slot << LIVE_ENTRY_BITS | entry_id)
        except KeyError:
            return
        self._count += 1


class Minimal(Entry):
    """Claim, then the packed copy appended to its window's current segment."""

    __slots__ = ()

    def add(self, ledger_id: int, entry_id: int, due_ms: int) -> None:
        if (type(ledger_id) is not int or type(entry_id) is not int or type(due_ms) is not int
                or (ledger_id | entry_id) >> 63 or due_ms >> 62):
            raise TypeError("ints in range only")
        bucket = (due_ms + self._add) & self._mask
        try:
            slot = self._by_id[ledger_id]
        except KeyError:
            slot = self._by_id[ledger_id] = len(self._by_id)
        if entry_id > NARROW_ENTRY_MAX:
            raise ValueError("narrow ids only")
        try:
            self._bits.add_checked(slot << LIVE_ENTRY_BITS | entry_id)
        except KeyError:
            return
        self._count += 1
        try:
            segments = self._windows[bucket >> self._wshift]
        except KeyError:
            segments = self._windows[bucket >> self._wshift] = [array.array(PACKED)]
        packed = segments[-1]
        if len(packed) >= SEGMENT:
            packed = array.array(PACKED)
            segments.append(packed)
        off = (bucket >> self._pbits) & self._omask
        packed.append((off << self._cshift | slot) << 32 | entry_id)


def compare(stream: tuple[list[int], list[int], list[int]], bits: int, rounds: int) -> dict[str, tuple[int, float]]:
    makers: dict[str, Callable[[], Any]] = {
        "entry": lambda: Entry(bits), "claim": lambda: Claim(bits), "minimal": lambda: Minimal(bits),
        "TimeBucketIndex": lambda: TimeBucketIndex(precision_bits=bits), "DictIndex": lambda: DictIndex(precision_bits=bits)}
    names = list(makers)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timed_adds(makers[name], stream))
    n = len(stream[0])
    return {name: (round(min(t) * 1e9 / n), round(statistics.median(a / b for a, b in zip(t, times["DictIndex"])), 3))
            for name, t in times.items()}


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args(argv)
    before = os.getloadavg()[0]
    for label, stream, bits in (("sparse", sparse(), 0), ("anchor", anchor(), 8)):
        row = compare(stream, bits, a.rounds)
        print(f"{label} bits {bits}: " + ", ".join(f"{name} {ns} ns ({ratio}x)" for name, (ns, ratio) in row.items()))
    print(f"x: the median over {a.rounds} rounds of each over DictIndex in the same round; "
          f"load average {before:.2f} -> {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
