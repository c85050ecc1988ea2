"""The sink contracts: a batch's output as a DataFrame (``Sink``, what users write), or a
windowed pipeline's few windows as Arrow tables on the driver (``WindowedSink``); both
answer the one protocol of a sink's fence (``SinkFence``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import pyarrow as pa

from lowmark.batches.pipeline import Pipeline
from lowmark.state.checkpoint import Checkpoint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class SinkFence:
    """What every sink answers about its writes besides making them, each batch's write
    being idempotent per ``(txn_app_id, batch_id)``, where ``txn_app_id`` is the
    checkpoint's ``txn_app_id("sink")`` (``<pipeline_id>:sink``, ``:<name>`` appended for an
    extra sink): a Delta ``txnAppId``, a Postgres fence row's ``app_id``, a Kafka fence
    group's and transactional id's part."""

    def landed(self, batch_id: int) -> bool | None:
        """Whether batch ``batch_id``'s write is in the sink; None (the default): the sink
        cannot tell. A replay of a batch that may have written reads its input strictly
        (as it was), and ``lowmark skip-batch`` refuses a batch whose write landed."""
        return None

    def last_landed(self) -> int | None:
        """The newest batch of ``txn_app_id`` whose write is in the sink, -1 when none is;
        None (the default): the sink cannot tell. A batch commits only after every sink of
        the pipeline wrote it, so a sink of a fan-out can only lag behind the others on the
        one batch that did not commit: ``lowmark reset --after-sink`` refuses then."""
        return None

    def begin(self, batch_id: int, replay: bool) -> None:
        """Called once per attempt of batch ``batch_id``, before anything of it is written:
        ``replay`` is true when an earlier attempt may have written (its offsets were
        logged before this attempt started). The default does nothing."""
        return None

    def check_ours(self, pipeline: Pipeline, checkpoint: Checkpoint) -> None:
        """Called before ``checkpoint``'s first batch: raise ``SinkHeldElsewhere`` (one line
        naming the other checkpoint and the way on) when the sink holds another checkpoint's
        writes, which the source, read from the start again, would write a second time. The
        writes of ``checkpoint`` and of the one it continues (``checkpoint.adopted_from``,
        after ``lowmark reset --after-sink``) are ours. The default checks nothing: a sink
        lowmark cannot read checks its own."""
        return None


class Sink(SinkFence, ABC):
    """Where a batch's output goes, as a DataFrame (Spark's ``foreachBatch``, exactly once).

    Contract: ``write(df, batch_id, retract)`` may be called again for the
    same batch after a crash (a replay) with the same rows; an exactly-once
    sink must then leave its system as if it had been called once (idempotent
    per batch id: a Delta table written with ``txnAppId``/``txnVersion``, a
    MERGE on a key, a file named by the batch id). ``retract`` (update-mode
    windows only) holds the identities of rows the batch supersedes, e.g.
    sessions merged into a longer one. It returns the version of the table it
    wrote, if the sink is versioned (recorded in the commit log). The rest of
    the contract (``landed``, ``begin``, ``check_ours``) is ``SinkFence``'s.
    """

    @abstractmethod
    def write(
        self, df: DataFrame, batch_id: int, retract: DataFrame | None = None
    ) -> int | None: ...


class WindowedSink(SinkFence, ABC):
    """A windowed pipeline's sink: the windows a batch emits, a few, on the driver (and a
    stream-stream join's: the joined rows, made on the driver).

    Contract as ``Sink``, over Arrow tables: ``write(rows, batch_id, retract)``
    may be called again for the same batch after a crash with the same rows
    and leaves the sink as if called once; ``retract`` holds the identities of
    windows the batch supersedes (update mode: sessions merged into a longer
    one).
    """

    @abstractmethod
    def write(
        self, rows: pa.Table, batch_id: int, retract: pa.Table | None = None
    ) -> int | None: ...
