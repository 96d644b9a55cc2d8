"""FixedBackoff and MultiplierBackoff on their own: values, caps, boundaries, and
errors that name the bad argument (written for the mutants `make mutate` found
surviving in backoff.py: see mutation/REPORT.md)."""

from __future__ import annotations

import pytest

from nacktracker import FixedBackoff, MultiplierBackoff


def test_fixed_backoff_is_the_same_for_every_count():
    b = FixedBackoff(250)
    assert [b(n) for n in (0, 1, 7, 10**9)] == [250] * 4
    assert FixedBackoff(0.2)(3) == 1  # float delays round up to whole ms
    assert repr(b) == "FixedBackoff(250)"


def test_multiplier_backoff_doubles_then_stays_at_its_cap():
    b = MultiplierBackoff(100, 1000)
    assert [b(n) for n in range(7)] == [100, 200, 400, 800, 1000, 1000, 1000]
    assert b(10**9) == 1000  # no float overflow for huge counts
    assert [MultiplierBackoff(100, 1000, multiplier=1.5)(n) for n in range(8)] == \
        [100, 150, 225, 338, 507, 760, 1000, 1000]  # ceil(100 * 1.5^n)
    assert [MultiplierBackoff(100, 1000, multiplier=1)(n) for n in (0, 5, 10**6)] == [100] * 3


def test_multiplier_backoff_edges():
    assert [MultiplierBackoff(0, 1000)(n) for n in (0, 3, 10**6)] == [0, 0, 0]
    assert [MultiplierBackoff(1, 100)(n) for n in range(9)] == [1, 2, 4, 8, 16, 32, 64, 100, 100]
    assert [MultiplierBackoff(500, 500)(n) for n in (0, 1, 2)] == [500] * 3  # max == min is allowed
    assert MultiplierBackoff(100, 800)(3) == 800  # exactly at the cap
    assert repr(MultiplierBackoff(1, 2, 3)) == "MultiplierBackoff(1, 2, multiplier=3.0)"


@pytest.mark.parametrize("make,error,words", [
    (lambda: FixedBackoff(-1), ValueError, "delay_ms must be >= 0"),
    (lambda: FixedBackoff(5)(-1), ValueError, "redelivery_count must be >= 0"),
    (lambda: FixedBackoff(5)(1.5), TypeError, "redelivery_count must be an int"),
    (lambda: MultiplierBackoff(-1, 10), ValueError, "min_delay_ms must be >= 0"),
    (lambda: MultiplierBackoff(1, -10), ValueError, "max_delay_ms must be >= 0"),
    (lambda: MultiplierBackoff(10, 5), ValueError, "max_delay_ms must be >= min_delay_ms"),
    (lambda: MultiplierBackoff(1, 10, multiplier=True), TypeError, "multiplier must be a number, not bool"),
    (lambda: MultiplierBackoff(1, 10, multiplier="2"), TypeError, "multiplier must be a number, not str"),
    (lambda: MultiplierBackoff(1, 10, multiplier=0.5), ValueError, "multiplier must be a finite number >= 1, got 0.5"),
    (lambda: MultiplierBackoff(1, 10, multiplier=float("inf")), ValueError, "multiplier must be a finite number >= 1, got inf"),
    (lambda: MultiplierBackoff(1, 10)(-1), ValueError, "redelivery_count must be >= 0"),
    (lambda: MultiplierBackoff(1, 10)(None), TypeError, "redelivery_count must be an int"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_arguments_are_named_in_the_error(make, error, words):
    with pytest.raises(error) as info:
        make()
    assert str(info.value).startswith(words), str(info.value)
