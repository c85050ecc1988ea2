"""The user-written outbox source (examples/outbox_source.py) through lowmark: a pipeline
declared in YAML reads it exactly once, parses its payloads, hands the frontier back, and a
factory that returns something else is refused in one line."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.registry import get_pipeline
from tests.helpers import delta_frame

PIPELINES = """
pipelines:
  - name: outbox_orders
    source:
      kind: custom
      factory: examples.outbox_source:build
      options:
        database: app.db
        schema_ddl: "order_id LONG, amount LONG"
        max_rows_per_batch: 2
        delete_committed: true
      operational: [max_rows_per_batch]
    sink: {kind: delta, path: orders}
"""


def insert(database: Path, payloads: list[str]) -> None:
    with sqlite3.connect(database) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, payload TEXT)"
        )
        db.executemany("INSERT INTO outbox (payload) VALUES (?)", [(p,) for p in payloads])


def test_an_outbox_table_is_read_exactly_once_and_emptied_behind_the_frontier(
    spark: SparkSession, data_root: Path
) -> None:
    (data_root / "p.yaml").write_text(PIPELINES)
    pipeline = get_pipeline("outbox_orders", str(data_root / "p.yaml"))
    orders = [json.dumps({"order_id": i, "amount": 10 * i}) for i in range(1, 4)]
    insert(data_root / "app.db", [*orders[:2], "not json", orders[2]])

    assert pipeline_status(spark, pipeline, data_root).backlog == {"rows": 4}
    results = MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
    # Two ids a batch from id 0; SQLite's ids start at 1: [0, 2) holds id 1, [2, 4) ids 2
    # and 3 (the malformed one: read, and counted bad), [4, 6) id 4.
    assert [(r.end, r.rows_in, r.rows_bad) for r in results] == [
        ({"outbox": 2}, 1, 0),
        ({"outbox": 4}, 2, 1),
        ({"outbox": 5}, 1, 0),
    ]
    sink = delta_frame(spark, str(data_root / "orders"))
    assert sorted((r.order_id, r.amount) for r in sink.collect()) == [(1, 10), (2, 20), (3, 30)]
    bad = delta_frame(spark, str(data_root / "_lowmark/outbox_orders/bad_records"))
    assert [(r.source_file, r.raw) for r in bad.collect()] == [("outbox@3", "not json")]
    with sqlite3.connect(data_root / "app.db") as db:
        assert db.execute("SELECT COUNT(*) FROM outbox").fetchone() == (0,)  # all committed

    insert(data_root / "app.db", [json.dumps({"order_id": 4, "amount": 40})])
    [more] = MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
    assert (more.start, more.end) == ({"outbox": 5}, {"outbox": 6})  # id 5, though emptied


def test_a_factory_that_does_not_return_a_source_is_refused_in_one_line(
    spark: SparkSession, data_root: Path
) -> None:
    (data_root / "p.yaml").write_text(
        PIPELINES.replace("examples.outbox_source:build", "builtins:slice")
    )
    pipeline = get_pipeline("outbox_orders", str(data_root / "p.yaml"))
    with pytest.raises(
        PipelineConfigInvalid, match=r"returned slice, not a lowmark\.batches\.sources\.Source"
    ):
        MicroBatchRunner(spark, pipeline, data_root)
