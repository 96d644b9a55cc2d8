"""``plan`` on a real Spark standalone cluster (master + worker on 127.0.0.1)
whose executors run a bare Python: the commands are taken verbatim from
docs/pipeline.md, so the documentation cannot drift from what is tested."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline_helpers import nacks_by_consumer, replay

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "pipeline.md"
T0 = 1_700_000_000_000

pytestmark = [
    pytest.mark.spark, pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("pyspark") is None or shutil.which("java") is None,
                       reason="needs pyspark and Java"),
]


def doc_block(name: str) -> str:
    """The bash block right after ``<!-- test:NAME ... -->`` in docs/pipeline.md."""
    m = re.search(rf"<!-- test:{re.escape(name)}\b[^>]*-->\s*```bash\n(.*?)```", DOC.read_text(), re.S)
    assert m, f"docs/pipeline.md has no block marked test:{name}"
    return m.group(1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from spark_cluster import standalone_cluster

    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as c:
        yield c


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """Three consumers, random delays and ledgers, one re-nacked message: a
    few thousand nacks written with pyarrow (no Spark needed to make it)."""
    rng = np.random.default_rng(11)
    cols: dict[str, list] = {c: [] for c in ("ts_ms", "kind", "ledger_id", "entry_id", "delay_ms", "consumer")}
    for c, n in enumerate((3000, 1500, 400)):
        ts = np.sort(rng.integers(T0, T0 + 10_000, n))
        cols["ts_ms"] += ts.tolist()
        cols["ledger_id"] += rng.integers(10 + 10 * c, 13 + 10 * c, n).tolist()
        cols["entry_id"] += rng.integers(0, 2000, n).tolist()
        cols["delay_ms"] += rng.integers(0, 5000, n).tolist()
        cols["consumer"] += [f"c{c}"] * n
        cols["kind"] += ["nack"] * n
    out = tmp_path_factory.mktemp("cluster-trace") / "nacks"
    out.mkdir()
    table = pa.table(cols)
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), out / "part-0.parquet")
    pq.write_table(table.slice(half), out / "part-1.parquet")
    return out


def driver_env(cluster, trace: Path) -> dict:
    """This environment as a user's shell would have it (its venv's bin first,
    this source tree importable), minus any Python choice for the executors."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(ROOT), SPARK_LOCAL_IP="127.0.0.1",
               SPARK_MASTER=cluster.master_url, TRACE=str(trace))
    return env


def run(block: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def check_exact_peaks(out: Path, trace: Path) -> None:
    rows = pq.read_table(out / "consumers.parquet").to_pandas()
    bits_seen = sorted(set(rows["bits"]))
    assert bits_seen == [0, 4, 8, 10, 12, 15]
    nacks = nacks_by_consumer(trace)
    assert sorted(set(rows["consumer"])) == sorted(nacks)
    for name, rows_of in nacks.items():
        for bits in bits_seen:
            r = rows[(rows["consumer"] == name) & (rows["bits"] == bits)].iloc[0]
            peak, at, _ = replay(rows_of, bits)
            assert (r["peak_pending"], r["peak_at_ms"]) == (peak, at), (name, bits)


def test_the_executors_python_is_bare(cluster):
    probe = subprocess.run([str(cluster.bare_bin / "python3"), "-c", "import numpy"],
                           env={"PATH": "/usr/bin:/bin"}, cwd="/", capture_output=True)
    assert probe.returncode != 0


def test_plan_on_a_cluster_ships_what_the_executors_need(cluster, trace, tmp_path):
    block = doc_block("cluster-plan")
    done = run(block, tmp_path, driver_env(cluster, trace))
    assert done.returncode == 0, done.stderr[-3000:]
    check_exact_peaks(tmp_path / "plan-out", trace)
    assert "executors ready" in done.stdout and "[plan] validate" in done.stdout
    # the executors really ran the bare Python, with the shipped packages
    assert re.search(r"executors ready in [\d.]+ s: Python 3\.\d+", done.stdout)


def test_without_shipping_the_probe_names_what_is_missing(cluster, trace, tmp_path):
    env = driver_env(cluster, trace)
    done = subprocess.run([sys.executable, "-m", "nacktracker.cli", "plan", str(trace), "--master",
                           cluster.master_url, "--no-ship", "--out", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("nacktracker: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "cannot import nacktracker" in errors[0] and "--no-ship" in errors[0]
    assert "validate" not in done.stdout  # stopped before reading the log
    assert not (tmp_path / "out").exists()


def test_the_spark_submit_recipe_as_documented(cluster, trace, tmp_path):
    block = doc_block("spark-submit")
    assert block.lstrip().startswith("spark-submit")
    done = run(block, tmp_path, driver_env(cluster, trace))
    assert done.returncode == 0, done.stderr[-3000:]
    check_exact_peaks(tmp_path / "plan-out", trace)
    assert "**precision_bits = " in done.stdout


def test_trace_generate_and_sweep_run_on_the_cluster_too(cluster, tmp_path):
    """trace generate needs no Python on the executors (Spark SQL only); sweep
    runs each configuration in a fresh executor-side interpreter, which finds
    the shipped packages on the inherited PYTHONPATH."""
    env = driver_env(cluster, tmp_path)
    out = tmp_path / "gen"
    done = subprocess.run([sys.executable, "-m", "nacktracker.cli", "trace", "generate", "--out", str(out),
                           "--events", "3000", "--consumers", "2", "--master", cluster.master_url],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "executors" not in done.stdout  # nothing shipped, nothing probed
    assert pq.read_table(out).num_rows == 3000
    done = subprocess.run([sys.executable, "-m", "nacktracker.cli", "sweep", "--x", "1,8", "--y", "8",
                           "--shares", "1", "--messages", "20000", "--master", cluster.master_url],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "executors ready" in done.stdout
    assert sum(line.startswith("| TimeBucketIndex") for line in done.stdout.splitlines()) == 2
