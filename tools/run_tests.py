"""`make test`'s pytest run: four pytest sessions side by side.

* ``apache``: the tests on the session's Apache Pulsar. They spend most of their time waiting
  (redelivery delays, its JVM).
* ``apache-own``: the tests on Apache Pulsar that start brokers of their own (restarts, kills,
  the harness's own tests): most of their time is JVM starts. It starts when ``others`` ends.
* ``spark``: the Spark and other slow tests (``-m "spark or slow"``): JVM starts, Spark jobs,
  benchmarks' quick runs, wheels built.
* ``others``: everything else (hypothesis, pulsar-lite, the consumer, docs).

The broker sessions mostly wait (on timers and JVMs); the Spark session runs at the lowest CPU
priority (``nice`` 19), the JVM starts of ``apache-own`` at ``nice`` 10, so they fill what the
others leave idle and yield the CPU to their millisecond timing tests.
Side by side the run takes about as long as its longest session (each prints its own time). Each
session has its own brokers, Spark session and temporary folders.

    python tools/run_tests.py [pytest arguments for every session ...]

``others`` prints as it goes; the others write to logs printed when all have ended. The exit
status is the first non-zero of them, with one exception: a session whose only failures are tests
marked ``timing`` (they assert lateness in milliseconds, and two cores shared by four sessions can
stall a thread for tens of them) has those tests run again, alone, once every session has ended;
it passes if they all pass then. The first failures are printed in its log all the same, and the
summary names every test that needed the second run. Ctrl-C or SIGTERM stops all (each pytest stops the
brokers it started).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
#: Where each session notes its failures (tests/conftest.py writes it): one JSON line per failure.
FAILURES_ENV = "NACKTRACKER_TEST_FAILURES"
SESSIONS = {"apache": ["-m", "apache and not own_broker"], "apache-own": ["-m", "apache and own_broker"],
            "spark": ["-m", "not apache and (spark or slow)"], "others": ["-m", "not apache and not spark and not slow"]}
#: The session printed as it goes (the others' logs follow when all have ended).
LIVE = "others"
#: Sessions started when another ends (not beside it): the JVM starts of ``apache-own`` would share the CPU
#: with the millisecond timing tests of ``others`` (pulsar-lite) otherwise.
AFTER = {"apache-own": "others"}
#: Sessions run at a lower CPU priority: throughput work beside the timing tests of the others.
NICE = {"spark": 19, "apache-own": 10}


def main(argv: list[str]) -> int:
    started = time.monotonic()
    if os.environ.get("NACKTRACKER_TEST_REQUIRE", "") not in ("", "0"):
        # the suite's own check of what it needs (tests/run_checks.py), run once
        spec = importlib.util.spec_from_file_location("run_checks", ROOT / "tests" / "run_checks.py")
        assert spec is not None and spec.loader is not None
        run_checks = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(run_checks)
        problems = run_checks.missing_dependencies()
        if problems:  # one line, as pytest would print it (and not once per half)
            print("ERROR: make test cannot run: " + "; ".join(problems), file=sys.stderr)
            return 4
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *argv]
    with tempfile.TemporaryDirectory(prefix="nacktracker-tests-") as tmp:
        procs: dict[str, subprocess.Popen[bytes]] = {}

        stopping = False

        def stop(signum: int, _frame: object) -> None:
            nonlocal stopping
            stopping = True  # no session starts after this
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        logs = {name: Path(tmp) / f"{name}.log" for name in SESSIONS if name != LIVE}

        failures = {name: Path(tmp) / f"{name}.failures" for name in SESSIONS}

        def start(name: str) -> None:
            out = open(logs[name], "wb") if name in logs else None
            try:
                nice = NICE.get(name, 0)
                procs[name] = subprocess.Popen([*pytest, *SESSIONS[name], "--basetemp", str(Path(tmp) / name)],
                                               cwd=ROOT, stdout=out, stderr=subprocess.STDOUT if out else None,
                                               env={**os.environ, FAILURES_ENV: str(failures[name])},
                                               preexec_fn=functools.partial(os.nice, nice) if nice else None)
            finally:
                if out is not None:
                    out.close()  # the child holds its own copy

        codes: dict[str, int] = {}
        for name in SESSIONS:
            if name not in AFTER:
                start(name)
        for first, then in ((AFTER[name], name) for name in AFTER):
            codes[first] = _wait(procs[first])
            if not stopping:
                start(then)
        codes.update({name: _wait(proc) for name, proc in procs.items() if name not in codes})
        for name, log_path in logs.items():
            sys.stdout.write(f"\n-- the {name} session (run side by side with the others) --\n")
            sys.stdout.write(log_path.read_text(errors="replace"))
        # pytest exits 5 when a session selects no test (e.g. NACKTRACKER_TEST_BROKERS=lite): not a failure
        failed = {name: code for name, code in codes.items() if code not in (0, 5)}
        again = None if stopping else timing_only(failed, failures)
        if again:
            sys.stdout.write(f"\n-- {len(again)} timing tests failed beside the other sessions: run again alone --\n")
            sys.stdout.flush()
            if _wait(subprocess.Popen([*pytest, *again, "--basetemp", str(Path(tmp) / "again")], cwd=ROOT)) == 0:
                print("make test: passed when run again alone: " + ", ".join(again))
                failed = {}
    print(f"\nmake test: {'FAILED ' + str(failed) if failed else 'passed'} "
          f"(all sessions in {time.monotonic() - started:.0f} s)")
    return next(iter(failed.values()), 0)


def timing_only(failed: dict[str, int], failures: dict[str, Path]) -> Optional[list[str]]:
    """The tests to run again alone: those that failed in the ``failed`` sessions, if every one is marked
    ``timing`` and failed in its call (not its set-up or tear-down) and nothing else failed there (a
    session that failed otherwise -- exit status other than 1, a collection error -- is not run
    again). None otherwise."""
    nodeids: list[str] = []
    for name, code in failed.items():
        path = failures[name]
        if code != 1 or not path.exists():
            return None
        for line in path.read_text(encoding="utf-8").splitlines():
            failure = json.loads(line)
            if not failure["timing"] or failure["when"] != "call":
                return None
            nodeids.append(failure["nodeid"])
    return sorted(set(nodeids)) or None


def _wait(proc: subprocess.Popen[bytes]) -> int:
    while True:
        try:
            return proc.wait()
        except InterruptedError:  # a signal handler ran: keep waiting for the child to stop
            continue


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
