"""The sink contract."""

from __future__ import annotations

from abc import ABC, abstractmethod

from pyspark.sql import DataFrame


class Sink(ABC):
    """Where a batch's output goes.

    Contract: ``write(df, batch_id, retract)`` may be called again for the
    same batch after a crash (a replay) with the same rows; an exactly-once
    sink must then leave the table as if it had been called once. ``retract``
    (keyed sinks only) holds the keys of rows the batch supersedes, e.g.
    sessions merged into a longer one. It returns the version of the table
    it wrote, if the sink is versioned.
    """

    @abstractmethod
    def write(
        self, df: DataFrame, batch_id: int, retract: DataFrame | None = None
    ) -> int | None: ...
