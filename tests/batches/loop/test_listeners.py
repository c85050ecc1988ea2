"""Listeners: told of every batch in order, never able to fail one, named in YAML or Python."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.loop.events import BatchFailure, BatchResult, RunTerminated
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import FileSource, Pipeline
from tests.helpers import FakeClock, HeardListener, drop_file, per_unit, pipeline, sink_ids


def one_file_per_batch(**overrides: object) -> Pipeline:
    source = FileSource(
        path="in", format="json", schema_ddl="id LONG, amount LONG", max_files_per_batch=1
    )
    return pipeline(source=source, **overrides)


def test_a_listener_hears_each_batch_start_then_its_progress_then_the_runs_end(
    spark: SparkSession, data_root: Path, clock: FakeClock
) -> None:
    drop_file(data_root, 0)
    drop_file(data_root, 1, rows=2)
    heard = HeardListener()
    with MicroBatchRunner(spark, one_file_per_batch(), data_root, clock, listeners=[heard]) as r:
        results = r.run(max_batches=None)

    assert heard.heard == [
        ("started", 0),
        ("progress", 0),
        ("started", 1),
        ("progress", 1),
        ("terminated", None),
    ]
    progress = [e for e in heard.events if isinstance(e, BatchResult)]
    assert progress == results
    rows = r.checkpoint.progress.get_range()
    assert (
        [(p.batch_id, p.rows_in, p.rows_out) for p in progress]
        == [(row.batch_id, row.rows_in, row.rows_out) for row in rows]
        == [(0, 3, 3), (1, 2, 2)]
    )
    assert [p.durations_ms for p in progress] == [row.durations_ms for row in rows]
    # The progress object is JSON, as Structured Streaming's is.
    assert json.loads(progress[1].json()) == progress[1].to_json()
    assert progress[1].to_json()["pipeline"] == "t" and progress[1].backlog is None
    terminated = heard.events[-1]
    assert isinstance(terminated, RunTerminated) and terminated.error is None


def test_a_listener_that_raises_fails_no_batch_and_the_others_still_hear_it(
    spark: SparkSession, data_root: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    drop_file(data_root, 0)
    failing, heard = HeardListener(raises=True), HeardListener()
    runner = MicroBatchRunner(spark, pipeline(), data_root, clock, listeners=[failing, heard])
    with caplog.at_level(logging.WARNING, logger="lowmark.batches.loop.listeners"):
        result = runner.run_batch()

    assert result is not None and result.batch_id == 0
    assert runner.checkpoint.commits.latest_batch_id() == 0
    assert sink_ids(spark, data_root) == [0, 1, 2]
    assert failing.heard == heard.heard == [("started", 0), ("progress", 0)]
    warnings = [r.getMessage() for r in caplog.records]
    assert any("HeardListener raised in on_batch_progress" in w for w in warnings), warnings


def test_a_failed_batch_is_heard_as_failed_with_its_kind_after_its_start(
    spark: SparkSession, data_root: Path, clock: FakeClock
) -> None:
    drop_file(data_root, 0)  # amount 0: per_unit divides by it
    heard = HeardListener()
    runner = MicroBatchRunner(spark, pipeline(transform=per_unit), data_root, clock)
    runner.add_listener(heard)
    with pytest.raises(Exception, match="DIVIDE_BY_ZERO"), runner:
        runner.run_batch()

    assert heard.heard == [("started", 0), ("failed", 0), ("terminated", None)]
    failed, terminated = heard.events[1], heard.events[2]
    assert isinstance(failed, BatchFailure) and failed.kind == "data"
    assert "DIVIDE_BY_ZERO" in failed.error
    assert isinstance(terminated, RunTerminated) and "DIVIDE_BY_ZERO" in (terminated.error or "")


def test_listeners_named_in_yaml_are_made_for_the_runner_and_left_out_of_the_fingerprint(
    spark: SparkSession, data_root: Path, clock: FakeClock
) -> None:
    plain = pipeline().model_dump(exclude={"listeners"})
    named = Pipeline.model_validate(plain | {"listeners": ["tests.helpers:HeardListener"]})
    assert named.fingerprint() == pipeline().fingerprint()

    drop_file(data_root, 0)
    runner = MicroBatchRunner(spark, named, data_root, clock)
    runner.run_batch()
    [made] = runner.listeners
    assert isinstance(made, HeardListener)
    assert made.heard == [("started", 0), ("progress", 0)]


def test_a_listener_path_to_no_listener_is_one_line_naming_it(
    spark: SparkSession, data_root: Path
) -> None:
    wrong = pipeline(listeners=("tests.helpers:FakeClock",))
    with pytest.raises(PipelineConfigInvalid, match=r"tests\.helpers:FakeClock made a FakeClock"):
        MicroBatchRunner(spark, wrong, data_root)
