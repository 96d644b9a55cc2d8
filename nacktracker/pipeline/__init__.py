"""The Spark pipeline: size nack trackers from event logs and sweep the design space.

Modules (each small, each importable without starting Spark):

* :mod:`.spark` — the SparkSession builder (offline, quiet, local or cluster);
* :mod:`.ship` — on a cluster: pack what the executors import (cached by
  content hash), ship it as a Spark archive, probe the executors' imports;
* :mod:`.progress` — phase lines and Spark task counts on stdout;
* :mod:`.load` — read a Parquet / JSON Lines nack log, check it, count it;
* :mod:`.trace` — ``trace generate``: synthetic logs from ``spark.range``;
* :mod:`.pending` — the kernel, vectorised over groups of whole consumers:
  peak pending and when, memory at the peak, errors, pending over time;
* :mod:`.memory_model` — TimeBucketIndex bytes from bitmaps + measured overheads;
* :mod:`.plan` — ``plan``: the Spark job around the kernel, fleet totals,
  recommendation; :mod:`.report` — its Parquet, Markdown and PNG;
* :mod:`.sweep` — ``sweep``: the memory benchmark's grid as Spark tasks;
* :mod:`.cli` — the three commands (``add_subcommands``).

Needs the ``spark`` extra (pyspark, pyarrow, pandas) and Java 17+.
"""

#: Candidate precision bits of ``nacktracker plan`` (1 ms to 32.8 s buckets).
DEFAULT_BITS = (0, 4, 8, 10, 12, 15)
#: Bound on the p99 redelivery error. Seed 000: "a delay of 1 minute may
#: require within 1 second".
DEFAULT_MAX_EARLY_MS = 1000
