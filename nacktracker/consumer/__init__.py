"""TrackedConsumer: a drop-in ``pulsar.asyncio.Consumer`` whose negative acks
go through :class:`~nacktracker.NegativeAcksTracker`.

A thin Pulsar shell over a pure delivery core, as aiokafka's consumer is a
thin front over ``Fetcher``/``SubscriptionState``:

* :mod:`.core` -- :class:`DeliveryCore`: which copy of which message surfaces
  now, is parked until its time, or is dropped; when a record may go. Pure
  (no pulsar, no clock, no I/O); model-tested in ``tests/consumer/test_consumer_core.py``.
* :mod:`.shell` -- :class:`TrackedConsumer`: the receive pump, ack/nack calls,
  the release timer on the tracker's clock.
* :mod:`.pump` -- the receive pump; :mod:`.release` -- the release timer.
* :mod:`.local` -- local redelivery on Exclusive/Failover subscriptions (glue to
  :class:`~nacktracker.adapters.LocalRedeliveryAdapter`).
* :mod:`.subscription` -- :func:`subscribe`; :mod:`.options` -- the consumer's options and
  their checks; :mod:`.ids` -- message ids (keys of what the application passes, seek targets).
* :mod:`.persist` -- snapshots (pending nacks and batch records across restarts).
* :mod:`.dead_letters` -- dead-letter publishing (one producer per dead-letter topic, in order).
* :mod:`.failures` -- retry letters (``reconsume_later``), terminal dead letters
  (``dead_letter``), ack timeouts and the consumer's own delivery counts, over
  :mod:`.retry_letters` (Java's names and properties, pure), :mod:`.retries`,
  :mod:`.ack_timeout` and :mod:`.counts` (pure); see ``docs/retries.md``.
* :mod:`.errors` -- the exceptions that are also pulsar-client's (all of them: :mod:`nacktracker.errors`).

Only the core is imported eagerly: it needs no pulsar-client.
"""

from typing import TYPE_CHECKING

from .core import DeliveryCore, Verdict

if TYPE_CHECKING:  # what __getattr__ loads on first use, as type checkers see it
    from .dead_letters import (PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_REAL_SUBSCRIPTION, PROPERTY_REAL_TOPIC,
                               DeadLetterPublisher)
    from .errors import ConsumerClosed, DeadLetterError, NotReceivedError, ReceiveTimeout
    from .options import ConsumerOptions
    from .persist import BATCHES_SUFFIX
    from .shell import COPY_OVERDUE_MS, TrackedConsumer
    from .subscription import ClientSubscribeOptions, subscribe

__all__ = ["TrackedConsumer", "subscribe", "ReceiveTimeout", "ConsumerClosed", "NotReceivedError", "DeliveryCore", "Verdict",
           "ConsumerOptions", "ClientSubscribeOptions", "PROPERTY_REAL_TOPIC", "PROPERTY_REAL_SUBSCRIPTION",
           "PROPERTY_ORIGIN_MESSAGE_ID", "DeadLetterPublisher", "DeadLetterError", "BATCHES_SUFFIX",
           "COPY_OVERDUE_MS"]

_LAZY = {"TrackedConsumer": "shell", "COPY_OVERDUE_MS": "shell", "subscribe": "subscription",
         "ClientSubscribeOptions": "subscription", "ConsumerOptions": "options", "ReceiveTimeout": "errors",
         "ConsumerClosed": "errors", "NotReceivedError": "errors",
         "PROPERTY_REAL_TOPIC": "dead_letters", "PROPERTY_REAL_SUBSCRIPTION": "dead_letters",
         "PROPERTY_ORIGIN_MESSAGE_ID": "dead_letters", "DeadLetterPublisher": "dead_letters",
         "DeadLetterError": "errors", "BATCHES_SUFFIX": "persist"}

if not TYPE_CHECKING:  # type checkers see the imports above instead: every name resolves to what it is

    def __getattr__(name: str) -> object:
        # The Pulsar shell imports pulsar-client; load it only when asked for.
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'nacktracker.consumer' has no attribute {name!r}")
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{module}"), name)
