"""Progress of the long phases on stdout: what runs, Spark's task counts, how long it took.

A phase prints one line when it starts and one when it ends. While it runs, a
daemon thread polls Spark's status tracker (``SparkContext.statusTracker``:
active stages and their task counts; no UI needed) and reports the tasks
done: on a terminal one line rewritten in place, elsewhere (logs, CI) a line
at most every ``every_s`` seconds and only when the count moved.
``Progress(enabled=False)`` prints nothing (``--quiet``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TYPE_CHECKING, Iterator, Optional, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Progress"]


class Progress:
    """Phase lines and Spark task progress for one command (``prefix``: its name)."""

    def __init__(self, prefix: str, enabled: bool = True, stream: Optional[TextIO] = None,
                 every_s: float = 10.0, poll_s: float = 0.5) -> None:
        self.prefix = prefix
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self.every_s = every_s
        self.poll_s = poll_s
        self.spark: Optional[SparkSession] = None  # set once a session exists: then phases show task counts
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._lock = threading.Lock()
        self._live = False         # a rewritable line is on screen

    def say(self, text: str) -> None:
        """One line (after clearing a live progress line)."""
        if not self.enabled:
            return
        with self._lock:
            self._clear()
            print(f"[{self.prefix}] {text}", file=self.stream, flush=True)

    def _clear(self) -> None:
        if self._live:
            self.stream.write("\r\033[K")
            self._live = False

    @contextlib.contextmanager
    def phase(self, name: str, what: str = "") -> Iterator[None]:
        """Announce ``name``, follow Spark's tasks while it runs, report its time."""
        started = time.perf_counter()
        self.say(f"{name}: {what}" if what else f"{name} ...")
        stop = threading.Event()
        watcher = None
        if self.enabled and self.spark is not None:
            watcher = threading.Thread(target=self._watch, args=(name, started, stop), daemon=True)
            watcher.start()
        try:
            yield
        finally:
            stop.set()
            if watcher is not None:
                watcher.join(2)
            with self._lock:
                self._clear()
        # only a phase that finished says so: a failure's message comes alone
        self.say(f"{name}: done in {time.perf_counter() - started:.1f} s")

    def _watch(self, name: str, started: float, stop: threading.Event) -> None:
        try:
            assert self.spark is not None  # a watcher starts only with a session
            tracker = self.spark.sparkContext.statusTracker()
        except Exception:  # noqa: BLE001  (the session went away: nothing to follow)
            return
        last_text, last_print = None, 0.0
        while not stop.wait(self.poll_s):
            try:
                infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            except Exception:  # noqa: BLE001  (a progress line is best effort)
                return
            stages = [s for s in infos if s is not None]
            if not stages:
                continue
            done = sum(s.numCompletedTasks for s in stages)
            total = sum(s.numTasks for s in stages)
            running = sum(s.numActiveTasks for s in stages)
            text = (f"{name}: {done}/{total} tasks done, {running} running "
                    f"(stage {', '.join(str(s.stageId) for s in stages)}), "
                    f"{time.perf_counter() - started:.0f} s")
            now = time.perf_counter()
            with self._lock:
                if stop.is_set():
                    return
                if self._tty:
                    self.stream.write(f"\r\033[K[{self.prefix}] {text}")
                    self.stream.flush()
                    self._live = True
                elif text.split(",")[0] != (last_text or "").split(",")[0] and now - last_print >= self.every_s:
                    print(f"[{self.prefix}] {text}", file=self.stream, flush=True)
                    last_text, last_print = text, now
