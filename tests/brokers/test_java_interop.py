"""Retry letters between Apache Pulsar's own Java client (4.0.7, built by Maven
from tests/java) and nacktracker, on Apache Pulsar: each consumes the other's
retry topic; topic names, properties and counts match.

Runs on the Apache Pulsar test broker only (pulsar-lite is not the reference
for the Java client's behaviour); needs ``java`` and ``mvn`` (Maven Central).
"""

from __future__ import annotations

import asyncio
import shutil

import pytest

pulsar = pytest.importorskip("pulsar")

import nacktracker  # noqa: E402
from bench.java_client import java_classpath as build_java_classpath  # noqa: E402  (the root is on pythonpath)


@pytest.fixture(scope="session")
def java_classpath() -> str:
    """Build the Java program (Maven, Central only) once per session; its class path."""
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.fail("the Java interop test needs java and mvn on PATH")
    return build_java_classpath()


async def run_java(classpath: str, *args: object) -> list[str]:
    """Run RetryInterop to its end; its GOT lines."""
    proc = await asyncio.create_subprocess_exec(
        "java", "-cp", classpath, "nacktracker.interop.RetryInterop", *map(str, args),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    lines = out.decode().splitlines()
    assert proc.returncode == 0 and "DONE" in lines, (proc.returncode, out.decode(), err.decode()[-2000:])
    return [line for line in lines if line.startswith("GOT ")]


def parse(line: str) -> tuple[bytes, str, dict[str, str]]:
    _, data, topic, props = line.split(" ", 3)
    return data.encode(), topic, dict(kv.split("=", 1) for kv in props.split(";") if kv)


async def dead_letters(client, topic: str, n: int) -> list:
    plain = await client.subscribe(topic, "check", consumer_type=pulsar.ConsumerType.Shared,
                                   initial_position=pulsar.InitialPosition.Earliest)
    out = []
    try:
        while len(out) < n:
            out.append(await plain.receive())
            await plain.acknowledge(out[-1])
    finally:
        await plain.close()
    return out


@pytest.fixture
def apache_only(broker_kind):
    if broker_kind == "lite":
        pytest.skip("the Java client's retry letters are checked on Apache Pulsar")


async def test_nacktracker_consumes_the_java_clients_retry_topic(apache_only, java_classpath, broker_url,
                                                                 client, topic):
    t = topic("jretry")
    producer = await client.create_producer(t)
    for i in range(2):
        await producer.send(b"j%d" % i, properties={"app": "x"})
    await producer.close()
    got = await run_java(java_classpath, broker_url, t, "sub", 1, 500, 2)  # reconsumeLater 500 ms each
    first = {data: props for data, _, props in map(parse, got)}
    assert set(first) == {b"j0", b"j1"} and all("RECONSUMETIMES" not in p for p in first.values())
    consumer = await nacktracker.subscribe(client, t, "sub", enable_retry=True, max_redeliveries=1)
    try:
        for _ in range(2):
            msg = await consumer.receive(timeout_ms=15_000)
            props = msg.properties()
            assert msg.topic_name() == t + "-sub-RETRY"  # Java's default name is ours
            assert props["RECONSUMETIMES"] == "1" and props["DELAY_TIME"] == "500"
            assert props["REAL_TOPIC"] == t and props["REAL_SUBSCRIPTION"] == "sub" and props["app"] == "x"
            assert props["ORIGIN_MESSAGE_ID"] == props["ORIGIN_MESSAGE_IDY_TIME"]
            await consumer.reconsume_later(msg, delay_ms=100)  # the second reconsume: past 1, dead-lettered
        dead = await dead_letters(client, t + "-sub-DLQ", 2)
        assert sorted(m.data() for m in dead) == [b"j0", b"j1"]
        for m in dead:
            assert m.properties()["RECONSUMETIMES"] == "2" and m.properties()["REAL_TOPIC"] == t
    finally:
        await consumer.close()


async def test_the_java_client_consumes_nacktrackers_retry_topic(apache_only, java_classpath, broker_url,
                                                                 client, topic):
    t = topic("pyretry")
    consumer = await nacktracker.subscribe(client, t, "sub", enable_retry=True, max_redeliveries=1)
    producer = await client.create_producer(t)
    origins = {}
    try:
        for i in range(2):
            await producer.send(b"p%d" % i)
        for _ in range(2):
            msg = await consumer.receive(timeout_ms=10_000)
            mid = msg.message_id()  # Java's MessageId.toString(): ledger:entry:partition[:batch]
            origins[msg.data()] = ":".join(map(str, (mid.ledger_id(), mid.entry_id(), mid.partition(),
                                                     *([mid.batch_index()] if mid.batch_index() >= 0 else []))))
            await consumer.reconsume_later(msg, delay_ms=500)
    finally:
        await producer.close()
        await consumer.close()
    got = await run_java(java_classpath, broker_url, t, "sub", 1, 100, 2)  # Java's reconsume: dead-lettered
    for data, where, props in map(parse, got):
        assert where == t + "-sub-RETRY" and props["RECONSUMETIMES"] == "1" and props["DELAY_TIME"] == "500"
        assert props["REAL_TOPIC"] == t and props["ORIGIN_MESSAGE_ID"] == origins[data]
        assert props["ORIGIN_MESSAGE_IDY_TIME"] == origins[data] and props["REAL_SUBSCRIPTION"] == "sub"
    assert sorted(parse(line)[0] for line in got) == [b"p0", b"p1"]
    dead = await dead_letters(client, t + "-sub-DLQ", 2)
    for m in dead:
        assert m.properties()["RECONSUMETIMES"] == "2" and m.properties()["ORIGIN_MESSAGE_ID"] == origins[m.data()]
