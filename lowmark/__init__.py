"""lowmark: exactly-once, event-time-correct micro-batch streaming on PySpark + Delta Lake.

What a pipeline module imports::

    from lowmark import Aggregate, DeltaSink, EventTime, FileSource, Pipeline, Tumbling

Every model a pipeline is built from (each section of the configuration reference), the
contracts a user implements (``Source``, ``Sink``, ``PipelineListener``) and the runner
that runs a pipeline from Python (``MicroBatchRunner``) are here, and the docs import
them from here only (tests/test_api.py).

Every module of lowmark is under this one name (``lowmark.batches``, ``lowmark.state``,
``lowmark.orchestration``: the repository's top-level folders, linked here), so a project's
own ``state.py`` or ``batches.py`` never stands in for one of them.

The names below, and ``__version__``, are read on first use (a module ``__getattr__``):
importing any ``lowmark`` module runs this file first, and a command that needs no Spark
(``lowmark --version``, ``lowmark status``) must not load them through here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lowmark.batches.dedup import Dedup
    from lowmark.batches.expectations import Expectation, Quality
    from lowmark.batches.keyed.definition import Keyed
    from lowmark.batches.loop.listeners import PipelineListener
    from lowmark.batches.loop.microbatch import MicroBatchRunner
    from lowmark.batches.pipeline import (
        CustomSink,
        CustomSource,
        DeltaSink,
        DeltaSource,
        EventTimePartitions,
        FileSource,
        ForeachBatchSink,
        HealthChecks,
        KafkaSink,
        KafkaSource,
        Maintenance,
        Pipeline,
        PostgresSink,
        SyntheticSource,
        UnionSource,
    )
    from lowmark.batches.sinks import Sink
    from lowmark.batches.sources import Source, SourceRead
    from lowmark.batches.sql import SqlStep
    from lowmark.batches.stream_join import JoinTime, StreamJoin
    from lowmark.batches.table_join import TableJoin
    from lowmark.batches.windows import (
        Aggregate,
        EventTime,
        IngestionWatermark,
        Session,
        Sliding,
        Tumbling,
        UserAggregate,
        WindowedAggregation,
    )

_HOME = {
    "Dedup": "lowmark.batches.dedup",
    "Expectation": "lowmark.batches.expectations",
    "Quality": "lowmark.batches.expectations",
    "Keyed": "lowmark.batches.keyed.definition",
    "PipelineListener": "lowmark.batches.loop.listeners",
    "MicroBatchRunner": "lowmark.batches.loop.microbatch",
    **dict.fromkeys(
        (
            "CustomSink",
            "CustomSource",
            "DeltaSink",
            "DeltaSource",
            "EventTimePartitions",
            "FileSource",
            "ForeachBatchSink",
            "HealthChecks",
            "KafkaSink",
            "KafkaSource",
            "Maintenance",
            "Pipeline",
            "PostgresSink",
            "SyntheticSource",
            "UnionSource",
        ),
        "lowmark.batches.pipeline",
    ),
    "Sink": "lowmark.batches.sinks",
    "Source": "lowmark.batches.sources",
    "SourceRead": "lowmark.batches.sources",
    "SqlStep": "lowmark.batches.sql",
    "JoinTime": "lowmark.batches.stream_join",
    "StreamJoin": "lowmark.batches.stream_join",
    "TableJoin": "lowmark.batches.table_join",
    **dict.fromkeys(
        (
            "Aggregate",
            "EventTime",
            "IngestionWatermark",
            "Session",
            "Sliding",
            "Tumbling",
            "UserAggregate",
            "WindowedAggregation",
        ),
        "lowmark.batches.windows",
    ),
}
"""Each public name and the module it is imported from (the ``TYPE_CHECKING`` imports above
and ``__all__`` say the same for type checkers and IDEs; tests/test_api.py keeps them equal)."""

__all__ = [
    "Aggregate",
    "CustomSink",
    "CustomSource",
    "Dedup",
    "DeltaSink",
    "DeltaSource",
    "EventTime",
    "EventTimePartitions",
    "Expectation",
    "FileSource",
    "ForeachBatchSink",
    "HealthChecks",
    "IngestionWatermark",
    "JoinTime",
    "KafkaSink",
    "KafkaSource",
    "Keyed",
    "Maintenance",
    "MicroBatchRunner",
    "Pipeline",
    "PipelineListener",
    "PostgresSink",
    "Quality",
    "Session",
    "Sink",
    "Sliding",
    "Source",
    "SourceRead",
    "SqlStep",
    "StreamJoin",
    "SyntheticSource",
    "TableJoin",
    "Tumbling",
    "UnionSource",
    "UserAggregate",
    "WindowedAggregation",
    "__version__",
]


__version__: str
"""The installed package's version (read from its metadata on first use: importing
``importlib.metadata`` costs 60 ms that ``lowmark show`` must not pay)."""


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        value: Any = version("lowmark")
    elif name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
    else:
        raise AttributeError(f"module 'lowmark' has no attribute {name!r}")
    globals()[name] = value  # the next look-up finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
