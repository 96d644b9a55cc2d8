"""PulsarAdapter: asks a pulsar-client consumer to redeliver chosen entries.

The only redelivery-of-chosen-ids path the Python client exposes is
``negative_acknowledge(id)``, which feeds the C++ client's own nack tracker.
That tracker (pulsar-client 3.x) holds every id for at least 100 ms, then
redelivers on a timer tick that runs ~1/3 of that (33 ms) after the *latest*
nack: nacks arriving closer together than ~33 ms keep postponing the tick and
can starve redelivery indefinitely. So this adapter

* sends every id of one tracker fire back to back as one *burst*;
* never starts a burst sooner than ``min_gap_ms`` after the previous burst
  ended: ids handed over meanwhile are queued and merged into the next burst;
* declares the path's latency as ``lead_ms`` so the tracker fires that much
  early: a *measured* quantity, the largest latency from :meth:`redeliver`
  to the copy's arrival at the consumer (reported by the consumer through
  :meth:`PulsarAdapter.arrived` when its receive pump takes the copy from the
  client: a busy consumer's copies wait in the client's queue first, and
  that wait is part of the path they take) over the last minute, plus a quarter of it
  and 20 ms (headroom for the next spike), bounded to [100, 1000] ms and
  updated at every arrival (see :mod:`.lead` for why a time memory and that
  headroom: measured). Copies that arrive before their due time are held by
  the consumer until then, so a lead on the high side costs a short wait,
  never an early message;
* declares ``coalesce_ms`` (half the gap) so buckets due just after a fire
  ride along with it instead of waiting out the gap.

Figures measured here (pulsar-client 3.13, pulsar-lite, nack delay 100):
a lone burst comes back after 103-138 ms (median 133); bursts spaced 34-80 ms
apart come back after 102-166 ms depending on the spacing (the tick lands
33 ms after whichever burst follows the 100 ms hold); gaps under ~33 ms
starve. ``tests/adapters/test_adapters.py`` re-measures spacing and latency each run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from typing import Any, Callable, Optional, Sequence

import _pulsar

from .._checks import check_delay_ms
from ..keys import MessageKey
from .client_close import close_leaves_no_callback
from .lead import LeadEstimator
from .pulsar_layout import raw_consumer

__all__ = ["PulsarAdapter", "MIN_NACK_DELAY_MS", "DEFAULT_LEAD_MS", "DEFAULT_MIN_GAP_MS", "LEAD_BOUNDS_MS", "is_multi_topic"]

log = logging.getLogger(__name__)

#: The C++ client clamps ``negative_ack_redelivery_delay_ms`` to at least this
#: (``MIN_NACK_DELAY_MILLIS`` in lib/NegativeAcksTracker.cc; measured: 0, 10
#: and 100 all come back after ~133 ms).
MIN_NACK_DELAY_MS = 100
#: Median latency of a lone burst (nack call -> message received by the
#: application), measured at 133 ms (min 103, p99 138). With bursts every
#: ``min_gap_ms`` (40) the path measured 108-133 ms (median 115) plus up to one
#: gap of queueing (median ~20), so the same lead centres both regimes on 0.
DEFAULT_LEAD_MS = 133
#: The learned lead stays within these: no copy comes back faster than the
#: client's 100 ms hold, and a path slower than a second is an outage, not a
#: latency to plan for.
LEAD_BOUNDS_MS = (100, 1000)
#: The window of :meth:`PulsarAdapter.latency_summary` (the lead itself is learned
#: over a time memory: :class:`~.lead.LeadEstimator`).
_SUMMARY_WINDOW = 256
#: An entry handed over longer ago than this without an arrival went to
#: another consumer (or was lost with a reconnect): forget it.
_HANDED_TTL_MS = 10_000
#: The client's tick is 33 ms; 40 leaves 7 ms for timer jitter. A tick that
#: fires after the next burst is re-armed and costs 33 ms more (measured under
#: load: p99 grows, redelivery never stops); 50 measured ~25 ms later medians
#: in dense traffic for no gain in the tail. Only precision_bits <= 5 makes
#: fires come this close: with the default 256 ms buckets bursts are far apart.
DEFAULT_MIN_GAP_MS = 40
#: Ids per synchronous stretch of a burst: each nack costs ~11 us of C++ work
#: (it re-arms the client's timer), so a long burst yields to the event loop
#: every this many ids (~6 ms) instead of blocking it.
_CHUNK = 512
#: The longest a request waits while :attr:`PulsarAdapter.sibling_held` says the application still
#: works through a message of its entry: past it the request goes anyway (a duplicate at worst, if
#: another consumer gets the entry). A TrackedConsumer's own rule ends the wait sooner: once the
#: entry's first nack is due. This bound, the slowest path planned for (:data:`LEAD_BOUNDS_MS`), is
#: for a ``sibling_held`` that never lets go.
SETTLE_WAIT_MS = 1000
#: How the C++ client names a multi-topic consumer's topic(); the only outward sign
#: of one. Only matters for keys without a topic (the consumer always sets it).
_MULTI_TOPIC_MARK = "-TopicsConsumerFakeName-"


def is_multi_topic(consumer: Any) -> bool:
    """Whether a pulsar-client consumer reads several topics (a list or a pattern). O(1)."""
    return _MULTI_TOPIC_MARK in consumer.topic()


class PulsarAdapter:
    """Redeliver due entries through a pulsar-client consumer's nack path.

    ``consumer``: a ``pulsar.Consumer``, a ``pulsar.asyncio.Consumer`` or the
    underlying ``_pulsar.Consumer`` (both wrappers keep it in ``._consumer``).
    It **must be subscribed with** ``negative_ack_redelivery_delay_ms=100``
    (:data:`MIN_NACK_DELAY_MS`, the smallest the C++ client allows): every
    redelivery this adapter asks for waits that delay inside the client, so the
    client's default of 60 000 ms would add a minute to every nack, and
    ``lead_ms`` would be wrong. The adapter cannot read the setting back from
    the consumer; :func:`nacktracker.subscribe` sets it for you.

    ``lead_ms``: fix the path latency the tracker fires early by; ``None``
    (default) learns it (see the module doc: ``arrived()`` reports arrivals;
    until 20 have been seen, ``initial_lead_ms``, default
    :data:`DEFAULT_LEAD_MS`). ``min_gap_ms``: the least spacing
    between bursts (default :data:`DEFAULT_MIN_GAP_MS`; at least 34 or the
    client's timer starves).

    Each :class:`~nacktracker.MessageKey` becomes ``_pulsar.MessageId(partition,
    ledger, entry, -1)`` (the client redelivers whole entries anyway). Keys
    carry their topic; a multi-topic consumer routes a nack by the id's topic
    and silently drops ids without one, so those are set with
    ``MessageId.topic_name(topic)``; a key without a topic on a multi-topic
    consumer cannot be routed and is logged and counted in ``unroutable``.

    Cost: ~11 us of C++ per id (the client's map insert and timer re-arm), run
    on the event loop in stretches of 512 ids. Waits between bursts cost no CPU.

    On partitioned topics the ids carry the partition index and the
    partition's topic, as the client expects (proven on Apache Pulsar).
    """

    def __init__(self, consumer: Any, *, lead_ms: Optional[int] = None,
                 min_gap_ms: Optional[int] = None, initial_lead_ms: Optional[int] = None) -> None:
        raw = raw_consumer(consumer)
        if raw is None:  # a _pulsar.Consumer itself
            raw = consumer
        if not isinstance(raw, _pulsar.Consumer):
            raise TypeError("consumer must be a pulsar.Consumer, pulsar.asyncio.Consumer or _pulsar.Consumer, "
                            f"not {type(consumer).__name__}")
        self._raw = raw
        close_leaves_no_callback()  # the client's close() leaves nothing to outlive the interpreter (client_close.py)
        if lead_ms is None:
            self._lead = check_delay_ms("initial_lead_ms", DEFAULT_LEAD_MS if initial_lead_ms is None
                                        else initial_lead_ms)
        else:
            self._lead = check_delay_ms("lead_ms", lead_ms)
        self.learns_lead = lead_ms is None
        self._handed: dict[MessageKey, float] = {}  # entry -> when redeliver() got it (insertion order)
        # entry -> when it was last requested, until its copy arrives (or twice the lead): not asked twice.
        self._in_flight: dict[MessageKey, float] = {}
        self._latencies: deque[float] = deque(maxlen=_SUMMARY_WINDOW)
        self._estimator = LeadEstimator(self._lead, LEAD_BOUNDS_MS)
        self.min_gap_ms = check_delay_ms("min_gap_ms", DEFAULT_MIN_GAP_MS if min_gap_ms is None else min_gap_ms)
        # A bucket due within min_gap_ms after a burst waits for the gap to end (late by up
        # to min_gap_ms); sending those due in the first half with this burst instead halves
        # the worst case: at most min_gap_ms/2 early or late.
        self.coalesce_ms = self.min_gap_ms // 2
        if self.min_gap_ms < 34:
            raise ValueError(f"min_gap_ms must be >= 34 (the client's nack timer ticks every 33 ms and "
                             f"nacks closer together than that starve it), got {self.min_gap_ms}")
        self.multi_topic = is_multi_topic(raw)
        self._queued: dict[MessageKey, None] = {}  # ordered set: merged ids for the next burst
        self._task: Optional[asyncio.Task[None]] = None  # sends bursts while keys are queued
        self._last_end = -float("inf")  # monotonic ms when the previous burst ended
        #: Monotonic ms (``time.monotonic()``) of each burst's start and end, and its size:
        #: the last 1000, for tests and diagnostics.
        self.bursts: list[tuple[float, float, int]] = []
        self.sent = 0
        #: Requests for entries already sent whose copy has not arrived yet (not sent again).
        self.in_flight_merged = 0
        self.unroutable = 0
        self.failures = 0
        #: ``f(entry) -> bool``: whether the application holds a message of ``entry`` (set by the
        #: consumer). The broker answers a request with every message of the entry not acknowledged, so a
        #: request made while the application still works on a sibling would send that sibling again,
        #: to another consumer of a Shared subscription: a duplicate of a message about to be
        #: acknowledged (measured on Apache Pulsar). Such a request waits until the sibling is
        #: acknowledged or nacked (or ``sibling_held`` says so), checked every ``min_gap_ms``, at most
        #: :data:`SETTLE_WAIT_MS`.
        self.sibling_held: Optional[Callable[[MessageKey], bool]] = None
        self._settling: dict[MessageKey, float] = {}  # entry -> since when its request waits for a sibling
        # entries asked for again while their requested copy was on its way: asked for once more if that
        # copy is not back here within its time (it went to another consumer), or the nack is lost
        self._merged: dict[MessageKey, None] = {}
        #: Requests that waited for a held sibling, and those that gave up waiting.
        self.settle_waits = 0
        self.settle_timeouts = 0
        #: ``f(entry) -> entries``: the entries a request for a due ``entry`` names (set by the consumer:
        #: every chunk's entry for a chunked message, see :mod:`nacktracker.consumer.chunks`; the client
        #: itself would name only the last chunk's, which the broker resends alone and the client drops).
        #: ``None``: the entry alone.
        self.entries_of: Optional[Callable[[MessageKey], Sequence[MessageKey]]] = None

    # -- the adapter protocol -----------------------------------------------------

    @property
    def lead_ms(self) -> int:
        """How early the tracker should fire (read by it at every use)."""
        return self._lead

    @property
    def awaiting_arrivals(self) -> bool:
        """Whether any entry handed over still waits for its copy (the
        consumer skips :meth:`arrived` otherwise). O(1)."""
        return bool(self._in_flight)

    @property
    def lead_samples(self) -> int:
        """Path latencies measured so far (the lead is learned from the 20th on). O(1)."""
        return self._estimator.samples

    def arrived(self, entry: MessageKey) -> None:
        """The consumer received a copy of ``entry`` (``batch_index`` -1): if
        this adapter asked for it, one latency sample, and the lead follows
        the last minute's maximum (:class:`~.lead.LeadEstimator`). Runtime:
        O(1) amortised."""
        if self._in_flight:
            self._in_flight.pop(entry, None)
            if self._merged:
                self._merged.pop(entry, None)  # the copy answers the later request too (the core parks it)
        handed = self._handed.pop(entry, None)
        if handed is None:
            return
        now = _now_ms()
        latency = now - handed
        self._latencies.append(latency)
        lead = self._estimator.observe(latency, now)
        if self.learns_lead:
            self._lead = lead

    def latency_summary(self) -> dict[str, Any]:
        """The measured path latency over the window (ms): count, p50, p99, max."""
        ordered = sorted(self._latencies)
        if not ordered:
            return {"count": 0}
        def pick(p: float) -> float:
            return round(ordered[max(0, math.ceil(p * len(ordered)) - 1)], 1)

        return {"count": len(ordered), "p50": pick(0.5), "p99": pick(0.99), "max": round(ordered[-1], 1)}

    async def redeliver(self, keys: Sequence[MessageKey]) -> None:
        """Queue ``keys`` for the next burst and return at once.

        The burst starts now when the previous one ended ``min_gap_ms`` ago or
        more, else at that moment; everything queued by then (this call's keys
        and later calls') goes out in it, back to back. Returning before the
        burst is what lets the tracker hand over its next fire while a burst
        waits for its slot, so keys wait at most one gap. The client's
        ``negative_acknowledge`` never reports failure (it is a local map
        insert, even on a closed consumer); should it raise anyway, the burst's
        keys stay queued and are retried after a growing pause (logged).
        An entry sent in an earlier burst whose copy has not arrived yet (for
        at most twice the lead: then it went elsewhere or was lost) is not sent
        again: the broker redelivers whole entries, and a second request would
        bring the entry a second time, to another consumer of the subscription.
        An entry of which the application still holds a message waits for it to
        be settled (:attr:`sibling_held`).
        Runtime complexity: O(k) for k keys (the burst costs ~11 us per id).
        """
        for key in keys:
            if type(key) is not MessageKey:
                raise TypeError(f"keys must be MessageKey, not {type(key).__name__}")
        now = _now_ms()
        self._overdue(now)
        held = self.sibling_held
        for key in keys:
            entry = key.entry
            if held is not None and entry not in self._queued and held(entry):
                if entry not in self._settling:
                    self._settling[entry] = now
                    self.settle_waits += 1
                continue
            self._settling.pop(entry, None)
            self._enqueue(entry, now)
        if (self._queued or self._settling or self._merged) and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="nacktracker-bursts")

    def _overdue(self, now: float) -> None:
        """Forget requests whose copy is overdue: later than twice the learned lead (the path's recent
        maximum), it went to another consumer or was lost. A request merged into such a one goes out
        now (a duplicate at worst, never a message left behind). O(expired)."""
        for pending, ttl in ((self._handed, _HANDED_TTL_MS), (self._in_flight, 2 * self._lead)):
            while pending:  # oldest first
                first = next(iter(pending))
                if now - pending[first] < ttl:
                    break
                del pending[first]
                if pending is self._in_flight and self._merged and first in self._merged:
                    del self._merged[first]
                    self._enqueue(first, now)

    def _enqueue(self, entry: MessageKey, now: float) -> None:
        """Queue ``entry`` for the next burst, unless its requested copy is still on its way."""
        if entry in self._in_flight and entry not in self._queued:
            # Sent in an earlier burst and its copy has not come back: it is on its way. The broker
            # would answer a second request by sending the whole entry again, to another consumer
            # of a Shared subscription: a duplicate of every message in it. Should that copy go
            # elsewhere instead, this request goes out when it is overdue (_overdue).
            self.in_flight_merged += 1
            self._merged[entry] = None
            return
        self._queued[entry] = None  # whole entries; duplicates merge
        self._handed.setdefault(entry, now)
        self._in_flight.setdefault(entry, now)

    def _settled(self) -> None:
        """Queue the waiting requests whose entry the application no longer holds a message of, or
        that waited :data:`SETTLE_WAIT_MS`. O(waiting requests x entry size)."""
        now, held = _now_ms(), self.sibling_held
        for entry, since in list(self._settling.items()):
            timed_out = now - since >= SETTLE_WAIT_MS
            if held is None or timed_out or not held(entry):
                del self._settling[entry]
                self.settle_timeouts += timed_out
                self._enqueue(entry, now)

    async def aclose(self) -> None:
        """Stop sending. Keys still queued are dropped: the owner is closing
        the consumer, which hands its unacknowledged messages back to the
        subscription anyway. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._queued.clear()
        self._settling.clear()
        self._merged.clear()

    @property
    def queued(self) -> int:
        """Entries waiting for the next burst."""
        return len(self._queued)

    # -- internals ----------------------------------------------------------------

    async def _run(self) -> None:
        """Send bursts while keys are queued, each ``min_gap_ms`` after the last."""
        pause = self.min_gap_ms
        try:
            while self._queued or self._settling or self._merged:
                self._overdue(_now_ms())
                if self._settling:
                    self._settled()
                if not self._queued:
                    if self._settling:  # the application settles meanwhile
                        await asyncio.sleep(self.min_gap_ms / 1000)
                    elif self._merged and self._in_flight:  # until the oldest request is overdue
                        oldest = next(iter(self._in_flight.values()))
                        await asyncio.sleep(max(self.min_gap_ms, oldest + 2 * self._lead - _now_ms()) / 1000)
                    else:  # (not in flight any more: nothing to wait for)
                        merged, self._merged = list(self._merged), {}
                        for entry in merged:
                            self._enqueue(entry, _now_ms())
                    continue
                wait_ms = self._last_end + max(pause, self.min_gap_ms) - _now_ms()
                if wait_ms > 0:
                    await asyncio.sleep(wait_ms / 1000)  # later keys join self._queued meanwhile
                keys, self._queued = list(self._queued), {}
                try:
                    await self._burst(keys)
                    pause = self.min_gap_ms
                except Exception:
                    self.failures += 1
                    pause = min(10_000, pause * 2)
                    log.exception("redelivery burst of %d entries failed; retrying in %d ms", len(keys), pause)
                    self._queued = dict.fromkeys(keys) | self._queued
        finally:
            self._task = None

    async def _burst(self, keys: list[MessageKey]) -> None:
        start = _now_ms()
        sent = 0
        entries_of = self.entries_of
        try:
            for i in range(0, len(keys), _CHUNK):
                if i:
                    await asyncio.sleep(0)  # let the loop breathe inside a long burst
                for key in keys[i:i + _CHUNK]:
                    for named in (key,) if entries_of is None else entries_of(key):
                        mid = self._id_of(named)
                        if mid is not None:
                            self._raw.negative_acknowledge(mid)
                            sent += 1
        finally:
            self.sent += sent
            self._last_end = end = _now_ms()
            self.bursts.append((start, end, len(keys)))
            del self.bursts[:-1000]

    def _id_of(self, key: MessageKey) -> Optional[_pulsar.MessageId]:
        mid = _pulsar.MessageId(key.partition, key.ledger_id, key.entry_id, -1)
        if key.topic:
            mid.topic_name(key.topic)
        elif self.multi_topic:
            self.unroutable += 1
            log.error("cannot redeliver %s: a multi-topic consumer needs the key's topic "
                      "(nack the Message, not a bare id)", key)
            return None
        return mid

    def __repr__(self) -> str:
        return (f"PulsarAdapter(topic={self._raw.topic()!r}, lead_ms={self.lead_ms}, "
                f"min_gap_ms={self.min_gap_ms}, sent={self.sent})")


def _now_ms() -> float:
    # The spacing is measured on the client's side of the boundary: steady real time.
    return time.monotonic() * 1000.0
