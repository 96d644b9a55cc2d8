"""Import rules of the package, checked on the source (AST), as tests/test_layers.py checks the layers.

**Private names stay in their package.** A name is private when a component of its
dotted path starts with one underscore (``_checks``, ``_roaring_bytes``; dunders such
as ``__version__`` are not private). Its *owner* is the package that holds the first
private component: ``nacktracker.index._bytes._roaring_bytes`` belongs to
``nacktracker.index``; ``nacktracker.pipeline.pending._sweep`` (a private name of the
module ``pending``) belongs to ``nacktracker.pipeline``. A module may import a private
name only when its own package (the folder it is in) is the owner or inside it:
``nacktracker.consumer.shell`` may import ``nacktracker._checks`` (a helper of the
whole package), ``nacktracker.pipeline.stream`` may import ``pending._sweep`` (its own
package's), but ``nacktracker.dedup`` may not import ``nacktracker.index._bytes``
(another package's inside). Every import statement counts: at module level, inside
functions and under ``if TYPE_CHECKING:``.

**No import cycles.** Module A depends on module B when any import statement in A
(at module level, inside a function, or under ``if TYPE_CHECKING:``) names B, or a
name B defines (``from .b import f``), or B as a submodule (``from . import b``).
The implicit import of a module's parent package is not an edge (a package's
``__init__`` that imports its own submodules is not a cycle). Lazy loads by
``importlib`` are mirrored by ``if TYPE_CHECKING:`` imports in the lazy packages'
``__init__`` (``nacktracker``, ``nacktracker.consumer``, ``nacktracker.errors``), so
they are edges too. The graph over every module of ``nacktracker`` has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "nacktracker"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
PACKAGES = {name for name, path in FILES.items() if path.name == "__init__.py"}

def package_of(module: str) -> str:
    return module if module in PACKAGES else module.rpartition(".")[0]


def imports(module: str) -> list[tuple[int, str]]:
    """``(line, absolute dotted name)`` of everything the module imports from the package:
    modules, and ``module.name`` for names taken from one."""
    found = []
    package = package_of(module)
    for node in ast.walk(ast.parse(FILES[module].read_text(), str(FILES[module]))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found += [(node.lineno, f"{source}.{alias.name}") for alias in node.names if alias.name != "*"]
    return [(line, name) for line, name in found if name == "nacktracker" or name.startswith("nacktracker.")]


def private_owner(dotted: str) -> str | None:
    """The package that owns the first private component of ``dotted`` (None: nothing private)."""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return package_of(".".join(parts[:i]))
    return None


def depends_on(module: str) -> set[str]:
    """The package's modules ``module`` imports (see the module docstring)."""
    out = set()
    for _, name in imports(module):
        if name in FILES:
            out.add(name)  # a module (or a package's __init__), or a submodule taken by `from . import x`
        elif name.rpartition(".")[0] in FILES:
            out.add(name.rpartition(".")[0])  # a name defined by a module
    out.discard(module)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("module", sorted(FILES))
def test_no_module_imports_another_packages_private_names(module):
    own = package_of(module)
    bad = [f"line {line}: {name}" for line, name in imports(module)
           if (owner := private_owner(name)) is not None and not (own == owner or own.startswith(owner + "."))]
    assert not bad, f"{module} imports private names of another package: {bad}"


def test_the_rules_catch_what_they_name():
    assert private_owner("nacktracker.index._bytes._roaring_bytes") == "nacktracker.index"
    assert private_owner("nacktracker.pipeline.pending._sweep") == "nacktracker.pipeline"
    assert private_owner("nacktracker._checks.check_int") == "nacktracker"
    assert private_owner("nacktracker.__version__") is None
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "nacktracker.consumer.shell" in depends_on("nacktracker.consumer.subscription")


def test_no_import_cycles_hidden_or_not():
    graph = {module: depends_on(module) for module in FILES}
    assert not cycles(graph), f"import cycles: {cycles(graph)}"
