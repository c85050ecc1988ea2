"""Several sinks of one pipeline, written in turn as one (``extra_sinks``).

Each sink is exactly once on its own (idempotent per batch id, each under an
idempotency key of its own), and the batch commits only after the last of
them wrote: a crash between two writes replays the batch, the sinks that
landed skip it, the others write it. So the set is exactly once too, and a
reader of two sinks may see one a batch ahead of the other until the batch
commits (there is no transaction across systems).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Generic, TypeVar

import pyarrow as pa
from pyspark.sql import DataFrame

from lowmark.batches.pipeline import PRIMARY_SINK, Pipeline
from lowmark.batches.sinks.base import Sink, WindowedSink
from lowmark.state.checkpoint import Checkpoint

S = TypeVar("S", Sink, WindowedSink)


class _Each(Generic[S]):
    """What several sinks answer together, by name: the first is the pipeline's ``sink``."""

    def __init__(self, sinks: Mapping[str, S]) -> None:
        self.sinks: dict[str, S] = dict(sinks)

    def landed(self, batch_id: int) -> bool | None:
        """Whether batch ``batch_id``'s write is in any of the sinks (its replay must read
        what it read; setting it aside would leave its rows there): True when one can tell
        it is, False when all can tell it is not, else None."""
        answers = [sink.landed(batch_id) for sink in self.sinks.values()]
        if True in answers:
            return True
        return False if all(answer is False for answer in answers) else None

    def begin(self, batch_id: int, replay: bool) -> None:
        for sink in self.sinks.values():
            sink.begin(batch_id, replay)

    def check_ours(self, pipeline: Pipeline, checkpoint: Checkpoint) -> None:
        """Each sink checks its own."""
        for sink in self.sinks.values():
            sink.check_ours(pipeline, checkpoint)


class FanOut(_Each[Sink], Sink):
    """A stateless pipeline's sinks: the batch's rows, computed once (cached), to each."""

    def write(self, df: DataFrame, batch_id: int, retract: DataFrame | None = None) -> int | None:
        """Each sink's write in turn; the version of the first (the one the commit log
        records)."""
        rows = df.persist()
        try:
            versions = [sink.write(rows, batch_id, retract) for sink in self.sinks.values()]
        finally:
            rows.unpersist()
        return versions[0]


class FanOutWindows(_Each[WindowedSink], WindowedSink):
    """A windowed pipeline's sinks: the windows a batch emits, to each."""

    def write(self, rows: pa.Table, batch_id: int, retract: pa.Table | None = None) -> int | None:
        """As ``FanOut.write``."""
        versions = [sink.write(rows, batch_id, retract) for sink in self.sinks.values()]
        return versions[0]


def landed_in(sink: Sink | WindowedSink, batch_id: int) -> list[str]:
    """The names of the sinks ``sink`` writes (``sink`` and each extra one) that can tell
    they hold batch ``batch_id``'s write."""
    named = sink.sinks if isinstance(sink, FanOut | FanOutWindows) else {PRIMARY_SINK: sink}
    return [name for name, each in named.items() if each.landed(batch_id)]
