"""A function of the user's as the sink (``kind: foreach_batch``), as Spark's ``foreachBatch``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame

from lowmark.batches.sinks.base import Sink


class ForeachBatch(Sink):
    """Calls ``function(df, batch_id, replay)`` with each batch's output.

    ``replay`` is what the runner said when the attempt began (``Sink.begin``): an earlier
    attempt of the batch may have called the function already, with the same rows. The
    function's return value is ignored; what it writes is its own (lowmark cannot read it:
    ``landed`` cannot tell).
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.replay = False

    def begin(self, batch_id: int, replay: bool) -> None:
        self.replay = replay

    def write(self, df: DataFrame, batch_id: int, retract: DataFrame | None = None) -> None:
        assert retract is None, "update-mode windows are refused with a foreach_batch sink"
        self.function(df, batch_id, self.replay)
