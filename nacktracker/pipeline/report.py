"""Write a plan's results: Parquet, CSV and Markdown tables, the report, plots.

The Markdown files summarise whatever the fleet's size: the recommendation,
the distribution of per-consumer peaks and memory, and the consumers with the
most memory (at most :data:`_MD_CONSUMERS` in ``consumers.md``, :data:`_TOP`
in ``report.md``). Every consumer at every candidate goes to
``consumers.parquet`` and ``consumers.csv``. Written by the driver with
pyarrow/matplotlib, so ``--out`` is a local directory even when the job ran
on a cluster.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .plan import PlanResult

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["write_outputs", "markdown", "consumer_table", "consumer_markdown", "plot", "plot_pending"]

_TOP = 20  # consumers in report.md
_MD_CONSUMERS = 100  # consumers in consumers.md (all of them in consumers.csv/.parquet)
_LINES = 8  # consumers drawn one by one in pending.png
#: Column order of consumers.csv/.parquet: the figures people read first.
_TABLE_ORDER = ("consumer", "bits", "bucket_ms", "nacks", "peak_pending", "peak_at_utc", "peak_at_ms",
                "index_bytes", "bytes_per_pending", "dict_index_bytes", "bitmaps", "buckets", "ledgers",
                "roaring_bytes", "err_p50", "err_p90", "err_p99", "err_max", "err_mean", "within_bound",
                "recommended", "own_best_bits")


def _mb(n: float) -> str:
    if n >= 10 * 2**20:
        return f"{n / 2**20:,.0f} MB"
    if n >= 2**20:
        return f"{n / 2**20:,.1f} MB"
    if n >= 2**10:
        return f"{n / 2**10:,.1f} KB"
    return f"{n:,.0f} B"


def _ms(n: float) -> str:
    """A duration, rounded for reading (bucket sizes, spans)."""
    if n >= 60_000:
        return f"{n / 60_000:.1f} min"
    if n >= 1000:
        return f"{n / 1000:.2f} s"
    return f"{n:,.0f} ms"


def _err(n: float) -> str:
    """An error figure in exact milliseconds: a bound is judged to the ms."""
    return f"{n:,.0f} ms"


def _span(result: PlanResult) -> str:
    firsts = [c["first_ms"] for c in result.trace.consumers.values()]
    lasts = [c["last_ms"] for c in result.trace.consumers.values()]
    start = _dt.datetime.fromtimestamp(min(firsts) / 1000, _dt.timezone.utc)
    return f"{_ms(max(lasts) - min(firsts))} starting {start:%Y-%m-%d %H:%M:%S} UTC"


def _candidates(result: PlanResult) -> list[str]:
    """Each candidate against the bound, with its figure: why it was taken or not."""
    fleet: Any = result.fleet.set_index("bits")  # Any: pandas-stubs type a row's cells as Series too
    bound = result.max_early_ms
    word = "early" if result.rounding == "floor" else "late"
    rec = result.recommended
    lines = []
    for bits, f in fleet.iterrows():
        p99 = f["err_p99"]
        figure = f"fleet p99 error {_err(p99)} {word}"
        if p99 > bound:
            verdict = f"**rejected**: {figure} > bound {_err(bound)} ({_err(p99 - bound)} over)"
        elif bits == rec:
            verdict = f"**recommended**: {figure} <= bound {_err(bound)} ({_err(bound - p99)} to spare)"
        else:
            verdict = f"within the bound ({figure} <= {_err(bound)})"
            if rec is not None:  # not taken: the rule is the largest bits within the bound, whatever the memory
                verdict += (f"; bits {rec} is the largest within it, with "
                            f"{_compare_bytes(fleet.loc[rec, 'index_bytes'], f['index_bytes'])}")
        lines.append(f"- bits {bits} ({_ms(1 << bits)} buckets, {_mb(f['index_bytes'])}): {verdict}")
    return lines


def _compare_bytes(theirs: float, mine: float) -> str:
    """``less memory (X B against Y B)``, ``more memory (...)`` or ``the same memory (X B)``: exact bytes,
    which the rounded figures of the list may not tell apart."""
    if theirs == mine:
        return f"the same memory ({int(theirs):,} B)"
    return f"{'less' if theirs < mine else 'more'} memory ({int(theirs):,} B against {int(mine):,} B)"


def _leaner(result: PlanResult) -> Optional[str]:
    """A sentence naming the candidate within the bound that holds less memory than the recommended one
    (the rule does not look at memory), or None when the recommended one holds the least."""
    fleet: Any = result.fleet.set_index("bits")  # Any: as in _candidates
    rec = result.recommended
    if rec is None:
        return None
    within = fleet[fleet["err_p99"] <= result.max_early_ms]
    least = within["index_bytes"].idxmin()
    if within.loc[least, "index_bytes"] >= fleet.loc[rec, "index_bytes"]:
        return None
    f, r = fleet.loc[least], fleet.loc[rec]
    error = ("a smaller" if f["err_p99"] < r["err_p99"] else "the same" if f["err_p99"] == r["err_p99"]
             else "a larger")
    return (f"precision_bits={least} is within the bound too and holds less memory "
            f"({int(f['index_bytes']):,} B against {int(r['index_bytes']):,} B), with {error} p99 error "
            f"({_err(f['err_p99'])}): the rule takes the largest bits within the bound and does not weigh memory.")


def markdown(result: PlanResult, table: Optional[pd.DataFrame] = None) -> str:
    """The report as Markdown (also printed by ``nacktracker plan``).
    ``table``: :func:`consumer_table` if already computed."""
    t = result.trace
    word = "early" if result.rounding == "floor" else "late"
    lines = [f"# nacktracker plan: `{t.path}`", ""]
    lines.append(
        f"{t.rows:,} events ({t.kinds.get('nack', 0):,} nack, {t.kinds.get('redeliver', 0):,} redeliver, "
        f"{t.kinds.get('dead_letter', 0):,} dead_letter) from {len(t.consumers):,} consumers over "
        f"{_span(result)}. Candidates: precision_bits {', '.join(map(str, result.bits))}, "
        f"rounding `{result.rounding}`; bound: p99 redelivery error <= {_err(result.max_early_ms)}.")
    lines += ["", "## Recommendation", "", *_recommendation(result, word)]
    lines += _fleet(result, word)
    n = result.consumers["consumer"].nunique()
    at = result.recommended if result.recommended is not None else min(result.bits)
    lines += ["", *distribution(result)]
    title = "## Consumers, every candidate"
    if n > _TOP:
        title += (f" (the {_TOP} of {n:,} with the most memory at precision_bits={at}; "
                  "every consumer in consumers.csv and consumers.parquet)")
    lines += ["", title, "", *consumer_markdown(result, top=_TOP, table=table)]
    if result.series is not None and len(result.series):
        lines += ["", f"Pending over time at precision_bits={result.series_bits}: the fleet's total in "
                      "pending_fleet.parquet, the busiest consumers' in pending.parquet, both drawn in "
                      "pending.png."]
    lines += _how_to_read(result)
    s = result.seconds
    lines.append(f"_Spark master `{result.master}`, {result.partitions} partitions; "
                 f"{s.get('total', 0):.1f} s (validate {s.get('validate', 0):.1f} s, analyse "
                 f"{s.get('analyse', 0):.1f} s, fleet errors {s.get('fleet', 0):.1f} s)._")
    return "\n".join(lines) + "\n"


def _recommendation(result: PlanResult, word: str) -> list[str]:
    """The recommended precision and what it holds, or why none meets the bound."""
    fleet: Any = result.fleet.set_index("bits")  # Any: as in _candidates
    rec = result.recommended
    lines: list[str] = []
    if rec is None:
        low = min(result.bits)
        lines.append(
            f"**No candidate meets the bound**: even precision_bits={low} has a fleet p99 error of "
            f"{_err(fleet.loc[low, 'err_p99'])}. Use the smallest bits ({low}), add smaller candidates, "
            f"or relax `--max-early-ms`.")
    else:
        f = fleet.loc[rec]
        dict_ratio = f["dict_index_bytes"] / f["index_bytes"] if f["index_bytes"] else float("nan")
        lines.append(
            f"**precision_bits = {rec}** (buckets of {1 << rec:,} ms) for the whole fleet: the largest "
            f"candidate whose p99 redelivery error ({_err(f['err_p99'])} {word}) stays within "
            f"{_err(result.max_early_ms)}. At that setting the trackers hold at most "
            f"**{_mb(f['index_bytes'])}** for {int(f['peak_pending']):,} pending nacks (sum of per-consumer "
            f"peaks, {f['bytes_per_pending']:.2f} B each), against {_mb(f['dict_index_bytes'])} for a "
            f"per-message dict (DictIndex): "
            f"{f'{dict_ratio:,.1f}x less' if dict_ratio >= 1 else f'{1 / dict_ratio:,.1f}x more'}.")
        leaner = _leaner(result)
        if leaner is not None:
            lines.append(leaner)
        per = result.consumers[result.consumers["recommended"]]
        other = per[per["bits"] != rec]
        missing = sorted(set(result.consumers["consumer"]) - set(per["consumer"]))
        if other.empty and not missing:
            lines.append("Every consumer on its own gets the same recommendation.")
        else:
            if not other.empty:
                lines.append(f"{len(other):,} consumers on their own would take another value "
                             "(column *own best* in the consumer tables).")
            if missing:
                lines.append(f"{len(missing):,} consumers miss the bound at every candidate: "
                             f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}.")
    return lines


def _fleet(result: PlanResult, word: str) -> list[str]:
    """Every candidate against the bound, then the fleet's table per precision."""
    fleet: Any = result.fleet.set_index("bits")  # Any: as in _candidates
    rec = result.recommended
    lines: list[str] = []
    lines += ["", "Every candidate against the bound:", "", *_candidates(result)]
    lines += ["", "## Fleet, per precision", "",
              "| bits | bucket | peak pending (Σ) | tracker memory (Σ peaks) | B / pending | bitmaps "
              f"| DictIndex (est.) | error p50 / p99 / max ({word}) |",
              "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for bits, f in fleet.iterrows():
        mark = " **<-**" if bits == rec else ""
        bpp = f"{f['bytes_per_pending']:.2f}" if f["peak_pending"] else "-"
        lines.append(
            f"| {bits}{mark} | {_ms(1 << bits)} | {int(f['peak_pending']):,} | {_mb(f['index_bytes'])} | {bpp} "
            f"| {int(f['bitmaps']):,} | {_mb(f['dict_index_bytes'])} | {_err(f['err_p50'])} / "
            f"{_err(f['err_p99'])} / {_err(f['err_max'])} |")
    return lines


def _how_to_read(result: PlanResult) -> list[str]:
    """What each column means and where its figures come from."""
    lines: list[str] = []
    c = result.costs
    lines += ["", "## How to read this", "",
              "- **Peak pending**: the most nacks a consumer's tracker holds at once, and **when** "
              "(UTC, the first instant it is reached). A nack at `ts` with "
              "`delay_ms` is pending from `ts` until its bucket fires (`(due >> bits) << bits`, "
              "due = ts + delay); nacks of one message into one bucket count once. The log holds no acks, "
              "so a nack counts until it fires; a consumer that acks a nacked message before it comes "
              "back holds fewer, so this is an upper bound. Fire times move with `bits`, so the peak "
              "does too (computed exactly for each value: a sweep over all start and fire times).",
              "- **Tracker memory**: `TimeBucketIndex.nbytes()` of the index a live tracker holds at the "
              "consumer's peak-pending instant (`nacktracker/pipeline/memory_model.py`): window arrays of "
              "8-byte sparse copies, real pyroaring bitmaps for the dense cells (runs of adds, the bucket "
              "at the front) and for the live-id set, plus the sizes of the same Python objects "
              f"(the model is within {c.max_model_error:.1%} of `nbytes()` on its live calibration builds). "
              "It is the memory at the count's peak, not a maximum over time: when pending messages spread "
              "over more buckets and ledgers at another moment, the index can be larger then. The "
              "tracker's own per-ledger bookkeeping is not counted. Fleet totals add per-consumer "
              "peaks, which need not coincide: an upper bound of what all trackers hold at one moment.",
              f"- **DictIndex (est.)**: a per-message dict (the client before PIP-393) measured in-process "
              f"at {c.dict_index_per_entry:.1f} B per pending message (`nbytes() / len()` of a "
              "100,000-message build), times the same peak pending.",
              f"- **Error**: each nack is redelivered at its bucket time (or at once, if that has passed); "
              f"the error is that minus its due time, over all nacks, in exact ms. With `{result.rounding}` "
              f"rounding it is never {'late' if result.rounding == 'floor' else 'early'}. It leaves out the "
              "timer's and the broker's own latency.",
              ""]
    return lines


def distribution(result: PlanResult) -> list[str]:
    """How per-consumer figures spread over the fleet, at the recommended bits
    (else the smallest): quantiles over consumers of peak pending, tracker
    memory, nacks and p99 error. A fixed number of lines, however many consumers."""
    import numpy as np

    at = result.recommended if result.recommended is not None else min(result.bits)
    df = result.consumers[result.consumers["bits"] == at]
    n = len(df)
    qs = (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))
    word = "early" if result.rounding == "floor" else "late"
    cols = (("peak pending", "peak_pending", lambda v: f"{int(v):,}"),
            ("tracker memory", "index_bytes", _mb),
            ("nacks", "nacks", lambda v: f"{int(v):,}"),
            (f"error p99 ({word})", "err_p99", _err))
    lines = [f"## Consumers, distribution at precision_bits={at}", "",
             f"Over the {n:,} consumers: each figure's value at the given share of consumers "
             "(p90: 90% of consumers are at or below it).", "",
             "| figure | " + " | ".join(q for q, _ in qs) + " | sum |",
             "|---|" + "---:|" * (len(qs) + 1)]
    for label, col, fmt in cols:
        values = np.sort(df[col].to_numpy(dtype=np.float64))
        cells = [fmt(values[min(n - 1, max(0, int(np.ceil(q * n)) - 1))]) if n else "-" for _, q in qs]
        total = fmt(values.sum()) if col != "err_p99" else "-"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {total} |")
    return lines


def consumer_table(result: PlanResult) -> pd.DataFrame:
    """Every consumer at every candidate (pandas), the columns of consumers.csv:
    the figures, the peak time in UTC, and whether the bits meets the bound."""
    import pandas as pd

    df = result.consumers.copy()
    df["bucket_ms"] = [1 << int(b) for b in df["bits"]]
    at = pd.to_datetime(df["peak_at_ms"].astype("float64"), unit="ms", utc=True)
    df["peak_at_utc"] = at.dt.strftime("%Y-%m-%d %H:%M:%S.%f").str[:-3].fillna("-")
    df["within_bound"] = df["err_p99"] <= result.max_early_ms
    own = df[df["recommended"]].set_index("consumer")["bits"]
    df["own_best_bits"] = df["consumer"].map(own).astype("Int64")
    first = [c for c in _TABLE_ORDER if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]]


def consumer_markdown(result: PlanResult, top: int | None = None, table: Optional[pd.DataFrame] = None) -> list[str]:
    """Markdown rows: consumer × bits (consumers by memory at the recommended bits)."""
    import pandas as pd

    df = consumer_table(result) if table is None else table
    at = result.recommended if result.recommended is not None else min(result.bits)
    order = df[df["bits"] == at].sort_values(["index_bytes", "consumer"], ascending=[False, True])["consumer"]
    rank = {name: i for i, name in enumerate(order.tolist()[:top] if top else order.tolist())}
    chosen = df[df["consumer"].isin(rank)].copy()
    chosen["_rank"] = chosen["consumer"].map(rank)
    chosen = chosen.sort_values(["_rank", "bits"])
    lines = ["| consumer | bits | nacks | peak pending | peak at (UTC) | tracker memory | B / pending "
             "| DictIndex (est.) | error p99 | within bound | own best |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|:---:|---:|"]
    rec = result.recommended
    r: Any  # a row of mixed columns: pandas-stubs type each cell as any scalar
    for r in chosen.itertuples(index=False):
        bpp = f"{r.bytes_per_pending:.2f}" if r.peak_pending else "-"
        best = "none" if pd.isna(r.own_best_bits) else int(r.own_best_bits)
        lines.append(
            f"| {r.consumer} | {r.bits}{' **<-**' if r.bits == rec else ''} | {int(r.nacks):,} "
            f"| {int(r.peak_pending):,} | {r.peak_at_utc} | {_mb(r.index_bytes)} | {bpp} "
            f"| {_mb(r.dict_index_bytes)} | {_err(r.err_p99)} | {'yes' if r.within_bound else 'no'} | {best} |")
    return lines


def plot(result: PlanResult, path: str | Path) -> Path:
    """Memory (fleet, log scale) and redelivery error against bits, side by side.

    The error axis is symmetric-log (linear below 1 ms): an error of 0 ms is
    drawn at 0, not lifted onto a log axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = result.fleet.sort_values("bits")
    fig, (mem, err) = plt.subplots(1, 2, figsize=(11, 4.2))
    for column, style, label in (("index_bytes", "o-", "TimeBucketIndex (Σ peaks)"),
                                 ("dict_index_bytes", "s--", "DictIndex (est.)")):
        y = f[column] / 2**20
        keep = y > 0  # a log axis has no 0: leave such points out rather than invent a value
        mem.plot(f["bits"][keep], y[keep], style, label=label)
    mem.set_yscale("log")
    mem.set_xlabel("precision_bits")
    mem.set_ylabel("MB at peak")
    mem.set_title("Tracker memory, fleet")
    mem.grid(True, which="both", alpha=0.3)
    mem.legend()
    for q, style in (("err_p50", "o-"), ("err_p99", "s-"), ("err_max", "^:")):
        err.plot(f["bits"], f[q], style, label=q.replace("err_", ""))
    err.axhline(result.max_early_ms, color="red", lw=1, ls="--", label=f"bound {result.max_early_ms:g} ms")
    err.set_yscale("symlog", linthresh=1.0)
    err.set_ylim(bottom=0)
    err.set_xlabel("precision_bits")
    err.set_ylabel("ms " + ("early" if result.rounding == "floor" else "late"))
    err.set_title("Redelivery error, all nacks")
    err.grid(True, which="both", alpha=0.3)
    err.legend()
    if result.recommended is not None:
        for ax in (mem, err):
            ax.axvline(result.recommended, color="green", lw=1, alpha=0.6)
    fig.suptitle(f"nacktracker plan: {Path(str(result.trace.path)).name}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_pending(result: PlanResult, path: str | Path) -> Path:
    """Pending over time at the recommended bits: the fleet total at each
    sample instant, and the busiest consumers' maximum per interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result.series
    assert s is not None, "a plan result has its series"
    fig, (fleet, per) = plt.subplots(1, 2, figsize=(11, 4.2))
    t0 = s["t_ms"].min()
    if result.fleet_series is not None and len(result.fleet_series):  # every consumer, summed in the tasks
        total = result.fleet_series.set_index("t_ms")["pending_at"]
    else:
        total = s.groupby("t_ms")["pending_at"].sum()
    fleet.plot((total.index - t0) / 1000, total.to_numpy(), "-")
    fleet.set_title(f"Fleet: pending at each instant (bits={result.series_bits})")
    fleet.set_xlabel("seconds into the trace")
    fleet.set_ylabel("pending nacks")
    fleet.grid(True, alpha=0.3)
    busiest = s.groupby("consumer")["pending_max"].max().sort_values(ascending=False).index[:_LINES]
    lines = dict(tuple(s[s["consumer"].isin(busiest)].groupby("consumer")))  # one pass, not one per line
    for name in busiest:
        g = lines[name]
        per.step((g["t_ms"] - t0) / 1000, g["pending_max"], where="post", label=name)
    per.set_title(f"Busiest {len(busiest)} consumers: maximum per interval")
    per.set_xlabel("seconds into the trace")
    per.set_ylabel("pending nacks")
    per.grid(True, alpha=0.3)
    per.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(result: PlanResult, out_dir: str | Path) -> dict[str, Path]:
    """Write the report and its tables into ``out_dir``; return their paths.

    ``consumers.parquet``/``.csv`` (every consumer × bits), ``consumers.md``
    (the distribution and the consumers with the most memory),
    ``fleet.parquet``, ``fleet_errors.parquet``, ``pending.parquet`` and
    ``pending.png`` (pending over time at the recommended bits),
    ``report.md`` and ``plot.png``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"consumers": out / "consumers.parquet", "consumers_csv": out / "consumers.csv",
             "consumers_md": out / "consumers.md", "fleet": out / "fleet.parquet",
             "fleet_errors": out / "fleet_errors.parquet", "pending": out / "pending.parquet",
             "pending_plot": out / "pending.png", "report": out / "report.md", "plot": out / "plot.png"}
    table = consumer_table(result)
    table.to_parquet(paths["consumers"], index=False)
    table.to_csv(paths["consumers_csv"], index=False)
    at = result.recommended if result.recommended is not None else min(result.bits)
    n = table["consumer"].nunique()
    shown = "All" if n <= _MD_CONSUMERS else f"The {_MD_CONSUMERS:,} of"
    paths["consumers_md"].write_text(
        f"# Consumers × precision_bits: `{result.trace.path}`\n\n" + "\n".join(distribution(result))
        + f"\n\n## Consumers with the most memory\n\n{shown} {n:,} consumers, by tracker memory at "
        f"precision_bits={at}; bound: p99 error <= {_err(result.max_early_ms)}. Every consumer at every "
        "candidate: consumers.csv and consumers.parquet.\n\n"
        + "\n".join(consumer_markdown(result, top=_MD_CONSUMERS, table=table)) + "\n",
        encoding="utf-8")
    result.fleet.to_parquet(paths["fleet"], index=False)
    result.fleet_errors.to_parquet(paths["fleet_errors"], index=False)
    if result.series is not None and len(result.series):
        result.series.to_parquet(paths["pending"], index=False)
        if result.fleet_series is not None:
            paths["pending_fleet"] = out / "pending_fleet.parquet"
            result.fleet_series.to_parquet(paths["pending_fleet"], index=False)
        plot_pending(result, paths["pending_plot"])
    else:
        del paths["pending"], paths["pending_plot"]
    paths["report"].write_text(markdown(result, table), encoding="utf-8")
    plot(result, paths["plot"])
    return paths
