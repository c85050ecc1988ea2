"""The Spark Connect server lowmark starts serves only clients that present its token.

The tests with a real server are `integration`: its start and its clients' take over a
minute on a busy machine (156 s measured on two shared cores).

A real server (``tests.spark_connect``: ``lowmark spark-connect`` on loopback, its token
in the file it names) and real pyspark clients, each in a process of its own; one of them
runs as another local account, as an attacker on a shared machine would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lowmark.state.connect_server import (
    SERVER_CLASS,
    TOKEN_CONF,
    TOKEN_ENV,
    ConnectServer,
    TokenFileExposed,
    TokenOnCommandLine,
    token_from_file,
)
from tests.helpers import command_line, descendants
from tests.spark_cluster import SparkCluster
from tests.spark_connect import RunningServer, start_server

COUNT = (
    "import sys; from pyspark.sql import SparkSession; "
    "print(SparkSession.builder.remote(sys.argv[1]).getOrCreate().range(3).count())"
)
"""A client's first query: prints 3 when the server serves it."""
CONF = (
    "import sys; from pyspark.sql import SparkSession; "
    "print(SparkSession.builder.remote(sys.argv[1]).getOrCreate().conf.get(sys.argv[2]))"
)
"""A client that prints its session's value of a conf."""
MEMORY = "spark.driver.memory"
REFUSED = "UNAUTHENTICATED"
"""The gRPC status the server answers a client without the right token with."""


def test_a_token_file_is_created_readable_by_its_owner_only_and_read_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "connect" / "spark-connect.token"
    token = token_from_file(path)

    assert path.stat().st_mode & 0o777 == 0o600
    assert len(token) >= 32
    assert token_from_file(path) == token


def test_a_token_file_others_may_read_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "spark-connect.token"
    path.write_text("a-token\n")
    path.chmod(0o644)

    with pytest.raises(TokenFileExposed, match=f"chmod 600 {path}"):
        token_from_file(path)


def test_a_token_given_as_a_conf_is_refused_as_ps_would_show_it(tmp_path: Path) -> None:
    with pytest.raises(TokenOnCommandLine, match=TOKEN_CONF):
        ConnectServer.start(tmp_path / "log", confs={TOKEN_CONF: "visible-in-ps"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    started = start_server(tmp_path_factory.mktemp("spark_connect"))
    yield started
    started.stop()


def _client(url: str, env: dict[str, str], conf: str | None = None) -> subprocess.Popen[str]:
    """A pyspark client of ``url`` with ``env`` only (no token this process may hold): it
    prints its count, or, given the key ``conf``, its session's value of that conf."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **env}
    args = [CONF, url, conf] if conf is not None else [COUNT, url]
    return subprocess.Popen(
        [sys.executable, "-c", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _outcome(client: subprocess.Popen[str]) -> tuple[str, str]:
    out, err = client.communicate(timeout=300)
    return out.strip(), err[-2000:]


@pytest.mark.integration
@pytest.mark.slow
def test_only_a_client_with_the_servers_token_is_served(server: RunningServer) -> None:
    # Started together: each client's Python and pyspark start takes seconds.
    served = _client(server.url, {TOKEN_ENV: server.token})
    in_url = _client(f"{server.url}/;token={server.token}", {})
    no_token = _client(server.url, {})
    wrong = _client(server.url, {TOKEN_ENV: "not-" + server.token})

    assert _outcome(served)[0] == "3"
    assert _outcome(in_url)[0] == "3"
    for refused in (no_token, wrong):
        out, err = _outcome(refused)
        assert out == "" and REFUSED in err, err


@pytest.mark.integration
@pytest.mark.slow
def test_neither_the_address_nor_a_command_line_of_the_server_holds_its_token(
    server: RunningServer,
) -> None:
    assert server.token not in server.url
    for pid in [server.command.pid, *descendants(server.command.pid)]:
        assert server.token not in command_line(pid)


@pytest.mark.integration
@pytest.mark.slow
def test_a_conf_given_to_spark_connect_is_its_sessions_and_sizes_its_jvm(
    server: RunningServer,
) -> None:
    # start_server gives `--conf spark.driver.memory=1g`; lowmark's default is 4g.
    client = _client(server.url, server.client_env(), MEMORY)
    assert _outcome(client)[0] == "1g"
    (jvm,) = (p for p in descendants(server.command.pid) if SERVER_CLASS in command_line(p))
    assert "-Xmx1g" in command_line(jvm).split()


@pytest.fixture
def another_account() -> Iterator[str]:
    """A throwaway local account (created here, deleted after): needs root, as CI has."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("creating another local account needs root and useradd")
    name = f"lmprobe{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
    )
    yield name
    subprocess.run(["userdel", name], check=False)


@pytest.mark.integration
@pytest.mark.slow
def test_another_local_account_is_refused_and_cannot_read_the_token(
    server: RunningServer, another_account: str
) -> None:
    python, path = _interpreter_for(another_account)
    as_other = ["runuser", "-u", another_account, "--", "env", "-i", "HOME=/tmp", *path]

    attempt = subprocess.run(
        [*as_other, python, "-c", COUNT, server.url], capture_output=True, text=True, timeout=300
    )
    assert attempt.stdout.strip() == "" and REFUSED in attempt.stderr, attempt.stderr[-2000:]
    # Nor can it find the token: not in the server's environment, nor in its file.
    (jvm,) = (p for p in descendants(server.command.pid) if SERVER_CLASS in command_line(p))
    for secret in (f"/proc/{jvm}/environ", str(server.token_file)):
        peek = subprocess.run([*as_other, "cat", secret], capture_output=True, text=True)
        assert peek.returncode != 0 and server.token not in peek.stdout, secret


def _interpreter_for(account: str) -> tuple[str, list[str]]:
    """A Python ``account`` may run that imports this venv's pyspark, and the environment
    entry that puts the venv's packages on its path: the venv's own interpreter when
    ``account`` can run it, else the system's of the same version (a venv's interpreter
    may live in a home folder others cannot enter)."""
    packages = sysconfig.get_paths()["purelib"]
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [sys.executable, *(f"{bin}/{version}" for bin in ("/usr/local/bin", "/usr/bin"))]
    for python in candidates:
        probe = ["runuser", "-u", account, "--", python, "-c", "pass"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            return python, [f"PYTHONPATH={packages}"]
    pytest.skip(f"no Python {sys.version_info[:2]} the account {account} may run")


@pytest.mark.integration
def test_a_server_given_a_cluster_s_master_runs_its_queries_there_with_its_confs(
    tmp_path: Path,
) -> None:
    cluster = SparkCluster.start(tmp_path / "cluster")
    try:
        server = start_server(tmp_path, master=cluster.master_url, confs=cluster.driver_confs())
        try:
            client = _client(server.url, server.client_env())
            assert _outcome(client) == ("3", "")
            apps = cluster.state()["activeapps"]
        finally:
            server.stop()
    finally:
        cluster.stop()
    assert [app["name"] for app in apps] == ["lowmark-spark-connect"]
    # Its executors are as its --conf spark.executor.memory asked, not Spark's 1 GB.
    assert apps[0]["memoryperexecutor"] == 512
