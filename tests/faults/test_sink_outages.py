"""A sink's system away mid-run is a transient error: a Postgres backend terminated during a
batch's write, a Kafka broker stopped (before a batch's write, or with its records in the
open transaction) and restarted. The batch is tried again after a pause,
no failed attempt is recorded, and the sink ends as a run without the outage leaves it,
each batch written once."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.loop import faults
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import KafkaSink, PostgresSink
from lowmark.batches.sinks import kafka_topic
from lowmark.batches.sinks.kafka_topic import fence_group
from tests.helpers import SCHEMA, drop_batches, event, timed
from tests.kafka_broker import KafkaBroker
from tests.postgres_server import PostgresServer

BATCHES = [
    [event("a", 0, 1), event("b", 3, 2), event("a", 15, 3)],
    [event("a", 7, 4), event("b", 4, 5)],
    [event("c", 40, 6), event("b", 90, 7)],
]
"""Three batches, one file each."""

HOLD_BATCH_1 = """
CREATE SEQUENCE held;
CREATE FUNCTION hold_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('held') = 1 THEN
        PERFORM pg_sleep(60);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER hold_once BEFORE UPDATE ON lowmark_sink_batches
    FOR EACH ROW WHEN (NEW.batch_id = 1) EXECUTE FUNCTION hold_once();
"""
"""The first write of batch 1 waits inside its transaction, its rows copied, at the fence's
count: where a terminated backend loses the most. A sequence counts the writes, since the
transaction it is called in does not commit."""


@contextmanager
def terminated_when_held(postgres: PostgresServer, database: str) -> Iterator[list[int]]:
    """Meanwhile, another connection terminates (``pg_terminate_backend``) the first
    backend of ``database`` found sleeping in ``hold_once``; the pids terminated."""
    terminated: list[int] = []
    done = threading.Event()

    def watch() -> None:
        with postgres.connect(database) as conn:
            while not done.is_set() and not terminated:
                held = conn.execute(
                    "SELECT pid FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event = 'PgSleep'"
                ).fetchall()
                for (pid,) in held:
                    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    terminated.append(pid)
                time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield terminated
    finally:
        done.set()
        watcher.join(timeout=10)


def test_a_postgres_backend_terminated_during_the_write_retries_the_batch_uncounted(
    spark: SparkSession, tmp_path: Path, postgres: PostgresServer, pg_database: str
) -> None:
    drop_batches(tmp_path, BATCHES)
    p = timed(sink=PostgresSink(table="events"))
    pauses: list[float] = []
    runner = MicroBatchRunner(spark, p, tmp_path, sleep=pauses.append)
    assert runner.run_batch() is not None  # batch 0 creates the tables
    with postgres.connect(pg_database) as conn:
        conn.execute(HOLD_BATCH_1.encode())

    with terminated_when_held(postgres, pg_database) as terminated:
        results = runner.run(max_batches=None)

    assert len(terminated) == 1
    assert [r.batch_id for r in results] == [1, 2]
    assert pauses == [1.0]  # one retry, after the first pause
    assert runner.checkpoint.failures.of(1) == []
    expected = spark.read.schema(SCHEMA).json(str(tmp_path / "in")).collect()
    found = postgres.rows(pg_database, 'SELECT "user", amount FROM events')
    assert sorted(found) == sorted((r.user, r.amount) for r in expected)  # once each
    fenced = postgres.rows(pg_database, "SELECT batch_id, rows FROM lowmark_sink_batches")
    assert sorted(fenced) == [(0, 3), (1, 2), (2, 2)]


@pytest.mark.parametrize(
    "stopped",
    [
        pytest.param("before_the_write", marks=pytest.mark.integration),  # the lesser case
        # 24 s, among the slowest of `make test` (docs/development.md).
        pytest.param("inside_the_transaction", marks=pytest.mark.integration),
    ],
)
def test_a_kafka_broker_stopped_and_restarted_retries_the_batch_uncounted(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopped: str
) -> None:
    # A call to a stopped broker gives up after 3 s, not half a minute: the test stays short.
    monkeypatch.setattr(kafka_topic, "TIMEOUT_S", 3.0)
    broker = KafkaBroker.start(tmp_path / "kafka")  # its own: the session's is not stopped
    try:
        topic = f"outage_{uuid.uuid4().hex[:8]}"
        broker.create_topic(topic, partitions=2)
        root = tmp_path / "run"
        drop_batches(root, BATCHES)
        p = timed(sink=KafkaSink(topic=topic, bootstrap_servers=broker.bootstrap, value="amount"))
        pauses: list[float] = []

        def pause(seconds: float) -> None:
            pauses.append(seconds)
            if broker.process.poll() is not None:  # back up while the runner waits
                broker.restart()

        def reached(step: str, batch_id: int) -> None:
            # Batch 1's records are on the broker in its open transaction; its commit not yet.
            if (step, batch_id) == ("before_sink_commit", 1) and not pauses:
                broker.stop()

        monkeypatch.setattr(faults, "reached", reached)
        runner = MicroBatchRunner(spark, p, root, sleep=pause)
        assert runner.run_batch() is not None  # batch 0, its producer connected
        if stopped == "before_the_write":
            broker.stop()

        started = time.monotonic()
        results = runner.run(max_batches=None)

        assert [r.batch_id for r in results] == [1, 2]
        assert pauses[0] == 1.0
        # Not a speed bound: a call librdkafka leaves hanging until the transaction times
        # out (10 min) is given up on after its timeout (confluentinc/librdkafka#5456).
        assert time.monotonic() - started < 300
        assert runner.checkpoint.failures.of(1) == []
        amounts = sorted(int(v or b"0") for _, _, v in broker.records(topic))
        assert amounts == list(range(1, 8))  # once each
        app_id = runner.checkpoint.txn_app_id("sink")
        assert broker.committed(fence_group(app_id), topic)[0] == 3
    finally:
        broker.stop()
