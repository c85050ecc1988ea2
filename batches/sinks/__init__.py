"""Sinks: where a batch's output lands, exactly once (the contracts, the Delta sinks, the
user's own), and the one function that builds a pipeline's sink."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lowmark.batches.pipeline import (
    PRIMARY_SINK,
    DeltaSink,
    ForeachBatchSink,
    KafkaSink,
    Pipeline,
    PostgresSink,
    SinkKind,
    resolve,
)
from lowmark.batches.sinks.base import Sink, SinkFence, WindowedSink

# The sinks themselves (PySpark at their tops) are imported by what builds them: a module of
# this package (``owner``, a fence's checks) must not cost a read-only command PySpark
# (docs/cli.md, "Fast commands").
if TYPE_CHECKING:
    from lowmark.state.session import SparkLike

__all__ = [
    "Sink",
    "SinkFence",
    "WindowedSink",
    "build_sink",
    "fences",
    "written_by_tasks",
    "written_on_driver",
]


def written_on_driver(pipeline: Pipeline) -> bool:
    """Whether ``pipeline``'s output is a few rows on the driver, written from there
    (``WindowedSink``: a windowed pipeline's windows, an event-time join's rows), rather
    than records written by Spark (``Sink``)."""
    on_driver = pipeline.aggregation is not None or pipeline.stream_join is not None
    return on_driver and pipeline.event_time is not None


def written_by_tasks(pipeline: Pipeline) -> bool:
    """Whether ``pipeline``'s records pass through Python tasks (``dedup``, a ``keyed``
    step), which then write a Delta sink appended to as data files (``DeltaFilesSink``)."""
    return pipeline.dedup is not None or pipeline.keyed is not None


def build_sink(
    spark: SparkLike,
    pipeline: Pipeline,
    data_root: Path,
    txn_app_id: str,
    staged: Callable[[int], None] = lambda _batch_id: None,
) -> Sink | WindowedSink:
    """The runtime sink of ``pipeline``; ``txn_app_id`` is its idempotency key (the
    checkpoint's ``txn_app_id("sink")``), written with each batch id. With ``extra_sinks``, a
    fan-out (``fan_out``) of the sink and each extra one, under ``<txn_app_id>:<name>``. A
    transactional sink calls ``staged(batch_id)`` between a batch's records and its commit
    (a crash point).

    One writer engine per Delta sink table: a windowed pipeline's few windows,
    and a stream-stream join's rows, are on the driver and written from there
    (``WindowedSink``), a stateless pipeline's records by Spark (``Sink``), unless
    they pass through Python tasks (``written_by_tasks``): appended, they are
    written by those tasks and committed by delta-rs (``DeltaFilesSink``). A
    Postgres sink likewise: driver rows from the driver, records streamed through it. A
    Kafka sink streams records through the driver too (a ``Sink``: windows reach it as
    DataFrames, update-mode ones keyed by their identity). A custom sink is a ``Sink``, a
    ``foreach_batch`` function is called by one; a windowed or joining pipeline hands any
    of these its rows as DataFrames.
    """
    from lowmark.batches.sinks.fan_out import FanOut, FanOutWindows

    windowed = written_on_driver(pipeline)
    built = {
        name: _built(
            spark,
            pipeline,
            pipeline.written_as(config),
            data_root,
            sink_app_id(txn_app_id, name),
            windowed,
            staged,
        )
        for name, config in pipeline.sinks().items()
    }
    if len(built) == 1:
        return built[PRIMARY_SINK]
    if windowed:
        return FanOutWindows({n: s for n, s in built.items() if isinstance(s, WindowedSink)})
    return FanOut({n: s for n, s in built.items() if isinstance(s, Sink)})


def sink_app_id(txn_app_id: str, name: str) -> str:
    """The idempotency key of sink ``name`` of a checkpoint whose sink key is ``txn_app_id``
    (``<pipeline_id>:sink``): that key for the pipeline's ``sink``, ``<txn_app_id>:<name>``
    for an extra one."""
    return txn_app_id if name == PRIMARY_SINK else f"{txn_app_id}:{name}"


def fences(pipeline: Pipeline, data_root: Path, txn_app_id: str) -> dict[str, SinkFence]:
    """The fence of each of ``pipeline``'s sinks, by name, under the checkpoint's sink key
    ``txn_app_id`` (each sink's own: ``sink_app_id``), to read what landed: no writer is
    built, no Spark is needed and no user code runs. A sink of the user's (``custom``,
    ``foreach_batch``) gets the plain ``SinkFence``, which cannot tell."""
    from lowmark.batches.sinks.delta import DeltaFence
    from lowmark.batches.sinks.kafka import KafkaFence
    from lowmark.batches.sinks.postgres import PostgresFence

    found: dict[str, SinkFence] = {}
    for name, config in pipeline.sinks().items():
        app_id = sink_app_id(txn_app_id, name)
        if isinstance(config, DeltaSink):
            found[name] = DeltaFence(resolve(config.path, data_root), app_id)
        elif isinstance(config, PostgresSink):
            found[name] = PostgresFence(config, app_id)
        elif isinstance(config, KafkaSink):
            found[name] = KafkaFence(config, app_id)
        else:
            found[name] = SinkFence()
    return found


def _built(
    spark: SparkLike,
    pipeline: Pipeline,
    config: SinkKind,
    data_root: Path,
    txn_app_id: str,
    windowed: bool,
    staged: Callable[[int], None],
) -> Sink | WindowedSink:
    """The runtime sink of one of ``pipeline``'s sinks, as written (``config``)."""
    from lowmark.batches.sinks.custom import WindowsAsFrames, from_factory
    from lowmark.batches.sinks.delta import DeltaFilesSink, DeltaTableSink, DeltaWindowSink
    from lowmark.batches.sinks.foreach_batch import ForeachBatch
    from lowmark.batches.sinks.kafka import KafkaFrameSink
    from lowmark.batches.sinks.postgres import PostgresFrameSink, PostgresWindowSink

    if isinstance(config, DeltaSink):
        path = resolve(config.path, data_root)
        if windowed:
            return DeltaWindowSink(config, path, txn_app_id)
        if config.mode == "append" and written_by_tasks(pipeline):
            return DeltaFilesSink(config, path, txn_app_id)
        return DeltaTableSink(spark, config, path, txn_app_id)
    if isinstance(config, PostgresSink):
        if windowed:
            return PostgresWindowSink(config, txn_app_id)
        return PostgresFrameSink(config, txn_app_id)
    if isinstance(config, KafkaSink):
        sink: Sink = KafkaFrameSink(config, txn_app_id, pipeline.window_identity, staged)
    elif isinstance(config, ForeachBatchSink):
        sink = ForeachBatch(config.function)
    else:
        sink = from_factory(spark, config, pipeline.name, data_root, txn_app_id)
    return WindowsAsFrames(spark, sink) if windowed else sink
