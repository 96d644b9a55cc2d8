"""Snapshots of a tracker's pending set: bytes and files that survive a restart.

Seed 003's idea (apache/pulsar#16763: bucket snapshots of the broker's
delayed message index, so a restart need not replay the log), on the client:
``tracker.snapshot()`` serialises every pending ``(bucket, topic/partition/
ledger, Roaring bitmap of entry ids)`` and ``NegativeAcksTracker.restore(data,
adapter)`` rebuilds an equivalent tracker.

Time. Bucket times live on a *monotonic* clock whose origin dies with the
process, so a snapshot stores each bucket as the **remaining delay** from the
snapshot moment (``bucket - now``, clamped at 0: overdue means "due now") and
records the wall-clock time of the snapshot. On restore the remaining delay
counts from the restore moment, minus, with ``elapsed="wall"`` (the default),
the wall time that passed since the snapshot:

* ``"wall"``: the downtime counts against the delay, as if the process had
  never stopped. A nack delay is usually "give the downstream this long", and
  that time passed while we were down. Trade-off: it trusts the wall clock
  across the restart (and across machines, if the file moves). A clock that
  jumped *forward* makes messages due early (a burst; nothing is lost); one
  that jumped *back* is clamped to 0 elapsed (messages wait their full
  remaining delay, never longer).
* ``"none"``: the remaining delay starts again at restore. Never early, whatever
  the clocks do; late by the downtime.

Re-bucketing. The bucket grid is aligned to the monotonic origin, which moves
on restart, so a restored due time is rounded onto the new grid with the
tracker's own rounding: ``"floor"`` stays never-late and ``"ceil"`` never-early,
but the error bound widens from one bucket (2^bits - 1 ms) to two. At
``precision_bits=0``, or restoring on the same clock, times are exact.

What is (not) in a snapshot. Pending buckets and the unsent outbox (keys
popped but not yet handed to the adapter, e.g. while it backs off after a
failure: restored as due now). Not the batch an adapter call is working on at
that moment: it is neither pending nor lost yet. Snapshot after ``await
tracker.close()`` (which waits for that call) to have everything. Not the
counters of ``stats()`` nor the configuration (delay, backoff, hooks): those
are the caller's, passed again to ``restore``. Occurrences of one entry that
are both overdue (several buckets clamped to "now") merge into one redelivery.

Format (little-endian, version 1)::

    header (32 bytes)
      0  8s  magic        b"\\x89NAKSNP\\n"   (PNG-style: catches text-mode mangling)
      8  H   version      1
      10 H   flags        0 (reserved: a reader refuses bits it does not know)
      12 I   body_crc32   zlib.crc32 of the body
      16 Q   body_len     exact; anything shorter or longer is refused
      24 I   header_crc32 of bytes 0..23 (tells corruption from a newer version)
      28 4x  zero
    body
      q  taken_wall_ns    time.time_ns() at the snapshot
      B  precision_bits   B  rounding (0 floor, 1 ceil)
      Q  pending          sum of the records' cardinalities (a cross-check)
      I  n_origins        I  n_records
      n_origins x (Q ledger_id, q partition, i topic_len (-1: None), topic utf-8)
      n_records x (I origin, Q remaining_ms, B width (32|64), Q cardinality,
                   Q nbytes, pyroaring portable serialisation of the entry ids)

Decoding is all-or-nothing: :func:`decode` checks and deserialises everything
into a :class:`Snapshot` before anything is built from it; any defect raises
:class:`SnapshotError`. Cost: O(n) in the serialised size, both ways.
"""

from __future__ import annotations

import errno
import math
import os
import stat
import struct
import tempfile
import time
import zlib
from dataclasses import dataclass
from typing import Any, Optional, Union

from pyroaring import BitMap, BitMap64

from ._checks import MAX_DUE, MAX_ID
from .errors import SnapshotError

__all__ = ["SnapshotError", "Snapshot", "encode", "decode", "restore", "write_atomic", "read_file",
           "MAGIC", "VERSION", "MAX_FILE_BYTES"]

MAGIC = b"\x89NAKSNP\n"
VERSION = 1
#: The largest snapshot file read (4 GiB: about 500 million pending nacks of consecutive ids, far more
#: when they share buckets); a larger one is refused before it is read.
MAX_FILE_BYTES = 1 << 32

_HEADER = struct.Struct("<8sHHIQI4x")  # 32 bytes
_HEADER_CRC_SPAN = 24
_BODY_HEAD = struct.Struct("<qBBQII")
_ORIGIN = struct.Struct("<Qqi")
_RECORD = struct.Struct("<IQBQQ")
_ROUNDINGS = ("floor", "ceil")

Origin = tuple[Optional[str], int, int]  # (topic, partition, ledger_id), as the tracker's _origins
Bitmap = Union[BitMap, BitMap64]


@dataclass(frozen=True)
class Snapshot:
    """A decoded snapshot: checked, complete, not yet attached to a tracker.

    ``origins[i]`` is ``(topic, partition, ledger_id)``; ``records`` are
    ``(origin index, remaining_ms, bitmap of entry ids)`` in remaining order.
    """

    taken_wall_ns: int
    precision_bits: int
    rounding: str
    pending: int
    origins: tuple[Origin, ...]
    records: tuple[tuple[int, int, Bitmap], ...]

    def __repr__(self) -> str:
        return (f"Snapshot(pending={self.pending}, records={len(self.records)}, origins={len(self.origins)}, "
                f"precision_bits={self.precision_bits}, rounding={self.rounding!r}, "
                f"taken_wall_ns={self.taken_wall_ns})")


# -- encoding ---------------------------------------------------------------------

def encode(tracker: Any) -> bytes:
    """Serialise ``tracker``'s pending set (see the module docstring).

    Reads what :meth:`~nacktracker.NegativeAcksTracker.export_pending` gives
    (and ``precision_bits``, ``rounding``). Does not mutate the tracker.
    Runtime complexity: O(b + s) for b bitmaps serialising to s bytes.
    """
    now, unsent, buckets = tracker.export_pending()
    origin_ids: dict[Origin, int] = {}
    merged: dict[tuple[int, int], Bitmap] = {}  # (origin, remaining) -> ids

    def put(origin: Origin, remaining: int, bm: Bitmap) -> None:
        o = origin_ids.setdefault(origin, len(origin_ids))
        old = merged.get((o, remaining))
        if old is None:
            merged[(o, remaining)] = bm
        else:  # overdue buckets of one origin all clamp to 0: one record
            merged[(o, remaining)] = _union(old, bm)

    # the outbox first: popped, not yet handed over, so due now
    for origin, entries in unsent.items():
        put(origin, 0, BitMap64(entries) if max(entries) >> 32 else BitMap(entries))
    for origin, bucket, bm in buckets:
        put(origin, min(MAX_ID, max(0, bucket - now)), bm)

    parts = [b""]  # body head goes first, once the counts are known
    for topic, partition, ledger in origin_ids:
        raw = None if topic is None else topic.encode("utf-8")
        parts.append(_ORIGIN.pack(ledger, partition, -1 if raw is None else len(raw)))
        if raw:
            parts.append(raw)
    pending = 0
    for (o, remaining), bm in sorted(merged.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        raw = bm.serialize()
        width = 64 if type(bm) is BitMap64 else 32
        parts.append(_RECORD.pack(o, remaining, width, len(bm), len(raw)))
        parts.append(raw)
        pending += len(bm)
    parts[0] = _BODY_HEAD.pack(time.time_ns(), tracker.precision_bits, _ROUNDINGS.index(tracker.rounding),
                               pending, len(origin_ids), len(merged))
    body = b"".join(parts)
    head = _HEADER.pack(MAGIC, VERSION, 0, zlib.crc32(body), len(body), 0)
    head = head[:_HEADER_CRC_SPAN] + struct.pack("<I", zlib.crc32(head[:_HEADER_CRC_SPAN])) + b"\0" * 4
    return head + body


def _union(a: Bitmap, b: Bitmap) -> Bitmap:
    if type(a) is BitMap and type(b) is BitMap:
        return a | b
    out = BitMap64(a)
    out |= b if type(b) is BitMap64 else BitMap64(b)
    return out


# -- decoding ---------------------------------------------------------------------

def decode(data: Any) -> Snapshot:
    """Check and decode snapshot bytes into a :class:`Snapshot`.

    ``data``: ``bytes``, ``bytearray`` or ``memoryview``. Raises ``TypeError``
    for anything else and :class:`SnapshotError` for bytes that are not a
    complete, intact, version-1 snapshot. Runtime complexity: O(n) bytes.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"snapshot data must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEADER.size:
        if MAGIC.startswith(data[:len(MAGIC)]) and data:
            raise SnapshotError(f"truncated snapshot: {len(data)} bytes, the header alone is {_HEADER.size}")
        raise SnapshotError("not a nacktracker snapshot (too short, wrong magic bytes)")
    magic, version, flags, body_crc, body_len, header_crc = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SnapshotError(f"not a nacktracker snapshot (magic bytes {magic!r}, expected {MAGIC!r})")
    if zlib.crc32(data[:_HEADER_CRC_SPAN]) != header_crc or data[28:32] != b"\0\0\0\0":
        raise SnapshotError("corrupted snapshot header (checksum mismatch)")
    if version != VERSION:
        raise SnapshotError(f"unsupported snapshot format version {version} (this reader knows {VERSION})")
    if flags:
        raise SnapshotError(f"unsupported snapshot flags {flags:#06x}")
    body = data[_HEADER.size:]
    if len(body) != body_len:
        what = "truncated" if len(body) < body_len else "trailing bytes after"
        raise SnapshotError(f"{what} snapshot: body is {len(body)} bytes, header says {body_len}")
    if zlib.crc32(body) != body_crc:
        raise SnapshotError("corrupted snapshot body (checksum mismatch)")
    try:
        return _parse(body)
    except SnapshotError:
        raise
    except (struct.error, ValueError, IndexError, OverflowError, UnicodeDecodeError) as exc:
        # checksums passed, so the writer itself produced this: still refuse cleanly
        raise SnapshotError(f"malformed snapshot body: {exc}") from None


def _parse(body: bytes) -> Snapshot:
    taken, bits, rounding, pending, n_origins, n_records = _BODY_HEAD.unpack_from(body)
    if bits > 30 or rounding >= len(_ROUNDINGS):
        raise SnapshotError(f"bad precision_bits {bits} or rounding {rounding}")
    pos = _BODY_HEAD.size
    # every origin takes >= 20 bytes and every record >= 29: bound counts before allocating
    if n_origins * _ORIGIN.size + n_records * _RECORD.size > len(body) - pos:
        raise SnapshotError("malformed snapshot body: counts exceed its size")
    origins: list[Origin] = []
    for _ in range(n_origins):
        ledger, partition, topic_len = _ORIGIN.unpack_from(body, pos)
        pos += _ORIGIN.size
        if ledger > MAX_ID or partition < -1 or topic_len < -1 or pos + max(0, topic_len) > len(body):
            raise SnapshotError("malformed snapshot origin")
        topic = None
        if topic_len >= 0:
            topic = body[pos:pos + topic_len].decode("utf-8")
            pos += topic_len
        origins.append((topic, partition, ledger))
    if len(set(origins)) != len(origins):
        raise SnapshotError("malformed snapshot: duplicate origins")
    records = []
    total = 0
    for _ in range(n_records):
        o, remaining, width, count, size = _RECORD.unpack_from(body, pos)
        pos += _RECORD.size
        if o >= n_origins or remaining > MAX_ID or width not in (32, 64) or not count or pos + size > len(body):
            raise SnapshotError("malformed snapshot record")
        bm = (BitMap if width == 32 else BitMap64).deserialize(body[pos:pos + size])
        pos += size
        if len(bm) != count or bm.max() > MAX_ID:
            raise SnapshotError("malformed snapshot record: bitmap does not match its header")
        records.append((o, remaining, bm))
        total += count
    if pos != len(body):
        raise SnapshotError(f"malformed snapshot: {len(body) - pos} unread bytes")
    if total != pending:
        raise SnapshotError(f"malformed snapshot: records hold {total} ids, header says {pending}")
    records.sort(key=lambda r: r[1])  # install in due order (the index compacts older buckets as it goes)
    return Snapshot(taken, bits, _ROUNDINGS[rounding], pending, tuple(origins), tuple(records))


# -- restoring --------------------------------------------------------------------

def restore(cls: type, data: Any, adapter: Any, *, elapsed: str = "wall", **tracker_kwargs: Any) -> Any:
    """Decode ``data`` fully, then build ``cls(adapter, **tracker_kwargs)`` and
    load it. ``precision_bits``/``rounding`` default to the snapshot's.

    Must run inside the event loop (or get ``clock=``): due times are placed
    on the new tracker's clock. Raises ``TypeError``/``ValueError`` for bad
    arguments and :class:`SnapshotError` for bad data, before any tracker
    exists. Runtime complexity: O(n) in the snapshot's size.
    """
    if elapsed not in ("wall", "none"):
        raise ValueError(f"elapsed must be 'wall' or 'none', got {elapsed!r}")
    snap = data if isinstance(data, Snapshot) else decode(data)
    tracker_kwargs.setdefault("precision_bits", snap.precision_bits)
    tracker_kwargs.setdefault("rounding", snap.rounding)
    tracker = cls(adapter, **tracker_kwargs)
    try:
        tracker.clock  # noqa: B018  (binds it to the running loop unless it has a clock)
    except RuntimeError:
        raise RuntimeError("restore() needs a running event loop or a clock= argument") from None
    shift = 0
    if elapsed == "wall":
        shift = max(0, (time.time_ns() - snap.taken_wall_ns) // 1_000_000)
    _install(tracker, snap, shift)
    return tracker


def _install(tracker: Any, snap: Snapshot, shift_ms: int) -> None:
    """Load ``snap``'s records into a fresh, bound tracker, their remaining delays
    less ``shift_ms`` (:meth:`~nacktracker.NegativeAcksTracker.import_pending`)."""
    now = math.ceil(tracker.clock.now_ms())
    # a saved delay may be up to MAX_ID (the format's limit); the index takes dues up to MAX_DUE
    tracker.import_pending(snap.origins, [(o, min(MAX_DUE, now + max(0, remaining - shift_ms)), bm.to_array())
                                          for o, remaining, bm in snap.records])


# -- files ------------------------------------------------------------------------

def write_atomic(path: Any, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old file or the new
    one, never a mix: a temporary file in the same directory, ``fsync``,
    ``os.replace``, then ``fsync`` of the directory (the rename itself must
    reach the disk). On failure the temporary file is removed and the old
    file is untouched. The file is created with mode 0600 (``mkstemp``)."""
    path = os.fspath(path)
    if not isinstance(path, str):
        path = os.fsdecode(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG
    if not stat.S_ISREG(mode):  # a device, a FIFO, a directory: never replaced by a snapshot
        raise OSError(errno.EINVAL, f"not a regular file ({_kind(mode)})", path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # platforms that cannot open directories (Windows): the rename is all we get
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the data file itself is synced
    finally:
        os.close(dfd)


def read_file(path: Any, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a snapshot file: a regular file of at most ``limit`` bytes
    (:data:`MAX_FILE_BYTES`). ``OSError`` if it cannot be read, is larger, or
    is not a regular file: a device such as ``/dev/zero`` would be read without
    end, a FIFO would block the open (it is opened without waiting, then refused)."""
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file ({_kind(st.st_mode)})", os.fspath(path))
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes ({st.st_size})", os.fspath(path))
        data = f.read(limit + 1)  # bounded even if the file grows meanwhile
        if len(data) > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
        return data


def _kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a file"
