"""The command line talks: --version, plain help for every command, bench's
parts and output folders, and one line naming the extra when one is missing."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

import nacktracker
from nacktracker import cli

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nacktracker.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_version():
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"nacktracker {nacktracker.__version__}"


def test_every_command_has_plain_help(capsys):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"demo", "bench", "trace", "plan", "sweep"} <= set(sub.choices)
    for name, command in [("nacktracker", parser), *sub.choices.items()]:
        text = command.format_help()
        assert "``" not in text and ":class:" not in text and ":func:" not in text, (name, text)
    # the pipeline's commands (trace, plan, sweep) are nacktracker/pipeline/cli.py's to describe
    for name, command in [("nacktracker", parser), ("demo", sub.choices["demo"]), ("bench", sub.choices["bench"])]:
        assert command.description, f"{name} has no description"


def test_bench_help_lists_the_parts():
    proc = run_cli("bench", "--help")
    assert proc.returncode == 0
    for part in cli.BENCH_PARTS:
        assert f"  {part} " in proc.stdout


def test_bench_skip_refuses_an_unknown_part_and_names_the_parts():
    proc = run_cli("bench", "--skip", "memroy")
    assert proc.returncode == 2
    assert "unknown part(s) memroy; parts: memory, grid, throughput," in proc.stderr


def test_bench_quick_never_overwrites_the_full_results():
    proc = run_cli("bench", "--quick", "--out", "bench/results/latest")
    assert proc.returncode == 2 and "does not overwrite" in proc.stderr


def test_bench_quick_defaults_to_its_own_folder(monkeypatch):
    seen = {}
    monkeypatch.setattr(cli, "_run_suite", lambda root, argv: seen.update(root=root, argv=argv) or 0)
    assert cli.main(["bench", "--quick", "--skip", "soak,dedup"]) == 0
    assert seen["root"] == ROOT
    assert seen["argv"] == ["--out", str(ROOT / "bench" / "results" / "quick"), "--quick", "--skip", "soak,dedup"]


def test_bench_outside_a_checkout_says_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cli, "bench_dir", lambda: None)
    assert cli.main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "source checkout" in err


@pytest.mark.parametrize("module, extra", [("pyspark", "spark"), ("numpy", "spark"), ("pulsar_lite", "demo"),
                                           ("_pulsar", "pulsar"), ("matplotlib", "bench")])
def test_a_missing_optional_module_is_one_line_naming_the_extra(monkeypatch, capsys, module, extra):
    def fail(args: argparse.Namespace) -> int:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(parser(), fail))
    assert cli.main(["plan", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"pip install 'nacktracker[{extra}]'" in err


def test_a_missing_module_of_no_extra_is_not_hidden(monkeypatch):
    def fail(args: argparse.Namespace) -> int:
        raise ModuleNotFoundError("No module named 'nacktracker.nope'", name="nacktracker.nope")

    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(parser(), fail))
    with pytest.raises(ModuleNotFoundError, match="nacktracker.nope"):
        cli.main(["plan", "x"])


def _with_func(parser: argparse.ArgumentParser, func) -> argparse.ArgumentParser:
    parser.set_defaults(func=func)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in sub.choices.values():
        command.set_defaults(func=func)
    return parser
