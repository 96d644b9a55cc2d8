"""NegativeAcksTracker with an injectable clock and the MemoryAdapter."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nacktracker import (FixedBackoff, ManualClock, MessageKey, MultiplierBackoff, NegativeAcksTracker,
                         TrackerClosedError)
from nacktracker.adapters import AdapterError, MemoryAdapter


async def settle(rounds: int = 5) -> None:
    """Let tasks the timer started (adapter calls) run to completion."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def make(clock=None, **kw):
    clock = clock or ManualClock(start_ms=1_000_000)
    adapter = kw.pop("adapter", None) or MemoryAdapter(clock=clock.now_ms, lead_ms=kw.pop("lead_ms", 0))
    return NegativeAcksTracker(adapter, clock=clock, **kw), adapter, clock


def K(entry, ledger=7, **kw):
    return MessageKey(ledger, entry, **kw)


# -- exact fire times ------------------------------------------------------------

@pytest.mark.parametrize("bits", [0, 8, 10])
@pytest.mark.parametrize("rounding", ["floor", "ceil"])
async def test_fires_exactly_at_the_bucket_time(bits, rounding):
    tracker, adapter, clock = make(precision_bits=bits, rounding=rounding, delay_ms=1000)
    start = clock.now_ms()
    due = tracker.add(K(1))
    assert due == start + 1000
    width = 1 << bits
    bucket = (due // width) * width if rounding == "floor" else -(-due // width) * width
    assert tracker.next_fire_ms() == bucket
    clock.advance_to(bucket - 1)
    await settle()
    assert adapter.calls == []
    clock.advance_to(bucket)
    await settle()
    assert [c.at_ms for c in adapter.calls] == [bucket]
    assert adapter.redelivered == [K(1)]
    error = bucket - due
    assert (-width < error <= 0) if rounding == "floor" else (0 <= error < width)
    assert tracker.pending == 0 and tracker.next_fire_ms() is None


async def test_one_timer_armed_at_the_earliest_bucket_whatever_the_adds():
    """The design's one timer: however nacks arrive (earlier, later, equal), the clock holds
    exactly one armed timer, at the earliest bucket; after every fire, the next one."""
    tracker, adapter, clock = make(precision_bits=0)
    for delay in (5000, 3000, 3000, 7000, 100, 2500, 100):
        tracker.add(K(delay + len(adapter.calls)), delay_ms=delay)
        assert clock.timers() == [tracker.next_fire_ms()]
    while tracker.pending:
        clock.advance_to(clock.timers()[0])
        await settle()
        assert clock.timers() == ([tracker.next_fire_ms()] if tracker.pending else [])
    assert sorted(k.entry_id for k in adapter.redelivered) == sorted(d for d in (5000, 3000, 7000, 100, 2500))


async def test_an_earlier_add_pulls_the_timer_earlier_and_a_later_one_does_not():
    tracker, adapter, clock = make(precision_bits=0)
    t0 = clock.now_ms()
    tracker.add(K(1), delay_ms=1000)
    assert tracker.next_fire_ms() == t0 + 1000
    tracker.add(K(2), delay_ms=100)
    assert tracker.next_fire_ms() == t0 + 100
    tracker.add(K(3), delay_ms=5000)
    assert tracker.next_fire_ms() == t0 + 100
    clock.advance(100)
    await settle()
    assert adapter.redelivered == [K(2)]
    assert tracker.next_fire_ms() == t0 + 1000
    clock.advance(900)
    await settle()
    assert adapter.redelivered == [K(2), K(1)]


async def test_a_steady_stream_of_nacks_never_postpones_redelivery():
    """10,000 nacks at one per ms, delay 100 ms, precision 0: each fires on time."""
    tracker, adapter, clock = make(precision_bits=0, delay_ms=100)
    t0 = int(clock.now_ms())
    added_at = {}
    for i in range(10_000):
        clock.advance_to(t0 + i)
        await settle(2)
        tracker.add(K(i, ledger=1 + i // 5000))
        added_at[K(i, ledger=1 + i // 5000)] = t0 + i
    for t in range(t0 + 10_000, t0 + 10_101):
        clock.advance_to(t)
        await settle(2)
    arrivals = {k: c.at_ms for c in adapter.calls for k in c.keys}
    assert len(arrivals) == 10_000
    assert all(arrivals[k] == added_at[k] + 100 for k in added_at)
    assert arrivals[K(0, ledger=1)] == t0 + 100  # the first comes back while nacks still pour in


async def test_one_adapter_call_per_fire_with_every_due_bucket():
    tracker, adapter, clock = make(precision_bits=0)
    for i, delay in enumerate((10, 20, 30)):
        tracker.add(K(i), delay_ms=delay)
    clock.stall(50)  # the loop was blocked: one wake-up covers three buckets
    await settle()
    assert len(adapter.calls) == 1
    assert adapter.calls[0].keys == (K(0), K(1), K(2))
    assert tracker.stats()["timer_lag_ms"]["max"] == 40  # the first bucket fired 40 ms late


async def test_lead_ms_fires_earlier():
    tracker, adapter, clock = make(precision_bits=0, lead_ms=30)
    t0 = clock.now_ms()
    tracker.add(K(1), delay_ms=200)
    assert tracker.next_fire_ms() == t0 + 170
    clock.advance(170)
    await settle()
    assert adapter.calls[0].at_ms == t0 + 170


# -- delays, backoff, dead letters ---------------------------------------------------

async def test_delay_precedence_explicit_then_backoff_then_default():
    tracker, _, clock = make(precision_bits=0, delay_ms=5000, backoff=MultiplierBackoff(100, 1000))
    t0 = clock.now_ms()
    assert tracker.add(K(1), delay_ms=42) == t0 + 42
    assert [tracker.add(K(10 + n), redelivery_count=n) - t0 for n in range(6)] == [100, 200, 400, 800, 1000, 1000]
    plain, _, clock2 = make(precision_bits=0, delay_ms=5000)
    assert plain.add(K(1)) == clock2.now_ms() + 5000
    fixed, _, clock3 = make(precision_bits=0, backoff=FixedBackoff(300))
    assert fixed.add(K(1), redelivery_count=9) == clock3.now_ms() + 300


async def test_redelivery_count_comes_from_the_message():
    class Msg:
        def __init__(self, count):
            self._count = count

        def message_id(self):
            return K(3)

        def redelivery_count(self):
            return self._count

        def topic_name(self):
            return "persistent://public/default/t"

    tracker, _, clock = make(precision_bits=0, backoff=MultiplierBackoff(100, 10_000))
    assert tracker.add(Msg(3)) == clock.now_ms() + 800


async def test_dead_letter_after_max_redeliveries():
    seen = []
    tracker, adapter, clock = make(precision_bits=0, max_redeliveries=3, on_dead_letter=seen.append)
    assert tracker.add(K(1), redelivery_count=2) is not None
    assert tracker.add(K(2), redelivery_count=3) is None
    assert seen == [K(2)] and tracker.pending == 1
    assert tracker.stats()["dead_lettered"] == 1


async def test_async_dead_letter_and_a_failing_one_keeps_the_message():
    calls = []

    async def dlq(key):
        calls.append(key)
        if key.entry_id == 2:
            raise RuntimeError("publish failed")

    tracker, adapter, clock = make(precision_bits=0, max_redeliveries=1, on_dead_letter=dlq, delay_ms=100)
    tracker.add(K(1), redelivery_count=1)
    tracker.add(K(2), redelivery_count=1)
    await settle()
    assert calls == [K(1), K(2)]
    s = tracker.stats()
    assert s["dead_lettered"] == 1 and s["dead_letter_failures"] == 1
    assert tracker.pending == 1  # the failed one is redelivered, to be dead-lettered again
    clock.advance(100)
    await settle()
    assert adapter.redelivered == [K(2)]


async def test_a_dead_letter_failing_during_close_stays_pending_and_in_the_snapshot():
    gate = asyncio.Event()

    async def dlq(key):
        await gate.wait()
        raise RuntimeError("publish failed while closing")

    tracker, adapter, clock = make(precision_bits=0, max_redeliveries=1, on_dead_letter=dlq, delay_ms=100)
    tracker.add(K(7), redelivery_count=1)
    closing = asyncio.ensure_future(tracker.close())
    await settle()
    assert not closing.done()  # close() waits for the dead letter in flight
    gate.set()
    await closing
    assert tracker.closed and tracker.pending == 1 and K(7) in tracker
    assert tracker.stats()["dead_letter_failures"] == 1
    restored = NegativeAcksTracker.restore(tracker.snapshot(), MemoryAdapter(), elapsed="none", clock=ManualClock())
    assert K(7) in restored
    clock.advance(1_000)
    await settle()
    assert adapter.redelivered == []  # closed: kept, never fired


def test_max_redeliveries_without_a_hook_is_refused():
    with pytest.raises(ValueError, match="on_dead_letter"):
        NegativeAcksTracker(MemoryAdapter(), max_redeliveries=3)


# -- discard, close ------------------------------------------------------------------

async def test_discard_cancels_every_pending_occurrence():
    tracker, adapter, clock = make(precision_bits=0)
    tracker.add(K(1), delay_ms=10)
    tracker.add(K(1), delay_ms=20)
    tracker.add(K(2), delay_ms=10)
    assert K(1) in tracker
    assert tracker.discard(K(1)) is True
    assert tracker.discard(K(1)) is False
    assert tracker.discard(K(99, ledger=12345)) is False
    clock.advance(30)
    await settle()
    assert adapter.redelivered == [K(2)]


async def test_close_without_flush_keeps_pending_accounted_and_stops_the_timer():
    tracker, adapter, clock = make(precision_bits=0)
    tracker.add(K(1), delay_ms=10)
    await tracker.close()
    clock.advance(100)
    await settle()
    assert adapter.calls == [] and tracker.pending == 1
    with pytest.raises(TrackerClosedError):
        tracker.add(K(2))
    assert tracker.pending == 1
    await tracker.close()  # idempotent


async def test_close_with_flush_redelivers_everything_now():
    tracker, adapter, clock = make(precision_bits=0)
    tracker.add(K(1), delay_ms=10_000)
    tracker.add(K(2, ledger=8, topic="t"), delay_ms=99_000)
    await tracker.close(flush=True)
    assert adapter.redelivered == [K(1), K(2, ledger=8, topic="t")]
    assert tracker.pending == 0 and tracker.stats()["redelivered"] == 2


async def test_flush_failure_raises_and_keeps_the_keys_counted():
    tracker, adapter, clock = make(precision_bits=0)
    tracker.add(K(1), delay_ms=10_000)
    adapter.fail_next(1)
    with pytest.raises(AdapterError):
        await tracker.close(flush=True)
    assert tracker.stats()["unsent"] == 1


async def test_async_with_closes():
    clock = ManualClock()
    async with NegativeAcksTracker(MemoryAdapter(clock=clock.now_ms), clock=clock) as tracker:
        tracker.add(K(1))
    assert tracker.closed


# -- adapter failures -----------------------------------------------------------------

async def test_adapter_failure_is_retried_with_backoff_and_nothing_is_lost(caplog):
    tracker, adapter, clock = make(precision_bits=0, retry_min_ms=100, retry_max_ms=1000)
    t0 = clock.now_ms()
    tracker.add(K(1), delay_ms=10)
    adapter.fail_next(3)
    clock.advance(10)
    await settle()
    assert adapter.failed_calls == 1 and tracker.stats()["unsent"] == 1
    tracker.add(K(2), delay_ms=50)  # due while the first one backs off
    clock.advance_to(t0 + 110)  # first retry (100 ms) fails too
    await settle()
    clock.advance_to(t0 + 310)  # second retry (200 ms) fails
    await settle()
    assert adapter.failed_calls == 3
    clock.advance_to(t0 + 710)  # third retry (400 ms) succeeds with everything due
    await settle()
    assert adapter.redelivered == [K(1), K(2)]
    s = tracker.stats()
    assert s["failures"] == 3 and s["unsent"] == 0 and s["redelivered"] == 2
    assert "retrying" in caplog.text


async def test_slow_adapter_never_blocks_add_and_calls_do_not_pile_up():
    clock = ManualClock()
    adapter = MemoryAdapter(clock=clock.now_ms, delay_s=0.05)
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0)
    for step in range(20):
        tracker.add(K(step), delay_ms=1)
        clock.advance(1)
        await asyncio.sleep(0)
    assert adapter.max_in_flight == 1
    await adapter.wait_for(20, timeout=5)
    assert adapter.max_in_flight == 1
    assert len(adapter.calls) < 20  # fires that came during a call were merged
    assert sorted(k.entry_id for k in adapter.redelivered) == list(range(20))


# -- routing, events, stats ---------------------------------------------------------------

async def test_keys_keep_topic_and_partition_even_when_ledger_ids_collide():
    tracker, adapter, clock = make(precision_bits=0)
    a = MessageKey(0, 1, partition=-1, topic="persistent://public/default/a")
    b = MessageKey(0, 1, partition=-1, topic="persistent://public/default/b")
    c = MessageKey(0, 1, partition=3, topic="persistent://public/default/c-partition-3")
    for key in (a, b, c):
        tracker.add(key, delay_ms=5)
    assert tracker.pending == 3
    tracker.discard(b)
    clock.advance(5)
    await settle()
    assert sorted(adapter.redelivered, key=str) == sorted([a, c], key=str)
    assert tracker.stats()["pending"] == 0 and tracker._origins == {} and tracker._slots == {}


async def test_a_batch_message_is_tracked_as_its_entry():
    tracker, adapter, clock = make(precision_bits=0)
    tracker.add(K(5, batch_index=3), delay_ms=5)
    tracker.add(K(5, batch_index=4), delay_ms=5)
    clock.advance(5)
    await settle()
    assert adapter.redelivered == [K(5)]


async def test_events_and_stats():
    events = []
    tracker, adapter, clock = make(precision_bits=0, on_event=events.append, max_redeliveries=5,
                                   on_dead_letter=lambda key: None, consumer_name="c1")
    tracker.add(K(1, topic="t"), delay_ms=10)
    tracker.add(K(2), redelivery_count=5)
    clock.advance(12)
    await settle()
    kinds = [(e.kind, e.entry_id) for e in events]
    assert kinds == [("nack", 1), ("dead_letter", 2), ("redeliver", 1)]
    assert events[0].topic == "t" and events[0].delay_ms == 10 and events[0].consumer == "c1"
    assert abs(events[0].ts_ms - time.time() * 1000) < 60_000  # wall clock, for humans
    s = tracker.stats()
    assert s["nacks"] == 1 and s["redelivered"] == 1 and s["dead_lettered"] == 1
    assert s["timer_lag_ms"]["count"] == 1 and s["timer_lag_ms"]["max"] == 0
    assert s["nbytes"] > 0


async def test_a_failing_event_hook_does_not_break_add(caplog):
    def boom(event):
        raise RuntimeError("hook")

    tracker, _, _ = make(on_event=boom)
    tracker.add(K(1))
    assert tracker.pending == 1 and "on_event hook failed" in caplog.text


# -- threads and the real loop ----------------------------------------------------------

async def test_add_threadsafe_from_a_listener_thread():
    adapter = MemoryAdapter()
    tracker = NegativeAcksTracker(adapter, precision_bits=0, delay_ms=20)
    errors = []

    def listener():
        for i in range(100):
            tracker.add_threadsafe(K(i))
        try:
            tracker.add_threadsafe(object())
        except TypeError as e:
            errors.append(e)

    thread = threading.Thread(target=listener)
    thread.start()
    thread.join()
    assert len(errors) == 1
    await adapter.wait_for(100, timeout=5)
    assert sorted(k.entry_id for k in adapter.redelivered) == list(range(100))
    await tracker.close()


async def test_a_plain_add_from_another_thread_is_refused_naming_add_threadsafe():
    """add() touches the index and the loop's timer: from a foreign thread it
    raises at once (the nack is not taken: it would wait for the loop's next
    wakeup), and the error says what to call instead."""
    tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=0, delay_ms=10)
    tracker.add(K(1))  # on the loop: bound
    raised = []

    def listener():
        try:
            tracker.add(K(2))
        except RuntimeError as exc:
            raised.append(str(exc))

    thread = threading.Thread(target=listener)
    thread.start()
    thread.join()
    assert len(raised) == 1 and "add_threadsafe" in raised[0]
    assert tracker.pending == 1 and K(2) not in tracker
    await tracker.close()


def test_add_outside_any_loop_is_refused_naming_add_threadsafe():
    tracker, _, _ = make()
    with pytest.raises(RuntimeError, match="add_threadsafe"):
        tracker.add(K(1))
    assert tracker.pending == 0


@pytest.mark.parametrize("build", [
    lambda d: NegativeAcksTracker(MemoryAdapter(), delay_ms=d),
    lambda d: FixedBackoff(d),
    lambda d: MultiplierBackoff(1, d),
])
def test_a_default_delay_past_the_due_time_range_is_refused_where_it_is_given(build):
    """A default used by every later nack is checked once, at construction:
    2^63 ms would make every nack using it raise."""
    for bad in (2**63, 2**62, 2**61):
        with pytest.raises(ValueError, match="<= 2305843009213693951"):
            build(bad)
    build(2**61 - 1)


async def test_add_threadsafe_refuses_in_the_calling_thread_what_add_refuses():
    """A delay past the clock's range and a backoff that raises or returns a bad
    delay raise in the listener thread, as add() would; nothing is queued."""
    def backoff(count):
        if count == 3:
            raise ArithmeticError("backoff broke")
        return -5 if count == 4 else 10

    tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=0, backoff=backoff)
    raised = {}

    def listener():
        for name, kwargs in (("huge", {"delay_ms": 2**62}), ("raises", {"redelivery_count": 3}),
                             ("negative", {"redelivery_count": 4}), ("ok", {"redelivery_count": 1})):
            try:
                tracker.add_threadsafe(K(1), **kwargs)
            except Exception as exc:  # noqa: BLE001 - recorded and checked below
                raised[name] = type(exc)

    thread = threading.Thread(target=listener)
    thread.start()
    thread.join()
    for _ in range(5):
        await asyncio.sleep(0)
    assert raised == {"huge": ValueError, "raises": ArithmeticError, "negative": ValueError}
    assert tracker.pending == 1 and tracker.stats()["threadsafe_failures"] == 0
    for kwargs in ({"delay_ms": 2**62}, {"redelivery_count": 3}, {"redelivery_count": 4}):  # add() agrees
        with pytest.raises((ValueError, ArithmeticError)):
            tracker.add(K(2), **kwargs)
    await tracker.close()


async def test_add_threadsafe_counts_and_logs_what_still_fails_on_the_loop(caplog):
    """A failure on the loop after the calling thread's checks passed is
    counted in threadsafe_failures and logged, never silent (a close in
    between is counted as rejected_after_close: tests/test_faults.py)."""
    tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=0)
    tracker.add_threadsafe(K(1), delay_ms=10)

    def broken(*args):
        raise RuntimeError("index broke")

    tracker._schedule = broken  # fault injection: scheduling breaks before the loop runs the add
    await asyncio.sleep(0.01)
    assert tracker.stats()["threadsafe_failures"] == 1 and "failed on the loop" in caplog.text
    await tracker.close()


async def test_real_loop_delivers_every_nack_never_early():
    """1,000 nacks with delays 20–200 ms at precision 0 on the real loop: every
    one is handed over, none before its due time. How late is a benchmark's
    question (bench/precision.py), not a unit test's: the machine is shared."""
    adapter = MemoryAdapter()
    tracker = NegativeAcksTracker(adapter, precision_bits=0)
    due = {}
    for i in range(1000):
        key = K(i)
        delay = 20 + (i * 37) % 181
        due[key] = tracker.add(key, delay_ms=delay)
        if i % 50 == 0:
            await asyncio.sleep(0.001)
    await adapter.wait_for(1000, timeout=30)
    delivered = [k for c in adapter.calls for k in c.keys]
    assert sorted(delivered) == sorted(due)
    errors = sorted(c.at_ms - due[k] for c in adapter.calls for k in c.keys)
    assert errors[0] >= -1  # never early at precision 0 (1 ms: the clock's own rounding)
    assert tracker.stats()["timer_lag_ms"]["count"] == 1000
    await tracker.close()


async def test_wall_clock_jumps_move_nothing(monkeypatch):
    adapter = MemoryAdapter()
    tracker = NegativeAcksTracker(adapter, precision_bits=0)
    tracker.add(K(1), delay_ms=50)
    fire = tracker.next_fire_ms()
    monkeypatch.setattr(time, "time", lambda: 4_000_000_000.0)  # wall clock jumps by decades
    tracker.add(K(2), delay_ms=60)
    assert tracker.next_fire_ms() == fire
    await adapter.wait_for(2, timeout=2)
    await tracker.close()


# -- bad input -------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [object(), 5, "7:1", None, (1, 2), b"x", 1.5])
async def test_non_message_ids_are_refused(bad):
    tracker, _, _ = make()
    tracker.add(K(1))
    with pytest.raises(TypeError):
        tracker.add(bad)
    with pytest.raises(TypeError):
        tracker.discard(bad)
    assert tracker.pending == 1


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), -0.5, True, "10", [10]])
async def test_bad_delays_are_refused(bad):
    tracker, _, _ = make()
    tracker.add(K(1))
    with pytest.raises((TypeError, ValueError)):
        tracker.add(K(2), delay_ms=bad)
    assert tracker.pending == 1 and K(2) not in tracker


@pytest.mark.parametrize("bad", [-1, 1.0, True, "1"])
async def test_bad_redelivery_counts_are_refused(bad):
    tracker, _, _ = make()
    with pytest.raises((TypeError, ValueError)):
        tracker.add(K(2), redelivery_count=bad)
    assert tracker.pending == 0


@pytest.mark.parametrize("bad", [MessageKey(-1, 1), MessageKey(1, -1), MessageKey(1, 2**63), MessageKey(1, 1, -2),
                                 MessageKey(1, 1, topic=5), MessageKey(True, 1)])
async def test_bad_keys_are_refused(bad):
    tracker, _, _ = make()
    with pytest.raises((TypeError, ValueError)):
        tracker.add(bad)
    assert tracker.pending == 0


async def test_bad_backoff_results_are_refused():
    tracker, _, _ = make(backoff=lambda n: float("nan"))
    with pytest.raises(ValueError):
        tracker.add(K(1))
    assert tracker.pending == 0


@pytest.mark.parametrize("kwargs", [
    {"delay_ms": -5}, {"delay_ms": float("nan")}, {"precision_bits": 31}, {"rounding": "nearest"},
    {"backoff": 5}, {"max_redeliveries": 0, "on_dead_letter": print}, {"clock": object()},
    {"on_event": "x"},
])
def test_bad_construction(kwargs):
    with pytest.raises((TypeError, ValueError)):
        NegativeAcksTracker(MemoryAdapter(), **kwargs)


def test_adapter_must_have_redeliver():
    with pytest.raises(TypeError):
        NegativeAcksTracker(object())


@pytest.mark.parametrize("bad", [(-1, 10), (10, 5), (float("nan"), 10)])
def test_bad_backoff_construction(bad):
    with pytest.raises((TypeError, ValueError)):
        MultiplierBackoff(*bad)
    with pytest.raises((TypeError, ValueError)):
        MultiplierBackoff(10, 100, multiplier=0.5)


async def test_an_adapter_coalesce_window_folds_nearby_buckets_into_one_call():
    adapter_clock = ManualClock()
    adapter = MemoryAdapter(clock=adapter_clock.now_ms)
    adapter.coalesce_ms = 20
    tracker = NegativeAcksTracker(adapter, clock=adapter_clock, precision_bits=0)
    t0 = adapter_clock.now_ms()
    for i, delay in enumerate((100, 110, 120, 121)):
        tracker.add(K(i), delay_ms=delay)
    adapter_clock.advance(100)
    await settle()
    assert [k.entry_id for k in adapter.calls[0].keys] == [0, 1, 2]  # 110 and 120 ride along
    assert tracker.next_fire_ms() == t0 + 121


# -- routing: the tracker's own slot numbers never meet a ledger id ---------------

TOPICS = ("persistent://public/default/a", "persistent://public/default/b", "persistent://public/default/c")


async def test_a_ledger_id_at_2_62_never_takes_another_topics_slot():
    """(A, 5, 1), (C, 2^62, 7), (B, 5, 2): each comes back as itself, and so do
    a second nack of C's and an unrelated one after the first fire."""
    tracker, adapter, clock = make(precision_bits=0)
    a, b, c = TOPICS[:3]
    first = [MessageKey(5, 1, topic=a), MessageKey(2**62, 7, topic=c), MessageKey(5, 2, topic=b)]
    for key in first:
        tracker.add(key, delay_ms=10)
    clock.advance(10)
    await settle()
    assert sorted(adapter.redelivered, key=str) == sorted(first, key=str)
    again = [MessageKey(2**62, 7, topic=c), MessageKey(9, 9, topic=a)]
    for key in again:
        tracker.add(key, delay_ms=10)
    clock.advance(10)
    await settle()
    assert sorted(adapter.redelivered, key=str) == sorted(first + again, key=str)
    assert tracker.pending == 0 and tracker._origins == {} and tracker._slots == {}


_SHARED_LEDGERS = (0, 1, 5, 2**62 - 1, 2**62, 2**62 + 1, 2**63 - 1)
_routing_key = st.builds(
    MessageKey,
    ledger_id=st.one_of(st.sampled_from(_SHARED_LEDGERS), st.integers(0, 2**63 - 1)),
    entry_id=st.one_of(st.integers(0, 3), st.integers(0, 2**63 - 1)),
    partition=st.sampled_from((-1, 0, 1)),
    batch_index=st.just(-1),
    topic=st.sampled_from(TOPICS))
_routing_op = st.one_of(
    st.tuples(st.just("add"), _routing_key, st.integers(0, 30)),
    st.tuples(st.just("ack"), _routing_key),
    st.tuples(st.just("advance"), st.integers(1, 20)),
    st.tuples(st.just("restore")))


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(_routing_op, max_size=40))
def test_every_nack_comes_back_as_itself_live_and_after_restore(ops):
    """Several topics sharing ledger ids over the whole id range (a topic-less
    id joins the only topic known for its ledger: tested above), acks, fires
    and snapshot/restore in between: the redeliveries are exactly the keys
    nacked, each once per request (its earliest pending due time; the fire
    cancels the entry's later buckets), as a dict of due times per key says."""
    async def run():
        clock = ManualClock(start_ms=1_000)
        adapter = MemoryAdapter(clock=clock.now_ms)
        tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0)
        model: dict[MessageKey, set[int]] = {}  # key -> due times pending
        expected: list[MessageKey] = []
        got: list[MessageKey] = []
        for op in ops:
            if op[0] == "add":
                _, key, delay = op
                due = tracker.add(key, delay_ms=delay)
                model.setdefault(key, set()).add(due)
            elif op[0] == "ack":
                tracker.discard(op[1])
                model.pop(op[1], None)
            elif op[0] == "advance":
                clock.advance(op[1])
                await settle()
                now = clock.now_ms()
                for key, dues in list(model.items()):
                    if min(dues) <= now:  # one request per entry: its fire cancels the entry's later buckets
                        expected.append(key)
                        del model[key]
            else:  # a snapshot and a new tracker on the same clock: due times stay exact
                await tracker.close()
                got.extend(adapter.redelivered)
                adapter = MemoryAdapter(clock=clock.now_ms)
                tracker = NegativeAcksTracker.restore(tracker.snapshot(), adapter, clock=clock, elapsed="none")
        clock.advance(100)
        await settle()
        for dues in model.values():
            assert all(d <= clock.now_ms() for d in dues)
        expected.extend(model)
        got.extend(adapter.redelivered)
        assert Counter(got) == Counter(expected)
        assert tracker.pending == 0 and tracker._origins == {} and tracker._slots == {}

    asyncio.run(run())


async def test_nacks_inside_the_lead_window_share_one_armed_fire():
    """With a lead above the delays every nack is due to go at once: the first
    arms the timer, the rest of the loop's iteration ride along (no re-arm per
    nack, even for an earlier bucket), and one fire hands all of them over."""
    tracker, adapter, clock = make(precision_bits=0, lead_ms=250)
    armed = []
    call_at = clock.call_at
    clock.call_at = lambda when, fn: armed.append(when) or call_at(when, fn)
    for i, delay in enumerate([200, 150, 100, 50, 0]):  # each bucket earlier than the last
        tracker.add(K(i), delay_ms=delay)
    assert len(armed) == 1
    clock.advance(0)
    await settle()
    assert sorted(k.entry_id for k in adapter.redelivered) == [0, 1, 2, 3, 4]
    assert tracker.stats()["fires"] == 1 and tracker.pending == 0
    tracker.add(K(9), delay_ms=1_000)  # beyond the lead: a timer of its own
    assert armed[1:] == [1_000_000 + 1_000 - 250]
