"""A consumer's letters in flight: the tracker's dead-letter hook over the consumer's
:class:`~.publisher.DeadLetterPublisher`, and the messages whose letter (dead or retry) is being
published, so that no other copy of one surfaces meanwhile and each is acknowledged once its
letter is published."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Optional

from ...keys import MessageKey
from .publisher import DeadLetterPublisher, random_name

__all__ = ["ConsumerDeadLetters"]


class ConsumerDeadLetters:
    """A TrackedConsumer's dead letters: the tracker's ``on_dead_letter`` hook
    over its :class:`DeadLetterPublisher` (``None``: no ``max_redeliveries``).
    The consumer sets ``candidate`` to the message being nacked around
    ``tracker.add`` (the hook gets only its key); ``ack(message, key)`` acknowledges a
    published one (also while the consumer closes)."""

    def __init__(self, publisher: Optional[DeadLetterPublisher], ack: Callable[[Any, Any], Awaitable[None]],
                 hooked: bool = True, ack_copies: Optional[Callable[[list[Any]], Awaitable[None]]] = None) -> None:
        self.publisher = publisher
        self._ack = ack
        self._ack_copies = ack_copies
        self._hooked = hooked  # False: the publisher serves explicit dead letters only (no max_redeliveries)
        self.candidate: Any = None
        #: why the tracker's hook dead-letters the message being nacked now: "max_redeliveries", or
        #: "ack_timeout" (the ack timeout of its last delivery passed: FailureHandling sets it around that nack)
        self.cause = "max_redeliveries"
        #: dead letters published, by cause ("bad_property": a reconsume of a message whose properties were refused)
        self.by_cause = {"max_redeliveries": 0, "dead_letter": 0, "ack_timeout": 0, "bad_property": 0}
        #: messages whose letter (dead letter, retry) is being published, until acknowledged: another
        #: copy of one (a broker restart's resend beside the requested one) must not surface meanwhile
        self.in_flight: dict[Any, int] = {}
        #: copies of in-flight batch messages dropped meanwhile (:meth:`keep_copies`)
        self._copies: dict[Any, list[Any]] = {}

    @classmethod
    def of(cls, consumer: Any, client: Any, opts: Any, schema: Any,
           ack: Callable[[Any, Any], Awaitable[None]],
           ack_copies: Optional[Callable[[list[Any]], Awaitable[None]]] = None) -> tuple["ConsumerDeadLetters", str]:
        """A consumer's dead letters, and the consumer's name. With a client there is a publisher
        (for ``dead_letter()`` and ``reconsume_later()`` too); the tracker's hook needs
        ``max_redeliveries``. The client leaves a multi-topic consumer subscribed without
        ``consumer_name`` unnamed; the dead-letter producers are named after the consumer (Java's
        names), so it gets a name as Java's client gives one."""
        name: str = consumer.consumer_name() or random_name()
        publisher = None if client is None else DeadLetterPublisher(
            client, subscription=consumer.subscription_name(), consumer_name=name,
            dead_letter_topic=opts.dead_letter_topic, initial_subscription=opts.dead_letter_initial_subscription,
            schema=schema)
        return cls(publisher, ack=ack, hooked=opts.max_redeliveries is not None, ack_copies=ack_copies), name

    @property
    def hook(self) -> Optional[Callable[[Any], Awaitable[None]]]:
        """The tracker's ``on_dead_letter``; ``None`` without a publisher or ``max_redeliveries``."""
        return None if self.publisher is None or not self._hooked else self._on_dead_letter

    def _on_dead_letter(self, key: Any) -> Awaitable[None]:
        """Queue the message being nacked now (its place in the order is taken
        here) and return what acknowledges it once published. A bare id (no
        payload: ``TypeError``) or a failed publish (:class:`DeadLetterError`)
        leaves it pending: the tracker redelivers it, the next nack tries again."""
        assert self.publisher is not None  # the hook exists only with a publisher
        message = self.candidate
        published = self.publisher.publish(message)
        self.publishing(key)  # now, not when the tracker's task starts: a copy may arrive before that
        return self.ack_when_published(message, published, key, cause=self.cause)

    async def ack_when_published(self, message: Any, published: Awaitable[Any], key: Any,
                                 message_key: Optional[MessageKey] = None, cause: Optional[str] = None) -> None:
        """Once a letter of ``message`` (``key``, marked :meth:`publishing`) is ``published``, acknowledge the
        message (``message_key``: its key when known; else ``ack`` reads it from the message), then the copies
        kept meanwhile (:meth:`keep_copies`). Whatever happens, the letter is :meth:`settled`; after a failure
        the message stays pending and its kept copies are forgotten. ``cause``: a dead letter's, counted in
        :attr:`by_cause` once published (None: a retry letter). O(kept copies)."""
        acked = False
        try:
            outcome = await published
            if cause is not None and outcome is not False:  # (a reconsume says False: it published a retry)
                self.by_cause[cause] += 1
            await self._ack(message, message_key)
            acked = True
        finally:
            copies = self.settled(key)
        if acked:
            await self._ack_kept(copies, message)

    def publishing(self, key: Any) -> None:
        """A letter of ``key`` is being published: other copies of it are dropped until :meth:`settled`. O(1)."""
        self.in_flight[key] = self.in_flight.get(key, 0) + 1

    def keep_copies(self, key: Any, copies: list[Any]) -> None:
        """Copies of an in-flight batch message, dropped: acknowledged once its letter's message is (a batch
        entry is acknowledged at the broker by whichever delivery of it has all its messages acked).
        O(len(copies))."""
        self._copies.setdefault(key, []).extend(copies)

    async def _ack_kept(self, copies: list[Any], message: Any) -> None:
        """Acknowledge the copies :meth:`settled` returned, once the letter's ``message`` was (not it
        again). A failure is logged and counted by the consumer: the message is acknowledged. O(copies)."""
        copies = [c for c in copies if c is not message]
        if copies and self._ack_copies is not None:
            await self._ack_copies(copies)

    def settled(self, key: Any) -> list[Any]:
        """A letter of ``key`` was published and acknowledged, or failed (see :attr:`in_flight`). Returns
        the copies kept meanwhile once no letter of ``key`` is left in flight: the caller acknowledges
        them if its letter's message was acknowledged; after a failure they are forgotten (the message
        stays pending: its redelivery sends the entry again). O(1)."""
        left = self.in_flight.pop(key, 1) - 1
        if left:
            self.in_flight[key] = left
            return []
        return self._copies.pop(key, [])

    def stats(self) -> dict[str, int]:
        """The consumer's ``dead_letter_*`` stats (see
        :meth:`DeadLetterPublisher.stats`). Runtime: O(queued)."""
        pub = self.publisher.stats() if self.publisher is not None else {}
        return {f"dead_letter_{name}": pub.get(name, 0)
                for name in ("published", "failed", "producers_created", "producers_open", "pending")}

    async def close(self) -> None:
        """Publish what is queued, close the producers (see :meth:`DeadLetterPublisher.close`)."""
        if self.publisher is not None:
            await self.publisher.close()
