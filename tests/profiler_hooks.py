"""A profile hook as a sampling profiler or debugger behaves: it reads ``frame.f_locals``.

On Python 3.11 such a read keeps the frame's locals alive (numpy views of the index's
arrays included) until the next read or the frame's end. Reading at every event re-syncs
the dict and hides the faults this exposes, so the hook reads at a random share of C calls.
"""

from __future__ import annotations

import random
from typing import Any, Callable


def locals_reader(prefix: str, sample: random.Random, share: float = 0.2) -> Callable[[Any, str, Any], None]:
    """A ``sys.setprofile`` hook reading the locals of every frame on the stack whose code lives under
    ``prefix`` at a random ``share`` of C calls (drawn from ``sample``, for a repeatable run)."""

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and sample.random() < share:
            while frame is not None:
                if frame.f_code.co_filename.startswith(prefix):
                    frame.f_locals  # noqa: B018  (the read is the point)
                frame = frame.f_back

    return hook
