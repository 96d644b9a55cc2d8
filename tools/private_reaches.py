"""Count reads and writes of another object's ``_name`` (``x._y`` where ``x`` is not ``self``/``cls``).

    python tools/private_reaches.py [--list] [ROOT]      (ROOT: nacktracker/)

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


def reaches(root: Path) -> list[tuple[str, int, str, str]]:
    """``(module, line, expression, kind)`` of every reach under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            kind = "api" if node.attr in API else "third-party" if node.attr in THIRD_PARTY else "own"
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
