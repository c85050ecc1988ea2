"""A definition may change freely until the first batch commits
(lowmark.batches.loop.start_over)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.loop.parts import read_only_planner
from lowmark.state.errors import FingerprintMismatch
from tests.helpers import SPARK_ERRORS, delta_frame, double_amount, drop_file, per_unit, pipeline


def test_a_pipeline_changed_after_its_first_batch_failed_starts_over_under_the_new_definition(
    spark: SparkSession, data_root: Path
) -> None:
    drop_file(data_root, 0)  # amounts 0, 1, 2: per_unit divides by zero
    with pytest.raises(SPARK_ERRORS):
        MicroBatchRunner(spark, pipeline(transform=per_unit), data_root).run_batch()

    fixed = pipeline(transform=double_amount)
    # What a sensor tick or `lowmark status` asks: batch 0 is still to run, not an error.
    planned = read_only_planner(spark, fixed, data_root).next_batch(dry_run=True).planned
    assert planned is not None and planned.batch_id == 0

    done = MicroBatchRunner(spark, fixed, data_root).run_batch()
    assert done is not None and (done.batch_id, done.replay, done.rows_out) == (0, False, 3)
    rows = delta_frame(spark, str(data_root / "out")).collect()
    assert sorted((r["id"], r["amount"]) for r in rows) == [(0, 0), (1, 2), (2, 4)]
    # The failed checkpoint is kept beside the new one, never deleted.
    assert [p.name.split("-")[0] for p in (data_root / "_lowmark").glob("t.changed-*")] == [
        "t.changed"
    ]


def test_a_first_batch_that_wrote_its_sink_before_dying_still_pins_the_definition(
    spark: SparkSession, data_root: Path
) -> None:
    drop_file(data_root, 0)
    with pytest.raises(InjectedCrash), crash_at(KillPoint("after_sink", 0)):
        MicroBatchRunner(spark, pipeline(), data_root).run_batch()
    with pytest.raises(FingerprintMismatch, match=r'transform: null -> "tests\.helpers:double'):
        MicroBatchRunner(spark, pipeline(transform=double_amount), data_root).run_batch()
    assert not list((data_root / "_lowmark").glob("t.changed-*"))
