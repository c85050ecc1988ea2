"""The crash harness: runs killed at a step, runs to completion, and their comparison.

A crash run is compared with a fault-free run of the same pipeline and
input, table by table, as multisets of rows: ``differences`` names every
row a crash run lost or has in excess. Only what a run may legitimately
change is left out: runner ids, wall-clock times (``created_at``), the
random ``pipeline_id`` and the progress table (descriptive; a kill right
after the commit loses its row). A partition's ``last_seen_ms`` is a
planning time, so it is compared as the batch it names: the batch whose
offsets were planned then.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from functools import reduce
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from deltalake import DeltaTable as RsDeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from batches.cli import commands
from batches.loop.faults import KILL_AT_ENV, STEPS, InjectedCrash, KillPoint, crash_at
from batches.loop.microbatch import BatchResult, MicroBatchRunner
from batches.pipeline import Pipeline, resolve
from tests.faults.scenarios import SINK

REPO = Path(__file__).resolve().parents[2]
LOWMARK = str(Path(sys.executable).parent / "lowmark")
KILLED = -signal.SIGKILL

Snapshot = dict[str, Counter[str]]
"""Table name → multiset of its rows as JSON."""

Crash = Callable[[Path, KillPoint], bool]
"""Run until ``point`` and die there; True if it was reached (else the run just finished)."""

_UNSTABLE = {
    "commits": ("runner_id", "created_at"),
    "offsets": ("runner_id", "created_at"),
}
_CHECKPOINT_TABLES = (
    "offsets",
    "commits",
    "files",
    "bad_records",
    "watermarks",
    "state_windows",
    "late",
)
_HISTORY_METRICS = (
    "numOutputRows",
    "numSourceRows",
    "numTargetRowsInserted",
    "numTargetRowsUpdated",
    "numTargetRowsDeleted",
)


def run_to_completion(spark: SparkSession, pipeline: Pipeline, root: Path) -> list[BatchResult]:
    """What a restarted `lowmark run --until-caught-up` does, in this process."""
    return MicroBatchRunner(spark, pipeline, root).run(max_batches=None)


def lowmark_env(**extra: str) -> dict[str, str]:
    """Environment for a `lowmark` subprocess that finds ``tests.faults.scenarios``."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        # A process that lives one batch gains more from a fast JVM start than from C2.
        "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        **extra,
    }


def lowmark_run_args(root: Path, pipeline: Pipeline, *options: str) -> list[str]:
    return [
        LOWMARK,
        "--pipelines",
        "tests.faults.scenarios",
        "--data-root",
        str(root),
        "run",
        pipeline.name,
        *options,
    ]


def kill_run(
    root: Path, pipeline: Pipeline, point: KillPoint, *options: str
) -> subprocess.CompletedProcess[str]:
    """`lowmark run` in a subprocess with ``LOWMARK_KILL_AT=point``."""
    return subprocess.run(
        lowmark_run_args(root, pipeline, *options),
        env=lowmark_env(**{KILL_AT_ENV: str(point)}),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )


def subprocess_crash(pipeline: Pipeline) -> Crash:
    """Crashes by SIGKILL: `lowmark run --until-caught-up` with ``LOWMARK_KILL_AT``."""

    def crash(root: Path, point: KillPoint) -> bool:
        proc = kill_run(root, pipeline, point, "--until-caught-up")
        if proc.returncode not in (0, KILLED):
            raise AssertionError(f"lowmark run failed at {point}: {proc.stderr[-3000:]}")
        return proc.returncode == KILLED

    return crash


def in_process_crash(spark: SparkSession, pipeline: Pipeline) -> Crash:
    """Crashes by InjectedCrash (see ``batches.loop.faults``), each time in a new runner."""

    def crash(root: Path, point: KillPoint) -> bool:
        with crash_at(point):
            try:
                run_to_completion(spark, pipeline, root)
            except InjectedCrash:
                return True
        return False

    return crash


def an_hour_passes(checkpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As if an hour passed since ``checkpoint`` was last written, for its maintenance: every
    Delta log file is an hour old (past the one-minute log retention), and so is every data
    file a commit removed (maintenance vacuums files removed over ``KEEP_HOURS`` ago, and
    Delta stamps removals with the wall clock, so the retention is what moves)."""
    hour_ago = time.time() - 3600
    for log_file in Path(checkpoint).glob("*/_delta_log/*"):
        os.utime(log_file, (hour_ago, hour_ago))
    monkeypatch.setattr("state.maintenance.KEEP_HOURS", 0)


def lowmark_compact(root: Path, pipeline: Pipeline) -> None:
    """`lowmark compact` of a ``tests.faults.scenarios`` pipeline, in this process (so it
    sees what the test changed, e.g. ``an_hour_passes``); it must succeed."""
    args = ["--pipelines", "tests.faults.scenarios", "--data-root", str(root)]
    with pytest.raises(SystemExit) as done:
        commands.main([*args, "compact", pipeline.name])
    assert not done.value.code, f"lowmark compact {pipeline.name} failed"


def random_schedule(rng: random.Random, batches: int, crashes: int) -> list[KillPoint]:
    """``crashes`` kill points over batches ``0 .. batches-1``, in the order they can happen.

    Several may hit one batch (its replays die again); ``after_commit`` only
    as the last of its batch, since the batch is done after it.
    """
    ids = sorted(rng.randrange(batches) for _ in range(crashes))
    last_of_batch = [i + 1 == len(ids) or ids[i + 1] != b for i, b in enumerate(ids)]
    return [
        KillPoint(rng.choice(STEPS if last else STEPS[:-1]), b)
        for b, last in zip(ids, last_of_batch, strict=True)
    ]


def run_with_crashes(
    spark: SparkSession, pipeline: Pipeline, root: Path, schedule: list[KillPoint], crash: Crash
) -> int:
    """Crash at each point of ``schedule`` in turn, then run to completion; count the crashes."""
    crashes = sum(crash(root, point) for point in schedule)
    run_to_completion(spark, pipeline, root)
    return crashes


def snapshot(
    spark: SparkSession, pipeline: Pipeline, root: Path, after_reset: bool = False
) -> Snapshot:
    """Every table a batch writes, plus the sink's and state's Delta history, in one Spark job.

    ``after_reset``: the sink's history only after the commit by which ``lowmark reset
    --truncate-sink`` emptied it, and its versions in the commit log, numbered from 0
    again (what a run from scratch wrote).
    """
    checkpoint = pipeline.checkpoint_location(root)
    tables = {"sink": resolve(SINK, root)} | {
        name: f"{checkpoint}/{name}" for name in _CHECKPOINT_TABLES
    }
    # The sink's versions up to the reset's are the old checkpoint's.
    before = _reset_version(tables["sink"]) + 1 if after_reset else 0
    frames: list[DataFrame] = []
    for name, path in tables.items():
        if not RsDeltaTable.is_deltatable(path):
            continue
        df = spark.read.format("delta").load(path)
        if name == "watermarks":
            df = _last_seen_as_batch(df, spark.read.format("delta").load(tables["offsets"]))
        if name == "commits" and before:
            df = _sink_version_less(df, before)
        frames.append(_as_json(name, df.drop(*_UNSTABLE.get(name, ()))))
        if name in ("sink", "state_windows"):
            history = _history(spark, path)
            if name == "sink" and before:
                history = history.where(F.col("version") >= before)
                history = history.withColumn("version", F.col("version") - before)
            frames.append(_as_json(f"{name} history", history))
    result: Snapshot = {name: Counter() for name in tables}
    for row in reduce(DataFrame.unionByName, frames).collect():
        result.setdefault(row["table"], Counter())[row["row"]] += 1
    return result


def differences(expected: Snapshot, actual: Snapshot) -> list[str]:
    """Per table, the rows ``actual`` lost and the rows it has in excess (empty: identical)."""
    found = []
    for table in sorted(expected.keys() | actual.keys()):
        want, got = expected.get(table, Counter()), actual.get(table, Counter())
        lost, extra = want - got, got - want
        if lost or extra:
            example = next(iter(lost or extra))
            found.append(
                f"{table}: {sum(lost.values())} lost, {sum(extra.values())} extra, e.g. {example}"
            )
    return found


def _as_json(table: str, df: DataFrame) -> DataFrame:
    return df.select(
        F.lit(table).alias("table"), F.to_json(F.struct(*sorted(df.columns))).alias("row")
    )


def _last_seen_as_batch(watermarks: DataFrame, offsets: DataFrame) -> DataFrame:
    """``last_seen_ms`` replaced by ``last_seen_batch``: the batch planned at that time (a
    time no batch was planned at stays, as -1, a difference)."""
    planned = offsets.select(
        F.unix_millis("created_at").alias("_planned_ms"), F.col("batch_id").alias("_batch")
    )
    return (
        watermarks.join(planned, watermarks["last_seen_ms"] == planned["_planned_ms"], "left")
        .withColumn("last_seen_batch", F.coalesce("_batch", F.lit(-1)))
        .drop("last_seen_ms", "_planned_ms", "_batch")
    )


def reset_with_truncate_sink(root: Path, pipeline: Pipeline) -> None:
    """`lowmark reset PIPELINE --truncate-sink`, in this process (its Spark session)."""
    args = ["--pipelines", "tests.faults.scenarios", "--data-root", str(root)]
    try:
        commands.main([*args, "reset", pipeline.name, "--truncate-sink"])
    except SystemExit as exit_info:
        assert not exit_info.code, f"lowmark reset {pipeline.name} exited {exit_info.code}"


def _reset_version(path: str) -> int:
    """The version of the newest commit of a reset to the table at ``path`` (its writer's
    batch is -1: ``batches.admin.reset``)."""
    return max(
        int(c["version"])
        for c in RsDeltaTable(path).history()
        if json.loads(c.get("userMetadata") or "{}").get("lowmark", {}).get("batch_id") == -1
    )


def _sink_version_less(commits: DataFrame, by: int) -> DataFrame:
    """``commits`` with the sink version each recorded (JSON text ``"sink": N``) less ``by``."""
    recorded = F.regexp_extract("table_versions", r'"sink": (\d+)', 1)
    shifted = F.concat(F.lit('"sink": '), (recorded.cast("long") - by).cast("string"))
    return commits.withColumn(
        "table_versions",
        F.when(
            recorded != "", F.regexp_replace("table_versions", r'"sink": \d+', shifted)
        ).otherwise(F.col("table_versions")),
    )


def _history(spark: SparkSession, path: str) -> DataFrame:
    """Each version's operation and row counts: a write replayed twice shows up here."""
    history = DeltaTable.forPath(spark, path).history()
    return history.select(
        "version",
        "operation",
        F.map_filter(
            "operationMetrics",
            lambda k, _: k.isin(*_HISTORY_METRICS)
            & ((F.col("operation") == "WRITE") | (k != "numOutputRows")),
        ).alias("metrics"),
    )
