"""The two consumers a scenario compares, behind one small protocol.

:class:`Side` is what a scenario calls: ``receive``, ``ack``, ``nack``,
``summary``, ``close``, plus each side's :class:`Redeliveries` (due times and
errors of its redeliveries). :class:`TrackedSide` wraps
``nacktracker.subscribe``; :class:`BuiltinSide` wraps a plain
``pulsar.asyncio`` consumer using the client's own negative ack. Both get
their own client, a subscription named after the side, Shared, from the
earliest message (:func:`open_side`).
"""

from __future__ import annotations

import array
import asyncio
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Protocol

import pulsar
import pulsar.asyncio as pulsar_asyncio

from ..consumer import TrackedConsumer, subscribe
from ..consumer.pump import ReceivePump
from .measure import BUILTIN, SIDES, TRACKED, ErrorSummary, now_ms, summarize

__all__ = ["TRACKED", "BUILTIN", "SIDES", "Side", "SideOptions", "Redeliveries", "TrackedSide", "BuiltinSide",
           "open_side", "open_client", "produce", "quietly", "topic_name"]

_Shared = pulsar.ConsumerType.Shared
_Earliest = pulsar.InitialPosition.Earliest
#: What closing something already closed raises (the sync and the asyncio client's own classes).
_CLOSE_ERRORS = (pulsar.PulsarException, pulsar_asyncio.PulsarException)


def topic_name(scenario: str) -> str:
    """A fresh topic per scenario run."""
    return f"persistent://public/default/nacktracker-demo-{scenario}-{uuid.uuid4().hex[:8]}"


def open_client(url: str) -> pulsar_asyncio.Client:
    # The C++ client logs every connection at INFO on stdout: keep the output readable.
    return pulsar_asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
                                 operation_timeout_seconds=10)


async def quietly(awaitable: Awaitable[Any]) -> None:
    """Await a close; one of something already closed is not an error."""
    try:
        await awaitable
    except _CLOSE_ERRORS:
        pass


async def produce(url: str, topic: str, n: int, *, batching: bool = False, payload_bytes: int = 0,
                  rate: Optional[float] = None, progress: Optional[Callable[[int], None]] = None) -> None:
    """Publish ``n`` messages whose payload starts with their number (``b"17"``
    or ``b"17:xxxx"``). ``rate``: messages per second, on schedule (a live
    stream); else as fast as the producer's pending queue allows (chunks of 500)."""
    client = open_client(url)
    try:
        producer = await client.create_producer(topic, batching_enabled=batching,
                                                batching_max_publish_delay_ms=5)
        pad = b":" + b"x" * (payload_bytes - 1) if payload_bytes > 0 else b""
        if rate is None:
            for start in range(0, n, 500):
                await asyncio.gather(*[producer.send(b"%d" % i + pad) for i in range(start, min(n, start + 500))])
        else:
            start_ms, sends = now_ms(), []
            for i in range(n):
                wait = start_ms + i * 1000 / rate - now_ms()
                if wait > 0:
                    await asyncio.sleep(wait / 1000)
                sends.append(asyncio.ensure_future(producer.send(b"%d" % i + pad)))
                if progress is not None:
                    progress(i + 1)
            await asyncio.gather(*sends)
        await producer.close()
    finally:
        await quietly(client.close())


@dataclass
class Redeliveries:
    """One side's bookkeeping: when each nacked payload is due, and the error
    of every redelivery against it (ms on the loop clock; + is late)."""

    due: dict[bytes, float] = field(default_factory=dict)  # payload -> due time of its pending redelivery
    dues: array.array[float] = field(default_factory=lambda: array.array("d"))
    errors: array.array[float] = field(default_factory=lambda: array.array("d"))
    arrivals: array.array[float] = field(default_factory=lambda: array.array("d"))
    nacks: int = 0
    unexpected: int = 0  # copies nobody asked for

    def nacked(self, msg: pulsar.Message, requested_ms: float) -> None:
        due = now_ms() + requested_ms
        self.due[msg.data()] = due
        self.dues.append(due)
        self.nacks += 1

    def arrived(self, msg: pulsar.Message) -> None:
        """Record a redelivery's error against its due time."""
        due = self.due.pop(msg.data(), None)
        if due is None:
            self.unexpected += 1
            return
        now = now_ms()
        self.errors.append(now - due)
        self.arrivals.append(now)

    def awaits(self, msg: pulsar.Message) -> bool:
        """Whether ``msg`` is a redelivery this side asked for (still pending)."""
        return msg.data() in self.due

    @property
    def count(self) -> int:
        return len(self.errors)

    def summary(self) -> dict[str, Any]:
        error_ms: ErrorSummary = summarize(self.errors)
        return {"nacks": self.nacks, "redeliveries": self.count, "unexpected": self.unexpected, "error_ms": error_ms}


@dataclass(frozen=True)
class SideOptions:
    """How a side subscribes. ``delay_ms``: the tracked default nack delay, or
    the built-in's fixed ``negative_ack_redelivery_delay_ms``. The built-in
    ignores ``precision_bits`` and ``backoff`` (it has neither)."""

    delay_ms: int
    precision_bits: int = 0
    backoff: Optional[Callable[[int], int]] = None
    max_redeliveries: Optional[int] = None
    dead_letter_topic: Optional[str] = None


class Side(Protocol):
    """One consumer under test, as the scenarios see it."""

    name: str
    client: pulsar_asyncio.Client
    record: Redeliveries

    async def receive(self) -> pulsar.Message: ...

    async def ack(self, msg: pulsar.Message) -> None: ...

    async def nack(self, msg: pulsar.Message, requested_ms: float, *, explicit: bool = True) -> None:
        """Nack ``msg``; ``requested_ms`` is the delay this side was asked for
        (TrackedConsumer gets it as ``delay_ms`` when ``explicit``, else applies
        its own backoff; the built-in applies its one configured delay)."""

    def tracker_stats(self) -> Optional[dict[str, Any]]:
        """The tracker's ``stats()``, or None where it is not exposed (the C++ client's)."""

    def summary(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class TrackedSide:
    """``nacktracker.subscribe``: TrackedConsumer with its tracker."""

    name = TRACKED

    def __init__(self, client: pulsar_asyncio.Client, consumer: TrackedConsumer) -> None:
        self.client, self.consumer, self.record = client, consumer, Redeliveries()

    @classmethod
    async def open(cls, client: pulsar_asyncio.Client, topic: str, options: SideOptions) -> "TrackedSide":
        consumer = await subscribe(client, topic, cls.name, consumer_type=_Shared, initial_position=_Earliest,
                                   delay_ms=options.delay_ms,
                                   precision_bits=options.precision_bits, backoff=options.backoff,
                                   max_redeliveries=options.max_redeliveries,
                                   dead_letter_topic=options.dead_letter_topic)
        return cls(client, consumer)

    async def receive(self) -> pulsar.Message:
        return await self.consumer.receive()  # TrackedConsumer pumps receives itself: safe to cancel

    async def ack(self, msg: pulsar.Message) -> None:
        await self.consumer.acknowledge(msg)

    async def nack(self, msg: pulsar.Message, requested_ms: float, *, explicit: bool = True) -> None:
        self.record.nacked(msg, requested_ms)
        await self.consumer.negative_acknowledge(msg, delay_ms=int(requested_ms) if explicit else None)

    def tracker_stats(self) -> Optional[dict[str, Any]]:
        return dict(self.consumer.stats())

    def summary(self) -> dict[str, Any]:
        stats = self.consumer.stats()
        return {**self.record.summary(), "consumer_stats": {k: v for k, v in stats.items() if k != "timer_lag_ms"}}

    async def close(self) -> None:
        await quietly(self.consumer.close())
        await quietly(self.client.close())


class BuiltinSide:
    """A plain ``pulsar.asyncio`` consumer with the client's built-in negative
    ack: one fixed ``negative_ack_redelivery_delay_ms`` and, for dead letters,
    a ``ConsumerDeadLetterPolicy`` (the only knobs the Python client offers)."""

    name = BUILTIN

    def __init__(self, client: pulsar_asyncio.Client, consumer: pulsar_asyncio.Consumer) -> None:
        self.client, self.consumer, self.record = client, consumer, Redeliveries()
        # The plain client's receive() loses a message when its awaiting task is cancelled:
        # the consumer package's pump owns it (unbounded here: the plain client's own side).
        self._pump = ReceivePump(consumer, _admit_all, prefetch=sys.maxsize)
        self._pump.start()

    @classmethod
    async def open(cls, client: pulsar_asyncio.Client, topic: str, options: SideOptions) -> "BuiltinSide":
        policy = None if options.max_redeliveries is None else pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=options.max_redeliveries, dead_letter_topic=options.dead_letter_topic)
        consumer = await client.subscribe(topic, cls.name, consumer_type=_Shared, initial_position=_Earliest,
                                          negative_ack_redelivery_delay_ms=options.delay_ms,
                                          dead_letter_policy=policy)
        return cls(client, consumer)

    async def receive(self) -> pulsar.Message:
        msg: pulsar.Message = await self._pump.get(None)
        return msg

    async def ack(self, msg: pulsar.Message) -> None:
        await self.consumer.acknowledge(msg)

    async def nack(self, msg: pulsar.Message, requested_ms: float, *, explicit: bool = True) -> None:
        self.record.nacked(msg, requested_ms)
        await self.consumer.negative_acknowledge(msg)

    def tracker_stats(self) -> Optional[dict[str, Any]]:
        return None

    def summary(self) -> dict[str, Any]:
        return self.record.summary()

    async def close(self) -> None:
        await self._pump.stop()
        await quietly(self.consumer.close())
        await quietly(self.client.close())


def _admit_all(msg: pulsar.Message) -> bool:
    return True  # the pump queues what admit() answers True (an awaitable is only awaited)


_OPENERS: dict[str, Callable[[pulsar_asyncio.Client, str, SideOptions], Awaitable[Side]]] = {
    TRACKED: TrackedSide.open, BUILTIN: BuiltinSide.open}


async def open_side(name: str, url: str, topic: str, options: SideOptions) -> Side:
    """Subscribe side ``name`` (``TRACKED`` or ``BUILTIN``) with its own client."""
    client = open_client(url)
    try:
        return await _OPENERS[name](client, topic, options)
    except BaseException:
        await quietly(client.close())
        raise
