"""Dagster on Postgres: the instance ``lowmark init --dagster-storage postgres`` writes keeps
its runs, event logs and schedules in a real PostgreSQL server the tests start
(``tests/postgres_server.py``), named by the ``DAGSTER_PG_*`` variables.

- cheap: the project's instance opens on Postgres, a run and its events land in its
  tables, and not one SQLite file is made; the default project's instance stays SQLite;
- integration: ``lowmark ui`` on that instance — a sensor-driven following run takes files
  as they land; the daemon is SIGKILLed mid-stream (``dagster dev`` then stops, and is
  started again on the same instance) while a file lands, and the sensor goes on with
  nothing lost or doubled (the sink against a plain Spark batch over every file); a
  backfill launched through GraphQL as the UI launches it completes; the sensor's ticks,
  the runs and their events are rows in Postgres.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster._core.instance.ref import InstanceRef
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lowmark.orchestration.cli import main
from lowmark.orchestration.instance import POSTGRES_VARIABLES
from tests.helpers import delta_frame, per_window, tick, write_json_lines
from tests.orchestration.dagster_dev import DagsterDev, command_line, start_ui, wait_for
from tests.orchestration.pipelines import SCHEMA
from tests.orchestration.workspace import LAUNCH_BACKFILL, backfill_params, partition_range
from tests.postgres_server import USER, PostgresServer

TICKS = dg.AssetKey(["lowmark", "ticks"])
HOUR_0 = "2026-01-01-00:00"


@pytest.fixture
def dagster_pg(postgres: PostgresServer, pg_database: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ``DAGSTER_PG_*`` variables naming the test's database, set in this process (and
    so in the processes it starts); the database's name."""
    values = ("127.0.0.1", str(postgres.port), USER, "", pg_database)
    for name, value in zip(POSTGRES_VARIABLES, values, strict=True):
        monkeypatch.setenv(name, value)
    return pg_database


def initialized_home(folder: Path, *storage: str) -> Path:
    """The Dagster instance folder of a project ``lowmark init`` made in ``folder``."""
    with pytest.raises(SystemExit) as done:
        main(["init", str(folder), *storage])
    assert done.value.code == 0
    return folder / "dagster_home"


def test_an_init_postgres_instance_keeps_runs_and_events_in_postgres_and_no_sqlite(
    tmp_path: Path, postgres: PostgresServer, dagster_pg: str
) -> None:
    home = initialized_home(tmp_path / "proj", "--dagster-storage", "postgres")

    @dg.asset
    def numbers() -> int:
        return 1

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        run_id = dg.materialize([numbers], instance=instance).run_id
    [(status,)] = postgres.rows(dagster_pg, f"SELECT status FROM runs WHERE run_id = '{run_id}'")
    assert status == "SUCCESS"
    events = postgres.rows(
        dagster_pg, f"SELECT dagster_event_type FROM event_logs WHERE run_id = '{run_id}'"
    )
    assert ("ASSET_MATERIALIZATION",) in events
    assert list(home.rglob("*.db")) == []

    # The default stays Dagster's own: SQLite files in the instance folder.
    default = initialized_home(tmp_path / "default") / "dagster.yaml"
    assert "storage" not in yaml.safe_load(default.read_text())


def launch_backfill(dev: DagsterDev, key: dg.AssetKey, partitions: list[str]) -> str:
    """Launch a backfill of ``key``'s ``partitions`` through GraphQL as the UI does; its id."""
    body = {"query": LAUNCH_BACKFILL, "variables": backfill_params(key, partitions)}
    request = urllib.request.Request(
        f"{dev.url}/graphql",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.load(response)["data"]["launchPartitionBackfill"]
    assert answer["__typename"] == "LaunchBackfillSuccess", answer
    return str(answer["backfillId"])


def final_windows(spark: SparkSession, folder: Path) -> DataFrame:
    """``ticks``' windows over every file in ``folder`` as one plain Spark batch: those the
    newest event time closed (end + 10 s allowed lateness at most that time)."""
    df = spark.read.schema(SCHEMA).json(str(folder))
    newest = df.agg(F.max("ts")).first()[0]  # type: ignore[index]
    windows = per_window(
        df,
        "user",
        F.window("ts", "10 seconds"),
        F.count(F.lit(1)).alias("count"),
        F.sum("amount").alias("sum_amount"),
    )
    return windows.where(F.col("window_end") + F.expr("INTERVAL 10 SECONDS") <= F.lit(newest))


def rows_in(dev: DagsterDev) -> int:
    """The records ``ticks``' batches read, summed over the batches Dagster recorded."""
    total = 0
    for record in dev.materializations(TICKS):
        assert record.asset_materialization is not None
        total += int(str(record.asset_materialization.metadata["rows_in"].value))
    return total


def rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted(
        tuple(r) for r in df.select("user", "window_start", "count", "sum_amount").collect()
    )


@pytest.mark.slow
@pytest.mark.integration
def test_on_postgres_a_following_run_a_killed_daemon_and_a_ui_backfill_lose_and_double_nothing(
    spark: SparkSession, tmp_path: Path, postgres: PostgresServer, dagster_pg: str
) -> None:
    home = initialized_home(tmp_path / "proj", "--dagster-storage", "postgres")
    data_root, log, incoming = tmp_path / "data", tmp_path / "lowmark-ui.log", "ticks/in"
    data_root.mkdir()
    dev = start_ui(home, data_root, log, {})
    try:
        # A sensor run takes the first file, then follows the source: the second is its too.
        write_json_lines(data_root / incoming, "f0.json", [tick("a", 1, 1), tick("a", 30, 2)], 1)
        wait_for("the first file's batch", lambda: rows_in(dev) == 2, dev)
        write_json_lines(
            data_root / incoming, "f1.json", [tick("a", 3600, 3), tick("b", 3605, 4)], 2
        )
        wait_for("the second file's batch", lambda: rows_in(dev) == 4, dev)
        [run_id] = {r.run_id for r in dev.materializations(TICKS)}

        # The daemon dies mid-stream: dagster dev stops all of it, the following run too.
        [daemon] = [p for p in dev.group() if "dagster._daemon" in command_line(p)]
        os.kill(daemon, signal.SIGKILL)
        dev.ui.wait(120)
        assert "dagster-daemon process shut down unexpectedly" in log.read_text()

        # A file lands while nothing runs; started again on the same instance, the sensor
        # (its state in Postgres) launches a run for it, which follows the next file.
        write_json_lines(data_root / incoming, "f2.json", [tick("c", 7200, 6)], 3)
        dev = start_ui(home, data_root, log, {})
        wait_for(
            "a batch of a run after the restart",
            lambda: {r.run_id for r in dev.materializations(TICKS)} - {run_id},
            dev,
        )
        write_json_lines(data_root / incoming, "f3.json", [tick("b", 10_800, 5)], 4)
        expected = rows(final_windows(spark, data_root / incoming))
        sink = data_root / "ticks/out"
        wait_for(
            "the sink to hold every closed window, once",
            lambda: sink.exists() and rows(delta_frame(spark, sink)) == expected,
            dev,
        )
        progress = delta_frame(spark, data_root / "_lowmark/ticks/progress").collect()
        batches = [r.batch_id for r in progress]
        assert sorted(batches) == list(range(len(batches)))  # each batch committed once
        assert rows_in(dev) == 6  # and every record read by one of them

        backfill_id = launch_backfill(dev, TICKS, [HOUR_0])
        backfilled = wait_for(
            "the backfill's run",
            lambda: dev.runs(
                tags={"dagster/backfill": backfill_id}, statuses=[dg.DagsterRunStatus.SUCCESS]
            ),
            dev,
        )
        assert [partition_range(r) for r in backfilled] == [(HOUR_0, HOUR_0)]
        assert rows(delta_frame(spark, sink)) == expected  # the slice replaced by itself

        # All of it is in Postgres: the runs, their events, the sensor's ticks (from before
        # and after the restart), the backfill; no SQLite file anywhere in the instance.
        runs = {r.run_id for r in dev.runs()}
        assert {r for (r,) in postgres.rows(dagster_pg, "SELECT run_id FROM runs")} == runs
        materialized = postgres.rows(
            dagster_pg,
            "SELECT DISTINCT run_id FROM event_logs WHERE dagster_event_type = "
            "'ASSET_MATERIALIZATION'",
        )
        assert {run_id, backfilled[0].run_id} <= {r for (r,) in materialized}
        launched = postgres.rows(
            dagster_pg, "SELECT count(*) FROM job_ticks WHERE status = 'SUCCESS'"
        )
        assert launched[0][0] >= 2
        backfill = f"SELECT status FROM bulk_actions WHERE key = '{backfill_id}'"
        wait_for(
            "the backfill to complete",
            lambda: postgres.rows(dagster_pg, backfill) == [("COMPLETED_SUCCESS",)],
            dev,
            seconds=60,
        )
        assert list(home.rglob("*.db")) == []
    finally:
        dev.stop()
