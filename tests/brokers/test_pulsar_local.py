"""Exclusive and Failover subscriptions against the embedded broker: nacks are
redelivered locally (the broker can only resend everything unacknowledged on
them, and pulsar-lite does not even do that), plus seek and the prefetch queue.

Ports the spirit of Java's NegativeAcksTest (nack everything, everything comes
back) and of acknowledge_cumulative usage; the adapter and the shell alone:
``tests/consumer/test_local_redelivery.py``.
"""

from __future__ import annotations

import asyncio

import pytest

pulsar = pytest.importorskip("pulsar")
import pulsar.asyncio  # noqa: E402

import nacktracker  # noqa: E402
from broker_helpers import publish_batch, redelivery_errors, settle_before_restart  # noqa: E402
from nacktracker.adapters import LocalRedeliveryAdapter, PulsarAdapter  # noqa: E402
from nacktracker.consumer import PROPERTY_REAL_TOPIC, ReceiveTimeout  # noqa: E402
from test_pulsar import expect_nothing  # noqa: E402

Earliest = pulsar.InitialPosition.Earliest
Types = pulsar.ConsumerType
LOCAL = [Types.Exclusive, Types.Failover]
EARLY_MS = 5
#: How long before the first due time the restart test reads how many copies are held.
HELD_CHECK_MS = 50
LATE_MS = 250


def now_ms() -> float:
    return asyncio.get_running_loop().time() * 1000.0


async def publish(client, t, n, batched):
    if batched:
        await publish_batch(client, t, n, prefix=b"m")
        return
    producer = await client.create_producer(t, batching_enabled=False)
    await asyncio.gather(*[producer.send(b"m%d" % i) for i in range(n)])
    await producer.close()


async def tracked(client, t, kind, **options):
    return await nacktracker.subscribe(client, t, "sub", consumer_type=kind, initial_position=Earliest, **options)


async def receive_n(consumer, n, timeout_ms=5_000):
    return [await consumer.receive(timeout_ms=timeout_ms) for _ in range(n)]


def settled(consumer):
    s = consumer.stats()
    return s["pending"], s["locally_kept"], s["batch_records"], s["parked"]


@pytest.mark.broker
@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
@pytest.mark.parametrize("kind", LOCAL, ids=lambda k: k.name)
async def test_nacked_messages_come_back_at_their_time_and_acked_or_held_siblings_do_not(client, topic, kind,
                                                                                        batched):
    t = topic()
    await publish(client, t, 6, batched)
    async with await tracked(client, t, kind, precision_bits=0) as consumer:
        assert isinstance(consumer.adapter, LocalRedeliveryAdapter)
        msgs = await receive_n(consumer, 6)
        assert [m.data() for m in msgs] == [b"m%d" % i for i in range(6)]
        if batched:
            assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in msgs}) == 1
        await consumer.acknowledge(msgs[0])
        await consumer.acknowledge(msgs[2])
        due = {}
        for i, delay in ((1, 300), (3, 500), (4, 400)):  # m5 stays in the application's hands
            nacked_at = now_ms()  # the nack is stamped inside the call: its due time is never before this
            await consumer.negative_acknowledge(msgs[i], delay_ms=delay)
            due[b"m%d" % i] = nacked_at + delay
        back, errors = [], []
        for _ in range(3):
            msg = await consumer.receive(timeout_ms=3_000)
            errors.append(now_ms() - due[msg.data()])
            back.append(msg.data())
            assert msg.redelivery_count() == 1  # back once, from memory: counted as the broker counts its own
            await consumer.acknowledge(msg)
        assert back == [b"m1", b"m4", b"m3"], back
        assert all(-EARLY_MS <= e <= LATE_MS for e in errors), errors
        await expect_nothing(consumer, 600)  # m0, m2 acked; m5 held: neither comes back
        await consumer.acknowledge(msgs[5])
        stats = consumer.stats()
        # one request per entry: the batch (whole-entry redelivery) brings m1, m3 and m4 at once
        assert stats["redelivered"] == (1 if batched else 3)
        assert stats["held"] == 0 and settled(consumer) == (0, 0, 0, 0)
    async with await tracked(client, t, kind) as again:  # everything was acknowledged at the broker
        await expect_nothing(again, 800)


@pytest.mark.broker
@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
async def test_java_negative_acks_ten_messages_nack_all_all_ten_come_back_on_failover(client, topic, batched):
    """Java NegativeAcksTest#testNegativeAcks on a Failover subscription: send
    10, receive 10, nack all, receive the same 10 again, ack them, nothing more."""
    t = topic()
    await publish(client, t, 10, batched)
    async with await tracked(client, t, Types.Failover, delay_ms=300, precision_bits=0) as consumer:
        first = await receive_n(consumer, 10)
        for msg in first:
            await consumer.negative_acknowledge(msg)
        again = await receive_n(consumer, 10, timeout_ms=3_000)
        assert sorted(m.data() for m in again) == sorted(m.data() for m in first)
        for msg in again:
            await consumer.acknowledge(msg)
        await expect_nothing(consumer, 600)
        assert settled(consumer) == (0, 0, 0, 0)


@pytest.mark.broker
@pytest.mark.parametrize("kind", LOCAL, ids=lambda k: k.name)
async def test_local_redeliveries_count_for_backoff_and_dead_letter_after_max_redeliveries(client, topic, pumps,
                                                                                           kind):
    t = topic()
    dlq_pump = pumps(await client.subscribe(f"{t}-sub-DLQ", "inspect", consumer_type=Types.Shared))
    await publish(client, t, 1, batched=False)
    counts: list[int] = []

    def backoff(count: int) -> int:
        counts.append(count)
        return 100 + 50 * count

    async with await tracked(client, t, kind, precision_bits=0, backoff=backoff, max_redeliveries=2) as consumer:
        msg = await consumer.receive(timeout_ms=5_000)
        deliveries, seen = 1, [msg.redelivery_count()]
        while True:
            await consumer.negative_acknowledge(msg)
            try:
                msg = await consumer.receive(timeout_ms=1_500)
            except ReceiveTimeout:
                break
            deliveries += 1
            seen.append(msg.redelivery_count())
        assert deliveries == 3 and counts == [0, 1, 2]  # the third nack (count 2) dead-letters it
        assert seen == [0, 1, 2]  # each copy from memory counted, as the broker counts its redeliveries
        _, dead = await dlq_pump.get()
        assert dead.data() == b"m0" and dead.properties()[PROPERTY_REAL_TOPIC] == t
        stats = consumer.stats()
        assert (stats["dead_lettered"], stats["dead_letter_published"]) == (1, 1)
        assert settled(consumer) == (0, 0, 0, 0)
    await asyncio.sleep(0.2)
    async with await tracked(client, t, kind) as again:
        await expect_nothing(again, 500)  # the dead-lettered message was acknowledged
    assert dlq_pump.queue.empty()


@pytest.mark.broker
@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
@pytest.mark.parametrize("kind", LOCAL, ids=lambda k: k.name)
async def test_cumulative_ack_acknowledges_and_cancels_the_pending_nacks_it_covers(client, topic, kind, batched):
    """acknowledge_cumulative as applications use it (one in-order worker):
    nacked messages behind the mark are acknowledged by it, as in Pulsar, and
    never come back; one past the mark comes back at its time."""
    t = topic()
    await publish(client, t, 10, batched)
    async with await tracked(client, t, kind, precision_bits=0) as consumer:
        msgs = await receive_n(consumer, 10)
        for i in (2, 4, 8):
            await consumer.negative_acknowledge(msgs[i], delay_ms=500)
        await consumer.acknowledge_cumulative(msgs[6])  # covers m0..m6: the nacks of m2 and m4 go
        stats = consumer.stats()
        assert stats["locally_kept"] == 1  # m8
        # one entry per nack, or one batch entry (pending once per bucket its nacks fell in: 1 to 3)
        assert stats["pending"] == 1 if not batched else 1 <= stats["pending"] <= 3
        back = await consumer.receive(timeout_ms=3_000)
        assert back.data() == b"m8"
        await consumer.acknowledge_cumulative(msgs[9])
        await expect_nothing(consumer, 800)
        assert settled(consumer) == (0, 0, 0, 0) and consumer.stats()["held"] == 0
    async with await tracked(client, t, kind) as again:  # all of it acknowledged at the broker
        await expect_nothing(again, 800)


@pytest.mark.broker
async def test_subscribe_picks_the_redelivery_path_by_subscription_type(client, topic):
    t = topic()
    for kind, adapter in ((Types.Shared, PulsarAdapter), (Types.KeyShared, PulsarAdapter),
                          (Types.Exclusive, LocalRedeliveryAdapter), (Types.Failover, LocalRedeliveryAdapter)):
        async with await nacktracker.subscribe(client, t, f"s-{kind.name}", consumer_type=kind) as consumer:
            assert type(consumer.adapter) is adapter
            assert consumer.options.redelivery == ("local" if adapter is LocalRedeliveryAdapter else "broker")
    async with await nacktracker.subscribe(client, t, "s-default") as consumer:  # Exclusive, as the client's
        assert type(consumer.adapter) is LocalRedeliveryAdapter and consumer.options.redelivery == "local"
    with pytest.raises(ValueError, match="Exclusive"):  # the default type, named in the refusal
        await nacktracker.subscribe(client, t, "bad", redelivery="broker")
    with pytest.raises(ValueError, match="Failover"):
        await nacktracker.subscribe(client, t, "bad", consumer_type=Types.Failover, redelivery="broker")
    with pytest.raises(ValueError, match="redelivery"):
        await nacktracker.subscribe(client, t, "bad", consumer_type=Types.Shared, redelivery="local")


@pytest.mark.broker
async def test_seek_drops_what_the_pump_took_before_it(topic, pulsar_logger, own_broker):
    """The C++ client clears its receive queue on seek; the messages the
    wrapper's pump had already taken must go too: after the seek the next
    receive is the first message, then the rest, each once, as the plain
    client (side by side) receives them.

    Apache Pulsar resends from the seek position at once. pulsar-lite answers
    a seek to a timestamp and then sends nothing (nor on redeliver-all), so
    there the resend comes from a broker restart (it sends every
    unacknowledged message again)."""
    with own_broker() as broker:
        client = pulsar.asyncio.Client(broker.url, logger=pulsar_logger, operation_timeout_seconds=10)
        try:
            t = topic()
            producer = await client.create_producer(t, batching_enabled=False)
            for i in range(6):
                await producer.send(b"m%d" % i)
            await producer.close()
            plain = await client.subscribe(t, "plain", consumer_type=Types.Shared, initial_position=Earliest)
            consumer = await tracked(client, t, Types.Shared)
            assert [m.data() for m in await receive_n(consumer, 2)] == [b"m0", b"m1"]
            assert [(await plain.receive()).data() for _ in range(2)] == [b"m0", b"m1"]
            for _ in range(50):  # let the pump take the other four ahead of the application
                if consumer.stats()["prefetched"] == 4:
                    break
                await asyncio.sleep(0.02)
            assert consumer.stats()["prefetched"] == 4
            await consumer.seek(0)  # a publish timestamp: the earliest (pulsar-lite refuses MessageId.earliest)
            await plain.seek(0)
            plain_got: asyncio.Queue = asyncio.Queue()

            async def pump_plain():  # never cancel the plain client's receive: it would lose a message
                while True:
                    plain_got.put_nowait((await plain.receive()).data())

            plain_task = asyncio.get_running_loop().create_task(pump_plain())
            if broker.kind == "lite":
                assert consumer.stats()["prefetched"] == 0
                await expect_nothing(consumer, 500)
                await asyncio.sleep(0.5)
                assert plain_got.empty()  # the plain client: the same
                await asyncio.get_running_loop().run_in_executor(None, broker.restart)  # the resend
            got = [m.data() for m in await receive_n(consumer, 6, timeout_ms=15_000)]
            assert got == [b"m%d" % i for i in range(6)], got
            await expect_nothing(consumer, 500)  # no stale duplicates
            plain_seen = [await asyncio.wait_for(plain_got.get(), 15) for _ in range(6)]
            assert plain_seen == got
            plain_task.cancel()
            await consumer.close()
        finally:
            await client.close()


@pytest.mark.broker
@pytest.mark.parametrize("kind", LOCAL, ids=lambda k: k.name)
async def test_restart_on_a_snapshot_holds_the_resent_copies_until_due_then_hands_them_back(client, topic, tmp_path,
                                                                                             kind):
    """As tests/brokers/test_reliability.py's restart on Shared: A nacks m0 (2500 ms),
    m1 (3500 ms) and b1 (3000 ms, one message of a batch entry), acks m2, b0,
    b3, holds b2, closes (its kept messages are dropped: the broker still has
    them). B starts on A's snapshot: the broker resends every unacked message at
    once; B surfaces the entry's b0, b2, b3 at once (whole entries; b0 and b3
    acked at the broker only with the entry) and keeps the copies of m0, m1, b1,
    handing each back at its due time, downtime included."""
    t = topic("restart")
    path = tmp_path / "nacks.snap"
    await publish(client, t, 3, batched=False)
    await publish_batch(client, t, 4)
    a = await tracked(client, t, kind, snapshot_path=path, precision_bits=0)
    msgs = {m.data(): m for m in await receive_n(a, 7)}
    due = await settle_before_restart(a, msgs, now_ms)
    assert a.stats()["locally_kept"] == 3
    await asyncio.sleep(0.3)
    await a.close()
    assert a.stats()["locally_kept"] == 0
    await asyncio.sleep(0.5)  # downtime: counts against the delays

    b = await tracked(client, t, kind, snapshot_path=path, precision_bits=0)
    assert b.stats()["restored"] == 3
    # Everything before the first due time surfaces "at once" (Apache Pulsar makes a Failover
    # subscription's new consumer active after activeConsumerFailoverDelayTimeMillis, 1 s by
    # default, so the resend may come late, close to the first due time: no fixed quiet window).
    # The count of held copies is read 50 ms before the first due time: read after the acks, a
    # copy coming back at its due time (up to EARLY_MS before the due time noted here) made it 2.
    first_due = min(due.values()) - EARLY_MS
    at_once = []
    while (left := first_due - HELD_CHECK_MS - now_ms()) > 0:
        try:
            at_once.append(await b.receive(timeout_ms=max(1, round(left))))
        except ReceiveTimeout:
            break
    kept, read_at = b.stats()["locally_kept"], now_ms()
    assert sorted(m.data() for m in at_once) == [b"b0", b"b2", b"b3"]
    assert kept == 3 or read_at >= first_due, kept  # the broker's copies of m0, m1, b1, held back until due
    for m in at_once:
        await b.acknowledge(m)
    errors = await redelivery_errors(b, due, now_ms)
    assert all(-EARLY_MS <= e <= LATE_MS for e in errors.values()), errors
    await expect_nothing(b, 600)
    assert settled(b) == (0, 0, 0, 0)
    await b.close()
