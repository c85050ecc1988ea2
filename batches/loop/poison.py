"""Poison batches: a batch that fails every time stops, and can be set aside on purpose.

A batch's input is fixed by the offset log, so a batch whose data work
fails deterministically (a transform error on one row under ANSI mode,
duplicate keys in a MERGE batch) fails again on every replay. Each failed
attempt is a row of the checkpoint's ``failures`` table. Once a batch has
``max_failed_attempts`` of them, runs stop before it with one line naming
the batch, its input and the error (``PoisonBatch``); ``lowmark status``
shows it as ``blocked`` and the Dagster sensor skips with that reason
instead of launching a run per tick. The ways on:

- fix the transform, then ``lowmark run PIPELINE --retry``;
- or ``lowmark skip-batch PIPELINE BATCH --reason TEXT``
  (``lowmark.batches.admin.skip_batch.set_aside``): the
  batch's input is recorded in ``bad_records`` (one row per file, with the
  reason), its window state is put back as the commit before it left it,
  and an empty commit lets the pipeline go on. Nothing is dropped silently:
  the rows say which input was set aside and why, to be reprocessed once
  the transform is fixed (docs/guarantees.md).

Errors are of four kinds (``failure_kind``):

- ``data``: the batch's data work raised — a Spark error, a file the source
  schema cannot read, a sink that refused the rows, any error of the
  transform's own code, or expectations the batch broke
  (``lowmark.batches.expectations``: the same input breaks them again). Counted;
  ``max_failed_attempts`` of them make a poison batch.
- ``transient``: the world was briefly away — a broker unreachable, a
  timeout, a reset connection, a Delta write conflict, and whatever a sink
  raises as ``SinkUnavailable`` (a Postgres connection cut, a failover, Kafka
  brokers unavailable: each sink decides which of its client's errors those
  are). A ``TransientError`` says so itself. The runner tries the batch again
  with a growing pause (``TRANSIENT_PAUSES_S``) and does not count them.
- ``definition``: the pipeline's definition cannot run, found only when Spark
  analyses the batch's plan (a column the transform's output lacks, mismatched
  types: ``DEFINITION_CONDITIONS``; a SQL step that does not parse or names a
  column its input lacks: ``DefinitionInvalid``), or before (``DefinitionMismatch``). No
  input would run: not counted, never a poison batch, and the advice is to fix
  the definition, never to set the input aside.
- ``operational``: something around the batch is wrong and stays wrong
  until someone acts — a file gone, history gone, a damaged or missing
  checkpoint table, a configuration error: lowmark's own one-line errors.
  Counted apart; ``max_failed_attempts`` of them block the batch too, with
  that error's line (it says what to do), and the Dagster sensor waits ever
  longer between runs before that (``lowmark.batches.admin.status.pending_work``).

Another runner (``ConcurrentRunner``), a refusal of this very rule
(``PoisonBatch``), an interrupt (``Interrupted``), Spark failing to start
(``SparkNotStarted``) and kills are no failure of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from lowmark.batches.errors import (
    DefinitionInvalid,
    DefinitionMismatch,
    ExpectationsFailed,
    Interrupted,
    PipelineConfigInvalid,
    PoisonBatch,
    SinkWriteFailed,
    SourceFileUnreadable,
)
from lowmark.batches.pipeline import Pipeline
from lowmark.batches.sources.base import Range, Source
from lowmark.state.errors import (
    ConcurrentRunner,
    LowmarkError,
    TransientError,
    first_line,
    jvm_causes,
)
from lowmark.state.failures import Failure, FailureKind, FailureLog
from lowmark.state.session import SparkNotStarted

SHOWN_INPUTS = 5
"""Input items a message names before it says how many more there are."""


TRANSIENT_PAUSES_S = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
"""Pauses before each new try of a batch that hit a transient error: two minutes in
all, so a broker restarting for a minute or two costs a wait, not a failed run."""

TRANSIENT_JVM_CAUSES = frozenset(
    {
        "java.net.ConnectException",
        "java.net.NoRouteToHostException",
        "java.net.SocketException",
        "java.net.SocketTimeoutException",
        "java.util.concurrent.TimeoutException",
        "org.apache.kafka.common.errors.DisconnectException",
        "org.apache.kafka.common.errors.NetworkException",
        "org.apache.kafka.common.errors.TimeoutException",
        "io.delta.exceptions.ConcurrentAppendException",
        "io.delta.exceptions.ConcurrentWriteException",
        "io.delta.exceptions.MetadataChangedException",
        "io.delta.exceptions.ProtocolChangedException",
    }
)
"""JVM exceptions, anywhere in a Spark error's causes, that a later try may not meet."""

DEFINITION_CONDITIONS = frozenset(
    {
        "AMBIGUOUS_COLUMN_OR_FIELD",
        "AMBIGUOUS_REFERENCE",
        "CANNOT_RESOLVE_DATAFRAME_COLUMN",
        "COLUMN_ALREADY_EXISTS",
        "DATATYPE_MISMATCH",
        "INVALID_EXTRACT_BASE_FIELD_TYPE",
        "MISSING_AGGREGATION",
        "MISSING_GROUP_BY",
        "UNRESOLVED_COLUMN",
        "UNRESOLVED_FIELD",
        "UNRESOLVED_MAP_KEY",
        "UNRESOLVED_ROUTINE",
        "UNRESOLVED_USING_COLUMN_FOR_JOIN",
        "WRONG_NUM_ARGS",
    }
)
"""Spark's analysis error conditions (their first part) that a definition causes whatever
the input: a column, field or function the plan names that is not there, or types that do
not fit."""

ErrorKind = FailureKind | Literal["transient", "definition", "none"]


def failure_kind(exc: Exception) -> ErrorKind:
    """What ``exc``, raised by a batch's work, is (see above; ``none``: no failure)."""
    if isinstance(exc, ConcurrentRunner | PoisonBatch | Interrupted | SparkNotStarted):
        return "none"
    if isinstance(exc, TransientError | ConnectionError | TimeoutError):
        return "transient"
    if _kafka_retriable(exc):
        return "transient"
    if TRANSIENT_JVM_CAUSES & set(jvm_causes(exc)):
        return "transient"
    if isinstance(exc, DefinitionMismatch | DefinitionInvalid):
        return "definition"
    if _analysis_condition(exc) in DEFINITION_CONDITIONS:
        return "definition"
    if isinstance(exc, LowmarkError):
        data = isinstance(
            exc, SourceFileUnreadable | SinkWriteFailed | PipelineConfigInvalid | ExpectationsFailed
        )
        return "data" if data else "operational"
    return "data"


def _kafka_retriable(exc: Exception) -> bool:
    """True if ``exc`` is a Kafka client error it calls retriable (a broker away, a timeout)."""
    # Imported here, as a batch failed: planning (`lowmark status`, `plan`, a caught-up
    # `run`) must not pay for the Kafka client (docs/cli.md, "Fast commands").
    from confluent_kafka import KafkaException

    if not isinstance(exc, KafkaException):
        return False
    error = exc.args[0] if exc.args else None
    return bool(getattr(error, "retriable", lambda: False)())


def _analysis_condition(exc: Exception) -> str | None:
    """The first part of a Spark analysis error's condition (``UNRESOLVED_COLUMN`` of
    ``UNRESOLVED_COLUMN.WITH_SUGGESTION``); None for any other error."""
    from pyspark.errors import AnalysisException

    if not isinstance(exc, AnalysisException):
        return None
    condition = exc.getCondition()
    return condition.partition(".")[0] if condition else None


def blocked(
    pipeline: Pipeline, failures: Sequence[Failure], source: Source, batch: Range
) -> str | None:
    """Why ``batch``, which failed ``failures`` times, is not run again by itself, or None
    when it may run."""
    limit = pipeline.max_failed_attempts
    name = pipeline.name
    stops = [f for f in failures if f.kind == "operational"]
    if len(stops) >= limit:
        return (
            f"batch {batch.batch_id} of {name} stopped {len(stops)} times on the same "
            f"kind of error, not on its data (last: {stops[-1].error}): do what it says, then "
            f"run `lowmark run {name} --retry`"
        )
    data = [f for f in failures if f.kind == "data"]
    if len(data) < limit:
        return None
    return (
        f"batch {batch.batch_id} of {name} failed {len(data)} times (input: "
        f"{_inputs(source, batch)}; last error: {data[-1].error}): fix the transform and run "
        f"`lowmark run {name} --retry`, or set its input aside with `lowmark skip-batch {name} "
        f'{batch.batch_id} --reason "..."`'
    )


def _inputs(source: Source, batch: Range) -> str:
    """The input of ``batch`` in words: its first ``SHOWN_INPUTS`` items and how many
    more."""
    items = source.inputs(batch.start, batch.end)
    shown = ", ".join(items[:SHOWN_INPUTS]) or "none"
    if len(items) > SHOWN_INPUTS:
        shown += f" and {len(items) - SHOWN_INPUTS} more"
    return shown


def failure_report(
    pipeline: Pipeline,
    source: Source,
    failures: FailureLog,
    attempting: Range | None,
    exc: Exception,
) -> str | None:
    """``exc``, which stopped the batch ``attempting`` (its failed attempts, this one
    included, are in ``failures``), in one paragraph: the batch, its input, the error's
    first line, the attempt and what to do. None when no batch was running, or ``exc`` is
    no failure of the batch (it says all itself)."""
    kind = failure_kind(exc)
    if attempting is None or kind == "none":
        return None
    name, batch_id = pipeline.name, attempting.batch_id
    what = f"batch {batch_id} of {name} (input: {_inputs(source, attempting)})"
    error = first_line(exc)
    if kind == "transient":
        waited = f"{sum(TRANSIENT_PAUSES_S):g} s"
        return (
            f"{what} could not reach what it reads or writes, retried for {waited}: {error}; "
            f"once it is back, `lowmark run {name}` replays the batch"
        )
    if kind == "definition":  # not the batch's fault: not counted, nothing to set aside
        return (
            f"{what} cannot run as {name} is defined: {error}; fix the definition of {name} "
            f"(its transform, aggregation or sink), then `lowmark run {name}` replays the "
            "batch (not counted as a failed attempt)"
        )
    limit = pipeline.max_failed_attempts
    attempts = sum(f.kind == kind for f in failures.of(batch_id))
    if kind == "operational":  # lowmark's own line: it says what to do
        return f"{what} stopped (attempt {attempts} of {limit}): {error}"
    if isinstance(exc, ExpectationsFailed):  # its line says what to do, too
        return (
            f"{what} failed (attempt {attempts} of {limit}): {error}; after {limit} failures "
            f"runs stop at it until `lowmark run {name} --retry`"
        )
    return (
        f"{what} failed (attempt {attempts} of {limit}): {error}; fix the transform or "
        f"the input, then `lowmark run {name}` replays the batch; after {limit} failures "
        f'runs stop at it, and `lowmark skip-batch {name} {batch_id} --reason "..."` '
        "sets its input aside"
    )
