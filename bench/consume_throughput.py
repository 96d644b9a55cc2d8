"""Receive + ack throughput: TrackedConsumer against the plain ``pulsar.asyncio.Consumer``.

Three kinds of consumer, side by side on one broker, one process:

* ``plain``: ``pulsar.asyncio.Consumer``, ``await receive()`` then ``await
  acknowledge()`` (or ``negative_acknowledge()``) per message;
* ``queued``: the same client behind a 16-deep ``asyncio.Queue`` filled by one
  receive task (the ceiling: TrackedConsumer has such a pump, ``prefetch=16``);
* ``tracked``: ``nacktracker.subscribe`` (defaults: dedup on, precision 0; Shared, as every kind).

Four workloads (each its own topic of 64-byte messages, produced once):
batched and non-batched entries, no nacks (``--messages``, 200,000) and 10% of
the messages nacked once, at first sight, with a 200 ms delay (``--nack-messages``,
50,000: the plain client's ``negative_ack_redelivery_delay_ms=200``, the
tracked consumer's ``delay_ms=200``), each acknowledged when it comes back. A run
is one fresh Shared subscription consumed from the earliest message until every
message is acknowledged, timed from the subscription being ready to the last
ack returning; CPU is the process's (every thread: Python and the client's C++
ones; the broker is another process). Each round runs the three kinds in
turn, the order rotating from round to round, so a slow phase of a shared
machine hits every kind; the per-round ratios tracked/plain and
tracked/queued (rate and CPU) are the comparison, reported as median and
range over the rounds, with the load average around each workload.

With nacks, each run also counts its *duplicates*: Pulsar redelivers whole
entries, so at best each entry holding a nacked message comes back once, whole;
every copy received beyond the first copies and that one (``received - messages
- sizes of the nacked entries``; the plain kinds stop receiving at the last ack,
so theirs may end a few copies below 0) was asked for again or sent while its
entry was still being consumed. The tracked consumer's runs also give the lead
its adapter learned (``stats()["lead_ms"]``) and from how many path samples.

    python -m bench.consume_throughput [--broker lite|apache] [--url URL] [--set KEY=VALUE]
        [--batch-index-ack] [--rounds 5] [--messages N] [--nack-messages N] [--only WORKLOAD,...]
        [--quick] [--json] [--save PATH] [--profile KIND:WORKLOAD]

``--broker lite`` (default) starts an embedded pulsar-lite broker, ``apache``
an Apache Pulsar standalone (``nacktracker.testing.ApacheBroker``; ``--set``
passes broker settings, e.g. ``acknowledgmentAtBatchIndexLevelEnabled=true``);
``--url`` (or ``$PULSAR_URL``) uses a running broker of that kind instead.
``--batch-index-ack`` subscribes every kind with ``batch_index_ack_enabled=True``.
``--save`` merges this run into a results file under its broker's name (the
committed one: ``bench/results/consume-throughput/results.json``; its
``RESULTS.md`` is rendered beside it; ``--render`` only renders it again).
``--profile`` runs one pass of a kind on
a workload under cProfile instead and prints where its time goes.

``--sync`` compares the synchronous face instead: ``plain-sync`` (``pulsar.Client.subscribe``,
``receive()`` then ``acknowledge()`` per message) and ``sync`` (``nacktracker.sync.subscribe``, the
same calls), side by side in alternating rounds on the workloads chosen (default: non-batched,
``--messages`` 20,000), each run in this process's main thread as a sync program would, on one
fresh Shared subscription each, timed from the subscription being ready to the last ack taken by
the client (the plain client's ``acknowledge`` returns once its C++ client took the ack; the sync
face's hands it to its loop without waiting, so its run ends with one call that waits for the acks
handed over before it); the ratio sync/plain-sync (rate and CPU) per round, median and range, with
the load average around the rounds. ``--save`` merges the run into ``sync.json`` beside the
results file (by broker; ``RESULTS.md`` shows it), rendered into the docs by ``python -m bench.figures``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

import pulsar
import pulsar.asyncio as pulsar_asyncio

import nacktracker
import nacktracker.sync
from nacktracker.consumer.ids import batch_size
from nacktracker.demo.sides import produce

KINDS = ("plain", "queued", "tracked")
KIND_NAMES = {"plain": "plain pulsar.asyncio", "queued": "plain behind a 16-deep receive queue",
              "tracked": "TrackedConsumer"}
#: name -> (batched, nack one message in this many, or 0)
WORKLOADS = {"batched": (True, 0), "non-batched": (False, 0),
             "batched-nacks": (True, 10), "non-batched-nacks": (False, 10)}
QUEUE_DEPTH = 16
NACK_DELAY_MS = 200
RECEIVER_QUEUE = 1000
DEFAULT_RESULTS = Path(__file__).resolve().parent / "results" / "consume-throughput" / "results.json"
#: the ``--sync`` runs, by broker (``--save`` with ``--sync``)
SYNC_RESULTS = DEFAULT_RESULTS.parent / "sync.json"
#: the sync face's target: the median per-round ratio sync/plain-sync of the receive + ack rate, non-batched
SYNC_TARGET = ("non-batched", 0.9)
#: Done-when targets of the consumer's hot path, per broker: (workload, measure, bound) on the
#: median per-round ratio tracked/plain; rate ratios are lower bounds, CPU ratios upper bounds.
TARGETS = {
    "lite": [("batched", "rate", 1.0), ("non-batched", "rate", 1.0), ("batched", "cpu", 1.05),
             ("non-batched", "cpu", 1.05), ("non-batched-nacks", "cpu", 1.15)],
    "apache": [("batched-nacks", "cpu", 1.2)],
}
#: Targets of a busy consumer's nacks, per broker, over every round (not the median): the tracked/plain rate
#: ratio at least this in each round, at most this many duplicates in each tracked run, and a lead learned
#: (path samples in each tracked run).
NACK_TARGETS = {"apache": [("batched-nacks", 1.0, 200)]}


def _client(url: str) -> pulsar_asyncio.Client:
    return pulsar_asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
                                 operation_timeout_seconds=30)


def _number(msg: Any) -> int:
    """The message's number (its payload starts with it: ``b"17:xxx"``)."""
    data = msg.data()
    cut = data.find(b":")
    return int(data if cut < 0 else data[:cut])


async def consume(url: str, topic: str, n: int, kind: str, subscription: str, nack_every: int,
                  batch_index_ack: bool = False) -> dict:
    """Consume the topic's ``n`` messages with a fresh subscription until each
    is acknowledged (every ``nack_every``-th nacked once first); messages/s and
    CPU µs per message."""
    client = _client(url)
    pump: Optional[asyncio.Task] = None
    try:
        options: dict[str, Any] = dict(consumer_type=pulsar.ConsumerType.Shared,
                                       initial_position=pulsar.InitialPosition.Earliest,
                                       receiver_queue_size=RECEIVER_QUEUE,
                                       batch_index_ack_enabled=batch_index_ack)
        if kind == "tracked":
            consumer = await nacktracker.subscribe(client, topic, subscription, delay_ms=NACK_DELAY_MS, **options)
        else:
            consumer = await client.subscribe(topic, subscription,
                                              negative_ack_redelivery_delay_ms=NACK_DELAY_MS, **options)
        receive = consumer.receive
        if kind == "queued":
            queue: asyncio.Queue = asyncio.Queue(QUEUE_DEPTH)

            async def fill() -> None:
                while True:
                    await queue.put(await consumer.receive())

            pump = asyncio.get_running_loop().create_task(fill())
            receive = queue.get
        ack, nack = consumer.acknowledge, consumer.negative_acknowledge
        copies = 0
        nacked_ids: list[Any] = []
        cpu0, t0 = time.process_time(), time.perf_counter()
        if not nack_every:
            for _ in range(n):
                await ack(await receive())
            copies = n
        else:
            acked: set[int] = set()
            nacked: set[int] = set()
            while len(acked) < n:
                msg = await receive()
                copies += 1
                number = _number(msg)
                if number % nack_every == 0 and number not in nacked:
                    nacked.add(number)
                    nacked_ids.append(msg.message_id())
                    await nack(msg)
                else:
                    await ack(msg)
                    acked.add(number)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        extra: dict[str, Any] = tracked_figures(consumer) if kind == "tracked" else {"received": copies}
        # Pulsar redelivers whole entries: each entry with a nacked message comes back once, whole, at best;
        # every copy beyond that was asked for again or sent while the entry was still being consumed
        extra["duplicates"] = extra["received"] - n - sum(entry_sizes(nacked_ids).values())
        if pump is not None:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        await consumer.close()
    finally:
        await client.close()
    return {"rate": round(n / elapsed, 1), "seconds": round(elapsed, 3), "cpu_us_per_msg": round(cpu / n * 1e6, 2),
            "copies": copies, **extra}


def entry_sizes(ids: list[Any]) -> dict[tuple[int, int, int], int]:
    """The entries of these message ids and their sizes in messages (1: not batched)."""
    sizes = {}
    for mid in ids:
        sizes[(mid.partition(), mid.ledger_id(), mid.entry_id())] = max(1, batch_size(mid))
    return sizes


def tracked_figures(consumer: Any) -> dict[str, Any]:
    """What a tracked run did besides its rate: copies of messages it dropped as duplicates (the broker sent
    them again while they were held or after they were acknowledged), and the lead the adapter learned."""
    stats = consumer.stats()
    adapter = consumer.adapter
    summary = adapter.latency_summary() if hasattr(adapter, "latency_summary") else {"count": 0}
    samples = getattr(adapter, "lead_samples", 0)
    return {"received": stats["received"], "held_copies_dropped": stats["held_copies_dropped"], "acked_copies_dropped": stats["acked_copies_dropped"],
            "early_copies_dropped": stats["early_copies_dropped"], "copies_overdue": stats["copies_overdue"],
            "lead_ms": stats["lead_ms"], "lead_samples": samples,
            "path_latency_ms": summary, "in_flight_merged": getattr(adapter, "in_flight_merged", 0),
            "settle_waits": stats["settle_waits"], "bursts": stats["bursts"]}


def _spread(values: list[float], digits: int = 3) -> dict:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


async def run_workload(url: str, name: str, n: int, rounds: int, batch_index_ack: bool,
                       progress: Any = None) -> dict:
    batched, nack_every = WORKLOADS[name]
    topic = f"persistent://public/default/consume-{name}-{uuid.uuid4().hex[:8]}"
    await produce(url, topic, n, batching=batched, payload_bytes=64)
    for kind in KINDS:  # first-touch costs out (imports, first calls) of every kind, not only the first to run
        await consume(url, topic, min(n, 2000), kind, f"warmup-{kind}", 0, batch_index_ack)
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for r in range(rounds):
        order = KINDS[r % len(KINDS):] + KINDS[:r % len(KINDS)]
        for kind in order:
            runs[kind].append(await consume(url, topic, n, kind, f"{kind}-{r}", nack_every, batch_index_ack))
            if progress:
                got = runs[kind][-1]
                progress(f"{name} round {r + 1}/{rounds} {kind}: {got['rate']:,.0f} msg/s, "
                         f"{got['cpu_us_per_msg']} µs/msg" + (f", {got['duplicates']} duplicates" if "duplicates" in got
                                                              else "") + (
                             f", lead {got['lead_ms']} ms from {got['lead_samples']} samples, "
                             f"{got['in_flight_merged']} merged" if "lead_ms" in got else ""))
    out: dict[str, Any] = {"messages": n, "batched": batched, "nack_every": nack_every, "rounds": rounds}
    for kind, rs in runs.items():
        out[kind] = {"rate": _spread([x["rate"] for x in rs], 0), "cpu_us_per_msg": _spread(
            [x["cpu_us_per_msg"] for x in rs], 2), "runs": rs}
    ratios: dict[str, Any] = {}
    for base in ("plain", "queued"):
        for measure, field in (("rate", "rate"), ("cpu", "cpu_us_per_msg")):
            per_round = [t[field] / b[field] for t, b in zip(runs["tracked"], runs[base])]
            ratios[f"tracked/{base} {measure}"] = {**_spread(per_round), "rounds": [round(x, 3) for x in per_round]}
    per_round = [q["rate"] / p["rate"] for q, p in zip(runs["queued"], runs["plain"])]
    ratios["queued/plain rate"] = {**_spread(per_round), "rounds": [round(x, 3) for x in per_round]}
    out["ratios"] = ratios
    out["load_avg_before"] = [round(x, 2) for x in load_before]
    out["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


SYNC_KINDS = ("plain-sync", "sync")


def consume_sync(url: str, topic: str, n: int, kind: str, subscription: str, nack_every: int) -> dict:
    """:func:`consume` for the sync face: ``plain-sync`` (``pulsar.Client``'s consumer) or ``sync``
    (``nacktracker.sync``), called from this thread as a synchronous program does."""
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), operation_timeout_seconds=30)
    try:
        options: dict[str, Any] = dict(consumer_type=pulsar.ConsumerType.Shared,
                                       initial_position=pulsar.InitialPosition.Earliest,
                                       receiver_queue_size=RECEIVER_QUEUE)
        if kind == "sync":
            consumer: Any = nacktracker.sync.subscribe(client, topic, subscription, delay_ms=NACK_DELAY_MS, **options)
        else:
            consumer = client.subscribe(topic, subscription,
                                        negative_ack_redelivery_delay_ms=NACK_DELAY_MS, **options)
        receive, ack, nack = consumer.receive, consumer.acknowledge, consumer.negative_acknowledge
        copies = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        if not nack_every:
            for _ in range(n):
                ack(receive())
            copies = n
        else:
            acked: set[int] = set()
            nacked: set[int] = set()
            while len(acked) < n:
                msg = receive()
                copies += 1
                number = _number(msg)
                if number % nack_every == 0 and number not in nacked:
                    nacked.add(number)
                    nack(msg)
                else:
                    ack(msg)
                    acked.add(number)
        if kind == "sync":
            consumer.stats()  # a call after the acks: it returns once the client took every ack before it
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        consumer.close()
    finally:
        client.close()
    return {"rate": round(n / elapsed, 1), "seconds": round(elapsed, 3), "cpu_us_per_msg": round(cpu / n * 1e6, 2),
            "copies": copies}


def run_sync(broker: str = "lite", url: Optional[str] = None, settings: Optional[dict] = None, rounds: int = 5,
             messages: int = 20_000, nack_messages: int = 10_000, only: Optional[list[str]] = None,
             progress: Any = None) -> dict:
    """The sync face beside the plain ``pulsar.Consumer``: alternating rounds per workload."""
    names = only or ["non-batched"]
    settings = settings or {}
    command = ["python -m bench.consume_throughput --sync", f"--broker {broker}",
               *[f"--set {k}={v}" for k, v in settings.items()], f"--rounds {rounds}", f"--messages {messages}"]
    if any(WORKLOADS[name][1] for name in names):
        command.append(f"--nack-messages {nack_messages}")
    if only:
        command.append("--only " + ",".join(only))
    result: dict[str, Any] = {"command": " ".join(command), "broker": broker, "broker_settings": settings,
                              "external_url": bool(url or os.environ.get("PULSAR_URL")), "cores": os.cpu_count(),
                              "rounds": rounds, "payload_bytes": 64, "receiver_queue_size": RECEIVER_QUEUE,
                              "python": sys.version.split()[0], "pulsar_client": getattr(pulsar, "__version__", "?"),
                              "handoff": nacktracker.sync.HANDOFF,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "workloads": {}}
    with broker_url(broker, url, settings) as service:
        for name in names:
            batched, nack_every = WORKLOADS[name]
            n = nack_messages if nack_every else messages
            topic = f"persistent://public/default/consume-sync-{name}-{uuid.uuid4().hex[:8]}"
            asyncio.run(produce(service, topic, n, batching=batched, payload_bytes=64))
            for kind in SYNC_KINDS:  # first-touch costs out of every kind
                consume_sync(service, topic, min(n, 2000), kind, f"warmup-{kind}", 0)
            load_before = os.getloadavg()
            runs: dict[str, list[dict]] = {kind: [] for kind in SYNC_KINDS}
            for r in range(rounds):
                order = SYNC_KINDS if r % 2 == 0 else SYNC_KINDS[::-1]
                for kind in order:
                    runs[kind].append(consume_sync(service, topic, n, kind, f"{kind}-{r}", nack_every))
                    if progress:
                        got = runs[kind][-1]
                        progress(f"{name} round {r + 1}/{rounds} {kind}: {got['rate']:,.0f} msg/s, "
                                 f"{got['cpu_us_per_msg']} µs/msg, load {os.getloadavg()[0]:.2f}")
            per_round = [s["rate"] / p["rate"] for s, p in zip(runs["sync"], runs["plain-sync"])]
            cpu_round = [s["cpu_us_per_msg"] / p["cpu_us_per_msg"] for s, p in zip(runs["sync"], runs["plain-sync"])]
            result["workloads"][name] = {
                "messages": n, "batched": batched, "nack_every": nack_every,
                **{kind: {"rate": _spread([x["rate"] for x in rs], 0),
                          "cpu_us_per_msg": _spread([x["cpu_us_per_msg"] for x in rs], 2), "runs": rs}
                   for kind, rs in runs.items()},
                "sync/plain-sync rate": {**_spread(per_round), "rounds": [round(x, 3) for x in per_round]},
                "sync/plain-sync cpu": {**_spread(cpu_round), "rounds": [round(x, 3) for x in cpu_round]},
                "load_avg_before": [round(x, 2) for x in load_before],
                "load_avg_after": [round(x, 2) for x in os.getloadavg()]}
    name, bound = SYNC_TARGET
    if name in result["workloads"]:
        got = result["workloads"][name]["sync/plain-sync rate"]
        result["target"] = {"workload": name, "bound": bound, "median": got["median"], "met": got["median"] >= bound}
    return result


def save_sync(result: dict, path: Path = SYNC_RESULTS) -> None:
    """Merge a ``--sync`` run into ``path`` under its broker's name (replacing that broker's last run);
    RESULTS.md is rendered again beside the async results."""
    path.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(path.read_text()) if path.exists() else {}
    results[result["broker"]] = result
    path.write_text(json.dumps(results, indent=1) + "\n")
    if (path.parent / "results.json").exists():
        render(path.parent / "results.json")


BROKER_NAMES = {"lite": "pulsar-lite", "apache": "Apache Pulsar"}


def sync_table(results: dict) -> str:
    """The ``--sync`` runs (by broker) as markdown, for RESULTS.md."""
    out = ["## The synchronous face: `nacktracker.sync` against the plain `pulsar.Consumer`", "",
           "Receive + ack per message in the main thread, side by side in alternating rounds on one broker; "
           "medians over rounds, [min–max]; ratios are per round.", "",
           "| broker | workload | messages | plain `pulsar.Consumer` msg/s · CPU µs/msg | `nacktracker.sync` msg/s · "
           "CPU µs/msg | sync/plain rate | sync/plain CPU | load avg | command |", "|---|---|---|---|---|---|---|---|---|"]
    for broker in sorted(results):
        r = results[broker]
        for name, w in r["workloads"].items():
            cells = [f"{w[k]['rate']['median']:,.0f} [{w[k]['rate']['min']:,.0f}–{w[k]['rate']['max']:,.0f}] · "
                     f"{w[k]['cpu_us_per_msg']['median']}" for k in SYNC_KINDS]
            ratios = [f"{x['median']:.2f} [{x['min']:.2f}–{x['max']:.2f}]"
                      for x in (w["sync/plain-sync rate"], w["sync/plain-sync cpu"])]
            out.append(f"| {BROKER_NAMES.get(broker, broker)} | {name} | {w['messages']:,} | " + " | ".join(cells + ratios)
                       + f" | {w['load_avg_before'][0]} → {w['load_avg_after'][0]} | `{r['command']}` ({r['started']}) |")
    targets = [(broker, r["target"]) for broker, r in sorted(results.items()) if "target" in r]
    if targets:
        out += ["", "Target (median per-round ratio of the rate):", ""]
        out += [f"- {BROKER_NAMES.get(b, b)}, {t['workload']}: {t['median']:.2f} ≥ {t['bound']}: "
                f"**{'met' if t['met'] else 'NOT met'}**" for b, t in targets]
    return "\n".join(out)


def sync_sentence(results: dict) -> str:
    """The docs' sentence on the sync face's receive + ack rate (``bench/figures.py`` renders it into the
    ``consume-throughput-sync`` blocks), from the committed ``--sync`` runs: one clause per broker."""
    parts = []
    for broker in sorted(results, key=lambda b: b != "apache"):  # Apache Pulsar first: it decides
        r = results[broker]
        w = r["workloads"].get("non-batched")
        if w is None:
            continue
        rate, cpu = w["sync/plain-sync rate"], w["sync/plain-sync cpu"]
        parts.append(f"on {BROKER_NAMES.get(broker, broker)}, `nacktracker.sync` {w['sync']['rate']['median']:,.0f} msg/s "
                     f"and plain `pulsar.Consumer` {w['plain-sync']['rate']['median']:,.0f} msg/s: **{rate['median']:.2f}×** "
                     f"the rate [{rate['min']:.2f}–{rate['max']:.2f} over the rounds], {cpu['median']:.2f}× the CPU "
                     f"(`{r['command']}`, {w['messages']:,} messages per run, {r['rounds']} alternating rounds, load "
                     f"average {w['load_avg_before'][0]} → {w['load_avg_after'][0]} on {r['cores']} cores)")
    if not parts:
        return "The synchronous face's throughput: no committed run yet (`python -m bench.consume_throughput --sync --save`)."
    return ("Receive + ack of non-batched 64-byte messages in a synchronous program's main thread, "
            "the two consumers side by side (medians of the per-round ratios): " + "; ".join(parts)
            + " ([results](bench/results/consume-throughput/RESULTS.md)).")


@contextlib.contextmanager
def broker_url(kind: str, url: Optional[str], settings: dict[str, str]) -> Iterator[str]:
    """A running broker of ``kind``: ``url`` (or ``$PULSAR_URL``) if given, else one started here."""
    url = url or os.environ.get("PULSAR_URL")
    if url:
        yield url
        return
    if kind == "lite":
        if settings:
            raise SystemExit("--set is for --broker apache (pulsar-lite takes no broker settings here)")
        from nacktracker.testing import EmbeddedBroker
        with EmbeddedBroker() as broker:
            yield broker.url
        return
    try:
        from nacktracker.testing import ApacheBroker  # type: ignore[attr-defined]
    except ImportError:
        raise SystemExit("--broker apache needs nacktracker.testing.ApacheBroker, or --url of a running "
                         "Apache Pulsar standalone") from None
    with ApacheBroker(settings=settings) as broker:
        yield broker.url


def run(quick: bool = False, broker: str = "lite", url: Optional[str] = None, settings: Optional[dict] = None,
        batch_index_ack: bool = False, rounds: Optional[int] = None, messages: Optional[int] = None,
        nack_messages: Optional[int] = None, only: Optional[list[str]] = None, progress: Any = None) -> dict:
    rounds = rounds or (3 if quick else 5)
    messages = messages or (20_000 if quick else 200_000)
    nack_messages = nack_messages or (10_000 if quick else 50_000)
    settings = settings or {}
    names = only or list(WORKLOADS)
    result: dict[str, Any] = {
        "command": command_line(quick, broker, settings, batch_index_ack, rounds, messages, nack_messages, only),
        "broker": broker, "broker_settings": settings, "external_url": bool(url or os.environ.get("PULSAR_URL")),
        "batch_index_ack_enabled": batch_index_ack, "payload_bytes": 64, "queue_depth": QUEUE_DEPTH,
        "nack_delay_ms": NACK_DELAY_MS, "receiver_queue_size": RECEIVER_QUEUE, "cores": os.cpu_count(),
        "python": sys.version.split()[0], "pulsar_client": getattr(pulsar, "__version__", "?"),
        "nacktracker": nacktracker.__version__ if hasattr(nacktracker, "__version__") else "?",
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "workloads": {}}
    with broker_url(broker, url, settings) as service:
        async def go() -> None:
            for name in names:
                n = nack_messages if WORKLOADS[name][1] else messages
                started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                result["workloads"][name] = {"command": result["command"], "started": started, **await run_workload(
                    service, name, n, rounds, batch_index_ack, progress)}

        asyncio.run(go())
    result["targets"] = check_targets(result)
    return result


def command_line(quick: bool, broker: str, settings: dict, batch_index_ack: bool, rounds: int, messages: int,
                 nack_messages: int, only: Optional[list[str]]) -> str:
    parts = ["python -m bench.consume_throughput", f"--broker {broker}"]
    parts += [f"--set {k}={v}" for k, v in settings.items()]
    if batch_index_ack:
        parts.append("--batch-index-ack")
    if quick:
        parts.append("--quick")
    else:
        parts += [f"--rounds {rounds}", f"--messages {messages}", f"--nack-messages {nack_messages}"]
    if only:
        parts.append("--only " + ",".join(only))
    return " ".join(parts)


def check_targets(result: dict) -> list[dict]:
    """The hot path's targets that this run's workloads cover (median per-round ratio tracked/plain)."""
    out = []
    for name, measure, bound in TARGETS.get(result["broker"], []):
        w = result["workloads"].get(name)
        if w is None:
            continue
        got = w["ratios"][f"tracked/plain {measure}"]
        ok = got["median"] >= bound if measure == "rate" else got["median"] <= bound
        out.append({"workload": name, "measure": measure, "bound": bound, "median": got["median"],
                    "min": got["min"], "max": got["max"], "met": ok, "op": "≥" if measure == "rate" else "≤"})
    for name, rate_bound, duplicates_bound in NACK_TARGETS.get(result["broker"], []):
        w = result["workloads"].get(name)
        if w is None:
            continue
        rates = w["ratios"]["tracked/plain rate"]
        out.append({"workload": name, "measure": "rate, every round", "bound": rate_bound, **_spread(rates["rounds"]),
                    "met": rates["min"] >= rate_bound, "op": "≥"})
        runs = w["tracked"]["runs"]
        duplicates = [r.get("duplicates", 0) for r in runs]
        out.append({"workload": name, "measure": "duplicates, every run", "bound": duplicates_bound,
                    **_spread(duplicates, 0), "met": max(duplicates) <= duplicates_bound, "op": "≤"})
        samples = [r.get("lead_samples", 0) for r in runs]
        out.append({"workload": name, "measure": "lead samples, every run", "bound": 1, **_spread(samples, 0),
                    "met": min(samples) >= 1, "op": "≥"})
    return out


def table(result: dict) -> str:
    """A run (or the merged runs of one broker: see :func:`save`) as markdown."""
    settings = ", ".join(f"{k}={v}" for k, v in result["broker_settings"].items())
    runs: dict[tuple[str, str], list[str]] = {}  # (command, started) -> its workloads
    for name, w in result["workloads"].items():
        run_of = (w.get("command", result["command"]), w.get("started", result["started"]))
        runs.setdefault(run_of, []).append(name)
    out = [f"### {result['broker']}" + (f" ({settings})" if settings else "")
           + (", batch_index_ack_enabled=True" if result["batch_index_ack_enabled"] else ""), ""]
    out += [f"`{command}` ({started}): {', '.join(names)}." for (command, started), names in runs.items()]
    out += ["", f"{result['cores']} cores, Python {result['python']}, pulsar-client {result['pulsar_client']}. "
            "Medians over rounds, [min–max]; ratios are per round.", "",
           "| workload | messages | " + " | ".join(f"{KIND_NAMES[k]} msg/s · CPU µs/msg" for k in KINDS)
           + " | tracked/plain rate | tracked/plain CPU | tracked/queued rate | tracked/queued CPU | load avg |",
           "|---|---|" + "---|" * (len(KINDS) + 5)]
    for name, w in result["workloads"].items():
        cells = [f"{w[k]['rate']['median']:,.0f} [{w[k]['rate']['min']:,.0f}–{w[k]['rate']['max']:,.0f}] · "
                 f"{w[k]['cpu_us_per_msg']['median']}" for k in KINDS]
        ratio = [f"{r['median']:.2f} [{r['min']:.2f}–{r['max']:.2f}]" for r in (
            w["ratios"]["tracked/plain rate"], w["ratios"]["tracked/plain cpu"],
            w["ratios"]["tracked/queued rate"], w["ratios"]["tracked/queued cpu"])]
        label = name.replace("-nacks", f", {100 // w['nack_every']}% nacked once") if w["nack_every"] else name + ", no nacks"
        out.append(f"| {label} | {w['messages']:,} | " + " | ".join(cells + ratio)
                   + f" | {w['load_avg_before'][0]} → {w['load_avg_after'][0]} |")
    nacking = {name: w for name, w in result["workloads"].items() if w["nack_every"]}
    if nacking:
        out += ["", "With nacks, per run (duplicates: copies beyond the first ones and one whole copy of each entry "
                "with a nack; lead: what the tracked consumer's adapter learned, from how many path samples):", "",
                "| workload | tracked duplicates | plain duplicates | tracked lead ms | path samples |",
                "|---|---|---|---|---|"]
        for name, w in nacking.items():
            def runs_of(kind: str, field: str) -> str:
                values = [r[field] for r in w[kind]["runs"] if field in r]
                return " / ".join(f"{v:,}" for v in values) if values else "–"

            out.append(f"| {name} | {runs_of('tracked', 'duplicates')} | {runs_of('plain', 'duplicates')} | "
                       f"{runs_of('tracked', 'lead_ms')} | {runs_of('tracked', 'lead_samples')} |")
    if result["targets"]:
        out += ["", "Targets (tracked/plain: the median per-round ratio unless every round or run is named):", ""]
        def fig(value: float) -> str:
            return f"{value:,.0f}" if float(value).is_integer() and abs(value) >= 2 or value == 0 else f"{value:,.2f}"

        out += [f"- {t['workload']} {t['measure']}: {fig(t['median'])} [{fig(t['min'])}–{fig(t['max'])}] "
                f"{t.get('op', '≥' if t['measure'] == 'rate' else '≤')} {t['bound']}: "
                f"**{'met' if t['met'] else 'NOT met'}**" for t in result["targets"]]
    return "\n".join(out)


def readme_line(results: dict) -> str:
    """README's throughput row (its table of headline figures), rendered from
    the committed results: pulsar-lite, no nacks, batched and not."""
    r = results["lite"]
    cells = []
    for kind in ("tracked", "plain"):
        cells.append(" / ".join(f"{r['workloads'][name][kind]['rate']['median']:,.0f} msg/s, "
                                f"{r['workloads'][name][kind]['cpu_us_per_msg']['median']:.1f} µs CPU/msg"
                                for name in ("batched", "non-batched")))
    ratios = " / ".join(f"{r['workloads'][name]['ratios']['tracked/plain rate']['median']:.2f}× rate, "
                        f"{r['workloads'][name]['ratios']['tracked/plain cpu']['median']:.2f}× CPU"
                        for name in ("batched", "non-batched"))
    return (f"| receive + ack throughput, batched / non-batched, no nacks (pulsar-lite, "
            f"[consume-throughput](bench/results/consume-throughput/RESULTS.md)) | {cells[0]} | "
            f"plain `pulsar.asyncio.Consumer` {cells[1]} | {ratios} (median of per-round ratios) |")


def readme_sentence(results: dict) -> str:
    """README's one-line throughput claim (``bench/figures.py`` renders it into the
    ``consume-throughput`` block), from the committed results: pulsar-lite, no nacks."""
    r = results["lite"]
    parts = []
    for name in ("batched", "non-batched"):
        w = r["workloads"][name]
        rate, cpu = w["ratios"]["tracked/plain rate"], w["ratios"]["tracked/plain cpu"]
        parts.append(f"{name}, TrackedConsumer {w['tracked']['rate']['median']:,.0f} msg/s and "
                     f"{w['tracked']['cpu_us_per_msg']['median']:.1f} µs CPU/msg, plain `pulsar.asyncio.Consumer` "
                     f"{w['plain']['rate']['median']:,.0f} msg/s and {w['plain']['cpu_us_per_msg']['median']:.1f} "
                     f"µs/msg: **{rate['median']:.2f}×** the rate, **{cpu['median']:.2f}×** the CPU")
    loads = [x for name in ("batched", "non-batched") for x in (r["workloads"][name]["load_avg_before"][0],
                                                               r["workloads"][name]["load_avg_after"][0])]
    return (f"Receive + ack throughput on pulsar-lite, no nacks, the three kinds side by side in each run "
            f"(`python -m bench.consume_throughput`, {r['workloads']['batched']['messages']:,} messages per run, "
            f"{r['workloads']['batched']['rounds']} alternating rounds, medians of the per-round ratios, load average "
            f"{min(loads)}–{max(loads)} on {r['cores']} cores): " + "; ".join(parts)
            + " ([all workloads](bench/results/consume-throughput/RESULTS.md)).")


def save(result: dict, path: Path) -> None:
    """Merge ``result`` into the results file under its broker's name; render RESULTS.md beside it. Workloads
    it did not run stay from the broker's earlier runs with the same settings (each keeps its command and time:
    a full matrix takes several runs of ``--only`` under 10 minutes each); other settings replace them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(path.read_text()) if path.exists() else {}
    old = results.get(result["broker"])
    if old is not None and all(old.get(k) == result[k] for k in ("broker_settings", "batch_index_ack_enabled")):
        merged = {name: {"command": old["command"], "started": old["started"], **w}
                  for name, w in old["workloads"].items()}
        merged.update(result["workloads"])
        result = {**result, "workloads": {name: merged[name] for name in WORKLOADS if name in merged}}
        result["targets"] = check_targets(result)
    results[result["broker"]] = result
    path.write_text(json.dumps(results, indent=1) + "\n")
    render(path)


def render(path: Path) -> None:
    """RESULTS.md beside a results file, from it."""
    results = json.loads(path.read_text())
    md = ["# Consume throughput: TrackedConsumer against the plain client", "",
          "Written by `python -m bench.consume_throughput ... --save` (each workload's latest run on each broker; "
          "the commands are under each heading). See the script's docstring for what is measured.", ""]
    for broker in sorted(results):
        md += [table(results[broker]), ""]
    if "lite" in results and {"batched", "non-batched"} <= set(results["lite"]["workloads"]):
        md += ["README's row:", "", "```", readme_line(results), "```", ""]
    sync = path.parent / SYNC_RESULTS.name
    if sync.exists():
        md += [sync_table(json.loads(sync.read_text())), ""]
    (path.parent / "RESULTS.md").write_text("\n".join(md))


def profile(kind: str, workload: str, n: int, broker: str, url: Optional[str], settings: dict,
            batch_index_ack: bool, top: int = 30) -> None:
    """One pass of ``kind`` on ``workload`` under cProfile: the top functions by own time."""
    import cProfile
    import io
    import pstats

    batched, nack_every = WORKLOADS[workload]

    async def go(service: str) -> None:
        topic = f"persistent://public/default/consume-profile-{uuid.uuid4().hex[:8]}"
        await produce(service, topic, n, batching=batched, payload_bytes=64)
        profiler = cProfile.Profile()
        profiler.enable()
        got = await consume(service, topic, n, kind, "profiled", nack_every, batch_index_ack)
        profiler.disable()
        stream = io.StringIO()
        stats = pstats.Stats(profiler, stream=stream)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
        print(got)
        print(stream.getvalue())

    with broker_url(broker, url, settings) as service:
        asyncio.run(go(service))


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--broker", choices=("lite", "apache"), default="lite")
    p.add_argument("--url", help="a running broker of that kind (default: $PULSAR_URL, else start one)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="broker setting (apache)")
    p.add_argument("--batch-index-ack", action="store_true", help="batch_index_ack_enabled=True for every kind")
    p.add_argument("--rounds", type=int)
    p.add_argument("--messages", type=int, help="messages per run without nacks (200,000)")
    p.add_argument("--nack-messages", type=int, help="messages per run with nacks (50,000)")
    p.add_argument("--only", help=f"comma-separated workloads: {','.join(WORKLOADS)}")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--save", nargs="?", const=str(DEFAULT_RESULTS), help=f"merge into a results file "
                   f"(default {DEFAULT_RESULTS.relative_to(Path.cwd()) if DEFAULT_RESULTS.is_relative_to(Path.cwd()) else DEFAULT_RESULTS})")
    p.add_argument("--render", action="store_true", help="only render RESULTS.md from the --save file")
    p.add_argument("--profile", metavar="KIND:WORKLOAD", help="profile one pass instead (e.g. tracked:batched)")
    p.add_argument("--sync", action="store_true", help="the sync face beside the plain pulsar.Consumer instead")
    a = p.parse_args(argv)
    settings = dict(s.split("=", 1) for s in a.set)
    only = a.only.split(",") if a.only else None
    for name in only or ():
        if name not in WORKLOADS:
            p.error(f"unknown workload {name!r}")
    if a.render:
        render(Path(a.save or DEFAULT_RESULTS))
        return 0
    if a.profile:
        kind, _, workload = a.profile.partition(":")
        if kind not in KINDS or workload not in WORKLOADS:
            p.error(f"--profile takes KIND:WORKLOAD, KIND one of {KINDS}, WORKLOAD one of {tuple(WORKLOADS)}")
        n = (a.nack_messages or 50_000) if WORKLOADS[workload][1] else (a.messages or 100_000)
        profile(kind, workload, n, a.broker, a.url, settings, a.batch_index_ack)
        return 0
    if a.sync:
        got = run_sync(a.broker, a.url, settings, a.rounds or 5, a.messages or 20_000, a.nack_messages or 10_000, only,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
        print(json.dumps(got, indent=1) if a.json else "\n".join(
            f"{name}: sync/plain-sync rate median {w['sync/plain-sync rate']['median']} "
            f"(range {w['sync/plain-sync rate']['min']}-{w['sync/plain-sync rate']['max']}), "
            f"plain-sync {w['plain-sync']['rate']['median']:,.0f} msg/s, sync {w['sync']['rate']['median']:,.0f} msg/s, "
            f"load {w['load_avg_before']} -> {w['load_avg_after']}" for name, w in got["workloads"].items()))
        if a.save:
            save_sync(got, Path(a.save).parent / SYNC_RESULTS.name)
        return 0
    result = run(a.quick, a.broker, a.url, settings, a.batch_index_ack, a.rounds, a.messages, a.nack_messages,
                 only, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(result, indent=1) if a.json else table(result))
    if a.save:
        save(result, Path(a.save))
    return 0


if __name__ == "__main__":
    sys.exit(main())
