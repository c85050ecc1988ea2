"""Dagster resources: the Spark session and where lowmark's data lives.

Both are typed ``ConfigurableResource``s; the session is built lazily, once
per process, on first use (a sensor tick or a run), never at import.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from pydantic import Field
from pyspark.sql import SparkSession

from lowmark.state.session import SparkSettings, get_spark


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
        """The process's session, created with these settings on first use."""
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
