"""NegativeAcksTracker with an injectable clock and the MemoryAdapter."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nacktracker import (
    FixedBackoff,
    ManualClock,
    MessageKey,
    MultiplierBackoff,
    NegativeAcksTracker,
    TrackerClosedError,
)
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
    assert tracker.next_fire_ms() == 1_000_010
    await tracker.close()
    assert tracker.next_fire_ms() is None  # nothing armed any more
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
    assert tracker.stats()["unsent"] == 1 and tracker.stats()["failures"] == 1  # the failed flush is counted


async def test_a_failed_flush_adds_to_the_failures_already_counted():
    tracker, adapter, clock = make(precision_bits=0, retry_min_ms=100)
    tracker.add(K(1), delay_ms=5)
    adapter.fail_next(2)
    clock.advance(5)
    await settle()  # the timer's call fails: retried in 100 ms
    assert tracker.stats()["failures"] == 1 and tracker.stats()["unsent"] == 1
    with pytest.raises(AdapterError):
        await tracker.close(flush=True)  # fails too
    assert tracker.stats()["failures"] == 2 and tracker.stats()["unsent"] == 1


def test_an_unbound_tracker_closes_with_flush_handing_over_nothing():
    adapter = MemoryAdapter()
    tracker = NegativeAcksTracker(adapter, precision_bits=0)  # made outside any loop: no clock yet
    asyncio.run(tracker.close(flush=True))
    assert tracker.closed and adapter.calls == [] and tracker.stats()["redelivered"] == 0


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


def test_loop_is_the_event_loop_the_tracker_is_bound_to():
    tracker = NegativeAcksTracker(MemoryAdapter())  # made outside a loop: bound on first use
    assert tracker.loop is None

    async def main() -> None:
        tracker.add(MessageKey(1, 1))
        assert tracker.loop is asyncio.get_running_loop()
        await tracker.close()

    asyncio.run(main())


def test_a_key_with_another_batch_index_or_topic_keeps_its_other_fields():
    key = MessageKey(7, 9, 2, 3, "persistent://public/default/t")
    assert key.with_batch_index(5) == MessageKey(7, 9, 2, 5, "persistent://public/default/t")
    assert key.with_batch_index(-1) == key.entry and type(key.with_batch_index(5)) is MessageKey
    assert key.with_topic(None) == MessageKey(7, 9, 2, 3) and key.with_topic("u") == MessageKey(7, 9, 2, 3, "u")
    assert type(key.with_topic("u")) is MessageKey and key == MessageKey(7, 9, 2, 3, "persistent://public/default/t")


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
    assert tracker.pending == 1 and [r.getMessage() for r in caplog.records] == ["on_event hook failed"]


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


def test_add_after_its_loop_ended_is_refused_in_another_loop_and_outside_any():
    """The add's cheap loop check (this thread, the bound loop running)
    fails once the loop has stopped, and the full check refuses: from
    another loop in the same thread, and from no loop at all."""
    async def first():
        tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=0, delay_ms=10_000)
        tracker.add(K(1))  # bound, and the cheap check armed for this thread
        return tracker

    tracker = asyncio.run(first())

    async def second():
        with pytest.raises(RuntimeError, match="add_threadsafe"):
            tracker.add(K(2))

    asyncio.run(second())
    with pytest.raises(RuntimeError, match="add_threadsafe"):
        tracker.add(K(3))
    assert tracker.pending == 1 and K(2) not in tracker and K(3) not in tracker


def test_add_from_the_thread_its_loop_ran_in_before_is_refused_once_the_loop_runs_in_another():
    """A loop stopped in one thread and run again in another: an add from the first thread is a foreign
    thread's add now, refused, while the loop's own thread adds as before."""
    loop = asyncio.new_event_loop()
    tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=0, delay_ms=10_000)

    async def add(key):
        tracker.add(key)

    loop.run_until_complete(add(K(1)))  # bound to the loop, in this thread
    running, release = threading.Event(), threading.Event()

    async def hold():
        running.set()
        while not release.is_set():
            await asyncio.sleep(0.005)
        tracker.add(K(2))  # the loop's thread now: added as before

    other = threading.Thread(target=loop.run_until_complete, args=(hold(),))
    other.start()
    try:
        assert running.wait(5)
        with pytest.raises(RuntimeError, match="add_threadsafe"):
            tracker.add(K(3))
    finally:
        release.set()
        other.join()
    assert tracker.pending == 2 and K(3) not in tracker
    loop.run_until_complete(tracker.close())
    loop.close()


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


class BrokenIndex:
    """An index whose ``add`` raises (the rest is the real one's): a fault on the loop's side of an add."""

    def __init__(self, real):
        self.real = real

    def add(self, *args):
        raise RuntimeError("index broke")

    def __getattr__(self, name):
        return getattr(self.real, name)

    def __len__(self):
        return len(self.real)


async def test_add_threadsafe_counts_and_logs_what_still_fails_on_the_loop(caplog):
    """A failure on the loop after the calling thread's checks passed is
    counted in threadsafe_failures and logged, never silent (a close in
    between is counted as rejected_after_close: tests/tracker/test_faults.py)."""
    tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=0)
    tracker.add_threadsafe(K(1), delay_ms=10)

    tracker._index = BrokenIndex(tracker._index)  # fault injection: the index breaks before the loop runs the add
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


# -- the timer-lag histogram -------------------------------------------------------------

def test_latency_histogram_percentiles_are_nearest_rank_worked_by_hand():
    from nacktracker.tracker import LatencyHistogram

    h = LatencyHistogram()
    assert h.percentile(50) is None
    assert h.summary() == {"count": 0, "p50": None, "p99": None, "max": None}
    for v in [10, 1, 9, 2, 8, 3, 7, 4, 6, 5]:  # 1..10 in any order
        h.add(v)
    # rank = ceil(p/100 * n), at least 1: the smallest value with that many at or below it
    assert [h.percentile(p) for p in (0, 10, 11, 50, 51, 90, 99, 100)] == [1, 1, 2, 5, 6, 9, 10, 10]
    assert h.summary() == {"count": 10, "p50": 5, "p99": 10, "max": 10}


def test_latency_histogram_percentiles_of_a_thousand_values_worked_by_hand():
    from nacktracker.tracker import LatencyHistogram

    h = LatencyHistogram()
    for v in range(1, 1001):
        h.add(v)
    assert [h.percentile(p) for p in (1, 50, 99)] == [10, 500, 990]
    assert h.summary() == {"count": 1000, "p50": 500, "p99": 990, "max": 1000}


def test_latency_summary_percentiles_never_read_above_the_largest_value():
    """The counts are whole ms: one redelivery 0.818 ms late is p50 0.818, not 1 (above its own max)."""
    from nacktracker.tracker import LatencyHistogram

    h = LatencyHistogram()
    h.add(0.818)
    assert h.summary() == {"count": 1, "p50": 0.818, "p99": 0.818, "max": 0.818}
    h.add(0.2)
    assert h.summary() == {"count": 2, "p50": 0, "p99": 0.818, "max": 0.818}


async def test_imported_pending_cells_arm_the_timer_the_adapter_s_lead_ahead():
    import array

    tracker, adapter, clock = make(precision_bits=0, lead_ms=30)
    tracker.import_pending([("t", 0, 5), ("t", 0, 6)], [(0, 1_002_000, array.array("I", range(40)))])
    assert tracker.pending == 40 and tracker.next_fire_ms() == 1_002_000 - 30
    buckets = [(origin, bucket, list(ids)) for origin, bucket, ids in tracker.export_pending().buckets]
    assert buckets == [(("t", 0, 5), 1_002_000, list(range(40)))]


def test_latency_histogram_weights_rounding_and_clamping():
    from nacktracker.tracker import LatencyHistogram

    h = LatencyHistogram(limit_ms=100)
    h.add(2.4, weight=3)  # three entries of one cell: counted at 2 ms
    h.add(2.6)  # 3 ms
    assert (h.count, h.percentile(75), h.percentile(76)) == (4, 2, 3)
    h.add(-250.5)  # clamped to -100 ms in the counts, the figures keep their true max
    h.add(1234.5678)
    assert (h.percentile(1), h.percentile(100)) == (-100, 100)
    assert h.summary() == {"count": 6, "p50": 2, "p99": 100, "max": 1234.568}
    d = LatencyHistogram()  # the default range: 10 minutes either way
    d.add(700_000)
    d.add(-700_000)
    d.add(599_999)
    assert [d.percentile(p) for p in (1, 50, 100)] == [-600_000, 599_999, 600_000]


# -- add_threadsafe, binding, dead-letter and listener details -----------------------------

async def test_add_threadsafe_schedules_what_add_would_with_its_delay_count_and_backoff():
    """The add on the loop gets the delay and count checked in the calling thread: an
    explicit delay, else backoff(count) with the message's own count (0 for a bare id);
    a count at max_redeliveries dead-letters. A due time exactly at the range's end is taken."""
    from nacktracker._checks import MAX_DUE

    seen = []
    clock = ManualClock(start_ms=1_000)
    adapter = MemoryAdapter()
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0, backoff=lambda n: 10 * (n + 1),
                                  max_redeliveries=3, on_dead_letter=seen.append)
    tracker.add_threadsafe(K(1), delay_ms=7)
    tracker.add_threadsafe(K(2), redelivery_count=3)  # dead-lettered on the loop
    tracker.add_threadsafe(K(3), redelivery_count=1)  # backoff(1) = 20 ms
    tracker.add_threadsafe(K(4))  # its own count, 0: backoff(0) = 10 ms
    tracker.add_threadsafe(K(5), delay_ms=MAX_DUE - 1_000)  # due at MAX_DUE: in range
    with pytest.raises(ValueError, match=f"^delay_ms {MAX_DUE - 999} is too large$"):
        tracker.add_threadsafe(K(6), delay_ms=MAX_DUE - 999)
    await settle()
    assert seen == [K(2)] and tracker.pending == 4 and K(6) not in tracker
    fired = []
    for step in (7, 10, 20):
        clock.advance(step - (clock.now_ms() - 1_000))
        await settle()
        fired.append(sorted(k.entry_id for k in adapter.redelivered))
    assert fired == [[1], [1, 4], [1, 3, 4]]
    await tracker.close()


async def test_add_threadsafe_refusals_say_what_is_wrong():
    """Refused in the calling thread, each error naming the argument at fault."""
    tracker = NegativeAcksTracker(MemoryAdapter(), clock=ManualClock(), precision_bits=0,
                                  backoff=lambda n: -1)
    with pytest.raises(TypeError, match="^redelivery_count must be an int, not str$"):
        tracker.add_threadsafe(K(1), redelivery_count="2")
    with pytest.raises(ValueError, match="^delay_ms must be >= 0 ms, got -3$"):
        tracker.add_threadsafe(K(1), delay_ms=-3)
    with pytest.raises(ValueError, match="^backoff result must be >= 0 ms, got -1$"):
        tracker.add_threadsafe(K(1))
    await tracker.close()
    with pytest.raises(TrackerClosedError, match="^tracker is closed$"):
        tracker.add_threadsafe(K(1), delay_ms=1)
    with pytest.raises(TrackerClosedError, match="^tracker is closed$"):
        tracker.add(K(1), delay_ms=1)


def test_add_threadsafe_before_the_tracker_has_a_loop_is_refused():
    tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=0)  # made outside any loop
    with pytest.raises(RuntimeError, match="^the tracker is not bound to an event loop yet: create it inside "
                                           "the loop$"):
        tracker.add_threadsafe(K(1), delay_ms=1)
    with pytest.raises(RuntimeError, match=r"^NegativeAcksTracker\.add\(\) needs a running event loop \(the "
                                           r"tracker is bound to it on first use\); from another thread use "
                                           r"add_threadsafe\(\)$"):
        tracker.add(K(1), delay_ms=1)


def test_a_tracker_made_outside_a_loop_binds_to_the_loop_it_is_first_used_in():
    """By a first add(), or by entering ``async with``: then its clock is that loop's
    and add_threadsafe() works."""
    async def first_add(tracker):
        loop = asyncio.get_running_loop()
        due = tracker.add(K(1), delay_ms=5)
        assert abs(due - (loop.time() * 1000 + 5)) < 1_000 and tracker.next_fire_ms() == due
        tracker.add_threadsafe(K(2), delay_ms=5)
        await tracker.adapter.wait_for(2, timeout=5)
        await tracker.close()

    async def entered(tracker):
        async with tracker:
            tracker.add_threadsafe(K(3), delay_ms=1)
            await tracker.adapter.wait_for(1, timeout=5)

    for use in (first_add, entered):
        tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=0)
        asyncio.run(use(tracker))
        assert tracker.closed and tracker.stats()["redelivered"] == (2 if use is first_add else 1)


async def test_a_plain_add_from_another_thread_gets_the_whole_explanation():
    tracker = NegativeAcksTracker(MemoryAdapter(), clock=ManualClock(), precision_bits=0)
    raised = []
    thread = threading.Thread(target=lambda: raised.append(pytest.raises(RuntimeError, tracker.add, K(1))))
    thread.start()
    thread.join()
    assert str(raised[0].value) == ("NegativeAcksTracker.add() called outside its event loop's thread (or from "
                                    "another loop): from other threads use add_threadsafe(), which hands the add "
                                    "to the loop")
    await tracker.close()


async def test_add_threadsafe_failures_on_the_loop_are_each_counted_and_logged_with_their_key(caplog):
    tracker = NegativeAcksTracker(MemoryAdapter(), clock=ManualClock(), precision_bits=0)

    real = tracker._index
    tracker._index = BrokenIndex(real)  # fault injection: the index breaks before the loop runs the adds
    tracker.add_threadsafe(K(1), delay_ms=10)
    tracker.add_threadsafe(K(2), delay_ms=10)
    await settle()
    tracker._index = real
    tracker.add_threadsafe(K(3), delay_ms=10)
    tracker.add_threadsafe(K(4), delay_ms=10)
    await tracker.close()  # before the loop runs those two adds
    await settle()
    s = tracker.stats()
    assert (s["threadsafe_failures"], s["rejected_after_close"], tracker.pending) == (2, 2, 0)
    messages = [r.getMessage() for r in caplog.records]
    for k in (K(1), K(2)):
        assert f"nack of {k} from another thread failed on the loop; not scheduled" in messages
    for k in (K(3), K(4)):
        assert f"nack of {k} arrived after close; not scheduled" in messages


async def test_each_dead_letter_and_each_failure_is_counted_and_a_failed_one_is_renacked_with_its_count(caplog):
    events = []

    async def dlq(key):
        if key.entry_id >= 10:
            raise RuntimeError("publish failed")

    tracker = NegativeAcksTracker(MemoryAdapter(), clock=ManualClock(), precision_bits=0, delay_ms=100,
                                  max_redeliveries=2, on_dead_letter=dlq, on_event=events.append)
    for entry in (1, 2, 10, 11):
        tracker.add(K(entry), redelivery_count=5)
    await settle()
    s = tracker.stats()
    assert (s["dead_lettered"], s["dead_letter_failures"], tracker.pending) == (2, 2, 2)
    renacked = [(e.kind, e.entry_id, e.delay_ms, e.redelivery_count) for e in events if e.kind == "nack"]
    assert renacked == [("nack", 10, 100, 5), ("nack", 11, 100, 5)]
    messages = [r.getMessage() for r in caplog.records]
    for entry in (10, 11):
        assert f"on_dead_letter({K(entry)}) failed; the message stays pending" in messages
    await tracker.close()


async def test_a_sync_dead_letter_hook_that_raises_renacks_with_its_count_and_logs_the_key(caplog):
    events = []

    def dlq(key):
        raise RuntimeError("publish failed")

    tracker = NegativeAcksTracker(MemoryAdapter(), clock=ManualClock(), precision_bits=0, delay_ms=100,
                                  max_redeliveries=2, on_dead_letter=dlq, on_event=events.append)
    tracker.add(K(1), redelivery_count=2)
    tracker.add(K(2), redelivery_count=3)
    assert tracker.stats()["dead_letter_failures"] == 2 and tracker.pending == 2
    assert [(e.kind, e.entry_id, e.redelivery_count) for e in events] == [
        ("dead_letter", 1, 2), ("nack", 1, 2), ("dead_letter", 2, 3), ("nack", 2, 3)]
    assert f"on_dead_letter({K(1)}) failed; the message stays pending" in [r.getMessage() for r in caplog.records]
    await tracker.close()


async def test_fire_listeners_get_each_cell_until_removed_and_a_failing_one_is_logged_and_kept(caplog):
    from nacktracker.tracker import FiredCell

    tracker, adapter, clock = make(precision_bits=0, lead_ms=0)
    cells, bad_calls = [], []

    def bad(cell):
        bad_calls.append(cell.bucket_ms)
        raise RuntimeError("metrics broke")

    remove = tracker.add_fire_listener(cells.append)
    tracker.add_fire_listener(bad)
    start = clock.now_ms()
    tracker.add(K(1), delay_ms=10)
    tracker.add(K(2, ledger=8), delay_ms=10)
    tracker.add(K(3), delay_ms=20)
    clock.advance(15)  # the manual clock runs the 10 ms timer at its time
    await settle()
    assert cells == [FiredCell(start + 10, 0, [K(1)]), FiredCell(start + 10, 0, [K(2, ledger=8)])]
    assert bad_calls == [start + 10, start + 10]
    assert [r.getMessage() for r in caplog.records] == [f"fire listener {bad!r} failed"] * 2
    remove()
    remove()  # removing twice is harmless
    clock.advance(5)
    await settle()
    assert len(cells) == 2 and bad_calls == [start + 10, start + 10, start + 20]  # the failing one is kept
    assert sorted(k.entry_id for k in adapter.redelivered) == [1, 2, 3]
    with pytest.raises(TypeError, match="^listener must be callable, not int$"):
        tracker.add_fire_listener(3)
    await tracker.close()


class _LeadAdapter(MemoryAdapter):
    def __init__(self, lead_ms=0, coalesce_ms=0):
        super().__init__()
        self.lead_ms, self.coalesce_ms = lead_ms, coalesce_ms


@pytest.mark.parametrize("adapter,kwargs,error", [
    (None, {"delay_ms": -5}, (ValueError, "delay_ms must be >= 0 ms, got -5")),
    (None, {"precision_bits": 31}, (ValueError, "precision_bits must be <= 30, got 31")),
    (None, {"rounding": "nearest"}, (ValueError, "rounding must be 'floor' or 'ceil', got 'nearest'")),
    (None, {"backoff": 5}, (TypeError, "backoff must be callable, not int")),
    (None, {"on_dead_letter": 5}, (TypeError, "on_dead_letter must be callable, not int")),
    (None, {"on_event": "x"}, (TypeError, "on_event must be callable, not str")),
    (None, {"max_redeliveries": 0, "on_dead_letter": print}, (ValueError, "max_redeliveries must be >= 1")),
    (None, {"max_redeliveries": "1", "on_dead_letter": print}, (TypeError, "max_redeliveries must be an int, not str")),
    (None, {"max_redeliveries": 2},
     (ValueError, "max_redeliveries needs on_dead_letter: the tracker never drops a message silently")),
    (None, {"clock": object()}, (TypeError, "clock must provide now_ms() and call_at(when_ms, callback)")),
    (None, {"clock": type("NoTimer", (), {"now_ms": lambda self: 0})()},
     (TypeError, "clock must provide now_ms() and call_at(when_ms, callback)")),
    (None, {"retry_min_ms": -1}, (ValueError, "retry_min_ms must be >= 0 ms, got -1")),
    (None, {"retry_max_ms": -1}, (ValueError, "retry_max_ms must be >= 0 ms, got -1")),
    (object(), {}, (TypeError, "adapter must have an async redeliver(keys) method, not object")),
    (_LeadAdapter(lead_ms=-1), {}, (ValueError, "adapter.lead_ms must be >= 0, got -1")),
    (_LeadAdapter(coalesce_ms=-1), {}, (ValueError, "adapter.coalesce_ms must be >= 0, got -1")),
])
def test_construction_refusals_name_the_argument_at_fault(adapter, kwargs, error):
    kind, message = error
    with pytest.raises(kind) as info:
        NegativeAcksTracker(adapter if adapter is not None else MemoryAdapter(), **kwargs)
    assert str(info.value) == message


def test_construction_keeps_its_arguments_and_repairs_the_retry_bounds():
    """retry_min_ms 0 waits 1 ms (a retry never spins); a retry_max_ms below the minimum is the minimum."""
    hook = print
    tracker = NegativeAcksTracker(MemoryAdapter(), clock=ManualClock(), delay_ms=250, precision_bits=3,
                                  rounding="ceil", max_redeliveries=4, on_dead_letter=hook, consumer_name="c1")
    assert (tracker.delay_ms, tracker.precision_bits, tracker.rounding, tracker.max_redeliveries,
            tracker.consumer_name) == (250, 3, "ceil", 4, "c1")
    assert repr(tracker) == "NegativeAcksTracker(pending=0, precision_bits=3, rounding='ceil', closed=False)"
    for lo, hi, want in ((0, 0, (1, 1)), (500, 100, (500, 500)), (20, 300, (20, 300))):
        t = NegativeAcksTracker(MemoryAdapter(), clock=ManualClock(), retry_min_ms=lo, retry_max_ms=hi)
        assert (t._retry_min, t._retry_max) == want


async def test_a_lead_ms_that_turns_invalid_is_logged_once_and_the_last_valid_one_kept(caplog):
    adapter = _LeadAdapter(lead_ms=5)
    tracker, _, clock = make(adapter=adapter, precision_bits=0)
    for bad in (-1, 3_600_001, 2.5, True):
        adapter.lead_ms = bad
        tracker.add(K(1), delay_ms=100)
        tracker.add(K(2), delay_ms=100)
    adapter.lead_ms = 3_600_000  # the largest valid lead: taken
    assert tracker._lead == 3_600_000
    adapter.lead_ms = 7
    start = clock.now_ms()
    tracker.add(K(3), delay_ms=50)
    assert tracker.next_fire_ms() == start + 50 - 7
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [f"adapter.lead_ms {bad!r} is not a valid delay; keeping 5" for bad in (-1, 3_600_001, 2.5, True)]
    await tracker.close()


async def test_stats_and_events_of_a_worked_case(monkeypatch, caplog):
    """Every counter and gauge, and every event field, through nacks in two
    origins, a dead letter, a failed adapter call and its retry."""
    import nacktracker.tracker as tracker_module
    from nacktracker.events import NackEvent

    monkeypatch.setattr(tracker_module.time, "time_ns", lambda: 1_700_000_000_123_456_789)
    ts = 1_700_000_000_123
    events, dead = [], []
    clock = ManualClock(start_ms=1_000)
    adapter = MemoryAdapter(clock=clock.now_ms)
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0, retry_min_ms=10, max_redeliveries=3,
                                  on_dead_letter=dead.append, on_event=events.append, consumer_name="c1")
    one, two, three, four = K(1, topic="t", partition=2), K(2), K(3), K(4)
    assert tracker.add(one, delay_ms=10) == 1_010 and tracker.add(two, delay_ms=10) == 1_010
    assert tracker.add(three, delay_ms=30, redelivery_count=1) == 1_030
    assert tracker.add(four, redelivery_count=3) is None and dead == [four]
    adapter.fail_next(1)
    clock.advance(10)
    await settle()
    s = tracker.stats()
    assert (s["pending"], s["unsent"], s["nacks"], s["redelivered"], s["failures"], s["fires"]) == (1, 2, 3, 0, 1, 1)
    assert s["buckets"] >= 1 and s["bitmaps"] >= 1 and s["nbytes"] == tracker.nbytes() > 0
    clock.advance(10)  # the retry
    await settle()
    clock.advance(10)
    await settle()
    assert adapter.redelivered == [one, two, three]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "redeliver of 2 messages failed (AdapterError('injected failure')); retrying in 10 ms"]
    s = tracker.stats()
    assert s == {"pending": 0, "unsent": 0, "buckets": 0, "bitmaps": 0, "nbytes": tracker.nbytes(), "nacks": 3,
                 "redelivered": 3, "dead_lettered": 1, "dead_letter_failures": 0, "failures": 1, "fires": 2,
                 "rejected_after_close": 0, "threadsafe_failures": 0,
                 "timer_lag_ms": {"count": 3, "p50": 0, "p99": 0, "max": 0}}
    assert events == [
        NackEvent(ts, "nack", 7, 1, 10, 0, 2, -1, "t", "c1"),
        NackEvent(ts, "nack", 7, 2, 10, 0, -1, -1, None, "c1"),
        NackEvent(ts, "nack", 7, 3, 30, 1, -1, -1, None, "c1"),
        NackEvent(ts, "dead_letter", 7, 4, 60_000, 3, -1, -1, None, "c1"),
        NackEvent(ts, "redeliver", 7, 1, 0, 0, 2, -1, "t", "c1"),
        NackEvent(ts, "redeliver", 7, 2, 0, 0, -1, -1, None, "c1"),
        NackEvent(ts, "redeliver", 7, 3, 0, 0, -1, -1, None, "c1"),
    ]
    await tracker.close()


async def test_asking_whether_unknown_messages_are_pending_allocates_nothing():
    tracker, _, _ = make(precision_bits=0)
    tracker.add(K(1), delay_ms=10)
    before = tracker.nbytes()
    assert not any(K(1, ledger=100 + i) in tracker for i in range(200))
    assert K(1) in tracker and tracker.nbytes() == before
    await tracker.close()


async def test_each_dead_letter_is_counted_and_finished_async_ones_are_not_kept():
    tracker = NegativeAcksTracker(MemoryAdapter(), clock=ManualClock(), precision_bits=0, max_redeliveries=1,
                                  on_dead_letter=lambda key: None)
    for entry in (1, 2, 3):
        tracker.add(K(entry), redelivery_count=1)
    assert tracker.stats()["dead_lettered"] == 3

    async def dlq(key):
        await asyncio.sleep(0)

    tracker2 = NegativeAcksTracker(MemoryAdapter(), clock=ManualClock(), precision_bits=0, max_redeliveries=1,
                                   on_dead_letter=dlq)
    for entry in (1, 2, 3):
        tracker2.add(K(entry), redelivery_count=1)
    await settle()
    assert tracker2.stats()["dead_lettered"] == 3 and not tracker2._side_tasks  # nothing held per finished one
    await tracker.close()
    await tracker2.close()


async def test_by_default_a_nack_comes_back_after_60_s_in_256_ms_buckets():
    tracker, adapter, clock = make(ManualClock(start_ms=1_000_100))  # delay_ms=60_000, precision_bits=8, floor
    tracker.add(K(1))
    assert tracker.next_fire_ms() == 1_060_096  # 4141 x 256: the bucket of 1_060_100, 4 ms early


# -- details a caller relies on, each pinned exactly -------------------------------------

async def test_add_refusals_name_the_argument_at_fault():
    """add() says which of its inputs is wrong: the count, the explicit delay, the backoff's result, or a
    delay running past the due-time range; nothing is scheduled."""
    from nacktracker._checks import MAX_DUE

    tracker, _, clock = make(precision_bits=0, backoff=lambda n: -1)
    with pytest.raises(TypeError) as info:
        tracker.add(K(1), redelivery_count="2")
    assert str(info.value) == "redelivery_count must be an int, not str"
    with pytest.raises(ValueError) as info:
        tracker.add(K(1), delay_ms=-3)
    assert str(info.value) == "delay_ms must be >= 0 ms, got -3"
    with pytest.raises(ValueError) as info:
        tracker.add(K(1))
    assert str(info.value) == "backoff result must be >= 0 ms, got -1"
    too_far = MAX_DUE - int(clock.now_ms()) + 1  # due one ms past the range
    with pytest.raises(ValueError) as info:
        tracker.add(K(1), delay_ms=too_far)
    assert str(info.value) == f"delay_ms {too_far} is too large"
    assert tracker.pending == 0 and tracker.stats()["nacks"] == 0
    assert tracker.add(K(1), delay_ms=too_far - 1) == MAX_DUE  # the last due time in range is taken
    await tracker.close()


async def test_by_default_a_failed_call_is_retried_after_100_ms_doubling_up_to_10_s():
    """retry_min_ms=100, retry_max_ms=10_000 by default: the waits between failed calls are
    100, 200, ..., 6_400, then 10_000 (12_800 capped), and the retried call carries the batch."""
    tracker, adapter, clock = make(precision_bits=0)  # retry bounds left at their defaults
    t0 = clock.now_ms()
    tracker.add(K(1), delay_ms=10)
    adapter.fail_next(9)
    clock.advance(10)
    await settle()
    waits = []
    while adapter.failed_calls < 9:
        assert len(clock.timers()) == 1  # the retry timer alone: nothing else is pending
        waits.append(clock.timers()[0] - clock.now_ms())
        clock.advance(waits[-1])
        await settle()
    waits.append(clock.timers()[0] - clock.now_ms())
    clock.advance(waits[-1])
    await settle()
    assert waits == [100, 200, 400, 800, 1_600, 3_200, 6_400, 10_000, 10_000]
    assert adapter.calls[0].at_ms == t0 + 10 + sum(waits) and adapter.redelivered == [K(1)]
    assert tracker.stats()["failures"] == 9 and clock.timers() == []
    await tracker.close()


class _BareAdapter:
    """The least an adapter may be: an async ``redeliver`` and no ``lead_ms``/``coalesce_ms``."""

    def __init__(self, clock):
        self.clock, self.calls = clock, []

    async def redeliver(self, keys):
        self.calls.append((self.clock.now_ms(), list(keys)))


async def test_an_adapter_that_declares_no_lead_or_coalesce_window_is_taken_as_zero():
    clock = ManualClock(start_ms=1_000_000)
    adapter = _BareAdapter(clock)
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0)
    assert tracker.lead_ms == 0
    tracker.add(K(1), delay_ms=100)
    tracker.add(K(2), delay_ms=101)
    assert tracker.next_fire_ms() == 1_000_100
    clock.advance(99)
    await settle()
    assert adapter.calls == []
    clock.advance(1)
    await settle()
    assert adapter.calls == [(1_000_100, [K(1)])]  # no coalesce window: the next ms waits for its own fire
    clock.advance(1)
    await settle()
    assert adapter.calls[1:] == [(1_000_101, [K(2)])]
    await tracker.close()


async def test_with_a_lead_the_timer_re_arms_the_lead_ahead_and_lag_is_against_that_time():
    """Every fire, the first and the re-armed ones, is ``lead_ms`` before its bucket; the timer lag
    (stats and FiredCell) is measured against that armed time: 0 on time, 70 for a loop 70 ms late."""
    tracker, adapter, clock = make(precision_bits=0, lead_ms=30)
    t0 = clock.now_ms()
    cells = []
    tracker.add_fire_listener(cells.append)
    for i, delay in enumerate((100, 500, 900)):
        tracker.add(K(i), delay_ms=delay)
    assert tracker.next_fire_ms() == t0 + 70
    clock.advance(70)
    await settle()
    assert tracker.next_fire_ms() == t0 + 470  # re-armed after the fire: the next bucket, the lead ahead
    clock.advance(400)
    await settle()
    assert [c.at_ms for c in adapter.calls] == [t0 + 70, t0 + 470]
    clock.stall(470)  # the loop was blocked past the third fire time (t0 + 870) until t0 + 940
    await settle()
    assert [c.at_ms for c in adapter.calls] == [t0 + 70, t0 + 470, t0 + 940]
    assert [(c.bucket_ms, c.timer_lag_ms, c.keys) for c in cells] == [
        (t0 + 100, 0, [K(0)]), (t0 + 500, 0, [K(1)]), (t0 + 900, 70, [K(2)])]
    assert tracker.stats()["timer_lag_ms"] == {"count": 3, "p50": 0, "p99": 70, "max": 70}
    await tracker.close()


async def test_an_entry_already_taken_by_this_fire_does_not_end_the_fire():
    """A late fire covering three cells: the entry's second bucket holds nothing new (it is on its way
    already), and the cell after it is still handed over in the same call."""
    tracker, adapter, clock = make(precision_bits=0)
    tracker.add(K(1), delay_ms=10)
    tracker.add(K(1), delay_ms=20)  # the same entry pending in a second bucket
    tracker.add(K(2), delay_ms=30)
    assert tracker.pending == 3
    clock.stall(50)
    await settle()
    assert [c.keys for c in adapter.calls] == [(K(1), K(2))]
    assert tracker.pending == 0 and tracker.stats()["redelivered"] == 2
    await tracker.close()


class _LateCancelClock(ManualClock):
    """A clock whose ``cancel()`` comes too late to stop a timer (as a clock run by another thread may):
    every timer armed fires, the cancelled ones too."""

    class _Handle:
        def cancel(self):
            pass

    def call_at(self, when_ms, callback):
        super().call_at(when_ms, callback)
        return self._Handle()


async def test_a_timer_that_fires_after_being_cancelled_is_harmless():
    """Stale fires (one re-armed over, one left over once nothing is armed) neither raise nor lose,
    repeat or advance anything: each entry comes back once, at its own time."""
    clock = _LateCancelClock(start_ms=1_000_000)
    adapter = MemoryAdapter(clock=clock.now_ms)
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0)
    t0 = clock.now_ms()
    tracker.add(K(1), delay_ms=1_000)  # armed at t0 + 1000 ...
    tracker.add(K(2), delay_ms=100)  # ... re-armed at t0 + 100; the first timer stays
    clock.advance(100)
    await settle()
    clock.advance(900)  # the stale timer and the re-armed one both fire at t0 + 1000
    await settle()
    assert [(c.at_ms, c.keys) for c in adapter.calls] == [(t0 + 100, (K(2),)), (t0 + 1_000, (K(1),))]
    assert tracker.pending == 0 and tracker.next_fire_ms() is None
    tracker.add(K(3), delay_ms=50)
    clock.advance(50)
    await settle()
    assert [(c.at_ms, c.keys) for c in adapter.calls][2:] == [(t0 + 1_050, (K(3),))]
    await tracker.close()


async def test_a_topic_less_id_s_ledger_learns_its_topic_from_a_later_key():
    """An id-only nack, then a nack of the same ledger with its topic: the ledger's entries are that
    topic's from then on (asked for by topic, acked by topic, and redelivered with it)."""
    tracker, adapter, clock = make(precision_bits=0)
    tracker.add(K(1), delay_ms=10)  # no topic yet
    tracker.add(K(2, topic="t"), delay_ms=10)
    tracker.add(K(3, topic="t"), delay_ms=10)
    assert K(1, topic="t") in tracker and K(2, topic="t") in tracker and K(2) in tracker
    assert tracker.discard(K(3, topic="t")) and K(3, topic="t") not in tracker
    clock.advance(10)
    await settle()
    assert adapter.redelivered == [K(1, topic="t"), K(2, topic="t")]
    assert tracker.pending == 0
    await tracker.close()


def test_an_unbound_tracker_exports_an_empty_pending_set_at_time_0():
    from nacktracker.tracker import PendingState

    tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=0)  # made outside any loop: no clock yet
    assert tracker.export_pending() == PendingState(0, {}, [])


async def test_nbytes_is_the_index_s_bytes_plus_the_routing_table_s_worked_from_its_definition():
    """nbytes(): the index's nbytes() plus the routing table as built: the dict by (partition, ledger),
    one {topic: slot} dict per entry of it, and the dict of origins by slot (sys.getsizeof each). Worked
    on a twin index fed the same (slot, entry, due) and dicts built the same way."""
    import sys

    from nacktracker.index import TimeBucketIndex

    tracker, adapter, clock = make(precision_bits=0)
    assert tracker.nbytes() == TimeBucketIndex(0).nbytes() + 2 * sys.getsizeof({})
    twin = TimeBucketIndex(0)
    by_ledger: dict = {}
    origins: dict = {}
    keys = [K(1, ledger=5, topic="a"), K(2, ledger=5, topic="b"), K(3, ledger=6, topic="a"),
            K(4, ledger=7, partition=2), K(5, ledger=5, topic="a")]
    for key in keys:
        due = tracker.add(key, delay_ms=10 * key.entry_id)
        origin = (key.topic, key.partition, key.ledger_id)
        slot = next((s for s, o in origins.items() if o == origin), len(origins))  # numbered as first seen
        by_ledger.setdefault((key.partition, key.ledger_id), {})[key.topic] = slot
        origins[slot] = origin
        twin.add(slot, key.entry_id, due)
    assert len(by_ledger) == 3 and len(origins) == 4
    routing = sys.getsizeof(by_ledger) + sys.getsizeof(origins) + sum(map(sys.getsizeof, by_ledger.values()))
    assert tracker.nbytes() == twin.nbytes() + routing
    assert tracker.stats()["nbytes"] == tracker.nbytes()
    await tracker.close()


async def test_a_lead_that_grows_pulls_the_timer_at_an_add_into_a_later_bucket():
    """The timer test add runs (a bucket below the armed one's, or a lead changed) is exact: an add into a
    bucket after the armed one fires earlier when the lead grew meanwhile, and not when it did not."""
    adapter = _LeadAdapter(lead_ms=5)
    tracker, _, clock = make(adapter=adapter, precision_bits=0)
    start = clock.now_ms()
    tracker.add(K(1), delay_ms=100)
    assert tracker.next_fire_ms() == start + 95
    tracker.add(K(2), delay_ms=150)  # a later bucket, the same lead: the timer stays
    assert tracker.next_fire_ms() == start + 95
    adapter.lead_ms = 80
    assert tracker.lead_ms == 80  # read elsewhere first: the add still sees the timer's lead changed
    tracker.add(K(3), delay_ms=110)  # later than the armed bucket, earlier than it with the longer lead
    assert tracker.next_fire_ms() == start + 110 - 80
    tracker.add(K(4), delay_ms=120)
    assert tracker.next_fire_ms() == start + 30
    tracker.add(K(5), delay_ms=105)
    assert tracker.next_fire_ms() == start + 105 - 80
    adapter.lead_ms = 0  # a shorter lead never pulls the timer later
    tracker.add(K(6), delay_ms=200)
    assert tracker.next_fire_ms() == start + 25
    await tracker.close()


@pytest.mark.parametrize("key", [K(1, partition=(1 << 63) - 1), K(1, batch_index=(1 << 63) - 1),
                                 K((1 << 63) - 1, ledger=(1 << 63) - 1, partition=-1, batch_index=-1, topic="t")])
async def test_keys_at_the_edge_of_add_s_inline_test_are_taken_as_by_the_general_path(key):
    tracker, adapter, clock = make(precision_bits=0)
    assert tracker.add(key, delay_ms=10) == clock.now_ms() + 10
    assert tracker.add(key, delay_ms=10, redelivery_count=0) == clock.now_ms() + 10  # the general path
    assert key in tracker and tracker.pending == 1
    clock.advance(10)
    await settle()
    assert adapter.redelivered == [key.entry]  # an entry is asked for once
    await tracker.close()


@pytest.mark.parametrize("key,error", [
    (MessageKey(-1, 2), ValueError), (MessageKey(1, 1 << 63), ValueError), (MessageKey(1, 2, partition=-2), ValueError),
    (MessageKey(1, 2, batch_index=1 << 63), ValueError), (MessageKey(1.0, 2), TypeError),
    (MessageKey(1, 2, partition=True), TypeError), (MessageKey(1, 2, topic=b"t"), TypeError)])
async def test_keys_add_s_inline_test_refuses_raise_as_before(key, error):
    tracker, _, _ = make()
    with pytest.raises(error):
        tracker.add(key)
    assert tracker.pending == 0 and tracker.next_fire_ms() is None
    await tracker.close()


async def test_a_limit_set_below_one_after_construction_dead_letters_a_first_nack_as_before():
    dead = []
    tracker, _, _ = make(max_redeliveries=3, on_dead_letter=dead.append)
    assert tracker.add(K(1)) is not None and tracker.pending == 1
    tracker.max_redeliveries = 0
    assert tracker.add(K(2)) is None and dead == [K(2)] and tracker.pending == 1
    await tracker.close()
