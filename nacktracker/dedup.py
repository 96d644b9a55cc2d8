"""Deduplicator: remembers recently seen message ids in two Roaring generations.

Seed 002's design (two bitmaps per key, like a copying collector's survivor
spaces): new ids go into the *active* generation; when it holds ``capacity``
ids it becomes the *old* one, the previous old one is dropped, and a fresh
active one starts. A lookup checks both. So each key remembers at least its
last ``capacity`` first-seen ids and at most ``2 * capacity``; memory is
bounded whatever the traffic, and forgetting happens in one O(1) step.

Exactness (a wrong "seen" would drop a message, so there are none):

* a message id is ``(ledger_id, entry_id, batch_index)``; every ``key`` (a
  topic or a partition) has its own generations and every ledger its own
  bitmap, so ledger and key never share bits;
* inside a ledger's bitmap the id is the 64-bit code ``(batch_index + 1) << 40
  | entry_id``: injective for ``entry_id < 2^40`` and ``batch_index < 2^24 - 1``
  (a non-batched message, ``batch_index=-1``, is its plain entry id, so
  consecutive entries stay dense; each batch slot forms its own dense run);
* ids outside that range (legal in Pulsar, not seen in practice: ledgers
  roll over at ~50k entries and batches hold ~1000 messages) go to an exact
  per-generation ``set`` of tuples instead: slower and ~100 B each, but still
  exact. ``stats()["exact_fallback"]`` counts them.

Roaring membership is exact, so ``seen_or_add`` answers True only for an id
added (and not discarded) within the last one or two generations. The only
error is the intended one: an id older than that is forgotten and reported
as new (processed twice: at-least-once, as without a deduplicator).

A hit does not refresh an id: the window is in first-seen order (seed 002).

>>> d = Deduplicator(capacity=2)
>>> d.seen_or_add("t", 7, 1), d.seen_or_add("t", 7, 1), d.seen_or_add("t", 7, 1, batch_index=0)
(False, True, False)
>>> d.seen_or_add("t", 7, 2), d.seen_or_add("t", 7, 3)  # the active one was full: rotate
(False, False)
>>> ("t", 7, 1) in d, len(d)  # still in the old generation
(True, 4)
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Union

from pyroaring import BitMap64

from ._checks import MAX_ID as _MAX_ID
from ._checks import check_int
from .index.layout import roaring_bytes

__all__ = ["Deduplicator"]

_ENTRY_BITS = 40
_ENTRY_LIMIT = 1 << _ENTRY_BITS
_SLOT_LIMIT = 1 << (64 - _ENTRY_BITS)  # batch_index + 1 must stay below this

Key = Union[str, int]


class _Generation:
    """One generation: ``ledger -> BitMap64`` of codes, plus the exact fallback."""

    __slots__ = ("bitmaps", "exact", "count")

    def __init__(self) -> None:
        self.bitmaps: dict[int, BitMap64] = {}
        self.exact: Optional[set[tuple[int, int, int]]] = None  # created on first use
        self.count = 0

    def has(self, ledger: int, code: Optional[int], triple: tuple[int, int, int]) -> bool:
        if code is None:
            return self.exact is not None and triple in self.exact
        bm = self.bitmaps.get(ledger)
        return bm is not None and code in bm

    def remove(self, ledger: int, code: Optional[int], triple: tuple[int, int, int]) -> bool:
        if code is None:
            if self.exact is None or triple not in self.exact:
                return False
            self.exact.remove(triple)
        else:
            bm = self.bitmaps.get(ledger)
            if bm is None or code not in bm:
                return False
            bm.discard(code)
            if not bm:
                del self.bitmaps[ledger]
        self.count -= 1
        return True

    def compact(self) -> None:
        """Run-optimise and shrink: this generation receives no more adds."""
        for bm in self.bitmaps.values():
            bm.run_optimize()
            bm.shrink_to_fit()

    def nbytes(self) -> int:
        total = sys.getsizeof(self.bitmaps)
        total += sum(sys.getsizeof(ledger) + roaring_bytes(bm) for ledger, bm in self.bitmaps.items())
        if self.exact is not None:
            total += sys.getsizeof(self.exact)
            total += sum(sys.getsizeof(t) + sum(map(sys.getsizeof, t)) for t in self.exact)
        return total


def _check_key(key: object) -> Key:
    if isinstance(key, str):
        return key
    if type(key) is int or (isinstance(key, int) and not isinstance(key, bool)):
        if key < -1:
            raise ValueError(f"key must be a topic (str) or a partition (int >= -1), got {key}")
        return int(key)
    raise TypeError(f"key must be a topic (str) or a partition (int), not {type(key).__name__}")


def _check_batch(batch_index: object) -> int:
    if type(batch_index) is int and batch_index == -1:
        return -1
    return check_int("batch_index", batch_index)


def _code(entry_id: int, batch_index: int) -> Optional[int]:
    """The 64-bit code of an id, or None when it needs the exact fallback."""
    slot = batch_index + 1
    if entry_id < _ENTRY_LIMIT and slot < _SLOT_LIMIT:
        return slot << _ENTRY_BITS | entry_id
    return None


class Deduplicator:
    """Exact recent-id memory per key, two Roaring generations each.

    ``capacity``: ids per generation per key (each key remembers between
    ``capacity`` and ``2 * capacity`` of its most recent first-seen ids).
    Memory per id: see ``bench/dedup.py`` (well under a byte for dense
    entry ids, ~2 B for sparse ones, ~100 B for fallback ids).

    Not thread-safe: use it from one thread (the event loop).
    """

    __slots__ = ("capacity", "_pairs", "_rotations", "_fallback")

    def __init__(self, capacity: int = 1_000_000) -> None:
        capacity = check_int("capacity", capacity)
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity: int = capacity
        self._pairs: dict[Key, list[Any]] = {}  # key -> [active _Generation, old _Generation | None]
        self._rotations = 0
        self._fallback = 0

    def _args(self, key: object, ledger_id: object, entry_id: object,
              batch_index: object) -> tuple[Key, int, Optional[int], tuple[int, int, int]]:
        checked = _check_key(key)
        ledger = check_int("ledger_id", ledger_id)
        entry = check_int("entry_id", entry_id)
        batch = _check_batch(batch_index)
        return checked, ledger, _code(entry, batch), (ledger, entry, batch)

    def seen_or_add(self, key: Key, ledger_id: int, entry_id: int, batch_index: int = -1) -> bool:
        """True if this id was already remembered for ``key``; else remember it
        and return False. Rotates the key's generations when the active one
        is full (O(bitmaps of the retiring generation) for its compaction).

        Runtime complexity: O(1) (two dict lookups and two bitmap probes).
        """
        # fast path: plain ints that pack (the common case) skip the checks' function calls
        if (type(ledger_id) is int and type(entry_id) is int and type(batch_index) is int
                and 0 <= ledger_id <= _MAX_ID and 0 <= entry_id < _ENTRY_LIMIT and -1 <= batch_index < _SLOT_LIMIT - 1
                and (type(key) is str or (type(key) is int and key >= -1))):
            pair = self._pairs.get(key)
            if pair is not None:
                code = (batch_index + 1) << _ENTRY_BITS | entry_id
                active, old = pair
                bm = active.bitmaps.get(ledger_id)
                if bm is not None and code in bm:
                    return True
                if old is not None:
                    obm = old.bitmaps.get(ledger_id)
                    if obm is not None and code in obm:
                        return True
                if bm is not None and active.count < self.capacity:
                    bm.add(code)
                    active.count += 1
                    return False
        return self._seen_or_add(key, ledger_id, entry_id, batch_index)

    def _seen_or_add(self, key: object, ledger_id: object, entry_id: object, batch_index: object) -> bool:
        checked, ledger, code, triple = self._args(key, ledger_id, entry_id, batch_index)
        pair = self._pairs.get(checked)
        if pair is None:
            pair = self._pairs[checked] = [_Generation(), None]
        active, old = pair
        if active.has(ledger, code, triple) or (old is not None and old.has(ledger, code, triple)):
            return True
        if active.count >= self.capacity:
            active.compact()
            pair[1], pair[0] = active, _Generation()
            active = pair[0]
            self._rotations += 1
        if code is None:
            if active.exact is None:
                active.exact = set()
            active.exact.add(triple)
            self._fallback += 1
        else:
            bm = active.bitmaps.get(ledger)
            if bm is None:
                bm = active.bitmaps[ledger] = BitMap64()
            bm.add(code)
        active.count += 1
        return False

    def discard(self, key: Key, ledger_id: int, entry_id: int, batch_index: int = -1) -> bool:
        """Forget one id (e.g. its processing failed and it must pass again).
        Returns whether it was remembered. Runtime complexity: O(1)."""
        key, ledger, code, triple = self._args(key, ledger_id, entry_id, batch_index)
        pair = self._pairs.get(key)
        if pair is None:
            return False
        hit = pair[0].remove(ledger, code, triple)
        if pair[1] is not None:
            hit = pair[1].remove(ledger, code, triple) or hit
        return bool(hit)

    def clear(self, key: Optional[Key] = None) -> None:
        """Forget everything of ``key`` (a revoked partition), or of all keys."""
        if key is None:
            self._pairs.clear()
        else:
            self._pairs.pop(_check_key(key), None)

    def __contains__(self, item: object) -> bool:
        """``(key, ledger_id, entry_id[, batch_index]) in dedup``, without adding.
        Malformed items are simply not contained. Runtime complexity: O(1)."""
        if type(item) is tuple and len(item) == 4:
            # fast path (a consumer asks for every copy it receives): plain ints that pack
            key, ledger_id, entry_id, batch_index = item
            if (type(ledger_id) is int and type(entry_id) is int and type(batch_index) is int
                    and 0 <= ledger_id <= _MAX_ID and 0 <= entry_id < _ENTRY_LIMIT
                    and -1 <= batch_index < _SLOT_LIMIT - 1 and type(key) is str):
                pair = self._pairs.get(key)
                if pair is None:
                    return False
                packed = (batch_index + 1) << _ENTRY_BITS | entry_id
                for generation in pair:
                    if generation is not None:
                        bm = generation.bitmaps.get(ledger_id)
                        if bm is not None and packed in bm:
                            return True
                return False
        if not isinstance(item, tuple) or len(item) not in (3, 4):
            return False
        try:
            key, ledger, code, triple = self._args(item[0], item[1], item[2], item[3] if len(item) == 4 else -1)
        except (TypeError, ValueError):
            return False
        pair = self._pairs.get(key)
        return pair is not None and any(g is not None and g.has(ledger, code, triple) for g in pair)

    def __len__(self) -> int:
        """Ids remembered over all keys and both generations. Runtime: O(keys)."""
        return sum(a.count + (o.count if o is not None else 0) for a, o in self._pairs.values())

    def nbytes(self) -> int:
        """Bytes held: dicts, ledger ids, bitmap objects and CRoaring's C heap
        (as :meth:`TimeBucketIndex.nbytes`), fallback sets and their tuples.
        Runtime complexity: O(bitmaps + fallback ids)."""
        total = sys.getsizeof(self._pairs)
        for key, pair in self._pairs.items():
            total += sys.getsizeof(key) + sys.getsizeof(pair)
            total += sum(g.nbytes() for g in pair if g is not None)
        return total

    def stats(self) -> dict[str, int]:
        """``keys``, ``remembered``, ``rotations``, ``exact_fallback`` (ids ever
        stored in the fallback sets)."""
        return {"keys": len(self._pairs), "remembered": len(self), "rotations": self._rotations,
                "exact_fallback": self._fallback}

    def __repr__(self) -> str:
        return f"Deduplicator(capacity={self.capacity}, keys={len(self._pairs)}, remembered={len(self)})"
