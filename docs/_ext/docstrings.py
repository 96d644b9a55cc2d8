"""A griffe extension for the API reference: the package's docstrings are
written for ``help()`` and Sphinx-style readers (reST roles, ``>>>`` doctest
examples); this turns them into Markdown that mkdocstrings renders as meant.

* a run of ``>>>``/``...`` lines and their output becomes a ``pycon`` code block
  (left as text, Markdown reads ``[1, 2]`` as a link reference);
* ``:class:`~a.b.C``` and the other roles become inline code (``C``, or the
  full path without the ``~``).

Loaded by mkdocs.yml (``extensions:``); ``docs/_ext`` is excluded from the site.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")


def _role(match: re.Match[str]) -> str:
    tilde, target = match.group(1), match.group(2).strip()
    if tilde:
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def markdown(text: str) -> str:
    """The docstring ``text`` with doctest runs fenced and roles as code."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            block = []
            while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
                block.append(lines[i][len(indent):])
                i += 1
            out += [f"{indent}```pycon", *(indent + b for b in block), f"{indent}```"]
            continue
        out.append(_ROLE.sub(_role, line))
        i += 1
    return "\n".join(out)


class DocstringsForMarkdown(Extension):
    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
