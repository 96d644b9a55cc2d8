"""Count reads and writes of another object's ``_name`` (``x._y`` where ``x`` is not ``self``/``cls``).

    python tools/private_reaches.py [--list] [ROOT]      (ROOT: nacktracker/)

A reach spelled with a string counts as one too: ``getattr(x, "_y")``, ``hasattr``, ``setattr``, ``delattr``
(``x`` not ``self``/``cls``) and ``operator.attrgetter("_y")`` (a getter made once and called per object).

Each reach is put in one of three kinds:

* ``own``: into one of nacktracker's own objects (what the layer rules keep small);
* ``third-party``: into pulsar-client's, PySpark's or asyncio's internals (no public way: each says why where it is);
* ``api``: the public API of a namedtuple or an enum, spelled with an underscore (``_replace``, ``_value_``).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

#: Underscore names that are public API (namedtuple, enum).
API = {"_replace", "_asdict", "_fields", "_make", "_value_", "_name_"}
#: Private names of other packages' objects that nacktracker reads (pulsar-client's wrappers, PySpark, and
#: asyncio's loop recording the thread that runs it: the tracker's add reads it instead of a getpid() per call).
THIRD_PARTY = {"_consumer", "_schema", "_message", "_msg_id", "_client", "_gateway", "_jvm", "_collect_as_arrow",
               "_thread_id"}


#: Built-ins that read or write the attribute their second argument names.
BY_NAME = {"getattr", "hasattr", "setattr", "delattr"}


def _private(name: object) -> bool:
    return isinstance(name, str) and name.startswith("_") and not name.startswith("__")


def _own_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _reached(node: ast.AST) -> str | None:
    """The private name ``node`` reads or writes on another object, if it does."""
    if isinstance(node, ast.Attribute):
        return node.attr if _private(node.attr) and not _own_self(node.value) else None
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if called in BY_NAME and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
        name = node.args[1].value
        return name if _private(name) and not _own_self(node.args[0]) else None  # type: ignore[return-value]
    if called == "attrgetter":
        names = [a.value for a in node.args if isinstance(a, ast.Constant)]
        return next((n for n in names if _private(n)), None)
    return None


def reaches(root: Path) -> list[tuple[str, int, str, str]]:
    """``(module, line, expression, kind)`` of every reach under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = _reached(node)
            if name is None:
                continue
            kind = "api" if name in API else "third-party" if name in THIRD_PARTY else "own"
            found.append((path.relative_to(root.parent).as_posix(), node.lineno, ast.unparse(node), kind))
    return found


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent / "nacktracker"
    found = reaches(root.resolve())
    if "--list" in argv:
        for module, line, expr, kind in found:
            print(f"{module}:{line}: {expr} ({kind})")
    kinds = Counter(kind for *_, kind in found)
    in_consumer = Counter(kind for module, *_, kind in found if "/consumer/" in module)
    print(f"total {len(found)}: " + ", ".join(f"{k} {kinds[k]}" for k in ("own", "third-party", "api")))
    print(f"consumer/ {sum(in_consumer.values())}: " + ", ".join(f"{k} {in_consumer[k]}" for k in ("own", "third-party", "api")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
