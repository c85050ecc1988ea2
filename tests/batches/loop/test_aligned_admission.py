"""Aligned admission (``event_time.admission: aligned``): when a batch cannot take everything
waiting, the source admits the partitions with the lowest watermark input first, so the
pipeline watermark (their minimum) advances batch by batch instead of waiting while a
partition ahead takes half of every batch.

Each run is compared with a fair split over the same input, and its windows with a plain
Spark batch over the whole input.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.status import pipeline_plan
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, Pipeline, SyntheticSource
from lowmark.batches.sources.synthetic import SyntheticStreamSource
from lowmark.batches.windows import (
    Aggregate,
    EventTime,
    IngestionWatermark,
    Tumbling,
    WindowedAggregation,
)
from tests.helpers import T0, FakeClock, delta_frame, event, per_window, windowed
from tests.helpers import write_json_lines as land

# Two partitions of 15 records a second of event time apart, partition 1 ten seconds behind
# partition 0; a batch takes 10 of the 30.
BEHIND = SyntheticSource(
    partitions=2,
    keys=3,
    rows_per_second=1,
    total_rows=15,
    starting_offsets="earliest",
    max_rows_per_batch=10,
    partition_skew="10 seconds",
    seed=5,
)


def _pipeline(admission: str) -> Pipeline:
    return Pipeline(
        name=f"{admission}_admission",
        source=BEHIND,
        sink=DeltaSink(path=f"out_{admission}"),
        event_time=EventTime(column="event_time", admission=admission),
        aggregation=WindowedAggregation(
            keys=("key",),
            window=Tumbling(size="10 seconds"),
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="value")),
            output_mode="append",
        ),
        read_ahead_batches=1,  # each batch its own job: what is compared is the planning
    )


def test_the_partition_behind_is_drained_first_and_the_watermark_advances_sooner(
    spark: SparkSession, data_root: Path
) -> None:
    start_ms = SyntheticStreamSource(spark, BEHIND).start_ms
    runs = {}
    for admission in ("fair", "aligned"):
        pipeline = _pipeline(admission)
        runner = MicroBatchRunner(spark, pipeline, data_root)
        results = [r for r in runner.run(max_batches=None) if r.rows_in]
        assert sum(r.rows_late for r in results) == 0
        # Seconds of event time the watermark reached after each batch with input.
        runs[admission] = [
            None if r.watermark_ms is None else (r.watermark_ms - start_ms) // 1000 for r in results
        ]
        every = SyntheticStreamSource(spark, BEHIND).read({}, {"0": 15, "1": 15}, 0).records
        expected = per_window(
            every.where(F.col("event_time") < F.timestamp_millis(F.lit(start_ms))),
            "key",
            F.window("event_time", "10 seconds"),
            F.count(F.lit(1)).alias("count"),
            F.sum("value").alias("sum_value"),
        )
        # Partition 1 ends at 0:04, so the windows before 0:00 closed, whatever the admission.
        assertDataFrameEqual(delta_frame(spark, str(data_root / f"out_{admission}")), expected)
    # A fair split takes 5 of each partition a batch: partition 1, 10 s behind, moves the
    # watermark 5 s a batch. Aligned, batch 0 knows no clock yet (a fair split); batch 1 is
    # partition 1's alone, which brings it level with partition 0 (at 0:04): the watermark
    # is where the fair split takes a batch more to bring it.
    assert runs["fair"] == [-6, -1, 4]
    assert runs["aligned"] == [-6, 4, 4]


def _by_ingestion_time(admission: str) -> Pipeline:
    """One file a batch from each folder of ``in``, under an ingestion-time watermark."""
    base = windowed(Tumbling(size="10 seconds"))
    return base.model_copy(
        update={
            "source": base.source.model_copy(update={"partition_by_folder": True}),
            "event_time": EventTime(
                column="ts",
                admission=admission,
                watermark=IngestionWatermark(
                    strategy="ingestion_time", max_event_time_lag="30 seconds"
                ),
            ),
        }
    )


def test_with_an_ingestion_clock_the_folder_listed_earliest_is_taken_first(
    spark: SparkSession, tmp_path: Path
) -> None:
    clock = FakeClock(now_ms=int(T0.timestamp() * 1000) + 60_000)
    for i in (1, 2, 3):  # listed at 0:60, modified last
        land(tmp_path / "in" / "early", f"{i}.json", [event("a", 50 + i, i)], 300 + i)
    runner = MicroBatchRunner(spark, _by_ingestion_time("fair"), tmp_path, clock)
    ends = [_end(runner)]
    clock.advance(30_000)
    land(tmp_path / "in" / "late", "1.json", [event("b", 85, 1)], 100)
    ends.append(_end(runner))
    assert ends == [{"early": 1}, {"early": 1, "late": 1}]  # the oldest file first
    clock.advance(30_000)
    for i in (2, 3):  # listed at 2:00, modified before the early folder's files
        land(tmp_path / "in" / "late", f"{i}.json", [event("b", 110 + i, i)], 100 + i)
    # The early folder's next file was listed at 1:00, the late folder's at 2:00: aligned,
    # the early folder, which holds the clock at 1:00, goes first; a fair admission takes the
    # oldest file, the late folder's.
    fair = pipeline_plan(spark, _by_ingestion_time("fair"), tmp_path, clock)
    aligned = pipeline_plan(spark, _by_ingestion_time("aligned"), tmp_path, clock)
    assert fair.end_offsets == {"early": 1, "late": 2}
    assert aligned.end_offsets == {"early": 2, "late": 1}
    # The same checkpoint either way: admission is not in the fingerprint.
    assert _by_ingestion_time("aligned").fingerprint() == _by_ingestion_time("fair").fingerprint()
    assert "admission" not in _by_ingestion_time("aligned").definition()["event_time"]


def _end(runner: MicroBatchRunner) -> dict[str, int]:
    """The end offsets of the batch ``runner`` runs next."""
    result = runner.run_batch()
    assert result is not None
    return result.end
