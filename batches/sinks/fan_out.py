"""Several sinks of one pipeline, written in turn as one (``extra_sinks``).

Each sink is exactly once on its own (idempotent per batch id, each under an
idempotency key of its own), and the batch commits only after the last of
them wrote: a crash between two writes replays the batch, the sinks that
landed skip it, the others write it. So the set is exactly once too, and a
reader of two sinks may see one a batch ahead of the other until the batch
commits (there is no transaction across systems).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

import pyarrow as pa
from pyspark.sql import DataFrame

from lowmark.batches.sinks.base import Sink, WindowedSink

S = TypeVar("S", Sink, WindowedSink)


class _Each(Generic[S]):
    """What several sinks answer together: the first is the pipeline's ``sink``."""

    def __init__(self, sinks: Sequence[S]) -> None:
        self.sinks: list[S] = list(sinks)

    def landed(self, batch_id: int) -> bool | None:
        """Whether every sink holds batch ``batch_id``'s write: False when one can tell it
        does not, True when all can tell they do, else None."""
        answers = [sink.landed(batch_id) for sink in self.sinks]
        if False in answers:
            return False
        return True if all(answers) else None

    def begin(self, batch_id: int, replay: bool) -> None:
        for sink in self.sinks:
            sink.begin(batch_id, replay)


class FanOut(_Each[Sink], Sink):
    """A stateless pipeline's sinks: the batch's rows, computed once (cached), to each."""

    def write(self, df: DataFrame, batch_id: int, retract: DataFrame | None = None) -> int | None:
        """Each sink's write in turn; the version of the first (the one the commit log
        records)."""
        rows = df.persist()
        try:
            versions = [sink.write(rows, batch_id, retract) for sink in self.sinks]
        finally:
            rows.unpersist()
        return versions[0]


class FanOutWindows(_Each[WindowedSink], WindowedSink):
    """A windowed pipeline's sinks: the windows a batch emits, to each."""

    def write(self, rows: pa.Table, batch_id: int, retract: pa.Table | None = None) -> int | None:
        """As ``FanOut.write``."""
        versions = [sink.write(rows, batch_id, retract) for sink in self.sinks]
        return versions[0]


def each_sink(sink: Sink | WindowedSink) -> list[Sink | WindowedSink]:
    """The sinks ``sink`` writes: several for a fan-out, else itself."""
    if isinstance(sink, FanOut | FanOutWindows):
        return list(sink.sinks)
    return [sink]
