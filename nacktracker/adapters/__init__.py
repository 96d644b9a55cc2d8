"""Adapters: how due messages get back to the consumer.

``RedeliveryAdapter`` is the protocol; ``MemoryAdapter`` records calls (tests);
``LocalRedeliveryAdapter`` hands kept messages back to the consumer (Exclusive
and Failover subscriptions, where the broker cannot redeliver chosen ones);
``PulsarAdapter`` drives a real pulsar-client consumer (imported lazily so the
core never needs pulsar-client).
"""

from ..errors import AdapterError
from .base import RedeliveryAdapter
from .local import HandBack, LocalRedeliveryAdapter
from .memory import MemoryAdapter, RedeliveryCall

__all__ = ["RedeliveryAdapter", "MemoryAdapter", "RedeliveryCall", "AdapterError", "PulsarAdapter",
           "LocalRedeliveryAdapter", "HandBack"]


def __getattr__(name: str) -> type:
    if name == "PulsarAdapter":
        from .pulsar import PulsarAdapter

        return PulsarAdapter
    raise AttributeError(name)
