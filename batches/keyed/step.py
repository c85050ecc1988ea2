"""A keyed step in a batch's Spark work: the records of each key through the user's processor.

Per batch (``KeyedStep.processed``):

1. Records without event time, or (event-time mode) below the watermark, go
   to the late table, as a windowed batch's late records do; the others get
   their key's bucket (a hash of the key columns modulo the state table's
   buckets) and one marker row per bucket joins them, so that every bucket
   is in exactly one task even when no record of it came.
2. The records are shuffled by bucket. Each task (``_process``, on the
   executors) reads, with delta-rs as of the versions the driver pinned
   (``lowmark.state.keyed_state.Pinned``), the timers of its buckets that are
   due and the states of the keys its records or due timers name, runs the
   processor (``lowmark.batches.keyed.runtime``), writes one change row per
   state or timer the batch changed as data files of the state and timer
   tables (``Pinned.written``: nothing committed), and yields the processor's
   output rows and one descriptor row per file it wrote.
3. The job that reads the batch observes the file descriptors and the late
   records as it runs; the output rows go on to the sink. The driver commits
   the files in the batch's state step, once per table
   (``KeyedTables.write``).

Neither the keys a batch touched nor their changes reach the driver: only
the files' descriptors do, a few per task, so a batch scales with the
cluster.

A batch known to have no records (its range is empty: it runs because a timer
is due) has only markers to shuffle: its one task runs on the driver instead
(``KeyedStep.fired``), the same ``_process`` over the marker rows of every
bucket, with no Spark job; its output rows become a local frame.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from lowmark.batches.batch_values import batch_long
from lowmark.batches.collect import to_frame
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.keyed.definition import Keyed
from lowmark.batches.keyed.runtime import Key, KeyedRun, TimeMode
from lowmark.batches.keyed.state_values import held_values
from lowmark.batches.records import (
    INGESTED_COLUMN,
    INTERNAL_COLUMNS,
    UNTIMED,
    late_struct,
    own_ingestion_clock,
)
from lowmark.state.keyed_state import (
    BUCKET,
    BUCKETS,
    STATE,
    STATE_TABLE,
    TIMER_CHANGE,
    TIMER_TABLE,
    TIMERS,
    KeyedTables,
    Pinned,
    key_json,
)
from lowmark.state.task_appends import WrittenFile

MARKER = "_lowmark_marker"
EVENT_MS = "_lowmark_event_ms"
ORDER = "_lowmark_order"
CHANGE = "_lowmark_change"
CHANGES, INTO, LATE = "_lowmark_changes", "_lowmark_keyed", "_lowmark_keyed_late"
BEHIND = "event time below the watermark: a keyed step's timers have passed it"


@dataclass(frozen=True)
class KeyedSeen:
    """What the job that read a batch observed of its keyed step."""

    records: int
    """Records the processor was given."""
    files: dict[str, list[WrittenFile]]
    """The data files of the batch's changes the tasks wrote, by table name
    (``Pinned.written``): what ``KeyedTables.write`` commits."""
    late: pa.Table
    """``event_us``, ``reason``, ``record`` of each record sent to the late table."""


@dataclass(frozen=True)
class Processed:
    """A batch's keyed step, lazily: the processor's output rows, and the observations of
    the records it was given (``seen``) and of the files its changes were written to
    (``changes``)."""

    output: DataFrame
    seen: Observation
    changes: Observation
    batch_id: int

    def observed(self, seen: dict[str, Any], changes: dict[str, Any]) -> KeyedSeen:
        """The step's counts and written files from the observations' metrics
        (``collect.observed``)."""
        late = [r.asDict() for r in seen[LATE]]
        return _keyed_seen(int(seen[INTO]), changes[CHANGES], late)


@dataclass(frozen=True)
class Fired:
    """A batch's keyed step run on the driver (``KeyedStep.fired``): no records, its due
    timers only; what the job that read it would have observed, known already."""

    output: DataFrame
    """The processor's output rows, as a local frame (no job made them)."""
    table: pa.Table
    """The same rows, as they are on the driver."""
    rows: int
    """How many."""
    seen: KeyedSeen


_LATE = pa.schema([("event_us", pa.int64()), ("reason", pa.string()), ("record", pa.string())])


def _keyed_seen(records: int, described: list[str], late: list[dict[str, Any]]) -> KeyedSeen:
    """A batch's keyed step from its ``records`` count, the descriptors ``_process`` yielded of
    the files it wrote, and its ``late`` records' rows."""
    files: dict[str, list[WrittenFile]] = {STATE_TABLE: [], TIMER_TABLE: []}
    for written in (json.loads(d) for d in described):
        files[written["table"]].append(WrittenFile.of(written["file"]))
    return KeyedSeen(records, files, pa.Table.from_pylist(late, schema=_LATE))


class KeyedStep:
    """The keyed step of one pipeline's batches."""

    def __init__(
        self,
        keyed: Keyed,
        event_time_column: str,
        tables: KeyedTables,
        lags: Mapping[str, int] | None = None,
        writes: bool = True,
    ) -> None:
        """``lags``: the maximum event-time lag of the partitions that follow an ingestion
        clock, by the prefix of their names (``IngestionLags.by_prefix``); in event-time
        mode their records are also late below their own clock (``own_ingestion_clock``).
        ``writes``: False when the tasks write no files of their changes (``previewing``)."""
        self.keyed = keyed
        self.column = event_time_column
        self.tables = tables
        self.lags = lags
        self.writes = writes

    def previewing(self) -> KeyedStep:
        """This step running the processor as it does, its tasks writing nothing (``lowmark
        preview``: the output rows without the state files a commit would add)."""
        return KeyedStep(self.keyed, self.column, self.tables, self.lags, writes=False)

    def ran_at(self, watermark_ms: int | None, processing_ms: int) -> int | None:
        """The time a batch's timers are due by: its watermark (event-time mode; None before
        there is one) or its processing time."""
        return watermark_ms if self.keyed.time_mode == "event_time" else processing_ms

    def processed(
        self,
        spark: SparkSession,
        records: DataFrame,
        watermark_ms: int | None,
        processing_ms: int,
        pinned: Pinned,
        batch_id: int,
    ) -> Processed:
        """Steps 1-3 of the module's docstring over ``records``, lazily."""
        payload = self._payload(records)
        event_ms = F.unix_millis(F.col(self.column))
        late = F.col(self.column).isNull()
        if self.keyed.time_mode == "event_time":
            clocks = [batch_long(watermark_ms)] if watermark_ms is not None else []
            own = own_ingestion_clock(self.lags or {})
            if own is not None and INGESTED_COLUMN in records.columns:
                clocks.append(own)
            if clocks:  # greatest() skips a record's null own clock
                clock = clocks[0] if len(clocks) == 1 else F.greatest(*clocks)
                late = late | F.coalesce(event_ms < clock, F.lit(False))
        seen = Observation()
        observed = records.observe(
            seen,
            F.count(F.when(~late, 1)).alias(INTO),
            F.collect_list(F.when(late, _late_record(self.column, payload))).alias(LATE),
        )
        rows, output, process = self._bucketed(
            spark, observed.where(~late), payload, watermark_ms, processing_ms, pinned, batch_id
        )
        changes = Observation()
        processed = (
            rows.repartition(BUCKET)
            .mapInArrow(process, output)
            .observe(changes, F.collect_list(F.col(CHANGE)).alias(CHANGES))
        )
        output_rows = processed.where(F.col(CHANGE).isNull()).drop(CHANGE)
        return Processed(output_rows, seen, changes, batch_id)

    def fired(
        self,
        spark: SparkSession,
        records: DataFrame,
        watermark_ms: int | None,
        processing_ms: int,
        pinned: Pinned,
        batch_id: int,
    ) -> Fired:
        """Steps 2-3 of a batch whose ``records`` are known to be none (its due timers fire,
        nothing else), on the driver and with no Spark job: the one task of step 2
        (``_process``) over the marker rows of every bucket, in this process. Its state and
        timer changes are the files ``Processed`` would have observed, its output rows the
        ones it would have given."""
        payload = self._payload(records)
        output, process = self._task(payload, watermark_ms, processing_ms, pinned, batch_id)
        given = to_arrow_schema(_given(records, payload), timezone="UTC")
        markers = pa.table(
            {
                f.name: (
                    pa.array(range(BUCKETS), f.type)
                    if f.name == BUCKET
                    else pa.array([True] * BUCKETS, f.type)
                    if f.name == MARKER
                    else pa.nulls(BUCKETS, f.type)
                )
                for f in given
            },
            schema=given,
        )
        schema = to_arrow_schema(output, timezone="UTC")
        yielded = pa.Table.from_batches(list(process(iter(markers.to_batches()))), schema=schema)
        change = yielded.column(CHANGE)
        out = yielded.filter(pc.is_null(change)).drop_columns([CHANGE])
        described = yielded.filter(pc.is_valid(change)).column(CHANGE).to_pylist()
        declared = StructType(output.fields[:-1])
        made = out.select(declared.fieldNames())
        return Fired(
            to_frame(spark, made, declared), made, made.num_rows, _keyed_seen(0, described, [])
        )

    def _payload(self, records: DataFrame) -> list[str]:
        """The columns of ``records`` the processor gets; raises when they lack the keys or the
        event time."""
        missing = {*self.keyed.keys, self.column} - set(records.columns)
        if missing:
            raise PipelineConfigInvalid(
                f"the records lack {sorted(missing)}: the transform must keep the keyed "
                "step's keys and the event-time column"
            )
        return [c for c in records.columns if c not in INTERNAL_COLUMNS]

    def _bucketed(
        self,
        spark: SparkSession,
        timely: DataFrame,
        payload: list[str],
        watermark_ms: int | None,
        processing_ms: int,
        pinned: Pinned,
        batch_id: int,
    ) -> tuple[
        DataFrame, StructType, Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
    ]:
        """Step 1's rows (the ``timely`` records with their buckets, and the markers), the
        schema step 2's tasks yield, and a task (``_task``)."""
        keys = [F.col(c) for c in self.keyed.keys]
        records = (
            timely.select(*payload)
            .withColumn(EVENT_MS, F.unix_millis(F.col(self.column)))
            .withColumn(ORDER, F.xxhash64(F.to_json(F.struct(*payload))))
            .withColumn(BUCKET, F.pmod(F.xxhash64(*keys), F.lit(BUCKETS)).cast("int"))
            .withColumn(MARKER, F.lit(None).cast("boolean"))
        )
        # One partition: the markers are BUCKETS rows, not worth a task each of the
        # session's parallelism.
        markers = spark.range(0, BUCKETS, 1, numPartitions=1).select(
            F.col("id").cast("int").alias(BUCKET), F.lit(True).alias(MARKER)
        )
        rows = records.unionByName(markers, allowMissingColumns=True)
        output, process = self._task(payload, watermark_ms, processing_ms, pinned, batch_id)
        return rows, output, process

    def _task(
        self,
        payload: list[str],
        watermark_ms: int | None,
        processing_ms: int,
        pinned: Pinned,
        batch_id: int,
    ) -> tuple[StructType, Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]]:
        """The schema step 2's tasks yield, and a task (``_process`` for this batch)."""
        keyed = self.keyed
        output = StructType([*self._declared.fields, StructField(CHANGE, StringType())])
        process = functools.partial(
            _process,
            pinned,
            keyed.processor,
            keyed.time_mode,
            watermark_ms,
            processing_ms,
            keyed.keys,
            payload,
            batch_id,
            to_arrow_schema(output, timezone="UTC"),
        )
        return output, process

    @functools.cached_property
    def _declared(self) -> StructType:
        """The processor's output rows' schema (``Keyed.output_schema``)."""
        declared = StructType.fromDDL(self.keyed.output_schema)  # needs a running Spark
        assert isinstance(declared, StructType)
        return declared


def _given(records: DataFrame, payload: list[str]) -> StructType:
    """The columns a task of step 2 is given (``_bucketed``'s rows): the ``payload`` of
    ``records``, each record's event time in ms, its order among the same event time, its
    bucket, and whether the row is a bucket's marker."""
    fields = {f.name: f for f in records.schema.fields}
    return StructType(
        [
            *(fields[c] for c in payload),
            StructField(EVENT_MS, LongType()),
            StructField(ORDER, LongType()),
            StructField(BUCKET, IntegerType()),
            StructField(MARKER, BooleanType()),
        ]
    )


def _late_record(column: str, payload: list[str]) -> Column:
    reason = F.when(F.col(column).isNull(), F.lit(UNTIMED)).otherwise(F.lit(BEHIND))
    return late_struct(F.unix_micros(F.col(column)), reason, payload)


def _process(
    pinned: Pinned,
    factory: Callable[[], Any],
    time_mode: TimeMode,
    watermark_ms: int | None,
    processing_ms: int,
    key_columns: tuple[str, ...],
    payload: list[str],
    batch_id: int,
    schema: pa.Schema,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """One task of step 2: its buckets' records through the processor; its changes written
    as data files; output rows and one descriptor row per file."""
    parts = [b for b in batches if b.num_rows]
    if not parts:
        return
    rows = pa.Table.from_batches(parts)
    buckets = set(rows.column(BUCKET).to_pylist())
    records = rows.filter(pc.invert(pc.fill_null(rows.column(MARKER), False)))
    frame = records.to_pandas(types_mapper=None).sort_values([EVENT_MS, ORDER], kind="stable")
    by_key: dict[Key, pd.DataFrame] = {}
    bucket_of: dict[str, int] = {}
    newest_ms: dict[Key, int] = {}
    # Per key, only a slice of the payload: what is worked out per group is worked out for
    # all groups at once (the same groups in the same order), which is what keeps a task's
    # cost per key to microseconds.
    grouped = frame.groupby(list(key_columns), sort=False, dropna=False)
    newest = grouped[EVENT_MS].max().tolist()
    first_bucket = grouped[BUCKET].first().tolist()
    for (key, group), ms, bucket in zip(grouped[payload], newest, first_bucket, strict=True):
        values = key if isinstance(key, tuple) else (key,)
        group.index = pd.RangeIndex(len(group))
        by_key[values] = group
        newest_ms[values] = int(ms)
        bucket_of[key_json(values)] = int(bucket)
    now = watermark_ms if time_mode == "event_time" else processing_ms
    due = pinned.due(buckets, now) if now is not None else None
    due_keys = {}
    if due is not None:
        for k, b in zip(due.column("key").to_pylist(), due.column(BUCKET).to_pylist(), strict=True):
            due_keys[k] = b
    bucket_of.update(due_keys)
    keys_of = {key_json(k): k for k in by_key} | {k: tuple(json.loads(k)) for k in due_keys}
    held = pinned.states(buckets, keys_of)
    run = KeyedRun(factory, time_mode, watermark_ms, processing_ms)
    rows_of: dict[Key, list[tuple[str, str | None, int | None]]] = {}
    timers: dict[Key, set[int]] = {}
    for k, name, value, expires_ms in zip(
        held.column("key").to_pylist(),
        held.column("state").to_pylist(),
        held.column("value").to_pylist(),
        held.column("expires_ms").to_pylist(),
        strict=True,
    ):
        if name == TIMERS:
            if value is not None:
                timers[keys_of[k]] = set(json.loads(value))
        else:
            rows_of.setdefault(keys_of[k], []).append((name, value, expires_ms))
    states = {key: held_values(rows, run.codecs, run.expiry) for key, rows in rows_of.items()}
    held_timers = {keys_of[k]: timers.get(keys_of[k], set()) for k in keys_of}
    outcome = run.run(by_key, states, held_timers, newest_ms)
    if outcome.output:
        out = pd.concat(outcome.output, ignore_index=True)
        data = pa.Table.from_pandas(
            out, schema=schema.remove(schema.get_field_index(CHANGE)), preserve_index=False
        )
        yield from data.append_column(CHANGE, pa.nulls(data.num_rows, pa.string())).to_batches()
    changes = []
    for key, change in outcome.changes.items():
        k = key_json(key)
        for name, stored, expires_ms in run.stored(change):
            changes.append(
                {
                    "kind": "state",
                    "key": k,
                    "state": name,
                    "value": stored,
                    "expires_ms": expires_ms,
                    "_lowmark_bucket": bucket_of[k],
                }
            )
        if change.timers_set or change.timers_deleted:
            pending = sorted(outcome.timers.get(key, set()))
            changes.append(
                {
                    "kind": "state",
                    "key": k,
                    "state": TIMERS,
                    "value": json.dumps(pending) if pending else None,
                    "expires_ms": None,
                    "_lowmark_bucket": bucket_of[k],
                }
            )
        for timer_ms in change.timers_set:
            changes.append(
                {
                    "kind": "timer",
                    "key": k,
                    "timer_ms": timer_ms,
                    "pending": True,
                    "_lowmark_bucket": bucket_of[k],
                }
            )
        for timer_ms in change.timers_deleted:
            changes.append(
                {
                    "kind": "timer",
                    "key": k,
                    "timer_ms": timer_ms,
                    "pending": False,
                    "_lowmark_bucket": bucket_of[k],
                }
            )
    if changes:
        state_rows = [c | {"batch_id": batch_id} for c in changes if c["kind"] == "state"]
        timer_rows = [c | {"batch_id": batch_id} for c in changes if c["kind"] == "timer"]
        written = pinned.written(
            pa.Table.from_pylist(state_rows, schema=STATE),
            pa.Table.from_pylist(timer_rows, schema=TIMER_CHANGE),
            batch_id,
        )
        described = [
            json.dumps({"table": table, "file": f.as_dict()})
            for table, files in written.items()
            for f in files
        ]
        blank = {
            name: pa.nulls(len(described), schema.field(name).type)
            for name in schema.names
            if name != CHANGE
        }
        yield from pa.table(
            {**blank, CHANGE: pa.array(described, pa.string())},
            schema=schema,
        ).to_batches()  # none when nothing was written (a preview)
