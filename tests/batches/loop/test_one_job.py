"""A stateless batch whose sink write is its one Spark job (``lowmark.batches.loop.one_job``).

The write observes what the look would have collected, so the commit's counts must be
the look's: a replay after a kill between the write and the commit (which looks first,
the write skipped by Delta) must commit what a run never killed commits, and leave the
sink as a plain Spark batch over the whole input gives it. A batch that too many bad rows
fail must still write nothing: the rows that do not parse stop the write's job before
Delta commits. (Job counts: ``test_job_counts``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from examples.keyed import ALERTS, SilenceAlert
from lowmark.batches.dedup import Dedup
from lowmark.batches.errors import ExpectationsFailed
from lowmark.batches.expectations import Quality
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.sinks.delta import DeltaFence
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.commit_log import COUNTS
from tests.helpers import SCHEMA, FakeClock, delta_frame, drop_batches, event, sink, timed

INPUT = [
    [event("a", 1, 1), event("b", 2, 2), event("b", 2, 2)],
    [event("a", 11, 3), event("c", 12, 4), event("a", 11, 3), event("b", 2, 2)],
]
"""Two files, one a batch: twins within a file and across files (by user and time)."""


DEDUP = timed(dedup=Dedup(columns=("user", "ts"), within="1 hour"))
KEYED = timed(keyed=Keyed(processor=SilenceAlert, keys=("user",), output_schema=ALERTS))


def _commits(root: Path) -> list[dict[str, object]]:
    ckpt = Checkpoint(str(root / "_lowmark" / "timed"), "timed")
    return [
        {k: getattr(c, k) for k in (*COUNTS, "next_watermark_ms", "next_timer_ms")}
        for c in ckpt.commits.get_range()
    ]


@pytest.mark.parametrize("defined", [DEDUP, KEYED], ids=["dedup", "keyed"])
def test_a_batch_killed_after_its_one_job_write_replays_to_the_counts_of_a_run_never_killed(
    spark: SparkSession, tmp_path: Path, defined: Pipeline
) -> None:
    for root in (tmp_path / "killed", tmp_path / "clean"):
        drop_batches(root, INPUT)
    killed = tmp_path / "killed"
    runner = MicroBatchRunner(spark, defined, killed, FakeClock())
    # Killed at the end of step 4: the batch's write landed, nothing else of it did.
    with crash_at(KillPoint("after_read", 1)), pytest.raises(InjectedCrash):
        runner.run(max_batches=None)
    assert isinstance(runner.sink, DeltaFence) and runner.sink.landed(1)
    assert runner.checkpoint.commits.latest_batch_id() == 0

    replay = MicroBatchRunner(spark, defined, killed, FakeClock()).run(max_batches=None)
    clean = MicroBatchRunner(spark, defined, tmp_path / "clean", FakeClock())
    batches = clean.run(max_batches=None)[1:]  # a keyed step's timers may run more batches

    assert [(r.batch_id, r.replay) for r in replay] == [
        (r.batch_id, r.batch_id == 1) for r in batches
    ]
    assert _commits(killed) == _commits(tmp_path / "clean")
    assertDataFrameEqual(sink(spark, killed), sink(spark, tmp_path / "clean"))
    if defined is DEDUP:  # a plain Spark batch over the whole input
        whole = spark.read.schema(SCHEMA).json(str(killed / "in"))
        assertDataFrameEqual(sink(spark, killed), whole.dropDuplicates(["user", "ts"]))
        assert [c["rows_duplicate"] for c in _commits(killed)] == [1, 2]


def test_a_batch_with_too_many_bad_rows_writes_nothing_though_its_write_is_its_look(
    spark: SparkSession, tmp_path: Path
) -> None:
    # Batch 1: one good record and ten that do not parse, over max_bad_fraction (0.9).
    drop_batches(tmp_path, INPUT[:1])
    bad = "".join('{"user": "x", "ts": oops}\n' for _ in range(10))
    (tmp_path / "in" / "b001.json").write_text(bad + '{"user": "d", "amount": 7}\n')
    runner = MicroBatchRunner(spark, timed(), tmp_path, FakeClock())
    runner.run_batch()
    with pytest.raises(ExpectationsFailed, match="10 of 11 rows bad"):
        runner.run_batch()

    assert isinstance(runner.sink, DeltaFence) and not runner.sink.landed(1)
    assert delta_frame(spark, runner.checkpoint.table("bad_records")).count() == 0
    loosened = timed(quality=Quality(max_bad_fraction=1.0))
    results = MicroBatchRunner(spark, loosened, tmp_path, FakeClock()).run(max_batches=None)
    assert [(r.batch_id, r.rows_in, r.rows_out, r.rows_bad) for r in results] == [(1, 11, 1, 10)]
    assert sorted(r.user for r in sink(spark, tmp_path).collect()) == ["a", "b", "b", "d"]
