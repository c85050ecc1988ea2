"""``lowmark preview``: the next batch run on its planned input, with nothing committed.

The batch is the one ``lowmark plan`` shows (``status.planned_next``: the same read-only
planner and answer; a replay's recorded offsets and watermark when the last batch is
uncommitted). It runs steps 3-5 of ``MicroBatchRunner._batch``: read and transform
(``BatchWork.take``), the one look at the records with the expectations' verdict
(``outcome.look_at`` with ``writing=False``: a stateless batch's sink is not written by
that job), and the event-time stage merged with the window state as it stands (a
replay's: as commit N-1 left it). What it would write is reported: the sink's rows
(``Outcome.sink_rows``) and the counts the commit would record. Steps 2 and 6-8 do
not run: no offset-log entry, no state, sink, late, bad, watermark or progress row,
and no file is made under the checkpoint or the sink.

A pipeline that never ran has no checkpoint, and the preview makes none: its batch 0
is planned again over an empty checkpoint in a temporary folder, which holds what the
read records (a file source's inferred schema) for the length of the preview.

Deduplication judges against the ids held, its tasks writing no files of the ids they
let through (``DedupStep.previewing``); a keyed step runs its processor over the state
and timers held, its tasks writing no files of their changes (``KeyedStep.previewing``).
A stream-stream join joins the batch's records with the rows held as of commit N-1 on the
driver (``BatchWork.joined``), and only step 6 writes what it holds.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from lowmark.batches.admin.status import BatchPlan, planned_next
from lowmark.batches.clock import Clock
from lowmark.batches.collect import collect
from lowmark.batches.errors import ExpectationsFailed, PreviewImpossible
from lowmark.batches.loop.batch_work import BatchWork, explained
from lowmark.batches.loop.outcome import Input, Outcome, look_at, with_event_time
from lowmark.batches.loop.plan import PlannedBatch, Planner
from lowmark.batches.loop.steps import DEDUP, KEYED, WINDOWS, Steps
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.sinks import build_sink
from lowmark.batches.sources import build_source
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.errors import first_line
from lowmark.state.session import SparkLike, provider


@dataclass(frozen=True, kw_only=True)
class WindowCounts:
    """What a windowed batch would do to its windows."""

    emitted: int
    """Window rows the sink would get: closed windows (append mode), or every window the
    batch changed (update mode)."""
    updated: int
    """Windows whose state the batch would write (those it touched and leaves open)."""
    closed: int
    """Windows the watermark would close (final, purged from the state)."""
    retracted: int
    """Windows the sink would drop (update mode: sessions merged into a longer one)."""


@dataclass(frozen=True, kw_only=True)
class PreviewedBatch:
    """What the batch would write, and its counts, as its commit would record them."""

    rows_in: int
    rows_out: int
    rows_bad: int
    rows_late: int
    violations: dict[str, int]
    """Per expectation (``parsable``: rows that did not parse), the records violating it."""
    windows: WindowCounts | None
    """None: the pipeline has no windows."""
    columns: list[str]
    """The sink rows' columns."""
    rows: list[dict[str, Any]]
    """The first rows the sink would get (at most the preview's ``limit``)."""
    stops: str | None
    """Why a run would stop before writing anything (the expectations' verdict), or None;
    a batch that stops has no rows out."""


@dataclass(frozen=True, kw_only=True)
class Preview:
    """The next batch's plan, and what running it gave (None: nothing to do, or a mistake
    a run would stop on before Spark starts: ``plan.problem``)."""

    plan: BatchPlan
    batch: PreviewedBatch | None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data (``lowmark preview --json``); values JSON has no type for (times)
        are left to the caller's ``default``."""
        batch = asdict(self.batch) if self.batch is not None else None
        return {"pipeline": self.plan.pipeline, "plan": self.plan.to_json(), "batch": batch}


def preview_next(
    spark: SparkLike,
    pipeline: Pipeline,
    data_root: Path,
    clock: Clock | None = None,
    limit: int = 20,
) -> Preview:
    """Run ``pipeline``'s next batch without committing anything (the module's contract);
    its first ``limit`` sink rows."""
    plan, planner, nxt = planned_next(spark, pipeline, data_root, clock)
    planned = nxt.planned
    if planned is None or plan.batch_id is None or plan.problem is not None:
        return Preview(plan=plan, batch=None)
    with _over_a_checkpoint(spark, data_root, planner, planned) as (planner, planned):
        work = _work(spark, pipeline, data_root, planner)
        return Preview(plan=plan, batch=_run(work, planned, limit))


@contextmanager
def _over_a_checkpoint(
    spark: SparkLike, data_root: Path, planner: Planner, planned: PlannedBatch
) -> Iterator[tuple[Planner, PlannedBatch]]:
    """The planner over the checkpoint the batch runs with, and its plan: the pipeline's,
    or while it has none, an empty one in a temporary folder (gone afterwards), planned
    anew there, so that what a source fixes on its first read (a file source's inferred
    schema) lands there too. Raises ``PreviewImpossible`` if that plan takes other
    input (some landed in between)."""
    if planner.checkpoint is not None:
        yield planner, planned
        return
    pipeline, clock = planner.pipeline, planner.clock
    with tempfile.TemporaryDirectory(prefix="lowmark-preview-") as folder:
        checkpoint = Checkpoint(folder, pipeline.name)
        source = build_source(spark, pipeline, data_root, checkpoint, clock)
        stage = WINDOWS.build(pipeline, checkpoint)
        again = Planner(pipeline, checkpoint, source, stage, clock, planner.dimensions)
        replanned = again.next_batch(dry_run=True).planned
        if replanned is None or replanned.range != planned.range:
            raise PreviewImpossible(
                f"the input of {pipeline.name}'s batch {planned.batch_id} changed while "
                "lowmark preview planned it: preview it again"
            )
        yield again, replanned


def _work(spark: SparkLike, pipeline: Pipeline, data_root: Path, planner: Planner) -> BatchWork:
    """The batch's Spark work over ``planner``'s checkpoint and source (the one that planned
    its range)."""
    checkpoint, source = planner.checkpoint, planner.source
    assert checkpoint is not None  # _over_a_checkpoint's
    steps = Steps.build(pipeline, checkpoint, source)
    dedup, keyed = steps.of(DEDUP), steps.of(KEYED)
    if dedup is not None:
        steps = Steps({**steps.built, DEDUP: dedup.previewing()})
    if keyed is not None:
        steps = Steps({**steps.built, KEYED: keyed.previewing()})
    # Only asked whether a replay's write landed: building a sink writes nothing.
    sink = build_sink(spark, pipeline, data_root, checkpoint.txn_app_id("sink"))
    return BatchWork(provider(spark), pipeline, checkpoint, source, sink, steps, planner.dimensions)


def _run(work: BatchWork, planned: PlannedBatch, limit: int) -> PreviewedBatch:
    """Steps 3-5 of ``planned`` (``MicroBatchRunner._batch``), nothing written."""
    outcome = look_at(work, None, planned, writing=False)
    try:
        judged = Input.of(outcome.seen)
        stops = None
        try:
            work.checks.verdict(
                planned.batch_id, judged.rows_in, judged.rows_bad, judged.violations
            )
        except ExpectationsFailed as exc:
            stops = first_line(exc)
        if stops is None:
            outcome = with_event_time(outcome, work, planned)
        counts = outcome.counts(windowed=work.stage is not None)
        columns, rows = ([], []) if stops is not None else _first_rows(outcome, limit)
    finally:
        outcome.release()
    changes = outcome.changes
    windows = (
        WindowCounts(
            emitted=changes.output.num_rows,
            updated=changes.upserts.num_rows,
            closed=changes.closed.num_rows,
            retracted=changes.retract.num_rows,
        )
        if changes is not None
        else None
    )
    return PreviewedBatch(
        rows_in=counts.rows_in,
        rows_out=0 if stops is not None else counts.rows_out,
        rows_bad=counts.rows_bad,
        rows_late=counts.rows_late,
        violations=counts.violations,
        windows=windows,
        columns=columns,
        rows=rows,
        stops=stops,
    )


def _first_rows(outcome: Outcome, limit: int) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns of the rows ``outcome`` hands its sink, and the first ``limit`` of them
    (a stateless batch's: one Spark job over its cached read)."""
    rows = outcome.sink_rows()
    if isinstance(rows, pa.Table):
        first = rows.slice(0, limit)
    else:
        taken = outcome.taken
        assert taken is not None  # a stateless batch's rows are over its own read
        frame = rows.limit(limit)
        first = explained(taken.read, lambda: collect({"rows": frame}))["rows"]
    return first.column_names, first.to_pylist()
