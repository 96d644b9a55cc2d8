"""Deduplicator: exact membership in two generations, against a model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nacktracker import Deduplicator
from nacktracker.dedup import _ENTRY_LIMIT, _SLOT_LIMIT


def test_first_sight_then_seen():
    d = Deduplicator()
    assert d.seen_or_add("t", 1, 2) is False
    assert d.seen_or_add("t", 1, 2) is True
    assert d.seen_or_add("t", 1, 2, batch_index=0) is False  # a batch message is not its entry
    assert d.seen_or_add("t", 1, 2, 0) is True
    assert d.seen_or_add("t", 2, 2) is False  # another ledger
    assert d.seen_or_add("u", 1, 2) is False  # another key
    assert d.seen_or_add(0, 1, 2) is False  # a partition is another key, and 0 is not "0"
    assert d.seen_or_add("0", 1, 2) is False
    assert len(d) == 6 and ("t", 1, 2) in d and ("t", 1, 2, 0) in d and ("t", 1, 3) not in d


def test_ids_that_would_collide_in_a_packed_code_are_kept_apart():
    """(entry 5, batch 0) packs to 2^40 + 5; the entry 2^40 + 5 itself goes to the exact fallback."""
    d = Deduplicator()
    assert d.seen_or_add("t", 1, 5, 0) is False
    assert d.seen_or_add("t", 1, _ENTRY_LIMIT + 5) is False
    assert d.seen_or_add("t", 1, _ENTRY_LIMIT + 5, -1) is True
    big_batch = _SLOT_LIMIT - 1  # batch_index + 1 == 2^24: falls back
    assert d.seen_or_add("t", 1, 5, big_batch) is False
    assert d.seen_or_add("t", 1, 5, big_batch - 1) is False  # the last packed slot
    assert d.seen_or_add("t", 1, 5, big_batch) is True
    assert d.seen_or_add("t", 1, 2**63 - 1, 2**63 - 1) is False
    assert d.seen_or_add("t", 2**63 - 1, 2**63 - 1, 2**63 - 1) is False
    assert d.stats()["exact_fallback"] == 4
    assert ("t", 1, _ENTRY_LIMIT + 5) in d and ("t", 1, 5, 0) in d and ("t", 1, 5) not in d


def test_two_generations_rotate_at_capacity():
    d = Deduplicator(capacity=3)
    for e in range(3):
        assert d.seen_or_add("t", 1, e) is False
    assert d.stats()["rotations"] == 0
    assert d.seen_or_add("t", 1, 3) is False  # active full: it becomes old, 3 starts a new one
    assert d.stats()["rotations"] == 1
    assert all(d.seen_or_add("t", 1, e) for e in range(4))  # all still remembered
    for e in range(4, 6):
        d.seen_or_add("t", 1, e)
    assert len(d) == 6
    d.seen_or_add("t", 1, 6)  # second rotation: 0..2 are forgotten
    assert [("t", 1, e) in d for e in range(7)] == [False] * 3 + [True] * 4
    assert d.seen_or_add("t", 1, 0) is False  # forgotten: reported new (at-least-once, never a drop)


def test_generations_are_per_key():
    d = Deduplicator(capacity=2)
    d.seen_or_add("a", 1, 1)
    for e in range(10):
        d.seen_or_add("b", 1, e)
    assert ("a", 1, 1) in d  # b's traffic does not push a's ids out (seed 002's shared counter did)
    assert d.stats()["keys"] == 2


def test_discard_and_clear():
    d = Deduplicator(capacity=2)
    for e in range(3):
        d.seen_or_add("t", 1, e)
    d.seen_or_add("t", 1, _ENTRY_LIMIT)
    assert d.discard("t", 1, 0) is True  # from the old generation
    assert d.discard("t", 1, 2) is True  # from the active one
    assert d.discard("t", 1, _ENTRY_LIMIT) is True  # from the fallback
    assert d.discard("t", 1, 0) is False and d.discard("nope", 1, 0) is False
    assert len(d) == 1 and d.seen_or_add("t", 1, 0) is False
    before = d.nbytes()
    d.clear("t")
    assert len(d) == 0 and d.nbytes() < before
    d.seen_or_add(3, 1, 1)
    d.clear()
    assert len(d) == 0 and d.stats()["keys"] == 0


def test_nbytes_is_small_for_dense_ids():
    d = Deduplicator(capacity=200_000)
    for e in range(100_000):
        d.seen_or_add("t", 1, e)
    assert d.nbytes() / len(d) < 0.5  # a bitmap container: 8 KiB per 65,536 ids


@pytest.mark.parametrize("args", [
    (None, 1, 1), (1.0, 1, 1), (True, 1, 1), (b"t", 1, 1), (("t",), 1, 1),
    ("t", 1.0, 1), ("t", True, 1), ("t", "1", 1), ("t", None, 1), ("t", 1, 1.5), ("t", 1, 1, 0.0),
    ("t", 1, 1, False), ("t", 1, 1, "0"),
])
def test_bad_types_raise_type_error_and_change_nothing(args):
    d = Deduplicator()
    d.seen_or_add("t", 1, 1)
    with pytest.raises(TypeError):
        d.seen_or_add(*args)
    with pytest.raises(TypeError):
        d.discard(*args)
    assert len(d) == 1 and args not in d


@pytest.mark.parametrize("args", [
    (-2, 1, 1), ("t", -1, 1), ("t", 1, -1), ("t", 2**63, 1), ("t", 1, 2**63), ("t", 1, 1, -2), ("t", 1, 1, 2**63),
])
def test_out_of_range_raises_value_error(args):
    d = Deduplicator()
    with pytest.raises(ValueError):
        d.seen_or_add(*args)
    assert len(d) == 0


@pytest.mark.parametrize("capacity", [0, -1, 2**63])
def test_bad_capacity(capacity):
    with pytest.raises(ValueError):
        Deduplicator(capacity)
    for bad in (1.5, True, "10", None):
        with pytest.raises(TypeError):
            Deduplicator(bad)


def test_contains_never_raises():
    d = Deduplicator()
    for item in (None, 5, "t", ("t",), ("t", 1), ("t", 1, 2, 3, 4), ("t", -1, 1), (None, 1, 1), [("t", 1, 1)]):
        assert item not in d


# -- against a model -------------------------------------------------------------------------

class Model:
    """The specification: per key, two sets in first-seen order."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.gens = {}

    def seen_or_add(self, key, ledger, entry, batch=-1):
        active, old = self.gens.setdefault(key, [set(), set()])
        ident = (ledger, entry, batch)
        if ident in active or ident in old:
            return True
        if len(active) >= self.capacity:
            self.gens[key] = [set(), active]
            active = self.gens[key][0]
        active.add(ident)
        return False

    def discard(self, key, ledger, entry, batch=-1):
        hit = False
        for gen in self.gens.get(key, []):
            if (ledger, entry, batch) in gen:
                gen.remove((ledger, entry, batch))
                hit = True
        return hit

    def __len__(self):
        return sum(len(a) + len(o) for a, o in self.gens.values())


entries = st.one_of(st.integers(0, 20), st.integers(_ENTRY_LIMIT - 3, _ENTRY_LIMIT + 3),
                    st.just(2**63 - 1))
batches = st.one_of(st.just(-1), st.integers(0, 3), st.integers(_SLOT_LIMIT - 3, _SLOT_LIMIT))
ops = st.lists(st.tuples(st.sampled_from(["add", "add", "add", "discard", "contains"]),
                         st.sampled_from(["a", "b", 0, 7]), st.integers(0, 3), entries, batches),
               max_size=150)


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(1, 6), ops=ops)
def test_matches_the_model_exactly(capacity, ops):
    d, m = Deduplicator(capacity), Model(capacity)
    for op, key, ledger, entry, batch in ops:
        if op == "add":
            assert d.seen_or_add(key, ledger, entry, batch) == m.seen_or_add(key, ledger, entry, batch)
        elif op == "discard":
            assert d.discard(key, ledger, entry, batch) == m.discard(key, ledger, entry, batch)
        else:
            expect = any((ledger, entry, batch) in g for g in m.gens.get(key, []))
            assert ((key, ledger, entry, batch) in d) == expect
        assert len(d) == len(m)
