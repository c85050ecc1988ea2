"""A sink the user writes (``kind: custom``): built by the factory its config names."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from lowmark.batches.collect import frame_of
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.pipeline import CustomSink, Pipeline
from lowmark.batches.sinks.base import Sink, WindowedSink
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.session import SparkLike, provider


def from_factory(
    spark: SparkLike, config: CustomSink, pipeline: str, data_root: Path, txn_app_id: str
) -> Sink:
    """``config.factory(spark, options, data_root, txn_app_id)``, checked to be a ``Sink``."""
    sink = config.factory(spark, config.options, data_root, txn_app_id)
    if not isinstance(sink, Sink):
        raise PipelineConfigInvalid(
            f"pipeline {pipeline}: sink factory {config.label} returned "
            f"{type(sink).__name__}, not a lowmark.batches.sinks.base.Sink: return your Sink "
            "subclass"
        )
    return sink


class WindowsAsFrames(WindowedSink):
    """A windowed pipeline's windows handed to a user's ``Sink`` as DataFrames.

    The windows are on the driver already; each batch that emits or
    retracts some becomes a local DataFrame (no input is read again). A batch
    that changes no window writes nothing: the sink is not called.
    """

    def __init__(self, spark: SparkLike, sink: Sink) -> None:
        self._spark = provider(spark)
        self.sink = sink

    def write(self, rows: pa.Table, batch_id: int, retract: pa.Table | None = None) -> int | None:
        gone = retract if retract is not None and retract.num_rows else None
        if not rows.num_rows and gone is None:
            return None
        spark = self._spark()
        retract = frame_of(spark, gone) if gone else None
        return self.sink.write(frame_of(spark, rows), batch_id, retract)

    def landed(self, batch_id: int) -> bool | None:
        return self.sink.landed(batch_id)

    def begin(self, batch_id: int, replay: bool) -> None:
        self.sink.begin(batch_id, replay)

    def check_ours(self, pipeline: Pipeline, checkpoint: Checkpoint) -> None:
        self.sink.check_ours(pipeline, checkpoint)
