"""``lowmark rebuild`` as a Dagster run (lowmark.orchestration.jobs.rebuild_job)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
from pyspark.sql import SparkSession

from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.windows import Tumbling
from lowmark.orchestration.jobs import rebuild_job
from tests.helpers import delta_frame, drop_order_files, tick
from tests.orchestration.pipelines import ticks


def test_the_rebuild_job_recomputes_a_changed_pipeline_and_logs_each_shadow_batch(
    spark: SparkSession,
    defs: dg.Definitions,
    instance: dg.DagsterInstance,
    resources: dict[str, Any],
    data_root: Path,
) -> None:
    assert "ticks_rebuild" in {j.name for j in defs.resolve_all_job_defs()}
    drop_order_files(data_root, 0, [tick("a", 1, 1), tick("a", 12, 2), tick("a", 41, 4)])
    MicroBatchRunner(spark, ticks, data_root).run(max_batches=None)
    assert ticks.aggregation is not None
    wider = Tumbling(size="20 seconds")  # a window size changed: a rebuild
    changed = ticks.model_copy(
        update={"aggregation": ticks.aggregation.model_copy(update={"window": wider})}
    )

    result = rebuild_job(changed).execute_in_process(instance=instance, resources=resources)

    assert result.success
    logged = [e.user_message for e in instance.all_logs(result.run_id)]
    assert any("ticks: shadow batch 0 committed (live batch 0 of" in m for m in logged)
    windows = delta_frame(spark, data_root / "ticks/out").collect()
    assert [(w["count"], w["sum_amount"]) for w in windows] == [(2, 3)]
    assert all(w["window_end"] - w["window_start"] == timedelta(seconds=20) for w in windows)
