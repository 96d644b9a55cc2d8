"""Memory per remembered id and time per call of nacktracker.Deduplicator.

Each workload runs in a fresh subprocess, remembers N ids for one key (capacity
N/2: after N first sights both generations are full, the steady state), and
reports ``nbytes()`` and the growth of the resident set (RSS) per id, plus the
time per ``seen_or_add`` for a first sight (miss) and a repeat (hit).

* ``sequential``: non-batched messages, entry ids 0..49,999 per ledger;
* ``batched100``: batch entries of 100 messages (batch_index 0..99);
* ``sparse10``: 10% of each ledger's entries, at random (a partition shared
  by ten consumers, or a filtered stream);
* ``fallback``: entry ids >= 2^40 (not packable: the exact set path);
* ``python-set``: the naive baseline, a set of ``(ledger, entry, batch)`` tuples.

    python -m bench.dedup                 # 10M ids (fallback and python-set: 1M)
    python -m bench.dedup --ids 1000000 --json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time

from bench import run_module

WORKLOADS = ("sequential", "batched100", "sparse10", "fallback", "python-set")
ENTRIES_PER_LEDGER = 50_000
SLOW = ("fallback", "python-set")  # one Python object per id: capped at 1M


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def ids(workload: str, n: int):
    """Yield ``(ledger, entry, batch_index)``."""
    if workload == "batched100":
        for i in range(n):
            entry, batch = divmod(i, 100)
            yield 10_000 + entry // ENTRIES_PER_LEDGER, entry % ENTRIES_PER_LEDGER, batch
    elif workload == "sparse10":
        rng = random.Random(1)
        i, ledger = 0, 10_000
        while i < n:
            for entry in sorted(rng.sample(range(ENTRIES_PER_LEDGER), min(ENTRIES_PER_LEDGER // 10, n - i))):
                yield ledger, entry, -1
                i += 1
            ledger += 1
    elif workload == "fallback":
        for i in range(n):
            yield 10_000 + i // ENTRIES_PER_LEDGER, (1 << 40) + i % ENTRIES_PER_LEDGER, -1
    else:
        for i in range(n):
            yield 10_000 + i // ENTRIES_PER_LEDGER, i % ENTRIES_PER_LEDGER, -1


def child(workload: str, n: int) -> dict:
    from nacktracker import Deduplicator

    # ids are generated lazily, as fresh objects, the way they arrive from messages;
    # the generator's own time is measured alone and subtracted
    t0 = time.perf_counter()
    for _ in ids(workload, n):
        pass
    gen_s = time.perf_counter() - t0
    gc.collect()
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    if workload == "python-set":
        seen: set = set()
        for ident in ids(workload, n):
            if ident not in seen:
                seen.add(ident)
    else:
        topic = "persistent://public/default/t"
        d = Deduplicator(capacity=max(1, n // 2))
        for ledger, entry, batch in ids(workload, n):
            d.seen_or_add(topic, ledger, entry, batch)
    miss_s = time.perf_counter() - t0 - gen_s
    gc.collect()
    rss1 = rss_bytes()
    if workload == "python-set":
        # the set, its tuples and the ints they hold (not the interpreter's cached small ints)
        nbytes = sys.getsizeof(seen) + sum(sys.getsizeof(t) + sum(sys.getsizeof(x) for x in t if not -5 <= x <= 256)
                                           for t in seen)
        remembered, hit_ns, stats = len(seen), None, {}
    else:
        nbytes, remembered = d.nbytes(), len(d)
        sample = list(ids(workload, n))[-min(n // 2, 1_000_000):]  # the newer half: still remembered
        t0 = time.perf_counter()
        hits = sum(d.seen_or_add(topic, *ident) for ident in sample)
        hit_ns = (time.perf_counter() - t0) / len(sample) * 1e9
        assert hits == len(sample)
        stats = d.stats()
    return {"workload": workload, "ids": n, "remembered": remembered, "nbytes": nbytes,
            "bytes_per_id": round(nbytes / remembered, 4), "rss_bytes_per_id": round((rss1 - rss0) / remembered, 3),
            "miss_ns": round(miss_s / n * 1e9), "hit_ns": None if hit_ns is None else round(hit_ns),
            "rotations": stats.get("rotations"), "exact_fallback": stats.get("exact_fallback")}


def run(quick: bool = False, n_ids: int | None = None, workloads=WORKLOADS) -> dict:
    """``bench/suite.py`` calls ``run(quick=...)``: 10M ids, or 200k when quick."""
    n = n_ids or (200_000 if quick else 10_000_000)
    rows = []
    for w in workloads:
        size = min(n, 1_000_000) if w in SLOW else n
        out = run_module("bench.dedup", "--child", w, "--ids", str(size))
        rows.append(json.loads(out.stdout))
    return {"ids": n, "rows": rows, "quick": quick}


def table(result: dict) -> str:
    out = [f"`python -m bench.dedup --ids {result['ids']}` — one key, capacity ids/2 (both generations full)", "",
           "| workload | ids | nbytes/id | RSS growth/id | miss ns/call | hit ns/call | exact fallback |",
           "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        out.append(f"| {r['workload']} | {r['ids']:,} | {r['bytes_per_id']} | {r['rss_bytes_per_id']} "
                   f"| {r['miss_ns']} | {r['hit_ns'] if r['hit_ns'] is not None else '—'} "
                   f"| {r['exact_fallback'] if r['exact_fallback'] is not None else '—'} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ids", type=int, default=10_000_000)
    p.add_argument("--workload", choices=WORKLOADS + ("all",), default="all")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", choices=WORKLOADS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child, a.ids)))
        return 0
    result = run(n_ids=a.ids, workloads=WORKLOADS if a.workload == "all" else (a.workload,))
    print(json.dumps(result, indent=1) if a.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
