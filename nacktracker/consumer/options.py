"""The consumer's own options, one object from :func:`~nacktracker.subscribe` to the index:
:class:`ConsumerOptions` (what a TrackedConsumer was asked for), checked when it is made (once, at
the boundary, before anything is subscribed), its defaults written once (its fields), its
:class:`~nacktracker.precision.Precision` built once and handed down to the delivery core, the
tracker and its index. Pure: no pulsar-client, no clock."""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterable, Literal, Mapping, Optional

from .._checks import MAX_CLIENT_DELAY_MS, MAX_DUE, check_client_delay, check_default_delay, check_delay_ms, check_int
from ..precision import Precision

__all__ = ["ConsumerOptions", "Redelivery", "SnapshotOnError", "check_timeout_ms",
           "unknown_option", "REDELIVERY_MODES", "CLIENT_RECEIVER_QUEUE_SIZE"]

#: ``redelivery``: how nacked messages come back.
Redelivery = Literal["broker", "local"]
#: ``snapshot_on_error``: what a snapshot that cannot be restored or written at close does.
SnapshotOnError = Literal["raise", "ignore"]

#: How nacked messages come back (:attr:`ConsumerOptions.redelivery`).
REDELIVERY_MODES = ("broker", "local")
#: The client's default ``receiver_queue_size``.
CLIENT_RECEIVER_QUEUE_SIZE = 1000
#: The deduplicator's default capacity (``dedup_capacity``): acknowledged ids remembered.
DEDUP_CAPACITY = 1_000_000
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
    """What a TrackedConsumer was asked for (see :func:`subscribe`): checked when made
    (``TypeError``/``ValueError`` for anything wrong), paths made absolute, delays in whole ms.
    ``delay_ms=None`` and ``dedup_capacity=None`` mean the default. ``precision``: built once from
    ``precision_bits`` (floor: a redelivery may come early, never late), used by every layer below.

    The options (the docs' consumer guide has a table): ``delay_ms`` (60 000, or the client's
    ``negative_ack_redelivery_delay_ms`` when given), ``precision_bits``
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
    """

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
    #: ids the deduplicator remembers (None: :data:`DEDUP_CAPACITY`; made that when checked)
    dedup_capacity: Optional[int] = None
    #: "broker": nacked messages come back through the client's nack path (Shared, Key_Shared);
    #: "local": from this consumer's memory (Exclusive, Failover: see adapters/local.py)
    redelivery: Redelivery = "broker"
    #: Java's enableRetry: reconsume_later() and the retry letter topic (subscribe() names it and subscribes)
    enable_retry: bool = False
    retry_letter_topic: Optional[str] = None
    retry_lead_ms: int = 2_000  # retries ask the broker for delivery this much before due (consumer/letters/retry.py)
    #: ack timeout (Java's ackTimeout, PIP-130's ackTimeoutRedeliveryBackoff): consumer/ack_timeout.py
    ack_timeout_ms: Optional[int] = None
    ack_timeout_backoff: Optional[Callable[[int], int]] = None
    precision: Precision = field(init=False, repr=False, compare=False)

    @classmethod
    def of(cls, arguments: Mapping[str, Any], **overrides: Any) -> ConsumerOptions:
        """The options named in ``arguments`` (a caller's keyword arguments: other names are left out, so
        ``subscribe`` hands its ``locals()``), with ``overrides`` (the client options done by the consumer,
        Java's retry defaults) taking their place. Checked once, here."""
        given = {f.name: arguments[f.name] for f in fields(cls) if f.init and f.name in arguments}
        return cls(**{**given, **overrides})

    @classmethod
    def check(cls, options: Mapping[str, Any], has_client: Optional[bool] = None) -> ConsumerOptions:
        """Options from keyword arguments by name, an unknown one refused naming the nearest valid option;
        ``has_client``: also :meth:`require_client`."""
        for name in options:
            if name not in cls.__dataclass_fields__ or name == "precision":
                raise unknown_option("ConsumerOptions", name, [f.name for f in fields(cls) if f.init])
        checked = cls(**options)
        if has_client is not None:
            checked.require_client(has_client)
        return checked

    def require_client(self, has_client: bool) -> None:
        """The options that publish (dead and retry letters) need the client: ``ValueError`` without it."""
        if not has_client and self.max_redeliveries is not None:
            raise ValueError("max_redeliveries needs the client (to publish dead letters)")
        if not has_client and self.enable_retry:
            raise ValueError("enable_retry needs the client (to publish retry letters)")

    def __post_init__(self) -> None:
        o = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        if o["delay_ms"] is None:
            o["delay_ms"] = type(self).delay_ms
        o["delay_ms"] = check_default_delay("delay_ms", o["delay_ms"])
        precision = Precision.of(o["precision_bits"])
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
        if o["redelivery"] not in REDELIVERY_MODES:
            raise ValueError(f"redelivery must be 'broker' or 'local', got {o['redelivery']!r}")
        if check_int("prefetch", o["prefetch"]) < 1:
            raise ValueError("prefetch must be >= 1")
        _check_reliability(o)
        _check_failure_options(o)
        if o.get("snapshot_path") is not None:
            o["snapshot_path"] = os.path.abspath(os.fspath(o["snapshot_path"]))
        if o["dedup_capacity"] is None:
            o["dedup_capacity"] = DEDUP_CAPACITY
        for name, value in o.items():  # the checked values (whole ms, absolute paths, defaults for None)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "precision", precision)


def _check_reliability(o: dict[str, Any]) -> None:
    path = o.get("snapshot_path")
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"snapshot_path must be a str or os.PathLike, not {type(path).__name__}")
    if path is not None and not isinstance(os.fspath(path), str):
        raise TypeError("snapshot_path must be a str path (not bytes)")
    interval = o["snapshot_interval_s"]
    if interval is not None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)):
            raise TypeError(f"snapshot_interval_s must be a number of seconds or None, not {type(interval).__name__}")
        if not 0 < interval < math.inf:
            raise ValueError(f"snapshot_interval_s must be > 0 (None: save only on close), got {interval}")
    if o["snapshot_on_error"] not in ("raise", "ignore"):
        raise ValueError(f"snapshot_on_error must be 'raise' or 'ignore', got {o['snapshot_on_error']!r}")
    dedup = o["dedup"]
    if not isinstance(dedup, bool):
        raise TypeError(f"dedup must be a bool, not {type(dedup).__name__}")
    if o.get("dedup_capacity") is not None:
        if not dedup:
            raise ValueError("dedup_capacity needs dedup=True")
        if check_int("dedup_capacity", o["dedup_capacity"]) < 1:
            raise ValueError("dedup_capacity must be >= 1")


def _check_failure_options(o: dict[str, Any]) -> None:
    """Retry letters and ack timeouts (see :func:`subscribe`)."""
    if not isinstance(o["enable_retry"], bool):
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
        check_client_delay("delay_ms (the default delay of reconsume_later with enable_retry)", o["delay_ms"])
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


def check_timeout_ms(timeout_ms: object, name: str = "timeout_ms") -> int:
    """A receive timeout in whole ms: as a delay (no bool, NaN, negative or
    non-number), and no later than the tracker's due times reach (a larger
    one would overflow the event loop's float seconds). ``name``: the
    argument's name in the errors (the sync face's is ``timeout_millis``)."""
    checked = check_delay_ms(name, timeout_ms)
    if checked > MAX_DUE:
        raise ValueError(f"{name} must be <= {MAX_DUE}, got {checked}")
    return checked


def unknown_option(where: str, name: str, valid: Iterable[str]) -> TypeError:
    """The ``TypeError`` for an unknown keyword option ``name`` of ``where``
    (``"nacktracker.subscribe"``), naming the nearest valid option when one is
    close (:func:`difflib.get_close_matches`)."""
    names = list(valid)
    alias = OPTION_ALIASES.get(name)
    close = [alias] if alias in names else difflib.get_close_matches(name, names, n=1)
    hint = f": did you mean {close[0]}?" if close else ""
    return TypeError(f"{where}() got an unexpected keyword argument {name!r}{hint}")
