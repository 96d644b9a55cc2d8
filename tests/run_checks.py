"""How the suite runs, apart from what it tests: hypothesis profiles, per-test
timeouts, and the dependencies ``make test`` requires (conftest.py imports the
hooks from here).

Hypothesis profiles, chosen by ``$NACKTRACKER_HYPOTHESIS`` (default ``ci``):

* ``ci``: derandomized: the same examples on every run, so a mutant a property
  test kills today it kills on every run (CI and ``make test`` use it);
* ``dev``: the same example counts with fresh random seeds (and the example
  database), to look for new failures while working;
* ``mutate``: ``ci`` without shrinking, for ``make mutate`` (tools/mutate.py):
  the same examples in the same order, so a mutant fails on the same example as
  under ``ci``; only the search for a smaller failing example (seconds per
  killed mutant, and reported to nobody) is skipped;
* ``mutate-quick``: ``mutate`` with ``quick``'s example counts, for a first
  pass of ``make mutate`` over modules every state machine reaches (the
  index): fewer examples can only let more mutants survive, never kill one
  that the code does not fail on; ``tools/mutate.py --survivors`` reruns the
  survivors on ``mutate``;
* ``thorough``: random, and every test's example count (its own
  ``@settings(max_examples=...)`` too) times ``$NACKTRACKER_HYPOTHESIS_SCALE``
  (default 10), for long local runs;
* ``quick``: derandomized like ``ci``, every test's example count a quarter
  (at least 10): ``make check``, the inner loop (``make test`` runs ``ci``).

Timeouts (pytest-timeout): ``timeout`` in pyproject.toml is every test's
default; tests known to be long get theirs from :data:`LONG_TESTS` (or their
own ``@pytest.mark.timeout``). A test past its timeout fails with a stack dump
of where it hung, and the run goes on.

Required dependencies: with ``NACKTRACKER_TEST_REQUIRE=1`` (``make test`` sets
it) a missing dependency of the test run is an error, not a skip: Java that
does not start, PySpark, pulsar-client, pulsar-lite, OpenTelemetry's SDK; a
broker fixture that cannot start stops the run. One line says why.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, Phase, settings

PROFILE_ENV = "NACKTRACKER_HYPOTHESIS"
SCALE_ENV = "NACKTRACKER_HYPOTHESIS_SCALE"
REQUIRE_ENV = "NACKTRACKER_TEST_REQUIRE"

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("mutate", settings.get_profile("ci"),
                          phases=[Phase.explicit, Phase.reuse, Phase.generate])
settings.register_profile("mutate-quick", settings.get_profile("mutate"))
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("quick", derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
#: How each profile scales a test's own example count (``@settings(max_examples=...)``).
SCALES = {"thorough": lambda n: n * int(os.environ.get(SCALE_ENV, "10")), "quick": lambda n: max(10, n // 4),
          "mutate-quick": lambda n: max(10, n // 4)}
PROFILE = os.environ.get(PROFILE_ENV, "ci")
settings.load_profile(PROFILE)  # before the test modules are imported: their @settings inherit it

#: Tests known to take longer than the default timeout, by node id prefix (seconds; measured
#: with ``pytest --durations`` on a 2-core machine under load, with about 3x headroom).
LONG_TESTS: dict[str, int] = {
    "tests/pipeline/test_pipeline_cluster.py": 900,
    "tests/pipeline/test_pipeline.py": 600,
    "tests/pipeline/test_pipeline_caches.py": 600,
    "tests/pipeline/test_pipeline_ship.py": 600,
    "tests/test_bench.py": 600,
    "tests/brokers/test_soak.py": 600,
    "tests/test_demo.py": 300,
    "tests/brokers/test_reliability.py": 300,
    "tests/index/test_index.py::test_nbytes_within_25_percent_of_rss_growth": 300,
    "tests/brokers/test_testing_apache.py": 600,
}

#: Tests with this marker get at least this timeout: the first test on an Apache Pulsar broker
#: starts its JVM (ApacheBroker's own startup_timeout is 120 s) inside its own timeout.
MARKER_TIMEOUTS: dict[str, int] = {"apache": 600}

#: What ``make test`` needs beyond the package: a module to import, or Java to start.
REQUIRED_MODULES = {
    "pulsar": "pulsar-client (the `pulsar` extra)",
    "pulsar_lite": "pulsar-lite (the embedded test broker)",
    "pyspark": "PySpark (the `spark` extra)",
    "opentelemetry.sdk.metrics": "opentelemetry-sdk (the `test` extra)",
    "fastavro": "fastavro (pulsar-client's Avro schemas, the `test` extra)",
}


def _java_problem() -> str | None:
    java = shutil.which("java")
    if java is None and os.environ.get("JAVA_HOME"):
        java = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    if java is None or not os.path.exists(java):
        return "Java is not installed (no `java` on PATH or in $JAVA_HOME)"
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Java cannot start ({java}: {exc})"
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"Java cannot start ({java} -version exited {proc.returncode}: {last[0]})"
    return None


def missing_dependencies() -> list[str]:
    """What the full test run needs and this machine lacks, one phrase each."""
    problems = []
    for module, what in REQUIRED_MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            problems.append(f"{what} is not installed")
    java = _java_problem()
    if java:
        problems.append(java)
    if shutil.which("mvn") is None:  # the Apache Pulsar test broker's class path comes from Maven Central
        problems.append("Maven is not installed (no `mvn` on PATH: Apache Pulsar's test broker is resolved with it)")
    return problems


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def pytest_configure(config):
    config.addinivalue_line("markers", "timeout(seconds): this test's own timeout (pytest-timeout)")
    if required():
        problems = missing_dependencies()
        if problems:  # pytest prints it as one line: "ERROR: make test cannot run: ..." (exit status 4)
            raise pytest.UsageError("make test cannot run: " + "; ".join(problems))
        config.pluginmanager.register(BrokerGuard(), "nacktracker-broker-guard")


def pytest_report_header(config):
    return [f"hypothesis profile: {PROFILE} (${PROFILE_ENV}); dependencies required: {required()} (${REQUIRE_ENV})"]


def apply_run_settings(items) -> None:
    """Timeouts of known-long tests, and ``thorough``'s example counts (called from
    conftest's ``pytest_collection_modifyitems``)."""
    for item in items:
        if item.get_closest_marker("timeout") is None:
            seconds = max([s for prefix, s in LONG_TESTS.items() if item.nodeid.startswith(prefix)]
                          + [s for name, s in MARKER_TIMEOUTS.items() if item.get_closest_marker(name)], default=None)
            if seconds is not None:
                item.add_marker(pytest.mark.timeout(seconds))
        if PROFILE in SCALES:
            _scale_examples(item, SCALES[PROFILE])


def _scale_examples(item, scale) -> None:
    """``thorough``, ``quick``: scale the test's own example count (a hypothesis test's
    settings live on its function; a state machine's on its TestCase class)."""
    fn = getattr(item, "obj", None)
    inner = getattr(fn, "hypothesis", None)
    target = getattr(inner, "inner_test", None) and fn
    if target is not None and hasattr(target, "_hypothesis_internal_use_settings"):
        # scaled from its own count once: mutmut collects the same module objects several times
        own = target.__dict__.setdefault("_nacktracker_own_settings", target._hypothesis_internal_use_settings)
        target._hypothesis_internal_use_settings = settings(own, max_examples=scale(own.max_examples))
    cls = getattr(item, "cls", None)
    own = getattr(cls, "settings", None)
    if isinstance(own, settings) and not getattr(cls, "_nacktracker_scaled", False):
        cls.settings = settings(own, max_examples=scale(own.max_examples))
        cls._nacktracker_scaled = True


class BrokerGuard:
    """With dependencies required, a session's broker that cannot start stops the run with one
    line (not the same traceback as an error in every test that needs it; the broker fixtures
    never skip). A plugin, not a conftest hook: conftest hooks do not see the setup of
    session-scoped fixtures."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        outcome = yield
        if outcome.excinfo is not None and fixturedef.scope == "session" and "broker" in fixturedef.argname:
            exc = outcome.excinfo[1]
            if not isinstance(exc, (pytest.exit.Exception, pytest.skip.Exception)):
                pytest.exit(f"make test cannot run: the broker of fixture {fixturedef.argname!r} cannot start: "
                            f"{type(exc).__name__}: {exc}", returncode=3)
