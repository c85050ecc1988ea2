"""This project's pipelines: every module-level ``Pipeline`` here is one (``lowmark list``).

``views_per_minute`` takes the JSON files that land in ``data/incoming/``, one page
view a line::

    {"user": "ada", "page": "/pricing", "ts": "2026-11-24T10:00:03Z"}

and counts views per page per one-minute event-time window into the Delta table
``data/views_per_minute`` (columns ``page``, ``window_start``, ``window_end``,
``views``). Every batch upserts the windows it changed (``output_mode="update"``),
so counts are there after the first batch and grow as files land. Views more than
``allowed_lateness`` behind the watermark (the newest event time seen, less the
out-of-orderness) go to the pipeline's late table, lines that are not JSON to its
bad-records table. Paths are relative to the data root (``lowmark.toml``).

Copy the pipeline to add another; every field is in lowmark's pipeline configuration
reference (docs/reference/pipeline.md), the ideas in docs/concepts.md.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lowmark import (
    Aggregate,
    DeltaSink,
    EventTime,
    FileSource,
    Pipeline,
    Tumbling,
    WindowedAggregation,
)


def parse_views(df: DataFrame) -> DataFrame:
    """Page views with their event time: a ``ts`` that is not a time becomes null, and a
    view without event time goes to the late table rather than failing the batch."""
    return df.withColumn("event_time", F.try_to_timestamp(F.col("ts"))).select(
        "user", "page", "event_time"
    )


views_per_minute = Pipeline(
    name="views_per_minute",
    description="Page views (JSON files in data/incoming) counted per page per minute.",
    source=FileSource(
        path="incoming", format="json", schema_ddl="user STRING, page STRING, ts STRING"
    ),
    transform=parse_views,
    sink=DeltaSink(path="views_per_minute"),
    event_time=EventTime(
        column="event_time", max_out_of_orderness="30 seconds", allowed_lateness="5 minutes"
    ),
    aggregation=WindowedAggregation(
        keys=("page",),
        window=Tumbling(size="1 minute"),
        aggregates=(Aggregate(fn="count", name="views"),),
        output_mode="update",
    ),
)
