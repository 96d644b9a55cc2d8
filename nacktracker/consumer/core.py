"""The delivery core: which copy of which message reaches the application, and when.

A pure state machine (no pulsar, no clock of its own, no I/O): the shell (:mod:`nacktracker.consumer.shell`) feeds it
what happens -- a copy arrives from the broker, the application acks or nacks, the tracker hands a bucket to the
adapter -- each with the tracker's clock reading ``now_ms``, and does what it answers. ``tests/consumer/test_consumer_core.py``
drives it with arbitrary interleavings (hypothesis) against the promises it keeps:

* nothing the application acknowledged surfaces again (acked ids live in a :class:`~nacktracker.Deduplicator`; with
  ``dedup=False`` only acks made while their entry has a record are remembered, as long as it lives);
* nothing the application still holds surfaces again;
* each nack surfaces its message once, never before its bucket's time (the due time minus the bucket rounding:
  ``2^bits - 1`` ms for ``"floor"``, never early for bits 0 or ``"ceil"``): a copy that arrives earlier is *parked*
  and released at that time;
* per-entry records end when their entry is settled, and requests whose copy never came (it went to another consumer
  of the subscription) expire ``overdue_ms`` after their time, so nothing grows without bound.

Copies are opaque *tokens* here (the shell passes the received message). A dropped copy of a batch message is kept
with the message's state and handed back when the message is finally acknowledged: acking it completes that delivery's
batch acker in the client, which is what acknowledges the entry at the broker (without batch-index acks). The copy the
application nacked is not kept: the copy that answers the nack is a new delivery of the whole entry, whose batch acker
the message's final ack completes (its siblings' copies are acked as they are dropped), so a pending nack of a batch
message costs its record's 12 bytes (:class:`~.state.NackedIndices`), not a received message.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Iterable, Optional

from ..keys import MessageKey
from ..precision import Precision
from .deadlines import Deadlines
from .state import ACKED as _ACKED
from .state import ACKED_FRESH as _ACKED_FRESH
from .state import ALL_INDICES, AckResult, EntryRecord, Held, Nacked, Parked, Positions, Token, Verdict, _Deadline
from .state import FRESH as _FRESH
from .state import HELD as _HELD

__all__ = ["DeliveryCore", "Verdict", "AckResult", "Held", "Nacked", "Parked", "EntryRecord"]


class DeliveryCore:
    """Per-copy decisions for one consumer.

    ``precision``: the tracker's buckets (a :class:`~nacktracker.precision.Precision`).
    ``dedup``: a :class:`~nacktracker.Deduplicator` or ``None``. ``pending(key) -> bool``: whether the tracker
    holds the entry (a pure lookup, asked only for copies that may be redeliveries). ``overdue_ms``: how long
    after its time a requested copy may still arrive before it is taken to have gone to another consumer.
    All times are the tracker's clock, in ms.

    Every method is O(1) unless its docstring says otherwise.
    """

    def __init__(self, precision: Precision, *, dedup: Any = None,
                 pending: Callable[[MessageKey], bool] = lambda key: False, overdue_ms: int = 10_000) -> None:
        self._precision = precision
        self._dedup = dedup
        self._pending = pending
        self.overdue_ms = overdue_ms
        self.held: dict[MessageKey, Held] = {}
        self.forgotten: set[MessageKey] = set()  # held when the application asked for a redelivery of all
        self.requested: dict[MessageKey, Nacked] = {}  # non-batched (and blind-restored) entries fired
        self.records: dict[MessageKey, EntryRecord] = {}  # batch entry -> record
        self.parked: dict[MessageKey, Parked] = {}
        # batch entry -> indices of its parked copies: a request for the entry surrenders them (below)
        self._parked_in: dict[MessageKey, set[int]] = {}
        # Deadlines in time order, with lazy deletion (deadlines.py): a state taken out early leaves its
        # deadline, skipped (_live) when it reaches the top
        self._releases = Deadlines(self._live)  # parked copies
        self._expiries = Deadlines(self._live)  # requests and records, once overdue
        self._positions = Positions()  # at or beyond every copy with state here, per partition
        self._cumulative: dict[tuple[Optional[str], int], tuple[int, int, int]] = {}
        self.blind = False  # restored batch entries without records: hold their copies while pending
        # per verdict (keyed by Verdict.label, its value: the hot path counts without hashing an enum member)
        self.counts = dict.fromkeys([v.value for v in Verdict] + ["released", "expired", "nacks_after_ack"], 0)
        #: ``f(lateness_ms)`` per redelivered copy surfacing: now - its bucket's time (the shell keeps the figures)
        self.on_redelivered: Callable[[float], None] = lambda lateness_ms: None

    # -- questions -------------------------------------------------------------------

    def bucket_ms(self, due_ms: int) -> int:
        """The time of the bucket a nack due at ``due_ms`` falls in."""
        return self._precision.bucket(due_ms)

    def is_acked(self, key: MessageKey) -> bool:
        """Whether the application acknowledged ``key`` (as far as remembered)."""
        if self._cumulative:
            mark = self._cumulative.get((key.topic, key.partition))
            if mark is not None and (key.ledger_id, key.entry_id, key.batch_index) <= mark:
                return True
        if self._dedup is not None and key.topic is not None \
                and (key.topic, key.ledger_id, key.entry_id, key.batch_index) in self._dedup:
            return True
        record = self.records.get(key.entry) if key.batch_index >= 0 and self.records else None
        return record is not None and record.acked is not None and key.batch_index in record.acked

    def knows(self, key: MessageKey) -> bool:
        """Whether this consumer received ``key``: :meth:`seen`, or a message of a batch entry with a
        record (pending nacks: the tracker's). O(1)."""
        return self.seen(key) or (key.batch_index >= 0 and key.entry in self.records)

    def seen(self, key: MessageKey) -> bool:
        """Whether a copy of ``key`` reached this consumer before (held, or before a redeliver-all,
        parked, requested, nacked or acknowledged): a copy of it now is a redelivery. O(1)."""
        if key in self.held or key in self.parked or key in self.requested or key in self.forgotten:
            return True
        record = self.records.get(key.entry) if key.batch_index >= 0 else None
        return (record is not None and key.batch_index in record.nacked) or key.entry in self.requested \
            or self.is_acked(key)

    def holds_sibling(self, entry: MessageKey) -> bool:
        """Whether the application holds a message of batch ``entry`` (surfaced, not acknowledged or
        nacked yet): a request for the entry now would make the broker send that message again, to
        another consumer of a Shared subscription. ``False`` when the entry's size is not known.
        O(messages in the entry)."""
        record = self.records.get(entry)
        if record is None or not record.size or not self.held:
            return False
        held, message = self.held, entry.with_batch_index
        return any(message(i) in held for i in range(record.size))

    def awaits_copy(self, entry: MessageKey) -> bool:
        """Whether a message of batch ``entry`` waits here for a redelivered copy or its time: nacked
        in the entry's record, or its copy parked. O(1)."""
        return entry in self.records or entry in self._parked_in

    def next_wakeup_ms(self) -> Optional[float]:
        """When :meth:`release` has something to do (a parked copy's time or an
        expiry), or ``None``. Amortised O(1)."""
        release, expiry = self._releases.next_ms(), self._expiries.next_ms()
        return expiry if release is None else release if expiry is None else min(release, expiry)

    # -- what happens ------------------------------------------------------------------

    def first_delivery(self, key: MessageKey) -> bool:
        """Whether a copy from the broker is a first delivery, then held as :meth:`arrive` would leave it:
        beyond its partition's :class:`~.state.Positions`, so nothing of it is acknowledged, held, parked,
        requested, recorded or pending. Else nothing changes (ask :meth:`arrive`). O(1), no allocation."""
        if not self._positions.advance(key):
            return False
        self.held[key] = _FRESH
        self.counts["surface"] += 1
        return True

    def arrive(self, key: MessageKey, batch_size: int, token: Token, now_ms: float) -> Verdict:
        """A copy of ``key`` (``batch_size``: messages in its entry, 0 when unknown or not batched; a batch of
        one nacked here is followed as a message that is not batched, so pass 1 for one) arrived
        from the broker. Amortised O(1), plus the tracker lookup for a non-batched copy that is not a first
        delivery (:meth:`first_delivery`): it may be a redelivery."""
        if self.first_delivery(key):
            return Verdict.SURFACE
        verdict = self._arrive(key, batch_size, token, now_ms)
        self.counts[verdict.label] += 1
        return verdict

    def _arrive(self, key: MessageKey, batch_size: int, token: Token, now_ms: float) -> Verdict:
        batched = key.batch_index >= 0
        if self.is_acked(key):
            return Verdict.DROP_ACKED
        held = self.held.get(key)
        if held is not None:
            if batched:
                held = self.held[key] = Held() if not held.tokens else held  # a shared empty one: its own now
                held.tokens.append(token)
            return Verdict.DROP_HELD
        parked = self.parked.get(key) if self.parked else None
        if parked is not None:
            if batched:
                parked.tokens.append(token)
            return Verdict.DROP_TWIN
        if not batched:
            nack = self.requested.pop(key, None) if self.requested else None
            if nack is not None:
                return self._due_or_park(key, nack.release_ms, token, nack.tokens, now_ms)
            if self._pending(key):  # at or behind the position kept: maybe a redelivery
                return Verdict.DROP_EARLY
            self.held[key] = _HELD
            return Verdict.SURFACE
        entry = key.entry
        record = self.records.get(entry)
        if record is not None:
            index = key.batch_index
            nacked = record.nacked.get(index)
            if nacked is None:  # neither acked, held nor nacked: the application has not seen it
                return self._surface(key, [])
            release_ms, fired = nacked
            if fired or now_ms >= release_ms:
                record.nacked.pop(index)
                tokens = record.take(index)
                self._maybe_end(entry, record, now_ms)
                return self._due_or_park(key, release_ms, token, tokens, now_ms)
            record.keep(index, [token])
            return Verdict.DROP_EARLY
        nack = self.requested.get(entry)  # a blind-restored entry, or a batch of one, whose bucket fired
        if nack is not None:
            if batch_size and key.batch_index + 1 >= batch_size:
                del self.requested[entry]  # the copy's last message: the request is answered
            return self._due_or_park(key, nack.release_ms, token, [], now_ms)
        if (self.blind or batch_size == 1) and self._pending(entry):
            return Verdict.DROP_EARLY
        return self._surface(key, [])

    def nacked(self, key: MessageKey, due_ms: Optional[int], token: Token, now_ms: float,
               batch_size: int = 0) -> None:
        """The application nacked ``key``; the tracker scheduled it at ``due_ms`` (``None``: it is being
        dead-lettered and may come back at any time). ``batch_size``: messages in its entry, when known
        (:meth:`holds_sibling`). Call :meth:`is_acked` first: a nack of an acknowledged message must not
        reach the tracker (the broker would never send it)."""
        self._positions.cover(key[4], key[2], key[0], key[1], key[3])
        held = self.held.pop(key, None)
        tokens: list[Token] = [] if held is None or not held.tokens else held.tokens
        self.forgotten.discard(key)
        parked = self._unpark(key) if self.parked else None  # nacked by id while a copy waited: that copy goes
        if parked is not None:
            tokens += parked.tokens + [parked.token]
        self.requested.pop(key, None)
        if key.batch_index < 0:
            return  # the tracker's index knows it until its bucket fires (see requested)
        if batch_size == 1 and key.entry not in self.records:
            # alone in its entry (a batching producer's entries at a low rate): as a message that is not
            # batched, the tracker's index alone knows it until its bucket fires, and then a request
            self.requested.pop(key.entry, None)
            return
        record = self.records.get(key.entry)
        if record is None:
            record = self.records[key.entry] = EntryRecord(acked=None if self._dedup is not None else set())
        if batch_size > record.size:
            record.size = batch_size
        release = math.ceil(now_ms) if due_ms is None else self.bucket_ms(due_ms)
        # the nacked copy itself is not kept (``token``): see the module's docstring
        record.nacked.set(key.batch_index, release, due_ms is None)
        record.keep(key.batch_index, tokens)
        if due_ms is None:
            self._expire_at(release + self.overdue_ms, key.entry, record)

    def nack_refused(self, key: MessageKey) -> None:
        """A nack of an already acknowledged message was refused (counted)."""
        self.counts["nacks_after_ack"] += 1

    def fired(self, bucket_ms: int, entries: Iterable[MessageKey], now_ms: float) -> None:
        """The tracker handed the bucket at ``bucket_ms`` (these entries) to the adapter: their copies
        are on their way, each answering every nack of its entry made so far (the tracker cancels the
        entry's later buckets). O(k) for k entries, plus the entry's nacked messages for a batch entry."""
        for entry in entries:
            self._positions.cover(entry.topic, entry.partition, entry.ledger_id, entry.entry_id, ALL_INDICES)
            if self._parked_in:
                self._surrender(entry)
            record = self.records.get(entry)
            if record is None and self.is_acked(entry):
                continue  # acked cumulatively meanwhile: the broker sends nothing
            if record is None:  # a non-batched message, or a blind-restored batch entry
                nack = self.requested[entry] = Nacked(bucket_ms, True)
                self._expire_at(bucket_ms + self.overdue_ms, entry, nack)
                continue
            # The broker redelivers whole entries: this request's copy answers every nack of the entry so
            # far, each parked until its own time here (the tracker cancels the entry's later buckets: a
            # second request would send the entry again, to another consumer, a duplicate of each).
            record.nacked.mark_fired()
            if self._dedup is None:
                record.linger_until = max(record.linger_until, bucket_ms + self.overdue_ms)
            # and the record wakes overdue_ms after its latest nack's time, or it outlives a copy gone elsewhere
            release_ms = record.nacked.max_release()
            latest = bucket_ms if release_ms is None else max(bucket_ms, release_ms)
            self._expire_at(latest + self.overdue_ms, entry, record)

    def _surrender(self, entry: MessageKey) -> None:
        """A request for ``entry`` went out: the broker takes back every message of it that this consumer
        has not acknowledged and sends the entry again, maybe to another consumer of the subscription. Copies
        of it parked here are no longer this consumer's to release (the broker's new copy answers their nacks:
        parked again here until due, or surfacing over there); releasing one would surface a message the
        other consumer may have acknowledged meanwhile. Each goes back to its entry's record, as fired.
        O(parked copies of the entry)."""
        indices = self._parked_in.pop(entry, None)
        if not indices:
            return
        record = self.records.get(entry)
        if record is None:
            record = self.records[entry] = EntryRecord(acked=None if self._dedup is not None else set())
        for index in sorted(indices):
            parked = self.parked.pop(entry.with_batch_index(index))
            record.nacked.set(index, parked.release_ms, True)
            record.keep(index, parked.tokens + [parked.token])

    def _unpark(self, key: MessageKey) -> Optional[Parked]:
        """Take ``key``'s parked copy out of the parked state (released, nacked or acked by id). O(1)."""
        parked = self.parked.pop(key, None)
        if parked is not None and key.batch_index >= 0:
            indices = self._parked_in.get(key.entry)
            if indices is not None:
                indices.discard(key.batch_index)
                if not indices:
                    del self._parked_in[key.entry]
        return parked

    def acked(self, key: MessageKey, now_ms: float) -> AckResult:
        """The broker accepted the application's ack of ``key``."""
        held = self.held.pop(key, None)
        tokens: list[Token] = [] if held is None or not held.tokens else held.tokens
        if held is None:  # not held here: it may not have arrived yet
            self._positions.cover(key[4], key[2], key[0], key[1], key[3])
        if self.parked:
            parked = self._unpark(key)
            if parked is not None:
                tokens += parked.tokens + [parked.token]
        if self.requested:
            self.requested.pop(key, None)
        self.forgotten.discard(key)
        if self._dedup is not None and key.topic is not None:
            self._dedup.seen_or_add(key.topic, key.ledger_id, key.entry_id, key.batch_index)
        if key.batch_index < 0 or not (self.records or self.blind):  # no record of its entry (FRESH: state.py)
            return AckResult(tokens, True) if tokens else _ACKED_FRESH if held is _FRESH and key[3] < 0 else _ACKED
        record = self.records.get(key.entry)
        if record is None:  # nothing of the entry waits for a bucket: any left in the tracker is spurious
            return AckResult(tokens, not self.blind)
        if record.acked is not None:
            record.acked.add(key.batch_index)
        if record.nacked.pop(key.batch_index) is not None:
            tokens += record.take(key.batch_index)
        discard = not record.nacked.unfired
        self._maybe_end(key.entry, record, now_ms)
        return AckResult(tokens, discard)

    def acked_cumulative(self, key: MessageKey, now_ms: float) -> list[Token]:
        """The broker accepted a cumulative ack up to ``key``: everything at or
        before it in its topic partition is settled. Returns the dropped
        copies to acknowledge as well. O(held + parked + requested + records)."""
        where = (key.topic, key.partition)
        mark = (key.ledger_id, key.entry_id, key.batch_index)
        self._cumulative[where] = max(mark, self._cumulative.get(where, mark))
        self._positions.cover(key.topic, key.partition, key.ledger_id, key.entry_id, key.batch_index)
        tokens = []

        def covered(k: MessageKey) -> bool:
            return (k.topic, k.partition) == where and (k.ledger_id, k.entry_id, k.batch_index) <= mark

        for k in [k for k in self.held if covered(k)]:
            tokens += self.held.pop(k).tokens
        for k in [k for k in self.parked if covered(k)]:
            parked = self._unpark(k)
            assert parked is not None
            tokens += parked.tokens + [parked.token]
        for k in [k for k in self.requested if covered(k)]:
            del self.requested[k]
        self.forgotten -= {k for k in self.forgotten if covered(k)}
        for entry, record in list(self.records.items()):
            if (entry.topic, entry.partition) != where or (entry.ledger_id, entry.entry_id) > mark[:2]:
                continue
            for index in [i for i in record.nacked.indices() if covered(entry.with_batch_index(i))]:
                record.nacked.pop(index)
                tokens += record.take(index)
            self._maybe_end(entry, record, now_ms)
        return tokens

    def release(self, now_ms: float) -> list[Token]:
        """Parked copies whose time has come (now the application's), in release order; expires
        overdue requests and records on the way. O(r log n) for r copies released or states expired."""
        out = []
        for item in self._releases.pop_due(now_ms):  # live: still the key's parked state
            parked: Parked = item.state  # type: ignore[assignment]  # (a release deadline's state)
            self._unpark(item.key)
            self.held[item.key] = Held(parked.tokens)
            self.counts["released"] += 1
            out.append(parked.token)
            self.on_redelivered(now_ms - item.at_ms)
        self._expire(now_ms)
        return out

    def forget_held(self) -> None:
        """The application asked for everything unacknowledged again (``redeliver_unacknowledged_messages``):
        what it holds may surface once more (and may still be acked or nacked: :meth:`knows`)."""
        self.forgotten.update(self.held)
        self.held.clear()

    def sought(self) -> None:
        """The subscription was rewound (``seek``): what the application acknowledged or holds is
        sent again and surfaces; pending nacks stay scheduled. O(held + records)."""
        self._cumulative.clear()
        if self._dedup is not None:
            self._dedup.clear()
        for record in self.records.values():
            if record.acked is not None:
                record.acked.clear()
        self.forget_held()

    def restore_record(self, entry: MessageKey, nacked: Iterable[tuple[int, int, bool]]) -> None:
        """A batch record from a snapshot: ``(batch_index, due_ms, fired)``.
        ``fired``: its bucket fired before the save (or the restored tracker
        does not hold the entry), so the copy the broker resends is the one to
        park until due: nothing else will ask for it."""
        self._positions.cover(entry.topic, entry.partition, entry.ledger_id, entry.entry_id, ALL_INDICES)
        record = self.records[entry] = EntryRecord(acked=None if self._dedup is not None else set())
        for index, due, fired in nacked:
            record.nacked.set(index, self.bucket_ms(due), fired)
        latest = record.nacked.max_release()
        if latest is not None and record.nacked.unfired < len(record.nacked):  # some fired
            self._expire_at(latest + self.overdue_ms, entry, record)

    def restored_without_records(self) -> None:
        """Restored nacks came without their batch records (see persist.py): copies of their batch
        entries are held while pending."""
        self.blind = True

    def note_position(self, topic: Optional[str], partition: int, ledger_id: int, entry_id: int) -> None:
        """Copies at or behind this position may be redeliveries (a restore)."""
        self._positions.cover(topic, partition, ledger_id, entry_id, ALL_INDICES)

    def nbytes(self) -> int:
        """Bytes of the core's own state: its tables (held, forgotten, requested, records, parked),
        each batch record with its key, each request and parked state, the deadlines and positions;
        not the copies it keeps (:meth:`kept_copies`) nor the keys of messages the application holds
        (each is its message's). O(records + requested + parked + held messages with dropped copies)."""
        size = sys.getsizeof
        total = sum(map(size, (self.held, self.forgotten, self.requested, self.records, self.parked,
                               self._parked_in, self._cumulative)))
        total += self._releases.nbytes() + self._expiries.nbytes()
        total += sum(size(entry) + record.nbytes() for entry, record in self.records.items())
        total += sum(size(key) + size(nack) + size(nack.tokens) for key, nack in self.requested.items())
        total += sum(size(parked) + size(parked.tokens) for parked in self.parked.values())
        total += sum(size(entry) + size(indices) for entry, indices in self._parked_in.items())
        total += sum(size(held) + size(held.tokens) for held in self.held.values() if held.tokens)
        return total + self._positions.nbytes()

    def kept_copies(self) -> int:
        """Received copies the core keeps: parked ones and the dropped copies it hands back with an ack.
        O(records + requested + parked + held messages with dropped copies)."""
        kept = sum(1 + len(parked.tokens) for parked in self.parked.values())
        kept += sum(len(nack.tokens) for nack in self.requested.values())
        kept += sum(len(held.tokens) for held in self.held.values() if held.tokens)
        return kept + sum(record.kept() for record in self.records.values() if record.copies)

    def pending_batch_nacks(self) -> Iterable[tuple[MessageKey, int, int, bool]]:
        """``(entry, batch_index, release_ms, fired)`` of every nacked batch
        message that has not surfaced again, parked copies included (for
        snapshots). O(records + parked)."""
        for entry, record in self.records.items():
            for index, release_ms, fired in record.nacked.items():
                yield entry, index, release_ms, fired
        for key, parked in self.parked.items():
            if key.batch_index >= 0:
                yield key.entry, key.batch_index, parked.release_ms, True

    # -- internals ---------------------------------------------------------------------

    def _surface(self, key: MessageKey, tokens: list[Token]) -> Verdict:
        self.held[key] = Held(tokens) if tokens else _HELD
        return Verdict.SURFACE

    def _due_or_park(self, key: MessageKey, release_ms: int, token: Token, tokens: list[Token],
                     now_ms: float) -> Verdict:
        if now_ms >= release_ms:
            self.on_redelivered(now_ms - release_ms)
            return self._surface(key, tokens)
        parked = self.parked[key] = Parked(release_ms, token, tokens)
        if key.batch_index >= 0:
            self._parked_in.setdefault(key.entry, set()).add(key.batch_index)
        self._releases.push(release_ms, key, parked)
        return Verdict.PARK

    def _maybe_end(self, entry: MessageKey, record: EntryRecord, now_ms: float) -> None:
        """Drop a record with nothing nacked left, unless (``dedup=False``) it
        must remember acked siblings until a requested copy is overdue."""
        if not record.nacked and record.linger_until <= now_ms and self.records.get(entry) is record:
            del self.records[entry]

    def _expire_at(self, at_ms: float, key: MessageKey, state: object) -> None:
        self._expiries.push(at_ms, key, state)

    def _expire(self, now_ms: float) -> None:
        for item in self._expiries.pop_due(now_ms):  # live: still the key's record or request
            state = item.state
            if isinstance(state, EntryRecord):
                for index in [i for i, release_ms, fired in state.nacked.items()
                              if fired and release_ms + self.overdue_ms <= now_ms]:
                    state.nacked.pop(index)  # its copy went elsewhere (or is very late: it then surfaces)
                    state.take(index)  # and the copies dropped meanwhile go with it, unacknowledged
                    self.counts["expired"] += 1
                self._maybe_end(item.key, state, now_ms)
            else:
                del self.requested[item.key]
                self.counts["expired"] += 1

    def _live(self, item: _Deadline) -> bool:
        state = item.state
        if isinstance(state, Parked):
            return self.parked.get(item.key) is state
        if isinstance(state, EntryRecord):
            return self.records.get(item.key) is state
        return self.requested.get(item.key) is state

