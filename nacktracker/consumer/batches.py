"""Batch receive limits: :meth:`TrackedConsumer.batch_receive` with the client's
``ConsumerBatchReceivePolicy`` semantics (the Java and C++ clients' ``BatchReceivePolicy``).

A batch is complete once it holds ``max_messages`` messages or ``max_bytes`` bytes of
payload, or ``timeout_ms`` after the call began (with whatever it holds then, maybe
nothing). A message is added while it fits: the first always does; after it, one more
message must keep the batch within both limits, else it stays queued for the next call.
A limit of 0 or less is no limit; the client caps ``max_messages`` at the receiver queue
size. Pure: no pulsar-client, no clock (the caller times the wait).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["BatchLimits", "DEFAULT_MAX_BYTES", "DEFAULT_TIMEOUT_MS"]

#: The client's defaults without a policy: no message limit, 10 MiB, 100 ms.
DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_TIMEOUT_MS = 100


@dataclass(frozen=True)
class BatchLimits:
    """One batch's limits (``<= 0``: none). Every method is O(1).

    >>> limits = BatchLimits(max_messages=2, max_bytes=10, timeout_ms=100)
    >>> limits.fits(0, 0, 50), limits.fits(1, 5, 5), limits.fits(1, 5, 6), limits.full(2, 3)
    (True, True, False, True)
    """

    max_messages: int = -1
    max_bytes: int = DEFAULT_MAX_BYTES
    timeout_ms: int = DEFAULT_TIMEOUT_MS

    @classmethod
    def of(cls, policy: Any, receiver_queue_size: Optional[int]) -> "BatchLimits":
        """The limits of a ``pulsar.ConsumerBatchReceivePolicy`` (``None``: the client's defaults),
        ``max_messages`` capped at ``receiver_queue_size`` as the client does (a queue of 0: 1;
        ``None``: not known, no cap)."""
        if policy is None:
            return cls()
        inner = policy.policy() if callable(getattr(policy, "policy", None)) else policy
        getters = ("getMaxNumMessages", "getMaxNumBytes", "getTimeoutMs")
        if not all(callable(getattr(inner, name, None)) for name in getters):
            raise TypeError(f"batch_receive_policy must be a pulsar.ConsumerBatchReceivePolicy, "
                            f"not {type(policy).__name__}")
        messages, size, timeout = (int(getattr(inner, name)()) for name in getters)
        if receiver_queue_size is not None and messages > max(1, receiver_queue_size):
            messages = max(1, receiver_queue_size)
        return cls(messages, size, timeout)

    def fits(self, count: int, size: int, length: int) -> bool:
        """Whether a message of ``length`` bytes joins a batch of ``count`` messages, ``size`` bytes."""
        if count == 0:
            return True
        if 0 < self.max_messages < count + 1:
            return False
        return not (0 < self.max_bytes < size + length)

    def full(self, count: int, size: int) -> bool:
        """Whether a batch of ``count`` messages, ``size`` bytes, is complete by its limits."""
        return 0 < self.max_messages <= count or 0 < self.max_bytes <= size
