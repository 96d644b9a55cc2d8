"""Retry letters and terminal dead letters, named as Pulsar's Java client names them.

Pure (no pulsar, no clock, no I/O): topic names, the properties a retry or a
dead letter carries, and when a retry copy is due. The consumer's shell
(:mod:`.retry`) publishes and acknowledges.

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

import re
from typing import Callable, Mapping, Optional

from ..._checks import MAX_DEFAULT_DELAY, MAX_ID
from ...errors import PropertyError

__all__ = ["PROPERTY_RECONSUMETIMES", "PROPERTY_DELAY_TIME", "PROPERTY_REAL_TOPIC", "PROPERTY_REAL_SUBSCRIPTION",
           "PROPERTY_ORIGIN_MESSAGE_ID", "PROPERTY_ORIGIN_MESSAGE_ID_OLD", "PROPERTY_DEAD_LETTER_REASON",
           "PROPERTY_DEAD_LETTER_EXCEPTION", "MAX_RECONSUMETIMES", "full_topic_name", "retry_letter_topic",
           "retry_dead_letter_topic", "is_retry_topic", "base_topic", "retry_properties", "terminal_properties",
           "retry_due_wall_ms", "exception_name", "read_property", "reconsume_times", "PropertyError",
           "MAX_PROPERTY_RECONSUMETIMES", "MAX_PROPERTY_DELAY_TIME", "MAX_PROPERTY_TEXT",
           "check_letter_properties"]

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

#: The largest ``RECONSUMETIMES`` read (Java writes an ``int``).
MAX_PROPERTY_RECONSUMETIMES = (1 << 31) - 1
#: The largest ``DELAY_TIME`` read, in ms (73 million years: a due time stays in the tracker's range).
MAX_PROPERTY_DELAY_TIME = MAX_DEFAULT_DELAY
#: The longest ``REAL_TOPIC`` or ``ORIGIN_MESSAGE_ID`` read, in characters.
MAX_PROPERTY_TEXT = 4096

_COUNT = re.compile(r"[0-9]{1,19}")  # ASCII digits only: str.isdigit() also takes '²' and other scripts' digits
_ONE_ID = r"-?[0-9]{1,19}:-?[0-9]{1,19}:-?[0-9]{1,10}(?::-?[0-9]{1,10})?"
_ORIGIN_ID = re.compile(f"{_ONE_ID}(?:;{_ONE_ID})?")  # Java's MessageId.toString(); a chunked message's: first;last
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _count(name: str, raw: str, maximum: int) -> int:
    if not _COUNT.fullmatch(raw):
        raise PropertyError(name, raw, f"must be a whole number of ASCII digits from 0 to {maximum}")
    value = int(raw)
    if value > maximum:
        raise PropertyError(name, raw, f"must be at most {maximum}")
    return value


def _text(name: str, raw: str) -> str:
    if not raw or len(raw) > MAX_PROPERTY_TEXT or _CONTROL.search(raw):
        raise PropertyError(name, raw, f"must be 1 to {MAX_PROPERTY_TEXT} characters without control characters")
    return raw


def _origin_id(name: str, raw: str) -> str:
    if not _ORIGIN_ID.fullmatch(raw) or any(
            not -1 <= int(part) <= MAX_ID for one in raw.split(";") for part in one.split(":")):
        raise PropertyError(name, raw, "must be a message id ledger:entry:partition[:batch] "
                                       "(each from -1 to 2^63 - 1), or two joined by ';' (a chunked message's)")
    return raw


#: How each property the consumer reads from a message is parsed: one table, one function (read_property).
_PARSERS: dict[str, Callable[[str, str], object]] = {
    PROPERTY_RECONSUMETIMES: lambda name, raw: _count(name, raw, MAX_PROPERTY_RECONSUMETIMES),
    PROPERTY_DELAY_TIME: lambda name, raw: _count(name, raw, MAX_PROPERTY_DELAY_TIME),
    PROPERTY_REAL_TOPIC: _text,
    PROPERTY_REAL_SUBSCRIPTION: _text,
    PROPERTY_ORIGIN_MESSAGE_ID: _origin_id,
    PROPERTY_ORIGIN_MESSAGE_ID_OLD: _origin_id,
}


def read_property(props: Mapping[str, object], name: str) -> object:
    """The value of property ``name`` of a received message, parsed strictly with its bounds, or
    ``None`` when absent: ``RECONSUMETIMES`` (int, 0 to 2^31 - 1), ``DELAY_TIME`` (int ms, 0 to
    :data:`MAX_PROPERTY_DELAY_TIME`), ``REAL_TOPIC``/``REAL_SUBSCRIPTION`` (text, no control characters,
    at most :data:`MAX_PROPERTY_TEXT` characters), ``ORIGIN_MESSAGE_ID`` (and Java's misspelt twin:
    ``ledger:entry:partition[:batch]``). Anything else: :class:`PropertyError` naming the property.
    Retry topics are shared with other clients and with anything that can produce to them: a value is
    data to check, never trusted. O(len(value)).

    >>> read_property({"DELAY_TIME": "250"}, "DELAY_TIME"), read_property({}, "DELAY_TIME")
    (250, None)
    >>> read_property({"DELAY_TIME": "\u00b2"}, "DELAY_TIME")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    nacktracker.errors.PropertyError: property DELAY_TIME='²': must be a whole number of ASCII digits...
    """
    raw = props.get(name)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise PropertyError(name, raw, "must be a str")
    return _PARSERS[name](name, raw)


#: The properties a retry carries on from its message (``DELAY_TIME`` is written anew, ``RECONSUMETIMES`` read).
_CARRIED = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_SUBSCRIPTION, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_ORIGIN_MESSAGE_ID_OLD)


def check_letter_properties(props: Mapping[str, object]) -> None:
    """Every property a retry of ``props`` carries on (:func:`retry_properties`), checked:
    :class:`PropertyError` for the first one refused. O(properties)."""
    for name in _CARRIED:
        read_property(props, name)


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
    number (``RECONSUMETIMES``). :class:`PropertyError` (a ``ValueError``) if a
    property it reads or carries on is refused by :func:`read_property` (in
    ``own`` and ``custom`` alike: check the caller's ``custom`` first with
    :func:`check_letter_properties`). O(properties).

    >>> props, n = retry_properties({"k": "v"}, topic="persistent://p/d/t-partition-1", origin_id="7:3:1",
    ...                             subscription="s", delay_ms=500)
    >>> n, sorted(props.items())  # doctest: +NORMALIZE_WHITESPACE
    (1, [('DELAY_TIME', '500'), ('ORIGIN_MESSAGE_ID', '7:3:1'), ('ORIGIN_MESSAGE_IDY_TIME', '7:3:1'),
         ('REAL_SUBSCRIPTION', 's'), ('REAL_TOPIC', 'persistent://p/d/t'), ('RECONSUMETIMES', '1'), ('k', 'v')])
    """
    check_letter_properties(own)
    props = dict(own)
    props.setdefault(PROPERTY_REAL_TOPIC, base_topic(topic))
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID_OLD, origin_id)
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, origin_id)
    props.setdefault(PROPERTY_REAL_SUBSCRIPTION, subscription)
    if custom:
        props.update(custom)
    times = reconsume_times(props) + 1
    if times > MAX_PROPERTY_RECONSUMETIMES:
        raise PropertyError(PROPERTY_RECONSUMETIMES, str(times - 1), f"a retry would count past "
                                                                      f"{MAX_PROPERTY_RECONSUMETIMES}")
    props[PROPERTY_RECONSUMETIMES] = str(times)
    props[PROPERTY_DELAY_TIME] = str(delay_ms)
    return props, times


def reconsume_times(props: Mapping[str, str]) -> int:
    """``RECONSUMETIMES`` of a message's properties (0 when absent); :class:`PropertyError` when
    :func:`read_property` refuses it. O(1)."""
    value = read_property(props, PROPERTY_RECONSUMETIMES)
    return value if isinstance(value, int) else 0


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
    ``DELAY_TIME``; ``None`` for a message without ``DELAY_TIME`` or a publish
    time (it surfaces as it comes); :class:`PropertyError` for a ``DELAY_TIME``
    :func:`read_property` refuses (the consumer surfaces that copy as it
    comes, counted in ``bad_properties``). O(len(value))."""
    delay = read_property(props, PROPERTY_DELAY_TIME)
    if not isinstance(delay, int) or type(publish_timestamp_ms) is not int or not 0 < publish_timestamp_ms <= MAX_ID:
        return None
    return publish_timestamp_ms + delay
