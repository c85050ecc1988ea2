"""The bad-records table: input rows that could not be parsed, kept verbatim.

A malformed row never stops a batch and is never dropped silently: it lands
here with the raw text, the file it came from and the reason.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA = pa.schema(
    [
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("source_file", pa.string()),
        pa.field("raw", pa.string()),
        pa.field("reason", pa.string(), nullable=False),
    ]
)


def bad_rows(parsed: pa.Table | None, dropped: pa.Table | None, batch_id: int) -> pa.Table | None:
    """Batch ``batch_id``'s rows of the ``bad_records`` table: the source's bad rows
    (``parsed``, in its schema) and the records ``drop`` expectations removed (``dropped``:
    ``raw`` and ``reason``, as ``lowmark.batches.expectations.Checks.dropped_rows`` gives
    them); None when neither has
    any. One table: the batch writes ``bad_records`` once (its idempotency key)."""
    tables = [parsed.select(SCHEMA.names).cast(SCHEMA)] if parsed is not None else []
    if dropped is not None and dropped.num_rows:
        n = dropped.num_rows
        rows = {
            "batch_id": pa.array([batch_id] * n, pa.int64()),
            "source_file": pa.nulls(n, pa.string()),
            "raw": dropped.column("raw").cast(pa.string()),
            "reason": dropped.column("reason").cast(pa.string()),
        }
        tables.append(pa.table(rows, schema=SCHEMA))
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else None
