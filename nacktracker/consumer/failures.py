"""What a TrackedConsumer does around failure besides nacks, gathered in one
part the shell delegates to: retry letters (``reconsume_later``), terminal dead
letters (``dead_letter``), ack timeouts, its own delivery counts, and holding
retry copies the broker sends early until they are due.

Each concern is its own module (the letters: :mod:`.letters`; :mod:`.ack_timeout`,
:mod:`.counts`); this one joins them, given what it works with by the shell
(core, tracker, keys, a put function: never the consumer), and keeps the shell thin. Time is read only
through the tracker's clock (a retry letter's wall-clock due time is placed on
it with one wall reading, :func:`nacktracker.clock.wall_ms`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Awaitable, Callable, Optional

import pulsar

from .._checks import check_client_delay
from ..clock import wall_ms
from ..errors import LetterInFlightError, NacktrackerError, PropertyError
from ..keys import MessageKey
from ..tracker import NegativeAcksTracker
from .ack_timeout import AckTimeouts
from .chunks import ChunkedNacks
from .core import DeliveryCore
from .counts import DeliveryCounts
from .deadlines import Deadlines
from .ids import MessageKeys, batch_size
from .letters.in_flight import ConsumerDeadLetters
from .letters.java import check_letter_properties
from .letters.publisher import DeadLetterPublisher
from .letters.retry import RetryLetters, TerminalDeadLetters
from .options import ConsumerOptions

__all__ = ["FailureHandling"]

log = logging.getLogger("nacktracker.consumer")


class FailureHandling:
    """The failure side of one TrackedConsumer, given what it works with (never the consumer):

    ``options``: the consumer's; ``client``/``schema``: for the retry producer (``enable_retry``);
    ``letters``: the consumer's :class:`ConsumerDeadLetters` (whose publisher dead-letters); ``tracker``
    and ``core``: where an ack timeout schedules its redelivery, and whose clock times the retry copies;
    ``keys``: the consumer's :class:`~.ids.MessageKeys`; ``counts``: its own delivery counts (also the
    snapshot's); ``chunks``: its :class:`~.chunks.ChunkedNacks` or ``None``; ``put(msg)``: hands a message
    to the application (the pump's queue); ``rearm()``: the release timer's; ``received(key)``: the
    consumer's received-check (:class:`~nacktracker.errors.NotReceivedError`); ``check_open()``: its
    closed/loop check; ``closed()``: whether it is closed; ``nack(msg, delay_ms)``: its nack; ``keep(key, msg)``:
    where the consumer redelivers locally (Exclusive/Failover), what keeps a message for its redelivery
    (an ack timeout's, as a nack's), else ``None``.
    It owns (and :meth:`close` closes) its timers, the ack timeouts and the retry producer."""

    def __init__(self, options: ConsumerOptions, *, client: Any, schema: Any, letters: ConsumerDeadLetters,
                 tracker: NegativeAcksTracker, core: DeliveryCore, keys: MessageKeys, counts: DeliveryCounts,
                 chunks: Optional[ChunkedNacks], put: Callable[[Any], None], rearm: Callable[[], None],
                 received: Callable[[MessageKey], MessageKey], check_open: Callable[[], None],
                 closed: Callable[[], bool], nack: Callable[..., Awaitable[None]],
                 keep: Optional[Callable[[MessageKey, Any], None]] = None) -> None:
        opts = self.options = options
        retry_topic, most = opts.retry_letter_topic, opts.max_redeliveries
        if opts.enable_retry and (retry_topic is None or most is None):
            raise ValueError("enable_retry needs retry_letter_topic and max_redeliveries here "
                             "(nacktracker.subscribe sets Java's defaults)")
        self.letters, self.tracker, self.core, self.keys, self.chunks = letters, tracker, core, keys, chunks
        self._put, self._rearm, self._received, self._check_open, self._closed, self._nack = (
            put, rearm, received, check_open, closed, nack)
        self._keep = keep
        publisher: Optional[DeadLetterPublisher] = letters.publisher
        self.counts = counts
        self.terminal = None if publisher is None else TerminalDeadLetters(publisher)
        self.retries = None
        if opts.enable_retry and publisher is not None and retry_topic is not None and most is not None:
            retry = DeadLetterPublisher(client, subscription=publisher.subscription,
                                        consumer_name=publisher.consumer_name,
                                        dead_letter_topic=retry_topic, schema=schema, kind="RETRY")
            self.retries = RetryLetters(retry, publisher, topic=retry_topic, max_redeliveries=most,
                                        lead_ms=opts.retry_lead_ms)
        self.ack_timeouts = None if opts.ack_timeout_ms is None else AckTimeouts(
            opts.ack_timeout_ms, opts.ack_timeout_backoff, schedule=self._schedule_ack_timeout,
            discard=tracker.discard, last=self._ack_timeout_last, clock=lambda: tracker.clock,
            max_redeliveries=opts.max_redeliveries)
        self.wall_ms = wall_ms  # replaceable in tests (a fake wall clock beside a ManualClock)
        self._early = Deadlines()  # retry copies the broker sent early: (due on the tracker's clock, message)
        self._timer: Any = None
        self._timer_at: Optional[float] = None
        self.early_held = 0
        self.dropped_in_flight = 0
        self.bad_properties = 0  # retry copies whose DELAY_TIME was refused: surfaced as they came
        self.nacks_while_lettered = 0  # nacks ignored: the message's letter was being published
        self.ack_timeouts_scheduled = 0  # tracker adds made by ack timeouts (not nacks: taken out of "nacks")
        self.ack_timeout_redeliveries = 0  # of those, the ones whose time came: redeliveries asked for
        self._timing: set[MessageKey] = set()  # entries whose ack timeout is in the tracker (with ack_timeout_ms)

    # -- the shell's hooks -------------------------------------------------------------

    def fired(self, cell: Any) -> None:
        """A fire handed ``cell.keys`` to the adapter: each entry's redelivery counts; those an ack
        timeout put there are ack-timeout redeliveries. O(k)."""
        self.counts.redelivered(cell.keys)
        timing = self._timing
        if timing:
            for key in cell.keys:
                if key in timing:
                    timing.discard(key)
                    self.ack_timeout_redeliveries += 1

    def surfacing(self, msg: Any) -> bool:
        """A copy the core let through: ``False`` when it is another copy of a message whose
        letter is being published (dropped: the letter's ack settles it), or a retry copy the
        broker sent before it is due (held here until then). O(log n)."""
        letters = self.letters
        if letters.in_flight:
            key = self.keys.key(msg)
            if key in letters.in_flight:
                held = self.core.held.pop(key, None)
                if key.batch_index >= 0:  # each delivery of a batch entry acks it through its own batch acker
                    letters.keep_copies(key, [*(held.tokens if held is not None else ()), msg])
                self.dropped_in_flight += 1
                return False
        if self.retries is None:
            return True
        try:
            due_wall = self.retries.due_wall_ms(msg)
        except PropertyError as exc:  # from anything that produces to the retry topic: never stops the pump
            self.bad_properties += 1
            log.warning("a retry copy with an unreadable property surfaces as it came: %s", exc)
            return True
        if due_wall is None:
            return True
        clock = self.tracker.clock
        now = clock.now_ms()
        due = math.ceil(now + (due_wall - self.wall_ms()))
        if due <= now:
            return True
        self._early.push(due, msg)
        self.early_held += 1
        if self._timer_at is None or due < self._timer_at:
            self._arm(due)
        return False

    def received(self, msg: Any) -> Any:
        """The application receives ``msg`` (returned): its ack timeout starts. O(1) amortised."""
        if self.ack_timeouts is not None:
            key, count = self.keys.key_and_count(msg)
            own = self._own_count(key, msg)  # (an entry of several messages: the broker's count)
            self.ack_timeouts.started(key, self.counts.count(key.entry, count or 0) if own else count or 0, msg)
        return msg

    def nacking(self, key: MessageKey, count: Optional[int], message: Any) -> Optional[int]:
        """A nack of ``key`` (the broker's redelivery count ``count``, ``None``
        for a bare id): ends its ack timeout; returns the count to decide with."""
        if self.ack_timeouts is not None:
            self.ack_timeouts.cancel(key)
            self._timing.discard(key.entry)
        if count is None or not self._own_count(key, message):
            return count
        count = self.counts.count(key.entry, count)
        self.counts.at_least(key.entry, count)
        return count

    @staticmethod
    def _own_count(key: MessageKey, message: Any) -> bool:
        """Whether the consumer's own count applies: a message alone in its entry (batched or not).
        An entry of several messages keeps the broker's count: siblings nacked apart make several
        requests of the entry, which the broker may answer once (the entry acked meanwhile by
        another consumer's dead letters) while each counts here; measured: three Shared consumers
        dead-lettered batched messages twice with the consumer's own counts."""
        if key.batch_index < 0:
            return True
        mid = message.message_id() if callable(getattr(message, "message_id", None)) else None
        return mid is not None and batch_size(mid) <= 1
    def acked(self, key: MessageKey) -> None:
        """``key`` was acknowledged (the core knows): its entry's count goes, unless a batch sibling
        still waits for its redelivery (nacked in the entry's record, or its copy parked). O(1) for
        an entry without a count (nearly all) and for a batch entry with one."""
        entry = key.entry
        if self._timing:
            self._timing.discard(entry)
        if not self.counts.has(entry):
            return
        if key.batch_index >= 0 and self.core.awaits_copy(entry):
            return
        self.counts.forget(entry)

    def stats(self, tracker_nacks: int = 0) -> dict[str, int]:
        """The failure side's stats (the docs' stats page); ``tracker_nacks``: the tracker's ``nacks``, of which
        the ack timeouts' redeliveries are taken out (``nacks`` counts the application's). O(1)."""
        by_cause = self.letters.by_cause
        dead = {f"dead_letters_{cause}": n for cause, n in by_cause.items()}
        out = {"nacks": tracker_nacks - self.ack_timeouts_scheduled,
               "ack_timeout_redeliveries": self.ack_timeout_redeliveries,
               "retry_letters": self.retries.counts["reconsumed"] if self.retries is not None else 0,
               **dead, "dead_lettered": sum(by_cause.values()),
               "delivery_counts": len(self.counts), "retry_copies_held": len(self._early),
               "letter_copies_dropped": self.dropped_in_flight,
               "terminal_dead_letters": self.terminal.published if self.terminal is not None else 0,
               "reconsumed": 0, "reconsume_dead_lettered": 0,
               "bad_properties": self.bad_properties, "nacks_while_lettered": self.nacks_while_lettered,
               "ack_timeouts_started": 0, "ack_timeouts_cancelled": 0, "ack_timeouts_last": 0}
        if self.retries is not None:
            out.update(self.retries.counts)
        if self.ack_timeouts is not None:
            out.update(self.ack_timeouts.counts)
        return out

    async def open_producers(self) -> None:
        """The retry producer created before the first retry (none without ``enable_retry``)."""
        if self.retries is not None:
            await self.retries.retry.open(self.retries.topic)

    async def close(self) -> None:
        """Closing: timers off, the retry producer closed (after what it has queued). Held retry
        copies stay unacknowledged: the broker resends them to the subscription."""
        if self.ack_timeouts is not None:
            self.ack_timeouts.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None
        if self.retries is not None:
            await self.retries.close()

    # -- the public calls (TrackedConsumer.reconsume_later / dead_letter) -------------------

    async def reconsume_later(self, message: Any, delay_ms: Optional[int],
                              properties: Optional[dict[str, str]]) -> None:
        self._check_open()
        if self.retries is None:
            raise RuntimeError("reconsume_later needs subscribe(..., enable_retry=True)")
        self._check_message("reconsume_later", message)
        if properties is not None and (not isinstance(properties, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in properties.items())):
            raise TypeError("properties must be a dict of str to str")
        if properties:
            check_letter_properties(properties)  # the caller's: a ValueError here, before anything is published
        delay = None if delay_ms is None else check_client_delay("delay_ms", delay_ms)
        key = self._settle_check(message, "reconsume_later")
        backoff = self.options.backoff
        try:
            props, times, delay = self.retries.prepare(
                message, delay, properties, backoff if backoff is not None else lambda _: self.options.delay_ms)
        except PropertyError as refused:  # the message cannot be retried as it is: dead-lettered, saying why
            await self._settle(message, key, self.retries.reconsume_refused(message, refused), "bad_property")
            return
        await self._settle(message, key, self.retries.reconsume(message, props, times, delay), "max_redeliveries")

    async def dead_letter(self, message: Any, reason: str, exception: Optional[BaseException]) -> None:
        self._check_open()
        if self.terminal is None:
            raise RuntimeError("dead_letter needs the client (use nacktracker.subscribe)")
        self._check_message("dead_letter", message)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, not {type(reason).__name__}")
        if exception is not None and not isinstance(exception, BaseException):
            raise TypeError(f"exception must be an exception, not {type(exception).__name__}")
        key = self._settle_check(message, "dead_letter")
        await self._settle(message, key, self.terminal.publish(message, reason, exception), "dead_letter")

    # -- internals -----------------------------------------------------------------------

    async def _settle(self, message: Any, key: MessageKey, publishing: Awaitable[Any], cause: str) -> None:
        """Publish a letter, then acknowledge the message; other copies of it are dropped meanwhile.
        ``cause``: the dead letter's, should ``publishing`` publish one (see ``ack_when_published``)."""
        letters = self.letters
        letters.publishing(key)
        ack_timeouts = self.ack_timeouts
        if ack_timeouts is not None:  # the letter settles the message: its ack timeout ends (restarted if it fails)
            ack_timeouts.cancel(key)
            self._timing.discard(key.entry)
        try:
            await letters.ack_when_published(message, publishing, key, message_key=key, cause=cause)
        except Exception:
            if ack_timeouts is not None and not self._closed():
                self.received(message)
            raise

    @staticmethod
    def _check_message(call: str, message: Any) -> None:
        if not isinstance(message, pulsar.Message):
            raise TypeError(f"{call} takes a received pulsar Message (it carries the payload), "
                            f"not {type(message).__name__}")

    def _settle_check(self, message: Any, call: str) -> MessageKey:
        """The key of a message a letter call may settle: received, not acknowledged, no letter of it
        in flight (one letter per message: the caller publishes it before its next await). O(1)."""
        key: MessageKey = self.keys.key_and_count(message)[0]
        if key in self.letters.in_flight:
            raise LetterInFlightError(key, call)
        self._received(key)
        if self.core.is_acked(key):
            raise ValueError(f"{key} was acknowledged already: nothing to {call.replace('_', ' ')}")
        return key

    def _arm(self, at_ms: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at_ms
        self._timer = self.tracker.clock.call_at(at_ms, self._release)

    def _release(self) -> None:
        """Hand the retry copies now due to the application, in due order."""
        self._timer = self._timer_at = None
        now = self.tracker.clock.now_ms()
        for item in self._early.pop_due(now):
            self._put(item.key)
        following = self._early.next_ms()
        if following is not None:
            self._arm(following)

    def _schedule_ack_timeout(self, key: MessageKey, delay_ms: int, count: int, msg: Any) -> None:
        self.ack_timeouts_scheduled += 1
        self._timing.add(key.entry)
        if self.chunks is not None:  # a chunked message: its request names every chunk (chunks.py)
            self.chunks.note(key, msg)
        due = self.tracker.add(key, delay_ms=delay_ms, redelivery_count=count)
        if self._keep is not None:  # local redelivery: the broker resends no chosen message, the kept one comes back
            self._keep(key, msg)
        self.core.nacked(key, due, msg, self.tracker.clock.now_ms())
        self._rearm()

    def _ack_timeout_last(self, msg: Any) -> None:
        """A last delivery's ack timeout passed: nack it now (the tracker dead-letters it)."""
        if not self._closed():
            asyncio.get_running_loop().create_task(self._quiet_nack(msg))

    async def _quiet_nack(self, msg: Any) -> None:
        letters = self.letters
        letters.cause = "ack_timeout"  # the tracker's hook runs within the nack's first step, before any await
        try:
            await self._nack(msg, delay_ms=0)
        except (NacktrackerError, RuntimeError) as exc:  # closed (ConsumerClosed, TrackerClosedError, its loop) or
            # forgotten meanwhile (NotReceivedError): nothing to do; anything else is a bug, raised in this task
            log.debug("ack timeout of a last delivery not nacked: %r", exc)
        finally:
            letters.cause = "max_redeliveries"
