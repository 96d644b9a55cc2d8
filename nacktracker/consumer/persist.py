"""Snapshot glue: a consumer's pending nacks (the tracker's snapshot) and its
batch records (``<snapshot_path>.batches``) saved together and restored at start.

Whose they are: ``<snapshot_path>.owner`` names the subscription and topics of
the consumer that writes them (JSON ``{"subscription": str, "topics": [str]}``);
a consumer of another subscription or other topics is refused them
(:class:`SnapshotError`; with ``snapshot_on_error="ignore"`` it restores
nothing and starts afresh). One consumer per path at a time: it holds an
exclusive ``flock`` on ``<snapshot_path>.lock`` from its start to its close
(the kernel drops it with a killed process, so nothing stays stuck); a second
consumer on the path is refused, whatever ``snapshot_on_error`` says (two
writers would each overwrite the other's nacks).

Batch-record file format: a line with the CRC-32 of the rest (8 hex digits),
then JSON ``{"snapshot_crc32": int, "entries": [[topic, partition, ledger,
entry, [[batch_index, remaining_ms, fired], ...]], ...]}`` (``fired``: 1 when
the message's bucket had fired at the save; files without it read as 0);
``snapshot_crc32`` links
it to the snapshot it was written with (a crash between the two writes leaves
a stale file, recognised and ignored).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
import math
import os
import time
import zlib
from typing import Any, Optional, Sequence

try:
    import fcntl
except ImportError:  # Windows: no flock; one consumer per path is then the caller's to keep
    fcntl = None  # type: ignore[assignment]

from .. import snapshot as _snapshot
from .._checks import check_int
from ..clock import LoopClock
from ..keys import MessageKey
from ..snapshot import SnapshotError
from ..tracker import NegativeAcksTracker
from .core import DeliveryCore
from .counts import COUNTS_SUFFIX, DeliveryCounts

__all__ = ["SnapshotStore", "BATCHES_SUFFIX", "OWNER_SUFFIX", "LOCK_SUFFIX"]

log = logging.getLogger("nacktracker.consumer")

#: Suffix of the file beside ``snapshot_path`` that holds the batch records.
BATCHES_SUFFIX = ".batches"
#: Suffix of the file that names whose the snapshot is (subscription, topics).
OWNER_SUFFIX = ".owner"
#: Suffix of the lock file a consumer holds while it uses the path.
LOCK_SUFFIX = ".lock"


class SnapshotStore:
    """Where one consumer's snapshot lives, and how it is read and written."""

    def __init__(self, path: str, on_error: str, *, subscription: Optional[str] = None,
                 topics: Sequence[str] = (), counts: Optional[DeliveryCounts] = None) -> None:
        self.path = path
        self.on_error = on_error
        #: whose the files are: compared with ``<path>.owner`` at start, written there (None: not checked)
        self.owner = None if subscription is None else {"subscription": subscription, "topics": sorted(topics)}
        self._lock_file: Optional[Any] = None  # a file object: closed (the lock dropped) with the store if forgotten
        self.restoring = True  # False once the files were found to be another consumer's (nothing of them is read)
        self.saved = self.failures = 0
        self._writing: Optional[asyncio.Future[None]] = None  # the write in flight (in a thread)
        self.counts = counts  # a consumer's own delivery counts: saved beside the snapshot (consumer/counts.py)
        self.due_at_restore: list[MessageKey] = []  # restored nacks whose time passed during the downtime

    def load_counts(self) -> int:
        """Read ``<path>.counts`` into :attr:`counts` (a consumer's own
        redelivery counts); a missing file reads as none, a corrupted one as
        the snapshot's own corruption is treated (``snapshot_on_error``).
        Returns how many were read. O(size of the file)."""
        if self.counts is None or not self.restoring:
            return 0
        due, self.due_at_restore = self.due_at_restore, []
        read = self._read_counts()
        self.counts.redelivered(due)  # their redelivery is the broker's resend: no fire will count it
        return read

    def _read_counts(self) -> int:
        assert self.counts is not None
        path = self.path + COUNTS_SUFFIX
        try:
            raw = _snapshot.read_file(path)
        except FileNotFoundError:
            return 0
        try:
            return self.counts.restore(raw, None)
        except ValueError as exc:
            self._refuse_or_skip(path, SnapshotError(str(exc)), "redelivery counts start from the broker's")
            return 0

    def load(self, adapter: Any, options: dict[str, Any], core: DeliveryCore) -> tuple[NegativeAcksTracker, int]:
        """The tracker for a start: empty on a first start, else restored from
        the file, with the batch records put into ``core``. Returns the
        tracker and the number of nacks restored. Call inside the event loop
        (restored delays count on its clock, the default ``options["clock"]``).
        Runtime: O(size of the files)."""
        if options.get("clock") is None:
            try:
                options["clock"] = LoopClock(asyncio.get_running_loop())
            except RuntimeError:
                raise RuntimeError("TrackedConsumer(snapshot_path=...) must be created inside the event "
                                   "loop (restored delays count on its clock); nacktracker.subscribe does "
                                   "that") from None
        self._lock()
        try:
            return self._load(adapter, options, core)
        except BaseException:
            self.release()
            raise

    def _load(self, adapter: Any, options: dict[str, Any], core: DeliveryCore) -> tuple[NegativeAcksTracker, int]:
        path = self.path
        if not self._owned():
            self.restoring = False
            return NegativeAcksTracker(adapter, **options), 0
        unread = "its nacked messages surface as soon as the broker resends them; saves to it fail (counted)"
        try:
            data = _snapshot.read_file(path)
        except FileNotFoundError:
            if not os.path.isdir(os.path.dirname(path)):
                self._refuse_or_skip(path, SnapshotError("its directory does not exist"), unread, keep=True)
            return NegativeAcksTracker(adapter, **options), 0  # a first start
        except OSError as exc:  # a directory, no permission, an I/O error
            self._refuse_or_skip(path, SnapshotError(f"it cannot be read ({exc.strerror or exc})"), unread,
                                 keep=True)
            return NegativeAcksTracker(adapter, **options), 0
        try:
            snap = _snapshot.decode(data)
        except SnapshotError as exc:
            self._refuse_or_skip(path, exc, "its nacked messages surface as soon as the broker resends them")
            return NegativeAcksTracker(adapter, **options), 0
        try:
            batches = self._read_batches(zlib.crc32(data))
        except SnapshotError as exc:
            self._refuse_or_skip(path + BATCHES_SUFFIX, exc, "restored batch entries wait for their last nack")
            batches = None
        # The downtime counts against every delay (the snapshot's "wall" mode): a snapshot's age is
        # data across processes, the one wall-clock reading here. Subtracted once for the tracker's
        # buckets and the records alike; nacks already due are left out (the broker resends every
        # unacknowledged message to a new consumer at once, and those copies surface).
        shift = max(0, (time.time_ns() - snap.taken_wall_ns) // 1_000_000)
        restored = snap.pending
        # Nacks due during the downtime are left out below (the broker's resend is their redelivery): they
        # count as redelivered all the same (load_counts), or a restart would grant a poison message more.
        # (Remaining 0: the unsent outbox, whose fire counted them already.)
        self.due_at_restore = [MessageKey(snap.origins[o][2], entry, snap.origins[o][1], -1, snap.origins[o][0])
                               for o, r, bm in snap.records if 0 < r <= shift for entry in bm]
        snap = dataclasses.replace(snap, records=tuple((o, r - shift, bm) for o, r, bm in snap.records
                                                       if r - shift > 0))
        # Due times on a clock reading no later than the tracker's restore takes: a record's bucket
        # time is then never later than its bucket's (fired() matches them up).
        now = math.ceil(options["clock"].now_ms())
        tracker = NegativeAcksTracker.restore(snap, adapter, elapsed="none", **options)
        for topic, partition, ledger, entry, nacked in batches or ():
            key = MessageKey(ledger, entry, partition, -1, topic)
            pending = key in tracker
            due = [(index, now + remaining - shift, bool(fired) or not pending)
                   for index, remaining, fired in nacked if remaining - shift > 0]
            if due:
                core.restore_record(key, due)
        if batches is None and snap.records:
            log.warning("%s: no batch records for this snapshot; copies of restored batch entries are held "
                        "until the entry's last nack is due", path)
            core.restored_without_records()
        # The broker resends everything unacknowledged at once: copies at or behind a restored
        # position are redeliveries and must pay the tracker lookup.
        for o, _, bm in snap.records:
            topic, partition, ledger = snap.origins[o]
            core.note_position(topic, partition, ledger, bm.max())
        log.info("restored %d pending nacks (%d due at once, %d batch records) from %s, taken %d ms ago",
                 restored, restored - tracker.pending, len(batches or ()), path, shift)
        return tracker, restored

    # -- whose the path is -------------------------------------------------------------

    def _lock(self) -> None:
        """Hold ``<path>.lock`` exclusively until :meth:`release` (or the process ends): a second
        consumer on the path gets a :class:`SnapshotError`. A path whose directory is missing or
        cannot be written is left to the snapshot's own checks (``snapshot_on_error``)."""
        if fcntl is None or self._lock_file is not None:
            return
        if os.path.lexists(self.path) and not os.path.isfile(self.path):
            return  # a directory, a device, a FIFO: refused by the read, and no lock file beside a device
        lock = self.path + LOCK_SUFFIX
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as exc:
            log.warning("cannot open %s (%s): the snapshot path is not locked", lock, exc.strerror or exc)
            return
        file = os.fdopen(fd, "r+b", buffering=0)
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            file.close()
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                log.warning("cannot lock %s (%s): the snapshot path is not locked", lock, exc.strerror or exc)
                return
            raise SnapshotError(f"snapshot path {self.path} is in use by another consumer (it holds {lock}): one "
                                "consumer per snapshot_path at a time, or each would overwrite the other's nacks. "
                                "Give this consumer a path of its own") from None
        self._lock_file = file

    def release(self) -> None:
        """Let go of the path (the consumer closed). Idempotent."""
        file, self._lock_file = self._lock_file, None
        if file is not None:
            file.close()  # closing the descriptor drops the flock

    def _owned(self) -> bool:
        """Whether the files at the path are this consumer's (or nobody's yet); writes its owner file.
        Another's: refused (:class:`SnapshotError`), or with ``snapshot_on_error="ignore"`` ``False``:
        nothing is restored and the files become this consumer's at its first save."""
        if self.owner is None:
            return True
        path = self.path + OWNER_SUFFIX
        try:
            raw = _snapshot.read_file(path, limit=1 << 20)
        except FileNotFoundError:
            raw = None
        except OSError as exc:
            self._refuse_or_skip(path, SnapshotError(f"it cannot be read ({exc.strerror or exc})"),
                                 "nothing is restored", keep=True)
            return False
        ours = True
        if raw is not None:
            try:
                theirs = json.loads(raw)
                if not isinstance(theirs, dict):
                    raise ValueError("not an object")
            except ValueError as exc:
                theirs = {"unreadable": str(exc)}
            if theirs != self.owner:
                self._refuse_or_skip(self.path, SnapshotError(
                    f"it belongs to another consumer (subscription {theirs.get('subscription')!r}, topics "
                    f"{theirs.get('topics')!r}; this one: {self.owner['subscription']!r}, "
                    f"{self.owner['topics']!r})"), "nothing is restored; its first save replaces the files",
                    keep=True, why="another consumer's")
                ours = False
        try:
            _snapshot.write_atomic(path, json.dumps(self.owner, sort_keys=True).encode())
        except OSError as exc:  # the directory is missing or read-only: the snapshot's own checks say so
            log.debug("cannot write %s: %r", path, exc)
        return ours

    def _read_batches(self, snapshot_crc: int) -> Optional[list[Any]]:
        """The batch records saved with the snapshot whose CRC-32 is
        ``snapshot_crc``; ``None`` if there is no such file or it belongs to
        another snapshot. Raises :class:`SnapshotError` if it is corrupted."""
        path = self.path + BATCHES_SUFFIX
        try:
            raw = _snapshot.read_file(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SnapshotError(f"batch records cannot be read ({exc.strerror or exc})") from None
        head, _, body = raw.partition(b"\n")
        try:
            if len(head) != 8 or int(head, 16) != zlib.crc32(body):
                raise ValueError("checksum mismatch")
            doc = json.loads(body)
            if doc["snapshot_crc32"] != snapshot_crc:
                log.warning("%s belongs to another snapshot; ignored", path)
                return None
            entries = []
            for topic, partition, ledger, entry, nacked in doc["entries"]:
                if not (topic is None or isinstance(topic, str)) or type(partition) is not int or partition < -1:
                    raise ValueError(f"bad topic {topic!r} or partition {partition!r}")
                entries.append((topic, partition, check_int("ledger_id", ledger), check_int("entry_id", entry),
                                [_nacked(item) for item in nacked]))
        except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
            raise SnapshotError(f"corrupted batch records: {exc}") from None
        return entries

    def _refuse_or_skip(self, path: str, exc: SnapshotError, consequence: str, keep: bool = False,
                        why: str = "fix or move the path") -> None:
        """A snapshot file that cannot be restored at start: refuse (default),
        or go on without it (a corrupted file is moved aside, ``keep``: a path
        that cannot be read is left as it is)."""
        if self.on_error == "raise":
            fix = "give this consumer a path of its own" if why == "another consumer's" else why
            raise SnapshotError(f"cannot restore {path}: {exc}. Nothing was started: {fix}, or pass "
                                f"snapshot_on_error='ignore' to start without it ({consequence})") from None
        if keep:
            log.warning("cannot restore %s (%s); starting without it: %s", path, exc, consequence)
            return
        try:
            os.replace(path, path + ".corrupt")
        except OSError as move:
            log.warning("cannot restore %s (%s) nor move it aside (%s); starting without it: %s",
                        path, exc, move, consequence)
            return
        log.warning("cannot restore %s (%s); moved to %s.corrupt and starting without it: %s",
                    path, exc, path, consequence)

    @staticmethod
    def batch_records(snapshot: bytes, core: DeliveryCore, now_ms: float) -> bytes:
        """The batch-record file for ``snapshot``. Call right after taking the
        snapshot (the same clock reading or a later one: a record's remaining
        delay is never longer than its bucket's). O(nacked batch messages)."""
        entries: dict[MessageKey, list[list[int]]] = {}
        for entry, index, release_ms, fired in core.pending_batch_nacks():
            entries.setdefault(entry, []).append([index, max(0, math.ceil(release_ms - now_ms)), int(fired)])
        doc = [[e.topic, e.partition, e.ledger_id, e.entry_id, nacked] for e, nacked in entries.items()]
        body = json.dumps({"snapshot_crc32": zlib.crc32(snapshot), "entries": doc}, separators=(",", ":")).encode()
        return b"%08x\n" % zlib.crc32(body) + body

    def save_now(self, tracker: NegativeAcksTracker, core: DeliveryCore) -> bool:
        """Save on the caller's thread, no event loop (the consumer's loop closed before it did), and let go
        of the path. Returns whether it was saved; a failure is logged and counted. O(pending)."""
        try:
            data = tracker.snapshot()
            counts = None if self.counts is None else self.counts.encode(zlib.crc32(data))
            self._write_files(data, self.batch_records(data, core, tracker.clock.now_ms()), counts)
        except Exception as exc:  # anything (disk, a bug): the consumer is closing; logged with its traceback
            self.failures += 1
            log.error("snapshot to %s after the loop closed failed: %r", self.path, exc, exc_info=True)
            return False
        finally:
            self.release()
        self.saved += 1
        return True

    async def save(self, tracker: NegativeAcksTracker, core: DeliveryCore) -> None:
        """Take a snapshot (on the loop: one consistent view) and write both
        files in a thread (atomic writes, off the loop). One write at a time,
        in order; a cancelled caller leaves its write to finish."""
        data = tracker.snapshot()
        batches = self.batch_records(data, core, tracker.clock.now_ms())
        counts = None if self.counts is None else self.counts.encode(zlib.crc32(data))
        if self._writing is not None:
            await asyncio.wait({self._writing})
        self._writing = asyncio.get_running_loop().run_in_executor(None, self._write_files, data, batches, counts)
        await asyncio.shield(self._writing)
        self.saved += 1

    async def final_save(self, tracker: NegativeAcksTracker, core: DeliveryCore) -> Optional[Exception]:
        """The save on close: a failure is logged and counted, and returned
        (the consumer raises it once everything else is closed) unless
        ``snapshot_on_error="ignore"``."""
        try:
            await self.save(tracker, core)
        except Exception as exc:  # returned: the consumer raises it once all else is closed
            self.failures += 1
            log.error("final snapshot to %s failed: %r", self.path, exc, exc_info=True)
            return exc if self.on_error == "raise" else None
        finally:
            self.release()
        return None

    def _write_files(self, data: bytes, batches: bytes, counts: Optional[bytes] = None) -> None:
        """The files, atomically each; a path that cannot be written is a
        :class:`SnapshotError` (its ``__cause__`` the ``OSError``)."""
        files = [(self.path, data), (self.path + BATCHES_SUFFIX, batches)]
        if counts is not None:
            files.append((self.path + COUNTS_SUFFIX, counts))
        for path, content in files:
            try:
                _snapshot.write_atomic(path, content)
            except OSError as exc:
                raise SnapshotError(f"cannot write snapshot {path}: {exc.strerror or exc}") from exc

    async def run_saver(self, interval_s: float, tracker: NegativeAcksTracker, core: DeliveryCore) -> None:
        """Save every ``interval_s``. A failed save (disk full, the directory
        gone) is logged and counted; consuming goes on and the next save tries."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.save(tracker, core)
            except Exception as exc:  # disk full, the directory gone, or a bug: consuming goes on (traceback logged)
                self.failures += 1
                log.warning("snapshot to %s failed (next try in %g s): %r", self.path, interval_s, exc, exc_info=True)

    async def remove(self) -> Optional[Exception]:
        """Delete both files (after unsubscribing: the nacks went with the
        subscription), once a write in flight has finished. A path that
        cannot be deleted is logged and counted, and returned as a
        :class:`SnapshotError` (raised by the consumer once everything else is
        closed) unless ``snapshot_on_error="ignore"``."""
        if self._writing is not None:
            await asyncio.wait({self._writing})
        error: Optional[Exception] = None
        self.release()
        for path in (self.path, self.path + BATCHES_SUFFIX, self.path + COUNTS_SUFFIX, self.path + OWNER_SUFFIX):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.failures += 1
                log.error("cannot remove snapshot %s after unsubscribing: %r", path, exc)
                if error is None and self.on_error == "raise":
                    error = SnapshotError(f"cannot remove snapshot {path} after unsubscribing: "
                                          f"{exc.strerror or exc}")
                    error.__cause__ = exc
        return error


def _nacked(item: Any) -> tuple[int, int, int]:
    """``[batch_index, remaining_ms(, fired)]`` from a batch-record file."""
    if not isinstance(item, list) or len(item) not in (2, 3):
        raise ValueError(f"bad nacked message {item!r}")
    fired = item[2] if len(item) == 3 else 0
    if fired not in (0, 1):
        raise ValueError(f"bad fired flag {fired!r}")
    return check_int("batch_index", item[0]), check_int("remaining_ms", item[1]), fired
