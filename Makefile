# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo lint test bench bench-quick clean

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

test: lint
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m nacktracker.cli bench --out bench/results/latest

bench-quick: $(STAMP)
	$(PY) -m nacktracker.cli bench --quick --out bench/results/quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
