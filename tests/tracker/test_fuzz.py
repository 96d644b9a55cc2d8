"""Fuzzing the public API with random valid and invalid input (hypothesis).

Invariants, checked after every step:

* only documented exceptions escape (TypeError, ValueError, TrackerClosedError,
  SnapshotError), and a call that raised changed nothing;
* TimeBucketIndex answers exactly as DictIndex (the reference model);
* NegativeAcksTracker (ManualClock + MemoryAdapter) holds what a DictIndex
  model holds: same pending count, and what it popped (delivered or still in
  the outbox) is exactly what the model popped; snapshot/restore mid-run
  changes nothing;
* any mutation or truncation of a snapshot is refused with SnapshotError or
  restores to an identical tracker; a body with valid checksums but random
  content is refused or restores consistently, never another exception.
"""

from __future__ import annotations

import array
import asyncio
import math
import struct
import zlib
from collections import Counter

import numpy as np
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from nacktracker import DictIndex, ManualClock, MessageKey, NegativeAcksTracker, TimeBucketIndex, TrackerClosedError
from nacktracker import snapshot as snap
from nacktracker.adapters import MemoryAdapter
from nacktracker.snapshot import SnapshotError

ALLOWED = (TypeError, ValueError, TrackerClosedError)  # SnapshotError is a ValueError
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BAD_SCALARS = [-1, 2**63, 2**64, 1.5, float("nan"), float("inf"), True, False, None, "1", b"1", [1], (1,), object()]
ids = st.one_of(st.integers(0, 6), st.integers(0, 6), st.sampled_from([2**32 - 1, 2**32, 2**40 + 1, 2**63 - 1]),
                st.sampled_from(BAD_SCALARS))
dues = st.one_of(st.integers(0, 5_000), st.sampled_from([2**62 - 1, 2**62, 2**63 - 1]), st.sampled_from(BAD_SCALARS))


def call(fn, *args, **kw):
    """(result, None) or (None, exception type) for an allowed exception; anything else escapes."""
    try:
        out = fn(*args, **kw), None
    except ALLOWED as exc:
        out = None, type(exc)
    event(f"{getattr(fn, '__name__', 'call')}: {out[1].__name__ if out[1] else 'ok'}")
    return out


# -- TimeBucketIndex against DictIndex ----------------------------------------------------

entry_lists = st.one_of(
    st.lists(ids, max_size=8),
    # past add_many's bulk threshold (32 ids), from a narrow range: bulk adds meet pending ids
    st.lists(st.integers(0, 50), min_size=32, max_size=64),
    st.lists(st.one_of(st.integers(0, 40), st.integers(2**32 - 2, 2**32 + 2)), min_size=32, max_size=48)
    .map(lambda v: array.array("Q", v)),
    st.lists(st.integers(0, 2**33), max_size=8).map(lambda v: array.array("Q", v)),
    st.lists(st.integers(0, 100), max_size=8).map(lambda v: array.array("I", v)),
    st.lists(st.integers(-3, 100), max_size=8).map(lambda v: array.array("q", v)),
    st.lists(st.integers(-3, 2**40), max_size=8).map(lambda v: np.array(v, dtype=np.int64)),
    st.lists(st.integers(0, 100), max_size=8).map(lambda v: np.array(v, dtype=np.uint16)),
    st.sampled_from([np.zeros((2, 2), dtype=np.int64), np.array([1.0]), array.array("d", [1.0]), "abc", None,
                     b"\x01", {1: 2}, 5, np.array([2**63], dtype=np.uint64)]),
)
index_ops = st.lists(st.one_of(
    st.tuples(st.just("add"), ids, ids, dues),
    st.tuples(st.just("add_many"), ids, entry_lists, dues),
    st.tuples(st.just("discard"), ids, ids),
    st.tuples(st.just("pop_due"), dues),
    st.tuples(st.just("contains"), st.one_of(st.tuples(ids, ids), st.sampled_from(BAD_SCALARS))),
    st.tuples(st.just("bucket_of"), dues),
), min_size=5, max_size=60)


@settings(FUZZ, max_examples=300)
@given(bits=st.integers(0, 12), rounding=st.sampled_from(["floor", "ceil"]), ops=index_ops)
def test_time_bucket_index_matches_dict_index(bits, rounding, ops):
    idx, model = TimeBucketIndex(bits, rounding), DictIndex(bits, rounding)
    for op, *args in ops:
        before = (len(model), model.next_due_ms())
        if op == "contains":
            assert (args[0] in idx) == (args[0] in model)
            continue
        got, err = call(getattr(idx, op), *args)
        want, model_err = call(getattr(model, op), *args)
        assert err == model_err, (op, args, err, model_err)
        assert got == want, (op, args)
        if err is not None:
            assert (len(idx), idx.next_due_ms()) == before  # a refused call changed nothing
        assert len(idx) == len(model) and idx.next_due_ms() == model.next_due_ms()
        assert idx.nbytes() > 0
    assert idx.pop_due(2**63 - 1) == model.pop_due(2**63 - 1)
    # due times stay below 2^62, so even a ceil-rounded bucket is reachable: all drained
    assert len(idx) == len(model) == 0 and not idx and not model


# -- NegativeAcksTracker against a DictIndex model -----------------------------------------

def _key(ledger, entry, partition, batch, pick):
    # the topic is a function of (ledger, partition, pick): ledgers 0-1 are topic-less,
    # ledgers 2-3 live in two topics at once (colliding ledger ids), so routing is exact
    topic = None if ledger in (0, 1) else ("a", "b")[pick] + ("" if partition < 0 else f"-partition-{partition}")
    return MessageKey(ledger, entry, partition, batch, topic)


def mostly(good, bad, bad_share=0.2):
    """``good`` most of the time: an invalid value in every step would test only the checks.
    (``st.one_of`` does not weight repeated branches, so choose by a drawn number.)"""
    return st.integers(0, 99).flatmap(lambda n: bad if n < bad_share * 100 else good)


good_keys = st.builds(_key, st.integers(0, 3), st.one_of(st.integers(0, 5), st.just(2**40)),
                      st.sampled_from([-1, 0, 1]), st.sampled_from([-1, -1, 0, 3]), st.integers(0, 1))
bad_keys = st.one_of(st.sampled_from(BAD_SCALARS), st.builds(MessageKey, ids, ids),
                     st.sampled_from([MessageKey(1, 1, -2), MessageKey(1, 1, topic=5), MessageKey(1, 1, 0, -7),
                                      MessageKey(1.0, 1), MessageKey(1, True)]))
keys = mostly(good_keys, bad_keys)
delays = mostly(st.one_of(st.none(), st.integers(0, 800), st.floats(0, 800, allow_nan=False)),
                st.sampled_from([2**62, 2**63 - 1, 2**63, -1, -0.5, float("nan"), float("inf"), "10", True]), 0.1)
counts = mostly(st.one_of(st.none(), st.integers(0, 4)), st.sampled_from([-1, 1.0, True, "1", 2**63]), 0.1)
OP_WEIGHTS = {"add": 40, "advance": 20, "discard": 8, "contains": 5, "stall": 6, "fail_next": 6,
              "snapshot_restore": 8, "close": 1}
OP_ARGS = {
    "add": st.tuples(keys, delays, counts),
    "advance": st.tuples(st.one_of(st.integers(0, 400), st.floats(0, 50, allow_nan=False))),
    "discard": st.tuples(keys), "contains": st.tuples(keys), "stall": st.tuples(st.integers(0, 400)),
    "fail_next": st.tuples(st.integers(1, 3)), "snapshot_restore": st.just(()), "close": st.just(()),
}
tracker_ops = st.lists(
    st.sampled_from([op for op, w in OP_WEIGHTS.items() for _ in range(w)]).flatmap(
        lambda op: OP_ARGS[op].map(lambda args: (op, *args))),
    min_size=10, max_size=80)


def contains(tracker, key):
    return key in tracker


class TrackerModel:
    """The specification: a DictIndex keyed by (topic, partition, ledger) -> small int."""

    def __init__(self, bits, rounding, max_redeliveries):
        self.index = DictIndex(bits, rounding)
        self.max = max_redeliveries
        self.origins: dict[tuple, int] = {}
        self.back: dict[int, tuple] = {}
        self.popped: Counter = Counter()
        self.dead: list = []

    def ledger(self, key):
        o = (key.topic, key.partition, key.ledger_id)
        if o not in self.origins:
            self.origins[o] = len(self.origins)
            self.back[self.origins[o]] = o
        return self.origins[o]

    def add(self, key, now, delay, count, default_delay):
        count = count or 0
        if self.max is not None and count >= self.max:
            self.dead.append(key)  # the message itself, batch index and all
            return
        key = key.entry  # the index tracks entries
        delay = default_delay if delay is None else math.ceil(delay)
        self.index.add(self.ledger(key), key.entry_id, math.ceil(now) + delay)

    def pop(self, now):
        # bucket by bucket, as the tracker's timer fires: a request brings the whole entry, so each
        # fire cancels the later buckets of the entries it popped
        while (nxt := self.index.next_due_ms()) is not None and nxt <= math.floor(now):
            due = list(self.index.pop_due(nxt))
            for ledger, entry in due:
                topic, partition, ledger_id = self.back[ledger]
                self.popped[MessageKey(ledger_id, entry, partition, -1, topic)] += 1
            for ledger, entry in due:
                if (ledger, entry) in self.index:
                    self.index.discard(ledger, entry)


async def settle(rounds=6):
    for _ in range(rounds):
        await asyncio.sleep(0)


async def run_tracker(bits, rounding, use_dlq, ops):
    clock = ManualClock(start_ms=10_000)
    adapter = MemoryAdapter(clock=clock.now_ms)
    dead: list = []
    kw = dict(clock=clock, precision_bits=bits, rounding=rounding, delay_ms=250, retry_min_ms=50, retry_max_ms=200)
    if use_dlq:
        kw.update(max_redeliveries=3, on_dead_letter=dead.append)
    tracker = NegativeAcksTracker(adapter, **kw)
    model = TrackerModel(bits, rounding, 3 if use_dlq else None)
    for op, *args in ops:
        before = tracker.pending
        if op == "add":
            key, delay, count = args
            due, err = call(tracker.add, key, delay_ms=delay, redelivery_count=count)
            if err is None:
                model.add(key, clock.now_ms(), delay, count, 250)
                if due is not None:
                    assert due == math.ceil(clock.now_ms()) + (250 if delay is None else math.ceil(delay))
            else:
                assert tracker.pending == before
        elif op == "discard":
            hit, err = call(tracker.discard, args[0])
            if err is None:
                ledger = model.ledger(args[0])
                assert hit == model.index.discard(ledger, args[0].entry_id)
        elif op == "contains":
            got, err = call(contains, tracker, args[0])
            if err is None:
                assert got == ((model.ledger(args[0]), args[0].entry_id) in model.index)
        elif op in ("advance", "stall"):
            getattr(clock, op)(args[0])
            if not tracker.closed:
                model.pop(clock.now_ms())
        elif op == "fail_next":
            adapter.fail_next(args[0])
        elif op == "close":
            await tracker.close()
            assert call(tracker.add, MessageKey(1, 1))[1] is TrackerClosedError
        elif op == "snapshot_restore" and not tracker.closed:
            await settle()
            if tracker.stats()["unsent"] or tracker._sending is not None:
                continue  # restoring would bring unsent keys back as pending: not this model's business
            data = tracker.snapshot()
            await tracker.close()  # stop its timer: the restored one takes over
            tracker = NegativeAcksTracker.restore(data, adapter, elapsed="none", **kw)
            event("restored mid-run")
        await settle()
        assert tracker.pending == len(model.index), (op, args)
        outbox = Counter(k for batch in tracker._outbox for k in batch)
        assert Counter(adapter.redelivered) + outbox == model.popped, (op, args)
        assert dead == model.dead
    await tracker.close()


@settings(FUZZ, max_examples=300)
@given(bits=st.sampled_from([0, 0, 3, 8]), rounding=st.sampled_from(["floor", "ceil"]), use_dlq=st.booleans(),
       ops=tracker_ops)
def test_tracker_matches_a_dict_index_model(bits, rounding, use_dlq, ops):
    asyncio.run(run_tracker(bits, rounding, use_dlq, ops))


# -- snapshot bytes ----------------------------------------------------------------------------

async def _sample_snapshot() -> bytes:
    clock = ManualClock(start_ms=50_000)
    tracker = NegativeAcksTracker(MemoryAdapter(clock=clock.now_ms), clock=clock, precision_bits=2)
    for i in range(12):
        tracker.add(_key(i % 4, i * 3, (-1, 0, 1)[i % 3], -1, i % 2), delay_ms=10 * i)
    tracker.add(MessageKey(2, 2**40 + 1, topic="a"), delay_ms=77)
    tracker.add(MessageKey(9, 0), delay_ms=0)
    for e in range(0, 5000, 3):
        tracker.add(MessageKey(5, e), delay_ms=300)
    return tracker.snapshot()


SAMPLE = asyncio.run(_sample_snapshot())


def _content(tracker):
    return sorted((b, repr(tracker._origins[s]), list(bm)) for b, s, bm in tracker._index.iter_bitmaps())


def _restore(data):
    clock = ManualClock(start_ms=50_000)
    return NegativeAcksTracker.restore(data, MemoryAdapter(clock=clock.now_ms), clock=clock, elapsed="none")


REFERENCE = _content(_restore(SAMPLE))

mutations = st.lists(st.one_of(
    st.tuples(st.just("set"), st.integers(0, len(SAMPLE) - 1), st.integers(0, 255)),
    st.tuples(st.just("xor"), st.integers(0, len(SAMPLE) - 1), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, len(SAMPLE))),
    st.tuples(st.just("insert"), st.integers(0, len(SAMPLE)), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, len(SAMPLE) - 1), st.integers(1, 16)),
), min_size=1, max_size=4)


def _mutate(data: bytes, muts) -> bytes:
    b = bytearray(data)
    for op, *args in muts:
        if op == "set" and args[0] < len(b):
            b[args[0]] = args[1]
        elif op == "xor" and args[0] < len(b):
            b[args[0]] ^= args[1]
        elif op == "truncate":
            del b[args[0]:]
        elif op == "insert":
            b[args[0]:args[0]] = args[1]
        elif op == "delete":
            del b[args[0]:args[0] + args[1]]
    return bytes(b)


@settings(FUZZ, max_examples=400)
@given(muts=mutations)
def test_mutated_snapshots_are_refused_or_identical(muts):
    data = _mutate(SAMPLE, muts)
    try:
        tracker = _restore(data)
    except SnapshotError:
        event("refused")
        return
    event("identical restore")
    assert _content(tracker) == REFERENCE


def _reseal(body: bytes) -> bytes:
    head = struct.pack("<8sHHIQ", snap.MAGIC, snap.VERSION, 0, zlib.crc32(body), len(body))
    return head + struct.pack("<I", zlib.crc32(head)) + b"\0" * 4 + body


@settings(FUZZ, max_examples=400)
@given(muts=mutations)
@example(muts=[("set", 826, 64)])  # a saved delay past MAX_DUE: restored at MAX_DUE, not a ValueError
def test_resealed_garbage_bodies_are_refused_or_consistent(muts):
    """Checksums recomputed: the parser itself must refuse cleanly."""
    body = _mutate(SAMPLE, muts)[32:]
    try:
        tracker = _restore(_reseal(body))
    except SnapshotError as exc:
        event(f"refused: {str(exc).split(':')[0][:40]}")
        return
    event("restored")
    assert tracker.pending == sum(len(bm) for _, _, bm in tracker._index.iter_bitmaps())
    assert set(tracker._origins) == {s for _, s, _ in tracker._index.iter_bitmaps()}


@settings(FUZZ, max_examples=200)
@given(data=st.binary(max_size=200))
def test_random_bytes_are_refused(data):
    try:
        snap.decode(data)
    except SnapshotError:
        return
    raise AssertionError("random bytes decoded")
