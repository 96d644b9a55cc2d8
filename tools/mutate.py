"""`make mutate`: mutation testing of the core modules against the fast tests.

Runs mutmut (configured in pyproject.toml, ``[tool.mutmut]``: tracker.py,
consumer/core.py, index/, backoff.py, snapshot.py; the tests that need no
broker, no Spark and no subprocess), times it, and writes
``mutation/latest.md``: the score per module (killed / all mutants run;
timeouts count as killed, a mutant no selected test reaches as surviving) and
every survivor with its diff. The committed ``mutation/REPORT.md`` gives a
reason for each survivor kept (an equivalent mutant) or names the test added
for it.

    python tools/mutate.py --owners [--max-children N] [--cpu-limit S] [--only-report]
                                                      (`make mutate`: --owners --cpu-limit 100)
    python tools/mutate.py [--max-children N] [--module nacktracker/tracker.py ... [--survivors]]
                           [--mutant NAME ...] [--tests 'tests/test_x.py ...'] [--profile mutate-quick]
                           [--cpu-limit S] [--only-report]

While mutmut runs, its result files are copied aside every minute
(``<module>.py.meta.bak``): mutmut rewrites a module's whole result file after
each mutant, so a run killed during that write leaves it empty; the next run
(or ``--only-report``) restores the copy.

``--owners`` runs each configured module against the tests that own its
behaviour (the table ``OWNERS`` below, as mutation/REPORT.md reports them),
one selection after the other, each resuming its own state: a module already
run costs nothing more, and an interrupted run goes on where it stopped (with
the mutants not run yet; survivors keep their result until ``--survivors``
reruns them). It
writes one report per selection (``mutation/latest/``) and their table with
the run time of each in ``mutation/latest.md``.

``--module`` runs the mutants of those modules only (mutmut's mutant names,
``nacktracker.tracker.*``), each against the tests that call the mutated
function (mutmut's own per-mutant test mapping, recorded by one traced run of
the configured selection); the report then covers those modules. Without it,
every configured module is run.

``--tests`` checks the mutants against those tests instead of the configured
selection (tools/mutmut_tests.py), e.g. the index's modules against the index
tests; mutmut's state for that selection lives in ``mutation/work/<hash>/``
(mutmut resets every result when the selection changes, so each selection
keeps its own), and a later run with the same ``--tests`` resumes it.

Hypothesis runs its ``mutate`` profile (tests/run_checks.py): ``ci``'s
derandomized examples without shrinking a failure, so a rerun on the same code
gives the same survivors, and a mutant ``ci`` kills is killed here on the same
example. ``--profile mutate-quick`` runs a quarter of each test's examples: a
first pass for modules whose survivors run every state machine (the index); a
mutant it kills failed a test, and its survivors are rerun with
``--survivors`` on ``mutate``. It takes long (tens of
minutes to hours on 2 cores): it is not part of ``make test``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KILLED = {1, 3, 36, 24, -24, 152, 255, 37}  # killed, pytest internal error, timeouts, type check
TIMEOUTS = {36, 24, -24, 152, 255}  # mutmut's CPU-time limit (SIGXCPU): a mutant that loops; counted as killed
SURVIVED = {0}


#: tests/index/test_index.py's RSS test and profile-hook test, left out of the index's selections: one
#: measures the process, one a tracing hook; neither is about what a mutant of the index changes.
_NOT_INDEX_TESTS = ("--deselect tests/index/test_index.py::test_nbytes_within_25_percent_of_rss_growth "
                    "--deselect tests/index/test_index.py::test_state_stays_whole_under_a_hook_reading_frame_locals")
INDEX_TESTS = ("tests/index/test_index.py tests/index/test_index_layout.py tests/pipeline/test_memory_model.py tests/tracker/test_fuzz.py "
               + _NOT_INDEX_TESTS)
#: What ``--owners`` (``make mutate``) runs: (modules, the tests that own their behaviour, hypothesis
#: profile), the fewest mutants first. The index's modules run on ``mutate-quick`` (see ``--profile``).
#: The retry and dead-letter toolkit's tests that need no broker and no subprocess.
LETTER_TESTS = ("tests/consumer/test_retries.py tests/consumer/test_consumer_letters.py -m 'not broker and not lite and not apache' "
                "--deselect tests/consumer/test_consumer_letters.py::"
                "test_one_consumer_per_snapshot_path_at_a_time_and_a_killed_holder_leaves_no_lock")
OWNERS: list[tuple[tuple[str, ...], str, str]] = [
    (("nacktracker/precision.py",), "tests/index/test_index.py " + _NOT_INDEX_TESTS, "mutate"),
    (("nacktracker/backoff.py",), "tests/tracker/test_backoff.py tests/tracker/test_backoff_jitter.py", "mutate"),
    (("nacktracker/snapshot.py",), "tests/tracker/test_snapshot.py tests/tracker/test_snapshot_edges.py tests/tracker/test_fuzz.py",
     "mutate"),
    (("nacktracker/consumer/core.py",), "tests/consumer/test_consumer_core.py", "mutate"),
    (("nacktracker/tracker.py",), "tests/tracker/test_tracker.py tests/tracker/test_faults.py tests/tracker/test_events.py "
     "tests/tracker/test_fuzz.py tests/tracker/test_snapshot.py", "mutate"),
    (("nacktracker/consumer/letters/java.py",), LETTER_TESTS, "mutate"),
    (("nacktracker/consumer/counts.py",), LETTER_TESTS, "mutate"),
    *(((f"nacktracker/index/{m}.py",), INDEX_TESTS, "mutate-quick")
      for m in ("_ledgers", "bitmaps", "layout", "baselines", "_windows", "_live", "buckets")),
]


def _owners(args: argparse.Namespace) -> int:
    """``--owners``: every OWNERS selection in turn (each resumes its own state), then their table."""
    rows, times = [], []
    for modules, tests, profile in OWNERS:
        out = ROOT / "mutation" / "latest" / (Path(modules[0]).stem.lstrip("_") + ".md")
        cmd = [sys.executable, __file__, "--max-children", str(args.max_children), "--tests", tests,
               "--profile", profile, "--out", str(out), *[a for m in modules for a in ("--module", m)],
               *(["--cpu-limit", str(args.cpu_limit)] if args.cpu_limit else [])]
        started = time.monotonic()
        code = subprocess.run([*cmd, "--only-report"] if args.only_report else cmd).returncode
        if code != 0:
            print(f"{', '.join(modules)}: exited {code}; stopped (the same command resumes)", file=sys.stderr)
            return code
        times.append((", ".join(modules), profile, time.monotonic() - started))
        rows += [line for line in out.read_text().splitlines() if line.startswith("| nacktracker/")]
    lines = ["# Mutation testing: the last `make mutate`", "",
             "Each module against the tests that own its behaviour (`OWNERS` in tools/mutate.py); the report "
             "of each selection, with every survivor's diff, is in mutation/latest/.", "",
             "| module | mutants | killed (of which timeouts) | survived | no tests | not checked | score |",
             "|---|---|---|---|---|---|---|", *rows, "",
             "Run time of each selection in this run (one already run costs its report only); load average "
             f"at the end {Path('/proc/loadavg').read_text().split()[0]}:", ""]
    lines += [f"- {modules} ({profile}): {seconds / 60:.1f} min" for modules, profile, seconds in times]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _workdir(tests: list[str] | None) -> Path:
    """Where mutmut keeps its state (``mutants/``) for a test selection: the
    checkout for the configured one; for ``--tests``, a directory of its own
    under ``mutation/work/`` (links to the package, the tests and
    pyproject.toml), because mutmut resets every result and its test mapping
    when the selection changes: each selection keeps its own results there."""
    if not tests:
        return ROOT
    work = ROOT / "mutation" / "work" / hashlib.sha1(json.dumps(tests).encode()).hexdigest()[:10]
    work.mkdir(parents=True, exist_ok=True)
    for name in ("nacktracker", "tests", "pyproject.toml"):
        if not (work / name).exists():
            (work / name).symlink_to(ROOT / name)
    (work / "selection.json").write_text(json.dumps(tests) + "\n")
    return work


def _not_killed(work: Path, module: str, survivors_only: bool = False) -> list[str]:
    """The mutants of ``module`` to run: all of them (mutmut's name pattern)
    before its first run; then those not run yet (mutmut resets the results of
    a function whose code changed), so that a resumed run goes on where it
    stopped instead of rerunning its survivors first; ``survivors_only``: those
    run and not killed (after tests were added for them)."""
    meta = work / "mutants" / (module + ".meta")
    if not meta.exists():
        return [module.removesuffix(".py").replace("/", ".") + ".*"]
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    if survivors_only:
        return sorted(name for name, code in codes.items() if code is not None and code not in KILLED)
    return sorted(name for name, code in codes.items() if code is None)


#: How often the results of a running mutmut are copied aside (seconds).
BACKUP_EVERY_S = 60


def _read_results(path: Path) -> str | None:
    """The text of a mutmut result file (``<module>.py.meta``, JSON), or None when missing or unreadable."""
    try:
        text = path.read_text()
        json.loads(text)
    except (OSError, ValueError):
        return None
    return text


def _back_up_results(work: Path, stop: threading.Event) -> None:
    """Until ``stop``: every BACKUP_EVERY_S, copy each readable result file to ``.meta.bak``. mutmut
    rewrites a module's whole result file after every mutant, so a run killed during that write leaves
    it empty, and every result of the module with it."""
    while not stop.wait(BACKUP_EVERY_S):
        for meta in (work / "mutants").rglob("*.py.meta"):
            text = _read_results(meta)
            if text is not None:
                tmp = meta.with_name(meta.name + ".bak.tmp")
                tmp.write_text(text)
                os.replace(tmp, meta.with_name(meta.name + ".bak"))


def _restore_results(work: Path) -> None:
    """Put back the last copy of each result file that is missing or unreadable (a killed run)."""
    for bak in (work / "mutants").rglob("*.py.meta.bak"):
        meta = bak.with_name(bak.name.removesuffix(".bak"))
        text = _read_results(bak)
        if text is not None and _read_results(meta) is None:
            meta.write_text(text)
            print(f"{meta.relative_to(work)}: missing or unreadable, restored from its copy of "
                  f"{time.ctime(bak.stat().st_mtime)}", file=sys.stderr)


def _stat(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` from field 3 (state) on: field k is at index k - 3."""
    return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()


def _worker_cpu_seconds(pid: int, root: int) -> float | None:
    """CPU time (user + system) of a mutmut worker (titled ``mutmut: <mutant>``) descending from process
    ``root``; None for any other process (another run's workers are left alone)."""
    try:
        if not (Path("/proc") / str(pid) / "cmdline").read_bytes().startswith(b"mutmut: "):
            return None
        fields = _stat(pid)
        ancestor = int(fields[1])  # field 4: the parent
        for _ in range(8):  # the runner, mutmut, its fork server: a few levels at most
            if ancestor in (root, 0, 1):
                break
            ancestor = int(_stat(ancestor)[1])
        if ancestor != root:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15
    except (OSError, ValueError, IndexError):
        return None


def _stop_loops(limit_s: float, root: int, stop: threading.Event) -> None:
    """Until ``stop``: send SIGXCPU, mutmut's own CPU-limit signal (so mutmut records a timeout, a kill),
    to each mutmut worker under process ``root`` past ``limit_s`` of CPU. mutmut's own limit is many
    times a mutant's traced test time (for a survivor of the index, about 1,450 s); ``--cpu-limit``
    takes a loop for what it is sooner."""
    while not stop.wait(5):
        for pid in (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()):
            cpu = _worker_cpu_seconds(pid, root)
            if cpu is not None and cpu > limit_s:
                try:
                    os.kill(pid, signal.SIGXCPU)
                except OSError:
                    continue
                print(f"--cpu-limit: stopped process {pid} after {cpu:.0f} s of CPU", file=sys.stderr)


def _run_mutmut(work: Path, args: argparse.Namespace, env: dict[str, str], names: list[str]) -> int:
    """One ``mutmut run`` of ``names`` in ``work`` (its result files backed up meanwhile, and its
    workers held to ``--cpu-limit``); its exit code."""
    runner = ([sys.executable, str(ROOT / "tools" / "mutmut_tests.py"), json.dumps(args.tests)]
              if args.tests else [sys.executable, "-m", "mutmut"])
    stop = threading.Event()
    with subprocess.Popen([*runner, "run", "--max-children", str(args.max_children), *names],
                          cwd=work, env=env) as proc:
        helpers = [threading.Thread(target=_back_up_results, args=(work, stop), daemon=True)]
        if args.cpu_limit and Path("/proc/self/stat").exists():
            helpers.append(threading.Thread(target=_stop_loops, args=(args.cpu_limit, proc.pid, stop), daemon=True))
        for helper in helpers:
            helper.start()
        try:
            return proc.wait()
        finally:
            stop.set()
            for helper in helpers:
                helper.join()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--module", action="append", default=[], metavar="PATH",
                    help="run (and report) the mutants of this module only, e.g. nacktracker/tracker.py; repeatable")
    ap.add_argument("--survivors", action="store_true",
                    help="with --module: run only the mutants that survived a run (after adding tests)")
    ap.add_argument("--mutant", action="append", default=[], metavar="NAME",
                    help="with --module: run only these mutants (mutmut's names, e.g. after a test was added for "
                         "them), not every survivor again; repeatable")
    ap.add_argument("--tests", type=shlex.split, metavar="'ARGS'",
                    help="the tests to run instead of [tool.mutmut]'s selection, one quoted string of pytest "
                         "arguments (e.g. 'tests/index/test_index.py --deselect ID'): the tests that own the modules' behaviour")
    ap.add_argument("--profile", default="mutate", choices=["mutate", "mutate-quick"],
                    help="hypothesis profile (tests/run_checks.py): mutate-quick runs a quarter of each test's "
                         "examples, a cheaper first pass that can only let more mutants survive; rerun its "
                         "survivors with --survivors on mutate")
    ap.add_argument("--owners", action="store_true",
                    help="each configured module against the tests that own it (OWNERS), in turn: what "
                         "`make mutate` runs")
    ap.add_argument("--cpu-limit", type=float, metavar="SECONDS",
                    help="stop a mutant's tests past this much CPU time (SIGXCPU: recorded as a timeout, a kill); "
                         "default: mutmut's own limit, many times the tests' traced time")
    ap.add_argument("--only-report", action="store_true", help="summarise the last run, run nothing")
    ap.add_argument("--out", default=str(ROOT / "mutation" / "latest.md"))
    args = ap.parse_args()
    if args.owners:
        return _owners(args)
    work = _workdir(args.tests)
    _restore_results(work)
    seconds = None
    if not args.only_report:
        env = {**os.environ, "NACKTRACKER_HYPOTHESIS": args.profile}
        started = time.monotonic()
        names = args.mutant or [name for m in args.module for name in _not_killed(work, m, args.survivors)]
        if args.module and not names:
            print("every mutant of those modules has run already (rerun the survivors with --survivors): "
                  "reporting the last results", file=sys.stderr)
        tried: set[str] = set()
        run_all = not args.module and not args.mutant  # the whole configured selection: mutmut's own default
        while names or run_all:
            run_all = False
            code = _run_mutmut(work, args, env, names)
            seconds = time.monotonic() - started
            if code != 0:
                print(f"mutmut run exited {code}", file=sys.stderr)
                return code
            # mutmut makes a changed module's mutants afresh when its run starts (resetting those of the
            # functions that changed): names read before it are then not all there is to run
            tried.update(names)
            names = [] if args.mutant or not args.module else \
                [name for m in args.module for name in _not_killed(work, m) if name not in tried]
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    survivors: list[tuple[str, str]] = []
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        module = str(meta.relative_to(work / "mutants"))[: -len(".meta")]
        if args.module and module not in args.module:
            continue
        data = json.loads(meta.read_text())
        for name, code in sorted(data["exit_code_by_key"].items()):
            kind = "killed" if code in KILLED else "survived" if code in SURVIVED else \
                "not checked" if code is None else "no tests" if code in (5, 33) else f"other ({code})"
            by_module[module][kind] += 1
            by_module[module]["timeout"] += code in TIMEOUTS
            if kind not in ("killed", "not checked"):
                survivors.append((module, name))
    if not by_module:
        print("no mutmut results under mutants/: run without --only-report first", file=sys.stderr)
        return 1
    lines = ["# Mutation testing: the last `make mutate`", "",
             f"Tests: {' '.join(args.tests) if args.tests else 'the configured selection ([tool.mutmut])'}.", ""]
    if seconds is not None:
        lines += [f"Run time: {seconds / 60:.1f} min with --max-children {args.max_children}, hypothesis profile "
                  f"{args.profile}; "
                  f"load average at the end: {Path('/proc/loadavg').read_text().split()[0]}.", ""]
    lines += ["| module | mutants | killed (of which timeouts) | survived | no tests | not checked | score |",
              "|---|---|---|---|---|---|---|"]
    total: Counter[str] = Counter()
    for module, c in sorted(by_module.items()):
        total.update(c)
        n = sum(c.values()) - c["timeout"]
        tested = n - c["not checked"]
        lines.append(f"| {module} | {n} | {c['killed']} ({c['timeout']}) | {c['survived']} | {c['no tests']} | "
                     f"{c['not checked']} | {c['killed'] / tested:.1%} |" if tested else f"| {module} | {n} | 0 | 0 | - | - | - |")
    n = sum(total.values()) - total["timeout"]
    lines.append(f"| **all** | {n} | {total['killed']} ({total['timeout']}) | {total['survived']} | {total['no tests']} | "
                 f"{total['not checked']} | {total['killed'] / max(n - total['not checked'], 1):.1%} |")
    lines += ["", "## Survivors (and mutants no test reaches)", ""]
    for _module, name in survivors:
        diff = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=work, capture_output=True, text=True).stdout.strip()
        lines += [f"### {name}", "", "```diff", diff, "```", ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[: lines.index("## Survivors (and mutants no test reaches)")]))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
