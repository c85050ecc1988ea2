"""A lowmark project: a folder whose ``lowmark.toml`` names its pipelines, its data root
and its Dagster instance (``lowmark init`` makes one).

``lowmark`` run in the folder, or in any folder below it, uses that project.
Each setting is taken from the first of these that gives it:

==============  ===============  ===================  ================================
lowmark.toml    flag             environment          without any of them
==============  ===============  ===================  ================================
pipelines       ``--pipelines``  LOWMARK_PIPELINES    the demo (``batches.demo``)
data_root       ``--data-root``  LOWMARK_DATA_ROOT    ``./data``
dagster_home    (none)           DAGSTER_HOME         unset (``lowmark ui``: ./.dagster_home)
==============  ===============  ===================  ================================

so: flag > environment > ``lowmark.toml`` > lowmark's default. The file works by
filling in the environment variables that are unset (``Project.use``), so every
process lowmark starts — ``dagster dev``, its code server, the runs — sees the
same project. Paths in the file are relative to its folder, and the folder goes
on ``sys.path`` (as Dagster's ``working_directory`` does): ``pipelines = "pipelines"``
names ``pipelines.py`` beside the file, and a YAML transform can name a module there.
"""

from __future__ import annotations

import os
import sys
import tomllib
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestration.errors import ProjectFileInvalid

PROJECT_FILE = "lowmark.toml"


class ProjectSettings(BaseModel):
    """What ``lowmark.toml`` holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pipelines: str = Field(
        description="Where the pipelines are defined: a module (pipelines.py in this folder is "
        "`pipelines`; or pkg.module), or a .py or .yaml file relative to this folder."
    )
    data_root: str = Field(default="data", description="Folder relative pipeline paths live under.")
    dagster_home: str = Field(
        default="dagster_home",
        description="Dagster instance folder (its dagster.yaml, then its storage); `lowmark` "
        "reports the batches it runs there.",
    )


@dataclass(frozen=True)
class Project:
    """A ``lowmark.toml`` and the folder it is in (``root``), its paths made absolute."""

    root: Path
    settings: ProjectSettings

    @property
    def pipelines(self) -> str:
        """A module name as written; a file as an absolute path."""
        location = self.settings.pipelines
        if location.endswith((".py", ".yaml", ".yml")):
            return str((self.root / location).resolve())
        return location

    @property
    def data_root(self) -> Path:
        return (self.root / self.settings.data_root).resolve()

    @property
    def dagster_home(self) -> Path:
        return (self.root / self.settings.dagster_home).resolve()

    @property
    def workspace(self) -> Path:
        """The Dagster workspace ``lowmark ui`` serves in this project."""
        return self.root / "workspace.yaml"

    def environment(self) -> dict[str, str]:
        """The environment variables this project sets when they are unset."""
        return {
            "LOWMARK_PIPELINES": self.pipelines,
            "LOWMARK_DATA_ROOT": str(self.data_root),
            "DAGSTER_HOME": str(self.dagster_home),
        }

    def use(
        self, environ: MutableMapping[str, str] = os.environ, path: list[str] = sys.path
    ) -> None:
        """Fill in the unset variables of ``environ`` from this project; put its folder first
        on ``path`` (this process's ``sys.path``)."""
        for name, value in self.environment().items():
            environ.setdefault(name, value)
        if str(self.root) not in path:
            path.insert(0, str(self.root))


def load_project(root: Path) -> Project:
    """The project whose ``lowmark.toml`` is in ``root``; a broken file is one line naming it
    and the field."""
    path = root.resolve() / PROJECT_FILE
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ProjectFileInvalid(f"{path} does not exist; `lowmark init` makes a project") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProjectFileInvalid(f"{path} is not valid TOML: {exc}") from exc
    try:
        settings = ProjectSettings.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(part) for part in err["loc"]) or "(root)"
        raise ProjectFileInvalid(f"{path}: {field}: {err['msg']}") from exc
    return Project(path.parent, settings)


def find_project(start: Path) -> Project | None:
    """The project ``start`` is in: the nearest ``lowmark.toml`` in ``start`` or a folder
    above it (None: not in a project)."""
    start = start.resolve()
    for folder in (start, *start.parents):
        try:
            found = (folder / PROJECT_FILE).is_file()
        except PermissionError:  # a folder above that we may not look into: no project there
            return None
        if found:
            return load_project(folder)
    return None


def project_definitions(root: Path) -> dg.Definitions:
    """The Dagster definitions of the project in ``root`` (its ``definitions.py`` calls this):
    the project fills in the unset environment, then lowmark builds its definitions from
    it, as for ``LOWMARK_PIPELINES`` and ``LOWMARK_DATA_ROOT`` set by hand."""
    load_project(root).use()
    # Imported only now: importing it builds its module-level definitions from the
    # environment, which must name this project's pipelines by then.
    from orchestration.definitions import build_definitions

    return build_definitions()
