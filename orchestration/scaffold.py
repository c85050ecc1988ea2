"""``lowmark init DIR``: a project of one's own, ready to run.

The project's files come from ``orchestration/templates/`` (``$name`` in
``workspace.yaml`` and ``README.md`` is the project's name, ``$commands`` the three
commands below); its Dagster instance settings are lowmark's own ``dagster.yaml``, with
the storage asked for (``lowmark.orchestration.instance``).
``lowmark.toml`` makes ``lowmark`` run in the folder use the project
(``lowmark.orchestration.project``).
"""

from __future__ import annotations

import json
import re
import stat
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from string import Template

from lowmark.orchestration.errors import ProjectFolderNotEmpty
from lowmark.orchestration.instance import DagsterStorage, instance_settings

TEMPLATES = Path(__file__).resolve().parent / "templates"
PIPELINE = "views_per_minute"
"""The example pipeline, defined in ``templates/pipelines.py``."""

COMMANDS = (
    (
        f"lowmark run {PIPELINE}",
        f"one batch: the files waiting in data/incoming/ → data/{PIPELINE}",
    ),
    (
        f"lowmark run {PIPELINE} --follow",
        "keep going: every file that lands in data/incoming/ is taken (Ctrl-C stops)",
    ),
    ("lowmark ui", "the Dagster UI on http://127.0.0.1:3000 (Ctrl-C stops it)"),
)
"""What to run in the project, with what each does: printed by ``lowmark init`` and in the
project's README."""

SAMPLE = "data/incoming/sample-views.json"
FILES = (
    ("pipelines.py", f"the pipelines: {PIPELINE} (JSON page views → views per page per minute)"),
    ("lowmark.toml", "where lowmark finds the pipelines, the data root and the Dagster instance"),
    ("definitions.py", "the pipelines as Dagster assets, jobs, sensors and schedules"),
    ("workspace.yaml", "the Dagster code location: definitions.py (`lowmark ui` serves it)"),
    ("dagster_home/dagster.yaml", "the Dagster instance's settings"),
    (SAMPLE, "a sample file: 12 page views of the last 3 minutes"),
    ("README.md", "the commands, the files, where lowmark looks"),
    (".gitignore", "leaves data/ and the instance's storage out of git"),
)
"""Every file ``lowmark init`` writes (path in the project, what it is), in the order shown."""


@dataclass(frozen=True)
class Scaffolded:
    """A project ``lowmark init`` made."""

    root: Path
    pipelines: tuple[str, ...] = (PIPELINE,)

    def as_dict(self) -> dict[str, object]:
        """What ``lowmark init --json`` prints."""
        return {
            "project": str(self.root),
            "created": [{"path": path, "what": what} for path, what in FILES],
            "pipelines": list(self.pipelines),
            "commands": [command for command, _ in COMMANDS],
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def init_project(
    folder: Path, now: datetime, storage: DagsterStorage = DagsterStorage.SQLITE
) -> Scaffolded:
    """Write a new project into ``folder`` (made if absent): ``FILES``, with a sample of page
    views timed in the 3 minutes before ``now`` (timezone-aware), its Dagster instance
    keeping its runs in ``storage``.

    ``folder`` must be absent or an empty folder: nothing is ever overwritten.
    """
    root = folder.resolve()
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ProjectFolderNotEmpty(
            f"{folder} is not an empty folder and lowmark init never overwrites: "
            "give a new or empty folder"
        )
    name = re.sub(r"[^A-Za-z0-9_]+", "_", root.name).strip("_") or "lowmark_project"
    fill = {"name": name, "commands": "\n".join(command_lines())}
    contents = {
        "pipelines.py": _template("pipelines.py"),
        "lowmark.toml": _template("lowmark.toml"),
        "definitions.py": _template("definitions.py"),
        "workspace.yaml": Template(_template("workspace.yaml")).substitute(fill),
        "dagster_home/dagster.yaml": instance_settings(storage),
        SAMPLE: _sample_views(now),
        "README.md": Template(_template("README.md")).substitute(fill),
        ".gitignore": _template("gitignore"),
    }
    for path, _ in FILES:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(contents[path])
    # Whatever the umask: a project others may write is refused (``project.check_safe``).
    for made in (root, root / "lowmark.toml"):
        made.chmod(made.stat().st_mode & ~(stat.S_IWGRP | stat.S_IWOTH))
    return Scaffolded(root)


def command_lines() -> list[str]:
    """``COMMANDS`` as aligned lines with their comments (the README's code block)."""
    width = max(len(command) for command, _ in COMMANDS)
    return [f"{command:<{width}}  # {what}" for command, what in COMMANDS]


def _template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def _sample_views(now: datetime) -> str:
    """12 page views, one JSON object a line, 15 s apart, the last one at ``now``."""
    pages = ("/", "/pricing", "/docs")
    users = ("ada", "bob", "cyd", "dee")
    first = now.replace(microsecond=0) - timedelta(seconds=165)
    views = [
        {
            "user": users[i % len(users)],
            "page": pages[i % len(pages)],
            "ts": (first + timedelta(seconds=15 * i)).isoformat().replace("+00:00", "Z"),
        }
        for i in range(12)
    ]
    return "".join(json.dumps(v) + "\n" for v in views)
