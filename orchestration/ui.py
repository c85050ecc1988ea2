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

With a shared Spark (``lowmark ui``'s default when no Spark master is set), a
Spark Connect server (``lowmark.state.connect_server``) starts beside it and
every run, sensor tick and backfill connects to it (``LOWMARK_SPARK_MASTER``,
and its token in their environment, never on a command line): a run's start
costs no JVM. It stops after the runs, which may need it to
finish their batch.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import dagster as dg
from dagster._core.instance.ref import InstanceRef

from lowmark.orchestration.runs import IN_FLIGHT
from lowmark.state.connect_server import ConnectServer

DAGSTER = Path(sys.executable).parent / "dagster"
PROJECT = Path(__file__).resolve().parents[1]
"""The lowmark project: its ``dagster.yaml`` is the default instance configuration."""


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
    ) -> DagsterDev:
        """Start ``dagster dev`` over ``workspace`` with its instance in ``home``; its output
        goes to ``output`` (default: this process's). With ``shared_spark``, a Spark Connect
        server on loopback too (its log: ``home``/spark-connect.log), which every process
        ``dagster dev`` starts is pointed at and given the token of."""
        env = {**os.environ, **(env or {}), "DAGSTER_HOME": str(prepare_home(home))}
        spark = None
        if shared_spark:
            folders = [Path.cwd(), workspace.parent]  # the runs' Python finds the project here
            spark = ConnectServer.start(home / "spark-connect.log", python_path=folders)
            env.update(spark.client_env())
        process = subprocess.Popen(
            [str(DAGSTER), "dev", "-w", str(workspace), "-h", host, "-p", str(port)],
            cwd=workspace.parent,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            start_new_session=True,  # its own group: a terminal's Ctrl-C reaches lowmark only
        )
        return cls(process, f"http://{host}:{port}", home, spark)

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
        """The pids of the group's live processes (zombies excluded)."""
        self.process.poll()  # reap dagster dev itself if it exited
        return live_group_members(self.process.pid)

    def stop(self, grace_s: float = 10, idle_grace_s: float = 2) -> float:
        """SIGTERM the whole group, SIGKILL what is left after ``grace_s`` (``idle_grace_s``
        when no run is in flight), then stop the shared Spark; the seconds it took until no
        process was left."""
        started = time.monotonic()
        if not self.runs_in_flight():
            grace_s = idle_grace_s
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace_s
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self.processes():
                break
        self.process.wait()
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
