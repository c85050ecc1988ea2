"""The post-aggregation step: emitted windows filtered or projected before the sink."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.sql import SqlStep
from lowmark.batches.windows import Tumbling
from tests.helpers import T0, drop_batches, event, pipeline, reference, sink, windowed

WINDOW = Tumbling(size="10 seconds")
COLUMNS = ("user", "window_start", "window_end", "count", "sum_amount")
MODEST = f"SELECT {', '.join(COLUMNS)} FROM windows WHERE sum_amount BETWEEN 5 AND 10"
BATCHES = [
    # a's first window passes (5), b's fails (3), c's fails (20)
    [event("a", 1, 5), event("b", 3, 3), event("c", 4, 20)],
    # a's stops passing (14), b's starts (7), c opens a window that fails (1)
    [event("a", 2, 9), event("b", 5, 4), event("c", 15, 1)],
    # moves the watermark past every window above (append mode emits them)
    [event("z", 40, 1)],
]


def modest(windows: DataFrame) -> DataFrame:
    """``MODEST`` as a Python function."""
    return windows.where(F.col("sum_amount").between(5, 10)).select(*COLUMNS)


def expected(spark: SparkSession, root: Path) -> DataFrame:
    """One plain Spark batch's aggregation over every file, then the same filter."""
    return modest(reference(spark, root, WINDOW))


@pytest.mark.parametrize(
    ("mode", "step"),
    [("update", SqlStep(sql=MODEST)), ("append", modest)],
    ids=["update-sql", "append-python"],
)
def test_the_sink_holds_the_whole_inputs_aggregation_through_the_same_filter(
    spark: SparkSession, data_root: Path, mode: str, step: object
) -> None:
    drop_batches(data_root, BATCHES)
    p = windowed(WINDOW, mode).model_copy(update={"post_aggregation": step})
    runner = MicroBatchRunner(spark, p, data_root)
    runner.run(max_batches=2)
    if mode == "update":  # a window that passed, then failed, left the sink; b's came in
        assertDataFrameEqual(sink(spark, data_root), expected(spark, data_root))
    runner.run(max_batches=None)
    closed = F.col("window_end") <= F.lit(T0 + timedelta(seconds=40))
    written = sink(spark, data_root)
    assert tuple(written.columns) == COLUMNS
    assertDataFrameEqual(written.where(closed), expected(spark, data_root).where(closed))
    assert [r["user"] for r in written.collect()] == ["b"]


def test_an_update_mode_step_that_drops_the_window_identity_fails_in_one_line(
    spark: SparkSession, data_root: Path
) -> None:
    drop_batches(data_root, BATCHES[:1])
    step = SqlStep(sql="SELECT user, count FROM windows")
    p = windowed(WINDOW, "update").model_copy(update={"post_aggregation": step})
    with pytest.raises(PipelineConfigInvalid, match="drops \\['window_start', 'window_end'\\]"):
        MicroBatchRunner(spark, p, data_root).run()
    assert not (data_root / "out").exists()


def test_the_step_is_in_the_fingerprint_only_when_given() -> None:
    plain = windowed(WINDOW, "update")
    with_step = plain.model_copy(update={"post_aggregation": SqlStep(sql=f" {MODEST} ")})
    assert "post_aggregation" not in plain.definition()
    assert with_step.definition()["post_aggregation"] == {"sql": MODEST}
    assert plain.fingerprint() != with_step.fingerprint()


def test_a_step_without_an_aggregation_is_refused() -> None:
    with pytest.raises(ValueError, match="`post_aggregation` runs on the windows"):
        pipeline(post_aggregation=SqlStep(sql=MODEST))
