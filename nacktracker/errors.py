"""Every exception nacktracker raises, in one tree.

``except nacktracker.NacktrackerError`` catches any of them; each is also the
built-in or Pulsar exception it stands for, so the ``except`` clauses a caller
already has (``ValueError``, ``TypeError``, ``RuntimeError``, ``ImportError``,
``pulsar.Timeout``, ``pulsar.AlreadyClosed``, ``pulsar.asyncio.PulsarException``)
keep working. The names are also importable from the modules that raise them.

| exception | raised when | also a |
|---|---|---|
| `NacktrackerError` | (the root) | `Exception` |
| `TrackerClosedError` | a nack reaches a closed tracker | `RuntimeError` |
| `SnapshotError` | snapshot bytes are foreign, truncated, corrupted or newer | `ValueError` |
| `AdapterError` | the failure `MemoryAdapter` injects | `RuntimeError` |
| `NotReceivedError` | an ack or nack of a message this consumer did not receive | `ValueError` |
| `TraceError` | a nack event log that cannot be used | `ValueError` |
| `MissingColumnError` | a required event-log column is absent | `TraceError` |
| `ColumnTypeError` | an event-log column has the wrong type | `TraceError`, `TypeError` |
| `BadValueError` | an event-log column holds a forbidden value | `TraceError` |
| `EmptyTraceError` | an event log with no events | `TraceError` |
| `MissingExtraError` | an optional dependency is missing | `ModuleNotFoundError` |
| `ExecutorCheckError` | Spark executors cannot run the job | `RuntimeError` |
| `BrokerStartError` | a test broker did not become ready | `RuntimeError` |
| `DeadLetterError` | a dead letter was not published | `RuntimeError` |
| `PropertyError` | a message property the consumer reads holds a value it refuses | `ValueError` |
| `LetterInFlightError` | a second letter call on a message whose letter is being published | `ValueError` |
| `ReceiveTimeout` | `receive(timeout_ms=...)` found no message | `pulsar.Timeout`, `pulsar.asyncio.PulsarException` |
| `ConsumerClosed` | a call on a closed consumer | `pulsar.AlreadyClosed`, `pulsar.asyncio.PulsarException` |
| `DeadLetterPublisherClosed` | a dead letter after its publisher closed | `pulsar.AlreadyClosed` |

The last three subclass pulsar-client's exceptions: they are made here on first
use (:func:`__getattr__`), so importing this module (or ``nacktracker``) needs
no pulsar-client. This module is the bottom of the house: it imports nothing of
nacktracker, and every room imports its exceptions from here.

The tree::

    NacktrackerError
    ├── TrackerClosedError, AdapterError, ExecutorCheckError, BrokerStartError, DeadLetterError (RuntimeError)
    ├── SnapshotError, NotReceivedError, PropertyError, LetterInFlightError (ValueError)
    ├── TraceError (ValueError)
    │   ├── MissingColumnError, BadValueError, EmptyTraceError
    │   └── ColumnTypeError (TypeError)
    ├── MissingExtraError (ModuleNotFoundError)
    ├── ReceiveTimeout (pulsar.Timeout, pulsar.asyncio.PulsarException)
    ├── ConsumerClosed (pulsar.AlreadyClosed, pulsar.asyncio.PulsarException)
    └── DeadLetterPublisherClosed (pulsar.AlreadyClosed)
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Optional

__all__ = ["NacktrackerError", "TrackerClosedError", "SnapshotError", "AdapterError", "NotReceivedError",
           "TraceError", "MissingColumnError", "ColumnTypeError", "BadValueError", "EmptyTraceError",
           "MissingExtraError", "ExecutorCheckError", "BrokerStartError", "DeadLetterError", "PropertyError",
           "LetterInFlightError", "ArgumentError",
           "ReceiveTimeout", "ConsumerClosed", "DeadLetterPublisherClosed"]


class NacktrackerError(Exception):
    """The root of every exception nacktracker raises."""


class TrackerClosedError(NacktrackerError, RuntimeError):
    """The tracker was closed; it accepts no more nacks."""


class SnapshotError(NacktrackerError, ValueError):
    """The bytes are not a snapshot this version can read: foreign, truncated,
    corrupted, or written by a newer format version. Nothing was loaded."""


class AdapterError(NacktrackerError, RuntimeError):
    """The failure :class:`~nacktracker.adapters.MemoryAdapter` injects by default."""


class NotReceivedError(NacktrackerError, ValueError):
    """An ack or nack of a message this consumer did not receive (another
    consumer's, or a made-up id): refused before it reaches the client, and
    nothing tracked changes. "Received" is what the consumer still knows: a
    message the application holds, one it acknowledged (remembered by
    ``dedup``), one with a pending or restored nack."""

    def __init__(self, key: object) -> None:
        super().__init__(f"{key} was not received by this consumer (another consumer's message, "
                         "or an id it never delivered): ack or nack it on the consumer that received it")


class TraceError(NacktrackerError, ValueError):
    """A nack event log that cannot be used; ``column`` names the culprit (or None)."""

    def __init__(self, message: str, column: Optional[str] = None) -> None:
        super().__init__(message)
        self.column = column


class MissingColumnError(TraceError):
    """A required column is absent."""


class ColumnTypeError(TraceError, TypeError):
    """A column has the wrong type (e.g. ``ledger_id`` stored as text)."""


class BadValueError(TraceError):
    """A column holds a value it may not: negative id, null, unknown kind."""


class EmptyTraceError(TraceError):
    """No events at all (or no files at the path)."""


class MissingExtraError(NacktrackerError, ModuleNotFoundError):
    """An optional dependency is missing; the message names the extra.

    A ``ModuleNotFoundError`` (so ``except ImportError`` still catches it)
    with ``extra`` set to the extra's name.
    """

    def __init__(self, feature: str, extra: str, module: Optional[str], hint: str = "") -> None:
        missing = f" (no module named {module!r})" if module else ""
        # not on a package index yet: what installs an extra is the checkout or a wheel built from it
        super().__init__(f"{feature} needs the {extra!r} extra{missing}: pip install '.[{extra}]' in the nacktracker "
                         f"checkout (or pip install 'nacktracker-<version>-py3-none-any.whl[{extra}]')"
                         + (f" ({hint})" if hint else ""), name=module)
        self.extra = extra


class ExecutorCheckError(NacktrackerError, RuntimeError):
    """The executors cannot run the job; the message is one line and names the fix."""


class BrokerStartError(NacktrackerError, RuntimeError):
    """A broker did not become ready; the message carries its log tail."""


class ArgumentError(NacktrackerError, TypeError, ValueError):
    """An argument of the wrong type where pulsar-client raises ``ValueError`` for it (its sync
    ``Client.subscribe`` and both clients' ``Consumer.seek``): a ``TypeError`` as nacktracker's own
    checks raise, and the ``ValueError`` code written for the client catches."""


class PropertyError(NacktrackerError, ValueError):
    """A message property the consumer reads (``RECONSUMETIMES``, ``DELAY_TIME``,
    ``REAL_TOPIC``, ``ORIGIN_MESSAGE_ID``) holds a value it refuses. ``name``:
    the property; ``value``: what it held (cut to 40 characters)."""

    def __init__(self, name: str, value: object, rule: str) -> None:
        shown = repr(value) if not isinstance(value, str) or len(value) <= 40 else repr(value[:40]) + "..."
        super().__init__(f"property {name}={shown}: {rule}")
        self.name = name
        self.value = value


class LetterInFlightError(NacktrackerError, ValueError):
    """A ``reconsume_later`` or ``dead_letter`` of a message whose retry or
    dead letter is still being published: one letter per message."""

    def __init__(self, key: object, call: str) -> None:
        super().__init__(f"{call}: a letter of {key} is being published already (one letter per message: await the "
                         "first call; the message is acknowledged once its letter is published)")


class DeadLetterError(NacktrackerError, RuntimeError):
    """A dead letter was not published (the cause is ``__cause__``): the
    message must stay pending. ``topic``: the dead-letter topic."""

    def __init__(self, topic: str, origin: str, reason: str) -> None:
        super().__init__(f"dead letter {origin} not published to {topic}: {reason}")
        self.topic = topic
        self.origin = origin


# -- the exceptions that are also pulsar-client's ----------------------------------------------------

#: The exceptions that subclass pulsar-client's: made by :func:`_pulsar_typed` on first use.
PULSAR_TYPED = ("ReceiveTimeout", "ConsumerClosed", "DeadLetterPublisherClosed")
_MAKING = threading.Lock()

if TYPE_CHECKING:  # what _pulsar_typed() makes, as type checkers and the API reference see it (a test
    # keeps the docstrings the same)
    import pulsar
    import pulsar.asyncio

    class ReceiveTimeout(pulsar.Timeout, pulsar.asyncio.PulsarException, NacktrackerError):  # type: ignore[misc]
        """``receive(timeout_ms=…)`` found no message in time.

        Both a ``pulsar.Timeout`` (what the sync client's ``receive(timeout_millis)``
        raises) and a ``pulsar.asyncio.PulsarException`` whose ``error()`` is
        ``pulsar.Result.Timeout`` (what the asyncio client raises), so either
        ``except`` clause a caller already has keeps working."""

        def __init__(self, msg: str = ...) -> None: ...

    class ConsumerClosed(pulsar.AlreadyClosed, pulsar.asyncio.PulsarException, NacktrackerError):  # type: ignore[misc]
        """The consumer was closed. A ``pulsar.AlreadyClosed`` and a
        ``pulsar.asyncio.PulsarException`` with ``pulsar.Result.AlreadyClosed``."""

        def __init__(self, msg: str = ...) -> None: ...

    class DeadLetterPublisherClosed(pulsar.AlreadyClosed, NacktrackerError):  # type: ignore[misc]
        """A dead or retry letter after its publisher closed (a ``pulsar.AlreadyClosed``)."""


def _pulsar_typed() -> dict[str, type[NacktrackerError]]:
    """Define the three Pulsar-typed exceptions (imports pulsar-client: called on first use only)."""
    import pulsar
    import pulsar.asyncio as pulsar_asyncio

    exception = pulsar_asyncio.PulsarException

    class ReceiveTimeout(pulsar.Timeout, exception, NacktrackerError):  # type: ignore[misc,valid-type]
        """``receive(timeout_ms=…)`` found no message in time.

        Both a ``pulsar.Timeout`` (what the sync client's ``receive(timeout_millis)``
        raises) and a ``pulsar.asyncio.PulsarException`` whose ``error()`` is
        ``pulsar.Result.Timeout`` (what the asyncio client raises), so either
        ``except`` clause a caller already has keeps working."""

        def __init__(self, msg: str = "no message received in time") -> None:
            exception.__init__(self, pulsar.Result.Timeout, msg)
            Exception.__init__(self, msg)

    class ConsumerClosed(pulsar.AlreadyClosed, exception, NacktrackerError):  # type: ignore[misc,valid-type]
        """The consumer was closed. A ``pulsar.AlreadyClosed`` and a
        ``pulsar.asyncio.PulsarException`` with ``pulsar.Result.AlreadyClosed``."""

        def __init__(self, msg: str = "consumer is closed") -> None:
            exception.__init__(self, pulsar.Result.AlreadyClosed, msg)
            Exception.__init__(self, msg)

    class DeadLetterPublisherClosed(pulsar.AlreadyClosed, NacktrackerError):  # type: ignore[misc]
        """A dead or retry letter after its publisher closed (a ``pulsar.AlreadyClosed``)."""

    made: dict[str, type[NacktrackerError]] = {
        "ReceiveTimeout": ReceiveTimeout, "ConsumerClosed": ConsumerClosed,
        "DeadLetterPublisherClosed": DeadLetterPublisherClosed}
    for name, cls in made.items():  # named where they are imported from (pickling, reprs, tracebacks)
        cls.__qualname__ = name
    return made


if not TYPE_CHECKING:  # type checkers see the declarations above

    def __getattr__(name: str) -> Any:
        if name in PULSAR_TYPED:  # (without pulsar-client: ModuleNotFoundError, as importing it would)
            with _MAKING:  # made once, also when two threads ask first: one class each, or `except` misses
                if name not in globals():
                    globals().update(_pulsar_typed())  # later lookups find them without this function
            return globals()[name]
        raise AttributeError(f"module 'nacktracker.errors' has no attribute {name!r}")
