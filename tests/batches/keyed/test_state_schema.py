"""State schemas: DDL read without Spark as Spark reads it, pydantic models as schemas, and
which changes of a declared schema a running checkpoint accepts."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from lowmark.batches.keyed.state_schema import (
    StateKind,
    StateSchema,
    TtlClock,
    as_struct,
    parse_ddl,
    refusal,
)
from lowmark.batches.keyed.state_values import Codec

DDLS = [
    "start_ms long, last_ms long, events long",
    "at TIMESTAMP, day DATE, amount DECIMAL(10, 2), n INT NOT NULL, f float, ok boolean",
    "tags array<struct<name: string, n: bigint>>, m map<string, double>, b binary",
    "`odd name` string COMMENT 'a comment', t timestamp_ntz, s smallint, y tinyint",
    "d dec, nested struct<a: struct<b: date>>, n numeric(5, 1)",
]


@pytest.mark.parametrize("ddl", DDLS)
def test_ddl_reads_without_spark_as_spark_reads_it(spark: SparkSession, ddl: str) -> None:
    assert parse_ddl(ddl, "test") == StructType.fromDDL(ddl)


class _Visit(BaseModel):
    at: dt.datetime
    amount: Decimal
    tags: list[str]
    note: str | None
    seen: int = 0


def test_a_pydantic_model_is_a_schema_its_defaults_nullable(spark: SparkSession) -> None:
    struct = as_struct(_Visit, "visit")
    expected = StructType.fromDDL(
        "at timestamp not null, amount decimal(38,18) not null, tags array<string> not null, "
        "note string, seen bigint"
    )
    assert isinstance(expected, StructType)
    assert [(f.name, f.dataType, f.nullable) for f in struct.fields] == [
        (f.name, f.dataType, f.nullable) for f in expected.fields
    ]
    assert struct["seen"].metadata == {"default": 0}


def _states(**schemas: str) -> dict[str, Any]:
    return {n: StateSchema(n, "value", parse_ddl(s, n)).semantics() for n, s in schemas.items()}


def _ttl(clock: TtlClock, ttl_ms: int | None = 60_000) -> dict[str, Any]:
    schema = parse_ddl("first timestamp, n long", "visits")
    return {"visits": StateSchema("visits", "value", schema, None, ttl_ms, clock).semantics()}


def _kinds(**kinds: StateKind) -> dict[str, Any]:
    schema = parse_ddl("first timestamp, n long", "visits")
    return {n: StateSchema(n, k, schema).semantics() for n, k in kinds.items()}


@pytest.mark.parametrize(
    ("now", "refused"),
    [
        (_states(visits="first timestamp, n long"), None),
        (_states(visits="first timestamp, n long, last timestamp"), None),  # nullable field
        (_states(visits="first timestamp, n long", other="x int"), None),  # a new state
        ({}, None),  # a state no longer declared
        (_states(visits="first string, n long"), "field 'first' changed type timestamp -> string"),
        (_states(visits="n long"), "field 'first' was removed"),
        (_states(visits="first timestamp, n long, m long not null"), "new field 'm' is NOT NULL"),
        (_states(visits="first timestamp, n long not null"), "field 'n' may no longer be null"),
        (_kinds(visits="list"), "state 'visits' changed from value state to list state"),
        (_ttl("processing_time"), None),  # a TTL by processing time given or changed
        (_ttl("event_time", None), None),  # no TTL: no clock
        (_ttl("event_time"), "its TTL changed clock"),
    ],
)
def test_a_schema_change_is_accepted_when_the_values_held_still_read(
    now: dict[str, Any], refused: str | None
) -> None:
    was = _states(visits="first timestamp, n long")
    problem = refusal(was, now)
    if refused is None:
        assert problem is None
    else:
        assert problem is not None and refused in problem and "visits" in problem


def test_a_state_declared_with_a_model_takes_its_instances_and_gives_tuples() -> None:
    codec = Codec("visit", as_struct(_Visit, "visit"))
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    given = _Visit(at=at, amount=Decimal("1.5"), tags=["x"], note=None)
    assert codec.check(given) == (at, Decimal("1.500000000000000000"), ["x"], None, 0)
    assert codec.load(codec.dump(codec.check(given))) == codec.check(given)
