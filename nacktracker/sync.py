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
  except the hot path: ``receive`` takes messages the loop set aside ahead of it
  (:data:`HANDOFF`), ``acknowledge`` hands its ack over without waiting.
* ``message_listener=callable(consumer, msg)``: a listener thread
  (``nacktracker-sync-listener``) receives and calls it, one message at a time, as the
  sync client calls its own; ``consumer`` is the :class:`SyncConsumer` (its acks and
  nacks go through the tracker).
* ``close()`` from any thread (the listener's too) stops both threads; a
  ``KeyboardInterrupt`` in ``receive`` cancels the waiting call (no message lost: it
  stays in the consumer's queue) and the threads are daemons: consumers left open are
  closed at interpreter exit, then their clients, so nothing is left running and the
  exit is clean. The cost: docs/design.md ("The synchronous face").
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import logging
import re
import threading
import weakref
from typing import Any, Awaitable, Callable, Optional, TypeVar, Union

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_asyncio

from .adapters.pulsar_layout import asyncio_client, raw_client
from .consumer.shell import TrackedConsumer
from .consumer.subscription import subscribe as subscribe_async
from .errors import ConsumerClosed

__all__ = ["subscribe", "SyncConsumer"]

log = logging.getLogger("nacktracker.sync")

T = TypeVar("T")
Listener = Callable[["SyncConsumer", pulsar.Message], None]

#: At most this many messages (and at most the consumer's ``prefetch``, which is this by default on the sync
#: face) wait here, taken from the loop ahead of the receives that will return them: those receives find
#: them without a thread hop (they count as received, as the client's queue does). None with an ack timeout
#: (its clock starts when the application gets the message: each receive takes its own on the loop).
HANDOFF = 64
#: Acks handed over while the loop took others less than this long ago wait for it to come back (no wake-up
#: of their own): the loop looks again after this long while acks keep coming. The client's own acks are
#: grouped for 100 ms before they are sent.
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
    """

    def __init__(self, runner: _LoopThread, tracked: TrackedConsumer, listener: Optional[Listener],
                 client: pulsar.Client) -> None:
        self._runner = runner
        self._client = client
        self._tracked = tracked
        self._closing = threading.Lock()
        self._closed = False
        self._listener = listener
        self._listening = threading.Event()  # cleared by pause_message_listener()
        self._listening.set()
        self._listener_thread: Optional[threading.Thread] = None
        # taken from the loop, in order; appended on the loop only, taken from in any thread
        self._ready: collections.deque[pulsar.Message] = collections.deque()
        opts = tracked.options
        self._handoff = 0 if opts.ack_timeout_ms else min(HANDOFF, opts.prefetch)  # the most _ready holds
        # a receive that leaves this many or fewer asks the loop, without waiting, to top _ready up again
        # (from what waits in the consumer already): a receiver that keeps up finds the next messages here
        self._refill_at = self._handoff // 2
        self._acks: list[Any] = []  # acknowledged here, not yet on the loop (see acknowledge)
        self._lock = threading.Lock()  # the hand-over to the loop: _acks and the three flags below
        self._acking = False  # an _ack_all runs on the loop: it takes every ack handed over meanwhile
        self._woken = False  # a _service call is queued on the loop
        self._refill = False  # a receive asked for a top-up of _ready (done by the next _service)
        self._taking = 0  # receives waiting on the loop for a message (_take): top-ups leave theirs to them
        self._topping = False  # a top-up runs on the loop
        self._gathering = False  # the loop looks for acks again soon (ACK_GATHER_S): no wake-up needed
        self.ack_failures = 0
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
        ready = self._ready
        try:
            msg = ready.popleft()  # taken from the loop before: no thread hop
        except IndexError:
            return self._call(lambda: self._take(timeout_millis))
        if len(ready) <= self._refill_at and not self._refill:
            self._ask_refill()
        return msg

    def _ask_refill(self) -> None:
        """Ask the loop to top the hand-off up (not waited for: the next receives find the messages)."""
        with self._lock:
            self._refill = True
            if self._woken:
                return
            self._woken = True
        try:
            self._runner.loop.call_soon_threadsafe(self._service)
        except RuntimeError:  # the loop closed meanwhile: the next receive raises ConsumerClosed
            pass

    def _service(self) -> None:
        """On the loop, once per wake-up from the callers' threads: start taking the acks handed over, and
        top the hand-off up if a receive asked."""
        with self._lock:
            self._woken = False
            refill, self._refill = self._refill, False
        self._start_acks()
        if refill and not self._topping and not self._closed:
            self._topping = True
            self._runner.loop.create_task(self._top_up())

    def _start_acks(self) -> None:
        """On the loop: take the acks handed over (an _ack_all), then look again in :data:`ACK_GATHER_S`."""
        with self._lock:
            ack = bool(self._acks) and not self._acking
            if ack:
                self._acking = True
            gather = ack and not self._gathering
            if gather:
                self._gathering = True
        if ack:
            self._runner.loop.create_task(self._ack_all())
        if gather:
            self._runner.loop.call_later(ACK_GATHER_S, self._gathered)

    def _gathered(self) -> None:
        with self._lock:
            self._gathering = False
        self._start_acks()

    def _move(self) -> int:
        """On the loop: move what waits in the consumer to ``_ready``, up to the hand-off's size; how many.
        Not while a receive waits on the loop (the message it waits for is its own)."""
        if self._taking or self._closed:
            return 0
        ready, tracked, most = self._ready, self._tracked, self._handoff
        moved = 0
        try:
            while len(ready) < most and (msg := tracked.receive_nowait()) is not None:
                ready.append(msg)
                moved += 1
        except Exception:  # closed or failed: the next receive that waits on the loop raises it
            log.debug("the hand-off stops: the consumer stopped", exc_info=True)
        return moved

    async def _top_up(self) -> None:
        """On the loop: fill ``_ready`` up to the hand-off's size from what the consumer has now, letting its
        pump take more from the client's queue in between; never waits for the broker."""
        try:
            while self._move() and len(self._ready) < self._handoff:
                await asyncio.sleep(0)  # the pump takes the next messages from the client's queue
        finally:
            self._topping = False

    async def _take(self, timeout_millis: Optional[int]) -> pulsar.Message:
        """On the loop: the next message (one that a top-up put in ``_ready`` meanwhile first), then a
        top-up."""
        ready = self._ready
        try:
            return ready.popleft()
        except IndexError:
            pass
        self._taking += 1
        try:
            first = await self._tracked.receive(timeout_millis)
        finally:
            self._taking -= 1
        self._move()
        return first

    def batch_receive(self) -> list[pulsar.Message]:
        """As ``pulsar.Consumer.batch_receive`` with ``batch_receive_policy`` (see
        :meth:`TrackedConsumer.batch_receive <nacktracker.TrackedConsumer.batch_receive>`)."""
        if self._ready:  # taken by receive() before: they come first
            batch = []
            while self._ready:
                try:
                    batch.append(self._ready.popleft())
                except IndexError:
                    break
            if batch:
                return batch
        return self._call(self._tracked.batch_receive)

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
        broker: the ack is handed to the loop, in order with every later call of this consumer. A
        wrong type or a closed consumer raises here; a failure on the way (the connection closed
        underneath) is logged and counted in ``stats()["sync_ack_failures"]``. O(1)."""
        if self._closed:
            raise ConsumerClosed()
        if not isinstance(message, ACKABLE):
            raise TypeError(f"acknowledge takes a pulsar.Message or pulsar.MessageId, not {type(message).__name__}")
        with self._lock:
            self._acks.append(message)
            if self._acking or self._woken or self._gathering:  # the loop takes it soon without a wake-up
                return
            self._woken = True
        try:
            self._runner.loop.call_soon_threadsafe(self._service)
        except RuntimeError:  # the loop closed meanwhile: closed
            raise ConsumerClosed() from None

    async def _ack_all(self) -> None:
        """On the loop: every ack handed over so far, in order (one runs at a time: ``_acking``)."""
        while True:
            with self._lock:
                acks, self._acks = self._acks, []
                if not acks:
                    self._acking = False
                    return
            for message in acks:
                try:
                    await self._tracked.acknowledge(message)
                except Exception:
                    self.ack_failures += 1
                    log.warning("acknowledge of %r failed", message, exc_info=True)

    def acknowledge_cumulative(self, message: Any) -> None:
        """As ``pulsar.Consumer.acknowledge_cumulative`` (not on Shared subscriptions). Messages taken from
        the loop by an earlier receive and covered by it are not handed out any more (the consumer
        drops them from its queue too)."""
        async def ack() -> None:
            await self._tracked.acknowledge_cumulative(message)
            ready = self._ready
            if ready and isinstance(message, pulsar.Message):  # on the loop: no top-up runs meanwhile
                upto, topic = message.message_id(), message.topic_name()
                kept = [m for m in list(ready) if m.topic_name() != topic or not m.message_id() <= upto]
                ready.clear()
                ready.extend(kept)
        self._call(ack)

    def negative_acknowledge(self, message: Any, delay_ms: Optional[int] = None) -> None:
        """Redeliver a Message (or its id) after ``delay_ms`` (default: the backoff for its redelivery count,
        else the consumer's ``delay_ms``), exactly at its due time with ``precision_bits=0``; dead-lettered
        once its count reaches ``max_redeliveries``. Never blocks on the broker."""
        self._call(lambda: self._tracked.negative_acknowledge(message, delay_ms))

    def reconsume_later(self, message: Any, delay_ms: Optional[int] = None,
                        properties: Optional[dict[str, str]] = None) -> None:
        """Java's ``reconsumeLater`` (needs ``enable_retry=True``): see docs/retries.md."""
        self._call(lambda: self._tracked.reconsume_later(message, delay_ms, properties))

    def dead_letter(self, message: Any, reason: str, exception: Optional[BaseException] = None) -> None:
        """A terminal nack: publish ``message`` to the dead-letter topic now, with ``reason``."""
        self._call(lambda: self._tracked.dead_letter(message, reason, exception))

    # -- the rest of the consumer API ------------------------------------------------

    def seek(self, messageid: Union[pulsar.Message, pulsar.MessageId, int]) -> None:
        """As the client's: the broker resends from there (what was taken here is dropped, as the
        client clears its queue)."""
        async def seek() -> None:
            await self._tracked.seek(messageid)
            self._ready.clear()  # on the loop: a top-up after this takes what the broker resends
        self._call(seek)

    def get_last_message_id(self) -> Any:
        return self._call(self._tracked.get_last_message_id)

    def redeliver_unacknowledged_messages(self) -> None:
        def redeliver() -> None:
            self._tracked.redeliver_unacknowledged_messages()
            self._ready.clear()  # the broker sends them again
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
            try:
                self._runner.call(lambda: self._close_after_acks(close))
            finally:
                self._runner.stop()
                _open.discard(self)
        thread = self._listener_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    async def _close_after_acks(self, close: Callable[[], Awaitable[None]]) -> None:
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


def subscribe(client: pulsar.Client, topic: Union[str, list[str], re.Pattern[str]], subscription: str, *,
              message_listener: Optional[Listener] = None, **options: Any) -> SyncConsumer:
    """Subscribe with a sync ``pulsar.Client`` and return a :class:`SyncConsumer`.

    ``options``: those of :func:`nacktracker.subscribe` (``delay_ms``, ``precision_bits``, ``backoff``,
    ``max_redeliveries``, ``dead_letter_topic``, ``enable_retry``, ``ack_timeout_ms``, ``snapshot_path``,
    ...) and pulsar-client's own subscribe options, checked the same way. ``topic``: a name, a list of
    names, or a compiled regex (a pattern subscription). ``message_listener``: called as
    ``message_listener(consumer, msg)`` on the consumer's listener thread.

    >>> client = pulsar.Client(url)                                           # doctest: +SKIP
    >>> consumer = nacktracker.sync.subscribe(client, "t", "sub", delay_ms=500)  # doctest: +SKIP
    >>> msg = consumer.receive()                                              # doctest: +SKIP
    >>> consumer.negative_acknowledge(msg, delay_ms=1000)                     # doctest: +SKIP
    """
    if not isinstance(client, pulsar.Client):
        if isinstance(client, pulsar_asyncio.Client):
            raise TypeError("nacktracker.sync.subscribe takes the synchronous pulsar.Client; "
                            "for a pulsar.asyncio.Client use nacktracker.subscribe")
        raise TypeError(f"client must be a pulsar.Client, not {type(client).__name__}")
    if message_listener is not None and not callable(message_listener):
        raise TypeError(f"message_listener must be callable(consumer, msg), not {type(message_listener).__name__}")
    if options.pop("pattern_auto_discovery_period", None) not in (None, 60):
        raise TypeError("pattern_auto_discovery_period is not supported (pulsar.asyncio has no such option)")
    if isinstance(topic, re.Pattern):
        topic = topic.pattern
        options["is_pattern_topic"] = True
    aclient = _asyncio_client(client)
    options.setdefault("prefetch", HANDOFF)  # what the hand-off takes at most (see HANDOFF)
    runner = _LoopThread()
    try:
        tracked = runner.call(lambda: subscribe_async(aclient, topic, subscription, **options))
    except BaseException:
        runner.stop()
        raise
    return SyncConsumer(runner, tracked, message_listener, client)


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
