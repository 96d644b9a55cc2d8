"""Receive+ack throughput: TrackedConsumer vs the plain ``pulsar.asyncio.Consumer``.

One topic of N messages (64-byte payloads, published with batching) is
consumed start to finish by a fresh Shared subscription per run, alternately
by the plain consumer and by TrackedConsumer (``nacktracker.subscribe``, same
receiver queue), one at a time, ``await receive()`` then ``await
acknowledge()`` per message, no nacks: the price of the wrapper on the path
every message takes. A run is timed from the subscription being ready to the
last ack returning; CPU is the process's (Python and the client's C++
threads). Reported: median, min and max messages/s over the runs, and the
median of the per-round ratios tracked/plain (each round runs both, in
alternating order, so slow phases of a shared machine hit both).

Target: TrackedConsumer >= 90% of plain. ``--profile`` also runs one
TrackedConsumer pass under cProfile and prints where its time goes.

    python bench/consume_throughput.py [--quick] [--json] [--profile]

Uses ``$PULSAR_URL`` when set, else starts an embedded pulsar-lite broker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid

import pulsar
import pulsar.asyncio as pulsar_asyncio

import nacktracker
from nacktracker.scenarios import CLOSE_GRACE_S, produce
from nacktracker.testing import pulsar_service

TARGET = 0.90
KINDS = ("plain", "tracked")


def _client(url: str) -> pulsar_asyncio.Client:
    return pulsar_asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
                                 operation_timeout_seconds=30)


async def consume(url: str, topic: str, n: int, kind: str, subscription: str) -> dict:
    """Receive and ack ``n`` messages with a fresh subscription; messages/s and CPU µs per message."""
    client = _client(url)
    try:
        options = dict(initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=1000)
        if kind == "tracked":
            consumer = await nacktracker.subscribe(client, topic, subscription, **options)
        else:
            consumer = await client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared,
                                              **options)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            msg = await consumer.receive()
            await consumer.acknowledge(msg)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        await consumer.close()
    finally:
        await client.close()
    return {"rate": n / elapsed, "seconds": elapsed, "cpu_us_per_msg": cpu / n * 1e6}


async def run_async(url: str, quick: bool = False) -> dict:
    n, rounds = (20_000, 3) if quick else (50_000, 5)
    load_before = os.getloadavg()
    topic = f"persistent://public/default/consume-throughput-{uuid.uuid4().hex[:8]}"
    await produce(url, topic, n, batching=True, payload_bytes=64)
    await consume(url, topic, min(n, 2000), "plain", "warmup")  # first-touch costs out of the runs
    runs: dict[str, list] = {kind: [] for kind in KINDS}
    ratios = []
    for r in range(rounds):
        order = KINDS if r % 2 == 0 else KINDS[::-1]
        for kind in order:
            runs[kind].append(await consume(url, topic, n, kind, f"{kind}-{r}"))
        ratios.append(runs["tracked"][-1]["rate"] / runs["plain"][-1]["rate"])
    summary = {}
    for kind, rs in runs.items():
        rates = [x["rate"] for x in rs]
        summary[kind] = {"median": round(statistics.median(rates)), "min": round(min(rates)), "max": round(max(rates)),
                         "rates": [round(x) for x in rates],
                         "cpu_us_per_msg": round(statistics.median(x["cpu_us_per_msg"] for x in rs), 1)}
    ratio = summary["tracked"]["median"] / summary["plain"]["median"]
    await asyncio.sleep(CLOSE_GRACE_S)  # let the closed clients' threads finish before exit
    return {"quick": quick, "messages": n, "rounds": rounds, "batching": True, "payload_bytes": 64,
            **summary, "ratio_of_medians": round(ratio, 3),
            "median_round_ratio": round(statistics.median(ratios), 3), "round_ratios": [round(x, 3) for x in ratios],
            "target": TARGET, "target_met": ratio >= TARGET,
            "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count()}


def run(quick: bool = False) -> dict:
    with pulsar_service() as url:
        return asyncio.run(run_async(url, quick))


def profile(n: int = 20_000, top: int = 25) -> None:
    """Print the top functions by own time of one TrackedConsumer pass under cProfile (its own topic)."""
    import cProfile
    import io
    import pstats

    async def go(url: str) -> None:
        topic = f"persistent://public/default/consume-profile-{uuid.uuid4().hex[:8]}"
        await produce(url, topic, n, batching=True, payload_bytes=64)
        profiler = cProfile.Profile()
        profiler.enable()
        await consume(url, topic, n, "tracked", "profiled")
        profiler.disable()
        await asyncio.sleep(CLOSE_GRACE_S)
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(top)
        print(stream.getvalue())

    with pulsar_service() as url:
        asyncio.run(go(url))


def table(result: dict) -> str:
    cmd = "python bench/consume_throughput.py" + (" --quick" if result["quick"] else "")
    out = ["## Consume throughput: TrackedConsumer vs plain pulsar.asyncio.Consumer", "",
           f"`{cmd}` — {result['messages']:,} batched messages ({result['payload_bytes']} B) per run, receive + "
           f"ack each, {result['rounds']} rounds of both (alternating order). Load average "
           f"{result['load_avg_before'][0]} → {result['load_avg_after'][0]} on {result['cores']} cores.", "",
           "| consumer | median msg/s | min | max | CPU µs/msg (median) | runs |", "|---|---|---|---|---|---|"]
    for kind, name in (("plain", "pulsar.asyncio.Consumer"), ("tracked", "TrackedConsumer")):
        s = result[kind]
        out.append(f"| {name} | {s['median']:,} | {s['min']:,} | {s['max']:,} | {s['cpu_us_per_msg']} | "
                   f"{', '.join(f'{x:,}' for x in s['rates'])} |")
    out += ["", f"TrackedConsumer / plain: **{result['ratio_of_medians']:.0%}** of the median "
            f"(per-round ratios {', '.join(f'{x:.0%}' for x in result['round_ratios'])}; median "
            f"{result['median_round_ratio']:.0%}). Target ≥ {result['target']:.0%}: "
            f"**{'met' if result['target_met'] else 'NOT met'}**."]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", action="store_true", help="also profile one TrackedConsumer pass (cProfile)")
    a = p.parse_args(argv)
    result = run(a.quick)
    print(json.dumps(result, indent=1, default=str) if a.json else table(result))
    if a.profile:
        profile(20_000 if a.quick else 50_000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
