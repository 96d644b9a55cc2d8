"""The ``nacktracker`` command line: demo, bench, and the Spark pipeline's
trace/plan/sweep (registered by :mod:`nacktracker.pipeline.cli`)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from . import __version__
from ._extras import MissingExtraError, explain, require

__all__ = ["main", "BENCH_PARTS", "bench_dir"]

DESCRIPTION = """\
nacktracker: a small, exact, asyncio-native negative-ack tracker for Apache Pulsar.

Run `nacktracker COMMAND --help` for a command's options."""

DEMO_DESCRIPTION = """\
Consume the same traffic with TrackedConsumer and with the client's built-in
negative ack, side by side on one broker, and print a table of what each did:
nacks, redeliveries, the error of every redelivery against its due time,
dead letters, memory for pending nacks, and a steady stream of nacks (where the built-in
tracker starves). Uses $PULSAR_URL when set, else starts an embedded
pulsar-lite broker on a free 127.0.0.1 port (the 'demo' extra)."""

#: The suite's parts, in the order they run (``--skip`` takes these names).
BENCH_PARTS: dict[str, str] = {
    "memory": "bytes per tracked nack over the design's grid of workloads (a fresh process per configuration)",
    "grid": "the index on real client traffic, by precision (a fresh process per cell)",
    "throughput": "ns per message: add, add_many, pop_due, discard",
    "precision": "tracker error and the starvation case on a real event loop (MemoryAdapter)",
    "pulsar": "redelivery error through the broker, beside the built-in client",
    "consume": "receive + ack throughput against plain pulsar.asyncio.Consumer",
    "soak": "does the tracker give its memory back once everything is redelivered",
    "snapshot": "snapshot size, save and restore time",
    "dedup": "Deduplicator memory per remembered id and time per call",
    "traffic": "batched traffic with nacks, one and two consumers, cumulative acks, beside the plain client",
}

BENCH_DESCRIPTION = """\
Run the benchmark suite and write results.json, RESULTS.md and PNG plots, by
default to build/bench/ (--quick: build/bench-quick/). The suite's scripts
live in bench/ of a source checkout (or the sdist): run this command inside
one. A full run takes tens of minutes on 2 cores; --quick: 1M messages, fewer
repeats. The figures the docs show come from each benchmark's own committed
results under bench/results/ (python -m bench.figures renders them).

parts (--skip takes a comma-separated list of these):
""" + "\n".join(f"  {name:<11} {what}" for name, what in BENCH_PARTS.items())


def bench_dir() -> Optional[Path]:
    """The ``bench/`` of a source checkout: beside the package when it is
    imported from the checkout, else under the current directory."""
    for root in (Path(__file__).resolve().parent.parent, Path.cwd()):
        if (root / "bench" / "suite.py").is_file():
            return root / "bench"
    return None


def _run_suite(root: Path, argv: list[str]) -> int:
    """``python -m bench.suite *argv`` from the checkout ``root`` (``bench`` is a
    package of the checkout, not of the installed distribution)."""
    return subprocess.run([sys.executable, "-m", "bench.suite", *argv], cwd=root).returncode


def _demo(args: argparse.Namespace) -> int:
    # Imported here: the other commands must not need pulsar-client. Whatever of
    # the demo's own needs is missing (pulsar-client, or pulsar-lite without
    # $PULSAR_URL), the 'demo' extra installs it.
    try:
        from .demo import main as demo_main

        if not os.environ.get("PULSAR_URL"):
            require("pulsar_lite", "demo", "nacktracker demo")
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("pulsar", "_pulsar", "pulsar_lite"):
            raise
        hint = "or set $PULSAR_URL to a running broker" if exc.name == "pulsar_lite" else ""
        raise MissingExtraError("nacktracker demo", "demo", exc.name, hint) from None
    return demo_main(quick=args.quick, as_json=args.json)


def _skip_list(text: str) -> list[str]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in parts if p not in BENCH_PARTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown part(s) {', '.join(unknown)}; parts: {', '.join(BENCH_PARTS)}")
    return parts


def _bench(args: argparse.Namespace) -> int:
    bench = bench_dir()
    if bench is None:
        print("nacktracker bench: needs the bench/ scripts of a source checkout or the sdist "
              "(not installed with the package); run it from the checkout's root", file=sys.stderr)
        return 2
    root = bench.parent
    full = root / "build" / "bench"
    out = Path(args.out).resolve() if args.out else root / "build" / ("bench-quick" if args.quick else "bench")
    if args.quick and out.resolve() == full.resolve():
        print("nacktracker bench: --quick does not overwrite a full run's results in build/bench; "
              "choose another --out", file=sys.stderr)
        return 2
    argv = ["--out", str(out)] + (["--quick"] if args.quick else []) + (["--skip", ",".join(args.skip)]
                                                                      if args.skip else [])
    return _run_suite(root, argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nacktracker", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"nacktracker {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    demo = sub.add_parser("demo", help="TrackedConsumer beside the built-in nack on a broker",
                          description=DEMO_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--quick", action="store_true", help="smaller scenarios (~10 s instead of ~30 s)")
    demo.add_argument("--json", action="store_true", help="print the measured result as JSON instead of the table")
    demo.set_defaults(func=_demo)
    bench = sub.add_parser("bench", help="the benchmark suite (needs a source checkout: bench/ is not installed)",
                           description=BENCH_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("--quick", action="store_true", help="1M messages, fewer repeats")
    bench.add_argument("--out", default=None,
                       help="output folder (default build/bench, or build/bench-quick with --quick)")
    bench.add_argument("--skip", type=_skip_list, default=[], metavar="PART[,PART...]",
                       help=f"parts to skip: {', '.join(BENCH_PARTS)}")
    bench.set_defaults(func=_bench)
    from .pipeline.cli import add_subcommands  # trace generate, plan, sweep (pyspark loaded on use)

    add_subcommands(sub)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except ModuleNotFoundError as exc:
        err = explain(exc, f"nacktracker {args.command}")
        if not isinstance(err, MissingExtraError):
            raise
        print(f"nacktracker: {err}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
