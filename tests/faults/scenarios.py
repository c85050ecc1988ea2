"""Pipelines and inputs the crash tests run, in process and as `lowmark run` subprocesses.

A subprocess finds the pipelines with ``--pipelines tests.faults.scenarios``.
Every pipeline reads ``../input`` relative to its data root, so runs that
live in sibling folders (a reference, a template, one copy per crash case)
share one input folder, have one fingerprint, and a copied checkpoint's
file manifest still names files that exist. The watermark must be a
function of the input alone, so that a run killed by a subprocess and a
fault-free run in the test process agree: one source partition and no idle
timeout, or (``tumbling_two_partitions``, ``synthetic_idle``) an idle timeout
of 1 ms, shorter than any batch: a partition is idle exactly when it has no
records waiting (all input is there before the first batch).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction
from pyspark.sql import SparkSession

from examples.keyed import ALERTS, SilenceAlert
from lowmark.batches.clock import SystemClock
from lowmark.batches.dedup import Dedup
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.pipeline import (
    CustomSource,
    DeltaSink,
    DeltaSource,
    FileSource,
    KafkaSink,
    KafkaSource,
    Pipeline,
    PostgresSink,
    SyntheticSource,
    UnionSource,
)
from lowmark.batches.stream_join import JoinTime, StreamJoin
from lowmark.batches.table_join import TableJoin
from lowmark.batches.windows import (
    Aggregate,
    EventTime,
    IngestionWatermark,
    Session,
    Sliding,
    Tumbling,
    WindowedAggregation,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"
INPUT = "../input"
SINK = "out"
POSTGRES_TABLE = "out"

Event = tuple[str, int, int]
"""(user, second after T0, amount)."""

File = list[Event | str]
"""One input file: events, and raw text for a malformed line."""


def _source(by_folder: bool = False) -> FileSource:
    return FileSource(
        path=INPUT,
        format="json",
        schema_ddl=SCHEMA,
        max_files_per_batch=1,
        partition_by_folder=by_folder,
    )


def _windowed(
    name: str, window: Tumbling | Sliding | Session, mode: str, by_folder: bool = False
) -> Pipeline:
    return Pipeline(
        name=name,
        source=_source(by_folder),
        sink=DeltaSink(path=SINK),
        event_time=EventTime(
            column="ts",
            max_out_of_orderness="5 seconds",
            allowed_lateness="10 seconds",
            idle_timeout="1 ms" if by_folder else None,
        ),
        aggregation=WindowedAggregation(
            keys=("user",),
            window=window,
            # Integer aggregates only: the comparison with a reference run is exact.
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
            output_mode=mode,
        ),
    )


tumbling_append = _windowed("tumbling_append", Tumbling(size="10 seconds"), "append")
tumbling_two_partitions = _windowed(
    "tumbling_two_partitions", Tumbling(size="10 seconds"), "append", by_folder=True
)
session_update = _windowed("session_update", Session(gap="5 seconds"), "update")
sliding_update = _windowed(
    "sliding_update", Sliding(size="10 seconds", slide="5 seconds"), "update"
)
plain_append = Pipeline(name="plain_append", source=_source(), sink=DeltaSink(path=SINK))
postgres_append = Pipeline(
    name="postgres_append", source=_source(), sink=PostgresSink(table=POSTGRES_TABLE)
)
"""``plain_append`` into a Postgres table: records streamed from Spark through the driver into
one transaction with the batch's fence row. Which database: libpq's PGDATABASE, one per data
root (``tests.faults.harness.database_of``)."""
postgres_update = session_update.model_copy(
    update={"name": "postgres_update", "sink": PostgresSink(table=POSTGRES_TABLE)}
)
"""``session_update`` into a Postgres table: each batch's sessions upserted on user + window,
the ones it merged away deleted, in one transaction with its fence row (from the driver)."""
dedup_tumbling = _windowed("dedup_tumbling", Tumbling(size="10 seconds"), "append").model_copy(
    update={"dedup": Dedup(columns=("user", "ts"), within="20 seconds")}
)
"""Tumbling windows behind deduplication by (user, event time), over ``RESENT_INPUT``."""
keyed_alerts = Pipeline(
    name="keyed_alerts",
    source=_source(),
    sink=DeltaSink(path=SINK),
    event_time=EventTime(column="ts", max_out_of_orderness="5 seconds"),
    keyed=Keyed(processor=SilenceAlert, keys=("user",), output_schema=ALERTS),
)
"""A keyed step with event-time timers (``examples.keyed.SilenceAlert``): users silent for
10 seconds of event time raise an alert, as the watermark passes their timers."""

dedup_append = Pipeline(
    name="dedup_append",
    source=_source(),
    sink=DeltaSink(path=SINK),
    event_time=EventTime(column="ts", max_out_of_orderness="5 seconds"),
    dedup=Dedup(columns=("user", "ts"), within="20 seconds"),
)
"""Deduplication by (user, event time) in front of a Delta sink, over ``RESENT_INPUT``: the
records let through are written by the verdicts' tasks as files, committed by delta-rs."""

KAFKA_ENV = "LOWMARK_TEST_KAFKA"
"""The test broker's address (``tests.conftest``'s ``kafka`` fixture sets it for subprocesses)."""
KAFKA_TOPIC = "kill_matrix"
KAFKA_BATCH = 3
"""Records per Kafka batch: the topic holds all of ``KAFKA_INPUT`` before the first batch."""

kafka_update = _windowed("kafka_update", Session(gap="5 seconds"), "update").model_copy(
    update={
        "source": KafkaSource(
            bootstrap_servers=os.environ.get(KAFKA_ENV, "127.0.0.1:9"),
            topics=(KAFKA_TOPIC,),
            schema_ddl=SCHEMA,
            max_offsets_per_batch=KAFKA_BATCH,
        )
    }
)
"""Sessions over a one-partition topic, KAFKA_BATCH records a batch."""

KAFKA_SINK_ENV = "LOWMARK_TEST_KAFKA_SINK_TOPIC"
"""The topic a `lowmark run` subprocess's Kafka sink writes (``tests.faults.kafka_sink``)."""

kafka_append = Pipeline(
    name="kafka_append",
    source=_source(),
    sink=KafkaSink(
        topic=os.environ.get(KAFKA_SINK_ENV, "kill_matrix_out"),
        bootstrap_servers=os.environ.get(KAFKA_ENV, "127.0.0.1:9"),
        key="user",
    ),
)
"""``plain_append`` into a Kafka topic: records streamed from Spark through the driver into one
producer transaction with the batch's fence. Which topic: one per data root
(``tests.faults.kafka_sink``)."""

KAFKA_INPUT: list[Event | str] = [
    ("a", 1, 1), ("b", 2, 2), ("a", 7, 3),
    ("b", 14, 4), ("a", 14, 5), ("c", 30, 6),  # the watermark moves to 25 s
    ("b", 18, 7), ("a", 16, 8), ("b", 21, 9),
    # The batch the kill matrix kills: a@4 is late, a line does not parse, c@33 extends a
    # session open since batch 1.
    ("a", 4, 10), '{"user": "b", "ts": oops', ("c", 33, 11),
    ("a", 40, 12), ("b", 45, 13), ("a", 52, 14),
    ("c", 60, 15), ("b", 44, 16),
]  # fmt: skip
"""The Kafka pipeline's input, one record a line: batch 3 holds late, bad and open-session rows."""

OUTBOX = "../input.db"
"""The outbox pipeline's SQLite file, beside its data roots like the folder pipelines' input."""

outbox_update = _windowed("outbox_update", Session(gap="5 seconds"), "update").model_copy(
    update={
        "source": CustomSource(
            factory="examples.outbox_source:build",
            options={"database": OUTBOX, "schema_ddl": SCHEMA, "max_rows_per_batch": KAFKA_BATCH},
            operational=("max_rows_per_batch",),
        )
    }
)
"""Sessions over a user-written source (``examples.outbox_source``) holding ``KAFKA_INPUT``."""

synthetic_append = _windowed("synthetic_append", Tumbling(size="10 seconds"), "append").model_copy(
    update={
        "source": SyntheticSource(
            seed=1,
            partitions=2,
            keys=3,
            rows_per_second=1,
            total_rows=60,
            starting_offsets="earliest",
            max_rows_per_batch=20,
            max_out_of_orderness="3 seconds",
            late_fraction=0.15,
            late_by="40 seconds",
            malformed_fraction=0.1,
            partition_skew="2 seconds",
        ),
        "event_time": EventTime(
            column="event_time", max_out_of_orderness="5 seconds", allowed_lateness="10 seconds"
        ),
        "aggregation": WindowedAggregation(
            keys=("key",),
            window=Tumbling(size="10 seconds"),
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="value")),
        ),
    }
)
"""Tumbling windows over two synthetic partitions (records 1 s apart, 10 a batch each); with
seed 1, batch 3 holds late, bad and emitted rows (the kill matrix's premise, checked there)."""

synthetic_no_idle = synthetic_append.model_copy(
    update={
        "name": "synthetic_no_idle",
        "source": synthetic_append.source.model_copy(update={"partition_skew": 30_000}),  # ms
    }
)
"""``synthetic_append`` with partition 1 30 s of event time behind partition 0."""
synthetic_idle = synthetic_no_idle.model_copy(
    update={
        "name": "synthetic_idle",
        "event_time": EventTime(
            column="event_time",
            max_out_of_orderness="5 seconds",
            allowed_lateness="10 seconds",
            idle_timeout="1 ms",
        ),
    }
)
"""``synthetic_no_idle`` with an idle timeout shorter than any batch: both partitions have
records waiting until the last batch, so neither may count as idle before it, and the
records each batch finds late are ``synthetic_no_idle``'s (were partition 0 alone to set
the watermark, partition 1's records would be late by the batchful)."""

INPUT_TABLE = "../input_table"
"""The Delta pipelines' input table, beside their data roots like the folder pipelines' input."""

delta_update = _windowed("delta_update", Session(gap="5 seconds"), "update").model_copy(
    update={"source": DeltaSource(path=INPUT_TABLE, max_versions_per_batch=1)}
)
"""Sessions over a Delta table written one version per Kafka batch of ``KAFKA_INPUT`` (its
malformed line left out: a table's rows are typed), a version a batch."""

union_append = _windowed("union_append", Tumbling(size="10 seconds"), "append").model_copy(
    update={
        "source": UnionSource(
            sources={"files": _source(), "table": delta_update.source},
        )
    }
)
"""Tumbling windows over the folder's ``FIXED_INPUT`` and the Delta table, a file and a
version a batch: the watermark is the lower of the two sources'."""

ingestion_tumbling = _windowed("ingestion_tumbling", Tumbling(size="10 seconds"), "append")
ingestion_tumbling = ingestion_tumbling.model_copy(
    update={
        "source": _source().model_copy(update={"ingestion_time": "modified"}),
        "event_time": EventTime(
            column="ts",
            allowed_lateness="10 seconds",
            watermark=IngestionWatermark(
                strategy="ingestion_time", max_event_time_lag="12 seconds"
            ),
        ),
    }
)
"""Tumbling windows on the ingestion clock: each file of ``FIXED_INPUT`` counts as written
at its modification time (``INGESTED_AT``), and the watermark is the earliest time of a file
still to come minus 12 seconds. A planning that finds nothing waiting reads the processing
time, which ``FROZEN_CLOCK_MS`` fixes (a fake clock in every process that runs it), so the
runs agree on the tail too."""

INGESTED_AT = (3, 15, 31, 34, 46, 61)
"""Seconds after T0 at which ``ingestion_tumbling``'s input files were written (modified)."""
FROZEN_CLOCK_MS = int((T0 + timedelta(days=1)).timestamp() * 1000)
"""The processing time of every run of ``ingestion_tumbling``: a day after its input."""
FROZEN_CLOCK_ENV = "LOWMARK_TEST_FROZEN_CLOCK_MS"
"""Set for a `lowmark run` subprocess of a pipeline with a frozen clock: this module, its
``--pipelines``, then fixes the wall clock the run reads (``frozen_clock``)."""


class FrozenClock:
    """A processing time that does not move."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now


DIMENSION = "../dimension"
"""The joined pipeline's dimension table, beside the data roots like the input folder."""
USER_REGIONS = {"user": ["a", "b", "c"], "region": ["north", "south", "north"]}
"""The dimension's rows: users a and c in one region, so its windows hold both."""

joined_tumbling = _windowed("joined_tumbling", Tumbling(size="10 seconds"), "append")
assert joined_tumbling.aggregation is not None
joined_tumbling = joined_tumbling.model_copy(
    update={
        "joins": (TableJoin(table=DIMENSION, keys=("user",), how="left"),),
        "aggregation": joined_tumbling.aggregation.model_copy(update={"keys": ("region",)}),
    }
)
"""Tumbling windows per region, a column the records get from a stream-table join with
``USER_REGIONS`` (one version, which every batch records and joins)."""


def write_dimension(table: Path) -> None:
    """``joined_tumbling``'s dimension table, ``USER_REGIONS``."""
    write_deltalake(str(table), pa.table(USER_REGIONS))


CLICKS = "../clicks"
"""The stream join's right side, a Delta table beside the data roots like the input folder."""
CLICKS_SCHEMA = pa.schema(
    [("user", pa.string()), ("clicked_at", pa.timestamp("us", "UTC")), ("cost", pa.int64())]
)

stream_joined = Pipeline(
    name="stream_joined",
    source=UnionSource(
        sources={
            "views": _source(),
            "clicks": DeltaSource(path=CLICKS, max_versions_per_batch=1),
        }
    ),
    sink=DeltaSink(path=SINK),
    event_time=EventTime(column="ts", max_out_of_orderness="50 seconds"),
    stream_join=StreamJoin(
        left="views",
        right="clicks",
        keys=("user",),
        how="left",
        time=JoinTime(left="ts", right="clicked_at", upper="100 seconds"),
    ),
)
"""A left outer stream-stream join: views (``VIEWS``, a file a batch) with the clicks of the
same user 0-100 seconds after them (``CLICK_VERSIONS``, a version of ``CLICKS`` a batch)."""

VIEWS: list[File] = [
    [("a", 10, 1), ("b", 20, 2)],
    [("c", 300, 3), ("a", 70, 4)],
    [("b", 180, 5), ("a", 140, 6), ("d", 120, 7)],
    # The batch the kill matrix kills (watermark 250 s): a@40 is late, a line does not parse,
    # a@280 matches a click of the same batch, b@330 is held unmatched, d@120 (never clicked)
    # is passed by the watermark and emitted with nulls.
    [("a", 40, 8), '{"user": "b", "ts": oops', ("a", 280, 9), ("b", 330, 10)],
    [("c", 400, 11), ("a", 450, 12)],
    [("c", 600, 13), ("a", 520, 14)],
]
"""``stream_joined``'s left side: six files, one per batch."""
CLICK_VERSIONS: list[list[Event]] = [
    [("a", 30, 100)],
    [("b", 80, 101)],
    [("a", 150, 102), ("c", 310, 103)],
    # The killed batch: b@260 matches b@180, held since batch 2; e@270 (no view) is held.
    [("b", 260, 104), ("e", 270, 105), ("a", 300, 106), ("c", 360, 107)],
    [("b", 400, 108), ("a", 460, 109)],
    [("c", 500, 110), ("b", 580, 111)],
]
"""``stream_joined``'s right side: (user, second after T0, cost), a table version per batch."""


def write_clicks(table: Path) -> None:
    """``stream_joined``'s clicks table: one version per ``CLICK_VERSIONS`` entry."""
    for rows in CLICK_VERSIONS:
        write_click_version(table, rows)


def write_click_version(table: Path, rows: list[Event]) -> None:
    """One more version of a clicks table, of ``rows``. None: a version of one file of no
    rows, which takes a batch's place as an empty file of a folder source does (delta-rs
    writes a version of no files, which a Delta source, Spark's too, passes over)."""
    clicks = [(user, T0 + timedelta(seconds=second), cost) for user, second, cost in rows]
    columns = [list(c) for c in zip(*clicks, strict=True)] or [[] for _ in CLICKS_SCHEMA]
    data = pa.table(dict(zip(CLICKS_SCHEMA.names, columns, strict=True)), CLICKS_SCHEMA)
    if rows:
        write_deltalake(str(table), data, mode="append")
        return
    name = f"part-empty-{DeltaTable(str(table)).version() + 1}.parquet"
    pq.write_table(data, table / name)
    size = (table / name).stat().st_size
    added = AddAction(name, size, {}, int(time.time() * 1000), True, '{"numRecords":0}')
    DeltaTable(str(table)).create_write_transaction([added], "append", CLICKS_SCHEMA)


def clock_of(pipeline: Pipeline) -> FrozenClock | None:
    """The fake clock a run of ``pipeline`` reads (None: the wall clock)."""
    return FrozenClock(FROZEN_CLOCK_MS) if pipeline.name == ingestion_tumbling.name else None


if FROZEN_CLOCK_ENV in os.environ:  # a `lowmark run` subprocess: every clock is frozen
    SystemClock.now_ms = FrozenClock(int(os.environ[FROZEN_CLOCK_ENV])).now_ms  # type: ignore[method-assign, assignment]

PIPELINES = {
    p.name: p
    for p in (
        tumbling_append,
        tumbling_two_partitions,
        session_update,
        sliding_update,
        plain_append,
        postgres_append,
        postgres_update,
        kafka_append,
        dedup_tumbling,
        dedup_append,
        keyed_alerts,
        kafka_update,
        synthetic_append,
        synthetic_idle,
        outbox_update,
        delta_update,
        union_append,
        ingestion_tumbling,
        joined_tumbling,
        stream_joined,
    )
}

FOLDER_PIPELINES = frozenset(
    n
    for n, p in PIPELINES.items()
    if isinstance(p.source, FileSource) and isinstance(p.sink, DeltaSink) and not p.joins
)
"""The pipelines that read only the input folder and write only Delta tables (random input
files are enough for them)."""

FIXED_INPUT: list[File] = [
    [("a", 1, 1), ("b", 2, 2)],
    [("a", 7, 3), ("b", 14, 4), ("a", 14, 5)],
    [("c", 30, 6), ("b", 18, 7)],
    # The batch the kill matrix kills, in the middle of the run (watermark 25 s): a@4
    # is late, a line does not parse, a@16 and b@21 extend windows and sessions open
    # since earlier batches, the windows [0,10) and sessions ending by 15 s are final
    # and emitted or purged.
    [("a", 4, 8), '{"user": "b", "ts": oops', ("a", 16, 9), ("b", 21, 10), ("c", 33, 11)],
    # After it: more windows close (and, with two partitions, the killed batch's is idle).
    [("a", 40, 12), ("b", 45, 13)],
    [("c", 60, 14), ("a", 52, 15), ("b", 44, 16)],
]
"""Six files, one per batch."""

RESENT_INPUT: list[File] = [
    FIXED_INPUT[0],
    FIXED_INPUT[1],
    FIXED_INPUT[2],
    # The killed batch (watermark 25 s, ids held from 5 s): b@18 came in batch 2 (a
    # duplicate), a@1 in batch 0 (before the horizon: late).
    [*FIXED_INPUT[3], ("b", 18, 7), ("a", 1, 1)],
    # a@16 came in the killed batch, and twice here (two duplicates).
    [*FIXED_INPUT[4], ("a", 16, 9), ("a", 16, 9)],
    # c@33 came in the killed batch (watermark 40 s: held from 20 s).
    [*FIXED_INPUT[5], ("c", 33, 11)],
]
"""``FIXED_INPUT`` with records sent again (``dedup_tumbling``'s input)."""


def random_input(rng: random.Random, files: int) -> list[File]:
    """``files`` files of a few events each, time moving forward with some disorder."""
    result: list[File] = []
    now = 0
    for _ in range(files):
        now += rng.randint(0, 15)
        rows: File = [
            (rng.choice("abc"), max(0, now - rng.randint(0, 25)), rng.randint(1, 9))
            for _ in range(rng.randint(1, 4))
        ]
        if rng.random() < 0.2:
            rows.insert(rng.randint(0, len(rows)), '{"user": oops')
        result.append(rows)
    return result


def kafka_lines() -> list[str]:
    """``KAFKA_INPUT`` as the values to produce."""
    return [_line(row) for row in KAFKA_INPUT]


def table_versions() -> list[list[Event]]:
    """``KAFKA_INPUT`` as the Delta input table's versions: a Kafka batch's records each,
    without the line that does not parse."""
    return [
        [row for row in KAFKA_INPUT[i : i + KAFKA_BATCH] if not isinstance(row, str)]
        for i in range(0, len(KAFKA_INPUT), KAFKA_BATCH)
    ]


def write_table(spark: SparkSession, table: Path) -> None:
    """The Delta input table: one version of one file per ``table_versions()`` entry."""
    for rows in table_versions():
        records = [(user, T0 + timedelta(seconds=second), amount) for user, second, amount in rows]
        df = spark.createDataFrame(records, SCHEMA).coalesce(1)
        df.write.format("delta").mode("append").save(str(table))


def write_outbox(database: Path) -> None:
    """``KAFKA_INPUT`` as the rows of an outbox table, ids from 0."""
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, payload TEXT)")
        db.executemany("INSERT INTO outbox VALUES (?, ?)", list(enumerate(kafka_lines())))


OTHER_PARTITION_FILE = 3
"""With folder partitions, the one file in ``p1/`` (the others are in ``p0/``): the kill
matrix's batch. ``p1`` first shows in it and has nothing waiting after it (idle from then
on), while ``p0``, read long before, still has files waiting (never idle)."""


def write_input(folder: Path, files: list[File], pipeline: Pipeline | None = None) -> None:
    """File i as JSON lines, modified at second i (discovery order = list order), or at
    ``INGESTED_AT[i]`` for ``ingestion_tumbling``; for a pipeline with folder partitions, in
    ``p0/`` but for ``OTHER_PARTITION_FILE``."""
    by_folder = (
        pipeline is not None
        and isinstance(pipeline.source, FileSource)
        and pipeline.source.partition_by_folder
    )
    for i, rows in enumerate(files):
        partition = f"p{int(i == OTHER_PARTITION_FILE)}" if by_folder else ""
        stamp = int(T0.timestamp()) + INGESTED_AT[i] if pipeline is ingestion_tumbling else None
        write_file(folder / partition, i, rows, stamp)


def write_file(folder: Path, index: int, rows: File, stamp: int | None = None) -> None:
    """Input file ``index`` of ``folder`` as JSON lines, modified at ``stamp`` (epoch seconds;
    default: second ``index`` of a fixed day, so discovery order is index order)."""
    path = folder / f"f{index:03d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(_line(r) + "\n" for r in rows))
    stamp = 1_700_000_000 + index if stamp is None else stamp
    os.utime(path, (stamp, stamp))


def _line(row: Event | str) -> str:
    if isinstance(row, str):
        return row
    user, second, amount = row
    record: dict[str, Any] = {
        "user": user,
        "ts": (T0 + timedelta(seconds=second)).isoformat(),
        "amount": amount,
    }
    return json.dumps(record)
