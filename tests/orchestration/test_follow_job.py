"""A micro-batch run with ``follow_seconds``: after draining it takes files that land later."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from batches.follow import FollowResult
from orchestration import jobs
from orchestration.resources import LowmarkResource, SparkResource
from tests.batches.helpers import drop_file, pipeline, sink_ids


@pytest.mark.slow
def test_a_run_with_follow_seconds_takes_a_file_that_lands_after_it_caught_up(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_file(data_root, 0)
    real_follow = jobs.follow
    followed: list[FollowResult] = []

    def land_a_file_then_follow(*args: Any, **kwargs: Any) -> FollowResult:
        drop_file(data_root, 1)  # lands once the drain is over, caught up
        followed.append(real_follow(*args, **kwargs))
        return followed[-1]

    monkeypatch.setattr(jobs, "follow", land_a_file_then_follow)
    result = jobs.microbatch_job(pipeline(name="followed")).execute_in_process(
        resources={"spark": SparkResource(), "lowmark": LowmarkResource(data_root=str(data_root))},
        run_config={
            "ops": {
                "followed_run_batches": {
                    "config": {"follow_seconds": 1, "poll_interval_seconds": 0.1}
                }
            }
        },
    )

    assert result.success
    materializations = result.asset_materializations_for_node("followed_run_batches")
    assert [m.metadata["batch_id"] for m in materializations] == [
        dg.IntMetadataValue(0),
        dg.IntMetadataValue(1),
    ]
    assert [b.batch_id for b in followed[0].batches] == [1]
    assert followed[0].stopped_by == "max_seconds"
    assert sink_ids(spark, data_root) == [0, 1, 2, 100, 101, 102]
