"""Two runners of one pipeline: one goes on, the other stops with ConcurrentRunner, and
nothing is lost or written twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.loop import faults
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.state.errors import ConcurrentRunner
from tests.faults.harness import (
    Snapshot,
    differences,
    lowmark_env,
    lowmark_run_args,
    run_to_completion,
    snapshot,
    two_runs_at_once,
)
from tests.faults.scenarios import FIXED_INPUT, PIPELINES, plain_append, write_input
from tests.helpers import drop_file, pipeline, sink_ids


@pytest.fixture(scope="module")
def plain(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Snapshot]:
    """A folder with ``input/``, and what a fault-free run of ``plain_append`` writes."""
    folder = tmp_path_factory.mktemp("plain")
    write_input(folder / "input", FIXED_INPUT[:2])
    run_to_completion(spark, plain_append, folder / "reference")
    return folder, snapshot(plain_append, folder / "reference")


@pytest.mark.integration
@pytest.mark.parametrize("pipeline_name", ["plain_append", "session_update"])
def test_a_runner_whose_batch_another_runner_finished_first_stops_at_its_commit(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pipeline_name: str,
) -> None:
    # A plain append, and a windowed pipeline with window state and a MERGE sink
    # (sessions in update mode).
    p = PIPELINES[pipeline_name]
    write_input(tmp_path / "input", FIXED_INPUT[:2])
    run_to_completion(spark, p, tmp_path / "reference")
    reference = snapshot(p, tmp_path / "reference")
    root = tmp_path / "stalled_owner"
    owner = MicroBatchRunner(spark, p, root)
    stalled = 0
    reached = faults.reached

    def a_second_runner_replays_the_batch(step: str, batch_id: int) -> None:
        # The owner stalls just before its commit (a long GC pause, a slow disk),
        # its state and sink written; a second runner sees the batch uncommitted,
        # replays it and commits.
        if (step, batch_id) == ("before_commit", stalled):
            monkeypatch.setattr(faults, "reached", reached)
            MicroBatchRunner(spark, p, root).run_batch()

    monkeypatch.setattr(faults, "reached", a_second_runner_replays_the_batch)
    with pytest.raises(ConcurrentRunner, match=rf"batch {stalled} in .*commits belongs to runner"):
        owner.run_batch()

    run_to_completion(spark, p, root)
    assert differences(reference, snapshot(p, root)) == []


@pytest.mark.integration
@pytest.mark.slow
def test_of_two_lowmark_runs_at_once_one_finishes_and_the_other_stops_with_a_clear_message(
    spark: SparkSession, plain: tuple[Path, Snapshot]
) -> None:
    folder, reference = plain
    root = folder / "two_runs"
    args = lowmark_run_args(root, plain_append, "--until-caught-up")
    claimed = root / "_lowmark" / "plain_append" / "offsets" / "_delta_log" / f"{1:020d}.json"
    first, second = two_runs_at_once(args, lowmark_env(spark), claimed.exists)
    first_err = first.stderr

    assert second.returncode == 0, second.stderr[-3000:]
    assert "batch 0 replayed" in second.stdout and "batch 1 committed" in second.stdout
    assert first.returncode == 2, first_err[-3000:]
    # The JVM writes its own start-up lines to stderr; lowmark's is the one error line.
    [error] = [line for line in first_err.splitlines() if line.startswith("error:")]
    assert error.startswith("error: batch 0 in ") and "another `lowmark run`" in error
    assert "Traceback" not in first_err
    assert differences(reference, snapshot(plain_append, root)) == []


def test_a_stale_runner_never_records_a_file_another_runner_recorded(
    spark: SparkSession, data_root: Path
) -> None:
    p = pipeline(source=pipeline().source.model_copy(update={"max_files_per_batch": 1}))
    for i in range(2):
        drop_file(data_root, i)
    fresh = MicroBatchRunner(spark, p, data_root)
    fresh.run_batch()  # batch 0 takes file 0 and records files 0 and 1
    stale = MicroBatchRunner(spark, p, data_root)
    stale.planner.next_batch(dry_run=True)  # it now holds batch 0's position and manifest
    fresh.run_batch()  # batch 1 takes file 1 and discovers nothing
    drop_file(data_root, 2)
    fresh.run_batch()  # batch 2 records and takes file 2
    # The stale runner plans batch 1 again: file 2 is new to its copy of the manifest,
    # and nothing was recorded for batch 1, but the table already holds file 2.
    with pytest.raises(ConcurrentRunner):
        stale.run_batch()
    drop_file(data_root, 3)
    fresh.run(max_batches=None)
    assert sink_ids(spark, data_root) == sorted(f * 100 + i for f in range(4) for i in range(3))
    paths = fresh.checkpoint.files.table.read().column("path").to_pylist()
    assert len(paths) == len(set(paths)) == 4
