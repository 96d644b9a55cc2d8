"""The Pulsar demo: TrackedConsumer beside the client's built-in negative ack.

``nacktracker demo`` (``make demo``). Every scenario runs both consumers at the
same time, on the same broker and the same messages (one topic, one Shared
subscription each, one client each), and measures every redelivery's error:
when the application received it minus when it was due (nack time + the
delay that side was asked for), in ms on the event loop's clock. Positive is
late.

* :func:`run_workload`: a worker processes messages; a share of them fail
  (once, twice, or always). TrackedConsumer nacks with ``MultiplierBackoff``
  and dead-letters after ``max_redeliveries``; the built-in consumer has the
  only knobs the Python client offers: one fixed
  ``negative_ack_redelivery_delay_ms`` and a ``ConsumerDeadLetterPolicy``.
* :func:`run_precision`: waves of nacks at one delay, the waves spaced more
  than delay/3 apart so the built-in tracker's timer (re-armed by every nack,
  ticking every delay/3) always gets to tick: the built-in's best case.
* :func:`run_steady_stream`: one nack every 5-10 ms for 3 s with a 200 ms
  delay: every nack re-arms the built-in timer, so it starves.

Each returns a plain dict with a ``"tracked"`` and a ``"builtin"`` entry
(``bench/pulsar_precision.py`` imports them). Samples are kept in
``array('d')``, never as per-message tuples: hoarded tuples make the garbage
collector pause the loop and the demo would measure its own GC.
"""

from __future__ import annotations

import array
import asyncio
import math
import random
import sys
import time
import uuid
from typing import Any, Callable, Optional, Sequence

import pulsar
import pulsar.asyncio as pulsar_asyncio

from .backoff import MultiplierBackoff
from .consumer import subscribe

__all__ = ["run_workload", "run_precision", "run_steady_stream", "run_demo", "produce", "summarize",
           "table_sections", "table_rows", "main", "TRACKED", "BUILTIN", "CLOSE_GRACE_S"]

TRACKED, BUILTIN = "tracked", "builtin"
SIDES = (TRACKED, BUILTIN)
ALWAYS = 1 << 30  # failures of a poison message: it never succeeds
#: Seconds to wait after the last client closed, before the process may exit: pulsar-client
#: 3.13's threads can still be releasing Python callbacks when ``close()`` returns, and an
#: interpreter finalizing meanwhile aborts ("terminate called without an active exception"
#: or SIGSEGV). Measured here: 5-11 of 50 exits of a minimal asyncio script without it, none in
#: 200 runs (scripts and examples) with it.
CLOSE_GRACE_S = 0.2
#: ``progress(task, completed, total)``: what the scenarios report while they run.
Progress = Callable[[str, float, float], None]

_Shared = pulsar.ConsumerType.Shared
_Earliest = pulsar.InitialPosition.Earliest


def summarize(errors: Sequence[float]) -> dict:
    """Nearest-rank p50/p99, min/max of signed errors and p99/max of |error|, in ms."""
    if not errors:
        return {"n": 0, "min": None, "p50": None, "p99": None, "max": None, "abs_p99": None, "abs_max": None}
    signed, absolute = sorted(errors), sorted(map(abs, errors))

    def rank(values: list, q: float) -> float:
        return round(values[max(0, math.ceil(q / 100 * len(values)) - 1)], 1)

    return {"n": len(signed), "min": round(signed[0], 1), "p50": rank(signed, 50), "p99": rank(signed, 99),
            "max": round(signed[-1], 1), "abs_p99": rank(absolute, 99), "abs_max": round(absolute[-1], 1)}


def _now_ms() -> float:
    return asyncio.get_running_loop().time() * 1000.0


def _topic(scenario: str) -> str:
    return f"persistent://public/default/nacktracker-demo-{scenario}-{uuid.uuid4().hex[:8]}"


def _client(url: str) -> pulsar_asyncio.Client:
    # The C++ client logs every connection at INFO on stdout: keep the demo's output readable.
    return pulsar_asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
                                 operation_timeout_seconds=10)


async def _quietly(awaitable: Any) -> None:
    try:
        await awaitable
    except Exception:  # closing something already closed
        pass


async def produce(url: str, topic: str, n: int, *, batching: bool = False, payload_bytes: int = 0,
                  rate: Optional[float] = None, progress: Optional[Callable[[int], None]] = None) -> None:
    """Publish ``n`` messages whose payload starts with their number (``b"17"``
    or ``b"17:xxxx"``). ``rate``: messages per second, on schedule (a live
    stream); else as fast as the producer's pending queue allows (chunks of 500)."""
    client = _client(url)
    try:
        producer = await client.create_producer(topic, batching_enabled=batching,
                                                batching_max_publish_delay_ms=5)
        pad = b":" + b"x" * (payload_bytes - 1) if payload_bytes > 0 else b""
        if rate is None:
            for start in range(0, n, 500):
                await asyncio.gather(*[producer.send(b"%d" % i + pad) for i in range(start, min(n, start + 500))])
        else:
            start, sends = _now_ms(), []
            for i in range(n):
                wait = start + i * 1000 / rate - _now_ms()
                if wait > 0:
                    await asyncio.sleep(wait / 1000)
                sends.append(asyncio.ensure_future(producer.send(b"%d" % i + pad)))
                if progress is not None:
                    progress(i + 1)
            await asyncio.gather(*sends)
        await producer.close()
    finally:
        await _quietly(client.close())


class _Side:
    """One consumer under test behind the four calls the scenarios make, with
    its redelivery bookkeeping (due times by payload, errors as floats)."""

    def __init__(self, name: str, client: pulsar_asyncio.Client, consumer: Any) -> None:
        self.name, self.client, self.consumer = name, client, consumer
        self.due: dict[bytes, float] = {}  # payload -> when its pending redelivery is due
        self.dues = array.array("d")  # every due time asked for (ms)
        self.errors = array.array("d")  # arrival - due of every redelivery (ms)
        self.arrivals = array.array("d")  # arrival time of every redelivery (ms)
        self.nacks = self.unexpected = 0
        self._queue: Optional[asyncio.Queue] = None
        self._pump: Optional[asyncio.Task] = None
        if name == BUILTIN:
            # The plain client's receive() loses a message when its awaiting task is
            # cancelled: one owned task awaits it and feeds a queue, whose get() is safe.
            self._queue = asyncio.Queue()
            self._pump = asyncio.get_running_loop().create_task(self._run_pump())

    async def _run_pump(self) -> None:
        try:
            while True:
                self._queue.put_nowait(await self.consumer.receive())
        except Exception:
            pass  # the consumer was closed

    async def receive(self) -> pulsar.Message:
        return await (self.consumer.receive() if self._queue is None else self._queue.get())

    async def ack(self, msg: pulsar.Message) -> None:
        await self.consumer.acknowledge(msg)

    async def nack(self, msg: pulsar.Message, requested_ms: float, *, explicit: bool = True) -> None:
        """Nack ``msg``; ``requested_ms`` is the delay this side was asked for
        (TrackedConsumer gets it as ``delay_ms`` when ``explicit``, else applies
        its own backoff; the built-in applies its one configured delay)."""
        due = _now_ms() + requested_ms
        self.due[msg.data()] = due
        self.dues.append(due)
        self.nacks += 1
        if self.name == TRACKED:
            await self.consumer.negative_acknowledge(msg, delay_ms=requested_ms if explicit else None)
        else:
            await self.consumer.negative_acknowledge(msg)

    def arrived(self, msg: pulsar.Message) -> None:
        """Record a redelivery's error against its due time."""
        due = self.due.pop(msg.data(), None)
        if due is None:
            self.unexpected += 1  # a copy nobody asked for
            return
        now = _now_ms()
        self.errors.append(now - due)
        self.arrivals.append(now)

    @property
    def redeliveries(self) -> int:
        return len(self.errors)

    def summary(self) -> dict:
        out = {"nacks": self.nacks, "redeliveries": self.redeliveries, "unexpected": self.unexpected,
               "error_ms": summarize(self.errors)}
        if self.name == TRACKED:
            stats = self.consumer.stats()
            out["consumer_stats"] = {k: v for k, v in stats.items() if k != "lateness_ms"}
        return out

    async def close(self) -> None:
        await _quietly(self.consumer.close())  # fails the pump's pending receive(): it ends
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        await _quietly(self.client.close())


async def _open(name: str, url: str, topic: str, *, delay_ms: int, precision_bits: int = 0,
                backoff: Optional[Callable[[int], int]] = None, max_redeliveries: Optional[int] = None,
                dead_letter_topic: Optional[str] = None) -> _Side:
    """Subscribe side ``name`` (its own client, subscription ``name``, Shared,
    from the earliest message). ``delay_ms``: the tracked default, or the
    built-in's fixed ``negative_ack_redelivery_delay_ms``."""
    client = _client(url)
    try:
        if name == TRACKED:
            consumer = await subscribe(client, topic, name, initial_position=_Earliest, delay_ms=delay_ms,
                                       precision_bits=precision_bits, backoff=backoff,
                                       max_redeliveries=max_redeliveries, dead_letter_topic=dead_letter_topic)
        else:
            policy = None if max_redeliveries is None else pulsar.ConsumerDeadLetterPolicy(
                max_redeliver_count=max_redeliveries, dead_letter_topic=dead_letter_topic)
            consumer = await client.subscribe(topic, name, consumer_type=_Shared, initial_position=_Earliest,
                                              negative_ack_redelivery_delay_ms=delay_ms, dead_letter_policy=policy)
    except BaseException:
        await _quietly(client.close())
        raise
    return _Side(name, client, consumer)


async def _serve(side: _Side, fresh: asyncio.Queue) -> None:
    """First deliveries go to ``fresh``; redeliveries are timed and acked."""
    while True:
        msg = await side.receive()
        if msg.redelivery_count() == 0 and msg.data() not in side.due:
            fresh.put_nowait(msg)
        else:
            side.arrived(msg)
            await side.ack(msg)


async def _start(url: str, topic: str, sides: list, tasks: list, **options: Any) -> dict[str, asyncio.Queue]:
    """Open both sides into ``sides`` and start serving each into ``tasks``
    (the caller's lists, so its ``finally`` closes whatever was opened);
    return each side's queue of first deliveries."""
    fresh: dict[str, asyncio.Queue] = {}
    for name in SIDES:
        sides.append(await _open(name, url, topic, **options))
        fresh[name] = asyncio.Queue()
        tasks.append(asyncio.create_task(_serve(sides[-1], fresh[name])))
    return fresh


async def _prefetched(fresh: dict, n: int, timeout_s: float = 15.0) -> None:
    """Wait until every side holds its ``n`` fresh messages, then a moment more.
    Why: while a backlog pours into Python the clients' nack path lags
    (measured here: nacks made meanwhile came back ~200 ms late); the scenarios
    measure nacks, not that start-up transient."""
    deadline = _now_ms() + timeout_s * 1000
    while any(q.qsize() < n for q in fresh.values()) and _now_ms() < deadline:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)


async def _wait_until(done: Callable[[], bool], deadline_ms: float, tick: Optional[Callable[[], None]] = None) -> None:
    while not done() and _now_ms() < deadline_ms:
        if tick:
            tick()
        await asyncio.sleep(0.02)
    if tick:
        tick()


async def _stop(tasks: list) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _report(progress: Optional[Progress], task: str, completed: float, total: float) -> None:
    if progress is not None:
        progress(task, completed, total)


# -- scenario 1: a worker with failures, backoff and a dead-letter topic ------------------

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


async def run_workload(url: str, n: int = 2000, *, rate: float = 400.0, fail_share: float = 0.2,
                       process_ms: float = 1.0, concurrency: int = 32, backoff_ms: tuple[int, int] = (200, 2000),
                       builtin_delay_ms: int = 200, max_redeliveries: int = 3, seed: int = 3,
                       timeout_s: float = 60.0, progress: Optional[Progress] = None) -> dict:
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
    topic = _topic("workload")
    backoff = MultiplierBackoff(*backoff_ms)
    dlq_topics = {name: f"{topic}-{name}-DLQ" for name in SIDES}
    sides: dict[str, _Side] = {}
    inspectors: list = []
    tasks: list = []
    settled: dict[str, set] = {name: set() for name in SIDES}
    dead: dict[str, set] = {name: set() for name in SIDES}
    dead_counts: dict[str, list] = {name: [] for name in SIDES}  # highest redelivery count seen per dead letter
    top_count: dict[str, dict] = {name: {} for name in SIDES}
    finished_ms: dict[str, Optional[float]] = {name: None for name in SIDES}
    memory = {"peak_nbytes": 0, "pending_at_peak": 0, "peak_pending": 0, "samples": 0}
    lags = {name: array.array("d") for name in SIDES}  # first deliveries: publish -> receive (wall ms)
    handlers: set = set()  # in-flight handler tasks of both sides
    try:
        for name in SIDES:
            sides[name] = await _open(name, url, topic, delay_ms=builtin_delay_ms, backoff=backoff,
                                      max_redeliveries=max_redeliveries, dead_letter_topic=dlq_topics[name])
            # subscribed before any nack: every dead letter is seen
            inspectors.append(await sides[name].client.subscribe(
                dlq_topics[name], "inspect", consumer_type=_Shared, initial_position=_Earliest))

        async def handle(side: _Side, msg: pulsar.Message, i: int, count: int) -> None:
            await asyncio.sleep(process_ms / 1000)  # "processing"
            if count < plan[i]:
                requested = backoff(count) if side.name == TRACKED else builtin_delay_ms
                await side.nack(msg, requested, explicit=False)
            else:
                await side.ack(msg)
                settled[side.name].add(i)

        async def work(side: _Side) -> None:
            # An asyncio worker: the receive loop hands each message to its own handler
            # task (at most ``concurrency`` at once), so a redelivery is timed when the
            # consumer delivers it, not after the messages queued ahead of it.
            slots = asyncio.Semaphore(concurrency)
            while True:
                msg = await side.receive()
                i, count = int(msg.data()), msg.redelivery_count()
                top_count[side.name][i] = max(count, top_count[side.name].get(i, 0))
                if count > 0:
                    side.arrived(msg)
                else:  # what any delivery costs right now: the floor under a redelivery's error
                    lags[side.name].append(time.time() * 1000 - msg.publish_timestamp())
                await slots.acquire()
                task = asyncio.create_task(handle(side, msg, i, count))
                handlers.add(task)
                task.add_done_callback(lambda t: (handlers.discard(t), slots.release()))

        async def watch_dead_letters(name: str, inspector: Any) -> None:
            while True:  # cancelled only at the end: a receive() lost then is harmless
                msg = await inspector.receive()
                i = int(msg.data())
                if i not in dead[name]:
                    dead[name].add(i)
                    dead_counts[name].append(top_count[name].get(i, -1))
                await inspector.acknowledge(msg)

        start = _now_ms()
        tasks = [asyncio.create_task(work(side)) for side in sides.values()]
        tasks += [asyncio.create_task(watch_dead_letters(name, ins)) for name, ins in zip(SIDES, inspectors)]
        publisher = asyncio.create_task(produce(url, topic, n, rate=rate,
                                                progress=lambda i: _report(progress, "workload/published", i, n)))
        tasks.append(publisher)
        tracker = sides[TRACKED].consumer.tracker

        def tick() -> None:
            stats = tracker.stats()
            memory["samples"] += 1
            memory["peak_pending"] = max(memory["peak_pending"], stats["pending"])
            if stats["nbytes"] > memory["peak_nbytes"]:
                memory["peak_nbytes"], memory["pending_at_peak"] = stats["nbytes"], stats["pending"]
            for name in SIDES:
                done = len(settled[name]) + len(dead[name])
                if done >= n and finished_ms[name] is None:
                    finished_ms[name] = _now_ms() - start
                _report(progress, f"workload/{name}", done, n)

        while not all(finished_ms.values()) and _now_ms() < start + timeout_s * 1000:
            if publisher.done() and publisher.exception() is not None:
                raise publisher.exception()
            tick()
            await asyncio.sleep(0.025)
        tick()
        memory["final_nbytes"] = tracker.stats()["nbytes"]
    finally:
        await _stop(tasks)
        await _stop(list(handlers))
        for inspector in inspectors:
            await _quietly(inspector.close())
        for side in sides.values():
            await side.close()
    failing = [f for f in plan if f]
    result: dict[str, Any] = {
        "messages": n, "rate": rate, "fail_share": fail_share, "process_ms": process_ms,
        "max_redeliveries": max_redeliveries, "fail_once": failing.count(1), "fail_twice": failing.count(2),
        "poison": failing.count(ALWAYS), "tracked_backoff": f"MultiplierBackoff({backoff_ms[0]}, {backoff_ms[1]})",
        "tracked_delays_ms": [backoff(count) for count in range(max_redeliveries)],
        "builtin_delay_ms": builtin_delay_ms}
    for name, side in sides.items():
        entry = side.summary()
        counts = dead_counts[name]
        entry.update({"acknowledged": len(settled[name]), "dead_lettered": len(dead[name]),
                      "deliveries_per_dead_letter": [min(counts) + 1, max(counts) + 1] if counts else None,
                      "settle_s": None if finished_ms[name] is None else round(finished_ms[name] / 1000, 2),
                      "unsettled": n - len(settled[name]) - len(dead[name]),
                      "first_delivery_lag_ms": summarize(lags[name])})
        if name == TRACKED:
            entry["memory"] = memory
        result[name] = entry
    return result


# -- scenario 2: precision when nothing starves the built-in timer ---------------------------

async def run_precision(url: str, delay_ms: int = 1000, n: int = 200, *, per_wave: int = 20,
                        precision_bits: int = 0, seed: int = 1, timeout_s: Optional[float] = None,
                        progress: Optional[Progress] = None) -> dict:
    """Nack ``n`` fresh messages on each side at ``delay_ms``, ``per_wave`` back
    to back per wave, the waves ``delay_ms/3 + 50..250 ms`` apart (random,
    seeded), both sides in each wave (alternating which goes first); ack each
    redelivery and record its error. Tracked uses ``precision_bits``."""
    topic = _topic(f"precision-{delay_ms}")
    await produce(url, topic, n)
    rng = random.Random(seed)
    sides: list[_Side] = []
    tasks: list = []
    label = f"precision {delay_ms} ms"
    gaps: list[float] = []

    def tick() -> None:
        for side in sides:
            _report(progress, f"{label}/{side.name}", side.redeliveries, n)

    try:
        fresh = await _start(url, topic, sides, tasks, delay_ms=delay_ms, precision_bits=precision_bits)
        await _prefetched(fresh, n)
        sent, wave = 0, 0
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
        await _wait_until(lambda: all(side.redeliveries >= n for side in sides), _now_ms() + limit, tick)
    finally:
        await _stop(tasks)
        for side in sides:
            await side.close()
    result: dict[str, Any] = {"delay_ms": delay_ms, "n": n, "per_wave": per_wave, "waves": wave,
                              "precision_bits": precision_bits,
                              "wave_gap_ms": [round(min(gaps)), round(max(gaps))] if gaps else None}
    for side in sides:
        result[side.name] = {**side.summary(), "missing": n - side.redeliveries}
    return result


# -- scenario 3: a steady stream of nacks ------------------------------------------------------

async def run_steady_stream(url: str, *, delay_ms: int = 200, period_ms: tuple[float, float] = (5, 10),
                            stream_ms: int = 3000, precision_bits: int = 0, seed: int = 2,
                            settle_ms: int = 3000, progress: Optional[Progress] = None) -> dict:
    """One nack on each side every ``period_ms`` (uniform, seeded) for
    ``stream_ms``, delay ``delay_ms``; redeliveries are acked as they arrive.
    Reports how many came back while the stream was still running (of those
    due by then), the errors, and when the first one came."""
    n = int(stream_ms / period_ms[0]) + 50
    topic = _topic("steady")
    await produce(url, topic, n)
    rng = random.Random(seed)
    sides: list[_Side] = []
    tasks: list = []
    label = "steady stream"
    try:
        fresh = await _start(url, topic, sides, tasks, delay_ms=delay_ms, precision_bits=precision_bits)
        await _prefetched(fresh, n)
        start = _now_ms()
        while _now_ms() - start < stream_ms:
            for side in sides:
                await side.nack(await asyncio.wait_for(fresh[side.name].get(), 10), delay_ms)
            for side in sides:
                _report(progress, f"{label}/{side.name}", side.redeliveries, sides[0].nacks)
            await asyncio.sleep(rng.uniform(*period_ms) / 1000)
        end = _now_ms()

        def tick() -> None:
            for side in sides:
                _report(progress, f"{label}/{side.name}", side.redeliveries, side.nacks)

        await _wait_until(lambda: all(side.redeliveries >= side.nacks for side in sides),
                          end + delay_ms + settle_ms, tick)
    finally:
        await _stop(tasks)
        for side in sides:
            await side.close()
    result: dict[str, Any] = {"delay_ms": delay_ms, "period_ms": list(period_ms), "stream_ms": stream_ms,
                              "precision_bits": precision_bits}
    for side in sides:
        during = sum(1 for at in side.arrivals if at < end)
        result[side.name] = {
            **side.summary(), "missing": side.nacks - side.redeliveries,
            "due_during_stream": sum(1 for due in side.dues if due < end),
            "redelivered_during_stream": during,
            "first_redelivery_after_start_ms": round(min(side.arrivals) - start) if side.arrivals else None,
            "first_redelivery_after_end_ms": round(min(side.arrivals) - end) if side.arrivals else None}
    return result


# -- the demo --------------------------------------------------------------------------------

async def run_demo(url: str, quick: bool = False, progress: Optional[Progress] = None) -> dict:
    """The three scenarios one after the other (each runs both sides at once).
    ``quick``: smaller and shorter (~10 s instead of ~30 s), 1 s precision only."""
    started = time.monotonic()
    result: dict[str, Any] = {"quick": quick, "url": url}
    result["workload"] = await run_workload(url, 600 if quick else 2000, progress=progress)
    delays = (1000,) if quick else (1000, 5000)
    sizes = {1000: 60 if quick else 200, 5000: 160}
    result["precision"] = list(await asyncio.gather(*[
        run_precision(url, d, sizes[d], per_wave=20, seed=d, progress=progress) for d in delays]))
    result["steady_stream"] = await run_steady_stream(url, stream_ms=1500 if quick else 3000, progress=progress)
    result["duration_s"] = round(time.monotonic() - started, 1)
    await asyncio.sleep(CLOSE_GRACE_S)
    return result


def _ms(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:+.0f}"


def _errors(e: dict) -> str:
    return "—" if not e["n"] else f"{_ms(e['p50'])} / {_ms(e['p99'])} / {_ms(e['max'])} ms"


Section = tuple[list[str], list[tuple[str, str, str]]]  # scenario lines, (metric, tracked, built-in) rows


def table_sections(result: dict) -> list[Section]:
    """The final table: per scenario, its description lines and its rows of
    ``(metric, TrackedConsumer, built-in)``; every figure measured in ``result``."""
    sections: list[Section] = []
    w = result["workload"]
    t, b = w[TRACKED], w[BUILTIN]
    steps = "/".join(map(str, w["tracked_delays_ms"]))

    def dead(side: dict) -> str:
        span = side["deliveries_per_dead_letter"]
        each = "" if span is None else f" (after {span[0]}" + ("" if span[0] == span[1] else f"-{span[1]}") + \
            " deliveries)"
        return f"{side['dead_lettered']}{each}"

    def settle(side: dict) -> str:
        return f"{side['settle_s']} s" if side["settle_s"] is not None else f"{side['unsettled']} unsettled"

    mem = t["memory"]
    sections.append(([ "workload", f"{w['messages']} msgs at {w['rate']:g}/s", f"{w['fail_share']:.0%} fail"], [
        ("failing once / twice / always", *[f"{w['fail_once']} / {w['fail_twice']} / {w['poison']}"] * 2),
        ("nack delay", f"backoff {steps} ms", f"fixed {w['builtin_delay_ms']} ms"),
        ("nacks", str(t["nacks"]), str(b["nacks"])),
        ("redeliveries", str(t["redeliveries"]), str(b["redeliveries"])),
        (f"dead-lettered (max_redeliveries={w['max_redeliveries']})", dead(t), dead(b)),
        ("error p50 / p99 / max", _errors(t["error_ms"]), _errors(b["error_ms"])),
        ("first deliveries: publish→receive p50 / p99 / max", *[_errors(x["first_delivery_lag_ms"]).replace("+", "")
                                                                for x in (t, b)]),
        ("every message settled after", settle(t), settle(b)),
        ("tracker memory, stats()['nbytes'] peak", f"{mem['peak_nbytes']:,} B ({mem['pending_at_peak']} pending)",
         "not exposed (C++)")]))
    def abs_p99(x: dict) -> str:
        return "—" if not x["error_ms"]["n"] else f"{x['error_ms']['abs_p99']:.0f} ms"

    for p in result["precision"]:
        t, b = p[TRACKED], p[BUILTIN]
        sections.append(([f"precision {p['delay_ms'] / 1000:g} s", f"{p['n']} nacks in {p['waves']} waves"], [
            ("|error| p99", abs_p99(t), abs_p99(b)),
            ("error p50 / p99 / max", _errors(t["error_ms"]), _errors(b["error_ms"])),
            ("redelivered", f"{t['redeliveries']} of {p['n']}", f"{b['redeliveries']} of {p['n']}")]))
    s = result["steady_stream"]
    t, b = s[TRACKED], s[BUILTIN]

    def first(x: dict) -> str:
        at = x["first_redelivery_after_start_ms"]
        return "—" if at is None else f"{at} ms after start"

    sections.append((["steady stream", f"a nack every {s['period_ms'][0]:g}-{s['period_ms'][1]:g} ms",
                      f"for {s['stream_ms'] / 1000:g} s, delay {s['delay_ms']} ms"], [
        ("nacks", str(t["nacks"]), str(b["nacks"])),
        # "due by its end" can be one or two short of those that came: arrivals may be a few ms early
        ("redelivered during the stream",
         *[f"{x['redelivered_during_stream']} ({x['due_during_stream']} due by its end)" for x in (t, b)]),
        ("first redelivery", first(t), first(b)),
        ("error p50 / p99 / max", _errors(t["error_ms"]), _errors(b["error_ms"]))]))
    return sections


def table_rows(result: dict) -> list[tuple[str, str, str, str]]:
    """``(scenario, metric, TrackedConsumer, built-in)`` rows, the scenario's
    description spread over its first rows."""
    rows = []
    for lines, section in table_sections(result):
        for i, row in enumerate(section):
            rows.append((lines[i] if i < len(lines) else "", *row))
    return rows


HEADERS = ("scenario", "metric", "TrackedConsumer", "built-in nack")
NOTE = ("error = when the application received the redelivery − when it was due (nack time + requested "
        "delay), ms; + is late. TrackedConsumer: precision_bits=0.")


def render_text(result: dict) -> str:
    """The table as plain aligned text (no rich needed)."""
    rows = [HEADERS] + table_rows(result)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines + ["", NOTE])


class _RichProgress:
    """One rich progress bar per scenario side, made on first report."""

    NAMES = {TRACKED: "TrackedConsumer", BUILTIN: "built-in nack"}

    def __init__(self, console: Any) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, \
            TimeElapsedColumn

        self._progress = RichProgress(TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), console=console)
        self._tasks: dict[str, Any] = {}

    def __call__(self, task: str, completed: float, total: float) -> None:
        if task not in self._tasks:
            scenario, side = task.rsplit("/", 1)
            self._tasks[task] = self._progress.add_task(f"{scenario}: {self.NAMES.get(side, side)}",
                                                        total=max(total, 1))
        self._progress.update(self._tasks[task], completed=completed, total=max(total, 1))

    def __enter__(self) -> "_RichProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._progress.stop()


def main(quick: bool = False, as_json: bool = False) -> int:
    """``nacktracker demo [--quick] [--json]``: run the scenarios against
    ``$PULSAR_URL`` or a fresh embedded broker, with progress bars, then print
    the comparison table (or the whole result as JSON)."""
    import json
    import os

    from .testing import pulsar_service

    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # the table still prints, plain, and no progress bars
        Console = None
    console = None
    if Console is not None:
        # Not a terminal (a pipe, a test): rich would assume 80 columns and cut cells.
        console = Console() if Console().is_terminal else Console(width=int(os.environ.get("COLUMNS", 0)) or 150)
    with pulsar_service() as url:
        where = f"$PULSAR_URL={url}" if url == os.environ.get("PULSAR_URL") else f"embedded pulsar-lite at {url}"
        print(f"nacktracker demo{' --quick' if quick else ''}: TrackedConsumer beside pulsar-client "
              f"{_version('pulsar-client')}'s built-in nack, {where}", flush=True,
              file=sys.stderr if as_json else sys.stdout)  # --json: stdout is JSON only
        if console is None or as_json:
            result = asyncio.run(run_demo(url, quick))
        else:
            with _RichProgress(console) as progress:
                result = asyncio.run(run_demo(url, quick, progress))
    if as_json:
        print(json.dumps(result, indent=1, default=str))
        return 0
    title = f"TrackedConsumer vs built-in nack, same broker, same run ({result['duration_s']} s, all measured)"
    if console is None:
        print(title)
        print(render_text(result))
        return 0
    table = Table(*HEADERS, title=title, title_justify="left", caption=NOTE, caption_justify="left")
    for column, style in zip(table.columns, ("bold", "", "green", "yellow")):
        column.style = style
    for lines, section in table_sections(result):
        for i, row in enumerate(section):
            table.add_row(lines[i] if i < len(lines) else "", *row, end_section=i == len(section) - 1)
    console.print(table)
    return 0


def _version(package: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"
