"""Delivery counts the consumer keeps itself, so ``max_redeliveries`` holds
when the broker's count does not.

The broker counts redeliveries in memory: a broker restart or a topic unload
sets every count back to 0, so a poison message that is nacked forever may
never reach ``max_redeliveries``. The consumer counts too, per entry (Pulsar
redelivers entries, and counts per entry), from the moment it first asks for
a redelivery until the message is acknowledged or dead-lettered; the count a
decision uses is the larger of the two (for a message alone in its entry: the
consumer keeps the broker's count for a batch entry of several, see
``FailureHandling._own_count``). Snapshots carry these counts
(``<snapshot_path>.counts``), so a consumer restarted on its snapshot keeps
them too.

Pure (no pulsar, no clock, no I/O). Cost: one dict item per message that was
redelivered at least once and is not settled yet (never for a message
delivered once and acknowledged): ``python -m bench.retry_precision --memory``
measures the bytes per message.
"""

from __future__ import annotations

import json
import sys
import zlib
from typing import Iterable, Iterator, Optional

from .._checks import check_int
from ..keys import MessageKey

__all__ = ["DeliveryCounts", "COUNTS_SUFFIX"]

#: Suffix of the file beside ``snapshot_path`` that holds the delivery counts.
COUNTS_SUFFIX = ".counts"


class DeliveryCounts:
    """Redeliveries asked for, per entry (``MessageKey`` with ``batch_index -1``)."""

    __slots__ = ("_n",)

    def __init__(self) -> None:
        self._n: dict[MessageKey, int] = {}

    def count(self, entry: MessageKey, broker_count: int) -> int:
        """The redelivery count to decide with: the broker's or ours, the larger. O(1)."""
        own = self._n.get(entry) if self._n else None
        return broker_count if own is None or own < broker_count else own

    def at_least(self, entry: MessageKey, count: int) -> None:
        """A redelivery of ``entry`` is being asked for while it has been
        redelivered ``count`` times: remember that much (nothing for 0). O(1)."""
        if count and count > self._n.get(entry, 0):
            self._n[entry] = count

    def redelivered(self, entries: Iterable[MessageKey]) -> None:
        """Each entry's redelivery was asked for (its bucket fired). O(k)."""
        n = self._n
        for entry in entries:
            n[entry] = n.get(entry, 0) + 1

    def has(self, entry: MessageKey) -> bool:
        """Whether the consumer counts ``entry``. O(1)."""
        return bool(self._n) and entry in self._n

    def forget(self, entry: MessageKey) -> None:
        """The entry is settled (acknowledged, dead-lettered). O(1)."""
        if self._n:
            self._n.pop(entry, None)

    def nbytes(self) -> int:
        """Bytes held: the table, and per entry its key and count (each an entry key of its own,
        as :meth:`redelivered` stores the tracker's). O(1)."""
        if not self._n:
            return sys.getsizeof(self._n)
        entry, count = next(iter(self._n.items()))
        return sys.getsizeof(self._n) + len(self._n) * (sys.getsizeof(entry) + sys.getsizeof(count))

    def __len__(self) -> int:
        return len(self._n)

    def __iter__(self) -> Iterator[tuple[MessageKey, int]]:
        return iter(self._n.items())

    # -- snapshots ---------------------------------------------------------------------

    def encode(self, snapshot_crc: int) -> bytes:
        """The counts file: a line with the CRC-32 of the rest (8 hex digits),
        then JSON ``{"snapshot_crc32": int, "counts": [[topic, partition, ledger,
        entry, count], ...]}``. O(n)."""
        doc = [[e.topic, e.partition, e.ledger_id, e.entry_id, c] for e, c in self._n.items()]
        body = json.dumps({"snapshot_crc32": snapshot_crc, "counts": doc}, separators=(",", ":")).encode()
        return b"%08x\n" % zlib.crc32(body) + body

    def restore(self, raw: bytes, snapshot_crc: Optional[int]) -> int:
        """Load a counts file written by :meth:`encode` (counts already held
        keep the larger value). ``snapshot_crc``: the snapshot it must go with,
        or ``None`` to take it whatever snapshot it was written with (counts
        never make a message surface early: a stale file only errs towards
        dead-lettering a message as early as the broker's own count would).
        ``ValueError`` for a corrupted file. Returns how many were read. O(n)."""
        head, _, body = raw.partition(b"\n")
        try:
            if len(head) != 8 or int(head, 16) != zlib.crc32(body):
                raise ValueError("checksum mismatch")
            doc = json.loads(body)
            if snapshot_crc is not None and doc["snapshot_crc32"] != snapshot_crc:
                return 0
            read = []
            for topic, partition, ledger, entry, count in doc["counts"]:
                if not (topic is None or isinstance(topic, str)) or type(partition) is not int or partition < -1:
                    raise ValueError(f"bad topic {topic!r} or partition {partition!r}")
                read.append((MessageKey(check_int("ledger_id", ledger), check_int("entry_id", entry), partition, -1,
                                        topic), check_int("count", count)))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"corrupted delivery counts: {exc}") from None
        for entry, count in read:
            self.at_least(entry, count)
        return len(read)
