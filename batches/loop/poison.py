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
- or ``lowmark skip-batch PIPELINE BATCH --reason TEXT`` (``set_aside``): the
  batch's input is recorded in ``bad_records`` (one row per file, with the
  reason), its window state is put back as the commit before it left it,
  and an empty commit lets the pipeline go on. Nothing is dropped silently:
  the rows say which input was set aside and why, to be reprocessed once
  the transform is fixed (docs/guarantees.md).

Errors are of three kinds (``failure_kind``):

- ``data``: the batch's data work raised — a Spark error, a file the source
  schema cannot read, a sink that refused the rows, or any error of the
  transform's own code. Counted; ``max_failed_attempts`` of them make a
  poison batch.
- ``transient``: the world was briefly away — a broker unreachable, a
  timeout, a reset connection, a Delta write conflict. The runner tries the
  batch again with a growing pause (``TRANSIENT_PAUSES_S``) and does not
  count them.
- ``operational``: something around the batch is wrong and stays wrong
  until someone acts — a file gone, history gone, a damaged or missing
  checkpoint table, a configuration error: lowmark's own one-line errors.
  Counted apart; ``max_failed_attempts`` of them block the batch too, with
  that error's line (it says what to do), and the Dagster sensor waits ever
  longer between runs before that (``batches.admin.status.pending_work``).

Another runner (``ConcurrentRunner``), a refusal of this very rule
(``PoisonBatch``), an interrupt (``Interrupted``) and kills are no failure of
the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
from confluent_kafka import KafkaException
from deltalake import DeltaTable

from batches.errors import (
    Interrupted,
    PipelineConfigInvalid,
    PoisonBatch,
    SinkWriteFailed,
    SourceFileUnreadable,
)
from state import quarantine
from state.commit_log import CommitEntry
from state.errors import (
    CheckpointCorrupt,
    ConcurrentRunner,
    LowmarkError,
    WriteConflict,
    first_line,
    jvm_causes,
)
from state.failures import FailureKind

if TYPE_CHECKING:
    from batches.loop.microbatch import MicroBatchRunner, PlannedBatch

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

ErrorKind = FailureKind | Literal["transient", "none"]


def failure_kind(exc: Exception) -> ErrorKind:
    """What ``exc``, raised by a batch's work, is (see above; ``none``: no failure)."""
    if isinstance(exc, ConcurrentRunner | PoisonBatch | Interrupted):
        return "none"
    if isinstance(exc, WriteConflict | ConnectionError | TimeoutError):
        return "transient"
    if isinstance(exc, KafkaException) and _retriable(exc):
        return "transient"
    if TRANSIENT_JVM_CAUSES & set(jvm_causes(exc)):
        return "transient"
    if isinstance(exc, LowmarkError):
        data = isinstance(exc, SourceFileUnreadable | SinkWriteFailed | PipelineConfigInvalid)
        return "data" if data else "operational"
    return "data"


def _retriable(exc: KafkaException) -> bool:
    """True if the Kafka client calls the error retriable (a broker away, a timeout)."""
    error = exc.args[0] if exc.args else None
    return bool(getattr(error, "retriable", lambda: False)())


def blocked(runner: MicroBatchRunner, planned: PlannedBatch) -> str | None:
    """Why ``planned`` is not run again by itself, or None when it may run."""
    failures = runner.checkpoint.failures.of(planned.batch_id)
    limit = runner.pipeline.max_failed_attempts
    name = runner.pipeline.name
    stops = [f for f in failures if f.kind == "operational"]
    if len(stops) >= limit:
        return (
            f"batch {planned.batch_id} of {name} stopped {len(stops)} times on the same "
            f"kind of error, not on its data (last: {stops[-1].error}): do what it says, then "
            f"run `lowmark run {name} --retry`"
        )
    failures = [f for f in failures if f.kind == "data"]
    if len(failures) < limit:
        return None
    shown = _inputs(runner, planned)
    return (
        f"batch {planned.batch_id} of {name} failed {len(failures)} times (input: {shown}; "
        f"last error: {failures[-1].error}): fix the transform and run `lowmark run {name} "
        f"--retry`, or set its input aside with `lowmark skip-batch {name} "
        f'{planned.batch_id} --reason "..."`'
    )


def _inputs(runner: MicroBatchRunner, planned: PlannedBatch) -> str:
    """The input of ``planned`` in words: its first ``SHOWN_INPUTS`` items and how many
    more."""
    items = runner.source.inputs(planned.start, planned.end)
    shown = ", ".join(items[:SHOWN_INPUTS]) or "none"
    if len(items) > SHOWN_INPUTS:
        shown += f" and {len(items) - SHOWN_INPUTS} more"
    return shown


def failure_report(runner: MicroBatchRunner, exc: Exception) -> str | None:
    """``exc``, which stopped the batch ``runner`` was running, in one paragraph: the
    batch, its input, the error's first line, the attempt and what to do. None when no
    batch was running, or ``exc`` is no failure of the batch (it says all itself)."""
    planned, kind = runner.attempting, failure_kind(exc)
    if planned is None or kind == "none":
        return None
    name, batch_id = runner.pipeline.name, planned.batch_id
    what = f"batch {batch_id} of {name} (input: {_inputs(runner, planned)})"
    error = first_line(exc)
    if kind == "transient":
        waited = f"{sum(TRANSIENT_PAUSES_S):g} s"
        return (
            f"{what} could not reach what it reads or writes, retried for {waited}: {error}; "
            f"once it is back, `lowmark run {name}` replays the batch"
        )
    limit = runner.pipeline.max_failed_attempts
    attempts = sum(f.kind == kind for f in runner.checkpoint.failures.of(batch_id))
    if kind == "operational":  # lowmark's own line: it says what to do
        return f"{what} stopped (attempt {attempts} of {limit}): {error}"
    return (
        f"{what} failed (attempt {attempts} of {limit}): {error}; fix the transform or "
        f"the input, then `lowmark run {name}` replays the batch; after {limit} failures "
        f'runs stop at it, and `lowmark skip-batch {name} {batch_id} --reason "..."` '
        "sets its input aside"
    )


def refuse_poison(runner: MicroBatchRunner, planned: PlannedBatch) -> None:
    """Raise ``PoisonBatch`` if ``planned`` failed ``max_failed_attempts`` times (of one kind)."""
    reason = blocked(runner, planned)
    if reason is not None:
        raise PoisonBatch(reason)


@dataclass(frozen=True)
class SetAside:
    """What ``set_aside`` did."""

    batch_id: int
    inputs: list[str]
    state_restored_to: int | None
    """The window state version put back (None: the batch wrote no state)."""


def set_aside(runner: MicroBatchRunner, batch_id: int, reason: str) -> SetAside:
    """Commit the uncommitted batch ``batch_id`` without its input (see the module doc)."""
    planned = runner.plan_next_batch(dry_run=True)
    name = runner.pipeline.name
    if planned is None or not planned.replay or planned.batch_id != batch_id:
        pending = f"batch {planned.batch_id}" if planned and planned.replay else "none"
        raise PipelineConfigInvalid(
            f"batch {batch_id} of {name} is not its uncommitted batch (uncommitted: {pending}): "
            "only a batch that was planned and never committed can be set aside"
        )
    ckpt = runner.checkpoint
    if runner.sink.landed(batch_id):
        raise PipelineConfigInvalid(
            f"batch {batch_id} of {name} already wrote its sink: its input did not stop it; "
            f"run `lowmark run {name}` to finish it"
        )
    restored = _restore_state(runner, planned)
    inputs = runner.source.inputs(planned.start, planned.end)
    rows = [
        {
            "batch_id": batch_id,
            "source_file": item,
            "raw": None,
            "reason": f"set aside by lowmark skip-batch: {reason}",
        }
        for item in inputs
    ]
    table = pa.Table.from_pylist(rows, schema=quarantine.SCHEMA)
    ckpt.bad_records.append_once(table, ckpt.txn_app_id("skipped"), batch_id)
    previous = planned.previous
    versions = dict(previous.table_versions) if previous else {}
    if runner.stage is not None and runner.stage.state.table.exists():
        versions["state"] = runner.stage.state.table.version()
    event_time = runner.pipeline.event_time
    if event_time is not None and previous is not None:
        times = runner.partition_times(previous)
        versions["watermarks"] = ckpt.watermarks.write(
            batch_id,
            [
                (p, t.max_event_time_ms, t.watermark_ms(event_time), t.last_seen_ms)
                for p, t in sorted(times.items())
            ],
        )
    commit = CommitEntry(
        batch_id=batch_id,
        runner_id=runner.runner_id,
        next_watermark_ms=planned.watermark_ms,
        table_versions=versions,
        rows_in=0,
        rows_out=0,
        rows_bad=0,
        rows_late=0,
        rows_dropped=0,
        rows_windowed=0,
        rows_closed=0,
    ).plus_totals(previous)
    ckpt.commits.claim(commit)
    return SetAside(batch_id, inputs, restored)


def _restore_state(runner: MicroBatchRunner, planned: PlannedBatch) -> int | None:
    """Put the window state back as commit N-1 left it, if batch N's state write landed."""
    stage = runner.stage
    if stage is None or not stage.state.table.landed(stage.state.txn_app_id, planned.batch_id):
        return None
    recorded = planned.previous.table_versions.get("state") if planned.previous else None
    table = DeltaTable(stage.state.path)
    if recorded is None:  # no state before this batch: it held no windows
        table.delete()
        return None
    try:
        table.restore(recorded)
    except Exception as exc:  # delta-rs raises plain exceptions for a log or files gone
        raise CheckpointCorrupt(
            f"window state table {stage.state.path} no longer has version {recorded}, the "
            f"state batch {planned.batch_id} is set aside to (a VACUUM with a retention shorter "
            "than the time since the crash removed its files): restore them from backup, or "
            "start over with `lowmark reset`"
        ) from exc
    return recorded
