"""``lowmark rebuild PIPELINE``: recompute a pipeline's output under its changed definition
beside the live tables, then swap it in.

A change of the *rebuild* class (``lowmark.batches.evolution``) is refused on the running
checkpoint: output already written would have to change. A rebuild recomputes that
output under the new definition from the input history the live checkpoint recorded,
while the live pipeline may go on under the old definition:

- into the shadow checkpoint ``<checkpoint>.rebuild`` and, for each Delta sink, the
  shadow sink ``<sink path>.rebuild``, beside the live ones;
- one shadow batch per committed live batch, over exactly the range the live offset log
  recorded for it and at the processing time it was planned (``RecordedRanges``), so the
  shadow holds what a fresh run of the new definition writes with the live's batching.
  Its offset log records the pipeline's definition (``build_parts``' ``records_as``), as
  the live checkpoint will once the shadow is swapped in.

Once the shadow holds every batch the live committed, the swap (``_swap``):

Step 1. Record in the shadow's ``rebuild.json`` where the live checkpoint goes (it
        names the live checkpoint the shadow was made from since its creation). From
        here a rebuild only finishes the swap.
Step 2. Move the live checkpoint aside to ``<checkpoint>.rebuilt-<UTC time>`` (never
        deleted). A runner still on it stops at its next fence (``CheckpointReplaced``,
        as after ``lowmark reset``); a run started now creates a new checkpoint, whose
        first batch finds the sink another checkpoint's (``SinkHeldElsewhere``).
Step 3. Run the shadow batches of the live batches committed before the move.
Step 4. Replace each live Delta sink's content with its shadow's in ONE commit (a reader
        sees the old table or the new one, never a mix; the schema may change),
        carrying the shadow's idempotency fence: ``txnAppId`` its sink key,
        ``txnVersion`` its last batch, and naming it the writer (``userMetadata``).
Step 5. Move the shadow checkpoint into the live one's place; whatever a refused run
        created there meanwhile is moved aside first.
Step 6. Delete the shadow sinks (their rows are the live sinks' now) and ``rebuild.json``.

Every step is idempotent, so a kill anywhere and a rebuild again finish the job exactly
once: a shadow batch is a batch (its own recovery rule), step 2 and step 5 look where the
checkpoints are, step 4 is skipped where its transaction landed. (As after ``lowmark
reset``, a batch of a live runner that passed its last fence before step 2 may still land
its sink write, after step 4's commit if it takes longer than steps 3-4: stop a live
runner whose batches take that long before its rebuild swaps.) Refused, before anything
is written (``RebuildRefused``): a sink that is not a Delta table (its content cannot be
swapped in one commit), a change the recorded offsets cannot be replayed under (another
source, a refused change), history neither the live offset log (nor the entries maintenance
retired to its history) nor the source still holds. A shadow of another live checkpoint
(``lowmark reset`` ran) or of another definition is moved aside
(``<checkpoint>.rebuild.dropped-<UTC time>``, its sinks likewise) and the rebuild starts
over. Local checkpoints only (a move is a rename).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake

from lowmark.batches.errors import RebuildRefused
from lowmark.batches.evolution import Change, classify
from lowmark.batches.loop import faults
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.loop.parts import build_parts
from lowmark.batches.loop.rebuildable import refusal
from lowmark.batches.pipeline import DeltaSink, Pipeline, resolve
from lowmark.batches.sinks import sink_app_id, written_on_driver
from lowmark.batches.sources import build_source
from lowmark.batches.sources.base import Clocks, Range, Skipped, Source, SourceRead
from lowmark.state import storage
from lowmark.state.checkpoint import Checkpoint, move_aside, time_stamp
from lowmark.state.errors import CheckpointCorrupt, CheckpointMissing
from lowmark.state.manifest import SCHEMA as MANIFEST_SCHEMA
from lowmark.state.offset_log import Identity, OffsetEntry, Offsets
from lowmark.state.ownership import writer_metadata
from lowmark.state.session import SparkLike, own_session, provider
from lowmark.state.storage import delta_rs_options, is_table, open_table
from lowmark.state.table import DriverTable, Write

SHADOW = ".rebuild"
"""What the shadow checkpoint's and shadow sinks' paths add to the live ones'."""
RECORD = "rebuild.json"
"""In the shadow checkpoint: the live checkpoint it was made from, and where the swap
moves that one (``_Record``)."""
RUNNER = "lowmark rebuild of live batch "
"""A shadow batch's runner id: this and the live batch it recomputes (``_live_batch``)."""


@dataclass(frozen=True, kw_only=True)
class Rebuilt:
    """What a rebuild did."""

    pipeline: str
    nothing: str | None = None
    """Why nothing was done (no change pending); None: the rebuild ran."""
    batches: int = 0
    """Shadow batches this call ran."""
    last_batch: int | None = None
    """The live batch the swapped-in checkpoint ends with (its last before the swap)."""
    moved_to: str | None = None
    """Where the old live checkpoint went."""
    sinks: tuple[str, ...] = ()
    """The live sinks whose content the swap replaced."""


@dataclass(frozen=True, kw_only=True)
class ShadowBatch:
    """One shadow batch committed (progress, told as it goes)."""

    shadow_batch: int
    live_batch: int
    live_last: int
    """The live's last committed batch, as of this pass."""
    replay: bool
    rows_out: int


@dataclass(frozen=True, kw_only=True)
class InProgress:
    """A rebuild under way (``lowmark status``): how far the shadow is."""

    shadow: str
    shadow_has: int | None
    """The last live batch the shadow has recomputed (None: none yet)."""
    live_last: int | None
    """The live's last committed batch (None: none, or the swap moved it aside)."""
    swapping: bool
    """The swap has started (step 1): a rebuild finishes it."""

    def describe(self) -> str:
        """In one line."""
        done = "none" if self.shadow_has is None else f"batch {self.shadow_has}"
        live = "none" if self.live_last is None else f"batch {self.live_last}"
        swap = "; swapping it in: `lowmark rebuild` finishes that" if self.swapping else ""
        return f"{self.shadow} has the live's {done} of {live}{swap}"


def shadow_location(pipeline: Pipeline, data_root: Path) -> str:
    """Where ``pipeline``'s shadow checkpoint is."""
    return pipeline.checkpoint_location(data_root).rstrip("/") + SHADOW


def in_progress(pipeline: Pipeline, data_root: Path) -> InProgress | None:
    """The rebuild of ``pipeline`` under way, if one is (no Spark, nothing written)."""
    location = shadow_location(pipeline, data_root)
    if not Checkpoint.exists(location):
        return None
    live = _live(pipeline, location.removesuffix(SHADOW))
    done = live.commits.get_latest() if live is not None else None
    return InProgress(
        shadow=location,
        shadow_has=_rebuilt_up_to(Checkpoint(location, pipeline.name)),
        live_last=done.batch_id if done is not None else None,
        swapping=_swapping(location) is not None,
    )


def shadow_pipeline(pipeline: Pipeline, data_root: Path) -> Pipeline:
    """``pipeline`` writing its shadow checkpoint and shadow sinks (paths resolved)."""
    sinks = {
        name: config.model_copy(update={"path": resolve(config.path, data_root) + SHADOW})
        for name, config in pipeline.sinks().items()
        if isinstance(config, DeltaSink)
    }
    primary, extra = next(iter(sinks.values())), dict(list(sinks.items())[1:])
    return pipeline.model_copy(
        update={
            "checkpoint": shadow_location(pipeline, data_root),
            "sink": primary,
            "extra_sinks": extra,
            "listeners": (),  # they hear of the pipeline's batches, not the shadow's
        }
    )


def rebuild(
    spark: SparkLike,
    pipeline: Pipeline,
    data_root: Path,
    on_batch: Callable[[ShadowBatch], None] = lambda _: None,
) -> Rebuilt:
    """Rebuild ``pipeline``'s output under its definition now, and swap it in (module doc);
    ``on_batch`` is told of each shadow batch committed."""
    from lowmark.batches.admin.reset import local_checkpoint  # PySpark: not for `status`

    location = local_checkpoint(pipeline.checkpoint_location(data_root))
    shadow_at = location + SHADOW
    _refuse(pipeline)
    finished = _finished(pipeline, data_root, location)
    if finished is not None:
        return finished
    record = _swapping(shadow_at)
    if record is not None:  # a swap cut short: only finishing it is left
        shadow = Checkpoint(shadow_at, pipeline.name)
        return _swap(spark, pipeline, data_root, shadow, record, on_batch, 0)
    live = _live(pipeline, location)
    _drop_stale_shadow(pipeline, data_root, shadow_at, live)
    if live is None:
        return Rebuilt(
            pipeline=pipeline.name,
            nothing=f"{pipeline.name} has committed no batch: there is no output to rebuild; "
            f"`lowmark run {pipeline.name}` runs it under its definition now",
        )
    last = _last_committed(live)
    if _pending(pipeline, last) is None:
        return Rebuilt(
            pipeline=pipeline.name,
            nothing=f"{pipeline.name}'s definition is the one its batch {last.batch_id} ran "
            "under: no change to rebuild",
        )
    _refuse_unreplayable(pipeline, live)
    _refuse_lost_history(spark, pipeline, data_root, live, last)
    shadow = _shadow(pipeline, data_root, shadow_at, live)
    ran = _catch_up(spark, pipeline, data_root, live, shadow, on_batch)
    record = _Record(live_id=live.pipeline_id, moved_to=f"{location}.rebuilt-{time_stamp()}")
    # Step 1.
    _write_record(shadow_at, record)
    faults.reached("swap_after_record", _shadow_last(shadow))
    return _swap(spark, pipeline, data_root, shadow, record, on_batch, ran)


@dataclass(frozen=True, kw_only=True)
class _Record:
    """What the shadow checkpoint records of its rebuild (``RECORD``)."""

    live_id: str
    """The live checkpoint the shadow was made from, and replaces."""
    moved_to: str | None = None
    """Where step 2 moves it (None: the swap has not started)."""


def _swap(
    spark: SparkLike,
    pipeline: Pipeline,
    data_root: Path,
    shadow: Checkpoint,
    record: _Record,
    on_batch: Callable[[ShadowBatch], None],
    ran: int,
) -> Rebuilt:
    """Steps 2-6 of the swap (module doc), each skipped where it is done."""
    location, moved_to = shadow.location.removesuffix(SHADOW), record.moved_to
    assert moved_to is not None  # step 1 recorded it
    # Step 2.
    if _pipeline_id_at(location) == record.live_id:
        os.rename(location, moved_to)
    elif not Checkpoint.exists(moved_to):
        raise CheckpointMissing(
            f"the live checkpoint {record.live_id} of {pipeline.name} is neither at {location} "
            f"nor at {moved_to}, where the swap moves it: put it back at {location} and "
            f"run `lowmark rebuild {pipeline.name}` again"
        )
    faults.reached("swap_after_move", _shadow_last(shadow))
    # Step 3.
    live = Checkpoint(moved_to, pipeline.name)
    ran += _catch_up(spark, pipeline, data_root, live, shadow, on_batch)
    last = _shadow_last(shadow)
    faults.reached("swap_after_catch_up", last)
    # Step 4.
    sinks = _sink_paths(pipeline, data_root)
    for name, path in sinks.items():
        app_id = sink_app_id(shadow.txn_app_id("sink"), name)
        _replace(spark, pipeline, path, path + SHADOW, app_id, last)
        faults.reached("swap_after_sink", last)
    # Step 5.
    if os.path.exists(location):  # a checkpoint a refused run created meanwhile
        move_aside(location, "refused-run")
    os.rename(shadow.location, location)
    faults.reached("swap_after_move_shadow", last)
    # Step 6.
    _clean_up(pipeline, data_root, location)
    return _swapped(pipeline, data_root, record, ran)


def _finished(pipeline: Pipeline, data_root: Path, location: str) -> Rebuilt | None:
    """A swap killed after step 5 (its record is in the live checkpoint now): its step 6,
    done now."""
    record = _swapping(location)
    if record is None:
        return None
    _clean_up(pipeline, data_root, location)
    return _swapped(pipeline, data_root, record, 0)


def _swapped(pipeline: Pipeline, data_root: Path, record: _Record, ran: int) -> Rebuilt:
    """What a rebuild that swapped the shadow in did (``ran`` shadow batches)."""
    assert record.moved_to is not None  # step 1 recorded it
    done = Checkpoint(record.moved_to, pipeline.name).commits.get_latest()
    return Rebuilt(
        pipeline=pipeline.name,
        batches=ran,
        last_batch=done.batch_id if done is not None else None,
        moved_to=record.moved_to,
        sinks=tuple(_sink_paths(pipeline, data_root).values()),
    )


def _clean_up(pipeline: Pipeline, data_root: Path, location: str) -> None:
    """Step 6: the shadow sinks deleted (their rows are the live sinks' now), then the
    rebuild's record."""
    from pyarrow.fs import FileType  # not for `lowmark status`, which asks `in_progress`

    for path in _sink_paths(pipeline, data_root).values():
        store, folder = storage.filesystem(path + SHADOW)
        if store.get_file_info(folder).type == FileType.Directory:
            store.delete_dir(folder)
    os.remove(os.path.join(location, RECORD))


def _replace(
    spark: SparkLike, pipeline: Pipeline, live: str, shadow: str, app_id: str, batch_id: int
) -> None:
    """Step 4 for one sink: the live sink ``live`` holds the shadow sink's rows, its schema
    too, after ONE commit of transaction (``app_id``, ``batch_id``), unless that landed
    already (emptied, when no shadow batch wrote a row). A windowed pipeline's sink is
    written by delta-rs, a stateless one's by Spark: each sink's one writer engine, as
    ``lowmark reset`` empties it."""
    if written_on_driver(pipeline):
        DriverTable(live, None, "sink").write_once(_overwrite_with(live, shadow), app_id, batch_id)
        return
    session = own_session(provider(spark)())
    if is_table(shadow):
        rows = session.read.format("delta").load(shadow)
    elif is_table(live):
        rows = session.read.format("delta").load(live).limit(0)
    else:
        return
    # Delta skips a write whose (txnAppId, txnVersion) the table recorded: idempotent.
    (
        rows.write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .option("txnAppId", app_id)
        .option("txnVersion", batch_id)
        .option("userMetadata", writer_metadata(app_id, batch_id))
        .save(live)
    )


def _overwrite_with(live: str, shadow: str) -> Write:
    """The delta-rs write of ``DriverTable.write_once`` that replaces a table's content and
    schema with the shadow sink's (nothing for a table that is not there and no shadow)."""

    def write(table: DeltaTable | None, commit: CommitProperties) -> None:
        if is_table(shadow):
            rows = open_table(shadow).to_pyarrow_table()
        elif table is not None:
            rows = pa.schema(table.schema().to_arrow()).empty_table()
        else:
            return
        write_deltalake(
            table if table is not None else live,
            rows,
            mode="overwrite",
            schema_mode="overwrite",
            commit_properties=commit,
            storage_options=delta_rs_options(live) if table is None else None,
        )

    return write


def _sink_paths(pipeline: Pipeline, data_root: Path) -> dict[str, str]:
    """Each Delta sink's live path, by sink name."""
    return {
        name: resolve(config.path, data_root)
        for name, config in pipeline.sinks().items()
        if isinstance(config, DeltaSink)
    }


def _record(shadow_at: str) -> _Record | None:
    """The rebuild's record in the checkpoint at ``shadow_at`` (None: none there)."""
    path = os.path.join(shadow_at, RECORD)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return _Record(**json.load(f))


def _swapping(location: str) -> _Record | None:
    """The record of a swap under way (step 1 done, step 6 not) in the checkpoint at
    ``location`` (the shadow's, or the live's once step 5 moved it there)."""
    record = _record(location)
    return record if record is not None and record.moved_to is not None else None


def _write_record(shadow_at: str, record: _Record) -> None:
    """The rebuild's record, written whole (renamed into place)."""
    path = os.path.join(shadow_at, RECORD)
    with open(f"{path}.tmp", "w") as f:
        json.dump(dataclasses.asdict(record), f)
    os.replace(f"{path}.tmp", path)


def _pipeline_id_at(location: str) -> str | None:
    """The id of the checkpoint at ``location`` (None: none there)."""
    if not Checkpoint.exists(location):
        return None
    ids = DriverTable(f"{location}/checkpoint", None).read().column("pipeline_id").to_pylist()
    return str(ids[0]) if ids else None


# Before anything is written: what there is to rebuild, and whether it can be.


def _refuse(pipeline: Pipeline, changes: Sequence[Change] = ()) -> None:
    """``RebuildRefused`` when a rebuild cannot recompute ``pipeline``'s output under
    ``changes`` (``rebuildable.refusal``)."""
    why = refusal(pipeline, changes)
    if why is not None:
        raise _refused(pipeline, why)


def _refused(pipeline: Pipeline, why: str) -> RebuildRefused:
    name = pipeline.name
    return RebuildRefused(
        f"{name} not rebuilt, nothing written: {why}; `lowmark reset {name} --truncate-sink` "
        "recomputes its output from the source's beginning instead"
    )


def _live(pipeline: Pipeline, location: str) -> Checkpoint | None:
    """The live checkpoint, if it has committed a batch."""
    if not Checkpoint.exists(location):
        return None
    live = Checkpoint(location, pipeline.name)
    return live if live.commits.get_latest() is not None else None


def _last_committed(live: Checkpoint) -> OffsetEntry:
    done = live.commits.get_latest()
    assert done is not None  # ``_live``
    entry = live.offsets.get(done.batch_id)
    assert entry is not None, "a committed batch always has its offsets"
    return entry


def _pending(pipeline: Pipeline, last: OffsetEntry) -> tuple[Change, ...] | None:
    """The changes since the definition ``last`` ran under (None: none); refused when the
    recorded offsets cannot be replayed under them."""
    if last.pipeline_fingerprint == pipeline.fingerprint():
        return None
    if last.pipeline_definition is None:
        raise _refused(
            pipeline,
            f"its batch {last.batch_id} predates lowmark recording definitions, so what "
            "changed is not known",
        )
    changes = classify(last.pipeline_definition, pipeline.definition())
    _refuse(pipeline, changes)
    return changes or None


def _refuse_unreplayable(pipeline: Pipeline, live: Checkpoint) -> None:
    """History the live checkpoint does not hold: what its sink held before it, the
    boundaries of batches its offset log dropped."""
    if live.adopted_from is not None:
        raise _refused(
            pipeline,
            f"its sink holds what checkpoint {live.adopted_from} wrote before `lowmark reset "
            "--after-sink`, which this checkpoint's history does not reach",
        )
    if not live.offsets.recorded(0, 0):
        raise _refused(
            pipeline,
            "neither its offset log nor the log's history holds batch 0 (a lowmark before "
            "the history dropped the entries maintenance retired), so the earlier batches' "
            "boundaries are gone",
        )


def _refuse_lost_history(
    spark: SparkLike, pipeline: Pipeline, data_root: Path, live: Checkpoint, last: OffsetEntry
) -> None:
    """The source must still hold every input the live batches read."""
    source = build_source(spark, pipeline, data_root, live)
    lost = source.missing(_history_start(live), last.end_offsets)
    if lost is not None:
        raise RebuildRefused(
            f"{pipeline.name} not rebuilt, nothing written: the source no longer holds all the "
            f"input its batches up to {last.batch_id} read ({lost}): restore that input, or "
            f"start over with `lowmark reset {pipeline.name} --truncate-sink` (the sink then "
            "holds only what the source still has)"
        )


def _history_start(live: Checkpoint) -> Offsets:
    """Where the live's batch 0 started."""
    if live.start_offsets is not None:
        return live.start_offsets
    [first] = live.offsets.recorded(0, 0)  # ``_refuse_unreplayable``
    return first.start_offsets


def _drop_stale_shadow(
    pipeline: Pipeline, data_root: Path, shadow_at: str, live: Checkpoint | None
) -> None:
    """A shadow of another live checkpoint than ``live`` (``lowmark reset`` ran since it was
    made; or a shadow whose creation was cut short before its record) or of another
    definition is moved aside, with its sinks: the rebuild starts over."""
    if not Checkpoint.exists(shadow_at):
        return
    record = _record(shadow_at)
    latest = Checkpoint(shadow_at, pipeline.name).offsets.get_latest()
    other_definition = latest is not None and latest.pipeline_fingerprint != pipeline.fingerprint()
    ours = record is not None and live is not None and record.live_id == live.pipeline_id
    if ours and not other_definition:
        return
    moved = move_aside(shadow_at, "dropped")
    stamp = moved.rsplit("-", 1)[1] if moved else time_stamp()
    for path in _sink_paths(pipeline, data_root).values():
        if os.path.exists(path + SHADOW):
            os.rename(path + SHADOW, f"{path}{SHADOW}.dropped-{stamp}")


def _shadow(pipeline: Pipeline, data_root: Path, shadow_at: str, live: Checkpoint) -> Checkpoint:
    """The shadow checkpoint, created beside the live one if there is none (starting where
    the live started, from the same source; its sink paths must be free), with its record
    naming the live checkpoint."""
    if Checkpoint.exists(shadow_at):
        return Checkpoint(shadow_at, pipeline.name)
    for path in _sink_paths(pipeline, data_root).values():
        if os.path.exists(path + SHADOW):
            raise RebuildRefused(
                f"{pipeline.name} not rebuilt, nothing written: {path + SHADOW}, where the "
                f"rebuild writes its shadow of sink {path}, is taken: move it away"
            )
    shadow = Checkpoint(
        shadow_at,
        pipeline.name,
        start_offsets=_history_start(live),
        start_identity=live.start_identity,
    )
    _write_record(shadow_at, _Record(live_id=live.pipeline_id))
    return shadow


# The shadow's batches.


class _RecordedClock:
    """Processing time as the live batch being recomputed was planned at."""

    def __init__(self) -> None:
        self.at_ms = 0

    def now_ms(self) -> int:
        return self.at_ms


class RecordedRanges(Source):
    """The shadow's source: the live source's input, in the ranges the live offset log
    recorded.

    ``plan(start)`` gives the end of the first recorded range from ``ranges`` (the live
    batch being recomputed first, then the ones after it, for the read-ahead) that starts
    at ``start``; ``start`` (nothing new) past them. A range the live batch started after
    lost input (``on_data_loss: skip``) is started the same way (``past_lost``). Reads,
    and everything else asked of the input, are the live source's; ``commit`` does
    nothing: upstream's resumption frontier is the live pipeline's to move.
    """

    def __init__(self, source: Source) -> None:
        self.source = source
        self.ranges: Sequence[OffsetEntry] = ()

    def _starting(self, start: Offsets) -> OffsetEntry | None:
        return next((e for e in self.ranges if e.start_offsets == start), None)

    def initial_offsets(self) -> Offsets:
        return self.source.initial_offsets()

    def plan(
        self,
        start: Offsets,
        batch_id: int,
        record: bool = True,
        discover: bool = True,
        clocks: Clocks | None = None,
    ) -> Offsets:
        """The recorded end of the range starting at ``start``; the batch being planned
        (``discover``: not one planned ahead) must start where the live batch did."""
        entry = self._starting(start)
        if discover and self.ranges and entry is not self.ranges[0]:
            live = self.ranges[0]
            raise CheckpointCorrupt(
                f"shadow batch {batch_id} would start at {start}, but live batch "
                f"{live.batch_id}, which it recomputes, started at {live.start_offsets}: the "
                "shadow checkpoint is not the live's history; `lowmark rebuild` starts over "
                "once it is moved away"
            )
        return entry.end_offsets if entry is not None else start

    def past_lost(self, start: Offsets) -> Skipped | None:
        entry = self.ranges[0] if self.ranges else None
        if entry is None or not entry.input_skipped or entry.start_offsets == start:
            return None
        return Skipped(entry.start_offsets, entry.input_skipped, "as the live batch passed it over")

    def reader(self) -> Source:
        return self.source.reader()

    def read(
        self,
        start: Offsets,
        end: Offsets,
        batch_id: int,
        cache: bool = False,
        strict: bool = False,
    ) -> SourceRead:
        return self.source.read(start, end, batch_id, cache, strict)

    def read_batches(self, batches: Sequence[Range]) -> SourceRead | None:
        return self.source.read_batches(batches)

    def backlog(self, committed_end: Offsets) -> dict[str, int]:
        return self.source.backlog(committed_end)

    def partitions(self, start: Offsets, end: Offsets) -> tuple[str, ...]:
        return self.source.partitions(start, end)

    def waiting_partitions(self, end: Offsets) -> tuple[str, ...]:
        entry = next((e for e in self.ranges if e.end_offsets == end), None)
        return tuple(entry.waiting_partitions) if entry is not None else ()

    def ingestion_times(self, position: Offsets, observed_ms: int) -> dict[str, int] | None:
        return self.source.ingestion_times(position, observed_ms)

    def inputs(self, start: Offsets, end: Offsets) -> list[str]:
        return self.source.inputs(start, end)

    def input_bytes(self, start: Offsets, end: Offsets) -> int | None:
        return self.source.input_bytes(start, end)

    def missing(self, start: Offsets, end: Offsets) -> str | None:
        return self.source.missing(start, end)

    def identity(self) -> Identity:
        return self.source.identity()

    def confirm(self, batch: Range) -> None:
        self.source.confirm(batch)

    def retire(self, committed_end: Offsets, batch_id: int) -> None:
        self.source.retire(committed_end, batch_id)


def _catch_up(
    spark: SparkLike,
    pipeline: Pipeline,
    data_root: Path,
    live: Checkpoint,
    shadow: Checkpoint,
    on_batch: Callable[[ShadowBatch], None],
) -> int:
    """Run the shadow batches of the live's committed batches the shadow lacks, until it
    has them all (the live may commit more meanwhile); how many ran.

    A shadow batch recomputes one live batch: planned at the processing time the live
    batch was, over its recorded range (``RecordedRanges``), its runner id naming it
    (``RUNNER``). A live batch with no input (it closed windows) whose time closes none
    under the new definition gets no shadow batch. A shadow batch cut short is replayed
    first, by the shadow's own recovery rule.
    """
    shadowed = shadow_pipeline(pipeline, data_root)
    clock = _RecordedClock()
    source = RecordedRanges(build_source(spark, shadowed, data_root, shadow, clock))
    parts = build_parts(spark, shadowed, data_root, clock, source, records_as=pipeline)
    runner = MicroBatchRunner(spark, shadowed, data_root, clock, parts=parts)
    ran, passed = 0, -1
    while True:
        done = live.commits.get_latest()
        live_last = done.batch_id if done is not None else -1
        rebuilt = _rebuilt_up_to(shadow)
        target = max(-1 if rebuilt is None else rebuilt, passed) + 1
        replay = _uncommitted(shadow)
        if target > live_last and not replay:
            return ran
        if not replay:
            ahead = min(live_last, target + pipeline.read_ahead_batches)
            source.ranges = live.offsets.recorded(target, ahead)
            if not source.ranges or source.ranges[0].batch_id != target:
                raise RebuildRefused(
                    f"{pipeline.name}: neither the live offset log nor its history holds "
                    f"batch {target}, which the shadow recomputes next: its boundaries are "
                    "gone; restore the checkpoint's offsets_history table, or start over with "
                    f"`lowmark reset {pipeline.name} --truncate-sink`"
                )
            _extend_manifest(pipeline, live, shadow, source.ranges[-1])
            faults.reached("rebuild_after_manifest", target)
            clock.at_ms = source.ranges[0].created_ms
            runner.runner_id = f"{RUNNER}{target}"
        result = runner.run_batch()
        if result is None:
            passed = target
            continue
        ran += 1
        recomputed = _rebuilt_up_to(shadow)
        assert recomputed is not None  # the batch just committed names it
        on_batch(
            ShadowBatch(
                shadow_batch=result.batch_id,
                live_batch=recomputed,
                live_last=live_last,
                replay=result.replay,
                rows_out=result.rows_out,
            )
        )


def _extend_manifest(
    pipeline: Pipeline, live: Checkpoint, shadow: Checkpoint, through: OffsetEntry
) -> None:
    """The live file manifest's files the batches up to ``through`` took (retired ones
    too) that the shadow's lacks, added to it: the shadow's offsets are the live's, and so
    must be the files they number. Once per live batch (a repeat is skipped)."""
    from lowmark.batches.admin.reset import file_offsets, taken_files

    end = file_offsets(pipeline, through.end_offsets)
    kept = taken_files(live.files.path, end)
    if kept is None:  # a source without a manifest
        return
    retired = taken_files(live.files.history.path, end)
    rows = pa.concat_tables([kept, retired]) if retired is not None else kept
    have = {(f.partition, f.seq) for f in shadow.files.files(retired=True)}
    seen: set[tuple[str, int]] = set()
    keep = []
    for row in rows.to_pylist():
        key = (row["partition"], row["seq"])
        if key not in have and key not in seen:
            seen.add(key)
            keep.append(row)
    if keep:
        table = pa.Table.from_pylist(keep, schema=MANIFEST_SCHEMA)
        shadow.files.table.append_once(table, shadow.txn_app_id("files:live"), through.batch_id)


def _live_batch(entry: OffsetEntry | None) -> int | None:
    """The live batch the shadow's offset-log ``entry`` recomputes."""
    if entry is None or not entry.runner_id.startswith(RUNNER):
        return None
    return int(entry.runner_id.removeprefix(RUNNER))


def _rebuilt_up_to(shadow: Checkpoint) -> int | None:
    """The live batch the shadow's newest batch recomputes (committed or not)."""
    return _live_batch(shadow.offsets.get_latest())


def _uncommitted(shadow: Checkpoint) -> bool:
    """Whether the shadow has a batch planned and not committed (to replay)."""
    latest, done = shadow.offsets.latest_batch_id(), shadow.commits.get_latest()
    return latest is not None and (done is None or done.batch_id < latest)


def _shadow_last(shadow: Checkpoint) -> int:
    """The shadow's last committed batch (-1: none)."""
    done = shadow.commits.get_latest()
    return done.batch_id if done is not None else -1
