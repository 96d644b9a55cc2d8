"""Render the measured figures of README.md and docs/ from the committed results files.

Every table of measured figures in the user docs sits between two markers::

    <!-- figures:NAME -->
    ...rendered text...
    <!-- /figures:NAME -->

and is written by this script from a results file under ``bench/results/``,
never by hand. ``tests/test_docs.py`` fails when a block differs from what
its results file renders, so the text cannot go stale.

    python -m bench.figures            # rewrite every block from the results files
    python -m bench.figures --check    # exit 1 and name the blocks that differ
    python -m bench.figures record-demo   # run `nacktracker demo --json`, save bench/results/demo/results.json

Blocks: ``demo`` (the demo's table), ``consume-throughput`` (TrackedConsumer
against the plain consumer, from ``python -m bench.consume_throughput --json``), ``consumer-memory``
(RSS per pending nack end to end, from ``python -m bench.consumer_memory --save``),
``index-grid`` (the index on real client traffic, by precision), ``java-anchor`` (the tracker beside
Java's PIP-393 tracker, from ``python -m bench.java_anchor --save``), ``seed-table`` (seed 000's
workloads, ``bench.memory``), ``pipeline-scale`` and
``pipeline-speed`` (``nacktracker plan`` at scale and against pandas, from ``bench/results/plan-*``).
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
from typing import Callable, Optional

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
    """``nbytes()`` per nack on seed 000's workloads (``bench.memory``), from the committed run."""
    r = _load(SEED_TABLE)
    rows = ["| workload | x | y | nbytes B/msg | RSS B/msg |", "|---|---:|---:|---:|---:|"]
    rows += [f"| {row['workload']} | {row['x']} | {row['y']} | {row['nbytes_per_msg']:.4f} | {row['rss_per_msg']:.3f} |"
             for row in r["rows"]]
    return ("\n".join(rows) + f"\n\n`{r['command']}` ({r['messages']:,} nacks per row, each a fresh process), "
            f"recorded {r['recorded']}, load average {r['loadavg_before'][0]:.2f} → {r['loadavg_after'][0]:.2f}. "
            "RSS below ~1 MB of growth is the process's one-time first-use cost, not the index. "
            "Results: [bench/results/seed-table/](bench/results/seed-table/).")


RENDERERS: dict[str, Callable[[], str]] = {"demo": demo, "consume-throughput": consume_throughput,
                                          "consumer-memory": consumer_memory,
                                          "index-grid": index_grid, "pipeline-scale": pipeline_scale,
                                          "pipeline-speed": pipeline_speed, "java-anchor": java_anchor,
                                          "seed-table": seed_table}


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
    """``path: block`` for every block whose text differs from its rendering."""
    out = []
    for doc in docs:
        fresh = {m.group("name"): m.group("body") or "" for m in BLOCK.finditer(rendered(doc))}
        for m in BLOCK.finditer(doc.read_text()):
            if fresh[m.group("name")] != (m.group("body") or ""):
                out.append(f"{doc.relative_to(ROOT)}: {m.group('name')}")
    return out


def record_demo() -> Path:
    """Run ``nacktracker demo --json`` (its embedded broker, or ``$PULSAR_URL``) and save the result."""
    before = os.getloadavg()
    proc = subprocess.run([sys.executable, "-m", "nacktracker.cli", "demo", "--json"], capture_output=True,
                          text=True, check=True, cwd=ROOT)
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
    a = p.parse_args(argv)
    if a.command == "record-demo":
        print(f"wrote {record_demo().relative_to(ROOT)}; now run: python -m bench.figures")
        return 0
    if a.check:
        bad = stale()
        for line in bad:
            print(f"stale: {line}")
        return 1 if bad else 0
    for doc in DOCS:
        if blocks(doc):
            new = rendered(doc)
            if new != doc.read_text():
                doc.write_text(new)
                print(f"rendered {doc.relative_to(ROOT)}: {', '.join(blocks(doc))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
