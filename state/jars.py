"""Where the jars Spark is handed (``spark.jars``: Delta, the Kafka connector) come from.

``jvm/pom.xml`` is the one list of them. The first folder of these that applies is used:

1. ``LOWMARK_JARS_DIR``, when set (nothing is fetched into it);
2. ``jvm/lib`` beside the source tree, when it holds Delta's jar (``make setup`` fills it);
3. a per-user cache, ``$XDG_CACHE_HOME/lowmark/jars/<pom digest>`` (``~/.cache`` by default),
   which an installed lowmark fills on first use: Maven (``mvn``) copies the pom's runtime
   dependencies there, less what pyspark already ships, on one progress line.

``jvm/fetch-jars jvm --spark`` (``make setup``) fetches them into ``jvm/lib`` with ``fetch``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lowmark.state.errors import LowmarkError

JVM_DIR = Path(__file__).resolve().parent.parent / "jvm"
"""jvm/ beside the source tree, or its copy inside an installed package (pom, log4j config)."""
POM = JVM_DIR / "pom.xml"
SOURCE_TREE_JARS = JVM_DIR / "lib"
JARS_ENV = "LOWMARK_JARS_DIR"
DELTA_JAR = "delta-spark"
# Scala's own libraries come with Spark; a jar pyspark ships under another version must not
# stand before Spark's own on the classpath.
LEFT_OUT = ("scala-library", "scala-reflect")
COPY_DEPENDENCIES = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"


class JarsMissing(LowmarkError):
    """The Delta jars are neither found nor fetched."""


def cache_dir() -> Path:
    """The per-user folder an installed lowmark fetches the jars into, one per pom."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return base / "lowmark" / "jars" / digest


def jars_dir() -> Path:
    """The folder the jars are taken from (module docstring); it may not be filled yet."""
    if JARS_ENV in os.environ:
        return Path(os.environ[JARS_ENV])
    if any(SOURCE_TREE_JARS.glob(f"{DELTA_JAR}*.jar")):
        return SOURCE_TREE_JARS
    return cache_dir()


def delta_jars(folder: Path) -> list[str]:
    """The jar paths to hand Spark from ``folder``; the per-user cache is filled first when
    empty. Raises JarsMissing when Delta's jar is not there."""
    if folder == cache_dir() and not _has_delta(folder):
        fetch(folder)
    if not _has_delta(folder):
        raise JarsMissing(
            f"no Delta jars in {folder}: run `make setup` in lowmark's folder, or point "
            f"{JARS_ENV} at a folder that holds them"
        )
    return sorted(str(p) for p in folder.glob("*.jar"))


def _has_delta(folder: Path) -> bool:
    return any(folder.glob(f"{DELTA_JAR}*.jar"))


def fetch(into: Path) -> None:
    """The pom's jars copied into ``into`` by Maven, less ``LEFT_OUT`` and the jars pyspark
    ships; one line on stderr says so, and how long it took. ``into`` is filled whole or not
    at all (a fetch cut short leaves nothing behind)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsMissing(
            f"no Delta jars in {into}, and no `mvn` to fetch them: install Maven (and Java), "
            f"or point {JARS_ENV} at a folder that holds them"
        )
    print(f"fetching Spark's Delta and Kafka jars into {into} with mvn …", end="", file=sys.stderr)
    sys.stderr.flush()
    began = time.monotonic()
    into.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into.parent) as tmp:
        part = Path(tmp) / "jars"
        done = subprocess.run(
            [
                mvn,
                "-B",
                "-q",
                "-f",
                str(POM),
                COPY_DEPENDENCIES,
                f"-DoutputDirectory={part}",
                "-DincludeScope=runtime",
                f"-DexcludeArtifactIds={','.join(LEFT_OUT)}",
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(" failed", file=sys.stderr)
            raise JarsMissing(
                f"mvn could not fetch the Delta jars into {into}: "
                f"{_last_error(done.stdout + done.stderr)}; point {JARS_ENV} at a folder "
                "that holds them"
            )
        _drop_shipped_by_pyspark(part)
        shutil.rmtree(into, ignore_errors=True)
        part.rename(into)
    size = sum(p.stat().st_size for p in into.glob("*.jar"))
    took = time.monotonic() - began
    print(f" done in {took:.0f} s ({size / 1e6:.0f} MB)", file=sys.stderr)


def _drop_shipped_by_pyspark(folder: Path) -> None:
    """Remove each jar whose artifact pyspark ships (under any version)."""
    import pyspark

    shipped = Path(pyspark.__file__).parent / "jars"
    for jar in folder.glob("*.jar"):
        artifact = _artifact(jar.name)
        if any(_artifact(p.name) == artifact for p in shipped.glob(f"{artifact}-*.jar")):
            jar.unlink()


def _artifact(name: str) -> str:
    """``kafka-clients`` of ``kafka-clients-3.9.2.jar``: the name before its version."""
    parts = name.removesuffix(".jar").split("-")
    for i, part in enumerate(parts):
        if part[:1].isdigit():
            return "-".join(parts[:i])
    return "-".join(parts)


def _last_error(output: str) -> str:
    errors = [line.strip() for line in output.splitlines() if "ERROR" in line]
    return errors[0] if errors else f"`mvn -f {POM} dependency:resolve` says why"
