"""The exceptions that are also pulsar-client's: each is a
:class:`~nacktracker.errors.NacktrackerError` and the pulsar exception a caller of
the plain client already catches (the whole tree: :mod:`nacktracker.errors`)."""

from __future__ import annotations

import pulsar
import pulsar.asyncio as pulsar_asyncio

from .._errors import DeadLetterError, NacktrackerError, NotReceivedError

__all__ = ["ReceiveTimeout", "ConsumerClosed", "NotReceivedError", "DeadLetterError", "DeadLetterPublisherClosed"]

_PulsarException = pulsar_asyncio.PulsarException


# pulsar-client has no type information: its classes are Any to mypy
class ReceiveTimeout(pulsar.Timeout, pulsar_asyncio.PulsarException, NacktrackerError):  # type: ignore[misc]
    """``receive(timeout_ms=…)`` found no message in time.

    Both a ``pulsar.Timeout`` (what the sync client's ``receive(timeout_millis)``
    raises) and a ``pulsar.asyncio.PulsarException`` whose ``error()`` is
    ``pulsar.Result.Timeout`` (what the asyncio client raises), so either
    ``except`` clause a caller already has keeps working."""

    def __init__(self, msg: str = "no message received in time") -> None:
        _PulsarException.__init__(self, pulsar.Result.Timeout, msg)
        Exception.__init__(self, msg)


class ConsumerClosed(pulsar.AlreadyClosed, pulsar_asyncio.PulsarException, NacktrackerError):  # type: ignore[misc]
    """The consumer was closed. A ``pulsar.AlreadyClosed`` and a
    ``pulsar.asyncio.PulsarException`` with ``pulsar.Result.AlreadyClosed``."""

    def __init__(self, msg: str = "consumer is closed") -> None:
        _PulsarException.__init__(self, pulsar.Result.AlreadyClosed, msg)
        Exception.__init__(self, msg)


class DeadLetterPublisherClosed(pulsar.AlreadyClosed, NacktrackerError):  # type: ignore[misc]
    """``publish`` after :meth:`DeadLetterPublisher.close` (a ``pulsar.AlreadyClosed``)."""
