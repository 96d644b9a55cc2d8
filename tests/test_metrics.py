"""OpenTelemetry metrics, read back with the SDK's in-memory reader; the
Prometheus example scrapes its own endpoint once."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk.metrics")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from nacktracker import ManualClock, MessageKey, NegativeAcksTracker  # noqa: E402
from nacktracker.adapters import MemoryAdapter  # noqa: E402
from nacktracker.metrics import INSTRUMENTS, instrument_tracker, observe_stats  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ATTRS = {"pulsar.topic": "orders", "pulsar.subscription": "workers", "pulsar.consumer": "c1"}


def collect(reader: InMemoryMetricReader) -> dict:
    """``{instrument name: {frozen attributes: point}}`` of one collection."""
    data = reader.get_metrics_data()
    out: dict = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            assert sm.scope.name == "nacktracker"
            for metric in sm.metrics:
                points = out.setdefault(metric.name, {})
                for point in metric.data.data_points:
                    points[frozenset(point.attributes.items())] = point
                out.setdefault("_units", {})[metric.name] = metric.unit
    return out


def setup(**kw):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    clock = ManualClock(start_ms=1_000_000)
    adapter = MemoryAdapter(clock=clock.now_ms)
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0, **kw)
    return reader, provider, tracker, adapter, clock


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_tracker_metrics_follow_its_stats():
    reader, provider, tracker, adapter, clock = setup(delay_ms=100, max_redeliveries=2,
                                                      on_dead_letter=lambda key: None)
    registration = instrument_tracker(tracker, topic="orders", subscription="workers", consumer="c1",
                                      meter_provider=provider)
    key = frozenset(ATTRS.items())
    for entry in range(10):
        tracker.add(MessageKey(7, entry))
    tracker.add(MessageKey(7, 99), redelivery_count=2)  # dead-lettered at once
    got = collect(reader)
    assert got["nacktracker.pending"][key].value == 10
    assert got["nacktracker.nacks"][key].value == 10
    assert got["nacktracker.dead_lettered"][key].value == 1
    assert got["nacktracker.memory.usage"][key].value == tracker.stats()["nbytes"] > 0
    assert got["nacktracker.buckets"][key].value == 1
    assert got["_units"]["nacktracker.memory.usage"] == "By"
    assert "nacktracker.batch_records" not in got  # a tracker has none; consumers do

    adapter.fail_next(1)
    clock.stall(130)  # the fire comes 30 ms late (a blocked loop), and the adapter fails once
    await settle()
    got = collect(reader)
    assert got["nacktracker.adapter.failures"][key].value == 1
    assert got["nacktracker.unsent"][key].value == 10 and got["nacktracker.pending"][key].value == 0
    clock.advance(200)  # the retry
    await settle()
    got = collect(reader)
    assert got["nacktracker.redelivered"][key].value == 10 and got["nacktracker.unsent"][key].value == 0
    assert got["_units"]["nacktracker.timer.lag"] == "ms"
    lag = got["nacktracker.timer.lag"][key]
    assert lag.count == 1 and lag.sum == 30  # one (bucket, ledger) cell, the timer 30 ms late
    assert lag.explicit_bounds[:4] == (0, 1, 2, 5)
    assert "nacktracker.redelivery.lateness" not in got  # a bare tracker sees no message surface; consumers do

    registration.close()
    tracker.add(MessageKey(8, 1))
    got = collect(reader)
    assert key not in got.get("nacktracker.pending", {})
    clock.stall(500)
    await settle()
    assert collect(reader)["nacktracker.timer.lag"][key].count == 1  # listener removed too
    await tracker.close()


async def test_every_stats_instrument_is_exported_per_source_with_its_own_attributes():
    reader, provider, tracker, adapter, clock = setup()
    other = NegativeAcksTracker(MemoryAdapter(), clock=clock)
    instrument_tracker(tracker, topic="a", meter_provider=provider)
    consumer_only = {"batch_records": 3, "ack_timeout_redeliveries": 0, "retry_letters": 0,
                     "dead_letters_max_redeliveries": 0, "dead_letters_dead_letter": 0, "dead_letters_ack_timeout": 0,
                     "dead_letters_bad_property": 0}
    stats = lambda: {**other.stats(), **consumer_only}  # noqa: E731  (a consumer's stats)
    observe_stats(stats, topic="b", subscription="s", tracker=other, meter_provider=provider)
    other.add(MessageKey(1, 1))
    got = collect(reader)
    for spec in INSTRUMENTS:
        points = got[spec.name]
        a, b = frozenset({"pulsar.topic": "a"}.items()), frozenset({"pulsar.topic": "b", "pulsar.subscription": "s"}.items())
        assert b in points, spec.name
        assert (a in points) == (spec.stat not in consumer_only), spec.name
    assert got["nacktracker.pending"][b].value == 1 and got["nacktracker.pending"][a].value == 0
    assert got["nacktracker.batch_records"][b].value == 3


async def test_a_collection_from_another_thread_reads_stats_on_the_loop():
    reader, provider, tracker, adapter, clock = setup()
    threads = []
    real = tracker.stats

    def spy():
        threads.append(threading.get_ident())
        return real()

    from nacktracker.metrics import metrics_for

    metrics_for(provider).observe(spy, {"pulsar.topic": "t"}, weak=False)
    tracker.add(MessageKey(1, 1))
    got = await asyncio.to_thread(collect, reader)
    assert got["nacktracker.pending"][frozenset({"pulsar.topic": "t"}.items())].value == 1
    assert threads and set(threads) == {threading.get_ident()}


async def test_a_garbage_collected_tracker_stops_being_exported():
    reader, provider, tracker, adapter, clock = setup()
    instrument_tracker(tracker, topic="gone", meter_provider=provider)
    assert frozenset({"pulsar.topic": "gone"}.items()) in collect(reader)["nacktracker.pending"]
    del tracker
    gc.collect()
    assert "nacktracker.pending" not in collect(reader)


async def test_without_a_provider_the_global_one_is_used():
    from opentelemetry import metrics

    from nacktracker.metrics import metrics_for

    assert metrics_for(None) is metrics_for(None)
    # before the application sets a global provider, the API hands out no-op instruments
    tracker = NegativeAcksTracker(MemoryAdapter(), clock=ManualClock())
    with instrument_tracker(tracker, topic="x"):
        assert metrics.get_meter_provider() is not None


def test_prometheus_example_serves_and_scrapes_itself():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "prometheus_metrics.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    out = proc.stdout
    assert "serving http://127.0.0.1:" in out
    assert "redelivered 200, pending 50, adapter failures 1" in out
    labels = '{pulsar_consumer="worker-1",pulsar_subscription="workers",pulsar_topic="orders"}'
    for line in (f"nacktracker_pending{labels} 50.0", f"nacktracker_redelivered_total{labels} 200.0",
                 f"nacktracker_nacks_total{labels} 250.0", f"nacktracker_adapter_failures_total{labels} 1.0",
                 f"nacktracker_memory_usage_bytes{labels} ", f"nacktracker_timer_lag_milliseconds_count{labels} "):
        assert line in out, f"{line!r} missing from:\n{out}"


def test_the_grafana_dashboard_queries_only_exported_series():
    import json
    import re

    from nacktracker.metrics import INSTRUMENTS

    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bnacktracker_\w+", e)}
    # the Prometheus exporter's names: dots -> _, unit appended (By -> bytes, ms -> milliseconds), _total on counters
    suffix = {"By": "_bytes", "ms": "_milliseconds"}
    exported = {spec.name.replace(".", "_") + suffix.get(spec.unit, "") + ("_total" if spec.counter else "")
                for spec in INSTRUMENTS}
    exported |= {"nacktracker_redelivery_lateness_milliseconds_bucket", "nacktracker_timer_lag_milliseconds_bucket"}
    assert used <= exported, used - exported
    assert {s.name.replace(".", "_") for s in INSTRUMENTS} <= {re.sub(r"(_bytes|_total)$", "", u) for u in used}


async def test_instrument_consumer_takes_its_names_and_stats():
    from nacktracker.metrics import instrument_consumer

    reader, provider, tracker, adapter, clock = setup(delay_ms=10)

    class Consumer:  # what instrument_consumer reads of a TrackedConsumer
        def __init__(self) -> None:
            self.tracker = tracker

        def topic(self) -> str:
            return "persistent://public/default/orders"

        def subscription_name(self) -> str:
            return "workers"

        def consumer_name(self) -> str:
            return "c-7"

        def stats(self) -> dict:
            return {**tracker.stats(), "batch_records": 2}

        class lateness:  # noqa: N801  (TrackedConsumer.lateness: a RedeliveryLateness)
            @staticmethod
            def add_listener(listener):
                listeners.append(listener)
                return lambda: listeners.remove(listener)

    listeners: list = []

    consumer = Consumer()
    with instrument_consumer(consumer, meter_provider=provider) as registration:
        key = frozenset({"pulsar.topic": "persistent://public/default/orders", "pulsar.subscription": "workers",
                         "pulsar.consumer": "c-7"}.items())
        assert frozenset(registration.attributes.items()) == key
        tracker.add(MessageKey(3, 4))
        clock.advance(10)
        await settle()
        got = collect(reader)
        assert got["nacktracker.batch_records"][key].value == 2
        assert got["nacktracker.redelivered"][key].value == 1
        assert got["nacktracker.timer.lag"][key].count == 1
        for listener in list(listeners):
            listener(3.0)  # a redelivered message surfaced 3 ms after its due time
            listener(-0.2)  # a loop that woke a hair early: recorded as 0
        lateness = collect(reader)["nacktracker.redelivery.lateness"][key]
        assert lateness.count == 2 and lateness.sum == 3.0
    assert listeners == []  # the registration's end removes its listener


async def test_a_retrying_consumers_topic_attribute_is_its_subscribed_topic_stable_across_restarts():
    """With enable_retry the client's consumer reads two topics and names itself
    ``...-RETRY-TopicsConsumerFakeName-<random>``: the attribute is the topic subscribed to instead."""
    from nacktracker.metrics import instrument_consumer

    reader, provider, tracker, adapter, clock = setup()
    seen = []
    for run in range(2):  # two runs of one consumer: one series
        class Consumer:  # what instrument_consumer reads of a TrackedConsumer
            topics = ["persistent://public/default/orders"]

            def __init__(self, run: int) -> None:
                self.tracker = tracker
                self.run = run

            def topic(self) -> str:
                return f"persistent://public/default/orders-workers-RETRY-TopicsConsumerFakeName-{self.run}abc"

            def subscription_name(self) -> str:
                return "workers"

            def consumer_name(self) -> str:
                return "c-7"

            def stats(self) -> dict:
                return tracker.stats()

        with instrument_consumer(Consumer(run), meter_provider=provider) as registration:
            seen.append(registration.attributes["pulsar.topic"])
    assert seen == ["persistent://public/default/orders"] * 2
    await tracker.close()
