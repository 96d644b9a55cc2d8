"""Without an optional dependency, the error is one line naming the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from nacktracker._extras import MissingExtraError, explain, require


def run_without(modules: list[str], code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where ``modules`` cannot be imported."""
    block = "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    return subprocess.run([sys.executable, "-c", "import sys\n" + block + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", ["TrackedConsumer", "subscribe", "ReceiveTimeout", "ConsumerClosed"])
def test_the_pulsar_layer_without_pulsar_client_names_the_extra(name):
    proc = run_without(["pulsar", "_pulsar"], f"""
        import nacktracker
        try:
            nacktracker.{name}
        except ImportError as e:
            print(type(e).__name__, e.extra, e)
        """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("MissingExtraError pulsar ")
    assert f"nacktracker.{name} needs the 'pulsar' extra" in proc.stdout
    assert "pip install '.[pulsar]' in the nacktracker checkout" in proc.stdout and proc.stdout.count("\n") == 1


def test_the_core_works_without_pulsar_client():
    proc = run_without(["pulsar", "_pulsar", "pulsar_lite"], """
        import asyncio
        from nacktracker import NegativeAcksTracker, MessageKey, TimeBucketIndex
        from nacktracker.adapters import MemoryAdapter

        async def main():
            adapter = MemoryAdapter()
            async with NegativeAcksTracker(adapter, delay_ms=5, precision_bits=0) as t:
                t.add(MessageKey(1, 2))
                await adapter.wait_for(1)
            print(adapter.redelivered)

        asyncio.run(main())
        """)
    assert proc.returncode == 0, proc.stderr
    assert "MessageKey(ledger_id=1, entry_id=2" in proc.stdout


def test_the_demo_without_the_embedded_broker_names_the_demo_extra():
    proc = run_without(["pulsar_lite"], """
        import os, sys
        os.environ.pop("PULSAR_URL", None)
        from nacktracker.cli import main
        sys.exit(main(["demo", "--quick"]))
        """)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "pip install '.[demo]' in the nacktracker checkout" in proc.stderr


def test_require_translates_only_a_missing_module():
    with pytest.raises(MissingExtraError, match=r"feature needs the 'otel' extra"):
        require("opentelemetry_nonexistent_xyz", "otel", "feature")
    err = explain(ModuleNotFoundError("x", name="somewhere_else"), "feature")
    assert not isinstance(err, MissingExtraError)
    assert isinstance(MissingExtraError("f", "pulsar", "pulsar"), ModuleNotFoundError)


def imported_modules(path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def test_the_rooms_of_this_surface_import_only_what_they_may():
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[1] / "nacktracker"
    # metrics: the OpenTelemetry API only (the application owns the SDK and exporters)
    assert {m for m in imported_modules(pkg / "metrics.py") if m.startswith("opentelemetry")} <= {
        "opentelemetry.metrics"}
    # rendering and the shared harness know nothing of Pulsar; the CLI loads it only on `demo`
    for name in ("demo/table.py", "demo/measure.py", "_extras.py", "cli.py"):
        assert not {m for m in imported_modules(pkg / name) if m.split(".")[0] in ("pulsar", "_pulsar")}, name
