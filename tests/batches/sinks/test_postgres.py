"""The Postgres sink against a real server: pipelines into it equal a plain Spark batch, a
replayed batch writes nothing twice, tables are created with the documented types, and a
bad setting stops the run in one line before anything is written."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lowmark.batches.errors import (
    PipelineConfigInvalid,
    SinkHeldElsewhere,
    SinkUnreachable,
    SinkWriteFailed,
)
from lowmark.batches.loop.faults import KillPoint
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import Pipeline, PostgresSink
from lowmark.batches.sinks.postgres import PostgresFrameSink
from lowmark.batches.windows import Session
from tests.helpers import SCHEMA, drop_batches, event, reference, run_replaying, timed, windowed
from tests.postgres_server import PostgresServer

BATCHES = [
    [event("a", 0, 1), event("b", 3, 2), event("a", 15, 3)],
    [event("a", 7, 4), event("b", 4, 5)],  # bridges a's two sessions: they merge
    [event("c", 40, 6), event("b", 90, 7)],
]
"""Three batches (one file each) for ``timed`` and ``windowed`` pipelines."""


def _comparable(rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """``rows`` sorted, times as epoch seconds (a Spark time is naive local time, a Postgres
    one aware), floats rounded: Spark's and Postgres's rows compare equal."""
    return sorted(
        tuple(
            v.timestamp() if isinstance(v, datetime) else round(v, 9) if isinstance(v, float) else v
            for v in row
        )
        for row in rows
    )


def _stateless(mode: str = "append") -> Pipeline:
    keys = ("user", "ts") if mode == "upsert" else ()
    return timed(sink=PostgresSink(table="events", mode=mode, keys=keys))


def _sessions() -> Pipeline:
    p = windowed(Session(gap="10 seconds"), "update", max_out_of_orderness="1 minute")
    return p.model_copy(update={"sink": PostgresSink(table="sessions")})


SESSION_COLUMNS = '"user", window_start, window_end, count, sum_amount, min_amount, max_amount'
"""The sink's columns a plain batch computes alike (``avg_amount`` is a double of a sum)."""
CHANGE_A = "UPDATE sessions SET max_amount = -1 WHERE \"user\" = 'a' RETURNING 1"


AFTER_POSTGRES_COMMIT = KillPoint("after_sink", 1)
"""Batch 1's transaction committed, lowmark's commit entry never written: batch 1 replays."""


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_stateless_pipeline_into_postgres_equals_a_plain_batch_even_replayed(
    spark: SparkSession, tmp_path: Path, postgres: PostgresServer, pg_database: str, mode: str
) -> None:
    replayed = run_replaying(spark, _stateless(mode), tmp_path, BATCHES, AFTER_POSTGRES_COMMIT)

    assert replayed == [1]
    expected = spark.read.schema(SCHEMA).json(str(tmp_path / "in"))
    got = _comparable(postgres.rows(pg_database, 'SELECT "user", ts, amount FROM events'))
    assert got == _comparable(
        expected.collect()
    )  # appended twice, batch 1's rows would be there twice
    fenced = postgres.rows(pg_database, "SELECT batch_id, rows FROM lowmark_sink_batches")
    assert sorted(fenced) == [(0, 3), (1, 2), (2, 2)]


def test_a_windowed_pipeline_into_postgres_equals_a_plain_batch_even_replayed(
    spark: SparkSession, tmp_path: Path, postgres: PostgresServer, pg_database: str
) -> None:
    # After the crash, someone changes the session batch 1 wrote (a's merged one, which no
    # later batch touches): a replay that wrote again would overwrite it.
    change = partial(postgres.rows, pg_database, CHANGE_A)
    replayed = run_replaying(spark, _sessions(), tmp_path, BATCHES, AFTER_POSTGRES_COMMIT, change)

    assert replayed == [1]
    found = _comparable(postgres.rows(pg_database, f"SELECT {SESSION_COLUMNS} FROM sessions"))
    expected = reference(spark, tmp_path, Session(gap="10 seconds")).drop("avg_amount")
    # a's merged session (its two parts deleted), b's two, c's; a's as changed: batch 1's
    # replay (which merged a's sessions) wrote nothing.
    assert found == [
        (*row[:6], -1) if row[0] == "a" else row for row in _comparable(expected.collect())
    ]
    assert len(found) == 4


def test_a_new_table_gets_the_documented_column_types(
    spark: SparkSession, postgres: PostgresServer, pg_database: str
) -> None:
    df = spark.createDataFrame(
        [(True, 1, 2, 3, 4.5, 5.5, Decimal("1.25"), "x", bytearray(b"\x01"), datetime(2026, 1, 1))],
        "b BOOLEAN, s SMALLINT, i INT, l BIGINT, f FLOAT, d DOUBLE, n DECIMAL(10,2), "
        "t STRING, y BINARY, ts TIMESTAMP",
    ).withColumn("day", F.to_date(F.lit("2026-01-02")))
    df = df.withColumn("ntz", F.to_timestamp_ntz(F.lit("2026-01-02 03:04:05")))
    PostgresFrameSink(PostgresSink(table="typed"), "pid:sink").write(df, 0)
    types = postgres.rows(
        pg_database,
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 'typed' ORDER BY ordinal_position",
    )
    assert types == [
        ("b", "boolean"),
        ("s", "smallint"),
        ("i", "integer"),
        ("l", "bigint"),
        ("f", "real"),
        ("d", "double precision"),
        ("n", "numeric"),
        ("t", "text"),
        ("y", "bytea"),
        ("ts", "timestamp with time zone"),
        ("day", "date"),
        ("ntz", "timestamp without time zone"),
    ]
    (ts,) = postgres.rows(pg_database, "SELECT ts FROM typed")[0]
    assert ts == datetime(2026, 1, 1).astimezone(UTC)  # the instant Spark held


def test_nested_output_is_refused_naming_the_column_and_the_cast(
    spark: SparkSession, postgres: PostgresServer, pg_database: str
) -> None:
    df = spark.createDataFrame([(1, [1, 2])], "id LONG, tags ARRAY<LONG>")
    sink = PostgresFrameSink(PostgresSink(table="nested"), "pid:sink")
    with pytest.raises(SinkWriteFailed, match=r"^column tags of type list<.*to_json"):
        sink.write(df, 0)


def test_upsert_without_keys_and_a_password_in_the_dsn_are_refused_in_one_line() -> None:
    with pytest.raises(ValidationError, match=r"mode 'upsert' needs `keys`"):
        PostgresSink(table="t", mode="upsert")
    with pytest.raises(ValidationError, match=r"`dsn` holds a password: .*`password_env`"):
        PostgresSink(table="t", dsn="postgresql://app:secret@db/serving")


@pytest.mark.parametrize(
    ("setting", "error", "message"),
    [
        (
            {"password_env": "LOWMARK_TEST_NO_SUCH_VARIABLE"},
            PipelineConfigInvalid,
            r"environment variable LOWMARK_TEST_NO_SUCH_VARIABLE \(`password_env`\) is not set",
        ),
        (
            {"host": "no-such-host.invalid"},
            SinkUnreachable,
            r"sink postgres events: cannot connect .*; fix the sink's `dsn`, `host`",
        ),
    ],
    ids=["missing-password-variable", "no-such-host"],
)
def test_a_bad_connection_setting_stops_the_run_before_the_batch_writes_anything(
    spark: SparkSession,
    data_root: Path,
    postgres: PostgresServer,
    pg_database: str,
    setting: dict[str, str],
    error: type[Exception],
    message: str,
) -> None:
    drop_batches(data_root, BATCHES)
    sink = PostgresSink(table="events", **setting)
    p = timed(sink=sink)
    runner = MicroBatchRunner(spark, p, data_root)
    with pytest.raises(error, match=message) as refused:
        runner.run(max_batches=None)
    assert "\n" not in str(refused.value)
    assert runner.checkpoint.offsets.latest_batch_id() is None


def test_a_new_checkpoint_refuses_a_table_another_checkpoint_wrote(
    spark: SparkSession, tmp_path: Path, postgres: PostgresServer, pg_database: str
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        drop_batches(root, BATCHES[:1])
    MicroBatchRunner(spark, _stateless(), first).run(max_batches=None)
    runner = MicroBatchRunner(spark, _stateless(), second)
    with pytest.raises(SinkHeldElsewhere, match=r"^sink postgres public\.events holds the"):
        runner.run(max_batches=None)
    assert runner.checkpoint.offsets.latest_batch_id() is None  # refused before batch 0
    assert len(postgres.rows(pg_database, "SELECT * FROM events")) == 3  # the first's only


def test_a_table_in_a_schema_that_does_not_exist_yet_is_created_with_its_schema(
    spark: SparkSession, postgres: PostgresServer, pg_database: str
) -> None:
    sink = PostgresFrameSink(PostgresSink(table="iot.readings"), "pid:sink")
    sink.table.check()  # before the first batch, as a run does: the fence's schema too
    sink.write(spark.createDataFrame([(1, "a")], "id LONG, name STRING"), 0)

    assert postgres.rows(pg_database, "SELECT id, name FROM iot.readings") == [(1, "a")]
    fenced = postgres.rows(pg_database, "SELECT batch_id, rows FROM iot.lowmark_sink_batches")
    assert fenced == [(0, 1)]
