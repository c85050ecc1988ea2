"""Checkpoints and sinks on an S3-compatible object store: the settings both writers need.

A location is on object storage when it starts with ``s3://`` or ``s3a://``
(``is_object_store``); anything else is a local (or Hadoop-mounted) path. Two engines
write there, and both must see the same store with the same guarantee, that a Delta
commit file is created only if absent:

- the driver's bookkeeping, with delta-rs (``lowmark.state.table``): ``delta_rs_options``
  gives its ``storage_options``. delta-rs commits a version with a conditional put
  (``If-None-Match: *``, object_store's ``aws_conditional_put = "etag"``: its default in
  the deltalake version pinned, set here all the same so that no ``AWS_CONDITIONAL_PUT``
  in the environment turns it off); the store answers 412 to the second creator, which
  retries as after any lost commit. delta-rs
  (1.x) has no other safe way on S3: its DynamoDB locking provider is gone, and
  ``AWS_S3_ALLOW_UNSAFE_RENAME`` is what it says.
- Spark's writes (a stateless pipeline's sink, executors' data files), with delta-spark
  through Hadoop's S3A file system (``spark_confs``, ``spark_jars``). delta-spark's own
  log store for ``s3a://``, ``S3SingleDriverLogStore``, checks that a commit file is
  absent under a lock of its own JVM, then creates it with a plain PUT: safe with one
  writing JVM only. lowmark's ``dev.lowmark.delta.S3ConditionalLogStore``
  (``jvm/s3/src``, built into ``jvm/s3/lib`` by ``make integration-setup``) creates it
  with S3A's ``createFile`` and ``fs.option.create.conditional.overwrite`` instead: a
  conditional put, which the store refuses with 412 when another writer created that
  version first, and Delta retries on the next. So both engines are safe with any
  number of writers, on a store that honours ``If-None-Match``.

Settings come from the environment (``lowmark.toml``'s ``s3_endpoint`` sets the first
when unset): ``LOWMARK_S3_ENDPOINT`` (the store's URL; for Amazon S3 itself
``https://s3.<region>.amazonaws.com``), ``LOWMARK_S3_PATH_STYLE`` (``true`` by default:
``<endpoint>/<bucket>/<key>``, what most S3-compatible servers want), ``LOWMARK_S3_JARS_DIR``
(hadoop-aws and the AWS SDK; default ``jvm/s3/lib`` of a source tree), and the standard
``AWS_REGION`` (or ``AWS_DEFAULT_REGION``; default ``us-east-1``), ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN``. Credentials never go into a Spark
conf (Spark shows its confs in its UI and logs): S3A reads the same variables itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from deltalake import DeltaTable

from lowmark.state.errors import LowmarkError

if TYPE_CHECKING:
    from pyarrow import fs as pafs

SCHEMES = ("s3://", "s3a://")
ENDPOINT_ENV = "LOWMARK_S3_ENDPOINT"
PATH_STYLE_ENV = "LOWMARK_S3_PATH_STYLE"
JARS_ENV = "LOWMARK_S3_JARS_DIR"
SOURCE_TREE_JARS = Path(__file__).resolve().parent.parent / "jvm" / "s3" / "lib"
HADOOP_AWS_JAR = "hadoop-aws-"
LOG_STORE = "dev.lowmark.delta.S3ConditionalLogStore"
"""Delta's log store on S3 for Spark's writes: commits as conditional puts."""
LOG_STORE_JAR = "lowmark-delta-log-store.jar"


class ObjectStoreNotConfigured(LowmarkError):
    """A location is on object storage, and lowmark was not told how to reach it."""


class NotOnObjectStorage(LowmarkError):
    """An operation that needs a local file system was asked of a location on object storage."""


def is_object_store(location: str) -> bool:
    """True if ``location`` is an ``s3://`` or ``s3a://`` URL."""
    return location.startswith(SCHEMES)


@dataclass(frozen=True)
class S3Settings:
    """How to reach the S3-compatible store (see the module's docstring for the variables)."""

    endpoint: str
    region: str
    path_style: bool
    jars_dir: Path

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> S3Settings | None:
        """The settings in the environment; None when ``LOWMARK_S3_ENDPOINT`` is unset."""
        env = dict(os.environ) if environ is None else environ
        endpoint = env.get(ENDPOINT_ENV, "").strip()
        if not endpoint:
            return None
        if urlparse(endpoint).scheme not in ("http", "https"):
            raise ObjectStoreNotConfigured(
                f"{ENDPOINT_ENV}={endpoint} is not an http(s) URL: set it to the store's "
                "address, e.g. http://127.0.0.1:9000 or https://s3.eu-west-1.amazonaws.com"
            )
        return cls(
            endpoint=endpoint.rstrip("/"),
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
            path_style=env.get(PATH_STYLE_ENV, "true").lower() != "false",
            jars_dir=Path(env.get(JARS_ENV) or SOURCE_TREE_JARS),
        )

    @property
    def secure(self) -> bool:
        return urlparse(self.endpoint).scheme == "https"

    def delta_rs_options(self) -> dict[str, str]:
        """delta-rs's ``storage_options`` (object_store's keys) for a table on the store."""
        options = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": self.region,
            "AWS_ALLOW_HTTP": str(not self.secure).lower(),
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not self.path_style).lower(),
            # Commits are conditional puts (If-None-Match: *): safe with two writers.
            "AWS_CONDITIONAL_PUT": "etag",
        }
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            if value := os.environ.get(name):
                options[name] = value
        return options

    def spark_jars(self) -> tuple[list[str], str]:
        """The jars S3A needs (hadoop-aws, the AWS SDK), for the driver's and executors'
        class path, and lowmark's log store's jar, for ``spark.jars`` (beside Delta's, whose
        classes it extends: a class on the class path would not see them); raises naming
        the fix when they are not there."""
        jars = sorted(str(p) for p in self.jars_dir.glob("*.jar"))
        names = {Path(j).name for j in jars}
        if not any(n.startswith(HADOOP_AWS_JAR) for n in names) or LOG_STORE_JAR not in names:
            raise ObjectStoreNotConfigured(
                f"no hadoop-aws jar or no {LOG_STORE_JAR} in {self.jars_dir} ({JARS_ENV}): "
                "run `make integration-setup` in lowmark's source tree, or point "
                f"{JARS_ENV} at a folder with hadoop-aws 3.5.0, its AWS SDK bundle and "
                f"the jar jvm/s3/build-log-store makes"
            )
        log_store = str(self.jars_dir / LOG_STORE_JAR)
        return [j for j in jars if j != log_store], log_store

    def spark_confs(self, delta_jars: list[str]) -> dict[str, str]:
        """Spark confs for ``s3a://`` and ``s3://`` (both S3A) with lowmark's log store;
        ``delta_jars``: the ``spark.jars`` Spark is given for Delta, which these confs add
        the log store's jar to."""
        class_path, log_store = self.spark_jars()
        jars = ":".join(class_path)
        s3a = "org.apache.hadoop.fs.s3a.S3AFileSystem"
        return {
            "spark.jars": ",".join([*delta_jars, log_store]),
            "spark.driver.extraClassPath": jars,
            "spark.executor.extraClassPath": jars,
            "spark.hadoop.fs.s3.impl": s3a,
            "spark.hadoop.fs.s3a.impl": s3a,
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": self.region,
            "spark.hadoop.fs.s3a.path.style.access": str(self.path_style).lower(),
            "spark.hadoop.fs.s3a.connection.ssl.enabled": str(self.secure).lower(),
            "spark.delta.logStore.s3a.impl": LOG_STORE,
            "spark.delta.logStore.s3.impl": LOG_STORE,
        }


def delta_rs_options(location: str) -> dict[str, str] | None:
    """delta-rs's ``storage_options`` for the table at ``location``: None for a local one;
    for one on object storage, the store's (raises naming the setting when unset)."""
    if not is_object_store(location):
        return None
    return required(location).delta_rs_options()


def required(location: str) -> S3Settings:
    """The store's settings for ``location``, which is on it; raises when unset."""
    settings = S3Settings.from_env()
    if settings is None:
        raise ObjectStoreNotConfigured(
            f"{location} is on object storage and {ENDPOINT_ENV} is not set: set it to the "
            "store's URL (or `s3_endpoint` in lowmark.toml), with AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY"
        )
    return settings


def not_on_object_storage(location: str, what: str, instead: str) -> NotOnObjectStorage:
    """The error for ``what``, which needs a local file system, asked of ``location`` on
    object storage; ``instead`` is the way on."""
    return NotOnObjectStorage(f"{what} {location}: not on object storage; {instead}")


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system ``location`` is on (local, or the S3 store) and
    ``location``'s path in it. (pyarrow is imported here: ``lowmark show`` and ``sql``
    import this module, and pyarrow would cost them a third of their time.)"""
    from pyarrow import fs as pafs

    if not is_object_store(location):
        if "://" in location:  # file://, or another store pyarrow knows by its URL
            return pafs.FileSystem.from_uri(location)
        return pafs.LocalFileSystem(), os.path.abspath(location)
    settings = required(location)
    url = urlparse(location)
    store = pafs.S3FileSystem(
        endpoint_override=settings.endpoint,
        scheme="https" if settings.secure else "http",
        region=settings.region,
        force_virtual_addressing=not settings.path_style,
        access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        session_token=os.environ.get("AWS_SESSION_TOKEN"),
    )
    return store, f"{url.netloc}{url.path}".rstrip("/")


def open_table(location: str, version: int | None = None) -> DeltaTable:
    """The Delta table at ``location`` (as of ``version``; None: its newest), with delta-rs,
    on whichever store it is."""
    return DeltaTable(location, version=version, storage_options=delta_rs_options(location))


def is_table(location: str) -> bool:
    """True if a Delta table is at ``location``, on whichever store it is."""
    return bool(DeltaTable.is_deltatable(location, delta_rs_options(location)))
