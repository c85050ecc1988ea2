"""Several sinks of one pipeline (``extra_sinks``): every batch reaches each of them exactly
once, also when a write fails after others landed (the replay writes only where it had not),
for records and for windows; two sinks of one table are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from pyspark.sql import DataFrame, SparkSession

from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, ForeachBatchSink, Pipeline, PostgresSink
from lowmark.batches.windows import Tumbling
from tests.batches.sinks.test_postgres import BATCHES, _comparable
from tests.helpers import SCHEMA, delta_frame, drop_batches, lowmark, reference, timed, windowed
from tests.postgres_server import PostgresServer

ORDERS_SERVED = {
    "name": "orders",
    "source": {"kind": "synthetic", "total_rows": 10},
    "sink": {"path": "out/orders"},
    "extra_sinks": {
        "serving": {"kind": "postgres", "table": "orders_now", "mode": "upsert", "keys": ["id"]}
    },
}
"""A pipeline (as YAML holds it) into a Delta table and, to serve, a Postgres table."""

calls: list[tuple[int, bool]] = []
audited: dict[int, int] = {}
"""What ``audit`` was called with, and the rows it holds by batch id (a replay replaces)."""


def audit(df: DataFrame, batch_id: int, replay: bool) -> None:
    """Idempotent per batch id; fails its first call for batch 1, after the sinks before it
    wrote (a network error, say)."""
    calls.append((batch_id, replay))
    if calls.count((1, False)) == 1 and (batch_id, replay) == (1, False):
        raise ConnectionError("the audit service hung up")
    audited[batch_id] = df.count()


def test_a_write_failing_after_other_sinks_landed_replays_into_the_rest_only(
    spark: SparkSession, tmp_path: Path, postgres: PostgresServer, pg_database: str
) -> None:
    calls.clear()
    audited.clear()
    p = timed(
        extra_sinks={
            "serving": PostgresSink(table="events"),
            "audit": ForeachBatchSink(function=f"{__name__}:audit"),
        }
    )
    drop_batches(tmp_path, BATCHES)
    # The run tries batch 1 again after the error (a replay: its offsets were logged).
    results = MicroBatchRunner(spark, p, tmp_path).run(max_batches=None)

    assert [r.batch_id for r in results if r.replay] == [1]
    every = spark.read.schema(SCHEMA).json(str(tmp_path / "in"))
    expected = _comparable(every.collect())
    # Batch 1 landed in the Delta table and in Postgres before the audit failed: its replay
    # wrote neither again.
    assert _comparable(delta_frame(spark, tmp_path / "out").collect()) == expected
    assert _comparable(postgres.rows(pg_database, 'SELECT "user", ts, amount FROM events')) == (
        expected
    )
    assert calls == [(0, False), (1, False), (1, True), (2, False)]
    assert sum(audited.values()) == len(expected)


def test_windows_reach_each_sink_once_across_a_crash_after_the_writes(
    spark: SparkSession, tmp_path: Path
) -> None:
    window = Tumbling(size="10 seconds")
    # Update mode (each sink merged on keys + window), no record late: the sinks end as a
    # plain batch over all input.
    p = windowed(window, "update", max_out_of_orderness="1 minute")
    p = p.model_copy(update={"extra_sinks": {"copy": DeltaSink(path="copy")}})
    drop_batches(tmp_path, BATCHES)
    with crash_at(KillPoint("after_sink", 1)), pytest.raises(InjectedCrash):
        MicroBatchRunner(spark, p, tmp_path).run(max_batches=None)
    MicroBatchRunner(spark, p, tmp_path).run(max_batches=None)

    expected = reference(spark, tmp_path, window)
    for table in ("out", "copy"):
        got = delta_frame(spark, tmp_path / table).select(*expected.columns)
        assert sorted(got.collect()) == sorted(expected.collect()), table


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"again": DeltaSink(path="out")}, "sinks 'sink' and 'again' both write Delta table out"),
        ({"sink": DeltaSink(path="other")}, "extra sink name 'sink' names `sink`"),
        ({"a-b": DeltaSink(path="other")}, "extra sink name 'a-b': use letters"),
    ],
)
def test_sinks_that_cannot_be_told_apart_are_refused_in_one_line(
    extra: dict[str, DeltaSink], named: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        Pipeline(**dict(timed()) | {"extra_sinks": extra})
    [error] = refused.value.errors()
    assert "\n" not in error["msg"] and named in error["msg"]


def test_list_shows_every_sink_with_the_mode_it_is_written_with(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pipelines = tmp_path / "pipelines.yaml"
    pipelines.write_text(yaml.safe_dump({"pipelines": [ORDERS_SERVED]}))
    code, out, _ = lowmark(capsys, tmp_path, "--pipelines", str(pipelines), "list")
    assert code == 0
    assert "delta:out/orders (append) + postgres:orders_now (upsert)" in " ".join(out.split())
    code, out, _ = lowmark(capsys, tmp_path, "--pipelines", str(pipelines), "list", "--json")
    [listed] = json.loads(out)
    assert listed["sink"] == {"kind": "delta", "path": "out/orders", "mode": "append"}
    assert listed["extra_sinks"] == {
        "serving": {"kind": "postgres", "table": "orders_now", "mode": "upsert"}
    }
