"""Scenario: precision when nothing starves the built-in timer."""

from __future__ import annotations

import asyncio
import random
from typing import Any, Optional

from .measure import Progress, now_ms, report, stop, wait_until
from .pair import close_all, prefetched, start
from .sides import Side, SideOptions, produce, topic_name

__all__ = ["run_precision"]


async def run_precision(url: str, delay_ms: int = 1000, n: int = 200, *, per_wave: int = 20,
                        precision_bits: int = 0, seed: int = 1, timeout_s: Optional[float] = None,
                        progress: Optional[Progress] = None) -> dict[str, Any]:
    """Nack ``n`` fresh messages on each side at ``delay_ms``, ``per_wave`` back
    to back per wave, the waves ``delay_ms/3 + 50..250 ms`` apart (random,
    seeded), both sides in each wave (alternating which goes first); ack each
    redelivery and record its error. Tracked uses ``precision_bits``.

    The waves are spaced more than delay/3 apart so the built-in tracker's
    timer (re-armed by every nack, ticking every delay/3) always gets to
    tick: the built-in's best case."""
    topic = topic_name(f"precision-{delay_ms}")
    await produce(url, topic, n)
    rng = random.Random(seed)
    sides: list[Side] = []
    tasks: list[asyncio.Task[Any]] = []
    label = f"precision {delay_ms} ms"
    gaps: list[float] = []
    wave = 0

    def tick() -> None:
        for side in sides:
            report(progress, f"{label}/{side.name}", side.record.count, n)

    try:
        fresh = await start(url, topic, sides, tasks, SideOptions(delay_ms=delay_ms, precision_bits=precision_bits))
        await prefetched(fresh, n)
        sent = 0
        while sent < n:
            k = min(per_wave, n - sent)
            batch = {side.name: [await asyncio.wait_for(fresh[side.name].get(), 10) for _ in range(k)]
                     for side in sides}
            for side in (sides if wave % 2 == 0 else sides[::-1]):
                for msg in batch[side.name]:
                    await side.nack(msg, delay_ms)
            sent, wave = sent + k, wave + 1
            tick()
            if sent < n:
                gaps.append(delay_ms / 3 + rng.uniform(50, 250))
                await asyncio.sleep(gaps[-1] / 1000)
        limit = (timeout_s or 10 + 2 * delay_ms / 1000) * 1000
        await wait_until(lambda: all(side.record.count >= n for side in sides), now_ms() + limit, tick)
    finally:
        await stop(tasks)
        await close_all(sides)
    result: dict[str, Any] = {"delay_ms": delay_ms, "n": n, "per_wave": per_wave, "waves": wave,
                              "precision_bits": precision_bits,
                              "wave_gap_ms": [round(min(gaps)), round(max(gaps))] if gaps else None}
    for side in sides:
        result[side.name] = {**side.summary(), "missing": n - side.record.count}
    return result
