"""Where nacktracker keeps what it caches on this machine (:mod:`.caches`, and the
executor environments of :mod:`.ship`): one function both use, so neither imports the other."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """``$NACKTRACKER_CACHE_DIR`` or ``$XDG_CACHE_HOME/nacktracker`` (default ``~/.cache/nacktracker``)."""
    return Path(os.environ.get("NACKTRACKER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "nacktracker"))
