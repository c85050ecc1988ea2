"""The ``dagster.yaml`` of a project's Dagster instance, with its storage in SQLite or Postgres.

Both are lowmark's own ``dagster.yaml`` (the run queue, one run per pipeline, run
monitoring): one copy of those settings. Postgres storage adds the ``storage:`` block of
``templates/dagster-postgres.yaml``, whose connection comes from ``DAGSTER_PG_*``
environment variables (the names Dagster's own deployment docs use), so no password is
written into the project. No Dagster import: ``lowmark init``'s options are read by fast
commands too.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

LOWMARK_SETTINGS = Path(__file__).resolve().parents[1] / "dagster.yaml"
"""lowmark's own instance settings (SQLite storage, Dagster's default)."""
POSTGRES_STORAGE = Path(__file__).resolve().parent / "templates" / "dagster-postgres.yaml"
"""The ``storage:`` block for Postgres, with the comment that says what it needs."""
POSTGRES_VARIABLES = (
    "DAGSTER_PG_HOST",
    "DAGSTER_PG_PORT",
    "DAGSTER_PG_USERNAME",
    "DAGSTER_PG_PASSWORD",
    "DAGSTER_PG_DB",
)
"""What every process opening a Postgres-backed instance must have in its environment."""


class DagsterStorage(StrEnum):
    """Where a Dagster instance keeps its runs, event logs and schedules."""

    SQLITE = "sqlite"
    """SQLite files in the instance folder."""
    POSTGRES = "postgres"
    """One Postgres database, reached through ``POSTGRES_VARIABLES``."""


def instance_settings(storage: DagsterStorage) -> str:
    """A project's ``dagster.yaml``: lowmark's own, its opening comment (about lowmark's own
    instance) replaced by one about the project's, plus the ``storage:`` block ``storage``
    needs (none for SQLite, Dagster's default)."""
    lines = LOWMARK_SETTINGS.read_text().splitlines(keepends=True)
    body = "".join(lines[next(i for i, line in enumerate(lines) if not line.startswith("#")) :])
    opening = "# This project's Dagster instance (DAGSTER_HOME is this folder; see lowmark.toml):\n"
    if storage is DagsterStorage.POSTGRES:
        return (
            f"{opening}# Postgres storage (below), queued runs, one run per pipeline at a time.\n"
            f"\n{POSTGRES_STORAGE.read_text()}\n{body}"
        )
    sqlite = "# SQLite storage beside this file, queued runs, one run per pipeline at a time.\n"
    production = "# For production: Postgres storage (`lowmark init --dagster-storage postgres`).\n"
    return opening + sqlite + production + body
