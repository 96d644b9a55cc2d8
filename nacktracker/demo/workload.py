"""Scenario: a worker with failures, backoff and a dead-letter topic.

A live stream of messages; on each side an asyncio worker processes them and
nacks the ones :func:`failure_plan` marks. TrackedConsumer nacks with
``MultiplierBackoff`` and dead-letters after ``max_redeliveries``; the
built-in consumer has the only knobs the Python client offers: one fixed
``negative_ack_redelivery_delay_ms`` and a ``ConsumerDeadLetterPolicy``.
"""

from __future__ import annotations

import array
import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import pulsar
import pulsar.asyncio as pulsar_asyncio

from ..backoff import MultiplierBackoff
from .measure import Progress, now_ms, report, stop, summarize
from .sides import BUILTIN, SIDES, TRACKED, Side, SideOptions, open_side, produce, quietly, topic_name

__all__ = ["run_workload", "failure_plan", "ALWAYS"]

ALWAYS = 1 << 30  # failures of a poison message: it never succeeds


def failure_plan(n: int, share: float, seed: int) -> list[int]:
    """How many times each message fails before it succeeds: 0 for ``1 - share``
    of them; of the failing ones half fail once, 30% twice, 20% always."""
    rng = random.Random(seed)
    plan = []
    for _ in range(n):
        if rng.random() >= share:
            plan.append(0)
        else:
            r = rng.random()
            plan.append(1 if r < 0.5 else 2 if r < 0.8 else ALWAYS)
    return plan


@dataclass
class _Tally:
    """One side's outcome: what settled, what was dead-lettered after how many deliveries."""

    settled: set[int] = field(default_factory=set)
    dead: set[int] = field(default_factory=set)
    dead_counts: list[int] = field(default_factory=list)  # highest redelivery count seen per dead letter
    top_count: dict[int, int] = field(default_factory=dict)  # message -> highest redelivery count seen
    lags: array.array[float] = field(default_factory=lambda: array.array("d"))
    finished_ms: Optional[float] = None

    @property
    def done(self) -> int:
        return len(self.settled) + len(self.dead)


@dataclass
class _MemorySampler:
    """The consumer's ``stats()['nbytes']`` (everything it holds for its pending nacks) and its split
    (``nbytes_parts``) at the peak, sampled while the scenario runs."""

    peak_nbytes: int = 0
    pending_at_peak: int = 0
    parts_at_peak: Optional[dict[str, int]] = None
    peak_pending: int = 0
    samples: int = 0
    final_nbytes: Optional[int] = None

    def sample(self, stats: dict[str, Any]) -> None:
        self.samples += 1
        self.peak_pending = max(self.peak_pending, stats["pending"])
        if stats["nbytes"] > self.peak_nbytes:
            self.peak_nbytes, self.pending_at_peak = stats["nbytes"], stats["pending"]
            self.parts_at_peak = stats.get("nbytes_parts")

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"peak_nbytes": self.peak_nbytes, "pending_at_peak": self.pending_at_peak,
               "peak_pending": self.peak_pending, "samples": self.samples}
        if self.parts_at_peak is not None:
            out["parts_at_peak"] = dict(self.parts_at_peak)
        if self.final_nbytes is not None:
            out["final_nbytes"] = self.final_nbytes
        return out


class _Worker:
    """One side's asyncio worker: the receive loop hands each message to its own
    handler task (at most ``concurrency`` at once), so a redelivery is timed
    when the consumer delivers it, not after the messages queued ahead of it."""

    def __init__(self, side: Side, plan: list[int], requested_ms: Any, process_ms: float, concurrency: int) -> None:
        self.side, self.plan, self.tally = side, plan, _Tally()
        self._requested_ms = requested_ms  # redelivery count -> the delay this side nacks with
        self._process_s = process_ms / 1000
        self._slots = asyncio.Semaphore(concurrency)
        self.handlers: set[asyncio.Task[None]] = set()

    async def work(self) -> None:
        while True:
            msg = await self.side.receive()
            i, count = int(msg.data()), msg.redelivery_count()
            self.tally.top_count[i] = max(count, self.tally.top_count.get(i, 0))
            if count > 0:
                self.side.record.arrived(msg)
            else:  # what any delivery costs right now: the floor under a redelivery's error
                self.tally.lags.append(time.time() * 1000 - msg.publish_timestamp())
            await self._slots.acquire()
            task = asyncio.create_task(self._handle(msg, i, count))
            self.handlers.add(task)
            task.add_done_callback(self._handled)

    def _handled(self, task: "asyncio.Task[None]") -> None:
        self.handlers.discard(task)
        self._slots.release()

    async def _handle(self, msg: pulsar.Message, i: int, count: int) -> None:
        await asyncio.sleep(self._process_s)  # "processing"
        if count < self.plan[i]:
            await self.side.nack(msg, self._requested_ms(count), explicit=False)
        else:
            await self.side.ack(msg)
            self.tally.settled.add(i)

    async def watch_dead_letters(self, inspector: pulsar_asyncio.Consumer) -> None:
        while True:  # cancelled only at the end: a receive() lost then is harmless
            msg = await inspector.receive()
            i = int(msg.data())
            if i not in self.tally.dead:
                self.tally.dead.add(i)
                self.tally.dead_counts.append(self.tally.top_count.get(i, -1))
            await inspector.acknowledge(msg)


async def run_workload(url: str, n: int = 2000, *, rate: float = 400.0, fail_share: float = 0.2,
                       process_ms: float = 1.0, concurrency: int = 32, backoff_ms: tuple[int, int] = (200, 2000),
                       builtin_delay_ms: int = 200, max_redeliveries: int = 3, seed: int = 3,
                       timeout_s: float = 60.0, progress: Optional[Progress] = None) -> dict[str, Any]:
    """A live stream of ``n`` messages published at ``rate`` per second; on each
    side one asyncio worker processes them (``process_ms`` each, up to
    ``concurrency`` at once) and nacks the ones :func:`failure_plan` marks.
    Tracked: delays ``MultiplierBackoff(*backoff_ms)`` of the redelivery count,
    dead letter after ``max_redeliveries``. Built-in: ``builtin_delay_ms`` for
    every nack and ``ConsumerDeadLetterPolicy(max_redeliveries)``. A side is
    done when every message was acknowledged or arrived on its dead-letter
    topic. Tracker memory: ``stats()['nbytes']`` sampled every 25 ms.
    ``first_delivery_lag_ms``: publish to receive of first deliveries, the
    system's own delivery latency under this load (a floor under any
    redelivery's error, whoever schedules it).

    The stream is live (not a pre-filled backlog) and the worker concurrent,
    so it keeps up: a redelivery is timed when the consumer delivers it instead
    of after thousands of prefetched messages, and the error measures the nack
    path rather than a backlog."""
    plan = failure_plan(n, fail_share, seed)
    topic = topic_name("workload")
    backoff = MultiplierBackoff(*backoff_ms)
    requested = {TRACKED: backoff, BUILTIN: lambda count: builtin_delay_ms}  # count -> the delay each side nacks with
    workers: dict[str, _Worker] = {}
    inspectors: list[pulsar_asyncio.Consumer] = []
    tasks: list[asyncio.Task[Any]] = []
    memory = _MemorySampler()
    try:
        for name in SIDES:
            dlq = f"{topic}-{name}-DLQ"
            side = await open_side(name, url, topic, SideOptions(
                delay_ms=builtin_delay_ms, backoff=backoff, max_redeliveries=max_redeliveries, dead_letter_topic=dlq))
            workers[name] = _Worker(side, plan, requested[name], process_ms, concurrency)
            # subscribed before any nack: every dead letter is seen
            inspectors.append(await side.client.subscribe(dlq, "inspect", consumer_type=pulsar.ConsumerType.Shared,
                                                          initial_position=pulsar.InitialPosition.Earliest))
        start = now_ms()
        tasks = [asyncio.create_task(w.work()) for w in workers.values()]
        tasks += [asyncio.create_task(w.watch_dead_letters(ins)) for w, ins in zip(workers.values(), inspectors)]
        publisher = asyncio.create_task(produce(url, topic, n, rate=rate,
                                                progress=lambda i: report(progress, "workload/published", i, n)))
        tasks.append(publisher)
        tracked = workers[TRACKED].side

        def tick() -> None:
            stats = tracked.tracker_stats()
            if stats is not None:
                memory.sample(stats)
            for name, worker in workers.items():
                if worker.tally.done >= n and worker.tally.finished_ms is None:
                    worker.tally.finished_ms = now_ms() - start
                report(progress, f"workload/{name}", worker.tally.done, n)

        while (any(w.tally.finished_ms is None for w in workers.values())
               and now_ms() < start + timeout_s * 1000):
            if publisher.done() and publisher.exception() is not None:
                await publisher  # raises the publisher's error
            tick()
            await asyncio.sleep(0.025)
        tick()
        final = tracked.tracker_stats()
        memory.final_nbytes = None if final is None else final["nbytes"]
    finally:
        await stop(tasks)
        await stop([task for w in workers.values() for task in w.handlers])
        for inspector in inspectors:
            await quietly(inspector.close())
        for worker in workers.values():
            await worker.side.close()
    failing = [f for f in plan if f]
    result: dict[str, Any] = {
        "messages": n, "rate": rate, "fail_share": fail_share, "process_ms": process_ms,
        "max_redeliveries": max_redeliveries, "fail_once": failing.count(1), "fail_twice": failing.count(2),
        "poison": failing.count(ALWAYS), "tracked_backoff": f"MultiplierBackoff({backoff_ms[0]}, {backoff_ms[1]})",
        "tracked_delays_ms": [backoff(count) for count in range(max_redeliveries)],
        "builtin_delay_ms": builtin_delay_ms}
    for name, worker in workers.items():
        tally, counts = worker.tally, worker.tally.dead_counts
        entry = worker.side.summary()
        entry.update({"acknowledged": len(tally.settled), "dead_lettered": len(tally.dead),
                      "deliveries_per_dead_letter": [min(counts) + 1, max(counts) + 1] if counts else None,
                      "settle_s": None if tally.finished_ms is None else round(tally.finished_ms / 1000, 2),
                      "unsettled": n - tally.done, "first_delivery_lag_ms": summarize(tally.lags)})
        if name == TRACKED:  # the built-in's tracker memory is not exposed (C++)
            entry["memory"] = memory.as_dict()
        result[name] = entry
    return result
