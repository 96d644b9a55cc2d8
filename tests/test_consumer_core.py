"""The delivery core (nacktracker.consumer.core) against its promises, no broker.

A hypothesis rule-based state machine plays broker, tracker and application
around one DeliveryCore: batched and single entries published and delivered
message by message, acks, nacks with random delays, re-nacks, the tracker's
buckets firing (``lead`` ms early), requested copies arriving early, late,
twice or at another consumer of the subscription, spontaneous copies (a
reconnect), cumulative acks, a restart restored from the snapshot's records,
``redeliver_unacknowledged_messages`` and clock advances. Checked whenever
something surfaces:

* nothing the application acknowledged surfaces again (in this process);
* nothing the application still holds surfaces again;
* a nacked message never surfaces before its due time minus the bucket
  rounding (2^bits - 1 ms; bits 0: never early);

and at the end, once every copy has arrived or gone elsewhere and the clock
has passed every deadline: every nack whose copy was not diverted surfaced
(exactly once: after surfacing it is held), and every record, request and
parked copy is gone. Records are bounded by the entries at every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from nacktracker import Deduplicator, MessageKey
from nacktracker._checks import check_precision
from nacktracker.consumer.core import DeliveryCore, Verdict

TOPIC = "t"
LEAD = 30
OVERDUE = 2_000


def key(entry: int, index: int, size: int) -> MessageKey:
    return MessageKey(1, entry, -1, index if size > 1 else -1, TOPIC)


@dataclass
class Copy:
    """A copy of an entry on its way to this consumer: the messages still to come."""

    entry: int
    remaining: list
    bucket: Optional[int] = None  # the bucket that requested it (None: the broker's own resend)
    answers: tuple = ()  # the nacks it answers: every nack of its entry made before its request


@dataclass
class Nack:
    due: int
    diverted: bool = False  # its requested copy went to another consumer: may never surface here
    lenient: bool = False   # its bucket fired before a restart: the resend may surface it early


@dataclass
class World:
    sizes: list = field(default_factory=list)       # entry -> messages in it (1: not batched)
    fresh: list = field(default_factory=list)       # first deliveries, in position order
    current: list = field(default_factory=list)     # the copy being pulled: its messages come back to back
    copies: list = field(default_factory=list)      # redelivered copies in flight
    pending: dict = field(default_factory=dict)     # the tracker: entry -> set of buckets
    held: set = field(default_factory=set)          # the application holds these
    acked: set = field(default_factory=set)         # ... acknowledged these (this process)
    nacks: dict = field(default_factory=dict)       # ... nacked these, not surfaced since
    surfaced_before: set = field(default_factory=set)


class DeliveryMachine(RuleBasedStateMachine):
    """Broker + tracker + application around one DeliveryCore."""

    @initialize(bits=st.sampled_from([0, 0, 3, 6]), dedup=st.booleans())
    def setup(self, bits, dedup):
        self.bits, self.use_dedup = bits, dedup
        self.precision = check_precision(bits, "floor")
        self.now = 1_000
        self.w = World()
        self.violations: list = []
        self.core = self._new_core()

    def _new_core(self) -> DeliveryCore:
        # the model is the reference for acked ids only with dedup; without it the core only
        # promises to remember acked siblings while their entry has a record
        return DeliveryCore(self.precision, dedup=Deduplicator(1000) if self.use_dedup else None,
                            pending=lambda k: k.entry_id in self.w.pending, overdue_ms=OVERDUE)

    # -- what the core is told --------------------------------------------------------

    def _arrive(self, k: MessageKey) -> None:
        # without dedup the core remembers only acks made while the entry had a record (unit-tested
        # below); the model checks acked ids with dedup, the default
        remembered = self.use_dedup
        verdict = self.core.arrive(k, 0, k, self.now)
        if verdict is Verdict.SURFACE:
            self._surfaced(k, remembered)

    def _surfaced(self, k: MessageKey, remembered: bool = True) -> None:
        w = self.w
        if k in w.acked and remembered:
            self.violations.append(("acked surfaced again", k, self.now))
        if k in w.held:
            self.violations.append(("held surfaced again", k, self.now))
        nack = w.nacks.pop(k, None)
        if nack is not None and not nack.lenient and self.now < nack.due - ((1 << self.bits) - 1):
            self.violations.append(("early", k, self.now, nack.due))
        w.held.add(k)
        w.acked.discard(k)  # without dedup it may come back; from now it is held again

    def _has_record(self, k: MessageKey) -> bool:
        return k.batch_index >= 0 and k.entry in self.core.records

    def _advance_to(self, target: int) -> None:
        """Move the clock, firing buckets ``LEAD`` early and releasing parked copies in time order."""
        while True:
            fires = [b - LEAD for buckets in self.w.pending.values() for b in buckets]
            wake = self.core.next_wakeup_ms()
            nxt = min(fires + ([wake] if wake is not None else []), default=None)
            if nxt is None or nxt > target:
                break
            self.now = max(self.now, math.ceil(nxt))
            for entry, buckets in list(self.w.pending.items()):
                due = sorted(b for b in buckets if b - LEAD <= self.now)
                if due:
                    # the tracker asks once: the copy brings the whole entry, its later buckets are cancelled
                    del self.w.pending[entry]
                    self.core.fired(due[0], [MessageKey(1, entry, -1, -1, TOPIC)], self.now)
                    answers = tuple(n for k, n in self.w.nacks.items() if k.entry_id == entry)
                    self.w.copies.append(Copy(entry, self._indices(entry), due[0], answers))
            for k in self.core.release(self.now):
                self._surfaced(k)
        self.now = max(self.now, target)
        for k in self.core.release(self.now):
            self._surfaced(k)

    def _indices(self, entry: int) -> list:
        size = self.w.sizes[entry]
        return [key(entry, i, size) for i in range(size)]

    # -- rules ------------------------------------------------------------------------

    @rule(size=st.sampled_from([1, 1, 2, 3, 4]))
    def publish(self, size):
        if len(self.w.sizes) < 8:
            self.w.sizes.append(size)
            self.w.fresh.append(len(self.w.sizes) - 1)

    @precondition(lambda self: self.w.current or self.w.fresh)
    @rule()
    def deliver_fresh(self):
        if not self.w.current:
            entry = self.w.fresh.pop(0)
            self.w.current = self._indices(entry)
        self._arrive(self.w.current.pop(0))

    @precondition(lambda self: self.w.current or self.w.copies)
    @rule(data=st.data())
    def deliver_copy(self, data):
        if not self.w.current:
            copy = self.w.copies.pop(data.draw(st.integers(0, len(self.w.copies) - 1)))
            self.w.current = copy.remaining
        self._arrive(self.w.current.pop(0))

    @precondition(lambda self: self.w.copies)
    @rule(data=st.data(), twice=st.booleans())
    def copy_goes_elsewhere_or_twice(self, data, twice):
        i = data.draw(st.integers(0, len(self.w.copies) - 1))
        copy = self.w.copies[i]
        if twice:  # the broker sends it again as well
            self.w.copies.append(Copy(copy.entry, list(copy.remaining), copy.bucket, copy.answers))
            return
        del self.w.copies[i]
        for k in copy.remaining:
            nack = self.w.nacks.get(k)
            # the copy carries the whole entry: every nack it was to answer surfaces over there
            if nack is not None and any(nack is a for a in copy.answers):
                nack.diverted = True

    @precondition(lambda self: self.w.sizes)
    @rule(data=st.data())
    def broker_resends(self, data):
        entry = data.draw(st.integers(0, len(self.w.sizes) - 1))
        self.w.copies.append(Copy(entry, self._indices(entry)))

    @precondition(lambda self: self.w.held)
    @rule(data=st.data())
    def ack(self, data):
        k = data.draw(st.sampled_from(sorted(self.w.held)))
        self._ack(k)

    def _ack(self, k: MessageKey) -> None:
        result = self.core.acked(k, self.now)
        if result.discard:
            self.w.pending.pop(k.entry_id, None)
        self.w.held.discard(k)
        self.w.nacks.pop(k, None)
        self.w.acked.add(k)

    @precondition(lambda self: self.w.nacks)
    @rule(data=st.data())
    def ack_a_nacked_message_by_id(self, data):
        self._ack(data.draw(st.sampled_from(sorted(self.w.nacks))))

    @precondition(lambda self: self.w.held)
    @rule(data=st.data(), delay=st.integers(0, 400))
    def nack(self, data, delay):
        k = data.draw(st.sampled_from(sorted(self.w.held)))
        assert not self.core.is_acked(k)
        due = self.now + delay
        self.w.pending.setdefault(k.entry_id, set()).add(self.core.bucket_ms(due))
        self.core.nacked(k, due, k, self.now)
        self.w.held.discard(k)
        self.w.nacks[k] = Nack(due)

    @precondition(lambda self: self.w.held or self.w.acked)
    @rule(data=st.data())
    def cumulative_ack(self, data):
        k = data.draw(st.sampled_from(sorted(self.w.held | self.w.acked)))
        self.core.acked_cumulative(k, self.now)
        covered = lambda m: (m.entry_id, m.batch_index) <= (k.entry_id, k.batch_index)  # noqa: E731
        for m in [m for m in self.w.held | set(self.w.nacks) if covered(m)]:
            self.w.held.discard(m)
            self.w.nacks.pop(m, None)
            self.w.acked.add(m)

    @rule(ms=st.sampled_from([1, 5, 20, 29, 31, 100, 250, 600]))
    def advance(self, ms):
        self._advance_to(self.now + ms)

    @precondition(lambda self: self.w.pending or self.core.next_wakeup_ms() is not None)
    @rule(offset=st.integers(0, LEAD + 2))
    def advance_into_the_lead(self, offset):
        """To the next bucket's fire time plus ``offset``: where copies arrive before due."""
        fires = [b - LEAD for buckets in self.w.pending.values() for b in buckets]
        wake = self.core.next_wakeup_ms()
        nxt = min(fires + ([wake] if wake is not None else []))
        self._advance_to(max(self.now, math.ceil(nxt) + offset))

    @rule()
    def redeliver_unacknowledged(self):
        self.core.forget_held()
        self.w.held.clear()  # the application asked for what it holds again
        if not self.use_dedup:
            self.w.acked.clear()  # ... and without dedup acked siblings of those entries come too
        for entry in range(len(self.w.sizes)):
            self.w.copies.append(Copy(entry, self._indices(entry)))

    @rule()
    def seek_to_the_start(self):
        """``seek``: the subscription is rewound, everything comes again, acked or held (issue 11)."""
        self.core.sought()
        self.w.held.clear()
        self.w.acked.clear()
        for entry in range(len(self.w.sizes)):
            self.w.copies.append(Copy(entry, self._indices(entry)))

    @rule()
    def restart_from_snapshot(self):
        """A new process: records restored (as nacktracker.consumer.persist does), the tracker's
        pending buckets kept, the application holding nothing and remembering no acks."""
        old = self.core
        self.core = self._new_core()
        records: dict = {}
        for entry, index, release, fired in old.pending_batch_nacks():
            records.setdefault(entry, []).append((index, release, fired or entry.entry_id not in self.w.pending))
        for entry, nacked in records.items():
            self.core.restore_record(entry, nacked)
        for entry in range(len(self.w.sizes)):
            self.core.note_position(TOPIC, -1, 1, entry)
        for k, nack in self.w.nacks.items():
            if k.batch_index < 0 and k.entry_id not in self.w.pending:
                nack.lenient = True  # its bucket fired: only the tracker knew it, and it is gone
        self.w.held.clear()
        self.w.acked.clear()
        for entry in range(len(self.w.sizes)):  # the broker resends everything unacknowledged
            self.w.copies.append(Copy(entry, self._indices(entry)))

    # -- checks -------------------------------------------------------------------------

    @invariant()
    def promises_kept(self):
        assert not getattr(self, "violations", []), self.violations
        if hasattr(self, "core"):
            # what the application holds, acked or nacked is "received" (issue 11: acks and nacks of
            # anything else are refused); the shell also asks the tracker (w.pending)
            # (not a nack whose copy is overdue: the core takes it to have gone to another consumer)
            live_nacks = {k for k, n in self.w.nacks.items()
                          if not (n.diverted or n.lenient) and self.now < self.core.bucket_ms(n.due) + OVERDUE}
            for k in (self.w.held | self.w.acked | live_nacks) if self.use_dedup else ():
                assert self.core.knows(k) or k.entry_id in self.w.pending, ("not known", k)
            assert len(self.core.records) <= len(self.w.sizes)
            assert len(self.core.parked) <= sum(len(self._indices(e)) for e in range(len(self.w.sizes)))

    def teardown(self):
        if not hasattr(self, "core"):
            return
        # everything settles: every copy arrives, the clock passes every deadline
        for _ in range(20):
            while self.w.current or self.w.copies or self.w.fresh:
                if not self.w.current:
                    self.w.current = self.w.copies.pop(0).remaining if self.w.copies \
                        else self._indices(self.w.fresh.pop(0))
                self._arrive(self.w.current.pop(0))
            self._advance_to(self.now + 500 + OVERDUE)
            if not self.w.copies and not self.w.pending:
                break
        assert not self.violations, self.violations
        missing = {k: n for k, n in self.w.nacks.items() if not n.diverted}
        assert not missing, f"nacked, never surfaced: {missing}"
        for k in sorted(self.w.held):
            self._ack(k)
        self._advance_to(self.now + OVERDUE + 1)
        assert (len(self.core.records), len(self.core.requested), len(self.core.parked), len(self.core.held)) \
            == (0, 0, 0, 0)


DeliveryMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None,
                                             suppress_health_check=[HealthCheck.too_slow])
test_delivery_core_keeps_its_promises = DeliveryMachine.TestCase


# -- the cases of issue 10, one named test each -----------------------------------------

def make(bits=0, dedup=True):
    pending: set = set()
    core = DeliveryCore(check_precision(bits, "floor"), dedup=Deduplicator(100) if dedup else None,
                        pending=lambda k: k.entry in pending, overdue_ms=OVERDUE)
    return core, pending


def deliver(core, keys, now):
    return [core.arrive(k, 0, k, now) for k in keys]


S, P, A, H, E = Verdict.SURFACE, Verdict.PARK, Verdict.DROP_ACKED, Verdict.DROP_HELD, Verdict.DROP_EARLY


def test_batch_of_four_acked_and_held_siblings_never_surface_again():
    """Issue 10's first case: m0 acked, m1 nacked 1000 ms, m2 nacked 1120 ms,
    each redelivery acked on arrival, m3 still held: only m1 and m2 surface
    again, each at its due time; the record ends once both are acked. The
    first bucket's copy answers both nacks (the broker sends the whole entry;
    the tracker cancels m2's bucket): m2 waits in it, parked until its time."""
    core, _ = make()
    m = [key(0, i, 4) for i in range(4)]
    assert deliver(core, m, 0) == [S] * 4
    core.acked(m[0], 0)
    core.nacked(m[1], 1000, m[1], 0)
    core.nacked(m[2], 1120, m[2], 0)
    entry = m[0].entry
    core.fired(1000, [entry], 1000 - LEAD)
    assert deliver(core, m, 990) == [A, P, P, H]  # m1 and m2 arrived early: parked until their times
    assert core.release(999) == [] and core.release(1000) == [m[1]]
    assert core.acked(m[1], 1001).discard is True  # nothing of the entry waits for a bucket
    assert core.release(1119) == [] and core.release(1120) == [m[2]]
    core.acked(m[2], 1124)
    assert deliver(core, m, 1125) == [A, A, A, H]  # a late twin of the entry: nothing surfaces
    core.release(1125 + OVERDUE)
    assert len(core.records) == 0 and core.is_acked(m[1]) and not core.is_acked(m[3])


def test_copies_at_another_consumer_expire_their_record():
    """Several consumers on one subscription: our bucket's copy went to another
    consumer. The record does not wait for it forever: it expires overdue_ms
    after its time, and a late copy then still surfaces (it is past due)."""
    core, _ = make()
    m = [key(0, i, 2) for i in range(2)]
    deliver(core, m, 0)
    core.nacked(m[0], 500, m[0], 0)
    core.fired(500, [m[0].entry], 470)
    assert len(core.records) == 1
    assert core.next_wakeup_ms() == 500 + OVERDUE
    core.release(500 + OVERDUE)
    assert len(core.records) == 0 and core.counts["expired"] == 1
    assert deliver(core, m, 600 + OVERDUE) == [S, H]


def test_a_copy_elsewhere_answering_a_later_sibling_still_expires_the_record():
    """One fire answers every nack of the entry (the tracker cancels the
    later sibling's bucket). When that copy goes to another consumer, the
    record must still end: overdue_ms after the later sibling's own time,
    when its parked wait would have ended (found on Apache Pulsar: records
    left at the end of bench/traffic.py's two-consumer scenarios)."""
    core, _ = make()
    m = [key(0, i, 2) for i in range(2)]
    deliver(core, m, 0)
    core.nacked(m[0], 500, m[0], 0)
    core.nacked(m[1], 2000, m[1], 0)
    core.fired(500, [m[0].entry], 470)  # no bucket of its own will fire for m[1]
    core.release(500 + OVERDUE)
    assert len(core.records) == 1  # m[1]'s copy may still land here and be parked until 2000
    assert core.next_wakeup_ms() == 2000 + OVERDUE
    core.release(2000 + OVERDUE)
    assert len(core.records) == 0 and core.next_wakeup_ms() is None


def test_cumulative_ack_settles_records_and_later_copies():
    core, _ = make()
    batch = [key(0, i, 3) for i in range(3)]
    single = key(1, 0, 1)
    deliver(core, batch + [single], 0)
    core.nacked(batch[1], 800, batch[1], 0)
    core.nacked(single, 900, single, 0)
    tokens = core.acked_cumulative(single, 10)
    assert batch[1] in tokens  # the nacked copy's delivery is acknowledged too
    assert len(core.records) == 0 and len(core.held) == 0
    core.fired(800, [batch[0].entry], 770)  # a bucket that fires anyway asks for nothing
    assert len(core.requested) == 0
    assert deliver(core, batch + [single], 820) == [A, A, A, A]


def test_nack_after_ack_is_refused():
    core, _ = make()
    m = key(0, 0, 1)
    deliver(core, [m], 0)
    core.acked(m, 1)
    assert core.is_acked(m)  # the shell asks first and never schedules it (see test_consumer_shell)


def test_restored_record_parks_the_resent_copy_until_due():
    """A restart: the broker resends the entry at once; the restored nacked
    message whose bucket had fired is parked until its time, its sibling
    surfaces, an entry still pending in the tracker drops its early copy."""
    core, _ = make()
    a, b = key(0, 0, 2), key(0, 1, 2)
    core.restore_record(a.entry, [(0, 300, True)])
    assert deliver(core, [a, b], 10) == [P, S]
    core2, pending = make()
    pending.add(a.entry)
    core2.restore_record(a.entry, [(0, 300, False)])
    assert deliver(core2, [a, b], 10) == [E, S]
    assert core.release(300) == [a]


def test_a_parked_copy_is_released_at_its_bucket_time_with_coarse_buckets():
    core, _ = make(bits=6)  # 64 ms buckets, floor: up to 63 ms early, never more
    m = key(0, 0, 1)
    deliver(core, [m], 0)
    core.nacked(m, 1000, m, 0)  # bucket 960
    core.fired(960, [m], 930)
    assert deliver(core, [m], 940) == [P]
    assert core.next_wakeup_ms() == 960 and core.release(960) == [m]


def test_without_dedup_only_acks_made_while_the_entry_has_a_record_are_remembered():
    """The documented cost of ``dedup=False``: m0, acked before its sibling's
    nack made the entry's record, surfaces again with the redelivery (as with
    Pulsar itself); m2, acked while the record lived, does not, until the
    record ends; held m3 never does."""
    core, _ = make(dedup=False)
    m = [key(0, i, 4) for i in range(4)]
    deliver(core, m, 0)
    core.acked(m[0], 1)
    core.nacked(m[1], 500, m[1], 1)
    core.acked(m[2], 2)
    core.fired(500, [m[0].entry], 470)
    assert deliver(core, m, 500) == [S, S, A, H]
    core.acked(m[1], 501)
    assert len(core.records) == 1  # lingers while a requested copy may still come
    core.release(500 + OVERDUE)
    assert len(core.records) == 0
    assert deliver(core, m, 600 + OVERDUE) == [H, S, S, H]


def test_memory_per_held_message_and_per_parked_copy(record_property):
    """What the core keeps per message in the application's hands (its key and
    a Held) and per batch record, measured with tracemalloc (the keys count:
    the shell makes one per received copy). Recorded; bounded loosely."""
    import tracemalloc

    core, _ = make()
    n = 20_000
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for e in range(n):
            core.arrive(MessageKey(1, e, -1, -1, TOPIC), 0, None, 0)
        middle = tracemalloc.take_snapshot()
        for e in range(n):
            core.nacked(MessageKey(1, e, -1, 0, TOPIC), 60_000, None, 0)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    held = sum(d.size_diff for d in middle.compare_to(before, "filename")) / n
    record = sum(d.size_diff for d in after.compare_to(middle, "filename")) / n
    record_property("core_bytes_per_held_message", round(held))
    record_property("core_bytes_per_batch_record", round(record))
    print(f"delivery core: {held:.0f} B per held message, {record:.0f} B per batch record (one nacked message)")
    assert 0 < held < 400 and 0 < record < 1500
