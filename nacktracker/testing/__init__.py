"""Test brokers for tests, examples, benchmarks and the demo.

Two brokers, both started by the code that needs them on free 127.0.0.1
ports, each owned by one object and stopped by it (also when its owner dies):

* :class:`EmbeddedBroker` -- **pulsar-lite**, a small re-implementation of the
  Pulsar protocol shipped as a wheel: starts in under a second, nothing to
  download. The default for ``make demo``, the examples and the fast tests.
  Its differences from Apache Pulsar (:mod:`nacktracker.testing.lite`) are
  what it cannot show: no redelivery on partitioned topics or on
  Exclusive/Failover, whole-entry redelivery with batch-index acks ignored,
  redelivery counts reset on restart, ``deliver_after`` ignored.
* :class:`ApacheBroker` -- **Apache Pulsar** standalone, from Maven Central
  (Java 17+ and Maven): the truth for Pulsar's semantics
  (:mod:`nacktracker.testing.apache`).

From a shell, ``python -m nacktracker.testing apache [--set KEY=VALUE ...]``
(or ``lite``) starts one and prints ``PULSAR_URL=...`` (and, for Apache
Pulsar, ``PULSAR_ADMIN_URL=...``) once it is ready; it runs until SIGTERM,
SIGINT or the death of its parent.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Iterator, Union

from ..errors import BrokerStartError
from ._process import free_port
from .apache import PULSAR_VERSION, ApacheBroker
from .lite import EmbeddedBroker

__all__ = ["EmbeddedBroker", "ApacheBroker", "PULSAR_VERSION", "BrokerStartError", "pulsar_service",
           "broker_url", "make_broker", "BROKER_KINDS", "free_port"]

log = logging.getLogger(__name__)

#: The broker kinds :func:`make_broker` and :func:`pulsar_service` take.
BROKER_KINDS = ("lite", "apache")


def make_broker(kind: str = "lite", **options: Any) -> Union[EmbeddedBroker, ApacheBroker]:
    """A broker of ``kind`` (``"lite"`` or ``"apache"``), not started; ``options`` go to its constructor."""
    if kind == "lite":
        return EmbeddedBroker(**options)
    if kind == "apache":
        return ApacheBroker(**options)
    raise ValueError(f"unknown broker kind {kind!r}: expected one of {', '.join(BROKER_KINDS)}")


@contextlib.contextmanager
def pulsar_service(kind: str = "lite", **broker_options: Any) -> Iterator[str]:
    """Yield a Pulsar service URL for a test, example or demo.

    If ``$PULSAR_URL`` is set, yield it and start nothing; otherwise run a
    broker of ``kind`` (``broker_options`` go to its constructor) for the
    duration of the block.
    """
    url = os.environ.get("PULSAR_URL")
    if url:
        log.info("using PULSAR_URL=%s", url)
        yield url
        return
    with make_broker(kind, **broker_options) as broker:
        yield broker.url


broker_url = pulsar_service  # the name some briefs use
