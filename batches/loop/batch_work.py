"""The Spark work of a batch: read and transform (step 3), look (step 4), windows (step 5).

What the runner (``lowmark.batches.loop.microbatch``) hands to Spark; everything
else a batch does is driver-side bookkeeping. The catch-up read-ahead
(``lowmark.batches.loop.catch_up``) builds its frames here too (``BatchWork.unwatermarked``),
so a batch it looked at ahead is looked at exactly as its own job would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import pyarrow as pa
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from lowmark.batches.collect import collect, empty_of, observed, shuffle_partitions, to_frame
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.event_time.dedup import DedupSeen, Judged
from lowmark.batches.event_time.driver_merge import WindowChanges
from lowmark.batches.event_time.interval_join import Joined
from lowmark.batches.event_time.stage import (
    BatchFrames,
    ObservedRecords,
    late_table,
    observe_records,
    partition_max_event_ms,
)
from lowmark.batches.expectations import DROPPED, Checks
from lowmark.batches.keyed.step import Fired, KeyedSeen, Processed
from lowmark.batches.loop.catch_up import Seen, row_by_row
from lowmark.batches.loop.dimensions import Dimensions
from lowmark.batches.loop.one_job import guarded, in_one_job, stopped_by_guard
from lowmark.batches.loop.plan import PlannedBatch
from lowmark.batches.loop.post_aggregation import post_aggregated
from lowmark.batches.loop.steps import DEDUP, KEYED, STREAM_JOIN, WINDOWS, Steps
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.records import INTERNAL_COLUMNS
from lowmark.batches.sinks import Sink, WindowedSink
from lowmark.batches.sources.base import PARTITION_COLUMN, Range, Source, SourceRead
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.keyed_state import Pinned
from lowmark.state.session import is_remote_session
from lowmark.state.state_table import StateTable

T = TypeVar("T")


@dataclass(frozen=True)
class Taken:
    """Step 3 of a batch: lazy frames over its input."""

    read: SourceRead
    out: DataFrame
    """The transformed records the expectations keep (no ``drop`` one violated)."""
    frames: BatchFrames | None
    """Windowed: the stage's frames over ``out``."""
    checked: DataFrame
    """The transformed records, before the expectations drop any."""
    expected: Observation | None = None
    """Windowed, with expectations: observes ``checked`` as the batch's job reads it (each
    expectation's violations, and the dropped records, ``Checks.observed``)."""
    judged: Judged | None = None
    """With ``dedup``: the records' verdicts, observed as the batch's job reads them
    (``out`` is then what it lets through)."""
    processed: Processed | None = None
    """With ``keyed``: the keyed step, observed as the batch's job reads it (``out`` is then
    the processor's output)."""
    timed: DataFrame | None = None
    """With ``keyed``: the records given to the keyed step (their event times move the
    watermark; ``out`` holds the processor's rows)."""
    watched: ObservedRecords | None = None
    """Taken for one job (``lowmark.batches.loop.one_job``): the records that move the
    watermark, observed as the sink's write reads them (``expected`` then observes the
    expectations)."""
    emitted: ObservedRecords | None = None
    """Taken for one job, with ``keyed``: the processor's rows, observed likewise."""
    fired: Fired | None = None
    """With ``keyed``, when it runs on the driver (``BatchWork.fires_on_driver``): what it gave,
    known already (``out`` is then its output rows, a local frame)."""


class BatchWork:
    """The Spark work of one pipeline's batches, over its source, stage and checkpoint."""

    def __init__(
        self,
        spark: Callable[[], SparkSession],
        pipeline: Pipeline,
        checkpoint: Checkpoint,
        source: Source,
        sink: Sink | WindowedSink,
        steps: Steps,
        dimensions: Dimensions | None = None,
    ) -> None:
        self._spark = spark
        self.pipeline = pipeline
        self.checkpoint = checkpoint
        self.source = source
        self.sink = sink
        self.steps = steps
        """Its stateful steps (``lowmark.batches.loop.steps``); the data path below takes
        each kind's in turn."""
        self.stage = steps.of(WINDOWS)
        self.dedup = steps.of(DEDUP)
        self.keyed = steps.of(KEYED)
        self.join = steps.of(STREAM_JOIN)
        self.dimensions = dimensions
        self.checks = Checks(pipeline.name, pipeline.expectations, pipeline.quality)
        self._no_partials: pa.Table | None = None
        """Windowed: the window partials of a batch without records (no rows, their
        columns), once a batch of this runner had partials (``emits_only``)."""

    def emits_only(self, planned: PlannedBatch) -> Seen | None:
        """What a windowed batch with no records sees, known without building its read:
        nothing, so it only emits what its watermark closes. None when it must be looked
        at (``look``): it has records, a keyed step runs before its windows, or no batch
        of this runner had partials yet, whose columns the empty ones take, or its windows
        merge in Spark (over the frames of its read: ``WindowedStage.merges_on_driver``)."""
        stage = self.stage
        if stage is None or not stage.merges_on_driver or self.keyed is not None:
            return None
        if self._no_partials is None:
            return None
        if planned.start != planned.end:
            return None
        return Seen(0, None, None, {}, 0, self._no_partials, self.checks.violations({}))

    def saw(self, seen: Seen) -> None:
        """Note what a batch's look saw (``emits_only`` takes its partials' columns)."""
        if self._no_partials is None and seen.partials is not None:
            self._no_partials = seen.partials.schema.empty_table()

    def in_one_job(self, planned: PlannedBatch) -> bool:
        """Whether ``planned`` runs one Spark job: its sink's write, which looks at the batch
        as it writes (``lowmark.batches.loop.one_job``). A join's batch looks first: its sink
        gets the join's rows, not the records."""
        if self.join is not None or self.fires_on_driver(planned.range):
            return False
        return in_one_job(planned, self.stage is not None, self.sink, self.checks)

    def fires_on_driver(self, batch: Range) -> bool:
        """Whether ``batch``'s keyed step runs on the driver (``KeyedStep.fired``): it has no
        records (an empty range: it runs because a timer is due) and the processor's rows go
        straight to the sink. After deduplication or before windows it runs in Spark, as
        the steps around it do."""
        alone = self.stage is None and self.dedup is None and self.join is None
        return self.keyed is not None and alone and batch.start == batch.end

    def take(self, planned: PlannedBatch, one_job: bool = False, landed: bool = False) -> Taken:
        """Step 3 for ``planned``: its read, transformed records and (windowed) stage frames,
        all lazy. A stateless batch reads its input twice (counts, then the sink write):
        its parse is cached (with ``dedup`` or ``keyed``, what the sink gets too) — or, with
        ``one_job`` (``in_one_job``), once, observed as the sink's write reads it
        (``write_looking``; the parse is cached for the rows that do not parse, which that
        job reads beside the records). A replay of a batch that already wrote something,
        and a batch whose write ``landed``, reads strictly what it read then
        (``Source.read``)."""
        strict = landed or (planned.replay and self.wrote_any(planned.batch_id))
        return self._take(
            planned.range,
            planned.watermark_ms,
            planned.planned_at_ms,
            window_watermark_ms=planned.window_watermark_ms,
            cache=self.stage is None,
            strict=strict,
            seen_ids=self._seen_ids_as_of(planned),
            keyed=self._keyed_as_of(planned),
            one_job=one_job,
            dimension_versions=planned.dimension_versions,
        )

    def _take(
        self,
        batch: Range,
        watermark_ms: int | None,
        now_ms: int,
        cache: bool = False,
        strict: bool = False,
        observe: bool = True,
        expect: bool = True,
        seen_ids: int | None = None,
        keyed: Pinned | None = None,
        one_job: bool = False,
        window_watermark_ms: int | None = None,
        dimension_versions: dict[str, int] | None = None,
    ) -> Taken:
        """Step 3 for ``batch`` (``observe``: see ``WindowedStage.batch_frames``; ``expect``
        False: the expectations drop nothing, as the read-ahead looks; ``seen_ids``: the
        version of the seen-ids table a deduplicating pipeline judges against; ``one_job``:
        see ``take``; ``window_watermark_ms``: the window stage's behind a keyed step,
        ``PlannedBatch.window_watermark_ms``; ``dimension_versions``: the versions of the
        tables the transformed records are joined with, ``PlannedBatch.dimension_versions``).

        Behind a keyed step the windows take the processor's output rows, which belong
        to no source partition: the keyed step's records are observed for the watermark
        instead (``Taken.watched``)."""
        read = self.source.read(batch.start, batch.end, batch.batch_id, cache, strict)
        if not cache:
            read = read.in_one_task()
        checked = self._transformed(read, batch)
        if self.dimensions is not None:
            checked = self.dimensions.joined(self._spark(), checked, dimension_versions)
        out, expected = checked, None
        if expect and self.checks:
            if observe and (self.stage is not None or one_job):
                expected = Observation()
                checked = checked.observe(expected, *self._observed_checks(checked))
            out = checked.where(~self.checks.dropped()) if self.checks.drops else checked
        judged = None
        if self.dedup is not None:
            judged = self.dedup.judged(out, watermark_ms, seen_ids, batch.batch_id, read.small)
            out = judged.kept
        watched = None
        if one_job:
            event_time = self.pipeline.event_time
            watched = observe_records(out, event_time, self._partitions_of(batch), now_ms)
            out = watched.records
        processed, timed, emitted = None, None, None
        windowed_at, windowed_from = watermark_ms, self._partitions_of(batch)
        if self.keyed is not None:
            assert keyed is not None
            if self.stage is not None:
                event_time = self.pipeline.event_time
                watched = observe_records(out, event_time, windowed_from, now_ms)
                out = watched.records
                windowed_at, windowed_from = window_watermark_ms, ()
            timed = out
            if self.fires_on_driver(batch):
                fired = self.keyed.fired(
                    self._spark(), out, watermark_ms, now_ms, keyed, batch.batch_id
                )
                return Taken(read, fired.output, None, checked, expected, timed=timed, fired=fired)
            processed = self.keyed.processed(
                self._spark(), out, watermark_ms, now_ms, keyed, batch.batch_id
            )
            out = processed.output
            if one_job:
                emitted = observe_records(out, None, (), now_ms)
                out = emitted.records
            if self.stage is not None:
                out = out.withColumn(PARTITION_COLUMN, F.lit(None).cast("string"))
        if self.join is not None:  # the watermark reads each side's own event time
            timed = self.join.timed(out)
        if cache and not one_job and (judged is not None or processed is not None):
            # The sink write reads them again: verdicts (and a processor's rows) are worked
            # out once.
            out = out.persist()
            read = dataclasses.replace(read, cached=(*read.cached, out))
        frames = (
            self.stage.batch_frames(
                out, windowed_at, batch.batch_id, windowed_from, now_ms, observe
            )
            if self.stage is not None
            else None
        )
        return Taken(
            read, out, frames, checked, expected, judged, processed, timed, watched, emitted
        )

    def _observed_checks(self, checked: DataFrame) -> list[Column]:
        """What a windowed batch's job observes of its transformed records: each
        expectation's violations and, collected as they are read, the dropped records."""
        dropped = F.when(self.checks.dropped(), self.checks.dropped_record(_payload(checked)))
        return [*self.checks.counts(), F.collect_list(dropped).alias(DROPPED)]

    def _transformed(self, read: SourceRead, batch: Range) -> DataFrame:
        """The records of ``read`` (of ``batch``'s range) after the pipeline's transform."""
        out = self.pipeline.transformed(read.records)
        if PARTITION_COLUMN not in out.columns:
            # A transform that selected its columns dropped the partition; when the batch
            # reads one partition (or none: no records) there is nothing to lose by
            # putting it back.
            moved = self._partitions_of(batch)
            if len(moved) <= 1:
                partition = F.lit(moved[0] if moved else None).cast("string")
                out = out.withColumn(PARTITION_COLUMN, partition)
        return out

    def _partitions_of(self, batch: Range) -> tuple[str, ...]:
        """The source partitions ``batch`` takes records from."""
        return self.source.partitions(batch.start, batch.end)

    def wrote_any(self, batch_id: int) -> bool:
        """True if a write of batch ``batch_id`` landed (its replay must read what it read)."""
        ckpt = self.checkpoint
        written = [
            (ckpt.bad_records, ckpt.txn_app_id("bad_records")),
            (ckpt.late, ckpt.txn_app_id("late")),
            (ckpt.watermarks.table, ckpt.txn_app_id("watermarks")),
        ]
        if any(table.landed(app_id, batch_id) for table, app_id in written):
            return True
        if any(state.landed(batch_id) for state in self.steps.tables):
            return True
        return self.sink.landed(batch_id) is not False  # a sink that cannot tell may have

    def unwatermarked(
        self, batches: Sequence[Range], now_ms: int
    ) -> tuple[SourceRead, BatchFrames] | None:
        """Step 3 with no watermark and nothing observed, as the catch-up read-ahead looks:
        of one batch, or of several in one read, each record tagged with its batch. None
        when the source cannot tag, or the transform may not keep the tag row by row
        (``catch_up.row_by_row``; never known over Spark Connect, so not read there): each
        batch is then looked at on its own."""
        assert self.stage is not None
        if len(batches) == 1:
            taken = self._take(batches[0], None, now_ms, observe=False, expect=False)
            assert taken.frames is not None
            return taken.read, taken.frames
        if is_remote_session(self._spark()):
            return None
        read = self.source.read_batches(batches)
        if read is None:
            return None
        whole = Range(batches[0].batch_id, batches[0].start, batches[-1].end)
        out = self._transformed(read, whole)
        if not row_by_row(out, read.records):
            return None
        frames = self.stage.batch_frames(
            out, None, whole.batch_id, self._partitions_of(whole), now_ms, observe=False
        )
        return read, frames

    def look(self, taken: Taken, planned: PlannedBatch) -> Seen:
        """Step 4: what the batch's records give, in one Spark job when all is well.

        Windowed: the job computes the partials while Spark observes the
        input's counts, the late rows (collected as they are read) and each
        partition's max event time. Only when it saw bad rows (or could not
        observe: see ``collect.observed``) does a second job read the input
        again, cached, for those rows; it must find as many rows and late rows
        as the first saw (a transform must be deterministic). No input, no
        job. Stateless: one job over the cached input (the sink write reads it
        again); none when the keyed step ran on the driver (``Taken.fired``).
        """
        read, frames = taken.read, taken.frames
        fired = taken.fired
        if fired is not None:  # no records: what the keyed step gave is all there is
            violations = self.checks.violations({})
            return Seen(
                0, None, None, {}, 0, None, violations, keyed=fired.seen, emitted=fired.rows
            )
        if frames is None:
            return self._counted(taken, None, planned)
        if planned.start == planned.end and taken.processed is None:
            return Seen(0, None, None, {}, 0, empty_of(frames.partials), self.checks.violations({}))
        with shuffle_partitions(self._spark(), read.size_bytes):
            partials = explained(read, lambda: collect({"partials": frames.partials}))
        counts, stats = observed(read.counts), frames.stats()
        expected = observed(taken.expected) if taken.expected is not None else {}
        judged = _judged(taken)
        keyed = _keyed_before_windows(taken)
        if (
            counts is not None
            and stats is not None
            and expected is not None
            and judged is not False
            and keyed is not False
            and not counts.get("bad")
        ):
            late = None
            if stats.late and stats.late_records is not None:
                late = late_table(stats.late_records, planned.batch_id, planned.window_watermark_ms)
            late = _with_late(late, judged.late if judged else None, planned)
            dropped = expected.get(DROPPED)
            rows_out, max_ms = stats.rows, stats.max_ms
            if keyed is not None:  # the windows took the processor's rows
                rows_out, max_ms = keyed.records
                late = _with_late(late, keyed.seen.late, planned)
            return Seen(
                counts["rows"],
                None,
                late,
                max_ms,
                rows_out,
                partials["partials"],
                self.checks.violations(expected),
                pa.Table.from_pylist([r.asDict() for r in dropped]) if dropped else None,
                judged,
                keyed.seen if keyed is not None else None,
                stats.rows if keyed is not None else None,
            )
        again = self._take(
            planned.range,
            planned.watermark_ms,
            planned.planned_at_ms,
            cache=True,
            seen_ids=self._seen_ids_as_of(planned),
            keyed=self._keyed_as_of(planned),
            window_watermark_ms=planned.window_watermark_ms,
            dimension_versions=planned.dimension_versions,
        )
        assert again.frames is not None
        seen = self._counted(again, again.frames.late, planned)
        seen_late = seen.late.num_rows if seen.late is not None else 0
        seen_late -= seen.judged.late.num_rows if seen.judged is not None else 0
        seen_late -= seen.keyed.late.num_rows if seen.keyed is not None else 0
        windowed = seen.emitted if seen.emitted is not None else seen.rows_out
        if stats is not None and (windowed, seen_late) != (stats.rows, stats.late):
            raise PipelineConfigInvalid(
                f"the transform of {self.pipeline.name} gave batch {planned.batch_id} "
                f"{stats.rows} records ({stats.late} late) in one job and {windowed} "
                f"({seen_late} late) in another over the same input: make it deterministic "
                "(no rand(), no current time, no reads of changing tables)"
            )
        return dataclasses.replace(seen, partials=partials["partials"])

    def write_looking(
        self, taken: Taken, planned: PlannedBatch, write: Callable[[DataFrame], int | None]
    ) -> tuple[Taken, Seen, int | None] | None:
        """Step 4 and the sink's write in one Spark job: ``write`` (the sink's) of ``taken``
        (``take(..., one_job=True)``), which observes what the look would have collected.
        Returns what was taken (another take when the look ran after all), what the job saw,
        and the sink's version; None when a row that did not parse stopped the write before
        it landed (the batch then looks, then writes: ``one_job``).
        """
        assert taken.watched is not None
        read = taken.read
        rows = guarded(taken.out.drop(*INTERNAL_COLUMNS), read.bad)
        try:
            # Shuffles (deduplication's, a keyed step's) sized to the input, as the look's.
            with shuffle_partitions(self._spark(), read.size_bytes):
                version = explained(read, lambda: write(rows))
        except Exception as exc:
            if not stopped_by_guard(exc):
                raise
            taken.read.unpersist()
            return None
        seen = self._seen_written(taken, planned)
        if seen is None:  # Spark observed nothing: count as a replay would (its write landed)
            taken.read.unpersist()
            taken = self.take(planned, landed=True)
            seen = self.look(taken, planned)
        return taken, seen, version

    def _seen_written(self, taken: Taken, planned: PlannedBatch) -> Seen | None:
        """What the sink's write of ``taken`` observed, as ``_counted`` would have seen it;
        None when Spark observed nothing, or bad rows (the guard lets none be written)."""
        assert taken.watched is not None
        counts, watched = observed(taken.read.counts), taken.watched.counts()
        expected = observed(taken.expected) if taken.expected is not None else {}
        judged = _judged(taken)
        emitted = taken.emitted.counts() if taken.emitted is not None else None
        processed = taken.processed
        if (
            counts is None
            or counts.get("bad")
            or watched is None
            or expected is None
            or judged is False
            or (processed is not None and emitted is None)
            or (processed is not None and observed(processed.seen) is None)
            or (processed is not None and observed(processed.changes) is None)
        ):
            return None
        rows_out, max_ms = watched
        keyed = _keyed(taken, planned)
        late = _with_late(None, judged.late if judged else None, planned)
        return Seen(
            counts["rows"],
            None,
            _with_late(late, keyed.late if keyed else None, planned),
            max_ms,
            rows_out,
            None,
            self.checks.violations(expected),
            None,
            judged,
            keyed,
            emitted[0] if emitted is not None else None,
        )

    def _counted(self, taken: Taken, late: DataFrame | None, planned: PlannedBatch) -> Seen:
        """One job over ``taken``'s read (cached): counts, max event times, bad rows,
        ``late``, and each expectation's violations and dropped records."""
        read = taken.read
        # A keyed step's records move the watermark; its output is what the sink gets.
        out = taken.timed if taken.timed is not None else taken.out
        event_time = self.pipeline.event_time
        parts: dict[str, DataFrame] = {
            "input": read.records.agg(F.count(F.lit(1)).alias("rows")),
            "output": (
                partition_max_event_ms(out, event_time, planned.planned_at_ms)
                if event_time is not None
                else out.agg(F.count(F.lit(1)).alias("rows"))
            ),
        }
        if taken.processed is not None:
            parts["emitted"] = taken.out.agg(F.count(F.lit(1)).alias("rows"))
        if self.join is not None:  # what the join takes, in the same job
            parts["join"] = self.join.records(taken.out)
        if read.bad is not None:
            parts["bad"] = read.bad
        if late is not None:
            parts["late"] = late
        if self.checks:
            parts["expectations"] = taken.checked.agg(*self.checks.counts())
            if self.checks.drops:
                parts["dropped"] = self.checks.dropped_rows(taken.checked, _payload(taken.checked))
        try:
            with shuffle_partitions(self._spark(), read.size_bytes):
                seen = explained(read, lambda: collect(parts))
        finally:
            if late is not None:  # the windowed fallback: nothing else reads the cache
                read.unpersist()
        max_ms: dict[str, int] = {}
        if event_time is not None:
            stats = seen["output"].to_pylist()
            max_ms = {r[PARTITION_COLUMN]: r["max_ms"] for r in stats if r["max_ms"] is not None}
        rows_out = total(seen["output"], "rows")
        judged = _judged(taken)
        if judged is False:
            if rows_out:  # never a guess: the ids it let through must be recorded
                raise RuntimeError(
                    f"batch {planned.batch_id} of {self.pipeline.name}: Spark reported no "
                    "deduplication verdicts for its records; the batch is run again"
                )
            judged = None
        keyed = _keyed(taken, planned)
        late = _with_late(seen.get("late"), judged.late if judged else None, planned)
        return Seen(
            total(seen["input"], "rows"),
            seen.get("bad"),
            _with_late(late, keyed.late if keyed else None, planned),
            max_ms,
            rows_out,
            None,
            self.checks.violations(seen["expectations"].to_pylist()[0]) if self.checks else {},
            seen.get("dropped"),
            judged,
            keyed,
            total(seen["emitted"], "rows") if "emitted" in seen else None,
            seen.get("join"),
        )

    def windows(
        self, partials: pa.Table, taken: Taken | None, planned: PlannedBatch
    ) -> WindowChanges:
        """Step 5: the batch's window changes, on the driver; nothing is written.

        The state rows the partials touch and those the watermark makes final
        are read on the driver as of the state batch ``planned`` starts from
        (``_state_as_of``); the merge runs there too when the aggregates allow,
        else as one Spark job over that local data (``taken``: the batch's own
        frames, which a batch merged in Spark always has). The windows it emits then go
        through the pipeline's post-aggregation step, if any (``post_aggregation``: one
        Spark job when it emits some).
        """
        assert self.stage is not None
        changes = self._merged(partials, taken, planned)
        return post_aggregated(self._spark, self.pipeline, changes, self.stage.identity)

    def _merged(
        self, partials: pa.Table, taken: Taken | None, planned: PlannedBatch
    ) -> WindowChanges:
        """The merge of step 5 (``windows``)."""
        stage = self.stage
        assert stage is not None
        nearby, final = stage.state_rows(
            partials, self._state_as_of(planned), planned.window_watermark_ms
        )
        if stage.merges_on_driver:
            return stage.merge_on_driver(partials, nearby, final, planned.batch_id)
        assert taken is not None and taken.frames is not None  # never read ahead
        spark = self._spark()
        schema = taken.frames.partials.schema
        local = to_frame(spark, partials, schema)
        merged = stage.merge(
            local,
            to_frame(spark, nearby, schema) if nearby is not None else None,
            to_frame(spark, final, schema) if final is not None else None,
            planned.batch_id,
        )
        # One job collects every table of the merge.
        tables = collect({f.name: getattr(merged, f.name) for f in dataclasses.fields(merged)})
        return WindowChanges(**tables)

    def joined(self, seen: Seen, planned: PlannedBatch) -> Joined:
        """Step 5 of a join's batch: its records (collected by its look, ``Seen.join_records``)
        joined with each other and with the held rows, as of commit N-1
        (``lowmark.batches.event_time.interval_join``); nothing is written."""
        join, new = self.join, seen.join_records
        assert join is not None and new is not None  # a join's batch looks at its records
        version = _as_of(join.state.contract, planned)
        assert version is not None  # the table is made before the first batch
        return join.joined(
            self._spark(),
            new,
            planned.batch_id,
            planned.watermark_ms,
            planned.planned_at_ms,
            version,
        )

    def _seen_ids_as_of(self, planned: PlannedBatch) -> int | None:
        """The seen-ids version batch ``planned`` judges its records against (None: no ids
        yet, or the pipeline does not deduplicate): see ``lowmark.state.seen_ids``."""
        if self.dedup is None:
            return None
        return _as_of(self.dedup.seen_ids.contract, planned)

    def _keyed_as_of(self, planned: PlannedBatch) -> Pinned | None:
        """Where batch ``planned``'s keyed step reads its state and timers (None: the pipeline
        has no keyed step): see ``lowmark.state.keyed_state``."""
        if self.keyed is None:
            return None
        recorded = _recorded(planned)
        return self.keyed.tables.pinned(
            recorded, planned.replay, planned.batch_id, self.keyed.writes
        )

    def _state_as_of(self, planned: PlannedBatch) -> int | None:
        """The state version batch ``planned`` starts from: the newest (``LATEST``), or, for
        a replay whose own state write landed, the one commit N-1 recorded (None: no state
        yet). See ``lowmark.state.window_state``."""
        if self.stage is None:
            return None
        return _as_of(self.stage.state.contract, planned, pin=False)


def _recorded(planned: PlannedBatch) -> dict[str, int]:
    """The table versions the commit before ``planned`` recorded (none before batch 0)."""
    return planned.previous.table_versions if planned.previous else {}


def _as_of(table: StateTable, planned: PlannedBatch, pin: bool = True) -> int | None:
    """The version of ``table`` batch ``planned`` reads (``StateTable.read_version``)."""
    return table.read_version(_recorded(planned), planned.replay, planned.batch_id, pin)


def _judged(taken: Taken) -> DedupSeen | None | Literal[False]:
    """What the job that just ran saw of the deduplication of ``taken`` (None: the pipeline
    does not deduplicate; False: Spark observed nothing, see ``collect.observed``)."""
    if taken.judged is None:
        return None
    metrics = observed(taken.judged.seen)
    return taken.judged.observed(metrics) if metrics is not None else False


def _keyed(taken: Taken, planned: PlannedBatch) -> KeyedSeen | None:
    """What the job that just ran saw of ``taken``'s keyed step (None: there is none).
    Raises when Spark observed nothing: a keyed batch's changes are never guessed."""
    processed = taken.processed
    if processed is None:
        return None
    seen, changes = observed(processed.seen), observed(processed.changes)
    if seen is None or changes is None:
        raise RuntimeError(
            f"batch {planned.batch_id}: Spark reported none of the keyed step's changes; "
            "the batch is run again"
        )
    return processed.observed(seen, changes)


@dataclass(frozen=True)
class _KeyedBeforeWindows:
    """What the job that read a batch saw of its keyed step, when windows take its rows."""

    seen: KeyedSeen
    records: tuple[int, dict[str, int]]
    """The records given to the keyed step (those it set aside included), and their max
    event time per source partition: what moves the watermark."""


def _keyed_before_windows(taken: Taken) -> _KeyedBeforeWindows | None | Literal[False]:
    """What the windowed job that just ran saw of ``taken``'s keyed step (None: there is
    none; False: Spark observed nothing, see ``collect.observed``)."""
    processed, watched = taken.processed, taken.watched
    if processed is None:
        return None
    assert watched is not None  # a keyed step before windows has its records observed
    seen, changes, records = observed(processed.seen), observed(processed.changes), watched.counts()
    if seen is None or changes is None or records is None:
        return False
    return _KeyedBeforeWindows(processed.observed(seen, changes), records)


def _with_late(
    late: pa.Table | None, more: pa.Table | None, planned: PlannedBatch
) -> pa.Table | None:
    """The batch's late rows: ``late`` (a late table's rows) and ``more`` (``LATE_RECORD``s
    a step set aside: deduplication, a keyed step)."""
    if more is None or not more.num_rows:
        return late
    rows = late_table(more, planned.batch_id, planned.watermark_ms)
    return rows if late is None else pa.concat_tables([late, rows.cast(late.schema)])


def explained(read: SourceRead, job: Callable[[], T]) -> T:
    """Run a Spark ``job`` over the batch's input, naming the input file it could not read."""
    try:
        return job()
    except (Py4JJavaError, PySparkException) as exc:
        error = read.explain(exc)
        if error is None:
            raise
        read.unpersist()
        raise error from exc


def _payload(records: DataFrame) -> list[str]:
    """The columns of ``records`` a user wrote (not lowmark's partition or batch tags)."""
    return [c for c in records.columns if c not in INTERNAL_COLUMNS]


def total(table: pa.Table, column: str) -> int:
    """The sum of ``column`` over ``table``'s rows (nulls count as nothing)."""
    return int(sum(v for v in table.column(column).to_pylist() if v is not None))
