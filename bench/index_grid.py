"""The index on real client traffic: the grid of issue 12, a fresh process per cell.

Traffic of one consumer: nacks arrive at ``rate`` per second, each message
``k`` entries after the previous nacked one of its ledger, round-robin over
``ledgers`` interleaved ledgers, each with its own delay: ``backoff`` (one of
1, 2, 4, 8, 16, 32, 60 s, equally likely: messages at every redelivery count)
or ``uniform`` (0.1-60 s). The driver plays it millisecond by millisecond like
a live tracker (adds, then ``pop_due`` whenever ``next_due_ms()`` has come)
for ``seconds`` of simulated time (60 s of delays fill, then steady state),
then measures in that process:

* memory: RSS growth since before the index was made (anonymous memory:
  ``rss_bytes``; the C heap's free pages given back first: ``trim_heap``), and ``nbytes()``, per
  pending message (both indexes hold exactly the same set at the end), and
  the growth after a second trim at the end (``rss_trimmed_per_pending``: how
  much of it was free heap the allocator kept);
* CPU per call at that steady state (thread CPU time, 25 rounds of 600
  calls, timed while no other cell of the run plays: :func:`machine_to_itself`):
  ``add`` (the stream goes on), ``discard`` of a pending id (hit) and of an
  id that is not pending (miss: a message between two nacked ones, what
  every ``acknowledge`` does), for the index and, side by side in the same
  process, a DictIndex copy of its pending set (``dict_*_ns``). Each
  one's best round is its figure; the ratios the targets check are the
  median over rounds of the two in the same round (``*_vs_dict``:
  :func:`side_by_side`).

DictIndex also runs the same cell in its own fresh process, in the same run,
for its memory (which does not depend on ``bits``: once per cell). Its pops
come from a scan every 2 s instead of every ms (a scan is O(n)); the end
state is the same.

Three scenarios beside the grid:

* ``flatness``: discard-miss CPU at 30k, 100k and 300k pending (bits 0);
* ``parked``: one nack parked for an hour, then 10,000 nacks/s for 90 s:
  the longest single ``add`` and ``pop_due`` (the timer callback's work).
* ``listed_miss``: one ledger with 8 listed dense cells (seed 000's bursts),
  discard-miss CPU of ids never nacked (results.json only).

    python -m bench.index_grid --out bench/results/index-grid    # full: ~11 min on 2 free cores
    python -m bench.index_grid --quick --out /tmp/grid            # seconds (the test runs it)
"""

from __future__ import annotations

import argparse
import array
import contextlib
import fcntl
import gc
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import index_grid_report as report
from bench import run_module

REPEATS = 5  # per-call timings: best of this many chunks
#: ``side_by_side``: rounds of ``calls`` each on the index and its DictIndex
#: copy (15,000 calls each in all): many short rounds give the best round
#: more chances to land in a quiet moment than five of 3,000 did, and the
#: median of the per-round ratios more rounds to settle on.
SIDE_CHUNKS = 25
BACKOFF_MS = (1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000)
FULL = dict(delays=("backoff", "uniform"), ks=(1, 3, 8, 20), ledgers=(1, 16),
            rates=(10, 100, 1_000, 10_000), bits=(0, 4, 8, 10), seconds=70)
QUICK = dict(delays=("uniform",), ks=(3,), ledgers=(16,), rates=(1_000,), bits=(0, 8), seconds=4,
             target_pending=2_000)
# 50,000 pending per cell. The RSS per pending message of a cell depends on how
# many indexes share its process, not only on the index: at 200,000 (4x the
# replicas) the 1,000/s cells read closer to nbytes() and the 10/s cells
# further from it (bench/results/index-grid/HISTORY.md, "At 200,000 pending")
FULL["target_pending"] = 50_000


@dataclass(frozen=True)
class Cell:
    """One traffic shape of the grid."""

    delays: str
    k: int
    ledgers: int
    rate: int
    seconds: int

    def label(self) -> str:
        return report.cell_label(asdict(self))


class Traffic:
    """The nack stream of a cell, generated on the fly (no per-message state,
    so the driver adds nothing to the RSS being measured)."""

    def __init__(self, cell: Cell, seed: int = 1) -> None:
        self.cell = cell
        self.rng = random.Random(seed)
        # an array, not a list: the next ids grow past CPython's shared small
        # ints, and a list would hold an int object per ledger made after the
        # RSS baseline, driver state charged to the index
        self.next_entry = array.array("q", bytes(8 * cell.ledgers))
        self.i = 0

    def delay(self) -> int:
        if self.cell.delays == "backoff":
            return BACKOFF_MS[self.rng.randrange(len(BACKOFF_MS))]
        return self.rng.randint(100, 60_000)

    def nack(self) -> tuple[int, int, int]:
        """``(ledger_id, entry_id, delay_ms)`` of the next nack."""
        j = self.i % self.cell.ledgers
        self.i += 1
        entry = self.next_entry[j]
        self.next_entry[j] = entry + self.cell.k
        return 1_000_000 + 7 * j, entry, self.delay()

    def per_ms(self, t_ms: int) -> int:
        """Nacks arriving during millisecond ``t_ms`` (an even spread)."""
        r = self.cell.rate
        return (t_ms + 1) * r // 1000 - t_ms * r // 1000


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim``)
    before the RSS baseline. Without it the indexes first reuse pages the
    warm-up freed, which were resident already: their growth was undercounted
    by an amount that depends on the heap's layout at import (adding an unused
    class to the index moved backoff k=3 L=16 10/s bits 0 from 64.5 to 63.0
    B/pending, dropping two slots of a record it never creates to 70.4; with
    the trim all three read 74.5-74.7). A no-op where glibc is absent."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def fill_numpy_cache() -> None:
    """Fill numpy's per-process cache of freed small data blocks before the
    RSS baseline. numpy keeps up to 7 freed blocks of every size under 1 KiB
    for reuse and never gives them back (~3.7 MB at most, whoever used numpy:
    a process that has run for a while holds it full). The index's pops make
    numpy temporaries of many sizes, so without this a cell's growth included
    the cache filling up (uniform k=3 L=1 1000/s bits 0, ``--one``: 27.3 B/pending
    without the fill, 22.5 with it; ``nbytes()`` 9.6 both)."""
    import numpy as np

    for size in range(1, 1024):
        blocks = [np.empty(size, np.uint8) for _ in range(8)]
        del blocks


def fill_malloc_cache() -> None:
    """Fill glibc's per-thread cache of freed small chunks (tcache: up to 7
    of every size up to 1,032 bytes, kept as in use, never trimmed) before
    the RSS baseline, as :func:`fill_numpy_cache` does numpy's: a process that
    has run for a while holds it full, and a cell that filled it counted up to
    ~230 KB (about 4 B/pending at 50,000 pending) that no index holds
    (mallinfo2's bytes in use after every index of a cell was deleted: 3.5-4.4
    B/pending). A no-op where glibc is absent."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    for size in range(8, 1041, 16):
        chunks = [libc.malloc(size) for _ in range(7)]
        for p in chunks:
            libc.free(p)


def rss_bytes() -> int:
    """Resident anonymous memory of this process (``RssAnon`` in
    /proc/self/status: the heap, memory maps, pymalloc's arenas), falling
    back to all of RSS where that line is missing. Not the file-backed part:
    pages of a shared library's code count in RSS once first run, and the
    cells' traffic runs numpy code the warm-up had not (320 KB of numpy's
    ``_multiarray_umath`` in backoff k=1 L=1 1000/s, bits 0: 6 B/pending,
    the same whether the index or anything else ran it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _per_call_ns(chunks: list[list[tuple]]) -> float:
    """CPU ns per call, the best of several chunks: each chunk is a list of
    ``(bound method, *args)``; thread CPU time, so preemption by other
    processes on a shared machine does not count (the minimum drops what
    noise is left), with the garbage collector off as in bench/throughput.py."""
    best = float("inf")
    gc.disable()
    try:
        for chunk in chunks:
            if not chunk:
                continue
            t = time.thread_time_ns()
            for fn, *args in chunk:
                fn(*args)
            best = min(best, (time.thread_time_ns() - t) / len(chunk))
    finally:
        gc.enable()
    return best


#: The grid's lock file (set by :func:`run` for the cells it starts).
LOCK_ENV = "NACKTRACKER_GRID_LOCK"


@contextlib.contextmanager
def machine_to_itself(exclusive: bool):
    """Cells of one run play their traffic side by side (shared lock) but
    time their calls alone (exclusive): with two cells on two cores, the
    other cell's play slowed the timed calls of the index more than those of
    its DictIndex copy (the ``add`` ratio of backoff k=20 L=1 100/s bits 10:
    2.89 in a run, 1.61 and 1.78 alone). The shared part covers a cell's
    imports, and ``--one`` leaves without tearing down (``os._exit``), so
    what runs unlocked is an interpreter's start. A cell's play never waits
    on a timing for long (a timing is under a second). No lock outside a run."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _warm_up(cls, cell: Cell, bits: int) -> None:
    """Run every code path once on a throwaway index, so one-time costs
    (numpy's first sort, interpreter caches) are not counted as the index's."""
    idx, traffic = cls(precision_bits=bits), Traffic(cell, seed=99)
    for i in range(2_000):
        ledger, entry, delay = traffic.nack()
        idx.add(ledger, entry, i + delay % 1_000)
        if i % 50 == 0:
            idx.pop_due(i)
            idx.next_due_ms()
        idx.discard(ledger, entry + 1)
    idx.pop_due(10**6)
    idx.nbytes()
    fill_numpy_cache()
    fill_malloc_cache()


def replicas_for(cell: Cell, target_pending: int) -> int:
    """Independent consumers per process, so small cells rise above page noise."""
    mean_delay_s = sum(BACKOFF_MS) / len(BACKOFF_MS) / 1000 if cell.delays == "backoff" else 30.05
    return max(1, round(target_pending / (cell.rate * mean_delay_s)))


def measure_cell(index: str, cell: Cell, bits: int, target_pending: int = 100_000, calls: int = 600) -> dict:
    """Play a cell in this process and measure it (run it in a fresh one).

    Low-rate cells run ``replicas_for`` independent consumers (each its own
    index and stream) so RSS growth is well above page granularity; figures
    are per pending message over all of them, per-call CPU is replica 0's.
    """
    with machine_to_itself(exclusive=False):  # imports too: numpy's is most of a process's start
        import nacktracker

        cls = getattr(nacktracker, index)
        row = _play(cls, index, cell, bits, replicas_for(cell, target_pending))
    if index == "TimeBucketIndex":  # pops as its timer would, timed against a DictIndex copy
        with machine_to_itself(exclusive=True):
            row.update(side_by_side(row.pop("indexes")[0], row.pop("stream"), cell, row.pop("now"), calls))
    for key in ("indexes", "stream", "now"):
        row.pop(key, None)
    return row


def _play(cls, index: str, cell: Cell, bits: int, n: int) -> dict:
    """Play a cell's traffic into ``n`` fresh indexes; their memory figures,
    and what :func:`side_by_side` needs (the indexes, replica 0's stream,
    the end time)."""
    t0 = 1_000_000_000
    _warm_up(cls, cell, bits)
    # the driver's own state (streams, lists) exists before the baseline: only the indexes grow RSS
    streams = [Traffic(cell, seed=j + 1) for j in range(n)]
    live = index == "TimeBucketIndex"  # pops as its timer would; the dict baseline scans every 2 s
    due_at: list = [None] * n
    indexes: list = []
    gc.collect()
    trim_heap()
    before = rss_bytes()
    indexes.extend(cls(precision_bits=bits) for _ in range(n))
    end = cell.seconds * 1000
    arrivals = cell.rate * cell.seconds
    next_scan = 0
    for i in range(arrivals):
        now = t0 + i * 1000 // cell.rate
        if not live and now >= next_scan:
            for idx in indexes:
                idx.pop_due(now)
            next_scan = now + 2_000
        for j in range(n):
            idx = indexes[j]
            if live and due_at[j] is not None and due_at[j] <= now:
                idx.pop_due_bitmaps(now)
                due_at[j] = None
            ledger, entry, delay = streams[j].nack()
            idx.add(ledger, entry, now + delay)
            if live and (due_at[j] is None or now + delay < due_at[j]):
                due_at[j] = idx.next_due_ms()
    now = t0 + end
    for idx in indexes:
        idx.pop_due(now)  # both indexes now hold exactly the nacks due after `now`
    gc.collect()
    grown = rss_bytes() - before
    trim_heap()  # what of the growth is free-but-resident heap (not the reading above: a real process holds it)
    grown_trimmed = rss_bytes() - before
    nbytes, pending = sum(i.nbytes() for i in indexes), sum(map(len, indexes))
    return {
        "index": index, **asdict(cell), "bits": bits, "replicas": n, "pending": pending, "nbytes": nbytes,
        "rss_growth": grown, "nbytes_per_pending": nbytes / max(1, pending),
        "rss_per_pending": grown / max(1, pending),
        "rss_trimmed_per_pending": grown_trimmed / max(1, pending),
        "indexes": indexes, "stream": streams[0], "now": now,
    }


def side_by_side(first, stream: Traffic, cell: Cell, now: int, calls: int) -> dict:
    """CPU per call of ``first`` (replica 0, after the memory reading) and of a
    DictIndex holding exactly its pending set, in this process, in rounds:
    each round times one chunk of calls on both, one right after the other
    (the index first in even rounds, the dict first in odd ones), so both
    see the same calls at nearly the same moment. Each gets the same
    arguments: the stream's next nacks (``add``), ids between two nacked
    ones, never pending (``discard`` miss), and ids just nacked into both
    (``discard`` hit).

    Per operation: ``<op>_ns`` and ``dict_<op>_ns``, each one's best round
    (what a call costs on a quiet machine), and ``<op>_vs_dict``, the median
    over rounds of the index's time over the dict's in that round: the
    ratio the targets check. A ratio of the two best rounds is not one: the
    machine's speed changes by up to 1.8x from moment to moment, and two
    bests may come from different moments: six ``--one`` runs of uniform
    k=8 L=16 100/s bits 4 read 1,335-2,422 ns per index ``add`` and
    1.72-1.89x the dict's, where a whole grid run had read 2.64x
    (bench/results/index-grid/HISTORY.md)."""
    import nacktracker

    twin = nacktracker.DictIndex(precision_bits=first.precision_bits)
    for bucket, ledger, ids in first.iter_bitmaps():
        for e in ids:
            twin.add(ledger, e, bucket)  # a bucket time maps to itself
    if len(twin) != len(first):
        raise AssertionError(f"DictIndex copy holds {len(twin)} of {len(first)}")
    pending = len(twin)
    both = (first, twin)
    adds = [[lg, e, now + d] for lg, e, d in (stream.nack() for _ in range(SIDE_CHUNKS * calls))]
    miss = [(lg, e + 1 if cell.k > 1 else e + 10**9) for lg, e, _ in adds[:calls]]
    hits = [(lg, e) for lg, e, _ in (stream.nack() for _ in range(SIDE_CHUNKS * calls))]
    out: dict = {"timed_pending": pending}
    for name, rows, prepare in (("add", adds, None), ("discard_miss", miss, None), ("discard_hit", hits, "add")):
        times: tuple[list[float], list[float]] = ([], [])
        for r in range(SIDE_CHUNKS):
            chunk = rows[r * calls:(r + 1) * calls] if len(rows) > calls else rows
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                idx = both[i]
                if prepare:
                    for lg, e in chunk:
                        idx.add(lg, e, now + 30_000)
                method = getattr(idx, "add" if name == "add" else "discard")
                times[i].append(_per_call_ns([[(method, *args) for args in chunk]]))
        out[f"{name}_ns"], out[f"dict_{name}_ns"] = min(times[0]), min(times[1])
        out[f"{name}_vs_dict"] = statistics.median(a / b for a, b in zip(*times))
    return out


def flatness(sizes=(30_000, 100_000, 300_000), calls: int = 20_000, rounds: int = 3 * REPEATS) -> list[dict]:
    """Discard-miss CPU per call at growing pending counts (bits 0, 16
    ledgers, uniform). Every index of every size is built first, then their
    chunks are timed in turn (each index at each size, ``rounds`` times over),
    the best chunk of each kept: a ratio between sizes is read side by side,
    so a slow spell of the machine does not land on one size only (timed one
    size after the other, one run read 1,669 ns at 100k and 814 at 300k)."""
    import nacktracker

    built = []
    for index in ("TimeBucketIndex", "DictIndex"):
        for n in sizes:
            traffic = Traffic(Cell("uniform", 3, 16, 1000, 0))
            idx = getattr(nacktracker, index)(precision_bits=0)
            nacks = [traffic.nack() for _ in range(n)]
            for lg, e, d in nacks:
                idx.add(lg, e, 1_000_000 + d)
            misses = [(idx.discard, lg, e + 1) for lg, e, _ in nacks[:: max(1, n // calls)]]
            built.append((index, idx, misses))
    best = [float("inf")] * len(built)
    for _ in range(rounds):
        for i, (_, _, misses) in enumerate(built):
            best[i] = min(best[i], _per_call_ns([misses]))
    return [{"index": index, "pending": len(idx), "discard_miss_ns": b} for (index, idx, _), b in zip(built, best)]


def listed_miss(cells: int = 8, run: int = 8_000, calls: int = 4_000) -> list[dict]:
    """Seed 000's bursts on one ledger: ``cells`` buckets (bits 10) of ``run``
    even ids each, so the ledger keeps that many listed dense cells (up to
    ``LISTED``), then acks of odd ids never nacked, spread over every cell's
    range and the gaps between them: discard-miss CPU per call, DictIndex beside it."""
    import nacktracker

    rows = []
    for index in ("TimeBucketIndex", "DictIndex"):
        idx = getattr(nacktracker, index)(precision_bits=10)
        for b in range(cells):
            for e in range(b * 2 * run, b * 2 * run + run, 2):
                idx.add(7, e, 100_000 + b * 1024)
        top = cells * 2 * run
        misses = [(idx.discard, 7, e) for e in range(1, top, max(3, top // calls) | 1)]
        rows.append({"index": index, "listed_cells": cells, "discard_miss_ns": _per_call_ns([misses] * REPEATS)})
    return rows


def parked(rate: int = 10_000, seconds: int = 90, bits: int = 0) -> dict:
    """One nack parked for an hour, then ``rate`` nacks/s: the longest single
    ``add`` and ``pop_due`` (as the tracker's timer calls it: pop, then
    ``next_due_ms``), as CPU time of this thread (what the index costs the
    event loop) and as wall time (which also counts preemption by other
    processes on a shared machine)."""
    import nacktracker

    idx = nacktracker.TimeBucketIndex(precision_bits=bits)
    traffic = Traffic(Cell("uniform", 1, 16, rate, seconds))
    t0 = 1_000_000_000
    idx.add(1, 1, t0 + 3_600_000)
    idx.next_due_ms()
    worst = {"add_cpu": 0.0, "add_wall": 0.0, "pop_cpu": 0.0, "pop_wall": 0.0}
    adds = pops = 0
    cpu, wall = time.thread_time, time.perf_counter
    gc.disable()
    try:
        due_at = None
        for t in range(seconds * 1000):
            now = t0 + t
            for _ in range(traffic.per_ms(t)):
                ledger, entry, delay = traffic.nack()
                c, w = cpu(), wall()
                idx.add(ledger, entry, now + delay)
                worst["add_cpu"] = max(worst["add_cpu"], cpu() - c)
                worst["add_wall"] = max(worst["add_wall"], wall() - w)
                adds += 1
                if due_at is not None and now + delay < due_at:
                    due_at = None
            if due_at is None or due_at <= now:
                c, w = cpu(), wall()
                idx.pop_due_bitmaps(now)
                due_at = idx.next_due_ms()
                worst["pop_cpu"] = max(worst["pop_cpu"], cpu() - c)
                worst["pop_wall"] = max(worst["pop_wall"], wall() - w)
                pops += 1
    finally:
        gc.enable()
    return {"rate": rate, "seconds": seconds, "bits": bits, "adds": adds, "pops": pops, "pending": len(idx),
            "max_add_ms": worst["add_cpu"] * 1e3, "max_pop_ms": worst["pop_cpu"] * 1e3,
            "max_add_wall_ms": worst["add_wall"] * 1e3, "max_pop_wall_ms": worst["pop_wall"] * 1e3,
            "loadavg": os.getloadavg()}


# -- running the grid ------------------------------------------------------------------

def _fresh(args: list[str]) -> dict:
    return json.loads(run_module("bench.index_grid", *args).stdout.strip().splitlines()[-1])


def configurations(spec: dict) -> list[tuple[str, Cell, int]]:
    out = []
    for delays, k, ledgers, rate in itertools.product(spec["delays"], spec["ks"], spec["ledgers"], spec["rates"]):
        cell = Cell(delays, k, ledgers, rate, spec["seconds"])
        out.append(("DictIndex", cell, 0))
        out.extend(("TimeBucketIndex", cell, bits) for bits in spec["bits"])
    return out


def run(quick: bool = False, workers: int = 2, progress=None) -> dict:
    spec = QUICK if quick else FULL
    configs = configurations(spec)
    load = os.getloadavg()

    def one(cfg):
        index, cell, bits = cfg
        row = _fresh(["--one", index, json.dumps(asdict(cell)), str(bits), str(spec["target_pending"])])
        if progress:
            progress(f"grid {index} {cell.label()} bits={bits}")
        return row

    with tempfile.NamedTemporaryFile(prefix="index-grid-", suffix=".lock") as lock:
        os.environ[LOCK_ENV] = lock.name
        try:
            with ThreadPoolExecutor(max_workers=workers) as pool:  # each cell is its own process
                rows = list(pool.map(one, configs))
        finally:
            del os.environ[LOCK_ENV]
    extra = _fresh(["--scenarios", "1" if quick else "0"])
    return {"quick": quick, "spec": spec, "rows": rows, **extra,
            "loadavg_before": load, "loadavg_after": os.getloadavg()}


def scenarios(quick: bool) -> dict:
    return {"flatness": flatness((3_000, 30_000) if quick else (30_000, 100_000, 300_000)),
            "parked": parked(seconds=3 if quick else 90),
            "listed_miss": listed_miss()}


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--one":
        index, cell, bits, target = argv[1], Cell(**json.loads(argv[2])), int(argv[3]), int(argv[4])
        print(json.dumps(measure_cell(index, cell, bits, target)), flush=True)
        os._exit(0)  # no teardown of the cell's indexes: it would run beside another cell's timing
    if argv and argv[0] == "--scenarios":
        print(json.dumps(scenarios(argv[1] == "1")))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="bench/results/index-grid")
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(argv)

    started = time.time()
    result = run(a.quick, a.workers, progress=lambda s: print(f"  {s}", file=sys.stderr, flush=True))
    result.update(duration_s=round(time.time() - started, 1), workers=a.workers, cores=os.cpu_count())
    report.write(result, Path(a.out))
    for t in report.targets(result):
        print(f"{'PASS' if t['pass'] else 'FAIL'} {t['target']}: {t['worst']:.3g} (bound {t['bound']:g}; {t['cell']})")
    print(f"wrote {a.out}/RESULTS.md in {result['duration_s']:.0f} s "
          f"(median add ratio {statistics.median(tb['add_vs_dict'] for tb, _ in report.pairs(result['rows'])):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
