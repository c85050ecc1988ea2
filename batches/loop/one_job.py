"""A stateless batch in one Spark job: the sink's write looks at the batch as it writes it.

A stateless batch (no windows) looks at its records in step 4 (counts, each
partition's newest event time, bad rows, the expectations' violations, the
verdicts of ``dedup`` and the changes of a ``keyed`` step), then Spark writes
its sink: two jobs over the same records. When nothing the look can find
would stop the write, the write's own job observes all of it instead
(``DataFrame.observe`` on the frames the sink's write reads: delta-spark's
append, or the tasks writing a ``DeltaFilesSink``'s files, run the observed
plan, and Spark hands the observations their metrics when it ends), and the
look is no job of its own. The batch then writes its sink before its other
writes (bad records, state, late rows): each is idempotent per batch and the
commit comes after all of them, so the order is free.

What can stop the write, and so keeps the two jobs (``in_one_job``):

- an expectation that fails the batch (``fail``, or named in
  ``quality.fail_on``) or that drops records (a dropped record is a bad one,
  and too many bad rows fail the batch: ``quality.max_bad_fraction``);
- a replay: its write may have landed, and Delta then skips it and observes
  nothing; a replay looks first, whatever wrote what before;
- a sink other than a Delta table appended to (by Spark, or as files by the tasks
  that made the rows: ``DeltaFilesSink``): a MERGE reads its
  source more than once, and a user's sink may write nothing, or twice.

Rows that do not parse are found only by reading: the written rows carry a
guard (``guarded``) that stops the job at the first bad row, before Delta
commits anything (``GUARD``); the batch then takes its two jobs
(``stopped_by_guard``), which quarantine the bad rows, or fail the batch
when there are too many. And when Spark observed nothing (a plan the
optimizer proved empty), the batch, whose write landed, looks in a job of
its own, as its replay would.

The source confirms its input unchanged after the write (``Source.confirm``):
a file that changed while the write read it stops the batch with its sink
written, and its replay, as any replay of a half-written batch, refuses the
file (input files must not change once they land).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lowmark.batches.expectations import Checks
from lowmark.batches.loop.plan import PlannedBatch
from lowmark.batches.sinks import Sink, WindowedSink
from lowmark.batches.sinks.delta import DeltaFilesSink, DeltaTableSink

GUARD = "lowmark: a row of this batch does not parse"
"""The error a written row that did not parse raises in the write's job (Spark's
``raise_error``): the write stops before it commits."""


def in_one_job(
    planned: PlannedBatch, windowed: bool, sink: Sink | WindowedSink, checks: Checks
) -> bool:
    """Whether ``planned``'s sink write can be its one job (see the module's docstring)."""
    if windowed or planned.replay:
        return False
    if not isinstance(sink, DeltaTableSink | DeltaFilesSink) or sink.config.mode != "append":
        return False
    stopping = [e for e in checks.expectations if e.on_violation != "warn"]
    return not stopping and not checks.quality.fail_on


def guarded(rows: DataFrame, bad: DataFrame | None) -> DataFrame:
    """``rows`` to write, with ``bad`` (the read's rows that did not parse) as rows that stop
    the job: each raises ``GUARD`` as it is written (none: the rows as they are)."""
    if bad is None:
        return rows
    stop = F.raise_error(F.lit(GUARD))
    columns = [stop.cast(f.dataType).alias(f.name) for f in rows.schema.fields]
    # A projection, not a filter: Spark may evaluate a filter's condition on rows another
    # condition of the same filter rejects (seen with Spark 4.2: a guard in a filter raised
    # for a batch without bad rows).
    return rows.unionByName(bad.select(*columns))


def stopped_by_guard(exc: BaseException) -> bool:
    """True when ``exc`` is the guard of ``guarded`` stopping a write (nothing landed)."""
    return GUARD in str(exc)
