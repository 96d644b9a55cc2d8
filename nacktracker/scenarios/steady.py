"""Scenario: a steady stream of nacks (where the built-in tracker starves)."""

from __future__ import annotations

import asyncio
import random
from typing import Any, Optional

from .harness import Progress, now_ms, report, stop, wait_until
from .pair import close_all, prefetched, start
from .sides import Side, SideOptions, produce, topic_name

__all__ = ["run_steady_stream"]


async def run_steady_stream(url: str, *, delay_ms: int = 200, period_ms: tuple[float, float] = (5, 10),
                            stream_ms: int = 3000, precision_bits: int = 0, seed: int = 2,
                            settle_ms: int = 3000, progress: Optional[Progress] = None) -> dict[str, Any]:
    """One nack on each side every ``period_ms`` (uniform, seeded) for
    ``stream_ms``, delay ``delay_ms``; redeliveries are acked as they arrive.
    Every nack re-arms the built-in client's timer, so under a stream it
    starves. Reports how many came back while the stream was still running
    (of those due by then), the errors, and when the first one came."""
    n = int(stream_ms / period_ms[0]) + 50
    topic = topic_name("steady")
    await produce(url, topic, n)
    rng = random.Random(seed)
    sides: list[Side] = []
    tasks: list[asyncio.Task[Any]] = []
    label = "steady stream"

    def tick() -> None:
        for side in sides:
            report(progress, f"{label}/{side.name}", side.record.count, side.record.nacks)

    try:
        fresh = await start(url, topic, sides, tasks, SideOptions(delay_ms=delay_ms, precision_bits=precision_bits))
        await prefetched(fresh, n)
        begin = now_ms()
        while now_ms() - begin < stream_ms:
            for side in sides:
                await side.nack(await asyncio.wait_for(fresh[side.name].get(), 10), delay_ms)
            tick()
            await asyncio.sleep(rng.uniform(*period_ms) / 1000)
        end = now_ms()
        await wait_until(lambda: all(side.record.count >= side.record.nacks for side in sides),
                         end + delay_ms + settle_ms, tick)
    finally:
        await stop(tasks)
        await close_all(sides)
    result: dict[str, Any] = {"delay_ms": delay_ms, "period_ms": list(period_ms), "stream_ms": stream_ms,
                              "precision_bits": precision_bits}
    for side in sides:
        record = side.record
        result[side.name] = {
            **side.summary(), "missing": record.nacks - record.count,
            "due_during_stream": sum(1 for due in record.dues if due < end),
            "redelivered_during_stream": sum(1 for at in record.arrivals if at < end),
            "first_redelivery_after_start_ms": round(min(record.arrivals) - begin) if record.arrivals else None,
            "first_redelivery_after_end_ms": round(min(record.arrivals) - end) if record.arrivals else None}
    return result
