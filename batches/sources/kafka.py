"""Kafka topics as a source: exact offset ranges per topic partition.

Offsets are ``{"<topic>:<partition>": next offset}``; a batch reads
``[start, end)`` of each partition that moved with Spark's Kafka batch reader
(``assign`` + ``startingOffsets``/``endingOffsets``), so a replay reads the
same records as long as the broker still holds them. Planning, the backlog
and the committed frontier use a small client on the driver
(``confluent_kafka``): no Spark job.

- Admission: ``max_offsets_per_batch`` split fairly over the partitions with
  records waiting (``fair_share``).
- New partitions are picked up at the next plan, from their earliest offset.
  A partition whose earliest offset is past 0 is first registered at that
  offset by a batch that takes none of its records, so every range read is
  one the plan saw.
- Data loss: a partition whose next offset retention already deleted, or a
  topic that is gone, stops the batch with one line naming topic, partition
  and offsets, and the way out.
- After each commit the frontier is committed to the consumer group, so
  ``kafka-consumer-groups --describe`` shows the pipeline's lag. lowmark
  never reads it back: its offset log is the truth.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from batches.errors import SourceDataLost
from batches.pipeline import KafkaSource, start_time_ms
from batches.sources.base import (
    PARTITION_COLUMN,
    Source,
    SourceRead,
    describe_range,
    fair_share,
    read_counts,
)
from batches.sources.json_values import parse_json_values
from state.errors import LowmarkError, first_line
from state.offset_log import Offsets
from state.session import SparkLike, provider

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0
"""Longest wait for the brokers on any one request."""

RAW_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
"""What Spark's Kafka reader returns (headers not included)."""


def partition_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def split_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition(":")
    return topic, int(partition)


class KafkaStreamSource(Source):
    """``config``'s topics; ``group`` receives the committed frontier."""

    def __init__(self, spark: SparkLike, config: KafkaSource, group: str) -> None:
        self._spark = provider(spark)
        self.config = config
        self.group = group
        # librdkafka's own log lines go through this module's logger, not to stderr.
        self._client: dict[str, Any] = {
            "bootstrap.servers": config.bootstrap_servers,
            "logger": log,
            **config.options,
        }
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None
        self._planned_latest: Offsets = {}
        """Each partition's latest offset as the last ``plan`` asked the brokers."""

    # -- the brokers, on the driver ------------------------------------------------

    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self._client)
        return self._admin

    def topic_partitions(self) -> list[str]:
        """Every partition of the configured topics now; a missing topic is an error."""
        metadata = self.admin().list_topics(timeout=TIMEOUT_S)
        keys = []
        for topic in self.config.topics:
            found = metadata.topics.get(topic)
            if found is None or found.error is not None or not found.partitions:
                raise SourceDataLost(
                    f"Kafka topic {topic} does not exist on {self.config.bootstrap_servers}"
                    f"{': ' + str(found.error) if found is not None and found.error else ''}: "
                    "create it, or remove it from the source's `topics` (a new pipeline "
                    "definition: `lowmark reset`)"
                )
            keys += [partition_key(topic, p) for p in sorted(found.partitions)]
        return keys

    def _offsets(self, keys: list[str], spec: Callable[[], OffsetSpec]) -> Offsets:
        """The ``spec`` offset (earliest, latest, for a time) of each partition."""
        if not keys:
            return {}
        asked = {TopicPartition(*split_key(k)): spec() for k in keys}
        futures = self.admin().list_offsets(asked, request_timeout=TIMEOUT_S)
        found = {}
        for tp, future in futures.items():
            found[partition_key(tp.topic, tp.partition)] = int(future.result().offset)
        return found

    def earliest(self, keys: list[str]) -> Offsets:
        return self._offsets(keys, OffsetSpec.earliest)

    def latest(self, keys: list[str]) -> Offsets:
        return self._offsets(keys, OffsetSpec.latest)

    # -- the contract ---------------------------------------------------------------

    def initial_offsets(self) -> Offsets:
        """Where batch 0 starts: ``starting_offsets`` resolved now (the runner records it,
        so a later run starts from the same place)."""
        keys = self.topic_partitions()
        start = self.config.starting_offsets
        if start == "earliest":
            return self.earliest(keys)
        latest = self.latest(keys)
        if start == "latest":
            return latest
        at = start_time_ms(start)
        found = self._offsets(keys, lambda: OffsetSpec.for_timestamp(at))
        # No record at or after the time: the partition starts at its end.
        return {k: latest[k] if found[k] < 0 else found[k] for k in keys}

    def start_moves(self) -> bool:
        """True but for "earliest", which stays put (what retention deleted is gone either
        way): "latest" and a time move on as records land."""
        return self.config.starting_offsets != "earliest"

    def plan(
        self, start: Offsets, batch_id: int, record: bool = True, discover: bool = True
    ) -> Offsets:
        """The next batch's end: up to ``max_offsets_per_batch`` records, split fairly.

        Nothing is recorded (the offset log holds the plan). ``discover`` is
        ignored: every plan asks the brokers.
        """
        keys = sorted(set(self.topic_partitions()) | set(start))
        earliest = self.earliest(keys)
        latest = self.latest(keys)
        self._planned_latest = latest
        self._check_kept(start, earliest)
        # A new partition starts at its earliest offset: one that starts past 0 is
        # registered there first (a batch that takes none of its records).
        registered = {k: earliest[k] for k in keys if k not in start and earliest[k] > 0}
        begin = {k: start.get(k, 0) for k in keys if k not in registered}
        waiting = {k: max(latest[k] - begin[k], 0) for k in begin}
        taken = fair_share(waiting, self.config.max_offsets_per_batch)
        return {
            **dict(start),
            **registered,
            **{k: begin[k] + n for k, n in taken.items() if n or k in start},
        }

    def _check_kept(self, start: Offsets, earliest: Offsets) -> None:
        """Refuse a start retention already deleted (the records were never read)."""
        for key, offset in sorted(start.items()):
            if earliest.get(key, 0) > offset:
                topic, partition = split_key(key)
                raise SourceDataLost(
                    f"Kafka topic {topic} partition {partition}: offsets {offset} to "
                    f"{earliest[key] - 1} were deleted (retention) before lowmark read them: "
                    "raise the topic's retention; to go on without them, `lowmark reset` "
                    "the pipeline"
                )

    def read(
        self,
        start: Offsets,
        end: Offsets,
        batch_id: int,
        cache: bool = False,
        strict: bool = False,
    ) -> SourceRead:
        """Exactly ``[start, end)`` of every partition that moved; ``strict`` changes
        nothing (a Kafka record never changes)."""
        moved = {k: (start.get(k, 0), e) for k, e in end.items() if e > start.get(k, 0)}
        raw = self._read_raw(moved) if moved else self._spark().createDataFrame([], RAW_SCHEMA)
        part = F.concat_ws(":", F.col("topic"), F.col("partition").cast("string"))
        explain = self._explain(moved)
        if self.config.value_format == "raw":
            counts = Observation()
            records = raw.withColumn(PARTITION_COLUMN, part).observe(
                counts, *read_counts(False, None)
            )
            if cache:
                records = records.persist()
            return SourceRead(records, None, counts, (records,) if cache else (), explain)
        assert self.config.schema_ddl is not None
        values = raw.select("value", part.alias(PARTITION_COLUMN), "offset")
        origin = F.concat(F.col(PARTITION_COLUMN), F.lit("@"), F.col("offset").cast("string"))
        return parse_json_values(
            values, self.config.schema_ddl, batch_id, origin, cache=cache, explain=explain
        )

    def _read_raw(self, moved: dict[str, tuple[int, int]]) -> DataFrame:
        assign: dict[str, list[int]] = {}
        starting: dict[str, dict[str, int]] = {}
        ending: dict[str, dict[str, int]] = {}
        for key, (s, e) in sorted(moved.items()):
            topic, partition = split_key(key)
            assign.setdefault(topic, []).append(partition)
            starting.setdefault(topic, {})[str(partition)] = s
            ending.setdefault(topic, {})[str(partition)] = e
        reader = (
            self._spark()
            .read.format("kafka")
            .option("kafka.bootstrap.servers", self.config.bootstrap_servers)
            .option("assign", json.dumps(assign))
            .option("startingOffsets", json.dumps(starting))
            .option("endingOffsets", json.dumps(ending))
            .option("failOnDataLoss", "true")
        )
        for name, value in self.config.options.items():
            reader = reader.option(f"kafka.{name}", value)
        return reader.load().select(*RAW_SCHEMA.fieldNames())

    @staticmethod
    def _explain(moved: dict[str, tuple[int, int]]) -> Callable[[Exception], LowmarkError | None]:
        """A read of offsets the broker no longer holds, as the user's error."""

        def explain(exc: Exception) -> LowmarkError | None:
            text = str(exc)
            if "data loss" not in text.lower() and "OffsetOutOfRange" not in text:
                return None
            ranges = ", ".join(f"{k} {s} to {e - 1}" for k, (s, e) in sorted(moved.items()))
            return SourceDataLost(
                f"Kafka no longer holds records this batch must read ({ranges}): "
                f"{first_line(exc)}; raise the topic's retention; to go on without them, "
                "`lowmark reset` the pipeline"
            )

        return explain

    def waiting_partitions(self, end: Offsets) -> tuple[str, ...]:
        """The partitions whose latest offset, when the last ``plan`` asked, was past ``end``
        (no new request: that plan's answer is the one the batch was sized by)."""
        return tuple(sorted(k for k, n in self._planned_latest.items() if n > end.get(k, 0)))

    def inputs(self, start: Offsets, end: Offsets) -> list[str]:
        return [
            f"{k} offsets {start.get(k, 0)} to {e - 1}"
            for k, e in sorted(end.items())
            if e > start.get(k, 0)
        ]

    def backlog(self, committed_end: Offsets) -> dict[str, int]:
        """Records past ``committed_end`` in all partitions, and partitions behind."""
        keys = sorted(set(self.topic_partitions()) | set(committed_end))
        latest = self.latest(keys)
        behind = {k: latest[k] - committed_end.get(k, 0) for k in keys}
        behind = {k: n for k, n in behind.items() if n > 0}
        return {"records": sum(behind.values()), "partitions": len(behind)}

    def describe_backlog(self, backlog: dict[str, int]) -> str:
        return f"{backlog['records']} Kafka records waiting in {backlog['partitions']} partitions"

    def commit(self, end: Offsets) -> None:
        """Commit ``end`` to the consumer group (a failure is logged, never fatal: the
        group's offsets only inform Kafka's tools)."""
        if self._consumer is None:
            self._consumer = Consumer(
                {**self._client, "group.id": self.group, "enable.auto.commit": False}
            )
        offsets = [TopicPartition(*split_key(k), e) for k, e in sorted(end.items())]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning(
                "could not commit %s to Kafka group %s: %s",
                describe_range({}, end),
                self.group,
                exc,
            )
