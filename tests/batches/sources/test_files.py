"""The file source: discovery order, admission limits, replay, bad records."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from lowmark.batches.errors import PipelineConfigInvalid, SourceFileChanged, SourceFileMissing
from lowmark.batches.loop import faults
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, FileSource
from lowmark.batches.records import INGESTED_COLUMN
from lowmark.batches.sources.base import BATCH_COLUMN, Range
from lowmark.batches.sources.files import FileStreamSource
from lowmark.state.errors import CheckpointMissing
from lowmark.state.manifest import FileManifest
from lowmark.state.source_schema import SourceSchema
from tests.helpers import FakeClock, delta_frame, drop_file, pipeline, sink_ids
from tests.helpers import write_json_lines as land

SCHEMA = "id LONG, amount LONG"


def test_files_are_taken_in_modification_time_then_path_order(
    spark: SparkSession, data_root: Path
) -> None:
    drop_file(data_root, 2)
    late_name_early_time = drop_file(data_root, 1)
    os.utime(late_name_early_time, (1_600_000_000, 1_600_000_000))
    drop_file(data_root, 0)
    src = FileSource(path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1)
    runner = MicroBatchRunner(spark, pipeline(source=src), data_root)
    firsts = [sink_ids_after(spark, data_root, runner) for _ in range(3)]
    assert firsts == [[100, 101, 102], [0, 1, 2], [200, 201, 202]]


def sink_ids_after(spark: SparkSession, root: Path, runner: MicroBatchRunner) -> list[int]:
    before = set(sink_ids(spark, root)) if (root / "out").exists() else set()
    runner.run_batch()
    return sorted(set(sink_ids(spark, root)) - before)


def test_max_bytes_per_batch_admits_a_prefix_but_always_at_least_one_file(
    spark: SparkSession, data_root: Path
) -> None:
    sizes = [drop_file(data_root, i).stat().st_size for i in range(3)]
    src = FileSource(
        path="in", format="json", schema_ddl=SCHEMA, max_bytes_per_batch=sizes[0] + sizes[1]
    )
    runner = MicroBatchRunner(spark, pipeline(source=src), data_root)
    assert [(r.start, r.end) for r in runner.run(max_batches=None)] == [
        ({"0": 0}, {"0": 2}),
        ({"0": 2}, {"0": 3}),
    ]

    tiny = FileSource(path="in", format="json", schema_ddl=SCHEMA, max_bytes_per_batch=1)
    other_pipeline = pipeline(source=tiny, checkpoint="tiny", sink=DeltaSink(path="out_tiny"))
    other = MicroBatchRunner(spark, other_pipeline, data_root)
    assert other.run_batch().end == {"0": 1}  # type: ignore[union-attr]


def test_the_manifest_records_which_files_each_batch_took(
    spark: SparkSession, data_root: Path
) -> None:
    for i in range(3):
        drop_file(data_root, i)
    src = FileSource(path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=2)
    runner = MicroBatchRunner(spark, pipeline(source=src), data_root)
    runner.run(max_batches=None)
    ckpt = runner.checkpoint.location
    took = spark.sql(
        f"""SELECT o.batch_id, element_at(split(f.path, '/'), -1) AS file
            FROM delta.`{ckpt}/offsets` o JOIN delta.`{ckpt}/files` f
              ON f.seq >= get_json_object(o.start_offsets, '$.0')
             AND f.seq <  get_json_object(o.end_offsets, '$.0')
            ORDER BY f.seq"""
    ).collect()
    assert [(r.batch_id, r.file) for r in took] == [
        (0, "f000.json"),
        (0, "f001.json"),
        (1, "f002.json"),
    ]


def test_an_inferred_schema_is_fixed_once_and_reused(spark: SparkSession, data_root: Path) -> None:
    drop_file(data_root, 0)
    src = FileSource(path="in", format="json")
    runner = MicroBatchRunner(spark, pipeline(source=src), data_root)
    runner.run_batch()
    (data_root / "in" / "f001.json").write_text('{"id": 7, "amount": 1, "extra": "x"}\n')
    runner.run_batch()
    out = delta_frame(spark, str(data_root / "out"))
    assert sorted(out.columns) == ["amount", "id"]
    assert sorted(r.id for r in out.collect()) == [0, 1, 2, 7]


def test_malformed_json_rows_are_quarantined_with_file_and_raw_text(
    spark: SparkSession, data_root: Path
) -> None:
    folder = data_root / "in"
    folder.mkdir()
    (folder / "a.json").write_text(
        '{"id": 1, "amount": 5}\n{"id": 2, oops\n{"id": "x", "amount": 1}\n'
    )
    runner = MicroBatchRunner(spark, pipeline(), data_root)
    result = runner.run_batch()
    assert result is not None and (result.rows_in, result.rows_out, result.rows_bad) == (3, 1, 2)
    bad = delta_frame(spark, runner.checkpoint.table("bad_records")).collect()
    assert sorted(r.raw for r in bad) == ['{"id": "x", "amount": 1}', '{"id": 2, oops']
    assert {r.source_file.rsplit("/", 1)[-1] for r in bad} == {"a.json"}
    assert {r.batch_id for r in bad} == {0}
    assert all("malformed json" in r.reason for r in bad)
    assert sink_ids(spark, data_root) == [1]


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_files_named_with_glob_characters_are_read_as_themselves(
    spark: SparkSession, data_root: Path, fmt: str
) -> None:
    # Spark's readers expand glob patterns: "a[1]" alone would match "a1", not itself.
    folder = data_root / "in"
    folder.mkdir()
    names = ["a[1]", "a1", "b{x,y}", "c*", "d?", "e\\f", "g %20 #ü"]
    for i, name in enumerate(names):
        if fmt == "json":
            (folder / f"{name}.json").write_text(f'{{"id": {i}, "amount": {10 * i}}}\n')
        else:
            table = pa.table({"id": [i], "amount": [10 * i]})
            pq.write_table(table, folder / f"{name}.parquet")
    if fmt == "json":  # a malformed line names its file
        (folder / "h[2].json").write_text("oops\n")
    src = FileSource(path="in", format=fmt, schema_ddl=SCHEMA if fmt == "json" else None)
    runner = MicroBatchRunner(spark, pipeline(source=src), data_root)
    runner.run(max_batches=None)
    assert sink_ids(spark, data_root) == list(range(len(names)))
    if fmt == "json":
        bad = delta_frame(spark, runner.checkpoint.table("bad_records")).collect()
        assert [r.source_file.rsplit("/", 1)[-1] for r in bad] == ["h%5B2%5D.json"]


def test_malformed_csv_rows_are_quarantined_and_the_batch_goes_on(
    spark: SparkSession, data_root: Path
) -> None:
    folder = data_root / "in"
    folder.mkdir()
    (folder / "a.csv").write_text("id,amount\n1,5\n2,not-a-number\n3,7\n")
    src = FileSource(path="in", format="csv", schema_ddl=SCHEMA)
    runner = MicroBatchRunner(spark, pipeline(source=src), data_root)
    result = runner.run_batch()
    assert result is not None and result.rows_bad == 1
    bad = delta_frame(spark, runner.checkpoint.table("bad_records")).collect()
    assert [r.raw for r in bad] == ["2,not-a-number"]
    assert sink_ids(spark, data_root) == [1, 3]


def test_parquet_files_are_read_with_their_schema(spark: SparkSession, data_root: Path) -> None:
    spark.createDataFrame([(1, 10), (2, 20)], SCHEMA).coalesce(1).write.parquet(
        str(data_root / "in")
    )
    src = FileSource(path="in", format="parquet")
    MicroBatchRunner(spark, pipeline(source=src), data_root).run(max_batches=None)
    assert sink_ids(spark, data_root) == [1, 2]


def test_a_file_removed_before_its_batch_is_replayed_is_a_clear_error(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = drop_file(data_root, 0)
    runner = MicroBatchRunner(spark, pipeline(), data_root)
    monkeypatch.setattr(runner.checkpoint.commits, "add", lambda entry: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        runner.run_batch()
    path.unlink()
    with pytest.raises(SourceFileMissing, match=r"f000.json \(taken by batch 0\) is gone"):
        MicroBatchRunner(spark, pipeline(), data_root).run_batch()


def test_a_file_landing_after_a_crash_in_planning_is_taken_by_a_later_batch_not_lost(
    spark: SparkSession, data_root: Path
) -> None:
    # Planning batch 0 recorded f000 in the manifest, then the process died.
    drop_file(data_root, 0)
    with faults.crash_at(faults.KillPoint("after_plan", 0)), pytest.raises(faults.InjectedCrash):
        MicroBatchRunner(spark, pipeline(), data_root).run_batch()
    drop_file(data_root, 1)  # Delta skips discovery for batch 0 now: it landed before

    results = MicroBatchRunner(spark, pipeline(), data_root).run(max_batches=None)

    assert [(r.batch_id, r.end) for r in results] == [(0, {"0": 1}), (1, {"0": 2})]
    assert sink_ids(spark, data_root) == [0, 1, 2, 100, 101, 102]


def test_a_lost_file_manifest_is_a_clear_error_not_a_restart_from_zero(
    spark: SparkSession, data_root: Path
) -> None:
    drop_file(data_root, 0)
    runner = MicroBatchRunner(spark, pipeline(), data_root)
    runner.run_batch()
    shutil.rmtree(runner.checkpoint.table("files"))
    drop_file(data_root, 1)
    with pytest.raises(CheckpointMissing, match=r"file manifest .*files is missing: restore it"):
        MicroBatchRunner(spark, pipeline(), data_root).run_batch()


def test_backlog_counts_unseen_and_uncommitted_files(spark: SparkSession, data_root: Path) -> None:
    sizes = [drop_file(data_root, i).stat().st_size for i in range(3)]
    src = FileSource(path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1)
    runner = MicroBatchRunner(spark, pipeline(source=src), data_root)
    assert runner.source.backlog({"0": 0}) == {"files": 3, "bytes": sum(sizes)}
    result = runner.run_batch()
    assert result is not None
    assert runner.source.backlog(result.end) == {"files": 2, "bytes": sizes[1] + sizes[2]}


def test_a_file_modified_less_than_min_file_age_ago_waits_for_a_later_batch(
    spark: SparkSession, data_root: Path
) -> None:
    drop_file(data_root, 0)  # modified in 2023: settled
    still_written = drop_file(data_root, 1)
    os.utime(still_written, None)  # modified just now: its producer may still write
    src = FileSource(path="in", format="json", schema_ddl=SCHEMA, min_file_age="1 hour")
    runner = MicroBatchRunner(spark, pipeline(source=src), data_root)
    assert [r.end for r in runner.run(max_batches=None)] == [{"0": 1}]
    assert sink_ids(spark, data_root) == [0, 1, 2]
    # An hour later (its modification time moved back), the next batch takes it.
    os.utime(still_written, (time.time() - 3601, time.time() - 3601))
    assert [r.end for r in runner.run(max_batches=None)] == [{"0": 2}]
    assert sink_ids(spark, data_root) == [0, 1, 2, 100, 101, 102]


def test_folder_partitions_a_batch_takes_no_file_of_are_left_for_later_batches(
    spark: SparkSession, data_root: Path
) -> None:
    # Both folders have a file before batch 0, which may take one: the manifest then
    # holds a file of a partition batch 0's offsets do not name (a KeyError before).
    for i, folder in enumerate(("eu", "us")):
        (data_root / "in" / folder).mkdir(parents=True)
        shutil.move(drop_file(data_root, i), data_root / "in" / folder / f"f{i}.json")
    src = FileSource(
        path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1, partition_by_folder=True
    )
    runner = MicroBatchRunner(spark, pipeline(source=src), data_root)
    assert [(r.start, r.end) for r in runner.run(max_batches=None)] == [
        ({}, {"eu": 1}),
        ({"eu": 1}, {"eu": 1, "us": 1}),
    ]
    assert sorted(sink_ids(spark, data_root)) == [0, 1, 2, 100, 101, 102]


@pytest.mark.parametrize("processed", ["archive", "delete"])
def test_processed_files_are_archived_or_deleted_once_their_batch_committed(
    spark: SparkSession, data_root: Path, processed: str
) -> None:
    for i in range(3):
        drop_file(data_root, i)
    src = FileSource(
        path="in",
        format="json",
        schema_ddl=SCHEMA,
        max_files_per_batch=1,
        processed_files=processed,
        archive_dir="archive" if processed == "archive" else None,
    )
    p = pipeline(source=src)
    folder, archive = data_root / "in", data_root / "archive"
    assert MicroBatchRunner(spark, p, data_root).run_batch() is not None
    assert sorted(f.name for f in folder.iterdir()) == ["f001.json", "f002.json"]
    # A batch that crashed after its sink write keeps its file for its replay; one that
    # crashed after its commit, before the clean-up, loses it with the next commit.
    with faults.crash_at(faults.KillPoint("after_sink", 1)), pytest.raises(faults.InjectedCrash):
        MicroBatchRunner(spark, p, data_root).run_batch()
    assert (folder / "f001.json").exists()
    with faults.crash_at(faults.KillPoint("after_commit", 1)), pytest.raises(faults.InjectedCrash):
        MicroBatchRunner(spark, p, data_root).run_batch()
    assert (folder / "f001.json").exists()
    drop_file(data_root, 3)  # still found beside what was cleaned
    assert len(MicroBatchRunner(spark, p, data_root).run(max_batches=None)) == 2
    assert list(folder.iterdir()) == []
    archived = sorted(f.name for f in archive.iterdir()) if archive.exists() else []
    assert archived == ([f"f00{i}.json" for i in range(4)] if processed == "archive" else [])
    assert sink_ids(spark, data_root) == [i * 100 + j for i in range(4) for j in range(3)]


def test_an_archive_dir_inside_the_source_folder_is_refused(
    spark: SparkSession, data_root: Path
) -> None:
    src = FileSource(path="in", format="json", processed_files="archive", archive_dir="in/done")
    with pytest.raises(PipelineConfigInvalid, match=r"archive_dir .* is inside the source folder"):
        MicroBatchRunner(spark, pipeline(source=src), data_root)


def test_a_file_that_changes_while_its_batch_reads_it_is_refused_before_anything_is_written(
    spark: SparkSession, data_root: Path
) -> None:
    path = drop_file(data_root, 0, rows=3)
    source = MicroBatchRunner(spark, pipeline(), data_root).source
    start = source.initial_offsets()
    batch = Range(0, start, source.plan(start, 0))
    assert source.read(batch.start, batch.end, 0).records.count() == 3
    source.confirm(batch)

    with path.open("a") as f:  # the producer writes on while the batch's job runs
        f.write('{"id": 3, "amount": 3}\n')
    with pytest.raises(SourceFileChanged, match=r"f000.json \(taken by batch 0\) changed while"):
        source.confirm(batch)

    # Read again (nothing was written): the manifest records the file as read now, so a
    # replay of a half-written batch (a strict read) reads the same four rows.
    assert source.read(batch.start, batch.end, 0).records.count() == 4
    source.confirm(batch)
    assert source.read(batch.start, batch.end, 0, strict=True).records.count() == 4


def test_maintenance_retires_committed_files_once_they_left_the_folder_and_no_others(
    spark: SparkSession, data_root: Path
) -> None:
    paths = [drop_file(data_root, i) for i in range(4)]
    source_config = FileSource(path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1)
    runner = MicroBatchRunner(spark, pipeline(source=source_config), data_root)
    for _ in range(3):
        runner.run_batch()  # batches 0..2 take f000..f002; f003 is listed and waits
    manifest, source = runner.checkpoint.files, runner.source

    def kept() -> list[int]:
        return [f.seq for f in manifest.files()]

    paths[1].unlink()  # the producer's own retention; f000 is still there
    source.retire({"0": 3}, 2)
    assert kept() == [0, 1, 2, 3]
    paths[0].unlink()
    paths[2].unlink()
    source.retire({"0": 2}, 2)  # as if batch 2 had not committed: f002 is not retired
    assert kept() == [2, 3]
    source.retire({"0": 3}, 2)  # f003 waits for a batch (and is the partition's last)
    assert kept() == [3]
    assert [f.seq for f in manifest.files(retired=True)] == [0, 1, 2, 3]

    assert runner.run_batch() is not None  # planning goes on after the retired files
    assert sink_ids(spark, data_root) == [i * 100 + r for i in range(4) for r in range(3)]
    assert runner.planner.next_batch(dry_run=True).planned is None


def test_aligned_admission_by_listing_time_stops_a_folder_at_the_next_folders_clock(
    spark: SparkSession, data_root: Path
) -> None:
    clock = FakeClock()
    config = FileSource(
        path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=2, partition_by_folder=True
    )
    manifest = FileManifest(str(data_root / "cp" / "files"), ":files")
    schema = SourceSchema(str(data_root / "cp" / "schema"), ":schema")

    def source(ingestion_clock: bool) -> FileStreamSource:
        folder = str(data_root / "in")
        return FileStreamSource(
            spark, config, folder, manifest, schema, clock=clock, ingestion_clock=ingestion_clock
        )

    # Listed (recorded by a plan) at 0 s, 10 s, 20 s; the late folder's file modified first.
    for seconds, (folder, mtime) in enumerate((("early", 300), ("late", 100), ("early", 301))):
        land(data_root / "in" / folder, f"{mtime}.json", [{"id": mtime, "amount": 1}], mtime)
        source(False).plan({}, seconds)
        clock.advance(10_000)
    clocks = {"early": clock.now - 30_000, "late": clock.now - 20_000}
    # The early folder's second file was listed after the late folder's clock: the late
    # folder's file goes before it.
    assert source(True).plan({}, 3, record=False, clocks=clocks) == {"early": 1, "late": 1}
    # Clocks that are not listing times (event times seen) cap nothing: lowest first.
    assert source(False).plan({}, 3, record=False, clocks=clocks) == {"early": 2}


def test_a_read_of_several_batches_finds_each_records_batch_in_a_map_spark_folds(
    spark: SparkSession, data_root: Path
) -> None:
    """Each record of a read-ahead's scan carries its file's batch and ingestion time,
    looked up in maps that are literals by the time Spark plans the scan: built from one
    JSON literal, which must not be parsed again for every record."""
    config = FileSource(path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1)
    manifest = FileManifest(str(data_root / "cp" / "files"), ":files")
    schema = SourceSchema(str(data_root / "cp" / "schema"), ":schema")
    source = FileStreamSource(
        spark, config, str(data_root / "in"), manifest, schema, ingestion_clock=True
    )
    for i in range(3):  # a name a URI escapes, and a quote JSON and SQL would escape
        land(data_root / "in", f"it's {i}.json", [{"id": i, "amount": 1}], 100 + i)
    ranges: list[Range] = []
    start: dict[str, int] = {}
    for batch_id in range(3):
        end = source.plan(start, batch_id)
        ranges.append(Range(batch_id, start, end))
        start = end
    read = source.read_batches(ranges)
    assert read is not None
    records = read.records.select("id", BATCH_COLUMN, INGESTED_COLUMN)
    rows = sorted(tuple(r) for r in records.collect())
    assert [(i, b) for i, b, _ in rows] == [(0, 0), (1, 1), (2, 2)]
    listed = {f.seq: f.discovered_ms for f in manifest.files()}
    assert [at for _, _, at in rows] == [listed[i] for i in range(3)]
    plan = records._jdf.queryExecution().optimizedPlan().toString().lower()
    assert "map(keys: [" in plan
    assert "from_json" not in plan and "jsontostructs" not in plan


def test_the_rows_that_did_not_parse_are_found_once_their_cached_parse_is_gone(
    spark: SparkSession, data_root: Path
) -> None:
    """A read cached for a stateless batch takes its rows that did not parse from the parse
    unobserved; once the cache is dropped (unpersisted, or evicted when another batch drops
    an equal plan), their query goes to the files again and must still parse every column:
    Spark refuses a query of the corrupt-record column alone."""
    config = FileSource(path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1)
    manifest = FileManifest(str(data_root / "cp" / "files"), ":files")
    schema = SourceSchema(str(data_root / "cp" / "schema"), ":schema")
    source = FileStreamSource(spark, config, str(data_root / "in"), manifest, schema)
    (data_root / "in").mkdir()
    (data_root / "in" / "a.json").write_text('{"id": 1, "amount": 5}\n{"id": 2, oops\n')
    end = source.plan({}, 0)
    read = source.read({}, end, 0, cache=True)
    read.unpersist()
    assert read.bad is not None
    assert [r.raw for r in read.bad.collect()] == ['{"id": 2, oops']
    assert [r.id for r in read.records.collect()] == [1]
