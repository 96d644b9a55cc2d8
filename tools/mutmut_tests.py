"""Run mutmut with another test selection than ``[tool.mutmut]``'s.

``tools/mutate.py --tests FILE ...`` runs mutmut through this: the mutants of
one part of the package are then checked against the tests that own its
behaviour (the index's mutants against the index tests) instead of the whole
fast selection, so a run fits in the time there is. Only the test selection
changes; everything else (what counts as killed, the ``mutate`` hypothesis
profile, the modules mutated) stays as configured.

    python tools/mutmut_tests.py '["tests/index/test_index.py", ...]' run [mutmut args]
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from mutmut import configuration
from mutmut.__main__ import cli


def main() -> None:
    selection = json.loads(sys.argv[1])
    read = configuration._config_reader

    def reader() -> Callable[[str, Any], Any]:
        configured = read()

        def get(key: str, default: Any) -> Any:
            return selection if key == "pytest_add_cli_args_test_selection" else configured(key, default)
        return get

    configuration._config_reader = reader
    configuration.reset_config()
    sys.argv = ["mutmut", *sys.argv[2:]]
    cli()


if __name__ == "__main__":
    main()
