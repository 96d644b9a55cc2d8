"""The consumer's own exceptions: each is also the pulsar exception a caller
of the plain client already catches."""

from __future__ import annotations

import pulsar
import pulsar.asyncio as pulsar_asyncio

__all__ = ["ReceiveTimeout", "ConsumerClosed", "NotReceivedError"]

_PulsarException = pulsar_asyncio.PulsarException


class ReceiveTimeout(pulsar.Timeout, pulsar_asyncio.PulsarException):
    """``receive(timeout_ms=…)`` found no message in time.

    Both a ``pulsar.Timeout`` (what the sync client's ``receive(timeout_millis)``
    raises) and a ``pulsar.asyncio.PulsarException`` whose ``error()`` is
    ``pulsar.Result.Timeout`` (what the asyncio client raises), so either
    ``except`` clause a caller already has keeps working."""

    def __init__(self, msg: str = "no message received in time") -> None:
        _PulsarException.__init__(self, pulsar.Result.Timeout, msg)
        Exception.__init__(self, msg)


class ConsumerClosed(pulsar.AlreadyClosed, pulsar_asyncio.PulsarException):
    """The consumer was closed. A ``pulsar.AlreadyClosed`` and a
    ``pulsar.asyncio.PulsarException`` with ``pulsar.Result.AlreadyClosed``."""

    def __init__(self, msg: str = "consumer is closed") -> None:
        _PulsarException.__init__(self, pulsar.Result.AlreadyClosed, msg)
        Exception.__init__(self, msg)


class NotReceivedError(ValueError):
    """An ack or nack of a message this consumer did not receive (another
    consumer's, or a made-up id): refused before it reaches the client, and
    nothing tracked changes. "Received" is what the consumer still knows: a
    message the application holds, one it acknowledged (remembered by
    ``dedup``), one with a pending or restored nack."""

    def __init__(self, key: object) -> None:
        super().__init__(f"{key} was not received by this consumer (another consumer's message, "
                         "or an id it never delivered): ack or nack it on the consumer that received it")
