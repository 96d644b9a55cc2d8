"""What the driver JVM's class archive saves: a Spark session start and the
first validation scan, with and without ``plan``'s caches, side by side.

    python -m bench.lab.plan_session /tmp/nacktracker-plan-speed/4m-2000 --repeats 2

Each run is a fresh process (``NACKTRACKER_CACHE=0`` for "off"; "on" uses
the cache as ``plan`` does, so run ``plan`` once first: the first run with
the cache on only dumps the archive), alternating off/on so both see the
same load. Per run: wall time and the driver JVM's CPU seconds (user +
system from ``/proc/<pid>/stat``: less sensitive to other jobs on a shared
machine than wall time) for the session start and for the first
:func:`~nacktracker.pipeline.load.load_trace` (one scan; the JVM's first
job), and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

_CHILD = """
import json, os, sys, time
t0 = time.perf_counter()
from nacktracker.pipeline.spark import get_spark
from nacktracker.pipeline.load import load_trace
spark = get_spark(sys.argv[2])
pid = spark.sparkContext._gateway.proc.pid  # spark-submit execs the JVM: this is its pid

def cpu():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

c1, t1 = cpu(), time.perf_counter()
load_trace(spark, sys.argv[1])
c2, t2 = cpu(), time.perf_counter()
print(json.dumps({"session_s": t1 - t0, "session_cpu_s": c1, "validate_s": t2 - t1, "validate_cpu_s": c2 - c1}))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)
    print("| run | cache | session (s) | session JVM CPU (s) | validate (s) | validate JVM CPU (s) | load (1 min) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for i in range(args.repeats):
        for cache in ("off", "on"):
            env = dict(os.environ, PYTHONPATH=str(HERE), NACKTRACKER_CACHE="1" if cache == "on" else "0")
            load = os.getloadavg()[0]
            done = subprocess.run([sys.executable, "-c", _CHILD, args.trace, args.master], env=env,
                                  capture_output=True, text=True, check=True)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"| {i} | {cache} | {r['session_s']:.1f} | {r['session_cpu_s']:.1f} | {r['validate_s']:.1f} "
                  f"| {r['validate_cpu_s']:.1f} | {load:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
