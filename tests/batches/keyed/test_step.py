"""A keyed step's changes never pass through the driver: the tasks write them as data files
of the state and timer tables, and the job brings back only those files' descriptors."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession

from examples.keyed import ALERTS, SILENCE_MS, SilenceAlert
from lowmark.batches.collect import observed
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.keyed.step import CHANGES, KeyedStep, _given
from lowmark.state.keyed_state import BUCKETS, TIMERS, KeyedTables, key_json

USERS = 300
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_keyed_batchs_changes_reach_the_driver_as_a_few_file_descriptors_whatever_the_keys(
    spark: SparkSession, tmp_path: Path
) -> None:
    tables = KeyedTables(str(tmp_path / "keyed_state"), str(tmp_path / "keyed_timers"), "p", 0)
    tables.create()
    keyed = Keyed(processor=SilenceAlert, keys=("user",), output_schema=ALERTS)
    step = KeyedStep(keyed, "ts", tables)
    seconds = {f"u{n}": n % 50 for n in range(USERS)}
    records = spark.createDataFrame(
        [(user, T0 + timedelta(seconds=s)) for user, s in seconds.items()],
        "user string, ts timestamp",
    )
    processed = step.processed(spark, records, None, 0, tables.pinned({}, False, 0), 0)

    assert processed.output.collect() == []  # one event per user: no silence yet
    changes = observed(processed.changes)
    assert changes is not None
    # Each user changed two states and set a timer: 900 rows, in a file per bucket of the
    # state table and per task and slot of the timer table.
    assert len(changes[CHANGES]) <= BUCKETS + 2 * 2
    seen = processed.observed(observed(processed.seen) or {}, changes)
    tables.write(seen.files, 0, None)

    state, timers = tables.state.read(), tables.timers.read()
    assert _pairs(state, "key", "state") == sorted(
        (key_json([user]), name) for user in seconds for name in ("last", TIMERS)
    )
    t0_ms = int(T0.timestamp() * 1000)
    assert _pairs(timers, "key", "timer_ms") == sorted(
        (key_json([user]), t0_ms + s * 1000 + SILENCE_MS) for user, s in seconds.items()
    )
    assert set(timers.column("batch_id").to_pylist()) == {0}
    # The descriptors add up to the rows committed, and name nothing but files.
    files = [f for fs in seen.files.values() for f in fs]
    assert sum(f.rows for f in files) == state.num_rows + timers.num_rows
    assert all(set(json.loads(c)) == {"table", "file"} for c in changes[CHANGES])


def _pairs(rows: pa.Table, first: str, second: str) -> list[tuple[object, object]]:
    return sorted((r[first], r[second]) for r in rows.to_pylist())


def test_a_timer_only_batchs_driver_task_is_given_the_columns_spark_gives_the_tasks(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The driver builds the marker rows of a batch without records from ``_given``, with no
    Spark plan: the same columns, of the same types, as step 1's rows in a Spark job."""
    tables = KeyedTables(str(tmp_path / "keyed_state"), str(tmp_path / "keyed_timers"), "p", 0)
    tables.create()
    step = KeyedStep(
        Keyed(processor=SilenceAlert, keys=("user",), output_schema=ALERTS), "ts", tables
    )
    records = spark.createDataFrame([], "user string, ts timestamp, amount long")
    payload = step._payload(records)
    rows, _, _ = step._bucketed(spark, records, payload, None, 0, tables.pinned({}, False, 0), 0)
    given = _given(records, payload)
    assert [(f.name, f.dataType) for f in given.fields] == [
        (f.name, f.dataType) for f in rows.schema.fields
    ]
