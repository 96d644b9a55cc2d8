"""Seed 000's memory experiment, run by the Spark ``nacktracker sweep`` (and by
``bench/memory.py``, which prints its own table): the workloads, the
measurement of one configuration, the seed's analytic estimate and Java's
published figures.

Workloads (seed 000, "Experimental verification"):

* ``sequential``: entry ids 0..E-1 of a ledger, then the next ledger; the due
  time advances 1 ms every ``x`` messages (``x`` nacks per ms);
* ``random``: the consumer nacks ``share`` of the entries at random (each
  ledger's nacked ids drawn without replacement); the due time advances 1 ms
  every ``x`` nacks, so bytes/message is per tracked nack, as in the seed.
"""

from __future__ import annotations

import gc
import os
import random
import time
from typing import Any, Iterator

__all__ = ["JAVA_MB", "JAVA_HEAP_MB", "seed_estimate", "workload", "rss_bytes", "measure"]

#: Java's measured figures for 10M messages, seed 000 (MB).
JAVA_MB = {(1, 10): 25.0, (4, 10): 20.48, (8, 10): 11.0, (8, 15): 2.25}
#: The broker's heap of (time, ledger, entry) triples for the same 10M, seed 000 (MB).
JAVA_HEAP_MB = 240.0


def seed_estimate(x: int, y: int, entries_per_ledger: int = 50_000) -> float:
    """Seed 000's analytic bytes/message for M = x * 2^y messages per bucket."""
    m = x * (1 << y)
    if m < 4096:
        return 2.0
    if m < entries_per_ledger:
        return 8192 / m
    return 8192 / entries_per_ledger


def workload(kind: str, messages: int, x: int, entries_per_ledger: int = 50_000, share: float = 0.1,
             seed: int = 1) -> Iterator[tuple[int, int, int]]:
    """Yield ``(ledger_id, entry_id, due_ms)`` in arrival order."""
    t0 = 1_000_000
    if kind == "sequential":
        for i in range(messages):
            yield 10_000 + i // entries_per_ledger, i % entries_per_ledger, t0 + i // x
        return
    rng = random.Random(seed)
    per_ledger = max(1, int(entries_per_ledger * share))
    i, ledger = 0, 10_000
    while i < messages:
        for entry in sorted(rng.sample(range(entries_per_ledger), per_ledger)):
            if i == messages:
                return
            yield ledger, entry, t0 + i // x
            i += 1
        ledger += 1


def rss_bytes() -> int:
    """This process's resident set (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(index: str, kind: str, messages: int, x: int, y: int,
            entries_per_ledger: int = 50_000, share: float = 0.1) -> dict[str, Any]:
    """Build one index in this process and measure it: ``nbytes()`` and RSS
    growth, per message. Run it in a fresh interpreter for honest RSS."""
    import nacktracker

    cls = getattr(nacktracker, index)
    gc.collect()
    before = rss_bytes()
    idx = cls(precision_bits=y)
    add = idx.add
    started = time.perf_counter()
    for ledger, entry, due in workload(kind, messages, x, entries_per_ledger, share):
        add(ledger, entry, due)
    if hasattr(idx, "compact"):
        idx.compact()
    build_s = time.perf_counter() - started
    gc.collect()
    grown = rss_bytes() - before
    nbytes = idx.nbytes()
    if len(idx) != messages:
        raise AssertionError(f"{index} holds {len(idx)} of {messages} messages")
    row = {
        "index": index, "workload": kind, "messages": messages, "x": x, "y": y,
        "entries_per_ledger": entries_per_ledger, "share": share if kind == "random" else 1.0,
        "nbytes": nbytes, "rss_growth": grown,
        "nbytes_per_msg": nbytes / messages, "rss_per_msg": grown / messages,
        "build_s": round(build_s, 2),
    }
    if hasattr(idx, "bucket_count"):
        row["buckets"] = idx.bucket_count()
        row["bitmaps"] = idx.bitmap_count()
    return row
