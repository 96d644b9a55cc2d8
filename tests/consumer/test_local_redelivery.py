"""Local redelivery (Exclusive and Failover subscriptions) without a broker.

The adapter alone (pure: no pulsar, no clock), then TrackedConsumer over a fake
consumer with the local adapter, every timing on ManualClock. The same
behaviour against the embedded broker: ``tests/brokers/test_pulsar_local.py``.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from nacktracker import ManualClock, MessageKey
from nacktracker.adapters import HandBack, LocalRedeliveryAdapter

T = "persistent://public/default/local"


def key(entry: int, index: int = -1, topic: str = T) -> MessageKey:
    return MessageKey(7, entry, -1, index, topic)


# -- the adapter alone -------------------------------------------------------------------

def test_kept_messages_come_back_once_per_fire_and_are_counted():
    answers: dict[str, HandBack] = {}
    handed: list[str] = []

    def deliver(token):
        handed.append(token)
        return answers.get(token, HandBack.TAKEN)

    adapter = LocalRedeliveryAdapter(deliver)
    assert (adapter.lead_ms, adapter.coalesce_ms) == (0, 0)  # a function call: nothing to fire early for
    adapter.keep(key(1), "m1")
    adapter.keep(key(1), "m1-again")  # kept already: the first token stays
    adapter.keep(key(2, 0), "b0")
    adapter.keep(key(2, 2), "b2")  # a batch entry: only its nacked messages are kept
    assert adapter.stored == 3 and adapter.is_kept(key(2, 2)) and not adapter.is_kept(key(2, 1))
    answers["b2"] = HandBack.NOT_YET  # its own bucket has not fired: kept for that one
    asyncio.run(adapter.redeliver([key(1), key(2), key(3)]))  # entries (batch_index -1), as the tracker fires
    assert handed == ["m1", "b0", "b2"] and adapter.missing == 1  # entry 3: nothing kept
    assert adapter.stored == 1 and adapter.is_kept(key(2, 2))
    assert (adapter.redeliveries(key(1)), adapter.redeliveries(key(2, 0)), adapter.redeliveries(key(2, 2))) == (1, 1, 0)
    answers["b2"] = HandBack.DROPPED  # acked or held again meanwhile: forgotten, not counted
    asyncio.run(adapter.redeliver([key(2)]))
    assert adapter.stored == 0 and adapter.redeliveries(key(2, 2)) == 0 and adapter.handed_back == 2


def test_ack_cumulative_ack_and_close_free_what_is_kept():
    adapter = LocalRedeliveryAdapter(lambda token: HandBack.TAKEN)
    for entry in (1, 2, 3):
        adapter.keep(key(entry), f"m{entry}")
    adapter.keep(key(4, 0), "b0")
    adapter.keep(key(4, 3), "b3")
    adapter.keep(key(1, topic="other"), "elsewhere")  # another topic: no cumulative ack of T covers it
    asyncio.run(adapter.redeliver([key(1)]))
    assert adapter.redeliveries(key(1)) == 1
    assert adapter.forget(key(2)) and not adapter.forget(key(2))  # an ack; a second one finds nothing
    assert adapter.forget_through(key(4, 1)) == [key(3)]  # entry 4 keeps b3, past the mark
    assert adapter.stored == 2 and adapter.is_kept(key(4, 3)) and adapter.redeliveries(key(1)) == 0
    assert adapter.forget_through(key(9)) == [key(4)]
    asyncio.run(adapter.aclose())
    assert adapter.stored == 0


def test_the_adapter_refuses_bad_input_and_needs_its_consumer():
    adapter = LocalRedeliveryAdapter()
    with pytest.raises(TypeError):
        adapter.keep((7, 1), "m")
    adapter.keep(key(1), "m")
    with pytest.raises(RuntimeError, match="bind"):
        asyncio.run(adapter.redeliver([key(1)]))
    with pytest.raises(TypeError):
        adapter.bind("not callable")
    adapter.bind(lambda token: HandBack.TAKEN)
    with pytest.raises(TypeError):
        asyncio.run(adapter.redeliver([(7, 1)]))
    assert adapter.stored == 1  # nothing lost by the refusals


def test_the_local_adapter_needs_no_pulsar_client():
    import subprocess
    import sys

    code = ("import sys, nacktracker.adapters.local; "
            "bad = [m for m in ('pulsar', '_pulsar') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


TOKENS: dict[str, MessageKey] = {}
KEY_LIST = [*(MessageKey(7, entry, -1, index, T) for entry in (1, 2) for index in (-1, 0, 1)),
            MessageKey(7, 1, -1, -1, "other")]  # few keys: rules meet on the same ones
KEYS = st.sampled_from(KEY_LIST)


class LocalAdapterMachine(RuleBasedStateMachine):
    """The adapter against a plain model: what is kept, what each fire hands
    back (the kept messages of the fired entries, in batch order), counts."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[MessageKey, HandBack] = {}
        self.handed: list[MessageKey] = []
        self.asked = 0
        self.adapter = LocalRedeliveryAdapter(self._deliver, redeliver_all=self._redeliver_all)
        self.kept: dict[MessageKey, str] = {}
        self.counts: dict[MessageKey, int] = {}
        self.expected: set[MessageKey] = set()  # nacked by bare id: nothing kept for them

    def _redeliver_all(self) -> None:
        self.asked += 1

    def _deliver(self, token: str) -> HandBack:
        k = TOKENS[token]
        self.handed.append(k)
        return self.answers.get(k, HandBack.TAKEN)

    @rule(k=KEYS)
    def keep(self, k):
        self.adapter.keep(k, f"{k}")
        TOKENS[f"{k}"] = k
        self.kept.setdefault(k, f"{k}")

    @rule(k=KEYS)
    def expect(self, k):
        self.adapter.expect(k)
        self.expected.add(k)

    @rule(k=KEYS, answer=st.sampled_from(list(HandBack)))
    def set_answer(self, k, answer):
        self.answers[k] = answer

    @rule(k=KEYS)
    def ack(self, k):
        assert self.adapter.forget(k) == (k in self.kept)
        self.kept.pop(k, None)
        self.counts.pop(k, None)
        self.expected.discard(k)

    @rule(k=KEYS)
    def cumulative_ack(self, k):
        def covered(x):
            return (x.topic, x.partition) == (k.topic, k.partition) and \
                (x.ledger_id, x.entry_id, x.batch_index) <= (k.ledger_id, k.entry_id, k.batch_index)

        entries = {x.entry for x in self.kept} | {x.entry for x in self.expected}
        for x in [x for x in self.kept if covered(x)]:
            del self.kept[x]
        for x in [x for x in self.counts if covered(x)]:
            del self.counts[x]
        self.expected = {x for x in self.expected if not covered(x)}
        emptied = {e for e in entries if not any(x.entry == e for x in [*self.kept, *self.expected])}
        assert set(self.adapter.forget_through(k)) == emptied

    @rule(entries=st.lists(KEYS.map(lambda k: k.entry), max_size=3, unique=True))
    def fire(self, entries):
        self.handed.clear()
        # a bare-id nack of a fired entry with no copy kept asks the broker, once per fire
        asks = any(x.entry in entries and x not in self.kept for x in self.expected)
        self.expected = {x for x in self.expected if x.entry not in entries}
        before = self.asked
        asyncio.run(self.adapter.redeliver(entries))
        assert self.asked - before == int(asks)
        expected = [x for e in entries for x in sorted((x for x in self.kept if x.entry == e),
                                                       key=lambda x: x.batch_index)]
        assert self.handed == expected
        for x in expected:
            answer = self.answers.get(x, HandBack.TAKEN)
            if answer is not HandBack.NOT_YET:
                del self.kept[x]
            if answer is HandBack.TAKEN:
                self.counts[x] = self.counts.get(x, 0) + 1

    @rule()
    def close(self):
        asyncio.run(self.adapter.aclose())
        self.kept.clear()
        self.counts.clear()
        self.expected.clear()

    @invariant()
    def agrees_with_the_model(self):
        assert self.adapter.stored == len(self.kept)
        for k in KEY_LIST:
            assert self.adapter.is_kept(k) == (k in self.kept)
            assert self.adapter.redeliveries(k) == self.counts.get(k, 0)


LocalAdapterMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_the_local_adapter_matches_its_model = LocalAdapterMachine.TestCase


# -- TrackedConsumer with local redelivery, on ManualClock -----------------------------------

pulsar = pytest.importorskip("pulsar")

from nacktracker.consumer import (  # noqa: E402
    ConsumerOptions,  # noqa: E402
    NotReceivedError,
    ReceiveTimeout,
    TrackedConsumer,
)
from test_consumer_shell import TOPIC, FakeConsumer, FakeMessage, settle  # noqa: E402


class FailoverConsumer(FakeConsumer):
    """The client's consumer on a Failover subscription: cumulative acks allowed, and
    nothing comes back by itself (no broker redelivery of chosen messages)."""

    def __init__(self) -> None:
        super().__init__()
        self.cumulative: list = []
        self.redeliver_all = 0

    async def acknowledge_cumulative(self, message):
        self.cumulative.append(message.data())

    def redeliver_unacknowledged_messages(self):
        self.redeliver_all += 1


class Local:
    def __init__(self, **options) -> None:
        self.clock = ManualClock(1_000_000)
        self.raw = FailoverConsumer()
        self.adapter = LocalRedeliveryAdapter(redeliver_all=self.raw.redeliver_unacknowledged_messages)
        self.consumer = TrackedConsumer(self.raw, adapter=self.adapter, clock=self.clock,
                                        options=ConsumerOptions.check(options))
        self.entries = 0

    def publish(self, size: int = 1) -> list:
        entry, self.entries = self.entries, self.entries + 1
        msgs = [FakeMessage(entry, i, size if size > 1 else 0, 0) for i in (range(size) if size > 1 else [-1])]
        for m in msgs:
            self.raw.queue.put_nowait(m)
        return msgs

    async def singles(self, n: int) -> list:
        """Publish ``n`` non-batched messages and receive them."""
        for _ in range(n):
            self.publish()
        return await self.receive_all()

    async def receive_all(self) -> list:
        await settle()
        out = []
        while True:
            try:
                out.append(await self.consumer.receive(timeout_ms=0))
            except ReceiveTimeout:
                return out

    async def advance_to(self, ms: int) -> list:
        """Move the clock to ``ms`` after the start in 1 ms steps; what surfaced, with when."""
        got = []
        while self.clock.now_ms() - 1_000_000 < ms:
            self.clock.advance(1)
            await settle()
            got += [(self.clock.now_ms() - 1_000_000, m.data()) for m in await self.receive_all()]
        return got


def settled(h: Local) -> tuple[int, int, int, int]:
    """Pending nacks, kept messages, batch records, held messages."""
    s = h.consumer.stats()
    return s["pending"], s["locally_kept"], s["batch_records"], s["held"]


@pytest.fixture
async def local():
    made: list[Local] = []

    def make(**options) -> Local:
        made.append(Local(**options))
        return made[-1]

    yield make
    for h in made:
        await h.consumer.close()


@pytest.mark.timing
async def test_a_nacked_message_comes_back_from_memory_exactly_at_its_due_time(local):
    h = local(precision_bits=0)
    m0, m1 = await h.singles(2)
    await h.consumer.negative_acknowledge(m0, delay_ms=300)
    await h.consumer.negative_acknowledge(m1, delay_ms=500)
    assert h.adapter.stored == 2 and h.consumer.stats()["locally_kept"] == 2
    assert await h.advance_to(600) == [(300, b"e0.-1"), (500, b"e1.-1")]
    assert h.raw.queue.empty() and h.adapter.stored == 0  # no broker call: the kept message came back
    await h.consumer.acknowledge(m0)
    assert h.adapter.redeliveries(MessageKey(7, 0, -1, -1, TOPIC)) == 0  # the ack forgets its count
    assert h.adapter.redeliveries(MessageKey(7, 1, -1, -1, TOPIC)) == 1


async def test_local_redeliveries_count_for_backoff_and_max_redeliveries(local):
    counts: list[int] = []

    def backoff(count: int) -> int:
        counts.append(count)
        return 100 * (count + 1)

    h = local(precision_bits=0, backoff=backoff)
    h.publish()
    [m] = await h.receive_all()
    for _ in range(3):
        await h.consumer.negative_acknowledge(m)
        [(at, _data)] = await h.advance_to(h.clock.now_ms() - 1_000_000 + 400)
        assert m.redelivery_count() == 0  # a fake Message: the broker's count (a received one adds the hand-backs)
    assert counts == [0, 1, 2]
    assert h.adapter.redeliveries(MessageKey(7, 0, -1, -1, TOPIC)) == 3  # max_redeliveries: the broker tests
    await h.consumer.acknowledge(m)



@pytest.mark.timing
async def test_an_ack_timeout_brings_the_message_back_from_memory_at_its_time(local):
    """Received and neither acked nor nacked for ``ack_timeout_ms``: the consumer hands the message back
    from memory at that time (the broker resends no chosen message here), counted as an ack-timeout
    redelivery. It keeps each received message while its ack timeout runs (the application may have
    dropped it); acknowledged, it is freed and nothing more comes."""
    h = local(precision_bits=0, ack_timeout_ms=300)
    [m] = await h.singles(1)
    assert await h.advance_to(600) == [(300, b"e0.-1"), (600, b"e0.-1")]  # each delivery times out in turn
    assert h.raw.queue.empty() and h.raw.redeliver_all == 0  # from memory: no broker call
    stats = h.consumer.stats()
    assert stats["ack_timeout_redeliveries"] == 2 and stats["locally_kept"] == 1  # its third timeout runs
    await h.consumer.acknowledge(m)
    assert await h.advance_to(1_000) == [] and settled(h) == (0, 0, 0, 0)

async def test_batches_only_the_nacked_messages_come_back_each_at_its_time(local):
    h = local(precision_bits=0)
    b0, b1, b2, b3 = h.publish(4)
    assert len(await h.receive_all()) == 4
    await h.consumer.acknowledge(b0)
    await h.consumer.negative_acknowledge(b1, delay_ms=1000)
    await h.consumer.negative_acknowledge(b2, delay_ms=1120)  # b3 still held by the application
    got = await h.advance_to(1300)
    assert got == [(1000, b"e0.1"), (1120, b"e0.2")]
    for m in (b1, b2, b3):
        await h.consumer.acknowledge(m)
    assert settled(h) == (0, 0, 0, 0)


async def test_cumulative_ack_cancels_covered_pending_nacks_and_frees_them(local):
    h = local(precision_bits=0)
    m0, m1, m2, m3 = await h.singles(4)
    b0, b1, b2 = h.publish(3)
    await h.receive_all()
    for m in (m1, m3, b1, b2):
        await h.consumer.negative_acknowledge(m, delay_ms=500)
    await h.consumer.acknowledge_cumulative(b1)  # covers m0..m3 and b0, b1 (as in Pulsar): b2 stays
    assert h.raw.cumulative == [b"e4.1"]
    assert h.adapter.stored == 1 and h.consumer.tracker.pending == 1
    assert await h.advance_to(700) == [(500, b"e4.2")]
    await h.consumer.acknowledge_cumulative(b2)
    assert settled(h) == (0, 0, 0, 0)


async def test_a_cumulative_ack_drops_covered_copies_waiting_in_the_receive_queue(local):
    """Seen in bench/traffic.py's cumulative scenario: a nacked message came
    back into the receive queue while the in-order worker was behind, the
    worker's cumulative ack covered it, then it surfaced: acknowledged, yet
    delivered again. The cumulative ack now takes it out of the queue."""
    h = local(precision_bits=0)
    m0, m1, m2 = await h.singles(3)
    await h.consumer.negative_acknowledge(m0, delay_ms=100)
    h.clock.advance(150)
    await settle()
    assert h.consumer.stats()["prefetched"] == 1  # m0's copy waits for the application
    h.publish()  # e3: a first delivery after the mark stays
    await settle()
    await h.consumer.acknowledge_cumulative(m2)
    assert [m.data() for m in await h.receive_all()] == [b"e3.-1"]
    assert settled(h) == (0, 0, 0, 1)


async def test_ack_of_a_pending_nack_frees_it_and_close_drops_what_is_kept(local):
    h = local(precision_bits=0)
    m0, m1, m2 = await h.singles(3)
    for m in (m0, m1, m2):
        await h.consumer.negative_acknowledge(m, delay_ms=500)
    await h.consumer.acknowledge(m1)
    assert h.adapter.stored == 2 and h.consumer.tracker.pending == 2
    await h.consumer.close()
    assert h.adapter.stored == 0  # the broker still has them unacknowledged: the next consumer gets them


async def test_a_nack_by_id_asks_the_broker_at_its_time_and_its_copy_surfaces_once(local):
    """A bare id carries no message to keep: at its time the consumer asks the broker to resend
    what is unacknowledged (the plain client's redelivery on Exclusive/Failover). Of the resent
    copies only the nacked one surfaces; one the application holds is dropped, and one with a
    pending nack of its own is kept for its bucket (no second request)."""
    h = local(precision_bits=0)
    m0, m1, m2 = await h.singles(3)
    await h.consumer.negative_acknowledge(m0.message_id(), delay_ms=300)
    await h.consumer.negative_acknowledge(m2.message_id(), delay_ms=500)
    assert h.adapter.stored == 0 and h.consumer.tracker.pending == 2
    assert await h.advance_to(299) == [] and h.raw.redeliver_all == 0
    h.clock.advance(1)
    await settle()
    assert h.raw.redeliver_all == 1
    for m in (m0, m1, m2):  # the broker resends everything unacknowledged
        h.raw.queue.put_nowait(FakeMessage(m.message_id().entry_id(), -1, 0, 0))
    assert [m.data() for m in await h.receive_all()] == [b"e0.-1"]  # at 300: its due time
    assert await h.advance_to(600) == [(500, b"e2.-1")]
    assert h.raw.redeliver_all == 1 and h.adapter.stored == 0
    with pytest.raises(NotReceivedError):  # an id this consumer never handed out
        await h.consumer.negative_acknowledge(FakeMessage(99, -1, 0, 0).message_id())


async def test_a_copy_the_broker_resends_while_the_nack_is_pending_is_held_back_and_kept(local):
    """A reconnect (or a restart on a snapshot, where the first copy is gone)
    resends unacknowledged messages: a nacked one is held back and its bucket
    hands that copy back. Nothing surfaces twice."""
    h = local(precision_bits=0)
    [m] = h.publish()
    await h.receive_all()
    await h.consumer.negative_acknowledge(m, delay_ms=400)
    h.adapter._kept.clear()  # as after a restart: nothing kept for the pending nack
    resent = FakeMessage(0, -1, 0, 1)
    h.raw.queue.put_nowait(resent)
    assert await h.advance_to(100) == []  # held back until due
    assert h.adapter.is_kept(MessageKey(7, 0, -1, -1, TOPIC))
    assert await h.advance_to(500) == [(400, b"e0.-1")]
    h.raw.queue.put_nowait(FakeMessage(0, -1, 0, 1))  # another resend: the application holds it
    assert await h.advance_to(600) == []


async def test_redeliver_unacknowledged_messages_still_reaches_the_client(local):
    h = local(precision_bits=0)
    h.publish()
    [m] = await h.receive_all()
    h.consumer.redeliver_unacknowledged_messages()
    assert h.raw.redeliver_all == 1
    await h.consumer.negative_acknowledge(m, delay_ms=100)  # still known: it was held
    assert await h.advance_to(200) == [(100, b"e0.-1")]


async def test_subscribe_picks_local_redelivery_for_exclusive_and_failover_only():
    from nacktracker.consumer import ConsumerOptions

    assert ConsumerOptions().redelivery == "broker"
    with pytest.raises(ValueError, match="redelivery"):
        ConsumerOptions.check({"redelivery": "somewhere"}, has_client=False)
    raw = FailoverConsumer()
    consumer = TrackedConsumer(raw, adapter=LocalRedeliveryAdapter(), clock=ManualClock(0))
    assert consumer._local is not None
    await consumer.close()
