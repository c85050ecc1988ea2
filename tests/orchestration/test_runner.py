"""The warm runner ``lowmark ui`` starts: every pipeline's runs in one process, on one Spark.

End to end through ``lowmark ui`` (a real ``dagster dev`` and its daemon; the runner
beside it):

- the runs the sensors of two pipelines launch execute in the runner's process, not in
  one of their own, and their sinks hold the files' rows;
- a batch in the runner runs on a session with the Spark confs ``lowmark ui --conf`` and
  the project's ``lowmark.toml`` (``[spark]``) gave, ``--conf`` winning;
- a run whose Spark settings the warm Spark cannot change gets a process of its own;
- a run terminated from the UI ends canceled after its batch, and the runner serves on;
- the runner killed mid-batch: ``lowmark ui`` starts another, which fails the run the dead
  one left; the sensor replays its batch and the sink holds each row once.

The tests share one server, started in a project with Spark confs given both ways, and
run in file order; the kill comes last.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient
from pyspark.sql import SparkSession

from lowmark.batches.cli.logs import log_file
from lowmark.orchestration.errors import SparkSettingsFixed
from lowmark.orchestration.launcher import RUN_PID_TAG, RunnerFiles, alive
from lowmark.orchestration.resources import SparkResource, fixed_settings, lent_session
from tests.helpers import delta_frame, tick, write_json_lines
from tests.orchestration.dagster_dev import DagsterDev, command_line, start_ui, wait_for
from tests.orchestration.pipelines import HOLD, SESSION

TICKS = dg.AssetKey(["lowmark", "ticks"])
SLOW = dg.AssetKey(["lowmark", "slow"])
RUN_PROCESS = "execute_run"
"""In the command line of a process Dagster starts for one run."""
SHUFFLE = "spark.sql.shuffle.partitions"
DISCOVERY = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
PROJECT_SPARK = {SHUFFLE: "5", DISCOVERY: "2"}
"""The project's ``[spark]`` table: lowmark's defaults are 4 and 4; ``--conf`` gives 7."""
GIVEN = f"{SHUFFLE}=7"
"""``lowmark ui --conf``."""


def test_a_static_conf_needs_a_spark_of_its_own_and_a_runtime_one_does_not(
    spark: SparkSession,
) -> None:
    assert fixed_settings(spark, None, {"spark.sql.shuffle.partitions": "3"}) == ""
    assert fixed_settings(spark, None, {"spark.driver.memory": "1g"}) == "spark.driver.memory=1g"
    same = spark.conf.get("spark.sql.extensions")
    assert same is not None
    assert fixed_settings(spark, None, {"spark.sql.extensions": same}) == ""
    assert fixed_settings(spark, "spark://elsewhere:7077", {}).startswith(
        "master spark://elsewhere:7077"
    )


def test_a_lent_session_takes_a_runs_runtime_confs_and_refuses_its_static_ones_in_one_line(
    spark: SparkSession,
) -> None:
    lent = spark.newSession()
    with lent_session(lent):
        session = SparkResource(confs={"spark.sql.shuffle.partitions": "3"}).session()
        assert session is lent and lent.conf.get("spark.sql.shuffle.partitions") == "3"
        assert spark.conf.get("spark.sql.shuffle.partitions") != "3"  # the run's own session
        with pytest.raises(SparkSettingsFixed, match=r"spark.driver.memory=1g.*--no-runner"):
            SparkResource(confs={"spark.driver.memory": "1g"}).session()


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagsterDev]:
    base = tmp_path_factory.mktemp("runner")
    (base / "data").mkdir()
    table = "".join(f'"{key}" = "{value}"\n' for key, value in PROJECT_SPARK.items())
    (base / "lowmark.toml").write_text(
        f'pipelines = "tests.orchestration.pipelines"\n[spark]\n{table}'
    )
    args = ("--conf", GIVEN)
    dev = start_ui(base / "home", base / "data", base / "lowmark-ui.log", {}, args, cwd=base)
    try:
        yield dev
    finally:
        dev.stop()


def runner_pid(dev: DagsterDev) -> int:
    return wait_for("the runner", lambda: RunnerFiles.of(dev.home).serving(), dev)


def run_processes(dev: DagsterDev) -> list[int]:
    return [p for p in dev.dagster_group() if RUN_PROCESS in command_line(p)]


@pytest.mark.slow
@pytest.mark.integration
def test_the_sensor_runs_of_two_pipelines_execute_in_the_one_runner_process(
    spark: SparkSession, dev: DagsterDev
) -> None:
    pid = runner_pid(dev)
    write_json_lines(dev.data_root / "ticks/in", "f0.json", [tick("a", 1, 1), tick("a", 30, 2)], 1)
    write_json_lines(dev.data_root / "slow/in", "f0.json", [{"id": 1}, {"id": 2}], 1)
    wait_for("batch 0 of ticks", lambda: dev.materializations(TICKS), dev)
    wait_for("batch 0 of slow", lambda: dev.materializations(SLOW), dev)

    runs = [
        *dev.runs(tags={"lowmark/pipeline": "ticks"}),
        *dev.runs(tags={"lowmark/pipeline": "slow"}),
    ]
    assert len(runs) == 2
    assert {r.tags[RUN_PID_TAG] for r in runs} == {str(pid)}
    assert run_processes(dev) == []  # no process of their own
    with dev.instance() as instance:
        started = [
            e.message
            for r in runs
            for e in instance.all_logs(r.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
        ]
    assert sum(f"Started in the lowmark runner (pid: {pid})" in m for m in started) == 2
    ticked = dev.materializations(TICKS)[0]  # batch 0's (emit-only batches may follow)
    assert ticked.asset_materialization.metadata["rows_in"].value == 2  # type: ignore[union-attr]
    slow = delta_frame(spark, str(dev.data_root / "slow/out")).collect()
    assert sorted(r.id for r in slow) == [1, 2]


@pytest.mark.slow
@pytest.mark.integration
def test_a_batch_in_the_runner_has_the_confs_given_to_lowmark_ui_and_in_the_project(
    dev: DagsterDev,
) -> None:
    pid = runner_pid(dev)
    wait_for("batch 0 of slow (the test above)", lambda: dev.materializations(SLOW), dev)
    [ran] = dev.runs(tags={"lowmark/pipeline": "slow"})
    assert ran.tags[RUN_PID_TAG] == str(pid)

    session = json.loads((dev.data_root / SESSION).read_text())  # what its transform saw
    assert session[SHUFFLE] == "7"  # --conf, over the project's 5 and lowmark's 4
    assert session[DISCOVERY] == "2"  # the project's, over lowmark's 4
    # The runner's log names each with its layer, as every command's does.
    logged = log_file(dev.data_root).read_text()
    assert f"{SHUFFLE}=7 (--conf)" in logged and f"{DISCOVERY}=2 (lowmark.toml)" in logged


@pytest.mark.slow
@pytest.mark.integration
def test_a_run_with_a_spark_setting_the_warm_spark_cannot_take_runs_in_its_own_process(
    dev: DagsterDev,
) -> None:
    pid = runner_pid(dev)
    client = DagsterGraphQLClient("127.0.0.1", port_number=int(dev.url.rsplit(":", 1)[1]))
    confs = {"spark.driver.memory": "1g"}
    run_id = client.submit_job_execution(
        "slow_compact", run_config={"resources": {"spark": {"config": {"confs": confs}}}}
    )
    own = wait_for(
        "the run in a process of its own",
        lambda: (run := dev.instance().get_run_by_id(run_id)) and run.is_finished and run,
        dev,
    )
    assert own.status == dg.DagsterRunStatus.SUCCESS
    assert own.tags[RUN_PID_TAG] != str(pid)
    with dev.instance() as instance:
        said = [e.message for e in instance.all_logs(run_id)]
    assert any("process of its own" in m and "spark.driver.memory=1g" in m for m in said)


@pytest.mark.slow
@pytest.mark.integration
def test_a_run_terminated_from_the_ui_ends_canceled_and_the_runner_serves_on(
    dev: DagsterDev,
) -> None:
    pid = runner_pid(dev)
    [following] = [r for r in dev.runs(tags={"lowmark/pipeline": "ticks"}) if not r.is_finished]
    client = DagsterGraphQLClient("127.0.0.1", port_number=int(dev.url.rsplit(":", 1)[1]))
    client.terminate_run(following.run_id)
    ended = wait_for(
        "the terminated run to end",
        lambda: (r := dev.instance().get_run_by_id(following.run_id)) and r.is_finished and r,
        dev,
        seconds=60,
    )
    assert ended.status == dg.DagsterRunStatus.CANCELED
    assert RunnerFiles.of(dev.home).serving() == pid


@pytest.mark.slow
@pytest.mark.integration
def test_the_runner_killed_mid_batch_leaves_its_run_failed_and_the_batch_replayed_once(
    spark: SparkSession, dev: DagsterDev
) -> None:
    killed = runner_pid(dev)
    (dev.data_root / HOLD).touch()
    write_json_lines(dev.data_root / "slow/in", "f1.json", [{"id": 3}, {"id": 4}], 2)
    held = dev.data_root / "HELD.pid"
    wait_for("the slow run to hold mid-batch", held.exists, dev)
    assert int(held.read_text()) == killed  # the batch runs in the runner
    [following] = [r for r in dev.runs(tags={"lowmark/pipeline": "slow"}) if not r.is_finished]
    os.kill(killed, signal.SIGKILL)
    (dev.data_root / HOLD).unlink()

    wait_for(
        "another runner", lambda: (p := RunnerFiles.of(dev.home).serving()) != killed and p, dev
    )
    failed = wait_for(
        "the killed run failed",
        lambda: (r := dev.instance().get_run_by_id(following.run_id)) and r.is_finished and r,
        dev,
    )
    assert failed.status == dg.DagsterRunStatus.FAILURE
    sink = dev.data_root / "slow/out"
    wait_for(
        "the replayed batch",
        lambda: (sink / "_delta_log").is_dir()  # the killed batch may not have created it
        and sorted(r.id for r in delta_frame(spark, str(sink)).collect()) == [1, 2, 3, 4],
        dev,
    )
    replays = [
        r
        for r in dev.runs(tags={"lowmark/pipeline": "slow"})
        if "replay" in r.tags["dagster/run_key"]
    ]
    assert replays and replays[-1].tags[RUN_PID_TAG] != str(killed)
    assert not alive(killed)
