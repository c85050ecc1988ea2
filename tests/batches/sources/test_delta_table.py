"""A Delta table as a source (``kind: delta``): admission in versions, files and rows, exact
appends and change-feed reads while another writer appends, updates and OPTIMIZEs the
table, and one-line errors for versions it cannot read or no longer can."""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.reset import reset
from lowmark.batches.errors import PipelineConfigInvalid, SourceDataLost, SourceReplaced
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, DeltaSource, Pipeline, UnionSource
from lowmark.batches.sources.delta_table import PARTITION, DeltaStreamSource
from tests.helpers import delta_frame, vacuum_every_version


def append(spark: SparkSession, table: Path, first: int, rows: int, files: int) -> None:
    """Ids ``first`` .. ``first + rows - 1`` in exactly ``files`` files (one per ``part``),
    partitioned by ``part`` = id % files."""
    df = spark.range(first, first + rows).withColumn("part", F.col("id") % files)
    df.repartition(files, "part").write.format("delta").mode("append").partitionBy("part").save(
        str(table)
    )


def source(table: Path, spark: SparkSession, **config: object) -> DeltaStreamSource:
    return DeltaStreamSource(spark, DeltaSource(path=str(table), **config), str(table))


def ends(src: DeltaStreamSource, start: dict[str, int], batches: int) -> list[dict[str, int]]:
    """The end offsets of ``batches`` consecutive plans from ``start``."""
    found = []
    for batch in range(batches):
        start = src.plan(start, batch)
        found.append(start)
    return found


def test_a_batch_takes_versions_files_and_rows_up_to_the_limits(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = tmp_path / "t"
    append(spark, table, 0, 4, files=2)  # v0: 2 files
    append(spark, table, 100, 9, files=3)  # v1: 3 files of 3 rows
    append(spark, table, 200, 1, files=1)  # v2: 1 file
    spark.sql(f"OPTIMIZE delta.`{table}`")  # v3: rewrites, changes no row
    before = set(table.rglob("*.parquet"))
    append(spark, table, 300, 4, files=2)  # v4: 2 files
    v4 = set(table.rglob("*.parquet")) - before

    # Whole versions; the OPTIMIZE, with nothing to read, goes with the batch before it;
    # then nothing new.
    assert ends(source(table, spark, max_versions_per_batch=1), {"version": 0}, 5) == [
        {"version": 1}, {"version": 2}, {"version": 4}, {"version": 5}, {"version": 5},
    ]  # fmt: skip
    # Two files a batch: version 1 is split after its second file.
    assert ends(source(table, spark, max_files_per_batch=2), {"version": 0}, 4) == [
        {"version": 1}, {"version": 1, "index": 2}, {"version": 4}, {"version": 5},
    ]  # fmt: skip
    # Rows from the files' statistics: 3 rows a file in version 1, so 4 rows take one file
    # (then its last file and version 2's one row); version 4's files hold 2 rows each.
    assert ends(source(table, spark, max_rows_per_batch=4), {"version": 1}, 4) == [
        {"version": 1, "index": 1}, {"version": 1, "index": 2}, {"version": 4},
        {"version": 5},
    ]  # fmt: skip
    # Nothing past the newest version; the backlog counts versions; the bytes of a range
    # are its files' sizes on disk.
    src = source(table, spark)
    assert src.plan({"version": 0}, 0) == {"version": 5}
    assert src.input_bytes({"version": 4}, {"version": 5}) == sum(p.stat().st_size for p in v4)
    assert src.backlog({"version": 2}) == {"versions": 3}
    assert src.backlog({"version": 5}) == {"versions": 0}


def test_reads_exactly_the_rows_of_a_range_with_partition_values(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = tmp_path / "t"
    append(spark, table, 0, 4, files=2)
    append(spark, table, 100, 9, files=3)
    append(spark, table, 200, 1, files=1)
    src = source(table, spark, max_files_per_batch=2)
    start: dict[str, int] = {"version": 0}
    read: list[DataFrame] = []
    for batch in range(4):
        end = src.plan(start, batch)
        read.append(src.read(start, end, batch).records)
        start = end
    everything = read[0].unionByName(read[1]).unionByName(read[2]).unionByName(read[3])
    expected = delta_frame(spark, str(table)).withColumn("_p", F.lit(PARTITION))
    assertDataFrameEqual(everything.withColumnRenamed("_lowmark_partition", "_p"), expected)
    # A split version: its first two files (sorted by path: part=0, part=1) in one batch.
    assert sorted(r.id % 3 for r in read[1].collect()) == [0, 0, 0, 1, 1, 1]


def writer(spark: SparkSession, table: Path, appended: list[tuple[int, str]]) -> None:
    """Another job: appends (ids and labels it records in ``appended``), updates the labels
    of some rows, deletes some and OPTIMIZEs, one commit at a time."""
    for step in range(8):
        rows = [(step * 10 + i, f"v{step}") for i in range(5)]
        spark.createDataFrame(rows, "id LONG, label STRING").write.format("delta").mode(
            "append"
        ).save(str(table))
        appended.extend(rows)
        if step % 4 == 1:
            spark.sql(f"UPDATE delta.`{table}` SET label = 'updated' WHERE id % 10 = {step % 5}")
        if step % 4 == 3:
            spark.sql(f"OPTIMIZE delta.`{table}`")
        if step % 6 == 5:
            spark.sql(f"DELETE FROM delta.`{table}` WHERE id = {step * 10}")


@pytest.mark.integration
def test_a_table_written_while_the_pipelines_run_is_read_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = tmp_path / "upstream"
    spark.createDataFrame([], "id LONG, label STRING").write.format("delta").option(
        "delta.enableChangeDataFeed", "true"
    ).save(str(table))
    appends = Pipeline(
        name="appends",
        source=DeltaSource(path=str(table), on_change="skip", max_files_per_batch=1),
        sink=DeltaSink(path="appends_out"),
    )
    changes = Pipeline(
        name="changes",
        source=DeltaSource(path=str(table), read="changes", max_versions_per_batch=2),
        sink=DeltaSink(path="changes_out"),
    )
    root = tmp_path / "data"
    runners = [MicroBatchRunner(spark, p, root) for p in (appends, changes)]
    appended: list[tuple[int, str]] = []
    other = threading.Thread(target=writer, args=(spark, table, appended))
    other.start()
    batches = 0
    while other.is_alive():
        batches += sum(len(r.run(max_batches=1)) for r in runners)
    other.join()
    for r in runners:
        r.run(max_batches=None)
    assert batches > 2, "the pipelines ran while the table was written"

    # Appends, with the versions that updated or deleted rows passed over: every row
    # as appended, once.
    got = delta_frame(spark, str(root / "appends_out"))
    assertDataFrameEqual(got, spark.createDataFrame(appended, "id LONG, label STRING"))
    # The change feed: what a plain Spark read of the whole feed returns, once.
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(str(table))
    )
    assertDataFrameEqual(delta_frame(spark, str(root / "changes_out")), feed)
    kinds = {r[0] for r in feed.select("_change_type").distinct().collect()}
    assert kinds == {"insert", "update_preimage", "update_postimage", "delete"}


@pytest.mark.parametrize("read", ["appends", "changes"])
def test_each_row_carries_its_versions_commit_time_as_its_ingestion_time(
    spark: SparkSession, tmp_path: Path, read: str
) -> None:
    """Under an ingestion clock each row read carries its version's commit timestamp (its
    own ingestion time): appends found by their data file, the change feed by version."""
    table = tmp_path / "t"
    append(spark, table, 0, 2, files=2)
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    append(spark, table, 100, 2, files=1)  # v2
    append(spark, table, 200, 3, files=3)  # v3
    src = DeltaStreamSource(
        spark, DeltaSource(path=str(table), read=read), str(table), ingestion_clock=True
    )
    start = {"version": 2}
    rows = src.read(start, src.plan(start, 0), 0).records.collect()
    committed = {}
    for version in (2, 3):
        commit = src.log.commit(version)
        assert commit is not None
        committed[version] = commit.timestamp_ms
    own = sorted((r.id, r["_lowmark_ingested_ms"]) for r in rows)
    expected = [(i, committed[2]) for i in (100, 101)]
    assert own == expected + [(i, committed[3]) for i in (200, 201, 202)]


def test_a_version_that_changed_rows_stops_reading_appends_naming_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = tmp_path / "t"
    append(spark, table, 0, 4, files=2)
    spark.sql(f"DELETE FROM delta.`{table}` WHERE id = 1")
    with pytest.raises(PipelineConfigInvalid) as failed:
        source(table, spark).plan({"version": 0}, 0)
    assert f"Delta table {table} version 1 (DELETE) changed existing rows" in str(failed.value)
    assert "`on_change: skip`" in str(failed.value)
    assert source(table, spark, on_change="skip").plan({"version": 0}, 0) == {"version": 2}


def test_the_change_feed_of_a_table_without_one_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = tmp_path / "t"
    append(spark, table, 0, 4, files=2)
    with pytest.raises(PipelineConfigInvalid, match="has no change data feed at version 0"):
        source(table, spark, read="changes").plan({"version": 0}, 0)
    with pytest.raises(SourceDataLost, match="no Delta table at"):
        source(tmp_path / "missing", spark).plan({"version": 0}, 0)


def test_vacuumed_files_and_cleaned_up_log_are_clear_errors(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = tmp_path / "t"
    for i in range(12):  # Spark writes a checkpoint at version 10
        append(spark, table, i * 10, 2, files=1)
    src = source(table, spark, max_versions_per_batch=1)

    # Version 3's file is rewritten by OPTIMIZE, then vacuumed.
    vacuum_every_version(spark, table)
    with pytest.raises(SourceDataLost) as lost:
        read = src.read({"version": 3}, {"version": 4}, 3)
        try:
            read.records.collect()
        except Exception as exc:
            raise read.explain(exc) or exc from exc
    assert f"Delta table {table}: files of version 3 were removed (VACUUM)" in str(lost.value)
    # The batch is planned (its range is in the offset log): it can be set aside, or the
    # source can pass over what is gone.
    assert (
        "set the batch's input aside with `lowmark skip-batch` (batch 3), or set the "
        "source's `on_data_loss: skip`" in str(lost.value)
    )

    # The log before the checkpoint is cleaned up (log retention).
    for version in range(10):
        (table / "_delta_log" / f"{version:020d}.json").unlink()
    with pytest.raises(SourceDataLost) as cleaned:
        source(table, spark).plan({"version": 3}, 3)
    assert (
        f"Delta table {table}: the log of version 3 was cleaned up (log retention) before "
        "lowmark read it; the oldest version kept is 10"
    ) in str(cleaned.value)
    assert "set the source's `on_data_loss: skip`" in str(cleaned.value)
    shutil.rmtree(table)


def test_a_table_dropped_and_created_again_at_its_path_stops_the_pipeline_in_one_line(
    spark: SparkSession, tmp_path: Path
) -> None:
    table, root = tmp_path / "t", tmp_path / "data"
    for i in range(4):  # versions 0-3
        append(spark, table, i * 10, 2, files=1)
    pipeline = Pipeline(
        name="replaced", source=DeltaSource(path=str(table)), sink=DeltaSink(path="out")
    )
    MicroBatchRunner(spark, pipeline, root).run(max_batches=None)
    shutil.rmtree(table)
    for i in range(6):  # versions 0-5 of another table: a plan from version 4 skips 0-3
        append(spark, table, 100 + i * 10, 2, files=1)

    with pytest.raises(SourceReplaced) as replaced:
        MicroBatchRunner(spark, pipeline, root).run(max_batches=None)
    message = str(replaced.value)
    assert message.startswith(f"Delta table {table} was replaced (deleted and created again)")
    assert "\n" not in message
    ids = sorted(r.id for r in delta_frame(spark, str(root / "out")).collect())
    assert ids == [0, 1, 10, 11, 20, 21, 30, 31]  # the old table's rows only


def test_a_checkpoint_reset_to_go_on_after_the_sink_refuses_a_table_created_again_since(
    spark: SparkSession, tmp_path: Path
) -> None:
    table, root = tmp_path / "t", tmp_path / "data"
    for i in range(2):  # versions 0-1
        append(spark, table, i * 10, 2, files=1)
    pipeline = Pipeline(
        name="continued", source=DeltaSource(path=str(table)), sink=DeltaSink(path="out")
    )
    MicroBatchRunner(spark, pipeline, root).run(max_batches=None)
    shutil.rmtree(table)
    for i in range(4):  # versions 0-3 of another table: starting at version 2 skips 0-1
        append(spark, table, 100 + i * 10, 2, files=1)
    reset(spark, pipeline, root, "after")  # the new checkpoint starts at version 2

    with pytest.raises(SourceReplaced, match=f"^Delta table {table} was replaced .* start offsets"):
        MicroBatchRunner(spark, pipeline, root).run(max_batches=None)
    ids = sorted(r.id for r in delta_frame(spark, str(root / "out")).collect())
    assert ids == [0, 1, 10, 11]


def test_a_table_whose_newest_version_is_below_the_offsets_already_read_stops_planning(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = tmp_path / "t"
    for i in range(2):  # versions 0-1
        append(spark, table, i * 10, 2, files=1)
    src = source(table, spark)
    # Offsets recorded before identities were (an older checkpoint): versions 0-3 taken.
    with pytest.raises(SourceReplaced, match=f"Delta table {table} has no version 3, which"):
        src.plan({"version": 4}, 1)
    # A start the user chose may lie ahead: it waits for that version.
    assert source(table, spark, starting_version=4).plan({"version": 4}, 0) == {"version": 4}


def test_a_union_records_each_sources_identity_and_names_the_one_replaced(
    spark: SparkSession, tmp_path: Path
) -> None:
    kept, replaced, root = tmp_path / "kept", tmp_path / "replaced", tmp_path / "data"
    append(spark, kept, 0, 2, files=1)
    append(spark, replaced, 10, 2, files=1)
    union = UnionSource(
        sources={"a": DeltaSource(path=str(kept)), "b": DeltaSource(path=str(replaced))}
    )
    pipeline = Pipeline(name="both", source=union, sink=DeltaSink(path="out"))
    runner = MicroBatchRunner(spark, pipeline, root)
    runner.run(max_batches=None)
    recorded = runner.checkpoint.offsets.get_latest()
    assert recorded is not None
    assert sorted(recorded.source_identity) == [
        f"a/Delta table {kept}",
        f"b/Delta table {replaced}",
    ]
    shutil.rmtree(replaced)
    append(spark, replaced, 20, 2, files=1)
    with pytest.raises(SourceReplaced, match=f"^b/Delta table {replaced} was replaced"):
        MicroBatchRunner(spark, pipeline, root).run(max_batches=None)


@pytest.mark.integration
def test_with_on_data_loss_skip_cleaned_up_versions_and_vacuumed_files_are_passed_over_and_counted(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table, root = tmp_path / "t", tmp_path / "data"
    for i in range(3):  # versions 0-2
        append(spark, table, i * 10, 2, files=1)
    pipeline = Pipeline(
        name="skips",
        source=DeltaSource(path=str(table), max_versions_per_batch=1, on_data_loss="skip"),
        sink=DeltaSink(path="out"),
    )
    MicroBatchRunner(spark, pipeline, root).run(max_batches=1)  # version 0
    for i in range(3, 12):  # versions 3-11; Spark writes a checkpoint at version 10
        append(spark, table, i * 10, 2, files=1)
    for version in range(10):  # log retention: versions 1-9 were never read
        (table / "_delta_log" / f"{version:020d}.json").unlink()
    caplog.set_level(logging.WARNING)

    runner = MicroBatchRunner(spark, pipeline, root)
    runner.run(max_batches=None)
    ids = sorted(r.id for r in delta_frame(spark, str(root / "out")).collect())
    assert ids == [0, 1, 100, 101, 110, 111]
    second = runner.checkpoint.offsets.get(1)
    assert second is not None and second.start_offsets == {"version": 10}  # the gap, recorded
    skipped = [p.input_skipped for p in runner.checkpoint.progress.get_range()]
    assert skipped == [{}, {"versions": 9}, {}]
    assert f"{table} versions 1 to 9 (9 versions)" in caplog.text

    # Files VACUUM removed before a batch read them: OPTIMIZE rewrote every small file
    # into one, so versions 3 and 4's files are gone.
    other = tmp_path / "other"
    for i in range(5):
        append(spark, other, i * 10, 2, files=1)
    vacuum_every_version(spark, other)
    read = source(other, spark, on_data_loss="skip").read({"version": 3}, {"version": 5}, 3)
    assert read.records.collect() == []
    assert f"batch 3 passes over 2 files (4 rows) of Delta table {other}" in caplog.text
