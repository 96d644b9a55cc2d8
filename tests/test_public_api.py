"""The public surface: subscribe's typed options and their errors, the exception tree."""

from __future__ import annotations

import dataclasses
import inspect

import pulsar
import pulsar.asyncio
import pytest

import nacktracker
import nacktracker.errors as errors
from nacktracker.consumer.options import ConsumerOptions, ConsumerOptionsDict
from nacktracker.consumer.subscription import ClientSubscribeOptions, client_subscribe_options, subscribe


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


async def test_pulsar_options_are_still_refused_where_they_were(client):
    with pytest.raises(ValueError, match="dead_letter_policy is not supported"):
        await subscribe(client, "t", "s", dead_letter_policy=object())
    with pytest.raises(ValueError, match="negative_ack_redelivery_delay_ms is fixed"):
        await subscribe(client, "t", "s", negative_ack_redelivery_delay_ms=5)


def test_subscribe_spells_out_every_consumer_option_with_its_default():
    params = inspect.signature(subscribe).parameters
    for f in dataclasses.fields(ConsumerOptions):
        assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY, f.name
        if f.name == "redelivery":
            assert params[f.name].default is None  # from the subscription type
        elif f.name == "dedup_capacity":
            assert params[f.name].default is None and f.default == 1_000_000  # None: the default
        else:
            assert params[f.name].default == f.default, f.name
    assert set(ConsumerOptionsDict.__annotations__) == {f.name for f in dataclasses.fields(ConsumerOptions)}


def test_the_typed_pass_through_options_are_the_clients():
    assert set(ClientSubscribeOptions.__annotations__) <= client_subscribe_options()
    assert nacktracker.subscribe is subscribe and nacktracker.consumer.subscribe is subscribe


def test_every_error_is_a_nacktracker_error_and_what_it_stands_for():
    stands_for = {"TrackerClosedError": RuntimeError, "SnapshotError": ValueError, "AdapterError": RuntimeError,
                  "NotReceivedError": ValueError, "TraceError": ValueError, "ColumnTypeError": TypeError,
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
