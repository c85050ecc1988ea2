"""What every record carries through a batch's steps, whichever source read it and whichever
step judges it: the columns a source adds, and the shape of a record set aside as late.

Sources (``lowmark.batches.sources``) add the columns; the event-time stages, deduplication
and keyed steps read them and build late records: this module sits below all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column


PARTITION_COLUMN = "_lowmark_partition"
"""Every record a source returns names its source partition here (a string)."""
BATCH_COLUMN = "_lowmark_batch"
"""The batch of a record in a read of several batches (``Source.read_batches``)."""
INGESTED_COLUMN = "_lowmark_ingested_ms"
"""A record's own ingestion time (epoch ms), added by a source whose pipeline follows its
ingestion clock when the source can tell it per record (a Kafka ``LogAppendTime`` record's
timestamp, a file's listing or modification time, a Delta version's commit time, a
synthetic record's paced time); null, or absent, when it cannot: the record is then judged
by its batch's clock."""
INTERNAL_COLUMNS = (PARTITION_COLUMN, BATCH_COLUMN, INGESTED_COLUMN)
"""The columns lowmark adds to records: never a record's payload, nor written to a sink."""
UNTIMED = "no event time: the event-time column is null"
"""The late table's reason for a record without event time."""


def late_struct(event_us: Column, reason: Column, payload: list[str]) -> Column:
    """A record's ``LATE_RECORD``: its event time (epoch µs), ``reason``, and its ``payload``
    columns as JSON."""
    from pyspark.sql import functions as F

    return F.struct(
        event_us.alias("event_us"),
        reason.alias("reason"),
        F.to_json(F.struct(*payload)).alias("record"),
    )


def own_ingestion_clock(lags: Mapping[str, int]) -> Column | None:
    """Per record, the clock it is judged by on its own: its ingestion time
    (``INGESTED_COLUMN``) minus the maximum event-time lag of its partition, found by the
    prefix of its name in ``lags`` (``""``: every partition); null when it has none (its
    source cannot tell, or its partition follows event time). None without ``lags``.

    Nothing ingested before a record is still to come once it is ingested, in any
    partition whose clock is its source's (a broker's append time, a commit time, a file's
    time), so the group clock at its own position is its ingestion time: a function of the
    input alone, where a batch's clock is the one at the batch's start."""
    from pyspark.sql import functions as F

    if not lags:
        return None
    if "" in lags:
        return F.col(INGESTED_COLUMN) - F.lit(lags[""])
    lag = F.lit(None).cast("long")
    for prefix, n in sorted(lags.items(), key=lambda p: len(p[0])):
        lag = F.when(F.col(PARTITION_COLUMN).startswith(prefix), F.lit(n)).otherwise(lag)
    return F.col(INGESTED_COLUMN) - lag
