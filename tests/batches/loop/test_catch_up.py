"""Catch-up read-ahead: the next batches' records in one Spark job, each batch's result its own.

A runner that finds a backlog looks at the next batches in one job; every
batch still commits alone. The proof is a second runner over the same input
that reads nothing ahead: batch by batch, both must commit the same counts and
watermarks and write the same sink, late, bad-record and state rows — with
batches whose own job is needed (late rows, rows without event time, bad
rows) among those read ahead.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from lowmark.batches.loop.catch_up import row_by_row
from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
from lowmark.batches.pipeline import FileSource, Pipeline
from lowmark.batches.sources.base import BATCH_COLUMN, PARTITION_COLUMN
from lowmark.batches.windows import Sliding, Tumbling
from tests.helpers import (
    SCHEMA,
    counted_batch,
    delta_frame,
    drop_batches,
    event,
    windowed,
    write_json_lines,
)

BACKLOG: list[list[dict[str, Any]]] = [
    [event("a", 1, 1), event("b", 2, 2)],
    [event("a", 12, 3), event("a", 25, 1)],  # watermark after: 25 s
    [event("a", 22, 10), event("a", 3, 100)],  # a@3: its window [0,10) is closed: late
    [event("c", 31, 4), {"user": "d", "amount": 9}],  # d: no event time
    [event("b", 42, 5), event("b", 43, 6)],  # + a line that does not parse
    [event("a", 55, 6), event("b", 56, 7)],
    [event("c", 61, 1), event("a", 62, 2)],
]


TUMBLING = Tumbling(size="10 seconds")


def _pipeline(read_ahead: int, window: Tumbling | Sliding = TUMBLING) -> Pipeline:
    p = windowed(window, allowed_lateness="5 seconds")
    return p.model_copy(update={"read_ahead_batches": read_ahead})


def _run(
    spark: SparkSession, root: Path, p: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[BatchResult], list[int], MicroBatchRunner]:
    """Every batch of ``p`` over ``root``; the results and each batch's Spark jobs."""
    runner = MicroBatchRunner(spark, p, root)
    results, jobs = [], []
    while runner.planner.next_batch(dry_run=True).planned is not None:
        result, counter = counted_batch(spark, runner, monkeypatch)
        results.append(result)
        jobs.append(counter.jobs())
    return results, jobs, runner


def _tables(spark: SparkSession, runner: MicroBatchRunner, root: Path) -> dict[str, list[Any]]:
    def rows(path: str, order: list[str]) -> list[Any]:
        df = delta_frame(spark, path)
        return [tuple(r) for r in df.select(*order).orderBy(*order).collect()]

    ckpt = runner.checkpoint
    return {
        "sink": rows(str(root / "out"), ["user", "window_start", "count", "sum_amount"]),
        "late": rows(ckpt.table("late"), ["batch_id", "event_time", "reason", "record"]),
        "bad": rows(ckpt.table("bad_records"), ["batch_id", "raw"]),
        "state": rows(
            ckpt.table("state_windows"),
            ["user", "window_start", "count__count", "sum_amount__sum", "updated_batch"],
        ),
    }


def _summary(results: list[BatchResult]) -> list[tuple[Any, ...]]:
    return [
        (r.batch_id, r.start, r.end, r.rows_in, r.rows_out, r.rows_bad, r.rows_late, r.watermark_ms)
        for r in results
    ]


def _land_backlog(root: Path) -> None:
    drop_batches(root, BACKLOG)
    with (root / "in" / "b004.json").open("a") as f:
        f.write('{"user": "b", "ts": oops\n')
    os.utime(root / "in" / "b004.json", (1_700_000_004, 1_700_000_004))


def dedup(records: DataFrame) -> DataFrame:
    """Not row by row: over several batches at once it would drop a record that a
    batch alone keeps (its twin is in another batch)."""
    return records.dropDuplicates(["user", "ts", "amount"])


@pytest.mark.parametrize(
    "transform",
    [None, pytest.param(dedup, marks=pytest.mark.integration)],
    ids=["one_scan", "scan_per_batch"],
)
def test_a_backlog_is_looked_at_in_one_job_and_every_batch_commits_as_alone(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    transform: Callable[[DataFrame], DataFrame] | None,
) -> None:
    caplog.set_level(logging.INFO, logger="lowmark.batches.loop.catch_up")
    ahead_root, alone_root = tmp_path / "ahead", tmp_path / "alone"
    _land_backlog(ahead_root)
    # A twin of batch 5's record in batch 6: a transform given several batches at
    # once (dedup) would drop it.
    with (ahead_root / "in" / "b006.json").open("a") as f:
        f.write(json.dumps(event("a", 55, 6)) + "\n")
    os.utime(ahead_root / "in" / "b006.json", (1_700_000_006, 1_700_000_006))
    shutil.copytree(ahead_root / "in", alone_root / "in")
    ahead_p, alone_p = (_pipeline(n).model_copy(update={"transform": transform}) for n in (10, 1))
    ahead, ahead_jobs, ahead_runner = _run(spark, ahead_root, ahead_p, monkeypatch)
    alone, alone_jobs, alone_runner = _run(spark, alone_root, alone_p, monkeypatch)

    assert _summary(ahead) == _summary(alone)
    how = "a scan per batch" if transform else "one scan"
    assert f"read ahead batches 0..6 in one job ({how})" in caplog.text
    assert [r.rows_late for r in ahead[:5]] == [0, 0, 1, 1, 0]  # the backlog has late rows
    assert ahead[4].rows_bad == 1
    assert _tables(spark, ahead_runner, ahead_root) == _tables(spark, alone_runner, alone_root)
    # One job looked at all seven batches; only the batch with a window closed under a
    # later watermark than the read-ahead's (2: one job collects its late records, and
    # those of the batches after it) and the one with a bad row (4) ran jobs; batch 3 took
    # its row without event time from the read-ahead.
    own = {2, 4}
    assert ahead_jobs[0] == 1, ahead_jobs
    assert all(ahead_jobs[b] == 0 for b in range(1, 7) if b not in own), ahead_jobs
    assert all(ahead_jobs[b] >= 1 for b in own), ahead_jobs
    assert all(n >= 1 for n in alone_jobs[:7]), alone_jobs


def test_late_rows_of_windows_closed_when_the_read_ahead_started_come_from_its_one_job(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ahead_root, alone_root = tmp_path / "ahead", tmp_path / "alone"
    later = [
        [event("a", 31, 1), event("b", 3, 2)],  # watermark 25 s: b@3's [0,10) is closed
        [event("a", 35, 3), event("c", 12, 4), {"user": "d", "amount": 9}],  # [10,20) too
        [event("b", 44, 5), event("a", 7, 6)],  # a@7: [0,10), closed since before
        # a@22: [20,30) is closed under this batch's watermark (44 s), not under 25 s
        [event("c", 51, 7), event("a", 22, 8)],
        # b@33: [30,40) is closed under this batch's watermark (51 s), not under 44 s
        [event("a", 62, 9), event("b", 33, 10)],
    ]
    results, jobs = {}, {}
    for root, read_ahead in ((ahead_root, 10), (alone_root, 1)):
        drop_batches(root, BACKLOG[:2])
        runner = MicroBatchRunner(spark, _pipeline(read_ahead), root)
        first = runner.run(max_batches=None)  # the watermark is now 25 s
        for i, rows in enumerate(later, start=2):
            write_json_lines(root / "in", f"b{i:03d}.json", rows, 1_700_000_000 + i)
        rest, counts, _ = _run(spark, root, _pipeline(read_ahead), monkeypatch)
        results[root] = (runner, first, rest)
        jobs[root] = counts[: len(later)]
    (ahead_runner, _, ahead), (alone_runner, _, alone) = results[ahead_root], results[alone_root]
    assert _summary(ahead) == _summary(alone)
    assert [r.rows_late for r in ahead[: len(later)]] == [1, 2, 1, 1, 1]
    assert _tables(spark, ahead_runner, ahead_root) == _tables(spark, alone_runner, alone_root)
    # The first later batch's job read all five ahead and collected the late rows of the
    # first three. The fourth's and fifth's windows closed later: the fourth ran one job
    # that collected the late rows of both, each under the watermark it was to have; the
    # fifth read nothing again.
    assert jobs[ahead_root] == [1, 0, 0, 1, 0], jobs


def test_a_batch_whose_range_grew_after_the_read_ahead_runs_its_own_job(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ahead_root, alone_root = tmp_path / "ahead", tmp_path / "alone"
    three = BACKLOG[:3]
    for root in (ahead_root, alone_root):
        drop_batches(root, three)
    p = _pipeline(10).model_copy(
        update={"source": _pipeline(10).source.model_copy(update={"max_files_per_batch": 2})}
    )
    ahead_runner = MicroBatchRunner(spark, p, ahead_root)
    first = ahead_runner.run_batch()  # reads ahead: batch 0 (files 0, 1) and batch 1 (file 2)
    assert first is not None and first.end == {"0": 2}
    for root in (ahead_root, alone_root):  # batch 1 now takes files 2 and 3
        write_json_lines(root / "in", "b003.json", [event("c", 31, 4)], 1_700_000_003)
    result, counter = counted_batch(spark, ahead_runner, monkeypatch)
    assert result.end == {"0": 4} and counter.jobs() >= 1
    ahead = [first, result, *ahead_runner.run(max_batches=None)]
    alone_runner = MicroBatchRunner(
        spark, p.model_copy(update={"read_ahead_batches": 1}), alone_root
    )
    alone = alone_runner.run(max_batches=None)
    assert _summary(ahead) == _summary(alone)
    assert _tables(spark, ahead_runner, ahead_root) == _tables(spark, alone_runner, alone_root)


def test_sliding_windows_do_not_read_ahead(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sliding record's lateness belongs to its last window, not to each window
    # it is in: what a partial row says cannot decide it, so each batch runs its job.
    drop_batches(tmp_path, BACKLOG[:3])
    p = _pipeline(10, Sliding(size="10 seconds", slide="5 seconds"))
    _, jobs, _ = _run(spark, tmp_path, p, monkeypatch)
    assert all(n >= 1 for n in jobs[:3]), jobs


def test_files_whose_names_a_uri_escapes_are_read_ahead_in_one_scan(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spark names a record's file by its URI ("a%20b"), the manifest by its path ("a b"):
    # a record the read could not tag with its batch would send every batch to its own job.
    for i, rows in enumerate(BACKLOG[:3]):
        write_json_lines(tmp_path / "in", f"b{i} a%b#ü.json", rows, 1_700_000_000 + i)
    _, jobs, _ = _run(spark, tmp_path, _pipeline(10), monkeypatch)
    assert jobs[:2] == [1, 0], jobs  # batch 1 took what the read-ahead saw


def test_files_of_one_name_in_two_folders_are_read_ahead_each_in_its_batch(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A record's batch is found by its file's name when the read-ahead's files have
    # unique names; here they do not (batch 0 takes q/a.json and p/b.json, batch 1
    # q/b.json and p/a.json), so by the file's URI: by name, the records of one folder's
    # file would take the other's batch.
    roots = {how: tmp_path / how for how in ("ahead", "alone")}
    for root in roots.values():
        for i, file in enumerate(["q/a", "p/b", "q/b", "p/a"]):
            folder, name = file.split("/")
            write_json_lines(root / "in" / folder, f"{name}.json", BACKLOG[i], 1_700_000_000 + i)
    by_folder = FileSource(
        path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1, partition_by_folder=True
    )
    ahead_p, alone_p = (_pipeline(n).model_copy(update={"source": by_folder}) for n in (10, 1))
    ahead, jobs, ahead_runner = _run(spark, roots["ahead"], ahead_p, monkeypatch)
    alone, _, alone_runner = _run(spark, roots["alone"], alone_p, monkeypatch)
    assert jobs[:2] == [1, 0], jobs  # batch 1 took what the read-ahead saw
    assert _summary(ahead) == _summary(alone)
    assert _tables(spark, ahead_runner, roots["ahead"]) == _tables(
        spark, alone_runner, roots["alone"]
    )


def test_lines_parsed_one_by_one_for_a_rescued_data_column_are_read_ahead_in_one_scan(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With a rescued-data column the source parses each line itself (from_json over a text
    # read): its records must carry their file's name too, for their batch.
    roots = {how: tmp_path / how for how in ("ahead", "alone")}
    for root in roots.values():
        for i, rows in enumerate(BACKLOG[:3]):
            extra = [{**r, "note": f"n{i}"} for r in rows]
            write_json_lines(root / "in", f"b{i}.json", extra, 1_700_000_000 + i)
    rescuing = _pipeline(1).source.model_copy(update={"rescued_data_column": "_rescued"})
    ahead_p, alone_p = (_pipeline(n).model_copy(update={"source": rescuing}) for n in (10, 1))
    ahead, jobs, _ = _run(spark, roots["ahead"], ahead_p, monkeypatch)
    alone, _, _ = _run(spark, roots["alone"], alone_p, monkeypatch)
    assert jobs[:2] == [1, 0], jobs  # batch 1 took what the read-ahead saw
    assert _summary(ahead) == _summary(alone)


def _upper(records: DataFrame) -> DataFrame:
    return records.withColumn("user", F.upper("user"))


@pytest.mark.parametrize(
    ("transform", "expected"),
    [
        (lambda df: df, True),
        (lambda df: _upper(df).select("*"), True),
        # A filter: a batch's records out are no longer its records read.
        (lambda df: _upper(df).where(F.col("amount") > 0).select("*"), False),
        (lambda df: df.selectExpr("*", "amount * 2 AS doubled"), True),
        (lambda df: df.select("user", "ts", "amount", PARTITION_COLUMN), False),  # tag dropped
        (dedup, False),
        (lambda df: df.withColumn("r", F.rand()), False),
        (lambda df: df.limit(5), False),
        (lambda df: df.withColumn("n", F.count("*").over(Window.partitionBy("user"))), False),
        (lambda df: df.withColumn("e", F.explode(F.array("user", "user"))), False),
        (lambda df: df.join(df.sparkSession.range(3), F.lit(True)), False),
        # A subquery over the records themselves would see every batch at once.
        (lambda df: df.where(F.col("amount") >= df.select(F.max("amount")).scalar()), False),
    ],
)
def test_row_by_row_tells_the_transforms_one_scan_may_take(
    spark: SparkSession, tmp_path: Path, transform: Callable[[DataFrame], DataFrame], expected: bool
) -> None:
    write_json_lines(tmp_path, "x.json", [event("a", 1, 1)], 1_700_000_000)
    # The read filters (a source drops its bad rows): only the transform is judged.
    records = (
        spark.read.schema(SCHEMA)
        .json(str(tmp_path))
        .where(F.col("user").isNotNull())
        .withColumn(PARTITION_COLUMN, F.lit("0"))
        .withColumn(BATCH_COLUMN, F.lit(0))
    )
    assert row_by_row(transform(records), records) is expected


def test_a_read_ahead_in_one_scan_parses_its_files_on_every_core(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan of a read-ahead over several files is split at least once per core, as
    Spark splits any scan: in one split, a wide read-ahead parsed its input on one core
    while the others waited."""
    _land_backlog(tmp_path)
    runner = MicroBatchRunner(spark, _pipeline(10), tmp_path)
    _, counter = counted_batch(spark, runner, monkeypatch)
    tracker = spark.sparkContext.statusTracker()
    (job,) = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(counter.group)]
    assert job is not None
    scan = tracker.getStageInfo(min(job.stageIds))  # the first stage: the scan
    assert scan is not None
    assert scan.numTasks >= spark.sparkContext.defaultParallelism > 1
