"""Render the measured figures of README.md and docs/ from the committed results files.

Every table of measured figures in the user docs sits between two markers::

    <!-- figures:NAME -->
    ...rendered text...
    <!-- /figures:NAME -->

and is written by this script from a results file under ``bench/results/``,
never by hand. ``tests/test_docs.py`` fails when a block differs from what
its results file renders, so the text cannot go stale.

    python -m bench.figures            # rewrite every block from the results files
    python -m bench.figures --check    # exit 1 and name the blocks and plots that differ
    python -m bench.figures --redraw   # ... and redraw every plot (after a change to how one is drawn)
    python -m bench.figures record-demo   # run `nacktracker demo --json`, save bench/results/demo/results.json

Blocks: ``demo`` (the demo's table), ``consume-throughput`` (TrackedConsumer
against the plain consumer, from ``python -m bench.consume_throughput --json``),
``consume-throughput-sync`` (``nacktracker.sync`` against the plain ``pulsar.Consumer``, from
``python -m bench.consume_throughput --sync --save``), ``consumer-memory``
(RSS per pending nack end to end, from ``python -m bench.consumer_memory --save``),
``index-grid`` (the index on real client traffic, by precision), ``java-anchor`` (the tracker beside
Java's PIP-393 tracker, from ``python -m bench.java_anchor --save``), ``seed-table`` (the broker-side
experiment's workloads, ``bench.memory``), ``pipeline-scale`` and
``pipeline-speed`` (``nacktracker plan`` at scale and against pandas, from ``bench/results/plan-*``),
and the plots ``plot-redelivery-error``, ``plot-memory-per-pending``, ``plot-consume-throughput`` (an
image in ``docs/img/`` drawn from the results files, and where its figures come from: see ``PLOTS``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]

#: The files whose marked blocks are rendered here.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DEMO = ROOT / "bench" / "results" / "demo" / "results.json"
THROUGHPUT_DIR = ROOT / "bench" / "results" / "consume-throughput"
INDEX_GRID = ROOT / "bench" / "results" / "index-grid" / "results.json"
CONSUMER_MEMORY = ROOT / "bench" / "results" / "consumer-memory" / "results.json"

BLOCK = re.compile(r"(<!-- figures:(?P<name>[\w-]+) -->)\n(?:(?P<body>.*?)\n)?(<!-- /figures:(?P=name) -->)", re.S)


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _machine(r: dict) -> str:
    la, lb = r.get("loadavg_before"), r.get("loadavg_after")
    load = f"load average {la[0]:.2f} → {lb[0]:.2f}" if la and lb else "load average not recorded"
    return f"{load}, {r.get('cores', '?')} cores"


def demo() -> str:
    """The demo's own table (the rows ``nacktracker demo`` prints), from its recorded run."""
    from nacktracker.demo.table import HEADERS, NOTE, table_rows

    r = _load(DEMO)
    rows = [HEADERS, tuple("---" for _ in HEADERS), *table_rows(r["result"])]
    table = "\n".join("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows)
    return (f"{table}\n\n{NOTE} Recorded by `{r['command']}` on {r['recorded']}: pulsar-client "
            f"{r['pulsar_client']}, {r['broker']}, {_machine(r)}; [results file](bench/results/demo/results.json).")


def _throughput_file() -> Optional[Path]:
    """``bench/results/consume-throughput/results.json``, else the last (by name) JSON of that folder or
    any ``*consume*throughput*.json`` under ``bench/results/`` holding that benchmark's ``--json`` output."""
    named = THROUGHPUT_DIR / "results.json"
    if named.exists():
        return named
    found = sorted({*THROUGHPUT_DIR.glob("*.json"), *(ROOT / "bench" / "results").glob("**/*consume*throughput*.json")})
    found = [p for p in found if {"tracked", "plain", "median_round_ratio"} <= set(_load(p))]
    return found[-1] if found else None


def consume_throughput() -> str:
    """One sentence: TrackedConsumer's receive + ack rate against the plain consumer's, side by side."""
    path = _throughput_file()
    if path is None:
        return ("Receive + ack throughput against the plain `pulsar.asyncio.Consumer`: no committed run yet "
                "(`python -m bench.consume_throughput --json > bench/results/consume-throughput/results.json`).")
    r = _load(path)
    if "lite" in r:  # bench/consume_throughput.py --save: runs by broker
        from bench import consume_throughput
        return consume_throughput.readme_sentence(r)
    rel = path.relative_to(ROOT).as_posix()
    return (f"Receive + ack throughput, side by side in one run (`python -m bench.consume_throughput`, "
            f"{r['messages']:,} messages per run, {r['rounds']} rounds, load average "
            f"{r['load_avg_before'][0]} → {r['load_avg_after'][0]} on {r['cores']} cores): TrackedConsumer "
            f"{r['tracked']['median']:,} msg/s, plain `pulsar.asyncio.Consumer` {r['plain']['median']:,} msg/s, "
            f"**{r['median_round_ratio']:.0%}** (median of the per-round ratios; [results file]({rel})).")


def consume_throughput_sync() -> str:
    """One sentence: the synchronous face's receive + ack rate against the plain ``pulsar.Consumer``'s, from the
    committed ``python -m bench.consume_throughput --sync --save`` runs (``sync.json``)."""
    from bench import consume_throughput

    path = THROUGHPUT_DIR / consume_throughput.SYNC_RESULTS.name
    return consume_throughput.sync_sentence(_load(path) if path.exists() else {})


def consumer_memory() -> str:
    """RSS growth per pending nack: TrackedConsumer and the plain consumer, batched and not, one run."""
    from bench import consumer_memory as bench

    if not CONSUMER_MEMORY.exists():
        return "No committed run yet (`python -m bench.consumer_memory --save`)."
    return (f"{bench.table(_load(CONSUMER_MEMORY))}\n\n"
            "Results: [bench/results/consumer-memory/](bench/results/consumer-memory/RESULTS.md).")


def index_grid() -> str:
    """Bytes and CPU per call of the index by precision, DictIndex beside it (medians over the grid's cells)."""
    from bench import index_grid_report

    r = _load(INDEX_GRID)
    return (f"{index_grid_report.summary(r)}\n\n`python -m bench.index_grid`: {len(r['rows'])} fresh processes "
            f"in {r['duration_s']:.0f} s, load average {r['loadavg_before'][0]:.2f} → {r['loadavg_after'][0]:.2f} "
            f"on {r['cores']} cores; every cell: [RESULTS.md](bench/results/index-grid/RESULTS.md).")


PLAN_SCALE = ROOT / "bench" / "results" / "plan-scale"
#: ``bench.plan_scale`` cases shown in docs/pipeline.md: the log, and how its consumers are planned.
SCALE_CASES = {
    "200m-1": ("200M nacks, one consumer (1,000/s, 60 s delay: 60,000 pending)", "read in time order"),
    "8m-1-streamed": ("8M nacks, one consumer (same workload)", "read in time order"),
    "8m-1-whole": ("8M nacks, one consumer (same workload)", "whole"),
    "8m-20000": ("8M nacks, 20,000 consumers", "whole"),
}


def _load_range(*runs: dict) -> str:
    loads = [x for r in runs for x in (r["load_before"], r["load_after"])]
    return f"{min(loads):.1f}-{max(loads):.1f}"


def pipeline_scale() -> str:
    """``plan`` at scale: wall time and peak memory per case (``bench.plan_scale``), and what a worker holds per
    nack when a consumer is planned whole."""
    rows = ["| log | planned as | wall | largest Python worker | driver | `consumers.md` | measured | command |",
            "|---|---|---:|---:|---:|---:|---|---|"]
    results = {}
    for case, (log, how) in SCALE_CASES.items():
        r = results[case] = _load(PLAN_SCALE / f"plan_scale-{case}.json")
        plan, rss = r["plan"], r["plan"]["peak_rss_mb"]
        rows.append(f"| {log} | {how} | {plan['wall_s']:,.1f} s (load {_load_range(plan)}) | {rss['worker']:,} MB | "
                    f"{rss['driver']:,} MB | {r['outputs_bytes']['consumers.md'] / 1000:,.0f} KB | {r['date']} | "
                    f"`python -m bench.plan_scale --case {case}` |")
    whole = results["8m-1-whole"]
    per_nack = whole["plan"]["peak_rss_mb"]["worker"] * 1e6 / 8e6
    fleet = results["8m-20000"]
    return ("\n".join(rows) + "\n\n" +
            f"A consumer planned whole costs its worker about **{per_nack:,.0f} bytes per nack** at the peak (the "
            f"8M-nack consumer: {whole['plan']['peak_rss_mb']['worker']:,} MB, the worker's own start-up memory "
            f"included), so the default `--stream-nacks` of 16,777,216 nacks is about "
            f"{per_nack * 16_777_216 / 1e9:.1f} GB in one worker. At 20,000 consumers the full tables hold "
            f"{fleet['consumers_csv_rows']:,} rows (`consumers.csv` {fleet['outputs_bytes']['consumers.csv'] / 1e6:.1f} MB, "
            f"`consumers.parquet` {fleet['outputs_bytes']['consumers.parquet'] / 1e6:.1f} MB) and the driver peaked at "
            f"{fleet['plan']['peak_rss_mb']['driver']:,} MB. Results: [bench/results/plan-scale/](bench/results/plan-scale/).")


def pipeline_speed() -> str:
    """``plan`` on 100M nacks against an earlier version, ``plan --bits 0`` against pandas, ``trace generate``
    at 20,000 consumers: the committed runs of ``bench.plan_speed``, ``bench.plan_pandas``, ``bench.plan_generate``."""
    import statistics

    speed = _load(ROOT / "bench" / "results" / "plan-speed-100m" / "plan_speed.json")
    this = [r for r in speed if r["side"] == "this"]
    base = [r for r in speed if r["side"] == "baseline"]
    med = lambda runs, key="wall_s": statistics.median(r[key] for r in runs)  # noqa: E731
    pandas = _load(ROOT / "bench" / "results" / "plan-pandas" / "plan_pandas.json")
    side = {k: [r for r in pandas["runs"] if r["side"] == k] for k in ("pandas", "plan --bits 0")}
    gen = _load(PLAN_SCALE / "plan_generate.json")
    gen_this = [r for r in gen["runs"] if r["side"] == "this"]
    walls = lambda runs: " and ".join(f"{r['wall_s']:.1f}" for r in runs)  # noqa: E731
    return (f"- 100M nacks of 8 consumers, six candidate bits, `--master 'local[2]'`: **{walls(this)} s**, side by "
            f"side with an earlier version's {walls(base)} s (ratio {med(this) / med(base):.2f}; CPU of the whole "
            f"process tree {med(this, 'cpu_s'):.0f} s against {med(base, 'cpu_s'):.0f} s; load average "
            f"{_load_range(*this, *base)}), about {med(this) / 100:.2f} µs per event with the JVM's start, the "
            f"check of the log and the report included: `python -m bench.plan_speed --traces 100m-8 --baseline <checkout>`, "
            f"[results](bench/results/plan-speed-100m/plan_speed.md).\n"
            f"- `plan --bits 0` on 20M nacks of 8 consumers against the single-process pandas script one would "
            f"write for the same figure: **{walls(side['plan --bits 0'])} s** against {walls(side['pandas'])} s, "
            f"the same peaks ({'checked equal' if pandas['peaks_equal'] else 'NOT equal'}); peak memory "
            f"{max(r['peak_rss_mb'] for r in side['plan --bits 0']):,} MB for `plan`'s whole process tree, "
            f"{max(r['peak_rss_mb'] for r in side['pandas']):,} MB for pandas; load average "
            f"{_load_range(*pandas['runs'])}: `python -m bench.plan_pandas`, "
            f"[results](bench/results/plan-pandas/plan_pandas.md).\n"
            f"- `trace generate` of 8M events from {gen['consumers']:,} consumers: **{walls(gen_this)} s**, the JVM's "
            f"start included (load average {_load_range(*gen_this)}): `python -m bench.plan_generate`, "
            f"[results](bench/results/plan-scale/plan_generate.md).")


JAVA_ANCHOR = ROOT / "bench" / "results" / "java-anchor" / "results.json"
SEED_TABLE = ROOT / "bench" / "results" / "seed-table" / "results.json"


def java_anchor() -> str:
    """The tracker's bytes and add CPU on the Java measurement's workload, Java's published figures beside them."""
    from bench import java_anchor as anchor

    return anchor.summary(_load(JAVA_ANCHOR))


def seed_table() -> str:
    """``nbytes()`` per nack on the broker TimeBucket design's workloads (``bench.memory``), from the committed run."""
    r = _load(SEED_TABLE)
    rows = ["| workload | x | y | nbytes B/msg | RSS B/msg |", "|---|---:|---:|---:|---:|"]
    rows += [f"| {row['workload']} | {row['x']} | {row['y']} | {row['nbytes_per_msg']:.4f} | {row['rss_per_msg']:.3f} |"
             for row in r["rows"]]
    return ("\n".join(rows) + f"\n\n`{r['command']}` ({r['messages']:,} nacks per row, each a fresh process), "
            f"recorded {r['recorded']}, load average {r['loadavg_before'][0]:.2f} → {r['loadavg_after'][0]:.2f}. "
            "RSS below ~1 MB of growth is the process's one-time first-use cost, not the index. "
            "Results: [bench/results/seed-table/](bench/results/seed-table/).")


# -- plots: drawn from the same results files as the tables ------------------------------------------------
#
# Each plot is a pair: ``data()`` gathers the figures it draws from the results files (plain JSON values),
# ``draw(fig, data)`` draws them. The PNG under docs/img/ carries a hash of its data (a PNG text chunk), so a
# results file that changes makes its plot stale exactly as it makes a table stale. Its block on the page
# (``plot-NAME``) shows the image and says where each series comes from.

IMG = ROOT / "docs" / "img"
_HASH_KEY = "nacktracker-figures-data"


def _first(*paths: Path) -> Optional[Path]:
    return next((p for p in paths if p.exists()), None)


def _error_data() -> dict:
    """Redelivery error (received − due, ms) of TrackedConsumer and the client's built-in nack, per scenario and
    broker: ``bench.pulsar_precision``'s committed runs (min, p50, p99, max of every redelivery)."""
    out: dict = {"runs": []}
    for broker, name in (("pulsar-lite", "pulsar-lite-idle.json"), ("Apache Pulsar", "apache-pulsar-idle.json")):
        path = ROOT / "bench" / "results" / "precision" / name
        if not path.exists():
            continue
        r = _load(path)
        scenarios = [(f"{p['delay_ms'] / 1000:g} s delay, {p['n']} nacks in waves", p) for p in r["precision"]]
        st = r["steady_stream"]
        scenarios.append((f"steady stream, {st['delay_ms']} ms delay", st))
        for label, sc in scenarios:
            out["runs"].append({"broker": broker, "scenario": label, "command": r["command"],
                                **{side: {k: sc[side]["error_ms"][k] for k in ("min", "p50", "p99", "max")}
                                   for side in ("tracked", "builtin")}})
    return out


def _draw_error(fig: Any, data: dict) -> None:
    ax = fig.add_subplot()
    runs = data["runs"]
    sides = (("tracked", "TrackedConsumer", "#1f77b4"), ("builtin", "built-in nack (pulsar-client)", "#d62728"))
    labels = []
    for i, run in enumerate(runs):
        for j, (side, name, colour) in enumerate(sides):
            y = i * 3 + j
            e = run[side]
            ax.plot([e["min"], e["max"]], [y, y], color=colour, lw=1.5, solid_capstyle="butt")
            ax.plot([e["p50"]], [y], "o", color=colour, label=name if i == 0 else None)
            ax.plot([e["p99"]], [y], "|", color=colour, ms=12, mew=2, label=f"{name}: p99" if i == 0 else None)
        labels.append((i * 3 + 0.5, f"{run['broker']}\n{run['scenario']}"))
    ax.set_yticks([y for y, _ in labels], [t for _, t in labels], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=10)
    top = max(run[side]["max"] for run in runs for side, _, _ in sides)
    ax.set_xlim(-5, top * 1.6)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel("redelivery error: received − due (ms, + is late); line: min to max, dot: p50, bar: p99")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    fig.set_size_inches(9, 1.6 + 0.62 * len(runs))


def _memory_data() -> dict:
    """Bytes per pending nack against the number pending, every committed source that measures it."""
    series: list[dict] = []
    grid = _load(INDEX_GRID)
    for index in ("TimeBucketIndex", "DictIndex"):
        pts = sorted((r["pending"], r["rss_per_pending"]) for r in grid["rows"]
                     if r["index"] == index and r["bits"] == 0)
        series.append({"label": f"{index}, index grid: 64 traffic shapes (RSS)", "points": pts,
                       "source": "bench/results/index-grid/results.json", "style": "scatter"})
    if SEED_TABLE.exists():
        seed = _load(SEED_TABLE)
        pts = sorted((r["messages"], r["nbytes_per_msg"]) for r in seed["rows"])
        series.append({"label": "TimeBucketIndex, the broker-side experiment's workloads (nbytes)", "points": pts,
                       "source": "bench/results/seed-table/results.json", "style": "scatter"})
    anchor = ROOT / "bench" / "results" / "java-anchor" / "results.json"  # bench.java_anchor --save, when committed
    java: dict[str, list] = {}
    if anchor.exists():
        rows = _load(anchor)["rows"]
        for b in sorted({r["bits"] for r in rows}):
            pts = sorted((r["messages"], r["nbytes_per_nack"]) for r in rows if r["bits"] == b)
            series.append({"label": f"NegativeAcksTracker, Java's workload, bits {b} (nbytes)", "points": pts,
                           "source": "bench/results/java-anchor/results.json", "style": "line"})
        for r in rows:
            if r.get("java_per_nack") is not None:
                java.setdefault(str(r["bits"]), []).append((r["messages"], r["java_per_nack"]))
    else:
        for (n, b), v in _java_published().items():
            java.setdefault(str(b), []).append((n, v))
    for b, pts in sorted(java.items(), key=lambda kv: -int(kv[0])):
        series.append({"label": f"Java client 4.0.7's tracker, bits {b} (published, JOL)", "points": sorted(pts),
                       "source": "published", "style": "java"})
    consumer = ROOT / "bench" / "results" / "consumer-memory" / "results.json"  # bench.consumer_memory --save
    if consumer.exists():
        runs = _load(consumer)["runs"]
        names = {"tracked": "TrackedConsumer", "plain": "plain pulsar.asyncio.Consumer",
                 "kept": "plain consumer keeping each message, no nack"}
        for key, run in sorted(runs.items()):
            kind, topic = key.split(" ", 1)
            series.append({"label": f"{names.get(kind, kind)}, end to end, {topic} (RSS)",
                           "points": [(run["messages"] // run.get("nack_every", 1), run["rss_per_nack"])],
                           "source": "bench/results/consumer-memory/results.json", "style": "consumer"})
    return {"series": series}


def _java_published() -> dict[tuple[int, int], float]:
    """The Java client's tracker (4.0.7, PIP-393), bytes per pending nack by JOL: the published reference
    figures ``bench.java_anchor`` prints beside its own (not measured here). ``(pending, bits) -> bytes``."""
    from bench.java_anchor import JAVA_B_PER_NACK

    return JAVA_B_PER_NACK


def _draw_memory(fig: Any, data: dict) -> None:
    ax = fig.add_subplot()
    import itertools

    markers = itertools.cycle("os^vDPX*<>ph")
    for s in data["series"]:
        xs, ys = zip(*s["points"])
        if s["style"] == "scatter":
            ax.scatter(xs, ys, s=14, alpha=0.6, marker=next(markers), label=s["label"])
        elif s["style"] == "java":
            ax.plot(xs, ys, "--", marker="s", color="#7f7f7f" if "bits 8" in s["label"] else "#bcbd22",
                    label=s["label"])
        else:
            ax.plot(xs, ys, "-", marker=next(markers), ms=7, label=s["label"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nacks pending at once")
    ax.set_ylabel("bytes per pending nack")
    ax.set_title("Memory per pending nack")
    ax.grid(which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    fig.set_size_inches(9, 5.2 + 0.22 * ((len(data["series"]) + 1) // 2))


def _throughput_data() -> dict:
    """Receive + ack rate of TrackedConsumer and the plain consumer, per workload: median and range over the
    rounds of ``bench.consume_throughput`` (the two kinds alternating in each round)."""
    path = _throughput_file()
    if path is None:
        return {"bars": []}
    r = _load(path)
    bars = []
    for broker, run in r.items() if "lite" in r else [("lite", r)]:
        if not isinstance(run, dict) or "workloads" not in run:
            continue
        name = "pulsar-lite" if broker == "lite" else "Apache Pulsar"
        for workload, w in run["workloads"].items():
            bars.append({"label": f"{workload}\n({name})",
                         **{side: [w[side]["rate"][k] for k in ("median", "min", "max")]
                            for side in ("tracked", "plain")}})
    return {"bars": bars}


def _draw_throughput(fig: Any, data: dict) -> None:
    ax = fig.add_subplot()
    bars = data["bars"]
    xs = range(len(bars))
    for offset, (side, name, colour) in zip((-0.2, 0.2), (("tracked", "TrackedConsumer", "#1f77b4"),
                                                         ("plain", "plain pulsar.asyncio.Consumer", "#ff7f0e"))):
        med = [b[side][0] for b in bars]
        low = [b[side][0] - b[side][1] for b in bars]
        high = [b[side][2] - b[side][0] for b in bars]
        ax.bar([x + offset for x in xs], med, 0.4, yerr=[low, high], capsize=3, color=colour, label=name)
    ax.set_xticks(list(xs), [b["label"] for b in bars], fontsize=8)
    ax.set_ylabel("msg/s: median of rounds (whiskers: min to max)")
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:,.0f}")
    ax.set_title("Receive + ack throughput, side by side in each round")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.set_size_inches(9, 4.5)


#: name -> (image file, gather, draw)
PLOTS: dict[str, tuple[str, Callable[[], dict], Callable[[Any, dict], None]]] = {
    "redelivery-error": ("redelivery-error.png", _error_data, _draw_error),
    "memory-per-pending": ("memory-per-pending.png", _memory_data, _draw_memory),
    "consume-throughput": ("consume-throughput.png", _throughput_data, _draw_throughput),
}


def _digest(data: dict) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _png_text(path: Path) -> dict[str, str]:
    """The ``tEXt`` chunks of a PNG (no imaging library needed)."""
    import struct

    out: dict[str, str] = {}
    blob = path.read_bytes()
    at = 8
    while at + 8 <= len(blob):
        length, kind = struct.unpack(">I4s", blob[at:at + 8])
        if kind == b"tEXt":
            key, _, value = blob[at + 8:at + 8 + length].partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        at += 12 + length
    return out


def stale_plots() -> list[str]:
    """``docs/img/FILE`` for every plot whose image is missing or drawn from other figures than today's."""
    return [f"docs/img/{file}" for file, gather, _ in PLOTS.values()
            if not (IMG / file).exists() or _png_text(IMG / file).get(_HASH_KEY) != _digest(gather())]


def draw_plots(force: bool = False) -> list[Path]:
    """Draw every stale plot (all with ``force``) into docs/img/; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    written = []
    for file, gather, draw in PLOTS.values():
        data = gather()
        path = IMG / file
        if not force and path.exists() and _png_text(path).get(_HASH_KEY) == _digest(data):
            continue
        fig = plt.figure()
        draw(fig, data)
        fig.tight_layout()
        fig.savefig(path, dpi=110, metadata={"Software": None, _HASH_KEY: _digest(data)})
        plt.close(fig)
        written.append(path)
    return written


def _plot_block(name: str, alt: str, sources: Callable[[], str]) -> Callable[[], str]:
    """A plot's block: its image (docs/img/, drawn by :func:`draw_plots`) and where its figures come from."""
    return lambda: f"![{alt}](img/{PLOTS[name][0]})\n\n{sources()}"


def _error_sources() -> str:
    # an older run recorded the script's path: shown as it runs today
    commands = sorted({re.sub(r"^python bench/(\w+)\.py", r"python -m bench.\1", r["command"])
                       for r in _error_data()["runs"]})
    return ("Each line is one scenario on one broker, the two consumers side by side in the same run: nacks in "
            "waves with a 1 s or 5 s delay, and a steady stream (a nack every 5–10 ms for 3 s). TrackedConsumer "
            "at `precision_bits=0`. From " + " and ".join(f"`{c}`" for c in commands) +
            " ([results](bench/results/precision/)).")


def _memory_sources() -> str:
    shown = {s["source"] for s in _memory_data()["series"]}
    parts = ["the index grid (`python -m bench.index_grid`, RSS growth at steady state, `precision_bits=0`, "
             "beside `DictIndex`, one dict entry per nack as in the clients before PIP-393)"]
    if "bench/results/seed-table/results.json" in shown:
        parts.append("the broker-side experiment's workloads (the table below, `nbytes()`)")
    if "bench/results/java-anchor/results.json" in shown:
        parts.append("the tracker on the Java measurement's workload (`python -m bench.java_anchor --save`)")
    if "bench/results/consumer-memory/results.json" in shown:
        parts.append("whole consumers, TrackedConsumer and the plain client, end to end "
                     "(`python -m bench.consumer_memory --save`)")
    java = "; ".join(f"bits {b}: " + " and ".join(f"{v:g} B per nack at {n:,} pending"
                                                  for (n, bb), v in sorted(_java_published().items()) if bb == b)
                     for b in sorted({b for _, b in _java_published()}, reverse=True))
    return ("Points from " + "; ".join(parts) + ". The Java client 4.0.7's PIP-393 tracker, by JOL on 4 ledgers, "
            f"consecutive ids and delays of 1–60 s, is published, not measured here: {java}.")


def _throughput_sources() -> str:
    path = _throughput_file()
    rel = path.relative_to(ROOT).as_posix() if path else "bench/results/consume-throughput/"
    return (f"`python -m bench.consume_throughput` ([results]({rel})): 64-byte messages, batched or not, with "
            "or without nacks; the two consumers alternate in each round.")


RENDERERS: dict[str, Callable[[], str]] = {"demo": demo, "consume-throughput": consume_throughput,
                                          "consume-throughput-sync": consume_throughput_sync,
                                          "consumer-memory": consumer_memory,
                                          "index-grid": index_grid, "pipeline-scale": pipeline_scale,
                                          "pipeline-speed": pipeline_speed, "java-anchor": java_anchor,
                                          "seed-table": seed_table}
# the plots (the section above)
RENDERERS.update({
    "plot-redelivery-error": _plot_block("redelivery-error", "Redelivery error per scenario and broker, "
                                         "TrackedConsumer beside the built-in nack", _error_sources),
    "plot-memory-per-pending": _plot_block("memory-per-pending", "Bytes per pending nack against the number "
                                           "pending", _memory_sources),
    "plot-consume-throughput": _plot_block("consume-throughput", "Receive and ack throughput, TrackedConsumer "
                                           "beside the plain consumer", _throughput_sources),
})


def _relink(text: str, doc: Path) -> str:
    """Links are written relative to the repository root (right for README.md); the docs site holds
    no bench/, so a page names the file as code instead."""
    if doc.parent == ROOT:
        return text
    return re.sub(r"\[[^\]]*\]\((bench/[^)]+)\)", r"`\1`", text)


def rendered(doc: Path) -> str:
    """``doc``'s text with every marked block rendered afresh."""
    text = doc.read_text()

    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in RENDERERS:
            raise KeyError(f"{doc}: unknown figures block {name!r} (known: {sorted(RENDERERS)})")
        return f"{m.group(1)}\n{_relink(RENDERERS[name](), doc)}\n{m.group(4)}"

    return BLOCK.sub(sub, text)


def blocks(doc: Path) -> list[str]:
    return [m.group("name") for m in BLOCK.finditer(doc.read_text())]


def stale(docs: list[Path] = DOCS) -> list[str]:
    """``path: block`` for every block whose text differs from its rendering, and every plot drawn from other
    figures than its results files hold now (:func:`stale_plots`)."""
    out = stale_plots() if docs is DOCS else []
    for doc in docs:
        fresh = {m.group("name"): m.group("body") or "" for m in BLOCK.finditer(rendered(doc))}
        for m in BLOCK.finditer(doc.read_text()):
            if fresh[m.group("name")] != (m.group("body") or ""):
                out.append(f"{doc.relative_to(ROOT)}: {m.group('name')}")
    return out


def _run(command: list[str]) -> "subprocess.CompletedProcess[str]":
    """``command`` from the checkout's root, its output captured; a failure raises ``SystemExit`` with the
    end of the command's stderr (what went wrong, in its own words)."""
    proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-20:])
        raise SystemExit(f"{' '.join(command[1:])} failed with exit status {proc.returncode}; its stderr ends:\n{tail}")
    return proc


def record_demo() -> Path:
    """Run ``nacktracker demo --json`` (its embedded broker, or ``$PULSAR_URL``) and save the result."""
    before = os.getloadavg()
    proc = _run([sys.executable, "-m", "nacktracker.cli", "demo", "--json"])
    after = os.getloadavg()
    result = json.loads(proc.stdout)
    result.pop("url", None)  # a random port: noise in a committed file
    record = {"command": "nacktracker demo --json", "recorded": datetime.date.today().isoformat(),
              "broker": "$PULSAR_URL" if os.environ.get("PULSAR_URL") else "embedded pulsar-lite",
              "pulsar_client": importlib.metadata.version("pulsar-client"),
              "python": ".".join(map(str, sys.version_info[:3])),
              "loadavg_before": [round(x, 2) for x in before], "loadavg_after": [round(x, 2) for x in after],
              "cores": os.cpu_count(), "result": result}
    DEMO.parent.mkdir(parents=True, exist_ok=True)
    DEMO.write_text(json.dumps(record, indent=1) + "\n")
    return DEMO


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", choices=["render", "record-demo"], default="render")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    p.add_argument("--redraw", action="store_true", help="redraw every plot (after a change to how one is drawn)")
    a = p.parse_args(argv)
    if a.command == "record-demo":
        print(f"wrote {record_demo().relative_to(ROOT)}; now run: python -m bench.figures")
        return 0
    if a.check:
        bad = stale()
        for line in bad:
            print(f"stale: {line}")
        return 1 if bad else 0
    for path in draw_plots(force=a.redraw):
        print(f"drew {path.relative_to(ROOT)}")
    for doc in DOCS:
        if blocks(doc):
            new = rendered(doc)
            if new != doc.read_text():
                doc.write_text(new)
                print(f"rendered {doc.relative_to(ROOT)}: {', '.join(blocks(doc))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
