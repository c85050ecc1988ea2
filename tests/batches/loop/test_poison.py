"""Poison batches: a batch that fails every time stops, says why, and can be set aside.

The transform divides by ``amount``; under Spark's ANSI mode a zero fails
the batch that holds it, the same way on every replay. After
``max_failed_attempts`` failures runs stop before it with one line naming
the batch, its file and the error; the sensor skips with that line; and
``lowmark skip-batch`` records the file in ``bad_records`` and commits the
batch empty, so the batches after it run, and nothing else changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.health import failing_batch
from lowmark.batches.admin.skip_batch import set_aside
from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.cli.display import iso_utc
from lowmark.batches.errors import PipelineConfigInvalid, PoisonBatch, SourceFileMissing
from lowmark.batches.loop import faults
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.loop.parts import build_parts
from lowmark.batches.loop.poison import failure_kind
from lowmark.batches.sql import SqlStep
from lowmark.batches.windows import Tumbling
from lowmark.orchestration.definitions import build_definitions
from lowmark.orchestration.resources import LowmarkResource, SparkResource
from tests.helpers import (
    SPARK_ERRORS,
    FlakyReads,
    delta_frame,
    dividing,
    drop_batches,
    drop_file,
    event,
    lowmark,
    pipeline,
    reference,
    sink,
    sink_ids,
    windowed,
    write_json_lines,
)


def _land(root: Path) -> None:
    """Files 0 and 2 are fine; file 1 holds a zero amount."""
    for i in (0, 2):
        write_json_lines(
            root / "in", f"f{i:03d}.json", [{"id": i, "amount": i + 1}], 1_700_000_000 + i
        )
    write_json_lines(root / "in", "f001.json", [{"id": 1, "amount": 0}], 1_700_000_001)


def test_a_batch_that_fails_every_time_stops_after_its_attempts_and_says_why(
    spark: SparkSession, data_root: Path
) -> None:
    _land(data_root)
    runner = MicroBatchRunner(spark, dividing, data_root)
    assert runner.run_batch() is not None  # batch 0
    for _ in range(2):
        with pytest.raises(SPARK_ERRORS):
            MicroBatchRunner(spark, dividing, data_root).run_batch()
    with pytest.raises(PoisonBatch) as stopped:
        MicroBatchRunner(spark, dividing, data_root).run_batch()
    message = str(stopped.value)
    assert "\n" not in message
    assert "batch 1 of dividing failed 2 times" in message and "f001.json" in message
    assert "DIVIDE_BY_ZERO" in message and "lowmark skip-batch dividing 1" in message
    status = pipeline_status(spark, dividing, data_root)
    assert status.blocked == message
    # --retry runs it once more (it fails again: the transform is unchanged).
    with pytest.raises(SPARK_ERRORS):
        MicroBatchRunner(spark, dividing, data_root).run(retry=True)


def test_skip_batch_records_the_input_and_the_pipeline_goes_on(
    spark: SparkSession, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _land(data_root)
    runner = MicroBatchRunner(spark, dividing, data_root)
    runner.run_batch()
    with pytest.raises(SPARK_ERRORS):
        MicroBatchRunner(spark, dividing, data_root).run_batch()
    with pytest.raises(PipelineConfigInvalid, match="not its uncommitted batch"):
        set_aside(spark, dividing, data_root, 2, "wrong batch")
    code, out, err = lowmark(
        capsys, data_root, "--pipelines", __name__, "skip-batch", "dividing",
        "1", "--reason", "amount 0 from the test feed",
    )  # fmt: skip
    assert code == 0, err
    assert "batch 1 set aside (1 inputs recorded" in out and "f001.json" in out
    results = MicroBatchRunner(spark, dividing, data_root).run(max_batches=None)
    assert [r.batch_id for r in results] == [2]
    assert sink_ids(spark, data_root) == [0, 2]
    bad = delta_frame(spark, runner.checkpoint.table("bad_records")).collect()
    assert [(r.batch_id, r.source_file.endswith("f001.json"), r.raw) for r in bad] == [
        (1, True, None)
    ]
    assert bad[0].reason == "set aside by lowmark skip-batch: amount 0 from the test feed"
    status = pipeline_status(spark, dividing, data_root)
    assert status.blocked is None and status.last_committed_batch == 2


def test_set_aside_puts_the_window_state_back_as_the_batch_before_left_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    window = Tumbling(size="10 seconds")
    batches = [[event("a", 10 * i + 1, i), event("b", 10 * i + 4, i)] for i in range(5)]
    skipped_root, reference_root = tmp_path / "skipped", tmp_path / "reference"
    drop_batches(skipped_root, batches)
    drop_batches(reference_root, [b for i, b in enumerate(batches) if i != 2])
    p = windowed(window, "update")
    # Batch 2 dies after its state write: the state holds its windows, the sink not.
    with pytest.raises(faults.InjectedCrash), faults.crash_at(faults.KillPoint("after_state", 2)):
        MicroBatchRunner(spark, p, skipped_root).run(max_batches=None)
    done = set_aside(spark, p, skipped_root, 2, "test")
    assert done.restored.get("state") is not None
    MicroBatchRunner(spark, p, skipped_root).run(max_batches=None)
    # The sink is what the input without batch 2's file gives.
    assertDataFrameEqual(sink(spark, skipped_root), reference(spark, reference_root, window))


def test_the_sensor_skips_a_poison_batch_and_its_failing_check_says_why(
    spark: SparkSession, data_root: Path
) -> None:
    _land(data_root)
    MicroBatchRunner(spark, dividing, data_root).run_batch()
    for _ in range(2):
        with pytest.raises(SPARK_ERRORS):
            MicroBatchRunner(spark, dividing, data_root).run_batch()
    defs = build_definitions("tests.batches.loop.test_poison")
    resources: dict[str, Any] = {
        "spark": SparkResource(),
        "lowmark": LowmarkResource(data_root=str(data_root)),
    }
    with dg.DagsterInstance.ephemeral() as instance:
        context = dg.build_sensor_context(instance=instance, resources=resources)
        data = defs.resolve_sensor_def("dividing_sensor").evaluate_tick(context)
        run = defs.resolve_job_def("dividing_microbatches").execute_in_process(
            instance=instance, resources=resources, raise_on_error=False
        )
    assert not data.run_requests
    assert "batch 1 of dividing failed 2 times" in (data.skip_message or "")
    # A run fails with the reason, and the sink's failing_batch check fails with it.
    assert not run.success
    checks = {e.check_name: e for e in run.get_asset_check_evaluations()}
    failing = checks["failing_batch"]
    assert not failing.passed and failing.severity == dg.AssetCheckSeverity.ERROR
    assert "batch 1 failed 2 of 2 allowed times" in (failing.description or "")
    assert "DIVIDE_BY_ZERO" in (failing.description or "")
    assert checks["bad_fraction"].passed


fragile = pipeline(name="fragile", max_failed_attempts=3)
"""A stateless pipeline over a folder, to lose a file or a broker under."""


def _claimed_then_interrupted(spark: SparkSession, root: Path) -> Path:
    """Batch 0 of ``fragile`` with its offsets written and nothing else: a replay is due."""
    taken = drop_file(root, 0)
    with (
        pytest.raises(faults.InjectedCrash),
        faults.crash_at(faults.KillPoint("after_offset_log", 0)),
    ):
        MicroBatchRunner(spark, fragile, root).run_batch()
    return taken


def test_a_transient_error_during_a_replay_is_tried_again_after_pauses_and_never_counts(
    spark: SparkSession, data_root: Path
) -> None:
    _claimed_then_interrupted(spark, data_root)
    pauses: list[float] = []
    built = build_parts(spark, fragile, data_root).source
    flaky = FlakyReads(built, 2, ConnectionResetError("connection reset by peer"))
    parts = build_parts(spark, fragile, data_root, source=flaky)
    runner = MicroBatchRunner(spark, fragile, data_root, sleep=pauses.append, parts=parts)
    result = runner.run_batch()
    assert result is not None and (result.batch_id, result.replay) == (0, True)
    # Two reads failed: one pause after each, the second twice the first.
    assert pauses == [1.0, 2.0]
    assert runner.checkpoint.failures.of(0) == []
    assert sink_ids(spark, data_root) == [0, 1, 2]


def test_a_lasting_operational_error_blocks_the_batch_with_its_reason_and_the_sensor_waits(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An interval long enough that a slow machine's tick still finds the wait running.
    interval_ms = 30_000
    monkeypatch.setenv("LOWMARK_SENSOR_INTERVAL_SECONDS", str(interval_ms // 1000))
    taken = _claimed_then_interrupted(spark, data_root)
    kept = taken.read_bytes()
    taken.unlink()
    defs = build_definitions("tests.batches.loop.test_poison")
    resources: dict[str, Any] = {
        "spark": SparkResource(),
        "lowmark": LowmarkResource(data_root=str(data_root)),
    }
    checkpoint = MicroBatchRunner(spark, fragile, data_root).checkpoint
    with dg.DagsterInstance.ephemeral() as instance:

        def tick() -> Any:
            context = dg.build_sensor_context(instance=instance, resources=resources)
            return defs.resolve_sensor_def("fragile_sensor").evaluate_tick(context)

        for stops in (1, 2):
            with pytest.raises(SourceFileMissing, match=r"f000\.json \(taken by batch 0\) is gone"):
                MicroBatchRunner(spark, fragile, data_root).run_batch()
            # No new run (and Spark start) per tick: the sensor waits its interval
            # after the first stop, twice that after the second.
            data = tick()
            failed_at = checkpoint.failures.of(0)[-1].failed_at.timestamp()
            wait_until = iso_utc(round(failed_at * 1000) + interval_ms * stops)
            assert not data.run_requests
            assert f"stopped {stops} times" in (data.skip_message or "")
            assert f"no run before {wait_until}" in (data.skip_message or "")
        with pytest.raises(SourceFileMissing):
            MicroBatchRunner(spark, fragile, data_root).run_batch()
        assert [f.kind for f in checkpoint.failures.of(0)] == ["operational"] * 3
        # Blocked: runs stop before the batch with the error's own line, status says so,
        # and so does the sensor.
        with pytest.raises(PoisonBatch) as stopped:
            MicroBatchRunner(spark, fragile, data_root).run_batch()
        message = str(stopped.value)
        assert "\n" not in message
        assert "batch 0 of fragile stopped 3 times" in message
        assert "f000.json (taken by batch 0) is gone: put it back" in message
        assert "lowmark run fragile --retry" in message
        assert pipeline_status(spark, fragile, data_root).blocked == message
        data = tick()
        assert not data.run_requests and data.skip_message == message
        # The Dagster check sends the operator to the error's own fix, not to the transform.
        check = failing_batch(fragile, data_root)
        assert not check.passed
        assert "do what its error says" in check.description
        assert "fix the transform" not in check.description
    # The file is back: --retry runs the batch, and it commits its input once.
    taken.write_bytes(kept)
    assert [r.batch_id for r in MicroBatchRunner(spark, fragile, data_root).run(retry=True)] == [0]
    assert sink_ids(spark, data_root) == [0, 1, 2]


def without_amount(df: DataFrame) -> DataFrame:
    """A transform whose output lacks the column the aggregation sums."""
    return df.drop("amount")


def test_a_definition_spark_cannot_resolve_is_a_definition_error_never_a_poison_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    drop_batches(tmp_path, [[event("a", 0, 1)]])
    p = windowed(Tumbling(size="10 seconds")).model_copy(update={"transform": without_amount})
    runner = MicroBatchRunner(spark, p, tmp_path)
    for _ in range(p.max_failed_attempts + 1):  # as many runs as make a poison batch, and one
        with pytest.raises(AnalysisException) as failed:
            runner.run_batch()
        assert failure_kind(failed.value) == "definition"

    assert runner.checkpoint.failures.of(0) == []  # never counted: never blocked
    report = runner.failure_report(failed.value) or ""
    assert "\n" not in report
    assert "cannot run as w is defined" in report and "UNRESOLVED_COLUMN" in report
    assert "fix the definition of w" in report and "skip-batch" not in report


@pytest.mark.parametrize(
    "query",
    [
        pytest.param("SELECT id, amount FROM input WHERE id >", id="does not parse"),
        pytest.param("SELECT id, price FROM input", id="names a missing column"),
    ],
)
def test_a_sql_step_that_cannot_run_is_a_definition_error_never_a_poison_batch(
    spark: SparkSession, data_root: Path, query: str
) -> None:
    drop_file(data_root, 0)
    p = pipeline(transform=SqlStep(sql=query))
    runner = MicroBatchRunner(spark, p, data_root)
    for _ in range(p.max_failed_attempts):  # as many runs as make a poison batch
        with pytest.raises(PipelineConfigInvalid, match="its SQL fails") as failed:
            runner.run_batch()
        assert failure_kind(failed.value) == "definition"

    assert runner.checkpoint.failures.of(0) == []  # never counted: never blocked
    report = runner.failure_report(failed.value) or ""
    assert "\n" not in report
    assert "cannot run as t is defined" in report and "fix the definition of t" in report
    assert "skip-batch" not in report
