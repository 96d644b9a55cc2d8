"""The README's quick start exits with 0 every time, beside busy processes, on both brokers.

Each run is a fresh interpreter (``python quickstart.py``, as a reader runs it): a crash at
interpreter exit (SIGSEGV, SIGABRT) comes after the output is printed, so only the exit
code tells. Two processes spin on the CPU meanwhile: load is what widens a race between the
interpreter's exit and the client's threads. The 20-run measurement, and the docs' programs
and examples: ``python tools/exit_codes.py --runs 20 --broker apache quickstart docs examples``.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("pulsar")

from tools.exit_codes import measure  # noqa: E402  (the checkout's root is on pytest's pythonpath)

RUNS = 10


@pytest.mark.broker
@pytest.mark.slow
def test_the_quick_start_exits_with_0_every_time_beside_busy_processes(broker_url):
    failures: list[str] = []
    counts = measure(["quickstart"], runs=RUNS, busy=2, url=broker_url,
                     on_run=lambda name, code, err: failures.append(f"exit {code}: {err}") if code else None)
    assert counts == {"README.md quick start": {0: RUNS}}, failures


@pytest.mark.broker
async def test_a_closed_client_reports_as_pulsar_asyncio_does(client):
    """Closing goes through the client's blocking close on a thread (no callback left in the client's
    threads), and still closes it, and still reports a second close as pulsar.asyncio does."""
    import pulsar.asyncio

    from nacktracker.adapters.client_close import close_leaves_no_callback

    close_leaves_no_callback()
    close_leaves_no_callback()  # idempotent
    assert pulsar.asyncio.Client.close.__wrapped__.__module__ == "pulsar.asyncio"
    await client.close()
    with pytest.raises(pulsar.asyncio.PulsarException) as caught:
        await client.close()
    assert caught.value.error() == pulsar.Result.AlreadyClosed
    with pytest.raises(pulsar.asyncio.PulsarException):  # a closed client makes nothing
        await asyncio.wait_for(client.create_producer("persistent://public/default/after-close"), 10)

