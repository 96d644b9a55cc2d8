"""The demo's table: every figure comes from the measured result; no Pulsar
import here (rendering is apart from running). Plain aligned text, or a rich
table and progress bars when rich is installed."""

from __future__ import annotations

from typing import Any, Optional

from .measure import BUILTIN, TRACKED

__all__ = ["HEADERS", "NOTE", "Section", "table_sections", "table_rows", "render_text", "RichProgress",
           "print_rich"]

HEADERS = ("scenario", "metric", "TrackedConsumer", "built-in nack")
NOTE = ("error = when the application received the redelivery − when it was due (nack time + requested "
        "delay), ms; + is late. TrackedConsumer: precision_bits=0.")

Row = tuple[str, str, str]  # (metric, TrackedConsumer, built-in)
Section = tuple[list[str], list[Row]]  # scenario description lines, rows


def _ms(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:+.0f}"


def _errors(e: dict[str, Any]) -> str:
    return "—" if not e["n"] else f"{_ms(e['p50'])} / {_ms(e['p99'])} / {_ms(e['max'])} ms"


def _workload(w: dict[str, Any]) -> Section:
    t, b = w[TRACKED], w[BUILTIN]
    steps = "/".join(map(str, w["tracked_delays_ms"]))

    def dead(side: dict[str, Any]) -> str:
        span = side["deliveries_per_dead_letter"]
        if span is None:
            return str(side["dead_lettered"])
        each = f"{span[0]}" if span[0] == span[1] else f"{span[0]}-{span[1]}"
        return f"{side['dead_lettered']} (after {each} deliveries)"

    def settle(side: dict[str, Any]) -> str:
        return f"{side['settle_s']} s" if side["settle_s"] is not None else f"{side['unsettled']} unsettled"

    def lag(side: dict[str, Any]) -> str:
        return _errors(side["first_delivery_lag_ms"]).replace("+", "")

    mem = t["memory"]
    failing = f"{w['fail_once']} / {w['fail_twice']} / {w['poison']}"
    return (["workload", f"{w['messages']} msgs at {w['rate']:g}/s", f"{w['fail_share']:.0%} fail"], [
        ("failing once / twice / always", failing, failing),
        ("nack delay", f"backoff {steps} ms", f"fixed {w['builtin_delay_ms']} ms"),
        ("nacks", str(t["nacks"]), str(b["nacks"])),
        ("redeliveries", str(t["redeliveries"]), str(b["redeliveries"])),
        (f"dead-lettered (max_redeliveries={w['max_redeliveries']})", dead(t), dead(b)),
        ("error p50 / p99 / max", _errors(t["error_ms"]), _errors(b["error_ms"])),
        ("first deliveries: publish→receive p50 / p99 / max", lag(t), lag(b)),
        ("every message settled after", settle(t), settle(b)),
        ("memory for pending nacks, stats()['nbytes'] peak", _memory(mem), "not exposed (C++)")])


def _memory(mem: dict[str, Any]) -> str:
    """The peak, its pending nacks, and the largest parts of it (results recorded before the consumer
    split its bytes give the peak alone)."""
    text = f"{mem['peak_nbytes']:,} B ({mem['pending_at_peak']} pending)"
    parts = {name: size for name, size in (mem.get("parts_at_peak") or {}).items() if size}
    if parts:
        text += ": " + ", ".join(f"{name.replace('_', ' ')} {size:,} B"
                                 for name, size in sorted(parts.items(), key=lambda item: -item[1]))
    return text


def _precision(p: dict[str, Any]) -> Section:
    t, b = p[TRACKED], p[BUILTIN]

    def abs_p99(x: dict[str, Any]) -> str:
        return "—" if not x["error_ms"]["n"] else f"{x['error_ms']['abs_p99']:.0f} ms"

    return ([f"precision {p['delay_ms'] / 1000:g} s", f"{p['n']} nacks in {p['waves']} waves"], [
        ("|error| p99", abs_p99(t), abs_p99(b)),
        ("error p50 / p99 / max", _errors(t["error_ms"]), _errors(b["error_ms"])),
        ("redelivered", f"{t['redeliveries']} of {p['n']}", f"{b['redeliveries']} of {p['n']}")])


def _steady(s: dict[str, Any]) -> Section:
    t, b = s[TRACKED], s[BUILTIN]

    def first(x: dict[str, Any]) -> str:
        at = x["first_redelivery_after_start_ms"]
        return "—" if at is None else f"{at} ms after start"

    def during(x: dict[str, Any]) -> str:
        # "due by its end" can be one or two short of those that came: arrivals may be a few ms early
        return f"{x['redelivered_during_stream']} ({x['due_during_stream']} due by its end)"

    overrun = s.get("builtin_overrun_ms", 0)
    return (["steady stream", f"a nack every {s['period_ms'][0]:g}-{s['period_ms'][1]:g} ms",
             f"for {s['stream_ms'] / 1000:g} s, delay {s['delay_ms']} ms"]
            + ([f"(built-in: {overrun} ms longer)"] if overrun else []), [
        ("nacks", str(t["nacks"]), str(b["nacks"])),
        ("redelivered during the stream", during(t), during(b)),
        ("first redelivery", first(t), first(b)),
        ("error p50 / p99 / max", _errors(t["error_ms"]), _errors(b["error_ms"]))])


def table_sections(result: dict[str, Any]) -> list[Section]:
    """The final table: per scenario, its description lines and its rows of
    ``(metric, TrackedConsumer, built-in)``; every figure measured in ``result``."""
    return [_workload(result["workload"]), *map(_precision, result["precision"]), _steady(result["steady_stream"])]


def table_rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """``(scenario, metric, TrackedConsumer, built-in)`` rows, the scenario's
    description spread over its first rows."""
    rows = []
    for lines, section in table_sections(result):
        for i, row in enumerate(section):
            rows.append((lines[i] if i < len(lines) else "", *row))
    return rows


def render_text(result: dict[str, Any]) -> str:
    """The table as plain aligned text (no rich needed)."""
    rows = [HEADERS, *table_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join([*lines, "", NOTE])


def print_rich(console: Any, title: str, result: dict[str, Any]) -> None:
    """The table with rich: one section per scenario."""
    from rich.table import Table

    table = Table(*HEADERS, title=title, title_justify="left", caption=NOTE, caption_justify="left")
    for column, style in zip(table.columns, ("bold", "", "green", "yellow")):
        column.style = style
    for lines, section in table_sections(result):
        for i, row in enumerate(section):
            table.add_row(lines[i] if i < len(lines) else "", *row, end_section=i == len(section) - 1)
    console.print(table)


class RichProgress:
    """One rich progress bar per scenario side, made on first report."""

    NAMES = {TRACKED: "TrackedConsumer", BUILTIN: "built-in nack"}

    def __init__(self, console: Any) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=console)
        self._tasks: dict[str, Any] = {}

    def __call__(self, task: str, completed: float, total: float) -> None:
        if task not in self._tasks:
            scenario, side = task.rsplit("/", 1)
            self._tasks[task] = self._progress.add_task(f"{scenario}: {self.NAMES.get(side, side)}",
                                                        total=max(total, 1))
        self._progress.update(self._tasks[task], completed=completed, total=max(total, 1))

    def __enter__(self) -> "RichProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._progress.stop()
