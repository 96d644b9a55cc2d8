"""Receives and acks that skip ``pulsar.asyncio``'s round trip through the event loop.

``pulsar.asyncio`` completes every call through ``loop.call_soon_threadsafe``: one
wakeup of the event loop (a write to its self-pipe, a ``select``, a task step) per
``receive()`` and per ``acknowledge()``, although the C++ client calls back at once,
in the calling thread, when a message is already in its receiver queue (receive)
or acks are grouped (acknowledge; its default). :class:`DirectConsumer` takes such
an answer at once; only an answer that comes later, from the client's threads,
goes through a future as ``pulsar.asyncio`` does. Measured by
``bench/consume_throughput.py``.

Used only for a ``pulsar.asyncio.Consumer`` whose C++ consumer and schema
:mod:`~nacktracker.adapters.pulsar_layout` finds (pulsar-client 3.x; see
:meth:`DirectConsumer.of`); anything else goes through its public async methods.
"""

from __future__ import annotations

import asyncio
from threading import get_ident
from typing import Any, Awaitable, Optional, Union

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_asyncio

from ..adapters.pulsar_layout import consumer_schema, fill_message, raw_consumer, raw_message

__all__ = ["DirectConsumer", "ReceivedMessage", "acknowledge", "acknowledged", "message_length"]

_OK = _pulsar.Result.Ok


class ReceivedMessage(pulsar.Message):  # type: ignore[misc]  # pulsar-client has no type information
    """A ``pulsar.Message`` as the client's own wrapper makes it (its C++ message and schema:
    :func:`~nacktracker.adapters.pulsar_layout.fill_message`), plus its :class:`~nacktracker.keys.MessageKey`
    once the consumer has built it: a message's key is built once, on arrival, and its ack reuses it.

    On Exclusive and Failover a nacked message comes back from the consumer's memory, which the broker
    never sees: :meth:`redelivery_count` adds those hand-backs to the broker's count, as the broker's
    own redelivery would have counted them (the plain client's nack resends through the broker there)."""

    __slots__ = ("nacktracker_key", "local_redeliveries")

    def redelivery_count(self) -> int:
        """The broker's redelivery count plus the times this consumer handed the message back from its
        memory since it was received. O(1)."""
        count: int = super().redelivery_count()
        try:
            return count + self.local_redeliveries
        except AttributeError:  # never handed back (the slot is unset)
            return count

    def broker_redelivery_count(self) -> int:
        """The broker's redelivery count alone (``pulsar.Message.redelivery_count``). O(1)."""
        count: int = super().redelivery_count()
        return count

    def redelivered_locally(self, times: int) -> None:
        """This message was handed back from the consumer's memory ``times`` times in all. O(1)."""
        self.local_redeliveries = times


class _Call:
    """One call into the C++ consumer: its answer, taken at once when the
    client calls back during the call in this thread, else through a future."""

    __slots__ = ("answer", "value", "calling", "future", "loop", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: int) -> None:
        self.answer: Any = None  # the client's Result, once called back during the call
        self.value: Any = None
        self.calling = True
        self.future: Optional[asyncio.Future[Any]] = None
        self.loop, self.thread = loop, thread

    def done(self, result: Any, value: Any = None) -> None:
        """The client's callback: in the calling thread during the call, or
        later in one of the client's threads (or in this one, from another
        call into the client: e.g. a close that fails the pending receive)."""
        if self.calling and get_ident() == self.thread:
            self.answer, self.value = result, value
            return
        try:
            self.loop.call_soon_threadsafe(self._settle, result, value)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _settle(self, result: Any, value: Any) -> None:
        future = self.future
        if future is None or future.done():  # the waiter was cancelled (the pump stopped)
            return
        if result == _OK:
            future.set_result(value)
        else:
            future.set_exception(pulsar_asyncio.PulsarException(result))


class DirectConsumer:
    """The receive and acknowledge of one ``pulsar.asyncio.Consumer``, without a
    loop round trip when the client answers at once. Create it on the loop."""

    def __init__(self, consumer: pulsar_asyncio.Consumer) -> None:
        self._raw = raw_consumer(consumer)
        self._schema = consumer_schema(consumer)
        self._loop = asyncio.get_running_loop()
        self._thread = get_ident()

    @classmethod
    def of(cls, consumer: Any) -> Optional["DirectConsumer"]:
        """One for ``consumer`` if it is a ``pulsar.asyncio.Consumer`` laid out
        as this module expects (else ``None``: use its public methods)."""
        if type(consumer) is not pulsar_asyncio.Consumer:
            return None
        raw = raw_consumer(consumer)
        if not (callable(getattr(raw, "receive_async", None)) and callable(getattr(raw, "acknowledge_async", None))
                and consumer_schema(consumer) is not None):
            return None
        return cls(consumer)

    def receive(self) -> Union[ReceivedMessage, "asyncio.Future[Any]"]:
        """The next message if the client has one queued (no loop round trip),
        else a future of the client's message (pass its result to
        :meth:`wrap`). Raises ``PulsarException`` as ``receive()``. Cancelling
        the future loses the message it would have got to this consumer (it
        goes back to the subscription when the consumer closes), as
        cancelling ``receive()`` does: only the pump, stopping, does that."""
        call = _Call(self._loop, self._thread)
        try:
            self._raw.receive_async(call.done)
        finally:
            call.calling = False
        if call.answer is None:
            call.future = self._loop.create_future()
            return call.future
        if call.answer != _OK:
            raise pulsar_asyncio.PulsarException(call.answer)
        return self.wrap(call.value)

    def wrap(self, raw: Any) -> ReceivedMessage:
        """A client's message in the wrapper ``receive()`` would return."""
        msg = ReceivedMessage()
        fill_message(msg, raw, self._schema)
        msg.nacktracker_key = None
        return msg

    def acknowledge(self, message: pulsar.Message) -> Optional["asyncio.Future[None]"]:
        """Acknowledge a received message: ``None`` once the client accepted
        it during the call, else a future of its answer. Raises
        ``PulsarException`` as ``acknowledge()``."""
        # the same steps as receive(), written out on purpose: a shared helper would add a Python call
        # and an argument tuple to every receive and every ack (the hot path)
        call = _Call(self._loop, self._thread)
        try:
            self._raw.acknowledge_async(raw_message(message), call.done)
        finally:
            call.calling = False
        if call.answer is None:
            call.future = self._loop.create_future()
            return call.future
        if call.answer != _OK:
            raise pulsar_asyncio.PulsarException(call.answer)
        return None


def acknowledge(direct: Optional[DirectConsumer], consumer: Any, message: Any) -> Optional[Awaitable[None]]:
    """Acknowledge ``message``: through ``direct`` for a message it received
    (``None`` once accepted at once), else ``consumer.acknowledge(message)``
    (a coroutine to await)."""
    if direct is not None and type(message) is ReceivedMessage:
        return direct.acknowledge(message)
    waiting: Awaitable[None] = consumer.acknowledge(message)
    return waiting


async def acknowledged(direct: Optional[DirectConsumer], consumer: Any, message: Any) -> None:
    """:func:`acknowledge`, awaited: no loop iteration when the client accepts
    the ack during the call."""
    waiting = acknowledge(direct, consumer, message)
    if waiting is not None:
        await waiting


def message_length(msg: Any) -> int:
    """The payload bytes of a message, as the client counts them for batch receive limits: the C++
    message's ``length()`` (no copy) where there is one, else ``len(msg.data())``. O(1) for a
    received message."""
    try:
        raw = raw_message(msg)
    except AttributeError:
        raw = None
    if raw is not None and callable(getattr(raw, "length", None)):
        return int(raw.length())
    return len(msg.data())
