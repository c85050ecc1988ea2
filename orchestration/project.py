"""A lowmark project: a folder whose ``lowmark.toml`` names its pipelines, its data root
and its Dagster instance (``lowmark init`` makes one).

``lowmark`` run in the folder, or in any folder below it, uses that project.
Each setting is taken from the first of these that gives it:

==============  ===============  ===================  ================================
lowmark.toml    flag             environment          without any of them
==============  ===============  ===================  ================================
pipelines       ``--pipelines``  LOWMARK_PIPELINES    the demo (``lowmark.batches.demo``)
data_root       ``--data-root``  LOWMARK_DATA_ROOT    ``./data``
dagster_home    (none)           DAGSTER_HOME         unset (``lowmark ui``: ./.dagster_home)
spark_master    ``--master``     LOWMARK_SPARK_MASTER ``local[*]``
s3_endpoint     (none)           LOWMARK_S3_ENDPOINT  unset (no object storage)
==============  ===============  ===================  ================================

so: flag > environment > ``lowmark.toml`` > lowmark's default. Its ``[spark]`` table holds
Spark confs (``"spark.sql.shuffle.partitions" = "8"``), one layer of those
``lowmark.state.spark_confs`` merges: over spark-defaults.conf, under
``PYSPARK_SUBMIT_ARGS`` and ``--conf``. The file works by
filling in the environment variables that are unset (``Project.use``), so every
process lowmark starts — ``dagster dev``, its code server, the runs — sees the
same project. Paths in the file are relative to its folder, and the folder goes
on ``sys.path`` (as Dagster's ``working_directory`` does): ``pipelines = "pipelines"``
names ``pipelines.py`` beside the file, and a YAML transform can name a module there.

Using a project runs its code, so, as git does with ``safe.directory``, a
project is refused (``ProjectUnsafe``) when its folder or its ``lowmark.toml``
belongs to another user or others may write it, unless the folder is listed in
``LOWMARK_SAFE_DIRECTORIES`` (folders separated by ``:``, or ``*`` for any).
And its folder goes last on ``sys.path``, after lowmark's own packages are
imported, so a project's ``state.py`` or ``batches.py`` never stands in for
lowmark's modules (nor one of its modules for an installed one).
"""

from __future__ import annotations

import importlib
import json
import os
import stat
import sys
import tomllib
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lowmark.orchestration.errors import ProjectFileInvalid, ProjectUnsafe
from lowmark.state.spark_confs import PROJECT_CONFS_ENV

if TYPE_CHECKING:
    import dagster as dg

PROJECT_FILE = "lowmark.toml"
SAFE_DIRECTORIES_ENV = "LOWMARK_SAFE_DIRECTORIES"
LOWMARK_PACKAGES = ("lowmark",)
"""lowmark's top-level packages (pyproject.toml's): imported before a project's folder goes
on ``sys.path``, so none of its modules is found in the folder instead."""


@dataclass(frozen=True)
class ProjectSettings:
    """What ``lowmark.toml`` holds: strings, each key once, no other key; and a ``[spark]``
    table of Spark confs, string values.

    Checked by hand, not by a pydantic model: every ``lowmark`` command in a project reads
    this file, and importing pydantic would cost the fast ones (``show``, ``sql``) a
    quarter of their time (docs/cli.md, "Fast commands")."""

    pipelines: str
    """Where the pipelines are defined: a module (pipelines.py in this folder is
    `pipelines`; or pkg.module), or a .py or .yaml file relative to this folder."""
    data_root: str = "data"
    """Folder relative pipeline paths live under."""
    dagster_home: str = "dagster_home"
    """Dagster instance folder (its dagster.yaml, then its storage); `lowmark` reports the
    batches it runs there."""
    spark_master: str | None = None
    """The Spark master URL every run uses (``spark://host:7077``); unset: ``local[*]``."""
    s3_endpoint: str | None = None
    """The S3-compatible store's URL, for checkpoints and sinks at ``s3a://`` paths
    (``lowmark.state.storage``); credentials come from the AWS variables, never this file."""
    spark: dict[str, str] = field(default_factory=dict)
    """Spark confs every session of the project gets, over spark-defaults.conf and under
    ``PYSPARK_SUBMIT_ARGS`` and ``--conf`` (``lowmark.state.spark_confs``)."""

    @classmethod
    def parse(cls, doc: dict[str, Any]) -> ProjectSettings:
        """The settings in the TOML document ``doc``; ``ValueError`` ``"field: what is
        wrong"`` for the first key that is unknown, missing or not a string. Keys of
        ``[spark]`` may be quoted (``"spark.sql.shuffle.partitions"``) or dotted: TOML
        makes tables of a dotted key's parts, joined again here."""
        known = {f.name for f in fields(cls)}
        settings: dict[str, Any] = {}
        for key, value in doc.items():
            if key not in known:
                raise ValueError(f"{key}: Extra inputs are not permitted")
            if key == "spark":
                if not isinstance(value, dict):
                    raise ValueError("spark: want a table of Spark confs ([spark])")
                settings[key] = dict(_spark_confs(value, ""))
            elif not isinstance(value, str):
                raise ValueError(f"{key}: Input should be a valid string")
            else:
                settings[key] = value
        if "pipelines" not in doc:
            raise ValueError("pipelines: Field required")
        return cls(**settings)


def _spark_confs(table: dict[str, Any], prefix: str) -> Iterator[tuple[str, str]]:
    """The confs of a ``[spark]`` table: its keys, those of tables in it joined by dots."""
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _spark_confs(value, f"{prefix}{key}.")
        elif isinstance(value, str):
            yield prefix + key, value
        else:
            shown = str(value).lower() if isinstance(value, bool) else value
            raise ValueError(f'spark: {prefix}{key}: give the value as a string ("{shown}")')


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
        spark = self.settings.spark
        optional = {
            "LOWMARK_SPARK_MASTER": self.settings.spark_master,
            "LOWMARK_S3_ENDPOINT": self.settings.s3_endpoint,
            PROJECT_CONFS_ENV: json.dumps(spark, sort_keys=True) if spark else None,
        }
        return {
            "LOWMARK_PIPELINES": self.pipelines,
            "LOWMARK_DATA_ROOT": str(self.data_root),
            "DAGSTER_HOME": str(self.dagster_home),
        } | {name: value for name, value in optional.items() if value}

    def use(
        self, environ: MutableMapping[str, str] = os.environ, path: list[str] = sys.path
    ) -> None:
        """Fill in the unset variables of ``environ`` from this project; put its folder last
        on ``path`` (this process's ``sys.path``) once lowmark's own packages are imported:
        their modules then come from them, whatever the folder holds."""
        for name, value in self.environment().items():
            environ.setdefault(name, value)
        for package in LOWMARK_PACKAGES:
            importlib.import_module(package)
        if str(self.root) not in path:
            path.append(str(self.root))


def load_project(root: Path, environ: Mapping[str, str] = os.environ) -> Project:
    """The project whose ``lowmark.toml`` is in ``root``; a broken file is one line naming it
    and the field, an unsafe project one line naming the folder (``check_safe``)."""
    path = root.resolve() / PROJECT_FILE
    if path.exists():
        check_safe(path.parent, environ)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ProjectFileInvalid(f"{path} does not exist; `lowmark init` makes a project") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProjectFileInvalid(f"{path} is not valid TOML: {exc}") from exc
    try:
        settings = ProjectSettings.parse(doc)
    except ValueError as exc:
        raise ProjectFileInvalid(f"{path}: {exc}") from exc
    return Project(path.parent, settings)


def check_safe(root: Path, environ: Mapping[str, str] = os.environ) -> None:
    """Raise ProjectUnsafe if the project folder ``root`` or its ``lowmark.toml`` is owned by
    another user or writable by group or others, unless ``LOWMARK_SAFE_DIRECTORIES`` in
    ``environ`` trusts ``root``."""
    if _trusted(root, environ.get(SAFE_DIRECTORIES_ENV, "")):
        return
    env = SAFE_DIRECTORIES_ENV
    trust = f"if you trust it, add it to {env} (export {env}={root})"
    me = os.geteuid()
    for path in (root, root / PROJECT_FILE):
        found = path.stat()
        if found.st_uid != me:
            raise ProjectUnsafe(
                f"project {root} is not yours ({path} is owned by uid {found.st_uid}, you are "
                f"uid {me}) and lowmark would run its code: {trust}"
            )
        if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ProjectUnsafe(
                f"project {root} may have been changed by others ({path} is writable by "
                f"group or others, mode {stat.filemode(found.st_mode)}) and lowmark would run "
                f"its code: run `chmod go-w {path}`, or {trust}"
            )


def _trusted(root: Path, listed: str) -> bool:
    """True if ``listed`` (``LOWMARK_SAFE_DIRECTORIES``) names ``root`` or is ``*``."""
    entries = [entry for entry in listed.split(os.pathsep) if entry]
    return "*" in entries or any(Path(entry).resolve() == root.resolve() for entry in entries)


def find_project(start: Path, environ: Mapping[str, str] = os.environ) -> Project | None:
    """The project ``start`` is in: the nearest ``lowmark.toml`` in ``start`` or a folder
    above it (None: not in a project); ``environ`` may trust it (``check_safe``)."""
    start = start.resolve()
    for folder in (start, *start.parents):
        try:
            found = (folder / PROJECT_FILE).is_file()
        except PermissionError:  # a folder above that we may not look into: no project there
            return None
        if found:
            return load_project(folder, environ)
    return None


def project_definitions(root: Path) -> dg.Definitions:
    """The Dagster definitions of the project in ``root`` (its ``definitions.py`` calls this):
    the project fills in the unset environment, then lowmark builds its definitions from
    it, as for ``LOWMARK_PIPELINES`` and ``LOWMARK_DATA_ROOT`` set by hand."""
    load_project(root).use()
    # Imported only now: importing it builds its module-level definitions from the
    # environment, which must name this project's pipelines by then.
    from lowmark.orchestration.definitions import build_definitions

    return build_definitions()
