"""The run launcher of lowmark's instance: runs go to the warm runner while one serves, and a
run whose process is gone is failed by run monitoring's health check."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef
from dagster._core.launcher.base import LaunchRunContext, WorkerStatus

from lowmark.orchestration.launcher import (
    RUN_PID_TAG,
    RUNNER_PID_TAG,
    RunnerFiles,
    RunnerLauncher,
)
from lowmark.orchestration.ui import prepare_home
from tests.helpers import lowmark


def gone_pid() -> int:
    """The pid of a process that has exited."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def open_instance(home: Path) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home)))


def test_lowmarks_instance_hands_a_run_to_the_runner_serving_it(tmp_path: Path) -> None:
    home = prepare_home(tmp_path / "home")
    files = RunnerFiles.of(home)
    files.folder.mkdir()
    files.pid_file.write_text(str(os.getpid()))  # a live process says it serves
    with open_instance(home) as instance:
        assert isinstance(instance.run_launcher, RunnerLauncher)
        run = instance.add_run(dg.DagsterRun(job_name="ticks_microbatches"))
        instance.run_launcher.launch_run(LaunchRunContext(run, workspace=None))
        assert [p.name for p in files.queue.iterdir()] == [run.run_id]
        handed = instance.get_run_by_id(run.run_id)
        assert handed is not None and handed.tags[RUNNER_PID_TAG] == str(os.getpid())
        said = [e.message for e in instance.all_logs(run.run_id)]
        assert any(f"handed to the lowmark runner (pid {os.getpid()})" in m for m in said)


def test_with_no_live_runner_a_run_goes_to_dagsters_default_launcher(tmp_path: Path) -> None:
    home = prepare_home(tmp_path / "home")
    files = RunnerFiles.of(home)
    files.folder.mkdir()
    files.pid_file.write_text(str(gone_pid()))  # a runner that died
    with open_instance(home) as instance:
        run = instance.add_run(dg.DagsterRun(job_name="ticks_microbatches"))
        # Dagster's default launcher starts the run through the code server of a workspace.
        with pytest.raises(dg.DagsterInvariantViolationError, match="requires a workspace"):
            instance.run_launcher.launch_run(LaunchRunContext(run, workspace=None))
        assert not files.queue.exists()
        said = [e.message for e in instance.all_logs(run.run_id)]
        assert any("no lowmark runner serves this instance" in m for m in said)


def test_a_run_whose_process_is_gone_fails_the_health_check(tmp_path: Path) -> None:
    home = prepare_home(tmp_path / "home")
    with open_instance(home) as instance:
        launcher = instance.run_launcher
        running = dg.DagsterRun(job_name="j", tags={RUN_PID_TAG: str(os.getpid())})
        dead = dg.DagsterRun(job_name="j", tags={RUN_PID_TAG: str(gone_pid())})
        assert launcher.check_run_worker_health(running).status == WorkerStatus.RUNNING
        health = launcher.check_run_worker_health(dead)
        assert health.status == WorkerStatus.FAILED
        assert "exited" in (health.msg or "")


def test_serve_refuses_in_one_line_an_instance_whose_launcher_hands_it_no_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # Dagster's launcher
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    code, _, err = lowmark(capsys, tmp_path / "data", "serve")
    assert code != 0
    assert "its run_launcher is DefaultRunLauncher" in err and "RunnerLauncher" in err
    assert not RunnerFiles.of(home).pid_file.exists()  # it never said it serves
