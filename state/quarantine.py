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
