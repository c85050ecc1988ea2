"""The synthetic source: deterministic records, paced offsets, the asked-for fractions, and a
windowed pipeline over it equal to a plain Spark batch over the same records."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, Pipeline, SyntheticSource
from lowmark.batches.records import INGESTED_COLUMN
from lowmark.batches.sources.base import PARTITION_COLUMN
from lowmark.batches.sources.synthetic import SyntheticStreamSource
from lowmark.batches.windows import Aggregate, EventTime, Tumbling, WindowedAggregation
from tests.helpers import FakeClock, delta_frame, per_window

START = datetime(2026, 1, 1, tzinfo=UTC)
START_MS = int(START.timestamp() * 1000)


def rows(df: DataFrame) -> list[tuple[object, ...]]:
    return sorted(tuple(r) for r in df.drop(PARTITION_COLUMN).collect())


def test_a_range_reads_the_same_records_every_time_and_in_any_split(
    spark: SparkSession,
) -> None:
    config = SyntheticSource(partitions=2, total_rows=50, rows_per_second=None, seed=3)
    source = SyntheticStreamSource(spark, config)
    whole = rows(source.read({"0": 0, "1": 0}, {"0": 40, "1": 30}, 0).records)
    again = rows(source.read({"0": 0, "1": 0}, {"0": 40, "1": 30}, 7).records)
    split = rows(source.read({"0": 0, "1": 0}, {"0": 15, "1": 30}, 0).records) + rows(
        source.read({"0": 15, "1": 30}, {"0": 40, "1": 30}, 1).records
    )
    assert whole == again == sorted(split)
    assert len(whole) == 70
    other_seed = SyntheticStreamSource(spark, config.model_copy(update={"seed": 4}))
    assert rows(other_seed.read({"0": 0}, {"0": 40}, 0).records) != rows(
        source.read({"0": 0}, {"0": 40}, 0).records
    )


def test_a_paced_source_offers_what_its_rate_produced_split_fairly(
    spark: SparkSession,
) -> None:
    clock = FakeClock(now_ms=START_MS + 10_000)  # 10 s after the first slot
    config = SyntheticSource(partitions=3, rows_per_second=10, max_rows_per_batch=50)
    source = SyntheticStreamSource(spark, config, clock)
    assert source.initial_offsets() == {"0": 100, "1": 100, "2": 100}  # latest: produced by now
    earliest = SyntheticStreamSource(
        spark, config.model_copy(update={"starting_offsets": "earliest"})
    )
    assert earliest.initial_offsets() == {"0": 0, "1": 0, "2": 0}
    # 50 a batch over three partitions: 16, 17, 17 (what one needs less of goes to the others).
    assert source.plan({"0": 0, "1": 0, "2": 0}, 0) == {"0": 16, "1": 17, "2": 17}
    assert source.plan({"0": 95, "1": 0, "2": 100}, 0) == {"0": 100, "1": 45, "2": 100}
    assert source.backlog({"0": 95, "1": 0, "2": 100}) == {"records": 105, "partitions": 2}
    clock.advance(1_000)
    assert source.plan({"0": 100, "1": 100, "2": 100}, 1) == {"0": 110, "1": 110, "2": 110}


def test_aligned_admission_takes_the_lowest_clocks_first_and_splits_equal_ones_fairly(
    spark: SparkSession,
) -> None:
    config = SyntheticSource(partitions=3, rows_per_second=None, total_rows=100)
    source = SyntheticStreamSource(spark, config.model_copy(update={"max_rows_per_batch": 50}))
    start = {"0": 0, "1": 0, "2": 0}
    assert source.plan(start, 0, clocks=None) == {"0": 16, "1": 17, "2": 17}  # fair
    assert source.plan(start, 0, clocks={"0": 9, "1": 5, "2": 5}) == {"0": 0, "1": 25, "2": 25}
    # What the lowest do not need goes to the next lowest.
    lowest_nearly_done = {"0": 0, "1": 95, "2": 0}
    assert source.plan(lowest_nearly_done, 0, clocks={"0": 9, "1": 5, "2": 7}) == {
        "0": 0,
        "1": 100,
        "2": 45,
    }
    # A partition with no clock yet comes first (its records may hold the lowest times).
    assert source.plan(start, 0, clocks={"0": 9, "2": 5}) == {"0": 0, "1": 50, "2": 0}


def test_a_paced_record_is_ingested_when_its_partition_produces_it(spark: SparkSession) -> None:
    """Each record carries that time too (``INGESTED_COLUMN``), the clock its partition has
    while it is the first not taken."""
    clock = FakeClock(now_ms=START_MS + 10_000)  # 100 records a partition produced
    config = SyntheticSource(partitions=2, rows_per_second=10, starting_offsets="earliest")
    source = SyntheticStreamSource(spark, config, clock, ingestion_clock=True)
    # Record 40 became available when the count passed it, at 4.1 s; partition 1 is read
    # to its end: whatever it produces next comes after now.
    assert source.ingestion_times({"0": 40, "1": 100}, clock.now) == {
        "0": START_MS + 4_100,
        "1": START_MS + 10_000,
    }
    records = source.read({"0": 40}, {"0": 43}, 0).records
    own = sorted(r[INGESTED_COLUMN] for r in records.select(INGESTED_COLUMN).collect())
    assert own == [START_MS + 4_100, START_MS + 4_200, START_MS + 4_300]
    unpaced = SyntheticStreamSource(
        spark, config.model_copy(update={"rows_per_second": None, "total_rows": 5})
    )
    assert unpaced.ingestion_times({"0": 0, "1": 5}, clock.now) == {"0": START_MS, "1": clock.now}


def test_event_times_follow_the_slots_with_skew_and_disorder(spark: SparkSession) -> None:
    config = SyntheticSource(
        partitions=2,
        rows_per_second=4,  # a slot every 250 ms
        partition_skew="1 minute",
        max_out_of_orderness="2 seconds",
    )
    records = SyntheticStreamSource(spark, config).read({}, {"0": 400, "1": 400}, 0).records
    lag = records.select(
        "source_partition",
        (
            F.lit(START_MS)
            + F.col("seq") * 250
            - F.col("source_partition") * 60_000
            - F.unix_millis("event_time")
        ).alias("behind_slot_ms"),
    )
    stats = {
        r.source_partition: (r.low, r.high, r.n)
        for r in lag.groupBy("source_partition")
        .agg(F.min("behind_slot_ms").alias("low"), F.max("behind_slot_ms").alias("high"))
        .join(
            lag.groupBy("source_partition").count().withColumnRenamed("count", "n"),
            "source_partition",
        )
        .collect()
    }
    for partition in (0, 1):
        low, high, n = stats[partition]
        assert n == 400 and low >= 0 and high <= 2_000 and high > 1_000  # disorder is used


def test_late_untimed_and_malformed_shares_are_as_configured(spark: SparkSession) -> None:
    n = 20_000
    config = SyntheticSource(
        rows_per_second=100,
        late_fraction=0.1,
        late_by="1 hour",
        null_fraction=0.05,
        malformed_fraction=0.02,
    )
    read = SyntheticStreamSource(spark, config).read({"0": 0}, {"0": n}, 0)
    records = read.records.withColumn(
        "behind_ms",
        F.lit(START_MS) + F.col("seq") * 10 - F.unix_millis("event_time"),
    )
    late = records.where(F.col("behind_ms") == 3_600_000).count()
    untimed = records.where(F.col("event_time").isNull()).count()
    assert read.bad is not None
    bad = read.bad.count()
    # Binomial counts: within 5 standard deviations of n * share.
    for count, share in ((late, 0.1), (untimed, 0.05), (bad, 0.02)):
        sd = (n * share * (1 - share)) ** 0.5
        assert abs(count - n * share) < 5 * sd, (count, share)
    assert records.count() + bad == n


def test_a_windowed_pipeline_over_it_equals_a_plain_batch_over_the_same_records(
    spark: SparkSession, data_root: Path
) -> None:
    source = SyntheticSource(
        partitions=3,
        keys=5,
        rows_per_second=2,
        total_rows=300,
        starting_offsets="earliest",
        max_rows_per_batch=120,
        max_out_of_orderness="3 seconds",
        partition_skew="5 seconds",
        seed=11,
    )
    pipeline = Pipeline(
        name="synthetic_windows",
        source=source,
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="event_time", max_out_of_orderness="10 seconds"),
        aggregation=WindowedAggregation(
            keys=("key",),
            window=Tumbling(size="30 seconds"),
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="value")),
            output_mode="update",
        ),
    )
    results = MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
    assert [r.rows_in for r in results if r.rows_in] == [120, 120, 120, 120, 120, 120, 120, 60]
    assert sum(r.rows_late for r in results) == 0  # disorder within the bound

    every = SyntheticStreamSource(spark, source).read({}, {"0": 300, "1": 300, "2": 300}, 0)
    expected = per_window(
        every.records,
        "key",
        F.window("event_time", "30 seconds"),
        F.count(F.lit(1)).alias("count"),
        F.sum("value").alias("sum_value"),
    )
    assertDataFrameEqual(delta_frame(spark, str(data_root / "out")), expected)
