"""Faults against the real embedded broker: a broker killed with SIGKILL
mid-stream, a consumer restarted on its snapshot, acknowledged messages that
the broker sends again. (Adapters that raise, slow adapters and loop stalls
need no broker: tests/tracker/test_faults.py.)

What every test checks is the direction that matters: nothing nacked is lost,
nothing surfaces before it is due (beyond the adapter's path tolerance),
nothing acknowledged surfaces again (with ``dedup``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import shutil
import zlib

import pytest

pulsar = pytest.importorskip("pulsar")
import pulsar.asyncio  # noqa: E402

import nacktracker  # noqa: E402
from broker_helpers import publish_batch, receive_all, redelivery_errors, settle_before_restart  # noqa: E402
from nacktracker import SnapshotError  # noqa: E402
from nacktracker.consumer import ReceiveTimeout  # noqa: E402
from nacktracker.consumer.persist import BATCHES_SUFFIX  # noqa: E402
from nacktracker.snapshot import decode  # noqa: E402
from nacktracker.testing import make_broker  # noqa: E402

Earliest = pulsar.InitialPosition.Earliest
EARLY_MS = 70  # the adapter's path varies 103-166 ms around its 133 ms lead (as in test_pulsar.py)
LATE_MS = 300
SETTLE_S = 0.3  # an ack sent immediately before a broker restart can be lost: let acks land first

own_broker_only = pytest.mark.skipif(bool(os.environ.get("PULSAR_URL")),
                                     reason="kills and restarts its own embedded broker")


@pytest.fixture(scope="module")
def crashable(broker_kind, tmp_path_factory):
    """A broker of this module's own (of the session's kind), free to be killed and restarted."""
    if broker_kind == "external":
        pytest.skip("kills and restarts its own broker ($PULSAR_URL names one it cannot)")
    with make_broker(broker_kind, data_dir=tmp_path_factory.mktemp("crashable")) as broker:
        yield broker


@pytest.fixture
async def crashable_client(crashable, pulsar_logger):
    c = pulsar.asyncio.Client(crashable.url, logger=pulsar_logger, operation_timeout_seconds=10)
    yield c
    try:
        await c.close()
    except Exception:
        pass


async def kill_and_restart(broker, down_s: float = 0.5) -> None:
    """SIGKILL the broker, leave it down ``down_s``, start it on the same data and port."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, broker.kill)
    await asyncio.sleep(down_s)
    await loop.run_in_executor(None, broker.start)


def now_ms() -> float:
    return asyncio.get_running_loop().time() * 1000.0


def id_of(msg):
    mid = msg.message_id()
    return msg.topic_name(), mid.ledger_id(), mid.entry_id(), mid.batch_index()


async def tracked(client, t, **options):
    # Shared: the faults are those of the broker's redelivery path (the adapter's; Exclusive, the default,
    # redelivers locally)
    return await nacktracker.subscribe(client, t, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                       initial_position=Earliest, precision_bits=0, **options)


async def publish(client, t, n, prefix=b"m"):
    producer = await client.create_producer(t, batching_enabled=False)
    for i in range(n):
        await producer.send(prefix + b"%d" % i)
    await producer.close()


async def receive_until(consumer, deadline_ms):
    """Everything the consumer surfaces until ``deadline_ms`` (loop clock)."""
    got = []
    while (left := deadline_ms - now_ms()) > 0:
        try:
            got.append(await consumer.receive(timeout_ms=round(left)))
        except ReceiveTimeout:
            break
    return got


async def expect_nothing(consumer, ms=600):
    with pytest.raises(ReceiveTimeout):
        msg = await consumer.receive(timeout_ms=ms)
        pytest.fail(f"unexpected message {msg.data()!r} (redelivery_count={msg.redelivery_count()})")


# -- the broker killed mid-stream -------------------------------------------------------

@pytest.mark.broker
@own_broker_only
async def test_broker_killed_mid_stream_loses_no_nacked_message_and_resurfaces_no_acked_one(
        crashable, crashable_client, topic):
    """A producer streams 150 messages over ~1.5 s; the application nacks a
    third of first copies (300-1500 ms) and acks the rest and every
    redelivery. The broker is SIGKILLed 0.6 s in and is down 0.5 s; it then
    resends every unacknowledged message at once (counts reset to 0), acks
    sent just before the kill included. Every sent message is acknowledged,
    every nacked one comes back, none before it is due, and (``dedup``) no
    acknowledged id surfaces again."""
    client, t, n = crashable_client, topic("kill"), 150
    rng = random.Random(5)
    consumer = await tracked(client, t, dedup=True)
    producer = await client.create_producer(t, batching_enabled=False)
    sent: set = set()
    failed_sends = 0

    async def stream():
        nonlocal failed_sends
        for i in range(n):
            try:
                await producer.send(b"s%d" % i)
                sent.add(b"s%d" % i)
            except Exception:  # a send that failed in the outage; if it landed anyway it is just extra
                failed_sends += 1
            await asyncio.sleep(0.01)

    due: dict = {}     # nacked data -> due (loop ms)
    nacked_ids: dict = {}  # nacked data -> the id of the message nacked
    back: dict = {}    # nacked data -> when it surfaced again
    resent: list = []  # nacked data that came again as another message (see application)
    acked: set = set()  # data acknowledged at least once
    acked_ids: set = set()
    resurfaced = []    # acknowledged ids that reached the application again

    async def application():
        while True:
            msg = await consumer.receive()
            data, ident = msg.data(), id_of(msg)
            if ident in acked_ids:
                resurfaced.append((data, ident))
            if data in due and data not in back and ident == nacked_ids[data]:
                back[data] = now_ms()
            elif data not in due and data not in acked and rng.random() < 1 / 3:
                delay = rng.randint(300, 1500)
                nacked_at = now_ms()  # the nack is stamped inside the call: its due time is never before this
                await consumer.negative_acknowledge(msg, delay_ms=delay)
                due[data], nacked_ids[data] = nacked_at + delay, ident
                continue
            if data in due and ident != nacked_ids[data]:  # the same data under another id: the producer's
                resent.append(data)  # resend of a send the kill cut short, stored already: another message
            await consumer.acknowledge(msg)
            acked.add(data)
            acked_ids.add(ident)

    streaming = asyncio.create_task(stream())
    app = asyncio.create_task(application())
    try:
        await asyncio.sleep(0.6)
        await kill_and_restart(crashable)
        await streaming
        # the consumer's reconnect backoff doubles while the broker is down: after a JVM restart on a busy
        # machine the rest can take tens of seconds to arrive (one full run was still short of it at 20 s)
        deadline = now_ms() + 60_000
        while (not sent <= acked or set(back) != set(due)) and now_ms() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.8)  # anything that would surface again has had time to
    finally:
        app.cancel()
        await asyncio.gather(app, return_exceptions=True)
    stats = consumer.stats()
    print(f"sent {len(sent)} (failed sends {failed_sends}, resent as other messages {len(resent)}), nacked "
          f"{len(due)}, early copies dropped "
          f"{stats['early_copies_dropped']}, acked copies dropped {stats['dedup_dropped']}")
    assert len(sent) >= n - 5 and len(due) > 20
    assert sent <= acked, f"never acknowledged: {sorted(sent - acked)}"
    assert set(back) == set(due), f"nacked, never back: {sorted(set(due) - set(back))}"
    # The tracker fires lead_ms before due (the adapter's path latency); a copy the broker resends
    # on its own after the restart and that lands after the fire surfaces then: at most lead_ms early.
    bound = consumer.adapter.lead_ms + 10
    errors = sorted(round(back[d] - due[d]) for d in due)
    print("redelivery error ms (min, median, max):", errors[0], errors[len(errors) // 2], errors[-1])
    early = {d: round(back[d] - due[d]) for d in due if back[d] < due[d] - bound}
    assert not early, f"surfaced more than {bound} ms before due (ms): {early}"
    assert not resurfaced, f"acknowledged ids surfaced again: {resurfaced}"
    assert consumer.tracker.pending == 0
    await producer.close()
    await consumer.close()


# -- a consumer restarted on its snapshot -----------------------------------------------

@pytest.mark.broker
async def test_restarted_consumer_holds_restored_nacks_until_their_remaining_delay(client, topic, tmp_path):
    """Consumer A nacks m0 (2500 ms), m1 (3500 ms) and b1 (3000 ms, one message
    of a batch entry), acks m2, b0, b3 and still holds b2 when it closes. B
    starts on A's snapshot: the broker resends every unacked message at once;
    B surfaces b0, b2, b3 at once (Pulsar resends whole entries; without
    batch-index acks b0 and b3 come back too) and m0, b1, m1 each at its due
    time, downtime included. Acking them completes the entry at the broker."""
    t = topic("restart")
    path = tmp_path / "nacks.snap"
    await publish(client, t, 3)
    await publish_batch(client, t, 4)
    a = await tracked(client, t, snapshot_path=path, snapshot_interval_s=0.2)
    msgs = {m.data(): m for m in [await a.receive(timeout_ms=5000) for _ in range(7)]}
    due = await settle_before_restart(a, msgs, now_ms)
    await asyncio.sleep(0.5)
    periodic = decode(path.read_bytes())  # what a crash right now would leave
    assert periodic.pending == 3 and a.stats()["snapshots_saved"] >= 1
    await a.close()
    await asyncio.sleep(0.5)  # downtime: counts against the delays

    b = await tracked(client, t, snapshot_path=path)
    assert b.stats()["restored"] == 3 and b.stats()["batch_records"] == 1
    at_once = await receive_until(b, now_ms() + 800)  # m0 is due ~1.3 s after B starts
    assert sorted(m.data() for m in at_once) == [b"b0", b"b2", b"b3"]
    for m in at_once:
        await b.acknowledge(m)
    errors = await redelivery_errors(b, due, now_ms)
    print("restored redelivery error ms:", errors)
    assert all(-EARLY_MS <= e <= LATE_MS for e in errors.values()), errors
    assert b.stats()["early_copies_dropped"] >= 3  # the broker's immediate copies of m0, m1, b1
    await expect_nothing(b)
    assert b.stats()["batch_records"] == 0 and b.tracker.pending == 0
    await b.close()
    assert decode(path.read_bytes()).pending == 0

    await asyncio.sleep(SETTLE_S)
    async with await tracked(client, t) as fresh:  # everything, the batch entry too, is acked at the broker
        await expect_nothing(fresh)


@pytest.mark.broker
async def test_without_its_batch_records_a_restored_batch_entry_waits_for_its_last_nack(client, topic, tmp_path,
                                                                                        caplog):
    """The batch-record file is lost (the snapshot alone survives): B cannot
    tell the nacked message of the entry from its siblings, so every copy of
    the entry is held until the entry's nack is due, then all surface: late
    for the siblings, never early for the nacked one, nothing lost."""
    t = topic("blind")
    path = tmp_path / "nacks.snap"
    await publish_batch(client, t, 3)
    a = await tracked(client, t, snapshot_path=path)
    b0, b1, b2 = [await a.receive(timeout_ms=5000) for _ in range(3)]
    await a.negative_acknowledge(b0, delay_ms=1500)
    due = now_ms() + 1500
    await a.acknowledge(b1)
    await a.close()
    os.unlink(str(path) + BATCHES_SUFFIX)
    with caplog.at_level(logging.WARNING, logger="nacktracker.consumer"):
        b = await tracked(client, t, snapshot_path=path)
    assert "no batch records" in caplog.text
    first = await b.receive(timeout_ms=4000)
    assert now_ms() >= due - EARLY_MS
    rest = await receive_all(b, 600)
    assert sorted(m.data() for m in [first] + rest) == [b"b0", b"b1", b"b2"]
    for m in [first] + rest:
        await b.acknowledge(m)
    assert b.stats()["early_copies_dropped"] >= 3
    await b.close()


@pytest.mark.broker
async def test_a_corrupted_snapshot_refuses_to_start_unless_told_to_ignore_it(client, topic, tmp_path, caplog):
    t = topic("corrupt")
    path = tmp_path / "nacks.snap"
    path.write_bytes(b"\x89NAKSNP\n" + b"\0" * 40)
    with pytest.raises(SnapshotError, match="nacks.snap.*snapshot_on_error='ignore'"):
        await tracked(client, t, snapshot_path=path)
    assert path.exists()  # evidence kept
    with caplog.at_level(logging.WARNING, logger="nacktracker.consumer"):
        consumer = await tracked(client, t, snapshot_path=path, snapshot_on_error="ignore")
    assert "starting without it" in caplog.text
    assert (tmp_path / "nacks.snap.corrupt").exists() and consumer.stats()["restored"] == 0
    await consumer.close()
    assert decode(path.read_bytes()).pending == 0  # a good snapshot replaces it

    batches = tmp_path / ("nacks.snap" + BATCHES_SUFFIX)
    batches.write_bytes(b"00000000\n{}")  # a corrupted batch-record file is refused as well
    with pytest.raises(SnapshotError, match="corrupted batch records"):
        await tracked(client, t, snapshot_path=path)
    # one intact but from another snapshot (a crash between the two writes) is ignored
    body = b'{"snapshot_crc32":1,"entries":[]}'
    batches.write_bytes(b"%08x\n" % zlib.crc32(body) + body)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nacktracker.consumer"):
        consumer = await tracked(client, t, snapshot_path=path)
    assert "belongs to another snapshot" in caplog.text
    await consumer.close()
    with pytest.raises(SnapshotError, match="directory does not exist"):
        await tracked(client, t, snapshot_path=tmp_path / "missing" / "nacks.snap")
    with pytest.raises(ValueError, match="snapshot_on_error"):
        await tracked(client, t, snapshot_path=path, snapshot_on_error="warn")
    with pytest.raises(ValueError, match="snapshot_interval_s"):
        await tracked(client, t, snapshot_path=path, snapshot_interval_s=0)
    with pytest.raises(ValueError, match="dedup_capacity needs dedup"):
        await tracked(client, t, dedup=False, dedup_capacity=10)

    # unsubscribing drops the nacks with the subscription, and the files with them
    consumer = await tracked(client, t, snapshot_path=path)
    await consumer.unsubscribe()
    assert not path.exists() and not batches.exists()


@pytest.mark.broker
async def test_a_failing_snapshot_write_is_counted_and_the_final_one_raises(client, topic, tmp_path):
    """The snapshot directory vanishes under a running consumer: periodic saves
    fail (logged, counted) while consuming goes on; the final save on close
    raises, after the consumer is closed all the same."""
    t = topic("nodir")
    where = tmp_path / "gone"
    where.mkdir()
    await publish(client, t, 1)
    consumer = await tracked(client, t, snapshot_path=where / "nacks.snap", snapshot_interval_s=0.1)
    msg = await consumer.receive(timeout_ms=5000)
    await consumer.negative_acknowledge(msg, delay_ms=60_000)
    shutil.rmtree(where)  # (with the consumer's lock and owner files)
    for _ in range(250):  # two periodic saves (every 0.1 s) fail; a loaded machine may take longer
        if consumer.stats()["snapshot_failures"] >= 2:
            break
        await asyncio.sleep(0.02)
    assert consumer.stats()["snapshot_failures"] >= 2
    with pytest.raises(SnapshotError, match="cannot write snapshot") as info:
        await consumer.close()
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert consumer.closed and consumer.tracker.closed


# -- dedup ----------------------------------------------------------------------------------

@pytest.mark.broker
@own_broker_only
@pytest.mark.parametrize("dedup", [False, True], ids=["without-dedup", "with-dedup"])
async def test_acked_batch_siblings_never_surface_again_after_a_broker_kill(crashable, crashable_client, topic,
                                                                            dedup):
    """One entry of four: b0 acked, b1 nacked and acked when it comes back, b2
    and b3 still held. The entry is not acknowledged at the broker (b2, b3
    are not), so after a SIGKILL the broker resends all four. b2 and b3 are
    still held: they never surface again. With ``dedup`` the Deduplicator
    remembers b0 and b1: nothing surfaces. Without it (the documented cost)
    b0, acked before b1's nack made the entry's record, comes back with b1's
    redelivery, and after the restart the record has ended (it outlives its
    last nack only while a requested copy may still come): the acked siblings
    may surface again, the held ones still do not. Acking b2 and b3
    completes the entry at the broker."""
    client, t = crashable_client, topic("dedup")
    await publish_batch(client, t, 4)
    consumer = await tracked(client, t, dedup=dedup)
    b0, b1, b2, b3 = [await consumer.receive(timeout_ms=5000) for _ in range(4)]
    await consumer.acknowledge(b0)
    await consumer.negative_acknowledge(b1, delay_ms=300)
    redelivered = []
    while not redelivered or redelivered[-1].data() != b"b1":
        redelivered.append(await consumer.receive(timeout_ms=3000))
        await consumer.acknowledge(redelivered[-1])
    assert [m.data() for m in redelivered] == ([b"b1"] if dedup else [b"b0", b"b1"])
    await asyncio.sleep(SETTLE_S)
    received = consumer.stats()["received"]
    await kill_and_restart(crashable)
    # reconnecting takes a while: the client's reconnect backoff doubles while the broker is down (a JVM
    # restart on a busy machine took over 15 s once), up to the C++ client's 60 s
    deadline = now_ms() + 60_000
    while consumer.stats()["received"] < received + 4 and now_ms() < deadline:
        await asyncio.sleep(0.05)
    assert consumer.stats()["received"] == received + 4  # the broker resent the whole entry
    again = await receive_all(consumer, 600)
    assert [m.data() for m in again] == [] if dedup else {m.data() for m in again} <= {b"b0", b"b1"}
    stats = consumer.stats()
    assert stats["held_copies_dropped"] >= 2 and stats["acked_copies_dropped"] >= (2 if dedup else 0)
    for m in [b2, b3] + again:
        await consumer.acknowledge(m)
    await consumer.close()
    await asyncio.sleep(SETTLE_S)
    async with await tracked(client, t) as fresh:  # the entry is acknowledged at the broker
        await expect_nothing(fresh)
