"""Stream-table joins, as users declare them: ``joins: [{table: devices, keys: [device_id],
how: left}]``. What a batch does with them is ``lowmark.batches.loop.dimensions``.

A join enriches each batch's records (after the ``transform``) with the rows of a Delta
table, a dimension, read as of the version the batch's offset-log entry records: a replay
joins against exactly the rows its first attempt joined against, and a dimension update
becomes visible at the next batch planned after it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from lowmark.batches.config import UserConfig

BROADCAST_MAX_BYTES = 32 * 1024 * 1024
"""``broadcast: auto`` broadcasts a dimension whose version's data files (Parquet, as the
Delta log lists them) total at most this many bytes; a larger one is shuffled."""


class TableJoin(UserConfig):
    """Join each batch's records with a Delta table (a dimension) on equal keys.

    ``how: inner`` keeps the records that match a dimension row (the others are
    dropped, as in SQL, and counted among the records the transform dropped);
    ``how: left`` keeps every record, with nulls in the dimension's columns
    where no row matches. A record matching several dimension rows gives a row
    per match, as in SQL. Join keys compare with SQL equality: a null key
    matches nothing.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str = Field(
        description="The dimension's Delta table folder, relative to the data root or absolute."
    )
    keys: tuple[str, ...] = Field(
        min_length=1,
        description="Key columns, named alike in the records (after the transform) and the "
        "table (SQL's USING); the joined rows have each once.",
    )
    how: Literal["inner", "left"] = Field(
        default="inner",
        description="inner: records without a matching row are dropped; left: kept, with "
        "nulls for the table's columns.",
    )
    columns: tuple[str, ...] | None = Field(
        default=None,
        description="The table's columns the records get (besides the keys); default: all.",
    )
    broadcast: Literal["auto", "true", "false"] = Field(
        default="auto",
        description="Send the whole table to every task (true), shuffle both sides by key "
        "(false), or broadcast when the version's data files total at most 32 MiB (auto).",
    )

    @field_validator("broadcast", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: object) -> object:
        """YAML reads ``broadcast: true`` as a boolean: it means the word."""
        return str(value).lower() if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _distinct_columns(self) -> TableJoin:
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"`keys` names a key twice: {list(self.keys)}")
        if self.columns is not None and set(self.columns) & set(self.keys):
            raise ValueError(
                f"`columns` lists the keys {sorted(set(self.columns) & set(self.keys))}, which "
                "the joined rows have anyway: leave them out of `columns`"
            )
        return self

    def semantics(self) -> dict[str, Any]:
        """What the pipeline's fingerprint hashes of this join: everything but how it is
        executed (``broadcast``)."""
        return self.model_dump(exclude={"broadcast"})


def check_tables_distinct(joins: tuple[TableJoin, ...]) -> None:
    """Each dimension table is joined once (its version is recorded by its path)."""
    tables = [j.table for j in joins]
    twice = sorted({t for t in tables if tables.count(t) > 1})
    if twice:
        raise ValueError(f"`joins` joins {twice} more than once: join each table once")
