"""Dead letters: publish a message to its dead-letter topic, Pulsar's way."""

from __future__ import annotations

import logging
import re
from typing import Any, Awaitable, Callable, Optional

__all__ = ["DeadLetters", "PROPERTY_REAL_TOPIC", "PROPERTY_ORIGIN_MESSAGE_ID", "java_id"]

log = logging.getLogger(__name__)

#: Dead-letter message properties, named as Pulsar's Java client names them.
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
_PARTITION_SUFFIX = re.compile(r"-partition-\d+$")


class DeadLetters:
    """One producer per dead-letter topic, made on first use.

    ``topic``: the dead-letter topic, or ``None`` for Pulsar's default
    ``<topic>-<subscription>-DLQ`` per original topic. ``producers`` is the
    cache (a broken producer is dropped and made afresh next time)."""

    def __init__(self, client: Any, subscription: str, topic: Optional[str]) -> None:
        self._client = client
        self._subscription = subscription
        self.topic = topic
        self.producers: dict[str, Any] = {}
        self.published = self.failed = 0
        #: The message being nacked: the tracker's dead-letter hook gets only its key.
        self.candidate: Any = None

    def hook(self, ack: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Any]:
        """The tracker's ``on_dead_letter``: publish the message being nacked,
        then ``ack`` it. Raising leaves the message pending (the tracker
        redelivers it and the next nack tries again)."""

        def on_dead_letter(key: Any) -> Any:
            message = self.candidate
            if not callable(getattr(message, "data", None)):
                raise TypeError(f"cannot dead-letter {key}: only a Message carries its payload")
            return self._publish_then_ack(message, ack)

        return on_dead_letter

    async def _publish_then_ack(self, message: Any, ack: Callable[[Any], Awaitable[None]]) -> None:
        await self.publish(message)
        await ack(message)

    async def publish(self, message: Any) -> None:
        """Publish ``message`` with its key, properties and event time plus
        ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID``. Raises if it fails (the
        caller keeps the message pending)."""
        topic = message.topic_name()
        target = self.topic or f"{_PARTITION_SUFFIX.sub('', topic)}-{self._subscription}-DLQ"
        properties = dict(message.properties())
        properties[PROPERTY_REAL_TOPIC] = topic
        properties[PROPERTY_ORIGIN_MESSAGE_ID] = java_id(message.message_id())
        options: dict[str, Any] = {"properties": properties}
        if message.partition_key():
            options["partition_key"] = message.partition_key()
        if message.ordering_key():
            options["ordering_key"] = message.ordering_key()
        if message.event_timestamp():
            options["event_timestamp"] = message.event_timestamp()
        try:
            producer = self.producers.get(target)
            if producer is None:
                producer = self.producers[target] = await self._client.create_producer(target)
            await producer.send(message.data(), **options)
        except Exception:
            self.failed += 1
            broken = self.producers.pop(target, None)  # a fresh producer next time
            if broken is not None:
                await quietly(broken.close())
            raise
        self.published += 1

    async def aclose(self) -> None:
        for producer in self.producers.values():
            await quietly(producer.close())
        self.producers.clear()


def java_id(mid: Any) -> str:
    """``ledger:entry:partition[:batch]``, the Java client's MessageId.toString()."""
    text = f"{mid.ledger_id()}:{mid.entry_id()}:{mid.partition()}"
    return text if mid.batch_index() < 0 else f"{text}:{mid.batch_index()}"


async def quietly(awaitable: Any) -> None:
    try:
        await awaitable
    except Exception as exc:  # closing something already closed or broken
        log.debug("ignored while closing: %r", exc)
