"""What the index's time order (its windows by id, in time order) costs per
index, for three ways of keeping it: a dict plus the earliest id (what the
index does), a dict plus a heap of the ids (what it did), and a
``sortedcontainers.SortedDict`` (the design card's and Java's sorted map).

Bytes are tracemalloc's (the Python heap) per structure, averaged over 1,000
of them holding ``n`` window ids each, beside a ~20-30 bytes per pending
message index that holds ~175-300 pending messages at 10 nacks/s
(bench/index_grid.py's 10/s cells).

    python -m bench.lab.time_order
"""

from __future__ import annotations

import gc
import heapq
import tracemalloc

from sortedcontainers import SortedDict

COPIES = 1_000


def per_structure(make, n: int) -> float:
    gc.collect()
    tracemalloc.start()
    kept = [make(n) for _ in range(COPIES)]
    total = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return total / COPIES


def dict_and_first(n: int) -> tuple[dict[int, None], int]:
    d = dict.fromkeys(range(100_000, 100_000 + n))
    return d, min(d)


def dict_and_heap(n: int) -> tuple[dict[int, None], list[int]]:
    d: dict[int, None] = {}
    h: list[int] = []
    for w in range(100_000 + n - 1, 99_999, -1):
        d[w] = None
        heapq.heappush(h, w)
    return d, h


def sorted_dict(n: int) -> SortedDict:
    return SortedDict(dict.fromkeys(range(100_000, 100_000 + n)))


def main() -> int:
    print("| windows | dict + earliest id | dict + heap of ids | SortedDict |")
    print("|---|---|---|---|")
    for n in (1, 4, 8, 64):
        row = [per_structure(f, n) for f in (dict_and_first, dict_and_heap, sorted_dict)]
        print(f"| {n} | " + " | ".join(f"{b:,.0f} B" for b in row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
