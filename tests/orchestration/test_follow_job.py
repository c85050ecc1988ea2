"""A micro-batch run with ``follow_seconds``: after draining it takes files that land later, and
it makes way for a run of its pipeline that is queued behind it."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.remote_origin import (
    InProcessCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from pyspark.sql import SparkSession

from lowmark.batches.clock import SystemClock
from lowmark.batches.loop.follow import FollowResult
from lowmark.orchestration import runs
from lowmark.orchestration.assets import pipeline_assets
from lowmark.orchestration.resources import LowmarkResource, SparkResource
from lowmark.orchestration.yields import Yielded
from tests.helpers import drop_file, pipeline, sink_ids


def queued_run(instance: dg.DagsterInstance, **fields: Any) -> str:
    """Add a queued run (as the UI's Materialize or a sensor leaves one) with ``fields``."""
    run_id = str(uuid.uuid4())
    instance.add_run(
        DagsterRun(
            job_name="__ASSET_JOB",
            run_id=run_id,
            status=dg.DagsterRunStatus.QUEUED,
            remote_job_origin=RemoteJobOrigin(
                RemoteRepositoryOrigin(
                    InProcessCodeLocationOrigin(LoadableTargetOrigin(python_file="x.py")),
                    "__repository__",
                ),
                "__ASSET_JOB",
            ),
            **fields,
        )
    )
    return run_id


def test_twenty_following_runs_read_the_run_queue_once_and_each_sees_its_own_queued_runs(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    behind_p3 = queued_run(instance, tags={"lowmark/pipeline": "p3"})
    reads = []
    real_read = instance.get_run_records

    def counted_read(*args: Any, **kwargs: Any) -> Any:
        reads.append(args)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(instance, "get_run_records", counted_read)
    queue = runs.QueuedRuns()
    seen = {n: queue.of(instance, pipeline(name=f"p{n}")) for n in range(20)}

    assert len(reads) == 1
    assert [r.run_id for r in seen[3]] == [behind_p3]
    assert all(seen[n] == [] for n in range(20) if n != 3)


def materialize(
    instance: dg.DagsterInstance, data_root: Path, name: str, **config: float
) -> tuple[dg.ExecuteInProcessResult, DagsterRun]:
    """Materialize pipeline ``name``'s assets on ``instance`` with the op ``config``: the
    result, and the run as the instance holds it after."""
    result = dg.materialize(
        [pipeline_assets(pipeline(name=name), data_root)],
        instance=instance,
        resources={"spark": SparkResource(), "lowmark": LowmarkResource(data_root=str(data_root))},
        run_config={"ops": {f"{name}_batches": {"config": config}}},
    )
    run = instance.get_run_by_id(result.run_id)
    assert run is not None
    return result, run


@pytest.mark.slow
def test_a_run_with_follow_seconds_takes_a_file_that_lands_after_it_caught_up(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_file(data_root, 0)
    real_follow = runs.follow
    followed: list[FollowResult] = []

    def land_a_file_then_follow(*args: Any, **kwargs: Any) -> FollowResult:
        drop_file(data_root, 1)  # lands once the drain is over, caught up
        followed.append(real_follow(*args, **kwargs))
        return followed[-1]

    monkeypatch.setattr(runs, "follow", land_a_file_then_follow)
    with dg.instance_for_test() as instance:
        result, run = materialize(
            instance, data_root, "followed", follow_seconds=1, poll_interval_seconds=0.1
        )

    assert result.success
    materializations = result.asset_materializations_for_node("followed_batches")
    sink = dg.AssetKey(["lowmark", "followed"])
    assert [m.metadata["batch"] for m in materializations if m.asset_key == sink] == [
        dg.TextMetadataValue("0"),
        dg.TextMetadataValue("1"),
    ]
    assert [b.batch_id for b in followed[0].batches] == [1]
    assert followed[0].stopped_by == "max_seconds"
    assert Yielded.of(run) is None  # its window ended: nothing to resume
    assert sink_ids(spark, data_root) == [0, 1, 2, 100, 101, 102]


@pytest.mark.slow
def test_a_following_run_makes_way_for_a_queued_run_of_its_pipeline(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_file(data_root, 0)
    real_follow = runs.follow
    followed: list[FollowResult] = []
    queued: list[str] = []
    sink = dg.AssetKey(["lowmark", "yielding"])

    with dg.instance_for_test() as instance:

        def queue_a_materialize_then_follow(*args: Any, **kwargs: Any) -> FollowResult:
            # What the UI's Materialize leaves in the queue: no lowmark tag, the sink selected.
            queued.append(queued_run(instance, asset_selection=frozenset({sink})))
            followed.append(real_follow(*args, **kwargs))
            return followed[-1]

        monkeypatch.setattr(runs, "follow", queue_a_materialize_then_follow)
        started = time.monotonic()
        before_ms = SystemClock().now_ms()
        result, run = materialize(instance, data_root, "yielding", follow_seconds=120)
        after_ms = SystemClock().now_ms()

    assert result.success
    assert followed[0].stopped_by == "should_stop"
    assert time.monotonic() - started < 60  # not the 120 s it would follow otherwise
    # The run records the yield, for the sensor to resume following after the queued run.
    yielded = Yielded.of(run)
    assert yielded is not None
    assert yielded.to_run_id == queued[0]
    # Its 120 s follow window began once caught up; the tag is to the second.
    assert before_ms + 120_000 - 1_000 <= yielded.until_ms <= after_ms + 120_000
