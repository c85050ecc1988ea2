"""Starting over never writes the sink's data twice.

A new checkpoint reads its source from the start, so on a sink that holds an
earlier checkpoint's writes it is refused; ``lowmark reset`` then either
empties the sink and starts from the beginning, or starts right after the
data the sink holds. Either way every input record is in the sink exactly
once, as a fault-free run from scratch would leave it.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.reset import reset
from lowmark.batches.errors import ResetFailed, SinkBehind, SinkHeldElsewhere
from lowmark.batches.evolution import DefinitionChanged
from lowmark.batches.loop import faults
from lowmark.batches.loop.follow import follow
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, KafkaSink, Pipeline, PostgresSink
from lowmark.batches.windows import Tumbling
from lowmark.state.errors import CheckpointReplaced, LowmarkError
from lowmark.state.ownership import last_writer
from tests.helpers import (
    delta_frame,
    drop_batches,
    drop_file,
    event,
    lowmark,
    pipeline,
    reference,
    sink,
    sink_ids,
    windowed,
)
from tests.postgres_server import PostgresServer

ONE_FILE = pipeline().source.model_copy(update={"max_files_per_batch": 1})
APPEND_ONLY = {"delta.appendOnly": "true"}


def _stateless() -> Pipeline:
    return pipeline(source=ONE_FILE)


def _all_ids(files: int, rows: int = 3) -> list[int]:
    return sorted(f * 100 + i for f in range(files) for i in range(rows))


def test_a_new_checkpoint_refuses_a_sink_that_holds_another_checkpoints_writes(
    spark: SparkSession, data_root: Path
) -> None:
    for i in range(3):
        drop_file(data_root, i)
    MicroBatchRunner(spark, _stateless(), data_root).run(max_batches=None)
    # The old way out of a broken checkpoint: move it away and run again.
    shutil.move(data_root / "_lowmark", data_root / "elsewhere")
    with pytest.raises(SinkHeldElsewhere, match="lowmark reset t --after-sink") as error:
        MicroBatchRunner(spark, _stateless(), data_root).run(max_batches=None)
    assert "\n" not in str(error.value)
    assert sink_ids(spark, data_root) == _all_ids(3)  # nothing written twice


def test_a_pipeline_on_another_pipelines_sink_is_refused_with_advice_that_keeps_its_rows(
    spark: SparkSession, data_root: Path
) -> None:
    for i in range(2):
        drop_file(data_root, i)
    MicroBatchRunner(spark, _stateless(), data_root).run(max_batches=None)
    second = pipeline(name="u", source=ONE_FILE)  # the same sink as t
    with pytest.raises(SinkHeldElsewhere) as error:
        MicroBatchRunner(spark, second, data_root).run(max_batches=None)
    message = str(error.value)
    assert "pipeline t's" in message and "give u a sink path of its own" in message
    assert "--truncate-sink" not in message and "--after-sink" not in message
    assert "\n" not in message
    # Nor does a reset of the second pipeline empty the first one's sink.
    with pytest.raises(SinkHeldElsewhere, match="pipeline t's"):
        reset(spark, second, data_root, "truncate")
    assert sink_ids(spark, data_root) == _all_ids(2)


def test_truncate_sink_starts_over_and_the_sink_ends_as_from_scratch(
    spark: SparkSession, data_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(3):
        drop_file(data_root, i)
    MicroBatchRunner(spark, _stateless(), data_root).run(max_batches=2)
    drop_file(data_root, 3)
    code, out, _ = lowmark(
        capsys, data_root, "--pipelines", "tests.batches.admin.test_reset", "reset", "t",
        "--truncate-sink",
    )  # fmt: skip
    assert code == 0 and "sink emptied" in out and "old checkpoint moved to" in out
    assert sink_ids(spark, data_root) == []
    assert len(list(data_root.glob("_lowmark/t.reset-*"))) == 1
    MicroBatchRunner(spark, _stateless(), data_root).run(max_batches=None)
    assert sink_ids(spark, data_root) == _all_ids(4)


def test_a_truncate_whose_sink_refuses_the_delete_leaves_the_checkpoint_and_a_retry_moves_it_once(
    spark: SparkSession, data_root: Path
) -> None:
    # An append-only sink: appends land, Delta refuses the reset's DELETE.
    p = pipeline(source=ONE_FILE, sink=DeltaSink(path="out", properties=APPEND_ONLY))
    for i in range(3):
        drop_file(data_root, i)
    MicroBatchRunner(spark, p, data_root).run(max_batches=2)
    out = str(data_root / "out")
    old = last_writer(out)

    with pytest.raises(
        ResetFailed,
        match=r"^reset of t failed, its checkpoint \S+ is back as it was: .*APPEND_ONLY",
    ):
        reset(spark, p, data_root, "truncate")
    assert list(data_root.glob("_lowmark/t.*")) == []
    MicroBatchRunner(spark, p, data_root).run(max_batches=None)  # on the old checkpoint
    writer = last_writer(out)
    assert old is not None and writer is not None and writer.pipeline_id == old.pipeline_id
    assert sink_ids(spark, data_root) == _all_ids(3)

    spark.sql(f"ALTER TABLE delta.`{out}` SET TBLPROPERTIES ('delta.appendOnly' = 'false')")
    again = reset(spark, p, data_root, "truncate")
    assert len(list(data_root.glob("_lowmark/t.reset-*"))) == 1
    assert sink_ids(spark, data_root) == []
    MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    writer = last_writer(out)
    assert writer is not None and writer.pipeline_id == again.pipeline_id
    assert sink_ids(spark, data_root) == _all_ids(3)


def test_truncate_sink_empties_an_extra_delta_sink_and_says_a_kafka_topic_is_not_emptied(
    spark: SparkSession, data_root: Path
) -> None:
    p = pipeline(source=ONE_FILE, extra_sinks={"copy": DeltaSink(path="copy")})
    for i in range(2):
        drop_file(data_root, i)
    MicroBatchRunner(spark, p, data_root).run(max_batches=None)

    done = reset(spark, p, data_root, "truncate")
    assert sink_ids(spark, data_root, "copy") == [] and done.not_emptied == ()
    MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    assert sink_ids(spark, data_root, "copy") == sink_ids(spark, data_root) == _all_ids(2)

    topic = KafkaSink(topic="events", bootstrap_servers="localhost:1")
    kafka = pipeline(name="k", sink=DeltaSink(path="k_out"), extra_sinks={"events": topic})
    (line,) = reset(spark, kafka, data_root, "truncate").not_emptied
    assert line.startswith("sink events (Kafka topic events) is not emptied: ")


def test_truncate_sink_of_a_windowed_pipeline_recomputes_every_window(
    spark: SparkSession, data_root: Path
) -> None:
    window = Tumbling(size="10 seconds")
    drop_batches(
        data_root, [[event("a", 10 * i + 1, i), event("b", 10 * i + 4, i)] for i in range(4)]
    )
    p = windowed(window, "update")
    MicroBatchRunner(spark, p, data_root).run(max_batches=3)
    reset(spark, p, data_root, "truncate")
    MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    assertDataFrameEqual(sink(spark, data_root), reference(spark, data_root, window))


@pytest.mark.parametrize("mode", ["append", "update"])
def test_after_sink_of_a_windowed_pipeline_carries_its_open_windows_and_watermark(
    spark: SparkSession, data_root: Path, mode: str
) -> None:
    window = Tumbling(size="10 seconds")
    # Windows open across the reset; a@2 in batch 3 is late by the watermark batch 2 left.
    batches = [[event("a", 10 * i + 1, i), event("b", 10 * i + 7, i)] for i in range(5)]
    batches[3].append(event("a", 2, 99))
    fault_free = data_root.parent / "fault_free"
    for root in (data_root, fault_free):
        drop_batches(root, batches)
    p = windowed(window, mode, max_out_of_orderness="5 seconds")
    MicroBatchRunner(spark, p, fault_free).run(max_batches=None)
    MicroBatchRunner(spark, p, data_root).run(max_batches=3)

    done = reset(spark, p, data_root, "after")

    assert done.continues is not None and done.continues.endswith("batch 2")
    MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    assertDataFrameEqual(sink(spark, data_root), sink(spark, fault_free))
    late = delta_frame(spark, data_root / "_lowmark" / "w" / "late").collect()
    assert ['"amount":99' in row.record for row in late] == [True]


def test_after_sink_refuses_to_carry_window_state_to_windows_of_another_size(
    spark: SparkSession, data_root: Path
) -> None:
    drop_batches(data_root, [[event("a", 10 * i + 1, i)] for i in range(3)])
    p = windowed(Tumbling(size="10 seconds"), "append")
    MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    checkpoint = data_root / "_lowmark" / "w"
    before = sorted(f.name for f in checkpoint.parent.iterdir())
    wider = windowed(Tumbling(size="20 seconds"), "append")

    with pytest.raises(DefinitionChanged) as refused:
        reset(spark, wider, data_root, "after")

    message = str(refused.value)
    assert "aggregation.window.size: 10000 -> 20000 (rebuild:" in message
    assert "--truncate-sink" in message and "\n" not in message
    assert sorted(f.name for f in checkpoint.parent.iterdir()) == before  # nothing moved


def test_truncate_sink_of_a_windowed_sink_without_rows_yet_names_the_new_checkpoint(
    spark: SparkSession, data_root: Path
) -> None:
    drop_batches(data_root, [[event("a", 10 * i + 1, i)] for i in range(3)])
    p = windowed(Tumbling(size="10 seconds"), "append")
    MicroBatchRunner(spark, p, data_root).run(max_batches=1)  # no window final yet
    assert sink(spark, data_root).count() == 0

    done = reset(spark, p, data_root, "truncate")

    # Nothing to delete, so an empty commit: else the old checkpoint stays the sink's
    # last writer and the new one refuses the sink.
    writer = last_writer(str(data_root / "out"))
    assert writer is not None and (writer.pipeline_id, writer.batch_id) == (done.pipeline_id, -1)
    MicroBatchRunner(spark, p, data_root).run(max_batches=None)


def test_after_sink_goes_on_after_the_last_batch_the_sink_holds(
    spark: SparkSession, data_root: Path
) -> None:
    for i in range(4):
        drop_file(data_root, i)
    p = _stateless()
    # Batch 2 dies right after its sink write: the sink holds files 0-2, the commit log 0-1.
    with pytest.raises(faults.InjectedCrash), faults.crash_at(faults.KillPoint("after_sink", 2)):
        MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    # And the checkpoint breaks: its commit log is gone.
    shutil.rmtree(data_root / "_lowmark" / "t" / "commits")
    done = reset(spark, p, data_root, "after")
    assert done.start_offsets == {"0": 3} and done.files == 3
    drop_file(data_root, 4)
    results = MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    assert [r.end for r in results] == [{"0": 4}, {"0": 5}]
    assert sink_ids(spark, data_root) == _all_ids(5)  # each record exactly once


def test_after_sink_refuses_while_a_postgres_extra_sink_lacks_the_last_batch_of_the_delta_sink(
    spark: SparkSession, data_root: Path, postgres: PostgresServer, pg_database: str
) -> None:
    for i in range(3):
        drop_file(data_root, i)
    p = pipeline(source=ONE_FILE, extra_sinks={"serving": PostgresSink(table="served")})
    MicroBatchRunner(spark, p, data_root).run(max_batches=1)
    # The serving table takes no id from 100 on: batch 1 lands in `out`, then Postgres
    # refuses it.
    with postgres.connect(pg_database) as conn:
        conn.execute("ALTER TABLE served ADD CONSTRAINT small_ids CHECK (id < 100)")
    with pytest.raises(LowmarkError, match="refused batch 1"):
        MicroBatchRunner(spark, p, data_root).run(max_batches=None)

    with pytest.raises(SinkBehind) as refused:
        reset(spark, p, data_root, "after")
    message = str(refused.value)
    assert "\n" not in message
    assert "(sink 1, serving 0;" in message and "never write it to serving;" in message
    assert "`lowmark run t --retry`" in message

    # Nothing moved: the way on the message gives ends with every record once in each sink.
    with postgres.connect(pg_database) as conn:
        conn.execute("ALTER TABLE served DROP CONSTRAINT small_ids")
    MicroBatchRunner(spark, p, data_root).run(max_batches=None, retry=True)
    done = reset(spark, p, data_root, "after")
    assert done.start_offsets == {"0": 3}
    drop_file(data_root, 3)
    MicroBatchRunner(spark, p, data_root).run(max_batches=None)
    assert sink_ids(spark, data_root) == _all_ids(4)
    assert sorted(i for (i,) in postgres.rows(pg_database, "SELECT id FROM served")) == _all_ids(4)


@pytest.mark.integration
def test_a_runner_following_the_source_while_it_is_reset_stops_and_nothing_lands_twice(
    spark: SparkSession, data_root: Path
) -> None:
    p = _stateless()
    for i in range(2):
        drop_file(data_root, i)
    runner = MicroBatchRunner(spark, p, data_root)
    committed: list[int] = []
    stop = threading.Event()
    stopped_by: list[BaseException] = []

    def follow_until_stopped() -> None:
        try:
            follow(
                runner,
                poll_interval_s=0.05,
                on_batch=lambda r: committed.append(r.batch_id),
                should_stop=stop.is_set,
                handle_signals=False,
            )
        except Exception as exc:
            stopped_by.append(exc)

    follower = threading.Thread(target=follow_until_stopped)
    follower.start()
    try:
        _wait_for(lambda: committed == [0, 1], follower)
        # While it follows the source: a reset, then a new file for the old runner to take.
        reset(spark, p, data_root, "truncate")
        drop_file(data_root, 2)
        follower.join(timeout=60)
    finally:
        stop.set()
        follower.join()

    assert committed == [0, 1]  # it took nothing after the reset
    [error] = stopped_by
    assert isinstance(error, CheckpointReplaced) and "\n" not in str(error)
    assert "lowmark reset" in str(error)
    fresh = MicroBatchRunner(spark, p, data_root)
    fresh.run(max_batches=None)
    assert sink_ids(spark, data_root) == _all_ids(3)  # each record exactly once
    assert [e.batch_id for e in fresh.checkpoint.offsets.get_range()] == [0, 1, 2]


def test_a_reset_in_the_middle_of_a_batch_stops_its_runner_before_the_batch_writes(
    spark: SparkSession, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _stateless()
    for i in range(3):
        drop_file(data_root, i)
    reached = faults.reached

    def reset_after_the_read(step: str, batch_id: int) -> None:
        if (step, batch_id) == ("after_read", 2):
            monkeypatch.setattr(faults, "reached", reached)
            reset(spark, p, data_root, "truncate")

    monkeypatch.setattr(faults, "reached", reset_after_the_read)
    old = MicroBatchRunner(spark, p, data_root)
    with pytest.raises(CheckpointReplaced, match="`lowmark reset` ran meanwhile"):
        old.run(max_batches=None)

    fresh = MicroBatchRunner(spark, p, data_root)
    fresh.run(max_batches=None)
    assert sink_ids(spark, data_root) == _all_ids(3)
    assert [e.batch_id for e in fresh.checkpoint.offsets.get_range()] == [0, 1, 2]
    assert [e.batch_id for e in fresh.checkpoint.commits.get_range()] == [0, 1, 2]


def _wait_for(done: Callable[[], bool], thread: threading.Thread) -> None:
    deadline = time.monotonic() + 120
    while not done():
        assert thread.is_alive() and time.monotonic() < deadline, "the follower never got there"
        time.sleep(0.02)


stateless = _stateless()
"""What ``lowmark --pipelines tests.batches.admin.test_reset`` finds."""
