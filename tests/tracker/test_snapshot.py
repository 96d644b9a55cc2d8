"""Snapshots: round trips on fake clocks, remaining delays, and refusal of bad
bytes with nothing loaded; atomic files."""

from __future__ import annotations

import asyncio
import os
import struct
import zlib

import pytest

from nacktracker import ManualClock, MessageKey, NegativeAcksTracker
from nacktracker import snapshot as snap
from nacktracker.adapters import MemoryAdapter
from nacktracker.snapshot import SnapshotError


async def settle(rounds: int = 5) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def make(start_ms=1_000_000, **kw):
    clock = ManualClock(start_ms=start_ms)
    adapter = MemoryAdapter(clock=clock.now_ms)
    return NegativeAcksTracker(adapter, clock=clock, **kw), adapter, clock


def restored(data, start_ms=5_000, **kw):
    clock = ManualClock(start_ms=start_ms)
    adapter = MemoryAdapter(clock=clock.now_ms)
    kw.setdefault("elapsed", "none")
    return NegativeAcksTracker.restore(data, adapter, clock=clock, **kw), adapter, clock


async def arrivals(adapter, clock, until_ms, step=1):
    """Advance ``clock`` ms by ms to ``until_ms``; return {key: arrival time}."""
    while clock.now_ms() < until_ms:
        clock.advance(step)
        await settle(3)
    out = {}
    for call in adapter.calls:
        for key in call.keys:
            assert key not in out, f"{key} redelivered twice"
            out[key] = call.at_ms
    return out


TA, TB = "persistent://public/default/a", "persistent://public/default/b"
# ledger 3 is used by two topics and by a topic-less id; ledger 9 by a partition
KEYS_AND_DELAYS = [
    (MessageKey(3, 1, topic=TA), 100),
    (MessageKey(3, 1, topic=TB), 250),
    (MessageKey(3, 2, topic=TB), 250),
    (MessageKey(3, 7), 40),
    (MessageKey(9, 5, partition=2, topic=TA + "-partition-2"), 300),
    (MessageKey(11, 2**40 + 5), 120),  # needs a BitMap64
    (MessageKey(11, 3), 120),
    (MessageKey(12, 2**63 - 1, partition=0), 500),
]


async def test_round_trip_keeps_routing_big_ids_and_remaining_delays_exactly():
    tracker, _, clock = make(precision_bits=0)
    for key, delay in KEYS_AND_DELAYS:
        tracker.add(key, delay_ms=delay)
    clock.advance(30)  # 30 ms pass before the snapshot: remaining = delay - 30
    data = tracker.snapshot()
    info = snap.decode(data)
    assert info.pending == len(KEYS_AND_DELAYS) == tracker.pending
    assert info.precision_bits == 0 and info.rounding == "floor"

    new, adapter, clock2 = restored(data, start_ms=5_000)  # another process: another clock origin
    assert new.pending == tracker.pending
    for key, _ in KEYS_AND_DELAYS:
        assert key in new
    got = await arrivals(adapter, clock2, 5_000 + 600)
    assert got == {key: 5_000 + delay - 30 for key, delay in KEYS_AND_DELAYS}
    assert new.pending == 0 and new._origins == {} and new._slots == {}


@pytest.mark.parametrize("bits,rounding", [(0, "floor"), (8, "floor"), (8, "ceil"), (4, "ceil")])
async def test_restore_on_the_same_clock_is_identical(bits, rounding):
    tracker, _, clock = make(precision_bits=bits, rounding=rounding)
    for i, (key, delay) in enumerate(KEYS_AND_DELAYS):
        tracker.add(key, delay_ms=delay * 7 + i)
        tracker.add(key, delay_ms=delay * 13)  # pending in two buckets
    data = tracker.snapshot()
    adapter = MemoryAdapter(clock=clock.now_ms)
    new = NegativeAcksTracker.restore(data, adapter, clock=clock, elapsed="none")
    assert (new.precision_bits, new.rounding) == (bits, rounding)  # defaults from the snapshot
    assert new.pending == tracker.pending
    assert new.next_fire_ms() == tracker.next_fire_ms()
    assert content(new) == content(tracker)
    await tracker.close()
    assert decoded(new.snapshot()) == decoded(data)


def content(tracker):
    """Sorted (bucket, origin, entry ids): slots may be numbered differently."""
    return sorted((b, repr(tracker._origins[s]), list(bm)) for b, s, bm in tracker._index.iter_bitmaps())


def decoded(data):
    info = snap.decode(data)
    return sorted((repr(info.origins[o]), remaining, list(bm)) for o, remaining, bm in info.records)


async def test_rebucketing_on_a_new_grid_keeps_the_rounding_direction():
    """floor never fires late, ceil never early, with at most two bucket widths of error."""
    for rounding in ("floor", "ceil"):
        tracker, _, clock = make(start_ms=1_000_003, precision_bits=4, rounding=rounding)
        due = {}
        for i in range(40):
            due[MessageKey(1, i)] = tracker.add(MessageKey(1, i), delay_ms=50 + 7 * i) - 1_000_003
        new, adapter, clock2 = restored(tracker.snapshot(), start_ms=5_009)
        got = await arrivals(adapter, clock2, 5_009 + 400)
        assert set(got) == set(due)
        for key, delay in due.items():
            error = got[key] - (5_009 + delay)
            assert (-32 < error <= 0) if rounding == "floor" else (0 <= error < 32), (rounding, key, error)


async def test_elapsed_wall_subtracts_downtime_and_overdue_is_due_now(monkeypatch):
    tracker, _, clock = make(precision_bits=0)
    tracker.add(MessageKey(1, 1), delay_ms=100)
    tracker.add(MessageKey(1, 2), delay_ms=1_000)
    wall = 1_700_000_000_000_000_000
    monkeypatch.setattr(snap.time, "time_ns", lambda: wall)
    data = tracker.snapshot()
    monkeypatch.setattr(snap.time, "time_ns", lambda: wall + 400 * 1_000_000)  # 400 ms of downtime
    new, adapter, clock2 = restored(data, start_ms=0, elapsed="wall")
    assert new.next_fire_ms() == 0  # the 100 ms one is overdue: due now
    got = await arrivals(adapter, clock2, 700)
    assert got == {MessageKey(1, 1): 1, MessageKey(1, 2): 600}  # 1: the first fire after advancing

    monkeypatch.setattr(snap.time, "time_ns", lambda: wall - 10**12)  # the wall clock went back
    new, adapter, clock2 = restored(data, start_ms=0, elapsed="wall")
    assert new.next_fire_ms() == 100  # clamped: nothing waits longer than its remaining delay


async def test_unsent_outbox_and_closed_trackers_are_included():
    tracker, adapter, clock = make(precision_bits=0)
    tracker.add(MessageKey(4, 1, topic="t"), delay_ms=10)
    tracker.add(MessageKey(4, 2, topic="t"), delay_ms=5_000)
    adapter.fail_next(5)
    clock.advance(10)
    await settle()
    assert tracker.stats()["unsent"] == 1 and tracker.pending == 1
    await tracker.close()
    data = tracker.snapshot()
    assert snap.decode(data).pending == 2
    new, adapter2, clock2 = restored(data, start_ms=0)
    got = await arrivals(adapter2, clock2, 5_100, step=10)
    assert got == {MessageKey(4, 1, topic="t"): 0 + 10, MessageKey(4, 2, topic="t"): 4_990}


def test_empty_and_unbound_trackers_round_trip_without_a_loop():
    tracker = NegativeAcksTracker(MemoryAdapter())  # no loop, no clock: never bound
    data = tracker.snapshot()
    assert snap.decode(data).pending == 0
    clock = ManualClock()
    new = NegativeAcksTracker.restore(data, MemoryAdapter(clock=clock.now_ms), clock=clock, delay_ms=5)
    assert new.pending == 0 and new.next_fire_ms() is None and new.delay_ms == 5
    with pytest.raises(RuntimeError, match="event loop"):
        NegativeAcksTracker.restore(data, MemoryAdapter())


async def test_restore_with_another_precision_and_passes_kwargs():
    tracker, _, clock = make(precision_bits=0)
    tracker.add(MessageKey(1, 1), delay_ms=1000)
    new, _, clock2 = restored(tracker.snapshot(), start_ms=0, precision_bits=8, delay_ms=77)
    assert new.precision_bits == 8 and new.delay_ms == 77
    assert new.next_fire_ms() == 768  # 1000 floored to a multiple of 256
    with pytest.raises(ValueError, match="elapsed"):
        restored(tracker.snapshot(), elapsed="monotonic")
    with pytest.raises(TypeError):
        restored("not bytes")
    with pytest.raises(TypeError):
        restored(tracker.snapshot(), no_such_option=1)


async def test_bytearray_memoryview_and_decoded_snapshots_are_accepted():
    tracker, _, _ = make(precision_bits=0)
    tracker.add(MessageKey(1, 1), delay_ms=10)
    data = tracker.snapshot()
    for form in (bytearray(data), memoryview(data), snap.decode(data)):
        assert restored(form)[0].pending == 1
    assert "pending=1" in repr(snap.decode(data))


# -- bad bytes ---------------------------------------------------------------------------

def reseal(body: bytes, version: int = snap.VERSION, flags: int = 0) -> bytes:
    """A header with valid checksums around ``body``: reaches the body checks."""
    head = struct.pack("<8sHHIQ", snap.MAGIC, version, flags, zlib.crc32(body), len(body))
    return head + struct.pack("<I", zlib.crc32(head)) + b"\0" * 4 + body


@pytest.fixture
def good() -> bytes:
    async def build():
        clock = ManualClock(start_ms=1_000)
        tracker = NegativeAcksTracker(MemoryAdapter(clock=clock.now_ms), clock=clock, precision_bits=0)
        for key, delay in KEYS_AND_DELAYS:
            tracker.add(key, delay_ms=delay)
        return tracker.snapshot()

    return asyncio.run(build())


def assert_refused(data, match=None):
    """SnapshotError, and no tracker constructed (nothing half-loaded)."""
    built = []

    class Spy(NegativeAcksTracker):
        def __init__(self, *a, **kw):
            built.append(1)
            super().__init__(*a, **kw)

    clock = ManualClock()
    with pytest.raises(SnapshotError, match=match):
        Spy.restore(data, MemoryAdapter(clock=clock.now_ms), clock=clock)
    assert built == []


def test_snapshot_error_is_a_value_error():
    assert issubclass(SnapshotError, ValueError)


def test_every_truncation_is_refused(good):
    for n in range(len(good)):
        assert_refused(good[:n])
    assert_refused(good[:10], match="truncated")
    assert_refused(good[:-1], match="truncated")
    assert_refused(good + b"\0", match="trailing")


def test_every_single_byte_corruption_is_refused(good):
    for i in range(len(good)):
        for flip in (0x01, 0x80, 0xFF):
            bad = bytearray(good)
            bad[i] ^= flip
            assert_refused(bytes(bad))


@pytest.mark.parametrize("foreign", [b"", b"\x89PNG\r\n\x1a\n" + b"\0" * 40, b'{"pending": []}' * 4,
                                     b"\0" * 64, os.urandom(200), zlib.compress(b"x" * 100)])
def test_foreign_bytes_are_refused(foreign):
    assert_refused(foreign, match="not a nacktracker snapshot|truncated")


def test_wrong_version_and_flags_are_refused(good):
    body = good[32:]
    assert_refused(reseal(body, version=2), match="version 2")
    assert_refused(reseal(body, version=0), match="version 0")
    assert_refused(reseal(body, flags=1), match="flags")
    clock = ManualClock()
    assert NegativeAcksTracker.restore(reseal(body), MemoryAdapter(), clock=clock).pending == len(KEYS_AND_DELAYS)


def test_a_corrupted_version_field_is_reported_as_corruption(good):
    bad = bytearray(good)
    bad[8] = 7  # version, without fixing the header checksum
    assert_refused(bytes(bad), match="corrupted snapshot header")


def _body_head(body):
    return list(snap._BODY_HEAD.unpack_from(body))


@pytest.mark.parametrize("field,value,match", [
    (1, 31, "precision_bits"), (2, 2, "rounding"), (3, 999, "header says"), (4, 10**6, "counts exceed"),
    (5, 10**6, "counts exceed"),
])
def test_malformed_bodies_with_valid_checksums_are_refused(good, field, value, match):
    body = good[32:]
    head = _body_head(body)
    head[field] = value
    assert_refused(reseal(snap._BODY_HEAD.pack(*head) + body[snap._BODY_HEAD.size:]), match=match)


def test_malformed_records_and_origins_are_refused(good):
    body = good[32:]
    head = _body_head(body)
    n_origins = head[4]
    assert_refused(reseal(body + b"\0"), match="unread")
    # fewer records than written: the rest is unread
    head2 = head[:]
    head2[5] -= 1
    assert_refused(reseal(snap._BODY_HEAD.pack(*head2) + body[snap._BODY_HEAD.size:]))
    # a record pointing at an origin that does not exist
    pos = snap._BODY_HEAD.size
    for _ in range(n_origins):
        _, _, tl = snap._ORIGIN.unpack_from(body, pos)
        pos += snap._ORIGIN.size + max(0, tl)
    o, rem, width, count, size = snap._RECORD.unpack_from(body, pos)
    for fields in ((n_origins, rem, width, count, size), (o, rem, 48, count, size), (o, rem, width, 0, size),
                   (o, rem, width, count + 1, size), (o, 2**63, width, count, size)):
        bad = body[:pos] + snap._RECORD.pack(*fields) + body[pos + snap._RECORD.size:]
        assert_refused(reseal(bad))
    # a bitmap whose bytes are not a bitmap
    bad = body[:pos + snap._RECORD.size] + b"\xff" * size + body[pos + snap._RECORD.size + size:]
    assert_refused(reseal(bad), match="malformed")
    # a topic that is not UTF-8; a duplicate origin (TA's bytes over TB's: same length, same ledger)
    spans, p = {}, snap._BODY_HEAD.size
    for _ in range(n_origins):
        _, _, tl = snap._ORIGIN.unpack_from(body, p)
        end = p + snap._ORIGIN.size + max(0, tl)
        spans[body[p + snap._ORIGIN.size:end].decode() if tl >= 0 else None] = (p, end)
        p = end
    a, b = spans[TA], spans[TB]
    assert_refused(reseal(body[:a[1] - 1] + b"\xff" + body[a[1]:]), match="malformed")
    assert_refused(reseal(body[:b[0]] + body[a[0]:a[1]] + body[b[1]:]), match="duplicate")


# -- files ---------------------------------------------------------------------------------

async def test_save_and_load_round_trip(tmp_path):
    tracker, _, clock = make(precision_bits=0)
    for key, delay in KEYS_AND_DELAYS:
        tracker.add(key, delay_ms=delay)
    path = tmp_path / "nacks.snap"
    tracker.save(path)
    tracker.save(str(path))  # replaces
    assert os.listdir(tmp_path) == ["nacks.snap"]
    clock2 = ManualClock()
    new = NegativeAcksTracker.load(path, MemoryAdapter(clock=clock2.now_ms), clock=clock2, elapsed="none")
    assert new.pending == len(KEYS_AND_DELAYS)
    with pytest.raises(FileNotFoundError):
        NegativeAcksTracker.load(tmp_path / "missing", MemoryAdapter(), clock=clock2)
    (tmp_path / "junk").write_bytes(b"hello")
    with pytest.raises(SnapshotError):
        NegativeAcksTracker.load(tmp_path / "junk", MemoryAdapter(), clock=clock2)


async def test_load_passes_elapsed_and_the_tracker_arguments_on(tmp_path, monkeypatch):
    """load() is restore() from a file: its ``elapsed`` and constructor arguments count."""
    tracker, _, _ = make(precision_bits=0)
    tracker.add(MessageKey(1, 1), delay_ms=1_000)
    wall = 1_700_000_000_000_000_000
    monkeypatch.setattr(snap.time, "time_ns", lambda: wall)
    path = tmp_path / "nacks.snap"
    tracker.save(path)
    monkeypatch.setattr(snap.time, "time_ns", lambda: wall + 400 * 1_000_000)  # 400 ms of downtime
    fires = {}
    for elapsed in ("none", "wall"):
        clock = ManualClock()
        new = NegativeAcksTracker.load(path, MemoryAdapter(), clock=clock, elapsed=elapsed, max_redeliveries=2,
                                       on_dead_letter=print)
        assert new.clock is clock and new.max_redeliveries == 2
        fires[elapsed] = new.next_fire_ms()
    assert fires == {"none": 1_000, "wall": 600}
    assert NegativeAcksTracker.load(path, MemoryAdapter(), clock=ManualClock()).next_fire_ms() == 600  # default


@pytest.mark.parametrize("fail_at", ["write", "fsync", "replace"])
async def test_a_failed_save_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch, fail_at):
    tracker, _, _ = make(precision_bits=0)
    tracker.add(MessageKey(1, 1), delay_ms=10)
    path = tmp_path / "nacks.snap"
    tracker.save(path)
    before = path.read_bytes()
    tracker.add(MessageKey(1, 2), delay_ms=10)

    def boom(*a, **kw):
        raise OSError(28, "No space left on device")

    if fail_at == "write":
        real_fdopen = os.fdopen

        class Failing:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(data[:10])  # a partial write, then the disk is full
                boom()

        monkeypatch.setattr(snap.os, "fdopen", lambda fd, mode: Failing(real_fdopen(fd, mode)))
    else:
        monkeypatch.setattr(snap.os, fail_at, boom)
    with pytest.raises(OSError, match="No space"):
        tracker.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["nacks.snap"]
    assert snap.decode(before).pending == 1
