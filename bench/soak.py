"""Soak: does the tracker give its memory back once everything is redelivered?

Per cycle, ``--nacks`` nacks are paced at ``--rate``/s on the real event loop
(fresh ledgers each cycle, 50,000 entries per ledger, as a live topic), each
with ``--delay-ms``, through NegativeAcksTracker with an in-process adapter
that only counts (and marks ids in a Roaring bitmap to catch losses and
duplicates): an adapter that hoarded keys would measure its own memory and GC
pauses (see bench/precision.py's ErrorRecorder). After the cycle's last
redelivery, ``gc.collect()``, then RSS (/proc/self/statm) and
``tracker.nbytes()`` are read.

"Start" is read after a warm-up pass (one second of the same traffic): the
interpreter, allocator pools and the tracker's dicts reach their working size
there, once. Checks: every cycle redelivers every nack exactly once; after
every cycle RSS is within 5% of the start, and nbytes too (or within 1 KiB:
an emptied tracker keeps its dicts' grown hash tables, a fixed few hundred
bytes); no growth across cycles: the last cycle ends no higher than the one
before it (RSS within 1% of the start, unless it also held over 5% more nacks at
its peak than any cycle before it; nbytes not at all). A leak grows every
cycle; a high-water mark (allocator pools, dict tables) appears once.

    python -m bench.soak                # 1,000,000 nacks at 20k/s, 3 cycles (~2.7 min)
    python -m bench.soak --quick        # 20,000 nacks, delay 300 ms: a smoke test (~5 s)
    python -m bench.soak --json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time

from pyroaring import BitMap

from nacktracker import MessageKey, NegativeAcksTracker

ENTRIES_PER_LEDGER = 50_000
LEDGERS_PER_CYCLE = 1_000  # ledger ids of cycle c start at 10_000 + c * 1_000


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class CountingAdapter:
    """Counts redeliveries; ids go into a bitmap (C memory, no Python objects)."""

    lead_ms = 0

    def __init__(self) -> None:
        self.count = 0
        self.duplicates = 0
        self.seen = BitMap()
        self.target = 0
        self.done = asyncio.Event()

    async def redeliver(self, keys) -> None:
        seen = self.seen
        for key in keys:
            i = (key.ledger_id - 10_000) % LEDGERS_PER_CYCLE * ENTRIES_PER_LEDGER + key.entry_id
            if i in seen:
                self.duplicates += 1
            else:
                seen.add(i)
        self.count += len(keys)
        if self.count >= self.target:
            self.done.set()

    def reset(self, target: int) -> None:
        self.count = self.duplicates = 0
        self.seen = BitMap()
        self.target = target
        self.done = asyncio.Event()


async def pace(tracker: NegativeAcksTracker, cycle: int, nacks: int, rate: float, peaks: dict) -> float:
    """Nack ``nacks`` messages at ``rate``/s on schedule; return the achieved rate."""
    loop = asyncio.get_running_loop()
    base = 10_000 + cycle * LEDGERS_PER_CYCLE
    add = tracker.add
    start = loop.time()
    i = 0
    while i < nacks:
        await asyncio.sleep(0.001)
        upto = min(nacks, int((loop.time() - start) * rate) + 1)
        while i < upto:
            add(MessageKey(base + i // ENTRIES_PER_LEDGER, i % ENTRIES_PER_LEDGER))
            i += 1
        if tracker.pending > peaks["pending"]:
            peaks["pending"] = tracker.pending
    return nacks / max(1e-9, loop.time() - start)


async def sample_peaks(tracker: NegativeAcksTracker, peaks: dict, stop: asyncio.Event) -> None:
    while not stop.is_set():
        peaks["nbytes"] = max(peaks["nbytes"], tracker.nbytes())
        peaks["rss"] = max(peaks["rss"], rss_bytes())
        try:
            await asyncio.wait_for(stop.wait(), 0.097)  # not a divisor of the bucket grid
        except asyncio.TimeoutError:
            pass


async def cycle_once(tracker, adapter, cycle: int, nacks: int, rate: float, delay_ms: int) -> dict:
    adapter.reset(nacks)
    peaks = {"pending": 0, "nbytes": 0, "rss": 0}
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_peaks(tracker, peaks, stop))
    t0 = time.perf_counter()
    achieved = await pace(tracker, cycle, nacks, rate, peaks)
    await asyncio.wait_for(adapter.done.wait(), timeout=delay_ms / 1000 + 60)
    while tracker.pending or tracker.stats()["unsent"]:
        await asyncio.sleep(0.01)
    stop.set()
    await sampler
    elapsed = time.perf_counter() - t0
    gc.collect()
    return {"cycle": cycle, "nacks": nacks, "rate_achieved": round(achieved), "seconds": round(elapsed, 2),
            "redelivered": adapter.count, "unique": len(adapter.seen), "duplicates": adapter.duplicates,
            "pending_end": tracker.pending, "peak_pending": peaks["pending"], "peak_nbytes": peaks["nbytes"],
            "peak_rss": peaks["rss"], "rss_end": rss_bytes(), "nbytes_end": tracker.nbytes()}


def start_row(start: dict) -> dict:
    return {"rss_end": start["rss"], "nbytes_end": start["nbytes"]}


async def run_async(nacks: int, rate: float, cycles: int, delay_ms: int, bits: int) -> dict:
    adapter = CountingAdapter()
    tracker = NegativeAcksTracker(adapter, delay_ms=delay_ms, precision_bits=bits)
    gc.collect()
    rss_cold = rss_bytes()
    warm = await cycle_once(tracker, adapter, cycles, min(nacks, int(rate)), rate, delay_ms)  # ~1 s
    start = {"rss": warm["rss_end"], "nbytes": warm["nbytes_end"]}
    rows = [await cycle_once(tracker, adapter, c, nacks, rate, delay_ms) for c in range(cycles)]
    stats = tracker.stats()
    await tracker.close()
    for r in rows:
        r["rss_vs_start"] = round(r["rss_end"] / start["rss"] - 1, 4)
        r["nbytes_vs_start"] = round(r["nbytes_end"] / start["nbytes"] - 1, 4)
    last, prev = rows[-1], rows[-2] if len(rows) > 1 else start_row(start)
    checks = {
        "no_loss_no_duplicates": all(r["redelivered"] == r["unique"] == r["nacks"] and not r["duplicates"]
                                     and not r["pending_end"] for r in rows),
        "rss_within_5pct": all(abs(r["rss_vs_start"]) <= 0.05 for r in rows),
        # an emptied tracker keeps its dicts' grown hash tables (CPython never shrinks a dict):
        # a fixed few hundred bytes over a fresh one, so 5% of ~1 KB would flag the allocator, not a leak
        "nbytes_within_5pct_or_1KiB": all(r["nbytes_end"] - start["nbytes"] <= max(0.05 * start["nbytes"], 1024)
                                          for r in rows),
        # a leak grows every cycle; a last cycle that also held more at its peak than any before it (a loop
        # slowed by a busy machine bunches the nacks) may leave a higher allocator high-water mark once
        "no_growth_across_cycles": (last["rss_end"] - prev["rss_end"] <= 0.01 * start["rss"]
                                    or last["peak_pending"] > 1.05 * max(r["peak_pending"] for r in rows[:-1] or [warm]))
        and last["nbytes_end"] <= prev["nbytes_end"],
    }
    return {"config": {"nacks": nacks, "rate": rate, "cycles": cycles, "delay_ms": delay_ms, "precision_bits": bits},
            "rss_cold": rss_cold, "warmup": warm, "start": start, "cycles": rows, "checks": checks,
            "timer_lag_ms": stats["timer_lag_ms"], "fires": stats["fires"], "ok": all(checks.values())}


QUICK = {"nacks": 20_000, "delay_ms": 300}


def run(quick: bool = False, nacks: int = 1_000_000, rate: float = 20_000, cycles: int = 3, delay_ms: int = 1000,
        precision_bits: int = 8) -> dict:
    """The soak as a function (``bench/suite.py`` calls ``run(quick=...)``)."""
    if quick:
        nacks, delay_ms = QUICK["nacks"], QUICK["delay_ms"]
    result = asyncio.run(run_async(nacks, rate, cycles, delay_ms, precision_bits))
    result["quick"] = quick
    return result


def table(result: dict, cmd: str | None = None) -> str:
    if cmd is None:
        cmd = "python -m bench.soak" + (" --quick" if result.get("quick") else "")
    c, s = result["config"], result["start"]
    out = [f"`{cmd}` — {c['nacks']:,} nacks/cycle at {c['rate']:,.0f}/s, delay {c['delay_ms']} ms, "
           f"precision_bits {c['precision_bits']}, real event loop, counting adapter", "",
           f"RSS cold {result['rss_cold'] / 2**20:.1f} MiB; start (after 1 s warm-up) RSS {s['rss'] / 2**20:.2f} MiB, "
           f"nbytes {s['nbytes']:,}", "",
           "| cycle | achieved rate/s | redelivered | dup | peak pending | peak nbytes | peak RSS MiB "
           "| end RSS MiB | RSS vs start | end nbytes | nbytes vs start |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["cycles"]:
        out.append(f"| {r['cycle'] + 1} | {r['rate_achieved']:,} | {r['redelivered']:,} | {r['duplicates']} "
                   f"| {r['peak_pending']:,} | {r['peak_nbytes']:,} | {r['peak_rss'] / 2**20:.2f} "
                   f"| {r['rss_end'] / 2**20:.2f} | {r['rss_vs_start']:+.2%} | {r['nbytes_end']:,} "
                   f"| {r['nbytes_vs_start']:+.2%} |")
    lat = result["timer_lag_ms"]
    out += ["", f"timer lag (ms, all cycles): p50 {lat['p50']}, p99 {lat['p99']}, max {lat['max']}; "
                f"fires {result['fires']:,}", "",
            "checks: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in result["checks"].items())]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nacks", type=int, default=1_000_000)
    p.add_argument("--rate", type=float, default=20_000)
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--delay-ms", type=int, default=1000)
    p.add_argument("--precision-bits", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="20,000 nacks per cycle, delay 300 ms")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    result = run(a.quick, a.nacks, a.rate, a.cycles, a.delay_ms, a.precision_bits)
    cmd = "python -m bench.soak" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    print(json.dumps(result, indent=1) if a.json else table(result, cmd))
    # losing or duplicating a message always fails; memory checks fail the full run only (quick is too short)
    if not result["checks"]["no_loss_no_duplicates"] or (not a.quick and not result["ok"]):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
