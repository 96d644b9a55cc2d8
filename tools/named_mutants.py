"""The hand-written mutants the test suite must catch, each against the tests that must catch it.

Each mutant is one textual change to the package (a promise broken on purpose); this applies it in
a throwaway copy of the checkout, runs the tests named for it there with hypothesis on its
derandomized ``ci`` profile (the profile ``make test`` runs), and checks that every one of them
fails. A mutant whose source line is no longer found is reported as such (the code moved: update
the mutant here), never passed.

    python tools/named_mutants.py [NAME ...]

Exit status 0 when every mutant is caught by each of its tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # node ids (or prefixes of parametrized ones); each must fail


MUTANTS = [
    Mutant("ceil rounding off by one", "nacktracker/precision.py",
           '0 if rounding == "floor" else width - 1,', '0 if rounding == "floor" else width,',
           ("tests/index/test_index.py::test_time_buckets_match_dict_and_heap",
            "tests/index/test_index.py::test_ceil_is_never_early_and_at_most_2_bits_late",
            "tests/tracker/test_fuzz.py::test_tracker_matches_a_dict_index_model")),
    Mutant("add_many skips its already-pending check", "nacktracker/index/buckets.py",
           "if keyed.intersect(ids.bits) or (", "if False and (",
           ("tests/index/test_index.py::test_bulk_add_many_of_ids_already_pending_counts_each_once",)),
    Mutant("uncapped retry backoff", "nacktracker/tracker.py",
           "wait = min(self._retry_max, self._retry_min * (1 << min(self._retry_streak, 30)))",
           "wait = self._retry_min * (1 << min(self._retry_streak, 30))",
           ("tests/tracker/test_faults.py::test_retry_backoff_is_capped",)),
    Mutant("an adapter's CancelledError not counted", "nacktracker/tracker.py",
           'exc: BaseException = asyncio.CancelledError("adapter raised CancelledError")\n',
           'exc: BaseException = asyncio.CancelledError("adapter raised CancelledError")\n'
           '            self._n["failures"] -= 1\n',
           ("tests/tracker/test_faults.py::test_an_adapter_raising_cancelled_error_is_retried_like_any_failure",)),
    Mutant("release 1 ms late", "nacktracker/consumer/core.py",
           "return self._precision.bucket(due_ms)", "return self._precision.bucket(due_ms) + 1",
           ("tests/consumer/test_consumer_core.py::test_delivery_core_keeps_its_promises",)),
    Mutant("release 5 ms early", "nacktracker/consumer/core.py",
           "return self._precision.bucket(due_ms)", "return self._precision.bucket(due_ms) - 5",
           ("tests/consumer/test_consumer_core.py::test_delivery_core_keeps_its_promises",)),
    Mutant("parked copies released 1 ms after their time", "nacktracker/consumer/core.py",
           "out = []\n        heap = self._release_heap\n        while heap and heap[0].at_ms <= now_ms:",
           "out = []\n        heap = self._release_heap\n        while heap and heap[0].at_ms < now_ms:",
           ("tests/consumer/test_consumer_core.py::test_delivery_core_keeps_its_promises",
            "tests/consumer/test_consumer_core.py::test_a_parked_copy_is_released_at_its_bucket_time_with_coarse_buckets")),
    Mutant("a copy surfaces up to 5 ms before its time", "nacktracker/consumer/core.py",
           "if now_ms >= release_ms:", "if now_ms + 5 >= release_ms:",
           ("tests/consumer/test_consumer_core.py::test_delivery_core_keeps_its_promises",)),
    Mutant("close(timeout=) ignored", "nacktracker/tracker.py",
           "await asyncio.wait({sending}, timeout=timeout)", "await asyncio.wait({sending}, timeout=None)",
           ("tests/tracker/test_faults.py::test_close_timeout_bounds_the_wait_for_a_hung_adapter",)),
]


def check(mutant: Mutant, workdir: Path) -> tuple[bool, str]:
    """Apply ``mutant`` in a fresh copy under ``workdir``, run its tests; (caught by each, what happened)."""
    copy = workdir / re.sub(r"\W+", "_", mutant.name)
    for part in ("nacktracker", "tests"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__", "target"))
    shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
    target = copy / mutant.path
    source = target.read_text()
    if source.count(mutant.old) != 1:
        return False, f"source not found once in {mutant.path} (found {source.count(mutant.old)}): update the mutant"
    target.write_text(source.replace(mutant.old, mutant.new))
    env = {**os.environ, "NACKTRACKER_HYPOTHESIS": "ci", "PYTHONPATH": str(copy)}
    where = subprocess.run([sys.executable, "-c", "import nacktracker; print(nacktracker.__file__)"],
                           cwd=copy, env=env, capture_output=True, text=True).stdout.strip()
    if not where.startswith(str(copy)):
        return False, f"the copy's package is not the one imported ({where})"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
                           *{t.split("[")[0] for t in mutant.tests}],
                          cwd=copy, env=env, capture_output=True, text=True)
    failed = re.findall(r"^FAILED (\S+)", proc.stdout, re.M)
    missed = [t for t in mutant.tests if not any(f == t or f.startswith((t + "[", t + "::")) for f in failed)]
    if proc.returncode != 1 or missed:
        tail = "\n".join(proc.stdout.strip().splitlines()[-5:])
        return False, f"pytest exit {proc.returncode}; not failed: {missed or '-'}\n{tail}"
    return True, f"{len(failed)} failed: " + ", ".join(sorted({f.split('[')[0] for f in failed}))


def main(argv: list[str]) -> int:
    chosen = [m for m in MUTANTS if not argv or m.name in argv]
    ok = True
    with tempfile.TemporaryDirectory(prefix="named-mutants-") as tmp:
        for mutant in chosen:
            started = time.monotonic()
            caught, what = check(mutant, Path(tmp))
            ok &= caught
            print(f"{'CAUGHT' if caught else 'MISSED'} {mutant.name} ({time.monotonic() - started:.0f} s): {what}",
                  flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
