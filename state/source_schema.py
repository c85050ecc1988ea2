"""The source schema, fixed when the checkpoint first reads data.

Inferring a schema anew each batch would let two batches disagree; like
Spark's file stream source, lowmark infers once and keeps the result here
(as Spark's JSON schema text).
"""

from __future__ import annotations

import pyarrow as pa

from lowmark.state.table import DriverTable

SCHEMA = pa.schema([pa.field("schema_json", pa.string(), nullable=False)])


class SourceSchema:
    """The ``schema`` table of a checkpoint: at most one row."""

    def __init__(self, path: str, txn_app_id: str) -> None:
        self.table = DriverTable(path, SCHEMA, "source schema table")
        self.txn_app_id = txn_app_id

    def get(self) -> str | None:
        """The recorded schema as JSON text, or None."""
        if not self.table.exists():
            return None
        rows = self.table.read().column("schema_json").to_pylist()
        return str(rows[0]) if rows else None

    def fix(self, schema_json: str) -> str:
        """Record ``schema_json`` unless one is recorded; return the recorded one."""
        rows = pa.Table.from_pylist([{"schema_json": schema_json}], schema=SCHEMA)
        self.table.append_once(rows, self.txn_app_id, 0)
        fixed = self.get()
        assert fixed is not None
        return fixed
