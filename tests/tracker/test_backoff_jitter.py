"""MultiplierBackoff's jitter: bounds, spread, and the same sequence for the same seed."""

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nacktracker import MultiplierBackoff


def test_same_seed_same_sequence_and_different_seed_differs():
    counts = [n % 8 for n in range(200)]
    a = MultiplierBackoff(100, 10_000, jitter=0.3, rng=random.Random(42))
    b = MultiplierBackoff(100, 10_000, jitter=0.3, rng=random.Random(42))
    c = MultiplierBackoff(100, 10_000, jitter=0.3, rng=random.Random(43))
    seq_a, seq_b, seq_c = ([x(n) for n in counts] for x in (a, b, c))
    assert seq_a == seq_b
    assert seq_a != seq_c


def test_spread_within_bounds_and_covers_them():
    backoff = MultiplierBackoff(1000, 60_000, jitter=0.5, rng=random.Random(1))
    plain = MultiplierBackoff(1000, 60_000)
    for n in range(8):
        d = plain(n)
        draws = [backoff(n) for _ in range(2000)]
        assert min(draws) >= math.ceil(d * 0.5) and max(draws) <= d
        # uniform over [d/2, d]: the draws reach both tenths at the ends and centre near 0.75 d
        assert min(draws) <= d * 0.55 and max(draws) >= d * 0.95
        assert abs(sum(draws) / len(draws) - 0.75 * d) < 0.03 * d


@given(st.integers(0, 5_000), st.integers(0, 100_000), st.floats(1, 10), st.floats(0, 1), st.integers(0, 200),
       st.integers(0, 2**32))
def test_never_above_the_cap_nor_below_the_jittered_floor(lo, span, mult, jitter, n, seed):
    b = MultiplierBackoff(lo, lo + span, multiplier=mult, jitter=jitter, rng=random.Random(seed))
    d = MultiplierBackoff(lo, lo + span, multiplier=mult)(n)
    got = b(n)
    assert isinstance(got, int)
    assert math.ceil(d * (1 - jitter)) <= got <= d <= lo + span
    assert got >= 0


def test_zero_jitter_draws_nothing_and_is_exact():
    rng = random.Random(5)
    state = rng.getstate()
    b = MultiplierBackoff(100, 1000, jitter=0.0, rng=rng)
    assert [b(n) for n in range(6)] == [100, 200, 400, 800, 1000, 1000]
    assert rng.getstate() == state


def test_full_jitter_spans_zero_to_d():
    b = MultiplierBackoff(10, 10, jitter=1.0, rng=random.Random(3))
    assert set(b(0) for _ in range(2000)) == set(range(0, 11))


@pytest.mark.parametrize("jitter, exc", [(-0.1, ValueError), (1.5, ValueError), (float("nan"), ValueError),
                                         (True, TypeError), ("0.2", TypeError)])
def test_bad_jitter_is_refused(jitter, exc):
    with pytest.raises(exc):
        MultiplierBackoff(10, 100, jitter=jitter)


def test_bad_rng_is_refused():
    with pytest.raises(TypeError):
        MultiplierBackoff(10, 100, jitter=0.1, rng=42)


@pytest.mark.parametrize("jitter, exc, message", [
    (1.5, ValueError, "jitter must be in [0, 1], got 1.5"),
    ("0.2", TypeError, "jitter must be a number in [0, 1], not str"),
])
def test_bad_jitter_is_refused_naming_it(jitter, exc, message):
    with pytest.raises(exc) as refused:
        MultiplierBackoff(10, 100, jitter=jitter)
    assert str(refused.value) == message


def test_bad_rng_is_refused_naming_its_type():
    with pytest.raises(TypeError) as refused:
        MultiplierBackoff(10, 100, jitter=0.1, rng=42)
    assert str(refused.value) == "rng must be a random.Random, not int"


def test_jitter_without_an_rng_draws_from_a_private_one_and_shows_in_repr():
    b = MultiplierBackoff(1000, 8000, jitter=0.5)
    assert all(2000 <= b(2) <= 4000 for _ in range(20))  # d = 4000 (1000 x 2^2): drawn from [2000, 4000]
    assert repr(b) == "MultiplierBackoff(1000, 8000, multiplier=2.0, jitter=0.5)"
    assert repr(MultiplierBackoff(1000, 8000)) == "MultiplierBackoff(1000, 8000, multiplier=2.0)"
