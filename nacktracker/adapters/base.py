"""The boundary between the tracker and a Pulsar client.

The tracker decides *when*; an adapter decides *how* a due message gets back
to the consumer. Everything above this boundary is testable without a broker
(see :class:`~nacktracker.adapters.MemoryAdapter`); everything Pulsar-specific
lives below it (:class:`~nacktracker.adapters.PulsarAdapter`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence, runtime_checkable

from ..keys import MessageKey

if TYPE_CHECKING:
    from .local import HandBack

__all__ = ["RedeliveryAdapter", "LearnsPathLatency", "KnowsTopics", "ReportsBursts", "RedeliversLocally",
           "ClosesAsync", "WaitsForSiblings", "NamesEntries"]


@runtime_checkable
class RedeliveryAdapter(Protocol):
    """Asks the broker to redeliver messages.

    ``redeliver(keys)``
        Called by the tracker once per timer fire with every entry that fell
        due (``batch_index`` is -1: Pulsar redelivers whole entries), never
        concurrently with itself. Return when the request has been handed to
        the client. Raise to report failure: the tracker logs it, keeps the
        keys and retries them with capped backoff; nothing is dropped.

    ``lead_ms`` (optional attribute, default 0)
        The known latency of the adapter's redelivery path, in ms. The
        tracker fires that much earlier so messages arrive on time.

    ``coalesce_ms`` (optional attribute, default 0)
        For a path that cannot take two calls close together (the Pulsar
        client's nack timer is re-armed by every nack): on each fire the
        tracker also hands over buckets due within this many ms, up to that
        much early, instead of leaving them to wait out the path's gap and
        arrive late.

    ``aclose()`` (optional)
        Release resources; called by the owner, not by the tracker.

    What a :class:`~nacktracker.TrackedConsumer` does with an adapter beyond
    this is declared by the capability protocols below; it checks for each
    with ``isinstance`` once, when it is made, and uses what the adapter has:
    :class:`LearnsPathLatency` (``arrived``, ``awaiting_arrivals``), :class:`KnowsTopics` (``multi_topic``),
    :class:`ReportsBursts` (``bursts``), :class:`WaitsForSiblings` (``sibling_held``, ``settle_waits``),
    :class:`NamesEntries` (``entries_of``) and :class:`RedeliversLocally` (the
    adapter keeps nacked messages and hands them back itself); ``aclose`` is
    :class:`ClosesAsync`.
    """

    async def redeliver(self, keys: Sequence[MessageKey]) -> None: ...


@runtime_checkable
class LearnsPathLatency(Protocol):
    """An adapter that measures its redelivery path from the copies the consumer receives
    (:class:`~nacktracker.adapters.PulsarAdapter`)."""

    @property
    def awaiting_arrivals(self) -> bool:
        """Whether an entry handed over still waits for its copy (else the consumer skips ``arrived``)."""
        ...

    def arrived(self, entry: MessageKey) -> None:
        """The consumer received a copy of ``entry`` (``batch_index`` -1)."""
        ...


@runtime_checkable
class KnowsTopics(Protocol):
    """An adapter that knows whether its consumer reads several topics (a bare message id
    names no topic there)."""

    multi_topic: bool


@runtime_checkable
class ReportsBursts(Protocol):
    """An adapter that sends due entries in bursts: ``(start ms, end ms, entries)`` of the
    recent ones (the consumer's ``stats()["bursts"]`` counts them)."""

    bursts: list[tuple[float, float, int]]


@runtime_checkable
class RedeliversLocally(Protocol):
    """An adapter that redelivers from the consumer's memory (Exclusive and Failover
    subscriptions, :class:`~nacktracker.adapters.LocalRedeliveryAdapter`): the consumer
    keeps each nacked message with it, and it hands them back through ``bind``'s path."""

    def bind(self, deliver: Callable[[Any], HandBack]) -> None: ...

    def keep(self, key: MessageKey, token: Any) -> None: ...

    def expect(self, key: MessageKey) -> None: ...

    def forget(self, key: MessageKey) -> bool: ...

    def forget_through(self, key: MessageKey) -> list[MessageKey]: ...

    def redeliveries(self, key: MessageKey) -> int: ...

    @property
    def stored(self) -> int: ...


@runtime_checkable
class ClosesAsync(Protocol):
    """An adapter with resources to release: its owner awaits ``aclose()`` (the tracker never does)."""

    async def aclose(self) -> None: ...


@runtime_checkable
class WaitsForSiblings(Protocol):
    """An adapter that holds a due batch entry back while the application holds another message of it
    (``sibling_held(entry)``, set by the consumer), and counts those waits (``stats()["settle_waits"]``)."""

    sibling_held: Optional[Callable[[MessageKey], bool]]
    settle_waits: int


@runtime_checkable
class NamesEntries(Protocol):
    """An adapter that asks the broker for entries: ``entries_of(entry)``, set by the consumer, names
    the entries a request for a due ``entry`` asks for (every chunk's entry for a chunked message:
    :mod:`nacktracker.consumer.chunks`); ``None``: the entry alone."""

    entries_of: Optional[Callable[[MessageKey], Sequence[MessageKey]]]
