"""Sensor ticks: new data, no data, an uncommitted batch, a run in flight, no Spark, and a
following run that yielded to a queued run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.storage.tags import RUN_KEY_TAG
from dagster._core.test_utils import create_run_for_test
from pyspark.sql import SparkSession

from lowmark.batches.admin.reset import reset
from lowmark.batches.clock import SystemClock
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.registry import load_pipelines
from lowmark.orchestration.definitions import build_definitions
from lowmark.orchestration.observations import PENDING_CHANGE
from lowmark.orchestration.resources import LowmarkResource, SparkResource
from lowmark.orchestration.yields import Yielded
from tests.helpers import write_json_lines
from tests.orchestration.conftest import PIPELINES
from tests.orchestration.pipelines import slow


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, resources: dict[str, Any]) -> Any:
    context = dg.build_sensor_context(instance=instance, resources=resources)
    return defs.resolve_sensor_def("slow_sensor").evaluate_tick(context)


def drop(root: Path, index: int) -> None:
    write_json_lines(root / "slow/in", f"f{index}.json", [{"id": index}], 1_700_000_000 + index)


@pytest.fixture(autouse=True)
def input_folder(data_root: Path) -> Path:
    """``slow``'s input folder, there and empty."""
    folder = data_root / "slow/in"
    folder.mkdir(parents=True)
    return folder


def test_no_data_skips_with_a_reason(
    defs: dg.Definitions, instance: dg.DagsterInstance, resources: dict[str, Any]
) -> None:
    data = tick(defs, instance, resources)
    assert not data.run_requests
    assert "caught up" in (data.skip_message or "")


def test_a_source_folder_that_is_not_there_skips_naming_it_not_as_caught_up(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
    input_folder: Path,
) -> None:
    input_folder.rmdir()
    data = tick(defs, instance, resources)
    assert not data.run_requests
    assert f"folder {data_root / 'slow/in'} of the file source of pipeline slow does not " in (
        data.skip_message or ""
    )
    assert not (data_root / "_lowmark").exists()


def test_new_files_request_a_run_keyed_by_the_next_batch_id(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOWMARK_DATA_ROOT", str(data_root))
    drop(data_root, 0)
    first = tick(defs, instance, resources)
    assert [r.run_key for r in first.run_requests] == ["slow:new:batch-0"]  # no checkpoint yet
    assert first.run_requests[0].tags["lowmark/pipeline"] == "slow"

    runner = MicroBatchRunner(spark, slow, data_root)
    runner.run(max_batches=None)
    assert not tick(defs, instance, resources).run_requests
    drop(data_root, 1)
    keys = [r.run_key for r in tick(defs, instance, resources).run_requests]
    assert keys == [f"slow:{runner.checkpoint.pipeline_id}:batch-1"]


def test_after_a_reset_the_sensor_requests_a_run_under_a_key_no_earlier_run_used(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOWMARK_DATA_ROOT", str(data_root))
    drop(data_root, 0)
    [request] = tick(defs, instance, resources).run_requests
    # The run the daemon launched for it, which ran batch 0.
    create_run_for_test(
        instance,
        job_name="slow_microbatches",
        tags={"lowmark/pipeline": "slow", RUN_KEY_TAG: request.run_key},
        status=dg.DagsterRunStatus.SUCCESS,
    )
    MicroBatchRunner(spark, slow, data_root).run(max_batches=None)

    reset(spark, slow, data_root, "truncate")
    [again] = tick(defs, instance, resources).run_requests
    # Dagster skips a request whose key a run already has: the new checkpoint would never run.
    assert instance.get_runs(dg.RunsFilter(tags={RUN_KEY_TAG: again.run_key})) == []


def test_an_uncommitted_batch_requests_a_replay_run(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOWMARK_DATA_ROOT", str(data_root))
    drop(data_root, 0)
    runner = MicroBatchRunner(spark, slow, data_root)

    def die(*_: Any) -> int:
        raise RuntimeError("killed before the sink write")

    monkeypatch.setattr(runner.sink, "write", die)
    with pytest.raises(RuntimeError):
        runner.run_batch()
    failed = create_run_for_test(
        instance,
        job_name="slow_microbatches",
        tags={"lowmark/pipeline": "slow"},
        status=dg.DagsterRunStatus.FAILURE,
    )
    data = tick(defs, instance, resources)
    key = f"slow:{runner.checkpoint.pipeline_id}:batch-0:replay-after-{failed.run_id}"
    assert [r.run_key for r in data.run_requests] == [key]


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTED])
def test_a_run_in_flight_blocks_new_requests(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
    status: dg.DagsterRunStatus,
) -> None:
    drop(data_root, 0)
    run = create_run_for_test(
        instance, job_name="slow_microbatches", tags={"lowmark/pipeline": "slow"}, status=status
    )
    data = tick(defs, instance, resources)
    assert not data.run_requests
    assert data.skip_message == f"run {run.run_id} of slow is {status.value}"


class NoSpark(SparkResource):
    """A Spark resource a tick must not use: the checkpoint and the folder are read without it."""

    def session(self) -> SparkSession:
        raise AssertionError("a sensor tick asked for a Spark session")


def test_a_tick_reads_the_checkpoint_and_the_folder_without_spark(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    data_root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOWMARK_DATA_ROOT", str(data_root))
    drop(data_root, 0)
    runner = MicroBatchRunner(spark, slow, data_root)
    runner.run(max_batches=None)
    drop(data_root, 1)
    no_spark = {"spark": NoSpark(), "lowmark": LowmarkResource(data_root=str(data_root))}
    keys = [r.run_key for r in tick(defs, instance, no_spark).run_requests]
    assert keys == [f"slow:{runner.checkpoint.pipeline_id}:batch-1"]


def test_a_tick_observes_the_input_when_what_waits_there_differs_from_its_newest_observation(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOWMARK_DATA_ROOT", str(data_root))
    no_spark = {"spark": NoSpark(), "lowmark": LowmarkResource(data_root=str(data_root))}

    def observe() -> Sequence[Any]:
        """A tick's observations, recorded as the daemon records them."""
        context = dg.build_sensor_context(instance=instance, resources=no_spark)
        events = defs.resolve_sensor_def("slow_sensor").evaluate_tick(context).asset_events
        for event in events:
            instance.report_runless_asset_event(event)
        return events

    drop(data_root, 0)
    [seen] = observe()
    assert seen.asset_key == dg.AssetKey(["lowmark", "sources", "files_slow_in"])
    assert seen.metadata["slow/waiting_files"] == dg.IntMetadataValue(1)
    assert seen.description == "for slow: 1 new files (10 bytes) waiting"
    assert not observe()  # nothing changed: nothing observed

    # A run takes the file and observes none waiting; one file (of the same size) lands
    # after it: what the tick before the run saw, but not what the newest observation says.
    job = defs.resolve_job_def("slow_microbatches")
    assert job.execute_in_process(instance=instance, resources=resources).success
    drop(data_root, 1)
    [after_run] = observe()
    assert after_run.metadata["slow/waiting_files"] == dg.IntMetadataValue(1)
    assert not observe()


def test_observe_sources_records_what_waits_for_each_pipeline_reading_an_input(
    instance: dg.DagsterInstance, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inputs are observable sources (their Observe button in the UI runs this): what waits
    for each pipeline, as the sensor records it, read without Spark."""
    monkeypatch.setenv("LOWMARK_DATA_ROOT", str(data_root))
    defs = build_definitions(PIPELINES)
    key = dg.AssetKey(["lowmark", "sources", "files_slow_in"])
    assert defs.resolve_assets_def(key).is_observable
    drop(data_root, 0)
    drop(data_root, 1)
    observe = dg.define_asset_job("observe_inputs", selection=[key])
    job = dg.Definitions.merge(defs, dg.Definitions(jobs=[observe])).resolve_job_def(observe.name)
    assert job.execute_in_process(instance=instance).success
    [event] = instance.fetch_observations(key, limit=10).records
    observation = event.asset_observation
    assert observation is not None
    assert observation.metadata["slow/waiting_files"] == dg.IntMetadataValue(2)


def follower(
    instance: dg.DagsterInstance,
    status: dg.DagsterRunStatus = dg.DagsterRunStatus.SUCCESS,
    yielded: Yielded | None = None,
    run_key: str | None = None,
) -> DagsterRun:
    """A finished run of slow's micro-batch job that was to follow the source, as the sensor
    launches them; ``yielded``: it recorded that it made way for a queued run."""
    tags = {"lowmark/pipeline": "slow", **(yielded.tags() if yielded else {})}
    return create_run_for_test(
        instance,
        job_name="slow_microbatches",
        tags={**tags, RUN_KEY_TAG: run_key} if run_key else tags,
        status=status,
        run_config={"ops": {"slow_batches": {"config": {"follow_seconds": 3600}}}},
    )


def materialize_run(instance: dg.DagsterInstance) -> DagsterRun:
    """The finished UI Materialize a follower yielded to."""
    return create_run_for_test(instance, job_name="__ASSET_JOB", status=dg.DagsterRunStatus.SUCCESS)


def test_after_a_yield_a_tick_without_new_data_resumes_following_for_the_rest_of_the_window(
    defs: dg.Definitions, instance: dg.DagsterInstance, data_root: Path
) -> None:
    no_spark = {"spark": NoSpark(), "lowmark": LowmarkResource(data_root=str(data_root))}
    materialize = materialize_run(instance)
    yielded = follower(
        instance, yielded=Yielded(materialize.run_id, SystemClock().now_ms() + 600_000)
    )
    materialize_run(instance)  # the newest finished run is the one it yielded to

    [request] = tick(defs, instance, no_spark).run_requests
    assert request.run_key == f"slow:resume-after-{yielded.run_id}"
    assert request.tags["lowmark/pipeline"] == "slow"
    seconds = request.run_config["ops"]["slow_batches"]["config"]["follow_seconds"]
    assert 590 < seconds <= 600  # the window's rest, not LOWMARK_FOLLOW_SECONDS
    # Each yield is resumed once: every tick asks under the same key, and Dagster launches one.
    assert [r.run_key for r in tick(defs, instance, no_spark).run_requests] == [request.run_key]

    follower(instance, run_key=request.run_key)  # the resuming run, ended with its window
    data = tick(defs, instance, no_spark)
    assert not data.run_requests
    assert "caught up" in (data.skip_message or "")


@pytest.mark.parametrize(
    ("status", "window_left_ms"),
    [
        pytest.param(dg.DagsterRunStatus.SUCCESS, -1_000, id="window-passed"),
        pytest.param(dg.DagsterRunStatus.SUCCESS, None, id="ended-without-yielding"),
        pytest.param(dg.DagsterRunStatus.FAILURE, 600_000, id="failed-after-yielding"),
        pytest.param(dg.DagsterRunStatus.CANCELED, 600_000, id="terminated-after-yielding"),
    ],
)
def test_a_follower_that_did_not_end_by_yielding_in_an_open_window_is_not_resumed(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    data_root: Path,
    status: dg.DagsterRunStatus,
    window_left_ms: int | None,
) -> None:
    no_spark = {"spark": NoSpark(), "lowmark": LowmarkResource(data_root=str(data_root))}
    materialize = materialize_run(instance)
    until_ms = None if window_left_ms is None else SystemClock().now_ms() + window_left_ms
    follower(instance, status, Yielded(materialize.run_id, until_ms) if until_ms else None)
    data = tick(defs, instance, no_spark)
    assert not data.run_requests
    assert "caught up" in (data.skip_message or "")


def test_an_older_yield_behind_a_newer_follower_is_not_resumed(
    defs: dg.Definitions, instance: dg.DagsterInstance, data_root: Path
) -> None:
    no_spark = {"spark": NoSpark(), "lowmark": LowmarkResource(data_root=str(data_root))}
    materialize = materialize_run(instance)
    follower(instance, yielded=Yielded(materialize.run_id, SystemClock().now_ms() + 600_000))
    follower(instance, dg.DagsterRunStatus.CANCELED)  # launched after it, then terminated
    assert not tick(defs, instance, no_spark).run_requests


def test_with_new_data_after_a_yield_the_usual_run_follows_for_lowmark_follow_seconds(
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    data_root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOWMARK_FOLLOW_SECONDS", "900")
    no_spark = {"spark": NoSpark(), "lowmark": LowmarkResource(data_root=str(data_root))}
    materialize = materialize_run(instance)
    follower(instance, yielded=Yielded(materialize.run_id, SystemClock().now_ms() + 600_000))
    drop(data_root, 0)
    [request] = tick(defs, instance, no_spark).run_requests
    assert request.run_key == "slow:new:batch-0"
    assert request.run_config["ops"]["slow_batches"]["config"]["follow_seconds"] == 900


CHANGED = (
    "from tests.orchestration import pipelines\n"
    "from lowmark.batches.pipeline import FileSource\n"
    "source = FileSource(path='slow/in', format='json', schema_ddl='id LONG, note STRING')\n"
    "slow = pipelines.slow.model_copy(update={'source': source})\n"
)
"""``slow`` with a column added to its source: a change compatible at a batch boundary."""


def test_a_tick_shows_a_pending_definition_change_on_the_sink_once_until_a_batch_takes_it(
    spark: SparkSession,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOWMARK_DATA_ROOT", str(data_root))
    drop(data_root, 0)
    MicroBatchRunner(spark, slow, data_root).run_batch()
    changed = tmp_path / "changed.py"
    changed.write_text(CHANGED)
    defs = build_definitions(str(changed))
    sink = dg.AssetKey(["lowmark", "slow"])

    def shown() -> list[str]:
        """What a tick observes on the sink (recorded as the daemon records it)."""
        events = tick(defs, instance, resources).asset_events
        for event in events:
            instance.report_runless_asset_event(event)
        return [e.metadata[PENDING_CHANGE].value for e in events if e.asset_key == sink]

    drop(data_root, 1)
    [pending] = shown()
    assert pending.startswith("source.schema_ddl.note (compatible: source column added")
    assert shown() == []  # recorded once, not on every tick

    changed_slow = load_pipelines(str(changed))["slow"]
    result = MicroBatchRunner(spark, changed_slow, data_root).run_batch()
    assert result is not None and result.batch_id == 1  # the batch that took the change
    assert shown() == ["none"]
    assert shown() == []
