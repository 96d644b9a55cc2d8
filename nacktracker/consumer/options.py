"""The consumer's own options, checked at the boundary before anything is
subscribed: :class:`ConsumerOptions` (what a TrackedConsumer was asked for) and
:class:`ConsumerOptionsDict` (the same options as keyword arguments, for type
checkers). Pure: no pulsar-client, no clock."""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Optional, TypedDict, Union

from .._checks import MAX_CLIENT_DELAY_MS, MAX_DUE, check_client_delay, check_default_delay, check_delay_ms, check_int
from ..precision import Precision

__all__ = ["ConsumerOptions", "ConsumerOptionsDict", "Redelivery", "SnapshotOnError", "check_timeout_ms",
           "unknown_option", "REDELIVERY_MODES", "CLIENT_RECEIVER_QUEUE_SIZE"]

#: ``redelivery``: how nacked messages come back.
Redelivery = Literal["broker", "local"]
#: ``snapshot_on_error``: what a snapshot that cannot be restored or written at close does.
SnapshotOnError = Literal["raise", "ignore"]

#: How nacked messages come back (:attr:`ConsumerOptions.redelivery`).
REDELIVERY_MODES = ("broker", "local")
#: The client's default ``receiver_queue_size``.
CLIENT_RECEIVER_QUEUE_SIZE = 1000
#: The largest ``max_redeliveries``: Java's ``maxRedeliverCount`` and ``RECONSUMETIMES`` are ``int``.
MAX_REDELIVERIES = (1 << 31) - 1
#: Names other clients (or a slip) use for an option, and the option meant.
OPTION_ALIASES = {"retry_enable": "enable_retry", "enableRetry": "enable_retry", "retryEnable": "enable_retry",
                  "max_redeliver_count": "max_redeliveries", "maxRedeliverCount": "max_redeliveries",
                  "dead_letter_topic_name": "dead_letter_topic", "deadLetterTopic": "dead_letter_topic",
                  "retry_letter_topic_name": "retry_letter_topic", "retryLetterTopic": "retry_letter_topic",
                  "ack_timeout": "ack_timeout_ms", "ackTimeout": "ack_timeout_ms",
                  "negative_ack_redelivery_delay": "delay_ms", "nack_delay_ms": "delay_ms"}


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
    snapshot_on_error: SnapshotOnError = "raise"
    dedup: bool = True
    dedup_capacity: int = 1_000_000
    #: "broker": nacked messages come back through the client's nack path (Shared, Key_Shared);
    #: "local": from this consumer's memory (Exclusive, Failover: see adapters/local.py)
    redelivery: Redelivery = "broker"
    #: Java's enableRetry: reconsume_later() and the retry letter topic (subscribe() names it and subscribes)
    enable_retry: bool = False
    retry_letter_topic: Optional[str] = None
    retry_lead_ms: int = 2_000  # retries ask the broker for delivery this much before due (consumer/retries.py)
    #: ack timeout (Java's ackTimeout, PIP-130's ackTimeoutRedeliveryBackoff): consumer/ack_timeout.py
    ack_timeout_ms: Optional[int] = None
    ack_timeout_backoff: Optional[Callable[[int], int]] = None

    @classmethod
    def check(cls, options: dict[str, Any], has_client: bool) -> ConsumerOptions:
        """Validated options; ``TypeError``/``ValueError`` for anything wrong."""
        for name in options:
            if name not in cls.__dataclass_fields__:
                raise unknown_option("TrackedConsumer", name, cls.__dataclass_fields__)
        o = dict(options)
        o["delay_ms"] = check_default_delay("delay_ms", o.get("delay_ms", 60_000))
        Precision.of(o.get("precision_bits", 0))
        for name in ("lead_ms", "min_gap_ms"):
            if o.get(name) is not None:
                check_default_delay(name, o[name])
        backoff = o.get("backoff")
        if backoff is not None and not callable(backoff):
            raise TypeError(f"backoff must be callable, not {type(backoff).__name__}")
        if o.get("max_redeliveries") is not None:
            limit = f"from 1 to {MAX_REDELIVERIES} (redeliveries before a message is dead-lettered)"
            try:
                redeliveries = check_int("max_redeliveries", o["max_redeliveries"], MAX_REDELIVERIES)
            except ValueError:
                raise ValueError(f"max_redeliveries must be {limit}, got {o['max_redeliveries']}") from None
            if redeliveries < 1:
                raise ValueError(f"max_redeliveries must be {limit}, got {redeliveries}")
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
        o["retry_lead_ms"] = check_client_delay("retry_lead_ms", o["retry_lead_ms"])
    if o.get("enable_retry"):  # reconsume_later() without delay_ms sends the default delay to the client
        check_client_delay("delay_ms (the default delay of reconsume_later with enable_retry)", o.get("delay_ms", 0))
        top = getattr(o.get("backoff"), "max_delay_ms", getattr(o.get("backoff"), "delay_ms", None))
        if isinstance(top, int) and top > MAX_CLIENT_DELAY_MS:
            raise ValueError(f"backoff's longest delay must be <= {MAX_CLIENT_DELAY_MS} ms with enable_retry (a "
                             f"retry letter's delay goes to the client, which holds a C int of ms), got {top}")
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




class ConsumerOptionsDict(TypedDict, total=False):
    """:class:`ConsumerOptions` as keyword arguments (``TrackedConsumer(consumer, **options)``):
    what a type checker holds them to. Paths may be ``os.PathLike``; delays may be floats (rounded up)."""

    delay_ms: float
    precision_bits: int
    backoff: Optional[Callable[[int], int]]
    max_redeliveries: Optional[int]
    dead_letter_topic: Optional[str]
    dead_letter_initial_subscription: Optional[str]
    lead_ms: Optional[float]
    min_gap_ms: Optional[float]
    prefetch: int
    snapshot_path: Union[str, os.PathLike[str], None]
    snapshot_interval_s: Optional[float]
    snapshot_on_error: SnapshotOnError
    dedup: bool
    dedup_capacity: Optional[int]
    redelivery: Redelivery
    enable_retry: bool
    retry_letter_topic: Optional[str]
    retry_lead_ms: float
    ack_timeout_ms: Optional[float]
    ack_timeout_backoff: Optional[Callable[[int], int]]


def unknown_option(where: str, name: str, valid: Iterable[str]) -> TypeError:
    """The ``TypeError`` for an unknown keyword option ``name`` of ``where``
    (``"nacktracker.subscribe"``), naming the nearest valid option when one is
    close (:func:`difflib.get_close_matches`)."""
    names = list(valid)
    alias = OPTION_ALIASES.get(name)
    close = [alias] if alias in names else difflib.get_close_matches(name, names, n=1)
    hint = f": did you mean {close[0]}?" if close else ""
    return TypeError(f"{where}() got an unexpected keyword argument {name!r}{hint}")
