"""A real PostgreSQL server for tests: initdb and pg_ctl from the machine's binaries.

The server keeps its data in a temporary folder, listens on a free loopback
port (no unix socket) and trusts every local connection as the superuser
``lowmark``. Run as root (as in CI's containers), initdb and pg_ctl refuse
to start: they then run as the ``postgres`` OS user (Debian's package makes
it), which owns the folder. Typical use is the session-scoped ``postgres``
fixture in ``tests/conftest.py``; tests take a database of their own
(``PostgresServer.create_database``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from lowmark.state.connect_server import free_port

USER = "lowmark"
"""The server's superuser, which tests connect as."""


def binaries() -> Path:
    """The newest PostgreSQL server binaries' folder (Debian's layout, else initdb on PATH)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError(
            "no PostgreSQL server binaries (initdb): run `make test-setup`, which installs them"
        )
    return Path(initdb).parent


@dataclass(frozen=True)
class PostgresServer:
    folder: Path
    port: int
    bin_dir: Path

    @property
    def env(self) -> dict[str, str]:
        """libpq's variables that reach this server (a database still to choose)."""
        return {"PGHOST": "127.0.0.1", "PGPORT": str(self.port), "PGUSER": USER}

    @classmethod
    def start(cls) -> PostgresServer:
        """initdb a new cluster in a temporary folder and start it (a few seconds)."""
        folder = Path(tempfile.mkdtemp(prefix="lowmark-postgres-"))
        server = cls(folder, free_port(), binaries())
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres", "postgres")
        server._as_owner(
            "initdb", "-D", str(folder / "data"), "-U", USER, "--auth=trust", "-E", "UTF8",
            "--no-sync", "--locale=C",
        )  # fmt: skip
        options = f"-p {server.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories="
        options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        server._as_owner(
            "pg_ctl", "-D", str(folder / "data"), "-l", str(folder / "log"), "-o", options,
            "-w", "start",
        )  # fmt: skip
        return server

    def stop(self) -> None:
        self._as_owner("pg_ctl", "-D", str(self.folder / "data"), "-m", "immediate", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)

    def _as_owner(self, tool: str, *args: str) -> None:
        command: Sequence[str] = [str(self.bin_dir / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{tool} failed: {done.stderr[-2000:]}")

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[tuple[Any, ...]]:
        """An autocommit connection to database ``dbname``."""
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user=USER, dbname=dbname, autocommit=True
        )

    def create_database(self, name: str, template: str = "template0") -> None:
        """A new, empty database ``name`` (or a copy of database ``template``)."""
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')

    def rows(self, dbname: str, query: str) -> list[tuple[Any, ...]]:
        """What ``query`` returns in database ``dbname``."""
        with self.connect(dbname) as conn:
            return list(conn.execute(query.encode()).fetchall())
