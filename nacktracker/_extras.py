"""Optional dependencies: one line naming the extra to install, instead of a
raw ``ModuleNotFoundError`` from deep inside a third-party package.

The core (index, tracker, adapters.memory, backoff, snapshots) needs only
pyroaring and sortedcontainers. Everything else is an extra
(``pyproject.toml``), and every place that imports one goes through
:func:`require` or maps a late ``ModuleNotFoundError`` with :func:`explain`.

>>> try:
...     require("no_such_module_xyz", "pulsar", "nacktracker.TrackedConsumer")
... except MissingExtraError as e:
...     print(e)
nacktracker.TrackedConsumer needs the 'pulsar' extra (no module named 'no_such_module_xyz'): pip install '.[pulsar]' in the nacktracker checkout (or pip install 'nacktracker-<version>-py3-none-any.whl[pulsar]')
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

from .errors import MissingExtraError

__all__ = ["MissingExtraError", "EXTRA_OF", "require", "explain"]

#: Top-level module -> the extra that installs it (what :func:`explain` maps).
EXTRA_OF: dict[str, str] = {
    "pulsar": "pulsar", "_pulsar": "pulsar",
    "pulsar_lite": "demo", "rich": "demo",
    "pyspark": "spark", "pyarrow": "spark", "pandas": "spark", "numpy": "spark",
    "matplotlib": "bench",
    "opentelemetry": "otel",
}


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``extra``.

    Only a missing module is translated; an installed module that fails while
    importing (a broken build, a bug) raises its own error unchanged.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise explain(exc, feature, default_extra=extra) from None


def explain(exc: ModuleNotFoundError, feature: str, default_extra: Optional[str] = None) -> ModuleNotFoundError:
    """The one-line error for ``exc``: a :class:`MissingExtraError` when the
    missing module belongs to an extra (or ``default_extra`` is given), else
    ``exc`` itself (a missing module nobody declared is a bug to see whole)."""
    if isinstance(exc, MissingExtraError):
        return exc
    root = (exc.name or "").split(".")[0]
    extra = EXTRA_OF.get(root, default_extra)
    if extra is None:
        return exc
    return MissingExtraError(feature, extra, exc.name)
