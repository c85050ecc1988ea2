"""A real Spark Connect server on loopback for tests, started as a user starts one:
``lowmark spark-connect`` (``lowmark.state.connect_server``) in a process of its own, with
two local cores, a 1 GB heap and queries evaluated without generated code (as in the
suite's own session); its log under ``folder``.

    server = start_server(tmp_path)
    try: ...  # lowmark with server.client_env() in its environment
    finally: server.stop()
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from lowmark.state.connect_server import TOKEN_ENV, free_port
from tests.helpers import INTERPRETED

LOWMARK = Path(sys.executable).parent / "lowmark"


@dataclass
class RunningServer:
    """``lowmark spark-connect`` running, the address it printed and the token in the file
    it named."""

    command: subprocess.Popen[str]
    url: str
    token_file: Path
    token: str

    def client_env(self) -> dict[str, str]:
        """What a client's environment needs: the address and the token."""
        return {"LOWMARK_SPARK_MASTER": self.url, TOKEN_ENV: self.token}

    def stop(self) -> None:
        """SIGTERM the command (it stops its server), as Ctrl-C does."""
        self.command.send_signal(signal.SIGTERM)
        self.command.wait(timeout=60)


def start_server(
    folder: Path, master: str | None = None, confs: dict[str, str] | None = None
) -> RunningServer:
    """The server, returned once it takes connections (the command printed its JSON): on two
    local cores, or on the cluster at ``master``; ``confs`` over the suite's."""
    confs = {**INTERPRETED, "spark.driver.memory": "1g", **(confs or {})}
    args = [str(LOWMARK), "--data-root", str(folder), "spark-connect", "--json"]
    args += ["--port", str(free_port())]
    args += ["--master", master] if master else ["--cores", "2"]
    args += [arg for k, v in confs.items() for arg in ("--conf", f"{k}={v}")]
    command = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert command.stdout is not None
    line = command.stdout.readline()  # the JSON once up; nothing if it exited
    if not line:
        _, error = command.communicate(timeout=60)
        raise RuntimeError(f"lowmark spark-connect did not start: {error[-2000:]}")
    token_file = Path(json.loads(line)["token_file"])
    return RunningServer(
        command, json.loads(line)["url"], token_file, token_file.read_text().strip()
    )
