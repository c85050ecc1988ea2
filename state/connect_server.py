"""A Spark Connect server with Delta: one long-lived Spark that lowmark's processes share.

Each local lowmark process otherwise starts a Spark JVM of its own, which
costs tens of seconds (a Dagster run's start, every Materialize, every
backfill). A server started once takes their work instead: a process that
connects to it (``LOWMARK_SPARK_MASTER=sc://host:port``) starts no JVM, and
its session is ready in well under a second.

A server runs Python as whoever started it, so it serves only clients that
present its token (Spark Connect's pre-shared token: the server reads it from
``SPARK_CONNECT_AUTHENTICATE_TOKEN``, its pyspark clients from the same
variable). Each server gets a random one, kept off every command line (``ps``
shows those to every local account): the server's environment holds it, its
clients are handed it in theirs (``client_env``), and ``lowmark spark-connect``
keeps it in a file only its owner reads (``token_from_file``). pyspark sends a
token without TLS only to the host name ``localhost`` (gRPC's local
credentials, which check that the peer is on this machine), so the address
given to clients of a server on loopback names ``localhost``.

The server is pyspark's own ``bin/spark-submit`` running ``SparkConnectServer``
(its jar, ``spark-connect_2.13``, ships in pyspark's ``jars/``) in local mode or
against a cluster's master, with the confs a local lowmark session has
(``lowmark.state.session.jvm_confs``: Delta's jars, extension and catalog, the
driver memory, S3A when an S3 endpoint is set, then the user's settings:
spark-defaults.conf, lowmark.toml's ``[spark]``, ``PYSPARK_SUBMIT_ARGS``'s confs,
``--conf``). It is a JVM in a process group of its own, bound to one interface
and port. Its Python workers (a keyed step, deduplication, a UDF)
run this interpreter, with ``python_path`` first on their ``PYTHONPATH``, so
they import a project's modules as the client does.

``lowmark ui`` starts one for the runs it launches (docs/dagster.md, "A shared
Spark"); ``lowmark spark-connect`` runs one in the foreground for a deployment
(docs/deploy.md). What lowmark does differently over Spark Connect is in
docs/deploy.md, "Spark Connect".
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyspark

from lowmark.state.errors import LowmarkError
from lowmark.state.session import CONNECT_SCHEME, SparkSettings, jvm_confs

SPARK_HOME = Path(pyspark.__file__).parent
"""pyspark's folder: its ``bin/`` and ``jars/`` are a Spark distribution's."""
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
"""Where the server (Spark's ``Connect.getAuthenticateToken``) and its pyspark clients
(``ChannelBuilder.token``) read the token when no conf or URL gives one."""
TOKEN_CONF = "spark.connect.authenticate.token"
_THIS_MACHINE = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::")
"""Bind addresses a client on this machine reaches as ``localhost``."""


def new_token() -> str:
    """A random token for one server (256 bits)."""
    return secrets.token_urlsafe(32)


def token_from_file(path: Path) -> str:
    """The token ``path`` holds; when there is no such file, a new one written there, readable
    by its owner only (mode 0600). Raises ``TokenFileExposed`` when group or others may read
    ``path`` or it holds no token."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise TokenFileExposed(
                f"{path}: group or others may read this Spark Connect token file "
                f"(mode {mode:o}): chmod 600 {path}, or delete it for a new token"
            ) from None
        token = path.read_text().strip()
        if not token:
            raise TokenFileExposed(f"{path}: no token in it: delete it for a new one") from None
        return token
    token = new_token()
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` nobody listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class ConnectServer:
    """A Spark Connect server process (``start``), its address and its log."""

    process: subprocess.Popen[bytes]
    host: str
    port: int
    log: Path
    token: str

    @property
    def url(self) -> str:
        """The address clients are given (``LOWMARK_SPARK_MASTER``): ``localhost`` for a server
        this machine reaches on loopback, as pyspark sends a token without TLS there only.
        It holds no token, so it may be shown."""
        host = "localhost" if self.host in _THIS_MACHINE else self.host
        return f"{CONNECT_SCHEME}{host}:{self.port}"

    def client_env(self) -> dict[str, str]:
        """The environment a lowmark process needs to be this server's client: its address
        and its token."""
        return {"LOWMARK_SPARK_MASTER": self.url, TOKEN_ENV: self.token}

    @classmethod
    def start(
        cls,
        log: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        cores: str = "*",
        confs: dict[str, str] | None = None,
        python_path: Sequence[Path] = (),
        token: str | None = None,
        master: str | None = None,
    ) -> ConnectServer:
        """Start a server on ``host``:``port`` (default: a free one) running ``cores``
        local cores, or the executors of the cluster at ``master`` (``spark://...``); its
        output goes to ``log``. Returns at once: ``wait_until_up`` waits for it. ``confs``
        win over every other layer (``LOWMARK_SPARK_CONFS``'s too; lowmark.state.spark_confs).
        It serves only clients presenting ``token``
        (default: a new random one), which its environment holds; ``TokenOnCommandLine``
        when ``confs`` would put a token on its command line instead."""
        if TOKEN_CONF in (confs or {}):
            raise TokenOnCommandLine(
                f"{TOKEN_CONF}: a conf goes on the server's command line, which ps shows to "
                "every local account: leave it out (lowmark spark-connect --token-file)"
            )
        port = port or free_port(host)
        token = token or new_token()
        if master is not None and master.startswith(CONNECT_SCHEME):
            raise NotAClusterMaster(
                f"--master {master}: a Spark Connect server runs Spark itself; give it a "
                "cluster's master (spark://host:7077) or none (local)"
            )
        settings = SparkSettings().with_confs(confs or {})
        server_confs = {
            **jvm_confs(settings).values,
            "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(port),
        }
        args = [
            str(SPARK_HOME / "bin" / "spark-submit"),
            *("--master", master or f"local[{cores}]", "--name", "lowmark-spark-connect"),
            *("--class", SERVER_CLASS),
            *(arg for k, v in server_confs.items() for arg in ("--conf", f"{k}={v}")),
            "spark-internal",
        ]
        inherited = os.environ.get("PYTHONPATH")
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            TOKEN_ENV: token,
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(
                [*map(str, python_path), *([inherited] if inherited else [])]
            ),
        }
        if host in ("127.0.0.1", "localhost") and master is None:
            # A cluster's executors must reach the driver: it binds where Spark decides.
            env["SPARK_LOCAL_IP"] = "127.0.0.1"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            process = subprocess.Popen(
                args,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C reaches its starter only
            )
        return cls(process, host, port, log, token)

    def answers(self) -> bool:
        """True once the server takes connections."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def wait_until_up(self, timeout_s: float = 180) -> None:
        """Return once the server takes connections; raise ``ServerDidNotStart`` with the
        end of its log if it exited or did not answer within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            if self.answers():
                return
            time.sleep(0.5)
        tail = self.log.read_text(errors="replace").strip().splitlines()[-5:]
        self.stop()
        raise ServerDidNotStart(
            f"the Spark Connect server at {self.url} did not start (log {self.log}): "
            + " | ".join(tail)
        )

    def stop(self, grace_s: float = 30) -> None:
        """SIGTERM the server's process group, SIGKILL it after ``grace_s``."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=grace_s)
                break
            except subprocess.TimeoutExpired:
                continue
        self.process.wait()


class ServerDidNotStart(LowmarkError):
    """The Spark Connect server exited or did not answer in time."""


class NotAClusterMaster(LowmarkError):
    """A server was given a Spark Connect endpoint as its master."""


class TokenOnCommandLine(LowmarkError):
    """The server's token was given as a conf, which its command line would show."""


class TokenFileExposed(LowmarkError):
    """A Spark Connect token file others may read, or one without a token."""
