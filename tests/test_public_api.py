"""The public surface: subscribe's typed options and their errors, the exception tree."""

from __future__ import annotations

import dataclasses
import inspect

import pulsar
import pulsar.asyncio
import pytest

import nacktracker
import nacktracker.errors as errors
from nacktracker.consumer import subscription
from nacktracker.consumer.batches import BatchLimits
from nacktracker.consumer.options import ConsumerOptions
from nacktracker.consumer.subscription import (
    CLIENT_OPTIONS,
    ClientSubscribeOptions,
    client_subscribe_options,
    subscribe,
)


@pytest.fixture
async def client():
    client = pulsar.asyncio.Client("pulsar://127.0.0.1:1")  # never connected: every case fails before
    yield client
    await client.close()


@pytest.mark.parametrize("name, hint", [("precison_bits", "precision_bits"), ("delay", "delay_ms"),
                                        ("reciever_queue_size", "receiver_queue_size"), ("zzz", None)])
async def test_an_unknown_option_names_subscribe_and_the_nearest_valid_one(client, name, hint):
    with pytest.raises(TypeError) as caught:
        await subscribe(client, "t", "s", **{name: 8})
    message = str(caught.value)
    assert message.startswith(f"nacktracker.subscribe() got an unexpected keyword argument '{name}'")
    assert (f"did you mean {hint}?" in message) if hint else "did you mean" not in message


def test_every_option_of_the_clients_subscribe_is_placed():
    """Walks the installed client's signature: a new client option fails here until CLIENT_OPTIONS
    says what subscribe does with it (pass it on, set it, or do it with the consumer's machinery)."""
    params = set(inspect.signature(pulsar.asyncio.Client.subscribe).parameters) - {"self"}
    assert params == set(CLIENT_OPTIONS)
    assert all(how in ("set", "passed") or how.startswith("mapped: ") for how in CLIENT_OPTIONS.values())
    own = {f.name for f in dataclasses.fields(ConsumerOptions)}
    for how in CLIENT_OPTIONS.values():  # a mapped option names the consumer's options that do its work
        if how.startswith("mapped: "):
            assert set(how.removeprefix("mapped: ").split(", ")) <= own, how
    # the ones subscribe sets: its own arguments (the subscription's name is "subscription" there)
    assert {n for n, h in CLIENT_OPTIONS.items() if h == "set"} - {"subscription_name"} | {"subscription"} \
        <= set(inspect.signature(subscribe).parameters)


class Subscribed:
    """What subscribe gave the client and the TrackedConsumer (both replaced: nothing connects)."""

    def __init__(self, monkeypatch, client) -> None:
        self.client_kwargs: dict = {}
        self.consumer_kwargs: dict = {}

        async def client_subscribe(topic, name, **kwargs):
            self.client_kwargs = kwargs
            return object()

        def consumer(raw, *, options, **kwargs):
            self.consumer_kwargs = {**kwargs, **{f.name: getattr(options, f.name) for f in dataclasses.fields(options)}}
            return self

        monkeypatch.setattr(client, "subscribe", client_subscribe)
        monkeypatch.setattr(subscription, "TrackedConsumer", consumer)

    async def open_producers(self) -> None:
        pass


async def test_every_passed_option_reaches_the_client_as_given(client, monkeypatch):
    seen = Subscribed(monkeypatch, client)
    passed = {name: f"value-of-{name}" for name, how in CLIENT_OPTIONS.items() if how == "passed"}
    passed["batch_receive_policy"] = pulsar.ConsumerBatchReceivePolicy(5, -1, 100)
    passed["receiver_queue_size"] = 10
    await subscribe(client, "t", "s", **passed)
    assert {k: seen.client_kwargs[k] for k in passed} == passed
    assert seen.client_kwargs["negative_ack_redelivery_delay_ms"] == 100  # the adapter's path
    assert seen.consumer_kwargs["batch_receive_policy"] == BatchLimits(5, -1, 100)


async def test_the_options_that_would_fight_the_consumer_are_done_by_its_own_machinery(client, monkeypatch):
    seen = Subscribed(monkeypatch, client)
    policy = pulsar.ConsumerDeadLetterPolicy(3, "dlq-topic", "audit")
    await subscribe(client, "t", "s", negative_ack_redelivery_delay_ms=1500, unacked_messages_timeout_ms=10_000,
                    dead_letter_policy=policy)
    for name in ("unacked_messages_timeout_ms", "dead_letter_policy"):
        assert name not in seen.client_kwargs  # the client would resend or dead-letter on its own
    assert seen.client_kwargs["negative_ack_redelivery_delay_ms"] == 100
    mine = seen.consumer_kwargs
    assert (mine["delay_ms"], mine["ack_timeout_ms"], mine["max_redeliveries"], mine["dead_letter_topic"],
            mine["dead_letter_initial_subscription"]) == (1500, 10_000, 3, "dlq-topic", "audit")
    await subscribe(client, "t", "s", unacked_messages_timeout_ms=0, dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(2))
    mine = seen.consumer_kwargs  # 0: no ack timeout, as in the client; the policy's default topic: ours
    assert (mine["delay_ms"], mine["ack_timeout_ms"], mine["max_redeliveries"], mine["dead_letter_topic"]) \
        == (60_000, None, 2, None)


async def test_an_option_given_both_ways_differently_is_refused_naming_both(client):
    with pytest.raises(ValueError, match="negative_ack_redelivery_delay_ms and delay_ms disagree"):
        await subscribe(client, "t", "s", negative_ack_redelivery_delay_ms=5, delay_ms=10)
    with pytest.raises(ValueError, match="unacked_messages_timeout_ms and ack_timeout_ms disagree"):
        await subscribe(client, "t", "s", unacked_messages_timeout_ms=10_000, ack_timeout_ms=5)
    with pytest.raises(ValueError, match="max_redeliver_count and max_redeliveries disagree"):
        await subscribe(client, "t", "s", dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(3), max_redeliveries=4)
    with pytest.raises(TypeError, match="pulsar.ConsumerDeadLetterPolicy"):
        await subscribe(client, "t", "s", dead_letter_policy=object())
    with pytest.raises(TypeError, match="ConsumerBatchReceivePolicy"):
        await subscribe(client, "t", "s", batch_receive_policy=object())


def test_subscribe_spells_out_every_consumer_option_with_its_default():
    params = inspect.signature(subscribe).parameters
    own = [f for f in dataclasses.fields(ConsumerOptions) if f.init]  # (precision: built from precision_bits)
    keyword_only = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keyword_only - {"consumer_type", "batch_index_ack_enabled"} == {f.name for f in own}  # both ways
    for f in own:
        assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY, f.name
        if f.name == "redelivery":
            assert params[f.name].default is None  # from the subscription type
        elif f.name == "delay_ms":
            assert params[f.name].default is None and f.default == 60_000  # None: the client's option, or this
        elif f.name == "dedup_capacity":
            assert params[f.name].default is None is f.default and ConsumerOptions().dedup_capacity == 1_000_000
        else:
            assert params[f.name].default == f.default, f.name


def test_the_typed_pass_through_options_are_the_clients():
    assert set(ClientSubscribeOptions.__annotations__) == {n for n, h in CLIENT_OPTIONS.items() if h != "set"}
    assert client_subscribe_options() == {n for n, h in CLIENT_OPTIONS.items() if h == "passed"}
    assert nacktracker.subscribe is subscribe and nacktracker.consumer.subscribe is subscribe


def test_every_error_is_a_nacktracker_error_and_what_it_stands_for():
    stands_for = {"TrackerClosedError": RuntimeError, "SnapshotError": ValueError, "AdapterError": RuntimeError,
                  "NotReceivedError": ValueError, "TraceError": ValueError, "ColumnTypeError": TypeError,
                  "ArgumentError": TypeError,
                  "MissingExtraError": ImportError, "ExecutorCheckError": RuntimeError,
                  "BrokerStartError": RuntimeError, "DeadLetterError": RuntimeError,
                  "ReceiveTimeout": pulsar.Timeout, "ConsumerClosed": pulsar.AlreadyClosed,
                  "DeadLetterPublisherClosed": pulsar.AlreadyClosed}
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.NacktrackerError), name
        if name in stands_for:
            assert issubclass(cls, stands_for[name]), name
    for name in ("ReceiveTimeout", "ConsumerClosed"):
        assert issubclass(getattr(errors, name), pulsar.asyncio.PulsarException)
    assert issubclass(errors.ArgumentError, ValueError)  # what pulsar-client raises for those arguments


def test_the_old_import_paths_give_the_same_classes():
    from nacktracker.adapters import AdapterError
    from nacktracker.consumer import ConsumerClosed, DeadLetterError, NotReceivedError, ReceiveTimeout
    from nacktracker.events import ColumnTypeError, TraceError
    from nacktracker.snapshot import SnapshotError
    from nacktracker.testing import BrokerStartError
    from nacktracker.tracker import TrackerClosedError

    for cls in (AdapterError, ConsumerClosed, DeadLetterError, NotReceivedError, ReceiveTimeout, ColumnTypeError,
                TraceError, SnapshotError, BrokerStartError, TrackerClosedError):
        assert getattr(errors, cls.__name__) is cls
    assert nacktracker.ConsumerClosed is ConsumerClosed and nacktracker.SnapshotError is SnapshotError


def test_the_public_surface_is_pinned():
    """What ``import nacktracker`` and ``nacktracker.consumer`` offer: a name added or dropped fails here
    until it is meant (and documented). The consumer's internals (the delivery core, its verdicts,
    timing constants, file suffixes) are imported from their own modules, not offered here."""
    assert sorted(nacktracker.__all__) == sorted([
        "TimeBucketIndex", "DictIndex", "HeapIndex", "NegativeAcksTracker", "TrackerClosedError", "TrackerStats",
        "MessageKey", "NackEvent", "FixedBackoff", "MultiplierBackoff", "LoopClock", "ManualClock",
        "TrackedConsumer", "subscribe", "ReceiveTimeout", "ConsumerClosed", "Deduplicator", "NacktrackerError",
        "SnapshotError", "NotReceivedError", "DeadLetterError", "AdapterError", "TraceError", "MissingExtraError"])
    assert sorted(nacktracker.consumer.__all__) == sorted([
        "TrackedConsumer", "subscribe", "ReceiveTimeout", "ConsumerClosed", "NotReceivedError", "DeadLetterError",
        "ConsumerOptions", "ClientSubscribeOptions", "PROPERTY_REAL_TOPIC", "PROPERTY_REAL_SUBSCRIPTION",
        "PROPERTY_ORIGIN_MESSAGE_ID", "DeadLetterPublisher"])
    for module in (nacktracker, nacktracker.consumer, errors):
        for name in module.__all__:  # each resolves (the lazy ones load their module)
            assert getattr(module, name) is not None, (module.__name__, name)
    for internal in ("DeliveryCore", "Verdict", "COPY_OVERDUE_MS", "BATCHES_SUFFIX"):
        with pytest.raises(AttributeError):
            getattr(nacktracker.consumer, internal)


def test_the_pulsar_typed_errors_are_made_once_named_and_documented_as_declared():
    import ast
    from pathlib import Path

    source = ast.parse(Path(errors.__file__).read_text())
    declared = {node.name: ast.get_docstring(node) for node in ast.walk(source)
                if isinstance(node, ast.ClassDef) and node.name in errors.PULSAR_TYPED}
    for name in errors.PULSAR_TYPED:
        cls = getattr(errors, name)
        assert cls is getattr(errors, name) and (cls.__module__, cls.__qualname__) == ("nacktracker.errors", name)
        assert inspect.getdoc(cls) == declared[name], name  # the API reference renders the declaration's
