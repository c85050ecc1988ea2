"""Checkpoint maintenance: bounded logs and few files, for a pipeline that runs for years.

Every checkpoint table a batch writes grows by a data file and a Delta
commit per batch; left alone, opening one (every batch, every sensor tick)
would cost more with every batch. Every ``every_batches`` batches, right
after a commit, the runner maintains each table (``DriverTable.maintain``):

1. old log rows go: offsets, commits and watermarks
   keep their latest ``log_batches`` batches (recovery reads only the latest
   entry; Spark keeps 100 by default too), progress its latest
   ``progress_batches``; the offsets first go to the offset log's history
   (``OffsetLog.retire``), which keeps every batch's boundaries for ``lowmark
   rebuild``;
2. small files are merged into few (delta-rs OPTIMIZE);
3. first of all, the Delta log is checkpointed at the version the last
   commit recorded and log files below it older than the log retention (a
   minute) are deleted; data files removed over ``KEEP_HOURS`` ago are
   vacuumed.

Before all that, the source retires what planning no longer needs
(``Source.retire``: the file source moves the manifest rows of committed
files that left the folder to the manifest history).

What it never loses: the entries recovery or a replay reads (the latest
ones), and the window state as of the last commit, which a pending replay
and a backfill read. That version stays readable however long maintenance
runs after it, batches pending or not (``lowmark compact`` and the daily
schedule run at any time, between a crash and its replay too): its log is
checkpointed and kept, and VACUUM keeps its files, however long ago a
crashed batch's write or an earlier maintenance's OPTIMIZE removed them
from the current version. The rows of the offset log's history and of the file
manifest and its history (a backfill reads the whole committed history), of the bad and late
records, and the sink (the user's table: OPTIMIZE and VACUUM it as any Delta
table) are kept.
Maintenance is best-effort: a table it cannot maintain now (a write raced it)
is left for the next time, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from deltalake.exceptions import CommitFailedError, DeltaError

from lowmark.state.checkpoint import Checkpoint
from lowmark.state.keyed_state import Expiry, compact_latest
from lowmark.state.state_table import StateTable
from lowmark.state.table import DriverTable

log = logging.getLogger(__name__)

KEEP_HOURS = 1
"""Data files removed this long ago are deleted (readers of older versions are done by then)."""


@dataclass(frozen=True)
class KeptBatches:
    """Batches of history each kind of log keeps."""

    log_batches: int
    progress_batches: int


def maintain(
    checkpoint: Checkpoint,
    batch_id: int,
    keep: KeptBatches,
    recorded: dict[str, int],
    state: Sequence[StateTable],
    expiry: Expiry | None = None,
) -> int:
    """Maintain every table of ``checkpoint`` after batch ``batch_id`` committed, its
    ``state`` tables among them; tables maintained.

    ``recorded`` are the table versions that commit recorded: each state table
    (``lowmark.state.state_table``) keeps its version readable (``DriverTable.maintain``)
    for a replay of the next batch and for a backfill, whatever was written to the table
    since. A keyed step's state first sheds the values later ones replaced and those expired by
    ``expiry`` (the committed batch's processing time and the watermark it left: later
    batches run at no earlier ones; ``compact_latest``).
    """
    logs = batch_id - keep.log_batches + 1
    progress = batch_id - keep.progress_batches + 1
    try:
        checkpoint.offsets.retire(logs)
    except (CommitFailedError, DeltaError) as exc:  # the entries stay in the log till then
        log.warning("maintenance of %s skipped until next time: %s", checkpoint.offsets.path, exc)
        logs = 0
    plan: list[tuple[DriverTable, str | None, int | None]] = [
        (checkpoint.offsets.table, f'"batch_id" < {logs}', None),
        (checkpoint.commits.table, f'"batch_id" < {logs}', None),
        (checkpoint.watermarks.table, f'"batch_id" < {logs}', None),
        (checkpoint.progress.table, f'"batch_id" < {progress}', None),
        (checkpoint.files.table, None, None),
        (checkpoint.files.history, None, None),
        (checkpoint.bad_records, None, None),
        (checkpoint.late, None, None),
    ]
    if checkpoint.offsets.history.exists():  # made by the first retirement
        plan.append((checkpoint.offsets.history, None, None))
    plan.extend((table.table, None, recorded.get(table.role)) for table in state)
    maintained = 0
    for table, drop_where, keep_version in plan:
        try:
            if table.path == checkpoint.table("keyed_state"):
                compact_latest(table, expiry)
            table.maintain(drop_where, KEEP_HOURS, keep_version)
            maintained += 1
        except (CommitFailedError, DeltaError) as exc:
            log.warning("maintenance of %s skipped until next time: %s", table.path, exc)
    return maintained
