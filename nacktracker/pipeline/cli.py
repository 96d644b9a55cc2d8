"""Command line of the Spark pipeline: ``trace generate``, ``plan``, ``sweep``.

``add_subcommands(subparsers)`` registers them on the main ``nacktracker``
parser; ``python -m nacktracker.pipeline.cli …`` runs them on their own, and
so does ``spark-submit nacktracker/pipeline/cli.py …`` on a cluster. Nothing
here imports pyspark until a command runs.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, ContextManager, Iterable, Optional

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .progress import Progress

if not __package__:  # run as a file (``spark-submit …/cli.py``): make the relative imports work
    __package__ = "nacktracker.pipeline"

__all__ = ["add_subcommands", "main"]


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _spark_options(p: argparse.ArgumentParser, python_on_executors: bool = True) -> None:
    g = p.add_argument_group("Spark")
    g.add_argument("--master", default=None,
                   help="Spark master URL (default: local[*]; under spark-submit, spark-submit's)")
    g.add_argument("--driver-memory", default="4g", help="driver heap for local runs (default 4g)")
    g.add_argument("--shuffle-partitions", type=int, default=None, help="spark.sql.shuffle.partitions")
    g.add_argument("--conf", type=_conf, action="append", default=[], metavar="KEY=VALUE",
                   help="any other Spark setting (repeatable)")
    if python_on_executors:
        g.add_argument("--executor-python", default=None, metavar="PYTHON",
                       help="the executors' Python on the workers (spark.pyspark.python; default: "
                            "$PYSPARK_PYTHON or python3); same minor version as this one")
        g.add_argument("--no-ship", action="store_true",
                       help="do not ship nacktracker and its dependencies to the executors: their Python "
                            "(--executor-python) already has them")
        g.add_argument("--probe-timeout", type=float, default=60.0, metavar="SECONDS",
                       help="how long the executor check waits for an executor (default 60)")
    p.add_argument("--quiet", action="store_true",
                   help="print nothing but errors and results: no progress lines, no closing summary (plan: no "
                        "report either; its files are written)")


def _needs_spark(command: str) -> None:
    """Raise the one-line missing-extra error before anything else is printed."""
    from .._extras import require

    for module in ("pyspark", "pyarrow", "pandas", "numpy"):
        require(module, "spark", f"nacktracker {command}")


class _Session:
    """The command's session: started (or joined) on entry; on exit, when this
    command started it, stopped with its JVM waited for (:func:`~.spark.stop_spark`),
    so no process of the command's outlives it."""

    def __init__(self, args: argparse.Namespace, progress: Progress, python_on_executors: bool = True) -> None:
        self.args, self.progress, self.python_on_executors = args, progress, python_on_executors
        self.spark: Optional[SparkSession] = None
        self.owned = False

    def __enter__(self) -> SparkSession:
        with quiet_import():
            from pyspark.sql import SparkSession
        self.owned = SparkSession.getActiveSession() is None
        self.spark = _session(self.args, self.progress, self.python_on_executors)
        return self.spark

    def __exit__(self, *exc_info: object) -> None:
        if self.owned and self.spark is not None:
            from .spark import stop_spark

            stop_spark(self.spark)


def quiet_import() -> ContextManager[None]:
    from .spark import quiet_pandas_check

    return quiet_pandas_check()


def _session(args: argparse.Namespace, progress: Progress, python_on_executors: bool = True) -> SparkSession:
    """Start (or join) the session; on a cluster, ship and check the executors'
    Python first. Raises ExecutorCheckError (one line) when they cannot run the job."""
    from .ship import prepare_executors
    from .spark import get_spark, is_local

    conf = dict(args.conf)
    if getattr(args, "executor_python", None):
        conf["spark.pyspark.python"] = args.executor_python
    with progress.phase("spark", f"starting a session ({args.master or 'local[*] or spark-submit'})"):
        spark = get_spark(args.master, driver_memory=args.driver_memory,
                          shuffle_partitions=args.shuffle_partitions, conf=conf)
    progress.spark = spark
    if python_on_executors and not is_local(spark.sparkContext.master):
        prepare_executors(spark, ship_env=not args.no_ship, timeout_s=args.probe_timeout, say=progress.say)
    return spark


def _warm_up() -> threading.Thread:
    """Import what ``plan`` needs after Spark (pandas, pyarrow, matplotlib: ~1.5 s)
    and load the memory model's constants, in a thread, while the driver JVM
    starts: this process only waits for the JVM meanwhile. Best effort: a
    failure here shows again, in the main thread, where the module is used."""
    def work() -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401
            import pandas  # noqa: F401
            import pyarrow.compute  # noqa: F401
            import pyarrow.parquet  # noqa: F401

            from .caches import cached_costs

            cached_costs()
        except Exception:  # noqa: BLE001  (see the docstring)
            pass

    thread = threading.Thread(target=work, name="nacktracker-warm-up", daemon=True)
    thread.start()
    return thread


def _fail(problem: object) -> int:
    """Print ``problem`` (an exception or a sentence naming the problem and the fix) as one line."""
    print(f"nacktracker: error: {problem}", file=sys.stderr)
    return 2


def _progress(args: argparse.Namespace, name: str) -> Progress:
    from .progress import Progress

    return Progress(name, enabled=not args.quiet)


# -- trace generate -------------------------------------------------------------

def _trace_generate(args: argparse.Namespace) -> int:
    from .trace import TraceSpec, generate_trace

    try:
        spec = TraceSpec(events=args.events, consumers=args.consumers, rate=args.rate,
                         rate_spread=args.rate_spread, delay_ms=args.delay_ms,
                         delay_jitter_ms=args.delay_jitter_ms, entries_per_ledger=args.entries_per_ledger,
                         nack_share=args.nack_share, batch_size=args.batch_size,
                         renack_share=args.renack_share, topics=args.topics, seed=args.seed,
                         start_ms=args.start_ms)
    except ValueError as e:
        return _fail(e)
    if args.files is not None and args.files < 1:
        return _fail(f"--files must be >= 1, got {args.files}")
    if not args.overwrite and _local_path_exists(args.out):
        return _fail(f"--out {args.out} exists: add --overwrite to replace it, or choose another folder")
    _needs_spark("trace generate")
    started = time.perf_counter()
    progress = _progress(args, "trace")
    failure: Optional[str] = None
    with _Session(args, progress, python_on_executors=False) as spark:  # JVM only: no Python on executors
        try:
            with progress.phase("write", f"{spec.events:,} events to {args.out}"):
                generate_trace(spark, spec, args.out, fmt=args.format, overwrite=args.overwrite, files=args.files)
        except Exception as e:  # Spark's "path already exists" and friends: one line, not a JVM trace
            if type(e).__name__ not in ("AnalysisException", "IllegalArgumentException") and not isinstance(e, ValueError):
                raise
            failure = _first_line(e)  # read while the session (and the JVM the message may call into) is up
    if failure is not None:
        return _fail(failure)
    if not args.quiet:
        print(f"wrote {spec.events:,} events from {spec.consumers} consumers to {args.out} "
              f"({args.format}) in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def _local_path_exists(path: str) -> bool:
    """Whether ``path`` names something that exists on this machine (a ``file:`` path or one
    without a scheme); a remote path (``hdfs://``, ``s3a://``) is Spark's to check."""
    if path.startswith("file:"):
        path = path[len("file:"):]
        path = "/" + path.lstrip("/") if path.startswith("//") else path
    elif "://" in path:
        return False
    return os.path.lexists(path)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _add_trace(sub: Any) -> None:  # argparse's private _SubParsersAction
    trace = sub.add_parser("trace", help="nack event logs: generate synthetic ones")
    tsub = trace.add_subparsers(dest="trace_command", required=True)
    g = tsub.add_parser("generate", help="write a synthetic nack trace (Spark)",
                        description="Write a synthetic nack event log, generated in Spark from spark.range: "
                                    "every entry nacked in order (the sequential workload) or a random share of them, several consumers, "
                                    "configurable rate, delays and ledger rollover.")
    g.add_argument("--out", required=True, help="output directory")
    g.add_argument("--events", type=int, required=True, help="number of nack events")
    g.add_argument("--consumers", type=int, default=4, help="consumers (default 4)")
    g.add_argument("--rate", type=float, default=1000.0, help="nacks per second per consumer (default 1000)")
    g.add_argument("--rate-spread", type=float, default=1.0,
                   help="the last consumer's rate over the first's (geometric; default 1)")
    g.add_argument("--delay-ms", type=int, default=60_000, help="nack delay (default 60000)")
    g.add_argument("--delay-jitter-ms", type=int, default=0, help="plus uniform 0..J ms (default 0)")
    g.add_argument("--entries-per-ledger", type=int, default=50_000, help="ledger rollover (default 50000)")
    g.add_argument("--nack-share", type=float, default=1.0,
                   help="share of each ledger's entries nacked, at random; 1 = all, in order (default 1)")
    g.add_argument("--batch-size", type=int, default=1, help="messages per batch entry (default 1)")
    g.add_argument("--renack-share", type=float, default=0.0,
                   help="share of events that nack an earlier, redelivered message again (default 0)")
    g.add_argument("--topics", type=int, default=1, help="topics the consumers spread over (default 1)")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--start-ms", type=int, default=1_700_000_000_000, help="first timestamp (epoch ms)")
    g.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    g.add_argument("--files", type=int, default=None, help="output files (default: one per 2M events)")
    g.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    _spark_options(g, python_on_executors=False)
    g.set_defaults(func=_trace_generate)


# -- plan -----------------------------------------------------------------------

def _plan(args: argparse.Namespace) -> int:
    from ..events import TraceError
    from .plan import run_plan
    from .report import write_outputs
    from .ship import ExecutorCheckError

    problem = _plan_argument_problem(args)
    if problem is not None:
        return _fail(problem)
    _needs_spark("plan")
    from .load import check_trace_path

    try:  # a wrong path or format: said first and alone, before a JVM starts
        check_trace_path(args.trace, args.format)
    except TraceError as e:
        return _fail(e)
    started = time.perf_counter()
    progress = _progress(args, "plan")
    _warm_up()
    try:
        with _Session(args, progress) as spark:
            result = run_plan(spark, args.trace, args.bits, max_early_ms=args.max_early_ms,
                              rounding=args.rounding, fmt=args.format, partitions=args.partitions,
                              progress=progress, stream_nacks=args.stream_nacks)
            with progress.phase("report", f"writing {args.out}"):
                paths = write_outputs(result, args.out)
    except (TraceError, ValueError, ExecutorCheckError) as e:
        return _fail(e)
    if not args.quiet:
        print(paths["report"].read_text(encoding="utf-8"))
        print(f"plan: {time.perf_counter() - started:.1f} s; wrote {', '.join(str(p) for p in paths.values())}",
              file=sys.stderr)
    return 0


def _plan_argument_problem(args: argparse.Namespace) -> Optional[str]:
    """What is wrong with ``plan``'s own arguments, as one line naming the option and its limits (None: nothing),
    known before Spark starts."""
    from ..precision import MAX_BITS

    if not math.isfinite(args.max_early_ms) or args.max_early_ms < 0:
        return (f"--max-early-ms must be a number of milliseconds >= 0 (the bound on the p99 redelivery "
                f"error), got {args.max_early_ms:g}")
    if not args.bits or any(not 0 <= b <= MAX_BITS for b in args.bits):
        return f"--bits must be integers from 0 to {MAX_BITS} (buckets of 2^bits ms), got {_join(args.bits) or 'none'}"
    for flag, value in (("--partitions", args.partitions), ("--stream-nacks", args.stream_nacks)):
        if value is not None and value < 1:
            return f"{flag} must be >= 1, got {value}"
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        return f"--out {args.out} is a file: name a folder (it is created if missing)"
    return None


def _sweep_argument_problem(args: argparse.Namespace) -> Optional[str]:
    """What is wrong with ``sweep``'s grid, as one line naming the option and its limits (None: nothing)."""
    from ..precision import MAX_BITS

    if not args.x or min(args.x) < 1:
        return f"--x (nacks per ms) must be integers >= 1, got {_join(args.x) or 'none'}"
    if not args.y or any(not 0 <= y <= MAX_BITS for y in args.y):
        return f"--y (precision bits) must be integers from 0 to {MAX_BITS}, got {_join(args.y) or 'none'}"
    if not args.entries_per_ledger or min(args.entries_per_ledger) < 1:
        return f"--entries-per-ledger must be integers >= 1, got {_join(args.entries_per_ledger) or 'none'}"
    if not args.shares or any(not 0 < v <= 1 for v in args.shares):
        return f"--shares must be numbers above 0 and at most 1, got {_join(args.shares) or 'none'}"
    if args.messages < 1:
        return f"--messages must be >= 1, got {args.messages}"
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        return f"--out {args.out} is a file: name a folder (it is created if missing)"
    return None


def _add_plan(sub: Any) -> None:
    from . import DEFAULT_BITS, DEFAULT_MAX_EARLY_MS

    p = sub.add_parser("plan", help="size trackers from a nack event log (Spark)",
                       description="For each consumer and candidate precision_bits: peak pending nacks, "
                                   "peak tracker memory (real pyroaring bitmaps), redelivery error; fleet "
                                   "totals and a recommendation. Writes Parquet, report.md and plot.png.")
    p.add_argument("trace", help="event log: a Parquet file, a JSON Lines file (.jsonl, .json, .ndjson, "
                                 "optionally .gz), or a directory of either (any Spark path)")
    p.add_argument("--bits", type=_ints, default=list(DEFAULT_BITS),
                   help=f"candidate precision bits (default {','.join(map(str, DEFAULT_BITS))})")
    p.add_argument("--max-early-ms", type=float, default=DEFAULT_MAX_EARLY_MS,
                   help=f"bound on the p99 redelivery error (default {DEFAULT_MAX_EARLY_MS})")
    p.add_argument("--rounding", choices=("floor", "ceil"), default="floor",
                   help="bucket rounding of the trackers (default floor: early, never late)")
    p.add_argument("--format", choices=("auto", "parquet", "jsonl"), default="auto")
    p.add_argument("--out", default="nacktracker-plan", help="output directory (default nacktracker-plan)")
    p.add_argument("--partitions", type=int, default=None,
                   help="tasks for the analysis (default: at least 4 x cores and about a "
                        "million nacks each, at most one a consumer)")
    p.add_argument("--stream-nacks", type=int, default=None, metavar="N",
                   help="a consumer with more nacks than N is read in time order, holding only what is "
                        "pending, instead of whole (default 16777216: about 3 GB held whole)")
    _spark_options(p)
    p.set_defaults(func=_plan)


# -- sweep ----------------------------------------------------------------------

def _sweep(args: argparse.Namespace) -> int:
    from .sweep import INDEXES, child_failure, grid, run_sweep, table, write_outputs

    indexes = INDEXES if args.indexes == ["all"] else args.indexes
    problem = _sweep_argument_problem(args)
    if problem is not None:
        return _fail(problem)
    try:
        configs = grid(args.x, args.y, args.entries_per_ledger, args.shares, indexes, args.messages)
    except ValueError as e:
        return _fail(e)
    _needs_spark("sweep")
    from .ship import ExecutorCheckError

    started = time.perf_counter()
    progress = _progress(args, "sweep")
    failure: Optional[str] = None
    try:
        with _Session(args, progress) as spark:
            try:
                with progress.phase("measure", f"{len(configs)} configurations, one task each"):
                    rows = run_sweep(spark, configs)
            except Exception as e:  # noqa: BLE001  a measurement's child failed: its own words, not Spark's trace
                failure = child_failure(e)  # read while the session is up (the message may call into the JVM)
                if failure is None:
                    raise
    except ExecutorCheckError as e:
        return _fail(e)
    if failure is not None:
        return _fail(failure)
    command = " ".join(["nacktracker sweep", "--x", _join(args.x), "--y", _join(args.y),
                        "--entries-per-ledger", _join(args.entries_per_ledger), "--shares", _join(args.shares),
                        "--indexes", ",".join(indexes), "--messages", str(args.messages)])
    print(f"`{command}`\n")
    print(table(rows))
    if args.out:
        write_outputs(rows, args.out, command)
    if not args.quiet:
        print(f"sweep: {len(rows)} configurations in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def _join(values: Iterable[object]) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _add_sweep(sub: Any) -> None:
    s = sub.add_parser("sweep", help="the memory benchmark's parameter grid as Spark tasks",
                       description="The memory benchmark over a grid of nacks per ms (--x), precision bits "
                                   "(--y), entries per ledger and nacked share: bytes per pending message by "
                                   "nbytes() and by resident memory, beside a closed formula's estimate and "
                                   "the Java client's published figure; every column is explained under the "
                                   "table. One Spark task per configuration, each measured in a fresh "
                                   "interpreter.")
    s.add_argument("--x", type=_ints, default=[1, 4, 8], help="nacks per ms (default 1,4,8)")
    s.add_argument("--y", type=_ints, default=[8, 10, 15], help="precision bits (default 8,10,15)")
    s.add_argument("--entries-per-ledger", type=_ints, default=[50_000], help="default 50000")
    s.add_argument("--shares", type=_floats, default=[1.0, 0.1],
                   help="nacked share per ledger; 1 = sequential workload (default 1,0.1)")
    s.add_argument("--indexes", type=lambda t: t.split(","), default=["TimeBucketIndex"],
                   help="TimeBucketIndex,DictIndex,HeapIndex or all (default TimeBucketIndex)")
    s.add_argument("--messages", type=int, default=10_000_000, help="per configuration (default 10M)")
    s.add_argument("--out", default=None, help="also write sweep.parquet/json/md here")
    _spark_options(s)
    s.set_defaults(func=_sweep)


def add_subcommands(subparsers: Any) -> None:
    """Register ``trace generate``, ``plan`` and ``sweep`` on an argparse subparsers object.

    Each sets ``func(args) -> int`` (the exit status).
    """
    _add_trace(subparsers)
    _add_plan(subparsers)
    _add_sweep(subparsers)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="nacktracker", description="nacktracker's Spark pipeline")
    sub = parser.add_subparsers(dest="command", required=True)
    add_subcommands(sub)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except ModuleNotFoundError as exc:  # as the main ``nacktracker`` command: one line naming the extra
        from .._extras import MissingExtraError, explain

        err = explain(exc, f"nacktracker {args.command}")
        if not isinstance(err, MissingExtraError):
            raise
        print(f"nacktracker: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
