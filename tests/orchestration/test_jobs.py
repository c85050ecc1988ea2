"""The pipeline's runs, executed in process: batches commit and report readable
materializations of the sink and its side tables, partitions the stream made final count
as materialized, checks are evaluated (alone too), and a backfill replaces one partition."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.execution.backfill import BulkActionStatus
from dagster._daemon.backfill import execute_backfill_iteration
from dagster_graphql.test.utils import execute_dagster_graphql
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lowmark.batches.admin.health import late_fraction
from lowmark.batches.demo import orders, user_revenue, write_sample_files
from lowmark.batches.loop.metrics import TEXTFILE_ENV
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.orchestration.checks import checks_of
from lowmark.orchestration.tables import COLUMN_SCHEMA, ROW_COUNT
from lowmark.state.table import DriverTable
from tests.helpers import TICKS, delta_frame, drop_order_files, samples, tick, value
from tests.orchestration.pipelines import SCHEMA, ticks
from tests.orchestration.workspace import (
    LAUNCH_BACKFILL,
    backfill_params,
    in_process_workspace,
    partition_range,
)
from tests.orchestration.workspace import defs as workspace_defs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TICKS_LATE = dg.AssetKey(["lowmark", "ticks_late"])
TICKS_BAD = dg.AssetKey(["lowmark", "ticks_bad_records"])


def run_ticks(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    raise_on_error: bool = True,
    **config: Any,
) -> dg.ExecuteInProcessResult:
    return defs.resolve_job_def("ticks_microbatches").execute_in_process(
        instance=instance,
        resources=resources,
        run_config={"ops": {"ticks_batches": {"config": config}}},
        raise_on_error=raise_on_error,
    )


def test_a_run_records_one_readable_materialization_per_batch(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TEXTFILE_ENV, str(tmp_path / "prom"))
    drop_order_files(data_root, 0, [tick("a", 1, 1), tick("b", 2, 2), tick("a", 30, 4)])
    # a@3s is late: [0,10) closed
    drop_order_files(data_root, 1, [tick("a", 3, 8), tick("b", 45, 16)])
    first = run_ticks(defs, instance, resources, max_batches=1)
    assert first.success
    assert first.dagster_run.tags["lowmark/pipeline"] == "ticks"
    again = run_ticks(defs, instance, resources)
    assert again.success

    records = instance.fetch_materializations(TICKS, limit=10).records
    metadata = [r.asset_materialization.metadata for r in reversed(records)]  # type: ignore[union-attr]
    assert [m["batch"] for m in metadata] == [dg.TextMetadataValue("0"), dg.TextMetadataValue("1")]
    assert [m["rows_in"].value for m in metadata] == [3, 2]
    assert [m["rows_late"].value for m in metadata] == [0, 1]
    assert metadata[0]["input"] == dg.TextMetadataValue("0 → 1 (+1)")  # the first file
    # The first batch saw events up to 30 s: that is its watermark (no out-of-orderness),
    # shown as a time.
    assert metadata[0]["watermark"] == dg.TimestampMetadataValue(
        (T0 + timedelta(seconds=30)).timestamp()
    )
    # What the folder still held after each batch: one file, then none.
    assert [m["backlog_files"].value for m in metadata] == [1, 0]
    # Plotted (numbers): only rows, the lag, the duration in seconds, the backlog, the
    # sink's row count and its open windows.
    numbers = {
        k
        for k, v in metadata[0].items()
        if isinstance(v, dg.IntMetadataValue | dg.FloatMetadataValue)
    }
    assert numbers == {
        "rows_in", "rows_out", "rows_late", "rows_bad", "lag_seconds", "duration_seconds",
        "backlog_files", "dagster/row_count", "open_windows",
    }  # fmt: skip
    lag = metadata[0]["lag_seconds"].value
    assert isinstance(lag, float) and lag > (datetime.now(UTC) - T0).total_seconds() - 3600
    # The lag as a person reads it too (the events are from January): days and hours.
    text = metadata[0]["lag"]
    assert isinstance(text, dg.TextMetadataValue) and re.fullmatch(r"\d+ d( \d+ h)?", text.value)

    # The sink's row count and schema are its table's, as Spark reads it.
    sink = delta_frame(spark, str(data_root / "ticks/out"))
    assert metadata[-1][ROW_COUNT].value == sink.count() == 2
    schema = metadata[-1][COLUMN_SCHEMA].value
    columns = [(c.name, c.type) for c in schema.columns]  # type: ignore[union-attr]
    assert columns == sink.dtypes  # the types as Spark SQL names them, not Arrow's reprs
    # Open windows: those the input has that the sink does not yet (append mode), the
    # next to close the one ending first, final at its end + 10 s lateness.
    events = spark.read.schema(SCHEMA).json(str(data_root / "ticks/in"))
    windows = events.select("user", F.window("ts", "10 seconds").start.alias("window_start"))
    still_open = windows.distinct().join(sink, ["user", "window_start"], "left_anti")
    assert metadata[-1]["open_windows"].value == still_open.count() == 2
    first_start_s = still_open.agg(F.min(F.col("window_start").cast("long"))).first()[0]  # type: ignore[index]
    assert metadata[-1]["next_window_final_at"] == dg.TimestampMetadataValue(
        float(first_start_s + 10 + 10)  # its end, then the allowed lateness
    )

    # The late and bad-records tables are materialized by every batch (so neither reads
    # as in progress while a run follows the source), with what it appended and their
    # row count.
    for key, rows in ((TICKS_LATE, [0, 1]), (TICKS_BAD, [0, 0])):
        records = instance.fetch_materializations(key, limit=10).records
        side = [r.asset_materialization.metadata for r in reversed(records)]  # type: ignore[union-attr]
        assert [m["rows"].value for m in side] == rows
        assert side[-1][ROW_COUNT].value == sum(rows)
        assert "batch_id" in [c.name for c in side[-1][COLUMN_SCHEMA].value.columns]  # type: ignore[union-attr]

    checks = {e.check_name: e for e in again.get_asset_check_evaluations()}
    assert checks.keys() == {"watermark_lag", "failing_batch", "late_fraction", "bad_fraction"}
    assert not checks["late_fraction"].passed  # 1 of 5 rows late, over the 5 % default
    assert checks["late_fraction"].asset_key == TICKS_LATE
    assert checks["late_fraction"].metadata["percent"] == dg.FloatMetadataValue(20.0)
    assert not checks["watermark_lag"].passed  # event time is in 2026-01, far behind the clock
    assert checks["failing_batch"].passed and checks["bad_fraction"].passed

    # Each run wrote its metrics for node_exporter's textfile collector: the second's
    # counters count its own batch.
    written = samples((tmp_path / "prom" / "lowmark_ticks.prom").read_text(), "ticks")
    assert value(written, "lowmark_batches_committed_total") == 1
    assert value(written, "lowmark_last_batch_id") == 1
    assert value(written, "lowmark_batch_rows_total", kind="late") == 1


def test_partitions_the_watermark_made_final_count_as_written_and_plot_the_batch_that_closed_them(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
) -> None:
    # Watermark 2 h 30 s after the first batch; the second batch runs with it. Hour 0 is
    # final at 1 h + 10 s window + 10 s lateness; hour 1 at 2 h 20 s; hour 2 not yet.
    drop_order_files(data_root, 0, [tick("a", 1, 1), tick("a", 7230, 2)])
    drop_order_files(data_root, 1, [tick("a", 7231, 4), tick("b", 5, 8)])  # b@5 s is late
    assert run_ticks(defs, instance, resources).success
    written = instance.get_materialized_partitions(TICKS)
    assert written == {"2026-01-01-00:00", "2026-01-01-01:00"}
    # Each carries its windows in the sink as a number: one window in hour 0, none yet in
    # hour 1 (a@2 h is in hour 2). A partitioned asset's plots are by partition (the newest
    # materialization of each, those without a partition left out): each also carries the
    # numbers of batch 1, which made it final.
    sink = delta_frame(spark, str(data_root / "ticks/out"))
    [closing] = [
        r.asset_materialization.metadata  # type: ignore[union-attr]
        for r in instance.fetch_materializations(TICKS, limit=10).records
        if r.partition_key is None and r.asset_materialization.metadata["batch"].value == "1"  # type: ignore[union-attr]
    ]
    plotted = ("rows_in", "rows_out", "rows_late", "rows_bad", "duration_seconds", "lag_seconds")
    hours = {"2026-01-01-00:00": 0, "2026-01-01-01:00": 1}
    for key, hour in hours.items():
        [record] = instance.fetch_materializations(
            dg.AssetRecordsFilter(TICKS, asset_partitions=[key]), limit=1
        ).records
        metadata = record.asset_materialization.metadata  # type: ignore[union-attr]
        expected = sink.where(F.hour("window_start") == hour).count()
        assert metadata[ROW_COUNT].value == expected
        for label in plotted:
            assert isinstance(metadata[label], dg.IntMetadataValue | dg.FloatMetadataValue)
            assert metadata[label] == closing[label], label
        assert metadata["rows_in"].value == 2 and metadata["rows_late"].value == 1
    assert sink.count() == 1


def test_after_each_batch_the_input_is_observed_with_the_files_still_waiting(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
) -> None:
    # ticks takes one file per batch: while a run goes on, files wait behind each batch.
    for i in range(3):
        drop_order_files(data_root, i, [tick("a", 10 * i + 1, i)])
    ticks_in = dg.AssetKey(["lowmark", "sources", "files_ticks_in"])

    def newest_waiting() -> Any:
        [record] = instance.fetch_observations(ticks_in, limit=1).records
        return record.asset_observation.metadata["ticks/waiting_files"].value  # type: ignore[union-attr]

    assert run_ticks(defs, instance, resources, max_batches=2).success
    folder = sorted(p.name for p in (data_root / "ticks/in").iterdir())
    assert newest_waiting() == 1 == len(folder) - 2  # two files taken, one waits
    observations = instance.fetch_observations(ticks_in, limit=10).records
    assert len(observations) == 2  # one per batch
    assert run_ticks(defs, instance, resources).success
    assert newest_waiting() == 0


def test_a_run_over_a_source_folder_that_is_not_there_fails_naming_it_and_makes_no_checkpoint(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
) -> None:
    failed = run_ticks(defs, instance, resources, max_batches=1, raise_on_error=False)
    assert not failed.success
    [failure] = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.step_failure_data.error.to_string()  # type: ignore[union-attr]
    assert "of the file source of pipeline ticks does not exist: create the folder" in message
    assert not (data_root / "_lowmark").exists()


def test_checks_run_alone_without_running_a_batch(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
) -> None:
    drop_order_files(data_root, 0, [tick("a", 1, 1)])
    assert run_ticks(defs, instance, resources).success
    drop_order_files(data_root, 1, [tick("a", 2, 1)])
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_check_selection={dg.AssetCheckKey(TICKS_LATE, "late_fraction")},
        asset_selection=set(),
    )
    evaluations = job.execute_in_process(
        instance=instance, resources=resources
    ).get_asset_check_evaluations()
    assert [(e.check_name, e.passed) for e in evaluations] == [("late_fraction", True)]
    assert "0 of 1 rows late" in (evaluations[0].description or "")
    commits = DriverTable(f"{ticks.checkpoint_location(data_root)}/commits").read()
    assert commits.num_rows == 1  # the second file waits: no batch ran


def test_the_backfill_job_replaces_one_hour_partition(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
) -> None:
    drop_order_files(data_root, 0, [tick("a", 1, 1), tick("a", 7200, 2)])  # hour 0, then hour 2
    drop_order_files(data_root, 1, [tick("a", 2, 4)])  # late for hour 0
    assert run_ticks(defs, instance, resources).success
    job = defs.resolve_job_def("ticks_backfill")
    done = job.execute_in_process(
        instance=instance, resources=resources, partition_key="2026-01-01-00:00"
    )
    assert done.success
    out = delta_frame(spark, str(data_root / "ticks/out"))
    assert [(r["count"], r["sum_amount"]) for r in out.collect()] == [(2, 5)]  # the late 4 included
    [backfilled] = done.asset_materializations_for_node("ticks_batches")
    assert backfilled.partition == "2026-01-01-00:00"
    assert backfilled.metadata["written_by"] == dg.TextMetadataValue("backfill")
    assert backfilled.metadata[ROW_COUNT] == dg.IntMetadataValue(1)

    refused = job.execute_in_process(
        instance=instance,
        resources=resources,
        partition_key="2026-01-01-02:00",
        raise_on_error=False,
    )
    assert not refused.success
    failure = refused.get_step_failure_events()[0].step_failure_data.error
    assert failure is not None and "is still open" in failure.message


@pytest.mark.integration  # 35 s: the slowest test of `make test` (docs/development.md)
def test_a_backfill_of_several_partitions_from_the_ui_runs_ranges_that_backfill_each(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOWMARK_DATA_ROOT", str(data_root))
    # Hours 0 and 1 hold a window each; a late record for each lands after hour 2's data
    # closed them.
    drop_order_files(data_root, 0, [tick("a", 1, 1), tick("a", 3601, 2), tick("a", 7230, 4)])
    drop_order_files(data_root, 1, [tick("a", 2, 8), tick("a", 3602, 16)])
    hours = ["2026-01-01-00:00", "2026-01-01-01:00"]
    with in_process_workspace() as workspace:
        instance = workspace.instance
        assert run_ticks(workspace_defs, instance, {}).success  # the stream: both hours final
        location = workspace.create_request_context()
        launched = execute_dagster_graphql(
            location, LAUNCH_BACKFILL, backfill_params(TICKS, hours)
        ).data["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        backfill_id = launched["backfillId"]
        # The daemon's iterations: plan and submit the runs (they run in process), see
        # them done, complete the backfill.
        for _ in range(3):
            list(execute_backfill_iteration(workspace, logging.getLogger("backfill")))
        backfill = instance.get_backfill(backfill_id)
        assert backfill is not None and backfill.status == BulkActionStatus.COMPLETED_SUCCESS
        assert backfill.asset_backfill_data is not None
        target = backfill.asset_backfill_data.target_subset
        assert set(target.get_partitions_subset(TICKS).get_partition_keys()) == set(hours)
        # One run for the range, which replaced each hour with its late record included.
        [run] = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert partition_range(run) == (hours[0], hours[1])
        for key in hours:
            [record] = instance.fetch_materializations(
                dg.AssetRecordsFilter(TICKS, asset_partitions=[key]), limit=1
            ).records
            assert record.run_id == run.run_id
            metadata = record.asset_materialization.metadata  # type: ignore[union-attr]
            assert metadata["written_by"] == dg.TextMetadataValue("backfill")
            assert metadata[ROW_COUNT] == dg.IntMetadataValue(1)
    out = delta_frame(spark, str(data_root / "ticks/out")).orderBy("window_start")
    assert [(r["count"], r["sum_amount"]) for r in out.collect()] == [(2, 9), (2, 18)]


def test_the_daily_compact_schedule_runs_checkpoint_maintenance(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
) -> None:
    schedule = defs.resolve_schedule_def("ticks_daily_compact")
    assert schedule.job_name == "ticks_compact"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    job = defs.resolve_job_def("ticks_compact")
    first = job.execute_in_process(instance=instance, resources=resources)
    assert first.success  # no checkpoint yet: nothing to do, not a failure

    for i in range(3):
        drop_order_files(data_root, i, [tick("a", 10 * i + 1, i)])
    assert run_ticks(defs, instance, resources, max_batches=10).success
    offsets = DriverTable(f"{ticks.checkpoint_location(data_root)}/offsets")
    assert offsets.files() >= 3  # a file per batch
    compacted = job.execute_in_process(instance=instance, resources=resources)
    assert compacted.success
    assert offsets.files() == 1


def test_the_demo_passes_its_own_checks(spark: SparkSession, data_root: Path) -> None:
    write_sample_files(data_root)
    for pipeline in (orders, user_revenue):
        MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
        outcomes = {c.name: c.evaluate(pipeline, data_root) for c in checks_of(pipeline)}
        assert all(o.passed for o in outcomes.values()), outcomes
    # The straggler is late on purpose: the late check sees it, within the demo's bound.
    late = late_fraction(user_revenue, data_root)
    assert 10 < late.metadata["percent"] <= 20
