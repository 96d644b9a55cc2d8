"""LeadEstimator (nacktracker/adapters/lead.py): the learned lead, on explicit
times from a ManualClock (no timing assertions: every time is given)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nacktracker.adapters.lead import MEMORY_MS, MIN_SAMPLES, LeadEstimator
from nacktracker.clock import ManualClock

BOUNDS = (100, 1000)


def feed(est: LeadEstimator, clock: ManualClock, latencies: list[float], every_ms: float = 50) -> int:
    lead = est.lead_ms
    for latency in latencies:
        clock.advance(every_ms)
        lead = est.observe(latency, clock.now_ms())
    return lead


def test_initial_lead_until_enough_samples_then_worst_plus_a_quarter_and_20_ms():
    clock, est = ManualClock(), LeadEstimator(250, BOUNDS)
    assert feed(est, clock, [140] * (MIN_SAMPLES - 1)) == 250
    assert feed(est, clock, [160]) == 160 + 40 + 20 == est.lead_ms
    assert est.worst_ms == 160


def test_fractional_latencies_round_up():
    clock, est = ManualClock(), LeadEstimator(250, BOUNDS)
    assert feed(est, clock, [120.2] * MIN_SAMPLES) == 121 + 30 + 20


def test_a_spike_raises_the_lead_at_once_and_is_remembered_for_the_memory():
    """The bench's failure mode: waves of 20 samples; a calm stretch must not
    unlearn a spike seconds old (it did with a window of the last 256 samples)."""
    clock, est = ManualClock(), LeadEstimator(250, BOUNDS)
    feed(est, clock, [110] * 40)
    assert est.lead_ms == 110 + 27 + 20
    assert feed(est, clock, [170]) == 170 + 42 + 20  # at once
    spike_at = clock.now_ms()
    while clock.now_ms() < spike_at + MEMORY_MS - 2_000:  # a calm ~58 s, far more than 256 samples
        feed(est, clock, [110] * 20, every_ms=5)
        clock.advance(400)
    assert est.lead_ms == 170 + 42 + 20
    clock.advance(3_000)
    assert feed(est, clock, [110]) == 110 + 27 + 20  # the spike left the memory


def test_bounds():
    clock = ManualClock()
    low = LeadEstimator(250, BOUNDS)
    assert feed(low, clock, [10] * MIN_SAMPLES) == 100
    high = LeadEstimator(250, BOUNDS)
    assert feed(high, clock, [5000] * MIN_SAMPLES) == 1000


def test_memory_is_bounded_whatever_the_rate():
    clock, est = ManualClock(), LeadEstimator(250, BOUNDS)
    for _ in range(10 * 60):  # ten minutes, 100 samples a second
        feed(est, clock, [120] * 100, every_ms=10)
    assert len(est._slots) <= MEMORY_MS // 1000 + 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5_000), st.floats(0, 3_000)), min_size=MIN_SAMPLES, max_size=300))
def test_the_lead_covers_the_worst_latency_of_the_memory(samples):
    """Model: the lead is the bounded worst of the samples taken less than
    MEMORY_MS (by whole seconds) ago, plus its headroom."""
    clock, est = ManualClock(), LeadEstimator(250, BOUNDS)
    seen: list[tuple[float, float]] = []
    for gap, latency in samples:
        clock.advance(gap)
        now = clock.now_ms()
        lead = est.observe(latency, now)
        seen.append((now, latency))
        second = now // 1000
        worst = max(lat for at, lat in seen if at // 1000 > second - MEMORY_MS // 1000)
        top = int(-(-worst // 1))
        assert lead == (250 if len(seen) < MIN_SAMPLES else min(1000, max(100, top + (top >> 2) + 20)))
