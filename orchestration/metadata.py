"""What a committed batch reports to Dagster, in units a person reads.

One unit each: rows as counts, lags and durations in seconds (rounded),
times as Dagster timestamps (shown as times), offsets as text. Dagster plots
the integer and float entries across materializations, so only what is worth
a chart is a number: rows in/out/late/bad, lag, batch duration, the source's
backlog, each table's row count, a windowed sink's open windows. The batch
id, the watermark and the offsets are text and timestamps (shown, not
plotted).

Dagster has no duration type: a number is shown as written (``lag_seconds
1656.3``). So the lag is twice: ``lag_seconds``, the float its plot needs (the
unit in its name), and ``lag``, text that reads as a duration (``27 min 36 s``,
as the CLI writes durations). A batch's duration is seconds a person reads at
a glance (``duration_seconds 4.2``) and stays a number only.


*Metadata plots*) default to one point per partition: the newest
materialization of each of the newest 120 partitions, materializations
without a partition left out. So the materialization of each partition a batch
makes final carries that batch's numbers (``batch_numbers``) beside the
partition's rows (``dagster/row_count``): the per-batch series, one point per
partition, by the batch that closed it. Every batch, one point each, is
plotted by time (*Plots* → *Events*).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import dagster as dg

from lowmark.batches.cli.display import duration
from lowmark.batches.loop.microbatch import BatchResult
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.sources.base import describe_range
from lowmark.orchestration.keys import bad_records_key, extra_sink_keys, late_key, sink_key
from lowmark.orchestration.tables import ROW_COUNT


def batch_line(pipeline: Pipeline, r: BatchResult) -> str:
    """The run log's line for one batch."""
    verb = "replayed" if r.replay else "committed"
    line = (
        f"{pipeline.name} batch {r.batch_id} {verb} in {_seconds(r):.1f} s: {r.rows_in} rows "
        f"in, {r.rows_out} out, {r.rows_late} late, {r.rows_bad} bad"
        + (f", {r.rows_duplicate} duplicates" if r.rows_duplicate is not None else "")
        + f"; input {describe_range(r.start, r.end)}"
    )
    if r.watermark_ms is not None:
        line += f"; watermark {_iso(r.watermark_ms)}"
    return line


def batch_numbers(r: BatchResult, backlog: dict[str, int]) -> dict[str, int | float]:
    """What Dagster plots of one batch: its rows, duration and lag; ``backlog`` is what the
    source still held past the batch (``Source.backlog``), by its headline unit:
    ``backlog_files``, ``backlog_records`` (Kafka: end offsets minus committed)."""
    numbers: dict[str, int | float] = {
        "rows_in": r.rows_in,
        "rows_out": r.rows_out,
        "rows_late": r.rows_late,
        "rows_bad": r.rows_bad,
        "duration_seconds": round(_seconds(r), 2),
    }
    if r.rows_duplicate is not None:
        numbers["rows_duplicate"] = r.rows_duplicate
    if r.lag_ms is not None:
        numbers["lag_seconds"] = round(r.lag_ms / 1000, 1)
    for unit, count in list(backlog.items())[:1]:
        numbers[f"backlog_{unit}"] = count
    return numbers


def batch_metadata(r: BatchResult, backlog: dict[str, int]) -> dict[str, dg.RawMetadataValue]:
    """The sink materialization's metadata for one batch: its numbers (``batch_numbers``),
    and its id, offsets and watermark as text and times."""
    metadata: dict[str, dg.RawMetadataValue] = {
        "batch": dg.MetadataValue.text(str(r.batch_id)),
        "replayed": r.replay,
        "input": dg.MetadataValue.text(describe_range(r.start, r.end)),
        **batch_numbers(r, backlog),
    }
    if r.watermark_ms is not None:
        metadata["watermark"] = dg.MetadataValue.timestamp(r.watermark_ms / 1000)
    if r.lag_ms is not None:
        metadata["lag"] = dg.MetadataValue.text(duration(r.lag_ms))
    if r.ingestion_ms is not None:  # the ingestion clock of each source partition
        metadata["ingested_up_to"] = dg.MetadataValue.json(
            {p: _iso(ms) for p, ms in sorted(r.ingestion_ms.items())}
        )
    return metadata


@dataclass(frozen=True)
class TablesRead:
    """What the driver read of a pipeline's tables after a batch (``lowmark.orchestration.tables``),
    as metadata per table; ``partitions``: each event-time partition the batch made final,
    with its rows (windows) in the sink."""

    sink: dict[str, dg.RawMetadataValue] = field(default_factory=dict)
    late: dict[str, dg.RawMetadataValue] = field(default_factory=dict)
    bad: dict[str, dg.RawMetadataValue] = field(default_factory=dict)
    partitions: dict[str, int] = field(default_factory=dict)


def batch_materializations(
    pipeline: Pipeline, r: BatchResult, backlog: dict[str, int], tables: TablesRead
) -> list[dg.AssetMaterialization]:
    """The sink's materialization for batch ``r``, with its table's row count and schema
    (a windowed sink's: its open windows too); the late (event-time pipelines) and
    bad-records tables' — every batch, so neither reads as in progress for the whole of a
    run that follows the source — with the rows ``r`` appended and their row count and
    schema; one per event-time partition of the sink it made final, with its rows and
    ``r``'s numbers: what the partitioned sink's plots (by partition) show; each extra
    sink's, with the rows ``r`` wrote to it."""
    batch = dg.MetadataValue.text(str(r.batch_id))
    numbers = batch_numbers(r, backlog)
    # The partitions first: the asset page shows the newest event, the batch's own.
    events = [
        dg.AssetMaterialization(
            sink_key(pipeline),
            partition=key,
            description=f"every window of {key} final with batch {r.batch_id}",
            metadata={"written_by": "stream", "batch": batch, **numbers, ROW_COUNT: rows},
        )
        for key, rows in tables.partitions.items()
    ]
    if pipeline.event_time is not None:
        events.append(
            dg.AssetMaterialization(
                late_key(pipeline), metadata={"batch": batch, "rows": r.rows_late, **tables.late}
            )
        )
    events.append(
        dg.AssetMaterialization(
            bad_records_key(pipeline), metadata={"batch": batch, "rows": r.rows_bad, **tables.bad}
        )
    )
    events.extend(
        dg.AssetMaterialization(key, metadata={"batch": batch, "rows": r.rows_out})
        for key in extra_sink_keys(pipeline).values()
    )
    events.append(
        dg.AssetMaterialization(
            sink_key(pipeline),
            description=f"batch {r.batch_id} {'replayed' if r.replay else 'committed'}",
            metadata=batch_metadata(r, backlog) | tables.sink,
        )
    )
    return events


def _seconds(r: BatchResult) -> float:
    return r.durations_ms.get("total", 0) / 1000


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
