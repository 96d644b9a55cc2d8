"""Memory per pending nack, end to end: a consumer's process RSS with real traffic.

Each run is one fresh process that subscribes (Shared, from the earliest
message, pulsar-lite), receives every message of a topic and nacks each with
a 600 s delay, so that every nack is still pending at the end. The figure is
the growth of the process's resident anonymous memory (``RssAnon``) per
pending nack, between a baseline taken after a warm-up (the first
``--warmup`` messages received and nacked: the client's receiver queue and
the consumer's prefetch are full by then, as they stay) and the end, the C heap
trimmed and the garbage collected at both points. Beside it, for a
``TrackedConsumer``, the growth of its ``stats()["nbytes"]`` (what the metrics
export as ``nacktracker.memory.usage``) and its split by part.

Six runs side by side on one broker, in one command: ``TrackedConsumer``
(``nacktracker.subscribe``, its defaults but Shared), the plain
``pulsar.asyncio.Consumer`` (``negative_ack_redelivery_delay_ms=600000``,
``negative_acknowledge(msg)``), and, for reference, the plain consumer keeping
every message it receives in a list instead of nacking it (what a received
message costs while Python holds it), each on a topic of batched entries (the
producer's batching on: the default of every Pulsar client) and on one of
single messages.

    python -m bench.consumer_memory                    # 100,000 messages per run
    python -m bench.consumer_memory --messages 20000 --json
    python -m bench.consumer_memory --save             # write bench/results/consumer-memory/
    python -m bench.consumer_memory --render           # RESULTS.md again from the committed results
    python -m bench.consumer_memory --census           # also count the live Python objects by type

Targets (per pending nack, TrackedConsumer): batched <= 32 B of RSS with
``nbytes`` within 25% of it; non-batched <= 16 B of RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import pulsar
import pulsar.asyncio as pulsar_asyncio

import nacktracker
from bench import run_module
from bench.index_grid import fill_malloc_cache, rss_bytes, trim_heap
from nacktracker.demo.measure import CLOSE_GRACE_S
from nacktracker.demo.sides import produce

DELAY_MS = 600_000
PAYLOAD_BYTES = 64
WARMUP = 5_000
#: Messages published beyond those taken, so that the client's receiver queue (1,000 messages, ~1 MB of
#: RSS) is full at the end as at the baseline: measured after ``SETTLE_S`` of quiet at both points.
TAIL = 5_000
SETTLE_S = 1.0
#: pulsar-lite stops dispatching to a consumer holding 50,000 unacknowledged messages (measured), and
#: every message nacked here stays unacknowledged: the non-batched runs take at most this many.
NON_BATCHED_CAP = 40_000
KINDS = ("tracked", "plain", "kept")
KIND_NAMES = {"tracked": "TrackedConsumer", "plain": "plain pulsar.asyncio.Consumer",
              "kept": "plain consumer keeping each message (no nack)"}
TOPICS = ("batched", "non-batched")
RESULTS_DIR = Path(__file__).resolve().parent / "results" / "consumer-memory"
#: (topic, measure, bound): RSS growth per pending nack (B) and nbytes against it (ratio - 1)
TARGETS = [("batched", "rss_per_nack", 32.0), ("batched", "nbytes_off", 0.25), ("non-batched", "rss_per_nack", 16.0)]


async def measure(kind: str, url: str, topic: str, messages: int, warmup: int, census: bool,
                  nack_every: int = 1) -> dict:
    """One run in this process: receive ``warmup + messages`` messages and nack each (``nack_every``:
    nack one in that many, acknowledge the others), RSS around the last ``messages``."""
    client = pulsar_asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
                                   operation_timeout_seconds=30)
    subscription = f"memory-{kind}-{uuid.uuid4().hex[:8]}"
    try:
        if kind == "tracked":
            consumer: Any = await nacktracker.subscribe(client, topic, subscription, delay_ms=DELAY_MS,
                                                        consumer_type=pulsar.ConsumerType.Shared,
                                                        initial_position=pulsar.InitialPosition.Earliest)
        else:
            consumer = await client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared,
                                              negative_ack_redelivery_delay_ms=DELAY_MS,
                                              initial_position=pulsar.InitialPosition.Earliest)
        receive, nack = consumer.receive, consumer.negative_acknowledge
        kept: list[Any] = []
        if kind == "kept":  # what a received message costs while the application keeps it
            async def nack(msg: Any) -> None:
                kept.append(msg)
        # entries counted as they change (first deliveries come in order): nothing kept per message here
        entries, last, taken = 0, (-1, -1), 0
        ack = consumer.acknowledge

        async def take(n: int) -> None:
            nonlocal entries, last, taken
            for _ in range(n):
                msg = await receive()
                mid = msg.message_id()
                entry = (mid.ledger_id(), mid.entry_id())
                if entry != last:
                    entries, last = entries + 1, entry
                taken += 1
                await (nack(msg) if taken % nack_every == 0 else ack(msg))

        await take(warmup)
        await asyncio.sleep(SETTLE_S)  # the receiver queue refills
        nbytes0, parts0 = _nbytes(consumer)
        gc.collect()
        trim_heap()
        fill_malloc_cache()
        rss0, heap0 = rss_bytes(), malloc_in_use()
        cpu0 = time.process_time()
        await take(messages)
        cpu = time.process_time() - cpu0
        await asyncio.sleep(SETTLE_S)
        gc.collect()
        trim_heap()
        rss1, heap1 = rss_bytes(), malloc_in_use()
        nbytes1, parts1 = _nbytes(consumer)
        types = _census() if census else None
        pending = (consumer.tracker.pending if kind == "tracked" else None)
        await consumer.close()
    finally:
        await client.close()
    await asyncio.sleep(CLOSE_GRACE_S)
    n = messages // nack_every  # the pending nacks made after the baseline
    out: dict[str, Any] = {
        "kind": kind, "messages": messages, "warmup": warmup, "entries": entries, "nack_every": nack_every,
        "messages_per_entry": round((warmup + messages) / entries, 1),
        "rss_growth_bytes": rss1 - rss0, "rss_per_nack": round((rss1 - rss0) / n, 2),
        "cpu_us_per_nack": round(cpu / n * 1e6, 2), "tracker_pending": pending,
        "malloc_in_use_per_nack": round((heap1 - heap0) / n, 2) if heap0 is not None and heap1 is not None else None}
    if nbytes1 is not None and nbytes0 is not None:
        out["nbytes"] = nbytes1
        out["nbytes_growth"] = nbytes1 - nbytes0
        out["nbytes_per_nack"] = round((nbytes1 - nbytes0) / n, 2)
        out["nbytes_parts_per_nack"] = {k: round((parts1[k] - parts0.get(k, 0)) / n, 2) for k in parts1}
        out["nbytes_off"] = round((nbytes1 - nbytes0) / (rss1 - rss0) - 1, 3) if rss1 > rss0 else None
    if types is not None:
        out["census"] = types
    return out


def malloc_in_use() -> Optional[int]:
    """Bytes the C heap has handed out and not had back (glibc ``mallinfo2``: every arena; pymalloc's
    arenas count as whole), or ``None`` where that is missing: tells memory held from pages the heap
    could not give back (RSS minus this)."""
    try:
        import ctypes

        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in
                        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2
        info = libc.mallinfo2()
        return int(info.uordblks + info.hblkhd)
    except (OSError, AttributeError):
        return None


def _nbytes(consumer: Any) -> tuple[Optional[int], dict[str, int]]:
    if not hasattr(consumer, "stats"):
        return None, {}
    stats = consumer.stats()
    return stats["nbytes"], dict(stats.get("nbytes_parts", {}))


def _census(top: int = 12) -> dict[str, int]:
    """Live objects tracked by the garbage collector, by type name (the most numerous)."""
    counts = Counter(type(o).__name__ for o in gc.get_objects())
    return dict(counts.most_common(top))


def run_one(kind: str, url: str, topic: str, messages: int, warmup: int, census: bool, nack_every: int = 1) -> dict:
    args = ["--one", kind, "--url", url, "--topic", topic, "--messages", str(messages), "--warmup", str(warmup),
            "--nack-every", str(nack_every)]
    out = run_module("bench.consumer_memory", *args, *(["--census"] if census else []), timeout=1800)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run(messages: int, warmup: int, census: bool = False, progress: Any = None,
        only: Optional[list[str]] = None, nack_every: int = 1) -> dict:
    """The four runs, each in a fresh process, on one pulsar-lite broker started here."""
    from nacktracker.testing import EmbeddedBroker

    result: dict[str, Any] = {
        "command": f"python -m bench.consumer_memory --messages {messages} --warmup {warmup}"
                   + (f" --nack-every {nack_every}" if nack_every != 1 else ""),
        "messages": messages, "warmup": warmup, "delay_ms": DELAY_MS, "payload_bytes": PAYLOAD_BYTES,
        "broker": "pulsar-lite", "subscription": "Shared", "cores": os.cpu_count(),
        "python": sys.version.split()[0], "pulsar_client": getattr(pulsar, "__version__", "?"),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()], "runs": {}}
    with EmbeddedBroker() as broker:
        topics = {}
        for name in TOPICS:
            topics[name] = f"persistent://public/default/memory-{name}-{uuid.uuid4().hex[:8]}"
            asyncio.run(produce(broker.url, topics[name], warmup + messages + TAIL, batching=name == "batched",
                                payload_bytes=PAYLOAD_BYTES))
        for name in TOPICS:
            for kind in KINDS:
                if only and f"{kind} {name}" not in only:
                    continue
                n = messages if name == "batched" else min(messages, NON_BATCHED_CAP)
                row = run_one(kind, broker.url, topics[name], n, warmup, census, nack_every)
                result["runs"][f"{kind} {name}"] = row
                if progress:
                    progress(f"{kind} {name}: {row['rss_per_nack']} B RSS per pending nack"
                             + (f", nbytes {row['nbytes_per_nack']} B" if "nbytes_per_nack" in row else ""))
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    result["targets"] = check_targets(result) if not only else []
    return result


def check_targets(result: dict) -> list[dict]:
    out = []
    for name, measure, bound in TARGETS:
        row = result["runs"][f"tracked {name}"]
        got = row.get(measure)
        met = got is not None and (abs(got) <= bound if measure == "nbytes_off" else got <= bound)
        out.append({"topic": name, "measure": measure, "bound": bound, "got": got, "met": met})
    return out


def table(result: dict) -> str:
    """The results as markdown (RESULTS.md, and the docs' block through bench/figures.py)."""
    runs = result["runs"]
    lines = ["| consumer | topic | pending nacks measured | messages per entry | RSS growth per pending nack "
             "| nbytes per pending nack | nbytes against RSS |", "|---|---|---|---|---|---|---|"]
    for name in TOPICS:
        for kind in KINDS:
            r = runs.get(f"{kind} {name}")
            if r is None:  # a partial run (--only)
                continue
            nb = f"{r['nbytes_per_nack']:,.1f} B" if "nbytes_per_nack" in r else "—"
            off = f"{r['nbytes_off']:+.0%}" if r.get("nbytes_off") is not None else "—"
            lines.append(f"| {KIND_NAMES[kind]} | {name} | {r['messages'] // r.get('nack_every', 1):,} | "
                         f"{r['messages_per_entry']:,} | "
                         f"**{r['rss_per_nack']:,.1f} B** | {nb} | {off} |")
    parts = runs.get("tracked batched", {}).get("nbytes_parts_per_nack", {})
    if parts and "tracked non-batched" in runs:
        lines += ["", "TrackedConsumer's nbytes per pending nack by part (batched / non-batched): " + ", ".join(
            f"{k} {v:,.1f} / {runs['tracked non-batched']['nbytes_parts_per_nack'].get(k, 0):,.1f} B"
            for k, v in parts.items()) + "."]
    lines += ["", f"`{result['command']}`: the messages received and nacked ({result['delay_ms'] // 1000} s) in each run "
              f"after {result['warmup']:,} of warm-up (non-batched: at most {NON_BATCHED_CAP:,}, as pulsar-lite stops "
              f"dispatching to a consumer holding 50,000 unacknowledged messages), {result['payload_bytes']}-byte payloads, "
              f"{result['broker']}, {result['subscription']}, each run a fresh process; pulsar-client "
              f"{result['pulsar_client']}, Python {result['python']}, load average {result['loadavg_before'][0]:.2f} → "
              f"{result['loadavg_after'][0]:.2f} on {result['cores']} cores, {result['started']}."]
    if result.get("targets"):
        lines += [""] + [f"- TrackedConsumer {t['topic']}: {t['measure']} {t['got']} "
                         f"{'within ±' if t['measure'] == 'nbytes_off' else '≤ '}{t['bound']}: "
                         f"**{'met' if t['met'] else 'NOT met'}**" for t in result["targets"]]
    return "\n".join(lines)


def save(result: dict, folder: Path = RESULTS_DIR) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    render(folder)


def render(folder: Path = RESULTS_DIR) -> None:
    result = json.loads((folder / "results.json").read_text())
    (folder / "RESULTS.md").write_text("# Memory per pending nack, end to end\n\n" + table(result) + "\n")


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--warmup", type=int, default=WARMUP)
    p.add_argument("--nack-every", type=int, default=1,
                   help="nack one message in this many and acknowledge the others (sparse nacks: one per entry "
                        "or fewer); such a run is not saved")
    p.add_argument("--census", action="store_true", help="count live Python objects by type at the end")
    p.add_argument("--only", help="runs to make, comma-separated (e.g. 'tracked batched,plain batched'); "
                                  "a partial run is not saved")
    p.add_argument("--json", action="store_true")
    p.add_argument("--save", action="store_true", help=f"write {RESULTS_DIR.relative_to(RESULTS_DIR.parents[2])}/")
    p.add_argument("--render", action="store_true", help="render RESULTS.md from the committed results only")
    p.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--topic", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(asyncio.run(measure(args.one, args.url, args.topic, args.messages, args.warmup, args.census,
                                             args.nack_every))))
        sys.stdout.flush()
        os._exit(0)  # no interpreter teardown with the client's threads (see ARCHITECTURE: teardown crashes)
    if args.render:
        render()
        return
    only = args.only.split(",") if args.only else None
    result = run(args.messages, args.warmup, args.census, progress=lambda s: print(s, file=sys.stderr), only=only,
                 nack_every=args.nack_every)
    if args.save and not only and args.nack_every == 1:
        save(result)
    print(json.dumps(result, indent=1) if args.json else table(result))


if __name__ == "__main__":
    main()
