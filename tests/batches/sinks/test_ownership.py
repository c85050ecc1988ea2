"""Whose writes a sink holds, asked of every sink through one method (``check_ours``): a new
checkpoint is refused by a sink that holds another checkpoint's writes, before it writes
anything, and goes on into one whose writes it continues (``lowmark reset --after-sink``)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from examples.json_lines_sink import JsonLinesSink
from lowmark.batches.admin.reset import reset
from lowmark.batches.errors import SinkHeldElsewhere
from lowmark.batches.loop import faults
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import CustomSink, DeltaSink, Pipeline, PostgresSink
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.session import SparkLike
from tests.helpers import drop_file, exported, pipeline, sink_ids
from tests.postgres_server import PostgresServer

ONE_FILE = pipeline().source.model_copy(update={"max_files_per_batch": 1})


class CheckedExport(JsonLinesSink):
    """The example sink, checking its own folder: another checkpoint's files are not ours."""

    def check_ours(self, pipeline: Pipeline, checkpoint: Checkpoint) -> None:
        ours = {checkpoint.pipeline_id, checkpoint.adopted_from}
        writers = {path.name.split("-sink-")[0] for path in self.folder.glob("*.jsonl")}
        if others := sorted(writers - ours):
            raise SinkHeldElsewhere(
                f"sink {self.folder} holds the files of checkpoint {others[0]}: give "
                f"{pipeline.name} a folder of its own"
            )


def checked_export(
    spark: SparkLike, options: dict[str, Any], data_root: Path, txn_app_id: str
) -> CheckedExport:
    return CheckedExport(options, data_root, txn_app_id)


def _ids(every: int) -> list[int]:
    return sorted(f * 100 + i for f in range(every) for i in range(3))


def _served(name: str = "t", sink: str = "out") -> Pipeline:
    """Files into a Delta table and, to serve, the Postgres table ``served``."""
    served = {"serving": PostgresSink(table="served")}
    return pipeline(name=name, source=ONE_FILE, sink=DeltaSink(path=sink), extra_sinks=served)


def _served_ids(postgres: PostgresServer, database: str) -> list[int]:
    return sorted(i for (i,) in postgres.rows(database, "SELECT id FROM served"))


def test_a_custom_sink_refuses_a_new_checkpoint_by_its_own_check_before_anything_is_written(
    spark: SparkSession, data_root: Path
) -> None:
    sink = CustomSink(factory=f"{__name__}:checked_export", options={"folder": "exported"})
    p = pipeline(source=ONE_FILE, sink=sink)
    for i in range(2):
        drop_file(data_root, i)
    MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    shutil.move(data_root / "_lowmark", data_root / "elsewhere")  # a new checkpoint

    runner = MicroBatchRunner(spark, p, data_root)
    with pytest.raises(SinkHeldElsewhere, match="holds the files of checkpoint"):
        runner.run(max_batches=None)
    assert runner.checkpoint.offsets.latest_batch_id() is None  # refused before batch 0
    assert sorted(exported(data_root / "exported")) == [0, 1]  # the old checkpoint's only


def test_reset_after_sink_goes_on_into_a_postgres_extra_sink_exactly_once(
    spark: SparkSession, data_root: Path, postgres: PostgresServer, pg_database: str
) -> None:
    for i in range(4):
        drop_file(data_root, i)
    p = _served()
    # Batch 2 dies after both sinks wrote it: each holds files 0-2, the commit log 0-1.
    with pytest.raises(faults.InjectedCrash), faults.crash_at(faults.KillPoint("after_sink", 2)):
        MicroBatchRunner(spark, p, data_root).run(max_batches=None)

    reset(spark, p, data_root, "after")
    drop_file(data_root, 4)
    results = MicroBatchRunner(spark, p, data_root).run(max_batches=None)

    assert [r.end for r in results] == [{"0": 4}, {"0": 5}]
    # As a fault-free run leaves them: every record once in each sink.
    assert sink_ids(spark, data_root) == _ids(5)
    assert _served_ids(postgres, pg_database) == _ids(5)


def test_a_postgres_table_another_pipeline_wrote_is_refused_with_advice_that_keeps_its_rows(
    spark: SparkSession, data_root: Path, postgres: PostgresServer, pg_database: str
) -> None:
    drop_file(data_root, 0)
    MicroBatchRunner(spark, _served(), data_root).run(max_batches=None)
    other = _served("u", "out_u")  # its own Delta table, but t's serving table

    runner = MicroBatchRunner(spark, other, data_root)
    with pytest.raises(SinkHeldElsewhere) as refused:
        runner.run(max_batches=None)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("sink postgres public.served is pipeline t's (checkpoint ")
    assert message.endswith("give u a table of its own")
    assert runner.checkpoint.offsets.latest_batch_id() is None
    assert _served_ids(postgres, pg_database) == _ids(1)
