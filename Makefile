# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo lint test mutate bench bench-quick clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m nacktracker.cli demo

# ruff and mypy (configured in pyproject.toml, installed by the `test` extra) run first:
# a lint or type error fails `make test` before the suite starts
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

# NACKTRACKER_TEST_REQUIRE=1: a test dependency that is missing (Java, PySpark, pulsar-client,
# pulsar-lite) or a broker that cannot start fails the run with one line, never skips quietly.
# Hypothesis runs the derandomized `ci` profile unless $$NACKTRACKER_HYPOTHESIS says otherwise
# (tests/run_checks.py).
test: lint
	NACKTRACKER_TEST_REQUIRE=1 $(PY) -m pytest -q

# Mutation testing (mutmut, configured in pyproject.toml: the core modules against the fast
# tests); not part of `make test`. Writes the score per module and each survivor to mutation/latest.md; the committed
# report with a reason per survivor is mutation/REPORT.md.
mutate: $(STAMP)
	$(PY) tools/mutate.py

bench: $(STAMP)
	$(PY) -m nacktracker.cli bench --out bench/results/latest

bench-quick: $(STAMP)
	$(PY) -m nacktracker.cli bench --quick --out bench/results/quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
