"""Step 7, the one commit path: a batch is done once its commit-log entry is written.

Used by the runner after a batch's writes, and by ``lowmark skip-batch``
(``lowmark.batches.admin.skip_batch``), which commits a batch without its input: a
field a commit gains is added here, once.
"""

from __future__ import annotations

from lowmark.batches.event_time.watermarks import PartitionTime
from lowmark.batches.loop import faults
from lowmark.batches.loop.plan import PlannedBatch
from lowmark.batches.pipeline import Pipeline
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.commit_log import BatchCounts, CommitEntry


def commit_batch(
    checkpoint: Checkpoint,
    pipeline: Pipeline,
    planned: PlannedBatch,
    runner_id: str,
    next_watermark_ms: int | None,
    versions: dict[str, int],
    partitions: dict[str, PartitionTime] | None,
    counts: BatchCounts,
    next_timer_ms: int | None = None,
) -> CommitEntry:
    """Commit batch ``planned``; the entry written.

    Step 7a. The per-partition times ``partitions`` (event-time pipelines;
             None: none to write), one row each in the watermarks table.
    Step 7b. The commit entry: ``next_watermark_ms`` (the next batch starts
             from it), the table ``versions`` the batch wrote (and the
             watermarks'), its ``counts`` and the running totals. A runner
             whose claim loses to another's stops (``CommitLog.claim``).
    """
    batch_id = planned.batch_id
    versions = dict(versions)
    event_time = pipeline.event_time
    if event_time is not None and partitions is not None:
        versions["watermarks"] = checkpoint.watermarks.write(
            batch_id,
            [
                (p, t.max_event_time_ms, t.watermark_ms(event_time), t.last_seen_ms)
                for p, t in sorted(partitions.items())
            ],
        )
    commit = CommitEntry(
        batch_id=batch_id,
        runner_id=runner_id,
        next_watermark_ms=next_watermark_ms,
        next_timer_ms=next_timer_ms,
        table_versions=versions,
        **counts.model_dump(),
    ).plus_totals(planned.previous)
    faults.reached("before_commit", batch_id)
    checkpoint.commits.claim(commit)
    return commit
