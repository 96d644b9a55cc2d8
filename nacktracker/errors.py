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

The last three subclass pulsar-client's exceptions, so they are defined in
:mod:`nacktracker.consumer.errors` and loaded from here on first use: importing
this module (or ``nacktracker``) needs no pulsar-client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import (AdapterError, BadValueError, BrokerStartError, ColumnTypeError, DeadLetterError,
                      EmptyTraceError, ExecutorCheckError, LetterInFlightError, MissingColumnError, MissingExtraError,
                      NacktrackerError, NotReceivedError, PropertyError, SnapshotError, TraceError,
                      TrackerClosedError)

if TYPE_CHECKING:
    from .consumer.errors import ConsumerClosed, DeadLetterPublisherClosed, ReceiveTimeout

__all__ = ["NacktrackerError", "TrackerClosedError", "SnapshotError", "AdapterError", "NotReceivedError",
           "TraceError", "MissingColumnError", "ColumnTypeError", "BadValueError", "EmptyTraceError",
           "MissingExtraError", "ExecutorCheckError", "BrokerStartError", "DeadLetterError", "PropertyError",
           "LetterInFlightError",
           "ReceiveTimeout", "ConsumerClosed", "DeadLetterPublisherClosed"]

#: The exceptions that subclass pulsar-client's: defined beside the consumer, loaded on first use.
_PULSAR_ERRORS = frozenset({"ReceiveTimeout", "ConsumerClosed", "DeadLetterPublisherClosed"})

if not TYPE_CHECKING:  # type checkers see the imports above

    def __getattr__(name: str) -> type[NacktrackerError]:
        if name in _PULSAR_ERRORS:
            from .consumer import errors

            cls: type[NacktrackerError] = getattr(errors, name)
            return cls
        raise AttributeError(f"module 'nacktracker.errors' has no attribute {name!r}")
