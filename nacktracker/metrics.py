"""OpenTelemetry metrics for trackers and consumers, through ``opentelemetry-api`` only.

As OpenTelemetry asks of libraries, nacktracker depends on the API alone (the
``otel`` extra) and never configures an SDK or an exporter: the application
does (``examples/prometheus_metrics.py`` exports to Prometheus). Without an
SDK every instrument is a no-op. Instruments come from the global
``MeterProvider`` unless one is passed in.

What is exported (the Prometheus exporter turns dots into underscores,
appends the unit, ``By`` as ``_bytes`` and ``ms`` as ``_milliseconds``, and
``_total`` to counters):

* levels (observable up-down counters, from ``stats()``):
  ``nacktracker.pending`` {message}, ``nacktracker.unsent`` {message} (due,
  not yet handed over: retrying or closed), ``nacktracker.memory.usage`` By
  (``nbytes``), ``nacktracker.buckets`` {bucket}, ``nacktracker.batch_records``
  {entry} (consumers only);
* counters (observable, from ``stats()``): ``nacktracker.nacks``,
  ``nacktracker.redelivered``, ``nacktracker.dead_lettered`` {message},
  ``nacktracker.dead_letter.failures``, ``nacktracker.adapter.failures``
  {failure}; consumers also: ``nacktracker.ack_timeout.redeliveries``,
  ``nacktracker.retry_letters`` and the dead letters by cause,
  ``nacktracker.dead_letters.max_redeliveries``,
  ``nacktracker.dead_letters.dead_letter_call``,
  ``nacktracker.dead_letters.ack_timeout``,
  ``nacktracker.dead_letters.bad_property`` {message};
* ``nacktracker.redelivery.lateness`` (histogram, ms; consumers only): per
  redelivered message, when it surfaced (was handed to the application)
  minus its bucket's time -- the requested due time at ``precision_bits=0``,
  ``subscribe``'s default; with more bits the due time is up to
  2^precision_bits - 1 ms after the bucket's;
* ``nacktracker.timer.lag`` (histogram, ms): per (bucket, ledger) cell a fire
  hands to the adapter, how late the tracker's timer fired against the time
  it was armed for (the bucket's time minus the adapter's ``lead_ms``). The
  timer's own figure: with a lead, a cell is handed over early on purpose,
  and its message surfaces later; not a message's error.

Counters and gauges are read from ``stats()`` when a reader collects
(nothing is added to the nack path). Histograms take non-negative values: an
early wake-up counts as 0.

Attributes: ``pulsar.topic``, ``pulsar.subscription``, ``pulsar.consumer``
(those given), plus any ``attributes=`` passed. A consumer's ``pulsar.topic``
is the topic it was subscribed to (topics joined by ``,``; not its retry
topic, nor the client's ``...-TopicsConsumerFakeName-<random>`` of a
multi-topic consumer): the same series after a restart.

>>> import asyncio
>>> from nacktracker import NegativeAcksTracker
>>> from nacktracker.adapters import MemoryAdapter
>>> async def main():
...     async with NegativeAcksTracker(MemoryAdapter()) as tracker:
...         with instrument_tracker(tracker, topic="orders", subscription="workers"):
...             pass  # exported while the block runs; the registration ends with it
>>> asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Union

from . import __version__
from ._extras import require

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

    from .tracker import FiredCell, NegativeAcksTracker

__all__ = ["NackMetrics", "Registration", "instrument_tracker", "instrument_consumer", "observe_stats",
           "LATENCY_BOUNDARIES_MS", "INSTRUMENTS"]

log = logging.getLogger(__name__)

StatsFn = Callable[[], Mapping[str, Any]]


@dataclass(frozen=True)
class _Spec:
    name: str
    stat: str  # the stats() key it reads
    unit: str
    description: str
    counter: bool  # monotonic since creation (else a level that goes up and down)


#: Every stats-backed instrument, in the order of the table above.
INSTRUMENTS: tuple[_Spec, ...] = (
    _Spec("nacktracker.pending", "pending", "{message}", "Scheduled redeliveries", False),
    _Spec("nacktracker.unsent", "unsent", "{message}", "Due messages not yet handed to the adapter", False),
    _Spec("nacktracker.memory.usage", "nbytes", "By", "Bytes held for pending nacks (a consumer: all it holds for them)", False),
    _Spec("nacktracker.buckets", "buckets", "{bucket}",
          "Time buckets holding pending nacks (an upper bound counted per window)", False),
    _Spec("nacktracker.batch_records", "batch_records", "{entry}",
          "Batch entries with nacked messages the consumer keeps a record of", False),
    _Spec("nacktracker.nacks", "nacks", "{message}", "Nacks scheduled", True),
    _Spec("nacktracker.redelivered", "redelivered", "{message}", "Messages handed to the adapter for redelivery", True),
    _Spec("nacktracker.dead_lettered", "dead_lettered", "{message}", "Messages handed to the dead-letter hook", True),
    _Spec("nacktracker.dead_letter.failures", "dead_letter_failures", "{failure}",
          "Failed dead-letter hooks (the message stays pending)", True),
    _Spec("nacktracker.adapter.failures", "failures", "{failure}",
          "Failed adapter calls (each retried with backoff; nothing dropped)", True),
    _Spec("nacktracker.ack_timeout.redeliveries", "ack_timeout_redeliveries", "{message}",
          "Redeliveries scheduled by ack timeouts (not nacks)", True),
    _Spec("nacktracker.retry_letters", "retry_letters", "{message}",
          "Retry letters published by reconsume_later()", True),
    _Spec("nacktracker.dead_letters.max_redeliveries", "dead_letters_max_redeliveries", "{message}",
          "Dead letters published because max_redeliveries was reached (nacks and reconsumes)", True),
    _Spec("nacktracker.dead_letters.dead_letter_call", "dead_letters_dead_letter", "{message}",
          "Dead letters published by dead_letter()", True),
    _Spec("nacktracker.dead_letters.ack_timeout", "dead_letters_ack_timeout", "{message}",
          "Dead letters published because the ack timeout of a last delivery passed", True),
    _Spec("nacktracker.dead_letters.bad_property", "dead_letters_bad_property", "{message}",
          "Dead letters published because a reconsumed message's property could not be read", True),
)

#: Bucket boundaries of the lateness and timer-lag histograms (ms).
LATENCY_BOUNDARIES_MS = (0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)

#: How long a collection waits for a busy event loop to read a tracker's stats (s).
_LOOP_WAIT_S = 1.0


@dataclass(eq=False)
class _Source:
    stats: Callable[[], Optional[StatsFn]]  # a weak or strong reference to the stats callable
    attributes: dict[str, str]
    loop: Optional[asyncio.AbstractEventLoop]
    detach: list[Callable[[], None]] = field(default_factory=list)


class Registration:
    """One tracker or consumer being observed; :meth:`close` (or leaving the
    ``with`` block) stops it. Dropped by itself when the observed object is
    garbage collected."""

    def __init__(self, metrics: "NackMetrics", source: _Source) -> None:
        self._metrics, self._source = metrics, source

    @property
    def source(self) -> _Source:
        """What is observed: its stats, attributes and the listeners to detach on close."""
        return self._source

    @property
    def attributes(self) -> Mapping[str, str]:
        return dict(self._source.attributes)

    def close(self) -> None:
        """Stop observing (idempotent)."""
        self._metrics.remove(self._source)

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class NackMetrics:
    """The instruments of one ``MeterProvider`` and the trackers they observe.

    Use :func:`instrument_tracker` / :func:`instrument_consumer`, which share
    one ``NackMetrics`` per provider (instruments are created once; each
    observed object adds its own attributes).
    """

    def __init__(self, meter_provider: Optional["MeterProvider"] = None) -> None:
        api = require("opentelemetry.metrics", "otel", "nacktracker.metrics")
        self._meter = api.get_meter("nacktracker", __version__, meter_provider=meter_provider)
        self._Observation = api.Observation
        self._sources: list[_Source] = []
        self._lock = threading.Lock()  # readers collect from their own threads
        for spec in INSTRUMENTS:
            create = (self._meter.create_observable_counter if spec.counter
                      else self._meter.create_observable_up_down_counter)
            create(spec.name, callbacks=[self._callback(spec.stat)], unit=spec.unit, description=spec.description)
        self._lateness = self._meter.create_histogram(
            "nacktracker.redelivery.lateness", unit="ms",
            description="How late a redelivered message surfaced to the application, against its bucket's time "
                        "(the requested due time at precision_bits=0)",
            explicit_bucket_boundaries_advisory=LATENCY_BOUNDARIES_MS)
        self._timer_lag = self._meter.create_histogram(
            "nacktracker.timer.lag", unit="ms",
            description="How late the tracker's timer handed a due (bucket, ledger) cell to the adapter, "
                        "against the time it was armed for (bucket - lead)",
            explicit_bucket_boundaries_advisory=LATENCY_BOUNDARIES_MS)

    # -- registering -------------------------------------------------------------

    def observe(self, stats: StatsFn, attributes: Mapping[str, str], *,
                loop: Optional[asyncio.AbstractEventLoop] = None, weak: bool = True) -> Registration:
        """Export the stats-backed instruments from ``stats()`` (a tracker's or
        a consumer's ``stats``; keys it lacks are skipped) with ``attributes``.
        ``loop``: the event loop that owns the object (default: the running
        one, if any); a collection from another thread reads ``stats()`` on
        that loop. ``weak``: hold a bound method weakly (the registration ends
        with its object)."""
        if not callable(stats):
            raise TypeError(f"stats must be callable, not {type(stats).__name__}")
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        ref: Callable[[], Optional[StatsFn]]
        if weak and hasattr(stats, "__self__") and hasattr(stats, "__func__"):
            ref = weakref.WeakMethod(stats)
        else:
            ref = lambda: stats  # noqa: E731
        source = _Source(ref, _check_attributes(attributes), loop)
        with self._lock:
            self._sources.append(source)
        return Registration(self, source)

    def instrument(self, tracker: "NegativeAcksTracker", attributes: Mapping[str, str], *,
                   stats: Optional[StatsFn] = None, consumer: Any = None) -> Registration:
        """Observe ``tracker`` (its ``stats()``, or ``stats`` when given, e.g.
        its consumer's) and record its fires into the timer-lag histogram;
        with ``consumer`` (a :class:`~nacktracker.TrackedConsumer`), also its
        redelivered messages into the lateness histogram."""
        loop = tracker.loop
        registration = self.observe(stats if stats is not None else tracker.stats, attributes, loop=loop)
        lag, lateness, attrs = self._timer_lag, self._lateness, registration.source.attributes

        def on_fire(cell: FiredCell) -> None:
            lag.record(max(0.0, cell.timer_lag_ms), attrs)

        def on_redelivered(lateness_ms: float) -> None:
            lateness.record(max(0.0, lateness_ms), attrs)

        registration.source.detach.append(tracker.add_fire_listener(on_fire))
        if consumer is not None:
            registration.source.detach.append(consumer.lateness.add_listener(on_redelivered))
        return registration

    def remove(self, source: _Source) -> None:
        """Stop observing ``source`` (what :meth:`Registration.close` does). Idempotent."""
        with self._lock:
            if source in self._sources:
                self._sources.remove(source)
        for detach in source.detach:
            detach()
        source.detach.clear()

    # -- collecting --------------------------------------------------------------

    def _callback(self, stat: str) -> Callable[["CallbackOptions"], Iterable["Observation"]]:
        def observe(options: "CallbackOptions") -> Iterable["Observation"]:
            out = []
            for source, values in self._read_all():
                value = values.get(stat)
                if isinstance(value, (int, float)):
                    out.append(self._Observation(value, source.attributes))
            return out

        return observe

    def _read_all(self) -> list[tuple[_Source, Mapping[str, Any]]]:
        with self._lock:
            sources = list(self._sources)
        out = []
        for source in sources:
            fn = source.stats()
            if fn is None:  # the object is gone
                self.remove(source)
                continue
            values = _read(fn, source.loop)
            if values is not None:
                out.append((source, values))
        return out


def _read(fn: StatsFn, loop: Optional[asyncio.AbstractEventLoop]) -> Optional[Mapping[str, Any]]:
    """``fn()`` on ``loop``'s thread: the tracker is not thread-safe, and
    readers (a periodic exporter, a Prometheus scrape) run on their own
    threads. ``None`` when the loop is too busy to answer in time."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is None or running is loop or loop.is_closed() or not loop.is_running():
        return fn()
    future: concurrent.futures.Future[Mapping[str, Any]] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the reader's thread, raised there
            future.set_exception(exc)

    try:
        loop.call_soon_threadsafe(run)
        return future.result(timeout=_LOOP_WAIT_S)
    except concurrent.futures.TimeoutError:
        log.debug("event loop busy: skipped one collection of %r", fn)
        return None
    except RuntimeError:  # the loop closed meanwhile: nothing mutates the object any more
        return fn()


def _check_attributes(attributes: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in attributes.items():
        if not isinstance(key, str):
            raise TypeError(f"attribute names must be str, not {type(key).__name__}")
        if value is not None:
            out[key] = str(value)
    return out


_registries: dict[Optional[int], tuple[Optional["MeterProvider"], NackMetrics]] = {}
_registries_lock = threading.Lock()


def metrics_for(meter_provider: Optional["MeterProvider"] = None) -> NackMetrics:
    """The shared :class:`NackMetrics` of ``meter_provider`` (None: the global one)."""
    key = None if meter_provider is None else id(meter_provider)
    with _registries_lock:
        entry = _registries.get(key)
        if entry is None or entry[0] is not meter_provider:
            entry = (meter_provider, NackMetrics(meter_provider))
            _registries[key] = entry
        return entry[1]


def _attributes(topic: Optional[str], subscription: Optional[str], consumer: Optional[str],
                extra: Optional[Mapping[str, str]]) -> dict[str, Any]:
    return {"pulsar.topic": topic, "pulsar.subscription": subscription, "pulsar.consumer": consumer,
            **(extra or {})}


def instrument_tracker(tracker: "NegativeAcksTracker", *, topic: Optional[str] = None,
                       subscription: Optional[str] = None, consumer: Optional[str] = None,
                       attributes: Optional[Mapping[str, str]] = None,
                       meter_provider: Optional["MeterProvider"] = None) -> Registration:
    """Export ``tracker``'s metrics (see the module's table) with these
    attributes, from the global ``MeterProvider`` or ``meter_provider``.
    ``consumer`` defaults to the tracker's ``consumer_name``.
    Runtime complexity: O(1) per nack (nothing added to the nack path); one
    ``stats()`` call per instrument per collection."""
    attrs = _attributes(topic, subscription, consumer if consumer is not None else tracker.consumer_name, attributes)
    return metrics_for(meter_provider).instrument(tracker, attrs)


def observe_stats(stats: StatsFn, *, topic: Optional[str] = None, subscription: Optional[str] = None,
                  consumer: Optional[str] = None, attributes: Optional[Mapping[str, str]] = None,
                  tracker: Optional["NegativeAcksTracker"] = None,
                  meter_provider: Optional["MeterProvider"] = None, lateness_from: Any = None) -> Registration:
    """The attach point for anything with a tracker-like ``stats()`` (a
    consumer): export its counters and gauges with these attributes; with
    ``tracker``, also its fires into the timer-lag histogram; with
    ``lateness_from`` (a :class:`~nacktracker.TrackedConsumer`: its ``lateness``),
    its redelivered messages into the lateness histogram."""
    attrs = _attributes(topic, subscription, consumer, attributes)
    metrics = metrics_for(meter_provider)
    if tracker is not None:
        return metrics.instrument(tracker, attrs, stats=stats, consumer=lateness_from)
    return metrics.observe(stats, attrs)


def instrument_consumer(consumer: Any, *, attributes: Optional[Mapping[str, str]] = None,
                        meter_provider: Optional["MeterProvider"] = None) -> Registration:
    """Export a :class:`~nacktracker.TrackedConsumer`'s metrics: its
    ``stats()`` (the tracker's plus ``batch_records``), its tracker's fires
    (timer lag), its redelivered messages (lateness), and its topic,
    subscription and consumer name as attributes."""
    topics = getattr(consumer, "topics", None) or None  # (none known: the client's topic())
    topic: Union[str, list[str]] = topics if topics is not None else consumer.topic()
    return observe_stats(consumer.stats, topic=topic if isinstance(topic, str) else ",".join(topic),
                         subscription=consumer.subscription_name(), consumer=consumer.consumer_name(),
                         attributes=attributes, tracker=consumer.tracker, meter_provider=meter_provider,
                         lateness_from=consumer if hasattr(consumer, "lateness") else None)
