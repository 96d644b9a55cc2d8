"""Pulsar scenarios measured side by side: TrackedConsumer beside the client's
built-in negative ack, on the same broker and the same messages (one topic,
one Shared subscription and one client per side).

Used by ``nacktracker demo`` and the benchmarks (``bench/pulsar_precision.py``,
``bench/consume_throughput.py``). Every scenario measures each redelivery's
error: when the application received it minus when it was due (nack time +
the delay that side was asked for), in ms on the event loop's clock; positive
is late. Each returns a plain dict with a ``"tracked"`` and a ``"builtin"``
entry.

* :func:`run_workload` (:mod:`.workload`): a worker with failures, backoff and
  a dead-letter topic;
* :func:`run_precision` (:mod:`.precision`): waves of nacks at one delay,
  spaced so the built-in timer always gets to tick (its best case);
* :func:`run_steady_stream` (:mod:`.steady`): a nack every 5-10 ms, where the
  built-in timer starves.

The two consumers sit behind one protocol (:class:`~.sides.Side`); the pieces
every scenario shares are in :mod:`.harness` (no Pulsar) and :mod:`.pair`.
Needs pulsar-client (the ``pulsar`` extra).
"""

from .harness import CLOSE_GRACE_S, ErrorSummary, Progress, summarize
from .precision import run_precision
from .sides import BUILTIN, SIDES, TRACKED, Side, SideOptions, open_side, produce
from .steady import run_steady_stream
from .workload import ALWAYS, failure_plan, run_workload

__all__ = ["run_workload", "run_precision", "run_steady_stream", "failure_plan", "produce", "summarize",
           "open_side", "Side", "SideOptions", "Progress", "ErrorSummary", "TRACKED", "BUILTIN", "SIDES", "ALWAYS",
           "CLOSE_GRACE_S"]
