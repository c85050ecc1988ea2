"""The kill matrix: `lowmark run` SIGKILLed at every step, then run to completion.

For each step of ``lowmark.batches.loop.faults.STEPS`` (and, into a Kafka topic, the step
inside its transaction) and each pipeline of ``MATRIX``
(append mode with tumbling windows, update mode with sessions, a stateless
append whose sink Spark writes; sessions over a Kafka topic, tumbling windows
over a synthetic source, also with an idle timeout shorter than any batch
(records waiting keep a partition in the watermark), sessions over a
user-written source and over a Delta table, tumbling windows over a union, on
the files' ingestion clock and per a column a stream-table join brings, and a
stream-stream join of the folder with a Delta table), a subprocess dies at
that step of batch 3 (late records, final windows, and windows, sessions and
join rows open since earlier batches); a restart in this process
runs to completion. Every table must equal the fault-free run's: nothing
lost, nothing duplicated. And a kill followed by `lowmark reset --truncate-sink`
before any replay must end as a fault-free run from scratch.

The killed driver is attached to this process's JVM (what that covers:
``tests.faults.driver``); the folder pipelines' cases run again with a JVM of
their own that dies with the driver. `make test` runs the cases of
``KILLED_IN_MAKE_TEST``; `make test-integration` every other case.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.loop.faults import SINK_STEPS, STEPS, KillPoint
from lowmark.batches.pipeline import KafkaSink, Pipeline
from tests.faults.conftest import (
    KILL_BATCH,
    KILLED_IN_MAKE_TEST,
    MATRIX,
    OTHER_SOURCES,
    KillCases,
    References,
)
from tests.faults.harness import (
    KILLED,
    differences,
    kill_run,
    reset_with_truncate_sink,
    run_to_completion,
    snapshot,
)
from tests.faults.scenarios import synthetic_no_idle

pytestmark = [pytest.mark.slow]


def _in_make_test(step: str, name: str, jvm: str) -> bool:
    return jvm == "shared" and step in KILLED_IN_MAKE_TEST.get(name, ())


def _steps(p: Pipeline) -> tuple[str, ...]:
    """Every step of a batch, and a transactional sink's own (``SINK_STEPS``) for a pipeline
    that writes one."""
    return (*STEPS, *SINK_STEPS) if isinstance(p.sink, KafkaSink) else STEPS


CASES = [
    pytest.param(
        step,
        p.name,
        jvm,
        marks=[] if _in_make_test(step, p.name, jvm) else [pytest.mark.integration],
        id=f"{step}-{p.name}-{jvm}-jvm",
    )
    for jvm in ("shared", "own")
    for step in (*STEPS, *SINK_STEPS)
    for p in MATRIX
    if step in _steps(p) and (jvm == "shared" or p.name not in OTHER_SOURCES)
]


@pytest.mark.parametrize(("step", "name", "jvm"), CASES)
def test_a_run_killed_at_any_step_then_restarted_ends_like_a_run_never_killed(
    spark: SparkSession,
    references: References,
    kill_cases: KillCases,
    name: str,
    step: str,
    jvm: str,
) -> None:
    ref = references[name]
    case = kill_cases.get((name, step, jvm))
    assert case.process.returncode == KILLED, case.process.stderr[-3000:]

    results = run_to_completion(spark, ref.pipeline, case.root)

    # Killed before its offsets were written, batch 3 is planned afresh; after its
    # commit, it is done; anywhere between, it is replayed.
    replayed = [r.batch_id for r in results if r.replay]
    assert replayed == ([] if step in ("after_plan", "after_commit") else [KILL_BATCH])
    assert differences(ref.tables, snapshot(ref.pipeline, case.root)) == []


ONE_JOB_BATCH = KILL_BATCH + 1
"""A batch with no bad row: a stateless pipeline writes its sink in one Spark job that
observes everything else (``lowmark.batches.loop.one_job``), so its kills fall around that
one job's write, not around a look job and a write."""


@pytest.mark.integration
@pytest.mark.parametrize("name", ["plain_append", "dedup_append", "keyed_alerts"])
@pytest.mark.parametrize("step", STEPS)
def test_a_one_job_batch_killed_at_any_step_then_restarted_ends_like_a_run_never_killed(
    spark: SparkSession, references: References, name: str, step: str
) -> None:
    ref = references[name]
    root = ref.folder / f"one_job_{step}"  # beside the shared input folder
    shutil.copytree(ref.folder / "template", root)
    point = KillPoint(step, ONE_JOB_BATCH)
    killed = kill_run(root, ref.pipeline, point, "--until-caught-up", jvm=spark)
    assert killed.returncode == KILLED, killed.stderr[-3000:]

    results = run_to_completion(spark, ref.pipeline, root)

    replayed = [r.batch_id for r in results if r.replay]
    assert replayed == ([] if step in ("after_plan", "after_commit") else [ONE_JOB_BATCH])
    assert differences(ref.tables, snapshot(ref.pipeline, root)) == []


@pytest.mark.integration  # the synthetic pipelines' reference runs are integration's
def test_an_idle_timeout_shorter_than_every_batch_makes_no_waiting_record_late(
    spark: SparkSession, references: References, tmp_path: Path
) -> None:
    # The same input with no idle timeout: records wait in both partitions until the last
    # batch, so the timeout may leave neither out of the watermark before it.
    root = tmp_path / "reference"
    run_to_completion(spark, synthetic_no_idle, root)
    without = snapshot(synthetic_no_idle, root)["late"]
    assert references["synthetic_idle"].tables["late"] == without
    assert sum(without.values()) > 0


RESET_STEPS = ("after_offset_log", "after_sink")
"""Kills before anything of the batch landed, and after its sink write landed uncommitted."""
RESET_CASES = [
    pytest.param(
        step,
        name,
        marks=[] if name == "tumbling_two_partitions" else [pytest.mark.integration],
        id=f"reset-{step}-{name}",
    )
    for step in RESET_STEPS
    for name in ("plain_append", "tumbling_two_partitions", "session_update")
]
"""A stateless pipeline, whose sink Spark writes; tumbling windows in append mode and
sessions in update mode, whose sinks lowmark writes on the driver (`make test`: tumbling
windows; `make test-integration`: the others)."""


@pytest.mark.parametrize(("step", "name"), RESET_CASES)
def test_a_run_killed_then_reset_with_truncate_sink_ends_like_a_run_from_scratch(
    spark: SparkSession, references: References, name: str, step: str
) -> None:
    ref = references[name]
    root = ref.folder / f"reset_{step}"
    shutil.copytree(ref.folder / "template", root)
    killed = kill_run(root, ref.pipeline, KillPoint(step, KILL_BATCH), jvm=spark)
    assert killed.returncode == KILLED, killed.stderr[-3000:]

    reset_with_truncate_sink(root, ref.pipeline)
    results = run_to_completion(spark, ref.pipeline, root)

    assert [r.batch_id for r in results] == list(range(ref.batches))
    assert not any(r.replay for r in results)  # a new checkpoint: nothing to replay
    # The sink's versions count on from the old checkpoint's, so its writes are compared
    # by batch (see ``snapshot``); every other table as it is.
    from_scratch = snapshot(ref.pipeline, ref.root, as_from_scratch=True)
    assert differences(from_scratch, snapshot(ref.pipeline, root, as_from_scratch=True)) == []
