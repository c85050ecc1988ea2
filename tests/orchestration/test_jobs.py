"""The jobs, executed in process: batches commit, the sink records materializations, checks
are evaluated, and the backfill job replaces one partition."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
from pyspark.sql import SparkSession

from orchestration.assets import sink_asset
from state.table import DriverTable
from tests.conftest import write_json_lines
from tests.orchestration.pipelines import ticks

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TICKS = dg.AssetKey(["lowmark", "ticks"])


def tick(user: str, second: int, amount: int) -> dict[str, Any]:
    return {"user": user, "ts": (T0 + timedelta(seconds=second)).isoformat(), "amount": amount}


def drop(root: Path, index: int, rows: list[dict[str, Any]]) -> None:
    write_json_lines(root / "ticks/in", f"f{index}.json", rows, 1_700_000_000 + index)


def test_a_run_drains_batches_and_records_one_materialization_per_batch(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
) -> None:
    drop(data_root, 0, [tick("a", 1, 1), tick("b", 2, 2), tick("a", 30, 4)])
    drop(data_root, 1, [tick("a", 3, 8), tick("b", 45, 16)])  # a@3s is late: [0,10) closed
    result = defs.resolve_job_def("ticks_microbatches").execute_in_process(
        instance=instance,
        resources=resources,
        run_config={"ops": {"ticks_run_batches": {"config": {"max_batches": 1}}}},
    )
    assert result.success
    assert result.dagster_run.tags["lowmark/pipeline"] == "ticks"
    again = defs.resolve_job_def("ticks_microbatches").execute_in_process(
        instance=instance, resources=resources
    )
    assert again.success

    records = instance.fetch_materializations(TICKS, limit=10).records
    metadata = [r.asset_materialization.metadata for r in reversed(records)]  # type: ignore[union-attr]
    assert [m["batch_id"].value for m in metadata] == [0, 1]
    assert [m["rows_in"].value for m in metadata] == [3, 2]
    assert [m["rows_late"].value for m in metadata] == [0, 1]
    # The first batch saw events up to 30 s: that is its watermark (no out-of-orderness).
    assert metadata[0]["watermark_ms"].value == int((T0 + timedelta(seconds=30)).timestamp() * 1000)

    checks = {e.check_name: e for e in again.get_asset_check_evaluations()}
    assert not checks["late_fraction"].passed  # 1 of 5 rows late, over the 5 % default
    assert not checks["watermark_lag"].passed  # event time is in 2026-01, far behind the clock


def test_the_on_demand_checks_report_the_same_health(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
) -> None:
    drop(data_root, 0, [tick("a", 1, 1)])
    defs.resolve_job_def("ticks_microbatches").execute_in_process(
        instance=instance, resources=resources
    )
    ticks_checks = [
        c
        for c in (defs.asset_checks or [])
        if isinstance(c, dg.AssetChecksDefinition)
        and all(k.asset_key == TICKS for k in c.check_keys)
    ]
    evaluations = dg.materialize(
        [sink_asset(ticks), *ticks_checks],
        selection=dg.AssetSelection.checks_for_assets(TICKS),
        resources=resources,
        instance=instance,
    ).get_asset_check_evaluations()
    by_name = {e.check_name: e for e in evaluations}
    assert by_name["late_fraction"].passed  # nothing late
    assert "0 of 1 rows late" in (by_name["late_fraction"].description or "")


def test_the_backfill_job_replaces_one_hour_partition(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
) -> None:
    drop(data_root, 0, [tick("a", 1, 1), tick("a", 7200, 2)])  # hour 0, then hour 2
    drop(data_root, 1, [tick("a", 2, 4)])  # late for hour 0
    defs.resolve_job_def("ticks_microbatches").execute_in_process(
        instance=instance, resources=resources
    )
    job = defs.resolve_job_def("ticks_backfill")
    done = job.execute_in_process(
        instance=instance, resources=resources, partition_key="2026-01-01-00:00"
    )
    assert done.success
    out = spark.read.format("delta").load(str(data_root / "ticks/out"))
    assert [(r["count"], r["sum_amount"]) for r in out.collect()] == [(2, 5)]  # the late 4 included

    refused = job.execute_in_process(
        instance=instance,
        resources=resources,
        partition_key="2026-01-01-02:00",
        raise_on_error=False,
    )
    assert not refused.success
    failure = refused.get_step_failure_events()[0].step_failure_data.error
    assert failure is not None and "is still open" in failure.message


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
        drop(data_root, i, [tick("a", 10 * i + 1, i)])
    ran = defs.resolve_job_def("ticks_microbatches").execute_in_process(
        instance=instance,
        resources=resources,
        run_config={"ops": {"ticks_run_batches": {"config": {"max_batches": 10}}}},
    )
    assert ran.success
    offsets = DriverTable(f"{ticks.checkpoint_location(data_root)}/offsets")
    assert offsets.files() >= 3  # a file per batch
    compacted = job.execute_in_process(instance=instance, resources=resources)
    assert compacted.success
    assert offsets.files() == 1
