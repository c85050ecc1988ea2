"""A real Spark standalone cluster on loopback for tests: one master and two one-core workers.

Started from the pyspark package's own ``bin/spark-class`` (the deploy classes ship in its
jars), each daemon a JVM of its own in its own process group, all bound to 127.0.0.1 on
free ports. A driver reaches it with ``--master`` set to ``master_url`` and the confs of
``driver_confs``; executors run the driver's Python (``PYSPARK_PYTHON``), which sees the
same folders, as a cluster's workers see a shared file system.

    cluster = SparkCluster.start(tmp_path)
    try: ...  # lowmark --master cluster.master_url ...
    finally: cluster.stop()
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lowmark.state.connect_server import SPARK_HOME, free_port
from tests.helpers import REPO

WORKERS = 2


@dataclass
class SparkCluster:
    folder: Path
    port: int
    ui_port: int
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @staticmethod
    def driver_confs() -> dict[str, str]:
        """What a driver on this machine needs to take the cluster's executors: loopback
        addresses, executors small enough for two to fit, one core each."""
        return {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": str(WORKERS),
        }

    @classmethod
    def start(cls, folder: Path) -> SparkCluster:
        """The master, then the workers; returns once the master lists every worker alive."""
        cluster = cls(folder, free_port(), free_port())
        folder.mkdir(parents=True, exist_ok=True)
        master = ("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1")
        cluster._daemon(
            "master", *master, "--port", str(cluster.port), "--webui-port", str(cluster.ui_port)
        )
        for i in range(WORKERS):
            cluster._daemon(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
                *("--webui-port", str(free_port()), "--work-dir", str(folder / f"work{i}")),
                cluster.master_url,
            )
        cluster._wait_for_workers(timeout_s=120)
        return cluster

    def _daemon(self, name: str, *args: str) -> None:
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_LOG_DIR": str(self.folder),
            # The executors' Python tasks import the pipelines' code (a keyed step's
            # processor in ``examples``) from this checkout, as a deployment ships its code.
            "PYTHONPATH": str(REPO),
        }
        log = (self.folder / f"{name}.log").open("wb")
        self.daemons.append(
            subprocess.Popen(
                [str(SPARK_HOME / "bin" / "spark-class"), *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def state(self) -> dict[str, Any]:
        """The master's own account of the cluster (its web UI's ``/json``): workers alive,
        applications running and completed."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json", timeout=5) as r:
            state: dict[str, Any] = json.load(r)
        return state

    def applications(self) -> int:
        """How many applications (drivers) have run on the cluster, or run now."""
        state = self.state()
        return len(state.get("activeapps", [])) + len(state.get("completedapps", []))

    def _wait_for_workers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.state().get("aliveworkers", 0) >= WORKERS:
                    return
            except OSError:
                pass
            if any(d.poll() is not None for d in self.daemons):
                break
            time.sleep(1)
        logs = {p.name: p.read_text(errors="replace")[-1500:] for p in self.folder.glob("*.log")}
        self.stop()
        raise RuntimeError(f"the Spark cluster did not come up: {logs}")

    def stop(self) -> None:
        for daemon in reversed(self.daemons):
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
        for daemon in self.daemons:
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
