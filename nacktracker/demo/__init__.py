"""``nacktracker demo``: TrackedConsumer beside the client's built-in negative
ack, on one broker, with a table of what each did.

The scenarios are :mod:`.workload`, :mod:`.precision` and :mod:`.steady`
(``bench/pulsar_precision.py`` runs the same ones, bigger); the two consumers
they compare are in :mod:`.sides`, what they measure with in :mod:`.measure`,
the table in :mod:`.table`. This module runs them in order against
``$PULSAR_URL`` or a fresh embedded broker and prints the result.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import sys
import time
from typing import Any, Optional

from .measure import CLOSE_GRACE_S, Progress
from .precision import run_precision
from .steady import run_steady_stream
from .table import RichProgress, print_rich, render_text
from .workload import run_workload

__all__ = ["run_demo", "main"]


async def run_demo(url: str, quick: bool = False, progress: Optional[Progress] = None) -> dict[str, Any]:
    """The three scenarios one after the other (each runs both sides at once).
    ``quick``: smaller and shorter (~10 s instead of ~30 s), 1 s precision only."""
    started = time.monotonic()
    result: dict[str, Any] = {"quick": quick, "url": url}
    result["workload"] = await run_workload(url, 600 if quick else 2000, progress=progress)
    delays = (1000,) if quick else (1000, 5000)
    sizes = {1000: 60 if quick else 200, 5000: 160}
    result["precision"] = list(await asyncio.gather(*[
        run_precision(url, d, sizes[d], per_wave=20, seed=d, progress=progress) for d in delays]))
    result["steady_stream"] = await run_steady_stream(url, stream_ms=1500 if quick else 3000, progress=progress)
    result["duration_s"] = round(time.monotonic() - started, 1)
    await asyncio.sleep(CLOSE_GRACE_S)
    return result


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _console() -> Any:
    """A rich console, or None without rich (the table still prints, plain)."""
    try:
        from rich.console import Console
    except ImportError:
        return None
    # Not a terminal (a pipe, a test): rich would assume 80 columns and cut cells.
    return Console() if Console().is_terminal else Console(width=int(os.environ.get("COLUMNS", 0)) or 150)


def main(quick: bool = False, as_json: bool = False) -> int:
    """``nacktracker demo [--quick] [--json]``: run the scenarios against
    ``$PULSAR_URL`` or a fresh embedded broker, with progress bars, then print
    the comparison table (or the whole result as JSON)."""
    from ..testing import pulsar_service

    console = _console()
    with pulsar_service() as url:
        where = f"$PULSAR_URL={url}" if url == os.environ.get("PULSAR_URL") else f"embedded pulsar-lite at {url}"
        print(f"nacktracker demo{' --quick' if quick else ''}: TrackedConsumer beside pulsar-client "
              f"{_version('pulsar-client')}'s built-in nack, {where}", flush=True,
              file=sys.stderr if as_json else sys.stdout)  # --json: stdout is JSON only
        if console is None or as_json:
            result = asyncio.run(run_demo(url, quick))
        else:
            with RichProgress(console) as progress:
                result = asyncio.run(run_demo(url, quick, progress))
    if as_json:
        print(json.dumps(result, indent=1, default=str))
        return 0
    title = f"TrackedConsumer vs built-in nack, same broker, same run ({result['duration_s']} s, all measured)"
    if console is None:
        print(title)
        print(render_text(result))
    else:
        print_rich(console, title, result)
    return 0
