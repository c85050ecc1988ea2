"""Backfilling an event-time partition replaces exactly its slice of the sink."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from batches.backfill import backfill_partition
from batches.errors import PartitionNotClosed
from batches.microbatch import MicroBatchRunner
from batches.pipeline import EventTimePartitions
from batches.windows import Tumbling
from tests.batches.test_windows import T0, drop_batches, event, reference, sink, windowed

HOUR = 3600
WINDOW = Tumbling(size="10 seconds")
PIPELINE = windowed(WINDOW, allowed_lateness="10 seconds").model_copy(
    update={"backfill": EventTimePartitions(granularity="hourly", start="2026-01-01")}
)


def hour(n: int) -> tuple[datetime, datetime]:
    return T0 + timedelta(hours=n), T0 + timedelta(hours=n + 1)


def in_hour(df: DataFrame, n: int) -> DataFrame:
    start, end = hour(n)
    return df.where((F.col("window_start") >= F.lit(start)) & (F.col("window_start") < F.lit(end)))


@pytest.fixture(scope="module")
def streamed(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four batches: hour 0, hour 1, a record late for hour 0, then time moves to hour 3."""
    root = tmp_path_factory.mktemp("streamed")
    drop_batches(
        root,
        [
            [event("a", 1, 1), event("a", 15, 2), event("b", 3, 4)],
            [event("a", HOUR + 5, 8)],
            [event("a", 2, 16), event("b", HOUR + 30, 32)],
            [event("c", 3 * HOUR, 64)],
        ],
    )
    results = MicroBatchRunner(spark, PIPELINE, root).run(max_batches=None)
    assert sum(r.rows_late for r in results) == 1  # a@2s: its window [0,10) had closed
    return root


@pytest.fixture
def root(streamed: Path, tmp_path: Path) -> Path:
    """A private copy of the streamed data root (checkpoint, sink and input)."""
    return Path(shutil.copytree(streamed, tmp_path / "copy"))


def test_a_backfill_recomputes_its_hour_from_all_history_and_leaves_other_hours_alone(
    spark: SparkSession, root: Path
) -> None:
    streamed_rows = sink(spark, root)
    others = streamed_rows.where(F.col("window_start") >= F.lit(hour(1)[0])).collect()
    result = backfill_partition(spark, PIPELINE, root, *hour(0))
    after = sink(spark, root)
    # Hour 0 now equals a plain batch aggregation of every record, the late one included.
    assertDataFrameEqual(in_hour(after, 0), in_hour(reference(spark, root, WINDOW), 0))
    assert result.windows == 3 and not result.skipped
    # Every other window is exactly as the stream wrote it.
    assertDataFrameEqual(after.where(F.col("window_start") >= F.lit(hour(1)[0])), others)


def test_repeating_a_backfill_over_the_same_history_is_skipped(
    spark: SparkSession, root: Path
) -> None:
    first = backfill_partition(spark, PIPELINE, root, *hour(0))
    rows = sink(spark, root).collect()
    again = backfill_partition(spark, PIPELINE, root, *hour(0))
    assert again.skipped and again.sink_version == first.sink_version
    assertDataFrameEqual(sink(spark, root), rows)


def test_a_partition_the_watermark_has_not_closed_is_refused_unless_forced(
    spark: SparkSession, root: Path
) -> None:
    with pytest.raises(PartitionNotClosed, match=r"2026-01-01 03:00\.\.2026-01-01 04:00 .* open"):
        backfill_partition(spark, PIPELINE, root, *hour(3))
    forced = backfill_partition(spark, PIPELINE, root, *hour(3), force=True)
    assert forced.windows == 1
    assertDataFrameEqual(in_hour(sink(spark, root), 3), in_hour(reference(spark, root, WINDOW), 3))
