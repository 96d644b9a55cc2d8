"""``nacktracker demo | bench | plan | sweep | trace`` — the command line."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _run_script(name: str, argv: list[str]) -> int:
    script = BENCH / name
    if not script.exists():
        print(f"nacktracker: {script} not found (the benchmarks ship with the source tree)", file=sys.stderr)
        return 2
    sys.argv = [str(script), *argv]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def _demo(args: argparse.Namespace) -> int:
    # Imported here: the other commands must not need pulsar-client.
    from .demo import main as demo_main

    return demo_main(quick=args.quick, as_json=args.json)


def _bench(args: argparse.Namespace) -> int:
    argv = ["--out", args.out] + (["--quick"] if args.quick else []) + (["--skip", args.skip] if args.skip else [])
    return _run_script("suite.py", argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nacktracker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="TrackedConsumer beside the built-in nack on a broker ($PULSAR_URL or embedded)")
    demo.add_argument("--quick", action="store_true", help="smaller scenarios (~10 s instead of ~30 s)")
    demo.add_argument("--json", action="store_true", help="print the measured result as JSON instead of the table")
    demo.set_defaults(func=_demo)
    bench = sub.add_parser("bench", help="run the benchmark suite (bench/suite.py)")
    bench.add_argument("--quick", action="store_true", help="1M messages, fewer repeats")
    bench.add_argument("--out", default="bench/results/latest", help="output folder")
    bench.add_argument("--skip", default="", help="comma-separated parts to skip")
    bench.set_defaults(func=_bench)
    from .pipeline.cli import add_subcommands  # trace generate, plan, sweep (pyspark loaded on use)

    add_subcommands(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
