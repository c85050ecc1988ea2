"""Delta write conflicts: someone else's are retried, our own runner's are ConcurrentRunner.

Every lowmark write is idempotent per (txnAppId, batch id), so retrying one
that lost a conflict is safe: it either lands once or is skipped because
it already landed. Delta raises, and lowmark answers:

- ``ConcurrentTransactionException``: another writer used the same txnAppId,
  i.e. another runner of this pipeline → ``ConcurrentRunner`` at once;
- ``ConcurrentAppendException``, ``ConcurrentDeleteReadException``,
  ``ConcurrentDeleteDeleteException``, ``ConcurrentWriteException``,
  ``MetadataChangedException``, ``ProtocolChangedException`` (an OPTIMIZE,
  another job writing the table, two creators of one table) → retried
  ``ATTEMPTS`` times with a growing pause, then ``WriteConflict``. The batch
  is not committed then, so the next run replays it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    MetadataChangedException,
    ProtocolChangedException,
)

from lowmark.state.errors import ConcurrentRunner, WriteConflict

log = logging.getLogger(__name__)

ATTEMPTS = 5
PAUSE_S = 0.5
"""Pause before the first retry; doubled before each next one."""

RETRIED = (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentDeleteDeleteException,
    ConcurrentWriteException,
    MetadataChangedException,
    ProtocolChangedException,
)


def retry_conflicts(
    write: Callable[[], None],
    path: str,
    version: int,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Run the idempotent ``write`` of batch ``version`` to ``path``, retrying lost conflicts."""
    pause = PAUSE_S
    for attempt in range(1, ATTEMPTS + 1):
        try:
            write()
            return
        except ConcurrentTransactionException as exc:
            raise ConcurrentRunner(
                f"another runner wrote batch {version} to {path} at the same time: "
                "run one `lowmark run` per pipeline"
            ) from exc
        except RETRIED as exc:
            conflict = type(exc).__name__
            if attempt == ATTEMPTS:
                raise WriteConflict(
                    f"batch {version} lost {ATTEMPTS} write conflicts on {path} (last: "
                    f"{conflict}): pause whatever else writes it (OPTIMIZE, another job) and "
                    "run again; the batch is replayed"
                ) from exc
            log.warning("batch %d: %s on %s, retrying (%d)", version, conflict, path, attempt)
            sleep(pause)
            pause *= 2
