"""Subscribing: :func:`subscribe`, the usual way to make a
:class:`~nacktracker.consumer.shell.TrackedConsumer`, with its own options typed
and pulsar-client's own subscribe options passed through."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from typing import Any, Callable, Optional, TypedDict, Union, Unpack

import pulsar
import pulsar.asyncio as pulsar_asyncio

from ..adapters.pulsar import MIN_NACK_DELAY_MS
from .batches import BatchLimits
from .letters.java import MAX_RECONSUMETIMES, full_topic_name, retry_dead_letter_topic, retry_letter_topic
from .letters.publisher import quietly
from .options import (
    CLIENT_RECEIVER_QUEUE_SIZE,
    REDELIVERY_MODES,
    ConsumerOptions,
    Redelivery,
    SnapshotOnError,
    unknown_option,
)
from .shell import TrackedConsumer, topic_names

__all__ = ["subscribe", "ClientSubscribeOptions", "client_subscribe_options", "CLIENT_OPTIONS"]

#: Subscription types whose broker redelivers only everything unacknowledged: nacks are redelivered locally.
LOCAL_TYPES = (pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover)


#: What :func:`subscribe` does with each parameter of pulsar-client's ``pulsar.asyncio.Client.subscribe``
#: (3.13): ``"set"`` by subscribe itself from its own arguments; ``"passed"`` to the client as given;
#: ``"mapped"`` onto the consumer's own machinery (the value: the option that does the work, which the
#: client is not given, so that it does not fight the consumer). tests/test_public_api.py walks the
#: installed client's signature against this table: a new client option fails it until it is placed.
CLIENT_OPTIONS: dict[str, str] = {
    "topic": "set", "subscription_name": "set", "consumer_type": "set", "batch_index_ack_enabled": "set",
    # the client's own nack tracker only forwards the consumer's requests, at its minimum delay
    "negative_ack_redelivery_delay_ms": "mapped: delay_ms",
    # the client's ack timeout resends copies the consumer drops as held: the consumer times acks itself
    "unacked_messages_timeout_ms": "mapped: ack_timeout_ms",
    # the client's dead letters count the client's redeliveries; the consumer counts and publishes its own
    "dead_letter_policy": "mapped: max_redeliveries, dead_letter_topic, dead_letter_initial_subscription",
    "batch_receive_policy": "passed",  # and read by TrackedConsumer.batch_receive()
    **dict.fromkeys(["schema", "receiver_queue_size", "max_total_receiver_queue_size_across_partitions",
                     "consumer_name", "broker_consumer_stats_cache_time_ms", "is_read_compacted", "properties",
                     "initial_position", "crypto_key_reader", "replicate_subscription_state_enabled",
                     "max_pending_chunked_message", "auto_ack_oldest_chunked_message_on_queue_full",
                     "start_message_id_inclusive", "key_shared_policy", "regex_subscription_mode",
                     "crypto_failure_action", "is_pattern_topic"], "passed"),
}


class ClientSubscribeOptions(TypedDict, total=False):
    """pulsar-client's own ``pulsar.asyncio.Client.subscribe`` options that
    :func:`subscribe` takes (pulsar-client 3.13's; a newer client's extra ones
    are refused until placed in :data:`CLIENT_OPTIONS`). Their meaning:
    pulsar-client's documentation. Three do their work through the consumer's
    own machinery: ``negative_ack_redelivery_delay_ms`` is ``delay_ms``,
    ``unacked_messages_timeout_ms`` is ``ack_timeout_ms`` and
    ``dead_letter_policy`` is ``max_redeliveries``, ``dead_letter_topic`` and
    ``dead_letter_initial_subscription``."""

    schema: pulsar.schema.Schema
    receiver_queue_size: int
    max_total_receiver_queue_size_across_partitions: int
    consumer_name: Optional[str]
    unacked_messages_timeout_ms: Optional[int]
    broker_consumer_stats_cache_time_ms: int
    negative_ack_redelivery_delay_ms: int
    dead_letter_policy: Optional[pulsar.ConsumerDeadLetterPolicy]
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
    """The keyword options of the installed client's ``pulsar.asyncio.Client.subscribe``
    that :func:`subscribe` passes through (read from its signature; placed in
    :data:`CLIENT_OPTIONS`)."""
    params = set(inspect.signature(pulsar_asyncio.Client.subscribe).parameters) - {"self"}
    return frozenset(name for name in params if CLIENT_OPTIONS.get(name) == "passed")


def _mapped_options(options: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """Take the client options the consumer does itself (:data:`CLIENT_OPTIONS` ``"mapped"``) out of
    ``options``: the consumer's options they set (``arguments``: subscribe's own, as given); the same
    thing said twice, differently: ``ValueError``."""
    mapped: dict[str, Any] = {}

    def take(name: str, value: Any, client_name: str) -> None:
        if arguments.get(name) is not None and arguments[name] != value:
            raise ValueError(f"{client_name} and {name} disagree ({value!r} and {arguments[name]!r}): "
                             f"{client_name} is {name} here; pass one of them")
        mapped[name] = value

    if "negative_ack_redelivery_delay_ms" in options:
        take("delay_ms", options.pop("negative_ack_redelivery_delay_ms"), "negative_ack_redelivery_delay_ms")
    timeout = options.pop("unacked_messages_timeout_ms", None)
    if timeout:  # 0 or None: off, as in the client
        take("ack_timeout_ms", timeout, "unacked_messages_timeout_ms")
    policy = options.pop("dead_letter_policy", None)
    if policy is not None:
        if not isinstance(policy, pulsar.ConsumerDeadLetterPolicy):
            raise TypeError(f"dead_letter_policy must be a pulsar.ConsumerDeadLetterPolicy, not {type(policy).__name__}")
        take("max_redeliveries", policy.max_redeliver_count, "dead_letter_policy.max_redeliver_count")
        if policy.dead_letter_topic:
            take("dead_letter_topic", policy.dead_letter_topic, "dead_letter_policy.dead_letter_topic")
        if policy.initial_subscription_name:
            take("dead_letter_initial_subscription", policy.initial_subscription_name,
                 "dead_letter_policy.initial_subscription_name")
    return mapped


def _with_retry_topic(topic: Union[str, list[str]], subscription: str,
                      options: ConsumerOptions) -> tuple[list[str], ConsumerOptions]:
    """Java's ``enableRetry`` defaults: the retry topic (of the first topic), the dead-letter topic beside
    it, ``max_redeliveries`` 16. Returns the topics to subscribe to (the retry topic added) and the
    options with those defaults."""
    topics = [topic] if isinstance(topic, str) else list(topic)
    if not topics or not all(isinstance(t, str) for t in topics):
        raise TypeError("enable_retry needs a topic name or a list of them (not a pattern)")
    first = topics[0]
    retry = full_topic_name(options.retry_letter_topic or retry_letter_topic(first, subscription))
    if retry not in (full_topic_name(t) for t in topics):
        topics.append(retry)
    return topics, dataclasses.replace(
        options, retry_letter_topic=retry,
        dead_letter_topic=options.dead_letter_topic or retry_dead_letter_topic(first, subscription),
        max_redeliveries=MAX_RECONSUMETIMES if options.max_redeliveries is None else options.max_redeliveries)


def _check_call(client: Any, subscription: Any, consumer_type: Any, batch_index_ack_enabled: Any) -> None:
    """subscribe's own arguments besides the consumer's options: ``TypeError`` for a wrong type."""
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


def _check_client_options(client_options: dict[str, Any]) -> None:
    """Every client option is one the installed client's subscribe takes (or one the consumer does
    itself): else the ``TypeError`` naming the nearest valid option."""
    passed_on = client_subscribe_options()
    for name in client_options:
        if name not in passed_on and not CLIENT_OPTIONS.get(name, "").startswith("mapped"):
            raise unknown_option("nacktracker.subscribe", name, [
                *(f.name for f in dataclasses.fields(ConsumerOptions) if f.init), *passed_on, "consumer_type",
                "batch_index_ack_enabled"])


async def subscribe(client: pulsar_asyncio.Client, topic: Union[str, list[str]], subscription: str, *,
                    consumer_type: pulsar.ConsumerType = pulsar.ConsumerType.Exclusive,
                    batch_index_ack_enabled: bool = False,
                    delay_ms: Optional[float] = None, precision_bits: int = 0, backoff: Optional[Callable[[int], int]] = None,
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
    ``TypeError``). ``consumer_type`` defaults to **Exclusive**, as the
    client's: code written for ``client.subscribe`` keeps its meaning (a
    cumulative ack works, a second consumer on the subscription is refused).
    Workers sharing a subscription with per-message nacks (the usual nack
    workload) pass ``consumer_type=pulsar.ConsumerType.Shared``: on Shared and
    Key_Shared the broker redelivers each nacked entry (possibly to another
    consumer of the subscription) and a pending nack costs bytes. On
    **Exclusive and Failover** the broker can only resend everything
    unacknowledged, so the consumer redelivers nacked messages **locally**
    (``redelivery="local"``, set here from the type): it keeps each nacked
    message (one received message per pending nack) and hands it back at its
    time, no broker call (the docs' "Subscription types per broker");
    ``redelivery`` (default: from the type) may only say the same.

    The consumer's own options (each keyword-only, its default in the signature) are the fields of
    :class:`~nacktracker.consumer.ConsumerOptions`, documented there and in the docs' consumer guide
    (a table); they become one such object, checked before anything is subscribed.

    ``batch_index_ack_enabled`` (default False) is passed to the client. Turn
    it on where the broker has ``acknowledgmentAtBatchIndexLevelEnabled``
    (Pulsar 4.1's default): acked siblings of a batch then never reach the
    subscription's other consumers. Apache Pulsar without that setting
    ignores the index acks (nothing is lost); pulsar-lite takes each index ack
    for the whole entry, and the entry's other messages are lost (both
    measured: ``tests/brokers/test_pulsar.py::test_batch_index_ack_on_a_broker_without_it``).

    The consumer is subscribed with ``negative_ack_redelivery_delay_ms=100``
    (the client's minimum; the adapter redelivers through that path). The
    client's options that would fight the consumer are done by its own
    machinery instead (:data:`CLIENT_OPTIONS`): ``negative_ack_redelivery_delay_ms``
    is ``delay_ms``, ``unacked_messages_timeout_ms`` is ``ack_timeout_ms`` (the
    message comes back to the application after that long unacknowledged) and a
    ``dead_letter_policy`` is ``max_redeliveries``, ``dead_letter_topic`` and
    ``dead_letter_initial_subscription`` (given both ways and different:
    ``ValueError``). ``batch_receive_policy`` sets :meth:`TrackedConsumer.batch_receive`'s
    limits. Other keyword arguments go to ``client.subscribe`` (``schema``,
    ``receiver_queue_size``, ``consumer_name``, ``initial_position``, ...
    :class:`ClientSubscribeOptions`); any other name is a ``TypeError`` that names
    the nearest valid option. Partitioned topics work as
    any other (proven on Apache Pulsar; pulsar-lite cannot redeliver on them).

    >>> async def main(url):                                        # doctest: +SKIP
    ...     client = pulsar.asyncio.Client(url)
    ...     async with await nacktracker.subscribe(client, "t", "sub", delay_ms=500) as consumer:
    ...         async for msg in consumer:
    ...             await consumer.negative_acknowledge(msg, delay_ms=1000)
    """
    given = locals()  # the call's arguments by name: ConsumerOptions' fields among them (a test keeps the two equal)
    _check_call(client, subscription, consumer_type, batch_index_ack_enabled)
    client_kwargs: dict[str, Any] = dict(client_options)
    expected = "local" if consumer_type in LOCAL_TYPES else "broker"
    if redelivery is not None and redelivery != expected and redelivery in REDELIVERY_MODES:
        raise ValueError(f"redelivery={redelivery!r} does not work on {consumer_type.name} subscriptions "
                         f"(it is {expected!r} there: the broker redelivers chosen messages only on Shared "
                         "and Key_Shared); leave it out")
    _check_client_options(client_kwargs)
    queue_size = client_kwargs.get("receiver_queue_size", CLIENT_RECEIVER_QUEUE_SIZE)
    if not isinstance(queue_size, int) or isinstance(queue_size, bool):
        queue_size = None  # the client's own error
    elif isinstance(prefetch, int) and not isinstance(prefetch, bool) and prefetch >= 1:
        # the pump takes no more ahead of the application than the client would (0: a zero queue, 1 here)
        prefetch = max(1, min(prefetch, queue_size))
    # bad options fail here, before a subscription is made
    options = ConsumerOptions.of(given, redelivery=redelivery or expected, prefetch=prefetch,
                                 **_mapped_options(client_kwargs, given))
    subscribed = topic_names(topic)  # as named here: the snapshot's owner and the metrics' topic (not the retry's)
    if options.enable_retry:
        topic, options = _with_retry_topic(topic, subscription, options)
    batch_limits = BatchLimits.of(client_kwargs.get("batch_receive_policy"), queue_size or CLIENT_RECEIVER_QUEUE_SIZE)
    consumer = await client.subscribe(topic, subscription, consumer_type=consumer_type,
                                      negative_ack_redelivery_delay_ms=MIN_NACK_DELAY_MS,
                                      batch_index_ack_enabled=batch_index_ack_enabled, **client_kwargs)
    try:
        tracked = TrackedConsumer(consumer, client=client, schema=client_kwargs.get("schema"),
                                  batch_receive_policy=batch_limits, topics=subscribed, options=options,
                                  pattern=bool(client_kwargs.get("is_pattern_topic")))
    except BaseException:
        await quietly(consumer.close())
        raise
    try:
        await tracked.open_producers()  # the retry producer exists before the first retry
    except BaseException:
        await quietly(tracked.close())
        raise
    return tracked
