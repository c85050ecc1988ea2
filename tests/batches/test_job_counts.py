"""Spark jobs per batch: a count, not a time, so it can be asserted on any machine.

Bookkeeping runs on the driver; the Spark jobs of a batch are its data work
only. The bounds are the performance budget's (stateless <= 4, windowed <=
8); the per-step counts are printed for the README's table.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from batches import faults
from batches.microbatch import BatchResult, MicroBatchRunner
from batches.pipeline import Pipeline
from batches.windows import Session, Tumbling
from tests.batches.helpers import drop_file, pipeline
from tests.batches.test_windows import drop_batches, event, windowed

STATELESS_LIMIT = 4
WINDOWED_LIMIT = 8
_groups = itertools.count()


class JobCounter:
    """Spark jobs started by this thread while counting, in total and per batch step."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.group = f"count-{next(_groups)}"
        self.per_step: dict[str, int] = {}

    def jobs(self) -> int:
        tracker = self.spark.sparkContext.statusTracker()
        return len(tracker.getJobIdsForGroup(self.group))

    @contextmanager
    def counting(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        """Count the jobs of the block; ``faults.reached`` marks where each step ends."""
        self.per_step = {}
        last = [0]

        def reached(step: str, batch_id: int) -> None:
            now = self.jobs()
            self.per_step[step] = now - last[0]
            last[0] = now

        self.spark.sparkContext.setJobGroup(self.group, "a counted batch")
        monkeypatch.setattr(faults, "reached", reached)
        try:
            yield
        finally:
            monkeypatch.undo()
            self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        self.per_step["rest"] = self.jobs() - last[0]


def counted_batch(
    spark: SparkSession, runner: MicroBatchRunner, monkeypatch: pytest.MonkeyPatch
) -> tuple[BatchResult, JobCounter]:
    counter = JobCounter(spark)
    with counter.counting(monkeypatch):
        result = runner.run_batch()
    assert result is not None
    print(f"batch {result.batch_id}: {counter.jobs()} jobs {counter.per_step}")
    return result, counter


def test_a_stateless_batch_runs_at_most_four_spark_jobs(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3):
        drop_file(data_root, i)
    p = pipeline(source=pipeline().source.model_copy(update={"max_files_per_batch": 1}))
    runner = MicroBatchRunner(spark, p, data_root)
    runner.run_batch()  # the first batch creates the sink
    for _ in range(2):
        result, counter = counted_batch(spark, runner, monkeypatch)
        assert result.rows_out == 3
        assert counter.jobs() <= STATELESS_LIMIT, counter.per_step
        # Planning, the logs and the commit run on the driver: no job at all.
        assert counter.per_step["after_plan"] == counter.per_step["after_commit"] == 0


@pytest.mark.parametrize(
    "windowing",
    [
        windowed(Tumbling(size="10 seconds"), max_out_of_orderness="5 seconds"),
        windowed(Session(gap="10 seconds"), "update", max_out_of_orderness="5 seconds"),
    ],
    ids=["tumbling-append", "session-update"],
)
def test_a_windowed_batch_with_state_late_rows_and_output_runs_at_most_eight_spark_jobs(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch, windowing: Pipeline
) -> None:
    drop_batches(
        data_root,
        [
            [event("a", 1, 1), event("b", 2, 1)],
            [event("a", 14, 1), event("b", 30, 2)],
            # updates open windows, emits closed ones and holds one late record
            [event("a", 33, 3), event("b", 1, 9), event("c", 45, 4)],
        ],
    )
    runner = MicroBatchRunner(spark, windowing, data_root)
    runner.run(max_batches=2)
    result, counter = counted_batch(spark, runner, monkeypatch)
    assert (result.rows_late, result.rows_out > 0) == (1, True)
    assert counter.jobs() <= WINDOWED_LIMIT, counter.per_step
    assert counter.per_step["after_plan"] == counter.per_step["after_commit"] == 0
