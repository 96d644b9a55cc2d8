"""``TimeBucketIndex.add`` against ``DictIndex.add``, side by side in one process.

Two streams of 100,000 adds into a fresh index each round, the two indexes alternating (the order
flipped every round), CPU time of the add calls alone (the ids are built before):

* ``sparse``: interleaved sparse traffic: 16 ledgers round robin, each nacked message 1-20 entries
  after the previous nacked one of its ledger, a delay uniform in 1-60 s each;
* ``anchor``: the Java measurement's workload (``bench.java_anchor``): 4 ledgers round robin,
  consecutive ids, delays uniform in 1-60 s, at bits 8.

Prints ns per add of each (its best round) and the median over rounds of the index's time over
the dict's in the same round.

    python -m bench.index_add [--rounds 7] [--bits 0] [--adds 100000] [--json]

``--adds``: the adds of each stream (the targets are read at 100,000; larger streams show how each
index's add cost grows with the pending set).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from typing import Any, Callable, Optional

from nacktracker.index import DictIndex, TimeBucketIndex

N = 100_000


def sparse(n: int = N, ledgers: int = 16, seed: int = 3) -> tuple[list[int], list[int], list[int]]:
    rng = random.Random(seed)
    nxt = [0] * ledgers
    lids, entries, dues = [], [], []
    for i in range(n):
        lane = i % ledgers
        nxt[lane] += rng.randint(1, 20)
        lids.append(1_000 + lane)
        entries.append(nxt[lane])
        dues.append(1_000_000 + rng.randint(1_000, 60_000))
    return lids, entries, dues


def anchor(n: int = N, seed: int = 1) -> tuple[list[int], list[int], list[int]]:
    rng = random.Random(seed)
    return [i % 4 for i in range(n)], [i // 4 for i in range(n)], [1_000_000 + rng.randint(1_000, 60_000) for _ in range(n)]


def timed_adds(make: Callable[[], Any], stream: tuple[list[int], list[int], list[int]]) -> float:
    """CPU seconds of the add calls of ``stream`` into a fresh ``make()`` (the garbage collector off)."""
    idx = make()
    add = idx.add
    gc.collect()
    gc.disable()
    try:
        t = time.process_time()
        for ledger, entry, due in zip(*stream):
            add(ledger, entry, due)
        return time.process_time() - t
    finally:
        gc.enable()


def compare(stream: tuple[list[int], list[int], list[int]], bits: int, rounds: int) -> dict[str, Any]:
    tb: list[float] = []
    dt: list[float] = []
    for r in range(rounds):
        pair = [(tb, lambda: TimeBucketIndex(precision_bits=bits)), (dt, lambda: DictIndex(precision_bits=bits))]
        for out, make in (pair if r % 2 == 0 else pair[::-1]):
            out.append(timed_adds(make, stream))
    n = len(stream[0])
    return {"bits": bits, "adds": n, "rounds": rounds, "index_ns": round(min(tb) * 1e9 / n), "dict_ns": round(min(dt) * 1e9 / n),
            "ratio_median": round(statistics.median(a / b for a, b in zip(tb, dt)), 3),
            "ratio_worst": round(max(a / b for a, b in zip(tb, dt)), 3)}


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--bits", type=int, default=0, help="precision of the sparse stream (the anchor runs at 8)")
    p.add_argument("--adds", type=int, default=N, help="adds per stream")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    before = os.getloadavg()
    out = {"sparse": compare(sparse(a.adds), a.bits, a.rounds), "anchor": compare(anchor(a.adds), 8, a.rounds),
           "loadavg_before": [round(v, 2) for v in before], "loadavg_after": [round(v, 2) for v in os.getloadavg()]}
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    for name in ("sparse", "anchor"):
        r = out[name]
        print(f"{name:7} bits {r['bits']:2}: TimeBucketIndex {r['index_ns']} ns, DictIndex {r['dict_ns']} ns per add; "
              f"ratio median {r['ratio_median']} (worst {r['ratio_worst']}) over {r['rounds']} rounds")
    print(f"load average {out['loadavg_before'][0]} -> {out['loadavg_after'][0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
