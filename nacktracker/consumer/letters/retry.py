"""A retrying consumer's letters: ``reconsume_later`` (Java's retry letter topic)
and ``dead_letter`` (a terminal nack to the dead-letter topic with its reason).

Glue over two ordered publishers (:class:`~.publisher.DeadLetterPublisher`):
the retry-letter one and the consumer's dead-letter one, so a reconsume that
has run out of retries and an explicit dead letter keep their place among the
consumer's other dead letters. Names, properties and counting:
:mod:`.java`. The shell acknowledges a message once its letter is
published (as Java: send, then acknowledge); a failed publish raises
:class:`~.publisher.DeadLetterError` and leaves the message unacknowledged.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Optional

from ..._checks import check_client_delay
from ...errors import PropertyError
from .java import is_retry_topic, reconsume_times, retry_due_wall_ms, retry_properties, terminal_properties
from .publisher import DeadLetterPublisher, java_message_id

__all__ = ["RetryLetters", "TerminalDeadLetters", "RETRY_LEAD_MS"]

log = logging.getLogger("nacktracker.consumer")


#: How much earlier than due a retry letter asks the broker to deliver it by default
#: (``deliver_after`` = delay minus this, at least 0; the consumer's ``retry_lead_ms``). Apache
#: Pulsar's delayed delivery runs on a tick (1 s by default) and may hand a message over up to a
#: tick early, or, throttled to one run per tick, up to a tick late: a measured run had retries 264
#: and 739 ms late with ``deliver_after`` = the delay. Asked two ticks early, the copy is here in
#: time and held until its due time (``DELAY_TIME`` after its publish time, which the message
#: carries). A Java consumer reading these retries gets them up to this much early (it does not
#: hold them).
RETRY_LEAD_MS = 2_000


class RetryLetters:
    """``retry``: the retry-letter publisher (its ``dead_letter_topic`` is the
    retry topic); ``dead_letters``: the consumer's dead-letter publisher;
    ``max_redeliveries``: reconsumes before a message is dead-lettered."""

    def __init__(self, retry: DeadLetterPublisher, dead_letters: DeadLetterPublisher, *, topic: str,
                 max_redeliveries: int, lead_ms: int = RETRY_LEAD_MS) -> None:
        self.retry = retry
        self.dead_letters = dead_letters
        self.topic = topic
        self.max_redeliveries = max_redeliveries
        self.lead_ms = lead_ms
        self.counts = {"reconsumed": 0, "reconsume_dead_lettered": 0}

    def prepare(self, message: Any, delay_ms: Optional[int], custom: Optional[Mapping[str, str]],
                default_delay: Callable[[int], object]) -> tuple[dict[str, str], int, int]:
        """The properties, reconsume number and delay of the next retry of ``message``: ``delay_ms``,
        else ``default_delay(RECONSUMETIMES)`` (the consumer's backoff or its ``delay_ms``), each at most
        :data:`~nacktracker._checks.MAX_CLIENT_DELAY_MS`. :class:`PropertyError` for a property of the message (or of
        ``custom``) that :func:`~.java.read_property` refuses. O(properties)."""
        own = message.properties()
        if delay_ms is None:
            delay_ms = check_client_delay("the backoff's delay", default_delay(reconsume_times(own)))
        props, times = retry_properties(own, topic=message.topic_name(),
                                        origin_id=java_message_id(message.message_id()),
                                        subscription=self.retry.subscription, delay_ms=delay_ms, custom=custom)
        return props, times, delay_ms

    async def reconsume_refused(self, message: Any, refused: PropertyError) -> None:
        """A reconsume of a message whose properties cannot be read: to the dead-letter topic with
        ``DEAD_LETTER_REASON`` naming the property (its retry could not count nor carry them)."""
        log.warning("reconsume_later of %s: %s; dead-lettered", java_message_id(message.message_id()), refused)
        props = terminal_properties(_without(message.properties(), refused.name), topic=message.topic_name(),
                                    origin_id=java_message_id(message.message_id()),
                                    subscription=self.dead_letters.subscription, reason=str(refused),
                                    exception=refused)
        await self.dead_letters.publish(message, properties=props)

    async def reconsume(self, message: Any, props: dict[str, str], times: int, delay_ms: int) -> bool:
        """Publish the next retry of ``message`` (:meth:`prepare`: its properties, number and delay), or
        its dead letter once ``RECONSUMETIMES`` would pass ``max_redeliveries``.
        Returns whether it was dead-lettered. One broker round trip (the
        producer's creation on first use)."""
        if times > self.max_redeliveries:
            await self.dead_letters.publish(message, properties=props)
            self.counts["reconsume_dead_lettered"] += 1
            return True
        await self.retry.publish(message, properties=props, deliver_after_ms=max(0, delay_ms - self.lead_ms))
        self.counts["reconsumed"] += 1
        return False

    def due_wall_ms(self, message: Any) -> Optional[int]:
        """When a copy from the retry topic is due (wall ms), ``None`` for any
        other message (it surfaces as it comes). O(1)."""
        if not is_retry_topic(message.topic_name(), self.topic):
            return None
        return retry_due_wall_ms(message.properties(), message.publish_timestamp())  # (PropertyError: the caller's)

    async def close(self) -> None:
        await self.retry.close()


def _without(props: Mapping[str, str], name: str) -> dict[str, str]:
    """``props`` less the refused property (its value is in the reason; the topic must take the rest)."""
    return {k: v for k, v in props.items() if k != name}


class TerminalDeadLetters:
    """``dead_letter(msg, reason=...)`` over the consumer's dead-letter publisher."""

    def __init__(self, dead_letters: DeadLetterPublisher) -> None:
        self.dead_letters = dead_letters
        self.published = 0

    async def publish(self, message: Any, reason: str, exception: Optional[BaseException]) -> None:
        props = terminal_properties(message.properties(), topic=message.topic_name(),
                                    origin_id=java_message_id(message.message_id()),
                                    subscription=self.dead_letters.subscription, reason=reason, exception=exception)
        await self.dead_letters.publish(message, properties=props)
        self.published += 1
