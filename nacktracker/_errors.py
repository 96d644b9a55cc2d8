"""The definitions behind :mod:`nacktracker.errors` that need no pulsar-client
(the consumer's Pulsar-typed ones import the root from here: no import cycle)."""

from __future__ import annotations

from typing import Optional

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
