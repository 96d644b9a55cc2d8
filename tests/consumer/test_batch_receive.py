"""TrackedConsumer.batch_receive(): the client's ConsumerBatchReceivePolicy semantics (limits in
messages, payload bytes and time), without a broker; the broker cases are in test_call_forms.py."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nacktracker.consumer.batches import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_MS, BatchLimits

pulsar = pytest.importorskip("pulsar")

from nacktracker import ManualClock  # noqa: E402
from nacktracker.consumer import (  # noqa: E402
    ConsumerClosed,
    ConsumerOptions,  # noqa: E402
    TrackedConsumer,
)
from test_consumer_shell import FakeBroker, FakeConsumer, settle  # noqa: E402


def policy(messages: int, size: int, timeout_ms: int):
    return pulsar.ConsumerBatchReceivePolicy(messages, size, timeout_ms)


def test_limits_are_read_from_the_clients_policy_and_capped_at_the_receiver_queue():
    assert BatchLimits.of(None, 1000) == BatchLimits(-1, DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_MS)
    assert BatchLimits.of(policy(5, -1, 200), 1000) == BatchLimits(5, -1, 200)
    assert BatchLimits.of(policy(5000, 10, 0), 1000) == BatchLimits(1000, 10, 0)  # as the client caps it
    assert BatchLimits.of(policy(5, -1, 200), 0).max_messages == 1  # a zero queue holds one message
    with pytest.raises(TypeError, match="ConsumerBatchReceivePolicy"):
        BatchLimits.of(object(), 1000)


@given(st.lists(st.integers(0, 50), max_size=30), st.integers(-1, 8), st.integers(-1, 120))
def test_a_batch_takes_messages_while_they_fit_as_the_client_does(lengths, max_messages, max_bytes):
    """The client's rule: the first message always fits; after it a message joins only within both
    limits; the batch is complete once either limit is reached."""
    limits = BatchLimits(max_messages, max_bytes, 100)
    count = size = 0
    for length in lengths:
        if limits.full(count, size) or not limits.fits(count, size, length):
            break
        count, size = count + 1, size + length
    assert count >= 1 if lengths else count == 0  # the first message always fits
    if count > 1:
        assert max_messages <= 0 or count <= max_messages
        assert max_bytes <= 0 or size <= max_bytes
    if count < len(lengths):  # stopped early: a limit was reached, or the next message would pass one
        nxt = lengths[count]
        assert (0 < max_messages <= count) or (0 < max_bytes < size + nxt) or (0 < max_bytes <= size)


class Batches:
    def __init__(self, batch_receive_policy=None, **options) -> None:
        self.clock = ManualClock(1_000_000)
        self.raw = FakeConsumer()
        self.broker = FakeBroker(self.clock, self.raw, 0, 10)
        self.consumer = TrackedConsumer(self.raw, adapter=self.broker, clock=self.clock,
                                        batch_receive_policy=batch_receive_policy,
                                        options=ConsumerOptions.check(options))


@pytest.fixture
async def batches():
    made: list[Batches] = []

    def make(**options) -> Batches:
        made.append(Batches(**options))
        return made[-1]

    yield make
    for b in made:
        await b.consumer.close()


async def test_batches_hold_at_most_the_policys_messages_and_each_message_is_its_own(batches):
    b = batches(batch_receive_policy=policy(5, -1, 50), delay_ms=100)
    for _ in range(12):
        b.broker.publish()
    await settle()
    got = [await b.consumer.batch_receive() for _ in range(3)]
    assert [len(x) for x in got] == [5, 5, 2]  # the last one at its timeout, with what there was
    # each message on its own: ack one, nack another; only the nacked one comes back
    await b.consumer.acknowledge(got[0][0])
    await b.consumer.negative_acknowledge(got[0][1])
    for m in got[0][2:] + got[1] + got[2]:
        await b.consumer.acknowledge(m)
    for _ in range(110):
        b.clock.advance(1)
        await settle()
    back = await b.consumer.batch_receive()
    assert [m.data() for m in back] == [got[0][1].data()]
    assert await b.consumer.batch_receive() == []  # nothing more: an empty batch at the timeout


async def test_the_byte_limit_leaves_a_message_that_would_pass_it_for_the_next_batch(batches):
    b = batches(batch_receive_policy=policy(-1, 10, 50))  # payloads are 5 bytes ("e0.-1")
    for _ in range(5):
        b.broker.publish()
    await settle()
    sizes = [len(await b.consumer.batch_receive()) for _ in range(3)]
    assert sizes == [2, 2, 1]


async def test_a_batch_waits_for_messages_until_its_timeout_and_a_cancelled_one_loses_nothing(batches):
    b = batches(batch_receive_policy=policy(3, -1, 5_000))
    waiting = asyncio.ensure_future(b.consumer.batch_receive())
    await settle()
    b.broker.publish()
    await settle()
    assert not waiting.done()  # one of three, the timeout far: it waits
    b.broker.publish()
    b.broker.publish()
    await settle()
    assert [m.data() for m in await waiting] == [b"e0.-1", b"e1.-1", b"e2.-1"]
    cancelled = asyncio.ensure_future(b.consumer.batch_receive())
    b.broker.publish()
    await settle()  # it took one and waits for two more
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    b.broker.publish()
    await settle()
    assert [(await b.consumer.receive(timeout_ms=1000)).data() for _ in range(2)] == [b"e3.-1", b"e4.-1"]


async def test_batch_receive_after_close_raises_and_a_batch_begun_returns_what_it_has(batches):
    b = batches(batch_receive_policy=policy(3, -1, 5_000))
    b.broker.publish()
    await settle()
    waiting = asyncio.ensure_future(b.consumer.batch_receive())
    await settle()
    await b.consumer.close()
    assert [m.data() for m in await waiting] == [b"e0.-1"]
    with pytest.raises(ConsumerClosed):
        await b.consumer.batch_receive()
