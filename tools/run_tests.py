"""`make test`'s pytest run: the Apache Pulsar tests and all the others side by side.

The tests on Apache Pulsar spend most of their time waiting on its JVM (start-up,
restarts, redelivery delays); the others keep a core busy (hypothesis, Spark,
pulsar-lite). Run one after the other they took ~16 minutes on 2 cores; side by
side, each in its own pytest session (its own brokers, its own temporary
folders), the run takes about as long as the longer half.

    python tools/run_tests.py [pytest arguments for both halves ...]

The Apache half writes to a log that is printed when it ends; the other half
prints as it goes. The exit status is the first non-zero of the two. Ctrl-C or
SIGTERM stops both (each pytest stops the brokers it started).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HALVES = {"apache": ["-m", "apache"], "others": ["-m", "not apache"]}


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
        log_path = Path(tmp) / "apache.log"
        procs: dict[str, subprocess.Popen[bytes]] = {}

        def stop(signum: int, _frame: object) -> None:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        with open(log_path, "wb") as log:
            procs["apache"] = subprocess.Popen([*pytest, *HALVES["apache"], "--basetemp", str(Path(tmp) / "a")],
                                               cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            procs["others"] = subprocess.Popen([*pytest, *HALVES["others"], "--basetemp", str(Path(tmp) / "o")],
                                               cwd=ROOT)
            codes = {name: _wait(proc) for name, proc in procs.items()}
        sys.stdout.write("\n-- the tests on Apache Pulsar (run side by side with the others) --\n")
        sys.stdout.write(log_path.read_text(errors="replace"))
    # pytest exits 5 when a half selects no test (e.g. NACKTRACKER_TEST_BROKERS=lite): not a failure
    failed = {name: code for name, code in codes.items() if code not in (0, 5)}
    print(f"\nmake test: {'FAILED ' + str(failed) if failed else 'passed'} "
          f"(both halves in {time.monotonic() - started:.0f} s)")
    return next(iter(failed.values()), 0)


def _wait(proc: subprocess.Popen[bytes]) -> int:
    while True:
        try:
            return proc.wait()
        except InterruptedError:  # a signal handler ran: keep waiting for the child to stop
            continue


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
