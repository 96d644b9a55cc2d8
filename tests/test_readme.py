"""The README's Python code blocks run, verbatim, against the session's broker.

The blocks are written for a reader's asyncio session (top-level ``await``):
each runs as the body of one coroutine, in one shared namespace, in README
order. The test supplies only what a reader's program would: messages on the
topic, a ``handle`` function, and a fresh topic name in place of "orders" (so
no other test's messages are seen)."""

from __future__ import annotations

import asyncio
import re
import textwrap
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pulsar")
pytest.importorskip("opentelemetry.sdk.metrics")

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


class AllHandled(BaseException):
    """Ends the README's endless ``async for`` (a BaseException: its ``except Exception`` must not nack it)."""


def as_coroutine(code: str, name: str) -> str:
    # the block's names stay visible to the next block (and the test), however it ended
    return (f"async def {name}():\n    try:\n" + textwrap.indent(code, "        ")
            + "\n        pass\n    finally:\n        globals().update(locals())\n")


async def run_block(code: str, namespace: dict, timeout: float = 30.0) -> None:
    exec(compile(as_coroutine(code, "_block"), "README.md", "exec"), namespace)
    await asyncio.wait_for(namespace["_block"](), timeout)


def test_the_readme_has_the_blocks_this_test_knows():
    assert len(BLOCKS) == 3
    assert "nacktracker.subscribe(" in BLOCKS[0] and "PulsarAdapter(raw)" in BLOCKS[1]
    assert "instrument_consumer(consumer)" in BLOCKS[2]


@pytest.mark.broker
async def test_readme_code_blocks_run(broker_url, monkeypatch):
    import pulsar
    import pulsar.asyncio

    import nacktracker

    topic = f"persistent://public/default/readme-{uuid.uuid4().hex[:8]}"
    blocks = [b.replace('"pulsar://127.0.0.1:6650"', repr(broker_url)).replace('"orders"', repr(topic))
              for b in BLOCKS]
    setup = pulsar.asyncio.Client(broker_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    real_subscribe = nacktracker.subscribe

    async def subscribe_then_publish(*args, **kwargs):
        # the README subscribes from the latest message, as a live consumer does: publish once subscribed
        consumer = await real_subscribe(*args, **kwargs)
        producer = await setup.create_producer(topic, batching_enabled=False)
        for i in range(3):
            await producer.send(b"job-%d" % i)
        await producer.close()
        return consumer

    monkeypatch.setattr(nacktracker, "subscribe", subscribe_then_publish)

    seen: list[tuple[bytes, int]] = []

    async def handle(msg) -> None:
        seen.append((msg.data(), msg.redelivery_count()))
        if msg.data() == b"job-1" and msg.redelivery_count() == 0:
            raise ValueError("fails once: nacked, back after the backoff's first step (1 s)")
        if {data for data, count in seen if (data, count) != (b"job-1", 0)} == {b"job-0", b"job-1", b"job-2"}:
            raise AllHandled  # each one handled successfully

    namespace: dict = {"handle": handle, "__name__": "readme"}
    try:
        # 1. subscribe, consume, nack one message, get it back
        with pytest.raises(AllHandled):
            await run_block(blocks[0], namespace)
        assert (b"job-1", 1) in seen, seen  # the nacked one came back, redelivery_count 1
        consumer = namespace["consumer"]
        assert consumer.closed and consumer.stats()["nacks"] == 1
        # 2. the layers underneath (same client, a second subscription)
        await run_block(blocks[1], namespace)
        tracker, idx = namespace["tracker"], namespace["idx"]
        assert tracker.closed and tracker.stats()["nacks"] == 1 and tracker.pending == 0
        assert namespace["msg"].data() == b"job-0" and len(idx) == 0  # every id popped by the last line
        # 3. metrics on the (closed) consumer of block 1
        await run_block(blocks[2], namespace)
        assert dict(namespace["registration"].attributes)["pulsar.subscription"] == "workers"
    finally:
        client = namespace.get("client")
        if client is not None:
            await client.close()
        await setup.close()
