"""A real Spark Connect server on loopback for tests, with Delta in it.

Started from the pyspark package's own ``bin/spark-submit`` running
``SparkConnectServer`` (its jar, ``spark-connect_2.13``, ships in pyspark's
``jars/``), with lowmark's Delta jars, Delta's session extension and catalog, and
local executors: a JVM of its own, in its own process group, bound to 127.0.0.1 on a
free port. Its Python workers run this interpreter, which sees the same folders.

    server = ConnectServer.start(tmp_path)
    try: ...  # lowmark --master server.url ...
    finally: server.stop()
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lowmark.state import jars
from tests.helpers import INTERPRETED
from tests.spark_cluster import SPARK_HOME, free_port

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


@dataclass
class ConnectServer:
    folder: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, folder: Path, cores: int = 2) -> ConnectServer:
        """The server, returned once it takes connections on its port."""
        folder.mkdir(parents=True, exist_ok=True)
        port = free_port()
        confs = {
            **INTERPRETED,
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": "4",
            "spark.ui.enabled": "false",
            "spark.driver.memory": "1g",
        }
        args = [
            str(SPARK_HOME / "bin" / "spark-submit"),
            *("--master", f"local[{cores}]", "--class", SERVER_CLASS),
            *("--jars", ",".join(jars.delta_jars(jars.jars_dir()))),
            *(arg for k, v in confs.items() for arg in ("--conf", f"{k}={v}")),
            "spark-internal",
        ]
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            # The server's Python workers (a keyed step, deduplication) run this interpreter.
            "PYSPARK_PYTHON": sys.executable,
        }
        log = (folder / "connect_server.log").open("wb")
        process = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        server = cls(folder, port, process)
        server._wait_for_port(timeout_s=120)
        return server

    def _wait_for_port(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.5)
        log = (self.folder / "connect_server.log").read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"the Spark Connect server did not come up: {log}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
