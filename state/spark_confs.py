"""The Spark confs a session gets: lowmark's defaults, then the settings a user gives the
standard ways, each layer winning over the ones before it.

==  =======================  =====================================================
1   lowmark                  its defaults (``lowmark.state.session``)
2   spark-defaults.conf      in ``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``; or the
                             file of ``--properties-file`` in ``PYSPARK_SUBMIT_ARGS``
                             (after spark-defaults.conf with ``--load-spark-defaults``)
3   lowmark.toml             the project's ``[spark]`` table (``LOWMARK_PROJECT_SPARK_CONFS``)
4   PYSPARK_SUBMIT_ARGS      its ``--conf k=v`` and the spark-submit flags that are confs
5   --conf                   the command's ``--conf k=v``, a Dagster resource's ``confs``
                             (``LOWMARK_SPARK_CONFS`` for the processes ``lowmark ui`` starts)
==  =======================  =====================================================

Delta is lowmark's, not a default: a user's ``spark.jars``, ``spark.sql.extensions`` and
``spark.driver.extraJavaOptions`` are added after lowmark's (Delta's jars and extension,
its log4j configuration), and ``spark.sql.catalog.spark_catalog`` other than Delta's is
refused. The master is lowmark's own setting (``--master``, ``LOWMARK_SPARK_MASTER``,
``spark_master``): ``spark.master`` in a layer is left out.

Only the standard library is imported: ``lowmark.orchestration.project`` names the
variables here on every command.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lowmark.state.errors import LowmarkError

LOWMARK = "lowmark"
PROJECT = "lowmark.toml"
SUBMIT_ARGS = "PYSPARK_SUBMIT_ARGS"
GIVEN = "--conf"
PROJECT_CONFS_ENV = "LOWMARK_PROJECT_SPARK_CONFS"
"""The project's ``[spark]`` table as a JSON object, for every process lowmark starts."""
CONFS_ENV = "LOWMARK_SPARK_CONFS"
"""``--conf`` settings as a JSON object: how ``lowmark ui`` hands its ``--conf`` to its runs."""

SUBMIT_FLAGS = {
    "--driver-memory": "spark.driver.memory",
    "--driver-cores": "spark.driver.cores",
    "--driver-java-options": "spark.driver.extraJavaOptions",
    "--driver-class-path": "spark.driver.extraClassPath",
    "--driver-library-path": "spark.driver.extraLibraryPath",
    "--executor-memory": "spark.executor.memory",
    "--executor-cores": "spark.executor.cores",
    "--num-executors": "spark.executor.instances",
    "--total-executor-cores": "spark.cores.max",
    "--jars": "spark.jars",
    "--packages": "spark.jars.packages",
    "--exclude-packages": "spark.jars.excludes",
    "--repositories": "spark.jars.repositories",
    "--files": "spark.files",
    "--archives": "spark.archives",
    "--py-files": "spark.submit.pyFiles",
}
"""spark-submit's flags that stand for one conf each (as ``SparkSubmitArguments`` maps
them); the others (``pyspark-shell``, ``--verbose``, ...) stay in ``PYSPARK_SUBMIT_ARGS``."""
_ADDED = {"spark.jars": ",", "spark.sql.extensions": ",", "spark.driver.extraJavaOptions": " "}
"""Lists a user's value is added to, after lowmark's, and the separator."""
_DELTA_ONLY = "spark.sql.catalog.spark_catalog"
_LEFT_OUT = ("spark.master", "spark.remote")
_REDACTED = re.compile(r"(?i)secret|password|token|access[.]?key")
"""Keys whose values are not shown (Spark's own ``spark.redaction.regex``)."""


class SparkConfRefused(LowmarkError):
    """A Spark conf lowmark cannot take: malformed, or one that would drop Delta."""


@dataclass(frozen=True, kw_only=True)
class SparkConfs:
    """The confs of one session and the layer each came from."""

    values: dict[str, str]
    sources: dict[str, str]
    """Per key, the layer its value is from (``lowmark``, a spark-defaults.conf path,
    ``lowmark.toml``, ``PYSPARK_SUBMIT_ARGS``, ``--conf``; for a list a user added to,
    "lowmark + " and the layer)."""
    submit_args: str | None = None
    """``PYSPARK_SUBMIT_ARGS`` without what ``values`` took from it (None: it is unset), for
    the JVM PySpark launches, so no flag there overrides a later layer."""

    def given(self) -> dict[str, str]:
        """The confs not all lowmark's, ``key=value (layer)`` with secrets' values hidden."""
        return {
            key: f"{'***' if _REDACTED.search(key) else value} ({self.sources[key]})"
            for key, value in self.values.items()
            if self.sources[key] != LOWMARK
        }


def merge(
    lowmark: Mapping[str, str],
    project: Mapping[str, str],
    given: Mapping[str, str],
    environ: Mapping[str, str] = os.environ,
    jvm: bool = True,
) -> SparkConfs:
    """``lowmark``'s confs overridden by each layer in turn (this module's table). With
    ``jvm`` false (a Spark Connect client: the server's JVM read its own) the
    spark-defaults.conf and ``PYSPARK_SUBMIT_ARGS`` layers are not read. Raises
    ``SparkConfRefused`` for a conf that would replace Delta's catalog and for a
    ``--conf`` without ``=`` in ``PYSPARK_SUBMIT_ARGS``."""
    layers: list[tuple[str, Mapping[str, str]]] = []
    submitted = parse_submit_args(environ[SUBMIT_ARGS]) if jvm and SUBMIT_ARGS in environ else None
    if jvm:
        given_file = submitted.properties_file if submitted is not None else None
        # As spark-submit: a properties file replaces spark-defaults.conf, unless asked to
        # add to it.
        with_defaults = given_file is None or (submitted is not None and submitted.load_defaults)
        files = [spark_defaults_file(environ) if with_defaults else None, given_file]
        for path in files:
            if path is not None:
                layers.append((str(path), read_properties(path)))
    layers.append((PROJECT, project))
    if submitted is not None:
        layers.append((SUBMIT_ARGS, submitted.confs))
    layers.append((GIVEN, given))
    values, sources = dict(lowmark), dict.fromkeys(lowmark, LOWMARK)
    for layer, confs in layers:
        for key, value in confs.items():
            if key in _LEFT_OUT:
                continue
            if key == _DELTA_ONLY and key in lowmark and value != lowmark[key]:
                raise SparkConfRefused(
                    f"{key}={value} ({layer}): lowmark's tables need Delta's catalog there "
                    f"({lowmark[key]}); remove it"
                )
            sep = _ADDED.get(key)
            if sep is not None and key in lowmark:
                values[key] = sep.join(dict.fromkeys([lowmark[key], *value.split(sep)]))
                sources[key] = f"{LOWMARK} + {layer}"
            else:
                values[key], sources[key] = value, layer
    submit_args = submitted.rest if submitted is not None else None
    return SparkConfs(values=values, sources=sources, submit_args=submit_args)


def spark_defaults_file(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The spark-defaults.conf spark-submit reads: in ``$SPARK_CONF_DIR``, else in
    ``$SPARK_HOME/conf`` (``SPARK_HOME``: pyspark's folder when unset, as PySpark has it);
    None when there is none."""
    folder = environ.get("SPARK_CONF_DIR")
    if folder is None:
        home = environ.get("SPARK_HOME") or _pyspark_folder()
        folder = str(Path(home) / "conf") if home else None
    path = Path(folder) / "spark-defaults.conf" if folder else None
    return path if path is not None and path.is_file() else None


def _pyspark_folder() -> str | None:
    spec = importlib.util.find_spec("pyspark")  # found, not imported
    return str(Path(spec.origin).parent) if spec is not None and spec.origin else None


def read_properties(path: Path) -> dict[str, str]:
    """A Spark properties file's confs: ``key value``, ``key=value`` or ``key: value`` a
    line, ``#`` and ``!`` starting comments; values trimmed, as spark-submit reads them."""
    confs: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, *value = re.split(r"\s*[=:]\s*|\s+", line, maxsplit=1)
        confs[key] = value[0].strip() if value else ""
    return confs


@dataclass(frozen=True)
class Submitted:
    """What ``PYSPARK_SUBMIT_ARGS`` says of a session's confs (``parse_submit_args``)."""

    confs: dict[str, str]
    """Its ``--conf`` settings and the flags that stand for a conf (``SUBMIT_FLAGS``)."""
    rest: str
    """The arguments left, shell-quoted: what spark-submit is still given (the properties
    files it reads included, so that it reads the ones the layers read)."""
    properties_file: Path | None = None
    """``--properties-file``: read instead of spark-defaults.conf."""
    load_defaults: bool = False
    """``--load-spark-defaults``: spark-defaults.conf read too, before the properties file."""


def parse_submit_args(args: str) -> Submitted:
    """The confs in spark-submit arguments (``--conf k=v``, ``-c k=v``, ``--conf=k=v``, the
    flags of ``SUBMIT_FLAGS``), later ones winning, ``--properties-file`` and
    ``--load-spark-defaults``, and the arguments left (``Submitted``)."""
    confs: dict[str, str] = {}
    rest: list[str] = []
    properties_file, load_defaults = None, False
    words = shlex.split(args)
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, attached = word.partition("=")
        name = flag if flag.startswith("--") and eq else word
        if name == "--load-spark-defaults":
            load_defaults = True
            rest.append(word)
        elif name in ("--conf", "-c", "--properties-file") or name in SUBMIT_FLAGS:
            value = attached if name == flag and eq else None
            if value is None:
                if i + 1 >= len(words):
                    raise SparkConfRefused(f"{SUBMIT_ARGS}: {name} needs a value")
                i += 1
                value = words[i]
            if name in SUBMIT_FLAGS:
                confs[SUBMIT_FLAGS[name]] = value
            elif name == "--properties-file":
                properties_file = Path(value)
                if not properties_file.is_file():
                    raise SparkConfRefused(
                        f"{SUBMIT_ARGS}: --properties-file {value}: no such file; "
                        "give the path of a Spark properties file"
                    )
                # Left to spark-submit too: it then reads what the layers read (its own
                # reads fill in only keys the session's confs do not set).
                rest += [name, value]
            else:
                key, sep, conf = value.partition("=")
                if not sep or not key:
                    raise SparkConfRefused(
                        f"{SUBMIT_ARGS}: --conf {value!r}: give KEY=VALUE, "
                        "e.g. --conf spark.sql.shuffle.partitions=8"
                    )
                confs[key] = conf
        else:
            rest.append(word)
        i += 1
    return Submitted(confs, shlex.join(rest), properties_file, load_defaults)


def confs_from_env(name: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The confs in the environment variable ``name`` (a JSON object of strings; unset:
    none). Raises ``SparkConfRefused`` naming it when it holds anything else."""
    text = environ.get(name)
    if not text:
        return {}
    try:
        confs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SparkConfRefused(f"{name} is not JSON ({exc}): unset it") from exc
    if not isinstance(confs, dict) or not all(isinstance(v, str) for v in confs.values()):
        raise SparkConfRefused(f"{name}: want a JSON object of strings, got {text[:80]}")
    return confs


def key_value(item: str) -> tuple[str, str]:
    """``KEY=VALUE`` as a pair; ``SparkConfRefused`` when there is no ``=`` or no key."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise SparkConfRefused(
            f"--conf {item!r}: give KEY=VALUE, e.g. --conf spark.sql.shuffle.partitions=8"
        )
    return key.strip(), value
