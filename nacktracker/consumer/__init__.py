"""TrackedConsumer: a drop-in ``pulsar.asyncio.Consumer`` whose negative acks
go through :class:`~nacktracker.NegativeAcksTracker`.

A thin Pulsar shell over a pure delivery core, as aiokafka's consumer is a
thin front over ``Fetcher``/``SubscriptionState``:

* :mod:`.core` -- :class:`DeliveryCore`: which copy of which message surfaces
  now, is parked until its time, or is dropped; when a record may go. Pure
  (no pulsar, no clock, no I/O); model-tested in ``tests/test_consumer_core.py``.
* :mod:`.shell` -- :class:`TrackedConsumer`: the receive pump, ack/nack calls,
  the release timer on the tracker's clock.
* :mod:`.pump` -- the receive pump; :mod:`.release` -- the release timer.
* :mod:`.local` -- local redelivery on Exclusive/Failover subscriptions (glue to
  :class:`~nacktracker.adapters.LocalRedeliveryAdapter`).
* :mod:`.options` -- option checks and :func:`subscribe`.
* :mod:`.persist` -- snapshots (pending nacks and batch records across restarts).
* :mod:`.dead_letters` -- dead-letter publishing (one producer per dead-letter topic, in order).
* :mod:`.failures` -- retry letters (``reconsume_later``), terminal dead letters
  (``dead_letter``), ack timeouts and the consumer's own delivery counts, over
  :mod:`.retry_letters` (Java's names and properties, pure), :mod:`.retries`,
  :mod:`.ack_timeout` and :mod:`.counts` (pure); see ``docs/retries.md``.
* :mod:`.errors` -- the exceptions.

Only the core is imported eagerly: it needs no pulsar-client.
"""

from .core import DeliveryCore, Verdict

__all__ = ["TrackedConsumer", "subscribe", "ReceiveTimeout", "ConsumerClosed", "NotReceivedError", "DeliveryCore", "Verdict",
           "ConsumerOptions", "PROPERTY_REAL_TOPIC", "PROPERTY_REAL_SUBSCRIPTION", "PROPERTY_ORIGIN_MESSAGE_ID",
           "DeadLetterPublisher", "DeadLetterError", "BATCHES_SUFFIX",
           "COPY_OVERDUE_MS"]

_LAZY = {"TrackedConsumer": "shell", "COPY_OVERDUE_MS": "shell", "subscribe": "options",
         "ConsumerOptions": "options", "ReceiveTimeout": "errors", "ConsumerClosed": "errors",
         "NotReceivedError": "errors",
         "PROPERTY_REAL_TOPIC": "dead_letters", "PROPERTY_REAL_SUBSCRIPTION": "dead_letters",
         "PROPERTY_ORIGIN_MESSAGE_ID": "dead_letters", "DeadLetterPublisher": "dead_letters",
         "DeadLetterError": "dead_letters", "BATCHES_SUFFIX": "persist"}


def __getattr__(name: str):
    # The Pulsar shell imports pulsar-client; load it only when asked for.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nacktracker.consumer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
