"""The benchmark suite: each module runs as ``python -m bench.<name>`` from a
source checkout (``bench/`` is not installed with the package); diagnostics
that explain a figure rather than state one are under :mod:`bench.lab`.
Results are committed under ``bench/results/``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

#: The checkout's root: ``python -m bench.<name>`` imports ``bench`` from here.
ROOT = Path(__file__).resolve().parent.parent


def run_module(module: str, *args: str, **kwargs: Any) -> "subprocess.CompletedProcess[str]":
    """``python -m module *args`` in a fresh interpreter, from :data:`ROOT`
    (so ``bench`` imports whatever the caller's working directory), its
    output captured as text. Raises ``CalledProcessError`` on failure."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, check=True, capture_output=True,
                          text=True, **kwargs)
