"""The tracker against Java's PIP-393 ``NegativeAcksTracker``, on the Java measurement's own workload.

The workload: 4 ledgers, consecutive entry ids (message ``i`` is entry ``i // 4`` of ledger ``i % 4``,
as a consumer of four partitions receives them), one nack each with a delay uniform in 1-60 s (whole
ms, seeded), added through :class:`~nacktracker.NegativeAcksTracker` on a
:class:`~nacktracker.clock.ManualClock` that does not move (nothing fires while the nacks are added,
as in the Java measurement). Each configuration runs in a fresh interpreter and reports the tracker's
``nbytes()`` and the growth of the process's anonymous resident set (``RssAnon``: the heap, not
library pages) over the adds, per nack, and the CPU time of the add calls. A throwaway build of
20,000 nacks runs first, so one-time costs of first calls (lazy imports, caches) are not counted,
and the C heap's free pages are given back (glibc ``malloc_trim``) before the baseline, as
``bench.index_grid`` does; the growth is also read after a second trim at the end (what of it
was free heap the allocator kept).

The Java figures beside them are the published reference numbers (the Java client 4.0.7's tracker,
``GraphLayout.parseInstance(tracker.nackedMessages).totalSize()`` by JOL on the same ids and delays,
measured on 2026-12-07); this script does not rerun Java.

    python -m bench.java_anchor                    # 100k and 1M at bits 0, 4, 8, 12
    python -m bench.java_anchor --save             # ... and write bench/results/java-anchor/
    python -m bench.java_anchor --one --messages 1000000 --bits 8   # one row as JSON
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import os
import random
import resource
import sys
import time
from typing import Any, Optional

from bench import ROOT, run_module
from bench.index_grid import rss_bytes, trim_heap

RESULTS = ROOT / "bench" / "results" / "java-anchor"
LEDGERS = 4
MESSAGES = (100_000, 1_000_000)
BITS = (0, 4, 8, 12)
#: Nacks of the throwaway build before the measured one.
WARM_UP = 20_000
#: Java 4.0.7's NegativeAcksTracker, bytes per pending nack by JOL (published reference, not rerun):
#: (messages, bits) -> bytes per nack.
JAVA_B_PER_NACK: dict[tuple[int, int], float] = {(100_000, 8): 6.2, (1_000_000, 8): 3.1,
                                                 (100_000, 0): 481.0, (1_000_000, 0): 152.0}


def workload(messages: int, seed: int = 1) -> tuple[list[Any], list[int]]:
    """The keys and delays of the anchor workload, in nack order."""
    from nacktracker.keys import MessageKey

    rng = random.Random(seed)
    keys = [MessageKey(i % LEDGERS, i // LEDGERS) for i in range(messages)]
    delays = [rng.randint(1_000, 60_000) for _ in range(messages)]
    return keys, delays


def measure(messages: int, bits: int, seed: int = 1) -> dict[str, Any]:
    """One configuration in this process: add the workload, report bytes and CPU."""
    from nacktracker import NegativeAcksTracker
    from nacktracker.adapters import MemoryAdapter
    from nacktracker.clock import ManualClock

    keys, delays = workload(messages, seed)
    out: dict[str, Any] = {}

    async def warm_up() -> None:
        """The same adds on a small tracker, thrown away: the first calls' one-time costs (lazy imports,
        caches) are not the tracker's. Its freed memory is reused by the build measured (a small share)."""
        tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=bits, clock=ManualClock(1_000_000))
        for key, delay in zip(keys[:WARM_UP], delays):
            tracker.add(key, delay_ms=delay)
        await tracker.close()

    async def run() -> None:
        tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=bits, clock=ManualClock(1_000_000))
        add = tracker.add
        gc.collect()
        trim_heap()  # the warm-up's free pages go back first: the build does not reuse resident ones
        rss0 = rss_bytes()
        cpu0 = time.process_time()
        for key, delay in zip(keys, delays):
            add(key, delay_ms=delay)
        cpu = time.process_time() - cpu0
        gc.collect()
        out["rss_growth"] = rss_bytes() - rss0
        trim_heap()
        out["rss_trimmed_growth"] = rss_bytes() - rss0
        out["add_cpu_s"] = round(cpu, 3)
        out["nbytes"] = tracker.nbytes()
        out["index_nbytes"] = tracker._index.nbytes()  # noqa: SLF001  # the index's share, for the record
        out["pending"] = tracker.pending
        await tracker.close()

    asyncio.run(warm_up())
    asyncio.run(run())
    out.update(messages=messages, bits=bits, seed=seed,
               nbytes_per_nack=round(out["nbytes"] / messages, 3),
               rss_per_nack=round(out["rss_growth"] / messages, 3),
               rss_trimmed_per_nack=round(out["rss_trimmed_growth"] / messages, 3),
               add_ns=round(out["add_cpu_s"] * 1e9 / messages),
               java_per_nack=JAVA_B_PER_NACK.get((messages, bits)),
               peak_rss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return out


def run_all(messages: tuple[int, ...] = MESSAGES, bits: tuple[int, ...] = BITS) -> dict[str, Any]:
    before = os.getloadavg()
    t0 = time.monotonic()
    rows = []
    for n in messages:
        for b in bits:
            proc = run_module("bench.java_anchor", "--one", "--messages", str(n), "--bits", str(b))
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(line(rows[-1]), file=sys.stderr)
    after = os.getloadavg()
    return {"command": "python -m bench.java_anchor --save", "recorded": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%d %H:%M UTC"), "python": ".".join(map(str, sys.version_info[:3])),
            "loadavg_before": [round(x, 2) for x in before], "loadavg_after": [round(x, 2) for x in after],
            "cores": os.cpu_count(), "duration_s": round(time.monotonic() - t0, 1), "rows": rows}


def line(r: dict[str, Any]) -> str:
    java = "—" if r["java_per_nack"] is None else f"{r['java_per_nack']:g} B"
    return (f"| {r['messages']:,} | {r['bits']} | {java} | {r['nbytes_per_nack']:.2f} B | {r['rss_per_nack']:.2f} B "
            f"({r['rss_trimmed_per_nack']:.2f} B) "
            f"| {r['nbytes']:,} | {r['add_ns']:,} ns |")


def table(result: dict[str, Any]) -> str:
    """The results as a Markdown table, with the ratios the targets name beside it."""
    rows = result["rows"]
    head = ["| pending | bits | Java 4.0.7 (JOL, reference) | nacktracker `nbytes()` | RSS growth (trimmed) "
            "| `nbytes()` total | CPU per `add` |", "|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["messages"], r["bits"]): r for r in rows}
    notes = []
    for n in sorted({r["messages"] for r in rows}):
        if (n, 0) in by and (n, 8) in by:
            notes.append(f"{n:,} nacks: bits 8 holds {by[n, 8]['nbytes'] / by[n, 0]['nbytes']:.2f}x the bytes of bits 0")
    return "\n".join(head + [line(r) for r in rows]) + ("\n\n" + "; ".join(notes) + "." if notes else "")


def summary(result: dict[str, Any]) -> str:
    """The docs' block: the table and how it was measured."""
    return (f"{table(result)}\n\n`{result['command']}`: each row a fresh process, recorded {result['recorded']}, "
            f"load average {result['loadavg_before'][0]:.2f} → {result['loadavg_after'][0]:.2f} on "
            f"{result['cores']} cores. RSS growth and CPU are over the `add` calls alone (the workload's keys are "
            f"built before; RSS is anonymous memory from a trimmed heap, in parentheses after a second trim; "
            f"below ~1 MB of growth, page-granular RSS says little: trust `nbytes()`); Java's column is the published JOL figure of the Java client's tracker on the same "
            f"ids and delays, not rerun here. Results: [results.json](bench/results/java-anchor/results.json).")


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--one", action="store_true", help="one configuration in this process, JSON on stdout")
    p.add_argument("--messages", type=int, nargs="*", default=list(MESSAGES))
    p.add_argument("--bits", type=int, nargs="*", default=list(BITS))
    p.add_argument("--save", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}/results.json")
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(measure(a.messages[0], a.bits[0])))
        return 0
    result = run_all(tuple(a.messages), tuple(a.bits))
    print(table(result))
    if a.save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "results.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {(RESULTS / 'results.json').relative_to(ROOT)}; now run: python -m bench.figures", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
