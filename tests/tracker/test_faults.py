"""Faults that need no broker: adapters that raise, hang or crawl; an event loop
that stalls; a tracker closed with redeliveries still pending."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from nacktracker import ManualClock, MessageKey, NegativeAcksTracker
from nacktracker.adapters import MemoryAdapter


async def settle(rounds: int = 6) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def K(entry, ledger=7, **kw):
    return MessageKey(ledger, entry, **kw)


class ScriptedAdapter:
    """Raises the scripted exceptions, one per call (``None``: that call succeeds), then succeeds."""

    lead_ms = 0

    def __init__(self, *failures: BaseException | None) -> None:
        self.failures = list(failures)
        self.delivered: list[MessageKey] = []
        self.calls = 0

    async def redeliver(self, keys) -> None:
        self.calls += 1
        failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            raise failure
        self.delivered.extend(keys)


# -- adapters that raise -----------------------------------------------------------------

async def test_every_kind_of_adapter_error_is_retried_and_nothing_is_lost(caplog):
    adapter = ScriptedAdapter(RuntimeError("broker"), OSError(104, "reset"), TimeoutError(), ValueError("bad id"),
                              ConnectionError("gone"))
    clock = ManualClock()
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0, retry_min_ms=10, retry_max_ms=40)
    for i in range(5):
        tracker.add(K(i), delay_ms=5 + i)
    for _ in range(300):
        clock.advance(1)
        await settle(3)
    assert sorted(adapter.delivered) == [K(i) for i in range(5)]  # each once
    s = tracker.stats()
    assert s["failures"] == 5 and s["redelivered"] == 5 and s["unsent"] == 0 and s["pending"] == 0
    assert caplog.text.count("retrying") == 5
    await tracker.close()


async def call_times(adapter: "ScriptedAdapter", clock: ManualClock, steps: int) -> list[float]:
    """Advance ``clock`` 1 ms at a time for ``steps`` ms; the times at which the adapter was called."""
    times = []
    for _ in range(steps):
        before = adapter.calls
        clock.advance(1)
        await settle(3)
        if adapter.calls != before:
            times.append(clock.now_ms())
    return times


async def test_retry_backoff_is_capped():
    adapter = ScriptedAdapter(*[RuntimeError("down")] * 8)
    clock = ManualClock()
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0, retry_min_ms=10, retry_max_ms=50)
    tracker.add(K(1), delay_ms=0)
    times = await call_times(adapter, clock, 400)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps == [10, 20, 40, 50, 50, 50, 50, 50]  # doubling, then capped at retry_max_ms
    assert adapter.delivered == [K(1)]
    await tracker.close()


async def test_an_adapter_that_raises_before_returning_a_coroutine():
    class SyncRaiser:
        lead_ms = 0
        calls = 0
        delivered: list = []

        def redeliver(self, keys):  # not async: raises at call time, or returns a coroutine
            SyncRaiser.calls += 1
            if SyncRaiser.calls == 1:
                raise RuntimeError("raised synchronously")

            async def ok():
                self.delivered.extend(keys)
            return ok()

    adapter = SyncRaiser()
    clock = ManualClock()
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0, retry_min_ms=10)
    tracker.add(K(1), delay_ms=1)
    clock.advance(1)
    await settle()
    clock.advance(10)
    await settle()
    assert adapter.delivered == [K(1)] and tracker.stats()["failures"] == 1
    await tracker.close()


async def test_an_adapter_raising_cancelled_error_is_retried_like_any_failure(caplog):
    adapter = ScriptedAdapter(asyncio.CancelledError())  # e.g. a client future cancelled under the adapter
    clock = ManualClock()
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0, retry_min_ms=10, retry_max_ms=100)
    tracker.add(K(1), delay_ms=1)
    for _ in range(1000):
        clock.advance(1)
        await settle(3)
    assert adapter.delivered == [K(1)]
    s = tracker.stats()
    assert s["failures"] == 1 and s["redelivered"] == 1 and s["unsent"] == 0  # counted like any failure
    # the log names the cause (a bare CancelledError() would say nothing)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("nacktracker")] == [
        "redeliver of 1 messages failed (CancelledError('adapter raised CancelledError')); retrying in 10 ms"]
    await tracker.close()


async def test_a_delivery_resets_the_retry_backoff():
    """The backoff doubles over one streak of failures; a delivery ends the streak, so the next
    failure waits ``retry_min_ms`` again."""
    down = RuntimeError("down")
    adapter = ScriptedAdapter(down, down, None, down, None)
    clock = ManualClock()
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0, retry_min_ms=10, retry_max_ms=1000)
    tracker.add(K(1), delay_ms=1)
    tracker.add(K(2), delay_ms=100)
    times = await call_times(adapter, clock, 200)
    assert times == [1, 11, 31, 100, 110]  # K(1): 10 then 20 ms; K(2): 10 ms, not 40
    assert adapter.delivered == [K(1), K(2)]
    assert tracker.stats()["failures"] == 3
    await tracker.close()


# -- slow and hanging adapters ------------------------------------------------------------

async def test_a_slow_adapter_on_the_real_loop_never_overlaps_and_loses_nothing():
    adapter = MemoryAdapter(delay_s=0.15)
    tracker = NegativeAcksTracker(adapter, precision_bits=0)
    loop = asyncio.get_running_loop()
    worst_add = 0.0
    for i in range(60):
        t0 = time.perf_counter()
        tracker.add(K(i), delay_ms=5 + 5 * i)
        worst_add = max(worst_add, time.perf_counter() - t0)
        await asyncio.sleep(0.002)
    assert worst_add < 0.1  # add() never waits for the adapter (a call takes 0.15 s); not a speed bound
    await adapter.wait_for(60, timeout=10)
    assert adapter.max_in_flight == 1  # one call at a time; fires during a call are merged
    assert len(adapter.calls) < 60
    assert sorted(k.entry_id for k in adapter.redelivered) == list(range(60))
    assert tracker.stats()["redelivered"] == 60
    started = loop.time()
    tracker.add(K(100), delay_ms=0)
    await asyncio.sleep(0.05)  # its call is in flight now
    await tracker.close()  # waits for the call in flight
    assert loop.time() - started >= 0.14
    assert tracker.stats()["redelivered"] == 61 and adapter.in_flight == 0


async def test_closing_over_a_hung_adapter_with_a_timeout_keeps_the_batch_unsent():
    """close() waits for the adapter call in flight; bound it with wait_for and the
    cancelled call's batch goes back to the outbox: counted, and in the snapshot."""
    release = asyncio.Event()

    class Hung:
        lead_ms = 0

        async def redeliver(self, keys):
            await release.wait()

    clock = ManualClock()
    tracker = NegativeAcksTracker(Hung(), clock=clock, precision_bits=0)
    tracker.add(K(1), delay_ms=1)
    tracker.add(K(2), delay_ms=1000)
    clock.advance(1)
    await settle()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(tracker.close(), 0.1)
    assert tracker.closed
    s = tracker.stats()
    assert s["unsent"] == 1 and s["pending"] == 1 and s["redelivered"] == 0
    clock2 = ManualClock()
    restored = NegativeAcksTracker.restore(tracker.snapshot(), MemoryAdapter(clock=clock2.now_ms), clock=clock2,
                                           elapsed="none")
    assert restored.pending == 2 and restored.next_fire_ms() == 0  # the unsent one is due now


class HungAdapter:
    """An adapter whose every call hangs until it is cancelled."""
    lead_ms = 0

    async def redeliver(self, keys):
        await asyncio.Event().wait()


async def tracker_in_a_hung_call() -> NegativeAcksTracker:
    """A tracker whose one key is in an adapter call that never returns."""
    clock = ManualClock()
    tracker = NegativeAcksTracker(HungAdapter(), clock=clock, precision_bits=0)
    tracker.add(K(1), delay_ms=1)
    clock.advance(1)
    await settle()
    return tracker


async def test_close_timeout_bounds_the_wait_for_a_hung_adapter():
    tracker = await tracker_in_a_hung_call()
    # bounded here too: a close() that ignored its timeout would otherwise hang the test
    await asyncio.wait_for(tracker.close(timeout=0.05), 5)
    assert tracker.closed and tracker.stats()["unsent"] == 1


@pytest.mark.parametrize("how", ["timeout", "caller_gives_up"])
async def test_close_cancelling_a_hung_call_puts_its_batch_back_and_is_not_an_adapter_failure(how, caplog):
    """Past close()'s timeout (or when its caller gives up) the call in flight is cancelled: by the
    time close() is done its batch is back in ``unsent`` (and in a snapshot), and that cancellation,
    the tracker's own, is neither counted nor logged as a failure of the adapter."""
    tracker = await tracker_in_a_hung_call()
    if how == "timeout":
        async with asyncio.timeout(5):  # bounded: a close() that ignored its timeout would hang here
            await tracker.close(timeout=0.05)  # returns normally: the call was cancelled, not close()
    else:
        closing = asyncio.ensure_future(tracker.close())
        await settle()
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
    s = tracker.stats()  # read at once, before the loop runs anything else
    assert tracker.closed and s["unsent"] == 1 and s["redelivered"] == 0
    assert s["failures"] == 0
    assert [r.getMessage() for r in caplog.records if r.name.startswith("nacktracker")] == []
    restored = NegativeAcksTracker.restore(tracker.snapshot(), MemoryAdapter(), clock=ManualClock(),
                                           elapsed="none")
    assert K(1) in restored and restored.pending == 1


async def test_a_dead_letter_cancelled_under_its_hook_stays_pending(caplog):
    """A hook's awaitable that ends cancelled (a client future cancelled under it) is a failed dead
    letter like any other: counted, logged, and the message stays pending."""
    published: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    clock = ManualClock()
    adapter = MemoryAdapter(clock=clock.now_ms)
    events = []
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0, delay_ms=100, max_redeliveries=1,
                                  on_dead_letter=lambda key: published, on_event=events.append)
    tracker.add(K(3), redelivery_count=2, delay_ms=250)
    await settle()
    published.cancel()
    await settle()
    s = tracker.stats()
    assert (s["dead_lettered"], s["dead_letter_failures"], tracker.pending) == (0, 1, 1) and K(3) in tracker
    assert [(e.kind, e.entry_id, e.delay_ms, e.redelivery_count) for e in events] == [
        ("dead_letter", 3, 250, 2), ("nack", 3, 250, 2)]  # renacked with its delay and count
    assert f"on_dead_letter({K(3)}) was cancelled; the message stays pending" in [
        r.getMessage() for r in caplog.records]
    clock.advance(250)
    await settle()
    assert adapter.redelivered == [K(3)]  # redelivered, to be dead-lettered again at its next nack
    await tracker.close()


async def test_close_completes_when_a_dead_letter_it_waits_for_is_cancelled(caplog):
    """close() waits for the dead letters in flight; one of them cancelled meanwhile (an application
    cancelling its tasks at shutdown) does not make close() fail, and its message stays pending."""
    clock = ManualClock()
    tracker = NegativeAcksTracker(MemoryAdapter(clock=clock.now_ms), clock=clock, precision_bits=0, delay_ms=100,
                                  max_redeliveries=1, on_dead_letter=lambda key: asyncio.Event().wait())
    tracker.add(K(4), redelivery_count=1)
    await settle()
    closing = asyncio.ensure_future(tracker.close())
    await settle()
    assert not closing.done()  # waiting for the dead letter
    others = asyncio.all_tasks() - {asyncio.current_task(), closing}
    assert len(others) == 1  # the dead letter in flight
    for task in others:
        task.cancel()
    await asyncio.wait_for(closing, 5)  # returns normally
    assert tracker.closed and tracker.pending == 1 and K(4) in tracker
    s = tracker.stats()
    assert (s["dead_lettered"], s["dead_letter_failures"]) == (0, 1)
    assert f"on_dead_letter({K(4)}) was cancelled; the message stays pending" in [
        r.getMessage() for r in caplog.records]


async def test_a_flush_reports_how_early_it_hands_each_cell_over():
    """close(flush=True) hands every pending cell over now: each cell's timer lag, ``now - (bucket -
    lead)``, is negative by how early that is, for the fire listeners and in stats()."""
    clock = ManualClock(start_ms=1000)
    adapter = MemoryAdapter(clock=clock.now_ms, lead_ms=20)
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0)
    cells = []
    tracker.add_fire_listener(cells.append)
    tracker.add(K(1), delay_ms=5000)
    tracker.add(K(2), delay_ms=300)
    tracker.add(K(3), delay_ms=300)
    clock.advance(100)
    await settle()
    await tracker.close(flush=True)
    assert cells == [(1300, 1100 - 1280, [K(2), K(3)]), (6000, 1100 - 5980, [K(1)])]
    assert tracker.stats()["timer_lag_ms"] == {"count": 3, "p50": -180, "p99": -180, "max": -180}
    assert sorted(adapter.redelivered) == [K(1), K(2), K(3)]


# -- a stalled event loop -------------------------------------------------------------------

async def test_a_one_second_loop_stall_delivers_everything_late_and_reports_it():
    adapter = MemoryAdapter()
    tracker = NegativeAcksTracker(adapter, precision_bits=0)
    loop = asyncio.get_running_loop()
    due = {}
    for i in range(200):
        due[K(i)] = tracker.add(K(i), delay_ms=100 + 5 * i)  # due from +100 ms to +1095 ms
    stall = []

    def block() -> None:  # a callback that blocks the loop for a second
        stall.append(loop.time() * 1000)
        time.sleep(1.0)
        stall.append(loop.time() * 1000)

    loop.call_later(0.05, block)
    await adapter.wait_for(200, timeout=10)
    arrivals = {k: c.at_ms for c in adapter.calls for k in c.keys}
    assert sorted(arrivals) == sorted(due)  # none lost
    assert len(adapter.redelivered) == 200  # none twice
    stall_start, stall_end = stall  # as it ran: on a loaded machine the callback can start late
    late = [k for k in due if stall_start <= due[k] < stall_end]  # came due while the loop was blocked
    assert len(late) > 100
    assert all(arrivals[k] >= stall_end for k in late)  # they waited for the loop...
    assert all(arrivals[k] >= due[k] - 1 for k in due)  # ...and none came early
    lateness = tracker.stats()["timer_lag_ms"]
    assert lateness["count"] == 200 and lateness["max"] >= 850  # the stall is visible in stats()
    assert 1 <= len(adapter.calls) < 200  # the first fire after the stall takes every overdue bucket at once
    await tracker.close()


async def test_a_stall_on_the_fake_clock_folds_every_due_bucket_into_one_call():
    clock = ManualClock()
    adapter = MemoryAdapter(clock=clock.now_ms)
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0)
    for i in range(50):
        tracker.add(K(i), delay_ms=10 * (i + 1))
    clock.stall(1000)
    await settle()
    assert len(adapter.calls) == 1 and len(adapter.redelivered) == 50
    assert tracker.stats()["timer_lag_ms"]["max"] == 990


# -- closed with redeliveries pending ---------------------------------------------------------

async def test_closed_with_pending_redeliveries_accounts_for_them():
    clock = ManualClock()
    adapter = MemoryAdapter(clock=clock.now_ms)
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0)
    for i in range(10):
        tracker.add(K(i), delay_ms=100 * (i + 1))
    clock.advance(350)
    await settle()
    await tracker.close()
    clock.advance(10_000)
    await settle()
    s = tracker.stats()
    assert s["redelivered"] == 3 and s["pending"] == 7 and s["nacks"] == 10  # nacks = redelivered + pending
    assert len(adapter.redelivered) == 3  # nothing after close
    # what a closed tracker still holds can be carried over a restart
    clock2 = ManualClock()
    adapter2 = MemoryAdapter(clock=clock2.now_ms)
    restored = NegativeAcksTracker.restore(tracker.snapshot(), adapter2, clock=clock2, elapsed="none")
    clock2.advance(1000)
    await settle()
    assert sorted(k.entry_id for k in adapter2.redelivered) == list(range(3, 10))


async def test_closed_during_retry_backoff_keeps_the_unsent_batch_counted():
    clock = ManualClock()
    adapter = MemoryAdapter(clock=clock.now_ms)
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0, retry_min_ms=100)
    tracker.add(K(1), delay_ms=5)
    tracker.add(K(2), delay_ms=5)
    adapter.fail_next(1)
    clock.advance(5)
    await settle()
    await tracker.close()
    clock.advance(1000)  # the retry timer was cancelled by close
    await settle()
    s = tracker.stats()
    assert s["unsent"] == 2 and s["pending"] == 0 and s["failures"] == 1 and adapter.calls == []


async def test_close_with_flush_while_backing_off_delivers_the_unsent_batch():
    clock = ManualClock()
    adapter = MemoryAdapter(clock=clock.now_ms)
    tracker = NegativeAcksTracker(adapter, clock=clock, precision_bits=0, retry_min_ms=100)
    tracker.add(K(1), delay_ms=5)
    tracker.add(K(2), delay_ms=50_000)
    adapter.fail_next(1)
    clock.advance(5)
    await settle()
    await tracker.close(flush=True)
    assert adapter.redelivered == [K(1), K(2)]
    s = tracker.stats()
    assert s["unsent"] == 0 and s["pending"] == 0 and s["redelivered"] == 2


async def test_a_nack_racing_close_from_another_thread_is_counted_not_lost_silently(caplog):
    tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=0)
    done = threading.Event()

    def listener():
        tracker.add_threadsafe(K(1))  # queued on the loop, runs after close below
        done.set()

    threading.Thread(target=listener).start()
    done.wait(5)
    await tracker.close()
    await settle()
    s = tracker.stats()
    assert s["rejected_after_close"] == 1 and s["pending"] == 0
    assert "arrived after close" in caplog.text
