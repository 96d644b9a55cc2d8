"""``nacktracker trace generate``: synthetic nack event logs, made in Spark.

Every row is a pure function of its number in ``spark.range(N)``, so a trace
of any size is generated in parallel with no driver-side data, and the same
arguments always give the same trace.

Row ``id`` belongs to consumer ``c = id % C`` and is that consumer's nack
number ``i = id // C`` (consumers interleave, as in a shared subscription):

* time: consumer ``c`` nacks ``rate_c`` messages per second,
  ``ts = start + c + i * 1000 // rate_c``; ``rate_c = rate * spread^(c/(C-1))``;
* message: the ``i``-th nacked message of the consumer is message ``m = i``
  (or an earlier one, for a re-nack, below). Messages are grouped in batch
  entries of ``batch_size`` (``batch_index = m % batch_size``), entries in
  ledgers of ``entries_per_ledger`` (ledger rollover). With ``nack_share < 1``
  the consumer nacks that share of each ledger's entries, picked at random
  (one in each stride of ``1/share`` entries); with 1 it nacks every entry in
  order: seed 000's sequential workload;
* delay: ``delay_ms`` plus a uniform ``[0, delay_jitter_ms]``;
* re-nacks: ``renack_share`` of the rows nack again a message nacked one delay
  earlier (it has been redelivered by then), with ``redelivery_count = 1``.

Cost: one Spark job writing N rows; about 2 s per million rows on 2 cores.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..events import COLUMN_TYPES, COLUMNS, MAX_TIME_MS

if TYPE_CHECKING:  # pyspark is imported where it is used (the `spark` extra)
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["TraceSpec", "generate_trace", "trace_frame"]

#: Up to this many consumers, per-consumer values are literal arrays in the plan.
_LITERAL_CONSUMERS = 1024


@dataclass(frozen=True)
class TraceSpec:
    """Parameters of a synthetic trace (see the module docstring)."""

    events: int
    consumers: int = 4
    rate: float = 1000.0              # nacks per second per consumer
    rate_spread: float = 1.0          # last consumer's rate / first consumer's rate
    delay_ms: int = 60_000
    delay_jitter_ms: int = 0
    entries_per_ledger: int = 50_000
    nack_share: float = 1.0
    batch_size: int = 1
    renack_share: float = 0.0
    topics: int = 1
    seed: int = 1
    start_ms: int = 1_700_000_000_000

    def __post_init__(self) -> None:
        checks = [  # (field, holds, what it must be)
            ("events", self.events >= 1, ">= 1"), ("consumers", self.consumers >= 1, ">= 1"),
            ("rate", self.rate > 0, "> 0 (nacks per second)"), ("rate_spread", self.rate_spread > 0, "> 0"),
            ("delay_ms", self.delay_ms >= 0, ">= 0"), ("delay_jitter_ms", self.delay_jitter_ms >= 0, ">= 0"),
            ("entries_per_ledger", self.entries_per_ledger >= 1, ">= 1"),
            ("nack_share", 0 < self.nack_share <= 1, "above 0 and at most 1"),
            ("batch_size", self.batch_size >= 1, ">= 1"),
            ("renack_share", 0 <= self.renack_share < 1, "at least 0 and below 1"), ("topics", self.topics >= 1, ">= 1"),
            ("start_ms", self.start_ms >= 0, ">= 0"),
        ]
        for name, ok, limit in checks:
            if not ok:  # the command line's option of the same name: --events, --rate-spread, ...
                raise ValueError(f"trace: {name} must be {limit}, got {getattr(self, name)!r}")
        if self.delay_ms + self.delay_jitter_ms > MAX_TIME_MS:
            raise ValueError(f"trace: delay_ms + delay_jitter_ms must be <= {MAX_TIME_MS} (2^61 - 1 ms, the largest "
                             f"delay plan reads), got {self.delay_ms + self.delay_jitter_ms}")
        last = self.last_ts_ms()
        if last > MAX_TIME_MS:
            raise ValueError(f"trace: the last nack would reach ts_ms {last}, above {MAX_TIME_MS} (2^61 - 1 ms, the "
                             f"largest time plan reads): lower start_ms or events, or raise rate")

    def last_ts_ms(self) -> int:
        """The largest ``ts_ms`` of the trace (the slowest consumer's last nack). O(1)."""
        slowest_ms_per_nack = 1000.0 / (self.rate * min(1.0, self.rate_spread))
        nacks = -(-self.events // self.consumers)  # the most any consumer makes
        return self.start_ms + self.consumers - 1 + math.floor((nacks - 1) * slowest_ms_per_nack)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def trace_frame(spark: SparkSession, spec: TraceSpec, partitions: int | None = None) -> DataFrame:
    """The trace as a lazy DataFrame with the event log's columns and types."""
    from pyspark.sql import functions as F

    C = spec.consumers
    parts = partitions or max(1, min(64, math.ceil(spec.events / 2_000_000)))
    df = spark.range(0, spec.events, numPartitions=parts)
    cid = (F.col("id") % C)
    i = F.floor(F.col("id") / C).cast("long")
    seed = F.lit(spec.seed)

    def uniform(*salt: int) -> Column:
        # a deterministic uniform [0, 1) per row and salt (Spark's murmur3 hash)
        h = F.xxhash64(seed, F.col("id"), *[F.lit(s) for s in salt])
        return F.pmod(h, F.lit(1 << 30)).cast("double") / float(1 << 30)

    # per-consumer values come from small literal arrays: a lookup per row is far
    # cheaper than building strings or calling pow() 20 million times. With many
    # consumers the arrays would be a plan of C literals each (planning 20,000
    # consumers took a minute on the driver): then the values are computed once
    # per consumer, in a table of C rows joined by broadcast (a hash lookup per row).
    few = C <= _LITERAL_CONSUMERS

    def per_consumer(values: Sequence[object], type_name: str) -> Column:
        return F.element_at(F.array(*[F.lit(v).cast(type_name) for v in values]), (cid + 1).cast("int"))

    # per-consumer rate: a geometric spread from rate to rate * spread
    if few:
        ms_per_nack = per_consumer([1000.0 / (spec.rate * spec.rate_spread ** (c / max(1, C - 1)))
                                    for c in range(C)], "double")
        topic = per_consumer([f"persistent://public/default/nacks-{c % spec.topics}" for c in range(C)], "string")
        name = per_consumer([f"consumer-{c:03d}" for c in range(C)], "string")
    else:
        c = F.col("id")
        table = spark.range(0, C, numPartitions=1).select(
            c.alias("cid"),
            (F.lit(1000.0) / (F.lit(float(spec.rate)) * F.pow(F.lit(float(spec.rate_spread)),
                                                              c.cast("double") / float(max(1, C - 1))))
             ).alias("ms_per_nack"),
            F.concat(F.lit("persistent://public/default/nacks-"), (c % spec.topics).cast("string")).alias("topic"),
            F.format_string("consumer-%03d", c).alias("name"))
        df = df.withColumn("cid", cid).join(F.broadcast(table), "cid")
        ms_per_nack, topic, name = F.col("ms_per_nack"), F.col("topic"), F.col("name")
    ts = F.lit(spec.start_ms) + cid + F.floor(i.cast("double") * ms_per_nack).cast("long")
    jitter = (F.floor(uniform(1) * (spec.delay_jitter_ms + 1)).cast("long")
              if spec.delay_jitter_ms else F.lit(0).cast("long"))
    delay = F.lit(spec.delay_ms).cast("long") + jitter
    # a re-nack points one (max) delay of nacks back: that message was redelivered by now
    lag = max(1, math.ceil(spec.rate * max(1.0, spec.rate_spread) * (spec.delay_ms + spec.delay_jitter_ms) / 1000) + 1)
    renack = (uniform(2) < spec.renack_share) & (i >= lag) if spec.renack_share else F.lit(False)
    m = F.when(renack, i - lag).otherwise(i)
    entry_seq = F.floor(m / spec.batch_size).cast("long")
    per_ledger = max(1, round(spec.entries_per_ledger * spec.nack_share))
    stride = spec.entries_per_ledger // per_ledger
    ledger_local = F.floor(entry_seq / per_ledger).cast("long")
    k = entry_seq % per_ledger
    if stride > 1:
        pick = F.pmod(F.xxhash64(seed, cid, ledger_local, k), F.lit(stride))
        entry = k * stride + pick
    else:
        entry = k
    ledger = F.lit(10_000) + ledger_local * C + cid  # ledgers of different consumers never collide
    columns = {
        "ts_ms": ts,
        "kind": F.lit("nack"),
        "ledger_id": ledger,
        "entry_id": entry,
        "delay_ms": delay,
        "redelivery_count": F.when(renack, 1).otherwise(0),
        "partition": F.lit(-1),
        "batch_index": (m % spec.batch_size) if spec.batch_size > 1 else F.lit(-1),
        "topic": topic,
        "consumer": name,
    }
    spark_type = {"int64": "bigint", "int32": "int", "string": "string"}
    return df.select(*[columns[c].cast(spark_type[COLUMN_TYPES[c]]).alias(c) for c in COLUMNS])


def generate_trace(spark: SparkSession, spec: TraceSpec, out: str, fmt: str = "parquet", overwrite: bool = False,
                   files: int | None = None) -> None:
    """Write a synthetic trace to ``out`` (a directory of Parquet or JSON Lines files)."""
    if fmt not in ("parquet", "jsonl"):
        raise ValueError(f"format must be parquet or jsonl, got {fmt!r}")
    writer = trace_frame(spark, spec, files).write.mode("overwrite" if overwrite else "errorifexists")
    if fmt == "parquet":
        writer.option("compression", "zstd").parquet(out)
    else:
        writer.json(out)
