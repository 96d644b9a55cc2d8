"""The boundary between the tracker and a Pulsar client.

The tracker decides *when*; an adapter decides *how* a due message gets back
to the consumer. Everything above this boundary is testable without a broker
(see :class:`~nacktracker.adapters.MemoryAdapter`); everything Pulsar-specific
lives below it (:class:`~nacktracker.adapters.PulsarAdapter`).
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from ..keys import MessageKey


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
    """

    async def redeliver(self, keys: Sequence[MessageKey]) -> None: ...
