"""Retry-letter precision: nacktracker's ``reconsume_later`` beside the Java
client's ``reconsumeLater`` on the same broker, in the same run; and the
memory of the consumer's own delivery counts.

Each side publishes N messages to its own topic; as each arrives, a worker
reconsumes it once with its delay (the same seeded delays, uniform in
200-5000 ms, for both sides), while the receiver stamps each retry's arrival.
Error = arrival − (the reconsume call's start + delay), ms, each side on its
own monotonic clock (asyncio's loop clock; Java's ``System.nanoTime``);
negative = early. nacktracker runs with ``precision_bits=0`` (the default).
The Java side is ``tests/java`` (``RetryBench``: Apache Pulsar's client
4.0.7, built by Maven from Central).

Target: nacktracker's |error| p99 <= 10 ms on Apache Pulsar. The Java
client's figures are reported beside it, not judged.

    python -m bench.retry_precision [--n 1000] [--seed 1] [--broker apache|lite] [--no-java] [--no-write]
                                    [--show-late MS]
    python -m bench.retry_precision --memory [--n 100000]

Writes ``bench/results/retry/<broker>.json`` and ``.md`` (not with
``--no-write`` or ``--memory``). Uses ``$PULSAR_URL`` when set.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import random
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Optional

from bench.java_client import java_classpath

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "retry"
SHOW_LATE_MS: Optional[float] = None  # --show-late: print each nacktracker retry later than this (stderr)


def summary(errors: list[float]) -> dict:
    """Count and nearest-rank percentiles of the errors and their absolute values (ms)."""
    if not errors:
        return {"count": 0}
    s, a = sorted(errors), sorted(abs(e) for e in errors)

    def rank(v: list[float], p: float) -> float:
        return round(v[max(0, math.ceil(p / 100 * len(v)) - 1)], 2)

    return {"count": len(s), "min": round(s[0], 2), "p50": rank(s, 50), "p99": rank(s, 99), "max": round(s[-1], 2),
            "abs_p50": rank(a, 50), "abs_p99": rank(a, 99), "abs_max": round(a[-1], 2)}


async def java_side(url: str, delays: list[int]) -> list[float]:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(map(str, delays)))
    try:
        proc = await asyncio.create_subprocess_exec(
            "java", "-cp", java_classpath(), "nacktracker.interop.RetryBench", url,
            f"persistent://public/default/jbench-{uuid.uuid4().hex[:8]}", "sub", f.name,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 300)
    finally:
        os.unlink(f.name)
    lines = out.decode().splitlines()
    if proc.returncode != 0 or "DONE" not in lines:
        raise RuntimeError(f"RetryBench failed ({proc.returncode}): {err.decode()[-2000:]}")
    return [float(line.split()[2]) for line in lines if line.startswith("ERR ")]


async def nacktracker_side(url: str, delays: list[int]) -> list[float]:
    import pulsar
    import pulsar.asyncio

    import nacktracker

    loop = asyncio.get_running_loop()
    client = pulsar.asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
                                   operation_timeout_seconds=30)
    topic = f"persistent://public/default/pybench-{uuid.uuid4().hex[:8]}"
    consumer = await nacktracker.subscribe(client, topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                           enable_retry=True, max_redeliveries=100,
                                           initial_position=pulsar.InitialPosition.Earliest)
    producer = await client.create_producer(topic, batching_enabled=False)
    due: dict[int, float] = {}
    work: asyncio.Queue = asyncio.Queue()

    async def worker() -> None:
        while True:
            msg = await work.get()
            i = int(msg.data())
            due[i] = loop.time() * 1000 + delays[i]
            await consumer.reconsume_later(msg, delay_ms=delays[i])

    task = loop.create_task(worker())
    errors: list[float] = []
    acks: list[asyncio.Task] = []
    try:
        await asyncio.gather(*[producer.send(str(i).encode()) for i in range(len(delays))])
        while len(errors) < len(delays):
            msg = await consumer.receive(timeout_ms=30_000)
            arrived = loop.time() * 1000
            if "RECONSUMETIMES" not in msg.properties():
                work.put_nowait(msg)
                continue
            errors.append(arrived - due[int(msg.data())])
            if SHOW_LATE_MS is not None and errors[-1] > SHOW_LATE_MS:
                print(f"late: message {int(msg.data())}, delay {delays[int(msg.data())]} ms, "
                      f"{errors[-1]:.1f} ms late, {len(errors)} retries back",
                      file=sys.stderr, flush=True)
            # not awaited here: the client groups acks (100 ms), and an awaited ack would hold up the next retry
            acks.append(loop.create_task(consumer.acknowledge(msg)))
        await asyncio.gather(*acks)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await producer.close()
        await consumer.close()
        await client.close()
    return errors


async def run(url: str, n: int, seed: int, java: bool) -> dict:
    rng = random.Random(seed)
    delays = [rng.randint(200, 5000) for _ in range(n)]
    gc.freeze()  # as a latency-sensitive service would (see bench/pulsar_precision.py)
    sides = [nacktracker_side(url, delays)] + ([java_side(url, delays)] if java else [])
    results = await asyncio.gather(*sides)
    out = {"nacktracker": summary(results[0])}
    if java:
        out["java"] = summary(results[1])
    return out


def memory(n: int) -> dict:
    """Bytes per message of DeliveryCounts (tracemalloc: every allocation it makes for n entries)."""
    from nacktracker.consumer.counts import DeliveryCounts
    from nacktracker.keys import MessageKey

    topic = "persistent://public/default/t"
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    keys = [MessageKey(1_000_000 + i // 5000, i % 5000, -1, -1, topic) for i in range(n)]
    counts = DeliveryCounts()
    counts.redelivered(keys)  # one entry per message (each its own key object, as fired cells make them)
    del keys
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return {"messages": n, "entries": len(counts), "bytes": grown, "bytes_per_message": round(grown / n, 1)}


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--broker", choices=("apache", "lite"), default="apache")
    p.add_argument("--no-java", action="store_true")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--memory", action="store_true")
    p.add_argument("--show-late", type=float, default=None, metavar="MS")
    args = p.parse_args(argv)
    global SHOW_LATE_MS
    SHOW_LATE_MS = args.show_late
    if args.memory:
        print(json.dumps(memory(args.n or 100_000), indent=2))
        return
    n = args.n or 1000
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else None
    started = time.time()
    url = os.environ.get("PULSAR_URL")
    if url:
        result = asyncio.run(run(url, n, args.seed, not args.no_java))
        kind = "external"
    else:
        from nacktracker.testing import make_broker

        with make_broker(args.broker) as broker:  # the Java side is for Apache Pulsar, the reference
            result = asyncio.run(run(broker.url, n, args.seed, not args.no_java and args.broker == "apache"))
        kind = args.broker
    doc = {"broker": kind, "n": n, "seed": args.seed, "delays_ms": [200, 5000], "loadavg_before": load,
           "loadavg_after": open("/proc/loadavg").read().split()[:3] if load else None,
           "duration_s": round(time.time() - started, 1), **result,
           "command": "python -m bench.retry_precision " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(json.dumps(doc, indent=2))
    if not args.no_write:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"{kind}.json").write_text(json.dumps(doc, indent=2) + "\n")
        rows = [f"| {side} | {r['count']} | {r.get('min')} | {r.get('p50')} | {r.get('p99')} | {r.get('max')} | "
                f"{r.get('abs_p99')} |" for side, r in result.items()]
        (OUT / f"{kind}.md").write_text(
            f"# Retry-letter precision on {kind} ({n} retries, delays 200-5000 ms, seed {args.seed})\n\n"
            f"`{doc['command']}`; load average {load} before, {doc['loadavg_after']} after.\n\n"
            "Error = arrival − (reconsume call + delay), ms.\n\n"
            "| client | retries | min | p50 | p99 | max | abs p99 |\n|---|---|---|---|---|---|---|\n"
            + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
