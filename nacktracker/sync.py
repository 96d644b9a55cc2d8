"""The synchronous face: :func:`subscribe` for code that uses ``pulsar.Client``.

``nacktracker.sync.subscribe(client, topic, subscription, **options)`` returns a
:class:`SyncConsumer`: the sync ``pulsar.Consumer``'s methods and signatures
(``receive(timeout_millis=None)``, ``batch_receive()``, ``acknowledge``,
``negative_acknowledge(msg, delay_ms=None)``, ...) plus ``reconsume_later`` and
``dead_letter(reason=...)``, with every option and guarantee of
:class:`~nacktracker.TrackedConsumer` -- because it *is* one, run for you:

* Each sync consumer owns one event-loop thread (``nacktracker-sync-loop``). Its
  :class:`~nacktracker.TrackedConsumer` (receive pump, tracker timer, release timer,
  letters, snapshots) lives there, over a ``pulsar.asyncio.Client`` that wraps the
  *same* C++ client as the user's ``pulsar.Client`` (``pulsar.asyncio.Client`` is a
  thin face over that object too: no second connection, the user's auth/TLS/settings
  apply). There is no second copy of the delivery logic: each method hands its call
  to the loop and waits for the answer in the caller's thread, where errors are raised;
  except the hot path: the loop hands every message the tracked consumer lets through
  to a deque (:data:`HANDOFF`) that ``receive`` takes from (waiting there, woken by the
  loop, when it is empty), and ``acknowledge`` appends to a deque the loop takes from
  when it runs anyway (:data:`ACK_GATHER_S`).
* ``message_listener=callable(consumer, msg)``: a listener thread
  (``nacktracker-sync-listener``) receives and calls it, one message at a time, as the
  sync client calls its own; ``consumer`` is the :class:`SyncConsumer` (its acks and
  nacks go through the tracker).
* ``close()`` from any thread (the listener's too) stops both threads; a
  ``KeyboardInterrupt`` in ``receive`` ends the wait (no message lost: it stays in
  the hand-off or the consumer's queue) and the threads are daemons: consumers left open are
  closed at interpreter exit, then their clients, so nothing is left running and the
  exit is clean. The cost: docs/design.md ("The synchronous face").
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import inspect
import logging
import math
import re
import threading
import weakref
from typing import Any, Awaitable, Callable, Optional, TypeVar, Union, cast

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_asyncio

from ._checks import check_delay_ms
from .adapters.pulsar_layout import asyncio_client, raw_client
from .clock import Clock
from .consumer.batches import BatchLimits
from .consumer.direct import message_length
from .consumer.options import CLIENT_RECEIVER_QUEUE_SIZE, check_timeout_ms
from .consumer.shell import TrackedConsumer
from .consumer.subscription import subscribe as subscribe_async
from .errors import ArgumentError, ConsumerClosed, ReceiveTimeout

__all__ = ["subscribe", "SyncConsumer"]

log = logging.getLogger("nacktracker.sync")

T = TypeVar("T")
Listener = Callable[["SyncConsumer", pulsar.Message], None]

#: At most this many messages (and at most the consumer's ``prefetch``, which is this by default on the sync
#: face) wait in the hand-off, given to it by the loop as the tracked consumer lets them through, ahead of the
#: receives that will return them (they count as received, as the client's queue does). None with an ack
#: timeout (its clock starts when the application gets the message: each receive asks the loop).
HANDOFF = 64
#: While acks keep coming the loop looks for them again this long after it took the last ones (no wake-up
#: per ack); it also takes them whenever a message wakes it. The client's own acks are grouped for 100 ms
#: before they are sent.
ACK_GATHER_S = 0.002
#: What acknowledge() takes (checked in the caller's thread; the rest is checked on the loop).
ACKABLE = (pulsar.Message, pulsar.MessageId, _pulsar.Message, _pulsar.MessageId)

#: How often a waiting call wakes up so that the main thread handles signals (KeyboardInterrupt).
_SIGNAL_CHECK_S = 0.1

_open: weakref.WeakSet[SyncConsumer] = weakref.WeakSet()  # closed at interpreter exit (atexit below)


def _asyncio_client(client: pulsar.Client) -> pulsar_asyncio.Client:
    """A ``pulsar.asyncio.Client`` over ``client``'s own C++ client. ``pulsar.asyncio.Client.__init__``
    does nothing else than build a ``pulsar.Client`` and keep its C++ client (pulsar-client 3.x), so
    this is the object it would make, minus a second connection pool; closing it is not done here
    (the user's client owns the connection)."""
    raw = raw_client(client)
    if raw is None:
        raise TypeError("this pulsar.Client has no underlying client (pulsar-client 3.x lays it out as _client)")
    return asyncio_client(raw)


def _sync_error(exc: pulsar_asyncio.PulsarException) -> BaseException:
    """The sync client's exception for a ``pulsar.asyncio`` one: the class ``pulsar.Client`` raises
    for its result (``pulsar.ConsumerBusy``, ``pulsar.CumulativeAcknowledgementNotAllowedError``,
    ...), so that code catching those keeps working. nacktracker's own (``ReceiveTimeout``,
    ``ConsumerClosed``) are both already."""
    if isinstance(exc, pulsar.PulsarException):
        return cast(BaseException, exc)
    found = getattr(_pulsar, getattr(exc.error(), "name", ""), None)
    cls: type[BaseException] = found if isinstance(found, type) and issubclass(found, pulsar.PulsarException) \
        else pulsar.PulsarException
    return cls(str(exc))


class _LoopThread:
    """One event loop on a daemon thread: where a sync consumer's TrackedConsumer lives."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), name="nacktracker-sync-loop", daemon=True)
        self.thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(started.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` (a coroutine) on the loop; wait for it here; raise its error here.
        Interrupted (``KeyboardInterrupt``), the coroutine is cancelled before the interrupt goes on."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("a nacktracker.sync consumer's method was called on its own loop thread")

        async def run() -> T:
            return await make()

        future = asyncio.run_coroutine_threadsafe(run(), self.loop)
        try:
            while True:
                # in slices: a Ctrl-C delivered to another thread (the C++ client's) is handled in the main
                # thread only when it runs Python code, as pulsar.Consumer.receive checks signals too
                try:
                    return future.result(_SIGNAL_CHECK_S)
                except TimeoutError:
                    if future.done():  # the call's own TimeoutError
                        raise
        except pulsar_asyncio.PulsarException as exc:
            raise _sync_error(exc) from exc
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # closed meanwhile
            return
        if threading.current_thread() is not self.thread:
            self.thread.join()


class SyncConsumer:
    """A sync ``pulsar.Consumer`` with exact, tracked negative acks (made by :func:`subscribe`).

    Every method may be called from any thread; each waits for its answer (a ``pulsar.Consumer`` does
    too) and raises its error in the calling thread. Same methods as ``pulsar.Consumer``, each taking
    a Message or its id where the client does, plus ``negative_acknowledge(msg, delay_ms=...)``,
    ``reconsume_later``, ``dead_letter`` and ``stats()`` (:class:`~nacktracker.TrackedConsumer`'s).
    After :meth:`close` every call that would reach the broker raises
    :class:`~nacktracker.ConsumerClosed`. Usable as a context manager (closes on exit).

    The hand-off (see docs/design.md, "The synchronous face"): a task on the loop (the *feeder*)
    takes every message the tracked consumer lets through, as it does, and appends it to a deque
    that ``receive`` takes from, waking a receive that waits there; ``acknowledge`` appends to
    another deque that the loop takes from when it runs anyway (a message came, or
    :data:`ACK_GATHER_S` after the last acks). With ``ack_timeout_ms`` there is no feeder (the
    timeout's clock starts when the application gets the message): each receive asks the loop.
    """

    def __init__(self, runner: _LoopThread, tracked: TrackedConsumer, listener: Optional[Listener],
                 client: pulsar.Client, batch_limits: BatchLimits, several_topics: bool = False) -> None:
        self._runner = runner
        self._several_topics = several_topics  # a list or a pattern: ids must name their topic
        self._loop = runner.loop
        self._client = client
        self._tracked = tracked
        self._batch_limits = batch_limits
        self._closing = threading.Lock()
        self._closed = False
        self._listener = listener
        self._listening = threading.Event()  # cleared by pause_message_listener()
        self._listening.set()
        self._listener_thread: Optional[threading.Thread] = None
        opts = tracked.options
        # the hand-off: appended to by the feeder (on the loop), taken from in any thread
        self._ready: collections.deque[pulsar.Message] = collections.deque()
        self._handoff = 0 if opts.ack_timeout_ms else min(HANDOFF, opts.prefetch)  # the most _ready holds
        self._low = self._handoff // 2  # a full hand-off is topped up again once a receive leaves this many
        self._arrived = threading.Condition(threading.Lock())  # a receive waits on it while _ready is empty
        self._waiting = 0  # receives waiting on _arrived (changed under its lock; read by the feeder without)
        self._space: Optional[asyncio.Future[None]] = None  # the feeder waits for room in _ready (on the loop)
        self._wants_space = False  # ... and a receive that takes _ready down to _low wakes it
        self._stopped: Optional[BaseException] = None  # why the feeder stopped (the consumer failed)
        self._feeder: Optional[asyncio.Task[None]] = None
        # acknowledged here, not yet on the loop: appended in any thread, taken on the loop
        self._acks: collections.deque[Any] = collections.deque()
        self._ack_watch = False  # the loop looks at _acks again soon without being woken
        self._fed = False  # messages were handed over since the loop last looked for acks (more will come)
        self._acking = False  # an _ack_all task runs on the loop (it takes what comes meanwhile)
        self._ack_task: Optional[asyncio.Task[None]] = None  # the last of them (awaited by close)
        self.ack_failures = 0
        self._clock: Clock = runner.call(self._start)
        if listener is not None:
            self._listener_thread = threading.Thread(target=self._listen, name="nacktracker-sync-listener",
                                                     daemon=True)
            self._listener_thread.start()
        _open.add(self)

    @property
    def client(self) -> pulsar.Client:
        """The ``pulsar.Client`` this consumer was subscribed with."""
        return self._client

    @property
    def tracked(self) -> TrackedConsumer:
        """The :class:`~nacktracker.TrackedConsumer` doing the work (it lives on the loop thread: use
        it only there, e.g. to instrument it before traffic; the methods here are the thread-safe way)."""
        return self._tracked

    def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the loop after the acks made before it (calls keep their order)."""
        if self._closed:
            raise ConsumerClosed()

        async def in_order() -> T:
            if self._acks:
                await self._ack_all()
            return await make()
        return self._runner.call(in_order)

    # -- receiving -------------------------------------------------------------------

    def receive(self, timeout_millis: Optional[int] = None) -> pulsar.Message:
        """The next message, as ``pulsar.Consumer.receive``: waits until one comes, or raises
        :class:`~nacktracker.ReceiveTimeout` (a ``pulsar.Timeout``) after ``timeout_millis``.
        With a ``message_listener`` the listener receives: ``pulsar.InvalidConfiguration``, as the client."""
        if self._listener is not None and threading.current_thread() is not self._listener_thread:
            raise pulsar.InvalidConfiguration("Can not receive when a listener has been set")
        if self._closed:
            raise ConsumerClosed()
        if timeout_millis is not None:  # checked whether or not a message waits: the same call, the same answer
            timeout_millis = check_timeout_ms(timeout_millis, "timeout_millis")
        ready = self._ready
        try:
            msg = ready.popleft()  # handed over by the feeder: no thread hop
        except IndexError:
            if not self._handoff:  # (ack timeouts) the loop hands each message over as it is asked
                return self._call(lambda: self._tracked.receive(timeout_millis))
            msg = self._wait(timeout_millis)
        if self._wants_space and len(ready) <= self._low:
            self._wants_space = False
            self._threadsafe(self._make_room)
        return msg

    def _wait(self, timeout_millis: Optional[int]) -> pulsar.Message:
        """Wait for the feeder to hand a message over (woken by it; in slices, so that a Ctrl-C reaches
        the main thread); :class:`ReceiveTimeout` after ``timeout_millis``. Interrupted, nothing is lost."""
        if threading.current_thread() is self._runner.thread:  # it would wait for itself
            raise RuntimeError("a nacktracker.sync consumer's receive was called on its own loop thread")
        clock = self._clock
        deadline = None
        if timeout_millis is not None:
            deadline = clock.now_ms() + check_timeout_ms(timeout_millis, "timeout_millis")
        ready, arrived = self._ready, self._arrived
        with arrived:
            self._waiting += 1
            try:
                while True:
                    try:
                        return ready.popleft()
                    except IndexError:
                        pass
                    if self._closed:
                        raise ConsumerClosed()
                    if self._stopped is not None:
                        raise self._stopped
                    wait = _SIGNAL_CHECK_S
                    if deadline is not None:
                        left = deadline - clock.now_ms()
                        if left <= 0:
                            raise ReceiveTimeout(f"no message within {timeout_millis} ms")
                        wait = min(wait, left / 1000)
                    arrived.wait(wait)
            finally:
                self._waiting -= 1

    def _threadsafe(self, callback: Callable[[], None]) -> None:
        try:
            self._loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop closed meanwhile: the next call raises ConsumerClosed
            pass

    async def _start(self) -> Clock:
        """On the loop: start the feeder (with a hand-off); the tracker's clock (the one clock a consumer
        reads: its ``now_ms`` is the loop's monotonic time, read from any thread here)."""
        if self._handoff:
            self._feeder = self._loop.create_task(self._feed(), name="nacktracker-sync-feeder")
        return self._tracked.tracker.clock

    async def _feed(self) -> None:
        """On the loop: hand every message the tracked consumer lets through to ``_ready`` (at most
        ``_handoff`` there), waking the receives that wait; take the acks handed over meanwhile."""
        tracked, ready, most, arrived = self._tracked, self._ready, self._handoff, self._arrived
        try:
            while True:
                if len(ready) >= most:
                    self._space = self._loop.create_future()
                    self._wants_space = True
                    if len(ready) >= most:  # (a receive may have taken some before it could see the flag)
                        await self._space
                    self._wants_space = False
                    self._space = None
                    continue
                msg = tracked.receive_nowait()
                if msg is None:
                    self._start_acks()  # about to wait: what was acknowledged meanwhile goes now
                    msg = await tracked.receive()
                ready.append(msg)
                while len(ready) < most and (msg := tracked.receive_nowait()) is not None:
                    ready.append(msg)
                if self._waiting:
                    with arrived:
                        arrived.notify(len(ready))
                self._start_acks()
                self._watch_acks()
        except Exception as exc:  # closed or failed: the receives raise it once _ready is empty
            log.debug("the hand-off stops: the consumer stopped", exc_info=True)
            self._stopped = exc
            with arrived:
                arrived.notify_all()

    def _make_room(self) -> None:
        """On the loop: a receive took the hand-off down to its low mark: the feeder goes on."""
        space = self._space
        if space is not None and not space.done():
            space.set_result(None)

    def _drop_ready(self, drop: Callable[[pulsar.Message], bool] = lambda msg: True) -> None:
        """On the loop: drop what the hand-off holds that ``drop`` names (the rest keeps its order; a
        receive taking one meanwhile takes it once)."""
        ready = self._ready
        for _ in range(len(ready)):
            try:
                msg = ready.popleft()
            except IndexError:
                break
            if not drop(msg):
                ready.append(msg)
        self._make_room()

    def batch_receive(self) -> list[pulsar.Message]:
        """As ``pulsar.Consumer.batch_receive`` with ``batch_receive_policy`` (see
        :meth:`TrackedConsumer.batch_receive <nacktracker.TrackedConsumer.batch_receive>`): complete at
        the policy's message count or payload bytes, else when its timeout passes, with what came
        meanwhile (maybe nothing)."""
        if not self._handoff:
            return self._call(self._tracked.batch_receive)
        if self._closed:
            raise ConsumerClosed()
        limits, ready, clock = self._batch_limits, self._ready, self._clock
        deadline = clock.now_ms() + limits.timeout_ms if limits.timeout_ms > 0 else None
        batch: list[pulsar.Message] = []
        size = 0
        while not limits.full(len(batch), size):
            try:
                msg = ready.popleft()
            except IndexError:
                left = None if deadline is None else deadline - clock.now_ms()
                if left is not None and left <= 0:
                    break
                try:
                    msg = self._wait(None if left is None else max(1, math.ceil(left)))
                except ReceiveTimeout:
                    break
                except Exception:
                    if batch:  # closed or failed after the batch began: it is returned as it is
                        break
                    raise
                except BaseException:  # interrupted: what was taken is handed out first next time
                    ready.extendleft(reversed(batch))
                    raise
            length = message_length(msg)
            if not limits.fits(len(batch), size, length):
                ready.appendleft(msg)  # the next call's first
                break
            batch.append(msg)
            size += length
        if self._wants_space and len(ready) <= self._low:
            self._wants_space = False
            self._threadsafe(self._make_room)
        return batch

    def _listen(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._closed:
            self._listening.wait()
            if self._closed:
                break
            try:
                msg = self.receive()
            except ConsumerClosed:
                break
            except Exception:  # the pump failed (the client closed underneath): nothing more comes
                if not self._closed:
                    log.warning("message listener stops: receive failed", exc_info=True)
                break
            self._listening.wait()  # paused while the receive waited: the message waits for the resume
            if self._closed:
                break  # unacknowledged: the broker hands it to the subscription again
            try:
                listener(self, msg)
            except Exception:  # as the client: a failing listener does not stop the deliveries
                log.exception("message_listener raised")

    def pause_message_listener(self) -> None:
        """Stop calling the listener after the message it is handling, until :meth:`resume_message_listener`."""
        self._listening.clear()

    def resume_message_listener(self) -> None:
        self._listening.set()

    # -- acknowledging ---------------------------------------------------------------

    def acknowledge(self, message: Any) -> None:
        """Acknowledge a Message or its id (cancels its pending nack; see ``TrackedConsumer.acknowledge``).

        As the sync client's (whose acks are grouped and sent later), it does not wait for the
        broker: the ack is handed to the loop, in order with every later call of this consumer, and
        taken there when the loop runs anyway (within :data:`ACK_GATHER_S`). A wrong type or a closed
        consumer raises here; a failure on the way (the connection closed underneath) is logged and
        counted in ``stats()["sync_ack_failures"]``. O(1)."""
        if self._closed:
            raise ConsumerClosed()
        if not isinstance(message, ACKABLE):
            raise TypeError(f"acknowledge takes a pulsar.Message or pulsar.MessageId, not {type(message).__name__}")
        if self._several_topics and not isinstance(message, pulsar.Message):
            # an id may name no topic (the client's multi-topics consumer refuses it at once: raised here
            # too, as pulsar.OperationNotSupported), and an id's topic cannot be read: wait for the answer
            self._call(lambda: self._tracked.acknowledge(message))
            return
        self._acks.append(message)
        if not self._ack_watch:  # else the loop looks again soon (the flag is cleared before its last look)
            self._ack_watch = True
            try:
                self._loop.call_soon_threadsafe(self._ack_tick)
            except RuntimeError:  # the loop closed meanwhile: closed
                raise ConsumerClosed() from None

    def _ack_tick(self) -> None:
        """On the loop: take the acks handed over; while acks or messages keep coming, look again in
        :data:`ACK_GATHER_S` (no wake-up per ack); after such a time with neither, stop looking (the
        next ack, or the next message handed over, starts it again)."""
        busy = bool(self._acks) or self._fed
        self._fed = False
        if not busy:
            self._ack_watch = False
            if not self._acks:  # (an ack appended before the flag was cleared is seen here)
                return
            self._ack_watch = True
        self._start_acks()
        if not self._closed:
            self._loop.call_later(ACK_GATHER_S, self._ack_tick)

    def _watch_acks(self) -> None:
        """On the loop, as messages are handed over: their acks will come; look for them without being
        woken (unless already looking)."""
        self._fed = True
        if not self._ack_watch:
            self._ack_watch = True
            self._loop.call_later(ACK_GATHER_S, self._ack_tick)

    def _start_acks(self) -> None:
        """On the loop: an _ack_all task for the acks handed over, unless one runs (it takes them)."""
        if self._acks and not self._acking:
            self._acking = True
            self._ack_task = self._loop.create_task(self._ack_all())  # (kept: the loop holds tasks weakly)

    async def _ack_all(self) -> None:
        """On the loop: every ack handed over so far, in order."""
        acks, tracked = self._acks, self._tracked
        try:
            while acks:
                message = acks.popleft()
                try:
                    await tracked.acknowledge(message)
                except Exception:
                    self.ack_failures += 1
                    log.warning("acknowledge of %r failed", message, exc_info=True)
        finally:
            self._acking = False

    def acknowledge_cumulative(self, message: Any) -> None:
        """As ``pulsar.Consumer.acknowledge_cumulative`` (not on Shared subscriptions). Messages handed
        over to this side and covered by it are not handed out any more (the consumer drops them from
        its queue too)."""
        async def ack() -> None:
            await self._tracked.acknowledge_cumulative(message)
            if self._ready and isinstance(message, pulsar.Message):
                upto, topic = message.message_id(), message.topic_name()
                self._drop_ready(lambda m: m.topic_name() == topic and m.message_id() <= upto)
        self._call(ack)

    def negative_acknowledge(self, message: Any, delay_ms: Optional[int] = None) -> None:
        """Redeliver a Message (or its id) after ``delay_ms`` (default: the backoff for its redelivery count,
        else the consumer's ``delay_ms``), exactly at its due time with ``precision_bits=0``; dead-lettered
        once its count reaches ``max_redeliveries``. A ``delay_ms`` given counts from this call (the time
        the call takes to reach the loop is taken off it); the default's from when the loop takes the
        nack. Never blocks on the broker."""
        if delay_ms is None:
            self._call(lambda: self._tracked.negative_acknowledge(message, None))
            return
        delay, called = check_delay_ms("delay_ms", delay_ms), self._clock.now_ms()
        self._call(lambda: self._tracked.negative_acknowledge(message, self._since(called, delay)))

    def _since(self, called: float, delay_ms: int) -> int:
        """On the loop: what is left of ``delay_ms`` counted from ``called`` (the tracker's clock in the
        caller's thread), in whole ms rounded up: never early, at most 1 ms later than asked."""
        spent = self._clock.now_ms() - called
        return max(0, math.ceil(delay_ms - max(0.0, spent)))

    def reconsume_later(self, message: Any, delay_ms: Optional[int] = None,
                        properties: Optional[dict[str, str]] = None) -> None:
        """Java's ``reconsumeLater`` (needs ``enable_retry=True``): see docs/retries.md. A ``delay_ms``
        given counts from this call, as :meth:`negative_acknowledge`'s."""
        if delay_ms is None:
            self._call(lambda: self._tracked.reconsume_later(message, None, properties))
            return
        delay, called = check_delay_ms("delay_ms", delay_ms), self._clock.now_ms()
        self._call(lambda: self._tracked.reconsume_later(message, self._since(called, delay), properties))

    def dead_letter(self, message: Any, reason: str, exception: Optional[BaseException] = None) -> None:
        """A terminal nack: publish ``message`` to the dead-letter topic now, with ``reason``."""
        self._call(lambda: self._tracked.dead_letter(message, reason, exception))

    # -- the rest of the consumer API ------------------------------------------------

    def seek(self, messageid: Union[pulsar.Message, pulsar.MessageId, int]) -> None:
        """As the client's: the broker resends from there (what was handed over here is dropped, as the
        client clears its queue)."""
        async def seek() -> None:
            await self._tracked.seek(messageid)
            self._drop_ready()
        self._call(seek)

    def get_last_message_id(self) -> Any:
        return self._call(self._tracked.get_last_message_id)

    def redeliver_unacknowledged_messages(self) -> None:
        def redeliver() -> None:
            self._tracked.redeliver_unacknowledged_messages()
            self._drop_ready()  # the broker sends them again
        self._call(self._async(redeliver))

    def stats(self) -> dict[str, Any]:
        """:meth:`TrackedConsumer.stats <nacktracker.TrackedConsumer.stats>`, read on the loop thread."""
        own = {"sync_ack_failures": self.ack_failures, "sync_handed_over": len(self._ready)}
        if self._closed:
            return {**self._tracked.stats(), **own}  # nothing moves any more
        return {**self._call(self._async(self._tracked.stats)), **own}

    @staticmethod
    def _async(fn: Callable[[], T]) -> Callable[[], Awaitable[T]]:
        async def run() -> T:
            return fn()
        return run

    def topic(self) -> str:
        return self._tracked.topic()

    def subscription_name(self) -> str:
        return self._tracked.subscription_name()

    def consumer_name(self) -> str:
        return self._tracked.consumer_name()

    def is_connected(self) -> bool:
        return not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    def unsubscribe(self) -> None:
        """Unsubscribe, then stop as :meth:`close` does."""
        self._call(self._tracked.unsubscribe)
        self._finish(self._tracked.close)

    def close(self) -> None:
        """Close the consumer (see ``TrackedConsumer.close``), then its loop and listener threads.
        Idempotent; from any thread, the listener's included."""
        self._finish(self._tracked.close)

    def _finish(self, close: Callable[[], Awaitable[None]]) -> None:
        with self._closing:
            if self._closed:
                return
            self._closed = True
            self._listening.set()  # a paused listener thread wakes up and ends
            with self._arrived:
                self._arrived.notify_all()  # waiting receives raise ConsumerClosed
            try:
                self._runner.call(lambda: self._close_after_acks(close))
            finally:
                self._runner.stop()
                _open.discard(self)
        thread = self._listener_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    async def _close_after_acks(self, close: Callable[[], Awaitable[None]]) -> None:
        feeder = self._feeder
        if feeder is not None:
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)
        running = self._ack_task
        if running is not None:  # the acks it took are sent before the consumer closes
            await asyncio.gather(running, return_exceptions=True)
        if self._acks:
            await self._ack_all()
        self._ready.clear()  # unacknowledged: the broker hands them to the subscription again
        await close()

    def __enter__(self) -> SyncConsumer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SyncConsumer(topic={self.topic()!r}, subscription={self.subscription_name()!r}, closed={self._closed})"


def subscribe(client: pulsar.Client, topic: Union[str, list[str], re.Pattern[str]],
              subscription: Optional[str] = None, *args: Any, **options: Any) -> SyncConsumer:
    """Subscribe with a sync ``pulsar.Client`` and return a :class:`SyncConsumer`.

    ``options``: those of :func:`nacktracker.subscribe` (``delay_ms``, ``precision_bits``, ``backoff``,
    ``max_redeliveries``, ``dead_letter_topic``, ``enable_retry``, ``ack_timeout_ms``, ``snapshot_path``,
    ...) and pulsar-client's own subscribe options, checked the same way. ``topic``: a name, a list of
    names, or a compiled regex (a pattern subscription). ``message_listener``: called as
    ``message_listener(consumer, msg)`` on the consumer's listener thread.

    Every form of call ``pulsar.Client.subscribe`` takes: ``subscription_name=`` for ``subscription``,
    and its options positionally in its own order (``consumer_type``, ``schema``, ``message_listener``,
    ...). The subscription type defaults to the client's, **Exclusive**, as in :func:`nacktracker.subscribe`
    (workers sharing a subscription with per-message nacks pass ``consumer_type=pulsar.ConsumerType.Shared``;
    on Exclusive and Failover a nacked message comes back from the consumer's memory). An argument of the wrong
    type raises :class:`~nacktracker.errors.ArgumentError`: the ``ValueError`` the client raises, and a
    ``TypeError``.

    >>> client = pulsar.Client(url)                                           # doctest: +SKIP
    >>> consumer = nacktracker.sync.subscribe(client, "t", "sub", delay_ms=500)  # doctest: +SKIP
    >>> msg = consumer.receive()                                              # doctest: +SKIP
    >>> consumer.negative_acknowledge(msg, delay_ms=1000)                     # doctest: +SKIP
    """
    try:
        subscription, message_listener = _call_form(subscription, args, options)
        return _subscribe(client, topic, subscription, message_listener, options)
    except TypeError as exc:
        if isinstance(exc, ValueError):
            raise
        raise ArgumentError(str(exc)) from exc


def _call_form(subscription: Optional[str], args: tuple[Any, ...],
               options: dict[str, Any]) -> tuple[Any, Optional[Listener]]:
    """``pulsar.Client.subscribe``'s forms of call: ``subscription_name=`` and its options given by
    position (named from the installed client's signature, in its order). Moves the positional ones
    into ``options``; returns the subscription and the listener."""
    if "subscription_name" in options:
        if subscription is not None:
            raise TypeError("subscribe() got multiple values for the subscription (subscription and "
                            "subscription_name)")
        subscription = options.pop("subscription_name")
    names = _client_positional()
    if len(args) > len(names):
        raise TypeError(f"subscribe() takes at most {len(names) + 3} positional arguments "
                        f"({len(args) + 3} given)")
    for name, value in zip(names, args):
        if name in options:
            raise TypeError(f"subscribe() got multiple values for argument {name!r}")
        options[name] = value
    return subscription, options.pop("message_listener", None)


def _client_positional() -> list[str]:
    """The names of ``pulsar.Client.subscribe``'s parameters after ``subscription_name``, in order."""
    names = list(inspect.signature(pulsar.Client.subscribe).parameters)
    return names[names.index("subscription_name") + 1:]


def _subscribe(client: pulsar.Client, topic: Union[str, list[str], re.Pattern[str]], subscription: Any,
               message_listener: Optional[Listener], options: dict[str, Any]) -> SyncConsumer:
    if not isinstance(client, pulsar.Client):
        if isinstance(client, pulsar_asyncio.Client):
            raise TypeError("nacktracker.sync.subscribe takes the synchronous pulsar.Client; "
                            "for a pulsar.asyncio.Client use nacktracker.subscribe")
        raise TypeError(f"client must be a pulsar.Client, not {type(client).__name__}")
    if message_listener is not None:
        _check_listener(message_listener)
    # pulsar-client 3.x's pulsar.Client.subscribe checks this option's type and sets nothing with it (the C++
    # client's default period applies): the same here
    period = options.pop("pattern_auto_discovery_period", 60)
    if not isinstance(period, int):
        raise ArgumentError(f"Argument pattern_auto_discovery_period is expected to be of type 'int' and not "
                            f"'{type(period).__name__}'")  # the client's own words (its ValueError, and a TypeError)
    if isinstance(topic, re.Pattern):
        topic = topic.pattern
        options["is_pattern_topic"] = True
    several = not isinstance(topic, str) or bool(options.get("is_pattern_topic"))
    aclient = _asyncio_client(client)
    _close_with_consumers()
    options.setdefault("prefetch", HANDOFF)  # what the hand-off takes at most (see HANDOFF)
    runner = _LoopThread()
    try:
        tracked = runner.call(lambda: subscribe_async(aclient, topic, subscription, **options))
    except BaseException:
        runner.stop()
        raise
    # the batch receive policy as the tracked consumer reads it (batch_receive takes from the hand-off)
    queue_size = options.get("receiver_queue_size", CLIENT_RECEIVER_QUEUE_SIZE)
    limits = BatchLimits.of(options.get("batch_receive_policy"), queue_size or CLIENT_RECEIVER_QUEUE_SIZE)
    try:
        return SyncConsumer(runner, tracked, message_listener, client, limits, several_topics=several)
    except BaseException:
        runner.call(tracked.close)
        runner.stop()
        raise


_CLIENT_CLOSE = pulsar.Client.close


def _close_consumers_first(client: pulsar.Client) -> None:
    """``pulsar.Client.close``, after closing the sync consumers made from this client that are still open
    (see :func:`_close_with_consumers`)."""
    for consumer in list(_open):
        if consumer.client is client:
            try:
                consumer.close()
            except Exception:  # the client's close goes on, as it would with the consumer open
                log.debug("closing %r with its client failed", consumer, exc_info=True)
    _CLIENT_CLOSE(client)


def _close_with_consumers() -> None:
    """Make ``pulsar.Client.close()`` close the client's open sync consumers first, as the client closes
    its own consumers: a program that closes only its client (pulsar-client's examples do) then has its
    last acknowledgements sent (the sync face hands them to its loop thread, which would find the C++
    consumer closed under it: the messages came again) and no consumer thread failing behind it.
    Idempotent; a subclass that overrides ``close`` keeps its own. O(1)."""
    if pulsar.Client.close is _CLIENT_CLOSE:
        _close_consumers_first.__wrapped__ = _CLIENT_CLOSE  # type: ignore[attr-defined]  # (inspect, help())
        pulsar.Client.close = _close_consumers_first


def _check_listener(listener: object) -> None:
    """A ``message_listener`` must be callable as ``listener(consumer, msg)`` (the client's form): a
    ``TypeError`` here, at ``subscribe``, rather than one logged per message on the listener thread.
    A callable whose signature cannot be read (some builtins) is taken as it is."""
    if not callable(listener):
        raise TypeError(f"message_listener must be callable(consumer, msg), not {type(listener).__name__}")
    try:
        signature = inspect.signature(listener)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None, None)
    except TypeError:
        raise TypeError(f"message_listener must be callable as listener(consumer, msg), as pulsar-client "
                        f"calls it; {getattr(listener, '__qualname__', listener)!r} takes {signature}") from None


def _close_all() -> None:
    """At interpreter exit: close what the program left open (its loop threads are daemons; this lets
    their consumers hand back what they hold and save their snapshots first), then the ``pulsar.Client``
    objects those consumers came from. A client left open at exit is destroyed during interpreter
    finalization with its threads still running (SIGABRT or SIGSEGV: the plain client's consumer,
    interrupted in ``receive``, does it on every exit); closed here, the program ends as it meant to.
    The program is ending: nobody uses those clients after this."""
    clients: dict[int, pulsar.Client] = {}
    for consumer in list(_open):
        clients[id(consumer.client)] = consumer.client
        try:
            consumer.close()
        except Exception:  # exit goes on
            log.debug("closing %r at exit failed", consumer, exc_info=True)
    for client in clients.values():
        try:
            client.close()
        except Exception:  # already closed by the program, or the broker is gone: exit goes on
            log.debug("closing %r at exit failed", client, exc_info=True)


atexit.register(_close_all)
