"""Where TrackedConsumer's late redeliveries lose their time (issue 10's tail).

Runs ``bench/pulsar_precision.py``'s scenarios (optionally with its CPU hog)
with timestamps taken along each tracked redelivery's path, all on the loop's
monotonic clock (``time.monotonic()``, as ``loop.time()``):

    fire      the tracker hands the entry to the adapter (redeliver())
    burst     the adapter's burst that nacks it in the client
    cb        the client's receive callback runs (a C++ thread, GIL held)
    admit     the pump hands the copy to the core (loop thread)
    release   a parked copy's release (the shell's timer ran)
    get       the application's receive() returns it
    error     as the bench: get - nack time - delay

and classifies every redelivery later than ``--late-ms`` (default 5):

    (a) path      the copy reached the consumer after its due time
                  (a1: the client's callback was already late; a2: the
                  callback was on time, the loop took it late)
    (b) release   parked, but released late (b1: a GC pause overlapped;
                  b2: the shell's timer ran late: the loop was busy or the
                  process was not scheduled)
    (c) receive   released or surfaced on time, but the application's
                  receive returned it late (c1: the application was not
                  waiting in receive, e.g. it awaited its previous ack;
                  c2: it was waiting)

Also reports the release timer's lateness, the application's ack await, GC
pauses (>= 1 ms), the process's CPU time and how often a 5 ms sleep of a probe
task on the same loop overslept by more than 3 ms (the loop's own stalls: what
no timer in the process can beat). Like the bench, freezes the start-up heap
(``--no-gc-freeze``: not).

    python -m bench.lab.precision_diagnose [--cpu-hog] [--runs N] [--late-ms 5] [--rows N] [--no-gc-freeze]
                                       [--only steady|precision] [--overrun-ms N]

``--only`` runs one kind of scenario (the steady stream alone takes ~10 s).
Per scenario it also prints the arrival slack (due − when the client's
callback ran, ms: how early the copies reached the process) and the path
from the tracker's fire to the adapter's burst.

Prints only; nothing is written. Diagnostic instrumentation is applied by
monkeypatching in this process only.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
from collections import Counter, defaultdict
from typing import Any

import pulsar
import pulsar.asyncio as pa

from bench.pulsar_precision import cpu_hog
from nacktracker.adapters import pulsar as adapter_mod
from nacktracker.consumer import core as core_mod
from nacktracker.consumer.core import Verdict
from nacktracker.demo import sides as sides_mod
from nacktracker.demo.precision import run_precision
from nacktracker.demo.steady import run_steady_stream
from nacktracker.testing import pulsar_service


def now() -> float:
    return time.monotonic() * 1000.0


T: dict[tuple, dict[str, float]] = defaultdict(dict)   # (topic, payload) -> stamps of the current redelivery
ENTRY: dict[Any, tuple] = {}                              # entry key -> (topic, payload)
FIRE: dict[Any, float] = {}
BURST: dict[Any, float] = {}
ROWS: list[dict[str, Any]] = []
ACKS: list[float] = []
BURSTS: list[tuple[float, int]] = []  # each burst's duration (ms) and size
BUILTIN_ARRIVALS: list[float] = []  # when the built-in side's redeliveries came
ROWS_SHOWN = [0]
GC: list[tuple[float, float, int]] = []
_gc_start = [0.0]


def _id(msg: Any) -> tuple:
    return (msg.topic_name(), msg.data())


def install() -> None:
    orig_receive = pa.Consumer.receive

    async def receive(self: pa.Consumer) -> pulsar.Message:
        if not getattr(self, "_diag", False):
            return await orig_receive(self)
        future = asyncio.get_running_loop().create_future()
        stamp: list[float] = []

        def cb(result: Any, value: Any) -> None:
            stamp.append(now())
            pa._set_future(future, result, value)

        self._consumer.receive_async(cb)
        raw = await future
        m = pulsar.Message()
        m._message = raw
        m._schema = self._schema
        m._diag_cb = stamp[0] if stamp else None  # type: ignore[attr-defined]
        return m

    pa.Consumer.receive = receive  # type: ignore[method-assign]

    orig_open = sides_mod.TrackedSide.open.__func__  # type: ignore[attr-defined]

    async def open_(cls: Any, client: Any, topic: str, options: Any) -> Any:
        side = await orig_open(cls, client, topic, options)
        side.consumer._consumer._diag = True
        side.record._diag = True
        orig_get = side.consumer._pump.get

        async def get(timeout_ms: Any) -> Any:
            called = now()
            msg = await orig_get(timeout_ms)
            k = _id(msg)
            if msg.data() in side.record.due:
                T[k]["call"] = called
                T[k]["get"] = now()
            return msg

        side.consumer._pump.get = get
        orig_ack = side.ack

        async def ack(msg: Any) -> None:
            t0 = now()
            await orig_ack(msg)
            ACKS.append(now() - t0)

        side.ack = ack
        return side

    sides_mod.TrackedSide.open = classmethod(open_)  # type: ignore[assignment]
    sides_mod._OPENERS[sides_mod.TRACKED] = sides_mod.TrackedSide.open

    orig_arrive = core_mod.DeliveryCore.arrive

    def arrive(self: Any, key: Any, batch_size: int, token: Any, now_ms: float) -> Verdict:
        verdict = orig_arrive(self, key, batch_size, token, now_ms)
        k = _id(token)
        t = T[k]
        t["admit"] = now()
        t["cb"] = getattr(token, "_diag_cb", None) or t["admit"]
        t["verdict"] = verdict.value  # type: ignore[assignment]
        e = key.entry
        if e in FIRE:
            t["fire"], t["burst"] = FIRE.pop(e), BURST.pop(e, float("nan"))
        if verdict is Verdict.PARK:
            t["release_ms"] = self.parked[key].release_ms
        return verdict

    core_mod.DeliveryCore.arrive = arrive  # type: ignore[method-assign]

    orig_release = core_mod.DeliveryCore.release

    def release(self: Any, now_ms: float) -> list:
        out = orig_release(self, now_ms)
        t = now()
        for i, token in enumerate(out):
            T[_id(token)]["release"] = t
            T[_id(token)]["wave_pos"] = i
        return out

    core_mod.DeliveryCore.release = release  # type: ignore[method-assign]

    orig_redeliver = adapter_mod.PulsarAdapter.redeliver

    async def redeliver(self: Any, keys: Any) -> None:
        t = now()
        for key in keys:
            FIRE[key.entry] = t
        await orig_redeliver(self, keys)

    adapter_mod.PulsarAdapter.redeliver = redeliver  # type: ignore[method-assign]

    orig_burst = adapter_mod.PulsarAdapter._burst

    async def burst(self: Any, keys: list) -> None:
        t = now()
        for key in keys:
            BURST[key] = t
        await orig_burst(self, keys)
        BURSTS.append((now() - t, len(keys)))

    adapter_mod.PulsarAdapter._burst = burst  # type: ignore[method-assign]

    orig_arrived = sides_mod.Redeliveries.arrived

    def arrived(self: Any, msg: Any) -> None:
        k = _id(msg)
        due = self.due.get(msg.data())
        orig_arrived(self, msg)
        if not getattr(self, "_diag", False) and due is not None:
            BUILTIN_ARRIVALS.append(now())
        if getattr(self, "_diag", False) and due is not None:
            t = T.pop(k, {})
            ROWS.append({**t, "due": due, "error": now() - due, "topic": k[0]})

    sides_mod.Redeliveries.arrived = arrived  # type: ignore[method-assign]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            _gc_start[0] = now()
        else:
            d = now() - _gc_start[0]
            if d >= 1:
                GC.append((_gc_start[0], d, info["generation"]))
                if d >= 5:
                    print(f"  gc gen {info['generation']} {d:.1f} ms collected {info['collected']}", flush=True)

    gc.callbacks.append(on_gc)


def flood_start(arrivals: list[float], n: int = 50, within_ms: float = 200) -> float:
    """The first arrival with ``n`` more within ``within_ms`` after it (the
    built-in side's end-of-stream flood; a copy its timer let through during
    the stream, in a lull of nacks, is not it); the last arrival if none."""
    a = sorted(arrivals)
    for i, t in enumerate(a):
        if i + n < len(a) and a[i + n] - t <= within_ms:
            return t
    return a[-1]


def classify(r: dict[str, Any], late: float) -> str:
    due = r["due"]
    if r.get("admit", due) > due + late / 2 and r.get("verdict") != "park":
        return "a1 path: client callback late" if r.get("cb", due) > due else "a2 path: loop took the copy late"
    if r.get("verdict") == "park":
        if r.get("release", due) - r["release_ms"] > late / 2:
            if any(g < r["release"] and g + d > r["release_ms"] for g, d, _ in GC):
                return "b1 release late: a GC pause"
            return "b2 release late: timer/loop"
        base = r["release"]
    else:
        base = r.get("admit", due)
    if r.get("call", 0) > base + 0.5:
        return "c1 receive: application was not waiting (busy/acking)"
    return "c2 receive: queued, application waiting"


async def main_async(url: str, late: float, only: str = "", overrun: Any = None) -> dict[str, Any]:
    loads = os.getloadavg()
    cpu0, wall0 = time.process_time(), now()
    stalls: list[tuple[float, float]] = []

    async def probe() -> None:  # loop lag: how late a 5 ms sleep wakes
        while True:
            t = now()
            await asyncio.sleep(0.005)
            lag = now() - t - 5
            if lag > 3:
                stalls.append((t, lag))

    p = asyncio.create_task(probe())
    precision = [] if only == "steady" else await asyncio.gather(
        run_precision(url, 1000, 400, per_wave=20, precision_bits=0, seed=1000),
        run_precision(url, 5000, 200, per_wave=20, precision_bits=0, seed=5000))
    stream = None if only == "precision" else await run_steady_stream(
        url, delay_ms=200, period_ms=(5, 10), stream_ms=3000, precision_bits=0, builtin_overrun_ms=overrun)
    p.cancel()
    await asyncio.sleep(0.2)
    threads = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        name = open(f"/proc/self/task/{task}/comm").read().strip()
        threads.append((int(fields[11]) + int(fields[12]), name))
    print(f"  process CPU {time.process_time() - cpu0:.1f} s in {(now() - wall0) / 1000:.1f} s; busiest threads (ticks): "
          + ", ".join(f"{n}={t}" for t, n in sorted(threads, reverse=True)[:6]))
    return {"precision": precision, "stream": stream, "load": (loads, os.getloadavg()), "stalls": stalls}


def report(res: dict[str, Any], late: float) -> None:
    print(f"load average {res['load'][0][0]:.2f} -> {res['load'][1][0]:.2f}")
    for p in res["precision"]:
        e = p["tracked"]["error_ms"]
        print(f"  {p['delay_ms']} ms: tracked |err| p99 {e['abs_p99']} max {e['abs_max']} min {e['min']};"
              f" lead_ms {p['tracked']['consumer_stats']['lead_ms']}")
    if res["stream"] is not None:
        e = res["stream"]["tracked"]["error_ms"]
        print(f"  steady: tracked |err| p99 {e['abs_p99']} max {e['abs_max']} min {e['min']};"
              f" lead_ms {res['stream']['tracked']['consumer_stats']['lead_ms']}")
    by_topic: dict[str, list] = defaultdict(list)
    for r in ROWS:
        by_topic[r["topic"].split("-demo-")[1].rsplit("-", 1)[0]].append(r)
    for name, rows in by_topic.items():
        lates = [r for r in rows if r["error"] > late]
        c = Counter(classify(r, late) for r in lates)
        verdicts = Counter(r.get("verdict") for r in rows)
        wake = sorted(r["release"] - r["release_ms"] for r in rows if "release" in r and "release_ms" in r)
        slack = sorted(r["due"] - r["cb"] for r in rows if "cb" in r)
        queue = sorted(r["burst"] - r["fire"] for r in rows if "burst" in r and r["burst"] == r["burst"])
        if slack:
            print(f"  [{name}] arrival slack (due - client callback, ms): min {slack[0]:.1f} "
                  f"p1 {slack[int(len(slack) * .01)]:.1f} p50 {slack[len(slack) // 2]:.1f}"
                  + (f"; fire -> burst: p50 {queue[len(queue) // 2]:.1f} max {queue[-1]:.1f}" if queue else ""))
        if wake:
            print(f"  [{name}] release timer lateness (ms): p50 {wake[len(wake) // 2]:.1f} "
                  f"p90 {wake[int(len(wake) * .9)]:.1f} p99 {wake[int(len(wake) * .99)]:.1f} max {wake[-1]:.1f}")
        first_due = min(r["due"] for r in rows)  # the precision scenarios' built-in copies came before
        builtin = [a for a in BUILTIN_ARRIVALS if a > first_due]
        if name == "steady" and builtin:
            # the built-in side starves until the stream stops, then all its copies come at once
            flood = flood_start(builtin)
            after = [r for r in lates if r["due"] >= flood - 20]
            print(f"  [{name}] late copies due after the built-in side's flood began (-20 ms): {len(after)} of {len(lates)};"
                  f" tracked copies due then: {sum(1 for r in rows if r['due'] >= flood - 20)}; worst five"
                  f" (error @ due - flood start): " + ", ".join(f"{r['error']:+.1f} @ {r['due'] - flood:+.0f}"
                                                               for r in sorted(lates, key=lambda r: -r["error"])[:5]))
        print(f"  [{name}] {len(rows)} redeliveries, verdicts {dict(verdicts)}; late > {late} ms: {len(lates)} {dict(c)}")
        for r in sorted(lates, key=lambda r: -r["error"])[:ROWS_SHOWN[0]]:
            due = r["due"]

            def rel(k: str) -> str:
                v = r.get(k)
                return "   -  " if v is None or v != v else f"{v - due:+6.1f}"

            print(f"     err {r['error']:+5.1f}  fire {rel('fire')} burst {rel('burst')} cb {rel('cb')} admit {rel('admit')}"
                  f" {r.get('verdict', '?'):7} rel_ms {rel('release_ms')} release {rel('release')}"
                  f" pos {r.get('wave_pos', '-')} call {rel('call')} get {rel('get')}  -> {classify(r, late)}")
    a = sorted(ACKS)
    if a:
        print(f"  tracked ack await: n {len(a)} p50 {a[len(a) // 2]:.2f} p99 {a[int(len(a) * .99)]:.2f} max {a[-1]:.2f} ms")
    b = sorted(d for d, _ in BURSTS)
    if b:
        print(f"  adapter bursts: n {len(b)} duration p50 {b[len(b) // 2]:.2f} p99 {b[int(len(b) * .99)]:.2f} "
              f"max {b[-1]:.2f} ms; ids per burst max {max(n for _, n in BURSTS)}")
    print(f"  GC pauses >= 1 ms: {len(GC)}" + (f", longest {max(d for _, d, _ in GC):.1f} ms" if GC else ""))
    st = sorted(res["stalls"], key=lambda s: -s[1])[:5]
    print(f"  loop stalls (5 ms sleep overslept > 3 ms): {len(res['stalls'])}; worst: "
          + ", ".join(f"{lag:.1f}" for _, lag in st))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-hog", action="store_true")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--late-ms", type=float, default=5)
    ap.add_argument("--no-gc-freeze", action="store_true", help="do not gc.freeze() after start-up (the bench does)")
    ap.add_argument("--rows", type=int, default=0, help="print this many of the latest rows per scenario")
    ap.add_argument("--overrun-ms", type=int, default=None,
                    help="the steady stream's builtin_overrun_ms (0: both sides stop together, as before)")
    ap.add_argument("--only", choices=("steady", "precision"), default="", help="run only these scenarios")
    a = ap.parse_args()
    install()
    ROWS_SHOWN[0] = a.rows
    if not a.no_gc_freeze:
        gc.collect()
        gc.freeze()
    with pulsar_service() as url:
        for i in range(a.runs):
            ROWS.clear()
            ACKS.clear()
            BURSTS.clear()
            BUILTIN_ARRIVALS.clear()
            GC.clear()
            print(f"run {i + 1} ({'cpu-hog' if a.cpu_hog else 'idle'})")
            if a.cpu_hog:
                with cpu_hog():
                    res = asyncio.run(main_async(url, a.late_ms, a.only, a.overrun_ms))
            else:
                res = asyncio.run(main_async(url, a.late_ms, a.only, a.overrun_ms))
            report(res, a.late_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
