"""What a batch computed before it writes (steps 3-5), and its counts.

``Outcome`` gathers what the batch's job (or the read-ahead) saw of its
records (``Seen``), its own read when it made one (``Taken``), the sink's
version when that job wrote it, the window changes of the event-time stage
and a join's rows. The runner writes from it (step 6) and commits its
``counts`` (step 7); the accounting identity they obey is
``CommitEntry.totals``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql import DataFrame

from lowmark.batches.event_time.driver_merge import WindowChanges
from lowmark.batches.event_time.interval_join import Joined
from lowmark.batches.expectations import PARSABLE
from lowmark.batches.loop.batch_work import BatchWork, Taken, explained, total
from lowmark.batches.loop.catch_up import ReadAhead, Seen
from lowmark.batches.loop.plan import PlannedBatch
from lowmark.batches.records import INTERNAL_COLUMNS
from lowmark.batches.sinks import Sink, WindowedSink
from lowmark.batches.sinks.delta import DeltaFilesSink
from lowmark.state.commit_log import BatchCounts
from lowmark.state.quarantine import bad_rows
from lowmark.state.window_state import ROWS


@dataclass(frozen=True)
class Input:
    """A batch's records as its expectations judge them: read, bad, and per expectation."""

    rows_in: int
    """Records read, rows that did not parse included."""
    rows_bad: int
    """Rows that did not parse, and records ``drop`` expectations removed."""
    violations: dict[str, int]

    @classmethod
    def of(cls, seen: Seen) -> Input:
        parsed_bad = seen.bad.num_rows if seen.bad is not None else 0
        dropped = seen.dropped.num_rows if seen.dropped is not None else 0
        violations = {PARSABLE: parsed_bad, **seen.violations}
        return cls(seen.rows_in + parsed_bad, parsed_bad + dropped, violations)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One batch after steps 3-5: nothing of it is written yet, but maybe its sink."""

    seen: Seen
    taken: Taken | None
    """Its own read (None: the read-ahead looked at the batch)."""
    written: bool = False
    """Whether step 4's one job wrote the sink (``lowmark.batches.loop.one_job``)."""
    sink_version: int | None = None
    """The sink's version after that write."""
    changes: WindowChanges | None = None
    """Windowed: what the batch changes in the windows (``lowmark.batches.event_time``)."""
    joined: Joined | None = None
    """Joining: the join's rows and its state after the batch."""

    @property
    def rows_out(self) -> int:
        """Rows for the sink: closed or changed windows, a join's rows, a keyed step's
        output, else the transformed records."""
        if self.joined is not None:
            return self.joined.rows_out
        if self.changes is not None:
            return self.changes.output.num_rows
        if self.seen.emitted is not None:
            return self.seen.emitted
        return self.seen.rows_out

    def bad(self, batch_id: int) -> pa.Table | None:
        """Rows for ``bad_records``: those that did not parse, and those expectations dropped."""
        return bad_rows(self.seen.bad, self.seen.dropped, batch_id)

    @property
    def late(self) -> pa.Table | None:
        """Rows for the late table: records too late, and a join's rows below the watermark."""
        late, joined = self.seen.late, self.joined
        if joined is None or joined.late is None:
            return late
        return joined.late if late is None else pa.concat_tables([late, joined.late])

    def release(self) -> None:
        """Let go of the batch's cached input (after its last write)."""
        if self.taken is not None:
            self.taken.read.unpersist()

    def counts(self, windowed: bool) -> BatchCounts:
        """What the commit records of the batch (``windowed``: the pipeline has windows)."""
        seen, late = self.seen, self.late
        judged = Input.of(seen)
        rows_late = late.num_rows if late is not None else 0
        dropped = seen.dropped.num_rows if seen.dropped is not None else 0
        duplicates = seen.judged.duplicates if seen.judged is not None else 0
        too_old = seen.judged.late.num_rows if seen.judged is not None else 0
        # Late rows are records set aside before the windows (too old for deduplication,
        # or for a keyed step) and rows the windows refused: records, or behind a keyed
        # step the processor's rows (``emitted``).
        behind = seen.keyed.late.num_rows if seen.keyed is not None else 0
        into_windows = seen.emitted if seen.emitted is not None else seen.rows_out
        keyed = seen.keyed.records if seen.keyed is not None else None
        joined = self.joined.records if self.joined is not None else 0
        return BatchCounts(
            rows_in=judged.rows_in,
            rows_out=self.rows_out,
            rows_bad=judged.rows_bad,
            rows_late=rows_late,
            rows_dropped=seen.rows_in - seen.rows_out - dropped - duplicates - too_old,
            violations=judged.violations,
            rows_windowed=into_windows - (rows_late - too_old - behind) if windowed else 0,
            rows_closed=total(self.changes.closed, ROWS) if self.changes is not None else 0,
            rows_duplicate=duplicates,
            rows_keyed=keyed if keyed is not None else joined,
            rows_emitted=seen.emitted or 0,
        )

    def write_sink(self, work: BatchWork, batch_id: int) -> int | None:
        """Step 6's sink write (idempotent per batch), unless step 4's job made it; the
        sink's version after it (None: a sink without versions)."""
        sink, pipeline = work.sink, work.pipeline
        if isinstance(sink, WindowedSink) and self.joined is not None:  # on the driver already
            return sink.write(self.joined.output, batch_id)
        if isinstance(sink, WindowedSink):
            changes, aggregation = self.changes, pipeline.aggregation
            assert changes is not None and aggregation is not None  # a windowed batch's
            retract = changes.retract if aggregation.output_mode == "update" else None
            return sink.write(changes.output, batch_id, retract)
        if self.written:
            return self.sink_version
        taken = self.taken
        assert taken is not None  # a stateless batch always reads its input itself
        if taken.fired is not None and isinstance(sink, DeltaFilesSink):  # made on the driver
            return sink.write_rows(taken.fired.table, batch_id)
        rows = self.sink_rows()
        return explained(taken.read, lambda: sink.write(rows, batch_id))

    def sink_rows(self) -> pa.Table | DataFrame:
        """The rows step 6 hands the sink: a join's rows or the windows' output (on the
        driver), else the transformed records (lazy, over the batch's own read)."""
        if self.joined is not None:
            return self.joined.output
        if self.changes is not None:
            return self.changes.output
        assert self.taken is not None  # a stateless batch always reads its input itself
        return self.taken.out.drop(*INTERNAL_COLUMNS)


def look_at(
    work: BatchWork, read_ahead: ReadAhead | None, planned: PlannedBatch, writing: bool = True
) -> Outcome:
    """Steps 3 and 4 of ``planned``: what the catch-up read-ahead saw of exactly its range,
    nothing for a windowed batch without records (``BatchWork.emits_only``: no read is
    built), or its own read and one job over its records (then its input is confirmed
    unchanged by the read). A stateless batch that nothing it finds can stop has its sink
    written by that job (``lowmark.batches.loop.one_job``) unless not ``writing``
    (``lowmark preview``); otherwise nothing is written yet."""
    batch = planned.range
    if read_ahead is not None:
        seen = read_ahead.seen(
            batch, planned.watermark_ms, planned.planned_at_ms, planned.replay, planned.clocks
        )
        if seen is not None:
            work.saw(seen)
            return Outcome(seen=seen, taken=None)
    quiet = work.emits_only(planned)
    if quiet is not None:
        return Outcome(seen=quiet, taken=None)
    one_job = writing and work.in_one_job(planned)
    taken = work.take(planned, one_job)
    written = None
    if one_job:
        work.checkpoint.fence()  # as before any write
        stateless = work.sink
        assert isinstance(stateless, Sink)

        def write(rows: DataFrame) -> int | None:
            return stateless.write(rows, planned.batch_id)

        written = work.write_looking(taken, planned, write)
    if written is not None:
        taken, seen, version = written
        outcome = Outcome(seen=seen, taken=taken, written=True, sink_version=version)
    else:
        if one_job:  # a row that did not parse stopped it before its write landed
            taken = work.take(planned)
        outcome = Outcome(seen=work.look(taken, planned), taken=taken)
    work.source.confirm(batch)
    work.saw(outcome.seen)
    return outcome


def with_event_time(outcome: Outcome, work: BatchWork, planned: PlannedBatch) -> Outcome:
    """Step 5 of ``planned``: the window partials merged with the state they touch, and a
    join's records with the rows it holds (nothing written)."""
    seen = outcome.seen
    changes = (
        work.windows(seen.partials, outcome.taken, planned) if seen.partials is not None else None
    )
    joined = work.joined(seen, planned) if work.join is not None else None
    return replace(outcome, changes=changes, joined=joined)
