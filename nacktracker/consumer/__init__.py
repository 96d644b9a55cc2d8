"""TrackedConsumer: a drop-in ``pulsar.asyncio.Consumer`` whose negative acks
go through :class:`~nacktracker.NegativeAcksTracker`.

A thin Pulsar shell over a pure delivery core, as aiokafka's consumer is a
thin front over ``Fetcher``/``SubscriptionState``:

* :mod:`.core` -- :class:`DeliveryCore`: which copy of which message surfaces
  now, is parked until its time, or is dropped; when a record may go. Pure
  (no pulsar, no clock, no I/O); model-tested in ``tests/consumer/test_consumer_core.py``.
* :mod:`.shell` -- :class:`TrackedConsumer`, and where the consumer is assembled (its
  constructor; the "who calls what" table atop the module).
* :mod:`.pump` -- the receive pump; :mod:`.release` -- the release timer;
  :mod:`.deadlines` -- the one lazy-deletion deadline heap every timer uses.
* :mod:`.local` -- local redelivery on Exclusive/Failover subscriptions (glue to
  :class:`~nacktracker.adapters.LocalRedeliveryAdapter`).
* :mod:`.subscription` -- :func:`subscribe`; :mod:`.options` -- :class:`ConsumerOptions`, the one
  options object; :mod:`.ids` -- every key the consumer derives (received messages, what the
  application passes, seek targets).
* :mod:`.persist` -- snapshots (pending nacks and batch records across restarts).
* :mod:`.letters` -- dead and retry letters: the ordered publisher, Java's names and properties,
  ``reconsume_later`` and ``dead_letter``, the letters in flight.
* :mod:`.failures` -- the failure side joined: letter calls, ack timeouts (:mod:`.ack_timeout`),
  the consumer's own delivery counts (:mod:`.counts`), early retry copies held until due;
  see ``docs/retries.md``.

The exceptions live in :mod:`nacktracker.errors` (re-exported here). Nothing is imported
eagerly: the Pulsar shell loads pulsar-client on first use of a name below.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what __getattr__ loads on first use, as type checkers see it
    from ..errors import ConsumerClosed, DeadLetterError, NotReceivedError, ReceiveTimeout
    from .letters.publisher import (
        PROPERTY_ORIGIN_MESSAGE_ID,
        PROPERTY_REAL_SUBSCRIPTION,
        PROPERTY_REAL_TOPIC,
        DeadLetterPublisher,
    )
    from .options import ConsumerOptions
    from .shell import TrackedConsumer
    from .subscription import ClientSubscribeOptions, subscribe

#: The public names (the internals, e.g. the delivery core, are imported from their modules).
__all__ = ["TrackedConsumer", "subscribe", "ReceiveTimeout", "ConsumerClosed", "NotReceivedError",
           "DeadLetterError", "ConsumerOptions", "ClientSubscribeOptions", "PROPERTY_REAL_TOPIC",
           "PROPERTY_REAL_SUBSCRIPTION", "PROPERTY_ORIGIN_MESSAGE_ID", "DeadLetterPublisher"]

_LAZY = {"TrackedConsumer": ".shell", "subscribe": ".subscription", "ClientSubscribeOptions": ".subscription",
         "ConsumerOptions": ".options", "ReceiveTimeout": "..errors", "ConsumerClosed": "..errors",
         "NotReceivedError": "..errors", "DeadLetterError": "..errors",
         "PROPERTY_REAL_TOPIC": ".letters.publisher", "PROPERTY_REAL_SUBSCRIPTION": ".letters.publisher",
         "PROPERTY_ORIGIN_MESSAGE_ID": ".letters.publisher", "DeadLetterPublisher": ".letters.publisher"}

if not TYPE_CHECKING:  # type checkers see the imports above instead: every name resolves to what it is

    def __getattr__(name: str) -> object:
        # The Pulsar shell imports pulsar-client; load it only when asked for.
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'nacktracker.consumer' has no attribute {name!r}")
        import importlib

        return getattr(importlib.import_module(module, __name__), name)
