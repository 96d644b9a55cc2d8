"""The receive pump: the one task that calls the client's ``receive()``.

``pulsar.asyncio.Consumer.receive()`` loses the message it was about to
return when the awaiting task is cancelled (e.g. by ``asyncio.wait_for``), so
it is awaited by this task alone, never cancelled except on close; callers
wait on a queue instead, whose waits are safe to cancel.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Awaitable, Callable, Optional, Union

from ..errors import ConsumerClosed, ReceiveTimeout

__all__ = ["ReceivePump"]

log = logging.getLogger("nacktracker.consumer")

_STOP = object()  # queue sentinel: the pump stopped (closed or failed)
_FUTURE = asyncio.Future
#: After a message came through a future (the client's queue had run empty), the pump waits this
#: long before it asks the client again (see ReceivePump). The loop's timers have 1 ms resolution.
COALESCE_S = 0.001


class ReceivePump:
    """Pulls from ``consumer`` into a queue of at most ``prefetch`` messages
    (the client's receiver queue does the real buffering); ``admit(msg)``
    decides what goes in: ``True`` (queue it), ``False`` (drop it), or an
    awaitable to finish before the next receive (e.g. acks of dropped
    copies). ``put`` adds a message from elsewhere (a parked copy released at
    its time).

    ``direct(consumer)``: a :class:`~.direct.DirectConsumer` for it or
    ``None``, made when the pump starts (on the loop); with one the pump
    takes the messages already in the client's queue without a loop round
    trip each (up to ``prefetch`` per loop iteration), else it awaits
    ``consumer.receive()``. When the client's queue has run empty, the
    next message comes from one of the client's threads (its listener
    thread takes the GIL to call back, the loop wakes up): several context
    switches for one message. So after such a message the pump lets
    :data:`COALESCE_S` pass before it asks again, and what arrived
    meanwhile is taken at once: a consumer that keeps up with the broker
    then wakes up about once a millisecond, not once a message (its CPU per
    message: ``python -m bench.consume_throughput``). The cost: a message
    arriving within that millisecond reaches the application up to 1 ms
    later. Only with a ``prefetch`` above 1 (``subscribe`` sets 1 for a
    client queue of one message or none, where nothing could gather).

    The queue is a deque with the waiting receivers' futures beside it
    (``asyncio.Queue`` costs a dozen Python calls per message: its unfinished
    task count, its events, its getters and putters); the pump, when the
    queue is full, waits on a future that the receive taking it below
    ``prefetch`` completes."""

    def __init__(self, consumer: Any, admit: Callable[[Any], Union[bool, Awaitable[Any]]], prefetch: int,
                 direct: Optional[Callable[[Any], Any]] = None) -> None:
        self._consumer = consumer
        self._make_direct = direct
        self.direct: Any = None  # the consumer's DirectConsumer, once started
        self._admit = admit
        self._prefetch = prefetch
        self._items: deque[Any] = deque()  # messages for the application, then _STOP once stopped
        self._receivers: deque[asyncio.Future[Any]] = deque()  # futures of receivers waiting, in arrival order
        self._space: Optional[asyncio.Future[None]] = None  # the pump waiting for the application to take some
        self.task: Optional[asyncio.Task[None]] = None
        self.error: Optional[BaseException] = None
        self.received = 0
        self.admit_failures = 0  # messages admit() raised on: surfaced as they came (logged)
        self.expect_failure = False  # closing or unsubscribing: a failing receive() is no news

    def start(self) -> None:
        self.direct = self._make_direct(self._consumer) if self._make_direct is not None else None
        self.task = asyncio.get_running_loop().create_task(self._run(), name="nacktracker-pump")

    @property
    def queued(self) -> int:
        """Messages waiting for the application (at most ``prefetch`` from the
        pump, plus released parked copies)."""
        n = len(self._items)
        return n - 1 if n and self._items[-1] is _STOP else n

    def put(self, msg: Any) -> None:
        self._items.append(msg)
        if self._receivers:
            self._wake_receiver()

    def _wake_receiver(self) -> None:
        """Wake the first receiver still waiting (it takes the message, or
        passes the wakeup on if cancelled meanwhile). O(1) amortised."""
        receivers = self._receivers
        while receivers:
            waiter = receivers.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _stopped(self) -> BaseException:
        """What a receiver gets once the pump stopped (the sentinel stays
        queued: it keeps waking the other receivers)."""
        return self.error if self.error is not None else ConsumerClosed()

    def poll(self) -> Any:
        """The next message if one waits, else ``None`` (then await
        :meth:`get`); the pump's error or :class:`ConsumerClosed` once it
        stopped. O(1), no await: a receive that finds a message waiting costs
        no loop iteration."""
        items = self._items
        if not items:
            return None
        item = items[0]
        if item is _STOP:
            raise self._stopped()
        items.popleft()
        space = self._space
        if space is not None and len(items) < self._prefetch:
            self._space = None
            if not space.done():
                space.set_result(None)
        return item

    def peek(self) -> Any:
        """The next message without taking it, or ``None``; as :meth:`poll` once stopped. O(1)."""
        items = self._items
        if not items:
            return None
        if items[0] is _STOP:
            raise self._stopped()
        return items[0]

    async def ready(self, timeout_ms: Optional[int]) -> bool:
        """Wait until a message waits (then ``True``; take it with :meth:`poll`) or the pump
        stopped (``True``: :meth:`poll` raises), at most ``timeout_ms`` (then ``False``). O(1)."""
        if self._items:
            return True
        if timeout_ms is None:
            await self._wait()
            return True
        if timeout_ms <= 0:
            return False
        try:
            await asyncio.wait_for(self._wait(), timeout_ms / 1000)
        except asyncio.TimeoutError:
            return False
        return True

    def put_back(self, msgs: list[Any]) -> None:
        """Messages taken with :meth:`poll` and not handed to the application (a batch receive
        cancelled while it waited for more): first in the queue again, in their order. O(len(msgs))."""
        self._items.extendleft(reversed(msgs))
        if msgs and self._receivers:
            self._wake_receiver()

    async def get(self, timeout_ms: Optional[int]) -> Any:
        """The next message; :class:`ReceiveTimeout` after ``timeout_ms``; the
        pump's error or :class:`ConsumerClosed` once it stopped. O(1)."""
        if self._items:
            return self.poll()  # no loop iteration
        if timeout_ms == 0:  # a poll (wait_for with 0 would not even look at the queue)
            raise ReceiveTimeout("no message within 0 ms")
        if timeout_ms is None:
            await self._wait()
        else:
            try:
                # Cancelling the wait is safe (the message stays queued), unlike the client's receive().
                await asyncio.wait_for(self._wait(), timeout_ms / 1000)
            except asyncio.TimeoutError:
                raise ReceiveTimeout(f"no message within {timeout_ms} ms") from None
        return self.poll()

    async def _wait(self) -> None:
        """Until a message (or the stop sentinel) is queued."""
        loop = asyncio.get_running_loop()
        while not self._items:
            waiter = loop.create_future()
            self._receivers.append(waiter)
            try:
                await waiter
            except BaseException:
                waiter.cancel()
                try:
                    self._receivers.remove(waiter)  # (a receive timing out again and again must not pile up)
                except ValueError:
                    pass
                if self._items and not waiter.cancelled():  # woken, then cancelled: wake the next one instead
                    self._wake_receiver()
                raise

    def clear(self, drop: Callable[[Any], bool] = lambda msg: True) -> int:
        """Drop the messages waiting for the application that ``drop(msg)``
        names (default: all of them, for a seek: the client clears its own
        queue and the broker resends from the new position); the others keep
        their order. Returns how many. Runtime: O(queued)."""
        kept = [item for item in self._items if item is _STOP or not drop(item)]
        dropped = len(self._items) - len(kept)
        self._items = deque(kept)
        space = self._space
        if space is not None and len(kept) < self._prefetch:
            self._space = None
            if not space.done():
                space.set_result(None)
        return dropped

    async def stop(self) -> None:
        """Cancel the pump (whatever its receive() was about to return stays
        unacknowledged and goes back with the consumer) and wake the receivers."""
        self.expect_failure = True
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self._stop()

    def _stop(self) -> None:
        self._items.append(_STOP)
        while self._receivers:  # every waiting receiver raises
            waiter = self._receivers.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def _run(self) -> None:
        direct, admit, prefetch, receivers = self.direct, self._admit, self._prefetch, self._receivers
        loop = asyncio.get_running_loop()
        caught_up = False  # the last message came through a future: the client's queue had run empty
        # (a prefetch of 1: the client's queue holds one message, or none (a zero queue): nothing to gather)
        coalesce = COALESCE_S if prefetch > 1 else 0
        try:
            while True:
                if len(self._items) >= prefetch:
                    self._space = loop.create_future()
                    await self._space
                    caught_up = False  # what arrived meanwhile waits in the client's queue already
                if direct is None:
                    msg = await self._consumer.receive()
                else:
                    if caught_up and coalesce:
                        caught_up = False
                        await asyncio.sleep(coalesce)
                    msg = direct.receive()  # a message already in the client's queue, or a future of the next
                    if type(msg) is _FUTURE:
                        caught_up = True
                        msg = direct.wrap(await msg)
                self.received += 1
                try:
                    admitted = admit(msg)
                except Exception:  # one message the consumer cannot place never stops the others
                    self.admit_failures += 1
                    log.exception("a received message could not be placed; it surfaces as it came")
                    admitted = True
                if admitted is True:
                    self._items.append(msg)  # (clear() replaces the deque)
                    if receivers:
                        self._wake_receiver()
                elif admitted is not False:
                    await admitted
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the consumer was closed or failed: every receiver raises it (_stopped)
            if not self.expect_failure:
                log.warning("receive failed; the consumer stops delivering: %r", exc, exc_info=True)
                self.error = exc
            self._stop()
