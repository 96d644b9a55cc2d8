"""TrackedConsumer's shell without a broker: a fake consumer and a fake broker
adapter (the seams ``adapter=`` and ``clock=``), every timing on ManualClock.

The fake broker redelivers a requested entry ``latency_ms`` after the
tracker's fire (or sends it to another consumer); the tests check what the
application receives and when, to the millisecond.
"""

from __future__ import annotations

import asyncio
import logging
import shutil

import pytest

pulsar = pytest.importorskip("pulsar")
import pulsar.asyncio  # noqa: E402

from nacktracker import FixedBackoff, ManualClock, MessageKey  # noqa: E402
from nacktracker.consumer import (  # noqa: E402
    ConsumerOptions,  # noqa: E402
    ReceiveTimeout,
    TrackedConsumer,
)

TOPIC = "persistent://public/default/fake"


class FakeId:
    def __init__(self, entry: int, index: int = -1, size: int = 0) -> None:
        self._entry, self._index, self._size = entry, index, size

    def ledger_id(self): return 7
    def entry_id(self): return self._entry
    def batch_index(self): return self._index
    def partition(self): return -1
    def batch_size(self): return self._size


class FakeMessage:
    def __init__(self, entry: int, index: int, size: int, count: int) -> None:
        self._id = FakeId(entry, index, size)
        self._count = count

    def message_id(self): return self._id
    def topic_name(self): return TOPIC
    def redelivery_count(self): return self._count
    def data(self): return b"e%d.%d" % (self._id.entry_id(), self._id.batch_index())
    def properties(self): return {}
    def partition_key(self): return ""
    def ordering_key(self): return ""
    def event_timestamp(self): return 0


class FakeConsumer:
    """The client's consumer: a queue in, a list of acks out."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.acks: list = []
        self.acked_messages: list = []  # the objects, when copies of one message must be told apart
        self.fail_acks = 0
        self.sought: list = []

    async def receive(self):
        return await self.queue.get()

    async def acknowledge(self, message):
        if self.fail_acks:
            self.fail_acks -= 1
            raise RuntimeError("ack failed")
        self.acks.append(message.data())
        self.acked_messages.append(message)

    async def acknowledge_cumulative(self, message):
        raise RuntimeError("cumulative ack is not allowed on Shared subscriptions")

    def topic(self): return TOPIC
    def subscription_name(self): return "sub"
    def consumer_name(self): return "fake"
    def redeliver_unacknowledged_messages(self): pass
    async def close(self): pass

    async def seek(self, target):
        self.sought.append(target)


class FakeBroker:
    """The adapter: each requested entry comes back ``latency_ms`` later (on the
    ManualClock), or goes to another consumer when ``elsewhere`` is set."""

    multi_topic = False

    def __init__(self, clock: ManualClock, consumer: FakeConsumer, lead_ms: int, latency_ms: int) -> None:
        self.clock, self.consumer, self.lead_ms, self.latency_ms = clock, consumer, lead_ms, latency_ms
        self.sizes: dict[int, int] = {}
        self.counts: dict[int, int] = {}
        self.elsewhere = False
        self.batched: set[int] = set()  # entries of one message sent as a batch (batch index 0, size 1)
        self.message_type = FakeMessage

    def publish(self, size: int = 1, batched: bool = False) -> int:
        entry = len(self.sizes)
        self.sizes[entry] = size
        if batched:
            self.batched.add(entry)
        self.send(entry)
        return entry

    def send(self, entry: int) -> None:
        size = self.sizes[entry]
        count = self.counts.get(entry, 0)
        batched = size > 1 or entry in self.batched
        for index in range(size) if batched else [-1]:
            self.consumer.queue.put_nowait(self.message_type(entry, index, size if batched else 0, count))

    async def redeliver(self, keys):
        for key in keys:
            if self.elsewhere:
                continue
            entry = key.entry_id
            self.counts[entry] = self.counts.get(entry, 0) + 1
            self.clock.call_at(self.clock.now_ms() + self.latency_ms, lambda e=entry: self.send(e))


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


class Harness:
    def __init__(self, lead_ms=30, latency_ms=20, client=None, **options) -> None:
        self.clock = ManualClock(1_000_000)
        self.raw = FakeConsumer()
        self.broker = FakeBroker(self.clock, self.raw, lead_ms, latency_ms)
        self.consumer = TrackedConsumer(self.raw, adapter=self.broker, clock=self.clock, client=client,
                                        options=ConsumerOptions.check(options))
        self.got: list = []  # (ms, data, redelivery count)

    async def advance(self, ms: float, ack: bool = False) -> None:
        """Move the clock in 1 ms steps, letting the pump and the application
        run at each (``ack``: the application acks what it gets at once)."""
        for _ in range(int(ms)):
            self.clock.advance(1)
            await settle()
            for msg in await self.drain():
                if ack:
                    await self.consumer.acknowledge(msg)

    async def drain(self) -> list:
        out = []
        while True:
            try:
                msg = await self.consumer.receive(timeout_ms=0)
            except ReceiveTimeout:
                return out
            self.got.append((self.clock.now_ms() - 1_000_000, msg.data(), msg.redelivery_count()))
            out.append(msg)

    async def close(self) -> None:
        await self.consumer.close()


@pytest.fixture
async def harness():
    made = []

    def make(**kw):
        made.append(Harness(**kw))
        return made[-1]

    yield make
    for h in made:
        await h.close()


async def first_delivery(h: Harness, size: int):
    entry = h.broker.publish(size)
    await settle()
    msgs = await h.drain()
    assert len(msgs) == size
    return entry, msgs


async def test_batch_of_four_acked_and_held_siblings_never_surface_again(harness):
    """The first case of an entry of four: m0 acked, m1 nacked 1000 ms, m2 nacked 1120 ms,
    each redelivery acked on arrival, m3 still held. Only m1 and m2 surface
    again, each exactly at its due time, from one redelivery of the entry (m2
    parked until its own); the record ends with m3's ack."""
    h = harness(precision_bits=0)
    _, (m0, m1, m2, m3) = await first_delivery(h, 4)
    h.got.clear()
    await h.consumer.acknowledge(m0)
    await h.consumer.negative_acknowledge(m1, delay_ms=1000)
    await h.consumer.negative_acknowledge(m2, delay_ms=1120)
    await h.advance(1300, ack=True)
    assert [(at, data) for at, data, _ in h.got] == [(1000, b"e0.1"), (1120, b"e0.2")]
    stats = h.consumer.stats()
    assert stats["held_copies_dropped"] >= 1 and stats["acked_copies_dropped"] >= 1 and stats["copies_parked"] >= 1
    assert stats["lateness_ms"]["count"] == 2 and stats["lateness_ms"]["max"] == 0  # each exactly at its due time
    await h.consumer.acknowledge(m3)
    assert h.consumer.stats()["batch_records"] == 0 and h.consumer.tracker.pending == 0


@pytest.mark.parametrize("latency_ms", [5, 29, 45])
async def test_a_copy_that_arrives_early_is_held_until_due(harness, latency_ms):
    """The tracker fires lead (30) ms early; a copy back in 5 or 29 ms waits
    for its due time and surfaces exactly then; one slower than the lead is
    late by the difference, never early."""
    h = harness(precision_bits=0, latency_ms=latency_ms)
    _, (m,) = await first_delivery(h, 1)
    h.got.clear()
    await h.consumer.negative_acknowledge(m, delay_ms=500)
    await h.advance(600)
    assert [(at, count) for at, _, count in h.got] == [(500 + max(0, latency_ms - 30), 1)]
    stats = h.consumer.stats()
    assert stats["copies_parked"] == (1 if latency_ms < 30 else 0)
    # lateness_ms is the surfaced message against its due time; the timer's own figure is apart
    assert stats["lateness_ms"] == {"count": 1, "p50": max(0, latency_ms - 30), "p99": max(0, latency_ms - 30),
                                    "max": max(0, latency_ms - 30)}
    assert stats["timer_lag_ms"]["count"] == 1 and stats["timer_lag_ms"]["max"] == 0  # fired at due - lead


async def test_lateness_listeners_see_each_redelivered_message_and_can_be_removed(harness):
    h = harness(precision_bits=0, latency_ms=40)  # each copy back 10 ms after its due time
    _, (m0, m1, m2) = await first_delivery(h, 3)
    seen: list[float] = []
    remove = h.consumer.lateness.add_listener(seen.append)
    h.consumer.lateness.add_listener(lambda ms: 1 / 0)  # a failing listener is logged and kept
    with pytest.raises(TypeError):
        h.consumer.lateness.add_listener("not callable")
    await h.consumer.negative_acknowledge(m0, delay_ms=200)
    await h.consumer.negative_acknowledge(m1, delay_ms=300)
    await h.advance(250, ack=True)
    remove()
    await h.advance(100, ack=True)
    assert seen == [10]  # m0 only: the listener was removed before m1 surfaced
    assert h.consumer.stats()["lateness_ms"]["count"] == 2


async def test_coarse_buckets_release_at_the_bucket_start_never_earlier(harness):
    h = harness(precision_bits=6, latency_ms=5)  # 64 ms buckets, rounding floor
    _, (m,) = await first_delivery(h, 1)
    h.got.clear()
    await h.consumer.negative_acknowledge(m, delay_ms=1000)  # due 1000, bucket 960 (clock starts at 1e6)
    await h.advance(1100)
    [(at, _, _)] = h.got
    assert 1000 - 63 <= at <= 1000


async def test_copies_at_another_consumer_do_not_keep_records(harness):
    """Several consumers on one subscription: the requested copies go to another
    consumer. Records and requests expire once overdue; nothing grows."""
    h = harness(precision_bits=0)
    entries = [await first_delivery(h, 3) for _ in range(5)]
    h.broker.elsewhere = True
    for _, msgs in entries:
        await h.consumer.negative_acknowledge(msgs[1], delay_ms=100)
        for m in (msgs[0], msgs[2]):
            await h.consumer.acknowledge(m)
    assert h.consumer.stats()["batch_records"] == 5
    h.clock.advance(200)
    await settle()
    assert h.consumer.stats()["batch_records"] == 5  # still waiting for the copies
    h.clock.advance(10_000)
    await settle()
    stats = h.consumer.stats()
    assert (stats["batch_records"], stats["copies_overdue"], stats["parked"]) == (0, 5, 0)


async def test_cumulative_ack_that_fails_changes_nothing_and_one_that_succeeds_settles_records(harness):
    h = harness(precision_bits=0)
    _, (a, b) = await first_delivery(h, 2)
    await h.consumer.negative_acknowledge(a, delay_ms=300)
    with pytest.raises(RuntimeError, match="cumulative"):
        await h.consumer.acknowledge_cumulative(b)
    assert h.consumer.stats()["batch_records"] == 1 and h.consumer.tracker.pending == 1

    async def cumulative(message):
        h.raw.acks.append(("cumulative", message.data()))

    h.raw.acknowledge_cumulative = cumulative
    await h.consumer.acknowledge_cumulative(b)
    assert h.consumer.stats()["batch_records"] == 0 and h.consumer.stats()["held"] == 0
    h.got.clear()
    await h.advance(400)
    assert h.got == []  # the nacked message was covered: its copy is dropped


async def test_a_failed_ack_leaves_the_pending_nack_in_place(harness):
    """The ack raises: the nack stays pending and the message comes back on time."""
    h = harness(precision_bits=0)
    _, (m,) = await first_delivery(h, 1)
    await h.consumer.negative_acknowledge(m, delay_ms=200)
    h.raw.fail_acks = 1
    with pytest.raises(RuntimeError, match="ack failed"):
        await h.consumer.acknowledge(m)
    assert h.consumer.tracker.pending == 1
    h.got.clear()
    await h.advance(300)
    assert [(at, count) for at, _, count in h.got] == [(200, 1)]


async def test_a_nack_after_an_ack_is_ignored(harness, caplog):
    h = harness(precision_bits=0)
    _, (m,) = await first_delivery(h, 1)
    await h.consumer.acknowledge(m)
    with caplog.at_level(logging.WARNING, logger="nacktracker.consumer"):
        await h.consumer.negative_acknowledge(m, delay_ms=100)
    assert "acknowledged already" in caplog.text
    assert h.consumer.tracker.pending == 0 and h.consumer.stats()["nacks_after_ack"] == 1
    assert h.consumer.stats()["batch_records"] == 0


async def test_acked_and_held_messages_never_surface_again_whatever_copies_arrive(harness):
    """A reconnect makes the broker resend everything unacknowledged, twice:
    the acked entry and the held one are dropped, the nacked one waits for its
    due time and surfaces once."""
    h = harness(precision_bits=0, backoff=FixedBackoff(400))
    acked, (ma,) = await first_delivery(h, 1)
    held, (mh,) = await first_delivery(h, 1)
    nacked, (mn,) = await first_delivery(h, 1)
    await h.consumer.acknowledge(ma)
    await h.consumer.negative_acknowledge(mn)  # the backoff's 400 ms
    h.got.clear()
    for _ in range(2):
        for entry in (acked, held, nacked):
            h.broker.send(entry)
    await h.advance(500)
    assert [(at, data) for at, data, _ in h.got] == [(400, mn.data())]
    stats = h.consumer.stats()
    assert stats["acked_copies_dropped"] == 2 and stats["held_copies_dropped"] == 2
    assert stats["early_copies_dropped"] == 2
    await h.consumer.acknowledge(mh)


async def test_siblings_still_arriving_when_one_is_nacked_surface(harness):
    h = harness(precision_bits=0, prefetch=1)
    h.broker.publish(3)
    await settle()
    first = await h.consumer.receive(timeout_ms=0)
    await h.consumer.negative_acknowledge(first, delay_ms=100)
    rest = []
    for _ in range(5):
        await settle()
        rest += await h.drain()
    assert [m.data() for m in rest] == [b"e0.1", b"e0.2"]


class SettlingBroker(FakeBroker):
    """A broker adapter that asks the consumer whether an entry is still being consumed (as PulsarAdapter)."""

    sibling_held = None
    settle_waits = 0


async def test_an_entry_is_still_consumed_while_its_messages_are_held_or_still_on_their_way(harness):
    """A request for an entry must wait while the application has not gone through it: its messages held,
    or not yet taken by the pump (still in the client's queue: the broker would send them again). Once
    the nack is due, it waits no more."""
    h = harness(precision_bits=0, prefetch=1)
    await h.consumer.close()  # (made with the plain fake broker: one that asks is made below)
    h.raw = FakeConsumer()
    h.broker = SettlingBroker(h.clock, h.raw, 30, 20)
    h.broker.message_type = LetterMessage  # a pulsar.Message: the consumer reads its entry's size from its id
    h.consumer = TrackedConsumer(h.raw, adapter=h.broker, clock=h.clock,
                                 options=ConsumerOptions(precision_bits=0, prefetch=1))
    still_consumed = h.broker.sibling_held
    assert still_consumed is not None
    h.broker.publish(4)
    await settle()
    first = await h.consumer.receive(timeout_ms=0)  # the pump has taken no other message of the entry yet
    await h.consumer.negative_acknowledge(first, delay_ms=100)
    entry = MessageKey(7, 0, -1, -1, TOPIC)
    assert still_consumed(entry)  # nothing of it held: three messages still on their way
    rest = []
    for _ in range(3):
        await settle()
        rest += await h.drain()
    assert [m.data() for m in rest] == [b"e0.1", b"e0.2", b"e0.3"]
    assert still_consumed(entry)  # all taken, three held
    for msg in rest[:2]:
        await h.consumer.acknowledge(msg)
    assert still_consumed(entry)  # one held
    h.clock.advance(100)
    assert not still_consumed(entry)  # due: asking now is late already
    await h.consumer.acknowledge(rest[2])


async def test_the_learned_lead_is_read_by_the_tracker_at_every_fire(harness):
    h = harness(precision_bits=0, latency_ms=10)
    _, (m,) = await first_delivery(h, 1)
    h.broker.lead_ms = 80  # an adapter that learned a longer path
    await h.consumer.negative_acknowledge(m, delay_ms=300)
    assert h.consumer.tracker.next_fire_ms() == 1_000_000 + 300 - 80
    assert h.consumer.stats()["lead_ms"] == 80


async def test_boundary_errors_change_nothing(harness):
    h = harness(precision_bits=0)
    _, (m,) = await first_delivery(h, 1)
    with pytest.raises(ValueError):
        await h.consumer.negative_acknowledge(m, delay_ms=-1)
    with pytest.raises(TypeError):
        await h.consumer.negative_acknowledge(MessageKey(1, 2))
    with pytest.raises(TypeError, match=r"ConsumerOptions\(\) got an unexpected keyword argument .delay.: did you mean delay_ms"):
        TrackedConsumer(h.raw, adapter=h.broker, clock=h.clock, options=ConsumerOptions.check({"delay": 5}))
    with pytest.raises(TypeError, match="options must be a ConsumerOptions, not dict"):
        TrackedConsumer(h.raw, adapter=h.broker, clock=h.clock, options={"delay_ms": 5})
    with pytest.raises(ValueError, match="dedup_capacity needs dedup"):
        TrackedConsumer(h.raw, adapter=h.broker, clock=h.clock, options=ConsumerOptions(dedup=False, dedup_capacity=5))
    with pytest.raises(ValueError, match="delay_ms must be <="):  # refused here, not at every nack
        TrackedConsumer(h.raw, adapter=h.broker, clock=h.clock, options=ConsumerOptions(delay_ms=2**63))
    assert h.consumer.tracker.pending == 0 and h.consumer.stats()["held"] == 1


async def test_after_close_every_broker_call_raises_consumer_closed(harness):
    import pulsar

    from nacktracker.consumer import ConsumerClosed

    h = harness(precision_bits=0)
    _, (m,) = await first_delivery(h, 1)
    await h.consumer.negative_acknowledge(m, delay_ms=500)
    await h.close()
    calls = {"acknowledge": lambda: h.consumer.acknowledge(m),
             "acknowledge_cumulative": lambda: h.consumer.acknowledge_cumulative(m),
             "negative_acknowledge": lambda: h.consumer.negative_acknowledge(m),
             "receive": lambda: h.consumer.receive(timeout_ms=0),
             "seek": lambda: h.consumer.seek(m.message_id()),
             "get_last_message_id": lambda: h.consumer.get_last_message_id(),
             "unsubscribe": lambda: h.consumer.unsubscribe(),
             "redeliver_unacknowledged_messages": lambda: h.consumer.redeliver_unacknowledged_messages()}
    for name, call in calls.items():
        with pytest.raises(ConsumerClosed) as closed:
            result = call()
            if asyncio.iscoroutine(result):
                await result
        assert isinstance(closed.value, pulsar.AlreadyClosed), name
    assert h.raw.acks == [] and h.consumer.tracker.pending == 1  # nothing reached the client, nothing lost
    await h.consumer.close()  # idempotent


async def test_receivers_waiting_at_once_each_get_one_message_and_timed_out_waits_leave_nothing_behind(harness):
    from nacktracker.consumer import ConsumerClosed, ReceiveTimeout

    h = harness(precision_bits=0)
    await settle()
    for _ in range(50):  # an application polling an idle consumer
        with pytest.raises(ReceiveTimeout):
            await h.consumer.receive(timeout_ms=1)
    assert not h.consumer._pump._receivers  # no wait of theirs is kept
    waiting = [asyncio.ensure_future(h.consumer.receive()) for _ in range(3)]
    await settle()
    h.broker.publish(1)
    h.broker.publish(1)
    await settle()
    got = sorted(task.result().data() for task in waiting if task.done())
    assert got == [b"e0.-1", b"e1.-1"]  # one message each, in order; the third still waits
    await h.consumer.close()
    await settle()
    assert all(task.done() for task in waiting)
    assert isinstance(waiting[2].exception(), ConsumerClosed)  # close wakes it


@pytest.mark.parametrize("timeout, error", [(10**400, ValueError), (2**62, ValueError), (1e300, ValueError),
                                            (-1, ValueError), (float("nan"), ValueError),
                                            (float("inf"), ValueError), (True, TypeError), ("5", TypeError)])
async def test_out_of_range_receive_timeouts_are_refused(harness, timeout, error):
    h = harness(precision_bits=0)
    h.broker.publish(1)
    await settle()
    with pytest.raises(error, match="timeout_ms"):
        await h.consumer.receive(timeout_ms=timeout)
    assert (await h.consumer.receive(timeout_ms=0)).data() == b"e0.-1"  # the message is still there


# -- prefetch, foreign messages, seek ------------------------------------------

@pytest.mark.parametrize("prefetch", [1, 3, 16])
async def test_the_pump_takes_no_more_than_its_window_ahead_of_a_slow_application(harness, prefetch):
    h = harness(precision_bits=0, prefetch=prefetch)
    for _ in range(40):
        h.broker.publish(1)
    taken = []
    for _ in range(40):
        await settle()
        stats = h.consumer.stats()
        assert stats["prefetched"] <= prefetch and stats["received"] - len(taken) <= prefetch, stats
        assert h.raw.queue.qsize() == 40 - stats["received"]  # the rest stays with the client
        msg = await h.consumer.receive(timeout_ms=0)
        taken.append(msg.data())
        await h.consumer.acknowledge(msg)
    assert taken == [b"e%d.-1" % i for i in range(40)]


async def test_nack_of_a_message_this_consumer_did_not_receive_is_refused(harness):
    from nacktracker.consumer import NotReceivedError

    h, other = harness(precision_bits=0), harness(precision_bits=0)
    _, (mine, nacked) = await first_delivery(h, 2)
    theirs = FakeMessage(5, -1, 0, 0)  # another consumer of the subscription received entry 5
    other.raw.queue.put_nowait(theirs)
    await settle()
    assert (await other.consumer.receive(timeout_ms=0)) is theirs
    await h.consumer.negative_acknowledge(nacked, delay_ms=500)
    made_up = FakeId(999)
    for foreign in (theirs, made_up):  # acks of them go to the client as they are (Pulsar's way)
        with pytest.raises(NotReceivedError, match="not received by this consumer") as info:
            await h.consumer.negative_acknowledge(foreign)
        assert isinstance(info.value, ValueError)
    assert h.raw.acks == [] and h.consumer.tracker.pending == 1 and h.consumer.stats()["held"] == 1
    await h.consumer.acknowledge(mine)
    await h.consumer.acknowledge(mine)  # acked before: idempotent (dedup remembers it)
    await h.consumer.acknowledge(nacked)  # a pending nack, its copy not back yet: cancelled
    assert h.consumer.tracker.pending == 0 and h.raw.acks[:3] == [b"e0.0", b"e0.0", b"e0.1"]
    await other.consumer.acknowledge(theirs)


async def test_held_messages_stay_ackable_after_redeliver_all_and_without_dedup_acks_are_forwarded(harness):
    h = harness(precision_bits=0)
    _, (m,) = await first_delivery(h, 1)
    h.consumer.redeliver_unacknowledged_messages()
    await h.consumer.acknowledge(m)  # the application still held it
    loose = harness(precision_bits=0, dedup=False)
    await loose.consumer.acknowledge(FakeMessage(77, -1, 0, 0))  # cannot tell: forwarded as before
    assert loose.raw.acks == [b"e77.-1"]


async def test_seek_rewinds_acked_and_held_messages_surface_again_pending_nacks_stay(harness):
    import pulsar

    h = harness(precision_bits=0)
    entries = [await first_delivery(h, 1) for _ in range(3)]
    (_, (acked,)), (_, (held,)), (_, (nacked,)) = entries
    await h.consumer.acknowledge(acked)
    await h.consumer.negative_acknowledge(nacked, delay_ms=500)
    await h.consumer.seek(1_234)  # a publish timestamp
    await h.consumer.seek(pulsar.MessageId.earliest)
    assert h.raw.sought[0] == 1_234 and isinstance(h.raw.sought[1], pulsar.MessageId)  # what pulsar.asyncio takes
    assert h.raw.sought[1]._msg_id is pulsar.MessageId.earliest
    h.got.clear()
    for entry in range(3):  # the broker resends everything after the seek position
        h.broker.send(entry)
    await settle()
    await h.drain()
    assert [data for _, data, _ in h.got] == [b"e0.-1", b"e1.-1"]  # the nacked one waits for its time
    assert h.consumer.tracker.pending == 1
    with pytest.raises(TypeError, match="seek takes"):
        await h.consumer.seek("e0")


async def test_seek_drops_the_messages_the_pump_took_before_it(harness):
    """The client clears its receive queue on seek (the broker resends
    from the new position); what the pump had taken ahead of the application
    goes too, and surfaces again when the broker resends it."""
    h = harness(precision_bits=0, prefetch=4)
    for _ in range(6):
        h.broker.publish()
    await settle()
    assert h.consumer.stats()["prefetched"] == 4
    first = await h.consumer.receive(timeout_ms=0)
    await settle()
    while not h.raw.queue.empty():  # what the client does on seek: e5 was still in its queue
        h.raw.queue.get_nowait()
    await h.consumer.seek(0)
    assert h.consumer.stats()["prefetched"] == 0
    with pytest.raises(ReceiveTimeout):
        await h.consumer.receive(timeout_ms=0)
    for entry in range(6):  # the broker resends from the start
        h.broker.send(entry)
    got = []
    for _ in range(6):
        await settle()
        got += [m.data() for m in await h.drain()]
    assert first.data() == b"e0.-1" and got == [b"e%d.-1" % i for i in range(6)]  # each once, in order


# -- snapshot paths that cannot be used -----------------------------------------------

def _unusable_paths(tmp_path):
    taken = tmp_path / "a-directory"
    taken.mkdir()
    return {"a directory": taken, "no such directory": tmp_path / "missing" / "nacks.snap"}


@pytest.mark.parametrize("what", ["a directory", "no such directory"])
async def test_an_unusable_snapshot_path_is_a_snapshot_error_unless_ignored(tmp_path, caplog, what):
    """Reading and writing alike: with snapshot_on_error="raise" the consumer
    refuses to start (a SnapshotError naming the path and the option); with
    "ignore" it starts without it, and the final save's failure is logged and
    counted, not raised."""
    from nacktracker.snapshot import SnapshotError
    path = _unusable_paths(tmp_path)[what]
    h = Harness(precision_bits=0)
    with pytest.raises(SnapshotError, match="snapshot_on_error='ignore'"):
        TrackedConsumer(h.raw, adapter=h.broker, clock=h.clock, options=ConsumerOptions(snapshot_path=path))
    with caplog.at_level(logging.WARNING, logger="nacktracker.consumer"):
        consumer = TrackedConsumer(h.raw, adapter=h.broker, clock=h.clock, options=ConsumerOptions(
            snapshot_path=path, snapshot_on_error="ignore", snapshot_interval_s=None))
    assert "starting without it" in caplog.text and consumer.stats()["restored"] == 0
    await consumer.close()  # the final save fails: logged and counted
    assert consumer.stats()["snapshot_failures"] == 1 and "final snapshot" in caplog.text
    await h.close()


async def test_a_save_to_an_unusable_path_raises_a_snapshot_error_at_close(tmp_path):
    """A path that worked at start and cannot be written at close: the close
    finishes everything else, then raises a SnapshotError (its cause the
    OSError)."""
    from nacktracker.snapshot import SnapshotError
    path = tmp_path / "sub" / "nacks.snap"
    path.parent.mkdir()
    h = Harness(precision_bits=0)
    consumer = TrackedConsumer(h.raw, adapter=h.broker, clock=h.clock,
                               options=ConsumerOptions(snapshot_path=path, snapshot_interval_s=None))
    shutil.rmtree(path.parent)  # (with the consumer's lock and owner files)
    with pytest.raises(SnapshotError, match="cannot write snapshot") as info:
        await consumer.close()
    assert isinstance(info.value.__cause__, OSError) and consumer.closed
    await h.close()


# -- direct calls into the client's C++ consumer ------------------------------------------

class FakeRawConsumer:
    """The C++ consumer's async calls: the callback runs during the call
    (``mode="now"``: a queued message, grouped acks), later from another thread
    (``"later"``), or during the call with a failure (``"fail"``)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def _answer(self, callback, *args):
        import threading

        import _pulsar
        if self.mode == "later":
            threading.Timer(0.01, callback, (_pulsar.Result.Ok, *args)).start()
        else:
            callback(_pulsar.Result.Ok if self.mode == "now" else _pulsar.Result.Timeout, *args)

    def receive_async(self, callback):
        self._answer(callback, "raw message")

    def acknowledge_async(self, message, callback):
        self._answer(callback)


@pytest.mark.parametrize("mode", ["now", "later", "fail"])
async def test_direct_calls_take_an_answer_at_once_or_through_a_future(mode):
    import pulsar.asyncio

    from nacktracker.consumer.direct import DirectConsumer, ReceivedMessage

    direct = DirectConsumer.of(pulsar.asyncio.Consumer(FakeRawConsumer(mode), "schema"))
    assert direct is not None and DirectConsumer.of(FakeConsumer()) is None  # anything else: public methods
    if mode == "fail":
        with pytest.raises(pulsar.asyncio.PulsarException):
            direct.receive()
        with pytest.raises(pulsar.asyncio.PulsarException):
            direct.acknowledge(direct.wrap("raw message"))
        return
    got = direct.receive()
    if mode == "later":
        assert isinstance(got, asyncio.Future) and not got.done()
        got = direct.wrap(await asyncio.wait_for(got, 5))
    assert type(got) is ReceivedMessage and got._message == "raw message" and got._schema == "schema"
    acked = direct.acknowledge(got)
    if mode == "now":
        assert acked is None  # accepted during the call: nothing to await
    else:
        assert await asyncio.wait_for(acked, 5) is None


class LetterMessage(FakeMessage, pulsar.Message):
    """A FakeMessage a dead-letter publisher takes (it carries a payload)."""


class GatedProducer:
    """A dead-letter producer whose sends wait for the test: ``release(ok)``."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.ok = True
        self.sent: list = []

    async def send(self, payload, **options):
        await self.gate.wait()
        if not self.ok:
            raise pulsar.asyncio.PulsarException(pulsar.Result.Timeout, "send timed out")
        self.sent.append(payload)
        return FakeId(len(self.sent))

    async def close(self):
        pass


class GatedClient(pulsar.asyncio.Client):
    def __init__(self) -> None:  # no real client
        self.producer = GatedProducer()

    async def create_producer(self, topic, **options):
        return self.producer


@pytest.fixture
def gated():
    """A GatedClient whose gate opens at teardown, whatever the test did (a closing consumer waits for
    the letters in flight)."""
    client = GatedClient()
    yield client
    client.producer.gate.set()


@pytest.mark.parametrize("size", [0, 1, 3], ids=["not-batched", "batch-of-one", "batch-of-three"])
async def test_copies_arriving_while_a_dead_letter_is_published_never_surface_and_are_acked_with_it(
        harness, gated, size):
    """A broker restart resends what is unacknowledged while the message's dead letter is being
    published: the copy must not reach the application again; a batch message's copy is
    acknowledged once the letter's message is (each delivery of a batch entry acks it through its own
    batch acker), then later copies are dropped as acknowledged."""
    h = harness(precision_bits=0, client=gated, max_redeliveries=1, delay_ms=100)
    h.broker.message_type = LetterMessage
    h.broker.counts[0] = 1  # redelivered once already: the next nack dead-letters it
    h.broker.publish(max(size, 1), batched=size == 1)
    await settle()
    first = (await h.drain())[0]
    await h.consumer.negative_acknowledge(first)
    h.broker.send(0)  # the resend, the letter still in flight
    await h.advance(5)
    assert await h.drain() == []
    assert h.consumer.stats()["letter_copies_dropped"] == 1
    gated.producer.gate.set()
    await h.advance(5)
    assert gated.producer.sent == [first.data()]
    copy = [m for m in h.raw.acked_messages if m is not first and m.data() == first.data()]
    assert h.raw.acked_messages.count(first) == 1 and len(copy) == (1 if size else 0)
    h.broker.send(0)  # and again after the letter
    await h.advance(200)
    assert len(h.got) == max(size, 1)  # the first delivery only (and its siblings')


@pytest.mark.parametrize("size", [0, 1], ids=["not-batched", "batch-of-one"])
async def test_a_copy_dropped_while_a_dead_letter_failed_comes_back_with_the_redelivery(harness, gated, size):
    """The letter fails: nothing is lost; the dropped copy is not acknowledged, and the message comes
    back with the tracker's redelivery (the next nack tries the dead letter again)."""
    gated.producer.ok = False
    h = harness(precision_bits=0, client=gated, max_redeliveries=1, delay_ms=100, latency_ms=20)
    h.broker.message_type = LetterMessage
    h.broker.counts[0] = 1
    h.broker.publish(1, batched=size == 1)
    await settle()
    (first,) = await h.drain()
    await h.consumer.negative_acknowledge(first)
    h.broker.send(0)
    await h.advance(5)
    assert await h.drain() == []
    gated.producer.gate.set()
    await h.advance(300)
    assert h.raw.acked_messages == [] and gated.producer.sent == []
    assert [data for _, data, _ in h.got[1:]] == [first.data()], h.got
