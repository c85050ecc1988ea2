"""Deterministic synthetic events (``SyntheticSource``): demos, tests, benchmarks.

Offsets are event counts per partition (``"0"``, ``"1"``, ...). Record ``i``
of partition ``p`` is computed from ``(seed, p, i)`` alone with Spark's
``xxhash64``, so any range reads the same records every time and a replay is
exact. Paced by ``rows_per_second``, the source offers at processing time
``now`` the records whose slot (``start + i / rows_per_second``) has passed;
unpaced, all ``total_rows`` at once (slots 1 ms apart).

Each record draws one uniform number that puts it, in this order, among the
late (``late_fraction``: ``late_by`` older than its slot), the untimed
(``null_fraction``: no event time), the malformed (``malformed_fraction``: a
bad record with its raw text) or the plain records.
"""

from __future__ import annotations

import math
from functools import reduce

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from lowmark.batches.batch_values import batch_long
from lowmark.batches.clock import Clock, SystemClock
from lowmark.batches.pipeline import SyntheticSource, start_time_ms
from lowmark.batches.records import INGESTED_COLUMN
from lowmark.batches.sources.base import (
    PARTITION_COLUMN,
    Clocks,
    Source,
    SourceRead,
    aligned_share,
    read_counts,
)
from lowmark.batches.sources.context import SourceContext
from lowmark.state.offset_log import Offsets
from lowmark.state.session import SparkLike, provider

_UNIFORM_STEPS = 1_000_000


class SyntheticStreamSource(Source):
    """``config``'s events; ``clock`` says how many a paced source has produced."""

    def __init__(
        self,
        spark: SparkLike,
        config: SyntheticSource,
        clock: Clock | None = None,
        ingestion_clock: bool = False,
    ):
        """``ingestion_clock``: the pipeline's watermark follows this source's ingestion
        clock (``ingestion_times``), so each record carries its own (``INGESTED_COLUMN``)."""
        self._spark = provider(spark)
        self.config = config
        self.clock = clock or SystemClock()
        self.start_ms = start_time_ms(config.start)
        self.ingestion_clock = ingestion_clock

    @classmethod
    def from_config(cls, config: SyntheticSource, context: SourceContext) -> SyntheticStreamSource:
        """``config``'s events, paced by the context's clock."""
        return cls(context.spark, config, context.clock, context.ingestion_clock)

    def _available(self) -> Offsets:
        """Records each partition has produced by now."""
        c = self.config
        if c.rows_per_second is None:
            produced = c.total_rows or 0
        else:
            elapsed_ms = max(self.clock.now_ms() - self.start_ms, 0)
            produced = int(elapsed_ms * c.rows_per_second // 1000)
            if c.total_rows is not None:
                produced = min(produced, c.total_rows)
        return {str(p): produced for p in range(c.partitions)}

    def initial_offsets(self) -> Offsets:
        if self.config.starting_offsets == "latest":
            return self._available()
        return {str(p): 0 for p in range(self.config.partitions)}

    def start_moves(self) -> bool:
        return self.config.starting_offsets == "latest"

    def plan(
        self,
        start: Offsets,
        batch_id: int,
        record: bool = True,
        discover: bool = True,
        clocks: Clocks | None = None,
    ) -> Offsets:
        """Up to ``max_rows_per_batch`` of what was produced, split fairly, or lowest
        ``clocks`` first (``aligned_share``); records nothing."""
        available = self._available()
        waiting = {p: n - start.get(p, 0) for p, n in available.items()}
        taken = aligned_share(waiting, self.config.max_rows_per_batch, clocks)
        return {p: start.get(p, 0) + taken[p] for p in available}

    def read(
        self,
        start: Offsets,
        end: Offsets,
        batch_id: int,
        cache: bool = False,
        strict: bool = False,
    ) -> SourceRead:
        """The records of ``[start, end)``, computed (nothing to cache or to change)."""
        spark = self._spark()
        ranges = [
            spark.range(start.get(p, 0), e).withColumn("_p", F.lit(int(p)))
            for p, e in sorted(end.items(), key=lambda item: int(item[0]))
            if e > start.get(p, 0)
        ]
        ids = (
            reduce(DataFrame.unionAll, ranges)
            if ranges
            else spark.range(0).withColumn("_p", F.lit(0))
        )
        events = ids.select(*self._columns())
        good = F.col("_kind") != "malformed"
        counts = Observation()
        events = events.observe(counts, *read_counts(False, good))
        bad = events.where(~good).select(
            batch_long(batch_id).alias("batch_id"),
            F.format_string("synthetic:%d@%d", "source_partition", "seq").alias("source_file"),
            F.format_string('{"key": "%s", "event_time": oops', "key").alias("raw"),
            F.lit("malformed synthetic record").alias("reason"),
        )
        records = events.where(good).drop("_kind")
        return SourceRead(records, bad, counts)

    def _columns(self) -> list[Column]:
        c = self.config
        i, p = F.col("id"), F.col("_p")

        def draw(salt: int, modulo: int) -> Column:
            return F.pmod(F.xxhash64(F.lit(c.seed), F.lit(salt), p, i), F.lit(modulo))

        slot_ms = 1000 / c.rows_per_second if c.rows_per_second else 1
        slot = F.lit(self.start_ms) + F.floor(i * F.lit(slot_ms)) - p * F.lit(c.partition_skew)
        disorder = draw(3, c.max_out_of_orderness + 1) if c.max_out_of_orderness else F.lit(0)
        u = draw(4, _UNIFORM_STEPS) / F.lit(_UNIFORM_STEPS)
        late_to = c.late_fraction
        null_to = late_to + c.null_fraction
        malformed_to = null_to + c.malformed_fraction
        kind = (
            F.when(u < F.lit(late_to), "late")
            .when(u < F.lit(null_to), "untimed")
            .when(u < F.lit(malformed_to), "malformed")
            .otherwise("plain")
        )
        ms = slot - disorder - F.when(kind == "late", F.lit(c.late_by)).otherwise(F.lit(0))
        own = []
        if self.ingestion_clock:  # when it was produced, as ``ingestion_times`` counts it
            rate = c.rows_per_second
            produced = (
                F.lit(self.start_ms)
                if rate is None
                else F.lit(self.start_ms) + F.ceil((i + 1) * F.lit(1000) / F.lit(rate))
            )
            own.append(produced.cast("long").alias(INGESTED_COLUMN))
        return [
            F.concat(F.lit("k"), draw(1, c.keys).cast("string")).alias("key"),
            F.when(kind == "untimed", F.lit(None))
            .otherwise(F.timestamp_millis(ms.cast("long")))
            .alias("event_time"),
            (draw(2, 100) + 1).alias("value"),
            i.alias("seq"),
            p.alias("source_partition"),
            p.cast("string").alias(PARTITION_COLUMN),
            *own,
            kind.alias("_kind"),
        ]

    def ingestion_times(self, position: Offsets, observed_ms: int) -> dict[str, int]:
        """Paced, record ``i`` is produced once its partition's count passes it, at ``start +
        (i + 1) / rows_per_second``: per partition that time for the first record at or past
        ``position`` if it is produced by ``observed_ms``, else ``observed_ms``. Unpaced,
        every record exists from ``start``."""
        rate = self.config.rows_per_second
        times = {}
        for p, produced in self._available().items():
            at = position.get(p, 0)
            if at >= produced:
                times[p] = observed_ms
            elif rate is None:
                times[p] = min(self.start_ms, observed_ms)
            else:
                times[p] = min(self.start_ms + math.ceil((at + 1) * 1000 / rate), observed_ms)
        return times

    def waiting_partitions(self, end: Offsets) -> tuple[str, ...]:
        """The partitions that have produced records past ``end`` by now."""
        return tuple(sorted(p for p, n in self._available().items() if n > end.get(p, 0)))

    def inputs(self, start: Offsets, end: Offsets) -> list[str]:
        return [
            f"partition {p} records {start.get(p, 0)} to {e - 1}"
            for p, e in sorted(end.items())
            if e > start.get(p, 0)
        ]

    def backlog(self, committed_end: Offsets) -> dict[str, int]:
        behind = {p: n - committed_end.get(p, 0) for p, n in self._available().items()}
        return {
            "records": sum(n for n in behind.values() if n > 0),
            "partitions": sum(1 for n in behind.values() if n > 0),
        }
