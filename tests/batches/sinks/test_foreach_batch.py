"""A function as the sink (``kind: foreach_batch``): called with each batch's output, its
id and whether an earlier attempt may have called it already; idempotent per batch id, the
pipeline is exactly once through crashes; update-mode windows are refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from pyspark.sql import DataFrame, SparkSession

from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import FileSource, ForeachBatchSink, Pipeline
from lowmark.batches.windows import Session
from tests.helpers import drop_file, pipeline, windowed

calls: list[tuple[int, bool]] = []
written: dict[int, list[tuple[int, int]]] = {}
"""What ``export`` was called with, and what it holds by batch id (a replay replaces it)."""


def export(df: DataFrame, batch_id: int, replay: bool) -> None:
    """Idempotent per batch id, as the docs ask: a batch's rows replace what that batch id
    wrote before."""
    calls.append((batch_id, replay))
    written[batch_id] = sorted((r["id"], r["amount"]) for r in df.collect())


def _pipeline() -> Any:
    source = FileSource(
        path="in", format="json", schema_ddl="id LONG, amount LONG", max_files_per_batch=1
    )
    sink = ForeachBatchSink(function=f"{__name__}:export")
    return pipeline(source=source, sink=sink)


@pytest.mark.parametrize("step", ["after_offset_log", "after_sink"])
def test_a_crashed_batch_calls_the_function_again_saying_it_is_a_replay(
    spark: SparkSession, tmp_path: Path, step: str
) -> None:
    calls.clear()
    written.clear()
    for i in range(3):
        drop_file(tmp_path, i)
    with crash_at(KillPoint(step, 1)), pytest.raises(InjectedCrash):
        MicroBatchRunner(spark, _pipeline(), tmp_path).run(max_batches=None)
    MicroBatchRunner(spark, _pipeline(), tmp_path).run(max_batches=None)

    first_attempt = [(1, False)] if step == "after_sink" else []  # it wrote, then died
    expected = [(0, False), *first_attempt, (1, True), (2, False)]
    assert calls == expected
    every = spark.read.schema("id LONG, amount LONG").json(str(tmp_path / "in")).collect()
    assert sorted(row for rows in written.values() for row in rows) == sorted(
        (r["id"], r["amount"]) for r in every
    )


def test_update_mode_windows_are_refused_in_one_line() -> None:
    fields = dict(windowed(Session(gap="5 seconds"), mode="update"))
    with pytest.raises(ValidationError) as refused:
        Pipeline(**fields | {"sink": ForeachBatchSink(function=f"{__name__}:export")})
    [error] = refused.value.errors()
    assert "\n" not in error["msg"]
    assert "foreach_batch" in error["msg"] and "output_mode: append" in error["msg"]
