"""The command line talks: --version, plain help for every command, bench's
parts and output folders, and one line naming the extra when one is missing."""

from __future__ import annotations

import argparse
import re
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
    proc = run_cli("bench", "--quick", "--out", "build/bench")
    assert proc.returncode == 2 and "does not overwrite" in proc.stderr


def test_bench_quick_defaults_to_its_own_folder(monkeypatch):
    seen = {}
    monkeypatch.setattr(cli, "_run_suite", lambda root, argv: seen.update(root=root, argv=argv) or 0)
    assert cli.main(["bench", "--quick", "--skip", "soak,dedup"]) == 0
    assert seen["root"] == ROOT
    assert seen["argv"] == ["--out", str(ROOT / "build" / "bench-quick"), "--quick", "--skip", "soak,dedup"]


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
    assert err.count("\n") == 1 and f"pip install '.[{extra}]' in the nacktracker checkout" in err


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


# -- the Spark commands' argument errors: one line naming the problem and the fix, before a JVM starts --------

def _one_line_error(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("nacktracker: error: ") and all(w in proc.stderr for w in words), proc.stderr


def run_main(capsys, *args: str) -> subprocess.CompletedProcess:
    """``nacktracker *args`` in this process (what the subprocess runs, without an interpreter's start)."""
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["nacktracker", *args], code, out, err)


def test_trace_generate_onto_an_existing_folder_is_one_line_naming_overwrite(tmp_path):
    (tmp_path / "trace").mkdir()
    proc = run_cli("trace", "generate", "--out", str(tmp_path / "trace"), "--events", "10", cwd=tmp_path)
    _one_line_error(proc, "exists", "--overwrite")
    proc = run_cli("trace", "generate", "--out", str(tmp_path / "new"), "--events", "10", "--files", "0")
    _one_line_error(proc, "--files must be >= 1")


@pytest.mark.parametrize("args, words", [
    (["--max-early-ms", "-5"], ["--max-early-ms must be a number of milliseconds >= 0", "got -5"]),
    (["--max-early-ms", "nan"], ["--max-early-ms"]),
    (["--bits", "0,31"], ["--bits must be integers from 0 to 30", "0,31"]),
    (["--bits", ","], ["--bits", "none"]),
    (["--partitions", "0"], ["--partitions must be >= 1"]),
    (["--stream-nacks", "-1"], ["--stream-nacks must be >= 1"]),
])
def test_plan_refuses_arguments_out_of_range_in_one_line(tmp_path, capsys, args, words):
    """Refused before the trace is read or Spark starts (the trace does not even exist)."""
    proc = run_main(capsys, "plan", str(tmp_path / "no-trace"), "--out", str(tmp_path / "plan"), *args)
    _one_line_error(proc, *words)
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize("args, words", [
    (["--start-ms", str((1 << 63) - 10)], ["ts_ms 9223372036854775", "2305843009213693951 (2^61 - 1 ms"]),
    (["--events", "1000", "--rate", "1e-13", "--start-ms", "0"], ["the last nack would reach ts_ms"]),
    (["--delay-ms", str(1 << 62)], ["delay_ms + delay_jitter_ms must be <= 2305843009213693951"]),
    (["--delay-ms", str(1 << 60), "--delay-jitter-ms", str(1 << 61)], ["delay_ms + delay_jitter_ms"]),
])
def test_trace_generate_refuses_times_beyond_what_plan_reads_and_says_the_limit(tmp_path, capsys, args, words):
    """ts_ms + delay_ms of every generated event must fit: a start near 2^63 used to give a trace whose
    plan read nonsense (an int64 overflow). Refused at once, the limit named."""
    proc = run_main(capsys, "trace", "generate", "--out", str(tmp_path / "t"), "--events", "10", *args)
    _one_line_error(proc, *words)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("args, words", [
    (["--x", "0"], ["--x (nacks per ms) must be integers >= 1", "got 0"]),
    (["--y", "31"], ["--y (precision bits) must be integers from 0 to 30"]),
    (["--shares", "1.5"], ["--shares must be numbers above 0 and at most 1", "1.5"]),
    (["--messages", "0"], ["--messages must be >= 1"]),
    (["--indexes", "BTree"], ["unknown index 'BTree'"]),
])
def test_sweep_refuses_a_bad_grid_in_one_line(capsys, args, words):
    _one_line_error(run_main(capsys, "sweep", *args), *words)


def test_plan_refuses_an_output_that_is_a_file(tmp_path, capsys):
    (tmp_path / "report").write_text("mine")
    proc = run_main(capsys, "plan", str(tmp_path / "no-trace"), "--out", str(tmp_path / "report"))
    _one_line_error(proc, "is a file: name a folder")


@pytest.mark.parametrize("args, words", [
    (["--events", "0"], ["trace: events must be >= 1, got 0"]),
    (["--events", "5", "--nack-share", "2"], ["trace: nack_share must be above 0 and at most 1, got 2.0"]),
    (["--events", "5", "--renack-share", "1"], ["trace: renack_share must be at least 0 and below 1"]),
])
def test_trace_generate_names_each_bad_option_with_its_limit(tmp_path, capsys, args, words):
    _one_line_error(run_main(capsys, "trace", "generate", "--out", str(tmp_path / "t"), *args), *words)


def test_the_main_help_lists_each_command_once():
    text = cli.build_parser().format_help()
    for command in ("demo", "bench", "trace", "plan", "sweep"):
        assert len(re.findall(rf"^\s+{command}\s", text, re.M)) == 1, text
