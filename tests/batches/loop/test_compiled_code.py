"""A batch planned like the one before it compiles no Java: a count, not a time.

Spark compiles each stage of a plan to Java and caches the classes by their source. A
literal number is written into that source, so a plan that differs from the last batch's
only by its watermark, its processing time or its batch id would be compiled again, batch
after batch (``lowmark.batches.batch_values``); and a plan of more classes than Spark's
cache holds (a session window's) would be compiled again whole (``spark.sql.codegen.cache
.maxEntries``, ``lowmark.state.session``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from examples.keyed import ALERTS, SilenceAlert
from lowmark.batches.dedup import Dedup
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.windows import Session, Tumbling
from lowmark.state.delta import STATE_JOB_GROUP
from tests.batches.event_time.test_interval_join import joined, write_versions
from tests.helpers import INTERPRETED, FakeClock, drop_batches, event, timed, windowed

KINDS: dict[str, Pipeline] = {
    "tumbling": windowed(Tumbling(size="1 minute"), max_out_of_orderness="10 seconds"),
    "session": windowed(Session(gap="20 seconds"), max_out_of_orderness="10 seconds"),
    "dedup": timed(dedup=Dedup(columns=("user", "ts"), within="1 hour")),
    "keyed": timed(
        keyed=Keyed(
            processor=SilenceAlert, keys=("user",), output_schema=ALERTS, time_mode="event_time"
        )
    ),
}


@pytest.fixture
def generating(spark: SparkSession) -> Iterator[SparkSession]:
    """The suite's session generating code for its plans, as Spark's defaults do (the suite
    evaluates them without: ``INTERPRETED``)."""
    spark.conf.set("spark.sql.codegen.wholeStage", "true")
    spark.conf.set("spark.sql.codegen.factoryMode", "FALLBACK")
    try:
        yield spark
    finally:
        for key, value in INTERPRETED.items():
            spark.conf.set(key, value)


def _compilations(spark: SparkSession) -> int:
    """Classes Spark's JVM has compiled so far (its cache's misses)."""
    metrics = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics  # type: ignore[union-attr]
    return int(metrics.METRIC_COMPILATION_TIME().getCount())


def _settled() -> None:
    """Wait for the jobs a sink's write leaves running (``lowmark.state.delta``)."""
    for thread in threading.enumerate():
        if thread.name.startswith(STATE_JOB_GROUP):
            thread.join()


@pytest.mark.parametrize("kind", [*KINDS, "stream join"])
def test_a_batch_planned_like_the_one_before_compiles_no_code(
    generating: SparkSession, data_root: Path, kind: str
) -> None:
    """Each batch moves event time, the watermark, the clock and the batch id on; each of
    the files holds a record far behind the watermark (late, for a stage that has one), the
    stream join's input is its own test's. From the fourth batch on, nothing is compiled."""
    if kind == "stream join":
        write_versions(data_root)
        p = joined(data_root)
    else:
        batches = [
            [
                event("a", 60 * i, 1),
                event("b", 60 * i + 5, 2),
                event(f"u{i}", 60 * i + 10, 3),
                event("c", 60 * i - 600, 4),
            ]
            for i in range(5)
        ]
        drop_batches(data_root, batches)
        p = KINDS[kind]
    spark = generating
    runner = MicroBatchRunner(spark, p, data_root, FakeClock(step_ms=1_000))
    for _ in range(3):
        assert runner.run_batch() is not None
    _settled()
    for _ in range(2):
        before = _compilations(spark)
        result = runner.run_batch()
        assert result is not None
        _settled()
        assert _compilations(spark) == before, f"batch {result.batch_id} compiled code"
