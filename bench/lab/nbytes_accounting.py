"""What ``nbytes()``'s accounting alone changes on seed 000's workloads.

Issue 12's fifth round made ``TimeBucketIndex.nbytes()`` count each
allocation as pymalloc/malloc take it (``held_size``) and the live bitmap at
the capacity CRoaring grows it to; before, it summed ``sys.getsizeof`` and
bitmaps at their size. To compare a seed-table row with one measured before
that change, this builds the row's index (as ``python -m bench.memory --one``
does) and prints ``nbytes()`` both ways, per message.

    python -m bench.lab.nbytes_accounting --x 1 --y 15 [--workload sequential] [--messages 10000000]
"""

from __future__ import annotations

import argparse
import json
import sys

import nacktracker
from nacktracker.index import _ledgers, _live, _windows, buckets, layout
from nacktracker.pipeline.memory_experiment import workload


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--x", type=int, default=1)
    p.add_argument("--y", type=int, default=10)
    p.add_argument("--workload", default="sequential")
    p.add_argument("--messages", type=int, default=10_000_000)
    a = p.parse_args(argv)
    idx = nacktracker.TimeBucketIndex(precision_bits=a.y)
    for ledger, entry, due in workload(a.workload, a.messages, a.x, 50_000, 0.1):
        idx.add(ledger, entry, due)
    idx.compact()
    now = idx.nbytes()
    roaring = layout.roaring_bytes
    for m in (layout, buckets, _ledgers, _live, _windows):  # as counted before: sizes, not allocations
        m.held_size = sys.getsizeof
        m.roaring_bytes = lambda bm, grown=False, refit=False: (roaring(bm) - layout.held(type(bm).__basicsize__)
                                                                 + type(bm).__basicsize__)
    before = idx.nbytes()
    print(json.dumps({"workload": a.workload, "x": a.x, "y": a.y, "messages": a.messages,
                      "nbytes_per_msg": now / a.messages, "nbytes_as_before_per_msg": before / a.messages}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
