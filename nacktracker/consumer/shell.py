"""TrackedConsumer: the thin Pulsar-facing shell over the delivery core, and the one place the
consumer is assembled (its constructor).

What it does, and only this: a *pump* task owns the client's ``receive()`` (cancelling
that call loses the message it was about to return, so callers wait on a queue instead)
and asks the :class:`~nacktracker.consumer.core.DeliveryCore` what to do with each copy;
acks and nacks go to the client and the tracker, then to the core; one timer on the
tracker's clock releases parked copies at their time. Every decision about a copy is
the core's; time is read only through the tracker's clock.

Who calls what (each part gets what it needs as arguments, never the consumer; each closes what it owns):

==================== ================================================ ===================================
part                 is given                                         called by
==================== ================================================ ===================================
options              (made by ``subscribe`` or the caller: checked)   everything below reads it
adapter              the client's consumer (or a test's transport)    the tracker (redeliver), closed here
MessageKeys          the bare ids' topics, ``knows(key)``             the shell; the failure side
DeliveryCore         the Precision, the deduplicator, ``pending``     the shell (arrive, ack, nack, fire)
NegativeAcksTracker  the adapter, the options, the letters' hook      the shell (add, discard); closed here
ReceivePump          the client's consumer, ``admit``                 the shell (poll, get, put); stopped here
ReleaseTimer         the core, the tracker's clock, the pump's put    the shell and the failure side (rearm)
ConsumerDeadLetters  the client, the options, the shell's ack         the tracker's hook; the failure side
FailureHandling      the options, the letters, tracker, core, keys,   the shell (received, nacking, acked,
                     counts, chunks, put, rearm, the shell's checks   surfacing, the letter calls)
SnapshotStore        the path, the owner, the delivery counts         the shell (load, save); closed here
LocalNacks           the local adapter, ``decide``, the pump's put    the shell (Exclusive/Failover only)
==================== ================================================ ===================================

Affects: closing stops them in this order: the release timer, the snapshot saver, the pump,
the tracker (awaiting the dead letters it decided), the final save, the adapter, the failure
side (timers, the retry producer), the dead-letter producers, the client's consumer.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import _get_running_loop
from typing import Any, Awaitable, Optional, Union

import pulsar
import pulsar.asyncio as pulsar_asyncio

from .._checks import check_delay_ms
from ..adapters.base import (
    ClosesAsync,
    KnowsTopics,
    LearnsPathLatency,
    NamesEntries,
    RedeliversLocally,
    ReportsBursts,
    WaitsForSiblings,
)
from ..adapters.client_close import close_leaves_no_callback, close_with_client
from ..adapters.local import LocalRedeliveryAdapter
from ..adapters.pulsar import PulsarAdapter, is_multi_topic
from ..clock import Clock
from ..dedup import Deduplicator
from ..errors import ConsumerClosed, NotReceivedError
from ..keys import MessageKey
from ..tracker import FiredCell, NegativeAcksTracker
from .batches import BatchLimits
from .chunks import ChunkedNacks, known_entries
from .core import DeliveryCore, Verdict
from .counts import DeliveryCounts
from .direct import DirectConsumer, ReceivedMessage, acknowledged, message_length
from .failures import FailureHandling
from .ids import (
    BareIds,
    MessageKeys,
    batch_size,
    is_bare_id,
    message_key_of,
    names_no_message,
    names_several_topics,
    seek_target,
)
from .lateness import RedeliveryLateness
from .letters.in_flight import ConsumerDeadLetters
from .letters.publisher import quietly
from .local import LocalNacks
from .memory import nbytes_parts
from .options import DEDUP_CAPACITY, ConsumerOptions, check_timeout_ms
from .persist import SnapshotStore
from .pump import ReceivePump
from .release import ReleaseTimer
from .state import core_stats

__all__ = ["TrackedConsumer", "topic_names"]

log = logging.getLogger("nacktracker.consumer")

#: How long after its bucket's time a requested copy may still arrive before it
#: is taken to have gone to another consumer (its record then ends). The path
#: takes ~100-300 ms after a fire that comes up to the lead (<= 1 s) early; a copy
#: later than this still surfaces (it is past due) and its siblings are still
#: dropped (acked: the Deduplicator; held: the held set), it just finds no record.
COPY_OVERDUE_MS = 1_000
#: The adapter's lead before it has measured its path: above the path's p99
#: measured here (~150-250 ms on a loaded machine).
INITIAL_LEAD_MS = 250


#: The scheme of a non-persistent topic's full name.
NON_PERSISTENT = "non-persistent://"


def _non_persistent(key: MessageKey, msg: Any) -> bool:
    """Whether ``msg`` (of a multi-topic consumer) comes from a non-persistent topic."""
    topic = key.topic or msg.topic_name()
    return isinstance(topic, str) and topic.startswith(NON_PERSISTENT)


def topic_names(topic: Any) -> list[str]:
    """Topic names from a topic, a list of them, or a pattern (its text). O(topics)."""
    if isinstance(topic, (list, tuple)):
        return [t for each in topic for t in topic_names(each)]
    return [topic if isinstance(topic, str) else str(getattr(topic, "pattern", topic))]


class TrackedConsumer:
    """A ``pulsar.asyncio.Consumer`` with exact, tracked negative acks.

    Usually made by :func:`~nacktracker.subscribe`; wrapping a consumer made by the client, its options are
    one :class:`~nacktracker.consumer.ConsumerOptions` (``options=``; each documented in :func:`subscribe`
    and in the docs' consumer guide). Same methods and argument types as ``pulsar.asyncio.Consumer`` (``receive``,
    ``acknowledge``, ``acknowledge_cumulative``, ``negative_acknowledge``, ``seek``, ``unsubscribe``, ``close``,
    ``get_last_message_id``, ``topic``, ``subscription_name``, ``consumer_name``,
    ``redeliver_unacknowledged_messages``), each taking a Message or its id where the client does, plus
    ``negative_acknowledge(msg, delay_ms=…)``, ``receive(timeout_ms=…)``, ``batch_receive()`` (the sync
    client's, absent from ``pulsar.asyncio``), ``async with`` and ``async for``. ``lateness``: see :mod:`.lateness`.

    ``schema``: the consumer's (dead letters are published under it). ``batch_receive_policy``: a
    ``pulsar.ConsumerBatchReceivePolicy``, the limits of :meth:`batch_receive`. After
    :meth:`close` every call that would reach the broker raises :class:`ConsumerClosed`.
    ``adapter``/``clock``: the seams that make it testable without a broker (as httpx's ``transport=``):
    with an ``adapter`` the ``consumer`` may be any object with the ``pulsar.asyncio.Consumer`` methods
    (its optional capabilities: :mod:`nacktracker.adapters.base`); ``clock``: the tracker's (default: the loop's).
    """

    def __init__(self, consumer: Any, *, client: Optional[pulsar_asyncio.Client] = None,
                 adapter: Any = None, clock: Optional[Clock] = None, schema: Any = None,
                 batch_receive_policy: Any = None, topics: Optional[list[str]] = None,
                 options: Optional[ConsumerOptions] = None, pattern: bool = False) -> None:
        opts = ConsumerOptions() if options is None else options
        if not isinstance(opts, ConsumerOptions):
            raise TypeError(f"options must be a ConsumerOptions, not {type(opts).__name__}")
        opts.require_client(client is not None)
        self._batch_limits = batch_receive_policy if isinstance(batch_receive_policy, BatchLimits) \
            else BatchLimits.of(batch_receive_policy, None)
        if adapter is None and not isinstance(consumer, pulsar_asyncio.Consumer):
            raise TypeError(f"consumer must be a pulsar.asyncio.Consumer, not {type(consumer).__name__}")
        if client is not None and not isinstance(client, pulsar_asyncio.Client):
            raise TypeError(f"client must be a pulsar.asyncio.Client, not {type(client).__name__}")
        close_leaves_no_callback()  # the client's close() leaves nothing to outlive the interpreter (client_close.py)
        self._consumer = consumer
        self.options = opts
        #: the topics subscribed to, as the application named them (``subscribe`` passes them; not the retry
        #: topic, nor a multi-topic consumer's ``...-TopicsConsumerFakeName-<random>``): whose the snapshot
        #: is, the metrics' ``pulsar.topic``; stable across restarts
        #: (made without ``topics``: the client's ``topic()``; none for a multi-topic consumer, whose
        #: ``topic()`` changes from one run to the next: its snapshot is then owned by subscription alone)
        self.topics = list(topics) if topics is not None else [] if is_multi_topic(consumer) else topic_names(
            consumer.topic())
        # A non-persistent topic gives every message the same id: nothing of them can be told apart (nor
        # redelivered), so each surfaces as it comes (a multi-topic consumer: those whose topic is one)
        # (``pattern``: subscribed to a pattern, whose topics may be of either kind)
        reads = str(consumer.topic())
        self._non_persistent_only = reads.startswith(NON_PERSISTENT) and not pattern
        self._maybe_non_persistent = pattern or is_multi_topic(consumer)
        # Copies that arrive early are parked until due, so the lead starts on the high side and is
        # learned down: an early copy costs a short wait, a late one costs precision.
        if adapter is None and opts.redelivery == "local":  # Exclusive/Failover: see adapters/local.py
            # a nack by bare id leaves no message to keep: its bucket asks the broker to resend (the client's way)
            adapter = LocalRedeliveryAdapter(multi_topic=is_multi_topic(consumer),
                                             redeliver_all=consumer.redeliver_unacknowledged_messages)
        self.adapter = adapter if adapter is not None else PulsarAdapter(
            consumer, lead_ms=opts.lead_ms, min_gap_ms=opts.min_gap_ms, initial_lead_ms=INITIAL_LEAD_MS)
        self._local = None if not isinstance(self.adapter, RedeliversLocally) else LocalNacks(  # capabilities: base.py
            self.adapter, lambda msg: self._decide(self._keys.key(msg), msg), lambda msg: self._pump.put(msg),
            lambda msg: self._keys.key(msg))
        self._arrived = self.adapter if isinstance(self.adapter, LearnsPathLatency) else None
        # one producer per dead-letter topic, in the order decided; an unnamed consumer is named (letters/in_flight.py)
        self._dead_letters, name = ConsumerDeadLetters.of(consumer, client, opts, schema, ack=self._acknowledge,
                                                          ack_copies=self._ack_copies)
        # the topic of a bare id (msg.message_id() names none): the consumer's own, its partition's, or
        # on a multi-topic consumer the one whose messages of the id's ledger arrived here
        own_topic = consumer.topic()
        several = (isinstance(self.adapter, KnowsTopics) and self.adapter.multi_topic) or names_several_topics(own_topic)
        ids = BareIds(None if several else own_topic)
        self._keys = MessageKeys(ids, self._knows)  # every key of what the application passes
        self._saw = ids.saw if ids.learns else None  # multi-topic: each arrival's ledger (hot path)
        self._dedup = Deduplicator(opts.dedup_capacity or DEDUP_CAPACITY) if opts.dedup else None
        self.tracker: NegativeAcksTracker
        self.core = DeliveryCore(opts.precision, dedup=self._dedup,
                                 pending=self._pending, overdue_ms=COPY_OVERDUE_MS)
        self.lateness = RedeliveryLateness(self.core)  # stats()["lateness_ms"]; add_listener: the metrics' histogram
        self._pump = ReceivePump(consumer, self._admit, opts.prefetch, direct=DirectConsumer.of)
        self._saver: Optional[asyncio.Task[None]] = None
        self._release = ReleaseTimer(self.core, lambda: self.tracker.clock, self._pump.put)
        self._closed = False
        self._newest: Optional[MessageKey] = None  # the newest first delivery (see _still_consumed)
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # the loop it runs on, from its start (_check_open)
        self._counts = {"restored": 0, "copy_ack_failures": 0}
        tracker_options: dict[str, Any] = dict(
            delay_ms=opts.delay_ms, precision=opts.precision, backoff=opts.backoff,
            max_redeliveries=opts.max_redeliveries, clock=clock,
            on_dead_letter=self._dead_letters.hook, consumer_name=name)
        counts = DeliveryCounts()  # the consumer's own delivery counts: kept by the failure side, saved by the store
        self._store = None if opts.snapshot_path is None else SnapshotStore(
            opts.snapshot_path, opts.snapshot_on_error, subscription=consumer.subscription_name(), topics=self.topics,
            counts=counts)
        if self._store is None:
            self.tracker = NegativeAcksTracker(self.adapter, **tracker_options)
        else:
            self.tracker, self._counts["restored"] = self._store.load(self.adapter, tracker_options, self.core)
        self.tracker.add_fire_listener(self._on_fired)
        if isinstance(self.adapter, WaitsForSiblings):  # a request waits while the application holds a sibling
            self.adapter.sibling_held = self._still_consumed
        #: nacked chunked messages: a request for one names every chunk (see :mod:`.chunks`); ``None`` where
        #: the adapter does not ask the broker (Exclusive/Failover: the whole message is kept and handed back)
        self.chunks: Optional[ChunkedNacks] = None
        if isinstance(self.adapter, NamesEntries):
            self.chunks = ChunkedNacks(known_entries(self.core, self._pending))
            self.adapter.entries_of = self.chunks.entries
        # retries, dead_letter(), ack timeouts, counts: given what they work with (see the note at the top)
        self._failures = FailureHandling(
            opts, client=client, schema=schema, letters=self._dead_letters, tracker=self.tracker, core=self.core,
            keys=self._keys, counts=counts, chunks=self.chunks, put=self._pump.put, rearm=self._release.rearm,
            received=self._received, check_open=self._check_open, closed=lambda: self._closed,
            nack=self.negative_acknowledge, keep=None if self._local is None else self._local.nacked)
        self.tracker.add_fire_listener(self._failures.fired)
        if self._store is not None:
            self._store.load_counts()  # the counts of a restored snapshot, once the tracker holds its nacks
        if client is not None:  # the client's close() closes this consumer first, as it closes its own
            close_with_client(client, self)
        try:
            asyncio.get_running_loop()
            self._start()
        except RuntimeError:
            pass  # started by the first receive() inside a loop

    async def open_producers(self) -> None:
        """Create the retry-letter producer now (``enable_retry``), so the first retry does not wait for it
        (``subscribe`` calls this). Nothing to do otherwise. One broker round trip."""
        await self._failures.open_producers()

    @property
    def snapshot_path(self) -> Optional[str]:
        return self.options.snapshot_path

    @property
    def dead_letter_topic(self) -> Optional[str]:
        return self.options.dead_letter_topic

    # -- receiving -----------------------------------------------------------------

    async def receive(self, timeout_ms: Optional[int] = None) -> pulsar.Message:
        """The next message. ``timeout_ms``: give up after that long and raise :class:`ReceiveTimeout` (a
        ``pulsar.Timeout``); no message is lost by the timeout or by cancelling the caller. Raises
        :class:`ConsumerClosed` once closed. Runtime: O(1), no loop iteration when a message waits."""
        if timeout_ms is not None:
            timeout_ms = check_timeout_ms(timeout_ms)
        if self._pump.task is None and not self._closed:
            self._start()
        self._check_open()
        if (msg := self._pump.poll()) is None:  # else a message waited: no coroutine made, no loop iteration
            msg = await self._pump.get(timeout_ms)
        return msg if self._failures.ack_timeouts is None else self._failures.received(msg)

    def receive_nowait(self) -> Optional[pulsar.Message]:
        """The next message if one is waiting in the consumer, else ``None``; never waits (no loop
        iteration). Raises :class:`ConsumerClosed` once closed. Runtime: O(1)."""
        self._check_open()
        if self._pump.task is None:
            self._start()
        if (msg := self._pump.poll()) is None:
            return None
        return msg if self._failures.ack_timeouts is None else self._failures.received(msg)

    async def batch_receive(self) -> list[pulsar.Message]:
        """The next messages, as the client's ``batch_receive`` with ``subscribe``'s
        ``batch_receive_policy`` (default: no message limit, 10 MiB, 100 ms): complete at the
        policy's message count or payload bytes (a message that would pass either stays for the next
        call; the first always fits), else when its timeout passes, with what came meanwhile (maybe
        nothing: ``[]``). Each message is acked, nacked or dead-lettered on its own. No message is
        lost by the timeout or by cancelling the caller. Raises :class:`ConsumerClosed` once closed
        (a batch begun before the close is returned as it is). Runtime: O(messages)."""
        self._check_open()
        if self._pump.task is None:
            self._start()
        limits, pump = self._batch_limits, self._pump
        batch: list[pulsar.Message] = []
        size = 0
        try:
            # waiting on the pump's queue is safe to cancel (the client's receive is never cancelled)
            async with asyncio.timeout(limits.timeout_ms / 1000 if limits.timeout_ms > 0 else None):
                while not limits.full(len(batch), size):
                    msg = pump.peek()
                    if msg is None:
                        await pump.ready(None)
                        continue
                    length = message_length(msg)
                    if not limits.fits(len(batch), size, length):
                        break
                    batch.append(pump.poll())
                    size += length
        except TimeoutError:
            pass
        except Exception:
            if not batch:  # closed or failed before anything was taken
                raise
        except BaseException:  # the caller was cancelled: what it took waits for the next receive
            pump.put_back(batch)
            raise
        if self._failures.ack_timeouts is not None:
            batch = [self._failures.received(msg) for msg in batch]
        return batch

    def __aiter__(self) -> TrackedConsumer:
        return self

    async def __anext__(self) -> pulsar.Message:
        try:
            return await self.receive()
        except ConsumerClosed:
            raise StopAsyncIteration from None

    def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._pump.start()
        if self._store is not None and self.options.snapshot_interval_s is not None:
            self._saver = asyncio.get_running_loop().create_task(
                self._store.run_saver(self.options.snapshot_interval_s, self.tracker, self.core),
                name="nacktracker-snapshots")

    def _admit(self, msg: Any) -> Union[bool, Awaitable[None]]:
        """Whether a copy from the broker goes to the application now, or what to await first (acks)."""
        key = message_key_of(msg) if type(msg) is ReceivedMessage else self._keys.key(msg)
        if self._non_persistent_only or self._maybe_non_persistent and _non_persistent(key, msg):
            return True
        if self._saw is not None:  # a multi-topic consumer: which topic each ledger's ids belong to
            self._saw(key)
        if self._arrived is not None and self._arrived.awaiting_arrivals and self.core.seen(key):
            # a copy of a message seen before: the adapter learns its path latency (first copies of an
            # entry's other messages, still arriving after one of them was nacked, answer no request)
            self._arrived.arrived(key.entry)
        if self.core.first_delivery(key):  # O(1)
            self._newest = key  # the newest first delivery: the entries before it came in whole
            verdict = Verdict.SURFACE
        else:
            verdict = self._decide(key, msg)
        if verdict is Verdict.SURFACE:  # the failure side has a say only with letters in flight or retries on
            if (self._dead_letters.in_flight or self._failures.retries) and not self._failures.surfacing(msg):
                return False
            most = self.options.max_redeliveries
            if most is not None and (msg.redelivery_count() or 0) > most:
                # redelivered past the limit by the broker's own redelivery (redeliver_unacknowledged_messages):
                # a dead letter, as the clients' dead-letter policy sends it instead of redelivering it again
                return self._failures.dead_letter(msg, "max_redeliveries", None)
            return True
        if verdict is Verdict.DROP_ACKED:
            return self._ack_copies([msg])  # tells the broker again (an ack lost in a restart)
        if verdict is Verdict.DROP_EARLY:
            if self._local is not None:
                self._local.held_back(key, msg)
            elif self.chunks is not None:  # (a chunked message resent after a restart: its chunks)
                self.chunks.note(key, msg)
        return False

    def _decide(self, key: MessageKey, msg: Any) -> Verdict:
        # the entry's size where it matters: a blind restore, and a batch of one (followed as a single message)
        size = batch_size(msg.message_id()) if key.batch_index == 0 or self.core.blind and key.batch_index > 0 else 0
        verdict = self.core.arrive(key, size, msg, self.tracker.clock.now_ms())
        if verdict is Verdict.PARK:
            self._release.rearm()
        return verdict

    # -- acknowledging -------------------------------------------------------------

    async def acknowledge(self, message: Any) -> None:
        """Acknowledge a message (or id); once the client accepted it, cancel its pending nack and remember it
        (``dedup``). A failed ack raises and changes nothing here: a pending nack stays pending. A message this
        consumer did not receive (``MessageId.earliest`` too) goes to the client as it is (Pulsar's way: the broker decides; refusing would turn
        a late or repeated ack into an error). Runtime: O(1), plus the tracker's discard when nacks are pending."""
        self._check_open()
        await self._acknowledge(message)

    async def _acknowledge(self, message: Any, key: Optional[MessageKey] = None) -> None:  # dead letters too
        received = type(message) is ReceivedMessage  # the hot path: its key was built on arrival, its ack is direct
        if key is None and not received and names_no_message(message):  # MessageId.earliest: the client's alone
            waiting = self._consumer.acknowledge(message)
            if waiting is not None:
                await waiting
            return
        key = key or (message.nacktracker_key if received else None) or self._keys.key(message)
        direct = self._pump.direct if received else None
        waiting = direct.acknowledge(message) if direct is not None else self._consumer.acknowledge(message)
        if waiting is not None:
            await waiting
        result = self.core.acked(key, self.tracker.clock.now_ms())
        self._failures.acked(key)
        if self._local is not None:
            self._local.acked(key)
        if self.chunks is not None:
            self.chunks.forget(key)
        if result.discard and self.tracker.pending:
            self.tracker.discard(key)
        if result.tokens:
            await self._ack_copies(result.tokens)

    async def acknowledge_cumulative(self, message: Any) -> None:
        """As ``pulsar.asyncio.Consumer.acknowledge_cumulative`` (not allowed on Shared subscriptions: it raises,
        and then nothing changes here). Settles everything at or before the message in its topic partition: held
        copies, parked copies, copies waiting in the receive queue, batch records; later copies of those are
        dropped. O(held + records + queued)."""
        self._check_open()
        if names_no_message(message):  # MessageId.earliest: nothing at or before it here; the client's alone
            await self._consumer.acknowledge_cumulative(message)
            return
        key = self._keys.key_and_count(message)[0]
        await self._consumer.acknowledge_cumulative(message)
        tokens = self.core.acked_cumulative(key, self.tracker.clock.now_ms())
        if self._local is not None:
            self._local.acked_cumulative(key, self.core.records, self.tracker.discard)
        self._pump.clear(lambda msg: self.core.is_acked(self._keys.key(msg)))  # waiting, now acknowledged
        if tokens:
            await self._ack_copies(tokens)

    async def _ack_copies(self, tokens: list[Any]) -> None:
        """Acknowledge dropped copies of acknowledged messages: completes their deliveries' batch ackers (what
        acks a batch entry at the broker without batch-index acks). A failure is logged: the message is acked."""
        for token in tokens:
            try:
                await acknowledged(self._pump.direct, self._consumer, token)
            except Exception as exc:  # the broker resends an unacked copy: counted, logged with its traceback
                self._counts["copy_ack_failures"] += 1
                log.debug("ack of a dropped copy failed: %r", exc, exc_info=True)

    async def negative_acknowledge(self, message: Any, delay_ms: Optional[int] = None) -> None:
        """Redeliver ``message`` after ``delay_ms`` (default: the backoff for
        its redelivery count, else the consumer's ``delay_ms``); it reaches
        the application at its bucket's time (exactly at the due time with
        ``precision_bits=0``), not before.

        ``message``: a received Message or its id (``msg.message_id()``, from any topic form: plain,
        partitioned, a list, a pattern). Once its redelivery count reaches ``max_redeliveries`` the
        message is dead-lettered instead. A bare message id has no redelivery count (it is never
        dead-lettered). A nack of a message already acknowledged is
        ignored (logged, counted in ``nacks_after_ack``): the broker would
        never send it again. One this consumer did not receive (or an id
        naming a position, ``MessageId.earliest``): :class:`NotReceivedError`. On Exclusive/Failover a nacked Message comes back from this consumer's
        memory (the docs' "Subscription types per broker"); a bare id, which carries no message, at its time
        by asking the broker to resend what is unacknowledged, as the plain client does on those types (the
        application's other messages are not surfaced twice). Never blocks. Runtime: O(1) amortised.
        """
        self._check_open()
        if names_no_message(message):
            raise NotReceivedError(f"{message}, a position (as MessageId.earliest) and not a message,")
        key, count = self._keys.key_and_count(message)
        self._received(key)
        if self._local is not None:  # redelivered from memory: see consumer/local.py
            count = self._local.redelivery_count(key, count)
        if delay_ms is not None:
            delay_ms = check_delay_ms("delay_ms", delay_ms)
        if self.core.is_acked(key):
            self.core.nack_refused(key)
            log.warning("nack of %s ignored: it was acknowledged already", key)
            return
        if self._dead_letters.in_flight and key in self._dead_letters.in_flight:  # one letter per message
            self._failures.nacks_while_lettered += 1
            log.warning("nack of %s ignored: its retry or dead letter is being published (its ack settles it)", key)
            return
        count = self._failures.nacking(key, count, message)  # ends an ack timeout; the consumer's own count
        if self.chunks is not None:  # a chunked message: its request names every chunk
            self.chunks.note(key, message)
        self._dead_letters.candidate = message  # what the tracker's dead-letter hook publishes
        try:
            due = self.tracker.add(key, delay_ms=delay_ms, redelivery_count=count or 0)
        finally:
            self._dead_letters.candidate = None
        if self._local is not None:
            self._local.nacked(key, message, bare_id=is_bare_id(message))
        size = batch_size(message.message_id()) if key.batch_index >= 0 and isinstance(message, pulsar.Message) else 0
        self.core.nacked(key, due, message, self.tracker.clock.now_ms(), size)
        self._release.rearm()

    async def reconsume_later(self, message: Any, delay_ms: Optional[int] = None,
                              properties: Optional[dict[str, str]] = None) -> None:
        """Java's ``reconsumeLater``: publish ``message`` to the retry topic, due ``delay_ms`` from now (default: the
        consumer's ``backoff`` of its reconsume count, else its ``delay_ms``),
        then acknowledge it. It comes back from the retry topic (the consumer
        subscribes to it) at its due time exactly: a copy the broker sends early
        is held until then. The retry carries Java's properties
        (``RECONSUMETIMES``, ``DELAY_TIME``, ``REAL_TOPIC``, ``ORIGIN_MESSAGE_ID``
        ...: :mod:`.letters.java`) plus ``properties``; once ``RECONSUMETIMES``
        would pass ``max_redeliveries`` it goes to the dead-letter topic instead,
        with the same properties. Needs ``subscribe(..., enable_retry=True)``
        (``RuntimeError`` otherwise) and a received Message (``TypeError``); a
        message already acknowledged: ``ValueError``. A failed publish raises
        :class:`~.letters.publisher.DeadLetterError` and leaves the message
        unacknowledged. Runtime: a broker round trip to publish, one to acknowledge.
        """
        await self._failures.reconsume_later(message, delay_ms, properties)

    async def dead_letter(self, message: Any, reason: str, exception: Optional[BaseException] = None) -> None:
        """A terminal nack: publish ``message`` to the dead-letter topic now, through the consumer's one ordered dead-letter
        producer (after the dead letters decided before it), with
        ``DEAD_LETTER_REASON`` = ``reason`` and, given an ``exception``,
        ``DEAD_LETTER_EXCEPTION`` = its type's ``module.QualifiedName``, besides
        the usual dead-letter properties (``REAL_TOPIC``, ``REAL_SUBSCRIPTION``,
        ``ORIGIN_MESSAGE_ID``); then acknowledge it. The dead-letter topic is
        ``dead_letter_topic`` (default ``<topic>-<subscription>-DLQ``), with or
        without ``max_redeliveries``. Needs a received Message (``TypeError``); a
        message already acknowledged: ``ValueError``. A failed publish raises
        :class:`~.letters.publisher.DeadLetterError` and leaves the message
        unacknowledged. Runtime: a broker round trip to publish, one to acknowledge.
        """
        await self._failures.dead_letter(message, reason, exception)

    # -- the tracker's side ----------------------------------------------------------

    def _on_fired(self, cell: FiredCell) -> None:
        """The tracker handed a bucket's cell to the adapter (a fire listener)."""
        self.core.fired(cell.bucket_ms, cell.keys, self.tracker.clock.now_ms())
        self._release.rearm()

    def _still_consumed(self, entry: MessageKey) -> bool:
        """Whether a request for batch ``entry`` should wait: the entry is still being consumed (the
        application holds a message of it, or some are still on their way to it: the newest message the
        pump took is one of its, not its last), so the broker would send those again (a duplicate, at
        another consumer of a Shared subscription); and the entry's first nack is not due yet (waiting past
        that would only make it later). O(messages in the entry)."""
        record = self.core.records.get(entry)
        if record is None:
            return False
        newest = self._newest  # messages of the entry still in the client's queue: not yet taken by the pump
        arriving = (newest is not None and newest.batch_index < record.size - 1 and newest.entry_id == entry.entry_id
                    and newest.ledger_id == entry.ledger_id and newest.partition == entry.partition
                    and newest.topic == entry.topic)
        if not arriving and not self.core.holds_sibling(entry):
            return False
        first = record.nacked.min_release()
        due = 0 if first is None else first
        return self.tracker.clock.now_ms() < due

    def _pending(self, key: MessageKey) -> bool:
        return bool(self.tracker.pending) and key in self.tracker

    def _received(self, key: MessageKey) -> MessageKey:
        # Received: the core knows it, or a nack (maybe restored) is pending. Unchecked without dedup (re-acks
        # stay idempotent). A bare id with no topic: nothing of its ledger arrived at this multi-topic consumer
        if key.topic is not None and (self._dedup is None or self.core.knows(key) or self._pending(key)):
            return key
        raise NotReceivedError(key)

    def _knows(self, key: MessageKey) -> bool:
        """Whether this consumer received ``key`` (the core knows it, or a nack of it is pending)."""
        return self.core.knows(key) or self._pending(key) or self._pending(key.entry)

    # -- the rest of the consumer API ----------------------------------------------

    async def seek(self, messageid: Union[pulsar.Message, pulsar.MessageId, int]) -> None:
        """As ``pulsar.asyncio.Consumer.seek``, and also a Message or ``msg.message_id()`` /
        ``MessageId.earliest``/``latest`` (see :func:`~.options.seek_target`). What was acked or held
        surfaces again as the broker resends it (:meth:`DeliveryCore.sought`); pending nacks stay scheduled."""
        self._check_open()
        await self._consumer.seek(seek_target(messageid))
        self._pump.clear()  # as the client clears its queue: the broker resends from the new position
        self.core.sought()

    async def get_last_message_id(self) -> Any:
        self._check_open()
        return await self._consumer.get_last_message_id()

    def redeliver_unacknowledged_messages(self) -> None:
        """As the client's: what the application holds may surface again (copies of pending nacks: when due)."""
        self._check_open()
        self.core.forget_held()
        self._consumer.redeliver_unacknowledged_messages()

    def topic(self) -> str:
        return str(self._consumer.topic())

    def subscription_name(self) -> str:
        return str(self._consumer.subscription_name())

    def consumer_name(self) -> str:
        return str(self._consumer.consumer_name())

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        """Every public call that reaches the client or the tracker: not closed, and on the consumer's own
        event loop (its pump, tracker and timers live there: from another loop or thread a receive would
        wait on futures nobody completes, a nack would reach a tracker that is not thread-safe). O(1)."""
        if self._closed:
            raise ConsumerClosed()
        loop = self._loop
        if loop is not None and _get_running_loop() is not loop:
            raise RuntimeError(
                "the consumer's event loop is closed: nothing it tracked can be redelivered from it any more "
                "(close a consumer before its loop ends; make a new one in the new loop)" if loop.is_closed() else
                "TrackedConsumer must be used from the event loop it was created in (another loop or thread "
                "called it; from another thread hand the call over with asyncio.run_coroutine_threadsafe)")

    def stats(self) -> dict[str, Any]:
        """The tracker's stats plus the consumer's (each key, its meaning and
        unit: the docs' "Stats and metrics" page). ``nbytes`` is everything the consumer holds for its
        pending nacks, ``nbytes_parts`` its split (:mod:`.memory`). Runtime: O(1) plus the tracker's,
        the deduplicator's ``nbytes()`` and the delivery core's (O(batch records + parked copies))."""
        tracker = self.tracker.stats()
        out: dict[str, Any] = {**tracker, "lateness_ms": self.lateness.summary(), "received": self._pump.received,
                "prefetched": self._pump.queued, "admit_failures": self._pump.admit_failures,
                **core_stats(self.core), **self._counts,
                **self._dead_letters.stats(), **self._failures.stats(tracker["nacks"]),
                "snapshots_saved": self._store.saved if self._store else 0,
                "snapshot_failures": self._store.failures if self._store else 0,
                "bursts": len(self.adapter.bursts) if isinstance(self.adapter, ReportsBursts) else 0,
                "lead_ms": self.tracker.lead_ms,
                "settle_waits": self.adapter.settle_waits if isinstance(self.adapter, WaitsForSiblings) else 0,
                "dedup_remembered": len(self._dedup) if self._dedup is not None else 0,
                "locally_kept": self._local.adapter.stored if self._local is not None else 0,
                "chunked_nacks": len(self.chunks) if self.chunks is not None else 0}
        # received messages kept outside the core: for local redelivery, retry copies, letters to publish
        kept = out["locally_kept"] + out["retry_copies_held"] + out["dead_letter_pending"]
        parts = nbytes_parts(tracker=tracker["nbytes"], core=self.core, kept_elsewhere=kept, dedup=self._dedup,
                             counts=self._failures.counts)
        out["nbytes"], out["nbytes_parts"] = sum(parts.values()), parts
        return out

    async def unsubscribe(self) -> None:
        """Unsubscribe, then release everything :meth:`close` releases. Pending
        nacks are dropped with the subscription, and so are the snapshot files
        (a new subscription of that name must not hold back its messages)."""
        self._check_open()
        self._pump.expect_failure = True  # the pump's receive() is about to fail: expected
        try:
            await self._consumer.unsubscribe()
        finally:
            self._pump.expect_failure = False
        await self._shutdown(close_consumer=False)

    async def close(self) -> None:
        """Stop the pump and the tracker (awaiting dead letters in flight),
        save the snapshot (with ``snapshot_path``), close dead-letter producers
        and the consumer. Idempotent. A failed final save is raised after
        everything else is closed. Parked copies go back with the consumer
        (unacknowledged: the broker hands them to the subscription again).
        Called after the consumer's event loop closed (the application's loop
        ended first): a ``RuntimeError`` saying how many nacks were pending,
        saved to ``snapshot_path`` first when there is one."""
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
        loop = self._loop
        if loop is not None and _get_running_loop() is not loop:
            if not loop.is_closed():
                self._check_open()  # the error for a call from another loop or thread
            self._closed = True  # its loop is gone: nothing of it can run; what it tracked is saved if it can be
            pending = self.tracker.pending
            saved = self._store is not None and close_consumer and self._store.save_now(self.tracker, self.core)
            raise RuntimeError(
                f"the consumer's event loop closed before the consumer: its {pending} pending nacks "
                + ("were saved to its snapshot_path (a consumer started on it redelivers them)" if saved else
                   "cannot be redelivered (close a consumer before its loop ends, or give it a snapshot_path)"))
        self._closed = True
        self._release.stop()
        if self._saver is not None:  # a write in flight finishes (see SnapshotStore.save), then the final save
            self._saver.cancel()
            await asyncio.gather(self._saver, return_exceptions=True)
        await self._pump.stop()
        await self.tracker.close()  # waits for an adapter call in flight: the snapshot has everything
        save_error: Optional[Exception] = None
        if self._store is not None and close_consumer:
            save_error = await self._store.final_save(self.tracker, self.core)
        elif self._store is not None:  # unsubscribed: the nacks went with the subscription
            save_error = await self._store.remove()
        if isinstance(self.adapter, ClosesAsync):
            await self.adapter.aclose()
        await self._failures.close()  # its timers, the retry producer (after what it has queued)
        await self._dead_letters.close()  # the tracker's close awaited every dead letter it decided
        if close_consumer:
            await quietly(self._consumer.close())
        if save_error is not None:
            raise save_error

