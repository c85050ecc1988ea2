"""Kafka topics as a source: exact offset ranges per topic partition.

Offsets are ``{"<topic>:<partition>": next offset}``; a batch reads
``[start, end)`` of each partition that moved with Spark's Kafka batch reader
(``assign`` + ``startingOffsets``/``endingOffsets``), so a replay reads the
same records as long as the broker still holds them. Planning, the backlog
and the committed frontier use a small client on the driver
(``confluent_kafka``): no Spark job.

- Admission: ``max_offsets_per_batch`` split fairly over the partitions with
  records waiting (``fair_share``), or, with aligned admission, to the
  partitions with the lowest clock first (``aligned_share``); under an
  ingestion-time watermark in a ``LogAppendTime`` topic, capped at the next
  partition's clock (the offset where the append time passes it, which the
  brokers answer).
- New partitions are picked up at the next plan, from their earliest offset.
  A partition whose earliest offset is past 0 is first registered at that
  offset by a batch that takes none of its records, so every range read is
  one the plan saw.
- Data loss: a partition whose next offset retention already deleted, or a
  topic that is gone, stops the batch with one line naming topic, partition
  and offsets, and the way out. With ``on_data_loss: skip`` the next batch
  starts at the earliest offset kept instead (``past_lost``), and a batch
  whose recorded range lost records since reads what is left of it; the
  records passed over are counted in a log line (and, when planning, in
  the batch's progress row).
- A replaced topic: each topic's id is the source's identity (the runner
  records it with the offsets and stops when it changes), and a partition
  ending below the offset already read stops planning (``SourceReplaced``).
- ``isolation.level=read_committed`` (in ``options``): batches end at the
  last stable offset, never inside a transaction still open, and Spark's
  reader reads with the same level (``kafka.isolation.level``), so a batch
  holds committed records only and the records of a transaction committed
  later are read once, by a later batch.
- After each commit the frontier is committed to the consumer group, so
  ``kafka-consumer-groups --describe`` shows the pipeline's lag. lowmark
  never reads it back: its offset log is the truth.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType
from pyspark.sql import Column, DataFrame, Observation
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

from lowmark.batches.errors import SourceDataLost, SourceReplaced
from lowmark.batches.pipeline import KafkaSource, start_time_ms
from lowmark.batches.records import INGESTED_COLUMN
from lowmark.batches.sources.base import (
    PARTITION_COLUMN,
    Clocks,
    Skipped,
    Source,
    SourceRead,
    aligned_share,
    describe_range,
    read_counts,
)
from lowmark.batches.sources.context import SourceContext
from lowmark.batches.sources.json_values import parse_json_values
from lowmark.state.errors import LowmarkError, first_line
from lowmark.state.offset_log import Identity, Offsets
from lowmark.state.session import SparkLike, provider

log = logging.getLogger(__name__)

RECORD_BYTES = 1024
"""A record's size as a batch's input is estimated (``SourceRead.size_bytes``): an offset
range tells records, not bytes. Events are mostly smaller, so the estimate errs toward
reading a batch in several tasks."""

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

    def __init__(
        self, spark: SparkLike, config: KafkaSource, group: str, ingestion_clock: bool = False
    ) -> None:
        """``ingestion_clock``: the pipeline's watermark follows this source's ingestion clock
        (``ingestion_times``), so aligned admission's clocks are append times."""
        self._spark = provider(spark)
        self.ingestion_clock = ingestion_clock
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
        committed_only = config.options.get("isolation.level") == "read_committed"
        self._isolation = (
            IsolationLevel.READ_COMMITTED if committed_only else IsolationLevel.READ_UNCOMMITTED
        )
        self._planned_latest: Offsets = {}
        """Each partition's latest offset as the last ``plan`` asked the brokers."""
        self._stamped: dict[str, bool] = {}
        """Per topic asked, whether it is stamped with the broker's append time."""

    @classmethod
    def from_config(cls, config: KafkaSource, context: SourceContext) -> KafkaStreamSource:
        """``config``'s topics, committing to its group (default ``lowmark-<pipeline>``)."""
        group = config.consumer_group or f"lowmark-{context.pipeline}"
        return cls(context.spark, config, group, context.ingestion_clock)

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

    def _offsets(
        self,
        keys: list[str],
        spec: Callable[[], OffsetSpec],
        isolation: IsolationLevel | None = None,
    ) -> Offsets:
        """The ``spec`` offset (earliest, latest, for a time) of each partition, as this
        source reads (or at ``isolation``)."""
        if not keys:
            return {}
        asked = {TopicPartition(*split_key(k)): spec() for k in keys}
        futures = self.admin().list_offsets(
            asked, isolation_level=isolation or self._isolation, request_timeout=TIMEOUT_S
        )
        found = {}
        for tp, future in futures.items():
            found[partition_key(tp.topic, tp.partition)] = int(future.result().offset)
        return found

    def identity(self) -> Identity:
        """Each configured topic's id (``Kafka topic <name>``): a topic deleted and created
        again under its name has a new one. A topic not found is left out (``plan`` says
        it is missing)."""
        asked = TopicCollection(list(self.config.topics))
        futures = self.admin().describe_topics(asked, request_timeout=TIMEOUT_S)
        found = {}
        for topic, future in futures.items():
            try:
                found[f"Kafka topic {topic}"] = str(future.result().topic_id)
            except KafkaException:
                continue
        return found

    def earliest(self, keys: list[str]) -> Offsets:
        return self._offsets(keys, OffsetSpec.earliest)

    def latest(self, keys: list[str]) -> Offsets:
        """Where each partition ends for this source: its high watermark, or, reading
        committed records only, its last stable offset (the first offset of the oldest
        transaction still open)."""
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
        self,
        start: Offsets,
        batch_id: int,
        record: bool = True,
        discover: bool = True,
        clocks: Clocks | None = None,
    ) -> Offsets:
        """The next batch's end: up to ``max_offsets_per_batch`` records, split fairly, or
        lowest ``clocks`` first (``aligned_share``), capped at the next clock when the
        clocks are append times (``ingestion_clock``, ``_appended_by``).

        Nothing is recorded (the offset log holds the plan). ``discover`` is
        ignored: every plan asks the brokers.
        """
        keys = sorted(set(self.topic_partitions()) | set(start))
        earliest = self.earliest(keys)
        latest = self.latest(keys)
        self._planned_latest = latest
        if self.config.on_data_loss == "fail":
            # (skip: the runner starts a batch past what is lost; a range planned ahead
            # over records lost since is read without them, counted)
            self._check_kept(start, earliest)
        self._check_not_behind(start, latest)
        # A new partition starts at its earliest offset: one that starts past 0 is
        # registered there first (a batch that takes none of its records).
        registered = {k: earliest[k] for k in keys if k not in start and earliest[k] > 0}
        begin = {k: start.get(k, 0) for k in keys if k not in registered}
        waiting = {k: max(latest[k] - begin[k], 0) for k in begin}
        ingested = (
            (lambda keys, ms: self._appended_by(keys, ms, begin, latest))
            if self.ingestion_clock
            else None
        )
        taken = aligned_share(waiting, self.config.max_offsets_per_batch, clocks, ingested)
        return {
            **dict(start),
            **registered,
            **{k: begin[k] + n for k, n in taken.items() if n or k in start},
        }

    def _appended_by(
        self, keys: list[str], ms: int, begin: Offsets, latest: Offsets
    ) -> dict[str, int]:
        """Per partition of ``keys``, how many records from ``begin`` the broker appended at
        or before ``ms``: up to the first offset whose timestamp is later (``list_offsets``
        for a time). A partition of a ``CreateTime`` topic has no append times: all it has
        waiting."""
        appended = self._log_append_time(sorted({split_key(k)[0] for k in keys}))
        stamped = [k for k in keys if appended[split_key(k)[0]]]
        later = self._offsets(stamped, lambda: OffsetSpec.for_timestamp(ms + 1))
        # -1: no record appended later, all of them count.
        ends = {k: latest[k] if later.get(k, -1) < 0 else min(later[k], latest[k]) for k in keys}
        return {k: ends[k] - begin[k] for k in keys}

    def _check_kept(self, start: Offsets, earliest: Offsets) -> None:
        """Refuse a start retention already deleted (the records were never read)."""
        for key, offset in sorted(start.items()):
            if earliest.get(key, 0) > offset:
                topic, partition = split_key(key)
                raise SourceDataLost(
                    f"Kafka topic {topic} partition {partition}: offsets {offset} to "
                    f"{earliest[key] - 1} were deleted (retention) before lowmark read them: "
                    "raise the topic's retention; to go on without them, set the source's "
                    "`on_data_loss: skip` (the records passed over are counted)"
                )

    def past_lost(self, start: Offsets) -> Skipped | None:
        """With ``on_data_loss: skip``: the partitions of ``start`` whose next records
        retention deleted, moved to their earliest offset kept."""
        if self.config.on_data_loss != "skip" or not start:
            return None
        earliest = self.earliest(sorted(start))
        lost = {k: (s, earliest[k]) for k, s in sorted(start.items()) if earliest[k] > s}
        if not lost:
            return None
        return Skipped(
            {**start, **{k: e for k, (_, e) in lost.items()}},
            {"records": sum(e - s for s, e in lost.values())},
            _lost(lost),
        )

    def _check_not_behind(self, start: Offsets, latest: Offsets) -> None:
        """Refuse a partition whose end is below what lowmark already read of it: it is not
        the log those offsets were read from (a topic deleted and created again)."""
        behind = {k: offset for k, offset in start.items() if latest[k] < offset}
        if behind and self._isolation == IsolationLevel.READ_COMMITTED:
            # A stable offset below the start is no proof: a batch planned before the
            # source read committed records only may end inside a transaction still open.
            ends = self._offsets(sorted(behind), OffsetSpec.latest, IsolationLevel.READ_UNCOMMITTED)
            behind = {k: offset for k, offset in behind.items() if ends[k] < offset}
        if behind:
            key = min(behind)
            topic, partition = split_key(key)
            raise SourceReplaced(
                f"Kafka topic {topic} partition {partition} ends at offset {latest[key]}, "
                f"below offset {behind[key]} lowmark already read up to: the topic was deleted "
                "and created again, and the checkpoint's offsets point into the old one; "
                "read the new one from its start with `lowmark reset` (`--truncate-sink`)"
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
        if moved and self.config.on_data_loss == "skip":
            moved = self._kept(moved, batch_id)
        raw = self._read_raw(moved) if moved else self._spark().createDataFrame([], RAW_SCHEMA)
        part = F.concat_ws(":", F.col("topic"), F.col("partition").cast("string"))
        explain = self._explain(moved, batch_id)
        size_bytes = RECORD_BYTES * sum(e - s for s, e in moved.values())
        if self.ingestion_clock:
            raw = raw.withColumn(INGESTED_COLUMN, self._ingested(moved))
        internal = [c for c in (INGESTED_COLUMN,) if c in raw.columns]
        if self.config.value_format == "raw":
            counts = Observation()
            records = raw.withColumn(PARTITION_COLUMN, part).observe(
                counts, *read_counts(False, None)
            )
            if cache:
                records = records.persist()
            cached = (records,) if cache else ()
            return SourceRead(records, None, counts, cached, explain, size_bytes)
        assert self.config.schema_ddl is not None
        values = raw.select("value", part.alias(PARTITION_COLUMN), "offset", *internal)
        origin = F.concat(F.col(PARTITION_COLUMN), F.lit("@"), F.col("offset").cast("string"))
        read = parse_json_values(
            values, self.config.schema_ddl, batch_id, origin, cache=cache, explain=explain
        )
        return dataclasses.replace(read, size_bytes=size_bytes)

    def _ingested(self, moved: dict[str, tuple[int, int]]) -> Column:
        """A record's own ingestion time (``INGESTED_COLUMN``): in a ``LogAppendTime`` topic
        its timestamp, the broker's append time; null in a ``CreateTime`` topic, whose
        timestamps are the producers' (its records are judged by the batch's clock)."""
        appended = self._log_append_time(sorted({split_key(k)[0] for k in moved}))
        stamped = [F.lit(t) for t, log_append in appended.items() if log_append]
        if not stamped:
            return F.lit(None).cast("long")
        return F.when(F.col("topic").isin(*stamped), F.unix_millis(F.col("timestamp")))

    def _kept(self, moved: dict[str, tuple[int, int]], batch_id: int) -> dict[str, tuple[int, int]]:
        """``moved`` without the records retention deleted since the batch was planned (a
        replay), which are passed over and counted in a log line."""
        earliest = self.earliest(sorted(moved))
        lost = {k: (s, min(earliest[k], e)) for k, (s, e) in moved.items() if earliest[k] > s}
        if not lost:
            return moved
        log.warning(
            "batch %d passes over %d Kafka records deleted before it read them "
            "(on_data_loss: skip): %s",
            batch_id,
            sum(e - s for s, e in lost.values()),
            _lost(lost),
        )
        kept = {k: (max(s, earliest[k]), e) for k, (s, e) in moved.items()}
        return {k: (s, e) for k, (s, e) in kept.items() if e > s}

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
    def _explain(
        moved: dict[str, tuple[int, int]], batch_id: int
    ) -> Callable[[Exception], LowmarkError | None]:
        """A read of offsets the broker no longer holds, as the user's error."""

        def explain(exc: Exception) -> LowmarkError | None:
            text = str(exc)
            if "data loss" not in text.lower() and "OffsetOutOfRange" not in text:
                return None
            ranges = ", ".join(f"{k} {s} to {e - 1}" for k, (s, e) in sorted(moved.items()))
            return SourceDataLost(
                f"Kafka no longer holds records batch {batch_id} must read ({ranges}): "
                f"{first_line(exc)}; raise the topic's retention; to go on without them, set "
                f"the batch's input aside with `lowmark skip-batch` (batch {batch_id}), or set "
                "the source's `on_data_loss: skip` and run again (what is gone is counted)"
            )

        return explain

    def missing(self, start: Offsets, end: Offsets) -> str | None:
        """A topic of ``[start, end)`` that is gone, or offsets of it retention deleted."""
        moved = {k: (start.get(k, 0), e) for k, e in sorted(end.items()) if e > start.get(k, 0)}
        topics = self.admin().list_topics(timeout=TIMEOUT_S).topics
        gone = sorted({split_key(k)[0] for k in moved if split_key(k)[0] not in topics})
        if gone:
            return (
                f"Kafka topic(s) {', '.join(gone)} no longer exist on "
                f"{self.config.bootstrap_servers}"
            )
        earliest = self.earliest(list(moved))
        lost = [
            f"{k} offsets {s} to {min(earliest[k], e) - 1}"
            for k, (s, e) in moved.items()
            if earliest[k] > s
        ]
        if not lost:
            return None
        return (
            f"Kafka deleted records the batches read ({', '.join(lost)}; retention): keep them "
            "longer with the topic's retention.ms"
        )

    def ingestion_times(self, position: Offsets, observed_ms: int) -> dict[str, int]:
        """Per partition, against the latest offsets the last ``plan`` saw (at
        ``observed_ms``): a partition read to that end gets ``observed_ms`` (every record past
        it was appended after the look). One with records waiting gets, in a topic whose
        ``message.timestamp.type`` is ``LogAppendTime``, the broker's append time of its
        first record at or past ``position``; in a ``CreateTime`` topic 0: when those were
        appended is unknown, so the clock waits (at the time the batch before last looked)
        until they are read."""
        latest = self._planned_latest
        waiting = {k: position.get(k, 0) for k, n in latest.items() if position.get(k, 0) < n}
        appended = self._log_append_time(sorted({split_key(k)[0] for k in waiting}))
        stamps = self._first_stamps({k: p for k, p in waiting.items() if appended[split_key(k)[0]]})
        times = dict.fromkeys({*latest, *position}, observed_ms)
        for key in waiting:
            times[key] = min(observed_ms, stamps.get(key, 0))
        return times

    def _log_append_time(self, topics: list[str]) -> dict[str, bool]:
        """Whether each of ``topics`` stamps records with the broker's append time."""
        asked = [ConfigResource(ResourceType.TOPIC, t) for t in topics if t not in self._stamped]
        if asked:
            futures = self.admin().describe_configs(asked, request_timeout=TIMEOUT_S)
            for resource, future in futures.items():
                kind = future.result().get("message.timestamp.type")
                self._stamped[resource.name] = kind is not None and kind.value == "LogAppendTime"
        return {t: self._stamped[t] for t in topics}

    def _first_stamps(self, positions: Offsets) -> dict[str, int]:
        """The timestamp of the first record at or past each partition's position (one
        consumer assigned to all of them; a partition that answers nothing in time is left
        out)."""
        if not positions:
            return {}
        consumer = Consumer(
            {
                **self._client,
                "group.id": self.group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",  # a position retention deleted: the next one
            }
        )
        try:
            consumer.assign([TopicPartition(*split_key(k), p) for k, p in positions.items()])
            found: dict[str, int] = {}
            deadline = time.monotonic() + TIMEOUT_S
            while len(found) < len(positions) and time.monotonic() < deadline:
                for message in consumer.consume(num_messages=len(positions), timeout=1.0):
                    topic, partition = message.topic(), message.partition()
                    if message.error() is None and topic is not None and partition is not None:
                        found.setdefault(partition_key(topic, partition), message.timestamp()[1])
            return found
        finally:
            consumer.close()

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


def _lost(lost: dict[str, tuple[int, int]]) -> str:
    """Lost ``{partition: (first, end)}`` ranges as an operator names them."""
    return ", ".join(f"{k} offsets {s} to {e - 1}" for k, (s, e) in sorted(lost.items()))
