"""The one place a SparkSession is built.

Local by default (``local[*]``) with Delta configured from the jars ``lowmark.state.jars``
finds (or fetches on first use); the master and any Spark conf can be overridden, so a
cluster master or another deployment needs no code change. The confs are lowmark's
defaults below, overridden by the settings a user gives the standard ways
(``lowmark.state.spark_confs``: spark-defaults.conf, lowmark.toml's ``[spark]``,
``PYSPARK_SUBMIT_ARGS``, ``--conf``). A Spark Connect endpoint
(``sc://host:port``) gives a remote session: the server's JVM has Delta, this process
starts none and sends only session confs.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from lowmark.state import jars, spark_confs
from lowmark.state.errors import LowmarkError, first_line
from lowmark.state.spark_confs import SparkConfs
from lowmark.state.storage import S3Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG4J_CONFIG = jars.JVM_DIR / "log4j2.properties"
_log = logging.getLogger(__name__)

# Confs that keep small local batches fast; every one can be overridden (docs/deploy.md,
# "Spark settings").
#
# A batch's bookkeeping runs on the driver (lowmark.state.table); Spark's own Delta
# writes are left to a stateless pipeline's sink, where each idempotent write
# first reconstructs the table's snapshot state (Delta 4.4's ``txnVersion``
# reads ``Snapshot.setTransactions``; no conf avoids it). So:
# - snapshotPartitions=1: that reconstruction shuffles a checkpoint's log (at
#   most ten commits plus one checkpoint) into one task instead of several.
# - adaptive.enabled=false: AQE runs every shuffle stage as its own job and
#   re-plans between them; on batch-sized data that costs more than it saves.
#   Re-enable it for large batches.
# - dataFrameDebugging.enabled=false: otherwise every DataFrame call walks the
#   Python stack and makes extra JVM calls to record its call site for error
#   messages: about a third of the time a batch spends building its plan.
# - parallelPartitionDiscovery.threshold=1024: a batch hands Spark the exact
#   files its manifest lists, and Spark checks more than 32 given paths in a
#   Spark job of its own (a task per path): 0.3 s for 100 local files, against
#   0.05 s on the driver. Lower it for object stores with thousands of files
#   per batch.
# - parallelPartitionDiscovery.parallelism=4: Delta's VACUUM lists a table in
#   a Spark job of that many tasks (default 10 000): 20-26 s for a small
#   checkpoint table on 2 cores, 1-2 s with 4. Raise it for large tables on a
#   cluster.
_SESSION_DEFAULTS = {
    "spark.sql.shuffle.partitions": "4",
    "spark.databricks.delta.snapshotPartitions": "1",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "1024",
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.databricks.delta.retentionDurationCheck.enabled": "true",
}
"""The defaults a session takes at any time: what a Spark Connect client sets too."""
_LOCAL_DEFAULTS = {
    **_SESSION_DEFAULTS,
    # Local mode runs every task in the driver; Spark's 1 GB default heap ran
    # out in long-lived processes (a Dagster code server, the test suite).
    "spark.driver.memory": "4g",
    "spark.default.parallelism": "4",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.sql.dataFrameDebugging.enabled": "false",  # static: set when Spark starts
    # Static too. Spark keeps the Java classes it compiles for a plan's stages in a cache
    # of 100 by default, evicted per segment well before that: a session window's batch
    # generates about 60 classes, so each batch compiled most of its classes again (0.3-0.7 s
    # of a 2 s batch). 1000 classes are a few tens of MiB.
    "spark.sql.codegen.cache.maxEntries": "1000",
}
CONNECT_SCHEME = "sc://"


class SparkSettings(BaseModel):
    """How to reach Spark. Environment: ``LOWMARK_SPARK_MASTER``, ``LOWMARK_JARS_DIR``."""

    model_config = ConfigDict(frozen=True)

    master: str = Field(
        default_factory=lambda: os.environ.get("LOWMARK_SPARK_MASTER", "local[*]"),
        description="Spark master URL: local[*], spark://host:port, ..., or a Spark Connect "
        "endpoint: sc://host:port",
    )
    app_name: str = Field(default="lowmark", description="Spark application name.")
    ui: bool = Field(default=False, description="Start the Spark web UI.")
    jars_dir: Path = Field(
        default_factory=jars.jars_dir,
        description="Folder with the Delta jars (see lowmark.state.jars).",
    )
    confs: dict[str, str] = Field(
        default_factory=lambda: spark_confs.confs_from_env(spark_confs.CONFS_ENV),
        description="Spark confs given for this process (--conf): they win over every other "
        "layer (lowmark.state.spark_confs). Default: LOWMARK_SPARK_CONFS, a JSON object.",
    )
    project_confs: dict[str, str] = Field(
        default_factory=lambda: spark_confs.confs_from_env(spark_confs.PROJECT_CONFS_ENV),
        description="The project's Spark confs (lowmark.toml's [spark] table). Default: "
        "LOWMARK_PROJECT_SPARK_CONFS, a JSON object.",
    )

    @property
    def remote(self) -> bool:
        """True for a Spark Connect endpoint: the JVM is the server's, so no jars and no
        JVM confs go from here, only session confs."""
        return self.master.startswith(CONNECT_SCHEME)

    def with_confs(self, confs: Mapping[str, str]) -> SparkSettings:
        """These settings with ``confs`` over their ``confs``."""
        return self.model_copy(update={"confs": {**self.confs, **confs}})


class SparkNotStarted(LowmarkError):
    """Spark, started when a step first needed it, did not start: no fault of the batch
    that asked (it is not counted against it, and the next run replays it)."""


SparkLike: TypeAlias = "SparkSession | Callable[[], SparkSession]"
"""A session, or a function that returns one when first needed (it may start Spark)."""


def provider(spark: SparkLike) -> Callable[[], SparkSession]:
    """``spark`` as a function that returns the session, so it is started only on use.

    What reads the checkpoint and lists folders (``lowmark status``, a Dagster
    sensor tick) then never starts a JVM unless it must touch Spark.
    """
    if callable(spark):
        return spark
    return lambda: spark  # a session: classic, or Spark Connect's (no subclass of it)


class StartedOnUse:
    """A session provider that starts Spark on first use and says whether, and how long
    that took: a run with nothing to do never starts a JVM, and the batch that starts one
    reports the start as a duration of its own, not as part of its read.

    ``now_ms`` is the clock the start is timed with (the runner's).
    """

    def __init__(self, spark: SparkLike, now_ms: Callable[[], int]) -> None:
        self._get = provider(spark)
        self._now_ms = now_ms
        self.session: SparkSession | None = None
        """The session once asked for (None: nothing needed Spark yet)."""
        self.start_ms = 0
        """How long starting Spark took (0: not started here, or a session was running)."""

    def __call__(self) -> SparkSession:
        from pyspark.sql import SparkSession

        if self.session is None:
            fresh = SparkSession.getActiveSession() is None
            began = self._now_ms()
            # PySpark's context takes over Ctrl-C when it starts; the process's own handler
            # (a run's: the first press cancels the batch) was there first and stays.
            main = threading.current_thread() is threading.main_thread()
            on_ctrl_c = signal.getsignal(signal.SIGINT) if main else None
            try:
                self.session = self._get()
            except Exception as exc:
                raise SparkNotStarted(f"Spark did not start: {first_line(exc)}") from exc
            finally:
                if on_ctrl_c is not None:
                    signal.signal(signal.SIGINT, on_ctrl_c)
            self.start_ms = self._now_ms() - began if fresh else 0
        return self.session


def get_spark(settings: SparkSettings | None = None) -> SparkSession:
    """Return the process's SparkSession, creating it with Delta on first use (and S3A with
    delta-spark's S3 log store when an S3 endpoint is set: ``lowmark.state.storage``).

    Later calls return the same session (Spark allows one per JVM); their
    settings are then ignored.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    settings = settings or SparkSettings()
    if settings.remote:
        return _connect(settings)
    if settings.master.startswith("local"):
        # Bind to loopback: no other host is ever involved in local mode.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python tasks (deduplication, users' UDFs) run in this interpreter, whose packages
        # (pyarrow, numpy, lowmark) they need, not in whatever `python3` is first on PATH.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    confs = jvm_confs(settings)
    builder = SparkSession.builder.master(settings.master).appName(settings.app_name)
    for key, value in confs.values.items():
        builder = builder.config(key, value)
    _log_given(confs)
    with _submit_args(confs.submit_args):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def jvm_confs(settings: SparkSettings, environ: Mapping[str, str] = os.environ) -> SparkConfs:
    """The confs of a Spark JVM lowmark starts: a local session's, a cluster driver's, or a
    Spark Connect server's (``lowmark.state.connect_server``). Delta's jars, extension and
    catalog; S3A with delta-spark's S3 log store when an S3 endpoint is set
    (``lowmark.state.storage``); lowmark's defaults; then the user's layers over them
    (``lowmark.state.spark_confs.merge``), ``settings.confs`` last."""
    delta = jars.delta_jars(settings.jars_dir)
    lowmark = {
        **_LOCAL_DEFAULTS,
        "spark.ui.enabled": str(settings.ui).lower(),
        "spark.jars": ",".join(delta),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile={LOG4J_CONFIG}",
        **(s3.spark_confs(delta) if (s3 := S3Settings.from_env()) is not None else {}),
    }
    return spark_confs.merge(lowmark, settings.project_confs, settings.confs, environ)


@contextmanager
def _submit_args(args: str | None) -> Iterator[None]:
    """``PYSPARK_SUBMIT_ARGS`` is ``args`` while PySpark launches the JVM (None: as it is):
    it puts those arguments after the session's confs on spark-submit's command line, where
    a ``--driver-memory`` would win over a ``--conf`` given later (docs/deploy.md)."""
    if args is None:
        yield
        return
    before = os.environ[spark_confs.SUBMIT_ARGS]
    os.environ[spark_confs.SUBMIT_ARGS] = args or "pyspark-shell"
    try:
        yield
    finally:
        os.environ[spark_confs.SUBMIT_ARGS] = before


def _log_given(confs: SparkConfs) -> None:
    given = confs.given()
    if given:
        _log.info(
            "Spark confs not lowmark's defaults: %s",
            "; ".join(f"{k}={v}" for k, v in given.items()),
        )


def _connect(settings: SparkSettings) -> SparkSession:
    """A Spark Connect session at ``settings.master``, with lowmark's session defaults, the
    project's confs and ``settings.confs`` (the server's JVM read spark-defaults.conf and
    the rest itself; the confs it cannot change per session, pyspark leaves out). The server
    was started with Delta (docs/deploy.md#spark-connect)."""
    from pyspark.sql import SparkSession

    confs = spark_confs.merge(_SESSION_DEFAULTS, settings.project_confs, settings.confs, jvm=False)
    builder = SparkSession.builder.remote(settings.master).appName(settings.app_name)
    for key, value in confs.values.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def own_session(spark: SparkSession) -> SparkSession:
    """A session of its own on ``spark``'s Spark: its own SQL confs and temporary views.

    Locally ``newSession``; over Spark Connect (which has no ``newSession``) a
    clone of the server-side session, made with the confs ``spark`` has now.
    """
    if is_remote_session(spark):
        clone = spark.cloneSession()  # type: ignore[attr-defined]
        # Its gRPC channel closed while Python still runs: left to the garbage collector at
        # exit, grpc's close waits forever and the process never ends.
        atexit.register(clone.client.close)
        return clone
    return spark.newSession()


def is_remote_session(spark: SparkSession) -> bool:
    """True for a Spark Connect session: no JVM of its own here, so no ``sparkContext``,
    no ``_jdf`` and no py4j."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
