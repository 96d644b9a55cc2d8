"""The synchronous face (``nacktracker.sync``) on both brokers.

The guarantees that hold for both faces run over the ``face`` fixture: ``async`` is
``nacktracker.subscribe`` on a ``pulsar.asyncio.Client``; ``sync`` is
``nacktracker.sync.subscribe`` on a ``pulsar.Client``, its blocking calls made from
worker threads (``asyncio.to_thread``: the sync consumer is called from threads other
than the one that made it). Times are read on ``time.monotonic`` (the loop's clock).
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
import time
from typing import Any

import pytest

import nacktracker
import nacktracker.sync
from conftest import quiet_logger

pytestmark = pytest.mark.timeout(120)


def now_ms() -> float:
    return time.monotonic() * 1000


class ThreadedView:
    """A :class:`nacktracker.sync.SyncConsumer` seen through awaitable calls, each run on a worker thread."""

    def __init__(self, consumer: nacktracker.sync.SyncConsumer) -> None:
        self.sync = consumer

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.sync, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)
        return call


@pytest.fixture(params=["async", "sync"])
async def face(request, broker_url):
    """``await face(topic, subscription, **options)``: a subscribed consumer with awaitable methods, of the
    async face (a TrackedConsumer) or the sync face (a SyncConsumer called from worker threads)."""
    import pulsar
    import pulsar.asyncio

    made: list[Any] = []
    if request.param == "async":
        client: Any = pulsar.asyncio.Client(broker_url, logger=quiet_logger(), operation_timeout_seconds=10)
    else:
        client = pulsar.Client(broker_url, logger=quiet_logger(), operation_timeout_seconds=10)

    async def make(topic: str, subscription: str, **options: Any) -> Any:
        options.setdefault("initial_position", pulsar.InitialPosition.Earliest)
        if request.param == "async":
            consumer = await nacktracker.subscribe(client, topic, subscription, **options)
            made.append(consumer.close)
            return consumer
        consumer = await asyncio.to_thread(nacktracker.sync.subscribe, client, topic, subscription, **options)
        made.append(lambda: asyncio.to_thread(consumer.close))
        return ThreadedView(consumer)

    make.kind = request.param  # type: ignore[attr-defined]
    yield make
    for close in made:
        await close()
    if request.param == "async":
        await client.close()
    else:
        await asyncio.to_thread(client.close)


@pytest.fixture
def sync_client(broker_url):
    import pulsar

    client = pulsar.Client(broker_url, logger=quiet_logger(), operation_timeout_seconds=10)
    yield client
    client.close()


def publish(client: Any, topic: str, payloads: list[bytes]) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for payload in payloads:
        producer.send(payload)
    producer.close()


async def publish_async(broker_url: str, topic: str, payloads: list[bytes]) -> None:
    import pulsar

    def run() -> None:
        client = pulsar.Client(broker_url, logger=quiet_logger())
        try:
            publish(client, topic, payloads)
        finally:
            client.close()
    await asyncio.to_thread(run)


async def settle(value: Any) -> Any:
    """A call's result on either face: the async face's calls return awaitables, the sync face's their
    results."""
    return await value if inspect.isawaitable(value) else value


async def forty_nacks(consumer: Any) -> list[float]:
    """Receive 40 messages, nack each with its own delay (200-1000 ms), then take them back: the lateness
    of each (ms from its due time). Early is checked against the moment the nack was asked for."""
    rng = random.Random(7)
    due: dict[bytes, float] = {}
    for _ in range(40):
        msg = await settle(consumer.receive(10_000))
        delay = rng.randint(200, 1000)
        due[msg.data()] = now_ms() + delay  # the nack is stamped inside the call: never before this
        await settle(consumer.negative_acknowledge(msg, delay_ms=delay))
    late: list[float] = []
    while len(late) < 40:
        msg = await settle(consumer.receive(10_000))
        arrived = now_ms()
        due_at = due.pop(msg.data())
        assert arrived >= due_at - 2, f"{msg.data()!r} came {due_at - arrived:.1f} ms early"
        late.append(arrived - due_at)
        await settle(consumer.acknowledge(msg))
    return sorted(late)


@pytest.mark.timing
async def test_forty_nacks_with_their_own_delays_come_back_on_time(face, broker_url, topic):
    """On the sync face as a synchronous program uses it: every call from one thread of the program's
    own (no thread hop per call in the test's harness, which would add its own lateness)."""
    import pulsar

    name = topic("sync-nacks")
    consumer = await face(name, "s", consumer_type=pulsar.ConsumerType.Shared)  # the broker's redelivery
    await publish_async(broker_url, name, [f"m{i}".encode() for i in range(40)])
    if face.kind == "sync":
        late = await asyncio.to_thread(asyncio.run, forty_nacks(consumer.sync))
    else:
        late = await forty_nacks(consumer)
    p99 = late[int(0.99 * (len(late) - 1))]
    assert p99 <= 10, f"p99 lateness {p99:.1f} ms (all: {[round(x, 1) for x in late]})"


async def test_max_redeliveries_two_is_three_deliveries_then_one_dead_letter(face, broker_url, topic,
                                                                             sync_client):
    import pulsar

    name = topic("sync-dlq")
    dlq = name + "-s-DLQ"
    reader = sync_client.subscribe(dlq, "reader", initial_position=pulsar.InitialPosition.Earliest)
    consumer = await face(name, "s", consumer_type=pulsar.ConsumerType.Shared, max_redeliveries=2,
                          dead_letter_topic=dlq, delay_ms=200)
    await publish_async(broker_url, name, [b"poison"])
    deliveries = 0
    while True:
        try:
            msg = await consumer.receive(2_000)
        except pulsar.Timeout:
            break
        deliveries += 1
        await consumer.negative_acknowledge(msg)
    assert deliveries == 3
    letter = await asyncio.to_thread(reader.receive, 5_000)
    assert letter.data() == b"poison"
    reader.acknowledge(letter)
    with pytest.raises(pulsar.Timeout):
        await asyncio.to_thread(reader.receive, 500)
    reader.close()


@pytest.mark.timing
async def test_reconsume_later_comes_back_at_its_time_with_its_count(face, broker_url, topic):
    name = topic("sync-retry")
    consumer = await face(name, "s", enable_retry=True)
    await publish_async(broker_url, name, [b"again"])
    msg = await consumer.receive(10_000)
    before = now_ms()
    await consumer.reconsume_later(msg, delay_ms=500)
    after = now_ms()
    back = await consumer.receive(10_000)
    arrived = now_ms()
    assert back.data() == b"again"
    assert back.properties()["RECONSUMETIMES"] == "1"
    assert before + 500 - 2 <= arrived <= before + 500 + 15, f"back at +{arrived - before:.1f} ms (the call took {after - before:.1f} ms)"
    await consumer.acknowledge(back)


@pytest.mark.timing
async def test_a_steady_stream_of_nacks_does_not_postpone_the_first_redelivery(face, broker_url, topic):
    """A nack every 5-10 ms for 3 s (delay 200 ms) while a receiver takes everything that comes."""
    import pulsar

    name = topic("sync-stream")
    consumer = await face(name, "s", consumer_type=pulsar.ConsumerType.Shared, delay_ms=200)
    await publish_async(broker_url, name, [f"m{i}".encode() for i in range(600)])
    rng = random.Random(3)
    fresh: asyncio.Queue[Any] = asyncio.Queue()
    nacked_at: dict[bytes, float] = {}
    arrived: dict[bytes, float] = {}
    streaming = True

    async def receiver() -> None:
        while streaming:
            try:
                msg = await consumer.receive(200)
            except pulsar.Timeout:
                continue
            if msg.data() in nacked_at:
                arrived.setdefault(msg.data(), now_ms())
                await consumer.acknowledge(msg)
            else:
                fresh.put_nowait(msg)

    task = asyncio.get_running_loop().create_task(receiver())
    try:
        start = now_ms()
        while now_ms() - start < 3_000:
            msg = await asyncio.wait_for(fresh.get(), 5)
            nacked_at[msg.data()] = now_ms()
            await consumer.negative_acknowledge(msg)
            await asyncio.sleep(rng.uniform(0.005, 0.010))
    finally:
        streaming = False
        await task
    first_nacked = min(nacked_at, key=nacked_at.__getitem__)
    assert first_nacked in arrived, "the first nacked message never came back during the stream"
    first = arrived[first_nacked] - nacked_at[first_nacked]
    assert first <= 260, f"first redelivery after {first:.1f} ms"
    during = [k for k in arrived if arrived[k] < start + 3_000]
    assert len(during) > 100, f"only {len(during)} redeliveries during the stream"



async def test_the_default_type_is_the_clients_exclusive_on_both_faces(face, broker_url, broker_kind, topic):
    """Subscribed without a type, as code written for the plain client does: the subscription is Exclusive,
    the default of ``pulsar.Client.subscribe`` and ``pulsar.asyncio.Client.subscribe``. A second consumer on
    it is refused as the plain client of the same face refuses its own second consumer on a default-typed
    subscription (the same class, the same result: ConsumerBusy; on Apache Pulsar: pulsar-lite answers
    neither subscribe, which times out); a cumulative ack is taken (a Shared subscription would refuse it):
    it cancels the nack it covers, and the broker keeps it (the next consumer of the subscription gets only
    what came after)."""
    import pulsar
    import pulsar.asyncio

    defaults = [inspect.signature(f).parameters["consumer_type"].default
                for f in (pulsar.Client.subscribe, pulsar.asyncio.Client.subscribe, nacktracker.subscribe)]
    assert defaults == [pulsar.ConsumerType.Exclusive] * 3
    name = topic("default-type")

    refused_as = (pulsar.asyncio.PulsarException if face.kind == "async" else pulsar.PulsarException,)

    def refusal(exc: BaseException) -> tuple[type, Any]:
        return type(exc), exc.error() if face.kind == "async" else None  # pulsar.asyncio: one class, a result

    async def plain_second_consumer() -> BaseException:
        """The plain client of this face: a default-typed subscription, then a second consumer on it."""
        if face.kind == "async":
            plain_client: Any = pulsar.asyncio.Client(broker_url, logger=quiet_logger(), operation_timeout_seconds=10)
            plain = await plain_client.subscribe(name, "plain")
            with pytest.raises(refused_as) as refused_plain:
                await plain_client.subscribe(name, "plain")
            await plain.close()
            await plain_client.close()
        else:
            plain_client = pulsar.Client(broker_url, logger=quiet_logger(), operation_timeout_seconds=10)
            plain = plain_client.subscribe(name, "plain")
            with pytest.raises(refused_as) as refused_plain:
                await asyncio.to_thread(plain_client.subscribe, name, "plain")
            plain_client.close()
        return refused_plain.value

    consumer = await face(name, "s")
    if broker_kind != "lite":  # measured there: a second subscribe times out, the plain client's too (testing.lite)
        plain_refused = await plain_second_consumer()
        assert refusal(plain_refused) == ((pulsar.asyncio.PulsarException, pulsar.Result.ConsumerBusy)
                                          if face.kind == "async" else (pulsar.ConsumerBusy, None))
        with pytest.raises(refused_as) as refused:
            await face(name, "s")
        assert refusal(refused.value) == refusal(plain_refused), (refused.value, plain_refused)

    await publish_async(broker_url, name, [b"m0", b"m1", b"m2"])
    got = [await consumer.receive(10_000) for _ in range(3)]
    assert [m.data() for m in got] == [b"m0", b"m1", b"m2"]
    await consumer.negative_acknowledge(got[0], delay_ms=300)
    await consumer.acknowledge_cumulative(got[2])
    assert (await settle(consumer.stats()))["pending"] == 0
    with pytest.raises(pulsar.Timeout):
        await consumer.receive(1_000)  # the nacked m0 does not come back: the cumulative ack covered it
    await consumer.close()
    await publish_async(broker_url, name, [b"m3"])
    again = await face(name, "s")
    assert (await again.receive(10_000)).data() == b"m3"


# -- the sync face alone -----------------------------------------------------------------


@pytest.mark.timing
@pytest.mark.parametrize("kind", ["Exclusive", "Shared"])
async def test_positions_passed_as_ids_are_acknowledged_as_the_client_takes_them(face, broker_url, topic, kind):
    """``MessageId.earliest`` and ``latest`` in an ack (and ``earliest`` in a cumulative ack) go to the
    client as they are, which takes them on both faces (the broker acknowledges nothing with them), and
    nothing the consumer holds changes: its message still comes back when nacked. A nack of ``earliest``
    names no message: NotReceivedError in the caller, nothing tracked."""
    import pulsar

    from nacktracker.consumer import NotReceivedError

    name = topic("positions")
    consumer = await face(name, "sub", delay_ms=100, consumer_type=getattr(pulsar.ConsumerType, kind))
    await publish_async(broker_url, name, [b"held"])
    held = await settle(consumer.receive(10_000))
    for position in (pulsar.MessageId.earliest, pulsar.MessageId.latest):
        await settle(consumer.acknowledge(position))
    if kind != "Shared":  # a cumulative ack is refused on Shared whatever it names
        await settle(consumer.acknowledge_cumulative(pulsar.MessageId.earliest))
    with pytest.raises(NotReceivedError, match="MessageId.earliest"):
        await settle(consumer.negative_acknowledge(pulsar.MessageId.earliest))
    await settle(consumer.negative_acknowledge(held))
    back = await settle(consumer.receive(10_000))
    assert (back.data(), back.message_id()) == (held.data(), held.message_id())
    await settle(consumer.acknowledge(back))
    stats = await settle(consumer.stats())
    assert (stats["nacks"], stats.get("sync_ack_failures", 0)) == (1, 0)


def test_a_listener_that_nacks_then_acks_gets_every_message_on_time(broker_url, topic, sync_client):
    import pulsar

    name = topic("sync-listener")
    n, delay = 20, 300
    lock = threading.Lock()
    done = threading.Event()
    nacked_at: dict[bytes, float] = {}
    errors: list[float] = []
    acked: set[bytes] = set()
    threads: set[str] = set()

    def listener(consumer: nacktracker.sync.SyncConsumer, msg: pulsar.Message) -> None:
        threads.add(threading.current_thread().name)
        data = msg.data()
        if data not in nacked_at:
            before = now_ms()
            consumer.negative_acknowledge(msg, delay_ms=delay)
            nacked_at[data] = before
            return
        errors.append(now_ms() - (nacked_at[data] + delay))
        consumer.acknowledge(msg)
        with lock:
            acked.add(data)
            if len(acked) == n:
                done.set()

    consumer = nacktracker.sync.subscribe(sync_client, name, "s", consumer_type=pulsar.ConsumerType.Shared,
                                          message_listener=listener, initial_position=pulsar.InitialPosition.Earliest)
    try:
        with pytest.raises(pulsar.InvalidConfiguration):
            consumer.receive(10)
        publish(sync_client, name, [f"m{i}".encode() for i in range(n)])
        assert done.wait(20), f"acked only {len(acked)} of {n}"
    finally:
        consumer.close()
    assert threads == {"nacktracker-sync-listener"}
    assert max(errors) <= 15 and min(errors) >= -2, sorted(errors)
    assert not [t for t in threading.enumerate() if t.name.startswith("nacktracker-sync")]


def test_a_nack_delay_counts_from_the_call_not_from_when_the_loop_takes_it(sync_client, topic):
    """A nack's ``delay_ms`` counts from the call in the caller's thread: the time the call waits for the
    consumer's loop thread (on a busy machine, milliseconds) is taken off it. Here the loop is held for
    150 ms by a backoff (run on the loop for another message's nack) while the nack is called."""
    import pulsar

    name = topic("sync-stamp")
    holding = threading.Event()

    def backoff(count: int) -> int:
        holding.set()
        time.sleep(0.15)  # the loop thread is busy meanwhile
        return 10_000

    consumer = nacktracker.sync.subscribe(sync_client, name, "s", consumer_type=pulsar.ConsumerType.Shared,
                                          backoff=backoff, initial_position=pulsar.InitialPosition.Earliest)
    try:
        publish(sync_client, name, [b"held", b"timed"])
        held, timed = consumer.receive(10_000), consumer.receive(10_000)
        other = threading.Thread(target=consumer.negative_acknowledge, args=(held,))
        other.start()
        assert holding.wait(5)
        called = now_ms()
        consumer.negative_acknowledge(timed, delay_ms=300)
        waited = now_ms() - called
        other.join()
        back = consumer.receive(10_000)
        arrived = now_ms()
        assert back.data() == b"timed"
        assert waited >= 50, f"the call waited only {waited:.1f} ms for the loop"
        assert called + 300 - 2 <= arrived <= called + 300 + 15, \
            f"back at +{arrived - called:.1f} ms (the call waited {waited:.1f} ms)"
        consumer.acknowledge(back)
    finally:
        consumer.close()


def test_a_sync_consumer_is_safe_from_any_thread_and_closes_from_another(broker_url, topic, sync_client):
    import pulsar

    name = topic("sync-threads")
    consumer = nacktracker.sync.subscribe(sync_client, name, "s", initial_position=pulsar.InitialPosition.Earliest)
    publish(sync_client, name, [f"m{i}".encode() for i in range(50)])
    got: list[bytes] = []

    def work() -> None:
        while True:
            try:
                msg = consumer.receive()
            except nacktracker.ConsumerClosed:
                return
            got.append(msg.data())
            consumer.acknowledge(msg.message_id())  # by id, as the client allows

    workers = [threading.Thread(target=work) for _ in range(3)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 10
    while len(got) < 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    closer = threading.Thread(target=consumer.close)  # close from yet another thread wakes the receivers
    closer.start()
    for w in workers:
        w.join(5)
        assert not w.is_alive()
    closer.join(10)  # (before the client's fixture closes the client: the acks handed over go out first)
    assert not closer.is_alive() and consumer.stats()["sync_ack_failures"] == 0
    again = sync_client.subscribe(name, "s", initial_position=pulsar.InitialPosition.Earliest)
    with pytest.raises(pulsar.Timeout):  # every ack reached the broker before the close: nothing comes again
        again.receive(1_000)
    again.close()
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(50))
    with pytest.raises(nacktracker.ConsumerClosed):
        consumer.acknowledge(b"")
    assert consumer.topic() == name and consumer.subscription_name() == "s"


def test_closing_only_the_client_closes_its_consumers_first_and_their_acks_go_out(broker_url, topic, caplog):
    """A program that closes its ``pulsar.Client`` and not its consumers (pulsar-client's own examples
    do): as the client closes its consumers, the client's close closes its sync consumers first, so
    the acks they handed to their loop go out (the last ones came again, once the C++ consumer closed
    under them) and no consumer thread logs a failure (a receive or listener failing on a closed client)."""
    import logging

    import pulsar

    client = pulsar.Client(broker_url, logger=quiet_logger(), operation_timeout_seconds=10)
    name = topic("sync-client-close")
    consumer = nacktracker.sync.subscribe(client, name, "s", initial_position=pulsar.InitialPosition.Earliest)
    listening = nacktracker.sync.subscribe(client, topic("sync-client-close-listener"), "s",
                                           message_listener=lambda consumer, msg: None)
    publish(client, name, [f"m{i}".encode() for i in range(20)])
    with caplog.at_level(logging.WARNING, logger="nacktracker"):
        for _ in range(20):
            consumer.acknowledge(consumer.receive(10_000))  # handed over: sent when the loop takes them
        client.close()
    assert consumer.closed and listening.closed
    assert consumer.stats()["sync_ack_failures"] == 0
    assert not [r for r in caplog.records if r.name.startswith("nacktracker")], caplog.text
    with pytest.raises(pulsar.AlreadyClosed):  # closed: a second close is the client's own error
        client.close()
    again_client = pulsar.Client(broker_url, logger=quiet_logger(), operation_timeout_seconds=10)
    again = again_client.subscribe(name, "s", initial_position=pulsar.InitialPosition.Earliest)
    with pytest.raises(pulsar.Timeout):  # every ack reached the broker: nothing comes again
        again.receive(1_000)
    again_client.close()


def test_wrong_clients_and_options_are_refused_in_the_callers_thread(broker_url, topic, sync_client):
    import pulsar.asyncio

    before = set(threading.enumerate())

    async def async_client() -> Any:
        return pulsar.asyncio.Client(broker_url, logger=quiet_logger())

    with pytest.raises(TypeError, match="nacktracker.subscribe"):
        nacktracker.sync.subscribe(asyncio.run(async_client()), topic(), "s")
    with pytest.raises(TypeError, match="pulsar.Client"):
        nacktracker.sync.subscribe("pulsar://x", topic(), "s")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delay_mss"):
        nacktracker.sync.subscribe(sync_client, topic(), "s", delay_mss=5)
    with pytest.raises(TypeError, match=r"listener\(consumer, msg\).*takes \(msg\)"):  # the client calls it so
        nacktracker.sync.subscribe(sync_client, topic(), "s", message_listener=lambda msg: None)
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("nacktracker-sync")]


def test_a_wrong_receive_timeout_is_refused_by_its_name_whether_or_not_a_message_waits(sync_client, topic):
    """``receive(timeout_millis=...)`` is checked before the hand-off is looked at: the same call gets the
    same answer whether a message waits there or not, and the error names the sync face's argument."""
    import pulsar

    name = topic("sync-receive-timeout")
    consumer = nacktracker.sync.subscribe(sync_client, name, "s", initial_position=pulsar.InitialPosition.Earliest)
    publish(sync_client, name, [b"m"])
    deadline = time.monotonic() + 10
    while consumer.stats()["sync_handed_over"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert consumer.stats()["sync_handed_over"] == 1  # a message waits in the hand-off
    with pytest.raises(TypeError, match="timeout_millis must be an int, not str"):
        consumer.receive(timeout_millis="5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_millis must be >= 0"):
        consumer.receive(-1)
    assert consumer.receive(timeout_millis=5_000).data() == b"m"  # still there
    with pytest.raises(TypeError, match="timeout_millis must be an int, not str"):  # and with none waiting
        consumer.receive(timeout_millis="5")  # type: ignore[arg-type]
    consumer.close()


def test_a_keyboard_interrupt_in_receive_leaves_nothing_running(broker_url, topic):
    """A program interrupted in ``receive`` (Ctrl-C) exits at once, with no thread of ours left and
    no crash at exit (the consumer and its client are left open: closed at exit, in that order). Five
    runs: a client destroyed by interpreter finalization crashed about one exit in five."""
    import signal
    import subprocess
    import sys

    code = f"""
import os, signal, sys, threading, pulsar, nacktracker.sync
client = pulsar.Client({broker_url!r}, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
consumer = nacktracker.sync.subscribe(client, sys.argv[1], "s")
threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT)).start()  # as Ctrl-C: to the process
try:
    consumer.receive()
except KeyboardInterrupt:
    print("interrupted", consumer.closed)
    raise
"""
    for run_number in range(5):
        started = time.monotonic()
        run = subprocess.run([sys.executable, "-c", code, topic(f"sync-int-{run_number}")],
                             capture_output=True, text=True, timeout=60)
        assert "interrupted False" in run.stdout, run.stderr
        assert "KeyboardInterrupt" in run.stderr
        assert run.returncode == -signal.SIGINT, (run_number, run.stderr)  # Python's exit on an uncaught ^C
        assert "Exception ignored" not in run.stderr and "Traceback" in run.stderr
        assert time.monotonic() - started < 30


# -- pulsar-client's own Python tests (pulsar_test.py), ported by intent to the sync face -------------


def test_negative_acks_come_back_in_order_then_nothing_more(sync_client, topic):
    """The client's ``test_negative_acks``: ten string messages nacked as received come back, in order,
    after the consumer's nack delay; acknowledged, nothing more arrives. On the default type (Exclusive), as
    the original: each comes back from the consumer's memory, its redelivery count 1 as the broker's would be."""
    import pulsar

    name = topic("sync-negative-acks")
    consumer = nacktracker.sync.subscribe(sync_client, name, "test", schema=pulsar.schema.StringSchema(),
                                          negative_ack_redelivery_delay_ms=1000)
    producer = sync_client.create_producer(name, schema=pulsar.schema.StringSchema())
    for i in range(10):
        producer.send_async(f"hello-{i}", callback=lambda result, msg_id: None)
    producer.flush()
    nacked_at = time.monotonic()
    for i in range(10):
        msg = consumer.receive(10_000)
        assert msg.value() == f"hello-{i}"
        consumer.negative_acknowledge(msg)
    for i in range(10):
        msg = consumer.receive(10_000)
        assert msg.value() == f"hello-{i}"
        assert msg.redelivery_count() == 1
        consumer.acknowledge(msg)
    assert time.monotonic() - nacked_at >= 1.0 - 0.002  # not before the delay
    with pytest.raises(pulsar.Timeout):
        consumer.receive(100)
    consumer.close()
    producer.close()


def test_dead_letter_policy_sends_each_message_after_its_redeliveries(sync_client, topic):
    """The client's ``test_dead_letter_policy``: with a ``dead_letter_policy`` of max 2 redeliveries,
    every message nacked on every delivery is delivered 3 times, then lands on the dead-letter topic
    once; the consumer then receives nothing more."""
    import pulsar

    name = topic("sync-dlq-policy")
    dlq = name + "-dlq"
    n = 5
    reader = sync_client.subscribe(dlq, "dlq-reader", initial_position=pulsar.InitialPosition.Earliest)
    consumer = nacktracker.sync.subscribe(
        sync_client, name, "sub", consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=200,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2, dead_letter_topic=dlq))
    publish(sync_client, name, [f"m{i}".encode() for i in range(n)])
    deliveries: dict[bytes, int] = {}
    while True:
        try:
            msg = consumer.receive(2_000)
        except pulsar.Timeout:
            break
        deliveries[msg.data()] = deliveries.get(msg.data(), 0) + 1
        consumer.negative_acknowledge(msg)
    assert deliveries == {f"m{i}".encode(): 3 for i in range(n)}
    letters = []
    for _ in range(n):
        letter = reader.receive(5_000)
        letters.append(letter.data())
        reader.acknowledge(letter)
    assert sorted(letters) == sorted(deliveries)
    with pytest.raises(pulsar.Timeout):
        reader.receive(300)
    consumer.close()
    reader.close()


@pytest.mark.parametrize("kind", ["plain-sync", "sync"])
def test_the_throughput_bench_consumes_every_message_with_each_sync_kind(kind, broker_url, topic, sync_client):
    """``bench.consume_throughput --sync`` measures what it names: each kind receives and acks every
    message (nacked ones once more), through the face it is named after."""
    from bench.consume_throughput import consume_sync

    name = topic("sync-bench")
    publish(sync_client, name, [f"{i}:x".encode() for i in range(200)])
    got = consume_sync(broker_url, name, 200, kind, f"bench-{kind}", nack_every=10)
    assert got["copies"] >= 200 + 20 and got["rate"] > 0 and got["cpu_us_per_msg"] > 0
    assert not [t for t in threading.enumerate() if t.name.startswith("nacktracker-sync")]


def test_batch_receive_takes_batches_within_the_policy_in_order(broker_url, topic, sync_client):
    """``batch_receive`` on the sync face: batches of at most the policy's count, in the order published,
    every message once; with nothing left, ``[]`` once the policy's timeout passed. With an ack timeout
    (no hand-off) the tracked consumer's own batch receive answers."""
    import pulsar

    name = topic("sync-batch")
    n = 23
    publish(sync_client, name, [f"m{i}".encode() for i in range(n)])
    policy = pulsar.ConsumerBatchReceivePolicy(5, -1, 200)
    for options in ({}, {"ack_timeout_ms": 10_000}):
        with nacktracker.sync.subscribe(sync_client, name, f"batch-{len(options)}", batch_receive_policy=policy,
                                        initial_position=pulsar.InitialPosition.Earliest, **options) as consumer:
            got: list[bytes] = []
            while len(got) < n:
                batch = consumer.batch_receive()
                assert len(batch) <= 5
                got += [m.data() for m in batch]
                for m in batch:
                    consumer.acknowledge(m)
            assert got == [f"m{i}".encode() for i in range(n)], options
            started = now_ms()
            assert consumer.batch_receive() == []
            assert now_ms() - started >= 200 - 2


def test_a_paused_listener_gets_nothing_until_resumed(broker_url, topic, sync_client):
    import pulsar

    name = topic("sync-pause")
    got: list[bytes] = []
    arrived = threading.Event()

    def listener(consumer: nacktracker.sync.SyncConsumer, msg: pulsar.Message) -> None:
        got.append(msg.data())
        consumer.acknowledge(msg)
        arrived.set()

    with nacktracker.sync.subscribe(sync_client, name, "s", message_listener=listener,
                                    initial_position=pulsar.InitialPosition.Earliest) as consumer:
        consumer.pause_message_listener()
        publish(sync_client, name, [b"later"])
        assert not arrived.wait(0.5) and got == []
        consumer.resume_message_listener()
        assert arrived.wait(10) and got == [b"later"]


def test_receives_through_the_hand_off_keep_the_order_and_its_bounds(broker_url, topic, sync_client):
    """Most receives take messages the loop set aside ahead of them: a single receiver still gets every
    message once, in the order published; the hand-off holds no more than the consumer's ``prefetch``
    (receiver queue size 4 here, so ``prefetch`` 4), and nothing at all with an ack timeout (whose clock
    starts when the application gets the message)."""
    import pulsar

    name = topic("sync-handoff")
    n = 300
    publish(sync_client, name, [f"m{i}".encode() for i in range(n)])
    with nacktracker.sync.subscribe(sync_client, name, "order", initial_position=pulsar.InitialPosition.Earliest,
                                    receiver_queue_size=4) as consumer:
        got, held = [], []
        for _ in range(n):
            msg = consumer.receive(10_000)
            got.append(msg.data())
            consumer.acknowledge(msg)
            held.append(consumer.stats()["sync_handed_over"])
        assert got == [f"m{i}".encode() for i in range(n)]
        assert max(held) <= 4
        with pytest.raises(pulsar.Timeout):
            consumer.receive(200)
    with nacktracker.sync.subscribe(sync_client, name, "timed", initial_position=pulsar.InitialPosition.Earliest,
                                    ack_timeout_ms=10_000) as consumer:
        first = [consumer.receive(10_000) for _ in range(20)]
        assert [m.data() for m in first] == [f"m{i}".encode() for i in range(20)]
        assert consumer.stats()["sync_handed_over"] == 0
    with nacktracker.sync.subscribe(sync_client, name, "default", initial_position=pulsar.InitialPosition.Earliest) as consumer:
        got = []
        for _ in range(n):
            msg = consumer.receive(10_000)
            got.append(msg.data())
            consumer.acknowledge(msg)
            assert consumer.stats()["sync_handed_over"] <= nacktracker.sync.HANDOFF
        assert got == [f"m{i}".encode() for i in range(n)]


def test_every_message_of_a_non_persistent_topic_comes_through(sync_client, topic):
    """A non-persistent topic gives all its messages the same id: none of them is taken for a copy of another."""
    import pulsar

    t = topic("non-persistent").replace("persistent://", "non-persistent://", 1)
    consumer = nacktracker.sync.subscribe(sync_client, t, "sub")
    try:
        producer = sync_client.create_producer(t, batching_enabled=False)
        for i in range(5):
            producer.send(b"np-%d" % i)
        got = [consumer.receive(10_000).data() for _ in range(5)]
        assert got == [b"np-%d" % i for i in range(5)]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(200)
        producer.close()
    finally:
        consumer.close()



def test_pattern_auto_discovery_period_is_taken_as_the_client_takes_it(sync_client, topic):
    """``pulsar.Client.subscribe`` checks ``pattern_auto_discovery_period``'s type (a ValueError) and sets
    nothing with it (pulsar-client 3.x): the sync face takes it the same way, on any topic form."""
    with pytest.raises(ValueError, match="pattern_auto_discovery_period"):
        sync_client.subscribe(topic(), "s", pattern_auto_discovery_period=1.5)
    with pytest.raises(nacktracker.errors.ArgumentError, match="pattern_auto_discovery_period"):  # a ValueError and a TypeError
        nacktracker.sync.subscribe(sync_client, topic(), "s", pattern_auto_discovery_period=1.5)
    t = topic("discovery")
    consumer = nacktracker.sync.subscribe(sync_client, t, "sub", pattern_auto_discovery_period=1)
    try:
        publish(sync_client, t, [b"one"])
        msg = consumer.receive(10_000)
        assert msg.data() == b"one"
        consumer.acknowledge(msg)
    finally:
        consumer.close()
