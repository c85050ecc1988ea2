"""Cost follows touched state: a batch never opens state files of windows it cannot touch."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.windows import Tumbling
from tests.helpers import T0, drop_batches, event, windowed

DAY = 86_400


def test_a_batch_of_recent_windows_neither_reads_nor_rewrites_state_files_of_old_windows(
    spark: SparkSession, data_root: Path
) -> None:
    # Two groups of open windows a day apart (lateness keeps both open), each
    # written by its own batch; then a batch that updates the recent group.
    old = [event(u, 1, 1) for u in ("a", "b", "c")]
    recent = [event(u, DAY + 1, 1) for u in ("a", "b", "c")]
    update = [event("a", DAY + 2, 5), event("b", DAY + 3, 5), event("d", DAY + 4, 5)]
    drop_batches(data_root, [old, recent, update])
    runner = MicroBatchRunner(
        spark, windowed(Tumbling(size="10 seconds"), allowed_lateness="30 days"), data_root
    )
    runner.run(max_batches=2)
    path = runner.checkpoint.table("state_windows")
    half_way = F.lit(T0 + timedelta(seconds=DAY / 2))
    files = (
        spark.read.format("delta")
        .load(path)
        .select(
            F.col("_metadata.file_path").alias("file"),
            (F.col("window_start") < half_way).alias("old"),
        )
    )
    old_files = {r.file for r in files.where(F.col("old")).select("file").distinct().collect()}
    new_files = {r.file for r in files.where(~F.col("old")).select("file").distinct().collect()}
    assert old_files and not old_files & new_files
    # If the batch opened any file of the old windows (to read state, to look
    # for final windows, or in the MERGE's scan), it would now fail.
    for file in old_files:
        Path(file.removeprefix("file:")).unlink()

    assert [r.batch_id for r in runner.run(max_batches=1)] == [2]

    [merge] = DeltaTable(path).history(1)
    assert merge["operation"] == "MERGE"
    metrics = merge["operationMetrics"]
    assert (metrics["num_target_rows_updated"], metrics["num_target_rows_inserted"]) == (2, 1)
    # Only the recent group's file was rewritten: its one untouched window ("c") is copied.
    assert metrics["num_target_rows_copied"] == 1
    recent_state = spark.read.format("delta").load(path).where(F.col("window_start") > half_way)
    counts = {r.user: r.count__count for r in recent_state.collect()}
    assert counts == {"a": 2, "b": 2, "c": 1, "d": 1}
