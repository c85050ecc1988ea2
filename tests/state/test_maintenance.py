"""Checkpoint maintenance: logs keep only their latest batches, tables stay a few files, and
every batch after it (a replay across it included) computes what a plain batch job does."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.skip_batch import set_aside
from lowmark.batches.loop import faults
from lowmark.batches.loop.maintenance import maintain_checkpoint
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import Maintenance
from lowmark.batches.windows import Tumbling
from lowmark.state.errors import CheckpointCorrupt
from tests.faults.harness import an_hour_passes
from tests.helpers import drop_batches, event, reference, sink, windowed

WINDOW = Tumbling(size="10 seconds")
BATCHES = [[event("a", 5 * i + 1, i), event("b", 5 * i + 3, 2 * i)] for i in range(12)]


def _run(spark: SparkSession, data_root: Path, maintenance: Maintenance) -> MicroBatchRunner:
    drop_batches(data_root, BATCHES)
    p = windowed(WINDOW, "update").model_copy(update={"maintenance": maintenance})
    runner = MicroBatchRunner(spark, p, data_root)
    # Batch 4 dies after writing its state; it is the batch after a maintenance that
    # merged the state table's files, and its replay reads the state as of commit 3.
    with pytest.raises(faults.InjectedCrash), faults.crash_at(faults.KillPoint("after_state", 4)):
        runner.run(max_batches=None)
    runner = MicroBatchRunner(spark, p, data_root)
    assert len(runner.run(max_batches=None)) >= 8
    return runner


def test_maintenance_keeps_the_latest_log_entries_and_few_files(
    spark: SparkSession, data_root: Path
) -> None:
    runner = _run(spark, data_root, Maintenance(every_batches=4, log_batches=3, progress_batches=5))
    ckpt = runner.checkpoint
    latest = ckpt.commits.get_latest()
    assert latest is not None and latest.batch_id == 11  # the last maintenance ran after it
    ids = {
        name: sorted(table.read().column("batch_id").to_pylist())
        for name, table in [
            ("offsets", ckpt.offsets.table),
            ("commits", ckpt.commits.table),
            ("progress", ckpt.progress.table),
        ]
    }
    assert ids == {"offsets": [9, 10, 11], "commits": [9, 10, 11], "progress": [7, 8, 9, 10, 11]}
    assert set(ckpt.watermarks.table.read().column("batch_id").to_pylist()) == {9, 10, 11}
    assert runner.stage is not None
    for table in [
        ckpt.offsets.table,
        ckpt.commits.table,
        ckpt.files.table,
        runner.stage.state.table,
    ]:
        assert table.files() <= 1, table.path
    # Every window exactly as a plain batch aggregation says (update mode: all of them).
    assertDataFrameEqual(sink(spark, data_root), reference(spark, data_root, WINDOW))


def test_without_maintenance_each_batch_adds_a_file_to_each_log(
    spark: SparkSession, data_root: Path
) -> None:
    runner = _run(spark, data_root, Maintenance(every_batches=1000))
    assert runner.checkpoint.offsets.table.files() == len(BATCHES)
    assert runner.checkpoint.offsets.table.read().num_rows == len(BATCHES)


def test_a_replay_after_an_idle_stretch_still_reads_the_state_of_the_last_commit(
    spark: SparkSession, data_root: Path
) -> None:
    drop_batches(data_root, BATCHES)
    p = windowed(WINDOW, "update")
    runner = MicroBatchRunner(spark, p, data_root)
    assert runner.stage is not None
    state = runner.stage.state.table
    # Up to the batch whose state write is a Delta checkpoint (versions 9, 19, ...).
    while not state.exists() or (state.version() + 2) % 10:
        assert runner.run_batch() is not None
    # A long idle stretch: every log file of the checkpoint is days old.
    days_ago = time.time() - 3 * 24 * 3600
    for log_file in Path(runner.checkpoint.location).glob("*/_delta_log/*"):
        os.utime(log_file, (days_ago, days_ago))
    batch = runner.planner.next_batch(dry_run=True).planned
    assert batch is not None
    crash = faults.KillPoint("after_state", batch.batch_id)
    with pytest.raises(faults.InjectedCrash), faults.crash_at(crash):
        runner.run_batch()
    assert state.version() % 10 == 9
    # The replay reads the state as of the last commit, a version before that checkpoint.
    replayed = MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    assert replayed[0].replay and replayed[0].batch_id == batch.batch_id
    assertDataFrameEqual(
        sink(spark, data_root).select(*reference(spark, data_root, WINDOW).columns),
        reference(spark, data_root, WINDOW),
    )


def _optimize_and_vacuum_now(path: str) -> None:
    """What a user may run any time: compact, then VACUUM with zero retention."""
    DeltaTable(path).optimize.compact()
    DeltaTable(path).vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)


def test_optimize_and_zero_retention_vacuum_of_the_state_between_batches_change_nothing(
    spark: SparkSession, data_root: Path
) -> None:
    drop_batches(data_root, BATCHES)
    p = windowed(WINDOW, "update")
    runner = MicroBatchRunner(spark, p, data_root)
    runner.run(max_batches=5)
    assert runner.stage is not None
    state = runner.stage.state.table
    assert state.files() >= 2  # OPTIMIZE rewrites them: the last commit's version is gone
    _optimize_and_vacuum_now(runner.stage.state.path)
    # A new runner too, as after an idle week: both read the newest state.
    runner.run(max_batches=2)
    _optimize_and_vacuum_now(runner.stage.state.path)
    MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    assertDataFrameEqual(sink(spark, data_root), reference(spark, data_root, WINDOW))


def test_a_replay_after_a_zero_retention_vacuum_resumes_or_names_what_is_gone(
    spark: SparkSession, tmp_path: Path
) -> None:
    p = windowed(WINDOW, "update")
    for step in ("after_offset_log", "after_state"):
        root = tmp_path / step
        drop_batches(root, BATCHES)
        runner = MicroBatchRunner(spark, p, root)
        assert runner.stage is not None
        with pytest.raises(faults.InjectedCrash), faults.crash_at(faults.KillPoint(step, 5)):
            runner.run(max_batches=None)
        _optimize_and_vacuum_now(runner.stage.state.path)
        replay = MicroBatchRunner(spark, p, root)
        if step == "after_offset_log":
            # The crashed batch wrote no state: its replay starts from the newest version.
            replay.run(max_batches=None)
            assertDataFrameEqual(sink(spark, root), reference(spark, root, WINDOW))
        else:
            # Its state write landed: the replay needs the version before it, now vacuumed.
            with pytest.raises(CheckpointCorrupt, match="VACUUM") as error:
                replay.run(max_batches=None)
            assert "\n" not in str(error.value)


def test_maintenance_between_a_crash_after_the_state_write_and_its_replay_keeps_what_it_reads(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_batches(data_root, BATCHES)
    p = windowed(WINDOW, "update")
    runner = MicroBatchRunner(spark, p, data_root)
    with pytest.raises(faults.InjectedCrash), faults.crash_at(faults.KillPoint("after_state", 5)):
        runner.run(max_batches=None)
    # An hour later, `lowmark compact` (or the daily schedule) runs before the replay.
    an_hour_passes(runner.checkpoint.location, monkeypatch)
    assert maintain_checkpoint(spark, p, data_root) is not None
    replayed = MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    assert replayed[0].replay and replayed[0].batch_id == 5
    assertDataFrameEqual(sink(spark, data_root), reference(spark, data_root, WINDOW))


def test_setting_aside_a_batch_whose_earlier_state_was_vacuumed_says_so_in_one_line(
    spark: SparkSession, data_root: Path
) -> None:
    drop_batches(data_root, BATCHES)
    p = windowed(WINDOW, "update")
    runner = MicroBatchRunner(spark, p, data_root)
    assert runner.stage is not None
    with pytest.raises(faults.InjectedCrash), faults.crash_at(faults.KillPoint("after_state", 5)):
        runner.run(max_batches=None)
    # Someone's zero-retention VACUUM removed the files of the state skip-batch puts back.
    _optimize_and_vacuum_now(runner.stage.state.path)
    with pytest.raises(CheckpointCorrupt, match="version") as error:
        set_aside(spark, p, data_root, 5, "test")
    assert "\n" not in str(error.value)
