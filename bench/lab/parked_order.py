"""Time order of parked copies (the delivery core's release deadlines), two
ways side by side in one run: a ``heapq`` list with lazy deletion (what the
core does: a copy taken out early leaves its deadline in the heap, skipped
when it comes to the top) and a ``sortedcontainers.SortedList`` with exact
removal (no stale items, O(1) peek at the earliest).

First through the delivery core itself: ``DeliveryCore`` against a lab
subclass keeping its release deadlines in a ``SortedList``. Each round parks
``n`` early copies of requested messages (release times spread over a
minute), acks a share of them by id before their time, then releases the
rest at wakeups every 100 ms. Reported: microseconds per copy for park +
ack + release, and bytes the core holds per parked copy (tracemalloc).

Then the two structures alone, the same round on bare deadlines (the heap
pops each due item; the sorted list takes each wakeup's due items as one
slice), and the structure's own bytes per deadline (the deadline tuples are
made before measuring, so not counted). Ratios are sorted / heap: above 1
means the sorted list is slower or bigger.

    python -m bench.lab.parked_order
"""

from __future__ import annotations

import gc
import heapq
import itertools
import random
import time
import tracemalloc
from typing import Any, Callable, NamedTuple

from sortedcontainers import SortedList

from nacktracker import Deduplicator, MessageKey
from nacktracker.consumer.core import DeliveryCore
from nacktracker.consumer.state import Held, Parked, Token, Verdict, _Deadline
from nacktracker.precision import Precision

ROUNDS = 5
STEP_MS = 100  # release wakeups every 100 ms over the minute the release times span
INF = float("inf")


class Deadline(NamedTuple):
    at_ms: float
    seq: int
    key: int
    state: object


def workload(n: int, removed: float, seed: int = 1) -> tuple[list[tuple[int, float]], set[int]]:
    rng = random.Random(seed)
    parks = [(k, float(rng.randrange(60_000))) for k in range(n)]
    gone = set(rng.sample(range(n), int(n * removed)))
    return parks, gone


def run_heap(parks: list[tuple[int, float]], gone: set[int]) -> int:
    heap: list[Deadline] = []
    live: dict[int, object] = {}
    seq = itertools.count()
    push, pop = heapq.heappush, heapq.heappop
    for key, at in parks:
        state = live[key] = object()
        push(heap, Deadline(at, next(seq), key, state))
    for key in gone:
        del live[key]  # lazy: the deadline stays in the heap
    released = 0
    for now in range(STEP_MS, 60_000 + STEP_MS, STEP_MS):  # the release timer's wakeups
        while heap and heap[0].at_ms <= now:
            item = pop(heap)
            if live.get(item.key) is item.state:
                del live[item.key]
                released += 1
    return released


def run_sorted(parks: list[tuple[int, float]], gone: set[int]) -> int:
    order: SortedList = SortedList()
    live: dict[int, Deadline] = {}
    seq = itertools.count()
    add = order.add
    for key, at in parks:
        item = live[key] = Deadline(at, next(seq), key, None)
        add(item)
    for key in gone:
        order.remove(live.pop(key))  # exact
    released = 0
    for now in range(STEP_MS, 60_000 + STEP_MS, STEP_MS):  # the release timer's wakeups
        due = order.bisect_right((now, INF))  # everything at or before now, in one slice
        if due:
            for item in order.islice(0, due):
                del live[item.key]
            del order[:due]
            released += due
    return released


def parked_bytes(kind: str, n: int) -> float:
    parks, _ = workload(n, 0.0)
    items = [Deadline(at, i, key, None) for i, (key, at) in enumerate(parks)]
    gc.collect()
    tracemalloc.start()
    if kind == "heap":
        heap: list[Any] = []
        for item in items:
            heapq.heappush(heap, item)
        kept: Any = heap
    else:
        kept = SortedList()
        for item in items:
            kept.add(item)
    total = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return total / n


def best_us(fn: Callable[[list[tuple[int, float]], set[int]], int], n: int, removed: float) -> float:
    parks, gone = workload(n, removed)
    best = float("inf")
    for _ in range(ROUNDS):
        gc.collect()
        t = time.perf_counter()
        fn(parks, gone)
        best = min(best, time.perf_counter() - t)
    return best / n * 1e6


class SortedReleaseCore(DeliveryCore):
    """The delivery core with its release deadlines in a ``SortedList`` (exact
    removal, O(1) peek) instead of the heap: only what that changes is
    overridden (a lab copy for the comparison, not the product)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._release_order: SortedList = SortedList()
        self._order = itertools.count()
        self._release_item: dict[MessageKey, _Deadline] = {}

    def next_wakeup_ms(self) -> float | None:
        times = [t for t in (self._release_order[0].at_ms if self._release_order else None,
                             self._expiries.next_ms()) if t is not None]
        return min(times) if times else None

    def _due_or_park(self, key: MessageKey, release_ms: int, token: Token, tokens: list[Token],
                     now_ms: float) -> Verdict:
        if now_ms >= release_ms:
            self.on_redelivered(now_ms - release_ms)
            return self._surface(key, tokens)
        parked = self.parked[key] = Parked(release_ms, token, tokens)
        if key.batch_index >= 0:
            self._parked_in.setdefault(key.entry, set()).add(key.batch_index)
        item = self._release_item[key] = _Deadline(release_ms, next(self._order), key, parked)
        self._release_order.add(item)
        return Verdict.PARK

    def _unpark(self, key: MessageKey) -> Parked | None:
        parked = super()._unpark(key)
        if parked is not None:
            self._release_order.remove(self._release_item.pop(key))
        return parked

    def _surrender(self, entry: MessageKey) -> None:
        for index in self._parked_in.get(entry, ()):
            self._release_order.remove(self._release_item.pop(entry._replace(batch_index=index)))
        super()._surrender(entry)

    def release(self, now_ms: float) -> list[Token]:
        out = []
        order = self._release_order
        due = order.bisect_right((now_ms, INF))
        if due:
            for item in order.islice(0, due):
                del self._release_item[item.key]
                parked = self._unpark_released(item.key)
                self.held[item.key] = Held(parked.tokens)
                self.counts["released"] += 1
                out.append(parked.token)
                self.on_redelivered(now_ms - item.at_ms)
            del order[:due]
        self._expire(now_ms)
        return out

    def _unpark_released(self, key: MessageKey) -> Parked:
        parked = DeliveryCore._unpark(self, key)
        assert parked is not None
        return parked


def requested_core(make: Callable[..., DeliveryCore], n: int,
                   removed: float) -> tuple[DeliveryCore, list[MessageKey], set[int]]:
    """A core in which each of ``n`` messages was nacked and its redelivery
    requested (so its next copy parks until its time), its keys, and which of
    them the workload acks early (:func:`workload`)."""
    parks, gone = workload(n, removed)
    core = make(Precision.of(0, "floor"), dedup=Deduplicator(n), overdue_ms=10_000)
    keys = [MessageKey(1, key, -1, -1, "t") for key, _ in parks]
    for k, (_, at) in zip(keys, parks):
        core.arrive(k, 0, None, 0)
        core.nacked(k, int(at) + 1_000, None, 0)
        core.fired(int(at) + 1_000, [k], 0)
    gc.collect()
    return core, keys, gone


def core_round(make: Callable[..., DeliveryCore], n: int, removed: float) -> float:
    """Seconds for ``n`` copies through one core: park (an early copy of a
    requested message), ack a share of them by id before their time, release
    the rest at wakeups every 100 ms. Requests are set up untimed."""
    core, keys, gone = requested_core(make, n, removed)
    t = time.perf_counter()
    for k in keys:
        core.arrive(k, 0, k, 0)
    for i in gone:
        core.acked(keys[i], 1)
    released = 0
    for now in range(STEP_MS, 61_000 + STEP_MS, STEP_MS):
        released += len(core.release(now))
    took = time.perf_counter() - t
    assert released == n - len(gone) and not core.parked, (released, len(core.parked))
    return took


def core_parked_bytes(make: Callable[..., DeliveryCore], n: int) -> float:
    """Bytes the core holds per parked copy (tracemalloc over the parking
    arrivals: the Parked, its deadline and the structures' slots; the keys and
    tokens exist before)."""
    core, keys, _ = requested_core(make, n, 0.0)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for k in keys:
        core.arrive(k, 0, k, 0)
    total = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return total / n


def core_us(make: Callable[..., DeliveryCore], n: int, removed: float) -> float:
    return min(core_round(make, n, removed) for _ in range(ROUNDS)) / n * 1e6


def main() -> None:
    print("The delivery core, park + early ack + release per copy (us):")
    print(f"{'parked':>8} {'removed':>8} {'heap us':>8} {'sorted us':>9} {'ratio':>6} "
          f"{'heap B':>7} {'sorted B':>8} {'ratio':>6}")
    for n in (1_000, 10_000, 100_000):
        hb, sb = core_parked_bytes(DeliveryCore, n), core_parked_bytes(SortedReleaseCore, n)
        for removed in (0.0, 0.5):
            h, s = core_us(DeliveryCore, n, removed), core_us(SortedReleaseCore, n, removed)
            print(f"{n:>8} {removed:>8.0%} {h:>8.2f} {s:>9.2f} {s / h:>6.2f} {hb:>7.0f} {sb:>8.0f} {sb / hb:>6.2f}")
    print("The structures alone:")
    print(f"{'parked':>8} {'removed':>8} {'heap us':>8} {'sorted us':>9} {'ratio':>6} "
          f"{'heap B':>7} {'sorted B':>8} {'ratio':>6}")
    for n in (100, 1_000, 10_000, 100_000):
        hb, sb = parked_bytes("heap", n), parked_bytes("sorted", n)
        for removed in (0.0, 0.5):
            h, s = best_us(run_heap, n, removed), best_us(run_sorted, n, removed)
            print(f"{n:>8} {removed:>8.0%} {h:>8.2f} {s:>9.2f} {s / h:>6.2f} {hb:>7.0f} {sb:>8.0f} {sb / hb:>6.2f}")


if __name__ == "__main__":
    main()
