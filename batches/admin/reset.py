"""``lowmark reset PIPELINE``: start a pipeline over without writing its sink's data twice.

A new checkpoint reads its source from the beginning; if the sink still holds
what an earlier checkpoint wrote, every record would land in it twice. So a
new checkpoint refuses a sink whose newest lowmark commit is another
checkpoint's (``MicroBatchRunner``'s first batch; ``lowmark.state.ownership``), and a
reset offers the two safe ways on:

- ``truncate``: the sink is emptied (one Delta commit, naming the new
  checkpoint as its writer; time travel still reaches the old rows) and the
  new checkpoint takes the source from its beginning: the sink ends as if the
  pipeline had always run on the new checkpoint.
- ``after``: the new checkpoint starts right after the data the sink holds:
  the end offsets of the newest batch that wrote the sink (the old
  checkpoint's offset log) and, for a file source, the old file manifest up to
  there. Every state table (``lowmark.state.state_table``: open windows, the
  ids deduplication let through, a keyed step's state and timers, a join's
  held rows) is carried over as that batch's commit recorded it, with the
  watermark, per-partition times and next timer it left (the new checkpoint's
  ``start_commit``): the records the sink has not got yet (open windows, rows
  waiting for their match) are emitted as if the pipeline had never stopped.
  Refused before anything moves when an extra sink lacks that batch
  (``_refuse_a_sink_behind``): going on after it would never write it there.

Neither is offered for a sink another pipeline wrote last (its rows are not
ours to empty or to go on after). Either way the old checkpoint is moved aside
to ``<checkpoint>.reset-<UTC time>`` first, never deleted; a truncate that fails
moves it back (``_truncate``), so a reset is done or not, never half. Local
checkpoints only (a move is a rename).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

import pyarrow as pa
from deltalake import CommitProperties, write_deltalake
from pyspark.sql import SparkSession

from lowmark.batches.errors import (
    PipelineConfigInvalid,
    ResetFailed,
    SinkBehind,
    SinkHeldElsewhere,
)
from lowmark.batches.evolution import DefinitionChanged, blocking, classify
from lowmark.batches.loop.steps import found_state_tables
from lowmark.batches.pipeline import (
    PRIMARY_SINK,
    DeltaSink,
    FileSource,
    KafkaSink,
    Pipeline,
    PostgresSink,
    SinkKind,
    UnionSource,
    resolve,
)
from lowmark.batches.sinks import fences, written_on_driver
from lowmark.batches.sinks.owner import held_elsewhere, sink_holder
from lowmark.batches.sinks.postgres_db import PostgresTable
from lowmark.batches.sources.union import own
from lowmark.state.checkpoint import Checkpoint, find_checkpoint, move_aside, time_stamp
from lowmark.state.commit_log import CommitEntry, CommitLog
from lowmark.state.delta import USER_METADATA_CONF, latest_version
from lowmark.state.errors import CheckpointCorrupt, CheckpointMissing, LowmarkError
from lowmark.state.offset_log import OffsetEntry, OffsetLog, Offsets
from lowmark.state.ownership import last_writer, writer_metadata
from lowmark.state.session import SparkLike, own_session, provider
from lowmark.state.state_table import CARRIED
from lowmark.state.storage import delta_rs_options, is_table, open_table
from lowmark.state.table import DriverTable
from lowmark.state.watermarks import WatermarkTable

Mode = Literal["truncate", "after"]


@dataclass(frozen=True)
class Reset:
    """What a reset did."""

    mode: Mode
    checkpoint: str
    moved_to: str | None
    """Where the old checkpoint went (None: there was none)."""
    pipeline_id: str
    """The new checkpoint's."""
    start_offsets: Offsets | None
    """``after``: where the new checkpoint starts."""
    continues: str | None
    """``after``: the old checkpoint's pipeline id and batch the sink's data ends with."""
    files: int
    """``after``, file source: files of the old manifest the new one keeps as taken."""
    not_emptied: tuple[str, ...] = ()
    """``truncate``: one line per sink lowmark cannot empty (a Kafka topic, your own)."""


def reset(spark: SparkLike, pipeline: Pipeline, data_root: Path, mode: Mode) -> Reset:
    """Move ``pipeline``'s checkpoint aside and create a new one (see the module doc)."""
    location = pipeline.checkpoint_location(data_root)
    way_on = f"to start over, empty your sink and delete the checkpoint {location}"
    sink = resolve(pipeline.delta_sink("`lowmark reset`", way_on).path, data_root)
    local = local_checkpoint(location)
    _refuse_another_pipelines_sink(pipeline, local, sink)
    if mode == "after":
        return _after(pipeline, local, sink, data_root)
    return _truncate(spark, pipeline, data_root, location, local)


def _truncate(
    spark: SparkLike, pipeline: Pipeline, data_root: Path, location: str, local: str
) -> Reset:
    """``--truncate-sink``: every sink emptied for a new checkpoint, or nothing changed.

    Step 1. Refuse, before anything moves, a Delta or Postgres sink another
            pipeline wrote last (its rows are not ours to empty).
    Step 2. Move the old checkpoint aside (a runner still on it stops at its next
            fence, so it writes no sink from here on) and create the new one.
    Step 3. Empty each sink in one commit naming the new checkpoint as its writer:
            a Delta sink with its own writer engine, a Postgres sink with its fence.
            A Kafka topic or a sink of the user's own is not lowmark's to empty:
            its line in ``Reset.not_emptied`` says so.
    Step 4. On any failure in steps 2-3: delete the new checkpoint and move the old
            one back, so a retry moves it aside once, as if the failed reset had not
            run; the error names the sinks emptied already (empty again by the retry).
    """
    sinks = pipeline.sinks()
    # Step 1.
    for config in sinks.values():
        if isinstance(config, DeltaSink):
            _refuse_another_pipelines_sink(pipeline, local, resolve(config.path, data_root))
        elif isinstance(config, PostgresSink):
            _refuse_another_pipelines_table(pipeline, local, PostgresTable(config, ""))
    # Step 2.
    moved = move_aside(local, "reset")
    emptied: list[str] = []
    try:
        new = Checkpoint(location, pipeline.name)
        # Step 3.
        not_emptied = []
        for name, config in sinks.items():
            app_id = new.txn_app_id("sink" if name == PRIMARY_SINK else f"sink:{name}")
            what = _empty(spark, pipeline, pipeline.written_as(config), data_root, app_id)
            if what is None:
                not_emptied.append(_not_emptied(name, config))
            else:
                emptied.append(what)
    except Exception as exc:
        # Step 4.
        shutil.rmtree(local, ignore_errors=True)
        if moved is not None:
            os.rename(moved, local)
        done = f" ({', '.join(emptied)} emptied already)" if emptied else ""
        raise ResetFailed(
            f"reset of {pipeline.name} failed, its checkpoint {location} is back as it "
            f"was{done}: {_first_line(exc)}; fix that and run `lowmark reset "
            f"{pipeline.name} --truncate-sink` again"
        ) from exc
    return Reset("truncate", location, moved, new.pipeline_id, None, None, 0, tuple(not_emptied))


def _empty(
    spark: SparkLike, pipeline: Pipeline, config: SinkKind, data_root: Path, app_id: str
) -> str | None:
    """Empty the sink ``config`` (as written) in one commit naming ``app_id`` (batch -1) as
    its writer; what it emptied, or None for a sink lowmark cannot empty."""
    if isinstance(config, PostgresSink):
        PostgresTable(config, app_id).empty()
        return f"postgres {config.table}"
    if not isinstance(config, DeltaSink):
        return None
    path = resolve(config.path, data_root)
    if is_table(path):
        metadata = writer_metadata(app_id, -1)
        if written_on_driver(pipeline):
            _truncate_window_sink(path, metadata)
        else:
            _truncate_spark_sink(provider(spark)(), path, metadata)
    return path


def _not_emptied(name: str, config: SinkKind) -> str:
    """The line saying that sink ``name`` keeps its data, and what the user can do."""
    if isinstance(config, KafkaSink):
        return (
            f"sink {name} (Kafka topic {config.topic}) is not emptied: lowmark cannot delete "
            "a topic's records, so its readers get the source's records again from the "
            "beginning; to avoid that, delete and create the topic again before the next run"
        )
    return (
        f"sink {name} (your own) is not emptied: lowmark cannot empty it; empty it yourself "
        "before the next run, or its records land in it again from the beginning"
    )


def _truncate_window_sink(sink: str, metadata: str) -> None:
    """Empty a windowed pipeline's sink (delta-rs is its one writer engine) in a commit
    whose ``userMetadata`` is ``metadata``, naming the new checkpoint as its writer.

    A sink without rows (no window emitted yet) gets an empty append instead: delta-rs
    commits no delete that deletes nothing, and without a commit of the reset the new
    checkpoint's first batch would find the old checkpoint the sink's last writer.
    """
    commit = CommitProperties(custom_metadata={"userMetadata": metadata})
    table = open_table(sink)
    before = table.version()
    table.delete(commit_properties=commit)
    if open_table(sink).version() == before:
        empty = pa.schema(table.schema().to_arrow()).empty_table()
        write_deltalake(
            sink,
            empty,
            mode="append",
            commit_properties=commit,
            storage_options=delta_rs_options(sink),
        )


def _truncate_spark_sink(spark: SparkSession, sink: str, metadata: str) -> None:
    """Empty a stateless pipeline's sink (Spark is its one writer engine) in a commit whose
    ``userMetadata`` is ``metadata``; a sink without rows gets an empty append instead
    (as ``_truncate_window_sink``).

    In a session of its own (``own_session``: locally a new session, over Spark Connect a
    clone), whose confs no other write of the process sees.
    """
    session = own_session(spark)
    before = latest_version(sink)
    session.conf.set(USER_METADATA_CONF, metadata)
    try:
        session.sql(f"DELETE FROM delta.`{sink}`")
    finally:
        session.conf.unset(USER_METADATA_CONF)
    if latest_version(sink) == before:
        empty = session.read.format("delta").load(sink).limit(0)
        empty.write.format("delta").mode("append").option("userMetadata", metadata).save(sink)


def _refuse_another_pipelines_sink(pipeline: Pipeline, location: str, sink: str) -> None:
    """Neither way on is ``pipeline``'s to take when another pipeline wrote the sink
    last: truncating would delete that pipeline's rows."""
    writer = last_writer(sink)
    holder = sink_holder(location, writer.pipeline_id) if writer is not None else None
    if writer is not None and holder is not None and holder.pipeline_name != pipeline.name:
        raise held_elsewhere(pipeline, location, sink, writer.pipeline_id, writer.batch_id)


def _refuse_another_pipelines_table(
    pipeline: Pipeline, location: str, table: PostgresTable
) -> None:
    """As ``_refuse_another_pipelines_sink``, for a Postgres sink (its fence names its writers)."""
    writer = table.last_writer()
    if writer is None:
        return
    holder = find_checkpoint(os.path.dirname(location.rstrip("/")), writer)
    if holder is not None and holder.pipeline_name != pipeline.name:
        raise SinkHeldElsewhere(
            f"sink postgres {table.config.table} is pipeline {holder.pipeline_name}'s "
            f"(checkpoint {holder.location}): {pipeline.name} must not empty it; give "
            f"{pipeline.name} a table of its own"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _after(pipeline: Pipeline, location: str, sink: str, data_root: Path) -> Reset:
    writer = last_writer(sink)
    if writer is None:
        raise PipelineConfigInvalid(
            f"sink {sink} holds no batch lowmark wrote: there is nothing to start after; "
            f"use `lowmark reset {pipeline.name} --truncate-sink`, or just run the pipeline"
        )
    old = _old_tables(location, writer.pipeline_id, pipeline.name)
    _refuse_a_sink_behind(pipeline, old, data_root, writer.pipeline_id, writer.batch_id)
    entry = _offsets_of(old, writer.batch_id)
    _refuse_state_of_another_definition(pipeline, entry)
    end = entry.end_offsets
    staging = f"{location}.new-{time_stamp()}"
    files_end = file_offsets(pipeline, end)
    taken = taken_files(f"{old}/files", files_end)
    if taken is not None:
        files = DriverTable(f"{staging}/files", taken.schema, "file manifest")
        files.append_once(taken, CARRIED, 0)
    retired = taken_files(f"{old}/files_history", files_end)
    if retired is not None and retired.num_rows:
        history = DriverTable(f"{staging}/files_history", retired.schema, "manifest history")
        history.append_once(retired, CARRIED, 0)
    start_commit = _carry_over(pipeline, old, writer.pipeline_id, writer.batch_id, staging)
    schema = _schema_json(old)
    # The old source's identity goes with its offsets: batch 0 refuses a replaced source.
    new = Checkpoint(
        staging,
        pipeline.name,
        start_offsets=end,
        adopted_from=writer.pipeline_id,
        start_identity=entry.source_identity,
        start_commit=start_commit,
    )
    if schema is not None:
        new.schema.fix(schema)
    moved = move_aside(location, "reset")
    os.rename(staging, location)
    return Reset(
        "after",
        location,
        moved,
        new.pipeline_id,
        end,
        f"{writer.pipeline_id} batch {writer.batch_id}",
        taken.num_rows if taken is not None else 0,
    )


def _refuse_state_of_another_definition(pipeline: Pipeline, entry: OffsetEntry) -> None:
    """Raise ``DefinitionChanged`` when ``pipeline``'s definition differs from the one
    ``entry``, the sink's last batch, ran under by a change its state cannot be carried
    across (``evolution.blocking``): windows of another size, other keys, another
    event-time column would go on from state that means something else. An entry that
    predates recording definitions is not checked (nothing is known of it)."""
    recorded = entry.pipeline_definition
    if recorded is None:
        return
    changes = classify(recorded, pipeline.definition())
    stops = blocking(changes)
    if stops:
        name = pipeline.name
        what = "; ".join(change.describe() for change in stops)
        raise DefinitionChanged(
            f"pipeline {name} changed since batch {entry.batch_id} wrote its sink, in ways its "
            f"state cannot be carried across ({what}): restore the old definition to go on "
            f"after the sink, or start over with `lowmark reset {name} --truncate-sink`",
            changes,
        )


def _refuse_a_sink_behind(
    pipeline: Pipeline, old: str, data_root: Path, pipeline_id: str, batch_id: int
) -> None:
    """``SinkBehind`` when a sink of ``pipeline`` that can tell lacks batch ``batch_id`` of
    the old checkpoint ``pipeline_id`` (at ``old``), the batch the sink's data ends with: a
    new checkpoint going on after it would never write that batch there. A committed batch
    is in every sink (it commits only after the last one wrote it); a sink that cannot tell
    (your own) is named as unknown and does not block."""
    commits = CommitLog(f"{old}/commits", CommitEntry, "")
    if commits.exists() and commits.get(batch_id) is not None:
        return
    last = {
        name: fence.last_landed()
        for name, fence in fences(pipeline, data_root, f"{pipeline_id}:sink").items()
    }
    behind = [name for name, landed in last.items() if landed is not None and landed < batch_id]
    if not behind:
        return
    name = pipeline.name
    held = ", ".join(
        f"{each} {'unknown' if landed is None else landed}" for each, landed in last.items()
    )
    raise SinkBehind(
        f"the sinks of {name} hold checkpoint {pipeline_id}'s batches up to ({held}; "
        f"unknown: a sink of your own, not checked): going on after batch {batch_id} would "
        f"never write it to {', '.join(behind)}; fix what stops it there and run `lowmark run "
        f"{name} --retry` (the batch's replay writes only the sinks that miss it), then "
        f"`lowmark reset {name} --after-sink` again"
    )


def _old_tables(location: str, pipeline_id: str, name: str) -> str:
    """The old checkpoint's folder, after checking it is the one that wrote the sink last."""
    metadata = DriverTable(f"{location}/checkpoint", None, "checkpoint table")
    try:
        rows = metadata.read().to_pylist() if metadata.exists() else []
    except LowmarkError as exc:
        raise CheckpointCorrupt(
            f"{exc}; without it `--after-sink` cannot tell where the sink's data ends: "
            f"use `lowmark reset {name} --truncate-sink`"
        ) from exc
    if not rows or rows[0]["pipeline_id"] != pipeline_id:
        found = rows[0]["pipeline_id"] if rows else "no checkpoint"
        raise CheckpointMissing(
            f"the sink was last written by checkpoint {pipeline_id}, but {location} holds "
            f"{found}: put that checkpoint back at {location}, or use "
            f"`lowmark reset {name} --truncate-sink`"
        )
    return location


def _offsets_of(location: str, batch_id: int) -> OffsetEntry:
    log = OffsetLog(f"{location}/offsets", OffsetEntry, "")
    entry = log.get(batch_id) if log.exists() else None
    if entry is None:
        raise CheckpointMissing(
            f"offset log {log.path} lacks batch {batch_id}, the last the sink holds: "
            "use `--truncate-sink`"
        )
    return entry


def taken_files(path: str, end: Offsets) -> pa.Table | None:
    """The rows of files before ``end`` of the old manifest (or its history) at ``path``
    (None: a source without one)."""
    table = DriverTable(path, None, "file manifest")
    if not table.exists():
        return None
    rows = table.read()
    keep = [r for r in rows.to_pylist() if r["seq"] < end.get(r["partition"], 0)]
    return pa.Table.from_pylist(keep, schema=rows.schema)


def file_offsets(pipeline: Pipeline, end: Offsets) -> Offsets:
    """The part of ``end`` the checkpoint's file manifest numbers: a union's folder member
    keeps its files under its own partition names (``<member>/<partition>`` in the union's
    offsets)."""
    source = pipeline.source
    if not isinstance(source, UnionSource):
        return end
    folders = [name for name, part in source.sources.items() if isinstance(part, FileSource)]
    return {p: n for name in folders for p, n in own(end, name).items()}


def _carry_over(
    pipeline: Pipeline, old: str, pipeline_id: str, batch_id: int, staging: str
) -> CommitEntry | None:
    """Every state table of the old checkpoint at ``old`` as commit ``batch_id`` recorded it,
    copied into ``staging``, and the commit the new checkpoint starts from: the watermark,
    per-partition times and next timer that commit left (None: a pipeline with neither
    state nor event time, which starts from nothing)."""
    tables = found_state_tables(old, pipeline_id)
    if not tables and pipeline.event_time is None:
        return None
    done = CommitLog(f"{old}/commits", CommitEntry, "").get(batch_id)
    if done is None:
        raise CheckpointMissing(
            f"batch {batch_id} of {pipeline.name} wrote its sink but did not commit, so the "
            f"state it leaves is not recorded: run `lowmark run {pipeline.name}` to finish it, "
            "then reset again"
        )
    versions: dict[str, int] = {}
    for state in tables:
        version = state.carry_over(done.table_versions, batch_id, staging)
        if version is not None:
            versions[state.role] = version
    if "watermarks" in done.table_versions:
        times = WatermarkTable(f"{old}/watermarks", "").at(batch_id)
        versions["watermarks"] = WatermarkTable(f"{staging}/watermarks", "").start_with(times)
    return CommitEntry(
        batch_id=-1,
        runner_id="lowmark reset",
        next_watermark_ms=done.next_watermark_ms,
        next_timer_ms=done.next_timer_ms,
        table_versions=versions,
    )


def _schema_json(location: str) -> str | None:
    table = DriverTable(f"{location}/schema", None, "source schema table")
    if not table.exists():
        return None
    values = table.read().column("schema_json").to_pylist()
    return str(values[0]) if values else None


def local_checkpoint(location: str) -> str:
    parsed = urlparse(location)
    if parsed.scheme not in ("", "file"):
        raise PipelineConfigInvalid(
            f"checkpoint {location} is not on a local disk: move it aside with your "
            "storage's tools, then run `lowmark reset` again"
        )
    return parsed.path if parsed.scheme == "file" else location
