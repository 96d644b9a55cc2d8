"""Redelivery precision through a real broker: TrackedConsumer beside the
built-in nack of pulsar-client, in the same run.

Error = when the application received the redelivery − when it was due (nack
time + requested delay), ms, event-loop clock. Scenarios come from
``nacktracker.demo`` (the demo shows the same ones, smaller):

* precision at 1 s and 5 s (run concurrently): waves of 20 back-to-back nacks,
  the waves delay/3 + 50..250 ms apart so the built-in tracker's timer (ticking
  every delay/3, re-armed by every nack) always gets to tick: its best case.
  TrackedConsumer with ``precision_bits=0``.
* steady stream: one nack every 5-10 ms for 3 s, delay 200 ms: every nack
  re-arms the built-in timer, so it starves until the stream stops.

Targets (TrackedConsumer): |error| p99 <= 50 ms at 1 s and 5 s; steady-stream
max |error| <= 300 ms. The built-in's figures are reported, not judged.
The machine's load average is recorded: timing on a shared machine depends on it.

    python bench/pulsar_precision.py [--quick] [--json]

Uses ``$PULSAR_URL`` when set, else starts an embedded pulsar-lite broker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from nacktracker.demo import BUILTIN, CLOSE_GRACE_S, TRACKED, run_precision, run_steady_stream
from nacktracker.testing import pulsar_service

PRECISION_TARGET_MS = 50
STREAM_TARGET_MS = 300
DELAYS_MS = (1000, 5000)
PER_WAVE = 20


def sizes(quick: bool) -> dict[int, int]:
    """Nacks per side at each delay (waves of 20): full ~25 s, quick ~12 s."""
    return {1000: 100, 5000: 60} if quick else {1000: 400, 5000: 200}


async def run_async(url: str, quick: bool = False) -> dict:
    load_before = os.getloadavg()
    started = time.monotonic()
    precision = await asyncio.gather(*[run_precision(url, d, n, per_wave=PER_WAVE, precision_bits=0, seed=d)
                                       for d, n in sizes(quick).items()])
    stream = await run_steady_stream(url, delay_ms=200, period_ms=(5, 10), stream_ms=3000, precision_bits=0)
    targets = {f"tracked |error| p99 at {p['delay_ms']} ms <= {PRECISION_TARGET_MS} ms":
               p[TRACKED]["error_ms"]["abs_p99"] is not None and p[TRACKED]["missing"] == 0
               and p[TRACKED]["error_ms"]["abs_p99"] <= PRECISION_TARGET_MS for p in precision}
    targets[f"tracked steady-stream max |error| <= {STREAM_TARGET_MS} ms"] = \
        stream[TRACKED]["missing"] == 0 and stream[TRACKED]["error_ms"]["abs_max"] is not None \
        and stream[TRACKED]["error_ms"]["abs_max"] <= STREAM_TARGET_MS
    await asyncio.sleep(CLOSE_GRACE_S)  # let the closed clients' threads finish before exit
    return {"quick": quick, "precision": list(precision), "steady_stream": stream, "targets": targets,
            "all_targets_met": all(targets.values()), "duration_s": round(time.monotonic() - started, 1),
            "load_avg_before": [round(x, 2) for x in load_before],
            "load_avg_after": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count()}


def run(quick: bool = False) -> dict:
    with pulsar_service() as url:
        return asyncio.run(run_async(url, quick))


def _e(e: dict, key: str) -> str:
    return "—" if e[key] is None else f"{e[key]:+.0f}" if key in ("p50", "p99", "max") else f"{e[key]:.0f}"


def table(result: dict) -> str:
    cmd = "python bench/pulsar_precision.py" + (" --quick" if result["quick"] else "")
    out = ["## Broker precision and starvation: TrackedConsumer vs built-in nack", "",
           f"`{cmd}` — error = application receives the redelivery − nack time − requested delay (ms); "
           f"same run, same broker, one subscription each. Load average {result['load_avg_before'][0]} → "
           f"{result['load_avg_after'][0]} on {result['cores']} cores; {result['duration_s']} s.", "",
           "| delay | consumer | redeliveries (missing) | p50 | p99 | max | \\|error\\| p99 | \\|error\\| max |",
           "|---|---|---|---|---|---|---|---|"]
    for p in result["precision"]:
        for side, name in ((TRACKED, "TrackedConsumer (bits 0)"), (BUILTIN, "built-in")):
            s, e = p[side], p[side]["error_ms"]
            out.append(f"| {p['delay_ms'] / 1000:g} s | {name} | {s['redeliveries']} ({s['missing']}) | {_e(e, 'p50')} "
                       f"| {_e(e, 'p99')} | {_e(e, 'max')} | {_e(e, 'abs_p99')} | {_e(e, 'abs_max')} |")
    s = result["steady_stream"]
    out += ["", f"Steady stream: one nack every {s['period_ms'][0]:g}-{s['period_ms'][1]:g} ms for "
            f"{s['stream_ms'] / 1000:g} s, delay {s['delay_ms']} ms", "",
            "| consumer | nacks | redelivered during stream / due by its end | first redelivery after start | "
            "p50 | p99 | max |", "|---|---|---|---|---|---|---|"]
    for side, name in ((TRACKED, "TrackedConsumer (bits 0)"), (BUILTIN, "built-in")):
        x, e = s[side], s[side]["error_ms"]
        first = "—" if x["first_redelivery_after_start_ms"] is None else f"{x['first_redelivery_after_start_ms']} ms"
        out.append(f"| {name} | {x['nacks']} | {x['redelivered_during_stream']} / {x['due_during_stream']} | {first} "
                   f"| {_e(e, 'p50')} | {_e(e, 'p99')} | {_e(e, 'max')} |")
    out += ["", "Targets: " + "; ".join(f"{k}: **{'met' if v else 'NOT met'}**" for k, v in result["targets"].items())]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    result = run(a.quick)
    print(json.dumps(result, indent=1, default=str) if a.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
