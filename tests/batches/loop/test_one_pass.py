"""A windowed batch reads its input once, and reads it again only for bad rows.

The first job computes the window partials while Spark observes the input's
counts and collects its late rows; a second read runs only when that job saw
bad rows, or when Spark could not observe it. Whatever path a batch takes, every input row is
accounted for, and a transform that gives two reads different records is
refused rather than trusted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import FileSource
from lowmark.batches.windows import Tumbling
from tests.helpers import T0, counted_batch, delta_frame, drop_batches, event, sink, windowed


def test_a_windowed_batch_with_clean_input_is_one_spark_job(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_batches(data_root, [[event("a", 1, 1)], [event("a", 2, 2), event("b", 14, 3)]])
    # No read-ahead: each batch runs its own job (tests/batches/loop/test_catch_up.py has both).
    p = windowed(Tumbling(size="10 seconds")).model_copy(update={"read_ahead_batches": 1})
    runner = MicroBatchRunner(spark, p, data_root)
    runner.run_batch()
    result, counter = counted_batch(spark, runner, monkeypatch)
    assert (result.rows_in, result.rows_late, result.rows_bad) == (2, 0, 0)
    # The partials' job; the counts ride along; tumbling windows merge on the driver.
    assert counter.jobs() == 1, counter.per_step


def test_a_windowed_batch_with_late_rows_collects_them_in_its_one_spark_job(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Watermark after batch 0: 25 s. In batch 1, b@3 belongs to [0,10), closed: late;
    # c has no event time: late too.
    later = [event("a", 26, 5), event("b", 3, 7), {"user": "c", "amount": 1}]
    drop_batches(data_root, [[event("a", 1, 1), event("a", 25, 1)], later])
    p = windowed(Tumbling(size="10 seconds")).model_copy(update={"read_ahead_batches": 1})
    runner = MicroBatchRunner(spark, p, data_root)
    runner.run_batch()
    result, counter = counted_batch(spark, runner, monkeypatch)
    assert (result.rows_in, result.rows_late) == (3, 2)
    assert counter.jobs() == 1, counter.per_step
    late = delta_frame(spark, runner.checkpoint.table("late"))
    late = late.withColumn("event_ms", F.unix_millis("event_time"))
    rows = [
        (r.batch_id, r.event_ms, r.watermark_ms, r.reason.split(":")[0], json.loads(r.record))
        for r in late.orderBy(F.col("event_ms").asc_nulls_last()).collect()
    ]
    t0_ms = int(T0.timestamp() * 1000)
    assert [row[:4] for row in rows] == [
        (1, t0_ms + 3_000, t0_ms + 25_000, "all windows closed"),
        (1, None, t0_ms + 25_000, "no event time"),
    ]
    assert sorted((r[4]["user"], r[4]["amount"]) for r in rows) == [("b", 7), ("c", 1)]


def test_bad_rows_even_in_unused_columns_and_late_rows_are_all_found(
    spark: SparkSession, data_root: Path
) -> None:
    p = windowed(Tumbling(size="10 seconds"), "update")
    # ``note`` is used by no window or aggregate: its bad value still makes a bad row.
    p = p.model_copy(
        update={
            "source": FileSource(
                path="in",
                format="json",
                schema_ddl="user STRING, ts TIMESTAMP, amount LONG, note INT",
                max_files_per_batch=1,
            )
        }
    )
    later = [event("a", 26, 5), event("b", 3, 7), {**event("c", 27, 1), "note": "not a number"}]
    drop_batches(data_root, [[event("a", 1, 1), event("a", 25, 1)], later])
    with (data_root / "in" / "b001.json").open("a") as f:
        f.write("{not json\n")
    os.utime(data_root / "in" / "b001.json", (1_700_000_001, 1_700_000_001))
    runner = MicroBatchRunner(spark, p, data_root)
    _, second = runner.run(max_batches=2)
    assert (second.rows_in, second.rows_bad, second.rows_late) == (4, 2, 1)
    bad = delta_frame(spark, runner.checkpoint.table("bad_records")).collect()
    assert sorted(r.raw.startswith("{not json") for r in bad) == [False, True]
    late = delta_frame(spark, runner.checkpoint.table("late")).collect()
    assert [('"user":"b"' in r.record) for r in late] == [True]
    out = {
        (r.user, r.window_start.second): r["sum_amount"] for r in sink(spark, data_root).collect()
    }
    assert out == {("a", 0): 1, ("a", 20): 6}


def test_a_transform_that_gives_two_reads_different_records_is_refused(
    spark: SparkSession, data_root: Path
) -> None:
    limits = [3, 2]

    def shrinking(records: DataFrame) -> DataFrame:
        """Takes fewer records each time it is called: not a function of its input."""
        return records.limit(limits.pop(0) if limits else 1)

    p = windowed(Tumbling(size="10 seconds")).model_copy(update={"transform": shrinking})
    drop_batches(data_root, [[event("a", 1, 1), event("b", 2, 2), event("c", 3, 3)]])
    # A line that does not parse, first (the limit stops the scan after three records):
    # the batch reads its input a second time for it.
    first = data_root / "in" / "b000.json"
    first.write_text("{not json\n" + first.read_text())
    os.utime(data_root / "in" / "b000.json", (1_700_000_000, 1_700_000_000))
    runner = MicroBatchRunner(spark, p, data_root)
    with pytest.raises(PipelineConfigInvalid, match="make it deterministic"):
        runner.run_batch()


def test_a_transform_spark_proves_empty_still_counts_every_input_row(
    spark: SparkSession, data_root: Path
) -> None:
    p = windowed(Tumbling(size="10 seconds")).model_copy(
        update={"transform": lambda records: records.where(F.lit(False))}
    )
    drop_batches(data_root, [[event("a", 1, 1), event("b", 2, 2)]])
    result = MicroBatchRunner(spark, p, data_root).run_batch()
    assert result is not None
    assert (result.rows_in, result.rows_out, result.rows_late) == (2, 0, 0)
