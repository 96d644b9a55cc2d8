"""Apache Pulsar as a test broker, and `python -m nacktracker.testing`: real processes.

Each Apache Pulsar start costs a JVM (5-20 s on 2 cores): the tests here share
as few starts as they can.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import uuid

import pulsar
import pytest

from nacktracker.testing import PULSAR_VERSION, ApacheBroker, BrokerStartError
from nacktracker.testing.apache import DEFAULT_SETTINGS, resolve_classpath

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
pytestmark = [pytest.mark.apache, pytest.mark.own_broker]  # each test starts Apache Pulsar itself


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is not alive: reaped or not, it runs nothing
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def read_urls(proc: subprocess.Popen, timeout: float = 180.0) -> dict[str, str]:
    urls: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(urls) < 2:
        line = proc.stdout.readline()
        if not line:
            break
        key, _, value = line.strip().partition("=")
        if key in ("PULSAR_URL", "PULSAR_ADMIN_URL"):
            urls[key] = value
    return urls


def java_children_of(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_settings_are_checked_and_the_classpath_is_cached():
    with pytest.raises(ValueError, match="port="):
        ApacheBroker(settings={"brokerServicePort": 6650})
    jars = resolve_classpath()
    assert any(os.path.basename(j) == f"pulsar-broker-{PULSAR_VERSION}.jar" for j in jars)
    assert resolve_classpath() == jars  # the cache answers, no Maven


def test_cli_starts_two_brokers_side_by_side_with_settings_and_stops_them_on_signals():
    """`python -m nacktracker.testing apache --set ...` twice at once: both print
    their URLs, report Apache Pulsar 4.0.x, carry their settings, serve a producer,
    and SIGTERM / SIGINT stop each with its JVM."""
    cmd = [sys.executable, "-m", "nacktracker.testing", "apache"]
    procs = [
        subprocess.Popen(cmd + ["--set", "allowAutoTopicCreationType=partitioned", "--set", "defaultNumPartitions=2"],
                         stdout=subprocess.PIPE, text=True),
        subprocess.Popen(cmd + ["--set", "maxMessageSize=5120"], stdout=subprocess.PIPE, text=True),
    ]
    try:
        urls = [read_urls(p) for p in procs]
        for u in urls:
            assert set(u) == {"PULSAR_URL", "PULSAR_ADMIN_URL"}, urls
        assert urls[0]["PULSAR_URL"] != urls[1]["PULSAR_URL"]
        jvms = [java_children_of(p.pid) for p in procs]
        assert all(len(j) == 1 for j in jvms), jvms

        import json
        import urllib.request

        def get(base: str, path: str):
            with urllib.request.urlopen(base + path, timeout=10) as answer:
                text = answer.read().decode()
            try:
                return json.loads(text)
            except ValueError:
                return text  # /brokers/version answers plain text

        for u in urls:
            assert get(u["PULSAR_ADMIN_URL"], "/admin/v2/brokers/version").startswith("4.0.")
        conf0 = get(urls[0]["PULSAR_ADMIN_URL"], "/admin/v2/brokers/configuration/runtime")
        conf1 = get(urls[1]["PULSAR_ADMIN_URL"], "/admin/v2/brokers/configuration/runtime")
        assert conf0["defaultNumPartitions"] == "2" and conf0["allowAutoTopicCreationType"] == "partitioned"
        assert conf1["maxMessageSize"] == "5120" and conf1["defaultNumPartitions"] == "1"

        client = pulsar.Client(urls[0]["PULSAR_URL"], logger=QUIET)
        try:
            t = f"persistent://public/default/auto-{uuid.uuid4().hex[:8]}"
            client.create_producer(t).close()
            assert len(client.get_topic_partitions(t)) == 2  # the setting took effect
        finally:
            client.close()

        procs[0].send_signal(signal.SIGTERM)
        procs[1].send_signal(signal.SIGINT)
        for p in procs:
            assert p.wait(timeout=60) in (0, 130)
        for j in jvms:
            assert not alive(j[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_cli_stops_the_broker_when_its_parent_dies():
    """The CLI's parent is killed: the CLI notices and stops its broker (pulsar-lite
    here: the same code path, and a JVM less to start)."""
    shell = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} -m nacktracker.testing lite & echo $!; wait"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    cli = int(shell.stdout.readline())
    assert shell.stdout.readline().startswith("PULSAR_URL=pulsar://127.0.0.1:")
    brokers = java_children_of(cli)
    assert len(brokers) == 1
    shell.kill()  # the parent only: the CLI and its broker live on until the CLI notices
    shell.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (alive(cli) or alive(brokers[0])):
        time.sleep(0.2)
    assert not alive(cli) and not alive(brokers[0])


def test_a_broker_dies_with_the_process_that_started_it(tmp_path):
    """kill -9 of the owner (a test session that dies): the kernel kills the JVM."""
    code = ("import sys, time; from nacktracker.testing import ApacheBroker\n"
            f"b = ApacheBroker({str(tmp_path / 'b')!r}).start(); print(b.pid, flush=True); time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        jvm = int(owner.stdout.readline())
        assert alive(jvm)
        owner.kill()
        owner.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and alive(jvm):
            time.sleep(0.1)
        assert not alive(jvm)
    finally:
        if owner.poll() is None:
            owner.kill()


def test_admin_errors_name_the_call_and_a_bad_setting_fails_with_the_log(tmp_path):
    with ApacheBroker(tmp_path / "ok") as broker:
        with pytest.raises(urllib.error.HTTPError, match="GET /admin/v2/namespaces/no-such-tenant: 4"):
            broker.admin("GET", "/admin/v2/namespaces/no-such-tenant")
        assert broker.admin("GET", "/admin/v2/clusters") == ["standalone"]
    bad = ApacheBroker(tmp_path / "bad", settings={"managedLedgerDefaultEnsembleSize": "not-a-number"},
                       startup_timeout=60)
    with pytest.raises(BrokerStartError, match="did not become ready"):
        bad.start()
    assert not bad.running
    assert DEFAULT_SETTINGS["acknowledgmentAtBatchIndexLevelEnabled"] is False
