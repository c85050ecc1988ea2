"""The late table (default dead-letter): records that came after their windows closed.

Nothing is dropped silently: each late record lands here with its event
time, the watermark that rejected it, the reason and the batch.
"""

from __future__ import annotations

import pyarrow as pa

from lowmark.state.table import UTC_MICROS

SCHEMA = pa.schema(
    [
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("event_time", UTC_MICROS),
        pa.field("watermark_ms", pa.int64(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("record", pa.string(), nullable=False),
    ]
)
