"""The receive pump: the one task that calls the client's ``receive()``.

``pulsar.asyncio.Consumer.receive()`` loses the message it was about to
return when the awaiting task is cancelled (e.g. by ``asyncio.wait_for``), so
it is awaited by this task alone, never cancelled except on close; callers
wait on a queue instead, whose waits are safe to cancel.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Optional, Union

from .errors import ConsumerClosed, ReceiveTimeout

__all__ = ["ReceivePump"]

log = logging.getLogger("nacktracker.consumer")

_STOP = object()  # queue sentinel: the pump stopped (closed or failed)
_FUTURE = asyncio.Future


class ReceivePump:
    """Pulls from ``consumer`` into a queue of at most ``prefetch`` messages
    (the client's receiver queue does the real buffering); ``admit(msg)``
    decides what goes in: ``True`` (queue it), ``False`` (drop it), or an
    awaitable to finish before the next receive (e.g. acks of dropped
    copies). ``put`` adds a message from elsewhere (a parked copy released at
    its time). ``on_resume()`` is called when the pump goes on after waiting
    for the application: what arrives next sat in the client's queue
    meanwhile (the adapter must not learn its path latency from those).

    ``direct(consumer)``: a :class:`~.direct.DirectConsumer` for it or
    ``None``, made when the pump starts (on the loop); with one the pump
    takes the messages already in the client's queue without a loop round
    trip each (up to ``prefetch`` per loop iteration), else it awaits
    ``consumer.receive()``."""

    def __init__(self, consumer: Any, admit: Callable[[Any], Union[bool, Awaitable[Any]]], prefetch: int,
                 on_resume: Optional[Callable[[], None]] = None,
                 direct: Optional[Callable[[Any], Any]] = None) -> None:
        self._consumer = consumer
        self._make_direct = direct
        self.direct: Any = None  # the consumer's DirectConsumer, once started
        self._admit = admit
        self._prefetch = prefetch
        self._on_resume = on_resume
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._space = asyncio.Event()
        self.task: Optional[asyncio.Task[None]] = None
        self.error: Optional[BaseException] = None
        self.received = 0
        self.expect_failure = False  # closing or unsubscribing: a failing receive() is no news

    def start(self) -> None:
        self.direct = self._make_direct(self._consumer) if self._make_direct is not None else None
        self.task = asyncio.get_running_loop().create_task(self._run(), name="nacktracker-pump")

    @property
    def queued(self) -> int:
        """Messages waiting for the application (at most ``prefetch`` from the
        pump, plus released parked copies)."""
        return self._queue.qsize()

    def put(self, msg: Any) -> None:
        self._queue.put_nowait(msg)

    def poll(self) -> Any:
        """The next message if one waits, else ``None`` (then await
        :meth:`get`); the pump's error or :class:`ConsumerClosed` once it
        stopped. O(1), no await: a receive that finds a message waiting costs
        no loop iteration."""
        queue = self._queue
        if queue.empty():
            return None
        item = queue.get_nowait()
        if item is _STOP:
            queue.put_nowait(_STOP)  # keep waking the other receivers
            raise self.error if self.error is not None else ConsumerClosed()
        if queue.qsize() < self._prefetch:
            self._space.set()
        return item

    async def get(self, timeout_ms: Optional[int]) -> Any:
        """The next message; :class:`ReceiveTimeout` after ``timeout_ms``; the
        pump's error or :class:`ConsumerClosed` once it stopped. O(1)."""
        if not self._queue.empty():
            return self.poll()  # no loop iteration
        if timeout_ms is None:
            item = await self._queue.get()
        elif timeout_ms == 0:  # a poll (wait_for with 0 would not even look at the queue)
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                raise ReceiveTimeout("no message within 0 ms") from None
        else:
            try:
                # Cancelling Queue.get() is safe (the item stays queued), unlike the client's receive().
                item = await asyncio.wait_for(self._queue.get(), timeout_ms / 1000)
            except asyncio.TimeoutError:
                raise ReceiveTimeout(f"no message within {timeout_ms} ms") from None
        if item is _STOP:
            self._queue.put_nowait(_STOP)  # keep waking the other receivers
            raise self.error if self.error is not None else ConsumerClosed()
        if self._queue.qsize() < self._prefetch:
            self._space.set()
        return item

    def clear(self, drop: Callable[[Any], bool] = lambda msg: True) -> int:
        """Drop the messages waiting for the application that ``drop(msg)``
        names (default: all of them, for a seek: the client clears its own
        queue and the broker resends from the new position); the others keep
        their order. Returns how many. Runtime: O(queued)."""
        kept, dropped = [], 0
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is _STOP or not drop(item):  # stopped meanwhile: keep telling the receivers
                kept.append(item)
            else:
                dropped += 1
        for item in kept:
            self._queue.put_nowait(item)
        if self._queue.qsize() < self._prefetch:
            self._space.set()
        return dropped

    async def stop(self) -> None:
        """Cancel the pump (whatever its receive() was about to return stays
        unacknowledged and goes back with the consumer) and wake the receivers."""
        self.expect_failure = True
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self._queue.put_nowait(_STOP)

    async def _run(self) -> None:
        direct, queue, admit = self.direct, self._queue, self._admit
        try:
            while True:
                if queue.qsize() >= self._prefetch:
                    self._space.clear()
                    await self._space.wait()
                    if self._on_resume is not None:
                        self._on_resume()
                if direct is None:
                    msg = await self._consumer.receive()
                else:
                    msg = direct.receive()  # a message already in the client's queue, or a future of the next
                    if type(msg) is _FUTURE:
                        msg = direct.wrap(await msg)
                self.received += 1
                admitted = admit(msg)
                if admitted is True:
                    queue.put_nowait(msg)
                elif admitted is not False:
                    await admitted
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the consumer was closed or failed: tell the receivers
            if not self.expect_failure:
                log.warning("receive failed; the consumer stops delivering: %r", exc)
                self.error = exc
            self._queue.put_nowait(_STOP)
