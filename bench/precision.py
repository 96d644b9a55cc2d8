"""Redelivery precision of NegativeAcksTracker on the real event loop.

Error = when the adapter was asked to redeliver - the requested due time
(nack time + delay), in ms, with the in-process MemoryAdapter (no broker: this
isolates the tracker; bench/pulsar_precision.py measures the broker path).

* precision: delays 100 ms, 1 s and 10 s at precision_bits 0 and 8, floor and
  ceil rounding: p1/p50/p99/max error;
* starvation: one nack every 1 ms for 5 s with a 100 ms delay (the pattern
  that starves the C++ client's tracker): when the first redelivery comes, and
  the error bounds throughout — floor: [-2^bits, +10 ms], ceil: [0, 2^bits + 10 ms].

All configurations run side by side in one event loop.

    python -m bench.precision [--quick] [--json]
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import math
import sys

from nacktracker import MessageKey, NegativeAcksTracker

CONFIGS = [(bits, rounding) for bits in (0, 8) for rounding in ("floor", "ceil")]
SLACK_MS = 10


def percentiles(values: list[float]) -> dict:
    v = sorted(values)

    def p(q):
        return round(v[max(0, math.ceil(q / 100 * len(v)) - 1)], 2)

    return {"n": len(v), "p1": p(1), "p50": p(50), "p99": p(99), "min": round(v[0], 2), "max": round(v[-1], 2)}


class ErrorRecorder:
    """An adapter that turns each redelivery into an error sample on arrival.

    Keeps floats and ints only (no tuples): a benchmark that hoards message
    keys makes the garbage collector pause the loop and measures its own GC.
    """

    lead_ms = 0

    def __init__(self, due: dict) -> None:
        self.due = due  # (ledger << 20 | entry) -> requested due time
        self.errors = array.array("d")
        self.first_at: float | None = None
        self.done = asyncio.Event()
        self.expected = 0

    async def redeliver(self, keys) -> None:
        now = asyncio.get_running_loop().time() * 1000
        if self.first_at is None:
            self.first_at = now
        for key in keys:
            self.errors.append(now - self.due.pop(key.ledger_id << 20 | key.entry_id))
        if len(self.errors) >= self.expected:
            self.done.set()


async def _stream(tracker: NegativeAcksTracker, delay_ms: int, count: int, every_ms: float,
                  due: dict) -> None:
    """Nack ``count`` messages, one every ``every_ms``, on schedule."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(count):
        lag = start + i * every_ms / 1000 - loop.time()
        if lag > 0:
            await asyncio.sleep(lag)
        ledger, entry = 1 + i // 50_000, i % 50_000
        due[ledger << 20 | entry] = tracker.add(MessageKey(ledger, entry), delay_ms=delay_ms)


async def _scenario(bits: int, rounding: str, delay_ms: int, count: int, every_ms: float) -> dict:
    due: dict = {}
    adapter = ErrorRecorder(due)
    adapter.expected = count
    tracker = NegativeAcksTracker(adapter, precision_bits=bits, rounding=rounding)
    loop = asyncio.get_running_loop()
    first_nack = loop.time() * 1000
    await _stream(tracker, delay_ms, count, every_ms, due)
    await asyncio.wait_for(adapter.done.wait(), timeout=delay_ms / 1000 + 30)
    await tracker.close()
    errors = adapter.errors
    width = 1 << bits
    lo, hi = (-width, SLACK_MS) if rounding == "floor" else (0, width + SLACK_MS)
    return {"bits": bits, "rounding": rounding, "delay_ms": delay_ms, "nacks": count, "every_ms": every_ms,
            "error_ms": percentiles(errors), "bounds_ms": [lo, hi],
            "within_bounds": all(lo - 1 <= e <= hi for e in errors),
            "first_redelivery_after_first_nack_ms": round(adapter.first_at - first_nack, 2),
            "timer_lag_ms": tracker.stats()["timer_lag_ms"]}


async def run_async(quick: bool = False) -> dict:
    delays = (100, 1000) if quick else (100, 1000, 10_000)
    n = 300 if quick else 1000
    jobs = [_scenario(b, r, d, n, 2.0) for d in delays for b, r in CONFIGS]
    stream_s = 2 if quick else 5
    jobs += [_scenario(b, r, 100, stream_s * 1000, 1.0) for b, r in CONFIGS]
    results = await asyncio.gather(*jobs)
    k = len(delays) * len(CONFIGS)
    return {"precision": results[:k], "starvation": results[k:], "quick": quick}


def run(quick: bool = False) -> dict:
    return asyncio.run(run_async(quick))


def table(result: dict) -> str:
    cmd = "python -m bench.precision" + (" --quick" if result["quick"] else "")
    out = [f"`{cmd}` — error = adapter call − requested due time (ms), MemoryAdapter, real event loop", "",
           "| delay | bits | rounding | nacks | p1 | p50 | p99 | max | within bounds |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["precision"]:
        e = r["error_ms"]
        out.append(f"| {r['delay_ms']} ms | {r['bits']} | {r['rounding']} | {r['nacks']} | {e['p1']} | {e['p50']} "
                   f"| {e['p99']} | {e['max']} | {'yes' if r['within_bounds'] else 'NO'} {r['bounds_ms']} |")
    out += ["", "Starvation: one nack every 1 ms, delay 100 ms, for the whole stream", "",
            "| bits | rounding | nacks | first redelivery after first nack (ms) | p1 | p50 | p99 | max | within bounds |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in result["starvation"]:
        e = r["error_ms"]
        out.append(f"| {r['bits']} | {r['rounding']} | {r['nacks']} | {r['first_redelivery_after_first_nack_ms']} "
                   f"| {e['p1']} | {e['p50']} | {e['p99']} | {e['max']} "
                   f"| {'yes' if r['within_bounds'] else 'NO'} {r['bounds_ms']} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    result = run(a.quick)
    print(json.dumps(result, indent=1) if a.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
