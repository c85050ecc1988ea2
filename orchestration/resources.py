"""Dagster resources: the Spark session and where lowmark's data lives.

Both are typed ``ConfigurableResource``s; the session is built lazily, once
per process, on first use (a sensor tick or a run), never at import. A process
executing several runs (the warm runner) lends each run a session of its own on
its one Spark (``lent_session``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import dagster as dg
from pydantic import Field
from pyspark.sql import SparkSession

from lowmark.orchestration.errors import SparkSettingsFixed
from lowmark.state.session import SparkSettings, get_spark

_lent: ContextVar[SparkSession | None] = ContextVar("lowmark_lent_session", default=None)
"""The session ``SparkResource.session`` returns in this context, if any."""


@contextmanager
def lent_session(session: SparkSession) -> Iterator[None]:
    """``SparkResource.session`` returns ``session`` in this context (this thread, for this
    block), with the resource's confs set on it: how a process executing several runs at
    once gives each a session of its own on its one Spark."""
    token = _lent.set(session)
    try:
        yield
    finally:
        _lent.reset(token)


def fixed_settings(spark: SparkSession, master: str | None, confs: Mapping[str, str]) -> str:
    """The settings of ``master`` and ``confs`` that ``spark`` has otherwise and cannot
    change at runtime (another master, a static conf such as ``spark.driver.memory``),
    named; "" when it can take them all."""
    fixed = []
    if master and master != spark.conf.get("spark.master"):
        fixed.append(f"master {master} (this Spark's: {spark.conf.get('spark.master')})")
    for key, value in confs.items():
        if spark.conf.get(key, None) != value and not spark.conf.isModifiable(key):
            fixed.append(f"{key}={value}")
    return ", ".join(fixed)


class SparkResource(dg.ConfigurableResource):
    """A Spark session with Delta, local by default (``lowmark.state.session.get_spark``)."""

    master: str | None = Field(
        default=None,
        description="Spark master: local[*], spark://host:port, ... "
        "Default: LOWMARK_SPARK_MASTER, else local[*].",
    )
    confs: dict[str, str] = Field(
        default_factory=dict,
        description="Spark confs for this job's runs: they win over every other layer "
        "(lowmark.toml's [spark], PYSPARK_SUBMIT_ARGS, lowmark ui --conf; docs/deploy.md).",
    )

    def session(self) -> SparkSession:
        """The process's session, created with these settings on first use; or the session
        lent to this run (``lent_session``), these confs set on it. Raises
        ``SparkSettingsFixed`` for settings the lent session's Spark cannot take."""
        lent = _lent.get()
        if lent is not None:
            fixed = fixed_settings(lent, self.master, self.confs)
            if fixed:
                raise SparkSettingsFixed(
                    f"the spark resource's {fixed}: the warm runner's Spark cannot take it at "
                    "runtime; set it where that Spark reads it (lowmark.toml's [spark], "
                    "`lowmark ui --conf`), give it in the run's config (such a run gets a "
                    "process of its own), or use `lowmark ui --no-runner`"
                )
            for key, value in self.confs.items():
                lent.conf.set(key, value)
            return lent
        settings = SparkSettings().with_confs(self.confs)
        if self.master:
            settings = settings.model_copy(update={"master": self.master})
        return get_spark(settings)


class LowmarkResource(dg.ConfigurableResource):
    """Where relative pipeline paths (sources, sinks, checkpoints) live."""

    data_root: str | None = Field(
        default=None,
        description="Data root folder. Default: LOWMARK_DATA_ROOT, else ./data.",
    )

    def root(self) -> Path:
        return Path(self.data_root or os.environ.get("LOWMARK_DATA_ROOT", "data")).resolve()
