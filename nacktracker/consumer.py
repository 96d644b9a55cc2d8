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
* Snapshots (``snapshot_path=``): pending nacks survive a restart of the
  consumer, each with its remaining delay (see :class:`TrackedConsumer`).
* Deduplication (``dedup=True``): a copy of a message the application has
  already acknowledged is dropped (see :class:`TrackedConsumer`).

Background work (the pump, the periodic snapshot, the tracker's timer,
dead-letter publishes) is owned by the consumer and cancelled or awaited by
:meth:`TrackedConsumer.close`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import re
import sys
import time
import zlib
from typing import Any, Callable, Optional, Union

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_asyncio

from . import snapshot as _snapshot
from ._checks import check_delay_ms, check_int, check_precision
from .adapters.pulsar import MIN_NACK_DELAY_MS, PulsarAdapter
from .dedup import Deduplicator
from .keys import MessageKey, key_of
from .snapshot import SnapshotError
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
# _admit's verdicts. RECHECK: a possible redelivery, checked again when taken from the
# queue (the application may have nacked its twin meanwhile).
_DROP, _SURFACE, _RECHECK = 0, 1, 2
#: Suffix of the file beside ``snapshot_path`` that holds the batch records.
BATCHES_SUFFIX = ".batches"


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
      surfaced when they arrive (the application has never seen them). 0 for
      a record restored from a snapshot: this process has seen nothing of the
      entry, so its first copy surfaces every sibling that is not nacked, and
      keeps one id of each nacked one held back (its final ack then completes
      that delivery's batch acker).

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
    see more than one increment per own nack (as with Pulsar itself). A
    broker restart resets them on pulsar-lite, and on Pulsar (whose broker
    keeps them in memory) a restart or topic unload does too, exactly as for
    Pulsar's own dead-letter policy: ``max_redeliveries`` then allows up to
    that many further attempts; a message is never dead-lettered early.
    Snapshots do not carry counts (a per-message count would cost far more
    than the index's few bytes per nack).

    **Snapshots** (``snapshot_path``). Without one, ``close()`` abandons
    pending nacks: as with any Pulsar consumer, the broker hands its
    unacknowledged messages back to the subscription at once. With one, the
    tracker's pending set is saved every ``snapshot_interval_s`` seconds (by an
    owned task; ``None``: only on close) and on ``close()``, atomically (a
    crash leaves the previous file or the new one; the writes run in a
    thread). A consumer started on that file restores it: each pending nack
    keeps its remaining delay, minus the time the consumer was down (the
    snapshot's ``elapsed="wall"``), and the copies the broker sends at once on
    reconnecting are held back until due, like any early copy. Batch records
    go to ``<snapshot_path>.batches`` (linked to the snapshot by its CRC, so
    a stale file is recognised and ignored), so each nacked batch message
    keeps its own delay and its siblings surface at once; without a usable
    one, every copy of a restored batch entry is held until the entry's last
    pending nack is due (late, never early, nothing lost). Siblings the
    previous consumer acknowledged surface again, as with Pulsar itself
    (without batch-index acks the broker only knows whole entries). A
    missing file means a first start. A corrupted one raises
    :class:`~nacktracker.SnapshotError` and nothing starts (``subscribe``
    closes the subscription it made), unless ``snapshot_on_error="ignore"``:
    the file is then moved aside to ``<snapshot_path>.corrupt``, a warning is
    logged and the consumer starts empty (the broker's copies surface at once:
    their backoff is lost, not the messages). One file per consumer: on a
    Shared subscription with other live consumers the broker may hand a
    closed consumer's messages to them, and only this consumer holds them
    back. :meth:`unsubscribe` removes the files (the nacks go with the
    subscription).

    **Deduplication** (``dedup=True``). Ids are recorded when the application
    acknowledges (not on receive: an unacknowledged message must be able to
    come back) in a :class:`~nacktracker.Deduplicator` keyed by topic, holding
    the last ``dedup_capacity`` to ``2 * dedup_capacity`` acknowledged ids per
    topic. A copy of a recorded id is dropped by the pump and again when it
    is taken from the queue (an ack may race a copy already queued): batch
    siblings coming back with their entry, redeliveries racing an ack, acks
    lost in a broker restart. Counted in ``stats()["dedup_dropped"]``. Cost:
    a few microseconds per message and well under a byte per dense id.
    Not persisted: after a consumer restart it starts empty.
    """

    def __init__(self, consumer: pulsar_asyncio.Consumer, *, client: Optional[pulsar_asyncio.Client] = None,
                 delay_ms: int = 60_000, precision_bits: int = 8,
                 backoff: Optional[Callable[[int], int]] = None, max_redeliveries: Optional[int] = None,
                 dead_letter_topic: Optional[str] = None, lead_ms: Optional[int] = None,
                 min_gap_ms: Optional[int] = None, prefetch: int = 16,
                 snapshot_path: Optional[Union[str, os.PathLike]] = None,
                 snapshot_interval_s: Optional[float] = 5.0, snapshot_on_error: str = "raise",
                 dedup: bool = False, dedup_capacity: Optional[int] = None) -> None:
        _check_reliability_options(snapshot_path, snapshot_interval_s, snapshot_on_error, dedup, dedup_capacity)
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
        tracker_options = dict(
            delay_ms=delay_ms, precision_bits=precision_bits, rounding="floor", backoff=backoff,
            max_redeliveries=max_redeliveries,
            on_dead_letter=self._on_dead_letter if max_redeliveries is not None else None,
            consumer_name=consumer.consumer_name())
        self.dead_letter_topic = dead_letter_topic
        # a single-topic consumer's ids need no topic; remember it for bare-id calls
        self._own_topic = None if self.adapter.multi_topic else consumer.topic()
        # The earliest the tracker may hand a bucket to the adapter: its start (rounding "floor")
        # minus the adapter's lead and coalescing window (see RedeliveryAdapter); see _fire_ms().
        self._fire_add, self._fire_mask = check_precision(precision_bits, "floor")
        self._fire_lead = self.adapter.lead_ms + (getattr(self.adapter, "coalesce_ms", 0) or 0)
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
                        "dead_letter_published": 0, "dead_letter_failed": 0, "dedup_dropped": 0,
                        "restored": 0, "snapshots_saved": 0, "snapshot_failures": 0}
        self._dedup = Deduplicator(dedup_capacity or 1_000_000) if dedup else None
        self.snapshot_path = None if snapshot_path is None else os.path.abspath(os.fspath(snapshot_path))
        self._snapshot_interval = snapshot_interval_s
        self._snapshot_on_error = snapshot_on_error
        self._saver: Optional[asyncio.Task] = None
        self._writing: Optional[asyncio.Future] = None  # the snapshot write in flight (in a thread)
        self._blind_restore = False  # restored batch entries without their records: hold every copy
        if self.snapshot_path is None:
            self.tracker = NegativeAcksTracker(self.adapter, **tracker_options)
        else:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError("TrackedConsumer(snapshot_path=...) must be created inside the event "
                                   "loop (restored delays count on its clock); nacktracker.subscribe does "
                                   "that") from None
            self.tracker = self._restore(tracker_options)
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
        loop = asyncio.get_running_loop()
        deadline = None if timeout_ms is None else loop.time() + timeout_ms / 1000
        while True:
            if deadline is None:
                item = await self._queue.get()
            else:
                try:
                    # Cancelling Queue.get() is safe (the item stays queued), unlike the client's receive().
                    item = await asyncio.wait_for(self._queue.get(), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    raise ReceiveTimeout(f"no message within {timeout_ms} ms") from None
            if item is _STOP:
                self._queue.put_nowait(_STOP)  # keep waking the other receivers
                raise self._error if self._error is not None else ConsumerClosed()
            if self._queue.qsize() < self._prefetch:
                self._space.set()
            msg, recheck = item
            # its twin may have been acked or nacked while this copy waited in the queue
            if not ((recheck and self._nacked_since(msg, loop.time() * 1000.0))
                    or (self._dedup is not None and self._acked_before(msg))):
                break
        self._counts["surfaced"] += 1
        return msg

    def __aiter__(self) -> "TrackedConsumer":
        return self

    async def __anext__(self) -> pulsar.Message:
        try:
            return await self.receive()
        except ConsumerClosed:
            raise StopAsyncIteration from None

    def _start_pump(self) -> None:
        loop = asyncio.get_running_loop()
        self._pump = loop.create_task(self._run_pump(), name="nacktracker-pump")
        if self.snapshot_path is not None and self._snapshot_interval is not None:
            self._saver = loop.create_task(self._run_saver(), name="nacktracker-snapshots")

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
                verdict = self._admit(msg, loop.time() * 1000.0)
                if verdict and (self._dedup is None or not self._acked_before(msg)):
                    self._queue.put_nowait((msg, verdict == _RECHECK))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the consumer was closed or failed: tell the receivers
            if not (self._closed or self._unsubscribing):
                log.warning("receive failed; the consumer stops delivering: %r", exc)
                self._error = exc
            self._queue.put_nowait(_STOP)

    def _admit(self, msg: pulsar.Message, now_ms: float) -> int:
        """Whether a received copy goes to the application (see the module
        doc): ``_DROP``, ``_SURFACE``, or ``_RECHECK`` for a copy that may be
        a redelivery (see :meth:`_nacked_since`). Runtime: O(1), plus O(b)
        for a redelivered non-batched message whose ledger has nacks pending
        in b buckets."""
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
                return _SURFACE
            if self.tracker.pending and msg in self.tracker:
                self._counts["early_copies_dropped"] += 1
                return _DROP
            return _RECHECK
        if self._lingering:
            self._end_delivery(topic, partition, (partition, ledger, entry, topic))
        self._pulled[(topic, partition)] = (ledger, entry, index, mid)
        where = (partition, ledger, entry, topic)
        record = self._entries.get(where)
        if record is None:
            if self._blind_restore and self.tracker.pending and msg in self.tracker:
                # restored without its record: every copy waits for the entry's last nack
                self._counts["early_copies_dropped"] += 1
                return _DROP
            return _RECHECK
        state = record.nacked.get(index)
        if index >= record.unseen_from and state is None:  # first sight of a sibling of this delivery
            record.unseen_from = index + 1
            admit = True
        else:
            admit = state is not None and state[0] is not None and state[0] <= now_ms
            if admit:
                state[0] = None  # surfaced: now the application's again
                record.unseen_from = max(record.unseen_from, index + 1)  # this delivery has passed it
            else:
                self._counts["siblings_dropped" if state is None or state[0] is None
                             else "early_copies_dropped"] += 1
                if state is not None and len(state) == 1 and state[0] is not None:
                    # a restored record has no copy of this delivery yet: keep one, so that the
                    # final ack also completes this delivery's batch acker (see _NackedEntry)
                    state.append(mid)
        if not record.nacked and index + 1 >= (_batch_size(mid) or _NO_INDEX):  # a resolved record's last copy
            self._lingering.pop((topic, partition), None)
            del self._entries[where]
        return _RECHECK if admit else _DROP

    def _nacked_since(self, msg: pulsar.Message, now_ms: float) -> bool:
        """Whether the application nacked a twin of this copy while the copy
        waited in the queue (a broker resending after a reconnect can queue a
        copy before the application has dealt with the first): then it is an
        early copy, dropped like one; its bucket brings the message back.
        Runtime: O(1) for a batch message; O(b) for a non-batched one whose
        ledger has nacks pending in b buckets (only possible redeliveries,
        the copies at or behind the highest position seen, are checked)."""
        if not self._entries and not self.tracker.pending:
            return False  # nothing is nacked: the common case
        mid = msg.message_id()
        index = mid.batch_index()
        if index < 0:
            held = bool(self.tracker.pending) and msg in self.tracker
        else:
            record = self._entries.get((mid.partition(), mid.ledger_id(), mid.entry_id(), msg.topic_name()))
            state = None if record is None else record.nacked.get(index)
            if state is None or state[0] is None:
                return False
            held = state[0] > now_ms
            if not held:  # due by now: this copy is the one that surfaces; later copies are siblings
                state[0] = None
                record.unseen_from = max(record.unseen_from, index + 1)
        if held:
            self._counts["early_copies_dropped"] += 1
        return held

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
        """Acknowledge a message (or id) and cancel its pending nacks; with
        ``dedup`` its id is recorded first, so a copy racing the ack is dropped
        (and forgotten again if the ack raises). Runtime: O(1), plus O(b)
        when its ledger has nacks pending in b buckets."""
        if type(message) is pulsar.Message and self._dedup is None and not self._entries \
                and not self.tracker.pending:
            # nothing to cancel or record: the hot path of a healthy consumer costs one ack
            await self._consumer.acknowledge(message)
            return
        await self._ack(message, self._consumer.acknowledge)

    async def acknowledge_cumulative(self, message: MessageLike) -> None:
        """As ``pulsar.asyncio.Consumer.acknowledge_cumulative`` (not allowed on
        Shared subscriptions). Cancels pending nacks of this message only;
        earlier messages' pending nacks fire and the broker ignores them.
        With ``dedup`` only this message's id is recorded."""
        await self._ack(message, self._consumer.acknowledge_cumulative)

    async def _ack(self, message: MessageLike, send: Callable[[Any], Any]) -> None:
        """Record (dedup), cancel pending nacks, then ``send`` the ack; undo the
        record if it fails."""
        key, _ = self._key(message)
        recorded = self._remember(key)
        held = self._settle(key)
        try:
            await send(message)
        except BaseException:
            self._forget(key, recorded)
            raise
        for mid in held:  # complete the batch ackers of the deliveries it was nacked in
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
        state[0] = -float("inf") if due is None else self._fire_ms(due)
        if held is not None:
            state.append(held)

    def _settle(self, key: MessageKey) -> list:
        """Bookkeeping of an ack: cancel pending nacks; return held ids to ack too."""
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

    # -- deduplication -------------------------------------------------------------

    def _remember(self, key: MessageKey) -> bool:
        """Record an acknowledged id; whether it was new. Ids without a topic
        (bare ids on a multi-topic consumer) cannot be matched and are skipped."""
        if self._dedup is None or key.topic is None:
            return False
        return not self._dedup.seen_or_add(key.topic, key.ledger_id, key.entry_id, key.batch_index)

    def _forget(self, key: MessageKey, recorded: bool) -> None:
        if recorded:
            self._dedup.discard(key.topic, key.ledger_id, key.entry_id, key.batch_index)

    def _acked_before(self, msg: pulsar.Message) -> bool:
        """With ``dedup``: whether this copy's id was acknowledged (counted).
        Runtime: O(1)."""
        mid = msg.message_id()
        if (msg.topic_name(), mid.ledger_id(), mid.entry_id(), mid.batch_index()) in self._dedup:
            self._counts["dedup_dropped"] += 1
            return True
        return False

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

    def _fire_ms(self, due: int) -> int:
        """The earliest moment the tracker may hand a nack due at ``due`` to
        the adapter: a copy arriving from then on may be the one it asked for."""
        return ((due + self._fire_add) & self._fire_mask) - self._fire_lead

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

    # -- snapshots -----------------------------------------------------------------

    def _restore(self, options: dict) -> NegativeAcksTracker:
        """The tracker for a start on ``snapshot_path``: empty on a first start,
        else restored from the file, with the batch records beside it (see the
        class doc). Runtime: O(size of the files)."""
        path = self.snapshot_path
        try:
            data = _snapshot.read_file(path)
        except FileNotFoundError:
            if not os.path.isdir(os.path.dirname(path)):
                raise FileNotFoundError(f"snapshot_path {path!r}: its directory does not exist") from None
            return NegativeAcksTracker(self.adapter, **options)  # a first start
        try:
            snap = _snapshot.decode(data)
        except SnapshotError as exc:
            self._refuse_or_skip(path, exc, "its nacked messages surface as soon as the broker resends them")
            return NegativeAcksTracker(self.adapter, **options)
        try:
            batches = self._read_batches(zlib.crc32(data))
        except SnapshotError as exc:
            self._refuse_or_skip(path + BATCHES_SUFFIX, exc, "restored batch entries wait for their last nack")
            batches = None
        # The downtime counts against every delay (the snapshot's "wall" mode), subtracted once
        # here for the tracker's buckets and the batch records alike. Buckets that would fire at
        # once are left out: the broker resends every unacknowledged message to a new consumer,
        # and a copy the tracker does not hold surfaces; a nack of an id not received yet would
        # only ask the broker for a second copy.
        shift = max(0, (time.time_ns() - snap.taken_wall_ns) // 1_000_000)
        restored = snap.pending
        snap = dataclasses.replace(snap, records=tuple((o, r - shift, bm) for o, r, bm in snap.records
                                                       if r - shift > self._fire_lead))
        # Records are placed first, on a clock reading no later than the one the tracker's restore
        # takes: a record must never call a copy early once its bucket has fired (that copy would
        # be dropped and nothing would ask for it again).
        now = math.ceil(asyncio.get_running_loop().time() * 1000.0)
        for topic, partition, ledger, entry, nacked in batches or ():
            record = self._entries[(partition, ledger, entry, topic)] = _NackedEntry(0)
            for index, remaining in nacked:
                due = now + max(0, remaining - shift)
                record.nacked[index] = [self._fire_ms(due)]
        tracker = NegativeAcksTracker.restore(snap, self.adapter, elapsed="none", **options)
        if batches is None and snap.records:
            log.warning("%s: no batch records for this snapshot; copies of restored batch entries are held "
                        "until the entry's last nack is due", path)
            self._blind_restore = True
        # The broker resends everything unacknowledged at once: copies at or behind a restored
        # position are redeliveries and must pay the tracker lookup (see _admit).
        for o, _, bm in snap.records:
            topic, partition, ledger = snap.origins[o]
            position = (ledger, bm.max())
            if topic is not None and position > self._high.get((topic, partition), (-1, -1)):
                self._high[(topic, partition)] = position
        self._counts["restored"] = restored
        log.info("restored %d pending nacks (%d due at once, %d batch records) from %s, taken %d ms ago",
                 restored, restored - tracker.pending, len(batches or ()), path, shift)
        return tracker

    def _read_batches(self, snapshot_crc: int) -> Optional[list]:
        """The batch records saved with the snapshot whose CRC-32 is
        ``snapshot_crc``; ``None`` if there is no such file or it belongs to
        another snapshot (a crash between the two writes). Raises
        :class:`SnapshotError` if it is corrupted.

        Format: a line with the CRC-32 of the rest (8 hex digits), then JSON
        ``{"snapshot_crc32": int, "entries": [[topic, partition, ledger,
        entry, [[batch_index, remaining_ms], ...]], ...]}``.
        """
        path = self.snapshot_path + BATCHES_SUFFIX
        try:
            raw = _snapshot.read_file(path)
        except FileNotFoundError:
            return None
        head, _, body = raw.partition(b"\n")
        try:
            if len(head) != 8 or int(head, 16) != zlib.crc32(body):
                raise ValueError("checksum mismatch")
            doc = json.loads(body)
            if doc["snapshot_crc32"] != snapshot_crc:
                log.warning("%s belongs to another snapshot; ignored", path)
                return None
            entries = []
            for topic, partition, ledger, entry, nacked in doc["entries"]:
                if not (topic is None or isinstance(topic, str)) or type(partition) is not int or partition < -1:
                    raise ValueError(f"bad topic {topic!r} or partition {partition!r}")
                entries.append((topic, partition, check_int("ledger_id", ledger), check_int("entry_id", entry),
                                [(check_int("batch_index", i), check_int("remaining_ms", r)) for i, r in nacked]))
        except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
            raise SnapshotError(f"corrupted batch records: {exc}") from None
        return entries

    def _refuse_or_skip(self, path: str, exc: SnapshotError, consequence: str) -> None:
        """A corrupted file at start: refuse (default), or move it aside and go on."""
        if self._snapshot_on_error == "raise":
            raise SnapshotError(f"cannot restore {path}: {exc}. Nothing was started: move the file away, or pass "
                                f"snapshot_on_error='ignore' to start without it ({consequence})") from None
        os.replace(path, path + ".corrupt")
        log.warning("cannot restore %s (%s); moved to %s.corrupt and starting without it: %s",
                    path, exc, path, consequence)

    def _batch_records(self, snapshot: bytes) -> bytes:
        """The batch records file for ``snapshot`` (format: :meth:`_read_batches`).
        Call right after taking the snapshot: the clock is read after the
        tracker's, so a record's remaining delay is never longer than its
        bucket's. Runtime: O(nacked batch messages)."""
        now = math.ceil(asyncio.get_running_loop().time() * 1000.0)
        lead = self._fire_lead
        entries = []
        for (partition, ledger, entry, topic), record in self._entries.items():
            # None: surfaced, the application's (a new process surfaces it again); -inf: due now
            nacked = [[index, max(0, state[0] + lead - now)] for index, state in record.nacked.items()
                      if state[0] is not None]
            if nacked:
                entries.append([topic, partition, ledger, entry, nacked])
        body = json.dumps({"snapshot_crc32": zlib.crc32(snapshot), "entries": entries},
                          separators=(",", ":")).encode()
        return b"%08x\n" % zlib.crc32(body) + body

    async def _save(self) -> None:
        """Take a snapshot (on the loop: one consistent view) and write both
        files in a thread (``tracker.save``'s atomic write, off the loop). One
        write at a time, in order; a cancelled caller leaves its write to
        finish (close waits for it)."""
        data = self.tracker.snapshot()
        batches = self._batch_records(data)
        if self._writing is not None:
            await asyncio.wait({self._writing})
        self._writing = asyncio.get_running_loop().run_in_executor(None, self._write_files, data, batches)
        await asyncio.shield(self._writing)
        self._counts["snapshots_saved"] += 1

    def _write_files(self, data: bytes, batches: bytes) -> None:
        _snapshot.write_atomic(self.snapshot_path, data)
        _snapshot.write_atomic(self.snapshot_path + BATCHES_SUFFIX, batches)

    async def _run_saver(self) -> None:
        """Save every ``snapshot_interval_s``. A failed save (disk full, the
        directory gone) is logged and counted; consuming goes on and the next
        save tries again."""
        while True:
            await asyncio.sleep(self._snapshot_interval)
            try:
                await self._save()
            except Exception as exc:
                self._counts["snapshot_failures"] += 1
                log.warning("snapshot to %s failed (next try in %g s): %r",
                            self.snapshot_path, self._snapshot_interval, exc)

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
        """The tracker's stats plus the consumer's counters and batch records
        (``restored``: nacks restored from the snapshot at start;
        ``dedup_remembered``: acknowledged ids the deduplicator holds)."""
        return {**self.tracker.stats(), **self._counts, "batch_records": len(self._entries),
                "bursts": len(self.adapter.bursts),
                "dedup_remembered": len(self._dedup) if self._dedup is not None else 0}

    async def unsubscribe(self) -> None:
        """Unsubscribe, then release everything :meth:`close` releases. Pending
        nacks are dropped with the subscription, and so are the snapshot files
        (a new subscription of that name must not hold back its messages)."""
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
        save the snapshot (with ``snapshot_path``), close dead-letter producers
        and the consumer. Idempotent. A failed final save is raised after
        everything else is closed (a silent loss of the pending nacks' delays
        is not an option)."""
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
        tasks = [task for task in (self._pump, self._saver) if task is not None]
        for task in tasks:
            # The pump: the one place the client's receive() is cancelled; whatever it was about
            # to return is unacknowledged and goes back to the subscription with the consumer.
            # The saver: a write in flight finishes (see _save), then the final save follows it.
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._queue.put_nowait(_STOP)
        await self.tracker.close()  # waits for an adapter call in flight: the snapshot has everything
        save_error: Optional[BaseException] = None
        if self.snapshot_path is not None:
            if close_consumer:
                try:
                    await self._save()
                except Exception as exc:
                    self._counts["snapshot_failures"] += 1
                    log.error("final snapshot to %s failed: %r", self.snapshot_path, exc)
                    save_error = exc
            else:  # unsubscribed: the nacks went with the subscription
                if self._writing is not None:
                    await asyncio.wait({self._writing})
                for path in (self.snapshot_path, self.snapshot_path + BATCHES_SUFFIX):
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
        await self.adapter.aclose()
        for producer in self._dlq_producers.values():
            await _quietly(producer.close())
        self._dlq_producers.clear()
        if close_consumer:
            await _quietly(self._consumer.close())
        if save_error is not None:
            raise save_error


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
        if tag & 7 == 0:  # varint
            value, i = _varint(data, i + 1)
            if tag >> 3 == 6:
                return value
        elif tag & 7 == 2:  # length-delimited: skip
            length, i = _varint(data, i + 1)
            i += length
        else:
            return 0
    return 0


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """A protobuf varint at ``data[i:]``: ``(value, index after it)``."""
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _java_id(mid: Any) -> str:
    """``ledger:entry:partition[:batch]``, the Java client's MessageId.toString()."""
    text = f"{mid.ledger_id()}:{mid.entry_id()}:{mid.partition()}"
    return text if mid.batch_index() < 0 else f"{text}:{mid.batch_index()}"


def _check_reliability_options(snapshot_path: Any, snapshot_interval_s: Any, snapshot_on_error: Any,
                               dedup: Any, dedup_capacity: Any) -> None:
    """Boundary checks of the snapshot and dedup options (before anything is subscribed)."""
    if snapshot_path is not None and not isinstance(snapshot_path, (str, os.PathLike)):
        raise TypeError(f"snapshot_path must be a str or os.PathLike, not {type(snapshot_path).__name__}")
    if snapshot_path is not None and not isinstance(os.fspath(snapshot_path), str):
        raise TypeError("snapshot_path must be a str path (not bytes)")
    if snapshot_interval_s is not None:
        if isinstance(snapshot_interval_s, bool) or not isinstance(snapshot_interval_s, (int, float)):
            raise TypeError(f"snapshot_interval_s must be a number of seconds or None, "
                            f"not {type(snapshot_interval_s).__name__}")
        if not 0 < snapshot_interval_s < math.inf:
            raise ValueError(f"snapshot_interval_s must be > 0 (None: save only on close), "
                             f"got {snapshot_interval_s}")
    if snapshot_on_error not in ("raise", "ignore"):
        raise ValueError(f"snapshot_on_error must be 'raise' or 'ignore', got {snapshot_on_error!r}")
    if not isinstance(dedup, bool):
        raise TypeError(f"dedup must be a bool, not {type(dedup).__name__}")
    if dedup_capacity is not None:
        if not dedup:
            raise ValueError("dedup_capacity needs dedup=True")
        if check_int("dedup_capacity", dedup_capacity) < 1:
            raise ValueError("dedup_capacity must be >= 1")


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
                    snapshot_path: Optional[Union[str, os.PathLike]] = None,
                    snapshot_interval_s: Optional[float] = 5.0, snapshot_on_error: str = "raise",
                    dedup: bool = False, dedup_capacity: Optional[int] = None,
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
    ``dead_letter_topic``. ``snapshot_path``, ``snapshot_interval_s``,
    ``snapshot_on_error``, ``dedup`` and ``dedup_capacity``: see
    :class:`TrackedConsumer` (a corrupted snapshot raises
    :class:`~nacktracker.SnapshotError` and the subscription made for it is
    closed). Other keyword arguments go to ``client.subscribe``. Not tested
    on partitioned topics (the embedded broker cannot redeliver on them).

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
    _check_reliability_options(snapshot_path, snapshot_interval_s, snapshot_on_error, dedup, dedup_capacity)
    consumer = await client.subscribe(topic, subscription, consumer_type=consumer_type,
                                      negative_ack_redelivery_delay_ms=MIN_NACK_DELAY_MS, **pulsar_kwargs)
    try:
        return TrackedConsumer(consumer, client=client, delay_ms=delay_ms, precision_bits=precision_bits,
                               backoff=backoff, max_redeliveries=max_redeliveries,
                               dead_letter_topic=dead_letter_topic, lead_ms=lead_ms, min_gap_ms=min_gap_ms,
                               snapshot_path=snapshot_path, snapshot_interval_s=snapshot_interval_s,
                               snapshot_on_error=snapshot_on_error, dedup=dedup, dedup_capacity=dedup_capacity)
    except BaseException:
        await _quietly(consumer.close())
        raise
