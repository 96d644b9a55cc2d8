"""Traffic benchmark: TrackedConsumer beside the plain pulsar client under
production-like traffic, same broker, same messages, same run.

Per scenario one topic gets a batched producer (batches of ``--batch`` = 10
messages, ``--rate`` msg/s, ``--messages`` >= 20,000) and two subscriptions,
one per *side*: ``tracked`` (``nacktracker.subscribe``, ``precision_bits=0``,
its defaults otherwise) and ``plain`` (``pulsar.asyncio`` consumer with the
client's built-in nack, ``negative_ack_redelivery_delay_ms=--plain-delay-ms``).
Each side is one application: ``--workers`` tasks per consumer receive, hold a
message for a short processing time (0-2 ms, 2% up to 50 ms), then nack it
(10% of first deliveries, 30% of redeliveries, at most 3 nacks per message,
delay uniform 0.1-3 s) or acknowledge it. The decisions are a function of
(seed, message, nacks so far) (``traffic_ledger.Plan``), so both sides nack
the same messages the same number of times; the plain client cannot take a
per-message delay, so its nacks all ask for its one configured delay.

Scenarios: ``shared-1`` (one consumer per side, Shared), ``shared-2`` (two
consumers per side on one Shared subscription), ``cumulative`` (Failover, one
consumer, one in-order worker acknowledging cumulatively every 100 processed
messages and once at the end: cumulative acks are refused on Shared; on
Exclusive/Failover the tracked consumer redelivers from its own memory),
``partitioned`` (``shared-2`` on a topic of 3 partitions, created through the
admin API; not run on pulsar-lite, which cannot redeliver on partitioned
topics: its row says so), ``key-shared`` (two consumers per side on one
Key_Shared subscription; message ``n`` has the key ``n % 64`` and the
producer batches by key), ``broker-restart`` (``shared-1`` with the broker
stopped gracefully (SIGTERM) when 40% of the messages are sent and started
again on its data) and ``broker-kill`` (the same with SIGKILL, down 0.5 s).
The last two need a broker this script owns, not ``$PULSAR_URL``.

Brokers (``--broker``): ``lite`` (pulsar-lite, the default: starts in under a
second) or ``apache`` (Apache Pulsar standalone from Maven Central,
:class:`nacktracker.testing.ApacheBroker`; ``--set KEY=VALUE`` adds broker
settings). On Apache Pulsar both sides use batch-index acknowledgement by
default (``acknowledgmentAtBatchIndexLevelEnabled`` at the broker,
``batch_index_ack_enabled`` in both consumers; ``--batch-index-ack off`` for
the broker's 4.0 default): without it a redelivered entry carries its
acknowledged siblings to whichever consumer receives it. pulsar-lite has no
batch-index acks.

Measures, per scenario and side (``traffic_ledger.Ledger``):

* **published**: messages whose ``send()`` returned a message id.
* **lost**: published messages the application never acknowledged (nor
  covered by a cumulative ack) by the end. The end: once the producer is done,
  each side waits until it has acknowledged everything with no nack
  outstanding, or ``--drain-s`` seconds, then ``--quiet-s`` seconds more
  (copies still on their way are counted). Split by the state they were left
  in (``never_delivered``, ``nacked``, ``held``, ``done``).
* **acked-then-resurfaced**: deliveries (``receive()`` returned) of a message
  the application had already decided to acknowledge (``acknowledge`` called,
  or a cumulative ack covering it) before that ``receive()`` returned; in
  brackets, those that reached another consumer of the subscription than the
  one the application acknowledged it through (which knows nothing of the ack).
* **held-then-resurfaced**: deliveries of a message one of the application's
  workers held at that moment (received, neither acked nor nacked yet; in the
  cumulative scenario also processed but not yet covered). The application
  settles such a copy as the holder settles the message, through the
  consumer that received it (``twins_settled`` in the JSON): a copy left
  unsettled stays pending at its consumer, and Apache Pulsar redelivers an
  entry only at the request of the consumer it was last dispatched to, so the
  holder's nack alone would never bring the message back.
* **redelivery error**: for each nack, the first delivery of that message
  after it: its arrival (``receive()`` returned, event-loop clock) minus its
  due time (when ``negative_acknowledge`` was called + the requested delay),
  ms; negative = early. Reported: n, min, p50, p99, max, |error| p50/p99,
  early (< 0) and early by more than 5 ms. A copy that arrives while the
  message is still nacked *is* its redelivery, however early.
* **at another consumer** (two-consumer scenario): the same error for the
  redeliveries that reached another consumer of the subscription than the
  one the nack went through (that consumer knows nothing of the nack and
  cannot hold an early copy).
* **missing redeliveries**: nacks with no delivery after them by the end.
* **unexpected**: deliveries whose id the producer did not return for that
  payload (a batch stored twice around a broker kill); acked, nothing else.
* **first-delivery lag**: for each message's first delivery, wall-clock ms
  from the broker storing it (``publish_timestamp``) to ``receive()``
  returning: the side's backlog. Redeliveries queue behind the same backlog,
  so a late redelivery with a large first-delivery lag is a throughput
  matter, not the nack path. (Measured once on a loaded machine, load
  average ~4 on 2 cores: the tracked side's receive pump spent 31 s of the
  run waiting on the client's ``receive()`` and 2.8 s waiting for its own
  prefetch room, so the backlog was upstream: the broker's dispatch or the
  client.)
* **records at end** (tracked only): the sum of ``stats()["batch_records"]``
  over the side's consumers at the end, and the tracker's ``pending``.

Each side runs in a process of its own (``traffic_side.py``: its own
interpreter and event loop, as two applications would), started before the
producer; the parent produces and kills the broker. Per side the run also
reports the loop lag (how late a 10 ms sleep wakes, p99/max: a late
redelivery under a large lag is the process's, not the consumer's) and CPU
seconds.

    python -m bench.traffic                      # full: 20,000 messages, every scenario, pulsar-lite
    python -m bench.traffic --broker apache      # the same on Apache Pulsar
    python -m bench.traffic --quick --no-write   # smoke test: 2,000 messages at 1,000/s,
                                                 # delays 0.1-1 s, no broker restart
    python -m bench.traffic --scenarios shared-2 --rate 1000 --label shared-2-rate1000

It writes ``bench/results/traffic/<label>.json`` and ``.md`` (with the
broker, machine, load average and command; the label defaults to the
broker's name, ``pulsar-lite`` or ``apache-pulsar``; ``--out`` another
folder, ``--no-write`` nothing). Uses ``$PULSAR_URL`` when set (no broker
restart then; the partitioned scenario needs ``$PULSAR_ADMIN_URL`` too),
else starts a broker of ``--broker``'s kind.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import multiprocessing
import os
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent

import pulsar

from bench.traffic_ledger import KEYS, PLAIN, QUICK, SCENARIOS, TRACKED, Config, Scenario
from bench.traffic_side import client, now_ms, quietly, side_main
from nacktracker.demo.measure import CLOSE_GRACE_S
from nacktracker.testing import BROKER_KINDS, make_broker

RESULTS = HERE / "results" / "traffic"
SIDE_START_S = 60.0  # a side process must subscribe within this
#: What each broker kind is called in the results (and their default file names).
BROKER_NAMES = {"lite": "pulsar-lite", "apache": "apache-pulsar"}
#: Why a scenario is not run on a broker: said in the results, never skipped silently.
CANNOT = {("lite", "partitioned"): "not run: pulsar-lite cannot redeliver nacked messages on partitioned topics "
                                   "(nacktracker.testing.lite); run it with --broker apache"}
#: What a scenario's figures on a broker are known to show of the broker rather than of the consumers.
BROKER_NOTES = {("lite", "key-shared"): "on pulsar-lite both sides stall on this Key_Shared subscription: most "
                                        "messages are never delivered, to the plain client as to the tracked one, "
                                        "where Apache Pulsar delivers them all (--broker apache)"}


def create_partitioned(admin_url: str, topic: str, partitions: int) -> None:
    """Create ``topic`` (``persistent://tenant/ns/name``) with ``partitions``
    partitions through the broker's admin REST API."""
    path = "/admin/v2/" + topic.replace("://", "/", 1) + "/partitions"
    request = urllib.request.Request(admin_url.rstrip("/") + path, data=json.dumps(partitions).encode(),
                                     method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30):
        pass


async def produce(url: str, topic: str, cfg: Config, pipes: list, on_sent: Any, keyed: bool = False) -> dict:
    """Publish ``cfg.messages`` numbered payloads at ``cfg.rate`` on schedule,
    batched; stream each returned id to the sides every ~50 ms. ``keyed``:
    message ``n`` gets the key ``n % KEYS``, batched by key (as a Key_Shared
    subscription needs: a batch goes to the consumer of its key)."""
    c = client(url)
    batching = {"batching_type": pulsar.BatchingType.KeyBased} if keyed else {}
    producer = await c.create_producer(topic, batching_enabled=True, batching_max_messages=cfg.batch,
                                       batching_max_publish_delay_ms=10, max_pending_messages=cfg.messages,
                                       send_timeout_millis=60_000, **batching)
    fresh: list = []
    failed = 0

    def record(number: int, fut: asyncio.Future) -> None:
        nonlocal failed
        if fut.cancelled() or fut.exception() is not None:
            failed += 1
            return
        mid = fut.result()
        fresh.append((number, mid.ledger_id(), mid.entry_id(), mid.batch_index()))

    def flush() -> None:
        if fresh:
            for conn in pipes:
                conn.send(("published", list(fresh)))
            fresh.clear()

    start, sends, i, flushed = now_ms(), [], 0, now_ms()
    while i < cfg.messages:
        upto = min(cfg.messages, int((now_ms() - start) * cfg.rate / 1000) + 1)
        for number in range(i, upto):
            key = {"partition_key": str(number % KEYS)} if keyed else {}
            fut = asyncio.ensure_future(producer.send(b"%d" % number, **key))
            fut.add_done_callback(lambda f, n=number: record(n, f))
            sends.append(fut)
        on_sent(upto)
        i = upto
        if now_ms() - flushed > 50:
            flush()
            flushed = now_ms()
        await asyncio.sleep(0.002)
    elapsed = now_ms() - start
    await asyncio.gather(*sends, return_exceptions=True)
    flush()
    await quietly(producer.close())
    await quietly(c.close())
    return {"publish_failed": failed, "publish_rate": round(cfg.messages / max(elapsed, 1) * 1000)}


async def _receive(conn: Any, kind: str, seconds: float) -> Any:
    """The next message of ``kind`` from a side, waiting on the loop (not blocking it)."""
    deadline = now_ms() + seconds * 1000
    while now_ms() < deadline:
        if conn.poll():
            got, payload = conn.recv()
            if got == "error":
                raise RuntimeError(f"a side process failed:\n{payload}")
            if got == kind:
                return payload
        await asyncio.sleep(0.02)
    raise TimeoutError(f"no {kind!r} from a side process within {seconds:g} s")


async def run_scenario(url: str, scenario: Scenario, cfg: Config, broker: Any, admin_url: Optional[str]) -> dict:
    topic = f"persistent://public/default/traffic-{scenario.name}-{uuid.uuid4().hex[:8]}"
    if scenario.partitions:
        if admin_url is None:
            raise SystemExit(f"{scenario.name} needs the broker's admin API: set PULSAR_ADMIN_URL too")
        create_partitioned(admin_url, topic, scenario.partitions)
    ctx = multiprocessing.get_context("spawn")  # never fork a process that has pulsar-client threads
    pipes, procs = [], []
    load_before, started = os.getloadavg(), time.monotonic()
    killer: Optional[asyncio.Task] = None
    killed_at: Optional[float] = None
    down_s: Optional[float] = None

    async def kill_and_restart() -> None:
        nonlocal killed_at, down_s
        loop = asyncio.get_running_loop()
        killed_at = round(time.monotonic() - produce_started, 2)
        if scenario.graceful:
            await loop.run_in_executor(None, broker.restart)  # SIGTERM, wait for it to stop, start
        else:
            await loop.run_in_executor(None, broker.kill)
            await asyncio.sleep(cfg.down_s)
            await loop.run_in_executor(None, broker.start)
        down_s = round(time.monotonic() - produce_started - killed_at, 2)

    def on_sent(upto: int) -> None:
        nonlocal killer
        if scenario.kill_at is not None and killer is None and upto >= scenario.kill_at * cfg.messages:
            killer = asyncio.create_task(kill_and_restart())

    try:
        for name in (TRACKED, PLAIN):
            mine, theirs = ctx.Pipe()
            procs.append(ctx.Process(target=side_main, args=(url, topic, name, scenario, cfg, theirs),
                                     name=f"traffic-{name}", daemon=True))
            procs[-1].start()
            pipes.append(mine)
        for conn in pipes:
            await _receive(conn, "ready", SIDE_START_S)
        produce_started = time.monotonic()
        produced = await produce(url, topic, cfg, pipes, on_sent, keyed=scenario.key_shared)
        if killer is not None:
            await killer
        for conn in pipes:
            conn.send(("produced", produced))
        ends = [await _receive(conn, "result", 2 * cfg.drain_s + cfg.quiet_s + 60) for conn in pipes]
    finally:
        for proc in procs:
            await asyncio.get_running_loop().run_in_executor(None, proc.join, 30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return {"scenario": scenario.name, "consumers_per_side": scenario.consumers,
            "subscription": scenario.subscription, "partitions": scenario.partitions,
            "keys": KEYS if scenario.key_shared else None,
            "workers_per_consumer": 1 if scenario.cumulative else cfg.workers, **produced,
            "broker_killed_at_s": killed_at, "broker_stop": ("restart" if scenario.graceful else "kill -9")
            if scenario.kill_at is not None else None, "broker_back_after_s": down_s,
            "duration_s": round(time.monotonic() - started, 1),
            "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()], **{e["side"]: e for e in ends}}


async def run_async(url: str, cfg: Config, scenarios: list[Scenario], broker: Any, kind: str,
                    admin_url: Optional[str]) -> list:
    results = []
    for scenario in scenarios:
        why_not = CANNOT.get((kind, scenario.name))
        if why_not:
            print(f"traffic: {scenario.name}: {why_not}", file=sys.stderr, flush=True)
            results.append({"scenario": scenario.name, "subscription": scenario.subscription,
                            "partitions": scenario.partitions, "not_run": why_not})
            continue
        print(f"traffic: {scenario.name} ...", file=sys.stderr, flush=True)
        results.append(await run_scenario(url, scenario, cfg, broker, admin_url))
    await asyncio.sleep(CLOSE_GRACE_S)
    return results


def _lite_version() -> str:
    from importlib.metadata import version

    return f"pulsar-lite {version('pulsar-lite')}"


def run(quick: bool = False, cfg: Optional[Config] = None, names: Optional[list[str]] = None, broker: str = "lite",
        settings: Optional[dict] = None) -> dict:
    """Run the scenarios (``names``; default: all, without the broker
    restarts in quick mode or with ``$PULSAR_URL``) on a broker of kind
    ``broker`` (``lite`` or ``apache``; ``settings``: Apache Pulsar broker
    settings) this script starts, or on ``$PULSAR_URL`` (the partitioned
    scenario also needs ``$PULSAR_ADMIN_URL`` then); return the results (no files)."""
    if broker not in BROKER_KINDS:
        raise ValueError(f"broker must be one of {BROKER_KINDS}, not {broker!r}")
    cfg = cfg or (QUICK if quick else Config())
    url = os.environ.get("PULSAR_URL")
    wanted = names or [s.name for s in SCENARIOS if not (s.kill_at and (quick or url))]
    unknown = set(wanted) - {s.name for s in SCENARIOS}
    if unknown:
        raise SystemExit(f"unknown scenarios {sorted(unknown)}: expected {', '.join(s.name for s in SCENARIOS)}")
    scenarios = [s for s in SCENARIOS if s.name in wanted]
    if url and any(s.kill_at for s in scenarios):
        raise SystemExit("broker-restart and broker-kill need a broker this script owns: unset PULSAR_URL")
    if cfg.batch_index_ack and not url:
        if broker != "apache":
            raise SystemExit("pulsar-lite ignores batch-index acks (an ack of one message acks its whole entry): "
                             "batch-index acks need --broker apache")
        settings = {"acknowledgmentAtBatchIndexLevelEnabled": True, **(settings or {})}
    started = time.monotonic()
    if url:
        kind, version = "external", url
        rows = asyncio.run(run_async(url, cfg, scenarios, None, kind, os.environ.get("PULSAR_ADMIN_URL")))
    else:
        options = {"settings": settings} if settings else {}
        if settings and broker != "apache":
            raise SystemExit("--set is for Apache Pulsar's broker settings (--broker apache)")
        kind = broker
        with make_broker(broker, **options) as owned:
            version = f"Apache Pulsar {owned.version()}" if broker == "apache" else _lite_version()
            rows = asyncio.run(run_async(owned.url, cfg, scenarios, owned, kind,
                                         owned.admin_url if broker == "apache" else None))
    return {"quick": quick, "broker": {"kind": kind, "version": version, "settings": settings or {}},
            "config": dataclasses.asdict(cfg), "scenarios": rows,
            "duration_s": round(time.monotonic() - started, 1), "cores": os.cpu_count()}


def _e(error: dict, key: str) -> str:
    return "—" if error[key] is None else f"{error[key]:+.0f}"


def _ms(values: dict, key: str) -> str:
    return "—" if values[key] is None else f"{values[key]:.0f}"


def table(result: dict) -> str:
    cfg = result["config"]
    broker = result.get("broker", {"kind": "lite", "version": "pulsar-lite", "settings": {}})
    settings = "".join(f", {k}={v}" for k, v in broker["settings"].items())
    out = ["## Traffic: TrackedConsumer beside the plain client", "",
           f"`{result.get('command', 'python -m bench.traffic' + (' --quick' if result['quick'] else ''))}` — "
           f"on {broker['version']} ({BROKER_NAMES.get(broker['kind'], broker['kind'])} broker{settings}); "
           f"{cfg['messages']:,} messages at {cfg['rate']:,.0f} msg/s in batches of {cfg['batch']}, "
           f"{cfg['workers']} workers per consumer, nacks {cfg['plan']['min_delay_ms']}-{cfg['plan']['max_delay_ms']} "
           f"ms (plain: its one delay, {cfg['plain_delay_ms']} ms), tracked at precision_bits="
           f"{cfg['precision_bits']}, batch-index acks {'on' if cfg.get('batch_index_ack') else 'off'}. Measures defined in bench/traffic.py. {result['duration_s']} s on "
           f"{result['cores']} cores.", "",
           "| scenario | side | published | lost | acked→resurfaced (elsewhere) | held→resurfaced | redeliveries (missing) "
           "| early / >5 ms early | error min | p50 | p99 | max | records end | pending end "
           "| first-delivery lag p50 / p99 | loop lag p99 / max | CPU s | load avg |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["scenarios"]:
        if row.get("not_run"):
            out.append(f"| {row['scenario']} | both | {row['not_run']} |" + " |" * 15)
            continue
        for name in (TRACKED, PLAIN):
            s = row[name]
            if s.get("refused"):
                out.append(f"| {row['scenario']} | {name} | refused: {s['refused']} |" + " |" * 15)
                continue
            e = s["error_ms"]
            out.append(
                f"| {row['scenario']} | {name} | {s['published']:,} | {s['lost']:,} "
                f"| {s['acked_resurfaced']:,} ({s.get('acked_resurfaced_elsewhere', 0):,}) "
                f"| {s['held_resurfaced']:,} | {s['redeliveries']:,} ({s['missing_redeliveries']:,}) "
                f"| {e['early']:,} / {e['early_beyond_tolerance']:,} | {_e(e, 'min')} | {_e(e, 'p50')} "
                f"| {_e(e, 'p99')} | {_e(e, 'max')} | {s.get('records_end', '—')} | {s.get('pending_end', '—')} "
                f"| {_ms(s['first_delivery_lag_ms'], 'p50')} / {_ms(s['first_delivery_lag_ms'], 'p99')} "
                f"| {s['loop_lag_ms']['p99']:.0f} / {s['loop_lag_ms']['max']:.0f} | {s['cpu_s']} "
                f"| {row['load_avg_before'][0]} → {row['load_avg_after'][0]} |")
    ran = [row for row in result["scenarios"] if not row.get("not_run")]
    elsewhere = [(row["scenario"], name, row[name]["error_ms_at_another_consumer"]) for row in ran
                 for name in (TRACKED, PLAIN) if row[name].get("error_ms_at_another_consumer", {}).get("n")]
    if elsewhere:
        out += ["", "Redeliveries that reached another consumer of the subscription than the one that nacked:", "",
                "| scenario | side | n | early / >5 ms early | min | p50 | p99 | max |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {sc} | {name} | {e['n']:,} | {e['early']:,} / {e['early_beyond_tolerance']:,} | {_e(e, 'min')} "
                f"| {_e(e, 'p50')} | {_e(e, 'p99')} | {_e(e, 'max')} |" for sc, name, e in elsewhere]
    notes = [f"{row['scenario']}: {row['subscription']} subscription"
             + (f", {row['partitions']} partitions" if row.get("partitions") else "")
             + (f", {row['keys']} keys, key-based batching" if row.get("keys") else "")
             + (f", {row['consumers_per_side']} consumers per side" if row.get("consumers_per_side", 1) > 1 else "")
             for row in ran]
    notes += [f"{row['scenario']}: broker {'SIGKILLed' if row.get('broker_stop', 'kill -9') == 'kill -9' else 'SIGTERMed'}"
              f" {row['broker_killed_at_s']} s in" + (f", serving again {row['broker_back_after_s']} s later"
                                                      if row.get("broker_back_after_s") is not None else "")
              for row in ran if row.get("broker_killed_at_s") is not None]
    kind = broker["kind"]
    notes += [f"{row['scenario']}: {BROKER_NOTES[kind, row['scenario']]}" for row in ran
              if (kind, row["scenario"]) in BROKER_NOTES]
    notes += [f"{row['scenario']}/{name}: the {a['n']:,} acknowledged messages that surfaced at another consumer did so "
              f"{a['min']:.0f}-{a['max']:.0f} ms (median {a['p50']:.0f}) after the application acknowledged them"
              for row in ran for name in (TRACKED, PLAIN)
              for a in [row[name].get("acked_resurfaced_elsewhere_after_ms", {})] if a.get("n")]
    notes += [f"{row['scenario']}/{name}: not drained within {cfg['drain_s']} s" for row in ran
              for name in (TRACKED, PLAIN) if not row[name]["drained"] and not row[name].get("refused")]
    notes += [f"{row['scenario']}/{name}: workers died: {'; '.join(row[name]['worker_errors'])}"
              for row in ran for name in (TRACKED, PLAIN) if row[name].get("worker_errors")]
    return "\n".join(out + ([""] + [f"- {n}" for n in notes] if notes else []))


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2,000 messages, no broker kill: a smoke test (< 30 s)")
    p.add_argument("--messages", type=int)
    p.add_argument("--rate", type=float)
    p.add_argument("--workers", type=int, help="per consumer (default 8)")
    p.add_argument("--batch", type=int, help="messages per batch (default 10)")
    p.add_argument("--plain-delay-ms", type=int, help="the plain client's one nack delay (default 1000)")
    p.add_argument("--drain-s", type=float, help="how long a side waits to settle (default 30)")
    p.add_argument("--quiet-s", type=float, help="how long it goes on counting after that (default 3)")
    p.add_argument("--scenarios", default="", help="comma-separated: " + ",".join(s.name for s in SCENARIOS))
    p.add_argument("--broker", choices=BROKER_KINDS, default="lite",
                   help="the broker this script starts: pulsar-lite (default) or Apache Pulsar standalone")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an Apache Pulsar broker setting (--broker apache), e.g. "
                        "acknowledgmentAtBatchIndexLevelEnabled=true; repeatable")
    p.add_argument("--batch-index-ack", choices=("on", "off"),
                   help="batch-index acknowledgement at the broker (acknowledgmentAtBatchIndexLevelEnabled) and "
                        "in both sides' consumers (batch_index_ack_enabled): on by default with --broker apache, "
                        "off (and only off) with pulsar-lite")
    p.add_argument("--label", help="results go to <out>/<label>.json and .md (default: the broker's name, "
                                   "pulsar-lite or apache-pulsar)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--no-write", action="store_true", help="print only")
    a = p.parse_args(argv)
    cfg = QUICK if a.quick else Config()
    chosen = {k: getattr(a, k) for k in ("messages", "rate", "workers", "batch", "plain_delay_ms", "drain_s",
                                         "quiet_s")}
    cfg = dataclasses.replace(cfg, **{k: v for k, v in chosen.items() if v is not None},
                              batch_index_ack=(a.batch_index_ack or ("on" if a.broker == "apache" else "off")) == "on")
    settings = {}
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--set takes KEY=VALUE, not {item!r}")
        settings[key] = value
    label = a.label or BROKER_NAMES[a.broker]
    result = run(a.quick, cfg, [n for n in a.scenarios.split(",") if n] or None, a.broker, settings)
    result["command"] = "python -m bench.traffic " + " ".join(argv if argv is not None else sys.argv[1:])
    from bench.suite import machine  # late: suite imports the other benchmarks

    result["machine"] = machine()
    md = table(result)
    print(md)
    if not a.no_write:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{label}.json").write_text(json.dumps(result, indent=1, default=str))
        m = result["machine"]
        (out / f"{label}.md").write_text(f"{md}\n\nMachine: {m['cpu']} ({m['cores']} cores), Python "
                                         f"{m['python']}, pulsar-client {m['packages'].get('pulsar-client')}.\n")
        print(f"wrote {out / label}.json and .md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
