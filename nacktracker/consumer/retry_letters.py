"""Retry letters and terminal dead letters, named as Pulsar's Java client names them.

Pure (no pulsar, no clock, no I/O): topic names, the properties a retry or a
dead letter carries, and when a retry copy is due. The consumer's shell
(:mod:`.retries`) publishes and acknowledges.

What matches the Java client 4.0 (``ConsumerImpl.doReconsumeLater``,
``RetryMessageUtil``, ``ConsumerBuilderImpl``), and why:

* **Retry topic**: ``<topic>-<subscription>-RETRY``, ``<topic>`` the fully
  qualified name of the consumer's first topic (Java's default since 2.10; a
  ``<subscription>-RETRY`` topic of an older client is not looked for: pass
  ``retry_letter_topic=`` to share one). The consumer subscribes to both.
* **Dead-letter topic of a retrying consumer**: ``<topic>-<subscription>-DLQ``
  of that same first topic (not one per source topic: messages from the retry
  topic dead-letter beside the others).
* **Properties of a retry**: the message's own, then ``REAL_TOPIC`` (its topic
  without ``-partition-N``), ``ORIGIN_MESSAGE_IDY_TIME`` (Java's old misspelt
  key, still written), ``ORIGIN_MESSAGE_ID`` (``ledger:entry:partition[:batch]``)
  and ``REAL_SUBSCRIPTION``, each only where absent, so a retry of a retry keeps
  its origin; then the caller's ``properties``; then ``RECONSUMETIMES`` (1, or
  the message's plus 1) and ``DELAY_TIME`` (the delay in ms) set.
* **Counting**: a reconsume whose ``RECONSUMETIMES`` would exceed
  ``max_redeliveries`` (Java's ``maxRedeliverCount``, default 16 with retries
  on) goes to the dead-letter topic instead, with the same properties; so a
  message is retried ``max_redeliveries`` times, then dead-lettered.
* **Due time**: Java sends the retry with ``deliverAfter(delay)`` and nothing
  else; the broker may hand it over up to its delayed-delivery tick (1 s by
  default) early, or at once where delayed delivery is off (pulsar-lite). A
  copy's due time is its publish time plus ``DELAY_TIME`` (wall clock, ms):
  the consumer parks an early copy until then, so it surfaces on time whoever
  sent it (a Java consumer, a Go one, or this one).

Terminal dead letters (``TrackedConsumer.dead_letter``) carry the dead-letter
properties (``REAL_TOPIC``, ``REAL_SUBSCRIPTION``, ``ORIGIN_MESSAGE_ID`` where
absent, as a dead letter after ``max_redeliveries``) plus
``DEAD_LETTER_REASON`` (the caller's text) and, when an exception is given,
``DEAD_LETTER_EXCEPTION`` (its ``module.QualifiedName``). Pulsar's proposal
for a terminal nack (PIP-372, open) names no properties; these are ours.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

__all__ = ["PROPERTY_RECONSUMETIMES", "PROPERTY_DELAY_TIME", "PROPERTY_REAL_TOPIC", "PROPERTY_REAL_SUBSCRIPTION",
           "PROPERTY_ORIGIN_MESSAGE_ID", "PROPERTY_ORIGIN_MESSAGE_ID_OLD", "PROPERTY_DEAD_LETTER_REASON",
           "PROPERTY_DEAD_LETTER_EXCEPTION", "MAX_RECONSUMETIMES", "full_topic_name", "retry_letter_topic",
           "retry_dead_letter_topic", "is_retry_topic", "base_topic", "retry_properties", "terminal_properties",
           "retry_due_wall_ms", "exception_name"]

PROPERTY_RECONSUMETIMES = "RECONSUMETIMES"
PROPERTY_DELAY_TIME = "DELAY_TIME"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_SUBSCRIPTION = "REAL_SUBSCRIPTION"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
#: Java's ``RetryMessageUtil.SYSTEM_PROPERTY_ORIGIN_MESSAGE_ID``: misspelt long ago and still written beside
#: ``ORIGIN_MESSAGE_ID`` for old readers; written here too, so the two clients' retries read alike.
PROPERTY_ORIGIN_MESSAGE_ID_OLD = "ORIGIN_MESSAGE_IDY_TIME"
PROPERTY_DEAD_LETTER_REASON = "DEAD_LETTER_REASON"
PROPERTY_DEAD_LETTER_EXCEPTION = "DEAD_LETTER_EXCEPTION"
#: Java's ``RetryMessageUtil.MAX_RECONSUMETIMES``: ``maxRedeliverCount`` of a retrying consumer without a
#: dead-letter policy (here: ``max_redeliveries`` left out with ``enable_retry=True``).
MAX_RECONSUMETIMES = 16

_PARTITION = "-partition-"


def full_topic_name(topic: str) -> str:
    """``persistent://public/default/t`` from ``t``, ``tenant/ns/t`` from itself
    prefixed, a full name as it is (Java's ``TopicName.get(...).toString()``).

    >>> full_topic_name("t"), full_topic_name("acme/orders/t"), full_topic_name("non-persistent://a/b/t")
    ('persistent://public/default/t', 'persistent://acme/orders/t', 'non-persistent://a/b/t')
    """
    if "://" in topic:
        return topic
    if "/" not in topic:
        return f"persistent://public/default/{topic}"
    if topic.count("/") == 2:
        return f"persistent://{topic}"
    raise ValueError(f"not a topic name: {topic!r}")


def base_topic(topic: str) -> str:
    """A partition's topic without ``-partition-N`` (Java's ``REAL_TOPIC`` of a retry)."""
    head, sep, tail = topic.rpartition(_PARTITION)
    return head if sep and tail.isdigit() else topic


def retry_letter_topic(topic: str, subscription: str) -> str:
    """Java's default retry topic of a consumer whose first topic is ``topic``.

    >>> retry_letter_topic("orders", "billing")
    'persistent://public/default/orders-billing-RETRY'
    """
    return f"{full_topic_name(topic)}-{subscription}-RETRY"


def retry_dead_letter_topic(topic: str, subscription: str) -> str:
    """Java's default dead-letter topic of a retrying consumer whose first topic is ``topic``."""
    return f"{full_topic_name(topic)}-{subscription}-DLQ"


def is_retry_topic(topic: str, retry_topic: str) -> bool:
    """Whether a message's topic is ``retry_topic`` or one of its partitions."""
    return topic == retry_topic or (topic.startswith(retry_topic) and base_topic(topic) == retry_topic)


def retry_properties(own: Mapping[str, str], *, topic: str, origin_id: str, subscription: str,
                     delay_ms: int, custom: Optional[Mapping[str, str]] = None) -> tuple[dict[str, str], int]:
    """The properties of the next retry (or dead letter) of a message with
    properties ``own`` from ``topic`` (its id ``origin_id``), and its reconsume
    number (``RECONSUMETIMES``). ``ValueError`` if ``own`` has a
    ``RECONSUMETIMES`` that is not a non-negative integer. O(properties).

    >>> props, n = retry_properties({"k": "v"}, topic="persistent://p/d/t-partition-1", origin_id="7:3:1",
    ...                             subscription="s", delay_ms=500)
    >>> n, sorted(props.items())  # doctest: +NORMALIZE_WHITESPACE
    (1, [('DELAY_TIME', '500'), ('ORIGIN_MESSAGE_ID', '7:3:1'), ('ORIGIN_MESSAGE_IDY_TIME', '7:3:1'),
         ('REAL_SUBSCRIPTION', 's'), ('REAL_TOPIC', 'persistent://p/d/t'), ('RECONSUMETIMES', '1'), ('k', 'v')])
    """
    props = dict(own)
    props.setdefault(PROPERTY_REAL_TOPIC, base_topic(topic))
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID_OLD, origin_id)
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, origin_id)
    props.setdefault(PROPERTY_REAL_SUBSCRIPTION, subscription)
    if custom:
        props.update(custom)
    times = 1
    if PROPERTY_RECONSUMETIMES in props:
        times = reconsume_times(props) + 1
    props[PROPERTY_RECONSUMETIMES] = str(times)
    props[PROPERTY_DELAY_TIME] = str(delay_ms)
    return props, times


def reconsume_times(props: Mapping[str, str]) -> int:
    """``RECONSUMETIMES`` of a message's properties (0 when absent). O(1)."""
    raw = props.get(PROPERTY_RECONSUMETIMES)
    if raw is None:
        return 0
    if not raw.isdigit():
        raise ValueError(f"{PROPERTY_RECONSUMETIMES} must be a non-negative integer, got {raw!r}")
    return int(raw)


def terminal_properties(own: Mapping[str, str], *, topic: str, origin_id: str, subscription: str,
                        reason: str, exception: Optional[BaseException] = None) -> dict[str, str]:
    """The properties of a terminal dead letter (``TrackedConsumer.dead_letter``). O(properties)."""
    props = dict(own)
    props.setdefault(PROPERTY_REAL_TOPIC, topic)
    props.setdefault(PROPERTY_REAL_SUBSCRIPTION, subscription)
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, origin_id)
    props[PROPERTY_DEAD_LETTER_REASON] = reason
    if exception is not None:
        props[PROPERTY_DEAD_LETTER_EXCEPTION] = exception_name(exception)
    else:
        props.pop(PROPERTY_DEAD_LETTER_EXCEPTION, None)
    return props


def exception_name(exception: BaseException) -> str:
    """``module.QualifiedName`` of an exception's type (builtins without the module).

    >>> exception_name(KeyError("x"))
    'KeyError'
    """
    cls = type(exception)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def retry_due_wall_ms(props: Mapping[str, str], publish_timestamp_ms: int) -> Optional[int]:
    """When a retry copy is due (wall clock, ms): its publish time plus its
    ``DELAY_TIME``; ``None`` for a message without a valid ``DELAY_TIME``
    (it surfaces as it comes). O(1)."""
    raw: Any = props.get(PROPERTY_DELAY_TIME)
    if raw is None or not raw.isdigit() or not publish_timestamp_ms:
        return None
    return publish_timestamp_ms + int(raw)
