"""Retry letters and dead letters through TrackedConsumer without a broker: a
fake client (its producers record what they send), a fake consumer and the
fake broker adapter, every timing on ManualClock. What a retry topic may hold
(anything any producer wrote) never stops the consumer; one letter per
message; the toolkit's behaviours pinned one by one."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pulsar = pytest.importorskip("pulsar")
import pulsar.asyncio  # noqa: E402

from nacktracker import ManualClock  # noqa: E402
from nacktracker.consumer import (  # noqa: E402
    ConsumerOptions,  # noqa: E402
    ReceiveTimeout,
    TrackedConsumer,
)
from nacktracker.errors import DeadLetterError, LetterInFlightError  # noqa: E402
from test_consumer_shell import FakeBroker, FakeConsumer, FakeId, settle  # noqa: E402
from test_dead_letters import FakeClient  # noqa: E402

TOPIC = "persistent://public/default/fake"
RETRY = f"{TOPIC}-sub-RETRY"
DLQ = f"{TOPIC}-sub-DLQ"
START_MS = 1_000_000
#: the wall clock the consumer reads (its failure side's ``wall_ms``): START_WALL when the ManualClock reads START_MS
START_WALL = 1_700_000_000_000

#: The retry topic's worst, as found by a hostile user: a superscript two (``str.isdigit()`` says yes, ``int()``
#: no), 5,000 digits (``int()``'s digit limit), 10^400 (overflows a C long and a float), and friends.
WORST_VALUES = ["²", "1" * 5000, "1" + "0" * 400, "-1", "", " 7", "7 ", "0x10", "1e3", "٣", "NaN", "9" * 19, "\x00"]


class Message(pulsar.Message):
    """A received message as the consumer and the dead-letter publisher look at one."""

    def __init__(self, entry: int, topic: str = TOPIC, props=None, publish_ms: int = 0, count: int = 0,
                 index: int = -1, size: int = 0) -> None:
        self._id = FakeId(entry, index, size)
        self._topic, self._props, self._publish, self._count = topic, dict(props or {}), publish_ms, count

    def message_id(self): return self._id
    def topic_name(self): return self._topic
    def redelivery_count(self): return self._count
    def data(self): return b"%s%d" % (b"r" if self._topic == RETRY else b"m", self._id.entry_id())
    def properties(self): return dict(self._props)
    def publish_timestamp(self): return self._publish
    def partition_key(self): return ""
    def ordering_key(self): return ""
    def event_timestamp(self): return 0


class Letters:
    """A TrackedConsumer on fakes with retries on (max_redeliveries 3, retry_lead_ms 0)."""

    def __init__(self, **options) -> None:
        self.clock = ManualClock(START_MS)
        self.raw = FakeConsumer()
        self.client = FakeClient()
        self.broker = FakeBroker(self.clock, self.raw, 30, 20)
        self.broker.multi_topic = True  # the main topic and the retry topic: keys carry their topic
        self.broker.message_type = lambda entry, index, size, count: Message(entry, index=index, size=size,
                                                                              count=count)
        opts = dict(precision_bits=0, enable_retry=True, retry_letter_topic=RETRY, max_redeliveries=3,
                    dead_letter_topic=DLQ, retry_lead_ms=0)
        opts.update(options)
        self.consumer = TrackedConsumer(self.raw, client=self.client, adapter=self.broker, clock=self.clock,
                                        options=ConsumerOptions.check(opts))
        self.consumer._failures.wall_ms = lambda: START_WALL + (self.clock.now_ms() - START_MS)
        self.got: list = []  # (ms since start, data)

    def wall(self) -> int:
        return int(START_WALL + (self.clock.now_ms() - START_MS))

    def feed(self, msg) -> None:
        self.raw.queue.put_nowait(msg)

    async def drain(self) -> list:
        """Everything the consumer hands over now (the pump refills its queue of ``prefetch`` meanwhile)."""
        out: list = []
        while True:
            await settle()
            before = len(out)
            while True:
                try:
                    msg = await self.consumer.receive(timeout_ms=0)
                except ReceiveTimeout:
                    break
                self.got.append((self.clock.now_ms() - START_MS, msg.data()))
                out.append(msg)
            if len(out) == before:
                return out

    async def advance(self, ms: int) -> list:
        out = []
        for _ in range(ms):
            self.clock.advance(1)
            out.extend(await self.drain())
        return out

    def sent(self, topic: str) -> list:
        """(payload, send options) of every letter published to ``topic``."""
        return [s for p in self.client.producers if p.topic == topic for s in p.sent]

    async def close(self) -> None:
        await self.consumer.close()


@pytest.fixture
async def letters():
    made = []

    def make(**kw) -> Letters:
        made.append(Letters(**kw))
        return made[-1]

    yield make
    for h in made:
        await h.close()


# -- the retry topic's worst never stops the consumer ---------------------------------------

async def feed_worst_then_good(h: Letters, first_entry: int) -> list:
    """The worst values as DELAY_TIME and RECONSUMETIMES of retry copies, then a good retry copy due in
    100 ms: returns what surfaced at once."""
    entries = itertools.count(first_entry)
    for value in WORST_VALUES:
        h.feed(Message(next(entries), RETRY, {"DELAY_TIME": value, "RECONSUMETIMES": "1"}, publish_ms=h.wall()))
        h.feed(Message(next(entries), RETRY, {"DELAY_TIME": "0", "RECONSUMETIMES": value}, publish_ms=h.wall()))
    h.feed(Message(next(entries), RETRY, {"DELAY_TIME": "100", "RECONSUMETIMES": "1"}, publish_ms=h.wall()))
    h.feed(Message(next(entries), TOPIC))  # and a first delivery behind them all
    return await h.drain()


async def test_the_retry_topics_worst_surfaces_and_the_good_messages_behind_it_are_delivered(letters):
    h = letters()
    at_once = await feed_worst_then_good(h, 100)
    # each bad copy surfaces as it came (its due time unreadable: nothing to hold it for), the main topic's too
    assert len(at_once) == 2 * len(WORST_VALUES) + 1
    assert h.consumer.stats()["bad_properties"] == len(WORST_VALUES)  # (a RECONSUMETIMES is read on reconsume)
    later = await h.advance(150)
    assert h.got[len(at_once):] == [(100, b"r126")]  # the good retry, at its due time
    # and the consumer goes on: each of them can be acknowledged, reconsumed or dead-lettered
    for m in at_once + later:
        await h.consumer.acknowledge(m)
    h.feed(Message(500, TOPIC))
    assert [m.data() for m in await h.drain()] == [b"m500"]


async def test_after_a_restart_the_worst_still_surfaces(letters):
    """The bad copies were not acknowledged: the broker sends them to the next consumer, which keeps going too."""
    first = letters()
    await feed_worst_then_good(first, 100)
    await first.close()
    again = letters()
    at_once = await feed_worst_then_good(again, 100)
    assert len(at_once) == 2 * len(WORST_VALUES) + 1
    assert [m.data() for m in await again.advance(150)] == [b"r126"]


#: The three values the issue found stopping the pump for good (the rest of WORST_VALUES are their friends).
ISSUE_VALUES = {"superscript-two": "²", "5000-digits": "1" * 5000, "1e400": "1" + "0" * 400}


@pytest.mark.parametrize("value", ISSUE_VALUES.values(), ids=ISSUE_VALUES.keys())
async def test_one_retry_copy_with_a_bad_delay_time_never_stops_the_pump(letters, value):
    """One such copy alone, a good message behind it: both surface, and so does the next one."""
    h = letters()
    h.feed(Message(1, RETRY, {"DELAY_TIME": value, "RECONSUMETIMES": "1"}, publish_ms=h.wall()))
    h.feed(Message(2, TOPIC))
    assert sorted(m.data() for m in await h.drain()) == [b"m2", b"r1"]
    h.feed(Message(3, TOPIC))
    assert [m.data() for m in await h.drain()] == [b"m3"]


async def test_a_bad_delay_time_is_counted_and_logged(letters, caplog):
    h = letters()
    h.feed(Message(1, RETRY, {"DELAY_TIME": "²"}, publish_ms=h.wall()))
    assert len(await h.drain()) == 1
    assert h.consumer.stats()["bad_properties"] == 1
    assert "DELAY_TIME" in caplog.text


async def test_reconsuming_a_message_whose_count_is_unreadable_dead_letters_it_naming_the_property(letters):
    h = letters()
    for entry, value in enumerate(WORST_VALUES[:4]):
        h.feed(Message(entry, RETRY, {"RECONSUMETIMES": value, "DELAY_TIME": "0", "app": "kept"},
                       publish_ms=h.wall()))
    msgs = await h.drain()
    for m in msgs:
        await h.consumer.reconsume_later(m, delay_ms=10)
    dead = h.sent(DLQ)
    assert len(dead) == 4 and h.sent(RETRY) == []
    for _, options in dead:
        props = options["properties"]
        assert props["DEAD_LETTER_REASON"].startswith("property RECONSUMETIMES=")
        assert props["DEAD_LETTER_EXCEPTION"] == "nacktracker.errors.PropertyError"
        assert "RECONSUMETIMES" not in props and props["app"] == "kept"
    assert h.raw.acks == [m.data() for m in msgs]  # each acknowledged once its dead letter was published
    assert h.consumer.stats()["dead_letters_bad_property"] == 4


PROPERTY_NAMES = ["RECONSUMETIMES", "DELAY_TIME", "REAL_TOPIC", "ORIGIN_MESSAGE_ID", "ORIGIN_MESSAGE_IDY_TIME",
                  "REAL_SUBSCRIPTION", "DEAD_LETTER_REASON", "app"]
values = st.one_of(st.text(max_size=30), st.integers(-10, 10 ** 30).map(str), st.sampled_from(WORST_VALUES),
                   st.builds(lambda a, b, c: f"{a}:{b}:{c}", st.integers(-5, 2 ** 64), st.integers(-5, 2 ** 64),
                             st.integers(-5, 2 ** 33)))
property_dicts = st.dictionaries(st.one_of(st.sampled_from(PROPERTY_NAMES), st.text(max_size=8)), values,
                                 max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(props=property_dicts, from_retry_topic=st.booleans())
def test_any_properties_surface_and_any_reconsume_publishes_exactly_one_letter(props, from_retry_topic):
    """Whatever a message's properties, it surfaces (now, or at a readable due time), the good message
    behind it too, and its reconsume publishes exactly one letter: a retry, or a dead letter whose
    reason names the property it could not read."""

    async def run() -> None:
        h = Letters()
        try:
            h.feed(Message(1, RETRY if from_retry_topic else TOPIC, props, publish_ms=h.wall()))
            h.feed(Message(2, TOPIC))
            got = await h.drain()
            if len(got) < 2:  # a readable DELAY_TIME held the retry copy: it surfaces at its due time
                h.clock.advance(int(props["DELAY_TIME"]))
                got += await h.drain()
            assert sorted(m.message_id().entry_id() for m in got) == [1, 2]
            [bad] = [m for m in got if m.message_id().entry_id() == 1]
            await h.consumer.reconsume_later(bad, delay_ms=5)
            retries, dead = h.sent(RETRY), h.sent(DLQ)
            assert len(retries) + len(dead) == 1 and h.raw.acks == [bad.data()]
            if dead:
                sent = dead[0][1]["properties"]
                if sent.get("DEAD_LETTER_EXCEPTION") == "nacktracker.errors.PropertyError":  # refused
                    name = sent["DEAD_LETTER_REASON"].split("=")[0].removeprefix("property ")
                    assert name in PROPERTY_NAMES and sent.get(name) != props[name]  # not carried on
                else:  # its retries ran out
                    assert int(sent["RECONSUMETIMES"]) == int(props["RECONSUMETIMES"]) + 1 > 3
        finally:
            await h.close()

    asyncio.run(run())


# -- one letter per message ------------------------------------------------------------------


async def letter_call_pairs(c, msgs) -> None:
    """Two letter calls on each message, all gathered at once, the pair's kinds in turn (dead + dead,
    reconsume + dead, dead + reconsume, reconsume + reconsume): each message's first call is taken, its
    second refused with LetterInFlightError."""

    def pair(i: int, m):
        return [lambda: (c.dead_letter(m, reason="a"), c.dead_letter(m, reason="b")),
                lambda: (c.reconsume_later(m, delay_ms=60_000), c.dead_letter(m, reason="c")),
                lambda: (c.dead_letter(m, reason="d"), c.reconsume_later(m, delay_ms=1)),
                lambda: (c.reconsume_later(m, delay_ms=5), c.reconsume_later(m, delay_ms=6))][i % 4]()

    results = await asyncio.gather(*[call for i, m in enumerate(msgs) for call in pair(i, m)],
                                   return_exceptions=True)
    firsts, seconds = results[0::2], results[1::2]
    assert firsts == [None] * len(msgs), {type(r) for r in firsts}
    assert all(isinstance(r, LetterInFlightError) for r in seconds), {type(r) for r in seconds}

async def test_1000_concurrent_letter_call_pairs_publish_exactly_1000_letters(letters):
    h = letters()
    n = 1000
    for entry in range(n):
        h.feed(Message(entry))
    msgs = await h.drain()
    assert len(msgs) == n

    await letter_call_pairs(h.consumer, msgs)
    letters_sent = h.sent(RETRY) + h.sent(DLQ)
    assert len(letters_sent) == n
    assert sorted(payload for payload, _ in letters_sent) == sorted(m.data() for m in msgs)
    assert sorted(h.raw.acks) == sorted(m.data() for m in msgs)
    # the first call of each pair decided which letter: a retry or a dead letter
    assert len(h.sent(RETRY)) == n // 2 and len(h.sent(DLQ)) == n // 2
    # settled: a third call is refused as acknowledged, not as in flight
    with pytest.raises(ValueError, match="acknowledged already"):
        await h.consumer.dead_letter(msgs[0], reason="late")


async def test_a_letter_call_while_the_tracker_dead_letters_the_message_is_refused(letters):
    h = letters(max_redeliveries=1)
    h.broker.publish()
    [m] = await h.drain()
    await h.consumer.negative_acknowledge(m, delay_ms=10)
    [copy] = await h.advance(40)
    await h.consumer.negative_acknowledge(copy)  # its last redelivery: the tracker's hook dead-letters it now
    with pytest.raises(LetterInFlightError, match="being published already"):
        await h.consumer.dead_letter(copy, reason="twice")
    await h.advance(5)
    for _ in range(50):
        await asyncio.sleep(0.01)  # the fake client's producer takes 10 ms to make
        if h.raw.acks:
            break
    assert len(h.sent(DLQ)) == 1 and h.raw.acks == [copy.data()]


async def test_after_a_failed_letter_the_message_may_be_lettered_again(letters):
    h = letters()
    h.feed(Message(1))
    [m] = await h.drain()
    h.client.fail_sends = 1
    with pytest.raises(DeadLetterError):
        await h.consumer.dead_letter(m, reason="first")
    stats = h.consumer.stats()
    # a failed explicit dead letter: not counted, nothing left in flight, the message not acknowledged
    assert stats["terminal_dead_letters"] == 0 and h.raw.acks == []
    await h.consumer.dead_letter(m, reason="second")
    assert [o["properties"]["DEAD_LETTER_REASON"] for _, o in h.sent(DLQ)] == ["second"]
    assert h.consumer.stats()["terminal_dead_letters"] == 1 and h.raw.acks == [m.data()]


# -- limits at the call ----------------------------------------------------------------------

async def test_a_reconsume_delay_beyond_what_the_client_holds_is_refused_at_the_call(letters):
    h = letters()
    h.feed(Message(1))
    [m] = await h.drain()
    for delay in (10 ** 30, 2 ** 31):
        with pytest.raises(ValueError, match=r"delay_ms must be <= 2147483647 ms \(the longest delay the client holds"):
            await h.consumer.reconsume_later(m, delay_ms=delay)
    assert h.sent(RETRY) == [] and h.raw.acks == []
    await h.consumer.reconsume_later(m, delay_ms=2 ** 31 - 1)  # the limit itself is taken
    assert len(h.sent(RETRY)) == 1


def test_every_option_is_checked_within_the_clients_limits_naming_the_option_and_the_limit():
    from nacktracker.consumer.options import ConsumerOptions

    def refused(**options) -> str:
        with pytest.raises((TypeError, ValueError)) as caught:
            ConsumerOptions.check(options, has_client=True)
        return str(caught.value)

    assert "max_redeliveries must be from 1 to 2147483647" in refused(max_redeliveries=-1)
    assert "max_redeliveries must be from 1 to 2147483647" in refused(max_redeliveries=0)
    assert "max_redeliveries must be from 1 to 2147483647" in refused(max_redeliveries=2 ** 31)
    assert "did you mean enable_retry?" in refused(retry_enable=True)
    assert "did you mean enable_retry?" in refused(enableRetry=True)
    for name in ("retry_lead_ms", "delay_ms"):
        message = refused(enable_retry=True, **{name: 2 ** 40})
        assert message.startswith(f"{name}") and "<= 2147483647 ms" in message
    assert "backoff's longest delay must be <= 2147483647 ms" in refused(
        enable_retry=True, backoff=__import__("nacktracker").MultiplierBackoff(1, 2 ** 40))
    for name in ("lead_ms", "min_gap_ms"):
        assert refused(**{name: 10 ** 30}).startswith(f"{name} must be <= ")
    assert refused(ack_timeout_ms=10 ** 30).startswith("ack_timeout_ms must be <= ")
    # without retries a long default delay is the tracker's alone (no client limit)
    assert ConsumerOptions.check({"delay_ms": 2 ** 40}, has_client=True).delay_ms == 2 ** 40


# -- every public call on the consumer's own loop -----------------------------------------------

def test_receive_and_every_call_from_another_loop_or_after_the_loop_closed_is_refused_clearly():
    made: dict = {}

    async def start() -> None:
        h = Letters()
        h.feed(Message(1))
        made["msg"] = (await h.drain())[0]
        made["h"] = h
        h.feed(Message(2))
        await settle()
        # from another loop (in another thread), while this one runs
        errors: list = []

        def elsewhere() -> None:
            for call in (lambda: h.consumer.receive(timeout_ms=0), lambda: h.consumer.acknowledge(made["msg"]),
                         lambda: h.consumer.negative_acknowledge(made["msg"]),
                         lambda: h.consumer.dead_letter(made["msg"], reason="x")):
                try:
                    asyncio.run(call())
                except RuntimeError as exc:
                    errors.append(str(exc))

        await asyncio.get_running_loop().run_in_executor(None, elsewhere)
        assert len(errors) == 4 and all("from the event loop it was created in" in e for e in errors)
        assert h.consumer.tracker.pending == 0 and h.raw.acks == []  # nothing reached the tracker or the client

    asyncio.run(start())
    h = made["h"]
    with pytest.raises(RuntimeError, match="event loop is closed"):
        asyncio.run(h.consumer.negative_acknowledge(made["msg"]))
    with pytest.raises(RuntimeError, match="event loop is closed"):
        asyncio.run(h.consumer.receive(timeout_ms=0))


# -- snapshots: whose they are, one consumer per path, only regular files --------------------------

class Fakes:
    """A fake consumer of ``subscription`` on ``topic`` and the fake broker, for TrackedConsumers made by hand."""

    def __init__(self, subscription: str, topic: str) -> None:
        self.clock = ManualClock(START_MS)
        self.raw = FakeConsumer()
        self.raw.subscription_name = lambda: subscription
        self.raw.topic = lambda: topic
        self.broker = FakeBroker(self.clock, self.raw, 30, 20)

    async def close(self) -> None:
        pass


def snapshot_consumer(path, subscription: str = "sub", topic: str = TOPIC, **options):
    h = Fakes(subscription, topic)
    options.setdefault("snapshot_interval_s", None)
    return h, (lambda: TrackedConsumer(h.raw, adapter=h.broker, clock=h.clock, options=ConsumerOptions(
        snapshot_path=path, precision_bits=0, **options)))


async def nacked_and_closed(path, n: int = 5) -> None:
    """Subscription "sub" of TOPIC nacks ``n`` messages for 60 s and closes: its snapshot holds them."""
    h, make = snapshot_consumer(path)
    consumer = make()
    for _ in range(n):
        h.broker.publish()
    await settle()
    for m in [await consumer.receive(timeout_ms=0) for _ in range(n)]:
        await consumer.negative_acknowledge(m, delay_ms=60_000)
    await consumer.close()
    await h.close()


@pytest.mark.parametrize("other", ["subscription", "topic"])
async def test_another_consumers_snapshot_is_refused_or_with_ignore_nothing_is_restored(tmp_path, other):
    from nacktracker.snapshot import SnapshotError

    path = tmp_path / "nacks.snap"
    await nacked_and_closed(path)
    kw = {"subscription": "other"} if other == "subscription" else {"topic": TOPIC + "-other"}
    h, make = snapshot_consumer(path, **kw)
    with pytest.raises(SnapshotError, match="belongs to another consumer.*path of its own"):
        make()
    h2, make_ignoring = snapshot_consumer(path, snapshot_on_error="ignore", **kw)
    consumer = make_ignoring()
    assert consumer.stats()["restored"] == 0 and consumer.tracker.pending == 0 and consumer.stats()["delivery_counts"] == 0
    h2.broker.publish()
    await settle()
    assert (await consumer.receive(timeout_ms=0)).data() == b"e0.-1"  # its own first delivery, not held back
    await consumer.close()
    # the owner's own consumer is refused now: the files were taken over by the one that ignored
    h3, make_owner = snapshot_consumer(path)
    with pytest.raises(SnapshotError, match="belongs to another consumer"):
        make_owner()
    for x in (h, h2, h3):
        await x.close()


async def test_the_owner_restores_its_own_snapshot(tmp_path):
    path = tmp_path / "nacks.snap"
    await nacked_and_closed(path)
    h, make = snapshot_consumer(path)
    consumer = make()
    assert consumer.stats()["restored"] == 5
    await consumer.close()
    await h.close()


async def test_one_consumer_per_snapshot_path_at_a_time_and_a_killed_holder_leaves_no_lock(tmp_path):
    import subprocess
    import sys

    from nacktracker.snapshot import SnapshotError

    path = tmp_path / "nacks.snap"
    h, make = snapshot_consumer(path)
    first = make()
    h2, make_second = snapshot_consumer(path, snapshot_on_error="ignore")
    with pytest.raises(SnapshotError, match="in use by another consumer"):
        make_second()
    await first.close()
    second = make_second()  # the first let go at its close
    await second.close()
    # a process holding the path is killed -9: the kernel drops its lock with it
    holder = subprocess.Popen([sys.executable, "-c", (
        "import asyncio, sys\n"
        "from nacktracker.consumer.persist import SnapshotStore\n"
        f"store = SnapshotStore({str(path)!r}, 'raise')\n"
        "store._lock()\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(SnapshotError, match="in use by another consumer"):
            make_second()
        holder.kill()
        holder.wait(10)
        third = make_second()
        await third.close()
    finally:
        holder.kill()
        holder.wait(10)
    for x in (h, h2):
        await x.close()


@pytest.mark.parametrize("kind", ["a character device", "a FIFO"], ids=["dev-zero", "fifo"])
async def test_a_snapshot_path_that_is_a_device_or_a_fifo_is_refused_at_once(tmp_path, kind):
    """/dev/zero (read without bound before: MemoryError) and a FIFO (its open() blocked before)."""
    import os

    from nacktracker.snapshot import SnapshotError

    path = tmp_path / "path"
    if kind == "a FIFO":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    h, make = snapshot_consumer(path)
    with pytest.raises(SnapshotError, match=f"not a regular file \\({kind}\\)"):
        make()
    h2, make_ignoring = snapshot_consumer(path, snapshot_on_error="ignore")
    consumer = make_ignoring()
    assert consumer.stats()["restored"] == 0
    await consumer.close()  # its save refuses to replace the device or the FIFO: counted
    assert consumer.stats()["snapshot_failures"] == 1
    for x in (h, h2):
        await x.close()
    if kind == "a character device":
        assert os.path.realpath(path) == "/dev/zero" and os.path.exists("/dev/zero")


async def drive(h, handle, ms: int, dead_letters: int) -> None:
    """Hand every delivery to ``handle`` while the clock moves ``ms`` in 1 ms steps, then wait until the
    dead-letter topic holds ``dead_letters`` messages (the fake producers' creation takes real time)."""
    await handle(await h.drain())
    for _ in range(ms):
        h.clock.advance(1)
        await handle(await h.drain())
        await asyncio.sleep(0)
    for _ in range(100):
        if len(h.sent(DLQ)) >= dead_letters:
            break
        await asyncio.sleep(0.01)
    await settle()


# -- every counter against what the topics received ----------------------------------------------

async def test_after_a_mixed_run_every_counter_equals_what_the_topics_received(letters):
    """Nacks until max_redeliveries, dead_letter() calls, reconsumes, ack timeouts until their last
    delivery, one reconsume of an unreadable count: each counter equals what the fake client's
    producers sent to the retry and dead-letter topics (and the redeliveries the broker was asked for)."""
    h = letters(max_redeliveries=2, ack_timeout_ms=100)
    groups = {"nacked": range(0, 10), "dead_letter": range(10, 20), "reconsumed": range(20, 30),
              "timed_out": range(30, 40)}
    group_of = {e: g for g, entries in groups.items() for e in entries}
    for _ in range(40):
        h.broker.publish()
    h.feed(Message(99, RETRY, {"RECONSUMETIMES": "²", "DELAY_TIME": "0"}, publish_ms=h.wall()))
    nacks = 0

    async def handle(msgs) -> None:
        nonlocal nacks
        for m in msgs:
            entry = m.message_id().entry_id()
            group = "bad" if m.topic_name() == RETRY else group_of[entry]
            if group == "nacked":
                nacks += m.redelivery_count() < 2  # the third delivery's nack dead-letters it at once
                await h.consumer.negative_acknowledge(m, delay_ms=10)
            elif group == "dead_letter":
                await h.consumer.dead_letter(m, reason="poison")
            elif group in ("reconsumed", "bad"):
                await h.consumer.reconsume_later(m, delay_ms=10)
            # timed_out: neither acked nor nacked

    await drive(h, handle, 1500, dead_letters=31)
    dead = [(group_of.get(int(p[1:]), "bad"), o["properties"]) for p, o in h.sent(DLQ)]
    by_group = {g: sum(1 for d, _ in dead if d == g) for g in ("nacked", "dead_letter", "timed_out", "bad")}
    assert by_group == {"nacked": 10, "dead_letter": 10, "timed_out": 10, "bad": 1}
    stats = h.consumer.stats()
    assert stats["dead_letters_max_redeliveries"] == by_group["nacked"]
    assert stats["dead_letters_dead_letter"] == by_group["dead_letter"] == stats["terminal_dead_letters"]
    assert stats["dead_letters_ack_timeout"] == by_group["timed_out"]
    assert stats["dead_letters_bad_property"] == by_group["bad"]
    assert stats["dead_lettered"] == len(dead) == stats["dead_letter_published"]
    assert stats["retry_letters"] == len(h.sent(RETRY)) == 10
    assert stats["nacks"] == nacks == 20
    # each timed-out message was redelivered until its last delivery (counts 1 and 2): what the broker was asked
    asked = sum(h.broker.counts.get(e, 0) for e in groups["timed_out"])
    assert stats["ack_timeout_redeliveries"] == asked == 20


async def test_ack_timeouts_are_not_nacks_and_every_dead_letter_is_counted_once_in_stats_and_metrics(letters):
    """One message nacked until max_redeliveries, one dead_letter() call, one never settled (ack timeouts
    until its last delivery): 2 nacks and 2 ack-timeout redeliveries apart, 3 dead letters (one of each
    cause), the same in stats() and in the OpenTelemetry counters an operator reads."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from nacktracker.metrics import instrument_consumer

    h = letters(max_redeliveries=2, ack_timeout_ms=100)
    reader = InMemoryMetricReader()
    registration = instrument_consumer(h.consumer, meter_provider=MeterProvider(metric_readers=[reader]))
    for _ in range(3):
        h.broker.publish()

    async def handle(msgs) -> None:
        for m in msgs:
            entry = m.message_id().entry_id()
            if entry == 0:
                await h.consumer.negative_acknowledge(m, delay_ms=10)
            elif entry == 1:
                await h.consumer.dead_letter(m, reason="poison")
            # entry 2: neither acknowledged nor nacked

    await drive(h, handle, 600, dead_letters=3)
    assert sorted(p for p, _ in h.sent(DLQ)) == [b"m0", b"m1", b"m2"]
    stats = h.consumer.stats()
    expected = {"nacks": 2, "ack_timeout_redeliveries": 2, "dead_lettered": 3, "dead_letters_max_redeliveries": 1,
                "dead_letters_dead_letter": 1, "dead_letters_ack_timeout": 1, "dead_letters_bad_property": 0,
                "retry_letters": 0}
    assert {k: stats[k] for k in expected} == expected
    points = {m.name: m.data.data_points[0].value for rm in reader.get_metrics_data().resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics if m.name in {
                  "nacktracker.nacks", "nacktracker.dead_lettered", "nacktracker.ack_timeout.redeliveries"}}
    assert points == {"nacktracker.nacks": 2, "nacktracker.dead_lettered": 3, "nacktracker.ack_timeout.redeliveries": 2}
    registration.close()


# -- the retry and dead-letter toolkit, pinned behaviour by behaviour ------------------------------

async def test_reconsume_without_a_delay_takes_the_backoff_of_its_reconsume_count(letters):
    import datetime

    h = letters(backoff=lambda n: 100 * (n + 1), delay_ms=7)
    for entry, times in ((1, None), (2, "2")):
        props = {} if times is None else {"RECONSUMETIMES": times, "DELAY_TIME": "0"}
        h.feed(Message(entry, RETRY if times else TOPIC, props, publish_ms=h.wall()))
    msgs = sorted(await h.drain(), key=lambda m: m.message_id().entry_id())
    for m in msgs:
        await h.consumer.reconsume_later(m)
    sent = [o for _, o in h.sent(RETRY)]
    assert [(o["properties"]["RECONSUMETIMES"], o["properties"]["DELAY_TIME"]) for o in sent] == [("1", "100"),
                                                                                                   ("3", "300")]
    assert [o["deliver_after"] for o in sent] == [datetime.timedelta(milliseconds=100),
                                                  datetime.timedelta(milliseconds=300)]
    h2 = letters(delay_ms=250)  # without a backoff: the consumer's delay_ms
    h2.feed(Message(1))
    [m] = await h2.drain()
    await h2.consumer.reconsume_later(m)
    assert h2.sent(RETRY)[0][1]["properties"]["DELAY_TIME"] == "250"


async def test_the_retrys_deliver_after_is_its_delay_less_the_lead_never_below_zero(letters):
    import datetime

    h = letters(retry_lead_ms=2000)
    for entry in (1, 2):
        h.feed(Message(entry))
    m1, m2 = sorted(await h.drain(), key=lambda m: m.message_id().entry_id())
    await h.consumer.reconsume_later(m1, delay_ms=5000)
    await h.consumer.reconsume_later(m2, delay_ms=1500)
    first, second = [o for _, o in h.sent(RETRY)]
    assert first["deliver_after"] == datetime.timedelta(milliseconds=3000)
    assert first["properties"]["DELAY_TIME"] == "5000"  # the due time the consumer holds a copy until
    assert "deliver_after" not in second and second["properties"]["DELAY_TIME"] == "1500"


async def test_re_dead_lettering_replaces_the_reason_and_drops_a_stale_exception(letters):
    h = letters()
    old = {"DEAD_LETTER_REASON": "old", "DEAD_LETTER_EXCEPTION": "builtins.KeyError", "app": "x"}
    h.feed(Message(1, props=old))
    h.feed(Message(2, props=old))
    m1, m2 = sorted(await h.drain(), key=lambda m: m.message_id().entry_id())
    await h.consumer.dead_letter(m1, reason="new")
    await h.consumer.dead_letter(m2, reason="newer", exception=ValueError("v"))
    p1, p2 = [o["properties"] for _, o in h.sent(DLQ)]
    assert p1["DEAD_LETTER_REASON"] == "new" and "DEAD_LETTER_EXCEPTION" not in p1 and p1["app"] == "x"
    assert p2["DEAD_LETTER_REASON"] == "newer" and p2["DEAD_LETTER_EXCEPTION"] == "ValueError"


async def test_a_failed_dead_letter_leaves_nothing_in_flight_and_the_count_unchanged(letters):
    h = letters()
    h.feed(Message(1))
    [m] = await h.drain()
    h.client.fail_sends = 1
    with pytest.raises(DeadLetterError):
        await h.consumer.dead_letter(m, reason="first")
    assert h.consumer._dead_letters.in_flight == {}  # noqa: SLF001  (what a second call is checked against)
    assert h.consumer.stats()["terminal_dead_letters"] == 0 == h.consumer.stats()["dead_letters_dead_letter"]
    assert h.raw.acks == [] and h.consumer.stats()["dead_letter_failed"] == 1
    await h.consumer.negative_acknowledge(m, delay_ms=10)  # still the application's to settle: a nack works
    assert h.consumer.tracker.pending == 1


async def test_the_consumers_count_when_the_brokers_starts_above_it_then_resets():
    """The broker's count starts at 5 (redeliveries before this consumer): the consumer takes it, then
    counts on from there when the broker's count resets (a broker restart)."""
    from test_consumer_shell import Harness

    h = Harness(precision_bits=0, backoff=lambda n: 100 * (n + 1))
    h.broker.counts[0] = 5
    h.broker.publish()
    received = []
    try:
        for _ in range(4000):
            h.clock.advance(1)
            await settle()
            for m in await h.drain():
                received.append((h.clock.now_ms(), m.redelivery_count()))
                if len(received) == 2:
                    h.broker.counts.clear()  # the broker restarted: its counts are gone
                await h.consumer.negative_acknowledge(m)
            if len(received) == 5:
                break
    finally:
        await h.close()
    counts = [c for _, c in received]
    gaps = [b[0] - a[0] for a, b in zip(received, received[1:])]
    assert counts == [5, 6, 1, 2, 3]  # what the broker said, reset after the second delivery
    assert gaps == [600, 700, 800, 900]  # what the consumer decided with: 5, 6, 7, 8


async def test_the_ack_timeout_backoff_grows_on_after_a_broker_count_reset():
    from test_consumer_shell import Harness

    h = Harness(precision_bits=0, ack_timeout_ms=100, ack_timeout_backoff=lambda n: 100 * (n + 1))
    h.broker.publish()
    received = []
    try:
        for _ in range(3000):
            h.clock.advance(1)
            await settle()
            for m in await h.drain():  # never acknowledged: each delivery's ack timeout passes
                received.append((h.clock.now_ms(), m.redelivery_count()))
                if len(received) == 3:
                    h.broker.counts.clear()
            if len(received) == 5:
                break
    finally:
        await h.close()
    counts = [c for _, c in received]
    gaps = [b[0] - a[0] for a, b in zip(received, received[1:])]
    assert counts == [0, 1, 2, 1, 2]
    assert gaps == [100, 200, 300, 400]  # the consumer's own count kept the backoff growing


# -- concurrent letter calls, as a state machine ---------------------------------------------------

from hypothesis.stateful import RuleBasedStateMachine, invariant, rule  # noqa: E402


class LetterCalls(RuleBasedStateMachine):
    """Letter calls started concurrently on a few messages (reconsume_later, dead_letter, a nack
    that reaches max_redeliveries), with publishes failing at random; the loop runs in between.
    Promises: a call that starts while a letter of its message is in flight is refused at once
    (LetterInFlightError), one on an acknowledged message too (ValueError); every message gets at
    most one letter, published exactly when it was acknowledged; nothing stays in flight once the
    calls are done."""

    MESSAGES = 4

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.h = self.loop.run_until_complete(self._make())
        self.tasks: list = []  # (entry, task)

    async def _make(self) -> Letters:
        h = Letters(max_redeliveries=1)
        for entry in range(self.MESSAGES):
            h.feed(Message(entry, count=1))  # each at its last delivery: a nack dead-letters it
        self.msgs = {m.message_id().entry_id(): m for m in await h.drain()}
        return h

    def acked(self, entry: int) -> bool:
        return self.msgs[entry].data() in self.h.raw.acks

    @rule(entry=st.integers(0, MESSAGES - 1), kind=st.sampled_from(["dead_letter", "reconsume", "nack"]))
    def start(self, entry: int, kind: str) -> None:
        c, m = self.h.consumer, self.msgs[entry]
        call = {"dead_letter": lambda: c.dead_letter(m, reason="r"),
                "reconsume": lambda: c.reconsume_later(m, delay_ms=5),
                "nack": lambda: c.negative_acknowledge(m)}[kind]()
        earlier = [t for e, _, t in self.tasks if e == entry]
        task = self.loop.create_task(call)
        self.loop.run_until_complete(asyncio.sleep(0))  # the call's first step: checked, its letter queued
        if task.done() and isinstance(task.exception(), LetterInFlightError):
            assert earlier, "refused as in flight with no letter of it ever started"
        self.tasks.append((entry, kind, task))

    @rule()
    def fail_next_publish(self) -> None:
        self.h.client.fail_sends += 1

    @rule()
    def run(self) -> None:
        async def settle_all() -> None:
            in_flight = self.h.consumer._dead_letters.in_flight  # noqa: SLF001  (the tracker's letters too)
            for _ in range(500):
                if all(t.done() for _, _, t in self.tasks) and not in_flight:
                    break
                await asyncio.sleep(0.002)
            await settle()

        self.loop.run_until_complete(settle_all())

    @invariant()
    def at_most_one_letter_per_message_and_only_with_its_ack(self) -> None:
        letters = [p for p, _ in self.h.sent(RETRY) + self.h.sent(DLQ)]
        in_flight = {k.entry_id for k in self.h.consumer._dead_letters.in_flight}  # noqa: SLF001
        for entry, m in self.msgs.items():
            assert letters.count(m.data()) <= 1, (entry, letters)
            if entry not in in_flight and all(t.done() for e, _, t in self.tasks if e == entry):
                assert (letters.count(m.data()) == 1) == self.acked(entry), (entry, letters, self.h.raw.acks)

    def teardown(self) -> None:
        self.run()
        assert all(t.done() for _, _, t in self.tasks)
        for _, _, t in self.tasks:
            exc = t.exception()
            assert exc is None or isinstance(exc, (LetterInFlightError, ValueError, DeadLetterError)), repr(exc)
        assert self.h.consumer._dead_letters.in_flight == {}  # noqa: SLF001
        self.loop.run_until_complete(self.h.close())
        self.loop.close()


LetterCalls.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
test_concurrent_letter_calls_keep_one_letter_per_message = LetterCalls.TestCase


async def test_a_nack_while_its_messages_dead_letter_is_in_flight_publishes_no_second_one(letters):
    h = letters(max_redeliveries=1)
    h.feed(Message(1, count=1))  # at its last delivery: a nack would dead-letter it
    [m] = await h.drain()
    await asyncio.gather(h.consumer.dead_letter(m, reason="r"), h.consumer.negative_acknowledge(m))
    for _ in range(100):
        await asyncio.sleep(0.005)
        if h.raw.acks:
            break
    await settle()
    assert [p for p, _ in h.sent(DLQ)] == [b"m1"] and h.raw.acks == [b"m1"]
    assert h.consumer.stats()["nacks_while_lettered"] == 1


async def test_a_letter_call_ends_the_messages_ack_timeout_and_a_failed_one_restarts_it(letters):
    h = letters(ack_timeout_ms=100)
    h.broker.publish()
    [m0] = await h.drain()
    slow = asyncio.ensure_future(h.consumer.dead_letter(m0, reason="r"))  # its producer takes a while to make
    await asyncio.sleep(0)
    await h.advance(150)  # the ack timeout's time passes while the letter is being published
    assert h.broker.counts == {} and h.consumer.stats()["ack_timeout_redeliveries"] == 0
    await slow
    h.broker.publish()
    [m1] = await h.drain()
    h.client.fail_sends = 1
    with pytest.raises(DeadLetterError):
        await h.consumer.dead_letter(m1, reason="r")
    await h.advance(150)  # the failed letter left m1 with the application: its ack timeout runs again
    assert h.broker.counts == {1: 1} and h.consumer.stats()["ack_timeout_redeliveries"] == 1


@pytest.mark.parametrize("with_path", [True, False], ids=["saved-to-the-snapshot", "without-a-snapshot"])
def test_a_consumer_whose_loop_closed_first_says_what_became_of_its_nacks(tmp_path, with_path):
    """The application's loop ended with a nack pending and the consumer open: its close (from a new
    loop) says so, and with a snapshot_path saves it there, where the next consumer restores it."""
    path = tmp_path / "nacks.snap"
    made: dict = {}

    async def run() -> None:
        h = made["h"] = Letters(**({"snapshot_path": path, "snapshot_interval_s": None} if with_path else {}))
        h.feed(Message(1))
        [m] = await h.drain()
        await h.consumer.negative_acknowledge(m, delay_ms=60_000)

    asyncio.run(run())
    consumer = made["h"].consumer
    expected = "were saved to its snapshot_path" if with_path else "cannot be redelivered"
    with pytest.raises(RuntimeError, match=f"loop closed before the consumer: its 1 pending nacks {expected}"):
        asyncio.run(consumer.close())
    assert consumer.closed
    if with_path:
        async def restart() -> int:
            again = Letters(snapshot_path=path, snapshot_interval_s=None)  # the lock was let go
            restored = again.consumer.stats()["restored"]
            await again.close()
            return restored

        assert asyncio.run(restart()) == 1
