"""Delta conflicts: someone else's are retried, our own runner's are ConcurrentRunner, and
table maintenance (OPTIMIZE, VACUUM) around a crash changes no result."""

from __future__ import annotations

import logging
import shutil
import threading
from collections import Counter
from collections.abc import Callable

import pytest
from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
)
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lowmark.batches.loop import faults
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.state.conflicts import ATTEMPTS, retry_conflicts
from lowmark.state.errors import ConcurrentRunner, WriteConflict
from tests.faults.conftest import KILL_BATCH, References
from tests.faults.harness import Snapshot, differences, run_to_completion, snapshot
from tests.faults.scenarios import SINK

LOST = (ConcurrentAppendException, ConcurrentDeleteReadException, ConcurrentWriteException)
"""How another job's Delta write loses to ours."""
DATA_TABLES = ("sink", "state_windows", "late", "bad_records", "offsets", "watermarks", "files")
"""What maintenance must leave alone; it adds Delta versions, so commits' table_versions
and the tables' histories legitimately move."""


def data(tables: Snapshot) -> Snapshot:
    return {name: rows for name, rows in tables.items() if name in DATA_TABLES}


def failing(times: int, error: Exception) -> tuple[list[int], Callable[[], None]]:
    """A write that raises ``error`` ``times`` times, then lands; and its calls."""
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        if len(calls) <= times:
            raise error

    return calls, write


def test_a_write_that_lost_a_conflict_to_another_writer_is_retried_until_it_lands() -> None:
    pauses: list[float] = []
    calls, write = failing(2, ConcurrentAppendException("files were added to the table"))
    retry_conflicts(write, "/t/sink", 7, sleep=pauses.append)
    assert len(calls) == 3 and pauses == [0.5, 1.0]


def test_a_write_that_keeps_losing_conflicts_is_a_clear_error_and_stays_uncommitted() -> None:
    calls, write = failing(ATTEMPTS, ConcurrentAppendException("files were added to the table"))
    with pytest.raises(
        WriteConflict, match=r"batch 7 lost 5 write conflicts on /t/sink .*replayed"
    ):
        retry_conflicts(write, "/t/sink", 7, sleep=lambda _: None)
    assert len(calls) == ATTEMPTS


def test_a_conflict_on_our_own_transaction_id_is_another_runner_at_once() -> None:
    calls, write = failing(1, ConcurrentTransactionException("same txnAppId"))
    with pytest.raises(ConcurrentRunner, match="another runner wrote batch 7 to /t/sink"):
        retry_conflicts(write, "/t/sink", 7, sleep=lambda _: None)
    assert len(calls) == 1


@pytest.mark.integration
def test_maintenance_and_another_job_writing_the_sink_around_a_crash_change_no_result(
    spark: SparkSession, references: References, caplog: pytest.LogCaptureFixture
) -> None:
    ref = references["session_update"]
    root = ref.folder / "maintained"
    shutil.copytree(ref.folder / "template", root)
    state = f"{ref.pipeline.checkpoint_location(root)}/state_windows"
    sink = str(root / SINK)
    crash = faults.crash_at(faults.KillPoint("after_state", KILL_BATCH))
    with crash, pytest.raises(faults.InjectedCrash):
        run_to_completion(spark, ref.pipeline, root)
    # Between the crash and the replay: the state MERGE of the crashed batch is
    # compacted away and VACUUMed (default retention), so is the sink.
    for table in (state, sink):
        DeltaTable.forPath(spark, table).optimize().executeCompaction()
        DeltaTable.forPath(spark, table).vacuum()

    # During the replay, another job appends to the sink (which update mode
    # MERGEs into, so they conflict) and compacts the state; the batches after it
    # run in peace.
    done = threading.Event()
    other = spark.newSession()  # its own confs: never inherits our txn ids

    def another_job() -> None:
        row = other.read.format("delta").load(sink).limit(1)
        while not done.is_set():
            try:
                row.withColumn("user", F.lit("someone else")).write.format("delta").mode(
                    "append"
                ).save(sink)
                DeltaTable.forPath(other, state).optimize().executeCompaction()
            except LOST:
                pass  # it lost to our MERGE: it tries again, as a real job would

    job = threading.Thread(target=another_job)
    caplog.set_level(logging.WARNING, logger="lowmark.state.conflicts")
    job.start()
    try:
        MicroBatchRunner(spark, ref.pipeline, root).run(max_batches=1)
    except WriteConflict:
        pass  # lost every retry: reported, not committed; the run below replays it
    finally:
        done.set()
        job.join()
    run_to_completion(spark, ref.pipeline, root)

    ours = snapshot(ref.pipeline, root)
    ours["sink"] = Counter({row: n for row, n in ours["sink"].items() if "someone else" not in row})
    assert differences(data(ref.tables), data(ours)) == [], caplog.text
