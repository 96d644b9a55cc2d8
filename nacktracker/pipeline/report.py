"""Write a plan's results: Parquet tables, a Markdown report and a PNG plot.

All outputs are small (one row per consumer and bits) and written by the
driver with pyarrow/matplotlib, so ``--out`` is a local directory even when
the job ran on a cluster.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from .plan import PlanResult

__all__ = ["write_outputs", "markdown", "plot"]

_TOP = 20  # consumers listed in the Markdown report (all of them are in the Parquet)


def _mb(n: float) -> str:
    if n >= 10 * 2**20:
        return f"{n / 2**20:,.0f} MB"
    if n >= 2**20:
        return f"{n / 2**20:,.1f} MB"
    if n >= 2**10:
        return f"{n / 2**10:,.1f} KB"
    return f"{n:,.0f} B"


def _ms(n: float) -> str:
    if n >= 60_000:
        return f"{n / 60_000:.1f} min"
    if n >= 1000:
        return f"{n / 1000:.2f} s"
    return f"{n:,.0f} ms"


def _span(result: PlanResult) -> str:
    firsts = [c["first_ms"] for c in result.trace.consumers.values()]
    lasts = [c["last_ms"] for c in result.trace.consumers.values()]
    start = _dt.datetime.fromtimestamp(min(firsts) / 1000, _dt.timezone.utc)
    return f"{_ms(max(lasts) - min(firsts))} starting {start:%Y-%m-%d %H:%M:%S} UTC"


def markdown(result: PlanResult) -> str:
    """The report as Markdown (also printed by ``nacktracker plan``)."""
    t = result.trace
    fleet = result.fleet.set_index("bits")
    rec = result.recommended
    word = "early" if result.rounding == "floor" else "late"
    lines = [f"# nacktracker plan: `{t.path}`", ""]
    lines.append(
        f"{t.rows:,} events ({t.kinds.get('nack', 0):,} nack, {t.kinds.get('redeliver', 0):,} redeliver, "
        f"{t.kinds.get('dead_letter', 0):,} dead_letter) from {len(t.consumers):,} consumers over "
        f"{_span(result)}. Candidates: precision_bits {', '.join(map(str, result.bits))}, "
        f"rounding `{result.rounding}`; bound: p99 redelivery error <= {result.max_early_ms:g} ms.")
    lines += ["", "## Recommendation", ""]
    if rec is None:
        low = min(result.bits)
        lines.append(
            f"**No candidate meets the bound**: even precision_bits={low} has a fleet p99 error of "
            f"{fleet.loc[low, 'err_p99']:,} ms. Use the smallest bits ({low}), add smaller candidates, "
            f"or relax `--max-early-ms`.")
    else:
        f = fleet.loc[rec]
        dict_ratio = f["dict_index_bytes"] / f["index_bytes"] if f["index_bytes"] else float("nan")
        lines.append(
            f"**precision_bits = {rec}** (buckets of {1 << rec:,} ms) for the whole fleet: the largest "
            f"candidate whose p99 redelivery error ({_ms(f['err_p99'])} {word}) stays within "
            f"{result.max_early_ms:g} ms. At that setting the trackers hold at most "
            f"**{_mb(f['index_bytes'])}** for {int(f['peak_pending']):,} pending nacks (sum of per-consumer "
            f"peaks, {f['bytes_per_pending']:.2f} B each), against {_mb(f['dict_index_bytes'])} for a "
            f"per-message dict (DictIndex): {dict_ratio:,.1f}x {'less' if dict_ratio >= 1 else 'more'}.")
        per = result.consumers[result.consumers["recommended"]]
        other = per[per["bits"] != rec]
        missing = sorted(set(result.consumers["consumer"]) - set(per["consumer"]))
        if other.empty and not missing:
            lines.append("Every consumer on its own gets the same recommendation.")
        else:
            if not other.empty:
                lines.append(f"{len(other):,} consumers on their own would take another value "
                             "(see the consumer table).")
            if missing:
                lines.append(f"{len(missing):,} consumers miss the bound at every candidate: "
                             f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}.")
    lines += ["", "## Fleet, per precision", "",
              "| bits | bucket | peak pending (Σ) | tracker memory (Σ peaks) | B / pending | bitmaps "
              f"| DictIndex (est.) | error p50 / p99 / max ({word}) |",
              "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for bits, f in fleet.iterrows():
        mark = " **<-**" if bits == rec else ""
        bpp = f"{f['bytes_per_pending']:.2f}" if f["peak_pending"] else "-"
        lines.append(
            f"| {bits}{mark} | {_ms(1 << bits)} | {int(f['peak_pending']):,} | {_mb(f['index_bytes'])} | {bpp} "
            f"| {int(f['bitmaps']):,} | {_mb(f['dict_index_bytes'])} | {_ms(f['err_p50'])} / "
            f"{_ms(f['err_p99'])} / {_ms(f['err_max'])} |")
    lines += _consumer_table(result)
    c = result.costs
    lines += ["", "## How to read this", "",
              "- **Peak pending**: the most nacks a consumer's tracker holds at once. A nack at `ts` with "
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
              f"the error is that minus its due time, over all nacks. With `{result.rounding}` rounding it "
              f"is never {'late' if result.rounding == 'floor' else 'early'}. It leaves out the timer's "
              "and the broker's own latency.",
              ""]
    s = result.seconds
    lines.append(f"_Spark master `{result.master}`, {result.partitions} partitions; "
                 f"{s.get('total', 0):.1f} s (validate {s.get('validate', 0):.1f} s, analyse "
                 f"{s.get('analyse', 0):.1f} s, fleet errors {s.get('fleet', 0):.1f} s)._")
    return "\n".join(lines) + "\n"


def _consumer_table(result: PlanResult) -> list[str]:
    df = result.consumers
    rec = result.recommended if result.recommended is not None else min(result.bits)
    at = df[df["bits"] == rec].sort_values("index_bytes", ascending=False)
    own = df[df["recommended"]].set_index("consumer")["bits"]
    n = len(at)
    title = f"## Consumers at precision_bits={rec}"
    if n > _TOP:
        title += f" (top {_TOP} of {n:,} by memory; all in consumers.parquet)"
    lines = ["", title, "",
             "| consumer | nacks | peak pending | tracker memory | B / pending | DictIndex (est.) "
             "| error p99 | own best bits |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for _, r in at.head(_TOP).iterrows():
        bpp = f"{r['bytes_per_pending']:.2f}" if r["peak_pending"] else "-"
        best = own.get(r["consumer"])
        lines.append(
            f"| {r['consumer']} | {int(r['nacks']):,} | {int(r['peak_pending']):,} | {_mb(r['index_bytes'])} "
            f"| {bpp} | {_mb(r['dict_index_bytes'])} | {_ms(r['err_p99'])} "
            f"| {'none' if best is None else int(best)} |")
    return lines


def plot(result: PlanResult, path: str | Path) -> Path:
    """Memory (fleet, log scale) and redelivery error against bits, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = result.fleet.sort_values("bits")
    fig, (mem, err) = plt.subplots(1, 2, figsize=(11, 4.2))
    mem.plot(f["bits"], f["index_bytes"] / 2**20, "o-", label="TimeBucketIndex (Σ peaks)")
    mem.plot(f["bits"], f["dict_index_bytes"] / 2**20, "s--", label="DictIndex (est.)")
    mem.set_yscale("log")
    mem.set_xlabel("precision_bits")
    mem.set_ylabel("MB at peak")
    mem.set_title("Tracker memory, fleet")
    mem.grid(True, which="both", alpha=0.3)
    mem.legend()
    for q, style in (("err_p50", "o-"), ("err_p99", "s-"), ("err_max", "^:")):
        err.plot(f["bits"], f[q].clip(lower=0.5), style, label=q.replace("err_", ""))
    err.axhline(result.max_early_ms, color="red", lw=1, ls="--", label=f"bound {result.max_early_ms:g} ms")
    err.set_yscale("log")
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


def write_outputs(result: PlanResult, out_dir: str | Path) -> dict[str, Path]:
    """Write ``consumers.parquet``, ``fleet.parquet``, ``fleet_errors.parquet``,
    ``report.md`` and ``plot.png`` into ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "consumers": out / "consumers.parquet", "fleet": out / "fleet.parquet",
        "fleet_errors": out / "fleet_errors.parquet", "report": out / "report.md", "plot": out / "plot.png",
    }
    result.consumers.to_parquet(paths["consumers"], index=False)
    result.fleet.to_parquet(paths["fleet"], index=False)
    result.fleet_errors.to_parquet(paths["fleet_errors"], index=False)
    paths["report"].write_text(markdown(result), encoding="utf-8")
    plot(result, paths["plot"])
    return paths
