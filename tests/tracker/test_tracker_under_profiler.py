"""The tracker under a sampling profiler or debugger: a profile hook that reads
``frame.f_locals`` of nacktracker's frames at a random ~20% of C calls (as a
sampler does) changes nothing the tracker does. On Python 3.11 such a read
keeps the frame's locals alive (numpy views of the index's arrays included)
until the next read or the frame's end; a resize of an array with a view
alive raises ``BufferError``. The index's own test drives the index; this one
drives the tracker's own calls: ``add``, ``discard``, its fires
(``pop_due_bitmaps``) and the bulk path of a restore (``import_pending``)."""

from __future__ import annotations

import asyncio
import os
import random
import sys

import pytest

import nacktracker
from nacktracker import ManualClock, MessageKey, NegativeAcksTracker
from nacktracker.adapters import MemoryAdapter
from profiler_hooks import locals_reader

PACKAGE_DIR = os.path.dirname(nacktracker.__file__)


def run(bits: int, seed: int, hooked: bool, ops: int = 8_000, ledgers: int = 16) -> tuple[list, list]:
    """What the tracker fired at each step and what it held, for one seeded workload."""
    rng, hook = random.Random(seed), locals_reader(PACKAGE_DIR, random.Random(1000 + seed))
    errors: list = []

    async def main() -> list:
        clock = ManualClock(0)
        tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=bits, clock=clock)
        fired: list = []
        tracker.add_fire_listener(lambda cell: fired.extend((k.ledger_id, k.entry_id) for k in cell.keys))
        steps = []
        old = sys.getprofile()
        if hooked:
            sys.setprofile(hook)
        try:
            for i in range(ops):
                ledger, entry, delay = rng.randrange(ledgers), rng.randrange(1 << 12), rng.randrange(1, 3000)
                roll = rng.random()
                try:
                    if roll < 0.85:
                        tracker.add(MessageKey(ledger, entry), delay_ms=delay)
                    elif roll < 0.9:  # a burst into one cell
                        for e in range(entry, entry + rng.randrange(1, 60)):
                            tracker.add(MessageKey(ledger, e), delay_ms=delay)
                    else:
                        tracker.discard(MessageKey(ledger, entry))
                except BufferError as exc:
                    errors.append(exc)
                if i % 10 == 9:
                    clock.advance(40)
                    for _ in range(5):
                        await asyncio.sleep(0)
                    steps.append((sorted(fired), tracker.pending))
                    fired.clear()
                if i == ops // 2:  # the bulk path: a snapshot restored into a new tracker on the same clock
                    data = tracker.snapshot()
                    await tracker.close()
                    tracker = NegativeAcksTracker.restore(data, MemoryAdapter(), elapsed="none",
                                                          precision_bits=bits, clock=clock)
                    tracker.add_fire_listener(lambda cell: fired.extend((k.ledger_id, k.entry_id) for k in cell.keys))
        finally:
            sys.setprofile(old)
        stats = tracker.stats()
        assert stats["failures"] == 0
        await tracker.close()
        return steps

    steps = asyncio.run(main())
    return steps, errors


@pytest.mark.slow
@pytest.mark.parametrize("bits", [0, 8])
def test_the_trackers_calls_under_a_locals_reading_hook_do_what_they_do_without_it(bits):
    plain, _ = run(bits, seed=bits, hooked=False)
    hooked, errors = run(bits, seed=bits, hooked=True)
    assert not errors, errors[:3]
    assert sum(bool(fired) for fired, _ in plain) > 150  # the workload reached the fires it meant to
    differ = [i for i, (a, b) in enumerate(zip(plain, hooked)) if a != b]
    assert len(plain) == len(hooked) and not differ, differ[:5]


def fires_after_a_bulk_of_nacks(bits: int, hooked: bool) -> tuple[list, list, int]:
    """60,000 nacks over 16 ledgers due within 60 s (through ``tracker.add``), then 600 steps of 100 ms of
    the tracker's own fires (``pop_due_bitmaps`` over windows that fill many segments), under the hook
    when ``hooked``: what fired at each step, the errors the loop was handed, and what stayed pending."""
    rng, hook = random.Random(bits + 1), locals_reader(PACKAGE_DIR, random.Random(bits))
    errors: list = []

    async def main() -> tuple[list, int]:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(
            context.get("exception") or context.get("message")))
        clock = ManualClock(0)
        tracker = NegativeAcksTracker(MemoryAdapter(), precision_bits=bits, clock=clock)
        fired: list = []
        tracker.add_fire_listener(lambda cell: fired.extend((k.ledger_id, k.entry_id) for k in cell.keys))
        for i in range(60_000):
            tracker.add(MessageKey(rng.randrange(16), i), delay_ms=rng.randrange(1, 60_000))
        steps = []
        old = sys.getprofile()
        if hooked:
            sys.setprofile(hook)
        try:
            for _ in range(600):
                clock.advance(100)
                for _ in range(5):
                    await asyncio.sleep(0)
                steps.append(sorted(fired))
                fired.clear()
        finally:
            sys.setprofile(old)
        errors.extend(["failures"] * tracker.stats()["failures"])
        pending = tracker.pending
        await tracker.close()
        return steps, pending

    steps, pending = asyncio.run(main())
    return steps, errors, pending


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("bits", [0, 8])
def test_the_trackers_fires_over_a_bulk_of_nacks_under_a_locals_reading_hook_do_what_they_do_without_it(bits):
    """The case a sampling profiler broke: the tracker's fires popping windows of many segments
    (a window sorted across its segments once closed a scratch map the hooked frame's locals still
    viewed: BufferError in the fire, and later fires differing)."""
    plain, plain_errors, plain_pending = fires_after_a_bulk_of_nacks(bits, hooked=False)
    hooked, errors, pending = fires_after_a_bulk_of_nacks(bits, hooked=True)
    assert not plain_errors and not errors, errors[:3]
    assert sum(len(fired) for fired in plain) == 60_000 and plain_pending == 0  # every nack fired, by its step
    differ = [i for i, (a, b) in enumerate(zip(plain, hooked)) if a != b]
    assert len(plain) == len(hooked) and not differ and pending == 0, differ[:5]
