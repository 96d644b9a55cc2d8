"""Export a tracker's OpenTelemetry metrics to Prometheus, then scrape them once.

    pip install 'nacktracker[otel]' opentelemetry-sdk opentelemetry-exporter-prometheus
    .venv/bin/python examples/prometheus_metrics.py

nacktracker only talks to the OpenTelemetry API; the application owns the SDK
and the exporter (below: a PrometheusMetricReader served over HTTP on
127.0.0.1, a free port). With a broker the same call is
``nacktracker.metrics.instrument_consumer(consumer)`` on a TrackedConsumer
(topic, subscription and consumer name become labels). No broker here: the
tracker hands due messages to an in-process MemoryAdapter, which fails once
to show the failure counter. The Grafana dashboard for these metrics:
docs/grafana-dashboard.json.
"""

from __future__ import annotations

import asyncio
import urllib.request

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, start_http_server

from nacktracker import MessageKey, MultiplierBackoff, NegativeAcksTracker
from nacktracker.adapters import MemoryAdapter
from nacktracker.metrics import instrument_tracker


async def work(provider: MeterProvider) -> None:
    adapter = MemoryAdapter()
    adapter.fail_next(1)  # the first redelivery call fails: retried, nothing lost, counted
    tracker = NegativeAcksTracker(adapter, precision_bits=4, backoff=MultiplierBackoff(20, 200),
                                  retry_min_ms=10, consumer_name="worker-1")
    with instrument_tracker(tracker, topic="orders", subscription="workers", meter_provider=provider):
        for entry in range(200):  # 200 failed messages, a third of them on their second attempt
            tracker.add(MessageKey(ledger_id=42, entry_id=entry), redelivery_count=entry % 3 // 2)
        for entry in range(200, 250):  # still pending when we scrape
            tracker.add(MessageKey(ledger_id=43, entry_id=entry), delay_ms=60_000)
        await adapter.wait_for(200)
        print(f"redelivered {len(adapter.redelivered)}, pending {tracker.pending}, "
              f"adapter failures {tracker.stats()['failures']}")
        # Prometheus scrapes from its own thread: the tracker's stats are read on this loop
        body = await asyncio.to_thread(scrape)
        print("\n".join(line for line in body.splitlines()  # every series but the histogram's buckets
                        if line.startswith("nacktracker_") and "_bucket{" not in line))
    await tracker.close()


URL = ""


def scrape() -> str:
    with urllib.request.urlopen(URL, timeout=10) as response:
        return str(response.read().decode())


def main() -> None:
    global URL
    registry = CollectorRegistry()  # a private registry: nothing else of this process is exported
    reader = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
    provider = MeterProvider(metric_readers=[reader])
    server, thread = start_http_server(port=0, addr="127.0.0.1", registry=registry)
    URL = f"http://127.0.0.1:{server.server_port}/metrics"
    print(f"serving {URL}")
    try:
        asyncio.run(work(provider))
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        provider.shutdown()


if __name__ == "__main__":
    main()
