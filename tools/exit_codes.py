"""Run the programs users copy, again and again beside busy processes, and count their exit codes.

A program that printed everything and then dies at exit (SIGSEGV 139, SIGABRT 134) is a crash
the user sees. This runs each program as a reader would (``python program.py``, a fresh
interpreter, ``$PULSAR_URL`` set so ``pulsar_service()`` starts nothing), ``--runs`` times each,
with ``--busy`` processes spinning on the CPU meanwhile (exits race with the client's threads,
and load widens the race), and prints the exit codes per program.

    python tools/exit_codes.py --runs 20 --busy 2 --broker apache quickstart
    python tools/exit_codes.py --runs 10 --broker apache docs examples

Programs: ``quickstart`` (README's quick start), ``docs`` (every program in docs/ that uses
a broker), ``examples`` (examples/*.py), ``quickstart-plain`` (the quick start written
for the plain ``pulsar.asyncio`` consumer), ``plain-ack-only`` (the same without its nack: no
``asyncio.to_thread`` in the program), or a path to a script. Uses ``$PULSAR_URL`` when set,
else starts a broker of ``--broker`` (stopped at the end, as the busy processes are). Exit
status 1 when any run exited with anything but 0.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

#: The README's quick start written for the plain consumer: the comparison the quick start is held to.
#: (The plain consumer has no receive timeout, and its nack needs a Shared subscription on Apache Pulsar:
#: on the default Exclusive one the plain client's nack never came back there.)
QUICKSTART_PLAIN = '''\
import asyncio

import pulsar
import pulsar.asyncio

from nacktracker.testing import pulsar_service


async def main(url: str) -> None:
    client = pulsar.asyncio.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = await client.create_producer("quickstart-orders-plain")
    consumer = await client.subscribe(
        "quickstart-orders-plain", "workers", consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest, negative_ack_redelivery_delay_ms=500,
    )
    for i in range(3):
        await producer.send(f"order-{i}".encode())
    done = set()
    while len(done) < 3:
        msg = await consumer.receive()
        if NACK and msg.data() == b"order-1" and msg.redelivery_count() == 0:
            await consumer.negative_acknowledge(msg)
            continue
        await consumer.acknowledge(msg)
        done.add(msg.data())
        print(msg.data().decode(), "delivery", msg.redelivery_count() + 1)
    await consumer.close()
    await producer.close()
    await client.close()


with pulsar_service() as url:
    asyncio.run(main(url))
'''


def broker_blocks(doc: Path) -> list[tuple[str, str]]:
    """The Python blocks of ``doc`` that use a broker, as (name, source)."""
    text = doc.read_text()
    out = []
    for m in FENCE.finditer(text):
        if re.search(r"^\s*import pulsar", m.group(1), re.M):
            line = text.count("\n", 0, m.start()) + 2
            out.append((f"{doc.relative_to(ROOT).as_posix()}:{line}", m.group(1)))
    return out


def programs(names: list[str]) -> list[tuple[str, str]]:
    """(name, source) for each program named."""
    out: list[tuple[str, str]] = []
    for name in names:
        if name == "quickstart":
            text = (ROOT / "README.md").read_text()
            block = FENCE.search(text, text.index("## Quick start"))
            assert block is not None, "README.md has no quick start block"
            out.append(("README.md quick start", block.group(1)))
        elif name == "docs":
            for doc in sorted((ROOT / "docs").rglob("*.md")):
                out += broker_blocks(doc)
        elif name == "examples":
            out += [(f"examples/{p.name}", p.read_text()) for p in sorted((ROOT / "examples").glob("*.py"))]
        elif name in ("quickstart-plain", "plain-ack-only"):
            out.append((name, f"NACK = {name == 'quickstart-plain'}\n" + QUICKSTART_PLAIN))
        else:
            path = Path(name)
            out.append((name, path.read_text()))
    return out


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[None]:
    """``n`` processes spinning on a core each while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


@contextlib.contextmanager
def service(kind: str) -> Iterator[str]:
    """``$PULSAR_URL``, else a broker of ``kind`` while the block runs."""
    if os.environ.get("PULSAR_URL"):
        yield os.environ["PULSAR_URL"]
        return
    from nacktracker.testing import make_broker

    with make_broker(kind) as broker:
        yield broker.url


def run_once(source: str, url: str, timeout_s: float) -> tuple[int, str]:
    """Run ``source`` as ``python program.py`` in a fresh directory: (exit code, stderr's tail).
    A run past ``timeout_s`` is killed and counted as exit code -9."""
    with tempfile.TemporaryDirectory(prefix="exit-codes-") as cwd:
        script = Path(cwd) / "program.py"
        script.write_text(source)
        env = {**os.environ, "PULSAR_URL": url, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        try:
            proc = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            return -9, err[-2000:]
        return proc.returncode, proc.stderr[-2000:]


def measure(names: list[str], runs: int, busy: int, url: str, timeout_s: float = 120.0,
            on_run: Optional[Callable[[str, int, str], None]] = None) -> dict[str, dict[int, int]]:
    """Exit codes per program: {name: {exit code: runs}}, the programs run in turn ``runs`` times
    (one of each, then again), beside ``busy`` spinning processes."""
    chosen = programs(names)
    counts: dict[str, collections.Counter[int]] = {name: collections.Counter() for name, _ in chosen}
    with busy_processes(busy):
        for _ in range(runs):
            for name, source in chosen:
                code, err = run_once(source, url, timeout_s)
                counts[name][code] += 1
                if on_run is not None:
                    on_run(name, code, err)
    return {name: dict(sorted(c.items())) for name, c in counts.items()}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("programs", nargs="*", default=["quickstart"],
                        help="quickstart, docs, examples, quickstart-plain, plain-ack-only, or a script's path")
    parser.add_argument("--runs", type=int, default=20, help="runs of each program (default 20)")
    parser.add_argument("--busy", type=int, default=2, help="processes spinning meanwhile (default 2)")
    parser.add_argument("--broker", choices=("apache", "lite"), default="apache",
                        help="the broker to start when $PULSAR_URL is not set (default apache)")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args(argv)

    def report(name: str, code: int, err: str) -> None:
        print(f"{name}: exit {code}" + (f"\n  stderr: {err.strip()[-300:]}" if code else ""), file=sys.stderr)

    with service(args.broker) as url:
        load_before = os.getloadavg()
        started = time.monotonic()
        counts = measure(args.programs, args.runs, args.busy, url, on_run=report)
        load_after = os.getloadavg()
    if args.json:
        print(json.dumps({"broker": args.broker if not os.environ.get("PULSAR_URL") else "external",
                          "runs": args.runs, "busy": args.busy, "counts": counts,
                          "load_average_1m": [round(load_before[0], 2), round(load_after[0], 2)]}))
    else:
        for name, by_code in counts.items():
            codes = ", ".join(f"exit {code}: {n}" for code, n in by_code.items())
            print(f"{name}: {codes}")
        print(f"{args.runs} runs each, {args.busy} busy processes, {time.monotonic() - started:.0f} s, "
              f"load average {load_before[0]:.2f} -> {load_after[0]:.2f}")
    return 0 if all(set(c) == {0} for c in counts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
