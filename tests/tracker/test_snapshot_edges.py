"""Snapshot edges that `make mutate` found untested (mutation/REPORT.md): a
restored tracker's timer honours the adapter's lead, overdue buckets are due
now (remaining 0) and merge with the unsent outbox across 32- and 64-bit ids,
records are written in a fixed order, the format's limits are accepted and one
past them refused, and atomic saves use a hidden temporary file beside the
target."""

from __future__ import annotations

import asyncio
import os

import pytest
from pyroaring import BitMap, BitMap64

from nacktracker import ManualClock, MessageKey, NegativeAcksTracker
from nacktracker import snapshot as snap
from nacktracker.adapters import MemoryAdapter
from test_snapshot import assert_refused, good, reseal  # noqa: F401 (good: a fixture)

MAX_ID = 2**63 - 1


async def settle(rounds: int = 5) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def tracker_on(start_ms=1_000, lead_ms=0, **kw):
    clock = ManualClock(start_ms=start_ms)
    adapter = MemoryAdapter(clock=clock.now_ms, lead_ms=lead_ms)
    return NegativeAcksTracker(adapter, clock=clock, **kw), adapter, clock


async def test_a_restored_tracker_fires_the_adapters_lead_early():
    tracker, _, _ = tracker_on(precision_bits=0)
    tracker.add(MessageKey(1, 1), delay_ms=500)
    clock = ManualClock(start_ms=7_000)
    new = NegativeAcksTracker.restore(tracker.snapshot(), MemoryAdapter(clock=clock.now_ms, lead_ms=30),
                                      clock=clock, elapsed="none")
    assert new.next_fire_ms() == 7_000 + 500 - 30


async def test_overdue_buckets_are_due_now_and_merge_with_the_unsent_outbox():
    """A closed tracker keeps an unsent batch (the adapter failed) and pending buckets that
    became overdue: each origin's overdue ids are one record with remaining 0, whatever
    mix of 32- and 64-bit ids; small unsent ids stay a 32-bit bitmap."""
    for unsent_id, pending_id in ((2**40, 1), (1, 2**40), (3, 4)):
        tracker, adapter, clock = tracker_on(precision_bits=0)
        adapter.fail_next(5)
        tracker.add(MessageKey(4, unsent_id, topic="t"), delay_ms=10)
        tracker.add(MessageKey(4, pending_id, topic="t"), delay_ms=20)
        tracker.add(MessageKey(5, 9, topic="t"), delay_ms=5_000)
        clock.advance(10)
        await settle()
        await tracker.close()  # the timer stops: the bucket at +20 stays pending
        assert tracker.stats()["unsent"] == 1 and tracker.pending == 2
        clock.advance(100)
        info = snap.decode(tracker.snapshot())
        records = {(info.origins[o], remaining): bm for o, remaining, bm in info.records}
        overdue = records[(("t", -1, 4), 0)]
        assert sorted(overdue) == sorted({unsent_id, pending_id})
        assert type(overdue) is (BitMap64 if max(unsent_id, pending_id) >> 32 else BitMap)
        assert records[(("t", -1, 5), 5_000 - 110)] == BitMap([9])
        assert info.pending == 3 and len(info.records) == 2
        # records come in (remaining, origin) order
        assert [(r, o) for o, r, _ in info.records] == sorted((r, o) for o, r, _ in info.records)


async def test_the_format_limits_round_trip():
    """precision_bits 30, a ledger id of 2^63 - 1, an empty topic name (not None)."""
    tracker, _, _ = tracker_on(precision_bits=30)
    tracker.add(MessageKey(MAX_ID, 1, topic=""), delay_ms=5)
    tracker.add(MessageKey(7, 2), delay_ms=5)  # topic None (a topic-less id of ledger MAX_ID would join "")
    info = snap.decode(tracker.snapshot())
    assert info.precision_bits == 30
    assert sorted(info.origins, key=repr) == sorted([("", -1, MAX_ID), (None, -1, 7)], key=repr)
    clock = ManualClock(start_ms=0)
    new = NegativeAcksTracker.restore(tracker.snapshot(), MemoryAdapter(clock=clock.now_ms), clock=clock)
    assert new.precision_bits == 30 and MessageKey(MAX_ID, 1, topic="") in new and MessageKey(7, 2) in new


def _origin_spans(body):
    n_origins = snap._BODY_HEAD.unpack_from(body)[4]
    pos, spans = snap._BODY_HEAD.size, []
    for _ in range(n_origins):
        ledger, partition, topic_len = snap._ORIGIN.unpack_from(body, pos)
        spans.append((pos, ledger, partition, topic_len))
        pos += snap._ORIGIN.size + max(0, topic_len)
    return spans, pos


def test_one_past_each_origin_limit_is_refused(good):  # noqa: F811
    body = good[32:]
    spans, _ = _origin_spans(body)
    pos, ledger, partition, topic_len = spans[0]
    for fields in ((ledger, -2, topic_len), (ledger, partition, -2), (MAX_ID, partition, topic_len)):
        bad = body[:pos] + snap._ORIGIN.pack(*fields) + body[pos + snap._ORIGIN.size:]
        if fields[0] == MAX_ID:  # the largest ledger id is valid (its topic and records unchanged)
            clock = ManualClock()
            NegativeAcksTracker.restore(reseal(bad), MemoryAdapter(clock=clock.now_ms), clock=clock)
        else:
            assert_refused(reseal(bad), match="^malformed snapshot origin$")


def test_a_record_may_say_max_id_remaining_and_not_more(good):  # noqa: F811
    body = good[32:]
    _, pos = _origin_spans(body)
    o, _, width, count, size = snap._RECORD.unpack_from(body, pos)
    far = body[:pos] + snap._RECORD.pack(o, MAX_ID, width, count, size) + body[pos + snap._RECORD.size:]
    clock = ManualClock()
    restored = NegativeAcksTracker.restore(reseal(far), MemoryAdapter(clock=clock.now_ms), clock=clock)
    assert restored.pending == snap.decode(good).pending


@pytest.mark.parametrize("field,size", [(4, snap._ORIGIN.size), (5, snap._RECORD.size)])
def test_counts_one_past_what_the_body_can_hold_are_refused(good, field, size):  # noqa: F811
    body = good[32:]
    head = list(snap._BODY_HEAD.unpack_from(body))
    head[field] = (len(body) - snap._BODY_HEAD.size) // size + 1
    assert_refused(reseal(snap._BODY_HEAD.pack(*head) + body[snap._BODY_HEAD.size:]),
                   match="^malformed snapshot body: counts exceed its size$")


def test_duplicate_origins_are_refused_with_their_message(good):  # noqa: F811
    body = good[32:]
    spans, _ = _origin_spans(body)
    pos, ledger, partition, topic_len = spans[0]
    end = pos + snap._ORIGIN.size + max(0, topic_len)
    head = list(snap._BODY_HEAD.unpack_from(body))
    # the first origin again in place of the second one of the same byte length
    for p2, _, _, t2 in spans[1:]:
        if t2 == topic_len:
            bad = body[:p2] + body[pos:end] + body[p2 + (end - pos):]
            assert_refused(reseal(snap._BODY_HEAD.pack(*head) + bad[snap._BODY_HEAD.size:]),
                           match="^malformed snapshot: duplicate origins$")
            return
    pytest.fail("the fixture has no two origins of the same length")


async def test_save_writes_a_hidden_temporary_file_beside_the_target_and_takes_bytes_paths(tmp_path, monkeypatch):
    tracker, _, _ = tracker_on(precision_bits=0)
    tracker.add(MessageKey(1, 1), delay_ms=50)
    target = tmp_path / "state.snap"
    renames = []
    real_replace = os.replace

    def replace(src, dst):
        renames.append((src, dst))
        return real_replace(src, dst)

    monkeypatch.setattr(snap.os, "replace", replace)
    tracker.save(os.fsencode(target))  # a bytes path works as a str one
    assert target.read_bytes()[:8] == snap.MAGIC
    ((src, dst),) = renames
    src = os.fsdecode(src)
    assert os.path.dirname(src) == str(tmp_path) and os.fsdecode(dst).endswith("state.snap")
    assert os.path.basename(src).startswith(".state.snap.") and src.endswith(".tmp")
    assert sorted(os.listdir(tmp_path)) == ["state.snap"]



def test_decode_refusals_say_exactly_what_is_wrong(good):  # noqa: F811
    """Each refusal's whole message (a user reads it; mutmut mangles it otherwise unseen)."""
    body = good[32:]
    header_bytes = snap._HEADER.size
    cases = [
        (b"", "not a nacktracker snapshot (too short, wrong magic bytes)"),
        (b"{" * 20, "not a nacktracker snapshot (too short, wrong magic bytes)"),
        (b"{" * 40, "not a nacktracker snapshot (magic bytes b'{{{{{{{{', expected b'\\x89NAKSNP\\n')"),
        (good[:header_bytes], f"truncated snapshot: body is 0 bytes, header says {len(body)}"),
        (good[:header_bytes - 1], f"truncated snapshot: {header_bytes - 1} bytes, the header alone is {header_bytes}"),
        (good[:-1], f"truncated snapshot: body is {len(body) - 1} bytes, header says {len(body)}"),
        (good + b"\0", f"trailing bytes after snapshot: body is {len(body) + 1} bytes, header says {len(body)}"),
        (good[:32] + bytes([body[0] ^ 1]) + body[1:], "corrupted snapshot body (checksum mismatch)"),
        (good[:30] + b"\1" + good[31:], "corrupted snapshot header (checksum mismatch)"),
    ]
    for data, message in cases:
        with pytest.raises(snap.SnapshotError) as info:
            snap.decode(data)
        assert str(info.value) == message, (data[:40], str(info.value))
    with pytest.raises(TypeError) as info:
        snap.decode("text")
    assert str(info.value) == "snapshot data must be bytes, not str"
    with pytest.raises(RuntimeError) as info:  # no loop running here, and no clock given
        NegativeAcksTracker.restore(good, MemoryAdapter())
    assert str(info.value) == "restore() needs a running event loop or a clock= argument"


async def test_restore_subtracts_wall_time_by_default(monkeypatch):
    tracker, _, _ = tracker_on(precision_bits=0)
    tracker.add(MessageKey(1, 1), delay_ms=1_000)
    wall = 1_700_000_000_000_000_000
    monkeypatch.setattr(snap.time, "time_ns", lambda: wall)
    data = tracker.snapshot()
    monkeypatch.setattr(snap.time, "time_ns", lambda: wall + 300 * 1_000_000)
    clock = ManualClock(start_ms=0)
    new = NegativeAcksTracker.restore(data, MemoryAdapter(clock=clock.now_ms), clock=clock)  # elapsed="wall"
    assert new.next_fire_ms() == 700


def _records_in_bytes(data):
    """``(origin, remaining, ids)`` of each record, in the order the bytes hold them."""
    body = data[32:]
    n_records = snap._BODY_HEAD.unpack_from(body)[5]
    _, pos = _origin_spans(body)
    out = []
    for _ in range(n_records):
        o, remaining, width, _, size = snap._RECORD.unpack_from(body, pos)
        pos += snap._RECORD.size
        bm = (BitMap if width == 32 else BitMap64).deserialize(body[pos:pos + size])
        out.append((o, remaining, sorted(bm)))
        pos += size
    return out


async def test_records_are_written_and_decoded_in_remaining_then_origin_order():
    """The documented order with origins whose numbering disagrees with their delays and with
    their slots: origin 0 (ledger 2) is first met in the earliest bucket, origin 1 (ledger 1)
    holds the lower routing slot and shares the +100 bucket with origin 0, and the smallest ids
    run against the order. Bytes: (remaining, origin) ascending; decoded: remaining order (ties
    as written)."""
    tracker, _, _ = tracker_on(precision_bits=0)
    tracker.add(MessageKey(1, 10), delay_ms=100)  # ledger 1 first: the lower slot
    tracker.add(MessageKey(2, 70), delay_ms=80)
    tracker.add(MessageKey(2, 50), delay_ms=100)
    tracker.add(MessageKey(2, 1), delay_ms=500)
    data = tracker.snapshot()
    info = snap.decode(data)
    assert info.origins == ((None, -1, 2), (None, -1, 1))  # numbered as first met, in time order
    expected = [(0, 80, [70]), (0, 100, [50]), (1, 100, [10]), (0, 500, [1])]
    assert _records_in_bytes(data) == expected
    assert [(o, r, sorted(bm)) for o, r, bm in info.records] == expected


async def test_an_unsent_id_just_past_32_bits_round_trips_in_a_64_bit_record():
    """Unsent (outbox) ids of 2^32 and 2^33 - 1 need a 64-bit bitmap; 2^32 - 1 still fits 32 bits."""
    for unsent_id, width in ((2**32, BitMap64), (2**33 - 1, BitMap64), (2**32 - 1, BitMap)):
        tracker, adapter, clock = tracker_on(precision_bits=0)
        adapter.fail_next(5)
        tracker.add(MessageKey(4, unsent_id, topic="t"), delay_ms=10)
        clock.advance(10)
        await settle()
        await tracker.close()
        assert tracker.stats()["unsent"] == 1 and tracker.pending == 0
        info = snap.decode(tracker.snapshot())
        ((o, remaining, bm),) = info.records
        assert info.origins[o] == ("t", -1, 4) and remaining == 0
        assert type(bm) is width and list(bm) == [unsent_id]
        clock2 = ManualClock(start_ms=0)
        new = NegativeAcksTracker.restore(tracker.snapshot(), MemoryAdapter(clock=clock2.now_ms), clock=clock2)
        assert MessageKey(4, unsent_id, topic="t") in new


def _first_record(body):
    _, pos = _origin_spans(body)
    return pos, snap._RECORD.unpack_from(body, pos)


def test_record_refusals_say_exactly_what_is_wrong(good):  # noqa: F811
    """Each field of a record one past its limit, alone (the others valid), is refused with its
    whole message; so are a bitmap disagreeing with its header and bytes left over."""
    body = good[32:]
    n_origins = snap._BODY_HEAD.unpack_from(body)[4]
    pos, (o, rem, width, count, size) = _first_record(body)
    past_end = len(body) - pos - snap._RECORD.size + 1  # the record's bitmap would run past the body
    for fields in ((n_origins, rem, width, count, size), (o, MAX_ID + 1, width, count, size),
                   (o, rem, 48, count, size), (o, rem, width, 0, size), (o, rem, width, count, past_end)):
        bad = body[:pos] + snap._RECORD.pack(*fields) + body[pos + snap._RECORD.size:]
        assert_refused(reseal(bad), match=r"^malformed snapshot record$")
    bad = body[:pos] + snap._RECORD.pack(o, rem, width, count + 1, size) + body[pos + snap._RECORD.size:]
    assert_refused(reseal(bad), match=r"^malformed snapshot record: bitmap does not match its header$")
    # a 64-bit record holding one id past the largest (2^63): its count agrees with its bitmap
    raw = BitMap64([MAX_ID + 1]).serialize()
    beyond = body[:pos] + snap._RECORD.pack(o, rem, 64, 1, len(raw)) + raw + body[pos + snap._RECORD.size + size:]
    head = list(snap._BODY_HEAD.unpack_from(beyond))
    head[3] += 1 - count  # the header's total agrees too
    beyond = snap._BODY_HEAD.pack(*head) + beyond[snap._BODY_HEAD.size:]
    assert_refused(reseal(beyond), match=r"^malformed snapshot record: bitmap does not match its header$")
    assert_refused(reseal(body + b"\0\0\0"), match=r"^malformed snapshot: 3 unread bytes$")
