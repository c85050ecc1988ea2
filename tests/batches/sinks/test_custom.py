"""A user's sink (``kind: custom``) through lowmark: each batch's output lands exactly once,
even when the run is killed around its write; what needs a Delta sink refuses in one line."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from pydantic import ValidationError
from pyspark.sql import SparkSession

from lowmark.batches.admin.reset import reset
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import CustomSink, EventTimePartitions, FileSource
from lowmark.batches.registry import get_pipeline
from lowmark.batches.windows import Session
from tests.helpers import (
    counted_per_window,
    drop_batches,
    drop_file,
    event,
    exported,
    json_lines_sink,
    lowmark_killed_at,
    pipeline,
    windowed,
)

PIPELINES = """
pipelines:
  - name: exported
    source: {path: in, format: json, schema_ddl: "id LONG, amount LONG", max_files_per_batch: 1}
    sink:
      kind: custom
      factory: examples.json_lines_sink:build
      options: {folder: exported}
"""


@pytest.mark.integration
def test_a_custom_sink_killed_after_its_write_ends_with_every_record_once(
    spark: SparkSession, data_root: Path
) -> None:
    pipelines = data_root / "pipelines.yaml"
    pipelines.write_text(PIPELINES)
    for i in range(3):
        drop_file(data_root, i)
    killed = lowmark_killed_at(
        KillPoint("after_sink", 1), data_root, pipelines, "run", "exported", "--until-caught-up"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert sorted(exported(data_root / "exported")) == [0, 1]  # batch 1 wrote, never committed

    p = get_pipeline("exported", str(pipelines))
    results = MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    assert [(r.batch_id, r.replay) for r in results] == [(1, True), (2, False)]
    landed = exported(data_root / "exported")
    assert {b: sorted(r["id"] for r in rows) for b, rows in landed.items()} == {
        0: [0, 1, 2],
        1: [100, 101, 102],
        2: [200, 201, 202],
    }


@pytest.mark.parametrize("step", ["after_state", "after_sink", "before_commit"])
def test_a_windowed_pipeline_crashed_around_its_custom_sink_writes_each_window_change_once(
    spark: SparkSession, tmp_path: Path, step: str
) -> None:
    one_file_a_batch = FileSource(
        path="in", format="json", schema_ddl="id LONG, amount LONG", max_files_per_batch=1
    )
    p = counted_per_window(sink=json_lines_sink(), source=one_file_a_batch)
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    for root in (clean, crashed):
        for i in range(3):
            drop_file(root, i)
    MicroBatchRunner(spark, p, clean).run(max_batches=None)
    with crash_at(KillPoint(step, 1)), pytest.raises(InjectedCrash):
        MicroBatchRunner(spark, p, crashed).run(max_batches=None)
    MicroBatchRunner(spark, p, crashed).run(max_batches=None)

    expected = exported(clean / "exported")
    assert sorted(expected) == [0, 1, 2] and all(len(rows) == 3 for rows in expected.values())
    assert exported(crashed / "exported") == expected


def test_a_custom_sink_gets_the_sessions_a_merge_retracts(
    spark: SparkSession, data_root: Path
) -> None:
    p = windowed(Session(gap="10 seconds"), "update", max_out_of_orderness="1 minute")
    p = p.model_copy(update={"sink": json_lines_sink()})
    # Batch 0: two sessions of user a; batch 1: an event between them merges them.
    drop_batches(data_root, [[event("a", 0, 1), event("a", 15, 2)], [event("a", 7, 4)]])
    MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    landed = exported(data_root / "exported")
    retracted = [r for r in landed[1] if r.get("_retract")]
    merged = [r for r in landed[1] if not r.get("_retract")]
    assert len(retracted) == 2 and {r["user"] for r in retracted} == {"a"}
    assert [(r["count"], r["sum_amount"]) for r in merged] == [(3, 7)]


def test_a_factory_that_returns_no_sink_is_refused_in_one_line_before_the_batch_is_written(
    spark: SparkSession, data_root: Path
) -> None:
    p = pipeline(sink=CustomSink.model_validate({"factory": "tests.helpers:not_a_sink"}))
    drop_file(data_root, 0)
    runner = MicroBatchRunner(spark, p, data_root)
    with pytest.raises(
        PipelineConfigInvalid, match=r"returned dict, not a lowmark\.batches\.sinks"
    ):
        runner.run()
    # The definition is at fault, not the batch: no offsets written, no failed attempt.
    assert runner.checkpoint.offsets.get(0) is None
    assert runner.checkpoint.failures.of(0) == []


def test_a_reset_of_a_pipeline_with_a_custom_sink_is_refused_naming_the_way_on(
    spark: SparkSession, data_root: Path
) -> None:
    p = pipeline(sink=json_lines_sink())
    checkpoint = p.checkpoint_location(data_root)
    with pytest.raises(PipelineConfigInvalid) as refused:
        reset(spark, p, data_root, "truncate")
    assert str(refused.value) == (
        "pipeline t writes a custom sink (examples.json_lines_sink.build): `lowmark reset` "
        "reads the sink's table, so it needs a `kind: delta` sink; to start over, empty your "
        f"sink and delete the checkpoint {checkpoint}"
    )


def test_backfill_partitions_need_a_delta_sink() -> None:
    with pytest.raises(ValidationError, match="`backfill` replaces a slice of the sink's Delta"):
        counted_per_window(sink=json_lines_sink(), backfill=EventTimePartitions())
