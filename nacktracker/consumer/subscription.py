"""Subscribing: :func:`subscribe`, the usual way to make a
:class:`~nacktracker.consumer.shell.TrackedConsumer`, with its own options typed
and pulsar-client's own subscribe options passed through."""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable, Optional, TypedDict, Union, Unpack

import pulsar
import pulsar.asyncio as pulsar_asyncio

from ..adapters.pulsar import MIN_NACK_DELAY_MS
from .dead_letters import quietly
from .options import (CLIENT_RECEIVER_QUEUE_SIZE, REDELIVERY_MODES, ConsumerOptions, Redelivery, SnapshotOnError,
                      unknown_option)
from .retry_letters import MAX_RECONSUMETIMES, full_topic_name, retry_dead_letter_topic, retry_letter_topic
from .shell import TrackedConsumer

__all__ = ["subscribe", "ClientSubscribeOptions", "client_subscribe_options"]

#: Subscription types whose broker redelivers only everything unacknowledged: nacks are redelivered locally.
LOCAL_TYPES = (pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover)


class ClientSubscribeOptions(TypedDict, total=False):
    """pulsar-client's own ``pulsar.asyncio.Client.subscribe`` options that
    :func:`subscribe` passes through as they are (pulsar-client 3.13's; a
    newer client's extra ones pass too, unchecked by type checkers). Their
    meaning: pulsar-client's documentation. ``negative_ack_redelivery_delay_ms``
    is fixed (the tracker delays) and ``dead_letter_policy`` refused (use
    ``max_redeliveries``)."""

    schema: pulsar.schema.Schema
    receiver_queue_size: int
    max_total_receiver_queue_size_across_partitions: int
    consumer_name: Optional[str]
    unacked_messages_timeout_ms: Optional[int]
    broker_consumer_stats_cache_time_ms: int
    negative_ack_redelivery_delay_ms: int
    is_read_compacted: bool
    properties: Optional[dict[str, str]]
    initial_position: pulsar.InitialPosition
    crypto_key_reader: Optional[pulsar.CryptoKeyReader]
    replicate_subscription_state_enabled: bool
    max_pending_chunked_message: int
    auto_ack_oldest_chunked_message_on_queue_full: bool
    start_message_id_inclusive: bool
    batch_receive_policy: Optional[pulsar.ConsumerBatchReceivePolicy]
    key_shared_policy: Optional[pulsar.ConsumerKeySharedPolicy]
    regex_subscription_mode: pulsar.RegexSubscriptionMode
    crypto_failure_action: pulsar.ConsumerCryptoFailureAction
    is_pattern_topic: bool


@functools.cache
def client_subscribe_options() -> frozenset[str]:
    """The keyword options the installed client's ``pulsar.asyncio.Client.subscribe``
    takes beyond the ones :func:`subscribe` sets itself (read from its signature)."""
    own = {"self", "topic", "subscription_name", "consumer_type", "batch_index_ack_enabled", "dead_letter_policy"}
    return frozenset(inspect.signature(pulsar_asyncio.Client.subscribe).parameters) - own


def _with_retry_topic(topic: Union[str, list[str]], subscription: str, own: dict[str, Any]) -> list[str]:
    """Java's ``enableRetry`` defaults, set in ``own``: the retry topic (of the
    first topic), the dead-letter topic beside it, ``max_redeliveries`` 16.
    Returns the topics to subscribe to (the retry topic added)."""
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


async def subscribe(client: pulsar_asyncio.Client, topic: Union[str, list[str]], subscription: str, *,
                    consumer_type: pulsar.ConsumerType = pulsar.ConsumerType.Shared,
                    batch_index_ack_enabled: bool = False,
                    delay_ms: float = 60_000, precision_bits: int = 0, backoff: Optional[Callable[[int], int]] = None,
                    max_redeliveries: Optional[int] = None, dead_letter_topic: Optional[str] = None,
                    dead_letter_initial_subscription: Optional[str] = None, lead_ms: Optional[float] = None,
                    min_gap_ms: Optional[float] = None, prefetch: int = 16,
                    snapshot_path: Union[str, os.PathLike[str], None] = None,
                    snapshot_interval_s: Optional[float] = 5.0, snapshot_on_error: SnapshotOnError = "raise",
                    dedup: bool = True, dedup_capacity: Optional[int] = None, redelivery: Optional[Redelivery] = None,
                    enable_retry: bool = False, retry_letter_topic: Optional[str] = None, retry_lead_ms: float = 2_000,
                    ack_timeout_ms: Optional[float] = None, ack_timeout_backoff: Optional[Callable[[int], int]] = None,
                    **client_options: Unpack[ClientSubscribeOptions]) -> TrackedConsumer:
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
    time, no broker call (the docs' "Subscription types per broker");
    ``redelivery`` (default: from the type) may only say the same.

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
    keyword arguments go to ``client.subscribe`` (``schema``, ``receiver_queue_size``,
    ``consumer_name``, ``initial_position``, ... :class:`ClientSubscribeOptions`); any other
    name is a ``TypeError`` that names the nearest valid option. Partitioned topics work as
    any other (proven on Apache Pulsar; pulsar-lite cannot redeliver on them).

    >>> async def main(url):                                        # doctest: +SKIP
    ...     client = pulsar.asyncio.Client(url)
    ...     async with await nacktracker.subscribe(client, "t", "sub", delay_ms=500) as consumer:
    ...         async for msg in consumer:
    ...             await consumer.negative_acknowledge(msg, delay_ms=1000)
    """
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
    options: dict[str, Any] = dict(client_options)
    own: dict[str, Any] = dict(
        delay_ms=delay_ms, precision_bits=precision_bits, backoff=backoff, max_redeliveries=max_redeliveries,
        dead_letter_topic=dead_letter_topic, dead_letter_initial_subscription=dead_letter_initial_subscription,
        lead_ms=lead_ms, min_gap_ms=min_gap_ms, prefetch=prefetch, snapshot_path=snapshot_path,
        snapshot_interval_s=snapshot_interval_s, snapshot_on_error=snapshot_on_error, dedup=dedup,
        dedup_capacity=dedup_capacity, enable_retry=enable_retry, retry_letter_topic=retry_letter_topic,
        retry_lead_ms=retry_lead_ms, ack_timeout_ms=ack_timeout_ms, ack_timeout_backoff=ack_timeout_backoff)
    expected = "local" if consumer_type in LOCAL_TYPES else "broker"
    own["redelivery"] = expected if redelivery is None else redelivery
    if own["redelivery"] != expected and own["redelivery"] in REDELIVERY_MODES:
        raise ValueError(f"redelivery={own['redelivery']!r} does not work on {consumer_type.name} subscriptions "
                         f"(it is {expected!r} there: the broker redelivers chosen messages only on Shared "
                         "and Key_Shared); leave it out")
    nack_delay = options.pop("negative_ack_redelivery_delay_ms", MIN_NACK_DELAY_MS)
    if nack_delay != MIN_NACK_DELAY_MS:
        raise ValueError(f"negative_ack_redelivery_delay_ms is fixed at {MIN_NACK_DELAY_MS} (the client's "
                         "minimum; the tracker does the delaying): use delay_ms")
    if options.get("dead_letter_policy") is not None:
        raise ValueError("dead_letter_policy is not supported: use max_redeliveries and dead_letter_topic")
    options.pop("dead_letter_policy", None)
    passed_on = client_subscribe_options()
    for name in options:
        if name not in passed_on:
            raise unknown_option("nacktracker.subscribe", name, [*own, *passed_on, "consumer_type",
                                                                 "batch_index_ack_enabled"])
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
