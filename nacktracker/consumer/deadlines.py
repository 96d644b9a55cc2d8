"""Deadlines: things due at a time, earliest first, with lazy deletion (as trio's ``Deadlines``).

One structure for every timer heap of the consumer: the delivery core's parked copies and
expiries, the failure side's early retry copies. A deadline whose thing was taken out early
(acked, surrendered, replaced) stays in the heap and is skipped when it reaches the top:
``live(deadline)`` says whether it still counts. Taking one out exactly would cost a search per
removal; lazily, each deadline is pushed once and popped once (a ``SortedList`` with exact
removal holds the same bytes but costs more per park and release: ``python -m bench.lab.parked_order``).
Pure: no clock (times are the caller's), no I/O.

>>> d = Deadlines(live=lambda item: item.state != "gone")
>>> d.push(20, "b", "kept"); d.push(10, "a", "gone"); d.push(30, "c", "kept")
>>> d.next_ms()  # "a" was taken out: skipped
20
>>> [item.key for item in d.pop_due(25)], len(d)
(['b'], 1)
"""

from __future__ import annotations

import heapq
import itertools
import sys
from typing import Any, Callable, Iterator, Optional

from .state import _Deadline

__all__ = ["Deadlines"]


def _always(item: _Deadline) -> bool:
    return True


class Deadlines:
    """``(at_ms, key, state)`` deadlines in time order (then in push order). ``live(deadline)``:
    whether a deadline still counts (default: all do). Costs: :meth:`push` O(log n);
    :meth:`next_ms` amortised O(1) (each dead deadline is dropped once); :meth:`pop_due`
    O(log n) per deadline popped."""

    __slots__ = ("_heap", "_seq", "_live")

    def __init__(self, live: Callable[[_Deadline], bool] = _always) -> None:
        self._heap: list[_Deadline] = []
        self._seq = itertools.count()
        self._live = live

    def push(self, at_ms: float, key: Any, state: object = None) -> None:
        """``key`` is due at ``at_ms``, as long as ``state`` is its current state (see ``live``)."""
        heapq.heappush(self._heap, _Deadline(at_ms, next(self._seq), key, state))

    def next_ms(self) -> Optional[float]:
        """When the earliest live deadline is due, or ``None``; drops the dead ones on top."""
        heap, live = self._heap, self._live
        while heap and not live(heap[0]):
            heapq.heappop(heap)
        return heap[0].at_ms if heap else None

    def pop_due(self, now_ms: float) -> Iterator[_Deadline]:
        """Take out every deadline due at ``now_ms`` and yield the live ones, earliest first. Each is
        judged live when its turn comes (acting on one may end another's state)."""
        heap, live = self._heap, self._live
        while heap and heap[0].at_ms <= now_ms:
            item = heapq.heappop(heap)
            if live(item):
                yield item

    def __len__(self) -> int:
        """Deadlines held, dead ones not yet dropped included. O(1)."""
        return len(self._heap)

    def nbytes(self) -> int:
        """Bytes of the heap and its deadlines (each the same shape: a 4-tuple, a float and an int of its
        own; not their keys and states, which are their owners'). O(1)."""
        heap, size = self._heap, sys.getsizeof
        return size(heap) + (len(heap) * (size(heap[0]) + size(heap[0].at_ms) + size(heap[0].seq)) if heap else 0)
