# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
MUTATE_STAMP := $(VENV)/.installed-mutate
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: venv demo docs lint check test mutate bench bench-quick clean

# every extra (what `make test` needs)
venv: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[all]'
	touch $(STAMP) $(DEMO_STAMP) $(DOCS_STAMP)

# the demo's extra only (pulsar-client, the embedded broker, rich): no Spark, no test tools
$(DEMO_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m nacktracker.cli demo

# the docs extra only (mkdocs and its plugins; the API reference reads the source, imports nothing)
$(DOCS_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

# the docs site (mkdocs.yml), warnings as errors; `make test` builds it before the suite
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# ruff and mypy (configured in pyproject.toml, installed by the `test` extra) run first:
# a lint or type error fails `make test` before the suite starts
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

# The inner loop (<= 90 s on 2 cores): ruff, mypy and the tests that need neither a broker nor
# Spark, without the ones marked `slow` (whole benchmark runs and other long subprocess tests:
# `nacktracker bench --quick` and the other benchmark smoke runs, the traffic bench, the demo, the
# pipeline's subprocess runs, the runs under a profile hook), with hypothesis's `quick` profile (a quarter of each test's examples,
# derandomized: tests/run_checks.py). `make test` runs everything, these included, on the `ci` profile.
CHECK_TESTS := not broker and not lite and not apache and not external and not spark and not slow
check: lint
	NACKTRACKER_HYPOTHESIS=$${NACKTRACKER_HYPOTHESIS:-quick} $(PY) -m pytest -q -m "$(CHECK_TESTS)"

# NACKTRACKER_TEST_REQUIRE=1: a test dependency that is missing (Java, PySpark, pulsar-client,
# pulsar-lite) or a broker that cannot start fails the run with one line, never skips quietly.
# Hypothesis runs the derandomized `ci` profile unless $$NACKTRACKER_HYPOTHESIS says otherwise
# (tests/run_checks.py). Four pytest sessions run side by side: Apache Pulsar (two), Spark/slow, the others (tools/run_tests.py).
test: lint docs
	NACKTRACKER_TEST_REQUIRE=1 $(PY) tools/run_tests.py

# Mutation testing (mutmut, configured in pyproject.toml: the core modules against the fast
# tests); not part of `make test`. Writes the score per module and each survivor to mutation/latest.md; the committed
# report with a reason per survivor is mutation/REPORT.md. A mutant whose tests pass 100 s of CPU
# is taken for a loop (a timeout, counted killed): the slowest survivor takes about 80 s.
mutate: $(MUTATE_STAMP)
	$(PY) tools/mutate.py --owners --cpu-limit 100

$(MUTATE_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[all,mutate]'
	touch $(MUTATE_STAMP)

# the whole suite in one run, into build/ (not committed: each benchmark commits its own results under
# bench/results/, rendered into the docs by `python -m bench.figures`)
bench: $(STAMP)
	$(PY) -m nacktracker.cli bench --out build/bench

bench-quick: $(STAMP)
	$(PY) -m nacktracker.cli bench --quick --out build/bench-quick

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache
