"""Where pulsar-client 3.x keeps what nacktracker needs and offers no public way to reach: the one module
that knows its Python wrappers' private names.

pulsar-client's Python classes wrap the C++ objects of its extension module ``_pulsar``. Its 3.x
releases lay them out as:

* ``pulsar.Client`` and ``pulsar.asyncio.Client``: the C++ client in ``_client`` (``pulsar.asyncio.Client``
  builds a ``pulsar.Client`` and keeps only its ``_client``);
* ``pulsar.Consumer`` and ``pulsar.asyncio.Consumer``: the C++ consumer in ``_consumer``, the schema in
  ``_schema``;
* ``pulsar.Message``: the C++ message in ``_message``, the schema its ``value()`` decodes with in
  ``_schema`` (``pulsar.asyncio.Consumer.receive`` fills a bare ``pulsar.Message()`` with both).

Public ways come first where the client has them: ``pulsar.MessageId.wrap`` wraps a C++ message id, and a
``pulsar.MessageId``'s own getters give its fields. Each private name is read or written once here, and
``tests/adapters/test_pulsar_layout.py`` checks this layout against the installed pulsar-client: a release
that moves a name fails there, not in a consumer. Callers of :func:`raw_consumer` and :func:`raw_client`
that meet another layout (``None``) fall back on the client's public methods.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Callable

import pulsar
import pulsar.asyncio as pulsar_asyncio

__all__ = ["raw_client", "asyncio_client", "raw_consumer", "consumer_schema", "raw_message", "fill_message"]


def raw_client(client: Any) -> Any:
    """The C++ client (``_pulsar.Client``) of a ``pulsar.Client`` or ``pulsar.asyncio.Client``; ``None``
    for an object laid out otherwise. O(1)."""
    return getattr(client, "_client", None)


def asyncio_client(raw: Any) -> pulsar_asyncio.Client:
    """A ``pulsar.asyncio.Client`` over the C++ client ``raw``: the object ``pulsar.asyncio.Client()`` makes
    around the C++ client it creates, minus a second connection pool. Closing it closes ``raw``. O(1)."""
    wrapper = pulsar_asyncio.Client.__new__(pulsar_asyncio.Client)
    wrapper._client = raw
    return wrapper


def raw_consumer(consumer: Any) -> Any:
    """The C++ consumer (``_pulsar.Consumer``) of a ``pulsar.Consumer`` or ``pulsar.asyncio.Consumer``;
    ``None`` for an object laid out otherwise. O(1)."""
    return getattr(consumer, "_consumer", None)


def consumer_schema(consumer: Any) -> Any:
    """The schema of a ``pulsar.Consumer`` or ``pulsar.asyncio.Consumer`` (what its messages' ``value()``
    decodes with); ``None`` for an object laid out otherwise. O(1)."""
    return getattr(consumer, "_schema", None)


#: The C++ message (``_pulsar.Message``) of a ``pulsar.Message``: ``raw_message(msg)``. ``AttributeError``
#: for an object that has none. A C getter made once (every receive and ack calls it: ~30 ns, no Python frame).
raw_message: Callable[[pulsar.Message], Any] = attrgetter("_message")


def fill_message(msg: pulsar.Message, raw: Any, schema: Any) -> None:
    """Make ``msg`` (a bare ``pulsar.Message``, or an instance of a subclass) the wrapper of the C++ message
    ``raw`` whose ``value()`` decodes with ``schema``, as ``pulsar.asyncio.Consumer.receive`` does. O(1)."""
    msg._message = raw
    msg._schema = schema
