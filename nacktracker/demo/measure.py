"""What every scenario shares, free of Pulsar: the loop clock in ms, error
summaries, progress reports, and waiting for a condition or for tasks to end.

Samples are kept in ``array('d')``, never as per-message tuples: hoarded
tuples make the garbage collector pause the loop and a scenario would
measure its own GC.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Callable, Optional, Sequence, TypedDict

__all__ = ["TRACKED", "BUILTIN", "SIDES", "CLOSE_GRACE_S", "Progress", "ErrorSummary", "now_ms", "summarize", "report", "wait_until", "stop"]

#: The two sides every scenario compares: ``nacktracker.subscribe`` and the client's built-in nack.
TRACKED, BUILTIN = "tracked", "builtin"
SIDES = (TRACKED, BUILTIN)

#: Seconds to wait after the last client closed, before the process may exit: pulsar-client
#: 3.13's threads can still be releasing Python callbacks when ``close()`` returns, and an
#: interpreter finalizing meanwhile aborts ("terminate called without an active exception"
#: or SIGSEGV). Measured here: 5-11 of 50 exits of a minimal asyncio script without it, none in
#: 200 runs (scripts and examples) with it.
CLOSE_GRACE_S = 0.2

#: ``progress(task, completed, total)``: what the scenarios report while they run.
Progress = Callable[[str, float, float], None]


class ErrorSummary(TypedDict):
    """Signed errors in ms (nearest-rank percentiles); ``abs_*`` of |error|."""

    n: int
    min: Optional[float]
    p50: Optional[float]
    p99: Optional[float]
    max: Optional[float]
    abs_p50: Optional[float]
    abs_p99: Optional[float]
    abs_max: Optional[float]


def now_ms() -> float:
    """The running loop's monotonic clock, in ms."""
    return asyncio.get_running_loop().time() * 1000.0


def summarize(errors: Sequence[float]) -> ErrorSummary:
    """Nearest-rank p50/p99, min/max of signed errors and p50/p99/max of |error|, in ms."""
    if not errors:
        return {"n": 0, "min": None, "p50": None, "p99": None, "max": None, "abs_p50": None, "abs_p99": None,
                "abs_max": None}
    signed, absolute = sorted(errors), sorted(map(abs, errors))

    def rank(values: list[float], q: float) -> float:
        return round(values[max(0, math.ceil(q / 100 * len(values)) - 1)], 1)

    return {"n": len(signed), "min": round(signed[0], 1), "p50": rank(signed, 50), "p99": rank(signed, 99),
            "max": round(signed[-1], 1), "abs_p50": rank(absolute, 50), "abs_p99": rank(absolute, 99),
            "abs_max": round(absolute[-1], 1)}


def report(progress: Optional[Progress], task: str, completed: float, total: float) -> None:
    if progress is not None:
        progress(task, completed, total)


async def wait_until(done: Callable[[], bool], deadline_ms: float, tick: Optional[Callable[[], None]] = None) -> None:
    """Poll ``done()`` every 20 ms until it holds or the loop clock reaches ``deadline_ms``."""
    while not done() and now_ms() < deadline_ms:
        if tick:
            tick()
        await asyncio.sleep(0.02)
    if tick:
        tick()


async def stop(tasks: Sequence["asyncio.Task[Any]"]) -> None:
    """Cancel ``tasks`` and wait until they ended."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
