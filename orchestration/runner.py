"""The warm runner: one long-lived process that executes the Dagster runs of every pipeline of
an instance on one SparkSession, started and warmed before the first run comes.

``lowmark ui`` starts it beside ``dagster dev`` (``lowmark serve`` runs one on its own).
It says it serves (``RunnerFiles.pid_file``) at once, then starts Spark and warms it
(a tiny Delta write and read, so Delta's classes are loaded and the JVM has run its
first jobs); the launcher (``lowmark.orchestration.launcher``) hands it runs through
its queue folder, and a run handed over while Spark warms waits for it.

Each run is a thread of this process, executed as ``dagster api execute_run`` executes
one in a process of its own (Dagster's ``core_execute_run``: the run's events, logs,
materializations and status are the same), with a session of its own on the one
Spark (``SparkSession.newSession``: its own SQL confs, so one pipeline's idempotent-
write confs never reach another's) lent to the run's ``SparkResource``
(``lowmark.orchestration.resources.lent_session``). A pipeline's runs never overlap (its pool
has one slot, as before); runs of different pipelines run side by side, as their
processes did: a run follows its source for ``LOWMARK_FOLLOW_SECONDS``, so runs taken
one at a time would leave every other pipeline waiting for that long. Their batches take
turns on the Spark (``lowmark.orchestration.turns``: ``LOWMARK_RUNNER_BATCHES`` at a time,
first to find work first); a caught-up run's poll takes none.

A run whose Spark resource asks for a setting this Spark cannot change at runtime (a
static conf such as ``spark.driver.memory``, or another master) gets a process of its
own, as with Dagster's default launcher, and its log says which setting.

Stopping (SIGTERM, SIGINT): every run ends after its batch in progress, as a run
process does on SIGTERM; a terminate from the UI stops that run the same way.
Raw stdout and stderr of the runs are this process's (one stream for every run), so
they are not captured per step; everything a run logs through Dagster is.

A runner that dies leaves no work lost: on its start, a runner fails the runs the dead
one had started (the pipeline's sensor replays their batches, exactly once) and takes
the runs still in the queue; meanwhile run monitoring fails a run whose process is
gone (``RunnerLauncher.check_run_worker_health``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import dagster as dg
from dagster._core.events import EngineEventData
from dagster._core.instance.ref import InstanceRef
from dagster._core.origin import get_python_environment_entry_point
from dagster._grpc.impl import core_execute_run
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import serialize_value
from dagster._utils.hosted_user_process import recon_job_from_origin
from pyspark.sql import SparkSession

from lowmark.orchestration.errors import NotHandedRuns
from lowmark.orchestration.launcher import (
    RUN_PID_TAG,
    RUNNER_PID_TAG,
    RunnerFiles,
    RunnerLauncher,
    alive,
)
from lowmark.orchestration.resources import fixed_settings, lent_session
from lowmark.orchestration.runs import IN_FLIGHT, RUN_STOPS
from lowmark.orchestration.turns import TURNS, runner_batches
from lowmark.state.errors import first_line
from lowmark.state.session import get_spark

log = logging.getLogger(__name__)

POLL_S = 0.2
"""How often the runner looks into its queue and cancel folders."""
UNCAPTURED_LOGS = {
    "compute_logs": {
        "module": "dagster._core.storage.noop_compute_log_manager",
        "class": "NoOpComputeLogManager",
    }
}
"""Dagster captures a step's stdout and stderr by redirecting the process's: runs side by
side in one process would capture one another's, so the runner does not."""


def warm(spark: SparkSession) -> None:
    """Run Spark's first jobs and load Delta: a one-row Delta table written and read back."""
    with tempfile.TemporaryDirectory(prefix="lowmark-warm-") as folder:
        spark.range(1).write.format("delta").save(folder)
        spark.read.format("delta").load(folder).count()


def spark_resource_config(run: dg.DagsterRun) -> tuple[str | None, dict[str, str]]:
    """The master and confs a run's config gives its ``spark`` resource."""
    run_config: Mapping[str, Any] = run.run_config
    config = run_config.get("resources", {}).get("spark", {}).get("config", {})
    return config.get("master"), dict(config.get("confs", {}))


@dataclass
class Runner:
    """Executes the runs handed to ``files`` in ``instance`` on ``spark`` (``serve``)."""

    instance: dg.DagsterInstance
    files: RunnerFiles
    spark: SparkSession
    threads: dict[str, threading.Thread] = field(default_factory=dict)
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    """The processes of their own of the runs this Spark cannot take, by run id."""

    def serve(self, stop: threading.Event) -> None:
        """Take runs from the queue until ``stop`` is set; then stop every run after its batch
        in progress and wait for them."""
        self.adopt()
        while not stop.is_set():
            self.poll()
            stop.wait(POLL_S)
        RUN_STOPS.request()
        for child in list(self.children.values()):  # a run's thread may remove its own
            child.send_signal(signal.SIGTERM)
        for thread in list(self.threads.values()):
            thread.join()

    def poll(self) -> None:
        """Start the runs handed over, stop the runs to cancel."""
        for entry in _entries(self.files.cancel):
            entry.unlink(missing_ok=True)
            RUN_STOPS.request(entry.name)
            child = self.children.get(entry.name)
            if child is not None:
                child.send_signal(signal.SIGTERM)
        for entry in _entries(self.files.queue):
            entry.unlink(missing_ok=True)
            if entry.name in self.threads:
                continue
            thread = threading.Thread(
                target=self.execute_or_fail, args=(entry.name,), name=f"run {entry.name[:8]}"
            )
            self.threads[entry.name] = thread
            thread.start()
        for run_id, thread in list(self.threads.items()):
            if not thread.is_alive():
                del self.threads[run_id]

    def adopt(self) -> None:
        """Fail the in-flight runs a runner that is gone had taken (their batches are replayed
        by the next run, as after any crash); runs it had not taken wait in the queue."""
        me = os.getpid()
        queued = {entry.name for entry in _entries(self.files.queue)}
        for record in self.instance.get_run_records(dg.RunsFilter(statuses=IN_FLIGHT)):
            run = record.dagster_run
            runner_pid = run.tags.get(RUNNER_PID_TAG)
            if runner_pid is None or int(runner_pid) == me or run.run_id in queued:
                continue
            pid = int(run.tags.get(RUN_PID_TAG, runner_pid))
            if run.status == dg.DagsterRunStatus.QUEUED or alive(pid):
                continue
            self.instance.report_run_failed(
                run,
                f"the lowmark runner that executed it (pid {pid}) exited; the pipeline's sensor "
                "replays its batch",
            )

    def execute_or_fail(self, run_id: str) -> None:
        """``execute``; a run it could not execute (a process that would not start) is failed
        with the reason, not left starting."""
        try:
            self.execute(run_id)
        except Exception as exc:
            log.exception("run %s not executed", run_id)
            run = self.instance.get_run_by_id(run_id)
            if run is not None and not run.is_finished:
                self.instance.report_run_failed(
                    run, f"the lowmark runner could not execute it: {first_line(exc)}"
                )

    def execute(self, run_id: str) -> None:
        """Execute run ``run_id``: on this Spark, or in a process of its own when its Spark
        settings need one. Whatever it raises is on the run's log already."""
        run = self.instance.get_run_by_id(run_id)
        if run is not None and run.status == dg.DagsterRunStatus.CANCELING:
            self.instance.report_run_canceled(run, "terminated before it started")
            return
        if run is None or run.status not in (
            dg.DagsterRunStatus.STARTING,
            dg.DagsterRunStatus.NOT_STARTED,
        ):
            log.info("run %s is no longer waiting to start: not executed", run_id)
            return
        master, confs = spark_resource_config(run)
        reason = fixed_settings(self.spark, master, confs)
        if reason:
            self._execute_in_own_process(run, reason)
            return
        pid = os.getpid()
        self.instance.add_run_tags(run_id, {RUN_PID_TAG: str(pid)})
        self.instance.report_engine_event(
            f"Started in the lowmark runner (pid: {pid}), on its warm Spark.",
            run,
            EngineEventData.in_process(pid),
        )
        session = self.spark.newSession()  # the run's confs: set by its SparkResource
        origin = run.job_code_origin
        assert origin is not None, f"run {run_id} has no job origin to load it from"
        try:
            with lent_session(session):
                for _event in core_execute_run(
                    recon_job_from_origin(origin), run, self.instance, inject_env_vars=False
                ):
                    pass
        except Exception:  # reported on the run by core_execute_run
            log.exception("run %s failed", run_id)

    def _execute_in_own_process(self, run: dg.DagsterRun, reason: str) -> None:
        """Run ``run`` as Dagster's default launcher would, in ``dagster api execute_run``."""
        self.instance.report_engine_event(
            f"runs in a process of its own: its Spark settings need a Spark of their own "
            f"({reason}), which the lowmark runner's warm Spark cannot take at runtime",
            run,
        )
        origin = run.job_code_origin
        assert origin is not None, f"run {run.run_id} has no job origin to load it from"
        args = ExecuteRunArgs(
            job_origin=origin,
            run_id=run.run_id,
            instance_ref=self.instance.get_ref(),
            set_exit_code_on_failure=True,
        )
        # This interpreter's dagster: the origin's entry point is a bare `dagster`, for PATH.
        command = [*get_python_environment_entry_point(sys.executable), "api", "execute_run"]
        child = subprocess.Popen([*command, serialize_value(args)])
        self.children[run.run_id] = child
        self.instance.add_run_tags(run.run_id, {RUN_PID_TAG: str(child.pid)})
        child.wait()
        del self.children[run.run_id]


def _entries(folder: Path) -> list[Path]:
    """The run ids dropped into ``folder`` (oldest first), their half-written files left out."""
    try:
        entries = [e for e in folder.iterdir() if not e.name.startswith(".")]
    except FileNotFoundError:
        return []
    return sorted(entries, key=lambda e: e.stat().st_mtime)


def _configure_python_log_handlers_once(instance: dg.DagsterInstance) -> None:
    """Read the instance's ``python_logs`` handlers now, once, for every run to reuse.

    Dagster reads them as each run starts, through ``logging.config.dictConfig``, which
    closes every handler under logging's module lock: beside a run logging (which holds
    its handler's lock, then asks for the module's) the two threads wait for each other
    forever. One process per run never met it."""
    handlers = instance.get_yaml_python_handlers()
    instance.get_yaml_python_handlers = lambda: handlers  # type: ignore[method-assign]


def serve(home: Path, ready: Callable[[], None] = lambda: None) -> None:
    """Serve the Dagster instance in ``home`` until SIGTERM or SIGINT: say so, start and warm
    Spark, call ``ready``, then execute the runs handed over (``Runner``)."""
    files = RunnerFiles.of(home)
    stop = threading.Event()

    def stop_serving(signum: int, frame: FrameType | None) -> None:
        log.info("%s received: runs end after their batch in progress", signal.Signals(signum).name)
        stop.set()

    ref = InstanceRef.from_dir(str(home), overrides=UNCAPTURED_LOGS)
    with dg.DagsterInstance.from_ref(ref) as instance:
        launcher = instance.run_launcher
        if not isinstance(launcher, RunnerLauncher):
            raise NotHandedRuns(
                f"{home / 'dagster.yaml'}: its run_launcher is {type(launcher).__name__}, "
                "which hands no run to a runner; add `run_launcher: {module: "
                "lowmark.orchestration.launcher, class: RunnerLauncher}` to it"
            )
        _configure_python_log_handlers_once(instance)
        TURNS.slots = runner_batches()
        # Serving from now: a run handed over while Spark starts waits for it, which is
        # sooner than a process of its own would start one.
        files.folder.mkdir(parents=True, exist_ok=True)
        files.pid_file.write_text(str(os.getpid()))
        try:
            spark = get_spark()
            # After Spark's start: PySpark's context puts a Ctrl-C handler of its own in place.
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, stop_serving)
            warm(spark)
            log.info("lowmark runner (pid %d) serving %s on a warm Spark", os.getpid(), home)
            ready()
            Runner(instance, files, spark).serve(stop)
        finally:
            if files.pid_file.read_text() == str(os.getpid()):
                files.pid_file.unlink()
