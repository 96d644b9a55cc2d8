"""Both sides on one topic at once: open them, serve their deliveries, wait
until each holds its first deliveries (the precision and steady-stream
scenarios nack those)."""

from __future__ import annotations

import asyncio
from typing import Any

import pulsar

from .measure import now_ms
from .sides import SIDES, Side, SideOptions, open_side

__all__ = ["start", "serve", "prefetched", "close_all"]


async def serve(side: Side, fresh: "asyncio.Queue[pulsar.Message]") -> None:
    """First deliveries go to ``fresh``; redeliveries are timed and acked.

    Each ack runs in its own task, so the next ``receive()`` is not held up by
    the previous ack's round trip through the client (a loop iteration or
    two, more under load): the error measures when the consumer hands a
    redelivery over, not this loop's own acks. Measured with
    ``bench/lab/precision_diagnose.py`` ("c1"): awaiting every ack before the next
    receive spread a wave of 20 released together over 5-8 ms idle and up to
    30 ms with the CPU busy, for either side. A failed ack ends serving (with
    its error), as it did when awaited in line."""
    acks: set[asyncio.Task[None]] = set()
    failed: list[BaseException] = []

    def done(task: "asyncio.Task[None]") -> None:
        acks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            failed.append(task.exception())  # type: ignore[arg-type]

    try:
        while not failed:
            msg = await side.receive()
            if msg.redelivery_count() == 0 and not side.record.awaits(msg):
                fresh.put_nowait(msg)
            else:
                side.record.arrived(msg)
                task = asyncio.ensure_future(side.ack(msg))
                acks.add(task)
                task.add_done_callback(done)
        raise failed[0]
    finally:
        await asyncio.gather(*acks, return_exceptions=True)


async def start(url: str, topic: str, sides: list[Side], tasks: list["asyncio.Task[Any]"],
                options: SideOptions) -> dict[str, "asyncio.Queue[pulsar.Message]"]:
    """Open both sides into ``sides`` and start serving each into ``tasks``
    (the caller's lists, so its ``finally`` closes whatever was opened);
    return each side's queue of first deliveries."""
    fresh: dict[str, asyncio.Queue[pulsar.Message]] = {}
    for name in SIDES:
        sides.append(await open_side(name, url, topic, options))
        fresh[name] = asyncio.Queue()
        tasks.append(asyncio.create_task(serve(sides[-1], fresh[name])))
    return fresh


async def prefetched(fresh: dict[str, "asyncio.Queue[pulsar.Message]"], n: int, timeout_s: float = 15.0) -> None:
    """Wait until every side holds its ``n`` fresh messages, then a moment more.
    Why: while a backlog pours into Python the clients' nack path lags
    (measured here: nacks made meanwhile came back ~200 ms late); the scenarios
    measure nacks, not that start-up transient."""
    deadline = now_ms() + timeout_s * 1000
    while any(q.qsize() < n for q in fresh.values()) and now_ms() < deadline:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)


async def close_all(sides: list[Side]) -> None:
    for side in sides:
        await side.close()
