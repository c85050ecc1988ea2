"""Windowed aggregation against a plain Spark batch aggregation of the same data."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.windows import (
    Aggregate,
    Session,
    Sliding,
    Tumbling,
    UserAggregate,
    WindowedAggregation,
)
from tests.helpers import (
    SCHEMA,
    T0,
    delta_frame,
    drop_batches,
    event,
    reference,
    sink,
    windowed,
)

IN_ORDER = [
    [event("a", 1, 5), event("b", 2, 7), event("a", 8, 1)],
    [event("a", 12, 3), event("b", 14, 2), event("b", 19, 9)],
    [event("a", 21, 4), event("c", 25, 6)],
    [event("b", 33, 8), event("a", 41, 2)],
]


WINDOWS = pytest.mark.parametrize(
    "window",
    [
        Tumbling(size="10 seconds"),
        Sliding(size="10 seconds", slide="5 seconds"),
        Session(gap="10 seconds"),
    ],
    ids=["tumbling", "sliding", "session"],
)


@WINDOWS
def test_append_mode_emits_every_closed_window_exactly_as_a_batch_aggregation(
    spark: SparkSession, data_root: Path, window: Tumbling | Sliding | Session
) -> None:
    drop_batches(data_root, IN_ORDER)
    runner = MicroBatchRunner(spark, windowed(window), data_root)
    results = runner.run(max_batches=None)
    final_watermark = results[-1].watermark_ms
    assert final_watermark == int((T0 + timedelta(seconds=41)).timestamp() * 1000)
    closed = reference(spark, data_root, window).where(
        F.unix_millis("window_end") <= F.lit(final_watermark)
    )
    assertDataFrameEqual(sink(spark, data_root), closed)


@WINDOWS
def test_update_mode_ends_with_every_window_exactly_as_a_batch_aggregation(
    spark: SparkSession, data_root: Path, window: Tumbling | Sliding | Session
) -> None:
    drop_batches(data_root, IN_ORDER)
    MicroBatchRunner(spark, windowed(window, mode="update"), data_root).run(max_batches=None)
    assertDataFrameEqual(sink(spark, data_root), reference(spark, data_root, window))


def test_late_records_within_lateness_update_their_window_and_beyond_go_to_the_late_table(
    spark: SparkSession, data_root: Path
) -> None:
    batches = [
        [event("a", 1, 1), event("a", 25, 1)],  # watermark after: 25 s
        [event("a", 15, 10), event("a", 3, 100)],  # [10,20) open by lateness; [0,10) is not
        [event("a", 50, 1)],
    ]
    drop_batches(data_root, batches)
    runner = MicroBatchRunner(
        spark, windowed(Tumbling(size="10 seconds"), allowed_lateness="10 seconds"), data_root
    )
    results = runner.run(max_batches=None)
    # Batch 3 reads nothing: the watermark (50 s) alone closes [10,20) and [20,30).
    assert [(r.rows_in, r.rows_late) for r in results] == [(2, 0), (2, 1), (1, 0), (0, 0)]
    late = delta_frame(spark, runner.checkpoint.table("late")).collect()
    assert len(late) == 1 and '"amount":100' in late[0].record and late[0].batch_id == 1
    assert late[0].watermark_ms == int((T0 + timedelta(seconds=25)).timestamp() * 1000)
    out = {r.window_start.second: r["sum_amount"] for r in sink(spark, data_root).collect()}
    assert out == {0: 1, 10: 10, 20: 1}


@pytest.mark.parametrize("window", [Tumbling(size="10 seconds"), Session(gap="5 seconds")])
def test_a_record_without_event_time_goes_to_the_late_table_never_into_a_window_or_nowhere(
    spark: SparkSession, data_root: Path, window: Tumbling | Session
) -> None:
    untimed = [{"user": "b", "amount": 7}, {"user": "c", "amount": 8}]
    drop_batches(data_root, [[event("a", 1, 1), untimed[0]], [event("a", 30, 1), untimed[1]]])
    runner = MicroBatchRunner(spark, windowed(window), data_root)
    results = runner.run(max_batches=None)
    # Before any watermark (batch 0) and after one (batch 1) alike.
    assert [(r.rows_in, r.rows_late) for r in results[:2]] == [(2, 1), (2, 1)]
    late = delta_frame(spark, runner.checkpoint.table("late")).collect()
    assert sorted((r.batch_id, r.event_time, r.reason) for r in late) == [
        (0, None, "no event time: the event-time column is null"),
        (1, None, "no event time: the event-time column is null"),
    ]
    assert sorted('"amount":7' in r.record for r in late) == [False, True]
    state = delta_frame(spark, runner.checkpoint.table("state_windows"))
    assert state.where("window_start IS NULL OR user IN ('b', 'c')").count() == 0
    assert sink(spark, data_root).where("user IN ('b', 'c')").count() == 0


def test_an_event_that_bridges_two_stored_sessions_merges_them_into_one(
    spark: SparkSession, data_root: Path
) -> None:
    drop_batches(
        data_root,
        [[event("a", 1, 1), event("a", 15, 2)], [event("a", 9, 4)], [event("a", 60, 8)]],
    )
    runner = MicroBatchRunner(spark, windowed(Session(gap="10 seconds")), data_root)
    runner.run(max_batches=None)
    rows = [
        (r.window_start.second, r.window_end.second, r["count"], r["sum_amount"])
        for r in sink(spark, data_root).collect()
    ]
    assert rows == [(1, 25, 3, 7)]
    state = delta_frame(spark, runner.checkpoint.table("state_windows"))
    assert [(r.window_start.second, r.window_end.second) for r in state.collect()] == [(0, 10)]


def test_a_new_session_of_a_key_whose_old_session_closes_in_the_same_batch_keeps_both(
    spark: SparkSession, data_root: Path
) -> None:
    # Batch 1 runs with watermark 35 s: b's session [2,7) is final just as b@38
    # opens a new one; the old session must be purged, not merged back in.
    drop_batches(data_root, [[event("b", 2, 1), event("c", 40, 1)], [event("b", 38, 2)]])
    window = Session(gap="5 seconds")
    pipeline = windowed(
        window, mode="update", max_out_of_orderness="5 seconds", allowed_lateness="10 seconds"
    )
    runner = MicroBatchRunner(spark, pipeline, data_root)
    runner.run(max_batches=None)
    assertDataFrameEqual(sink(spark, data_root), reference(spark, data_root, window))
    state = delta_frame(spark, runner.checkpoint.table("state_windows"))
    assert sorted((r.user, r.window_start.second) for r in state.collect()) == [
        ("b", 38),
        ("c", 40),
    ]


def test_approximate_distinct_counts_and_user_aggregates_merge_across_batches(
    spark: SparkSession, data_root: Path
) -> None:
    drop_batches(data_root, IN_ORDER)
    users = UserAggregate(
        name="users",
        column="user",
        partial=F.collect_set,
        merge=lambda c: F.array_distinct(F.flatten(F.collect_list(c))),
        finish=F.array_sort,
    )
    pipeline = windowed(Tumbling(size="20 seconds"), mode="update").model_copy(
        update={
            "aggregation": WindowedAggregation(
                keys=(),
                window=Tumbling(size="20 seconds"),
                aggregates=(Aggregate(fn="approx_count_distinct", column="user"), users),
                output_mode="update",
            )
        }
    )
    MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
    expected = (
        spark.read.schema(SCHEMA)
        .json(str(data_root / "in"))
        .groupBy(F.window("ts", "20 seconds").alias("w"))
        .agg(
            F.count_distinct("user").alias("approx_count_distinct_user"),
            F.array_sort(F.collect_set("user")).alias("users"),
        )
        .select(
            F.col("w.start").alias("window_start"),
            F.col("w.end").alias("window_end"),
            "approx_count_distinct_user",
            "users",
        )
    )
    assertDataFrameEqual(sink(spark, data_root), expected)
