"""Checkpoints and sinks on an S3-compatible store (``lowmark.state.storage``), against a
real server on loopback (``tests.s3_server``): the store refuses a second create of a
commit, a windowed pipeline's tables on a bucket equal a local run's, and so do a
deduplicating and a keyed pipeline's (whose tasks write their sink's files), two runners at once
end as one, a SIGKILL is replayed, and maintenance works on the bucket.

Each `lowmark run` is a subprocess with a JVM of its own, started with S3A's jars and
settings (the test process's Spark has none); ``tests.faults.s3_scenarios`` puts the
scenario's checkpoint and sink on the test's bucket.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from botocore.exceptions import ClientError
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from lowmark.batches.loop.faults import KILL_AT_ENV, KillPoint
from lowmark.batches.loop.maintenance import maintain_checkpoint
from lowmark.batches.pipeline import Pipeline
from lowmark.state.keyed_state import TIMER_INDEX, TIMER_PARTITIONS
from lowmark.state.storage import delta_rs_options, open_table
from lowmark.state.table import DriverTable
from lowmark.state.task_appends import write_files
from tests.faults.harness import (
    ENGINE_CLI,
    KILLED,
    REPO,
    Snapshot,
    differences,
    lowmark_env,
    run_to_completion,
    snapshot,
    two_runs_at_once,
)
from tests.faults.s3_scenarios import PREFIX_ENV, on_bucket
from tests.faults.scenarios import (
    FIXED_INPUT,
    RESENT_INPUT,
    File,
    dedup_append,
    keyed_alerts,
    session_update,
    write_input,
)
from tests.s3_server import S3Server

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def s3(spark: SparkSession) -> Iterator[S3Server]:
    """The server, its settings in this process's environment (after the test process's
    Spark started: it stays without S3)."""
    server = S3Server.start()
    with pytest.MonkeyPatch.context() as env:
        for name, value in server.env.items():
            env.setenv(name, value)
        yield server
    server.stop()


@pytest.fixture(scope="module")
def reference(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Snapshot]:
    """A folder with ``input/`` (six files, one per batch), and what a fault-free local run
    of ``session_update`` (sessions in update mode: window state, a MERGE sink) writes."""
    folder = tmp_path_factory.mktemp("s3")
    write_input(folder / "input", FIXED_INPUT)
    run_to_completion(spark, session_update, folder / "reference")
    return folder, snapshot(session_update, folder / "reference")


WHERE = ("pipeline_definition", "pipeline_fingerprint")
"""The offset log's record of the definition, which names the checkpoint's and the sink's
paths: a local run's and a run's on a bucket differ there, and only there."""


def _tables(tables: Snapshot) -> Snapshot:
    """``tables`` with the offset log's rows without ``WHERE``."""
    offsets = Counter(
        json.dumps({k: v for k, v in json.loads(row).items() if k not in WHERE}, sort_keys=True)
        for row in tables.get("offsets", Counter()).elements()
    )
    return tables | {"offsets": offsets}


@dataclass(frozen=True)
class Case:
    """One test's bucket: ``session_update`` on it, its local data root, and what the
    local reference run wrote (``_tables``)."""

    prefix: str
    pipeline: Pipeline
    root: Path
    expected: Snapshot


def _on_new_bucket(s3: S3Server, reference: tuple[Path, Snapshot], name: str) -> Case:
    """A bucket ``name`` for one test, and the test's data root beside the input."""
    folder, local = reference
    prefix = s3.create_bucket(name)
    return Case(prefix, on_bucket(session_update, prefix), folder / name, _tables(local))


def _run_args(root: Path, name: str = "session_update") -> list[str]:
    args = ["--pipelines", "tests.faults.s3_scenarios", "--data-root", str(root)]
    return [*ENGINE_CLI, *args, "run", name, "--until-caught-up"]


def _env(s3: S3Server, prefix: str, **extra: str) -> dict[str, str]:
    return lowmark_env(None, **s3.env, **{PREFIX_ENV: prefix}, **extra)


def _run(
    s3: S3Server, prefix: str, root: Path, name: str = "session_update", **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _run_args(root, name),
        env=_env(s3, prefix, **extra),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_the_store_refuses_a_second_create_and_delta_rs_never_overwrites_a_commit(
    s3: S3Server,
) -> None:
    client = s3.client()
    client.create_bucket(Bucket="refuses")
    client.put_object(Bucket="refuses", Key="k", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        client.put_object(Bucket="refuses", Key="k", Body=b"second", IfNoneMatch="*")

    # Another writer commits version 1 between delta-rs's look at the table and its put
    # of version 1: delta-rs must not overwrite that commit (an unconditional put would)
    # but lose, read it, and commit version 2.
    table = "s3a://refuses/t"
    options = delta_rs_options(table)
    write_deltalake(table, pa.table({"x": [0]}), storage_options=options)
    theirs = b'{"commitInfo":{"operation":"OTHER WRITER"}}\n'
    s3.race("refuses", f"t/_delta_log/{1:020d}.json", theirs)
    write_deltalake(table, pa.table({"x": [2]}), mode="append", storage_options=options)
    kept = client.get_object(Bucket="refuses", Key=f"t/_delta_log/{1:020d}.json")["Body"]
    assert kept.read() == theirs
    assert open_table(table).version() == 2
    assert sorted(open_table(table).to_pyarrow_table().column("x").to_pylist()) == [0, 2]


def test_spark_never_overwrites_a_commit_another_writer_made_on_a_bucket(s3: S3Server) -> None:
    # What delta-rs does above, for Spark's writes (a stateless pipeline's sink): another
    # writer commits version 1 between Spark's look at the table and its put of version 1.
    # lowmark's log store puts conditionally, loses, and Delta commits version 2; delta-spark's
    # own S3SingleDriverLogStore would put unconditionally and overwrite the other commit.
    client = s3.client()
    client.create_bucket(Bucket="spark-refused")
    table = "s3a://spark-refused/t"
    write_deltalake(table, pa.table({"x": [0]}), storage_options=delta_rs_options(table))
    theirs = b'{"commitInfo":{"operation":"OTHER WRITER","isBlindAppend":true}}\n'
    s3.race("spark-refused", f"t/_delta_log/{1:020d}.json", theirs)
    args = [sys.executable, "-m", "tests.faults.spark_append", table, "2"]
    done = subprocess.run(
        args, env=lowmark_env(None, **s3.env), cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]

    kept = client.get_object(Bucket="spark-refused", Key=f"t/_delta_log/{1:020d}.json")["Body"]
    assert kept.read() == theirs
    assert open_table(table).version() == 2
    assert sorted(open_table(table).to_pyarrow_table().column("x").to_pylist()) == [0, 2]


def test_files_tasks_write_into_a_table_on_a_bucket_are_committed_and_read_back(
    s3: S3Server,
) -> None:
    # What a keyed step's and deduplication's tasks do (lowmark.state.task_appends), here
    # on the driver: the store is reached the same way from an executor.
    s3.create_bucket("appends")
    table = DriverTable("s3a://appends/keyed_timers", TIMER_INDEX, partition_by=TIMER_PARTITIONS)
    table.create()
    rows = [
        {"timer_ms": 1000 * i, "key": f"[{i}]", "_lowmark_bucket": i % 2, "pending": True,
         "batch_id": 7, "_lowmark_slot": i % 3 - 1}
        for i in range(6)
    ]  # fmt: skip
    files = write_files(
        table.path, pa.Table.from_pylist(rows, schema=TIMER_INDEX), TIMER_PARTITIONS, 7
    )
    assert table.commit_files(files, "pipeline:keyed_timers", 7)
    assert sorted(table.read().to_pylist(), key=lambda r: r["timer_ms"]) == rows
    assert all(list(s3.keys("appends", f"keyed_timers/{f.path}")) for f in files)


def test_a_windowed_pipeline_on_a_bucket_writes_what_a_local_run_writes(
    s3: S3Server, reference: tuple[Path, Snapshot]
) -> None:
    case = _on_new_bucket(s3, reference, "windowed")
    done = _run(s3, case.prefix, case.root)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "batch 5 committed" in done.stdout
    assert differences(case.expected, _tables(snapshot(case.pipeline, case.root))) == []
    assert any(k.startswith("out/_delta_log/") for k in s3.keys("windowed", "out/"))


@pytest.mark.parametrize(
    ("defined", "given"),
    [(dedup_append, RESENT_INPUT), (keyed_alerts, FIXED_INPUT)],
    ids=["dedup", "keyed"],
)
def test_a_sink_its_pipelines_tasks_write_on_a_bucket_holds_what_a_local_run_writes(
    s3: S3Server, spark: SparkSession, tmp_path: Path, defined: Pipeline, given: list[File]
) -> None:
    """Deduplication's and a keyed step's tasks write their sink's files, the seen ids' and
    the keyed state's on the bucket (``DeltaFilesSink``, ``lowmark.state.task_appends``)."""
    write_input(tmp_path / "input", given, defined)
    run_to_completion(spark, defined, tmp_path / "reference")
    expected = _tables(snapshot(defined, tmp_path / "reference"))
    prefix = s3.create_bucket(defined.name.replace("_", "-"))
    done = _run(s3, prefix, tmp_path / "bucket", defined.name)
    assert done.returncode == 0, done.stderr[-3000:]
    on_it = on_bucket(defined, prefix)
    assert differences(expected, _tables(snapshot(on_it, tmp_path / "bucket"))) == []
    bucket = prefix.removeprefix("s3a://")
    assert any(k.endswith(".parquet") for k in s3.keys(bucket, "out/"))


def test_of_two_runs_at_once_on_a_bucket_one_finishes_and_the_other_stops(
    s3: S3Server, reference: tuple[Path, Snapshot]
) -> None:
    case = _on_new_bucket(s3, reference, "fence")
    # The first runner is frozen right after it claimed batch 0 (its offset log's
    # version 1 is on the bucket).
    claimed = f"_lowmark/session_update/offsets/_delta_log/{1:020d}.json"

    def was_claimed() -> bool:
        return claimed in set(s3.keys("fence", claimed))

    first, second = two_runs_at_once(_run_args(case.root), _env(s3, case.prefix), was_claimed)
    first_err = first.stderr

    assert second.returncode == 0, second.stderr[-3000:]
    assert "batch 0 replayed" in second.stdout and "batch 5 committed" in second.stdout
    assert first.returncode == 2, first_err[-3000:]
    [error] = [line for line in first_err.splitlines() if line.startswith("error:")]
    assert error.startswith("error: batch 0 in ") and "another `lowmark run`" in error
    assert differences(case.expected, _tables(snapshot(case.pipeline, case.root))) == []


def test_a_run_killed_on_a_bucket_is_replayed_to_what_a_run_never_killed_writes(
    s3: S3Server, reference: tuple[Path, Snapshot]
) -> None:
    case = _on_new_bucket(s3, reference, "killed")
    # Killed with the batch's state and sink written and its commit not: the replay must
    # restore the state and skip the sink write that landed.
    kill = {KILL_AT_ENV: str(KillPoint("before_commit", 3))}
    killed = _run(s3, case.prefix, case.root, **kill)
    assert killed.returncode == KILLED, killed.stderr[-3000:]
    commits = open_table(f"{case.prefix}/_lowmark/session_update/commits")
    assert max(commits.to_pyarrow_table().column("batch_id").to_pylist()) == 2
    replayed = _run(s3, case.prefix, case.root)
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert "batch 3 replayed" in replayed.stdout
    assert differences(case.expected, _tables(snapshot(case.pipeline, case.root))) == []


CHANGED_BY_MAINTENANCE = ("commits", "state_windows history")
"""What maintenance rightly changes: its OPTIMIZE commits are versions of the state table,
so the state versions the commits record move too. Every row of every table stays."""


def test_maintenance_on_a_bucket_compacts_vacuums_and_drops_old_log_files(
    spark: SparkSession,
    s3: S3Server,
    reference: tuple[Path, Snapshot],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    case = _on_new_bucket(s3, reference, "maintained")
    done = _run(s3, case.prefix, case.root)
    assert done.returncode == 0, done.stderr[-3000:]
    state = "_lowmark/session_update/state_windows"
    before = set(s3.keys("maintained", state))
    # An hour later: every object is past the log retention (a minute), and data files
    # removed from now on are past maintenance's retention.
    assert s3.age("maintained", "", timedelta(hours=1)) > 0
    monkeypatch.setattr("lowmark.state.maintenance.KEEP_HOURS", 0)

    maintained = maintain_checkpoint(spark, case.pipeline, case.root)

    assert maintained is not None and maintained.tables > 0
    after = set(s3.keys("maintained", state))
    data = {k for k in after if k.endswith(".parquet") and "/_delta_log/" not in k}
    # OPTIMIZE merged the state's files, VACUUM deleted the merged ones from the bucket,
    # and the log files before the new checkpoint are gone.
    assert len(data) == len(open_table(f"{case.prefix}/{state}").file_uris())
    assert len(data) < len({k for k in before if k.endswith(".parquet") and "_delta_log" not in k})
    logs = sorted(k for k in after if k.startswith(f"{state}/_delta_log/") and k.endswith(".json"))
    assert f"{state}/_delta_log/{0:020d}.json" not in logs
    assert any(k.endswith(".checkpoint.parquet") for k in after)
    now = _tables(snapshot(case.pipeline, case.root))
    kept = [n for n in case.expected.keys() | now.keys() if n not in CHANGED_BY_MAINTENANCE]
    want = {n: case.expected.get(n, Counter()) for n in kept}
    assert differences(want, {n: now.get(n, Counter()) for n in kept}) == []
