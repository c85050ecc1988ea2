"""Errors a user can cause in pipeline definitions, input or sinks.

One line each, naming the thing and the fix. ``LowmarkError`` (from
``lowmark.state.errors``) is the common base the CLI turns into a clean message.
"""

from __future__ import annotations

from lowmark.state.errors import LowmarkError, TransientError


class PipelineNotFound(LowmarkError):
    """No registered pipeline has the asked-for name."""


class PipelineConfigInvalid(LowmarkError):
    """A pipeline definition (Python or YAML) fails validation."""


class DefinitionInvalid(PipelineConfigInvalid):
    """A mistake of a pipeline's definition found only when a batch runs (a SQL step that
    does not parse, names a column its input lacks, or is not deterministic): whatever the
    input, it fails the same way, so it is no failure of the batch's data."""


class SourceFileMissing(LowmarkError):
    """A file the manifest assigned to a batch is gone before the batch finished."""


class SourceFileChanged(LowmarkError):
    """A file differs (size, modification time) from what the file manifest records the
    batch read: it changed while the batch read it, or before a replay of a half-written
    batch or a backfill reads it again."""


class SinkWriteFailed(LowmarkError):
    """The sink refused the batch (schema mismatch, duplicate merge keys, ...)."""


class SinkUnreachable(LowmarkError):
    """The sink's system cannot be reached with its settings (no such host, a refused
    password)."""


class SinkUnavailable(TransientError):
    """The sink's system went away during a batch's write (its connection cut, the server
    restarting or failing over, the brokers unavailable): nothing of the attempt is visible,
    and the batch is tried again. Every sink says so with this one error, naming itself
    (``sink postgres iot.events``) and the cause (the client's first line)."""

    def __init__(self, sink: str, cause: str) -> None:
        super().__init__(f"{sink} was unavailable during the write: {cause}")
        self.sink = sink
        self.cause = cause

    def __reduce__(self) -> tuple[type[SinkUnavailable], tuple[str, str]]:
        return type(self), (self.sink, self.cause)


class PartitionNotClosed(LowmarkError):
    """A backfill asked for an event-time partition the watermark has not closed yet."""


class FaultSpecInvalid(LowmarkError):
    """``LOWMARK_KILL_AT`` (crash tests only) does not name a step and a batch."""


class SourceFileUnreadable(LowmarkError):
    """A file a batch takes cannot be read with the source schema (drift, corruption)."""


class SinkHeldElsewhere(LowmarkError):
    """A new checkpoint's sink holds another checkpoint's writes (``lowmark reset``)."""


class PoisonBatch(LowmarkError):
    """A batch failed ``max_failed_attempts`` times: it is not run again by itself."""


class BackfillHistoryLost(LowmarkError):
    """A backfill cannot read all the history the checkpoint's batches read (where batch 0
    started is not recorded, or the source no longer holds some input): refused, the sink
    unchanged."""


class SourceDataLost(LowmarkError):
    """Input a batch must read is gone upstream (a deleted topic, records removed by
    retention, vacuumed table history)."""


class SourceReplaced(LowmarkError):
    """The source is not the one the offset log's positions point into: a topic or table
    deleted and created again under its name, or an end offset below the start."""


class ResetFailed(LowmarkError):
    """``lowmark reset --truncate-sink`` could not empty a sink: the old checkpoint is back
    where it was, and the reset can run again."""


class SinkBehind(LowmarkError):
    """``lowmark reset --after-sink`` would go on after a batch one of the pipeline's sinks
    does not hold (it refused the batch after another sink landed it): nothing moved."""


class RebuildRefused(LowmarkError):
    """``lowmark rebuild`` cannot recompute a pipeline's output from its recorded history (a
    sink whose content cannot be swapped in one commit, input the source no longer holds, a
    change the recorded offsets cannot be replayed under): nothing written."""


class RunInFlight(LowmarkError):
    """A pipeline cannot be reset while a run of it is queued or in flight."""


class BatchFailed(LowmarkError):
    """A batch stopped on an error: which batch, its input, the error's first line, the
    attempt and what to do, in one paragraph (``MicroBatchRunner.failure_report``)."""


class DefinitionMismatch(LowmarkError):
    """A pipeline's definition does not fit the input or the sink it meets (files not in
    its ``format``, an event-time column the source lacks, a sink folder that cannot be
    made): caught before Spark starts, nothing written (``lowmark.batches.loop.preflight``)."""


class SinkNotATable(LowmarkError):
    """A sink path holds something a Delta table cannot live in (a file)."""


class Interrupted(LowmarkError):
    """The person running lowmark stopped it (Ctrl-C) while a batch ran."""


class ExpectationsFailed(LowmarkError):
    """A batch broke its expectations' thresholds (``quality``, a ``fail`` expectation):
    it fails before anything is written, and replays with the same offsets once fixed."""


class TableNotFound(LowmarkError):
    """A query or ``lowmark show`` names a table a pipeline does not have, or not yet."""


class QueryFailed(LowmarkError):
    """A query over a pipeline's tables (``lowmark sql``, ``show --where``) is not valid SQL
    for them (a syntax error, a column no table has)."""


class StateValueInvalid(LowmarkError):
    """A keyed step's processor gave a state a value its declared schema does not hold (a
    tuple of another arity, a value not of the field's type): the batch fails, nothing
    written."""


class PreviewImpossible(LowmarkError):
    """``lowmark preview`` cannot run a pipeline's next batch without writing (a step whose
    Spark tasks write state files as they run), or its input moved while it planned."""
