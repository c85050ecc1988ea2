"""The Kafka source against a real single-node broker (``tests.kafka_broker``): exact ranges,
fair and aligned admission, new partitions, data loss, start positions (a start at latest
fixed by the first plan, a sensor tick's too), the consumer-group frontier, and a windowed
pipeline over three partitions where one goes idle, or whose batches outlast the idle
timeout."""

from __future__ import annotations

import json
import logging
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from confluent_kafka.admin import AdminClient, NewPartitions
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.admin.status import pipeline_status
from lowmark.batches.dedup import Dedup
from lowmark.batches.errors import BackfillHistoryLost, SourceDataLost, SourceReplaced
from lowmark.batches.loop.backfill import backfill_partition
from lowmark.batches.loop.faults import InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, EventTimePartitions, KafkaSource, Pipeline
from lowmark.batches.sources.base import PARTITION_COLUMN
from lowmark.batches.sources.kafka import KafkaStreamSource
from lowmark.batches.windows import (
    Aggregate,
    EventTime,
    IngestionWatermark,
    Tumbling,
    WindowedAggregation,
)
from lowmark.orchestration.assets import pipeline_assets
from lowmark.orchestration.jobs import microbatch_job
from lowmark.orchestration.resources import LowmarkResource, SparkResource
from lowmark.orchestration.sensors import pipeline_sensor
from tests.helpers import FakeClock, delta_frame, per_window
from tests.kafka_broker import KafkaBroker

SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
T0 = datetime(2026, 1, 1, tzinfo=UTC)

pytestmark = pytest.mark.slow


def event(user: str, second: int, amount: int = 1) -> str:
    ts = (T0 + timedelta(seconds=second)).isoformat()
    return json.dumps({"user": user, "ts": ts, "amount": amount})


def new_topic(kafka: KafkaBroker, partitions: int = 1) -> str:
    name = f"t_{uuid.uuid4().hex[:8]}"
    kafka.create_topic(name, partitions)
    return name


def config(kafka: KafkaBroker, topic: str, **overrides: Any) -> KafkaSource:
    return KafkaSource(
        bootstrap_servers=kafka.bootstrap, topics=(topic,), schema_ddl=SCHEMA, **overrides
    )


def copied(kafka: KafkaBroker, topic: str, name: str, **source: Any) -> Pipeline:
    """A pipeline copying ``topic`` into ``out``."""
    return Pipeline(name=name, source=config(kafka, topic, **source), sink=DeltaSink(path="out"))


def amounts(read: Any) -> list[tuple[str, int]]:
    return sorted((r[PARTITION_COLUMN], r.amount) for r in read.records.collect())


def test_a_batch_reads_exactly_its_range_split_fairly_and_a_replay_reads_the_same(
    spark: SparkSession, kafka: KafkaBroker
) -> None:
    topic = new_topic(kafka, 3)
    for p, n in ((0, 2), (1, 10), (2, 10)):
        kafka.produce(topic, [event("u", i, 100 * p + i) for i in range(n)], partition=p)
    source = KafkaStreamSource(spark, config(kafka, topic, max_offsets_per_batch=10), "g")
    start = source.initial_offsets()
    assert start == {f"{topic}:0": 0, f"{topic}:1": 0, f"{topic}:2": 0}
    end = source.plan(start, 0)
    # 10 over three partitions: partition 0 needs 2, the other two share the rest.
    assert end == {f"{topic}:0": 2, f"{topic}:1": 4, f"{topic}:2": 4}
    # Aligned admission: the lowest clock first (partition 0, with none yet, before any).
    clocks = {f"{topic}:1": 5, f"{topic}:2": 9}
    aligned = {f"{topic}:0": 2, f"{topic}:1": 8, f"{topic}:2": 0}
    assert source.plan(start, 0, clocks=clocks) == aligned
    first = amounts(source.read(start, end, 0))
    assert first == sorted(
        [(f"{topic}:0", a) for a in (0, 1)]
        + [(f"{topic}:1", a) for a in (100, 101, 102, 103)]
        + [(f"{topic}:2", a) for a in (200, 201, 202, 203)]
    )
    kafka.produce(topic, [event("u", 50, 999)], partition=0)  # lands after the plan
    assert amounts(source.read(start, end, 0)) == first  # a replay: the same records
    assert source.backlog(end) == {"records": 13, "partitions": 3}


def test_aligned_admission_by_append_time_stops_a_partition_at_the_next_partitions_clock(
    spark: SparkSession, kafka: KafkaBroker
) -> None:
    """Partition 0's records are appended milliseconds before and after partition 1's first
    one: the batch takes partition 0 only up to partition 1's clock, then shares."""
    topic = f"t_{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2, {"message.timestamp.type": "LogAppendTime"})
    for partition in (0, 1, 0):
        kafka.produce(topic, [event("u", i) for i in range(30)], partition=partition)
        time.sleep(0.02)  # the next produce is appended at a later millisecond
    raw = KafkaSource(bootstrap_servers=kafka.bootstrap, topics=(topic,), value_format="raw")
    latest = {f"{topic}:0": 60, f"{topic}:1": 30}
    # The broker's append times, read back by Spark's reader: the reference.
    read = KafkaStreamSource(spark, raw, "g").read({}, latest, 0).records
    stamps: dict[int, list[int]] = {0: [], 1: []}
    for r in read.orderBy("offset").collect():
        stamps[r.partition].append(int(r.timestamp.timestamp() * 1000))
    clocks = {f"{topic}:0": stamps[0][0], f"{topic}:1": stamps[1][0]}
    by_then = sum(1 for ms in stamps[0] if ms <= clocks[f"{topic}:1"])
    assert by_then == 30
    limited = raw.model_copy(update={"max_offsets_per_batch": by_then + 20})
    start = {f"{topic}:0": 0, f"{topic}:1": 0}
    by_append_time = KafkaStreamSource(spark, limited, "g", ingestion_clock=True)
    # Up to partition 1's clock, then the 20 left shared by the two, now at one clock.
    assert by_append_time.plan(start, 0, clocks=clocks) == {
        f"{topic}:0": by_then + 10,
        f"{topic}:1": 10,
    }
    # Clocks that are not append times (event times seen) cap nothing: lowest first.
    by_event_time = KafkaStreamSource(spark, limited, "g")
    assert by_event_time.plan(start, 0, clocks=clocks) == {
        f"{topic}:0": by_then + 20,
        f"{topic}:1": 0,
    }


def test_values_that_do_not_parse_and_tombstones_are_bad_records_with_their_text(
    spark: SparkSession, kafka: KafkaBroker
) -> None:
    topic = new_topic(kafka)
    kafka.produce(topic, [event("a", 1), '{"user": "b", "ts": oops', event("c", 2)])
    kafka.produce(topic, [None])  # a tombstone: no value
    source = KafkaStreamSource(spark, config(kafka, topic), "g")
    read = source.read({f"{topic}:0": 0}, {f"{topic}:0": 4}, 5)
    assert sorted(r.user for r in read.records.collect()) == ["a", "c"]
    assert read.bad is not None
    bad = sorted((r.batch_id, r.source_file, r.raw, r.reason) for r in read.bad.collect())
    assert bad == [
        (5, f"{topic}:0@1", '{"user": "b", "ts": oops', "malformed JSON or not matching the "
         "source schema"),
        (5, f"{topic}:0@3", None, "a record with no value"),
    ]  # fmt: skip


def test_partitions_added_later_are_read_from_their_start(
    spark: SparkSession, kafka: KafkaBroker
) -> None:
    topic = new_topic(kafka, 1)
    kafka.produce(topic, [event("a", 1)], partition=0)
    source = KafkaStreamSource(spark, config(kafka, topic), "g")
    end = source.plan(source.initial_offsets(), 0)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_partitions([NewPartitions(topic, 2)])[topic].result()
    kafka.produce(topic, [event("b", 2), event("b", 3)], partition=1)
    nxt = source.plan(end, 1)
    assert nxt == {f"{topic}:0": 1, f"{topic}:1": 2}
    assert amounts(source.read(end, nxt, 1)) == [(f"{topic}:1", 1), (f"{topic}:1", 1)]


def test_records_deleted_before_they_were_read_and_a_deleted_topic_stop_with_one_line(
    spark: SparkSession, kafka: KafkaBroker
) -> None:
    topic = new_topic(kafka)
    kafka.produce(topic, [event("a", i) for i in range(6)])
    source = KafkaStreamSource(spark, config(kafka, topic), "g")
    kafka.delete_records_before(topic, 0, 4)  # what retention does
    with pytest.raises(SourceDataLost, match=rf"topic {topic} partition 0: offsets 2 to 3 were"):
        source.plan({f"{topic}:0": 2}, 1)
    # No batch holds the lost records yet: the way on is to skip them, not to start over.
    with pytest.raises(SourceDataLost, match=r"set the source's `on_data_loss: skip`"):
        source.plan({f"{topic}:0": 2}, 1)
    assert source.plan({f"{topic}:0": 4}, 1) == {f"{topic}:0": 6}
    kafka.delete_topic(topic)
    with pytest.raises(SourceDataLost, match=f"Kafka topic {topic} does not exist"):
        source.plan({f"{topic}:0": 6}, 2)


def test_a_topic_deleted_and_created_again_stops_the_pipeline_in_one_line_reading_none_of_it(
    spark: SparkSession, kafka: KafkaBroker, data_root: Path
) -> None:
    topic = new_topic(kafka)
    kafka.produce(topic, [event("old", i) for i in range(10)])
    pipeline = copied(kafka, topic, "replaced_topic")
    MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
    kafka.delete_topic(topic)
    kafka.create_topic(topic)
    kafka.produce(topic, [event("new", i) for i in range(14)])

    runner = MicroBatchRunner(spark, pipeline, data_root)
    with pytest.raises(SourceReplaced) as replaced:
        runner.run(max_batches=None)
    message = str(replaced.value)
    assert message.startswith(f"Kafka topic {topic} was replaced (deleted and created again)")
    assert "\n" not in message and "lowmark reset replaced_topic --truncate-sink" in message
    # Nothing of the new topic was read: the sink holds the old topic's ten records only.
    users = [r.user for r in delta_frame(spark, str(data_root / "out")).collect()]
    assert users == ["old"] * 10
    assert runner.checkpoint.offsets.get_latest().batch_id == 0  # type: ignore[union-attr]


def test_a_partition_ending_below_the_offsets_already_read_stops_planning(
    spark: SparkSession, kafka: KafkaBroker
) -> None:
    topic = new_topic(kafka)
    kafka.produce(topic, [event("new", i) for i in range(3)])
    source = KafkaStreamSource(spark, config(kafka, topic), "g")
    # Offsets recorded before identities were (an older checkpoint): only the positions
    # tell that the log they were read from is not this one.
    with pytest.raises(
        SourceReplaced, match=rf"Kafka topic {topic} partition 0 ends at offset 3, below offset 10"
    ):
        source.plan({f"{topic}:0": 10}, 1)


def test_read_committed_stops_a_batch_at_an_open_transaction_and_reads_it_once_committed(
    spark: SparkSession, kafka: KafkaBroker, data_root: Path
) -> None:
    topic = new_topic(kafka)
    kafka.produce(topic, [event("before", i) for i in range(3)])  # offsets 0-2
    open_transaction = kafka.produce_in_open_transaction(
        topic, [event("in_transaction", i) for i in range(4)]
    )  # offsets 3-6, not committed
    committed_only = {"isolation.level": "read_committed"}
    source = KafkaStreamSource(spark, config(kafka, topic, options=committed_only), "g")
    # The last stable offset is 3: the open transaction's first record.
    assert source.plan({f"{topic}:0": 0}, 0) == {f"{topic}:0": 3}
    # A batch planned before the source read committed records only may end inside the
    # transaction: it waits for it, it is no sign of a replaced topic.
    assert source.plan({f"{topic}:0": 7}, 5) == {f"{topic}:0": 7}

    pipeline = copied(kafka, topic, "committed_only", options=committed_only)
    MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
    out = str(data_root / "out")
    assert sorted(r.user for r in delta_frame(spark, out).collect()) == ["before"] * 3

    open_transaction.commit_transaction(30)
    # The broker moves the last stable offset a moment after the commit returns: a run
    # planned before that finds nothing new (rightly), so wait for it.
    deadline = time.monotonic() + 30
    while source.plan({f"{topic}:0": 3}, 1) == {f"{topic}:0": 3}:
        assert time.monotonic() < deadline, "the committed transaction never became readable"
        time.sleep(0.1)
    MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
    got = sorted((r.user, r.ts) for r in delta_frame(spark, out).collect())
    expected = [("before", T0 + timedelta(seconds=i)) for i in range(3)]
    expected += [("in_transaction", T0 + timedelta(seconds=i)) for i in range(4)]
    assert got == sorted((u, t.replace(tzinfo=None)) for u, t in expected)


def test_with_on_data_loss_skip_records_deleted_before_they_were_read_are_passed_over_and_counted(
    spark: SparkSession, kafka: KafkaBroker, data_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(kafka)
    kafka.produce(topic, [event("u", i, amount=i) for i in range(6)])
    pipeline = copied(kafka, topic, "skips", max_offsets_per_batch=2, on_data_loss="skip")
    MicroBatchRunner(spark, pipeline, data_root).run(max_batches=1)  # offsets 0-1
    kafka.delete_records_before(topic, 0, 4)  # offsets 2-3 are never read
    caplog.set_level(logging.WARNING)

    runner = MicroBatchRunner(spark, pipeline, data_root)
    runner.run(max_batches=None)
    out = delta_frame(spark, str(data_root / "out"))
    assert sorted(r.amount for r in out.collect()) == [0, 1, 4, 5]
    second = runner.checkpoint.offsets.get(1)
    assert second is not None and second.start_offsets == {f"{topic}:0": 4}  # the gap, recorded
    assert [p.input_skipped for p in runner.checkpoint.progress.get_range()] == [
        {},
        {"records": 2},
    ]
    assert (
        f"skips batch 1 passes over input lost before it was read (on_data_loss: skip): "
        f"{topic}:0 offsets 2 to 3 (2 records)" in caplog.text
    )


def test_records_deleted_after_their_batch_was_planned_fail_with_skip_batch_or_are_skipped(
    spark: SparkSession, kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(kafka)
    kafka.produce(topic, [event("u", i, amount=i) for i in range(6)])
    kafka.delete_records_before(topic, 0, 4)
    start, end = {f"{topic}:0": 0}, {f"{topic}:0": 6}  # batch 3, planned before the deletion
    read = KafkaStreamSource(spark, config(kafka, topic), "g").read(start, end, 3)
    with pytest.raises(SourceDataLost) as lost:
        try:
            read.records.collect()
        except Exception as exc:
            raise read.explain(exc) or exc from exc
    assert "set the batch's input aside with `lowmark skip-batch` (batch 3)" in str(lost.value)

    caplog.set_level(logging.WARNING)
    skipping = KafkaStreamSource(spark, config(kafka, topic, on_data_loss="skip"), "g")
    assert sorted(r.amount for r in skipping.read(start, end, 3).records.collect()) == [4, 5]
    assert "batch 3 passes over 4 Kafka records deleted before it read them" in caplog.text


def test_start_at_latest_or_at_a_time_is_recorded_so_later_runs_start_there(
    spark: SparkSession, kafka: KafkaBroker, data_root: Path
) -> None:
    topic = new_topic(kafka)
    base_ms = int(T0.timestamp() * 1000)
    for i in range(4):
        kafka.produce(topic, [event("old", i)], timestamp_ms=base_ms + i * 60_000)
    at = (T0 + timedelta(minutes=2)).isoformat()
    by_time = KafkaStreamSource(spark, config(kafka, topic, starting_offsets=at), "g")
    assert by_time.initial_offsets() == {f"{topic}:0": 2}

    pipeline = copied(kafka, topic, "from_latest", starting_offsets="latest")
    assert MicroBatchRunner(spark, pipeline, data_root).run_batch() is None  # nothing new
    kafka.produce(topic, [event("new", 9)])  # lands between two runs
    MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
    users = [r.user for r in delta_frame(spark, str(data_root / "out")).collect()]
    assert users == ["new"]


def test_a_pipeline_at_latest_reads_what_lands_after_the_dagster_sensor_first_asked(
    spark: SparkSession, kafka: KafkaBroker, data_root: Path
) -> None:
    topic = new_topic(kafka, 2)
    kafka.produce(topic, [event("old", i) for i in range(3)])
    pipeline = copied(kafka, topic, "sensed_from_latest", starting_offsets="latest")
    sensor = pipeline_sensor(
        pipeline, microbatch_job(pipeline, pipeline_assets(pipeline, data_root))
    )
    resources = {"spark": SparkResource(), "lowmark": LowmarkResource(data_root=str(data_root))}
    with dg.DagsterInstance.ephemeral() as instance:

        def tick() -> Any:
            context = dg.build_sensor_context(instance=instance, resources=resources)
            return sensor.evaluate_tick(context)

        assert not tick().run_requests  # nothing past "latest" yet
        kafka.produce(topic, [event("new", i) for i in range(4)])  # lands between two ticks
        # The first tick created the checkpoint (its start fixed): the key names its id.
        runner = MicroBatchRunner(spark, pipeline, data_root)
        key = f"sensed_from_latest:{runner.checkpoint.pipeline_id}:batch-0"
        assert [r.run_key for r in tick().run_requests] == [key]
    runner.run(max_batches=None)
    users = [r.user for r in delta_frame(spark, str(data_root / "out")).collect()]
    assert users == ["new"] * 4


def test_each_commit_commits_the_frontier_to_the_consumer_group_and_status_shows_lag(
    spark: SparkSession, kafka: KafkaBroker, data_root: Path
) -> None:
    topic = new_topic(kafka, 2)
    kafka.produce(topic, [event("a", i) for i in range(5)], partition=0)
    kafka.produce(topic, [event("b", i) for i in range(3)], partition=1)
    pipeline = copied(kafka, topic, "grouped", max_offsets_per_batch=6)
    runner = MicroBatchRunner(spark, pipeline, data_root)
    runner.run_batch()
    assert kafka.committed("lowmark-grouped", topic) == {0: 3, 1: 3}
    status = pipeline_status(spark, pipeline, data_root)
    assert status.backlog == {"records": 2, "partitions": 1}
    assert (
        status.next_batch is not None
        and status.next_batch.reason == "2 Kafka records waiting in 1 partitions"
    )
    runner.run(max_batches=None)
    assert kafka.committed("lowmark-grouped", topic) == {0: 5, 1: 3}


def test_records_a_producer_sends_again_reach_the_sink_once_even_across_a_replay(
    spark: SparkSession, kafka: KafkaBroker, data_root: Path
) -> None:
    # A producer that retries sends some records twice: to the same partition, right after
    # or batches later, and (re-keyed) to the other partition.
    topic = new_topic(kafka, 2)

    def order(n: int, partition: int) -> None:
        record = json.loads(event("u", n, n)) | {"id": f"o{n}"}
        kafka.produce(topic, [json.dumps(record)], partition=partition)

    for n in range(6):
        order(n, n % 2)
    order(2, 0)  # again, right after
    pipeline = Pipeline(
        name="once",
        source=config(kafka, topic, max_offsets_per_batch=4).model_copy(
            update={"schema_ddl": f"id STRING, {SCHEMA}"}
        ),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts"),
        dedup=Dedup(columns=("id",), within="1 hour"),
    )
    MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
    order(1, 0)  # batches later, on the other partition
    order(5, 1)  # batches later, on its own
    order(6, 0)
    # Killed after the sink write of the batch holding the repeats: its replay must
    # keep exactly what it wrote.
    with crash_at(KillPoint("after_sink", 2)), pytest.raises(InjectedCrash):
        MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)
    MicroBatchRunner(spark, pipeline, data_root).run(max_batches=None)

    written = delta_frame(spark, data_root / "out").select("id").collect()
    assert sorted(r.id for r in written) == [f"o{n}" for n in range(7)]
    status = pipeline_status(spark, pipeline, data_root)
    assert status.accounting["read"] == 10 and status.accounting["duplicates"] == 3


def test_a_dagster_run_reports_the_records_still_waiting_after_each_batch(
    spark: SparkSession, kafka: KafkaBroker, data_root: Path
) -> None:
    topic = new_topic(kafka, 2)
    kafka.produce(topic, [event("a", i) for i in range(4)], partition=0)
    kafka.produce(topic, [event("b", i) for i in range(3)], partition=1)
    pipeline = copied(kafka, topic, "kafka_in_dagster", max_offsets_per_batch=4)
    result = dg.materialize(
        [pipeline_assets(pipeline, data_root)],
        resources={"spark": SparkResource(), "lowmark": LowmarkResource(data_root=str(data_root))},
    )
    assert result.success
    sink = dg.AssetKey(["lowmark", "kafka_in_dagster"])
    metadata = [
        m.metadata
        for m in result.asset_materializations_for_node("kafka_in_dagster_batches")
        if m.asset_key == sink
    ]
    # 7 records, 4 a batch: 3 wait after the first batch, none after the second.
    assert [m["backlog_records"] for m in metadata] == [
        dg.IntMetadataValue(3),
        dg.IntMetadataValue(0),
    ]
    assert metadata[0]["input"] == dg.TextMetadataValue(
        f"{topic}:0: 0 → 2 (+2), {topic}:1: 0 → 2 (+2)"
    )


def test_a_windowed_pipeline_over_three_partitions_goes_on_when_one_goes_idle(
    spark: SparkSession, kafka: KafkaBroker, data_root: Path
) -> None:
    topic = new_topic(kafka, 3)
    clock = FakeClock()
    pipeline = Pipeline(
        name="idle_partition",
        source=config(kafka, topic),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts", idle_timeout="1 minute"),
        aggregation=WindowedAggregation(
            keys=("user",),
            window=Tumbling(size="10 seconds"),
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
        ),
    )
    runner = MicroBatchRunner(spark, pipeline, data_root, clock=clock)
    for p in range(3):
        kafka.produce(topic, [event(f"u{p}", s, s) for s in (1, 5, 12)], partition=p)
    runner.run(max_batches=None)
    # Partition 2 goes quiet; the others move on by two minutes of event time.
    for second in (30, 60, 90, 120):
        clock.advance(20_000)
        for p in (0, 1):
            kafka.produce(topic, [event(f"u{p}", second, second)], partition=p)
        runner.run(max_batches=None)
    status = pipeline_status(spark, pipeline, data_root, clock)
    times = {t.partition: t for t in status.partitions}
    idle = times[f"{topic}:2"]
    assert (
        status.watermark_ms is not None and status.watermark_ms > idle.max_event_time_ms
    )  # partition 2 holds nothing back

    every = spark.createDataFrame(
        [(f"u{p}", T0 + timedelta(seconds=s), s) for p in range(3) for s in (1, 5, 12)]
        + [(f"u{p}", T0 + timedelta(seconds=s), s) for p in (0, 1) for s in (30, 60, 90, 120)],
        SCHEMA,
    )
    expected = per_window(
        every,
        "user",
        F.window("ts", "10 seconds"),
        F.count(F.lit(1)).alias("count"),
        F.sum("amount").alias("sum_amount"),
    ).where(  # append mode: windows the watermark closed (allowed lateness 0)
        F.unix_millis("window_end") <= F.lit(status.watermark_ms)
    )
    assertDataFrameEqual(delta_frame(spark, str(data_root / "out")), expected)


def test_a_backfill_of_a_pipeline_started_at_latest_reads_from_its_start_until_retention_ends_it(
    spark: SparkSession, kafka: KafkaBroker, data_root: Path
) -> None:
    topic = new_topic(kafka)
    kafka.produce(topic, [event("old", 2, 1000), event("u", 4, 2000)])  # before the start
    pipeline = Pipeline(
        name="backfilled",
        source=config(kafka, topic, starting_offsets="latest"),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts"),
        aggregation=WindowedAggregation(
            keys=("user",),
            window=Tumbling(size="10 seconds"),
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
        ),
        backfill=EventTimePartitions(granularity="hourly", start="2026-01-01"),
    )
    runner = MicroBatchRunner(spark, pipeline, data_root)
    assert runner.run_batch() is None  # nothing past latest: only where batch 0 starts
    read = [("u", 1, 1), ("u", 5, 2), ("v", 3, 4), ("u", 1800, 8), ("w", 3 * 3600, 16)]
    kafka.produce(topic, [event(user, s, amount) for user, s, amount in read])
    runner.run(max_batches=None)

    hour_0 = (T0, T0 + timedelta(hours=1))
    expected = per_window(
        spark.createDataFrame([(u, T0 + timedelta(seconds=s), a) for u, s, a in read], SCHEMA),
        "user",
        F.window("ts", "10 seconds"),
        F.count(F.lit(1)).alias("count"),
        F.sum("amount").alias("sum_amount"),
    ).where(F.col("window_start") < F.lit(hour_0[1]))
    assert backfill_partition(spark, pipeline, data_root, *hour_0).windows == 3
    out = delta_frame(spark, str(data_root / "out"))
    assertDataFrameEqual(out.where(F.col("window_start") < F.lit(hour_0[1])), expected)

    # Retention deletes the first record the pipeline read: a backfill would lose it.
    kafka.delete_records_before(topic, 0, 3)
    version = DeltaTable(str(data_root / "out")).version()
    with pytest.raises(
        BackfillHistoryLost,
        match=rf"of backfilled not backfilled, the sink is unchanged: Kafka deleted records the "
        rf"batches read \({topic}:0 offsets 2 to 2; retention\)",
    ):
        backfill_partition(spark, pipeline, data_root, *hour_0)
    assert DeltaTable(str(data_root / "out")).version() == version


@pytest.mark.integration
def test_a_batch_slower_than_the_idle_timeout_makes_no_waiting_record_late(
    spark: SparkSession, kafka: KafkaBroker, data_root: Path
) -> None:
    topic = new_topic(kafka, 3)
    # Each partition's events only move forward (partition p p*15 s behind partition 0): under
    # the min over the partitions, not one is late (the run without an idle timeout below).
    for p in range(3):
        kafka.produce(topic, [event(f"u{p}", s - 15 * p, s) for s in range(40, 70)], partition=p)
    late = {}
    for name, timeout in (("timeout", {"idle_timeout": "5 seconds"}), ("none", {})):
        pipeline = Pipeline(
            name=name,
            source=config(kafka, topic, max_offsets_per_batch=30),
            sink=DeltaSink(path=f"{name}/out"),
            event_time=EventTime(column="ts", **timeout),
            aggregation=WindowedAggregation(
                keys=("user",),
                window=Tumbling(size="10 seconds"),
                aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
            ),
        )
        # Every reading of the clock moves it 6 s on: each batch outlasts the idle timeout.
        runner = MicroBatchRunner(spark, pipeline, data_root, clock=FakeClock(step_ms=6_000))
        results = runner.run(max_batches=3)  # the input, 10 records a partition a batch
        assert [r.rows_in for r in results] == [30, 30, 30]
        late[name] = [r.rows_late for r in results]
    assert late == {"timeout": [0, 0, 0], "none": [0, 0, 0]}
    assertDataFrameEqual(
        delta_frame(spark, str(data_root / "timeout/out")),
        delta_frame(spark, str(data_root / "none/out")),
    )


def test_with_log_append_time_a_backlog_read_later_gives_the_live_runs_clock_and_windows(
    spark: SparkSession, kafka: KafkaBroker, tmp_path: Path
) -> None:
    """A topic stamped by the broker's append time drives an ingestion-time watermark: read
    as it is written (a batch per produce) and read an hour later (a batch per produce's
    worth of records), the clocks, windows and late records are the same."""
    topic = f"t_{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 1, {"message.timestamp.type": "LogAppendTime"})
    lag = IngestionWatermark(strategy="ingestion_time", max_event_time_lag="30 seconds")
    pipeline = Pipeline(
        name="clock",
        source=config(kafka, topic, max_offsets_per_batch=3),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts", watermark=lag),
        aggregation=WindowedAggregation(
            keys=("user",),
            window=Tumbling(size="10 seconds"),
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
        ),
    )
    live = FakeClock()
    for seconds_ago in [(28, 3, 14), (25, 12, 2), (6, 75, 1), (20, 1, 9)]:  # 75: beyond the lag
        now = time.time()
        kafka.produce(topic, [_now_event(now - ago, n) for n, ago in enumerate(seconds_ago)], 0)
        live.now = int(time.time() * 1000)
        MicroBatchRunner(spark, pipeline, tmp_path / "live", live).run(max_batches=None)
    live.advance(3_600_000)
    MicroBatchRunner(spark, pipeline, tmp_path / "live", live).run(max_batches=None)
    later = FakeClock(live.now + 3_600_000)
    results = MicroBatchRunner(spark, pipeline, tmp_path / "later", later).run(max_batches=None)
    assert sum(r.rows_late for r in results) == 1
    assertDataFrameEqual(
        delta_frame(spark, tmp_path / "later" / "out"),
        delta_frame(spark, tmp_path / "live" / "out"),
    )


def _now_event(at_s: float, n: int) -> str:
    ts = datetime.fromtimestamp(at_s, UTC).isoformat()
    return json.dumps({"user": "ab"[n % 2], "ts": ts, "amount": n})


def test_in_a_create_time_topic_records_waiting_hold_the_clock_until_they_are_read(
    spark: SparkSession, kafka: KafkaBroker
) -> None:
    """Producers stamp CreateTime records themselves, so a record's stamp says nothing of
    when it was appended: only a partition read to the end the plan saw counts with the
    plan's time (whatever comes was appended after that look); one with records waiting
    counts as 0, and the pipeline's clock stays where the last look left it."""
    topic = new_topic(kafka, 2)
    kafka.produce(topic, [event("u", i) for i in range(4)], partition=0, timestamp_ms=10**12)
    source = KafkaStreamSource(spark, config(kafka, topic, max_offsets_per_batch=2), "g")
    start = source.initial_offsets()
    end = source.plan(start, 0)
    assert end == {f"{topic}:0": 2, f"{topic}:1": 0}
    observed = 1_767_225_600_000
    assert source.ingestion_times(end, observed) == {f"{topic}:0": 0, f"{topic}:1": observed}
    caught_up = source.plan(end, 1)
    assert source.ingestion_times(caught_up, observed) == dict.fromkeys(caught_up, observed)
