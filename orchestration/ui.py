"""The Dagster UI (``dagster dev``) with a clean start and a clean stop, and the Spark its
runs share.

``dagster dev`` runs a webserver, a daemon, a code server and, per run, a
process. Sent SIGTERM or SIGINT, it does not stop them all: with Dagster 1.13
the runs end, but ``dagster dev``, its webserver, daemon and code server stay
up. So lowmark starts it in a process group of its own and stops the group
itself: SIGTERM to every process in it (a run following the source finishes
its batch and ends), then SIGKILL to what is left after ``grace`` seconds. A
batch killed then is replayed by the next run with the same offsets, as after
any crash.

With the warm runner (``lowmark ui``'s default: ``lowmark.orchestration.runner``), one
more process executes every run on one Spark it starts and warms with the UI; it
leads a process group of its own, stopped with ``dagster dev``'s (SIGTERM: its runs
end after their batch), and is started again if it dies.

With a shared Spark (``lowmark ui --no-runner``'s default when no Spark master is set), a
Spark Connect server (``lowmark.state.connect_server``) starts beside it and
every run, sensor tick and backfill connects to it (``LOWMARK_SPARK_MASTER``,
and its token in their environment, never on a command line): a run's start
costs no JVM. It stops after the runs, which may need it to
finish their batch.

Its terminal is quiet (``ConsoleFeed``): ``dagster dev``'s output — every run's
events, the daemon's ticks, Dagster's warnings — goes to ``UI_LOG`` in the
instance folder, and the terminal gets what a person watches for: each
pipeline's runs starting and ending, a sensor's reason to skip when it changes,
and errors.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO

import dagster as dg
from dagster._core.instance.ref import InstanceRef

from lowmark.orchestration.keys import GROUP, PIPELINE_TAG
from lowmark.orchestration.runs import IN_FLIGHT
from lowmark.state.connect_server import ConnectServer

DAGSTER = Path(sys.executable).parent / "dagster"
LOWMARK = Path(sys.executable).parent / "lowmark"
PROJECT = Path(__file__).resolve().parents[1]
"""The lowmark project: its ``dagster.yaml`` is the default instance configuration."""
RUNNER_STEADY_S = 60
"""A runner that exits sooner after its start twice in a row is not started again."""
UI_LOG = "lowmark-ui.log"
"""``dagster dev``'s output, in the instance folder (appended to, start after start)."""


def prepare_home(home: Path) -> Path:
    """``home`` as a Dagster instance folder: created, with lowmark's ``dagster.yaml`` unless
    it has one already."""
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copy(PROJECT / "dagster.yaml", home / "dagster.yaml")
    # Its storage is created here, once, under a lock: the webserver, daemon and code
    # server of a new SQLite instance would each create it at the same moment, and so may
    # a `lowmark run` reporting to it while `lowmark ui` starts; two may stamp its schema
    # ("alembic_version has more than one head present", seen on a loaded machine).
    with (home / ".lowmark-storage.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))):
            pass
    return home


@dataclass
class DagsterDev:
    """A running ``dagster dev`` and every process it started (one process group)."""

    process: subprocess.Popen[bytes]
    url: str
    home: Path
    spark: ConnectServer | None = None
    """The shared Spark its runs connect to; None: each run starts its own."""
    log: Path | None = None
    """The file its output goes to (None: elsewhere)."""
    log_start: int = 0
    """Where in ``log`` its output begins (the file is appended to, start after start)."""
    runner: subprocess.Popen[bytes] | None = None
    """The warm runner executing every run (``lowmark serve``, leading a process group of
    its own); None: a process per run."""
    runner_start: Callable[[], subprocess.Popen[bytes]] | None = None
    runner_started_at: float = 0.0
    """When the runner last started (``time.monotonic``)."""
    quick_exit: bool = False
    """The runner before the current one exited within ``RUNNER_STEADY_S`` of its start."""

    @classmethod
    def start(
        cls,
        home: Path,
        port: int,
        host: str = "127.0.0.1",
        workspace: Path = PROJECT / "workspace.yaml",
        env: dict[str, str] | None = None,
        output: IO[str] | None = None,
        shared_spark: bool = False,
        log: Path | None = None,
        runner: bool = False,
    ) -> DagsterDev:
        """Start ``dagster dev`` over ``workspace`` with its instance in ``home``; its output
        goes to ``output``, or is appended to ``log`` (default: this process's). With
        ``shared_spark``, a Spark Connect server on loopback too (its log:
        ``home``/spark-connect.log), which every process ``dagster dev`` starts is pointed at
        and given the token of. With ``runner``, the warm runner too (``lowmark serve``, in
        a process group of its own, its output with ``dagster dev``'s), started now so
        its Spark warms while the UI starts."""
        env = {**os.environ, **(env or {}), "DAGSTER_HOME": str(prepare_home(home))}
        spark = None
        if shared_spark:
            folders = [Path.cwd(), workspace.parent]  # the runs' Python finds the project here
            spark = ConnectServer.start(home / "spark-connect.log", python_path=folders)
            env.update(spark.client_env())
        start = 0
        with contextlib.ExitStack() as opened:
            if log is not None:  # `dagster dev` keeps a descriptor of its own
                output = opened.enter_context(log.open("a"))
                start = output.tell()  # before it writes: the descriptors share one offset
            process = subprocess.Popen(
                [str(DAGSTER), "dev", "-w", str(workspace), "-h", host, "-p", str(port)],
                cwd=workspace.parent,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT if output is not None else None,
                start_new_session=True,  # its own group: a terminal's Ctrl-C reaches lowmark only
            )
        dev = cls(process, f"http://{host}:{port}", home, spark, log, start)
        if runner:
            to = log

            def start_runner() -> subprocess.Popen[bytes]:
                with to.open("a") if to is not None else contextlib.nullcontext(output) as out:
                    return subprocess.Popen(
                        [str(LOWMARK), "serve"],
                        cwd=workspace.parent,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT if out is not None else None,
                        start_new_session=True,  # a group of its own, stopped with the UI's
                    )

            dev.runner_start = start_runner
            dev.start_runner()
        return dev

    def start_runner(self) -> None:
        """Start the warm runner (again: after it exited)."""
        assert self.runner_start is not None, "started without a runner"
        self.runner = self.runner_start()
        self.runner_started_at = time.monotonic()

    def runner_exited(self) -> str | None:
        """When the runner has exited: what ``lowmark ui`` says of it, after starting another
        unless this one and the one before each ran less than ``RUNNER_STEADY_S`` (a runner
        that cannot start Spark would be started again and again: runs then start processes
        of their own; one killed once early is started again)."""
        if self.runner is None or self.runner.poll() is None:
            return None
        code = self.runner.returncode
        quick = time.monotonic() - self.runner_started_at < RUNNER_STEADY_S
        if quick and self.quick_exit:
            self.runner = None
            return (
                f"the lowmark runner exited ({code}) within {RUNNER_STEADY_S} s of its start, "
                f"twice (its log: {self.log or 'above'}): runs start processes of their own"
            )
        self.quick_exit = quick
        self.start_runner()
        return (
            f"the lowmark runner exited ({code}): started another, which fails the runs it "
            "left (their sensors replay them) and takes the queued ones"
        )

    @contextlib.contextmanager
    def feed(self) -> Iterator[ConsoleFeed]:
        """What to print of this ``dagster dev`` (started with a ``log``) while it serves."""
        assert self.log is not None, "a ConsoleFeed reads the log DagsterDev.start was given"
        with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(self.home))) as instance:
            yield ConsoleFeed(instance, self.log, offset=self.log_start)

    def answers(self) -> bool:
        """True once the webserver serves requests."""
        try:
            with urllib.request.urlopen(f"{self.url}/server_info", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def wait_until_up(self, timeout_s: float = 180) -> bool:
        """Wait for the webserver (and the shared Spark); False if it did not answer in
        time or ``dagster dev`` exited. Raises ``ServerDidNotStart`` when the shared Spark
        did not start."""
        deadline = time.monotonic() + timeout_s
        if self.spark is not None:
            self.spark.wait_until_up(timeout_s)
        while time.monotonic() < deadline and self.process.poll() is None:
            if self.answers():
                return True
            time.sleep(0.5)
        return False

    def runs_in_flight(self) -> int:
        """How many runs the instance has queued or in progress."""
        with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(self.home))) as instance:
            return len(instance.get_run_records(dg.RunsFilter(statuses=IN_FLIGHT)))

    def processes(self) -> list[int]:
        """The pids of the live processes (zombies excluded) of its groups: ``dagster dev``'s
        and the runner's."""
        self.process.poll()  # reap dagster dev itself if it exited
        if self.runner is not None:
            self.runner.poll()
        return [pid for group in self._groups() for pid in live_group_members(group)]

    def _groups(self) -> list[int]:
        return [self.process.pid, *([self.runner.pid] if self.runner is not None else [])]

    def stop(self, grace_s: float = 10, idle_grace_s: float = 2) -> float:
        """SIGTERM both groups (``dagster dev``'s, the runner's), SIGKILL what is left after
        ``grace_s`` (``idle_grace_s`` when no run is in flight), then stop the shared Spark;
        the seconds it took until no process was left."""
        started = time.monotonic()
        if not self.runs_in_flight():
            grace_s = idle_grace_s
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for group in self._groups():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, sig)
            deadline = time.monotonic() + grace_s
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self.processes():
                break
        self.process.wait()
        if self.runner is not None:
            self.runner.wait()
        if self.spark is not None:
            self.spark.stop(grace_s)
        return time.monotonic() - started


def live_group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group ``pgid``.

    Reads ``/proc`` where there is one (a zombie is not alive, though ``kill``
    still finds it until reaped); elsewhere asks ``killpg`` whether any
    process is left, and names the group leader for all of them.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry.name))
    return members


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} - "  # Dagster's log records, colours cut
    r"(?P<logger>\S+) - (?P<level>[A-Z]+) - (?P<message>.*)$"
)
_RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_RUN_EVENT = re.compile(rf"^\S+ - {_RUN_ID.pattern} - ")
"""A run's own event (``job - run id - …``): the run's line says how it ended."""
_SKIPPED = re.compile(r"^Sensor (?P<sensor>\S+) skipped: (?P<reason>.*)$")
_TRACEBACK_HEADINGS = (
    "Traceback (most recent call last):",
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_ENDED = {
    dg.DagsterRunStatus.SUCCESS: "succeeded",
    dg.DagsterRunStatus.FAILURE: "failed",
    dg.DagsterRunStatus.CANCELED: "canceled",
}


@dataclass
class ConsoleFeed:
    """The lines ``lowmark ui`` prints while it serves, read from ``dagster dev``'s log
    (``log``) and its ``instance``; each ``poll`` returns the new ones:

    - each run that started or ended since the feed began: ``ticks: run 1a2b3c4d started
      (ticks_sensor)``, ``… succeeded in 42 s``, ``… failed: <the error's first line>``,
      by pipeline (its tag, else the sink it materializes, else its job);
    - a sensor's skip reason, when it differs from the one it gave before (unless it
      names a run: the run's lines say it);
    - errors: a log record at ERROR or CRITICAL, and the exception line of a traceback
      (a run's own error events excepted: its line says how it ended).
    """

    instance: dg.DagsterInstance
    log: Path
    offset: int = 0
    """Where in ``log`` the next poll reads from."""
    since: datetime = field(default_factory=lambda: datetime.now(UTC))
    """Runs updated since then are read (moved on as runs are)."""
    _partial: str = ""
    _in_error: bool = False
    _in_run_event: bool = False
    _skips: dict[str, str] = field(default_factory=dict)
    _said: dict[str, dg.DagsterRunStatus] = field(default_factory=dict)

    def poll(self) -> list[str]:
        """What happened since the last poll, a line each, oldest first."""
        return [*self._log_lines(), *self._run_lines()]

    def _log_lines(self) -> list[str]:
        try:
            with self.log.open("rb") as f:
                f.seek(self.offset)
                text = self._partial + f.read().decode(errors="replace")
                self.offset = f.tell()
        except FileNotFoundError:
            return []
        *lines, self._partial = text.split("\n")
        return [said for line in lines if (said := self._notice(_ANSI.sub("", line)))]

    def _notice(self, line: str) -> str | None:
        """What to print of one line of the log, if anything."""
        record = _RECORD.match(line)
        if record is None:  # a record's continuation, or a process's raw output
            if line.startswith(_TRACEBACK_HEADINGS[0]) and not self._in_run_event:
                self._in_error = True  # a logged error's, or a process's own
            exception = self._in_error and line.strip() and not line[0].isspace()
            if exception and not line.startswith(_TRACEBACK_HEADINGS):
                return f"error: {line}"
            return None
        logger, level, message = record["logger"], record["level"], record["message"]
        self._in_run_event = bool(_RUN_EVENT.match(message))
        self._in_error = level in ("ERROR", "CRITICAL") and not self._in_run_event
        skipped = _SKIPPED.match(message)
        if skipped and self._skips.get(skipped["sensor"]) != skipped["reason"]:
            self._skips[skipped["sensor"]] = skipped["reason"]
            # Skipped for a run in flight: that run's own lines say so.
            return None if _RUN_ID.search(skipped["reason"]) else message
        return f"error: {logger}: {message}" if self._in_error else None

    def _run_lines(self) -> list[str]:
        updated = self.instance.get_run_records(dg.RunsFilter(updated_after=self.since))
        if updated:  # a margin for clocks and equal timestamps: `_said` drops repeats
            newest = max(r.update_timestamp for r in updated)
            self.since = max(self.since, newest - timedelta(seconds=10))
        lines = []
        for record in reversed(updated):  # oldest first
            run = record.dagster_run
            if run.status not in (dg.DagsterRunStatus.STARTED, *_ENDED):
                continue
            if self._said.get(run.run_id) == run.status:
                continue
            self._said[run.run_id] = run.status
            lines.append(f"{_pipeline(run)}: run {run.run_id[:8]} {self._how(record)}")
        return lines

    def _how(self, record: dg.RunRecord) -> str:
        """How the run stands: started (by whom), or how it ended and after how long."""
        run = record.dagster_run
        if run.status == dg.DagsterRunStatus.STARTED:
            by = run.tags.get("dagster/sensor_name") or run.tags.get("dagster/backfill")
            return "started" + (f" ({by})" if by else "")
        took = ""
        if record.start_time is not None and record.end_time is not None:
            took = f" in {record.end_time - record.start_time:.0f} s"
        how = _ENDED[run.status] + took
        if run.status == dg.DagsterRunStatus.FAILURE:
            how += f": {self._failure(run.run_id)}"
        return how

    def _failure(self, run_id: str) -> str:
        """The first line of the error a failed run's step raised (the innermost cause),
        else of its failure event."""
        for entry in self.instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
            event = entry.dagster_event
            error = event.step_failure_data.error if event is not None else None
            while error is not None and error.cause is not None:
                error = error.cause
            if error is not None:
                return error.message.strip().splitlines()[0]
        for entry in self.instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE):
            return entry.message.strip().splitlines()[0]
        return "see its log in the UI"


def _pipeline(run: dg.DagsterRun) -> str:
    """The pipeline a run runs: its tag (sensor, jobs), else the sink it materializes (the
    UI's Materialize), else its job's name."""
    if PIPELINE_TAG in run.tags:
        return run.tags[PIPELINE_TAG]
    sinks = [
        k.path[1] for k in run.asset_selection or () if len(k.path) == 2 and k.path[0] == GROUP
    ]
    return sinks[0] if sinks else run.job_name
