"""The Kafka sink against the real broker the tests start: pipelines into a topic equal a
plain Spark batch as a ``read_committed`` consumer reads them, a batch replayed after its
transaction committed writes nothing twice, an attempt killed before its commit shows
nothing, and a bad setting stops the run in one line before anything is written."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from pyspark.sql import SparkSession

from lowmark.batches.errors import SinkWriteFailed
from lowmark.batches.loop.faults import KillPoint
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import KafkaSink, Pipeline
from lowmark.batches.sinks.kafka import KafkaFence
from lowmark.batches.sinks.kafka_topic import fence_group
from lowmark.batches.windows import Session, Tumbling
from tests.helpers import SCHEMA, drop_batches, event, reference, run_replaying, timed, windowed
from tests.kafka_broker import KafkaBroker

pytestmark = pytest.mark.slow

BATCHES = [
    [event("a", 0, 1), event("b", 3, 2), event("a", 15, 3)],
    [event("a", 7, 4), event("b", 4, 5)],  # bridges a's two sessions: they merge
    [event("c", 40, 6), event("b", 90, 7)],
]
"""Three batches (one file each) for ``timed`` and ``windowed`` pipelines."""


def _topic(kafka: KafkaBroker, compacted: bool = False) -> str:
    name = f"sink_{uuid.uuid4().hex[:8]}"
    kafka.create_topic(
        name, partitions=2, config={"cleanup.policy": "compact"} if compacted else {}
    )
    return name


def _into(p: Pipeline, kafka: KafkaBroker, topic: str, **settings: Any) -> Pipeline:
    sink = KafkaSink(topic=topic, bootstrap_servers=kafka.bootstrap, **settings)
    return p.model_copy(update={"sink": sink})


CLOSING = [event("z", 1000, 0)]
"""A batch whose watermark closes every window of ``BATCHES`` (its own stays open)."""


def _values(kafka: KafkaBroker, topic: str) -> list[tuple[Any, ...]]:
    """The committed records' JSON values as sorted tuples of their fields."""
    rows = [json.loads(value) for _, _, value in kafka.records(topic) if value is not None]
    return sorted(tuple(row[c] for c in sorted(row)) for row in rows)


def _as_values(rows: list[Any]) -> list[tuple[Any, ...]]:
    """Spark rows as ``_values`` reads them back (Spark's JSON: ISO times in UTC)."""
    as_json = [json.loads(json.dumps(r.asDict(), default=_iso)) for r in rows]
    return sorted(tuple(row[c] for c in sorted(row)) for row in as_json)


def _iso(value: Any) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _amounts(kafka: KafkaBroker, topic: str, committed_only: bool = True) -> list[bytes]:
    """The values of ``topic`` (``value: amount``), sorted."""
    return sorted(v or b"" for _, _, v in kafka.records(topic, committed_only))


AFTER_KAFKA_COMMIT = KillPoint("after_sink", 1)
"""Batch 1's transaction committed, lowmark's commit entry never written: batch 1 replays."""
BEFORE_KAFKA_COMMIT = KillPoint("before_sink_commit", 1)
"""Batch 1's records produced in its transaction, which never commits (left open)."""


def test_a_stateless_pipeline_into_kafka_equals_a_plain_batch_even_replayed(
    spark: SparkSession, tmp_path: Path, kafka: KafkaBroker
) -> None:
    topic = _topic(kafka)
    p = _into(timed(), kafka, topic, key="user")

    replayed = run_replaying(spark, p, tmp_path, BATCHES, AFTER_KAFKA_COMMIT)

    assert replayed == [1]
    expected = spark.read.schema(SCHEMA).json(str(tmp_path / "in")).collect()
    # Batch 1's records written twice would be there twice.
    assert _values(kafka, topic) == _as_values(expected)
    keys = sorted(key or b"" for _, key, _ in kafka.records(topic))
    assert keys == sorted(r["user"].encode() for r in expected)
    app_id = MicroBatchRunner(spark, p, tmp_path).checkpoint.txn_app_id("sink")
    assert kafka.committed(fence_group(app_id), topic)[0] == 3  # batches 0-2 fenced


def test_the_kafka_fence_tells_the_newest_batch_a_checkpoint_landed_and_none_of_another(
    spark: SparkSession, tmp_path: Path, kafka: KafkaBroker
) -> None:
    sink = KafkaSink(topic=_topic(kafka), bootstrap_servers=kafka.bootstrap)
    p = timed().model_copy(update={"sink": sink})
    drop_batches(tmp_path, BATCHES[:2])
    runner = MicroBatchRunner(spark, p, tmp_path)
    runner.run(max_batches=None)

    assert KafkaFence(sink, runner.checkpoint.txn_app_id("sink")).last_landed() == 1
    assert KafkaFence(sink, f"{uuid.uuid4()}:sink").last_landed() == -1


def test_an_attempt_killed_before_its_kafka_commit_shows_nothing_and_is_written_once(
    spark: SparkSession, tmp_path: Path, kafka: KafkaBroker
) -> None:
    topic = _topic(kafka)
    p = _into(timed(), kafka, topic, value="amount")
    seen: dict[str, list[bytes]] = {}

    def look() -> None:
        seen["committed"] = _amounts(kafka, topic)
        seen["uncommitted"] = _amounts(kafka, topic, committed_only=False)

    replayed = run_replaying(spark, p, tmp_path, BATCHES, BEFORE_KAFKA_COMMIT, look)

    assert replayed == [1]
    # The killed attempt's records are on the broker, in a transaction left open: a
    # read_committed consumer sees batch 0's only.
    assert seen["committed"] == [b"1", b"2", b"3"]
    assert seen["uncommitted"] == [b"1", b"2", b"3", b"4", b"5"]
    # The replay aborted it and wrote batch 1 once.
    assert _amounts(kafka, topic) == [str(i).encode() for i in range(1, 8)]


@pytest.mark.integration  # the stateless replay covers the fence in `make test`
def test_a_windowed_pipeline_into_kafka_equals_a_plain_batch_even_replayed(
    spark: SparkSession, tmp_path: Path, kafka: KafkaBroker
) -> None:
    topic = _topic(kafka)
    window = Tumbling(size="10 seconds")
    p = _into(windowed(window, max_out_of_orderness="1 minute"), kafka, topic)

    closing = KillPoint("after_sink", len(BATCHES))  # the batch that emits every window
    replayed = run_replaying(spark, p, tmp_path, [*BATCHES, CLOSING], closing)

    assert replayed == [len(BATCHES)]
    # Each closed window once, as a plain batch computes it (windows a replay wrote twice
    # would be there twice).
    expected = reference(spark, tmp_path, window).where("user != 'z'").collect()
    assert _values(kafka, topic) == _as_values(expected)


@pytest.mark.integration  # the stateless replay covers the fence in `make test`
def test_update_mode_windows_compact_to_a_plain_batch_with_tombstones_for_merged_ones(
    spark: SparkSession, tmp_path: Path, kafka: KafkaBroker
) -> None:
    topic = _topic(kafka, compacted=True)
    window = Session(gap="10 seconds")
    p = _into(windowed(window, "update", max_out_of_orderness="1 minute"), kafka, topic)

    run_replaying(spark, p, tmp_path, BATCHES)

    # What a compacted topic keeps: each key's latest record, none where it is a tombstone.
    latest: dict[bytes | None, bytes | None] = {}
    for _, key, value in kafka.records(topic):
        latest[key] = value
    tombstones = [key for key, value in latest.items() if value is None]
    # Batch 0's sessions that batch 1 superseded: a's two (merged) and b's (extended).
    assert len(tombstones) == 3
    kept = [json.loads(v) for v in latest.values() if v is not None]
    for emitted in kept:
        identity = {c: emitted[c] for c in ("user", "window_start", "window_end")}
        assert json.dumps(identity, separators=(",", ":")).encode() in latest
    expected = _as_values(reference(spark, tmp_path, window).collect())
    assert sorted(tuple(r[c] for c in sorted(r)) for r in kept) == expected


def test_bad_settings_are_refused_in_one_line(
    spark: SparkSession, data_root: Path, kafka: KafkaBroker
) -> None:
    sessions = dict(windowed(Session(gap="10 seconds"), "update"))
    keyed = KafkaSink(topic="t", bootstrap_servers=kafka.bootstrap, key="user")
    with pytest.raises(ValidationError, match=r"update-mode windows are keyed .* `sink.key` out"):
        Pipeline(**(sessions | {"sink": keyed}))
    with pytest.raises(ValidationError, match=r"'sasl.password'\] in `producer` .*`secret_env`"):
        KafkaSink(topic="t", bootstrap_servers="b:9092", producer={"sasl.password": "x"})
    with pytest.raises(ValidationError, match=r"\['transactional.id'\] are set by the sink"):
        KafkaSink(topic="t", bootstrap_servers="b:9092", producer={"transactional.id": "x"})

    drop_batches(data_root, BATCHES)
    runner = MicroBatchRunner(spark, _into(timed(), kafka, "no_such_topic"), data_root)
    with pytest.raises(SinkWriteFailed, match=r"^sink kafka no_such_topic: no such topic") as no:
        runner.run(max_batches=None)
    assert "\n" not in str(no.value)
    assert runner.checkpoint.offsets.latest_batch_id() is None
