"""The application's ledger for bench/traffic.py: what one side's application
did with each message and what the consumer handed it, and the measures
derived from that (defined in bench/traffic.py's docstring).

Also the run's shape (:class:`Config`, :class:`Scenario`), shared by the
parent and the side processes. Pure: no clock (callers pass ``now_ms``), no
I/O; tested on its own (tests/test_bench.py). Messages are keyed by their number (the payload is
``b"%d" % number``): both sides see the same numbers, and a delivery that
arrives before its producer's ``send()`` returned is still recognised.
"""

from __future__ import annotations

import array
import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Optional

from nacktracker.demo.measure import summarize as quantiles

__all__ = ["Fate", "Verdict", "Plan", "Ledger", "Scenario", "Config", "SCENARIOS", "KEYS", "QUICK", "summarize",
           "TRACKED", "PLAIN"]

TRACKED, PLAIN = "tracked", "plain"  # the two sides

#: Redeliveries more than this many ms early are counted apart (the issue's bound).
EARLY_TOLERANCE_MS = 5.0


class Fate(enum.Enum):
    """Where a message stands for the application."""

    HELD = "held"  # a worker received it and has not acked or nacked it yet
    NACKED = "nacked"  # nacked; its redelivery is due at Ledger.due[number]
    DONE = "done"  # processed, waiting for a cumulative ack (cumulative scenario)
    ACKED = "acked"  # the application called acknowledge (or a cumulative ack covering it)


class Verdict(enum.Enum):
    """What the application does with a delivery (see :meth:`Ledger.delivered`)."""

    PROCESS = "process"  # a first delivery, or the redelivery of a nack: a worker handles it
    IGNORE = "ignore"  # a copy of a message the application still holds: settled as its holder settles it
    REACK = "reack"  # a copy of an acknowledged message (or an unknown one): acknowledge it again


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of an int."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


@dataclass(frozen=True)
class Plan:
    """The application's decisions, a pure function of (seed, message number,
    nacks so far): both sides nack the same messages the same number of times.

    ``nack_first``/``nack_again``: probability of nacking a first delivery / a
    redelivery; at most ``max_nacks`` nacks per message. Delays uniform in
    ``[min_delay_ms, max_delay_ms]``. Processing (the time a worker holds a
    message before deciding) is uniform in ``[0, hold_ms]``, and for a share
    ``slow_share`` of deliveries uniform in ``[0, slow_hold_ms]``.
    """

    seed: int = 1
    nack_first: float = 0.10
    nack_again: float = 0.30
    max_nacks: int = 3
    min_delay_ms: int = 100
    max_delay_ms: int = 3000
    hold_ms: float = 2.0
    slow_share: float = 0.02
    slow_hold_ms: float = 50.0

    def _u(self, number: int, nacks: int, salt: int) -> float:
        """A uniform [0, 1) draw for this message, attempt and purpose."""
        return _mix(_mix(_mix(self.seed * 4 + salt) ^ number) ^ nacks) / 2.0**64

    def nack(self, number: int, nacks: int) -> Optional[int]:
        """The delay (ms) to nack this delivery with, or None to acknowledge it."""
        if nacks >= self.max_nacks or self._u(number, nacks, 0) >= (self.nack_again if nacks else self.nack_first):
            return None
        return round(self.min_delay_ms + self._u(number, nacks, 1) * (self.max_delay_ms - self.min_delay_ms))

    def hold_s(self, number: int, nacks: int) -> float:
        """How long a worker processes this delivery (seconds)."""
        top = self.slow_hold_ms if self._u(number, nacks, 2) < self.slow_share else self.hold_ms
        return self._u(number, nacks, 3) * top / 1000.0


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    consumers: int = 1  # per side, all on that side's one subscription
    cumulative: bool = False  # Failover, one in-order worker, cumulative acks
    kill_at: Optional[float] = None  # stop the broker once this share of messages is sent, then start it again
    graceful: bool = False  # with kill_at: SIGTERM (a restart) rather than SIGKILL (a crash)
    key_shared: bool = False  # Key_Shared subscription; messages keyed, batched by key
    partitions: int = 0  # a partitioned topic of this many partitions (0: not partitioned)

    @property
    def subscription(self) -> str:
        return "Failover" if self.cumulative else "Key_Shared" if self.key_shared else "Shared"


SCENARIOS = (Scenario("shared-1"), Scenario("shared-2", consumers=2), Scenario("cumulative", cumulative=True),
             Scenario("partitioned", consumers=2, partitions=3), Scenario("key-shared", consumers=2, key_shared=True),
             Scenario("broker-restart", kill_at=0.4, graceful=True), Scenario("broker-kill", kill_at=0.4))

#: Distinct keys of the key-shared scenario (message ``n`` has key ``n % KEYS``).
KEYS = 64


@dataclasses.dataclass(frozen=True)
class Config:
    messages: int = 20_000
    rate: float = 2_000.0
    batch: int = 10
    workers: int = 8  # per consumer
    plan: Plan = Plan()
    plain_delay_ms: int = 1000
    precision_bits: int = 0
    drain_s: float = 30.0
    quiet_s: float = 3.0
    cumulative_every: int = 100
    down_s: float = 0.5
    batch_index_ack: bool = False  # both sides subscribe with batch_index_ack_enabled (the broker's setting too)


QUICK = Config(messages=2_000, rate=1_000.0, plan=Plan(max_delay_ms=1000), drain_s=10.0, quiet_s=1.0,
               cumulative_every=50)



@dataclass
class Ledger:
    """One side's application state. ``sent``: messages numbered ``0..sent-1``
    were handed to the producer; ``published``: the ids its ``send()``
    returned (number -> ``(ledger, entry, batch_index)``). Runtime: O(1) per
    call, except :meth:`cumulative_ack`, O(messages it newly covers)."""

    sent: int = 0
    published: dict = field(default_factory=dict)
    fate: dict = field(default_factory=dict)  # number -> Fate (absent: never delivered)
    due: dict = field(default_factory=dict)  # number -> due time (ms) of its pending nack
    nacks: dict = field(default_factory=dict)  # number -> nacks so far
    nacked_at: dict = field(default_factory=dict)  # number -> the consumer its pending nack went through
    acked_at: dict = field(default_factory=dict)  # number -> the consumer the application acknowledged it through
    acked_when: dict = field(default_factory=dict)  # number -> when (ms) the application acknowledged it
    resurfaced_after: array.array = field(default_factory=lambda: array.array("d"))  # ack -> copy elsewhere (ms)
    errors_elsewhere: array.array = field(default_factory=lambda: array.array("d"))  # at another consumer
    errors: array.array = field(default_factory=lambda: array.array("d"))  # redelivery errors (ms)
    first_delivery_lag: array.array = field(default_factory=lambda: array.array("d"))  # publish -> first delivery
    covered: int = -1  # cumulative scenario: every number <= covered is acknowledged
    acked: int = 0  # distinct numbers acknowledged (individually or covered)
    deliveries: int = 0
    acked_resurfaced: int = 0
    acked_resurfaced_elsewhere: int = 0  # of which at another consumer than the one that acknowledged it
    held_resurfaced: int = 0
    unexpected: int = 0
    nack_calls: int = 0
    ack_failures: int = 0
    nacked_then_covered: int = 0
    twins_settled: int = 0  # IGNOREd copies settled (acked or nacked through their consumer) as their holder did

    def delivered(self, number: int, mid: tuple, now_ms: float, since_publish_ms: float = 0.0,
                  consumer: int = 0) -> Verdict:
        """Consumer number ``consumer`` handed the application a copy of
        ``number`` (id ``mid``), ``since_publish_ms`` after the broker stored
        it (first deliveries record it: the consumer's backlog)."""
        self.deliveries += 1
        if not 0 <= number < self.sent or self.published.get(number, mid) != mid:
            self.unexpected += 1  # not one of ours, or stored twice (a broker kill): ack it, nothing else
            return Verdict.REACK
        fate = Fate.ACKED if number <= self.covered else self.fate.get(number)
        if fate is None:
            self.fate[number] = Fate.HELD
            self.first_delivery_lag.append(since_publish_ms)
            return Verdict.PROCESS
        if fate is Fate.NACKED:
            error = now_ms - self.due.pop(number)
            self.errors.append(error)
            if self.nacked_at.pop(number, consumer) != consumer:  # the broker sent it to another consumer
                self.errors_elsewhere.append(error)
            self.fate[number] = Fate.HELD
            return Verdict.PROCESS
        if fate is Fate.ACKED:
            self.acked_resurfaced += 1
            if self.acked_at.get(number, consumer) != consumer:
                self.acked_resurfaced_elsewhere += 1
                if number in self.acked_when:
                    self.resurfaced_after.append(now_ms - self.acked_when[number])
            return Verdict.REACK
        self.held_resurfaced += 1  # HELD, or DONE (processed, its cumulative ack still owed)
        return Verdict.IGNORE

    def nacked(self, number: int, now_ms: float, delay_ms: float, consumer: int = 0) -> None:
        """The application nacks ``number`` at ``now_ms`` through consumer
        number ``consumer``, asking for ``delay_ms``."""
        self.fate[number] = Fate.NACKED
        self.nacked_at[number] = consumer
        self.due[number] = now_ms + delay_ms
        self.nacks[number] = self.nacks.get(number, 0) + 1
        self.nack_calls += 1

    def acking(self, number: int, consumer: int = 0, now_ms: Optional[float] = None) -> None:
        """The application decided at ``now_ms`` to acknowledge ``number``
        through consumer number ``consumer`` (called before the ack is sent)."""
        if self.fate.get(number) is not Fate.ACKED and number > self.covered:
            self.acked += 1
        self.fate[number] = Fate.ACKED
        self.acked_at[number] = consumer
        if now_ms is not None:
            self.acked_when[number] = now_ms

    def done(self, number: int) -> None:
        """Processed; a later cumulative ack will cover it."""
        self.fate[number] = Fate.DONE

    def cumulative_ack(self, number: int) -> None:
        """A cumulative ack of ``number``: every message up to it is acknowledged
        (the producer sends in number order, so ids and numbers agree)."""
        for n in range(self.covered + 1, number + 1):
            fate = self.fate.pop(n, None)
            if fate is not Fate.ACKED:
                self.acked += 1
            if fate is Fate.NACKED:
                self.due.pop(n, None)
                self.nacked_then_covered += 1
        self.covered = max(self.covered, number)

    @property
    def settled(self) -> bool:
        """Every published message acknowledged and no nack outstanding (ask
        once the producer is done: ``published`` is complete then)."""
        return not self.due and self.acked >= len(self.published)

    def summary(self) -> dict:
        """The measures (see bench/traffic.py). ``lost`` counts published
        messages never acknowledged, split by where they were left."""
        left = [n for n in self.published if n > self.covered and self.fate.get(n) is not Fate.ACKED]
        where = {fate.value: 0 for fate in Fate if fate is not Fate.ACKED}
        where["never_delivered"] = 0
        for n in left:
            fate = self.fate.get(n)
            where["never_delivered" if fate is None else fate.value] += 1
        return {"published": len(self.published), "deliveries": self.deliveries, "lost": len(left),
                "lost_by_state": where, "acked_resurfaced": self.acked_resurfaced,
                "acked_resurfaced_elsewhere": self.acked_resurfaced_elsewhere,
                "acked_resurfaced_elsewhere_after_ms": {k: v for k, v in quantiles(self.resurfaced_after).items()
                                                        if k in ("n", "min", "p50", "max")},
                "held_resurfaced": self.held_resurfaced, "unexpected": self.unexpected,
                "nacks": self.nack_calls, "redeliveries": len(self.errors),
                "missing_redeliveries": len(self.due), "nacked_then_covered": self.nacked_then_covered,
                "twins_settled": self.twins_settled,
                "ack_failures": self.ack_failures, "error_ms": summarize(self.errors),
                "error_ms_at_another_consumer": summarize(self.errors_elsewhere),
                "first_delivery_lag_ms": {k: v for k, v in quantiles(self.first_delivery_lag).items()
                                          if k in ("n", "p50", "p99", "max")}}


def summarize(errors) -> dict:
    """:func:`nacktracker.demo.measure.summarize` (nearest-rank min, p50, p99, max,
    |error| p50/p99/max, ms) plus how many were early (< 0) and early by more
    than ``EARLY_TOLERANCE_MS``."""
    return {**quantiles(errors), "early": sum(1 for e in errors if e < 0),
            "early_beyond_tolerance": sum(1 for e in errors if e < -EARLY_TOLERANCE_MS)}
