"""NegativeAcksTracker: the only part of nacktracker that knows time.

One timer, armed at the earliest pending bucket (minus the adapter's declared
lead). An add into an earlier bucket pulls the timer earlier; an add into a
later bucket leaves it alone, so a steady stream of nacks never postpones a
due redelivery. On fire, every due bucket is popped and handed to the adapter
in one call; then the timer is armed at the next bucket.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import sys
import time
from asyncio import _get_running_loop
from collections import Counter, deque
from math import ceil as _ceil  # add's path: one global lookup, not two
from threading import get_ident
from typing import Any, Callable, Iterable, Literal, NamedTuple, Optional, Sequence, TypedDict, overload

from . import snapshot as _snapshot
from ._checks import MAX_DUE, check_default_delay, check_delay_ms, check_int
from .adapters.base import RedeliveryAdapter
from .clock import Clock, LoopClock, TimerHandle
from .errors import TrackerClosedError
from .events import NackEvent
from .index import TimeBucketIndex
from .keys import MessageKey, key_of
from .precision import Precision

__all__ = ["NegativeAcksTracker", "TrackerClosedError", "LatencyHistogram", "TrackerStats", "LatencySummary",
           "FireListener", "FiredCell", "PendingState"]

log = logging.getLogger(__name__)

_FOREVER = (1 << 63) - 1


class PendingState(NamedTuple):
    """A tracker's pending set as :meth:`NegativeAcksTracker.export_pending` gives it: ``now_ms``, the
    clock's reading rounded up (0 before the tracker is bound); ``unsent``: entry ids popped but not yet
    handed to the adapter (due now), by origin ``(topic, partition, ledger_id)``; ``buckets``:
    ``(origin, bucket time ms, bitmap of entry ids)`` per index cell."""

    now_ms: int
    unsent: dict[tuple[Optional[str], int, int], list[int]]
    buckets: list[tuple[tuple[Optional[str], int, int], int, Any]]


class LatencySummary(TypedDict):
    """:meth:`LatencyHistogram.summary`: count and nearest-rank percentiles (ms): whole ms,
    or ``max`` itself where the whole ms would read above it."""

    count: int
    p50: Optional[float]
    p99: Optional[float]
    max: Optional[float]


class TrackerStats(TypedDict):
    """What :meth:`NegativeAcksTracker.stats` returns (counters since creation, gauges now)."""

    pending: int  #: scheduled redeliveries (an entry pending in two buckets counts twice)
    unsent: int  #: due keys waiting for the adapter (retrying, or left at close)
    #: upper bound on time buckets pending (TimeBucketIndex.bucket_count_bound: O(windows))
    buckets: int
    #: upper bound on (bucket, ledger) cells pending (TimeBucketIndex.bitmap_count_bound: O(windows))
    bitmaps: int
    nbytes: int  #: bytes held by the pending set
    nacks: int
    redelivered: int
    dead_lettered: int
    dead_letter_failures: int
    failures: int  #: failed adapter calls (each retried)
    fires: int
    rejected_after_close: int
    threadsafe_failures: int  #: add_threadsafe calls that failed on the loop (logged)
    #: how late the timer handed each entry to the adapter against the time it was armed for
    #: (the bucket's time minus the adapter's lead), per entry: the timer's own figure, not a
    #: message's error (TrackedConsumer.stats()["lateness_ms"] is that)
    timer_lag_ms: LatencySummary


class FiredCell(NamedTuple):
    """One (bucket, ledger) cell a fire hands to the adapter."""

    bucket_ms: int  #: the bucket's time (the due time at ``precision_bits=0``)
    timer_lag_ms: float  #: how late the fire was against the cell's fire time (bucket - lead)
    keys: list[MessageKey]  #: the entries handed over (batch_index -1: Pulsar redelivers entries)


#: ``listener(cell)``: called on the loop once per :class:`FiredCell`.
FireListener = Callable[[FiredCell], None]


class LatencyHistogram:
    """Counts per whole millisecond, clamped to ``[-limit, limit]``: bounded
    memory whatever the traffic. Percentiles are exact to 1 ms inside the range."""

    __slots__ = ("limit", "_counts", "count", "max")

    def __init__(self, limit_ms: int = 600_000) -> None:
        self.limit = limit_ms
        self._counts: Counter[int] = Counter()
        self.count = 0
        self.max: Optional[float] = None

    def add(self, value_ms: float, weight: int = 1) -> None:
        self._counts[max(-self.limit, min(self.limit, round(value_ms)))] += weight
        self.count += weight
        if self.max is None or value_ms > self.max:
            self.max = value_ms

    def percentile(self, p: float) -> Optional[int]:
        if not self.count:
            return None
        rank = max(1, math.ceil(p / 100 * self.count))
        seen = 0
        for value in sorted(self._counts):
            seen += self._counts[value]
            if seen >= rank:
                return value
        return None  # unreachable

    def summary(self) -> LatencySummary:
        top = None if self.max is None else round(self.max, 3)
        # the counts are whole ms: a percentile never reads above the largest value seen (0.8 ms is p50 0.8, not 1)
        p50, p99 = self.percentile(50), self.percentile(99)
        return {"count": self.count, "p50": p50 if p50 is None or top is None else min(p50, top),
                "p99": p99 if p99 is None or top is None else min(p99, top), "max": top}


class NegativeAcksTracker:
    """Schedules redeliveries of negatively acknowledged messages.

    ``adapter``: a :class:`~nacktracker.adapters.RedeliveryAdapter`.
    ``delay_ms``: default nack delay. ``precision_bits``/``rounding``: the
    bucket width 2^bits ms and whether a bucket fires early (``"floor"``,
    Pulsar's semantics) or late (``"ceil"``). ``backoff``: ``f(redelivery_count)
    -> ms`` used when ``add`` gets no ``delay_ms``. ``max_redeliveries``: a
    message nacked with ``redelivery_count >= max_redeliveries`` is not
    scheduled but handed to ``on_dead_letter(key)`` (sync or async; required
    then: dropping silently is not an option). ``clock``: a
    :class:`~nacktracker.clock.Clock` (default: the event loop's monotonic
    clock). ``on_event``: receives a :class:`~nacktracker.events.NackEvent` per
    nack, redelivery and dead letter. What each fire hands over is told to
    the listeners of :meth:`add_fire_listener`.

    The adapter's ``lead_ms`` is read at every use, so an adapter may learn
    its path latency as it goes (:class:`~nacktracker.adapters.PulsarAdapter`
    does).

    Must be used from one event loop; other threads call :meth:`add_threadsafe`.

    >>> from nacktracker.adapters import MemoryAdapter
    >>> async def main():
    ...     adapter = MemoryAdapter()
    ...     async with NegativeAcksTracker(adapter, delay_ms=10, precision_bits=0) as t:
    ...         t.add(MessageKey(ledger_id=1, entry_id=2))
    ...         await adapter.wait_for(1)
    ...     return adapter.redelivered
    >>> asyncio.run(main())
    [MessageKey(ledger_id=1, entry_id=2, partition=-1, batch_index=-1, topic=None)]
    """

    def __init__(self, adapter: RedeliveryAdapter, *, delay_ms: int = 60_000, precision_bits: int = 8,
                 rounding: str = "floor", backoff: Optional[Callable[[int], int]] = None,
                 max_redeliveries: Optional[int] = None,
                 on_dead_letter: Optional[Callable[[MessageKey], Any]] = None,
                 clock: Optional[Clock] = None, on_event: Optional[Callable[[NackEvent], Any]] = None,
                 retry_min_ms: int = 100, retry_max_ms: int = 10_000,
                 consumer_name: Optional[str] = None, precision: Optional[Precision] = None) -> None:
        if not callable(getattr(adapter, "redeliver", None)):
            raise TypeError(f"adapter must have an async redeliver(keys) method, not {type(adapter).__name__}")
        lead = check_int("adapter.lead_ms", getattr(adapter, "lead_ms", 0) or 0)  # read at every use: see _lead
        self._coalesce = check_int("adapter.coalesce_ms", getattr(adapter, "coalesce_ms", 0) or 0)
        self._delay_ms = check_default_delay("delay_ms", delay_ms)
        # a consumer hands down the Precision its options built (then precision_bits and rounding are its)
        self.precision = precision if precision is not None else Precision.of(precision_bits, rounding)
        if not isinstance(self.precision, Precision):
            raise TypeError(f"precision must be a Precision, not {type(self.precision).__name__}")
        self._bucket_add, self._bucket_mask = self.precision.add, self.precision.mask  # _schedule's Precision.bucket
        self._nacks = 0  # nacks scheduled (stats()["nacks"]): an int of its own, not a Counter item, on add's path
        for name, fn in (("backoff", backoff), ("on_dead_letter", on_dead_letter), ("on_event", on_event)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable, not {type(fn).__name__}")
        if max_redeliveries is not None:
            max_redeliveries = check_int("max_redeliveries", max_redeliveries)
            if max_redeliveries < 1:
                raise ValueError("max_redeliveries must be >= 1")
            if on_dead_letter is None:
                raise ValueError("max_redeliveries needs on_dead_letter: the tracker never drops a message silently")
        if clock is not None and not (callable(getattr(clock, "now_ms", None))
                                      and callable(getattr(clock, "call_at", None))):
            raise TypeError("clock must provide now_ms() and call_at(when_ms, callback)")
        self._retry_min = check_delay_ms("retry_min_ms", retry_min_ms) or 1
        self._retry_max = max(self._retry_min, check_delay_ms("retry_max_ms", retry_max_ms))
        self.adapter = adapter
        self.precision_bits, self.rounding = self.precision.bits, self.precision.rounding
        self.delay_ms = self._delay_ms
        self.max_redeliveries = max_redeliveries
        self.consumer_name = consumer_name
        self._backoff = backoff
        self._on_dead_letter = on_dead_letter
        self._on_event = on_event
        self._lead_ok = lead  # the last valid adapter.lead_ms
        self._lead_bad: object = None  # the last invalid one, logged once
        self._clock: Optional[Clock] = clock
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        # the bound loop when it is asyncio's own (it records the thread running it): add()'s cheap test
        self._own_loop: Optional[asyncio.BaseEventLoop] = None
        self._index = TimeBucketIndex(self.precision.bits, self.precision.rounding)  # (Precision.of: the same object)
        # one slot per (partition, ledger[, topic]); see _slot()
        self._slots: dict[tuple[int, int], dict[Optional[str], int]] = {}
        self._origins: dict[int, tuple[Optional[str], int, int]] = {}
        self._free_slots: list[int] = []  # released slot numbers, reused first
        self._next_slot = 0
        self._timer: Optional[TimerHandle] = None
        self._timer_at: Optional[int] = None
        self._timer_limit: Optional[int] = None  # the armed time plus the lead: see _arm
        self._timer_lead = 0  # the lead of _timer_limit
        self._retry_timer: Optional[TimerHandle] = None
        self._retry_streak = 0
        self._outbox: deque[list[MessageKey]] = deque()
        self._sending: Optional[asyncio.Task[None]] = None
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._fire_listeners: list[FireListener] = []
        self._closed = False
        self._timer_lag = LatencyHistogram()
        self._n: Counter[str] = Counter()  # nacks, redelivered, dead_lettered, failures, ...
        try:
            self._bind(asyncio.get_running_loop())
        except RuntimeError:
            pass  # bound on first use inside a loop

    # -- public API --------------------------------------------------------------

    def add(self, message_id: Any, *, delay_ms: Optional[float] = None,
            redelivery_count: Optional[int] = None) -> Optional[int]:
        """Schedule a redelivery of ``message_id`` (a ``pulsar.Message``, a
        message id or a :class:`MessageKey`).

        Delay: ``delay_ms`` if given, else ``backoff(redelivery_count)`` when a
        backoff is set, else the tracker's ``delay_ms``. ``redelivery_count``
        defaults to the message's own (0 for ids). Returns the due time on the
        tracker's clock (ms), or ``None`` when the message was dead-lettered.
        Call it on the tracker's event loop: from another thread it raises
        ``RuntimeError`` (use :meth:`add_threadsafe`). Never blocks.
        Runtime complexity: O(1) amortised.
        """
        # The common call (a valid MessageKey, a count below max_redeliveries: the consumer's every nack)
        # runs inline, _schedule's steps included: each call and check saved is a share of an add's budget.
        # Anything else takes _add, the general path.
        if type(message_id) is not MessageKey or self._closed:
            return self._add(message_id, delay_ms, redelivery_count)
        count = 0 if redelivery_count is None else redelivery_count  # a MessageKey's own count is 0
        if type(count) is not int or count >> 63:  # not an int in [0, 2^63): _add names what is wrong
            return self._add(message_id, delay_ms, redelivery_count)
        ledger, entry, partition, batch, topic = message_id  # key_of's test of a MessageKey, inline
        # ints, ids in [0, 2^63), partition and batch index in [-1, 2^63 - 1) (the largest takes _add's path)
        if not (type(ledger) is int and type(entry) is int and type(partition) is int and type(batch) is int
                and not (ledger | entry | (partition + 1) | (batch + 1)) >> 63 and (topic is None or type(topic) is str)):
            return self._add(message_id, delay_ms, redelivery_count)
        most = self.max_redeliveries
        if most is not None and count >= most:  # dead-lettered: the general path
            return self._add(message_id, delay_ms, redelivery_count)
        delay = delay_ms if type(delay_ms) is int and delay_ms >= 0 else self._delay_of(delay_ms, count)
        own = self._own_loop
        if own is None or own._thread_id != get_ident():  # type: ignore[attr-defined]
            self._check_thread()  # O(1); not asyncio's own loop, not bound yet, or not this loop's thread
        # the rest is _schedule's, inline
        clock = self._clock if self._clock is not None else self._clk  # (the property raises when unbound)
        now = _ceil(clock.now_ms())
        due = now + delay
        if due > MAX_DUE:
            raise ValueError(f"delay_ms {delay} is too large")
        topics = self._slots.get((partition, ledger))
        slot = None if topics is None else topics.get(topic)
        if slot is None:
            slot = self._slot(message_id, create=True)
        self._index.add(slot, entry, due)
        self._nacks += 1
        bucket = (due + self._bucket_add) & self._bucket_mask  # Precision.bucket
        lead = getattr(self.adapter, "lead_ms", 0) or 0  # read at every add (see _lead): it may be learned
        limit = self._timer_limit
        if limit is None or bucket < limit or lead != self._timer_lead or type(lead) is not int:
            self._rearm(bucket, now)  # an earlier fire, maybe (else nothing to do: no per-add timer work)
        if self._on_event is not None:
            self._emit("nack", message_id, delay, count)
        return due

    def _add(self, message_id: Any, delay_ms: Optional[float], redelivery_count: Optional[int]) -> Optional[int]:
        """:meth:`add`'s general path: any id, an explicit count, dead letters, a closed tracker."""
        if self._closed:
            raise TrackerClosedError("tracker is closed")
        key, own_count = key_of(message_id)
        count = redelivery_count if redelivery_count is not None else (own_count or 0)
        if type(count) is not int or count >> 63:  # checks only what is not a plain int in range
            count = check_int("redelivery_count", count)
        delay = self._delay_of(delay_ms, count)
        self._check_thread()  # O(1): the full test (add's inline path has the cheap one)
        if self.max_redeliveries is not None and count >= self.max_redeliveries:
            self._dead_letter(key, count, delay)
            return None
        return self._schedule(key, delay, count)

    def _delay_of(self, delay_ms: Optional[float], count: int) -> int:
        """A nack's delay: ``delay_ms`` checked, else the backoff's for ``count``, else the tracker's. O(1)
        plus the backoff."""
        if delay_ms is not None:
            return check_delay_ms("delay_ms", delay_ms)
        if self._backoff is not None:
            return check_delay_ms("backoff result", self._backoff(count))
        return self._delay_ms

    def _check_thread(self) -> None:
        """``add`` outside the tracker's loop: bind to the running loop on
        first use, else refuse (a foreign thread's add would touch the index
        and the loop's timer unlocked, its redelivery left to whenever the
        loop next wakes)."""
        running = _get_running_loop()
        if running is not None and running is self._loop:
            return
        if self._loop is None and running is not None:
            self._bind(running)
            return
        if self._loop is None:
            raise RuntimeError("NegativeAcksTracker.add() needs a running event loop (the tracker is bound "
                               "to it on first use); from another thread use add_threadsafe()")
        raise RuntimeError("NegativeAcksTracker.add() called outside its event loop's thread (or from another "
                           "loop): from other threads use add_threadsafe(), which hands the add to the loop")

    def add_threadsafe(self, message_id: Any, *, delay_ms: Optional[float] = None,
                       redelivery_count: Optional[int] = None) -> None:
        """:meth:`add` from another thread (e.g. a pulsar listener thread).

        Everything :meth:`add` would refuse is refused here, in the calling
        thread: bad ids, counts and delays, a delay past the clock's range,
        and a ``backoff`` that raises or returns a bad delay (the backoff is
        called in this thread, so it must be thread-safe; the built-in ones
        are pure). The add itself runs on the tracker's loop; should it still
        fail there (the tracker closed meanwhile, a broken hook), the failure
        is logged and counted in ``stats()`` (``rejected_after_close``,
        ``threadsafe_failures``), never dropped silently.
        """
        if self._closed:
            raise TrackerClosedError("tracker is closed")
        if self._loop is None:
            raise RuntimeError("the tracker is not bound to an event loop yet: create it inside the loop")
        key, own_count = key_of(message_id)
        count = check_int("redelivery_count", redelivery_count if redelivery_count is not None else (own_count or 0))
        if delay_ms is not None:
            delay = check_delay_ms("delay_ms", delay_ms)
        elif self._backoff is not None:
            delay = check_delay_ms("backoff result", self._backoff(count))
        else:
            delay = self._delay_ms
        # the clock is monotonic: a due time in range now stays in range on the loop a moment later
        if math.ceil(self._clk.now_ms()) + delay > MAX_DUE:
            raise ValueError(f"delay_ms {delay} is too large")

        def run() -> None:
            try:
                self.add(key, delay_ms=delay, redelivery_count=count)
            except TrackerClosedError:
                self._n["rejected_after_close"] += 1
                log.warning("nack of %s arrived after close; not scheduled", key)
            except Exception:
                self._n["threadsafe_failures"] += 1
                log.exception("nack of %s from another thread failed on the loop; not scheduled", key)

        self._loop.call_soon_threadsafe(run)

    def discard(self, message_id: Any) -> bool:
        """Cancel the pending redelivery of a message (it was acknowledged).

        Cancels the whole entry (Pulsar redelivers entries; batch siblings are
        the consumer's business). Returns whether anything was pending.
        Runtime complexity: O(b) for the b buckets holding its ledger.
        """
        key, _ = key_of(message_id)
        slot = self._slot(key, create=False)
        if slot is None or not self._index.discard(slot, key.entry_id):
            return False
        self._release(slot)
        return True

    def __contains__(self, message_id: Any) -> bool:
        key, _ = key_of(message_id)
        slot = self._slot(key, create=False)
        return slot is not None and (slot, key.entry_id) in self._index

    @property
    def pending(self) -> int:
        """Pending redeliveries (an entry pending in two buckets counts twice)."""
        return len(self._index)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def loop(self) -> Optional[asyncio.AbstractEventLoop]:
        """The event loop the tracker is bound to: the one running when it was made, else the one of its
        first use (an ``add``, its ``clock``); ``None`` before. O(1)."""
        return self._loop

    @property
    def clock(self) -> Clock:
        """The tracker's clock (the one clock its owner may read: see
        ``TrackedConsumer``). Binds to the running loop on first use."""
        if self._clock is None:
            self._bind(asyncio.get_running_loop())
        return self._clk

    @property
    def _lead(self) -> int:
        """The adapter's ``lead_ms`` now (it may be learned as it goes); a
        value that turns invalid is logged once and the last valid one kept."""
        lead = getattr(self.adapter, "lead_ms", 0) or 0
        if type(lead) is int and 0 <= lead <= 3_600_000:
            self._lead_ok = lead
        elif lead != self._lead_bad:
            self._lead_bad = lead
            log.error("adapter.lead_ms %r is not a valid delay; keeping %d", lead, self._lead_ok)
        return self._lead_ok

    @property
    def lead_ms(self) -> int:
        """How early the timer fires for the adapter's path latency: its ``lead_ms`` now (0 when it declares
        none; the last valid value if it turned invalid). O(1)."""
        return self._lead

    def next_fire_ms(self) -> Optional[int]:
        """When the timer is armed for, on the tracker's clock (None: idle)."""
        return self._timer_at

    def stats(self) -> TrackerStats:
        """Counters and gauges; ``timer_lag_ms`` is actual fire time minus the
        time the timer was armed for (the bucket's time minus the adapter's
        ``lead_ms``): the timer's own figure. A message's error against its
        requested due time also holds the bucket rounding and the adapter's
        path; :class:`~nacktracker.consumer.TrackedConsumer` measures it where
        the message surfaces (its ``stats()["lateness_ms"]``).

        Cheap enough for every metrics scrape on the event loop: O(windows +
        ledgers + cells) (the index's ``nbytes()``), never O(messages).
        ``buckets`` and ``bitmaps`` are therefore upper bounds counted per
        window (exact when each copy sits in its own bucket / cell, or a
        window holds at most 64 copies); the exact counts are the index's
        ``bucket_count()``/``bitmap_count()``, O(n log n)."""
        return {
            "pending": len(self._index), "unsent": sum(map(len, self._outbox)),
            "buckets": self._index.bucket_count_bound(), "bitmaps": self._index.bitmap_count_bound(),
            "nbytes": self.nbytes(), "nacks": self._nacks, "redelivered": self._n["redelivered"],
            "dead_lettered": self._n["dead_lettered"], "dead_letter_failures": self._n["dead_letter_failures"],
            "failures": self._n["failures"], "fires": self._n["fires"],
            "rejected_after_close": self._n["rejected_after_close"],
            "threadsafe_failures": self._n["threadsafe_failures"],
            "timer_lag_ms": self._timer_lag.summary(),
        }

    def add_fire_listener(self, listener: FireListener) -> Callable[[], None]:
        """Call ``listener(cell)`` with a :class:`FiredCell` for every (bucket,
        ledger) cell a fire hands to the adapter: :mod:`nacktracker.metrics`
        records its timer lag, ``TrackedConsumer`` learns when each redelivered
        copy may surface. Returns a function that removes the listener. A
        listener that raises is logged and kept. O(listeners) per cell."""
        if not callable(listener):
            raise TypeError(f"listener must be callable, not {type(listener).__name__}")
        listeners = self._fire_listeners  # not self: a remover must not keep the tracker alive
        listeners.append(listener)

        def remove() -> None:
            if listener in listeners:
                listeners.remove(listener)

        return remove

    def nbytes(self) -> int:
        """Bytes held by the pending set (index plus the ledger routing table)."""
        slots = sys.getsizeof(self._slots) + sys.getsizeof(self._origins)
        slots += sum(sys.getsizeof(t) for t in self._slots.values())
        return self._index.nbytes() + slots

    # -- snapshots (format and rules: nacktracker/snapshot.py) -------------------------

    def snapshot(self) -> bytes:
        """The pending set as bytes: each bucket as its remaining delay, with
        its topic/partition routing, plus the unsent outbox (due now). Works
        on a closed tracker (``await close()`` first to include an adapter
        call in flight). Runtime complexity: O(size of the snapshot).
        """
        return _snapshot.encode(self)

    @classmethod
    def restore(cls, data: Any, adapter: RedeliveryAdapter, *, elapsed: str = "wall",
                **tracker_kwargs: Any) -> "NegativeAcksTracker":
        """A new tracker holding what :meth:`snapshot` saved.

        ``elapsed="wall"`` subtracts the wall time since the snapshot from
        every remaining delay; ``"none"`` restarts them. ``tracker_kwargs`` go
        to the constructor (``precision_bits``/``rounding`` default to the
        snapshot's). Raises :class:`~nacktracker.snapshot.SnapshotError` (a
        ``ValueError``) for foreign, truncated or corrupted data, before any
        tracker is built. Call inside the event loop or pass ``clock=``.
        """
        tracker: NegativeAcksTracker = _snapshot.restore(cls, data, adapter, elapsed=elapsed, **tracker_kwargs)
        return tracker

    def export_pending(self) -> PendingState:
        """The pending set as :meth:`snapshot` saves it, before encoding (the seam the snapshot format uses;
        see :class:`PendingState`). Works on a closed tracker; changes nothing. O(buckets + unsent)."""
        now = math.ceil(self._clock.now_ms()) if self._clock is not None else 0
        unsent: dict[tuple[Optional[str], int, int], list[int]] = {}
        for batch in self._outbox:
            for key in batch:
                unsent.setdefault((key.topic, key.partition, key.ledger_id), []).append(key.entry_id)
        buckets = [(self._origins[slot], bucket, ids) for bucket, slot, ids in self._index.iter_bitmaps()]
        return PendingState(now, unsent, buckets)

    def import_pending(self, origins: Sequence[tuple[Optional[str], int, int]],
                       cells: Iterable[tuple[int, int, Any]]) -> None:
        """Load saved pending cells into this new tracker (what :meth:`restore` does after decoding).

        ``origins``: ``(topic, partition, ledger_id)`` each; ``cells``: ``(origin index, due ms on this
        tracker's clock, entry ids)`` with the ids as an integer array, due times up to ``MAX_DUE``. Each
        origin gets a routing slot of its own (not a live key's lookup, which would merge a topic-less
        origin into the only topic known for its ledger: right for a live key, wrong for a saved table
        holding both), then the timer is armed. Binds to the running loop if no clock was given.
        Runtime: O(ids)."""
        self.clock  # noqa: B018  (binds the tracker, or raises RuntimeError outside a loop)
        slots = [self._new_slot(topic, partition, ledger) for topic, partition, ledger in origins]
        for origin, due, ids in cells:
            self._index.add_many(slots[origin], ids, min(MAX_DUE, due))
        for slot in slots:  # an origin whose cells were all empty (never written, but be safe)
            if not self._index.has_ledger(slot):
                self._release(slot)
        nxt = self._index.next_due_ms()
        if nxt is not None:
            self._arm(nxt - self._lead, nxt)

    def save(self, path: Any) -> None:
        """Write :meth:`snapshot` to ``path`` atomically (temp file in the same
        directory, fsync, rename, fsync the directory): a crash leaves the
        old file or the new one. Blocks for the write."""
        _snapshot.write_atomic(path, self.snapshot())

    @classmethod
    def load(cls, path: Any, adapter: RedeliveryAdapter, *, elapsed: str = "wall",
             **tracker_kwargs: Any) -> "NegativeAcksTracker":
        """:meth:`restore` from a file written by :meth:`save` (``OSError`` if
        it cannot be read)."""
        tracker: NegativeAcksTracker = _snapshot.restore(cls, _snapshot.read_file(path), adapter, elapsed=elapsed,
                                                         **tracker_kwargs)
        return tracker

    async def close(self, flush: bool = False, timeout: Optional[float] = None) -> None:
        """Stop the timer. ``flush=True`` first hands every pending message to
        the adapter (raising if that fails, with the keys still counted in
        ``stats()['unsent']``). ``timeout`` (seconds) bounds the wait for an
        adapter call in flight; past it the call is cancelled and its keys go
        back to ``unsent`` (nothing lost; a snapshot includes them).
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._cancel(self._timer)
        self._timer = self._timer_at = self._timer_limit = None
        self._cancel(self._retry_timer)
        self._retry_timer = None
        if self._sending is not None:
            sending = self._sending
            try:
                done, _ = await asyncio.wait({sending}, timeout=timeout)
            except asyncio.CancelledError:  # our caller gave up (e.g. wait_for): so does the call
                done = None
            if not done:
                sending.cancel()  # its batch goes back to the outbox
                await asyncio.gather(sending, return_exceptions=True)
                if done is None:
                    raise asyncio.CancelledError
        if self._side_tasks:
            await asyncio.gather(*self._side_tasks, return_exceptions=True)
        if flush:
            self._collect(_FOREVER, self._clock.now_ms() if self._clock is not None else 0.0)
            if self._outbox:
                batch = self._take_outbox()
                try:
                    await self.adapter.redeliver(batch)
                except Exception:
                    self._n["failures"] += 1
                    self._outbox.appendleft(batch)
                    raise
                self._delivered(batch)

    async def __aenter__(self) -> "NegativeAcksTracker":
        if self._loop is None:
            self._bind(asyncio.get_running_loop())
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return (f"NegativeAcksTracker(pending={self.pending}, precision_bits={self.precision_bits}, "
                f"rounding={self.rounding!r}, closed={self._closed})")

    # -- scheduling ----------------------------------------------------------------

    @property
    def _clk(self) -> Clock:
        """The clock; set by :meth:`_bind` before anything can be scheduled."""
        if self._clock is None:
            raise RuntimeError("the tracker is not bound to an event loop yet")
        return self._clock

    @property
    def _bound_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the tracker is not bound to an event loop yet")
        return self._loop

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # add()'s cheap test: asyncio's loops (every BaseEventLoop sets it in its __init__) keep the id of the
        # thread running them (None when stopped), the same fact _get_running_loop() gives at the price of a
        # getpid() system call per use (~190 ns, most of an add's budget). Other loops (uvloop) take the full
        # test on every add.
        self._own_loop = loop if isinstance(loop, asyncio.BaseEventLoop) else None
        if self._clock is None:
            self._clock = LoopClock(loop)

    def _schedule(self, key: MessageKey, delay: int, count: int) -> int:
        # every add runs this: _clk, _slot's lookup of a known ledger, Precision.bucket and _lead inline
        clock = self._clock if self._clock is not None else self._clk  # (the property raises when unbound)
        now = _ceil(clock.now_ms())
        due = now + delay
        if due > MAX_DUE:
            raise ValueError(f"delay_ms {delay} is too large")
        topics = self._slots.get((key[2], key[0]))  # (partition, ledger)
        slot = None if topics is None else topics.get(key[4])  # its topic
        if slot is None:
            slot = self._slot(key, create=True)
        self._index.add(slot, key[1], due)
        self._nacks += 1
        bucket = (due + self._bucket_add) & self._bucket_mask  # Precision.bucket
        lead = getattr(self.adapter, "lead_ms", 0) or 0
        limit = self._timer_limit
        if limit is None or bucket < limit or lead != self._timer_lead or type(lead) is not int:
            self._rearm(bucket, now)
        if self._on_event is not None:
            self._emit("nack", key, delay, count)
        return due

    def _rearm(self, bucket: int, now: int) -> None:
        """An add into ``bucket`` that may pull the timer earlier: one earlier than the timer's limit, or
        the adapter's lead changed, or nothing is armed. Re-arms for an earlier fire, and not when the armed
        one is due already (it runs at the loop's next iteration and takes every bucket due within the
        lead: nacks inside the lead window ride along)."""
        armed = self._timer_at
        if armed is not None and armed <= now:
            return
        lead = self._lead
        if self._closed:
            return
        if armed is not None:
            self._timer_limit, self._timer_lead = armed + lead, lead  # the lead now: a bucket below fires earlier
            if bucket - lead >= armed:
                return
        self._arm(bucket - lead, bucket)

    def _arm(self, fire_ms: int, bucket: int) -> None:
        """Arm the timer at ``fire_ms``: ``bucket`` less the adapter's lead now."""
        self._cancel(self._timer)
        # add's one test: a bucket below _timer_limit fires earlier, while the lead stays _timer_lead
        self._timer_at, self._timer_limit, self._timer_lead = fire_ms, bucket, bucket - fire_ms
        self._timer = self._clk.call_at(fire_ms, self._on_timer)

    def _on_timer(self) -> None:
        armed = self._timer_at
        self._timer = self._timer_at = self._timer_limit = None
        if self._closed:
            return
        now = self._clk.now_ms()
        if armed is None:  # a cancelled handle that fired anyway: nothing was armed
            armed = math.floor(now)
        # the loop may wake a hair before the armed time: the armed time counts as reached;
        # buckets due within the adapter's coalesce window ride along (see RedeliveryAdapter)
        lead = self._lead
        self._collect(max(now, armed) + lead + self._coalesce, now)
        self._n["fires"] += 1
        self._kick()
        nxt = self._index.next_due_ms()
        if nxt is not None:
            self._arm(nxt - lead, nxt)

    def _collect(self, horizon_ms: float, now: float) -> None:
        """Pop every bucket due by ``horizon_ms`` into the outbox."""
        keys: list[MessageKey] = []
        released = set()
        fired: list[tuple[int, list[MessageKey]]] = []
        lead = self._lead
        popped: set[tuple[int, int]] = set()  # (slot, entry) already in this fire: an entry is asked for once
        for bucket, slot, bm in self._index.pop_due_bitmaps(min(_FOREVER, math.floor(horizon_ms))):
            topic, partition, ledger = self._origins[slot]
            lag = now - (bucket - lead)
            self._timer_lag.add(lag, len(bm))
            if fired:  # a second cell in one fire (a late or coalesced fire) may hold an entry again
                due = [MessageKey(ledger, entry, partition, -1, topic) for entry in bm if (slot, entry) not in popped]
            else:
                due = [MessageKey(ledger, entry, partition, -1, topic) for entry in bm]
            popped.update((slot, key.entry_id) for key in due)
            released.add(slot)
            if not due:
                continue
            for listener in self._fire_listeners:
                self._notify(listener, FiredCell(bucket, lag, due))
            keys.extend(due)
            fired.append((slot, due))
        # Pulsar redelivers whole entries: this request brings every message of each entry, so the
        # entry's later buckets (batch siblings nacked a little later) are cancelled; they would ask
        # again for an entry already on its way and bring it twice, to another consumer (a duplicate
        # of every sibling). O(k) membership checks for k entries, a discard only where one is left.
        index = self._index
        for slot, due in fired:
            for key in due:
                if (slot, key.entry_id) in index:
                    index.discard(slot, key.entry_id)
        for slot in released:
            self._release(slot)
        if keys:
            self._outbox.append(keys)

    # -- sending -------------------------------------------------------------------

    def _take_outbox(self) -> list[MessageKey]:
        batch = self._outbox.popleft()
        while self._outbox:
            batch.extend(self._outbox.popleft())
        return batch

    def _kick(self) -> None:
        """Start one adapter call if none is running and none is backing off."""
        if self._sending is not None or self._retry_timer is not None or not self._outbox or self._closed:
            return
        self._sending = self._bound_loop.create_task(self._send(self._take_outbox()))

    async def _send(self, batch: list[MessageKey]) -> None:
        try:
            await self.adapter.redeliver(batch)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # we were cancelled (close timeout)
                self._outbox.appendleft(batch)
                raise
            exc: BaseException = asyncio.CancelledError("adapter raised CancelledError")
            self._failed(batch, exc)
        except Exception as exc:  # noqa: BLE001 - the adapter contract: any error is a failure to retry
            self._failed(batch, exc)
        else:
            self._retry_streak = 0
            self._delivered(batch)
        finally:
            self._sending = None
        self._kick()

    def _failed(self, batch: list[MessageKey], exc: BaseException) -> None:
        """Keep the batch (first in line) and retry after a capped backoff."""
        self._n["failures"] += 1
        self._outbox.appendleft(batch)
        wait = min(self._retry_max, self._retry_min * (1 << min(self._retry_streak, 30)))
        self._retry_streak += 1
        log.warning("redeliver of %d messages failed (%r); retrying in %d ms", len(batch), exc, wait)
        if not self._closed:
            self._retry_timer = self._clk.call_at(self._clk.now_ms() + wait, self._retry)

    def _retry(self) -> None:
        self._retry_timer = None
        self._kick()

    def _delivered(self, batch: list[MessageKey]) -> None:
        self._n["redelivered"] += len(batch)
        if self._on_event is not None:
            for key in batch:
                self._emit("redeliver", key, 0, 0)

    # -- dead letters --------------------------------------------------------------

    def _dead_letter(self, key: MessageKey, count: int, delay: int) -> None:
        self._emit("dead_letter", key, delay, count)
        hook = self._on_dead_letter
        if hook is None:  # refused in __init__: max_redeliveries needs a hook
            raise RuntimeError("max_redeliveries without on_dead_letter")
        try:
            result = hook(key)
        except Exception:
            log.exception("on_dead_letter(%s) failed; the message stays pending", key)
            self._dead_letter_failed(key, delay, count)
            return
        if inspect.isawaitable(result):
            task = self._bound_loop.create_task(self._await_dead_letter(result, key, delay, count))
            self._side_tasks.add(task)
            task.add_done_callback(self._side_tasks.discard)
        else:
            self._n["dead_lettered"] += 1

    async def _await_dead_letter(self, result: Any, key: MessageKey, delay: int, count: int) -> None:
        try:
            await result
        except asyncio.CancelledError:  # under the hook (e.g. a client future) or this task (shutdown)
            log.error("on_dead_letter(%s) was cancelled; the message stays pending", key)
            self._dead_letter_failed(key, delay, count)
            raise  # the task ends cancelled either way: close() waits for it without raising
        except Exception:
            log.exception("on_dead_letter(%s) failed; the message stays pending", key)
            self._dead_letter_failed(key, delay, count)
        else:
            self._n["dead_lettered"] += 1

    def _dead_letter_failed(self, key: MessageKey, delay: int, count: int) -> None:
        """Nothing lost: schedule an ordinary redelivery; the next nack of it
        tries the dead-letter hook again. On a tracker closed meanwhile (close()
        awaits dead letters in flight) the key still goes back into the pending
        set, unarmed: a snapshot taken after close() keeps it."""
        self._n["dead_letter_failures"] += 1
        self._schedule(key, delay, count)

    # -- helpers -------------------------------------------------------------------

    @overload
    def _slot(self, key: MessageKey, create: Literal[True]) -> int: ...
    @overload
    def _slot(self, key: MessageKey, create: Literal[False]) -> Optional[int]: ...

    def _slot(self, key: MessageKey, create: bool) -> Optional[int]:
        """The index's ledger id for a key's ``(topic, partition, ledger)``.

        Slots are the tracker's own numbers (:meth:`_new_slot`): ledger ids
        are unique on a real cluster, but some brokers (pulsar-lite) number
        ledgers per topic, so two topics may share one. A key without a
        topic matches the only topic known for its ledger.
        """
        pl = (key.partition, key.ledger_id)
        topics = self._slots.get(pl)
        if topics is not None:
            slot = topics.get(key.topic)
            if slot is not None:
                return slot
            if len(topics) == 1:
                (known, slot), = topics.items()
                if key.topic is None:
                    return slot
                if known is None:  # learn the topic of an id-only key
                    del topics[None]
                    topics[key.topic] = slot
                    self._origins[slot] = (key.topic, key.partition, key.ledger_id)
                    return slot
        if not create:
            return None
        return self._new_slot(key.topic, key.partition, key.ledger_id)

    def _new_slot(self, topic: Optional[str], partition: int, ledger: int) -> int:
        """A slot for a new ``(topic, partition, ledger)``: a number of the
        tracker's own (a released one first, else the next unused), never the
        ledger id itself, so no accepted ledger id (any of ``[0, 2^63)``) can
        meet another origin's slot, live or restored. Runtime: O(1)."""
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = self._next_slot
            self._next_slot += 1
        self._slots.setdefault((partition, ledger), {})[topic] = slot
        self._origins[slot] = (topic, partition, ledger)
        return slot

    def _release(self, slot: int) -> None:
        if self._index.has_ledger(slot):
            return
        topic, partition, ledger = self._origins.pop(slot)
        topics = self._slots[(partition, ledger)]
        del topics[topic]
        if not topics:
            del self._slots[(partition, ledger)]
        self._free_slots.append(slot)  # nothing of it is live: the index takes a reuse as a new ledger

    def _emit(self, kind: str, key: MessageKey, delay: int, count: int) -> None:
        if self._on_event is None:
            return
        try:
            self._on_event(NackEvent(time.time_ns() // 1_000_000, kind, key.ledger_id, key.entry_id, delay,
                                     count, key.partition, key.batch_index, key.topic, self.consumer_name))
        except Exception:
            log.exception("on_event hook failed")

    @staticmethod
    def _notify(listener: FireListener, cell: FiredCell) -> None:
        try:
            listener(cell)
        except Exception:  # a metrics bug must not stop redeliveries
            log.exception("fire listener %r failed", listener)

    @staticmethod
    def _cancel(handle: Optional[TimerHandle]) -> None:
        if handle is not None:
            handle.cancel()
