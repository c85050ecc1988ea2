"""Backfill one event-time partition of a windowed pipeline's sink.

A partition is a UTC interval ``[start, end)`` (a day or an hour, see
``EventTimePartitions``). Backfilling it recomputes every window that STARTS
in it from the source's committed history — everything the checkpoint's
batches took, from where batch 0 started, late records included — and
replaces exactly that slice of the sink in one Delta transaction
(``replaceWhere``). Windows outside the slice are never touched.

The sink of a windowed pipeline is written on the driver with delta-rs (its
one writer engine, see ``lowmark.batches.sinks.delta``), and so is the backfill. It
is idempotent the way batches are: the write carries the application
transaction ``<pipeline_id>:backfill:<start ms>`` with version = the last
committed batch, so repeating a backfill over the same committed history is skipped by
Delta, and a backfill after more batches committed recomputes.

A backfill owns the windows that start in its partition, and only once the
stream is done with them, so that no (key, window) is ever written twice:

- the watermark the next batch runs with (the last commit's) has passed
  ``end + window span + allowed_lateness`` (the span is the window size, or
  the gap for sessions): every record of a window of the slice that a batch
  reads from now on is late, so no batch opens or updates one again;
- window state at the version the last commit recorded holds none of the
  slice's windows: a window the watermark has closed is emitted by the next
  batch (and a session may still grow), so while one is there, the stream
  still owns it.

Both are read from the last commit, which no later batch changes, so the
rule needs no lock against runs: a batch running beside the backfill, the
replay of one that crashed after its state write (the newest state version
no longer holds the window, the recorded one does) and every later batch
find the slice's windows closed and emit none. ``force`` skips the first
check only (the stream may then open windows of the slice again and write
them after the backfill's); the second always holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lowmark.batches.errors import BackfillHistoryLost, PartitionNotClosed, PipelineConfigInvalid
from lowmark.batches.event_time.dedup import as_let_through
from lowmark.batches.event_time.stage import WindowedStage, window_state
from lowmark.batches.evolution import DefinitionChanged, blocking, classify
from lowmark.batches.expectations import Checks
from lowmark.batches.pipeline import Pipeline, resolve
from lowmark.batches.sources import build_source
from lowmark.batches.sources.base import Range
from lowmark.batches.windows import Session
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.offset_log import OffsetEntry, Offsets
from lowmark.state.seen_ids import SeenIds, let_through
from lowmark.state.table import DriverTable, micros_literal


@dataclass(frozen=True)
class BackfillResult:
    """What a backfill of one partition did."""

    start: datetime
    end: datetime
    based_on_batch: int
    """The last committed batch: the history the windows were computed from."""
    windows: int
    skipped: bool
    """True when this exact backfill (same partition, same history) had already landed."""
    sink_version: int


def final_at_ms(pipeline: Pipeline, end_ms: int) -> int:
    """The watermark from which no window starting before ``end_ms`` changes again: ``end +
    window span (session: gap) + allowed_lateness``. A batch running with it emits them all."""
    assert pipeline.event_time is not None and pipeline.aggregation is not None
    window = pipeline.aggregation.window
    span = window.gap if isinstance(window, Session) else window.size
    return end_ms + span + pipeline.event_time.allowed_lateness


def backfill_partition(
    spark: SparkSession,
    pipeline: Pipeline,
    data_root: Path,
    start: datetime,
    end: datetime,
    force: bool = False,
) -> BackfillResult:
    """Recompute the windows starting in ``[start, end)`` and replace that slice of the sink.

    Step 1. Read the checkpoint: last committed batch, its end offsets and watermark.
    Step 2. Refuse a partition the watermark has not closed (unless ``force``), or
            whose windows are still in state.
    Step 3. Read the committed history from the source (refused, the sink unchanged, when
            the source no longer holds all of it), transform it and leave out what the
            ``drop`` expectations drop (and, deduplicating, the records no batch let
            through: the seen-ids table as of the versions the commits recorded).
    Step 4. Aggregate it as one batch; keep the windows that start in the partition.
    Step 5. Replace the slice of the sink, idempotently.
    """
    event_time, aggregation = pipeline.event_time, pipeline.aggregation
    if event_time is None or aggregation is None:
        raise PipelineConfigInvalid(
            f"pipeline {pipeline.name} has no windowed aggregation: only windowed "
            "pipelines can be backfilled by event-time partition"
        )
    sink_config = pipeline.delta_sink("a backfill", "remove `backfill` from the pipeline")
    unreplayable = _unreplayable(pipeline)
    if unreplayable is not None:
        raise PipelineConfigInvalid(
            f"pipeline {pipeline.name} {unreplayable}, which one aggregation over its history "
            "cannot replay: its windows stay as the stream wrote them (to recompute them all, "
            f"`lowmark reset {pipeline.name} --truncate-sink`)"
        )
    start_ms, end_ms = _ms(start), _ms(end)

    # Step 1. Checkpoint.
    location = pipeline.checkpoint_location(data_root)
    ckpt = Checkpoint(location, pipeline.name) if Checkpoint.exists(location) else None
    done = ckpt.commits.get_latest() if ckpt else None
    if ckpt is None or done is None:
        raise PartitionNotClosed(
            f"pipeline {pipeline.name} has committed no batch yet: run it first "
            f"(`lowmark run {pipeline.name}`), then backfill"
        )
    committed = ckpt.offsets.get(done.batch_id)
    assert committed is not None, "a committed batch always has its offsets"
    _check_computes_as_the_stream(pipeline, committed)

    # Step 2. Only a slice the stream is done with (see the module docstring).
    closes_at = final_at_ms(pipeline, end_ms)
    watermark = done.next_watermark_ms
    if not force and (watermark is None or watermark < closes_at):
        raise PartitionNotClosed(
            f"partition {_iso(start)}..{_iso(end)} of {pipeline.name} is still open: its "
            f"windows are final once the watermark reaches {_iso_ms(closes_at)}, it is at "
            f"{_iso_ms(watermark) if watermark is not None else 'none'}; wait, or force it "
            "(the stream may then write windows of this slice again)"
        )

    state = window_state(ckpt, aggregation)
    held = state.touched(done.table_versions.get("state"), start_ms * 1000, end_ms * 1000 - 1)
    if held is not None and held.num_rows:
        raise PartitionNotClosed(
            f"partition {_iso(start)}..{_iso(end)} of {pipeline.name} still has "
            f"{held.num_rows} window(s) in state after batch {done.batch_id}, which the stream "
            f"will write: run the pipeline until it has emitted them (`lowmark run "
            f"{pipeline.name}`), then backfill"
        )

    # Step 3. Committed history: from where batch 0 started, not where the source starts
    # now (Kafka's or Delta's latest, retention), and refused if the source lost any of it.
    source = build_source(spark, pipeline, data_root, ckpt)
    partition = f"partition {_iso(start)}..{_iso(end)} of {pipeline.name}"
    history = Range(done.batch_id, history_start(ckpt, partition), committed.end_offsets)
    missing = source.missing(history.start, history.end)
    if missing is not None:
        raise BackfillHistoryLost(
            f"{partition} not backfilled, the sink is unchanged: {missing}; the batches up to "
            f"{done.batch_id} read it, and the windows the stream wrote from it stay as they "
            "are: restore that input to backfill"
        )
    read = source.read(history.start, history.end, done.batch_id, strict=True)
    records = pipeline.transformed(read.records)
    checks = Checks(pipeline.name, pipeline.expectations, pipeline.quality)
    if checks.drops:  # what the stream's batches dropped never counted in a window
        records = records.where(~checks.dropped())
    if pipeline.dedup is not None:  # the records the stream's batches let through
        ids = let_through(
            SeenIds(
                ckpt.table("dedup_ids"), ckpt.txn_app_id("dedup"), pipeline.dedup.within * 1000
            ),
            done.batch_id,
            watermark,
            None if isinstance(aggregation.window, Session) else start_ms * 1000,
        )
        if ids is None:
            raise BackfillHistoryLost(
                f"{partition} not backfilled, the sink is unchanged: the ids its records' "
                "batches let through were purged from the seen-ids table and maintenance has "
                "since removed the versions that held them, so a backfill cannot keep the "
                "records the stream kept: the windows the stream wrote stay as they are (a "
                "longer dedup.within keeps ids for later backfills)"
            )
        records = as_let_through(records, pipeline.dedup, event_time.column, ids)

    # Step 4. One batch aggregation, sliced.
    stage = WindowedStage(event_time, aggregation, state)
    start_col = F.unix_millis("window_start")
    windows = stage.windows_of(records).where(
        (start_col >= F.lit(start_ms)) & (start_col < F.lit(end_ms))
    )
    windows = pipeline.post_aggregated(windows)  # as the stream's batches wrote them
    rows = windows.toArrow()
    read.unpersist()
    source.confirm(history)

    # Step 5. Replace the slice.
    sink_path = resolve(sink_config.path, data_root)
    sink = DriverTable(sink_path, None, "sink", sink_config.properties)
    slice_sql = (
        f'"window_start" >= {micros_literal(start_ms * 1000)} '
        f'AND "window_start" < {micros_literal(end_ms * 1000)}'
    )
    wrote = sink.replace_once(
        rows, slice_sql, ckpt.txn_app_id(f"backfill:{start_ms}"), done.batch_id
    )
    return BackfillResult(
        start, end, done.batch_id, rows.num_rows, skipped=not wrote, sink_version=sink.version()
    )


def _check_computes_as_the_stream(pipeline: Pipeline, committed: OffsetEntry) -> None:
    """A backfill computes under the pipeline's definition now: refused when it differs from
    the one the last committed batch ran under other than compatibly at a batch boundary
    (``lowmark.batches.evolution``), as the next batch would be: the slice would be
    computed otherwise than every window beside it."""
    if committed.pipeline_definition is None:
        return
    changes = classify(committed.pipeline_definition, pipeline.definition())
    stops = blocking(changes)
    if stops:
        name = pipeline.name
        raise DefinitionChanged(
            f"pipeline {name} changed since batch {committed.batch_id} ran, in ways its "
            f"sink's windows were not computed by ({'; '.join(c.describe() for c in stops)}): "
            f"a backfill would compute this slice otherwise; restore the old definition, or "
            f"start over with `lowmark reset {name} --truncate-sink`",
            changes,
        )


def _unreplayable(pipeline: Pipeline) -> str | None:
    """What of ``pipeline``'s batches a backfill cannot replay (None: nothing): each batch
    joined the dimensions' versions it was planned with, and a keyed step's or a
    stream-stream join's output depends on the state the batches before left."""
    if pipeline.joins:
        return "joins tables at the versions each batch was planned with"
    if pipeline.keyed is not None:
        return "runs a keyed step whose output depends on the state each batch found"
    if pipeline.stream_join is not None:
        return "joins two streams by the rows each batch found held"
    return None


def history_start(ckpt: Checkpoint, partition: str) -> Offsets:
    """Where batch 0 of ``ckpt`` started: as the checkpoint recorded it, or, in a checkpoint
    from before that was recorded, as the offset log's batch 0 says; ``partition`` names the
    backfill refused when neither is there."""
    if ckpt.start_offsets is not None:
        return ckpt.start_offsets
    first = ckpt.offsets.recorded(0, 0)
    if not first:
        raise BackfillHistoryLost(
            f"{partition} not backfilled, the sink is unchanged: checkpoint {ckpt.location} "
            "does not record where batch 0 started (it predates that record) and neither its "
            "offset log nor the log's history holds batch 0, so the history its windows were "
            "computed from is unknown: the windows the stream wrote stay as they are"
        )
    return first[0].start_offsets


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


def _iso_ms(ms: int) -> str:
    return _iso(datetime.fromtimestamp(ms / 1000, UTC))
