"""One side of bench/traffic.py, in a process of its own: its consumers,
its workers (the application) and its ledger. The parent process produces,
streams the ids its ``send()`` calls returned over a pipe, and collects the
side's end state; each side has its own interpreter and event loop, so one
side's work (the plain client's resurfaced siblings, say) never delays the
other's deliveries.

Protocol (``multiprocessing`` pipe): side -> parent ``("ready", refused)``,
then ``("result", dict)``; parent -> side ``("published", [(number, ledger,
entry, batch_index), ...])`` any number of times, then ``("produced", dict)``.
"""

from __future__ import annotations

import array
import asyncio
import sys
import time
import traceback
from typing import Any, Optional

import pulsar
import pulsar.asyncio as pulsar_asyncio

import nacktracker
from bench.traffic_ledger import TRACKED, Config, Ledger, Scenario, Verdict, quantiles
from nacktracker.consumer.pump import ReceivePump
from nacktracker.demo.sides import open_client as client  # quiet: the C++ client logs INFO on stdout
from nacktracker.demo.sides import quietly

#: What the client (or TrackedConsumer, which raises the client's classes and ValueError/TypeError
#: at its boundary) raises for a refused or failed call.
PULSAR_ERRORS = (pulsar.PulsarException, pulsar_asyncio.PulsarException)
REFUSALS = (ValueError, TypeError) + PULSAR_ERRORS


def now_ms() -> float:
    return asyncio.get_running_loop().time() * 1000.0


def _admit_all(msg: pulsar.Message) -> bool:
    return True  # the pump queues what admit() answers True (an awaitable is only awaited)


class PlainConsumer:
    """The plain ``pulsar.asyncio.Consumer`` behind the calls the workers make.
    Its ``receive()`` loses a message when the awaiting task is cancelled, so
    the consumer package's pump owns it (unbounded: the plain client's side)."""

    def __init__(self, consumer: pulsar_asyncio.Consumer) -> None:
        self.consumer = consumer
        self.pump = ReceivePump(consumer, _admit_all, prefetch=sys.maxsize)
        self.pump.start()

    async def receive(self) -> pulsar.Message:
        return await self.pump.get(None)

    async def acknowledge(self, msg: pulsar.Message) -> None:
        await self.consumer.acknowledge(msg)

    async def acknowledge_cumulative(self, msg: pulsar.Message) -> None:
        await self.consumer.acknowledge_cumulative(msg)

    async def negative_acknowledge(self, msg: pulsar.Message, delay_ms: Optional[int] = None) -> None:
        await self.consumer.negative_acknowledge(msg)  # one configured delay: delay_ms cannot be honoured

    async def close(self) -> None:
        await self.pump.stop()
        await quietly(self.consumer.close())


class Side:
    """One subscription, its consumers, and the application's ledger."""

    def __init__(self, name: str, client: pulsar_asyncio.Client, ledger: Ledger) -> None:
        self.name, self.client, self.ledger = name, client, ledger
        self.consumers: list = []
        self.refused: Optional[str] = None
        self.last_msg: Optional[pulsar.Message] = None  # cumulative: highest-numbered message received
        self.twins: dict[int, list] = {}  # number -> [(consumer, copy)] that arrived while a worker held it

    async def open(self, topic: str, scenario: Scenario, cfg: Config) -> None:
        kind = {"Failover": pulsar.ConsumerType.Failover, "Key_Shared": pulsar.ConsumerType.KeyShared,
                "Shared": pulsar.ConsumerType.Shared}[scenario.subscription]
        common = dict(consumer_type=kind, initial_position=pulsar.InitialPosition.Earliest,
                      batch_index_ack_enabled=cfg.batch_index_ack)
        for i in range(scenario.consumers):
            name = f"{self.name}-{i}"
            try:
                if self.name == TRACKED:
                    c = await nacktracker.subscribe(self.client, topic, self.name, consumer_name=name,
                                                    precision_bits=cfg.precision_bits, delay_ms=1000, **common)
                else:
                    c = PlainConsumer(await self.client.subscribe(
                        topic, self.name, consumer_name=name,
                        negative_ack_redelivery_delay_ms=cfg.plain_delay_ms, **common))
            except REFUSALS as exc:  # e.g. a subscription type the consumer refuses: reported, not fatal
                self.refused = f"{type(exc).__name__}: {exc}"
                return
            self.consumers.append(c)

    def end_state(self) -> dict:
        out: dict[str, Any] = {"side": self.name, **self.ledger.summary()}
        if self.refused:
            out["refused"] = self.refused
        if self.name == TRACKED and self.consumers:
            stats = [c.stats() for c in self.consumers]
            out["records_end"] = sum(s["batch_records"] for s in stats)
            out["pending_end"] = sum(s["pending"] for s in stats)
            out["consumer_stats"] = [{k: v for k, v in s.items() if isinstance(v, (int, float))} for s in stats]
        return out

    async def close(self) -> None:
        for c in self.consumers:
            await quietly(c.close())
        await quietly(self.client.close())


def _since_publish_ms(msg: pulsar.Message) -> float:
    """Wall-clock ms from the broker storing ``msg`` to now (same machine: the
    broker's clock is ours)."""
    return time.time() * 1000.0 - msg.publish_timestamp()


def _identify(msg: pulsar.Message) -> tuple[int, tuple]:
    mid = msg.message_id()
    try:
        number = int(msg.data())
    except ValueError:
        number = -1
    return number, (mid.ledger_id(), mid.entry_id(), mid.batch_index())


async def _ack(side: Side, consumer: Any, msg: pulsar.Message) -> None:
    try:
        await consumer.acknowledge(msg)
    except REFUSALS:
        side.ledger.ack_failures += 1


async def settle_twins(side: Side, number: int, delay: Optional[int]) -> None:
    """Settle the copies of ``number`` that arrived while a worker held it the
    way that worker settled it: each through the consumer that received it.
    A copy left unsettled stays the broker's pending entry of its consumer,
    and Apache Pulsar redelivers an entry only when the consumer it was last
    dispatched to asks: the holder's nack alone would never bring it back."""
    for consumer, copy in side.twins.pop(number, ()):
        side.ledger.twins_settled += 1
        if delay is None:
            await _ack(side, consumer, copy)
        else:
            await consumer.negative_acknowledge(copy, delay_ms=delay)


async def serve(side: Side, consumer: Any, cfg: Config, index: int = 0) -> None:
    """A worker: receive, hold, then nack or acknowledge, per ``cfg.plan``."""
    ledger, plan = side.ledger, cfg.plan
    while True:
        msg = await consumer.receive()
        number, mid = _identify(msg)
        verdict = ledger.delivered(number, mid, now_ms(), _since_publish_ms(msg), index)
        if verdict is Verdict.IGNORE:
            side.twins.setdefault(number, []).append((consumer, msg))
            continue
        if verdict is Verdict.REACK:
            await _ack(side, consumer, msg)
            continue
        nacks = ledger.nacks.get(number, 0)
        await asyncio.sleep(plan.hold_s(number, nacks))
        delay = plan.nack(number, nacks)
        if delay is None:
            ledger.acking(number, index, now_ms())
            await _ack(side, consumer, msg)
        else:
            ledger.nacked(number, now_ms(), delay if side.name == TRACKED else cfg.plain_delay_ms, index)
            await consumer.negative_acknowledge(msg, delay_ms=delay)
        if side.twins:
            await settle_twins(side, number, delay)


async def serve_cumulative(side: Side, consumer: Any, cfg: Config) -> None:
    """The in-order worker of the cumulative scenario: nack per ``cfg.plan``,
    else mark done, and acknowledge cumulatively every ``cumulative_every``."""
    ledger, plan, since = side.ledger, cfg.plan, 0
    while True:
        msg = await consumer.receive()
        number, mid = _identify(msg)
        if ledger.delivered(number, mid, now_ms(), _since_publish_ms(msg)) is not Verdict.PROCESS:
            continue  # a copy of something covered or still owed: the next cumulative ack covers it
        if side.last_msg is None or number > _identify(side.last_msg)[0]:
            side.last_msg = msg
        nacks = ledger.nacks.get(number, 0)
        await asyncio.sleep(0)  # no processing time: one in-order worker must keep up with the producer
        delay = plan.nack(number, nacks)
        if delay is not None:
            ledger.nacked(number, now_ms(), delay if side.name == TRACKED else cfg.plain_delay_ms)
            await consumer.negative_acknowledge(msg, delay_ms=delay)
            continue
        ledger.done(number)
        since += 1
        if since >= cfg.cumulative_every:
            since = 0
            await ack_cumulative(side, consumer, msg)


async def ack_cumulative(side: Side, consumer: Any, msg: pulsar.Message) -> None:
    side.ledger.cumulative_ack(_identify(msg)[0])
    try:
        await consumer.acknowledge_cumulative(msg)
    except REFUSALS:
        side.ledger.ack_failures += 1


class LoopLag:
    """How late the event loop wakes a 10 ms sleep (ms): both sides share the
    loop, so a late redelivery with a large loop lag is the process's, not the
    consumer's."""

    def __init__(self) -> None:
        self.samples = array.array("d")
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            before = now_ms()
            await asyncio.sleep(0.01)
            self.samples.append(now_ms() - before - 10.0)

    async def stop(self) -> dict:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        q = quantiles(self.samples)
        return {"p50": q["p50"], "p99": q["p99"], "max": q["max"]}


async def wait_until(done: Any, seconds: float) -> bool:
    deadline = now_ms() + seconds * 1000
    while not done():
        if now_ms() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def side_main(url: str, topic: str, name: str, scenario: Scenario, cfg: Config, conn: Any) -> None:
    """The child process's entry point."""
    try:
        asyncio.run(_run_side(url, topic, name, scenario, cfg, conn))
    except BaseException:
        conn.send(("error", traceback.format_exc()))  # the parent stops at once instead of timing out
        raise
    finally:
        time.sleep(0.2)  # pulsar-client's threads may still release callbacks (nacktracker.demo.measure.CLOSE_GRACE_S)


async def _run_side(url: str, topic: str, name: str, scenario: Scenario, cfg: Config, conn: Any) -> None:
    side = Side(name, client(url), Ledger(sent=cfg.messages))
    ledger, workers = side.ledger, []
    lag, cpu_start = LoopLag(), time.process_time()
    produced: Optional[dict] = None
    try:
        await side.open(topic, scenario, cfg)
        for index, consumer in enumerate(side.consumers):
            if scenario.cumulative:
                workers.append(asyncio.create_task(serve_cumulative(side, consumer, cfg)))
            else:
                workers += [asyncio.create_task(serve(side, consumer, cfg, index)) for _ in range(cfg.workers)]
        conn.send(("ready", side.refused))

        def read_pipe() -> bool:
            nonlocal produced
            while conn.poll():
                kind, payload = conn.recv()
                if kind == "published":
                    ledger.published.update((n, (lid, eid, bi)) for n, lid, eid, bi in payload)
                else:
                    produced = payload
            return produced is not None

        await wait_until(read_pipe, 3600)
        if side.refused is None:
            if scenario.cumulative:  # every message delivered once, then the final cumulative ack
                await wait_until(lambda: len(ledger.fate) + ledger.covered + 1 >= len(ledger.published),
                                 cfg.drain_s)
                await asyncio.sleep(0.5)
                if side.last_msg is not None:
                    await ack_cumulative(side, side.consumers[0], side.last_msg)
            drained = await wait_until(lambda: ledger.settled, cfg.drain_s)
            await asyncio.sleep(cfg.quiet_s)
        else:
            drained = False
        # a worker that died (an exception from the consumer) would quietly shrink the application
        crashed = [repr(t.exception()) for t in workers if t.done() and not t.cancelled() and t.exception()]
        result = {**side.end_state(), "drained": drained, "loop_lag_ms": await lag.stop(),
                  "cpu_s": round(time.process_time() - cpu_start, 2), "worker_errors": crashed}
    finally:
        lag.task.cancel()
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await side.close()
    conn.send(("result", result))
