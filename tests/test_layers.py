"""The layer rules of ARCHITECTURE.md, checked on the source (AST), per module:

* pure modules (the index, backoff, keys, checks, the consumer's delivery
  core) import no pulsar, no asyncio, no clock, no I/O;
* only the adapters' Pulsar module, the consumer's Pulsar shell and the
  dead-letter publisher (plus the demo, its scenarios and the embedded-broker
  helper, which drive a real broker) import pulsar; importing the package and the delivery core loads no pulsar-client;
* only the tracker and the clock read time; the exceptions each say why
  (a snapshot's age is wall time across processes; the Pulsar adapter spaces
  its bursts and measures its path on the client's side of the boundary);
  the consumer package reads its clock only through the tracker.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "nacktracker"
MODULES = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py"))

PURE = {*(m for m in MODULES if m.startswith("index/")),  # the index package, every module of it
        "backoff.py", "keys.py", "_checks.py", "precision.py", "consumer/core.py", "consumer/state.py",
        "adapters/local.py", "consumer/local.py",  # local redelivery: bookkeeping, no pulsar, no clock
        "consumer/letters/java.py", "consumer/counts.py",  # retry-letter names and properties; own delivery counts
        "consumer/chunks.py",  # which entries a request for a chunked message names
        "consumer/deadlines.py"}  # the timer heaps' one structure
IMPURE_IMPORTS = {"pulsar", "_pulsar", "asyncio", "time", "os", "socket", "threading", "subprocess", "io"}

PULSAR_IMPORTERS = {
    "adapters/pulsar.py": "the adapter: the one redelivery path into the client",
    "adapters/client_close.py": "the client's close, through its blocking close: no callback outlives it",
    "adapters/pulsar_layout.py": "the one module that knows pulsar-client's private layout",
    "consumer/shell.py": "the consumer's Pulsar shell",
    "sync.py": "the synchronous face: takes the sync pulsar.Client and hands out its Messages",
    "consumer/direct.py": "the shell's receives and acks straight into the client's C++ consumer",
    "consumer/subscription.py": "subscribe() makes the client's consumer",
    "consumer/ids.py": "keys of pulsar Messages and MessageIds, seek targets",
    "errors.py": "makes the exceptions that are also the client's, on first use (importing it loads no pulsar)",
    "consumer/letters/publisher.py": "publishes dead letters through the client's producers",
    "consumer/failures.py": "retry letters and terminal dead letters take received pulsar Messages",
    "testing/lite.py": "probes the pulsar-lite broker it starts",
    "testing/apache.py": "probes the Apache Pulsar broker it starts",
    "testing/owned.py": "a broker's readiness probe: a real client creates a producer",
}
#: The demo and its scenarios (bench/ runs them too) drive a real broker beside the plain client,
#: and measure it.
DRIVERS = ("demo/",)

TIME_READERS = {
    "tracker.py": "the tracker knows time (event timestamps)",
    "clock.py": "the clocks themselves",
    "snapshot.py": "a snapshot's age is wall time across processes",
    "consumer/persist.py": "a snapshot's age is wall time across processes",
    "adapters/pulsar.py": "burst spacing and path latency, on the client's side of the boundary",
    "adapters/memory.py": "the test adapter stamps its calls",
    "events.py": "event records carry wall timestamps",
    "testing/lite.py": "waits for the pulsar-lite broker to start",
    "testing/apache.py": "waits for the Apache Pulsar broker to start, times Maven",
    "testing/owned.py": "stamps a broker's log at each launch",
}
TIME_FUNCS = {"time", "monotonic", "perf_counter", "time_ns", "monotonic_ns", "perf_counter_ns"}


def tree(module: str) -> ast.Module:
    return ast.parse((ROOT / module).read_text(), module)


def imported(module: str) -> set[str]:
    """Top-level names of every module imported (absolute), anywhere in the file."""
    names = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def relative_imports(module: str) -> set[str]:
    names = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.ImportFrom) and node.level:
            names.add((node.module or "").split(".")[-1])
            names |= {alias.name for alias in node.names}
    return names


def time_reads(module: str) -> list[str]:
    """``time.monotonic()``-style calls and ``.time()`` calls (loop.time())."""
    found = []
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, owner = node.func.attr, node.func.value
            if attr in TIME_FUNCS and isinstance(owner, ast.Name) and owner.id == "time":
                found.append(f"time.{attr}() line {node.lineno}")
            elif attr == "time" and not node.args:
                found.append(f".time() line {node.lineno}")
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            found.append(f"from time import … line {node.lineno}")
    return found


@pytest.mark.parametrize("module", sorted(PURE))
def test_pure_modules_import_no_pulsar_asyncio_clock_or_io(module):
    assert not imported(module) & IMPURE_IMPORTS, imported(module) & IMPURE_IMPORTS
    assert "clock" not in relative_imports(module)
    calls = {n.func.id for n in ast.walk(tree(module)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "open" not in calls and "print" not in calls


@pytest.mark.parametrize("module", MODULES)
def test_only_the_pulsar_layers_import_pulsar(module):
    uses = imported(module) & {"pulsar", "_pulsar"}
    assert not uses or module in PULSAR_IMPORTERS or module.startswith(DRIVERS), f"{module} imports {uses}"


@pytest.mark.parametrize("module", MODULES)
def test_only_the_tracker_and_clock_read_time(module):
    if module in TIME_READERS or module.startswith(("pipeline/",) + DRIVERS):  # offline jobs, measurements
        return
    assert not time_reads(module), f"{module} reads time: {time_reads(module)}"


def test_the_consumer_reads_time_only_through_the_trackers_clock():
    for module in ("consumer/shell.py", "consumer/core.py", "consumer/options.py", "consumer/subscription.py", "consumer/ids.py", "consumer/letters/publisher.py",
                   "consumer/pump.py", "consumer/release.py", "consumer/local.py", "consumer/failures.py",
                   "consumer/ack_timeout.py", "consumer/letters/retry.py", "consumer/counts.py"):
        source = (ROOT / module).read_text()
        assert "get_running_loop().time" not in source and "loop.time" not in source, module
        assert "call_later" not in source and ".call_at(" not in source.replace("clock.call_at(", ""), module


def test_importing_the_package_and_the_core_loads_no_pulsar_client():
    code = ("import sys, nacktracker, nacktracker.consumer.core, nacktracker.adapters; "
            "bad = [m for m in ('pulsar', '_pulsar') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT.parent)


#: The rooms above the consumer (they use it); every other module is below it and never imports it.
ABOVE_CONSUMER = {"__init__.py": "the package's front: re-exports subscribe and TrackedConsumer, loaded on first use",
                  "sync.py": "the synchronous face over the consumer's wiring",
                  "cli.py": "the command line runs the demo", "metrics.py": "instruments a consumer"}
ABOVE_PREFIXES = ("consumer/", "demo/", "pipeline/")


def consumer_imports(module: str) -> list[str]:
    """Every import of nacktracker.consumer in ``module``: relative or absolute, at the top or inside a
    function, and ``importlib.import_module`` of a name with ``consumer`` in it."""
    depth = module.count("/")
    found = []
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.ImportFrom):
            absolute = (node.module or "") if not node.level else (
                "nacktracker." + ".".join([*module.split("/")[:-1][:max(0, depth - node.level + 1)],
                                           *([node.module] if node.module else [])]))
            names = [f"{absolute}.{alias.name}" for alias in node.names]
            if any(n.startswith("nacktracker.consumer") or ".consumer." in n + "." for n in [absolute, *names]):
                found.append(f"line {node.lineno}")
        elif isinstance(node, ast.Import):
            if any(a.name.startswith("nacktracker.consumer") for a in node.names):
                found.append(f"line {node.lineno}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "nacktracker.consumer" in node.value \
                and " " not in node.value and ":" not in node.value:
            found.append(f"line {node.lineno} ({node.value})")  # a dotted name handed to importlib
    return found


@pytest.mark.parametrize("module", [m for m in MODULES if m not in ABOVE_CONSUMER and not m.startswith(ABOVE_PREFIXES)])
def test_nothing_below_the_consumer_imports_it(module):
    assert not consumer_imports(module), f"{module} imports nacktracker.consumer: {consumer_imports(module)}"


def test_the_consumer_import_check_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "adapters").mkdir()
    (tmp_path / "adapters" / "x.py").write_text("def f():\n    from ..consumer import errors\n")
    (tmp_path / "y.py").write_text("from .consumer.shell import TrackedConsumer\n")
    (tmp_path / "z.py").write_text("from . import consumer\n")
    (tmp_path / "w.py").write_text("from .errors import ConsumerClosed\n")
    assert consumer_imports("adapters/x.py") and consumer_imports("y.py") and consumer_imports("z.py")
    assert not consumer_imports("w.py")


#: The consumer's modules that may name TrackedConsumer: the class itself, and the function that makes it.
NAMES_THE_CONSUMER = {"consumer/shell.py": "TrackedConsumer itself", "consumer/subscription.py": "subscribe() makes one",
                      "consumer/__init__.py": "re-exports it"}


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("consumer/") and m not in NAMES_THE_CONSUMER])
def test_no_part_of_the_consumer_takes_or_names_the_consumer(module):
    """Each collaborator gets what it needs as explicit arguments (the core, the tracker, a put
    function, the keys, the letters), never the consumer: no ``owner`` parameter, no TrackedConsumer."""
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Name):
            assert node.id != "TrackedConsumer", f"{module} line {node.lineno} names TrackedConsumer"
        elif isinstance(node, ast.arg):
            assert node.arg != "owner", f"{module} line {node.lineno} takes an owner"


def test_few_reads_or_writes_of_another_objects_private_names():
    """``x._y`` with ``x`` not ``self`` (or ``getattr(x, "_y")``, ...): none into nacktracker's own objects,
    at most 12 in the package in all (what tools/private_reaches.py counts: pulsar-client's, PySpark's and
    asyncio's internals, where they have no public way)."""
    from tools import private_reaches  # (the checkout's root is on the tests' path: pyproject's pythonpath)

    found = private_reaches.reaches(ROOT)
    assert [r for r in found if r[3] != "third-party"] == []
    assert len(found) <= 12, found


def test_pulsar_clients_private_names_are_reached_in_one_module():
    """pulsar-client's wrappers' private names (``_client``, ``_consumer``, ``_schema``, ``_message``,
    ``_msg_id``) are read or written in adapters/pulsar_layout.py only: a read of each wrapper's C++ object and
    schema, and the writes that make a ``pulsar.asyncio.Client`` and a ``pulsar.Message``."""
    from tools import private_reaches

    names = {"_client", "_consumer", "_schema", "_message", "_msg_id"}
    layout = "nacktracker/adapters/pulsar_layout.py"
    found = [r for r in private_reaches.reaches(ROOT) if r[3] == "third-party" and any(n in r[2] for n in names)]
    assert all(module == layout for module, *_ in found), [r for r in found if r[0] != layout]
    assert len(found) <= 7, found
