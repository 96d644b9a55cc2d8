"""Dead letters as Pulsar's Java client publishes them: one producer per
dead-letter topic per consumer, published in the order they were decided.

Part of the consumer's Pulsar shell (it imports pulsar). The consumer makes
one :class:`DeadLetterPublisher` and, when the tracker decides a message is
dead, calls :meth:`DeadLetterPublisher.publish` *at that moment* (a plain
call: it takes the message's place in the order there and then) and awaits
the future it returns before acknowledging the message; a future that raises
:class:`DeadLetterError` means nothing was published and the message must stay
pending. :meth:`DeadLetterPublisher.close` publishes what is already queued
(each caller learns its own outcome), then closes the producers.

What matches Java's ``ConsumerImpl`` / ``DeadLetterPolicy`` (pulsar-client
3.x), and why:

* **Topic**: ``dead_letter_topic`` if given, else ``<topic>-<subscription>-DLQ``
  where ``<topic>`` is the message's own topic: for a partitioned topic that
  is the partition (``…-partition-N-<subscription>-DLQ``), as Java, whose
  dead-letter policy lives in the per-partition consumer.
* **One producer per dead-letter topic**, created once even when many dead
  letters arrive together: dead letters go through one queue drained by one
  task, so the first one creates the producer and the others find it (Java
  guards it with a shared future; Pulsar's
  ``testCloseDeadLetterTopicProducerOnExceptionToPreventProducerLeak`` bounds
  it at one). A producer whose send failed is closed and replaced on the next
  dead letter (no leak, no reuse of a broken one).
* **Producer name** ``<topic>-<subscription>-<consumerName>-<5 random
  alphanumerics>-DLQ``, ``<topic>`` being that of the dead letter that made
  the producer (Java's per-partition consumers each have their own; here one
  producer serves a given ``dead_letter_topic`` for every partition); batching
  off and chunking on (Java's ``enableBatching(false)``, ``enableChunking(true)``):
  a dead or retry letter of a chunked message, larger than the broker's
  ``maxMessageSize``, goes out in chunks and arrives whole (a smaller one goes
  out as it is).
* **Initial subscription** (``initial_subscription``, Java's
  ``initialSubscriptionName``): created on the dead-letter topic before its
  first dead letter is published, so it retains every one of them. The Python
  client cannot pass it with the producer, so a consumer subscribes (Shared,
  from the earliest message) and closes: the durable subscription stays.
* **Message**: the original payload bytes, unchanged, under the consumer's
  schema (``schema``: the producer declares its schema info, as Java's
  ``AUTO_PRODUCE_BYTES``); its properties, plus ``REAL_TOPIC``,
  ``REAL_SUBSCRIPTION`` and ``ORIGIN_MESSAGE_ID`` (``ledger:entry:partition
  [:batch]``, Java's ``MessageId.toString()``) where absent (Java's
  ``putIfAbsent``: a message already dead-lettered once keeps its origin);
  key, ordering key and event time when set.

Order: dead letters are published one at a time in the order ``publish`` was
called (one broker round trip each; dead letters are rare, order comes
first). A failed one does not hold back the next; it comes back later through
the tracker, after the others.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
import secrets
import string
from dataclasses import dataclass
from typing import Any, Optional, Union

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_asyncio
import pulsar.schema

from ...errors import DeadLetterError, DeadLetterPublisherClosed

__all__ = ["DeadLetterPublisher", "DeadLetterError", "DeadLetterPublisherClosed", "dead_letter_topic",
           "producer_name", "java_message_id", "quietly", "PROPERTY_REAL_TOPIC", "PROPERTY_REAL_SUBSCRIPTION", "PROPERTY_ORIGIN_MESSAGE_ID"]

log = logging.getLogger(__name__)

#: Dead-letter message properties, named as Pulsar's Java client names them.
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_SUBSCRIPTION = "REAL_SUBSCRIPTION"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
_ALPHANUMERIC = string.ascii_letters + string.digits
#: What a refused producer, send or subscribe raises: the sync and the asyncio client's own
#: classes, a lost connection, a timeout.
_PULSAR_ERRORS = (pulsar.PulsarException, pulsar_asyncio.PulsarException, OSError, asyncio.TimeoutError)

Message = Union[pulsar.Message, _pulsar.Message]


def dead_letter_topic(source_topic: str, subscription: str) -> str:
    """Java's default dead-letter topic of a message from ``source_topic``
    (a partition's name keeps its ``-partition-N``).

    >>> dead_letter_topic("persistent://public/default/t-partition-2", "sub")
    'persistent://public/default/t-partition-2-sub-DLQ'
    """
    return f"{source_topic}-{subscription}-DLQ"


def producer_name(source_topic: str, subscription: str, consumer_name: str, kind: str = "DLQ") -> str:
    """Java's dead-letter producer name: ``<topic>-<subscription>-<consumerName>-<5 random>-DLQ``
    (``kind="RETRY"``: the same shape for a retry-letter producer)."""
    return f"{source_topic}-{subscription}-{consumer_name}-{random_name()}-{kind}"


def random_name() -> str:
    """Five random alphanumerics: a producer suffix; a name for an unnamed consumer (as Java's)."""
    return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(5))


def java_message_id(mid: Any) -> str:
    """``ledger:entry:partition[:batch]``, the Java client's ``MessageId.toString()``."""
    text = f"{mid.ledger_id()}:{mid.entry_id()}:{mid.partition()}"
    return text if mid.batch_index() < 0 else f"{text}:{mid.batch_index()}"


class _RawBytes(pulsar.schema.Schema):  # type: ignore[misc]  # pulsar-client: untyped
    """Declares another schema's info but sends payload bytes as they are
    (Java's ``Schema.AUTO_PRODUCE_BYTES``): a dead letter is the original
    bytes, never decoded and re-encoded."""

    def __init__(self, schema: pulsar.schema.Schema) -> None:
        self._record_cls = bytes
        self._schema_info = schema.schema_info()

    def encode(self, obj: bytes) -> bytes:
        return obj

    def decode(self, data: bytes) -> bytes:
        return data


@dataclass
class _Letter:
    """One queued dead letter: what to send where, and its caller's future."""

    source_topic: str
    target: str
    origin: str
    payload: bytes
    options: dict[str, Any]
    done: asyncio.Future[None]


class DeadLetterPublisher:
    """One consumer's dead-letter producers.

    ``client``: the ``pulsar.asyncio.Client`` the consumer came from;
    ``subscription``, ``consumer_name``: the consumer's (they name the topic,
    the producer and ``REAL_SUBSCRIPTION``); ``dead_letter_topic``: one topic
    for every dead letter (default: per source topic, see
    :func:`dead_letter_topic`); ``initial_subscription``: created on each
    dead-letter topic before its first dead letter; ``schema``: the
    consumer's schema (default bytes); ``send_timeout_ms``: per dead letter.
    Use inside the event loop that runs the consumer.
    """

    def __init__(self, client: pulsar_asyncio.Client, *, subscription: str, consumer_name: str,
                 dead_letter_topic: Optional[str] = None, initial_subscription: Optional[str] = None,
                 schema: Optional[pulsar.schema.Schema] = None, send_timeout_ms: int = 30_000,
                 kind: str = "DLQ") -> None:
        if not isinstance(client, pulsar_asyncio.Client):
            raise TypeError(f"client must be a pulsar.asyncio.Client, not {type(client).__name__}")
        for name, value, optional in (("subscription", subscription, False), ("consumer_name", consumer_name, False),
                                      ("dead_letter_topic", dead_letter_topic, True),
                                      ("initial_subscription", initial_subscription, True)):
            if (value is not None or not optional) and not isinstance(value, str):
                raise TypeError(f"{name} must be a str, not {type(value).__name__}")
            if isinstance(value, str) and not value:
                raise ValueError(f"{name} must not be empty")
        if schema is not None and not isinstance(schema, pulsar.schema.Schema):
            raise TypeError(f"schema must be a pulsar.schema.Schema, not {type(schema).__name__}")
        if isinstance(send_timeout_ms, bool) or not isinstance(send_timeout_ms, int) or send_timeout_ms <= 0:
            raise ValueError(f"send_timeout_ms must be a positive int, got {send_timeout_ms!r}")
        self._client = client
        self.subscription = subscription
        self.consumer_name = consumer_name
        self.dead_letter_topic = dead_letter_topic
        self.initial_subscription = initial_subscription
        self._schema = _RawBytes(schema or pulsar.schema.BytesSchema())
        self._send_timeout_ms = send_timeout_ms
        self.kind = kind  # "DLQ", or "RETRY" for the retry-letter producer (names only)
        self._producers: dict[str, pulsar_asyncio.Producer] = {}  # dead-letter topic -> its producer
        self._subscribed: set[str] = set()  # topics whose initial subscription exists
        self._queue: collections.deque[_Letter] = collections.deque()
        self._drainer: Optional[asyncio.Task[None]] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._closed = False
        self._counts = {"published": 0, "failed": 0, "producers_created": 0}

    # -- the interface the consumer calls ------------------------------------------

    def topic_for(self, source_topic: str) -> str:
        """The dead-letter topic of a message from ``source_topic``. O(1)."""
        return self.dead_letter_topic or dead_letter_topic(source_topic, self.subscription)

    def publish(self, message: Message, *, properties: Optional[dict[str, str]] = None,
                deliver_after_ms: Optional[int] = None) -> "asyncio.Future[pulsar.MessageId]":
        """Queue ``message`` as a dead letter; its place in the order is taken
        by this call. ``properties``: send these instead of the message's own
        plus the dead-letter ones (retry letters, terminal dead letters: see
        :mod:`.java`); ``deliver_after_ms``: the broker's delayed
        delivery (retry letters). Returns a future: the dead letter's id once published,
        or :class:`DeadLetterError` (nothing published: keep the message
        pending). Raises :class:`DeadLetterPublisherClosed` after
        :meth:`close`, ``TypeError`` for anything but a received Message,
        ``RuntimeError`` outside the publisher's event loop thread.
        Cancelling the future withdraws a dead letter not yet handed to the
        producer. Runtime: O(properties) now, one broker round trip later."""
        if not isinstance(message, (pulsar.Message, _pulsar.Message)):
            raise TypeError(f"a dead letter must be a received pulsar Message (it carries the payload), "
                            f"not {type(message).__name__}")
        loop = self._check_loop()
        if self._closed:
            raise DeadLetterPublisherClosed("dead-letter publisher is closed")
        source = message.topic_name()
        origin = java_message_id(message.message_id())
        if properties is None:
            properties = dict(message.properties())
            properties.setdefault(PROPERTY_REAL_TOPIC, source)
            properties.setdefault(PROPERTY_REAL_SUBSCRIPTION, self.subscription)
            properties.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, origin)
        options: dict[str, Any] = {"properties": properties}
        if deliver_after_ms:
            options["deliver_after"] = datetime.timedelta(milliseconds=deliver_after_ms)
        if message.partition_key():
            options["partition_key"] = message.partition_key()
        if message.ordering_key():
            options["ordering_key"] = message.ordering_key()
        if message.event_timestamp():
            options["event_timestamp"] = message.event_timestamp()
        done = loop.create_future()
        self._queue.append(_Letter(source, self.topic_for(source), origin, message.data(), options, done))
        if self._drainer is None or self._drainer.done():
            self._drainer = loop.create_task(self._drain(), name="nacktracker-dead-letters")
        return done

    async def open(self, source_topic: str) -> None:
        """Create the producer for messages from ``source_topic`` now, before the
        first letter (a retry's due time counts from its publish time: the
        first must not wait for a producer). Call before anything is published."""
        loop = self._check_loop()
        await self._producer(_Letter(source_topic, self.topic_for(source_topic), "", b"", {}, loop.create_future()))

    async def close(self) -> None:
        """Publish what is queued (each caller's future gets its outcome),
        then close every producer. Idempotent; ``publish`` raises after it.
        Runtime: one round trip per queued dead letter (each bounded by
        ``send_timeout_ms``), plus one per producer."""
        self._closed = True
        if self._drainer is not None:
            await asyncio.gather(self._drainer, return_exceptions=True)
        producers, self._producers = list(self._producers.values()), {}
        for producer in producers:
            await quietly(producer.close())

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pending(self) -> int:
        """Dead letters queued and not yet published or failed. Runtime: O(queued)."""
        return sum(1 for letter in self._queue if not letter.done.done())

    def producer_for(self, target: str) -> Optional[pulsar_asyncio.Producer]:
        """The open producer of dead-letter topic ``target``, if any. Runtime: O(1)."""
        return self._producers.get(target)

    def stats(self) -> dict[str, int]:
        """``published``, ``failed``, ``producers_created``, ``producers_open``, ``pending``.
        Runtime: O(queued)."""
        return {**self._counts, "producers_open": len(self._producers), "pending": self.pending}

    # -- internals -------------------------------------------------------------------

    def _check_loop(self) -> asyncio.AbstractEventLoop:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("DeadLetterPublisher.publish must be called inside the consumer's event loop "
                               "(from another thread, use loop.call_soon_threadsafe)") from None
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise RuntimeError("DeadLetterPublisher.publish called from another event loop than its first call")
        return loop

    async def _drain(self) -> None:
        """Publish queued dead letters one at a time, in order, until none is
        left. Cancelled (the loop shutting down) or broken by an unexpected
        error (logged): every letter still queued fails, so no caller waits
        forever."""
        try:
            while self._queue:
                letter = self._queue[0]
                if not letter.done.done():  # a cancelled future: withdrawn by its caller
                    await self._publish(letter)
                self._queue.popleft()
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("dead-letter publisher failed; %d queued dead letters stay pending", len(self._queue))
            while self._queue:
                letter = self._queue.popleft()
                if not letter.done.done():
                    error = DeadLetterError(letter.target, letter.origin, f"publisher stopped: {exc!r}")
                    letter.done.set_exception(error)
            raise

    async def _publish(self, letter: _Letter) -> None:
        try:
            producer = await self._producer(letter)
            message_id = await producer.send(letter.payload, **letter.options)
        except _PULSAR_ERRORS as exc:  # refused or lost: the caller keeps the message pending
            self._counts["failed"] += 1
            log.warning("dead letter %s not published to %s: %r", letter.origin, letter.target, exc)
            broken = self._producers.pop(letter.target, None)  # a fresh producer next time, never a leak
            if broken is not None:
                await quietly(broken.close())
            if not letter.done.done():
                error = DeadLetterError(letter.target, letter.origin, repr(exc))
                error.__cause__ = exc
                letter.done.set_exception(error)
            return
        self._counts["published"] += 1
        if not letter.done.done():
            letter.done.set_result(message_id)

    async def _producer(self, letter: _Letter) -> pulsar_asyncio.Producer:
        """The dead-letter topic's producer, made (with its initial subscription) on first use.
        Only the drain task calls this, one letter at a time: one creation per topic."""
        producer = self._producers.get(letter.target)
        if producer is not None:
            return producer
        if self.initial_subscription is not None and letter.target not in self._subscribed:
            await self._create_initial_subscription(letter.target)
            self._subscribed.add(letter.target)
        producer = await self._client.create_producer(
            letter.target, producer_name=producer_name(letter.source_topic, self.subscription, self.consumer_name,
                                                       self.kind),
            schema=self._schema, batching_enabled=False, chunking_enabled=True, send_timeout_millis=self._send_timeout_ms)
        self._counts["producers_created"] += 1
        self._producers[letter.target] = producer
        return producer

    async def _create_initial_subscription(self, target: str) -> None:
        try:
            consumer = await self._client.subscribe(target, self.initial_subscription,
                                                    consumer_type=pulsar.ConsumerType.Shared,
                                                    initial_position=pulsar.InitialPosition.Earliest)
        except pulsar.ConsumerBusy:
            return  # an exclusive consumer is attached to it: the subscription exists
        except pulsar_asyncio.PulsarException as exc:
            if exc.error() == pulsar.Result.ConsumerBusy:
                return
            raise
        await quietly(consumer.close())


async def quietly(awaitable: Any) -> None:
    """Await ``awaitable`` (closing a producer or consumer); a Pulsar error (already closed, broken) is
    logged at debug and dropped."""
    try:
        await awaitable
    except _PULSAR_ERRORS as exc:  # closing something already closed or broken
        log.debug("ignored while closing: %r", exc)
