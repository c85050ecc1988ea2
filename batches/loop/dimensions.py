"""The dimension tables of a pipeline's stream-table joins (``joins``), at run time.

Planning a new batch picks each table's newest Delta version (``Dimensions.newest``,
driver-side with delta-rs, no Spark) and the offset log records them
(``OffsetEntry.dimension_versions``); the batch, and any replay of it, joins its
transformed records with each table read as of exactly that version
(``Dimensions.joined``). An update of a table therefore becomes visible at the next
batch planned after it; it does not start a batch by itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable

from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.pipeline import Pipeline, resolve
from lowmark.batches.table_join import BROADCAST_MAX_BYTES, TableJoin
from lowmark.state.errors import first_line
from lowmark.state.storage import is_table, open_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class Dimensions:
    """The joined tables of one pipeline, found under ``data_root``."""

    def __init__(self, pipeline: Pipeline, data_root: Path) -> None:
        self.name = pipeline.name
        self.joins = pipeline.joins
        self.paths = {join.table: resolve(join.table, data_root) for join in self.joins}

    def newest(self) -> dict[str, int] | None:
        """Each joined table's newest version, by its ``table`` (None: the pipeline joins
        none). Raises ``PipelineConfigInvalid`` naming a table that is not a Delta table."""
        if not self.joins:
            return None
        return {join.table: self._open(join).version() for join in self.joins}

    def joined(
        self, spark: SparkSession, records: DataFrame, versions: dict[str, int] | None
    ) -> DataFrame:
        """``records`` joined with each table, in order, as of ``versions`` (the batch's
        offset-log entry: ``newest`` when it was planned). Lazy: the columns are checked
        before any Spark job, each mistake raising ``PipelineConfigInvalid`` in one line."""
        from pyspark.sql import functions as F

        for join in self.joins:
            assert versions is not None and join.table in versions, "planned without versions"
            version = versions[join.table]
            snapshot = self._open(join, version)  # a version whose history is gone: one line
            table = (
                spark.read.format("delta")
                .option("versionAsOf", version)
                .load(self.paths[join.table])
            )
            table = table.select(*join.keys, *self._taken(join, records, table.columns))
            # Shuffled by key unless broadcast, however small Spark thinks the table is.
            table = F.broadcast(table) if self._broadcasts(join, snapshot) else table.hint("merge")
            records = records.join(table, on=list(join.keys), how=join.how)
        return records

    def _taken(self, join: TableJoin, records: DataFrame, columns: list[str]) -> list[str]:
        """The table's columns the records get: the checked ``columns``, or all but the
        keys."""
        where = f"pipeline {self.name} joins {join.table} by {list(join.keys)}"
        lacking = [k for k in join.keys if k not in columns]
        if lacking:
            raise PipelineConfigInvalid(
                f"{where}, but the table has no column {lacking}: fix `keys`, or the table"
            )
        lacking = [k for k in join.keys if k not in records.columns]
        if lacking:
            raise PipelineConfigInvalid(
                f"{where}, but its records (after the transform) have no column {lacking}: "
                "fix `keys`, or make the transform keep them"
            )
        taken = list(join.columns) if join.columns is not None else columns
        unknown = [c for c in taken if c not in columns]
        if unknown:
            raise PipelineConfigInvalid(
                f"{where}: its `columns` {unknown} are not in the table: fix `columns`"
            )
        taken = [c for c in taken if c not in join.keys]
        both = [c for c in taken if c in records.columns]
        if both:
            raise PipelineConfigInvalid(
                f"{where}: the records already have the table's columns {both}: list the "
                "ones to take in `columns`, or rename them in the transform"
            )
        return taken

    @staticmethod
    def _broadcasts(join: TableJoin, snapshot: DeltaTable) -> bool:
        """Whether ``join`` sends the whole table to every task: as set, or (``auto``) when
        the data files of the ``snapshot`` it joins total at most ``BROADCAST_MAX_BYTES``,
        as its Delta log says (no file is read)."""
        if join.broadcast != "auto":
            return join.broadcast == "true"
        files = pa.table(snapshot.get_add_actions(flatten=True))
        return sum(files.column("size_bytes").to_pylist()) <= BROADCAST_MAX_BYTES

    def _open(self, join: TableJoin, version: int | None = None) -> DeltaTable:
        """``join``'s table (as of ``version``; default its newest), with delta-rs."""
        path = self.paths[join.table]
        try:
            return open_table(path, version=version)
        except Exception as exc:  # delta-rs raises plain exceptions for what it cannot read
            what = f"pipeline {self.name} joins {join.table}, but {path} cannot be read"
            if version is not None and is_table(path):
                raise PipelineConfigInvalid(
                    f"{what} as of version {version}, which the batch recorded "
                    f"({first_line(exc)}): restore the table's history (VACUUM or log "
                    "clean-up removed it), or set the batch aside with `lowmark skip-batch`"
                ) from exc
            raise PipelineConfigInvalid(
                f"{what} as a Delta table ({first_line(exc)}): create it, or fix the join's `table`"
            ) from exc
