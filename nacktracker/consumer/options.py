"""The consumer's options (checked at the boundary, before anything is
subscribed) and :func:`subscribe`, the usual way to make a TrackedConsumer."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Union

import _pulsar
import pulsar
import pulsar.asyncio as pulsar_asyncio

from .._checks import MAX_DUE, check_default_delay, check_delay_ms, check_int
from ..precision import Precision
from ..adapters.pulsar import MIN_NACK_DELAY_MS
from .direct import ReceivedMessage, message_key_of
from ..keys import MessageKey, key_of

__all__ = ["ConsumerOptions", "subscribe", "batch_size", "check_timeout_ms", "seek_target", "key_and_count",
           "CLIENT_RECEIVER_QUEUE_SIZE", "message_key"]

#: How nacked messages come back (:attr:`ConsumerOptions.redelivery`).
REDELIVERY_MODES = ("broker", "local")
#: Subscription types whose broker redelivers only everything unacknowledged: nacks are redelivered locally.
LOCAL_TYPES = (pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover)
#: The client's default ``receiver_queue_size``.
CLIENT_RECEIVER_QUEUE_SIZE = 1000


@dataclass(frozen=True)
class ConsumerOptions:
    """What a TrackedConsumer was asked for (see :func:`subscribe`)."""

    delay_ms: int = 60_000
    precision_bits: int = 0  # exact: the cheapest precision on real traffic (bench/results/index-grid)
    backoff: Optional[Callable[[int], int]] = None
    max_redeliveries: Optional[int] = None
    dead_letter_topic: Optional[str] = None
    dead_letter_initial_subscription: Optional[str] = None
    lead_ms: Optional[int] = None
    min_gap_ms: Optional[int] = None
    prefetch: int = 16
    snapshot_path: Optional[str] = None
    snapshot_interval_s: Optional[float] = 5.0
    #: a snapshot path that cannot be restored at start (corrupted, unreadable, its directory missing) or
    #: written at close: "raise" a SnapshotError (at start nothing starts; at close once all else is closed),
    #: or "ignore" (logged, counted in snapshot_failures; a corrupted file is moved aside). The saves in
    #: between never raise (logged and counted either way).
    snapshot_on_error: str = "raise"
    dedup: bool = True
    dedup_capacity: int = 1_000_000
    #: "broker": nacked messages come back through the client's nack path (Shared, Key_Shared);
    #: "local": from this consumer's memory (Exclusive, Failover: see adapters/local.py)
    redelivery: str = "broker"
    #: Java's enableRetry: reconsume_later() and the retry letter topic (subscribe() names it and subscribes)
    enable_retry: bool = False
    retry_letter_topic: Optional[str] = None
    retry_lead_ms: int = 2_000  # retries ask the broker for delivery this much before due (consumer/retries.py)
    #: ack timeout (Java's ackTimeout, PIP-130's ackTimeoutRedeliveryBackoff): consumer/ack_timeout.py
    ack_timeout_ms: Optional[int] = None
    ack_timeout_backoff: Optional[Callable[[int], int]] = None

    @classmethod
    def check(cls, options: dict[str, Any], has_client: bool) -> "ConsumerOptions":
        """Validated options; ``TypeError``/``ValueError`` for anything wrong."""
        unknown = set(options) - set(cls.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown TrackedConsumer option(s): {', '.join(sorted(unknown))}")
        o = dict(options)
        o["delay_ms"] = check_default_delay("delay_ms", o.get("delay_ms", 60_000))
        Precision.of(o.get("precision_bits", 0))
        for name in ("lead_ms", "min_gap_ms"):
            if o.get(name) is not None:
                check_delay_ms(name, o[name])
        backoff = o.get("backoff")
        if backoff is not None and not callable(backoff):
            raise TypeError(f"backoff must be callable, not {type(backoff).__name__}")
        if o.get("max_redeliveries") is not None:
            if check_int("max_redeliveries", o["max_redeliveries"]) < 1:
                raise ValueError("max_redeliveries must be >= 1")
            if not has_client:
                raise ValueError("max_redeliveries needs the client (to publish dead letters)")
        topic = o.get("dead_letter_topic")
        if topic is not None and not isinstance(topic, str):
            raise TypeError(f"dead_letter_topic must be a str, not {type(topic).__name__}")
        if topic is not None and o.get("max_redeliveries") is None:
            raise ValueError("dead_letter_topic needs max_redeliveries")
        for name in ("dead_letter_topic", "dead_letter_initial_subscription"):
            if o.get(name) == "":
                raise ValueError(f"{name} must not be empty")
        initial = o.get("dead_letter_initial_subscription")
        if initial is not None and not isinstance(initial, str):
            raise TypeError(f"dead_letter_initial_subscription must be a str, not {type(initial).__name__}")
        if initial is not None and o.get("max_redeliveries") is None:
            raise ValueError("dead_letter_initial_subscription needs max_redeliveries")
        if o.get("redelivery", "broker") not in REDELIVERY_MODES:
            raise ValueError(f"redelivery must be 'broker' or 'local', got {o['redelivery']!r}")
        if check_int("prefetch", o.get("prefetch", 16)) < 1:
            raise ValueError("prefetch must be >= 1")
        _check_reliability(o)
        _check_failure_options(o)
        if o.get("enable_retry") and not has_client:
            raise ValueError("enable_retry needs the client (to publish retry letters)")
        if o.get("snapshot_path") is not None:
            o["snapshot_path"] = os.path.abspath(os.fspath(o["snapshot_path"]))
        if o.get("dedup_capacity") is None:
            o.pop("dedup_capacity", None)
        return cls(**o)


def _check_reliability(o: dict[str, Any]) -> None:
    path = o.get("snapshot_path")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"snapshot_path must be a str or os.PathLike, not {type(path).__name__}")
    if path is not None and not isinstance(os.fspath(path), str):
        raise TypeError("snapshot_path must be a str path (not bytes)")
    interval = o.get("snapshot_interval_s", 5.0)
    if interval is not None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)):
            raise TypeError(f"snapshot_interval_s must be a number of seconds or None, not {type(interval).__name__}")
        if not 0 < interval < math.inf:
            raise ValueError(f"snapshot_interval_s must be > 0 (None: save only on close), got {interval}")
    if o.get("snapshot_on_error", "raise") not in ("raise", "ignore"):
        raise ValueError(f"snapshot_on_error must be 'raise' or 'ignore', got {o['snapshot_on_error']!r}")
    dedup = o.get("dedup", True)
    if not isinstance(dedup, bool):
        raise TypeError(f"dedup must be a bool, not {type(dedup).__name__}")
    if o.get("dedup_capacity") is not None:
        if not dedup:
            raise ValueError("dedup_capacity needs dedup=True")
        if check_int("dedup_capacity", o["dedup_capacity"]) < 1:
            raise ValueError("dedup_capacity must be >= 1")


def _check_failure_options(o: dict[str, Any]) -> None:
    """Retry letters and ack timeouts (see :func:`subscribe`)."""
    if not isinstance(o.get("enable_retry", False), bool):
        raise TypeError(f"enable_retry must be a bool, not {type(o['enable_retry']).__name__}")
    topic = o.get("retry_letter_topic")
    if topic is not None:
        if not isinstance(topic, str):
            raise TypeError(f"retry_letter_topic must be a str, not {type(topic).__name__}")
        if not topic:
            raise ValueError("retry_letter_topic must not be empty")
        if not o.get("enable_retry"):
            raise ValueError("retry_letter_topic needs enable_retry=True")
    if "retry_lead_ms" in o:
        o["retry_lead_ms"] = check_delay_ms("retry_lead_ms", o["retry_lead_ms"])
    timeout = o.get("ack_timeout_ms")
    if timeout is not None:
        o["ack_timeout_ms"] = timeout = check_delay_ms("ack_timeout_ms", timeout)  # whole ms (floats up)
        if timeout < 1:
            raise ValueError("ack_timeout_ms must be >= 1")
        if timeout > MAX_DUE:
            raise ValueError(f"ack_timeout_ms must be <= {MAX_DUE}")
    backoff = o.get("ack_timeout_backoff")
    if backoff is not None:
        if not callable(backoff):
            raise TypeError(f"ack_timeout_backoff must be callable, not {type(backoff).__name__}")
        if timeout is None:
            raise ValueError("ack_timeout_backoff needs ack_timeout_ms")


def check_timeout_ms(timeout_ms: object) -> int:
    """A receive timeout in whole ms: as a delay (no bool, NaN, negative or
    non-number), and no later than the tracker's due times reach (a larger
    one would overflow the event loop's float seconds)."""
    checked = check_delay_ms("timeout_ms", timeout_ms)
    if checked > MAX_DUE:
        raise ValueError(f"timeout_ms must be <= {MAX_DUE}, got {checked}")
    return checked


def key_and_count(message: Any, own_topic: Optional[str],
                  held: Iterable[MessageKey]) -> tuple[MessageKey, Optional[int]]:
    """The key and redelivery count of a Message or id the application passed;
    a bare id gets ``own_topic``, or on a multi-topic consumer (``None``) the
    topic of the ``held`` message it names (O(held)). A MessageKey: TypeError."""
    if type(message) is ReceivedMessage:  # its key was built on arrival
        return message_key_of(message), message.redelivery_count()
    if isinstance(message, MessageKey):
        raise TypeError("pass a pulsar Message or MessageId, not a MessageKey")
    if isinstance(message, pulsar.MessageId):
        message = message._msg_id
    key, count = key_of(message)
    if key.topic is None:
        if own_topic is not None:
            key = key._replace(topic=own_topic)
        else:
            key = next((k for k in held if k._replace(topic=None) == key), key)
    return key, count


def message_key(message: Any, own_topic: Optional[str], held: Iterable[MessageKey]) -> MessageKey:
    """:func:`key_and_count` without the count; a received ``pulsar.Message``
    (the hot path: every receive and ack) skips the generic checks. O(1)."""
    if type(message) is ReceivedMessage:
        return message_key_of(message)  # built once, on arrival
    if type(message) is pulsar.Message:
        mid = message.message_id()
        return MessageKey(mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index(), message.topic_name())
    return key_and_count(message, own_topic, held)[0]


def seek_target(target: object) -> Union[pulsar.MessageId, int]:
    """What ``pulsar.asyncio.Consumer.seek`` takes, from what users pass: a
    received Message (its id), a ``pulsar.MessageId``, a ``_pulsar.MessageId``
    (what ``Message.message_id()`` and ``MessageId.earliest/latest`` are, which
    ``pulsar.asyncio`` refuses), or a publish timestamp in ms (an int >= 0).
    Anything else: ``TypeError``. O(1)."""
    if isinstance(target, pulsar.Message):
        target = target.message_id()
    if isinstance(target, pulsar.MessageId):
        return target
    if isinstance(target, _pulsar.MessageId):
        wrapped = pulsar.MessageId.__new__(pulsar.MessageId)  # the wrapper asyncio's seek unwraps again
        wrapped._msg_id = target
        return wrapped
    if isinstance(target, int) and not isinstance(target, bool):
        if not 0 <= target < 2**63:
            raise ValueError(f"a seek timestamp must be ms since the epoch (0 <= t < 2**63), got {target}")
        return target
    raise TypeError("seek takes a pulsar Message, a MessageId (pulsar.MessageId.earliest/latest too) or a "
                    f"publish timestamp in ms (int), not {type(target).__name__}")


def batch_size(mid: Any) -> int:
    """Messages in the entry of a received batch message id: ``mid.batch_size()``
    where it exists, else protobuf field 6 of its serialized form (the Python
    client has no getter). 0 if absent. Runtime: ~2 us."""
    getter = getattr(mid, "batch_size", None)
    if callable(getter):
        return getter()
    data = mid.serialize()
    i, n = 0, len(data)
    while i < n:
        tag = data[i]
        if tag & 7 == 0:  # varint
            value, i = _varint(data, i + 1)
            if tag >> 3 == 6:
                return value
        elif tag & 7 == 2:  # length-delimited: skip
            length, i = _varint(data, i + 1)
            i += length
        else:
            return 0
    return 0


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """A protobuf varint at ``data[i:]``: ``(value, index after it)``."""
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _with_retry_topic(topic: Union[str, list], subscription: str, own: dict[str, Any]) -> list:
    """Java's ``enableRetry`` defaults, set in ``own``: the retry topic (of the
    first topic), the dead-letter topic beside it, ``max_redeliveries`` 16.
    Returns the topics to subscribe to (the retry topic added)."""
    from .retry_letters import MAX_RECONSUMETIMES, full_topic_name, retry_dead_letter_topic, retry_letter_topic

    topics = [topic] if isinstance(topic, str) else list(topic)
    if not topics or not all(isinstance(t, str) for t in topics):
        raise TypeError("enable_retry needs a topic name or a list of them (not a pattern)")
    first = topics[0]
    own["retry_letter_topic"] = retry = full_topic_name(own.get("retry_letter_topic")
                                                        or retry_letter_topic(first, subscription))
    if own.get("dead_letter_topic") is None:
        own["dead_letter_topic"] = retry_dead_letter_topic(first, subscription)
    if own.get("max_redeliveries") is None:
        own["max_redeliveries"] = MAX_RECONSUMETIMES
    if retry not in (full_topic_name(t) for t in topics):
        topics.append(retry)
    return topics


async def subscribe(client: pulsar_asyncio.Client, topic: Union[str, list], subscription: str, *,
                    consumer_type: pulsar.ConsumerType = pulsar.ConsumerType.Shared,
                    batch_index_ack_enabled: bool = False, **options: Any) -> Any:
    """Subscribe with ``client`` and return a :class:`TrackedConsumer`.

    ``client`` must be a ``pulsar.asyncio.Client`` (the tracker's timer and
    the receive pump live on the event loop; a sync ``pulsar.Client`` gets a
    ``TypeError``). ``consumer_type`` defaults to **Shared** (Pulsar's own
    default is Exclusive): nacks are a per-message workflow. On Shared and
    Key_Shared the broker redelivers each nacked entry (possibly to another
    consumer of the subscription). On **Exclusive and Failover** the broker can
    only resend everything unacknowledged, so the consumer redelivers nacked
    messages **locally** (``redelivery="local"``, set here from the type): it
    keeps each nacked message (one per pending nack) and hands it back at its
    time, no broker call (the docs' "Subscription types per broker").

    Options (the docs' consumer guide has a table): ``delay_ms`` (60 000), ``precision_bits``
    (0, the default: exact; 8: buckets of 256 ms, up to 255 ms early), ``backoff``, ``max_redeliveries``,
    ``dead_letter_topic`` (default ``<topic>-<subscription>-DLQ``, per
    partition), ``dead_letter_initial_subscription`` (made on the dead-letter
    topic before its first dead letter),
    ``lead_ms`` (fixed instead of learned), ``min_gap_ms``, ``prefetch`` (16:
    at most this many received messages wait in the consumer for the
    application, never more than ``receiver_queue_size``, the client's 1000
    by default; parked nacked copies released at their time come on top),
    ``snapshot_path``, ``snapshot_interval_s``, ``snapshot_on_error``,
    ``dedup`` (True: acknowledged ids are remembered so no copy of one
    surfaces again; well under a byte per dense id), ``dedup_capacity``,
    ``enable_retry`` (Java's ``enableRetry``: ``reconsume_later()``, subscribing
    to ``retry_letter_topic`` too, default ``<topic>-<subscription>-RETRY``;
    ``retry_lead_ms``, 2000: how early the broker is asked to deliver a retry,
    held until due;
    then ``dead_letter_topic`` defaults to ``<topic>-<subscription>-DLQ`` of
    the first topic and ``max_redeliveries`` to 16), ``ack_timeout_ms`` and
    ``ack_timeout_backoff`` (redeliver what is received and neither acked nor
    nacked in time); see ``docs/retries.md``.

    ``batch_index_ack_enabled`` (default False) is passed to the client. Turn
    it on where the broker has ``acknowledgmentAtBatchIndexLevelEnabled``
    (Pulsar 4.1's default): acked siblings of a batch then never reach the
    subscription's other consumers. Apache Pulsar without that setting
    ignores the index acks (nothing is lost); pulsar-lite takes each index ack
    for the whole entry, and the entry's other messages are lost (both
    measured: ``tests/test_pulsar.py::test_batch_index_ack_on_a_broker_without_it``).

    The consumer is subscribed with ``negative_ack_redelivery_delay_ms=100``
    (the client's minimum; the adapter redelivers through that path).
    ``dead_letter_policy`` is refused (use ``max_redeliveries``). Other
    keyword arguments go to ``client.subscribe``. Partitioned topics work as
    any other (proven on Apache Pulsar; pulsar-lite cannot redeliver on them).

    >>> async def main(url):                                        # doctest: +SKIP
    ...     client = pulsar.asyncio.Client(url)
    ...     async with await nacktracker.subscribe(client, "t", "sub", delay_ms=500) as consumer:
    ...         async for msg in consumer:
    ...             await consumer.negative_acknowledge(msg, delay_ms=1000)
    """
    from .shell import TrackedConsumer
    from .dead_letters import quietly

    if not isinstance(client, pulsar_asyncio.Client):
        if isinstance(client, pulsar.Client):
            raise TypeError("nacktracker.subscribe needs a pulsar.asyncio.Client, not the synchronous "
                            "pulsar.Client: TrackedConsumer runs its tracker and receive pump on the "
                            "asyncio event loop. Create the client with pulsar.asyncio.Client(url).")
        raise TypeError(f"client must be a pulsar.asyncio.Client, not {type(client).__name__}")
    if not isinstance(subscription, str):
        raise TypeError(f"subscription must be a str, not {type(subscription).__name__}")
    if not isinstance(consumer_type, pulsar.ConsumerType):
        raise TypeError(f"consumer_type must be a pulsar.ConsumerType, not {type(consumer_type).__name__}")
    if not isinstance(batch_index_ack_enabled, bool):
        raise TypeError(f"batch_index_ack_enabled must be a bool, not {type(batch_index_ack_enabled).__name__}")
    own = {k: options.pop(k) for k in list(options) if k in ConsumerOptions.__dataclass_fields__}
    redelivery = "local" if consumer_type in LOCAL_TYPES else "broker"
    if own.setdefault("redelivery", redelivery) != redelivery and own["redelivery"] in REDELIVERY_MODES:
        raise ValueError(f"redelivery={own['redelivery']!r} does not work on {consumer_type.name} subscriptions "
                         f"(it is {redelivery!r} there: the broker redelivers chosen messages only on Shared "
                         "and Key_Shared); leave it out")
    nack_delay = options.pop("negative_ack_redelivery_delay_ms", MIN_NACK_DELAY_MS)
    if nack_delay != MIN_NACK_DELAY_MS:
        raise ValueError(f"negative_ack_redelivery_delay_ms is fixed at {MIN_NACK_DELAY_MS} (the client's "
                         "minimum; the tracker does the delaying): use delay_ms")
    if options.get("dead_letter_policy") is not None:
        raise ValueError("dead_letter_policy is not supported: use max_redeliveries and dead_letter_topic")
    ConsumerOptions.check(own, has_client=True)  # bad options fail before a subscription is made
    if own.get("enable_retry"):
        topic = _with_retry_topic(topic, subscription, own)
    queue_size = options.get("receiver_queue_size", CLIENT_RECEIVER_QUEUE_SIZE)
    if isinstance(queue_size, int) and not isinstance(queue_size, bool):  # else the client's own error
        # the pump takes no more ahead of the application than the client would (0: a zero queue, 1 here)
        own["prefetch"] = max(1, min(own.get("prefetch", ConsumerOptions.prefetch), queue_size))
    consumer = await client.subscribe(topic, subscription, consumer_type=consumer_type,
                                      negative_ack_redelivery_delay_ms=MIN_NACK_DELAY_MS,
                                      batch_index_ack_enabled=batch_index_ack_enabled, **options)
    try:
        tracked = TrackedConsumer(consumer, client=client, schema=options.get("schema"), **own)
    except BaseException:
        await quietly(consumer.close())
        raise
    if tracked._failures.retries is not None:  # the retry producer exists before the first retry
        try:
            await tracked._failures.retries.retry.open(own["retry_letter_topic"])
        except BaseException:
            await quietly(tracked.close())
            raise
    return tracked
