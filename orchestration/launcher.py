"""The run launcher of lowmark's Dagster instance: runs go to the warm runner when it runs.

``RunnerLauncher`` is the ``run_launcher`` of lowmark's ``dagster.yaml``. While a
runner (``lowmark.orchestration.runner``, started by ``lowmark ui`` or ``lowmark
serve``) serves the instance, ``launch_run`` hands it the run: a file named by the
run id in the runner's queue folder (``RunnerFiles.queue``), which the runner takes
and executes in its own process, on its warm Spark. With no runner serving, the run
starts a process of its own, as Dagster's default launcher does, and its log says
why.

The process executing a run is recorded on it (``RUN_PID_TAG``): the runner's,
or the process of its own the runner started for a run its Spark cannot take.
Dagster's run monitoring asks ``check_run_worker_health``: a run whose process is
gone is failed, and the pipeline's sensor replays its batch (exactly once: every
write of a batch is idempotent). A run handed over that never started is taken by
the next runner on its start, or failed by run monitoring's start timeout.

No PySpark here: every process that opens the instance loads its launcher.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from dagster._core.launcher import DefaultRunLauncher
from dagster._core.launcher.base import (
    CheckRunHealthResult,
    LaunchRunContext,
    RunLauncher,
    WorkerStatus,
)
from dagster._serdes import ConfigurableClass, ConfigurableClassData

RUN_PID_TAG = "lowmark/run_pid"
"""The pid of the process executing a run the runner took (its own, or a run's own)."""
RUNNER_PID_TAG = "lowmark/runner_pid"
"""The pid of the runner a run was handed to."""


@dataclass(frozen=True)
class RunnerFiles:
    """Where a runner and the launcher meet: a folder in the instance's home."""

    folder: Path

    @classmethod
    def of(cls, home: str | Path) -> RunnerFiles:
        return cls(Path(home) / "runner")

    @property
    def pid_file(self) -> Path:
        """The serving runner's pid; absent (or naming a dead process): no runner serves."""
        return self.folder / "runner.pid"

    @property
    def queue(self) -> Path:
        """Runs handed over and not yet taken: an empty file each, named by the run id."""
        return self.folder / "queue"

    @property
    def cancel(self) -> Path:
        """Runs to stop (a terminate from the UI): an empty file each, named by the run id."""
        return self.folder / "cancel"

    def serving(self) -> int | None:
        """The pid of the runner serving the instance, or None."""
        try:
            pid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        return pid if alive(pid) else None

    def put(self, folder: Path, run_id: str) -> None:
        """Drop ``run_id`` into ``folder`` (written, then renamed: a reader never sees half)."""
        folder.mkdir(parents=True, exist_ok=True)
        part = folder / f".{run_id}.part"
        part.touch()
        part.rename(folder / run_id)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (and is not a zombie, where ``/proc`` can say)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] != "Z"


class RunnerLauncher(RunLauncher, ConfigurableClass):
    """Hands each run to the instance's warm runner when one serves it; else launches it as
    Dagster's ``DefaultRunLauncher`` does (a process per run, started by the code server)."""

    def __init__(self, inst_data: ConfigurableClassData | None = None) -> None:
        self._inst_data = inst_data
        self._default = DefaultRunLauncher()
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {}

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> RunnerLauncher:
        return cls(inst_data=inst_data)

    def register_instance(self, instance: dg.DagsterInstance) -> None:
        super().register_instance(instance)
        self._default.register_instance(instance)

    def _files(self) -> RunnerFiles:
        return RunnerFiles.of(self._instance.root_directory)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        files = self._files()
        pid = files.serving()
        if pid is None:
            self._instance.report_engine_event(
                "no lowmark runner serves this instance (`lowmark ui`, `lowmark serve`): the "
                "run starts a process of its own",
                run,
                cls=self.__class__,
            )
            self._default.launch_run(context)
            return
        self._instance.add_run_tags(run.run_id, {RUNNER_PID_TAG: str(pid)})
        files.put(files.queue, run.run_id)
        self._instance.report_engine_event(
            f"handed to the lowmark runner (pid {pid})", run, cls=self.__class__
        )

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        if RUNNER_PID_TAG not in run.tags:
            return self._default.terminate(run_id)
        self._instance.report_run_canceling(run)
        files = self._files()
        files.put(files.cancel, run_id)
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        """A run the runner took is running while its process lives; one launched by the
        default launcher is taken as running (that launcher offers no check)."""
        pid = run.tags.get(RUN_PID_TAG)
        if pid is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING)
        if alive(int(pid)):
            return CheckRunHealthResult(WorkerStatus.RUNNING, run_worker_id=pid)
        return CheckRunHealthResult(
            WorkerStatus.FAILED,
            f"the process executing the run (pid {pid}) exited; the pipeline's sensor "
            "replays its batch",
            run_worker_id=pid,
        )

    def dispose(self) -> None:
        self._default.dispose()

    def join(self, timeout: int = 30) -> None:
        self._default.join(timeout)
