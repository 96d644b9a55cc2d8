"""The embedded broker helper: real pulsar-lite processes, a few seconds in all."""

import os
import socket
import subprocess
import uuid

import pulsar
import pytest

from nacktracker import testing
from nacktracker.testing import BrokerStartError, EmbeddedBroker, pulsar_service

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


def topic() -> str:
    return f"persistent://public/default/t-{uuid.uuid4().hex[:8]}"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def broker():
    with EmbeddedBroker() as b:
        yield b


@pytest.fixture
def client_for():
    clients = []

    def make(url):
        clients.append(pulsar.Client(url, logger=QUIET))
        return clients[-1]

    yield make
    for c in clients:
        try:
            c.close()
        except pulsar.AlreadyClosed:
            pass


def shared(client, name, **kw):
    # pulsar-lite redelivers only on Shared/Key_Shared subscriptions.
    return client.subscribe(
        name, "sub", consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100, **kw,
    )


@pytest.mark.broker
def test_nack_is_redelivered(broker, client_for):
    client = client_for(broker.url)
    t = topic()
    consumer = shared(client, t)
    client.create_producer(t, batching_enabled=False).send(b"hello")

    first = consumer.receive(timeout_millis=5000)
    assert (first.data(), first.redelivery_count()) == (b"hello", 0)
    consumer.negative_acknowledge(first)

    again = consumer.receive(timeout_millis=5000)
    assert again.data() == b"hello"
    assert again.message_id() == first.message_id()
    assert again.redelivery_count() == 1
    consumer.acknowledge(again)


@pytest.mark.broker
def test_restart_keeps_data_dir_port_and_unacked_messages(broker, client_for):
    client = client_for(broker.url)
    t = topic()
    consumer = shared(client, t)
    client.create_producer(t, batching_enabled=False).send(b"unacked")
    assert consumer.receive(timeout_millis=5000).data() == b"unacked"  # never acked

    url, old_pid = broker.url, broker.pid
    broker.restart()
    assert (broker.url, broker.running) == (url, True)
    assert broker.pid != old_pid and not alive(old_pid)
    assert (broker.data_dir / "broker.rocksdb").is_dir()

    # The same consumer reconnects and gets the unacked message again.
    assert consumer.receive(timeout_millis=10_000).data() == b"unacked"


@pytest.mark.broker
def test_kill_then_start_resumes_on_same_data(broker, client_for):
    client = client_for(broker.url)
    t = topic()
    client.create_producer(t, batching_enabled=False).send(b"durable")
    client.close()

    broker.kill()
    assert not broker.running and broker.pid is None
    broker.start()

    consumer = shared(client_for(broker.url), t, initial_position=pulsar.InitialPosition.Earliest)
    assert consumer.receive(timeout_millis=10_000).data() == b"durable"


@pytest.mark.broker
def test_two_brokers_at_once(client_for):
    with EmbeddedBroker() as a, EmbeddedBroker() as b:
        assert a.port != b.port and a.pid != b.pid and a.data_dir != b.data_dir
        for br in (a, b):
            client = client_for(br.url)
            t = topic()
            consumer = shared(client, t)
            client.create_producer(t, batching_enabled=False).send(br.url.encode())
            assert consumer.receive(timeout_millis=5000).data() == br.url.encode()
        a.stop()
        assert not a.running and b.running


@pytest.mark.broker
def test_stop_terminates_and_removes_owned_dir_only(tmp_path):
    owned = EmbeddedBroker().start()
    pid, owned_dir = owned.pid, owned.data_dir
    owned.stop()
    assert not alive(pid) and not owned_dir.exists()

    given = EmbeddedBroker(tmp_path / "data").start()
    log_path = given.log_path
    given.stop()
    assert (tmp_path / "data" / "broker.rocksdb").is_dir()
    assert (tmp_path / "data" / "pulsar-lite.toml").read_text().strip().endswith("enabled = false")
    assert "Server listening on 127.0.0.1" in log_path.read_text()

    kept = EmbeddedBroker(keep_data=True).start()
    kept.stop()
    assert kept.data_dir.is_dir()
    subprocess.run(["rm", "-rf", str(kept.data_dir)], check=True)


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(BrokerStartError, match="already in use"):
            with EmbeddedBroker(port=s.getsockname()[1]):
                pass


def test_broker_that_dies_reports_its_log(tmp_path, monkeypatch):
    fake = tmp_path / "fake-broker"
    fake.write_text("#!/bin/sh\necho 'boom: cannot open database' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr("pulsar_lite.binary_finder.find_pulsar_lite_binary", lambda: str(fake))
    with pytest.raises(BrokerStartError, match=r"(?s)exited with code 3.*boom: cannot open database"):
        with EmbeddedBroker(tmp_path / "data", startup_timeout=5):
            pass


def test_pulsar_service_honours_pulsar_url(monkeypatch):
    monkeypatch.setenv("PULSAR_URL", "pulsar://example.invalid:6650")

    def no_process(*args, **kwargs):
        raise AssertionError("no broker may be started when PULSAR_URL is set")

    monkeypatch.setattr(testing._process.subprocess, "Popen", no_process)
    with pulsar_service() as url:
        assert url == "pulsar://example.invalid:6650"


@pytest.mark.broker
def test_pulsar_service_starts_and_stops_a_broker(monkeypatch, client_for):
    monkeypatch.delenv("PULSAR_URL", raising=False)
    started = []
    real_popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(testing._process.subprocess, "Popen", recording_popen)
    with pulsar_service() as url:
        assert url.startswith("pulsar://127.0.0.1:")
        client_for(url).create_producer(topic()).close()
    assert len(started) == 1 and started[0].poll() is not None
