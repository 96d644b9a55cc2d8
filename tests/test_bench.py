"""Smoke test of the benchmark suite: `nacktracker bench --quick` end to end."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_quick_writes_results(tmp_path):
    out = tmp_path / "bench"
    subprocess.run([sys.executable, "-m", "nacktracker.cli", "bench", "--quick", "--out", str(out),
                    "--skip", "pulsar,consume,soak,snapshot,dedup,traffic,grid"],  # grid: tests/index/test_index_grid.py
                   check=True, cwd=ROOT, capture_output=True, text=True, timeout=300)
    results = json.loads((out / "results.json").read_text())
    for name in ("results.json", "RESULTS.md", "memory.png", "precision.png"):
        assert (out / name).stat().st_size > 0, name
    assert results["machine"]["cores"] >= 1 and results["duration_s"] > 0
    mem = {(r["index"], r["workload"], r["x"], r["y"]): r for r in results["memory"]}
    tb, d = mem[("TimeBucketIndex", "sequential", 8, 10)], mem[("DictIndex", "sequential", 8, 10)]
    assert tb["nbytes_per_msg"] * 100 < d["nbytes_per_msg"]
    ops = {(r["op"], r["index"]): r for r in results["throughput"]["rows"]}
    assert all(r["runs"] >= 3 and r["min"] <= r["median"] <= r["max"] for r in ops.values())
    # timing targets are the benchmark's to check, not a unit test's: only the shape here
    assert {r["bits"] for r in results["precision"]["starvation"]} == {0, 8}
    md = (out / "RESULTS.md").read_text()
    assert "`python -m bench.memory" in md and "`python -m bench.throughput --quick`" in md


# -- the package's shape: `python -m bench.<name>`, no path tricks, no import cycle -----

def _bench_imports() -> dict[str, set[str]]:
    """Each module of bench/ (dotted) -> the bench modules it imports, anywhere in the file."""
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (ROOT / "bench").rglob("*.py")}
    graph = {}
    for name, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.split(".")[0] == "bench"}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "bench":
                subs = {f"{node.module}.{a.name}" for a in node.names} & files.keys()
                found |= subs or {node.module}
        graph[name] = found - {name}
    return graph


def test_bench_is_a_package_without_path_tricks():
    needle = "sys.path." + "insert"  # spelled apart: this file is scanned too
    for folder in ("bench", "tests", "nacktracker", "examples", "tools"):
        for path in (ROOT / folder).rglob("*.py"):
            assert needle not in path.read_text(), path.relative_to(ROOT)
    siblings = {p.stem for p in (ROOT / "bench").glob("*.py")} - {"__init__"}
    for path in (ROOT / "bench").rglob("*.py"):  # a sibling imported by its bare name only worked with sys.path
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            assert not {n.split(".")[0] for n in names if n} & siblings, (path.relative_to(ROOT), names)


def test_bench_has_no_import_cycle():
    graph = _bench_imports()
    assert graph["bench.index_grid"] >= {"bench.index_grid_report"}  # the check sees function-local imports too

    def visit(name, path):
        assert name not in path, " -> ".join([*path[path.index(name):], name])
        for nxt in graph.get(name, ()):
            visit(nxt, [*path, name])

    for name in graph:
        visit(name, [])


# -- the traffic benchmark (bench/traffic.py) ----------------------------------------

from bench import traffic_ledger  # noqa: E402  (the checkout's root is on pytest's pythonpath)
from bench.traffic_ledger import Fate, Ledger, Plan, Verdict  # noqa: E402


def test_traffic_plan_is_a_pure_function_of_message_and_attempt():
    plan = Plan(seed=3)
    decisions = [plan.nack(n, k) for n in range(5000) for k in range(4)]
    assert decisions == [Plan(seed=3).nack(n, k) for n in range(5000) for k in range(4)]
    delays = [d for d in decisions if d is not None]
    assert all(plan.min_delay_ms <= d <= plan.max_delay_ms for d in delays)
    assert all(plan.nack(n, plan.max_nacks) is None for n in range(1000))  # at most max_nacks per message
    first = sum(plan.nack(n, 0) is not None for n in range(5000)) / 5000
    assert abs(first - plan.nack_first) < 0.02
    holds = [plan.hold_s(n, 0) for n in range(5000)]
    assert 0 <= min(holds) and max(holds) <= plan.slow_hold_ms / 1000


def test_traffic_ledger_counts_each_measure_as_its_docstring_defines_it():
    ledger = Ledger(sent=4, published={0: (1, 0, 0), 1: (1, 0, 1), 2: (1, 0, 2), 3: (1, 1, -1)})
    assert ledger.delivered(0, (1, 0, 0), 0.0, since_publish_ms=7.0) is Verdict.PROCESS
    assert ledger.delivered(0, (1, 0, 0), 1.0) is Verdict.IGNORE  # a copy while a worker holds it
    ledger.nacked(0, now_ms=10.0, delay_ms=100)
    assert ledger.delivered(0, (1, 0, 0), 104.0) is Verdict.PROCESS  # its redelivery: 6 ms early
    ledger.acking(0)
    assert ledger.delivered(0, (1, 0, 0), 200.0) is Verdict.REACK  # acked, then surfaced again
    assert ledger.delivered(1, (9, 9, 9), 200.0) is Verdict.REACK  # not the id its send() returned
    assert ledger.delivered(1, (1, 0, 1), 200.0) is Verdict.PROCESS
    ledger.nacked(1, now_ms=200.0, delay_ms=50)  # never comes back
    assert ledger.delivered(2, (1, 0, 2), 210.0) is Verdict.PROCESS
    ledger.done(2)
    assert not ledger.settled
    s = ledger.summary()
    assert (s["published"], s["lost"], s["acked_resurfaced"], s["held_resurfaced"], s["unexpected"]) == (4, 3, 1, 1, 1)
    assert s["lost_by_state"] == {"held": 0, "nacked": 1, "done": 1, "never_delivered": 1}
    assert (s["nacks"], s["redeliveries"], s["missing_redeliveries"]) == (2, 1, 1)
    assert s["error_ms"]["min"] == -6.0 and s["error_ms"]["early"] == 1 and s["error_ms"]["early_beyond_tolerance"] == 1
    assert s["first_delivery_lag_ms"]["n"] == 3 and s["first_delivery_lag_ms"]["max"] == 7.0
    assert s["error_ms_at_another_consumer"]["n"] == 0
    ledger.cumulative_ack(2)  # covers 1 (nacked) and 2 (done)
    assert ledger.fate.get(1) is None and ledger.nacked_then_covered == 1
    assert ledger.delivered(1, (1, 0, 1), 300.0) is Verdict.REACK and ledger.acked_resurfaced == 2
    assert ledger.delivered(3, (1, 1, -1), 300.0) is Verdict.PROCESS
    ledger.acking(3)
    assert ledger.settled and ledger.summary()["lost"] == 0
    assert Fate.ACKED not in ledger.summary()["lost_by_state"]


def test_traffic_ledger_tells_redeliveries_at_another_consumer_apart():
    ledger = Ledger(sent=2, published={0: (1, 0, 0), 1: (1, 0, 1)})
    for n in (0, 1):
        ledger.delivered(n, (1, 0, n), 0.0, consumer=0)
        ledger.nacked(n, now_ms=0.0, delay_ms=100, consumer=0)
    ledger.delivered(0, (1, 0, 0), 99.0, consumer=0)  # back where it was nacked, 1 ms early
    ledger.delivered(1, (1, 0, 1), 40.0, consumer=1)  # at the other consumer, 60 ms early
    s = ledger.summary()
    assert s["error_ms"]["n"] == 2 and s["error_ms"]["min"] == -60.0
    assert s["error_ms_at_another_consumer"]["n"] == 1 and s["error_ms_at_another_consumer"]["min"] == -60.0


def test_traffic_ledger_tells_acked_copies_at_another_consumer_apart():
    ledger = Ledger(sent=2, published={0: (1, 0, 0), 1: (1, 0, 1)})
    for n in (0, 1):
        ledger.delivered(n, (1, 0, n), 0.0, consumer=0)
        ledger.acking(n, consumer=0, now_ms=2.0)
    assert ledger.delivered(0, (1, 0, 0), 5.0, consumer=0) is Verdict.REACK  # back where it was acked
    assert ledger.delivered(1, (1, 0, 1), 9.0, consumer=1) is Verdict.REACK  # at a consumer that never saw the ack
    s = ledger.summary()
    assert (s["acked_resurfaced"], s["acked_resurfaced_elsewhere"]) == (2, 1)
    assert s["acked_resurfaced_elsewhere_after_ms"] == {"n": 1, "min": 7.0, "p50": 7.0, "max": 7.0}


def test_traffic_scenarios_name_their_subscription_and_topic():
    by_name = {s.name: s for s in traffic_ledger.SCENARIOS}
    assert {"shared-1", "shared-2", "cumulative", "partitioned", "key-shared", "broker-restart",
            "broker-kill"} <= by_name.keys()
    assert [by_name[n].subscription for n in ("shared-2", "cumulative", "key-shared")] == \
        ["Shared", "Failover", "Key_Shared"]
    assert by_name["partitioned"].partitions > 1 and by_name["partitioned"].consumers == 2
    assert by_name["broker-restart"].graceful and not by_name["broker-kill"].graceful


@pytest.mark.slow
@pytest.mark.broker
def test_traffic_quick_runs_both_sides_and_writes_results(tmp_path):
    """`python -m bench.traffic --quick` end to end (< 30 s): the shape of what
    it writes; the figures are the benchmark's to judge, not a unit test's."""
    subprocess.run([sys.executable, "-m", "bench.traffic", "--quick", "--scenarios", "shared-1,shared-2,cumulative,"
                    "partitioned", "--out", str(tmp_path), "--label", "smoke"],
                   check=True, cwd=ROOT, capture_output=True, text=True, timeout=180)
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert [r["scenario"] for r in result["scenarios"]] == ["shared-1", "shared-2", "cumulative", "partitioned"]
    assert result["machine"]["cores"] >= 1 and result["command"].startswith("python -m bench.traffic --quick")
    assert result["broker"]["kind"] == "lite" and result["broker"]["version"].startswith("pulsar-lite")
    # pulsar-lite cannot redeliver on partitioned topics: the row says so instead of measuring nothing
    assert "cannot redeliver" in result["scenarios"][-1]["not_run"]
    for row in result["scenarios"][:-1]:
        assert row["publish_failed"] == 0 and len(row["load_avg_before"]) == 3
        for side in (traffic_ledger.TRACKED, traffic_ledger.PLAIN):
            s = row[side]
            assert s["published"] == traffic_ledger.QUICK.messages
            assert s["redeliveries"] + s["missing_redeliveries"] <= s["nacks"]
            assert {"lost", "acked_resurfaced", "held_resurfaced", "error_ms", "loop_lag_ms"} <= s.keys()
            assert s["worker_errors"] == []  # no worker of the application died
        assert "records_end" in row["tracked"] and "records_end" not in row["plain"]
    md = (tmp_path / "smoke.md").read_text()
    assert "| shared-2 | tracked |" in md and "load avg" in md and "| partitioned | both | not run:" in md


@pytest.mark.slow
@pytest.mark.apache
def test_traffic_quick_on_apache_pulsar_runs_the_partitioned_and_key_shared_scenarios(tmp_path):
    """`python -m bench.traffic --quick --broker apache` on the two scenarios
    pulsar-lite cannot show: the partitioned topic is created through the admin
    API and both sides measure it; batch-index acks are on at the broker."""
    subprocess.run([sys.executable, "-m", "bench.traffic", "--quick", "--broker", "apache", "--scenarios",
                    "partitioned,key-shared", "--out", str(tmp_path), "--label", "smoke"],
                   check=True, cwd=ROOT, capture_output=True, text=True, timeout=600)
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert result["broker"]["kind"] == "apache" and result["broker"]["version"].startswith("Apache Pulsar 4.0.")
    assert result["broker"]["settings"] == {"acknowledgmentAtBatchIndexLevelEnabled": True}
    assert result["config"]["batch_index_ack"] is True
    rows = {r["scenario"]: r for r in result["scenarios"]}
    assert (rows["partitioned"]["partitions"], rows["key-shared"]["subscription"]) == (3, "Key_Shared")
    for row in rows.values():
        assert "not_run" not in row and row["publish_failed"] == 0
        for side in (traffic_ledger.TRACKED, traffic_ledger.PLAIN):
            s = row[side]
            assert s["published"] == traffic_ledger.QUICK.messages and s["worker_errors"] == []
            assert s["redeliveries"] + s["missing_redeliveries"] <= s["nacks"]
    md = (tmp_path / "smoke.md").read_text()
    assert "on Apache Pulsar 4.0." in md and "| partitioned | tracked |" in md


def test_java_anchor_measures_the_workload_it_names():
    """The anchor workload (4 ledgers, consecutive ids round robin, delays 1-60 s) through the tracker:
    at Java's default 8 bits its ids share buckets and ledgers, and the index holds them in bitmaps."""
    from bench import java_anchor

    keys, delays = java_anchor.workload(8)
    assert [(k.ledger_id, k.entry_id) for k in keys] == [(i % 4, i // 4) for i in range(8)]
    assert all(1_000 <= d <= 60_000 for d in java_anchor.workload(10_000)[1])
    fine, coarse = java_anchor.measure(100_000, 0), java_anchor.measure(100_000, 8)
    assert fine["pending"] == coarse["pending"] == 100_000
    assert coarse["nbytes"] < 0.7 * fine["nbytes"] and coarse["nbytes_per_nack"] <= coarse["java_per_nack"] == 6.2
    assert "| 100,000 | 8 | 6.2 B |" in java_anchor.table({"rows": [fine, coarse]})
