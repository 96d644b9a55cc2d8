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



@pytest.mark.broker
async def test_closing_only_the_client_closes_its_tracked_consumers_first(client, broker_url, topic, tmp_path,
                                                                          caplog):
    """A program that closes its client and not its consumer (pulsar-client's examples do): the client's
    close closes the TrackedConsumer first, as the client closes its own consumers: its pending nack is
    saved to its snapshot, nothing of it goes on over the closed client, and nothing is logged (its pump
    logged its receive failing, with a traceback)."""
    import logging

    import pulsar
    import pulsar.asyncio

    import nacktracker
    from conftest import quiet_logger

    name = topic("client-close-only")
    snapshot = tmp_path / "pending.snap"
    consumer = await nacktracker.subscribe(client, name, "s", initial_position=pulsar.InitialPosition.Earliest,
                                           snapshot_path=str(snapshot), snapshot_interval_s=None)
    other = await nacktracker.subscribe(client, topic("client-close-only-other"), "s")
    producer = await client.create_producer(name)
    await producer.send(b"m")
    await other.close()  # closed by the program first: the client's close leaves it as it is
    with caplog.at_level(logging.WARNING, logger="nacktracker"):
        msg = await consumer.receive(timeout_ms=10_000)
        await consumer.negative_acknowledge(msg, delay_ms=60_000)
        await client.close()
        await asyncio.sleep(0.1)  # a pump left running over the closed client would fail meanwhile
    assert consumer.closed and other.closed
    assert not [r for r in caplog.records if r.name.startswith("nacktracker")], caplog.text
    with pytest.raises(nacktracker.ConsumerClosed):
        await consumer.receive(timeout_ms=100)
    again_client = pulsar.asyncio.Client(broker_url, logger=quiet_logger(), operation_timeout_seconds=10)
    again = await nacktracker.subscribe(again_client, name, "s", snapshot_path=str(snapshot))
    assert again.stats()["restored"] == 1  # the pending nack, saved by the consumer's close
    await again.close()
    await again_client.close()
