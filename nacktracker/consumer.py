"""TrackedConsumer: a drop-in ``pulsar.asyncio.Consumer`` whose negative acks
go through :class:`~nacktracker.NegativeAcksTracker`.

What it adds to the consumer it wraps, and why:

* ``negative_acknowledge(msg, delay_ms=…)``: each nack is scheduled by the
  tracker (exact time buckets, one timer, never postponed by later nacks) and
  redelivered through :class:`~nacktracker.adapters.PulsarAdapter`.
* ``receive(timeout_ms=…)`` that never loses a message: one owned background
  task (the *pump*) awaits ``pulsar.asyncio.Consumer.receive()`` and feeds a
  queue; callers wait on the queue, whose waits are safe to cancel (cancelling
  the client's own ``receive()`` loses the message it was about to return).
* Acks cancel pending nacks of the same message (``tracker.discard``).
* Early copies are dropped: a message the tracker still holds (e.g. sent again
  by the broker after a reconnect, or brought back by a sibling of its batch
  entry) is not handed to the application; its own bucket asks for it again.
* Batch entries (Pulsar redelivers whole entries): see :class:`_NackedEntry`.
* Dead letters: after ``max_redeliveries`` the message is published to
  ``dead_letter_topic`` and acknowledged; a failed publish leaves it pending.

Background work (the pump, the tracker's timer, dead-letter publishes) is owned
by the consumer and cancelled or awaited by :meth:`TrackedConsumer.close`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from typing import Any, Callable, Optional, Union

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_asyncio

from ._checks import check_delay_ms, check_int
from .adapters.pulsar import MIN_NACK_DELAY_MS, PulsarAdapter
from .keys import MessageKey, key_of
from .tracker import NegativeAcksTracker

__all__ = ["TrackedConsumer", "subscribe", "ReceiveTimeout", "ConsumerClosed",
           "PROPERTY_REAL_TOPIC", "PROPERTY_ORIGIN_MESSAGE_ID"]

log = logging.getLogger(__name__)

#: Dead-letter message properties, named as Pulsar's Java client names them.
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"

_PulsarException = pulsar_asyncio.PulsarException
_PARTITION_SUFFIX = re.compile(r"-partition-\d+$")
_NO_INDEX = sys.maxsize  # "every index of this entry has already been pulled"
_STOP = object()  # queue sentinel: the pump stopped (closed or failed)


class ReceiveTimeout(pulsar.Timeout, _PulsarException):
    """``receive(timeout_ms=…)`` found no message in time.

    Both a ``pulsar.Timeout`` (what the sync client's ``receive(timeout_millis)``
    raises) and a ``pulsar.asyncio.PulsarException`` whose ``error()`` is
    ``pulsar.Result.Timeout`` (what the asyncio client raises), so either
    ``except`` clause a caller already has keeps working."""

    def __init__(self, msg: str = "no message received in time") -> None:
        _PulsarException.__init__(self, pulsar.Result.Timeout, msg)
        Exception.__init__(self, msg)


class ConsumerClosed(pulsar.AlreadyClosed, _PulsarException):
    """The consumer was closed. A ``pulsar.AlreadyClosed`` and a
    ``pulsar.asyncio.PulsarException`` with ``pulsar.Result.AlreadyClosed``."""

    def __init__(self, msg: str = "consumer is closed") -> None:
        _PulsarException.__init__(self, pulsar.Result.AlreadyClosed, msg)
        Exception.__init__(self, msg)


MessageLike = Union[pulsar.Message, pulsar.MessageId, _pulsar.Message, _pulsar.MessageId]


class _NackedEntry:
    """Bookkeeping for one batch entry that has nacked messages.

    Pulsar redelivers entries, not messages: nacking one message of a batch
    brings the whole entry back. So for each entry with nacked messages (and
    only those) the consumer keeps

    ``nacked``: batch index -> ``[fire_ms, *held_ids]``. ``fire_ms`` is when the
      tracker hands that message's bucket to the adapter (``None`` once the
      message has been surfaced again and awaits the application's verdict);
      ``held_ids`` are the message ids of the copies that were nacked. Each id
      carries the client's per-delivery batch acker, and acking it when the
      message is finally acknowledged completes that delivery's acker, which
      is what makes the client ack the entry at the broker.
    ``unseen_from``: the first batch index of the entry's current delivery the
      pump had not pulled yet when the record was made; those siblings are
      surfaced when they arrive (the application has never seen them).

    When a copy of the entry arrives, a nacked message is surfaced only if its
    bucket has fired; every other sibling is dropped: it was acknowledged, or
    the application still holds its earlier copy, or its own bucket has yet to
    fire and will ask for the entry again. The record is dropped when every
    nacked message of the entry has been acknowledged (or dead-lettered); if
    the pump is part-way through a copy of the entry at that moment, it is kept
    until that copy's last message (or the partition's next entry) has passed,
    so the copy's remaining siblings are still dropped.
    Memory (``tests/test_pulsar.py::test_batch_record_memory``, tracemalloc):
    ~510 B of Python objects per entry with one nacked message, ~+100-150 B
    per further nacked message; each held id also pins ~150 B of C++ (the
    id and its delivery's batch acker). Entries without nacks cost nothing.
    """

    __slots__ = ("nacked", "unseen_from")

    def __init__(self, unseen_from: int) -> None:
        self.nacked: dict[int, list] = {}
        self.unseen_from = unseen_from

    def pending(self) -> bool:
        """Whether any nacked message still waits for its bucket."""
        return any(state[0] is not None for state in self.nacked.values())


class TrackedConsumer:
    """A ``pulsar.asyncio.Consumer`` with exact, tracked negative acks.

    Usually made by :func:`subscribe`. Same methods and argument types as
    ``pulsar.asyncio.Consumer`` (``receive``, ``acknowledge``,
    ``acknowledge_cumulative``, ``negative_acknowledge``, ``seek``,
    ``unsubscribe``, ``close``, ``get_last_message_id``, ``topic``,
    ``subscription_name``, ``consumer_name``,
    ``redeliver_unacknowledged_messages``), plus ``negative_acknowledge(msg,
    delay_ms=…)``, ``receive(timeout_ms=…)``, ``async with`` and ``async for``.

    ``consumer``: a ``pulsar.asyncio.Consumer`` subscribed with
    ``negative_ack_redelivery_delay_ms=100`` (see
    :class:`~nacktracker.adapters.PulsarAdapter`) on a Shared or Key_Shared
    subscription. ``client``: the ``pulsar.asyncio.Client`` it came from
    (needed for dead letters). ``delay_ms``, ``precision_bits``, ``backoff``,
    ``max_redeliveries``: as for :class:`~nacktracker.NegativeAcksTracker`.
    ``dead_letter_topic``: where messages go after ``max_redeliveries``
    (default ``<topic>-<subscription>-DLQ`` per original topic, Pulsar's
    naming). ``lead_ms``/``min_gap_ms``: passed to the adapter. ``prefetch``:
    messages the pump may hold ahead of ``receive()`` (the client's own
    receiver queue does the real buffering).

    Redelivery counts are the broker's: for a batch message they count
    redeliveries of its entry, so a message whose siblings were nacked too can
    see more than one increment per own nack (as with Pulsar itself).

    ``close()`` abandons pending nacks: as with any Pulsar consumer, the
    broker hands its unacknowledged messages back to the subscription at once.
    """

    def __init__(self, consumer: pulsar_asyncio.Consumer, *, client: Optional[pulsar_asyncio.Client] = None,
                 delay_ms: int = 60_000, precision_bits: int = 8,
                 backoff: Optional[Callable[[int], int]] = None, max_redeliveries: Optional[int] = None,
                 dead_letter_topic: Optional[str] = None, lead_ms: Optional[int] = None,
                 min_gap_ms: Optional[int] = None, prefetch: int = 16) -> None:
        if not isinstance(consumer, pulsar_asyncio.Consumer):
            raise TypeError(f"consumer must be a pulsar.asyncio.Consumer, not {type(consumer).__name__}")
        if client is not None and not isinstance(client, pulsar_asyncio.Client):
            raise TypeError(f"client must be a pulsar.asyncio.Client, not {type(client).__name__}")
        if dead_letter_topic is not None and not isinstance(dead_letter_topic, str):
            raise TypeError(f"dead_letter_topic must be a str, not {type(dead_letter_topic).__name__}")
        if dead_letter_topic is not None and max_redeliveries is None:
            raise ValueError("dead_letter_topic needs max_redeliveries")
        if max_redeliveries is not None and client is None:
            raise ValueError("max_redeliveries needs the client (to publish dead letters)")
        self._prefetch = check_int("prefetch", prefetch)
        if self._prefetch < 1:
            raise ValueError("prefetch must be >= 1")
        self._consumer = consumer
        self._client = client
        self.adapter = PulsarAdapter(consumer, lead_ms=lead_ms, min_gap_ms=min_gap_ms)
        self.tracker = NegativeAcksTracker(
            self.adapter, delay_ms=delay_ms, precision_bits=precision_bits, backoff=backoff,
            max_redeliveries=max_redeliveries,
            on_dead_letter=self._on_dead_letter if max_redeliveries is not None else None,
            consumer_name=consumer.consumer_name())
        self.dead_letter_topic = dead_letter_topic
        # a single-topic consumer's ids need no topic; remember it for bare-id calls
        self._own_topic = None if self.adapter.multi_topic else consumer.topic()
        width = 1 << precision_bits
        self._fire_add = 0 if self.tracker.rounding == "floor" else width - 1
        self._fire_mask = ~(width - 1)
        self._entries: dict[tuple[int, int, int, Optional[str]], _NackedEntry] = {}
        # (topic, partition) -> (ledger, entry, batch index, id) of the last batch message pulled
        self._pulled: dict[tuple[Optional[str], int], tuple[int, int, int, Any]] = {}
        self._lingering: dict[tuple[Optional[str], int], tuple] = {}  # (topic, partition) -> resolved record key
        self._high: dict[tuple[Optional[str], int], tuple[int, int]] = {}  # highest (ledger, entry) pulled
        self._queue: asyncio.Queue = asyncio.Queue()
        self._space = asyncio.Event()
        self._pump: Optional[asyncio.Task] = None
        self._error: Optional[BaseException] = None
        self._closed = self._unsubscribing = False
        self._dlq_candidate: Any = None
        self._dlq_producers: dict[str, pulsar_asyncio.Producer] = {}
        self._counts = {"received": 0, "surfaced": 0, "early_copies_dropped": 0, "siblings_dropped": 0,
                        "dead_letter_published": 0, "dead_letter_failed": 0}
        try:
            asyncio.get_running_loop()
            self._start_pump()
        except RuntimeError:
            pass  # started by the first receive() inside a loop

    # -- receiving -----------------------------------------------------------------

    async def receive(self, timeout_ms: Optional[int] = None) -> pulsar.Message:
        """The next message. ``timeout_ms``: give up after that long and raise
        :class:`ReceiveTimeout` (a ``pulsar.Timeout``); no message is lost by
        the timeout or by cancelling the caller. Raises :class:`ConsumerClosed`
        once closed. Runtime: O(1)."""
        if timeout_ms is not None:
            timeout_ms = check_delay_ms("timeout_ms", timeout_ms)
        if self._closed:
            raise ConsumerClosed()
        if self._pump is None:
            self._start_pump()
        if timeout_ms is None:
            item = await self._queue.get()
        else:
            try:
                # Cancelling Queue.get() is safe (the item stays queued), unlike the client's receive().
                item = await asyncio.wait_for(self._queue.get(), timeout_ms / 1000)
            except asyncio.TimeoutError:
                raise ReceiveTimeout(f"no message within {timeout_ms} ms") from None
        if item is _STOP:
            self._queue.put_nowait(_STOP)  # keep waking the other receivers
            raise self._error if self._error is not None else ConsumerClosed()
        if self._queue.qsize() < self._prefetch:
            self._space.set()
        self._counts["surfaced"] += 1
        return item

    def __aiter__(self) -> "TrackedConsumer":
        return self

    async def __anext__(self) -> pulsar.Message:
        try:
            return await self.receive()
        except ConsumerClosed:
            raise StopAsyncIteration from None

    def _start_pump(self) -> None:
        self._pump = asyncio.get_running_loop().create_task(self._run_pump(), name="nacktracker-pump")

    async def _run_pump(self) -> None:
        """Owns the client's ``receive()``: never cancelled mid-wait except on close."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self._queue.qsize() >= self._prefetch:
                    self._space.clear()
                    await self._space.wait()
                msg = await self._consumer.receive()
                self._counts["received"] += 1
                if self._admit(msg, loop.time() * 1000.0):
                    self._queue.put_nowait(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the consumer was closed or failed: tell the receivers
            if not (self._closed or self._unsubscribing):
                log.warning("receive failed; the consumer stops delivering: %r", exc)
                self._error = exc
            self._queue.put_nowait(_STOP)

    def _admit(self, msg: pulsar.Message, now_ms: float) -> bool:
        """Whether a received copy goes to the application (see the module doc).
        Runtime: O(1), plus O(b) for a redelivered non-batched message whose
        ledger has nacks pending in b buckets."""
        mid = msg.message_id()
        index = mid.batch_index()
        topic, partition = msg.topic_name(), mid.partition()
        ledger, entry = mid.ledger_id(), mid.entry_id()
        if index < 0:
            if self._lingering:
                self._end_delivery(topic, partition, None)
            # First deliveries arrive in position order per partition: only a copy at or
            # behind the highest position seen can be a redelivery, so only those pay the
            # tracker lookup (O(b)).
            high = self._high.get((topic, partition))
            if high is None or (ledger, entry) > high:
                self._high[(topic, partition)] = (ledger, entry)
            elif self.tracker.pending and msg in self.tracker:
                self._counts["early_copies_dropped"] += 1
                return False
            return True
        if self._lingering:
            self._end_delivery(topic, partition, (partition, ledger, entry, topic))
        self._pulled[(topic, partition)] = (ledger, entry, index, mid)
        where = (partition, ledger, entry, topic)
        record = self._entries.get(where)
        if record is None:
            return True
        if index >= record.unseen_from:  # first sight of a sibling of the delivery that was nacked in
            record.unseen_from = index + 1
            admit = True
        else:
            state = record.nacked.get(index)
            admit = state is not None and state[0] is not None and state[0] <= now_ms
            if admit:
                state[0] = None  # surfaced: now the application's again
            else:
                self._counts["siblings_dropped" if state is None or state[0] is None
                             else "early_copies_dropped"] += 1
        if not record.nacked and index + 1 >= (_batch_size(mid) or _NO_INDEX):  # a resolved record's last copy
            self._lingering.pop((topic, partition), None)
            del self._entries[where]
        return admit

    def _end_delivery(self, topic: str, partition: int, entry: Optional[tuple]) -> None:
        """The pump moved on to another entry of this topic partition: a resolved
        record kept for the rest of its entry's delivery can go."""
        where = self._lingering.get((topic, partition))
        if where is not None and where != entry:
            del self._lingering[(topic, partition)]
            record = self._entries.get(where)
            if record is not None and not record.nacked:
                del self._entries[where]

    # -- acknowledging -------------------------------------------------------------

    async def acknowledge(self, message: MessageLike) -> None:
        """Acknowledge a message (or id) and cancel its pending nacks.
        Runtime: O(1), plus O(b) when its ledger has nacks pending in b buckets."""
        held = self._settle(message)
        await self._consumer.acknowledge(message)
        for mid in held:  # complete the batch ackers of the deliveries it was nacked in
            await self._consumer.acknowledge(mid)

    async def acknowledge_cumulative(self, message: MessageLike) -> None:
        """As ``pulsar.asyncio.Consumer.acknowledge_cumulative`` (not allowed on
        Shared subscriptions). Cancels pending nacks of this message only;
        earlier messages' pending nacks fire and the broker ignores them."""
        held = self._settle(message)
        await self._consumer.acknowledge_cumulative(message)
        for mid in held:
            await self._consumer.acknowledge(mid)

    async def negative_acknowledge(self, message: MessageLike, delay_ms: Optional[int] = None) -> None:
        """Redeliver ``message`` after ``delay_ms`` (default: the backoff for
        its redelivery count, else the consumer's ``delay_ms``).

        Once its redelivery count reaches ``max_redeliveries`` the message is
        dead-lettered instead. A bare message id has no redelivery count (it
        is never dead-lettered) and, on a multi-topic consumer, no topic: pass
        the Message there. For a batch message pass the Message or its
        ``message_id()``, never an id built by hand: a hand-built batch id
        acks the whole entry when the consumer later acks it on your behalf.
        Never blocks. Runtime: O(1) amortised.
        """
        if self._closed:
            raise ConsumerClosed()
        key, count = self._key(message)
        if delay_ms is not None:
            delay_ms = check_delay_ms("delay_ms", delay_ms)
        held = _held_id(message)
        self._dlq_candidate = message
        try:
            due = self.tracker.add(key, delay_ms=delay_ms, redelivery_count=count or 0)
        finally:
            self._dlq_candidate = None
        if key.batch_index < 0:
            return
        where = self._where(key)
        if where is None:
            where = (key.partition, key.ledger_id, key.entry_id, key.topic)
            self._entries[where] = _NackedEntry(self._unseen_from(key))
        elif self._lingering.get((where[3], where[0])) == where:
            del self._lingering[(where[3], where[0])]  # pending again: no longer on its way out
        record = self._entries[where]
        state = record.nacked.setdefault(key.batch_index, [None])
        # a dead-lettered message (due None) is surfaced whenever it might come back
        state[0] = -float("inf") if due is None else \
            ((due + self._fire_add) & self._fire_mask) - self.adapter.lead_ms
        if held is not None:
            state.append(held)

    def _settle(self, message: MessageLike) -> list:
        """Bookkeeping of an ack: cancel pending nacks; return held ids to ack too."""
        key, _ = self._key(message)
        if key.batch_index < 0:
            self.tracker.discard(key)
            return []
        record = self._record(key)
        if record is None:
            return []
        state = record.nacked.pop(key.batch_index, None)
        if state is None:
            return []
        if not record.pending():
            self.tracker.discard(key)  # a bucket of an acked, still pending nack: nothing left to fetch
            if not record.nacked:
                self._resolve(key)
        return state[1:]

    def _resolve(self, key: MessageKey) -> None:
        """Every nacked message of the entry is settled: drop its record, unless
        the pump is part-way through a delivery of that entry, whose remaining
        siblings must still be dropped (the record then goes with the entry's
        last copy or the next entry of the topic partition)."""
        where = self._where(key)
        if where is None:
            return
        partition, ledger, entry, topic = where
        last = self._pulled.get((topic, partition))
        if last is not None and last[:2] == (ledger, entry) and last[2] + 1 < (_batch_size(last[3]) or _NO_INDEX):
            self._lingering[(topic, partition)] = where
        else:
            del self._entries[where]

    def _where(self, key: MessageKey) -> Optional[tuple]:
        """The record key of a message's entry, if it has a record."""
        where = (key.partition, key.ledger_id, key.entry_id, key.topic)
        if where in self._entries:
            return where
        if key.topic is None:  # a bare id on a multi-topic consumer: O(records)
            for candidate in self._entries:
                if candidate[:3] == where[:3]:
                    return candidate
        return None

    def _record(self, key: MessageKey) -> Optional[_NackedEntry]:
        where = self._where(key)
        return None if where is None else self._entries[where]

    def _unseen_from(self, key: MessageKey) -> int:
        last = self._pulled.get((key.topic, key.partition))
        if last is not None and last[:2] == (key.ledger_id, key.entry_id):
            return last[2] + 1  # the rest of this delivery is still on its way
        return _NO_INDEX

    def _key(self, message: MessageLike) -> tuple[MessageKey, Optional[int]]:
        if isinstance(message, MessageKey):
            raise TypeError("pass a pulsar Message or MessageId, not a MessageKey")
        if isinstance(message, pulsar.MessageId):
            message = message._msg_id
        key, count = key_of(message)
        if key.topic is None and self._own_topic is not None:
            key = key._replace(topic=self._own_topic)
        return key, count

    # -- dead letters --------------------------------------------------------------

    def _on_dead_letter(self, key: MessageKey) -> Any:
        message = self._dlq_candidate
        if not isinstance(message, (pulsar.Message, _pulsar.Message)):
            raise TypeError(f"cannot dead-letter {key}: only a Message carries its payload")
        return self._dead_letter(message)

    async def _dead_letter(self, message: Union[pulsar.Message, _pulsar.Message]) -> None:
        """Publish to the dead-letter topic, then ack. Raising leaves the message
        pending (the tracker redelivers it and the next nack tries again)."""
        topic = message.topic_name()
        target = self.dead_letter_topic or \
            f"{_PARTITION_SUFFIX.sub('', topic)}-{self._consumer.subscription_name()}-DLQ"
        mid = message.message_id()
        properties = dict(message.properties())
        properties[PROPERTY_REAL_TOPIC] = topic
        properties[PROPERTY_ORIGIN_MESSAGE_ID] = _java_id(mid)
        options: dict[str, Any] = {"properties": properties}
        if message.partition_key():
            options["partition_key"] = message.partition_key()
        if message.ordering_key():
            options["ordering_key"] = message.ordering_key()
        if message.event_timestamp():
            options["event_timestamp"] = message.event_timestamp()
        try:
            producer = self._dlq_producers.get(target)
            if producer is None:
                producer = self._dlq_producers[target] = await self._client.create_producer(target)
            await producer.send(message.data(), **options)
        except Exception:
            self._counts["dead_letter_failed"] += 1
            broken = self._dlq_producers.pop(target, None)  # a fresh producer next time
            if broken is not None:
                await _quietly(broken.close())
            raise
        self._counts["dead_letter_published"] += 1
        await self.acknowledge(message)

    # -- the rest of the consumer API ----------------------------------------------

    async def seek(self, messageid: Union[pulsar.MessageId, int]) -> None:
        """As ``pulsar.asyncio.Consumer.seek``. Pending nacks stay scheduled."""
        await self._consumer.seek(messageid)

    async def get_last_message_id(self) -> _pulsar.MessageId:
        return await self._consumer.get_last_message_id()

    def redeliver_unacknowledged_messages(self) -> None:
        """As the client's. Copies of messages with pending nacks that come back
        are dropped; their own buckets bring them back on time."""
        self._consumer.redeliver_unacknowledged_messages()

    def topic(self) -> str:
        return self._consumer.topic()

    def subscription_name(self) -> str:
        return self._consumer.subscription_name()

    def consumer_name(self) -> str:
        return self._consumer.consumer_name()

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, Any]:
        """The tracker's stats plus the consumer's counters and batch records."""
        return {**self.tracker.stats(), **self._counts, "batch_records": len(self._entries),
                "bursts": len(self.adapter.bursts)}

    async def unsubscribe(self) -> None:
        """Unsubscribe, then release everything :meth:`close` releases. Pending
        nacks are dropped with the subscription."""
        if self._closed:
            raise ConsumerClosed()
        self._unsubscribing = True  # the pump's receive() is about to fail: expected
        try:
            await self._consumer.unsubscribe()
        finally:
            self._unsubscribing = False
        await self._shutdown(close_consumer=False)

    async def close(self) -> None:
        """Stop the pump and the tracker (awaiting dead letters in flight),
        close dead-letter producers and the consumer. Idempotent."""
        await self._shutdown(close_consumer=True)

    async def __aenter__(self) -> "TrackedConsumer":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (f"TrackedConsumer(topic={self.topic()!r}, subscription={self.subscription_name()!r}, "
                f"pending={self.tracker.pending}, closed={self._closed})")

    async def _shutdown(self, close_consumer: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pump is not None:
            # The one place the client's receive() is cancelled: whatever it was about to
            # return is unacknowledged and goes back to the subscription with the consumer.
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        self._queue.put_nowait(_STOP)
        await self.tracker.close()
        await self.adapter.aclose()
        for producer in self._dlq_producers.values():
            await _quietly(producer.close())
        self._dlq_producers.clear()
        if close_consumer:
            await _quietly(self._consumer.close())


def _held_id(message: MessageLike) -> Any:
    """The id object to keep for a nacked batch message (it references the
    delivery's batch acker; ``None`` for a non-batched message)."""
    if isinstance(message, (pulsar.Message, _pulsar.Message)):
        mid = message.message_id()
    elif isinstance(message, pulsar.MessageId):
        mid = message._msg_id
    else:
        mid = message
    return mid if mid.batch_index() >= 0 else None


def _batch_size(mid: Any) -> int:
    """Messages in the entry of a received batch message id (protobuf field 6
    of its serialized form; the Python client has no getter). 0 if absent.
    Runtime: ~2 us; called only for the copies of a resolved record."""
    data = mid.serialize()
    i, n = 0, len(data)
    while i < n:
        tag = data[i]
        i += 1
        if tag & 7 == 0:  # varint
            value = shift = 0
            while True:
                byte = data[i]
                i += 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            if tag >> 3 == 6:
                return value
        elif tag & 7 == 2:  # length-delimited: skip
            length = shift = 0
            while True:
                byte = data[i]
                i += 1
                length |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            i += length
        else:
            return 0
    return 0


def _java_id(mid: Any) -> str:
    """``ledger:entry:partition[:batch]``, the Java client's MessageId.toString()."""
    text = f"{mid.ledger_id()}:{mid.entry_id()}:{mid.partition()}"
    return text if mid.batch_index() < 0 else f"{text}:{mid.batch_index()}"


async def _quietly(awaitable: Any) -> None:
    try:
        await awaitable
    except Exception as exc:  # closing something already closed or broken
        log.debug("ignored while closing: %r", exc)


async def subscribe(client: pulsar_asyncio.Client, topic: Union[str, list], subscription: str, *,
                    precision_bits: int = 8, delay_ms: int = 60_000,
                    backoff: Optional[Callable[[int], int]] = None, max_redeliveries: Optional[int] = None,
                    dead_letter_topic: Optional[str] = None,
                    consumer_type: pulsar.ConsumerType = pulsar.ConsumerType.Shared,
                    lead_ms: Optional[int] = None, min_gap_ms: Optional[int] = None,
                    **pulsar_kwargs: Any) -> TrackedConsumer:
    """Subscribe with ``client`` and return a :class:`TrackedConsumer`.

    ``client`` must be a ``pulsar.asyncio.Client``: the tracker's timer and the
    receive pump live on the event loop, and the asyncio client delivers
    there; a sync ``pulsar.Client`` would need a thread per consumer and gets a
    ``TypeError``.

    ``consumer_type`` defaults to **Shared** (Pulsar's own default is
    Exclusive): negative acks are a per-message workflow, Shared (or
    Key_Shared) subscriptions are where messages are acked one by one, and the
    embedded test broker redelivers only on those.

    The consumer is subscribed with ``negative_ack_redelivery_delay_ms=100``
    (the C++ client's minimum): the adapter redelivers through that path.
    ``dead_letter_policy`` is refused: use ``max_redeliveries`` and
    ``dead_letter_topic``. Other keyword arguments go to
    ``client.subscribe``. Not tested on partitioned topics (the embedded broker
    cannot redeliver on them).

    >>> async def main(url):                                        # doctest: +SKIP
    ...     client = pulsar.asyncio.Client(url)
    ...     async with await nacktracker.subscribe(client, "t", "sub", delay_ms=500) as consumer:
    ...         async for msg in consumer:
    ...             await consumer.negative_acknowledge(msg, delay_ms=1000)
    """
    if not isinstance(client, pulsar_asyncio.Client):
        if isinstance(client, pulsar.Client):
            raise TypeError("nacktracker.subscribe needs a pulsar.asyncio.Client, not the synchronous "
                            "pulsar.Client: TrackedConsumer runs its tracker and receive pump on the "
                            "asyncio event loop. Create the client with pulsar.asyncio.Client(url).")
        raise TypeError(f"client must be a pulsar.asyncio.Client, not {type(client).__name__}")
    if not isinstance(subscription, str):
        raise TypeError(f"subscription must be a str, not {type(subscription).__name__}")
    if not isinstance(consumer_type, pulsar.ConsumerType):
        raise TypeError(f"consumer_type must be a pulsar.ConsumerType, not {type(consumer_type).__name__}")
    nack_delay = pulsar_kwargs.pop("negative_ack_redelivery_delay_ms", MIN_NACK_DELAY_MS)
    if nack_delay != MIN_NACK_DELAY_MS:
        raise ValueError(f"negative_ack_redelivery_delay_ms is fixed at {MIN_NACK_DELAY_MS} (the client's "
                         "minimum; the tracker does the delaying): use delay_ms")
    if pulsar_kwargs.get("dead_letter_policy") is not None:
        raise ValueError("dead_letter_policy is not supported: use max_redeliveries and dead_letter_topic")
    # build the tracker's side first: bad options fail before a subscription is made
    check_delay_ms("delay_ms", delay_ms)
    if max_redeliveries is not None and check_int("max_redeliveries", max_redeliveries) < 1:
        raise ValueError("max_redeliveries must be >= 1")
    consumer = await client.subscribe(topic, subscription, consumer_type=consumer_type,
                                      negative_ack_redelivery_delay_ms=MIN_NACK_DELAY_MS, **pulsar_kwargs)
    try:
        return TrackedConsumer(consumer, client=client, delay_ms=delay_ms, precision_bits=precision_bits,
                               backoff=backoff, max_redeliveries=max_redeliveries,
                               dead_letter_topic=dead_letter_topic, lead_ms=lead_ms, min_gap_ms=min_gap_ms)
    except BaseException:
        await _quietly(consumer.close())
        raise
