"""Retry letters, terminal dead letters, ack timeouts and the consumer's own
delivery counts: pure parts, the shell on ManualClock (fake broker), then
both test brokers (pulsar-lite ignores deliver_after: retry copies arrive at
once and are held until due; Apache Pulsar sends them up to its 1 s tick early)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nacktracker import MultiplierBackoff
from nacktracker.consumer.counts import DeliveryCounts
from nacktracker.consumer.letters.java import (
    base_topic,
    check_letter_properties,
    full_topic_name,
    is_retry_topic,
    read_property,
    retry_dead_letter_topic,
    retry_due_wall_ms,
    retry_letter_topic,
    retry_properties,
    terminal_properties,
)
from nacktracker.errors import PropertyError
from nacktracker.keys import MessageKey

#: how much later than its message's hand-over a receive() may return to the test on a loaded loop
RECEIVE_JITTER_MS = 5

# -- pure ------------------------------------------------------------------------------


def test_retry_properties_count_and_keep_their_origin_as_java():
    props, n = retry_properties({"app": "x"}, topic="persistent://p/d/t-partition-3", origin_id="5:9:3",
                                subscription="s", delay_ms=1500)
    assert n == 1 and props == {"app": "x", "REAL_TOPIC": "persistent://p/d/t", "ORIGIN_MESSAGE_ID": "5:9:3",
                                "ORIGIN_MESSAGE_IDY_TIME": "5:9:3", "REAL_SUBSCRIPTION": "s",
                                "RECONSUMETIMES": "1", "DELAY_TIME": "1500"}
    again, n2 = retry_properties(props, topic="persistent://p/d/t-s-RETRY", origin_id="8:1:-1",
                                 subscription="s", delay_ms=10, custom={"why": "busy"})
    assert n2 == 2 and again["RECONSUMETIMES"] == "2" and again["DELAY_TIME"] == "10"
    assert again["ORIGIN_MESSAGE_ID"] == "5:9:3" and again["REAL_TOPIC"] == "persistent://p/d/t"
    assert again["why"] == "busy"
    with pytest.raises(ValueError):
        retry_properties({"RECONSUMETIMES": "x"}, topic="t", origin_id="1:1:-1", subscription="s", delay_ms=0)


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=4),
       st.lists(st.integers(0, 10**6), min_size=1, max_size=20), st.integers(1, 16))
def test_a_chain_of_reconsumes_counts_by_one_keeps_its_origin_and_ends_after_max(own, delays, max_redeliveries):
    """Each hop's properties come from the previous hop's (as on the retry topic): RECONSUMETIMES goes
    1, 2, 3 ...; REAL_TOPIC and ORIGIN_MESSAGE_ID stay the first's; the hop that would pass
    max_redeliveries is the dead letter (so a message is retried exactly max_redeliveries times)."""
    own = {k: v for k, v in own.items() if k not in ("RECONSUMETIMES", "DELAY_TIME", "REAL_TOPIC",
                                                       "ORIGIN_MESSAGE_ID", "ORIGIN_MESSAGE_IDY_TIME",
                                                       "REAL_SUBSCRIPTION")}
    props, topic, origin, retried = own, "persistent://p/d/t", "1:2:-1", 0
    for hop, delay in enumerate(delays, 1):
        props, times = retry_properties(props, topic=topic, origin_id=origin, subscription="s", delay_ms=delay)
        assert times == hop and props["DELAY_TIME"] == str(delay)
        assert props["REAL_TOPIC"] == "persistent://p/d/t" and props["ORIGIN_MESSAGE_ID"] == "1:2:-1"
        assert {k: props[k] for k in own} == own
        if times > max_redeliveries:
            break
        retried += 1
        topic, origin = "persistent://p/d/t-s-RETRY", f"9:{hop}:-1"  # the retry's own id and topic
    assert retried == min(max_redeliveries, len(delays))


def refused(props, name):
    with pytest.raises(PropertyError) as info:
        read_property(props, name)
    return info.value


def test_read_property_takes_each_property_to_its_bound_exactly_and_names_what_it_refuses():
    from nacktracker.consumer.letters.java import MAX_PROPERTY_DELAY_TIME, MAX_PROPERTY_RECONSUMETIMES

    top_count, top_delay = MAX_PROPERTY_RECONSUMETIMES, MAX_PROPERTY_DELAY_TIME
    assert (top_count, top_delay) == (2**31 - 1, 2**61 - 1)
    assert read_property({"RECONSUMETIMES": str(top_count)}, "RECONSUMETIMES") == top_count
    assert read_property({"DELAY_TIME": str(top_delay)}, "DELAY_TIME") == top_delay
    assert read_property({"DELAY_TIME": "0"}, "DELAY_TIME") == 0 and read_property({}, "RECONSUMETIMES") is None
    exc = refused({"RECONSUMETIMES": str(top_count + 1)}, "RECONSUMETIMES")
    assert (exc.name, exc.value, str(exc)) == ("RECONSUMETIMES", "2147483648",
                                               "property RECONSUMETIMES='2147483648': must be at most 2147483647")
    exc = refused({"DELAY_TIME": "²"}, "DELAY_TIME")
    assert (exc.name, exc.value) == ("DELAY_TIME", "²") and str(exc) == (
        "property DELAY_TIME='²': must be a whole number of ASCII digits from 0 to 2305843009213693951")
    exc = refused({"DELAY_TIME": 5}, "DELAY_TIME")
    assert (exc.name, exc.value, str(exc)) == ("DELAY_TIME", 5, "property DELAY_TIME=5: must be a str")
    assert str(refused({"DELAY_TIME": "9" * 50}, "DELAY_TIME")).startswith("property DELAY_TIME='" + "9" * 40 + "'...:")
    # text: 1 to 4096 characters, no control characters
    assert read_property({"REAL_TOPIC": "t" * 4096}, "REAL_TOPIC") == "t" * 4096
    for bad in ("", "t" * 4097, "a\nb", "\x7f"):
        exc = refused({"REAL_TOPIC": bad}, "REAL_TOPIC")
        assert exc.value == bad and str(exc).endswith(": must be 1 to 4096 characters without control characters")
    # message ids: each part from -1 to 2^63 - 1; a chunked message's two joined by ';'
    top = str(2**63 - 1)
    for good in ("-1:-1:-1", f"{top}:{top}:-1:0", "1:2:-1;1:5:-1", f"1:{top}:3;4:5:6:7"):
        assert read_property({"ORIGIN_MESSAGE_ID": good}, "ORIGIN_MESSAGE_ID") == good
    for bad in ("-2:1:-1", f"1:{2**63}:-1", "1:2", "1:2:-1;", "1:2:-1 1:5:-1", "1:2:-1;1:5:-2", "1:2:3:4:5"):
        exc = refused({"ORIGIN_MESSAGE_ID": bad}, "ORIGIN_MESSAGE_ID")
        assert exc.value == bad and str(exc).endswith(
            ": must be a message id ledger:entry:partition[:batch] (each from -1 to 2^63 - 1), or two joined by ';' "
            "(a chunked message's)")
    # a retry past the largest count is refused, naming the count it had
    with pytest.raises(PropertyError) as info:
        retry_properties({"RECONSUMETIMES": str(top_count)}, topic="t", origin_id="1:1:-1", subscription="s",
                         delay_ms=0)
    assert (info.value.name, info.value.value, str(info.value)) == (
        "RECONSUMETIMES", str(top_count), f"property RECONSUMETIMES='{top_count}': a retry would count past {top_count}")
    props, times = retry_properties({"RECONSUMETIMES": str(top_count - 1)}, topic="t", origin_id="1:1:-1",
                                    subscription="s", delay_ms=0)
    assert times == top_count == int(props["RECONSUMETIMES"])
    # every carried property is checked, by name
    for name in ("REAL_TOPIC", "REAL_SUBSCRIPTION", "ORIGIN_MESSAGE_ID", "ORIGIN_MESSAGE_IDY_TIME"):
        with pytest.raises(PropertyError, match=f"^property {name}=''"):
            check_letter_properties({name: ""})


def test_due_time_needs_a_publish_time_in_range():
    assert retry_due_wall_ms({"DELAY_TIME": "5"}, 1) == 6
    assert retry_due_wall_ms({"DELAY_TIME": "5"}, 2**63 - 1) == 2**63 + 4
    assert retry_due_wall_ms({"DELAY_TIME": "5"}, 2**63) is None and retry_due_wall_ms({"DELAY_TIME": "5"}, -1) is None


def test_topic_names():
    assert retry_letter_topic("t", "s") == "persistent://public/default/t-s-RETRY"
    assert full_topic_name("a/b/c") == "persistent://a/b/c"
    assert base_topic("persistent://a/b/c-partition-2") == "persistent://a/b/c"
    assert base_topic("persistent://a/b/c-partition-x") == "persistent://a/b/c-partition-x"
    assert is_retry_topic("persistent://a/b/r-partition-0", "persistent://a/b/r")
    assert not is_retry_topic("persistent://a/b/r2", "persistent://a/b/r")
    assert full_topic_name("non-persistent://a/b/t") == "non-persistent://a/b/t"
    assert base_topic("persistent://a/b/x-partition-1-partition-2") == "persistent://a/b/x-partition-1"
    assert retry_dead_letter_topic("t", "s") == "persistent://public/default/t-s-DLQ"
    with pytest.raises(ValueError, match=r"^not a topic name: 'a/b'$"):
        full_topic_name("a/b")


def test_due_time_and_terminal_properties():
    assert retry_due_wall_ms({"DELAY_TIME": "250"}, 1_000) == 1_250
    assert retry_due_wall_ms({}, 1_000) is None and retry_due_wall_ms({"DELAY_TIME": "5"}, 0) is None
    for bad in ("-1", "²", "1" * 5000, "1" + "0" * 400):  # refused, naming the property (the consumer surfaces it)
        with pytest.raises(PropertyError, match="DELAY_TIME"):
            retry_due_wall_ms({"DELAY_TIME": bad}, 1)
    props = terminal_properties({"a": "b"}, topic="persistent://p/d/t", origin_id="1:2:-1", subscription="s",
                                reason="bad field", exception=KeyError("k"))
    assert props == {"a": "b", "REAL_TOPIC": "persistent://p/d/t", "REAL_SUBSCRIPTION": "s",
                     "ORIGIN_MESSAGE_ID": "1:2:-1", "DEAD_LETTER_REASON": "bad field",
                     "DEAD_LETTER_EXCEPTION": "KeyError"}


def test_delivery_counts_take_the_larger_and_survive_a_round_trip():
    counts = DeliveryCounts()
    e = MessageKey(3, 4, -1, -1, "persistent://p/d/t")
    assert counts.count(e, 2) == 2
    counts.at_least(e, 2)
    counts.redelivered([e])
    assert counts.count(e, 0) == 3 and counts.count(e, 5) == 5  # a reset broker count, a larger one
    restored = DeliveryCounts()
    assert restored.restore(counts.encode(123), 123) == 1 and restored.count(e, 0) == 3
    assert DeliveryCounts().restore(counts.encode(123), 999) == 0  # another snapshot's
    with pytest.raises(ValueError):
        restored.restore(b"00000000\n{}", None)
    counts.forget(e)
    assert len(counts) == 0


def test_delivery_counts_operation_by_operation():
    """Each operation of DeliveryCounts pinned: what it keeps, what it refuses and what it says (the
    survivors of a mutation run over consumer/counts.py against the letter tests)."""
    import json
    import sys
    import zlib

    e, other = MessageKey(3, 4, -1, -1, "persistent://p/d/t"), MessageKey(3, 5, 0, -1, None)
    counts = DeliveryCounts()
    assert not counts.has(e) and list(counts) == [] and counts.nbytes() == sys.getsizeof({})
    counts.at_least(e, 0)  # nothing for 0
    assert len(counts) == 0
    counts.at_least(e, 1)  # the first count is kept, 1 included
    assert counts.has(e) and not counts.has(other) and list(counts) == [(e, 1)]
    counts.at_least(e, 5)
    counts.at_least(e, 2)  # a smaller count never lowers it
    assert list(counts) == [(e, 5)] and counts.count(e, 2) == 5 and counts.count(e, 7) == 7
    counts.forget(other)  # not counted: nothing happens
    n = len(counts)
    assert counts.nbytes() == sys.getsizeof(counts._n) + n * (sys.getsizeof(e) + sys.getsizeof(5))  # noqa: SLF001
    counts.at_least(other, 2)
    # the file: 8 lowercase hex digits of the body's CRC-32, then compact JSON
    raw = counts.encode(0xABCDEF)
    body = json.dumps({"snapshot_crc32": 0xABCDEF, "counts": [["persistent://p/d/t", -1, 3, 4, 5], [None, 0, 3, 5, 2]]},
                      separators=(",", ":")).encode()
    assert raw == b"%08x\n" % zlib.crc32(body) + body and b" " not in body
    restored = DeliveryCounts()
    restored.at_least(other, 9)  # a count already held keeps the larger value
    assert restored.restore(raw, None) == 2 and sorted(restored, key=lambda kv: kv[0].entry_id) == [(e, 5), (other, 9)]
    counts.forget(e)
    assert not counts.has(e) and list(counts) == [(other, 2)]

    def refused(doc_counts=None, *, raw=None) -> str:
        if raw is None:
            body = json.dumps({"snapshot_crc32": 1, "counts": doc_counts}).encode()
            raw = b"%08x\n" % zlib.crc32(body) + body
        with pytest.raises(ValueError) as caught:
            DeliveryCounts().restore(raw, None)
        return str(caught.value)

    good = counts.encode(1)
    assert refused(raw=b"%08x\n" % (int(good[:8], 16) ^ 1) + good[9:]) == "checksum mismatch"
    assert refused(raw=b"0" + good) == "checksum mismatch"  # a head of 9 digits
    assert refused([[5, 0, 1, 1, 1]]) == "bad topic 5 or partition 0"
    assert refused([["t", True, 1, 1, 1]]) == "bad topic 't' or partition True"
    assert refused([["t", -2, 1, 1, 1]]) == "bad topic 't' or partition -2"
    assert refused([["t", -1, -1, 1, 1]]) == "ledger_id must be >= 0, got -1"
    assert refused([["t", -1, 1, -1, 1]]) == "entry_id must be >= 0, got -1"
    assert refused([["t", -1, 1, 1, -1]]) == "count must be >= 0, got -1"
    assert refused([["t", -1, 1, 1, None]]) == "corrupted delivery counts: count must be an int, not NoneType"
    assert refused(raw=b"%08x\n{}" % zlib.crc32(b"{}")) == "corrupted delivery counts: 'counts'"


def test_bad_retry_and_ack_timeout_options_are_refused_before_anything_is_made():
    from nacktracker.consumer.options import ConsumerOptions

    for options, exc in [({"enable_retry": 1}, TypeError), ({"retry_letter_topic": "r"}, ValueError),
                         ({"enable_retry": True, "retry_letter_topic": ""}, ValueError),
                         ({"ack_timeout_ms": 0}, ValueError), ({"ack_timeout_ms": -1}, ValueError),
                         ({"ack_timeout_ms": "1"}, TypeError), ({"ack_timeout_backoff": lambda n: 1}, ValueError),
                         ({"ack_timeout_ms": 10, "ack_timeout_backoff": 5}, TypeError)]:
        with pytest.raises(exc):
            ConsumerOptions.check(options, has_client=True)
    with pytest.raises(ValueError, match="needs the client"):
        ConsumerOptions.check({"enable_retry": True}, has_client=False)


# -- the shell on ManualClock ---------------------------------------------------------------

pulsar = pytest.importorskip("pulsar")
from test_consumer_shell import Harness, first_delivery, harness  # noqa: E402, F401  (harness: the fixture)


async def test_ack_timeout_redelivers_at_1_2_4_s_exactly_and_stops_on_ack(harness):
    h = harness(precision_bits=0, ack_timeout_ms=1000, ack_timeout_backoff=MultiplierBackoff(1000, 60_000))
    h.broker.publish()
    kept = []

    async def run(ms):
        for _ in range(ms):
            h.clock.advance(1)
            for _ in range(20):
                await asyncio.sleep(0)
            kept.extend(await h.drain())

    await run(7100)
    # received at 1, then 1 s, 2 s, 4 s after each receive (each copy comes 10 ms early and waits)
    assert [(at, count) for at, _, count in h.got] == [(1, 0), (1001, 1), (3001, 2), (7001, 3)]
    await h.consumer.acknowledge(kept[-1])
    await run(9000)
    assert len(h.got) == 4 and h.consumer.tracker.pending == 0


async def test_ack_timeout_cancelled_by_ack_and_by_nack(harness):
    h = harness(precision_bits=0, ack_timeout_ms=500)
    h.broker.publish()
    h.broker.publish()
    await asyncio.sleep(0)
    m0 = await h.consumer.receive(timeout_ms=1000)
    m1 = await h.consumer.receive(timeout_ms=1000)
    await h.consumer.acknowledge(m0)
    await h.consumer.negative_acknowledge(m1, delay_ms=2000)
    await h.advance(2100)
    # m0 never again; m1 at its nack's time (2000), not at the ack timeout's (500)
    assert [(at, data) for at, data, _ in h.got] == [(2000, b"e1.-1")]
    assert h.consumer.stats()["ack_timeouts_cancelled"] == 1  # the nack's (an ack discards it as any pending nack)


async def test_own_counts_outlive_a_broker_count_reset(harness):
    """The broker forgets its counts (a restart): the backoff still grows, from the consumer's own count."""
    h = harness(precision_bits=0, backoff=lambda n: 100 * (n + 1))
    h.broker.publish()
    received = []
    for _ in range(2000):
        h.clock.advance(1)
        for _ in range(20):
            await asyncio.sleep(0)
        for m in await h.drain():
            received.append((h.clock.now_ms() - 1_000_000, m.redelivery_count()))
            if len(received) == 3:
                h.broker.counts.clear()  # the broker restarted: its counts are gone
            await h.consumer.negative_acknowledge(m)
    counts = [c for _, c in received]
    gaps = [b[0] - a[0] for a, b in zip(received, received[1:])]
    assert counts[:5] == [0, 1, 2, 1, 2]  # what the broker said after its reset
    assert gaps[:4] == [100, 200, 300, 400]  # what the consumer counted: it kept growing
    assert h.consumer.stats()["delivery_counts"] == 1


async def test_a_batch_entrys_count_lasts_until_its_last_nacked_message_is_acked(harness):
    h = harness(precision_bits=0)
    _, (m0, m1) = await first_delivery(h, 2)
    h.got.clear()
    await h.consumer.negative_acknowledge(m0, delay_ms=100)
    await h.consumer.negative_acknowledge(m1, delay_ms=500)
    await h.advance(150, ack=True)  # m0 back and acked; m1 still nacked: the entry's count stays
    assert [data for _, data, _ in h.got] == [b"e0.0"] and h.consumer.stats()["delivery_counts"] == 1
    await h.advance(400, ack=True)
    assert [data for _, data, _ in h.got] == [b"e0.0", b"e0.1"] and h.consumer.stats()["delivery_counts"] == 0


# -- on both brokers -------------------------------------------------------------------------

def now_ms() -> float:
    return asyncio.get_running_loop().time() * 1000.0


async def drain_topic(client, topic, n, timeout_ms=10_000):
    """The first ``n`` messages of ``topic`` (a plain consumer from the earliest)."""
    plain = await client.subscribe(topic, "check", consumer_type=pulsar.ConsumerType.Shared,
                                   initial_position=pulsar.InitialPosition.Earliest)
    out = []
    try:
        while len(out) < n:
            msg = await plain.receive()
            out.append(msg)
            await plain.acknowledge(msg)
    finally:
        await plain.close()
    return out


@pytest.mark.timing
async def test_reconsume_later_surfaces_each_retry_at_its_due_time_then_dead_letters(client, topic):
    import nacktracker

    t = topic("retry")
    # retry_lead_ms above every delay: each retry comes at once and is held here until due (what this test
    # checks); how late Apache Pulsar's delayed delivery can be under load is bench/retry_precision.py's
    consumer = await nacktracker.subscribe(client, t, "sub", enable_retry=True, max_redeliveries=2,
                                           retry_lead_ms=10_000)
    producer = await client.create_producer(t)
    try:
        for i in range(3):
            await producer.send(b"m%d" % i, properties={"app": "x"})
        delays = {b"m0": 300, b"m1": 1200, b"m2": 3500}
        due, errors, seen = {}, [], []
        while len(seen) < 9:  # 3 first deliveries + 2 retries each; the third reconsume dead-letters
            msg = await consumer.receive(timeout_ms=10_000)
            arrived = now_ms()
            data = msg.data()
            times = msg.properties().get("RECONSUMETIMES", "0")
            seen.append((data, times))
            if (data, times) in due:
                errors.append(arrived - due.pop((data, times)))
            due[(data, str(int(times) + 1))] = now_ms() + delays[data]  # from the call: never early
            await consumer.reconsume_later(msg, delay_ms=delays[data])
        assert sorted(seen) == sorted([(d, n) for d in delays for n in ("0", "1", "2")])
        assert len(errors) == 6 and all(-2 <= e <= 150 for e in errors), errors
        dead = await drain_topic(client, t + "-sub-DLQ", 3)
        for msg in dead:
            props = msg.properties()
            assert props["RECONSUMETIMES"] == "3" and props["REAL_TOPIC"] == t and props["app"] == "x"
            assert props["DELAY_TIME"] == str(delays[msg.data()]) and props["REAL_SUBSCRIPTION"] == "sub"
            assert props["ORIGIN_MESSAGE_ID"] == props["ORIGIN_MESSAGE_IDY_TIME"]
        stats = consumer.stats()
        assert stats["reconsumed"] == 6 and stats["reconsume_dead_lettered"] == 3
    finally:
        await producer.close()
        await consumer.close()


async def test_dead_letter_publishes_once_in_order_with_the_reason_and_acks(client, topic):
    import nacktracker

    t = topic("term")
    consumer = await nacktracker.subscribe(client, t, "sub")
    producer = await client.create_producer(t)
    try:
        for i in range(5):
            await producer.send(b"m%d" % i)
        for i in range(5):
            msg = await consumer.receive(timeout_ms=10_000)
            await consumer.dead_letter(msg, reason=f"bad {i}", exception=ValueError() if i % 2 else None)
        dead = await drain_topic(client, t + "-sub-DLQ", 5)
        assert [m.data() for m in dead] == [b"m%d" % i for i in range(5)]
        for i, m in enumerate(dead):
            props = m.properties()
            assert props["DEAD_LETTER_REASON"] == f"bad {i}" and props["REAL_TOPIC"] == t
            assert props.get("DEAD_LETTER_EXCEPTION") == ("ValueError" if i % 2 else None)
        with pytest.raises(pulsar.Timeout):
            await consumer.receive(timeout_ms=1500)  # acknowledged: nothing comes back
        assert consumer.stats()["terminal_dead_letters"] == 5
    finally:
        await producer.close()
        await consumer.close()


async def test_ack_timeout_with_backoff_on_the_broker(client, topic):
    import nacktracker

    t = topic("ackto")
    consumer = await nacktracker.subscribe(client, t, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                           ack_timeout_ms=500,
                                           ack_timeout_backoff=MultiplierBackoff(500, 4000))
    producer = await client.create_producer(t)
    try:
        await producer.send(b"x")
        times, msg = [], None
        for _ in range(4):
            msg = await consumer.receive(timeout_ms=10_000)
            times.append(now_ms())
        await consumer.acknowledge(msg)
        gaps = [b - a for a, b in zip(times, times[1:])]
        # never early: each gap is timed between two receive() returns, so the first one returning a hair
        # later than its message was handed over (a few ms on a loaded loop) reads as that much early
        assert all(want - RECEIVE_JITTER_MS <= gap <= want + 150 for gap, want in zip(gaps, (500, 1000, 2000))), gaps
        with pytest.raises(pulsar.Timeout):
            await consumer.receive(timeout_ms=4500)
    finally:
        await producer.close()
        await consumer.close()


async def test_ack_timeouts_count_for_max_redeliveries_then_dead_letter(client, topic):
    """Never acknowledged: delivered 1 + max_redeliveries times, then dead-lettered when its last
    delivery's timeout passes (as Java's ack-timeout redelivery past maxRedeliverCount). On the default
    type, Exclusive: each redelivery comes from the consumer's memory (it kept the message when its ack
    timeout passed; pulsar-lite resends nothing there, Apache Pulsar would resend everything)."""
    import nacktracker

    t = topic("ackdlq")
    consumer = await nacktracker.subscribe(client, t, "sub", ack_timeout_ms=300, max_redeliveries=2)
    producer = await client.create_producer(t)
    try:
        await producer.send(b"slow")
        deliveries = []
        while True:
            try:
                deliveries.append((await consumer.receive(timeout_ms=3000)).redelivery_count())
            except pulsar.Timeout:
                break
        assert len(deliveries) == 3, deliveries
        dead = await drain_topic(client, t + "-sub-DLQ", 1)
        assert dead[0].data() == b"slow" and consumer.stats()["ack_timeouts_last"] == 1
    finally:
        await producer.close()
        await consumer.close()


async def test_a_broker_restart_in_a_poison_loop_does_not_reset_its_count(own_broker, topic, tmp_path):
    """max_redeliveries=3: the message is delivered 1 + 3 times, then dead-lettered, although the
    broker restarts after its second redelivery (its own count starts again from 0)."""
    import pulsar.asyncio

    import nacktracker

    broker = own_broker().start()
    t = topic("poison")
    client = pulsar.asyncio.Client(broker.url, operation_timeout_seconds=10,
                                   logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    consumer = await nacktracker.subscribe(client, t, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                           max_redeliveries=3, delay_ms=200)
    producer = await client.create_producer(t)
    try:
        await producer.send(b"poison")
        deliveries = []
        while True:
            try:
                msg = await consumer.receive(timeout_ms=5000 if len(deliveries) != 3 else 30_000)
            except pulsar.Timeout:
                break
            deliveries.append(msg.redelivery_count())
            if len(deliveries) == 3:
                await asyncio.sleep(0.3)
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, broker.stop)
                await loop.run_in_executor(None, broker.start)
            await consumer.negative_acknowledge(msg)
        assert len(deliveries) == 4, deliveries
        assert consumer.stats()["dead_letter_published"] == 1
        dead = await drain_topic(client, t + "-sub-DLQ", 1, timeout_ms=10_000)
        assert dead[0].data() == b"poison"
    finally:
        await producer.close()
        await consumer.close()
        await client.close()


@pytest.mark.parametrize("down_s", [0.0, 1.0], ids=["nack-pending-at-restore", "nack-due-during-downtime"])
async def test_a_consumer_restart_on_its_snapshot_keeps_the_count(own_broker, topic, tmp_path, down_s):
    """max_redeliveries=3: nacked three times, the consumer closes (snapshot, the third nack pending),
    the broker restarts (its count resets), a new consumer starts on the snapshot: the third nack's
    redelivery (the restored tracker's, or the broker's resend when it fell due while all was down),
    then the dead-letter topic."""
    import pulsar.asyncio

    import nacktracker

    broker = own_broker().start()
    t = topic("poison-snap")
    path = tmp_path / "snap"
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    client = pulsar.asyncio.Client(broker.url, operation_timeout_seconds=10, logger=logger)
    options = dict(max_redeliveries=3, delay_ms=300, snapshot_path=path, snapshot_interval_s=None)
    consumer = await nacktracker.subscribe(client, t, "sub", consumer_type=pulsar.ConsumerType.Shared, **options)
    producer = await client.create_producer(t)
    await producer.send(b"poison")
    await producer.close()
    deliveries = []
    try:
        for _ in range(3):
            msg = await consumer.receive(timeout_ms=10_000)
            deliveries.append(msg.redelivery_count())
            await consumer.negative_acknowledge(msg)
        await consumer.close()  # the third nack is pending: saved, with the consumer's count (2)
        await client.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, broker.stop)
        await asyncio.sleep(down_s)
        await loop.run_in_executor(None, broker.start)
        client = pulsar.asyncio.Client(broker.url, operation_timeout_seconds=10, logger=logger)
        consumer = await nacktracker.subscribe(client, t, "sub", consumer_type=pulsar.ConsumerType.Shared, **options)
        while True:
            try:
                msg = await consumer.receive(timeout_ms=5000)
            except pulsar.Timeout:
                break
            deliveries.append(msg.redelivery_count())
            await consumer.negative_acknowledge(msg)
        assert len(deliveries) == 4, deliveries  # 1 + max_redeliveries
        assert consumer.stats()["dead_letter_published"] == 1
        dead = await drain_topic(client, t + "-sub-DLQ", 1)
        assert dead[0].data() == b"poison"
    finally:
        await consumer.close()
        await client.close()
