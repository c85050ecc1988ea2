"""``LOWMARK_BENCH_PIPELINES`` (default 20) copies of the benchmark's windowed pipeline, for
``bench/dagster_latency.py --pipelines N``: ``bench_follow_<i>`` reads ``in_<i>`` and writes
``out_<i>`` under one data root."""

from __future__ import annotations

import os

from bench.streaming import FOLLOW_PIPELINE, windowed_pipeline
from lowmark.batches.pipeline import DeltaSink, Pipeline

COUNT_ENV = "LOWMARK_BENCH_PIPELINES"


def names(count: int) -> list[str]:
    return [f"{FOLLOW_PIPELINE}_{i:02d}" for i in range(count)]


def pipeline(i: int) -> Pipeline:
    base = windowed_pipeline(f"{FOLLOW_PIPELINE}_{i:02d}", f"in_{i:02d}", files_per_batch=1000)
    return base.model_copy(update={"sink": DeltaSink(path=f"out_{i:02d}")})


# Module attributes: the registry loads a module's Pipeline values.
globals().update({p.name: p for p in map(pipeline, range(int(os.environ.get(COUNT_ENV, "20"))))})
