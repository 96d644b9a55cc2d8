"""Adapters: how due messages get back to the consumer.

``RedeliveryAdapter`` is the protocol; ``MemoryAdapter`` records calls (tests);
``PulsarAdapter`` drives a real pulsar-client consumer (imported lazily so the
core never needs pulsar-client).
"""

from .base import RedeliveryAdapter
from .memory import AdapterError, MemoryAdapter, RedeliveryCall

__all__ = ["RedeliveryAdapter", "MemoryAdapter", "RedeliveryCall", "AdapterError", "PulsarAdapter"]


def __getattr__(name: str) -> type:
    if name == "PulsarAdapter":
        from .pulsar import PulsarAdapter

        return PulsarAdapter
    raise AttributeError(name)
