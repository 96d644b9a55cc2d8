"""README.md and the docs site (docs/): every Python block runs, figures match their results files,
no internal words reach user text, README stays a one-page front page.

The Python blocks are complete programs, run here as a reader would run them
(``python block.py``): each in a fresh namespace as ``__main__``, in a fresh
working directory, once on each of the session's brokers (``$PULSAR_URL``
points at it, so ``nacktracker.testing.pulsar_service()`` starts nothing). A
block that needs no broker does not get one. The ``>>>`` examples the API
reference shows run too, every test a page names must exist, and every
``stats()`` key and metric must be on the stats page. The site build itself
(``mkdocs build --strict``: warnings are errors) is ``make docs``, run by
``make test``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from bench import figures  # noqa: E402  (the checkout's root is on pytest's pythonpath)

#: A page whose content is owned elsewhere and whose one block is not a program yet: it writes an event
#: log under /data and uses an adapter it does not make. Remove it from here when its block runs.
NOT_RUN: dict[str, str] = {}  # page -> why its Python blocks are not run (none: every block runs)
#: Pages whose internal words are not checked yet (the Spark pipeline page is, since its history moved
#: to bench/results/plan-speed/HISTORY.md).
NOT_WORDCHECKED: set[str] = set()

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(on_broker: bool) -> list:
    """The blocks that import pulsar (``on_broker``) or those that do not, as test parameters."""
    out = []
    for doc in DOCS:
        rel = doc.relative_to(ROOT).as_posix()
        text = doc.read_text()
        for m in FENCE.finditer(text):
            if bool(re.search(r"^\s*import pulsar", m.group(1), re.M)) != on_broker:
                continue
            line = text.count("\n", 0, m.start()) + 2
            marks = [pytest.mark.skip(reason=NOT_RUN[rel])] if rel in NOT_RUN else []
            out.append(pytest.param(rel, line, m.group(1), id=f"{rel}:{line}", marks=marks))
    return out


BLOCKS = python_blocks(on_broker=False)
BROKER_BLOCKS = python_blocks(on_broker=True)


def run_block(rel: str, line: int, code: str, cwd: Path) -> str:
    """Run ``code`` as ``__main__`` in ``cwd``; return what it printed."""
    out = io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out):
            exec(compile("\n" * (line - 1) + code, str(ROOT / rel), "exec"), {"__name__": "__main__"})
    finally:
        os.chdir(old)
    return out.getvalue()


@pytest.mark.parametrize(("rel", "line", "code"), BLOCKS)
def test_python_block_runs(rel, line, code, tmp_path):
    run_block(rel, line, code, tmp_path)


@pytest.mark.broker
@pytest.mark.parametrize(("rel", "line", "code"), BROKER_BLOCKS)
def test_python_block_runs_on_a_broker(rel, line, code, broker_url, tmp_path, monkeypatch):
    monkeypatch.setenv("PULSAR_URL", broker_url)  # pulsar_service() in the block starts nothing
    printed = run_block(rel, line, code, tmp_path)
    if rel == "README.md":  # the quick start: the nacked order came back once, after the others
        assert printed.splitlines()[:3] == ["order-0 delivery 1", "order-2 delivery 1", "order-1 delivery 2"], printed
        lateness = json.loads(printed.splitlines()[3].split(": ", 1)[1].replace("'", '"'))
        assert lateness["count"] == 1 and lateness["p50"] >= 0, printed


def test_every_page_with_code_has_its_blocks_collected():
    pages = {b.values[0] for b in BLOCKS + BROKER_BLOCKS}
    assert pages >= {"README.md", "docs/guide/consumer.md", "docs/guide/tracker.md", "docs/guide/metrics.md"}


def test_the_rendered_figures_match_their_results_files():
    assert figures.stale() == [], "run: python -m bench.figures"
    assert "demo" in figures.blocks(ROOT / "README.md") and "consume-throughput" in figures.blocks(ROOT / "README.md")


def test_a_results_file_that_changes_makes_its_block_stale(tmp_path, monkeypatch):
    record = json.loads(figures.DEMO.read_text())
    record["result"]["precision"][0]["tracked"]["error_ms"]["abs_p99"] += 1  # one figure moves
    changed = tmp_path / "results.json"
    changed.write_text(json.dumps(record))
    monkeypatch.setattr(figures, "DEMO", changed)
    assert "README.md: demo" in figures.stale()


def test_a_results_file_that_changes_makes_its_plot_stale(tmp_path, monkeypatch):
    """A plot carries a hash of the figures it draws: one figure moving in its results file makes it stale."""
    assert figures.stale_plots() == []
    record = json.loads(figures.INDEX_GRID.read_text())
    record["rows"][0]["rss_per_pending"] += 1
    changed = tmp_path / "results.json"
    changed.write_text(json.dumps(record))
    monkeypatch.setattr(figures, "INDEX_GRID", changed)
    assert figures.stale_plots() == ["docs/img/memory-per-pending.png"]


def test_an_unknown_block_name_is_an_error(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("<!-- figures:nope -->\n<!-- /figures:nope -->\n")
    with pytest.raises(KeyError, match="nope"):
        figures.rendered(doc)


#: Words of the project's own history that mean nothing to a user.
INTERNAL = re.compile(r"\b(issue|round|seed) ?#?\d+\b|\bround r\d+\b|\br\d+\b(?!\.)|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)"
                      r"[0-9a-f]{7,40}\b|after-issue|before-issue", re.I)


@pytest.mark.parametrize("doc", [d for d in DOCS if d.relative_to(ROOT).as_posix() not in NOT_WORDCHECKED],
                         ids=lambda d: d.relative_to(ROOT).as_posix())
def test_no_internal_words_in_user_text(doc):
    text = re.sub(r"<!--.*?-->", "", doc.read_text(), flags=re.S)
    found = [m.group(0) for m in INTERNAL.finditer(text)]
    assert found == [], f"{doc.relative_to(ROOT)}: {found}"


def test_readme_is_a_one_page_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    text = "\n".join(lines)
    for must in ("make demo", "make test", "PULSAR_URL", "pulsar_service()", ".whl", "docs/guarantees.md",
                 "python -m nacktracker.testing apache", "| pulsar-lite | Apache Pulsar |"):
        assert must in text, must


def test_every_docs_page_is_in_the_site_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {d.relative_to(ROOT / "docs").as_posix() for d in DOCS if d.parent != ROOT}
    assert {p for p in pages if p not in nav} == set()


async def test_the_stats_page_names_every_stats_key_and_metric():
    pytest.importorskip("pulsar")
    from nacktracker.metrics import INSTRUMENTS
    from test_consumer_shell import Harness  # a TrackedConsumer over a fake broker: its real stats() keys

    h = Harness()
    try:
        keys = set(h.consumer.stats()) | set(h.consumer.tracker.stats())
    finally:
        await h.close()
    page = (ROOT / "docs" / "stats.md").read_text()
    assert {k for k in keys if f"`{k}`" not in page} == set()
    metrics = {spec.name for spec in INSTRUMENTS} | {"nacktracker.redelivery.lateness", "nacktracker.timer.lag"}
    assert {m for m in metrics if f"`{m}`" not in page} == set()


def test_every_test_the_docs_name_exists():
    """A promise's proof cannot silently disappear: each ``test_x.py::name`` (or ``::name`` after it)
    named in README or docs is a test function in that file (found in whichever folder of tests/ holds it)."""
    missing = []
    files = {path.name: path for path in (ROOT / "tests").rglob("test_*.py")}  # in the rooms' folders
    for doc in DOCS:
        text = doc.read_text()
        current = None
        for m in re.finditer(r"`(?:(?P<file>test_\w+\.py))?::(?P<name>test_\w+)`", text):
            current = m.group("file") or current
            source = files.get(current or "")
            if source is None or not re.search(
                    rf"^((async )?def {m.group('name')}\(|{m.group('name')} = )", source.read_text(), re.M):
                missing.append(f"{doc.relative_to(ROOT)}: {current}::{m.group('name')}")
    assert missing == []


def api_objects() -> list:
    """The objects the API reference page renders (``::: dotted.path`` lines)."""
    out = []
    for path in re.findall(r"^::: (\S+)", (ROOT / "docs" / "reference" / "api.md").read_text(), re.M):
        module_path, _, name = path.rpartition(".")
        out.append(pytest.param(module_path, name, id=path))
    return out


@pytest.mark.parametrize(("module_path", "name"), api_objects())
def test_the_examples_of_the_api_reference_run(module_path, name):
    """The API reference shows the docstrings' ``>>>`` examples: each runs and prints what it shows."""
    import doctest
    import importlib

    pytest.importorskip("pulsar")
    module = importlib.import_module(module_path)
    obj = getattr(module, name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder().find(obj, f"{module_path}.{name}", globs=dict(vars(module))):
        runner.run(test)
    assert runner.failures == 0, f"{runner.failures} of {runner.tries} examples failed (output above)"


def test_make_demo_installs_only_the_demo_extra_and_make_test_every_extra_with_the_docs_build():
    makefile = (ROOT / "Makefile").read_text()
    demo_install = re.search(r"^\$\(DEMO_STAMP\):.*?\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "-e '.[demo]'" in demo_install and "[all]" not in demo_install
    assert re.search(r"^demo: \$\(DEMO_STAMP\)$", makefile, re.M)
    assert re.search(r"^test: lint docs$", makefile, re.M) and "mkdocs build --strict" in makefile
    assert "docs" in re.search(r'^all = \["nacktracker\[([^\]]*)\]"\]', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


# -- the first pages a user reads ----------------------------------------------------------------

def _section(text: str, heading: str) -> str:
    """The text under ``heading`` (a ``## `` line) up to the next heading of that level."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def _table_rows(text: str) -> dict[str, list[str]]:
    """``{first cell without backticks: the other cells}`` of the first Markdown table in ``text``."""
    rows: dict[str, list[str]] = {}
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def _shows_default(cell: str, default: object) -> bool:
    """Whether an options table's default cell states ``default`` (a signature's default)."""
    text = re.sub(r"[`\"' ,]", "", cell)
    if isinstance(default, bool):
        return text == str(default)
    if isinstance(default, (int, float)):
        try:
            return float(text) == default
        except ValueError:
            return False
    if isinstance(default, str):
        return text == default
    name = getattr(default, "name", None)
    return text == name if name is not None else bool(text)


def test_every_option_of_subscribe_is_a_row_of_the_consumer_guide():
    """Each keyword option of ``nacktracker.subscribe`` has a row in the consumer guide's options table, with
    its default (the signature's, where the signature states one) and a meaning; pulsar-client's options that
    ``subscribe`` passes through are each named under the table."""
    import inspect
    from typing import get_type_hints

    pytest.importorskip("pulsar")
    import nacktracker
    from nacktracker.consumer.subscription import CLIENT_OPTIONS, ClientSubscribeOptions

    section = _section((ROOT / "docs" / "guide" / "consumer.md").read_text(), "Options of `subscribe`")
    rows = _table_rows(section)
    params = [p for p in inspect.signature(nacktracker.subscribe).parameters.values()
              if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert len(params) >= 20
    assert [p.name for p in params if p.name not in rows] == [], "options missing from the table"
    assert [name for name in rows if name not in {p.name for p in params}] == [], "rows that are not options"
    for p in params:
        default, meaning = rows[p.name]
        assert default and len(meaning.split()) >= 4, (p.name, rows[p.name])
        if p.default is not None:
            assert _shows_default(default, p.default), (p.name, default, p.default)
    # the client's options: passed through or mapped onto the consumer's own (CLIENT_OPTIONS), each named
    client = set(get_type_hints(ClientSubscribeOptions)) | {k for k, v in CLIENT_OPTIONS.items() if v != "set"}
    assert sorted(k for k in client if f"`{k}`" not in section) == [], "client options not named"


def test_the_getting_started_page_is_in_the_nav_holds_install_and_the_quick_start_and_home_links_it():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^  - Getting started: getting-started\.md$", nav, re.M)
    page = (ROOT / "docs" / "getting-started.md").read_text()
    assert "pip install" in page and "python -m nacktracker.testing apache" in page and "kill" in page
    # the quick start is README's program, included (one copy, run by test_python_block_runs_on_a_broker)
    assert re.search(r'^--8<-- "README\.md:quickstart"$', page, re.M)
    readme = (ROOT / "README.md").read_text()
    quick = re.search(r"<!-- --8<-- \[start:quickstart\] -->\n(```python\n.*?```)\n<!-- --8<-- \[end:quickstart\] -->",
                      readme, re.S)
    assert quick and "nacktracker.subscribe(" in quick.group(1)
    assert "](getting-started.md)" in (ROOT / "docs" / "index.md").read_text()
    for word in ("pulsar-lite", "PIP-393"):
        assert re.search(rf"^{word}\n:   ", page, re.M), f"no glossary line for {word}"


def test_make_docs_needs_the_docs_extra_only():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^docs: \$\(DOCS_STAMP\)$", makefile, re.M)
    install = re.search(r"^\$\(DOCS_STAMP\):.*?\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "-e '.[docs]'" in install and "[all]" not in install


def test_every_results_folder_is_named_by_a_page():
    """No orphaned results: each folder under bench/results/ is named on a page of README or the site."""
    text = "\n".join(doc.read_text() for doc in DOCS)
    folders = sorted(p.name for p in (ROOT / "bench" / "results").iterdir() if p.is_dir())
    assert folders and [f for f in folders if f"bench/results/{f}" not in text] == []


def test_the_benchmarks_page_shows_the_seed_table_and_its_plots():
    page = ROOT / "docs" / "benchmarks.md"
    names = figures.blocks(page)
    assert {"seed-table", "plot-redelivery-error", "plot-memory-per-pending", "plot-consume-throughput"} <= set(names)
    text = page.read_text()
    for file, _, _ in figures.PLOTS.values():
        assert f"](img/{file})" in text and (ROOT / "docs" / "img" / file).exists(), file
