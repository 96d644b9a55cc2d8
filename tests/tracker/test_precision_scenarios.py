"""The steady-stream scenario's layout (``nacktracker/demo/steady.py``):
the built-in side keeps nacking ``builtin_overrun_ms`` after the tracked side
stopped, so its flood of redeliveries does not land on the tracked side's last
due copies. No timing assertions: the errors are the benchmark's to measure
(``bench/pulsar_precision.py``); these check the layout and the bookkeeping."""

from __future__ import annotations

import pytest

pytest.importorskip("pulsar")

from nacktracker.demo.measure import BUILTIN, TRACKED  # noqa: E402
from nacktracker.demo.steady import BUILTIN_OVERRUN_EXTRA_MS, run_steady_stream  # noqa: E402


async def test_a_negative_overrun_is_refused_before_anything_is_published():
    # no broker listens there: the check must come first
    with pytest.raises(ValueError, match="builtin_overrun_ms must be >= 0"):
        await run_steady_stream("pulsar://127.0.0.1:1", builtin_overrun_ms=-1)


@pytest.mark.broker
async def test_the_builtin_side_nacks_longer_by_default_and_every_nack_comes_back(broker_url):
    delay = 100
    r = await run_steady_stream(broker_url, delay_ms=delay, period_ms=(5, 10), stream_ms=400, settle_ms=2000)
    assert r["builtin_overrun_ms"] == delay + BUILTIN_OVERRUN_EXTRA_MS
    tracked, builtin = r[TRACKED], r[BUILTIN]
    assert tracked["missing"] == 0 and builtin["missing"] == 0
    assert tracked["unexpected"] == 0 and builtin["unexpected"] == 0
    # ~200 ms more of one nack per 5-10 ms: at least 15 more on the built-in side
    assert builtin["nacks"] >= tracked["nacks"] + 15, (tracked["nacks"], builtin["nacks"])
    # each side's "during the stream" counts against its own end
    assert builtin["due_during_stream"] > tracked["due_during_stream"]
    assert tracked["redeliveries"] == tracked["nacks"] and builtin["redeliveries"] == builtin["nacks"]


@pytest.mark.broker
async def test_overrun_0_stops_both_sides_together(broker_url):
    r = await run_steady_stream(broker_url, delay_ms=100, period_ms=(5, 10), stream_ms=300, settle_ms=2000,
                                builtin_overrun_ms=0)
    assert r["builtin_overrun_ms"] == 0
    assert r[TRACKED]["nacks"] == r[BUILTIN]["nacks"]  # one nack each per step, the same steps
    assert r[TRACKED]["missing"] == 0 and r[BUILTIN]["missing"] == 0
