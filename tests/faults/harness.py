"""The crash harness: runs killed at a step, runs to completion, and their comparison.

A crash run is compared with a fault-free run of the same pipeline and
input, table by table, as multisets of rows: ``differences`` names every
row a crash run lost or has in excess. Only what a run may legitimately
change is left out: runner ids, wall-clock times (``created_at``, ``discovered_ms``), the
random ``pipeline_id`` and the progress table (descriptive; a kill right
after the commit loses its row). A partition's ``last_seen_ms`` is a
planning time, so it is compared as the batch it names: the batch whose
offsets were planned then. Tables are read with delta-rs, the same way for
both runs, so a comparison runs no Spark job.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from pyspark.sql import SparkSession

from lowmark.batches.cli import commands
from lowmark.batches.loop.faults import KILL_AT_ENV, STEPS, InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, KafkaSink, Pipeline, PostgresSink, resolve
from lowmark.state.storage import is_table, open_table
from tests.faults.class_archive import JVM_OPTIONS, subprocess_jvm_options
from tests.faults.driver import attached_env
from tests.faults.kafka_sink import at_root, copy_topic, kafka_sink_env, kafka_tables
from tests.faults.scenarios import FROZEN_CLOCK_ENV, SINK, clock_of
from tests.helpers import INTERPRETED

REPO = Path(__file__).resolve().parents[2]
LOWMARK = str(Path(sys.executable).parent / "lowmark")
"""The installed `lowmark` command (``lowmark.orchestration.cli``)."""
ENGINE_CLI = (sys.executable, "-m", "tests.faults.driver")
"""`lowmark` as the crash tests run it: the engine's commands (``tests.faults.driver``),
without the Dagster commands and batch reports of the installed entry point
(``lowmark.orchestration.cli``), whose imports double a subprocess's Python start (0.7 s → 1.4 s
of CPU time): a kill case is about the engine's recovery."""
KILLED = -signal.SIGKILL

Snapshot = dict[str, Counter[str]]
"""Table name → multiset of its rows as JSON."""

Row = dict[str, Any]

Crash = Callable[[Path, KillPoint], bool]
"""Run until ``point`` and die there; True if it was reached (else the run just finished)."""

_UNSTABLE = {
    "commits": ("runner_id", "created_at"),
    "offsets": ("runner_id", "created_at"),
    "files": ("discovered_ms",),  # when a planning listed the file: wall-clock time
}
_CHECKPOINT_TABLES = (
    "offsets",
    "commits",
    "files",
    "bad_records",
    "watermarks",
    "state_windows",
    "late",
    "dedup_ids",
    "keyed_state",
    "keyed_timers",
    "join_state",
)
_INSERTED = ("numOutputRows", "numTargetRowsInserted", "num_added_rows", "num_target_rows_inserted")
_UPDATED = ("numTargetRowsUpdated", "num_target_rows_updated")
_DELETED = ("numTargetRowsDeleted", "num_target_rows_deleted")
_ROW_COUNTS = (*_INSERTED, *_UPDATED, *_DELETED, "numSourceRows", "num_source_rows")
"""A commit's row counts as Spark and as delta-rs name them (``numOutputRows`` counts what
a WRITE added, but also rows a MERGE copied: it is kept for WRITEs only)."""
_CHANGES = ("inserted", "updated", "deleted")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def run_to_completion(spark: SparkSession, pipeline: Pipeline, root: Path) -> list[BatchResult]:
    """What a restarted `lowmark run --until-caught-up` does, in this process (a Postgres
    sink into ``root``'s own database, a Kafka sink into its own topic)."""
    with postgres_database(root, pipeline):
        return MicroBatchRunner(spark, at_root(pipeline, root), root, clock_of(pipeline)).run(
            max_batches=None
        )


def database_of(root: Path) -> str:
    """The Postgres database of the run under data root ``root``: each run (reference,
    template, crash case) writes a database of its own, as it writes Delta tables of its own."""
    return "run_" + hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:20]


def postgres_env(root: Path, pipeline: Pipeline) -> dict[str, str]:
    """libpq's PGDATABASE for a run of ``pipeline`` under ``root``, if its sink is Postgres
    (the server's other variables are in the environment: ``tests.conftest``'s ``postgres``)."""
    return {"PGDATABASE": database_of(root)} if isinstance(pipeline.sink, PostgresSink) else {}


@contextmanager
def postgres_database(root: Path, pipeline: Pipeline) -> Iterator[None]:
    """Within the block, this process's PGDATABASE is ``root``'s (``postgres_env``)."""
    env = postgres_env(root, pipeline)
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def copy_run(source: Path, target: Path, pipeline: Pipeline) -> None:
    """The run under ``source`` copied to ``target``: its folder, and its Postgres database
    (a Postgres sink's table and fence rows) or Kafka topic (with its fence) if it has one."""
    shutil.copytree(source, target)
    if isinstance(pipeline.sink, KafkaSink):
        copy_topic(source, target, pipeline)
    if isinstance(pipeline.sink, PostgresSink):
        with psycopg.connect(dbname="postgres", autocommit=True) as conn:
            conn.execute(
                f'CREATE DATABASE "{database_of(target)}" TEMPLATE "{database_of(source)}"'
            )


def create_database(root: Path, pipeline: Pipeline) -> None:
    """An empty Postgres database for the run under ``root``, if ``pipeline`` needs one."""
    if isinstance(pipeline.sink, PostgresSink):
        with psycopg.connect(dbname="postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database_of(root)}"')


def _postgres_tables(pipeline: Pipeline, root: Path) -> dict[str, list[Row]]:
    """A Postgres sink's rows and its fence rows (without ``written_at``, a wall-clock time),
    from ``root``'s database."""
    assert isinstance(pipeline.sink, PostgresSink)
    with psycopg.connect(dbname=database_of(root), row_factory=dict_row) as conn:
        sink = conn.execute(f'SELECT * FROM "{pipeline.sink.table}"').fetchall()
        fence = conn.execute(
            "SELECT app_id, batch_id, table_name, rows FROM lowmark_sink_batches"
        ).fetchall()
    return {"sink": list(sink), "sink fence": list(fence)}


def lowmark_env(jvm: SparkSession | None = None, **extra: str) -> dict[str, str]:
    """Environment for a `lowmark` subprocess that finds ``tests.faults.scenarios``: its
    driver attached to ``jvm``'s JVM (``tests.faults.driver``), or with a JVM of its own."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        **(attached_env(jvm) if jvm is not None else own_jvm_env()),
        **extra,
    }


def own_jvm_env() -> dict[str, str]:
    """A subprocess's own JVM: started with the session's class archive, if any, and the
    test process's Spark settings (``INTERPRETED``)."""
    return {
        "SPARK_SUBMIT_OPTS": subprocess_jvm_options(),
        # spark-submit's own JVM, which only builds the driver's command line.
        "SPARK_LAUNCHER_OPTS": " ".join(JVM_OPTIONS),
        "PYSPARK_SUBMIT_ARGS": " ".join(
            [*(f"--conf {k}={v}" for k, v in INTERPRETED.items()), "pyspark-shell"]
        ),
    }


def lowmark_run_args(root: Path, pipeline: Pipeline, *options: str) -> list[str]:
    return [
        *ENGINE_CLI,
        "--pipelines",
        "tests.faults.scenarios",
        "--data-root",
        str(root),
        "run",
        pipeline.name,
        *options,
    ]


def clock_env(pipeline: Pipeline) -> dict[str, str]:
    """What freezes a `lowmark` subprocess's clock where ``pipeline`` runs on a fake one
    (``tests.faults.scenarios.clock_of``)."""
    clock = clock_of(pipeline)
    return {} if clock is None else {FROZEN_CLOCK_ENV: str(clock.now_ms())}


def kill_run(
    root: Path, pipeline: Pipeline, point: KillPoint, *options: str, jvm: SparkSession | None
) -> subprocess.CompletedProcess[str]:
    """`lowmark run` in a subprocess with ``LOWMARK_KILL_AT=point``, its driver attached to
    ``jvm``'s JVM or (None) with a JVM of its own (``lowmark_env``)."""
    return subprocess.run(
        lowmark_run_args(root, pipeline, *options),
        env=lowmark_env(
            jvm,
            **{KILL_AT_ENV: str(point)},
            **postgres_env(root, pipeline),
            **kafka_sink_env(root, pipeline),
            **clock_env(pipeline),
        ),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )


def two_runs_at_once(
    args: list[str], env: dict[str, str], claimed: Callable[[], bool]
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """`lowmark run` ``args`` twice at once: the first frozen (SIGSTOP) as soon as
    ``claimed()`` says it claimed its first batch (a runner stalled mid-batch), a second
    one run to its end meanwhile, then the first let go on to its end. Both outcomes,
    the first's first (its stdout not captured)."""
    first = subprocess.Popen(args, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while not claimed() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGSTOP)
    try:
        second = subprocess.run(
            args, env=env, cwd=REPO, capture_output=True, text=True, timeout=900
        )
    finally:
        first.send_signal(signal.SIGCONT)
    _, first_err = first.communicate(timeout=900)
    return subprocess.CompletedProcess(args, first.returncode, None, first_err), second


def subprocess_crash(pipeline: Pipeline) -> Crash:
    """Crashes by SIGKILL: `lowmark run --until-caught-up` with ``LOWMARK_KILL_AT``, each
    with a JVM of its own, which dies with it."""

    def crash(root: Path, point: KillPoint) -> bool:
        proc = kill_run(root, pipeline, point, "--until-caught-up", jvm=None)
        if proc.returncode not in (0, KILLED):
            raise AssertionError(f"lowmark run failed at {point}: {proc.stderr[-3000:]}")
        return proc.returncode == KILLED

    return crash


def in_process_crash(spark: SparkSession, pipeline: Pipeline) -> Crash:
    """Crashes by InjectedCrash (see ``lowmark.batches.loop.faults``), each time in a new runner."""

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
    monkeypatch.setattr("lowmark.state.maintenance.KEEP_HOURS", 0)


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


def snapshot(pipeline: Pipeline, root: Path, as_from_scratch: bool = False) -> Snapshot:
    """Every table a batch writes, plus the sink's and state's Delta history, read with
    delta-rs (no Spark job); a Postgres sink's table and fence rows, read with psycopg; a
    Kafka sink's records and fence, read as a ``read_committed`` consumer.

    ``as_from_scratch``: the sink's history as the writes of the checkpoint in place,
    by batch (``_sink_writes``), and the sink version each commit records as the batch
    whose write it shows: what a run that started from scratch and a run after ``lowmark
    reset --truncate-sink`` must agree on.
    """
    checkpoint = pipeline.checkpoint_location(root)
    sink = resolve(pipeline.sink.path if isinstance(pipeline.sink, DeltaSink) else SINK, root)
    tables = {"sink": sink} | {name: f"{checkpoint}/{name}" for name in _CHECKPOINT_TABLES}
    result: Snapshot = {name: Counter() for name in tables}
    found = {name: path for name, path in tables.items() if is_table(path)}
    writes = _sink_writes(found["sink"]) if as_from_scratch and "sink" in found else None
    for name, path in found.items():
        rows = _rows(path, _UNSTABLE.get(name, ()))
        if name == "watermarks":
            rows = _last_seen_as_batch(rows, _rows(found["offsets"], ()))
        if name == "commits" and writes is not None:
            rows = [_sink_version_as_batch(row, writes) for row in rows]
        result[name] = rows_as_json(rows)
        if name == "sink" and writes is not None:
            result["sink writes"] = rows_as_json(list(writes.values()))
        elif name in ("sink", "state_windows", "join_state"):
            result[f"{name} history"] = rows_as_json(_history(path))
    if isinstance(pipeline.sink, PostgresSink):
        for name, rows in _postgres_tables(pipeline, root).items():
            result[name] = rows_as_json(rows)
    if isinstance(pipeline.sink, KafkaSink):
        for name, rows in kafka_tables(pipeline, root).items():
            result[name] = rows_as_json(rows)
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


def delta_rows(path: str) -> Counter[str]:
    """The rows of the Delta table at ``path`` as a multiset of JSON texts (``rows_as_json``)."""
    return rows_as_json(_rows(path, ()))


def _rows(path: str, unstable: tuple[str, ...]) -> list[Row]:
    """The rows of the Delta table at ``path``, without the columns ``unstable``."""
    table = open_table(path).to_pyarrow_table()
    return table.drop_columns([c for c in unstable if c in table.column_names]).to_pylist()


def rows_as_json(rows: list[Row]) -> Counter[str]:
    """``rows`` as a multiset of JSON texts (keys sorted; times, dates and the like as
    their ``str``)."""
    return Counter(json.dumps(row, sort_keys=True, default=str) for row in rows)


def _last_seen_as_batch(watermarks: list[Row], offsets: list[Row]) -> list[Row]:
    """``last_seen_ms`` replaced by ``last_seen_batch``: the batch planned at that time (a
    time no batch was planned at stays, as -1, a difference)."""
    planned = {_millis(o["created_at"]): o["batch_id"] for o in offsets}
    return [
        {k: v for k, v in row.items() if k != "last_seen_ms"}
        | {"last_seen_batch": planned.get(row["last_seen_ms"], -1)}
        for row in watermarks
    ]


def _millis(moment: datetime) -> int:
    """``moment`` in epoch milliseconds, truncated as Spark's ``unix_millis``."""
    return (moment - EPOCH) // timedelta(milliseconds=1)


def _history(path: str) -> list[Row]:
    """Each version's operation and row counts: a write replayed twice shows up here."""
    return [
        {
            "version": commit["version"],
            "operation": commit["operation"],
            "metrics": _row_counts(commit),
        }
        for commit in open_table(path).history()
    ]


def _row_counts(commit: Row) -> dict[str, str]:
    """The row counts among a commit's metrics, whichever engine wrote it (Spark's counts
    are text, delta-rs's numbers: both as text)."""
    metrics = commit.get("operationMetrics") or {}
    return {
        k: str(v)
        for k, v in metrics.items()
        if k in _ROW_COUNTS and (k != "numOutputRows" or commit["operation"] == "WRITE")
    }


def _sink_writes(path: str) -> dict[int, Row]:
    """Sink version → the write it is, for the versions the checkpoint in place wrote
    (after the newest reset, if any), each as its batch and the rows it inserted,
    updated and deleted.

    The operation and the version number are left out: the first write into an
    emptied sink MERGEs (or appends) where a run from scratch creates the table, and
    the versions count on from the old checkpoint's. A write of no rows, the empty
    table a run from scratch creates in its first batch or the reset's truncation
    (batch -1, ``lowmark.batches.admin.reset``), is left out too: it is no batch's output.
    """
    commits = sorted(open_table(path).history(), key=lambda c: int(c["version"]))
    ours = commits[_after_newest_reset(commits) :]
    writes = {int(c["version"]): {"batch_id": _writer_batch(c)} | _changed(c) for c in ours}
    return {v: w for v, w in writes.items() if any(w[k] for k in _CHANGES)}


def _after_newest_reset(commits: list[Row]) -> int:
    """The index in ``commits`` (oldest first) after the newest reset's, else 0."""
    resets = [i for i, c in enumerate(commits) if _writer_batch(c) == -1]
    return resets[-1] + 1 if resets else 0


def _writer_batch(commit: Row) -> int | None:
    """The batch a commit's ``userMetadata`` names (``lowmark.state.ownership``), if any."""
    writer = json.loads(commit.get("userMetadata") or "{}").get("lowmark", {})
    return writer.get("batch_id")


def _changed(commit: Row) -> Row:
    """Rows a commit inserted, updated and deleted, from either engine's metrics."""
    counts = _row_counts(commit)
    return {
        change: sum(int(counts.get(k, 0)) for k in names)
        for change, names in zip(_CHANGES, (_INSERTED, _UPDATED, _DELETED), strict=True)
    }


def _sink_version_as_batch(commit: Row, writes: dict[int, Row]) -> Row:
    """A commit log row with its recorded sink version replaced by the batch whose write
    the sink then showed (None: no write yet, only a creation or a truncation)."""
    versions = json.loads(commit["table_versions"])
    if "sink" not in versions:
        return commit
    shown = [v for v in writes if v <= versions["sink"]]
    versions["sink"] = {"written_by_batch": writes[max(shown)]["batch_id"] if shown else None}
    return commit | {"table_versions": json.dumps(versions, sort_keys=True)}


def reset_with_truncate_sink(root: Path, pipeline: Pipeline) -> None:
    """`lowmark reset PIPELINE --truncate-sink`, in this process (its Spark session)."""
    args = ["--pipelines", "tests.faults.scenarios", "--data-root", str(root)]
    try:
        commands.main([*args, "reset", pipeline.name, "--truncate-sink"])
    except SystemExit as exit_info:
        assert not exit_info.code, f"lowmark reset {pipeline.name} exited {exit_info.code}"
