"""Where one grid cell's memory goes: the C heap's bytes in use and free
(glibc ``mallinfo2``) and pymalloc's bytes in use, grown while the cell's
traffic played, beside ``nbytes()``; then every index is deleted and the
bytes that frees (C heap + pymalloc) are what the indexes really held;
first their live bitmaps alone ("live_held", beside what ``nbytes()``
counts for them: "live_nbytes").

    python -m bench.lab.heap_breakdown '{"delays": "uniform", "k": 3, "ledgers": 1, "rate": 1000, "seconds": 70}' 0

The cell plays as in ``bench/index_grid.py`` (same warm-up, baseline and
driver). Linux/glibc only.
"""

from __future__ import annotations

import gc
import json
import os
import re
import sys
import tempfile

from bench import index_grid as grid
from bench.roaring_bytes import mallinfo


def heap() -> tuple[int, int, int]:
    """(C heap bytes in use, C heap bytes free, pymalloc bytes in allocated blocks)."""
    m = mallinfo()
    fd, out = os.dup(2), tempfile.TemporaryFile()
    os.dup2(out.fileno(), 2)
    try:
        sys._debugmallocstats()
    finally:
        os.dup2(fd, 2)
        os.close(fd)
    out.seek(0)
    text = out.read().decode()
    py = int(re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text).group(1).replace(",", ""))
    return m.uordblks + m.hblkhd, m.fordblks, py


def main(argv: list[str]) -> int:
    import nacktracker
    from nacktracker.index.layout import roaring_bytes

    cell, bits = grid.Cell(**json.loads(argv[0])), int(argv[1])
    target = int(argv[2]) if len(argv) > 2 else grid.FULL["target_pending"]
    n, t0 = grid.replicas_for(cell, target), 1_000_000_000
    grid._warm_up(nacktracker.TimeBucketIndex, cell, bits)
    streams = [grid.Traffic(cell, seed=j + 1) for j in range(n)]
    due_at: list = [None] * n
    gc.collect()
    grid.trim_heap()
    rss0, (used0, free0, py0) = grid.rss_bytes(), heap()
    indexes = [nacktracker.TimeBucketIndex(precision_bits=bits) for _ in range(n)]
    for i in range(cell.rate * cell.seconds):
        now = t0 + i * 1000 // cell.rate
        for j, idx in enumerate(indexes):
            if due_at[j] is not None and due_at[j] <= now:
                idx.pop_due_bitmaps(now)
                due_at[j] = None
            ledger, entry, delay = streams[j].nack()
            idx.add(ledger, entry, now + delay)
            if due_at[j] is None or now + delay < due_at[j]:
                due_at[j] = idx.next_due_ms()
    for idx in indexes:
        idx.pop_due(t0 + cell.seconds * 1000)
    gc.collect()
    rss1, (used1, free1, py1) = grid.rss_bytes(), heap()
    pending, nbytes = sum(map(len, indexes)), sum(i.nbytes() for i in indexes)
    # the live bitmaps alone: counted as nbytes() counts them, and freed
    live_counted = sum(roaring_bytes(i._ids.bits, grown=True, refit=i._ids.refitted) for i in indexes)
    for one in indexes:
        one._ids.bits = type(one._ids.bits)()
    gc.collect()
    used_live, _, py_live = heap()
    live_counted -= sum(roaring_bytes(i._ids.bits, grown=True, refit=i._ids.refitted) for i in indexes)  # the empty ones
    del indexes, idx, one
    gc.collect()
    used2, _, py2 = heap()
    per = lambda b: round(b / pending, 2)  # noqa: E731
    print(json.dumps({"cell": cell.label(), "bits": bits, "pending": pending, "rss": per(rss1 - rss0),
                      "nbytes": per(nbytes), "held": per(used1 - used2 + py1 - py2),
                      "c_heap_in_use": per(used1 - used0), "c_heap_free": per(free1 - free0),
                      "pymalloc_in_use": per(py1 - py0),
                      "live_held": per(used1 - used_live + py1 - py_live), "live_nbytes": per(live_counted)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
