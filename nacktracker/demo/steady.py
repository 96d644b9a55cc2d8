"""Scenario: a steady stream of nacks (where the built-in tracker starves)."""

from __future__ import annotations

import asyncio
import random
from typing import Any, Optional

from .measure import BUILTIN, Progress, now_ms, report, stop, wait_until
from .pair import close_all, prefetched, start
from .sides import Side, SideOptions, produce, topic_name

__all__ = ["run_steady_stream", "BUILTIN_OVERRUN_EXTRA_MS"]

#: How much longer than the delay the built-in side keeps nacking after the
#: tracked side stopped (see :func:`run_steady_stream`): its flood of
#: redeliveries comes ~70-130 ms after its last nack (the client's hold plus a
#: tick), so this many ms past the tracked side's last due time.
BUILTIN_OVERRUN_EXTRA_MS = 100


async def run_steady_stream(url: str, *, delay_ms: int = 200, period_ms: tuple[float, float] = (5, 10),
                            stream_ms: int = 3000, precision_bits: int = 0, seed: int = 2,
                            settle_ms: int = 3000, builtin_overrun_ms: Optional[int] = None,
                            progress: Optional[Progress] = None) -> dict[str, Any]:
    """One nack on each side every ``period_ms`` (uniform, seeded) for
    ``stream_ms``, delay ``delay_ms``; redeliveries are acked as they arrive.
    Every nack re-arms the built-in client's timer, so under a stream it
    starves. Reports how many came back while each side's stream was still
    running (of those due by then), the errors, and when the first one came.

    The built-in side's stream runs ``builtin_overrun_ms`` longer (default
    ``delay_ms`` + :data:`BUILTIN_OVERRUN_EXTRA_MS`; 0: both stop together).
    Why: the built-in side starves until its stream stops, then receives and
    acks all its ~300 redeliveries at once, in this process, on this loop.
    Stopping both together put that flood on the tracked side's last
    ``delay_ms`` of due copies: measured with ``bench/lab/precision_diagnose.py
    --only steady --cpu-hog``, the worst tracked errors of a run (+14 to +28
    ms) were copies due within 0-100 ms of the flood's start, parked in time
    and released late because the loop was busy with the other side. The
    overrun keeps the tracked side's whole stream under the same load (the
    built-in side's nacks interleaved) and moves the flood past it."""
    overrun = delay_ms + BUILTIN_OVERRUN_EXTRA_MS if builtin_overrun_ms is None else builtin_overrun_ms
    if overrun < 0:
        raise ValueError(f"builtin_overrun_ms must be >= 0, got {overrun}")
    n = int((stream_ms + overrun) / period_ms[0]) + 50
    topic = topic_name("steady")
    await produce(url, topic, n)
    rng = random.Random(seed)
    sides: list[Side] = []
    tasks: list[asyncio.Task[Any]] = []
    label = "steady stream"
    ends: dict[str, float] = {}  # when each side's stream stopped (loop ms)

    def tick() -> None:
        for side in sides:
            report(progress, f"{label}/{side.name}", side.record.count, side.record.nacks)

    try:
        fresh = await start(url, topic, sides, tasks, SideOptions(delay_ms=delay_ms, precision_bits=precision_bits))
        await prefetched(fresh, n)
        begin = now_ms()
        while len(ends) < len(sides):
            step = now_ms()  # one reading per step: with no overrun both sides stop at the same step
            for side in sides:
                if side.name in ends:
                    continue
                if step - begin >= stream_ms + (overrun if side.name == BUILTIN else 0):
                    ends[side.name] = step
                    continue
                await side.nack(await asyncio.wait_for(fresh[side.name].get(), 10), delay_ms)
            tick()
            if len(ends) < len(sides):
                await asyncio.sleep(rng.uniform(*period_ms) / 1000)
        end = max(ends.values())
        await wait_until(lambda: all(side.record.count >= side.record.nacks for side in sides),
                         end + delay_ms + settle_ms, tick)
    finally:
        await stop(tasks)
        await close_all(sides)
    result: dict[str, Any] = {"delay_ms": delay_ms, "period_ms": list(period_ms), "stream_ms": stream_ms,
                              "builtin_overrun_ms": overrun, "precision_bits": precision_bits}
    for side in sides:
        record, end = side.record, ends.get(side.name, now_ms())
        result[side.name] = {
            **side.summary(), "missing": record.nacks - record.count,
            "due_during_stream": sum(1 for due in record.dues if due < end),
            "redelivered_during_stream": sum(1 for at in record.arrivals if at < end),
            "first_redelivery_after_start_ms": round(min(record.arrivals) - begin) if record.arrivals else None,
            "first_redelivery_after_end_ms": round(min(record.arrivals) - end) if record.arrivals else None}
    return result
