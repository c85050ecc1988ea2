"""Event-time partitions of a windowed pipeline's sink, as Dagster shows them.

A partition is a UTC hour or day of window STARTS (``backfill`` in the
pipeline). The partitions begin where the data begins: at ``backfill.start``
when set, else at the first window in the sink — read from the Delta log's
file statistics when the code location loads (Reload in the UI picks up a
later one) — else at the day it loads.

A partition counts as written by the stream once a batch ran with a
watermark at or past its ``final_at_ms`` (``lowmark.batches.loop.backfill``): every window
of it was closed and emitted by then. The micro-batch run reports such
partitions materialized, so the asset's partition view shows what the stream
wrote; a backfill reports each partition it replaced. A backfill of several
partitions runs them in ranges (``backfill_policy``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from lowmark.batches.loop.backfill import final_at_ms
from lowmark.batches.pipeline import DeltaSink, Pipeline, resolve
from lowmark.state.storage import open_table

HOURLY_KEY = "%Y-%m-%d-%H:%M"
DAILY_KEY = "%Y-%m-%d"

PARTITIONS_PER_BACKFILL_RUN = 24
"""At most this many partitions (a day of hours) per run of a backfill: each run starts
Spark (unless shared) and takes the pipeline's one pool slot once, then backfills its
partitions in turn, each over the whole committed history; more per run would hold the
slot, and so the stream, longer between its batches."""


def event_time_partitions(
    pipeline: Pipeline, data_root: Path
) -> dg.TimeWindowPartitionsDefinition | None:
    """Hourly or daily partitions from where ``pipeline``'s data starts; None when the
    pipeline has no ``backfill``."""
    config = pipeline.backfill
    if config is None:
        return None
    if config.start is not None:
        start = datetime.fromisoformat(config.start).replace(tzinfo=UTC)
    else:
        start = _first_window(pipeline, data_root) or datetime.now(UTC)
    hourly = config.granularity == "hourly"
    start = start.replace(minute=0, second=0, microsecond=0)
    if not hourly:
        start = start.replace(hour=0)
    return dg.TimeWindowPartitionsDefinition(
        start=start,
        fmt=HOURLY_KEY if hourly else DAILY_KEY,
        cron_schedule="0 * * * *" if hourly else "0 0 * * *",
        timezone="UTC",
    )


def backfill_policy(pipeline: Pipeline) -> dg.BackfillPolicy | None:
    """How Dagster splits a backfill of ``pipeline``'s partitions into runs: ranges of up to
    ``PARTITIONS_PER_BACKFILL_RUN`` consecutive partitions, a run each (the backfill dialog's
    *Launch backfill*, listed under *Backfills*); None without partitions."""
    if pipeline.backfill is None:
        return None
    return dg.BackfillPolicy.multi_run(max_partitions_per_run=PARTITIONS_PER_BACKFILL_RUN)


def _first_window(pipeline: Pipeline, data_root: Path) -> datetime | None:
    """The smallest ``window_start`` in the sink's file statistics (no data read)."""
    if not isinstance(pipeline.sink, DeltaSink):  # a pipeline with partitions has a Delta sink
        return None
    try:
        table = open_table(resolve(pipeline.sink.path, data_root))
    except Exception:  # no sink yet (or not readable here): the caller falls back to today
        return None
    actions = pa.table(table.get_add_actions(flatten=True))
    if "min.window_start" not in actions.column_names or not actions.num_rows:
        return None
    first = pc.min(actions.column("min.window_start")).as_py()
    return first.astimezone(UTC) if first is not None else None


def final_partition_keys(
    pipeline: Pipeline, partitions: dg.TimeWindowPartitionsDefinition, watermark_ms: int | None
) -> list[str]:
    """Keys of the partitions every window of which is final once a batch ran with
    ``watermark_ms``, oldest first."""
    if watermark_ms is None:
        return []
    # final_at_ms(end) is end + a constant: the newest final partition ends by this.
    newest_end_ms = watermark_ms - final_at_ms(pipeline, 0)
    start = partitions.start
    size = timedelta(hours=1) if partitions.fmt == HOURLY_KEY else timedelta(days=1)
    count = (newest_end_ms - int(start.timestamp() * 1000)) // (size // timedelta(milliseconds=1))
    return [(start + i * size).strftime(partitions.fmt) for i in range(max(count, 0))]
