"""The batch loop and its recovery rule, against real Delta tables."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import FileSource
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.commit_log import CommitEntry
from lowmark.state.errors import CheckpointCorrupt, ConcurrentRunner, FingerprintMismatch
from lowmark.state.offset_log import OffsetEntry
from tests.helpers import FakeClock, double_amount, drop_file, pipeline, sink_ids

ONE_FILE = FileSource(
    path="in", format="json", schema_ddl="id LONG, amount LONG", max_files_per_batch=1
)


class Crash(Exception):
    """Stands in for the process dying at a step."""


def crash_at_commit(runner: MicroBatchRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    def die(entry: CommitEntry) -> None:
        raise Crash("killed before the commit log write")

    monkeypatch.setattr(runner.checkpoint.commits, "add", die)


def test_an_empty_checkpoint_plans_batch_zero_from_the_initial_offsets(
    spark: SparkSession, data_root: Path
) -> None:
    drop_file(data_root, 0)
    runner = MicroBatchRunner(spark, pipeline(), data_root)
    planned = runner.planner.next_batch().planned
    assert planned is not None
    assert (planned.batch_id, planned.start, planned.end, planned.replay) == (
        0,
        {"0": 0},
        {"0": 1},
        False,
    )


def test_nothing_to_do_when_the_source_has_no_new_data(
    spark: SparkSession, data_root: Path
) -> None:
    runner = MicroBatchRunner(spark, pipeline(), data_root)
    assert runner.run_batch() is None
    drop_file(data_root, 0)
    assert runner.run_batch() is not None
    assert runner.run_batch() is None


def test_after_a_commit_the_next_batch_starts_at_the_previous_end(
    spark: SparkSession, data_root: Path
) -> None:
    drop_file(data_root, 0)
    runner = MicroBatchRunner(spark, pipeline(), data_root)
    first = runner.run_batch()
    drop_file(data_root, 1)
    drop_file(data_root, 2)
    planned = runner.planner.next_batch().planned
    assert first is not None and planned is not None
    assert (planned.batch_id, planned.start, planned.end) == (1, first.end, {"0": 3})


def test_a_crash_before_the_commit_replays_the_recorded_offsets_not_new_ones(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_file(data_root, 0)
    crashed = MicroBatchRunner(spark, pipeline(source=ONE_FILE), data_root)
    crash_at_commit(crashed, monkeypatch)
    with pytest.raises(Crash):
        crashed.run_batch()
    drop_file(data_root, 1)  # arrives while the pipeline is down

    restarted = MicroBatchRunner(spark, pipeline(source=ONE_FILE), data_root)
    planned = restarted.planner.next_batch().planned
    assert planned is not None
    assert (planned.batch_id, planned.start, planned.end, planned.replay) == (
        0,
        {"0": 0},
        {"0": 1},
        True,
    )


def test_a_crash_between_sink_write_and_commit_then_rerun_writes_no_duplicates(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3):
        drop_file(data_root, i)
    reference_root = data_root / "reference"
    for i in range(3):
        drop_file(reference_root, i)
    MicroBatchRunner(spark, pipeline(source=ONE_FILE), reference_root).run(max_batches=None)

    runner = MicroBatchRunner(spark, pipeline(source=ONE_FILE), data_root)
    runner.run_batch()
    crash_at_commit(runner, monkeypatch)
    with pytest.raises(Crash):
        runner.run_batch()  # batch 1 reached the sink, not the commit log
    assert len(sink_ids(spark, data_root)) == 6

    results = MicroBatchRunner(spark, pipeline(source=ONE_FILE), data_root).run(max_batches=None)
    assert [(r.batch_id, r.replay) for r in results] == [(1, True), (2, False)]
    assert sink_ids(spark, data_root) == sink_ids(spark, reference_root)
    assert len(sink_ids(spark, data_root)) == 9


def test_a_first_batch_that_never_committed_is_replayed(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_file(data_root, 0)
    runner = MicroBatchRunner(spark, pipeline(), data_root)
    crash_at_commit(runner, monkeypatch)
    with pytest.raises(Crash):
        runner.run_batch()
    result = MicroBatchRunner(spark, pipeline(), data_root).run_batch()
    assert result is not None and (result.batch_id, result.replay) == (0, True)
    assert sink_ids(spark, data_root) == [0, 1, 2]


def _offsets(batch_id: int, fingerprint: str) -> OffsetEntry:
    return OffsetEntry(
        batch_id=batch_id,
        runner_id="x",
        start_offsets={"0": batch_id},
        end_offsets={"0": batch_id + 1},
        pipeline_fingerprint=fingerprint,
    )


def test_a_commit_two_behind_the_offsets_is_refused_naming_both_ids(
    spark: SparkSession, data_root: Path
) -> None:
    runner = MicroBatchRunner(spark, pipeline(), data_root)
    for n in range(4):
        runner.checkpoint.offsets.add(_offsets(n, runner.planner.fingerprint))
    runner.checkpoint.commits.add(CommitEntry(batch_id=1, runner_id="x"))
    with pytest.raises(CheckpointCorrupt, match=r"latest offsets batch 3, latest commit batch 1"):
        runner.planner.next_batch()


def test_commits_without_offsets_are_refused(spark: SparkSession, data_root: Path) -> None:
    runner = MicroBatchRunner(spark, pipeline(), data_root)
    runner.checkpoint.commits.add(CommitEntry(batch_id=0, runner_id="x"))
    with pytest.raises(CheckpointCorrupt, match="offset log is empty"):
        runner.planner.next_batch()


def test_no_commits_but_offsets_past_batch_zero_is_refused(
    spark: SparkSession, data_root: Path
) -> None:
    runner = MicroBatchRunner(spark, pipeline(), data_root)
    for n in range(2):
        runner.checkpoint.offsets.add(_offsets(n, runner.planner.fingerprint))
    with pytest.raises(CheckpointCorrupt, match="latest commit batch None"):
        runner.planner.next_batch()


def test_a_changed_pipeline_on_an_old_checkpoint_is_refused(
    spark: SparkSession, data_root: Path
) -> None:
    drop_file(data_root, 0)
    MicroBatchRunner(spark, pipeline(), data_root).run_batch()
    source = FileSource(
        path="in", format="json", schema_ddl="id LONG, amount INT", max_files_per_batch=1
    )
    changed = pipeline(transform=double_amount, source=source)
    with pytest.raises(FingerprintMismatch) as refused:
        MicroBatchRunner(spark, changed, data_root).run_batch()
    # Each change that blocks, old and new, with its class; an operational one (the
    # admission limit) is no change, and a compatible one (the transform) does not block.
    assert 'amount: "bigint" -> "int" (rebuild: source column narrowed' in str(refused.value)
    assert "max_files" not in str(refused.value)
    assert "transform" not in str(refused.value)
    assert str(refused.value).endswith("`lowmark reset t --truncate-sink`")


def test_a_checkpoint_that_predates_recording_definitions_is_refused_naming_the_fingerprints(
    spark: SparkSession, data_root: Path
) -> None:
    runner = MicroBatchRunner(spark, pipeline(), data_root)
    runner.checkpoint.offsets.add(_offsets(0, "0123456789abcdef"))
    changed = MicroBatchRunner(spark, pipeline(transform=double_amount), data_root)
    with pytest.raises(FingerprintMismatch, match=r"\(fingerprint 0123456789abcdef -> \w{16}\)"):
        changed.planner.next_batch()


def test_a_second_runner_planning_the_same_batch_stops_with_concurrent_runner(
    spark: SparkSession, data_root: Path
) -> None:
    drop_file(data_root, 0)
    first = MicroBatchRunner(spark, pipeline(), data_root)
    second = MicroBatchRunner(spark, pipeline(), data_root)
    planned = second.planner.next_batch().planned  # second plans batch 0 ...
    first.run_batch()  # ... while first runs and commits it
    assert planned is not None
    with pytest.raises(ConcurrentRunner, match="another `lowmark run`"):
        claimed = _offsets(0, second.planner.fingerprint)
        second.checkpoint.offsets.claim(claimed.model_copy(update={"runner_id": second.runner_id}))
    assert sink_ids(spark, data_root) == [0, 1, 2]


def test_progress_records_each_committed_batch_with_step_durations(
    spark: SparkSession, data_root: Path, clock: FakeClock
) -> None:
    drop_file(data_root, 0)
    runner = MicroBatchRunner(spark, pipeline(), data_root, clock=clock)
    runner.run_batch()
    [progress] = runner.checkpoint.progress.get_range()
    assert (progress.batch_id, progress.rows_in, progress.rows_out, progress.replayed) == (
        0,
        3,
        3,
        False,
    )
    assert {"plan", "offset_log", "read", "event_time", "sink", "commit"} <= set(
        progress.durations_ms
    )


def test_run_stops_after_max_batches_or_when_caught_up(
    spark: SparkSession, data_root: Path
) -> None:
    for i in range(3):
        drop_file(data_root, i)
    runner = MicroBatchRunner(spark, pipeline(source=ONE_FILE), data_root)
    assert [r.batch_id for r in runner.run(max_batches=2)] == [0, 1]
    assert [r.batch_id for r in runner.run(max_batches=None)] == [2]
    assert runner.run(max_batches=None) == []


def test_run_stops_when_its_time_budget_is_spent(
    spark: SparkSession, data_root: Path, clock: FakeClock
) -> None:
    for i in range(2):
        drop_file(data_root, i)
    clock.step_ms = 1_000  # every reading of the clock takes a second
    runner = MicroBatchRunner(spark, pipeline(source=ONE_FILE), data_root, clock=clock)
    assert len(runner.run(max_batches=None, max_seconds=2)) == 1
    assert len(runner.run(max_batches=None, max_seconds=1_000)) == 1


def test_the_first_plan_records_where_batch_0_starts_even_a_start_with_no_partitions_yet(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A backfill reads the history from there: every source kind records it."""
    source = FileSource(
        path="in", format="json", schema_ddl="id LONG, amount LONG", partition_by_folder=True
    )
    runner = MicroBatchRunner(spark, pipeline(source=source), tmp_path)
    assert runner.run_batch() is None  # no folder yet: nothing to run
    assert Checkpoint(runner.checkpoint.location, "t").start_offsets == {}
