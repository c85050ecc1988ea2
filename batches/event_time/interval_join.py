"""The stream-stream join of a batch: new rows against each other and against held rows.

Structured Streaming's stream-stream join with watermarks, per batch N with
watermark W (``lowmark.batches.stream_join`` for the declaration):

1. The batch's records of both sides are collected (one Spark job over the
   cached input), each as (side, key, event time, row as JSON, own clock,
   ingestion time). A record with no event time, from beyond ``max_future``
   (``stage.future_of``), or below W is late: it goes to the late table,
   never into the join. A record of a partition that
   follows ingestion time is also late below its own clock (its ingestion time
   minus the lag, ``own_ingestion_clock``): every batch that may take it has a
   W at or below that clock, so whether it joins is a function of the input
   alone, and so is every pair and every outer row (a row held is evicted
   only once every row that can still join has a time past its bound).
2. New left rows are joined with the held right rows and the new right rows,
   and the held left rows with the new right rows, on the keys and the time
   bound (on the driver, in Arrow: the held rows are read as of commit N-1,
   only those of the new rows' keys and of the time range they can match).
3. A left row can match no row to come once ``W > time + upper``; a right row
   once ``W > time - lower`` (rows to come are at or above W). Such rows are
   not held (new ones) or stop being held (their slots are deleted). An outer
   join's preserved side emits those that never matched, once, with nulls
   (a held row is marked ``evicted`` in the batch that emits it).
4. The rest of the new rows are held (``lowmark.state.join_state``), and an
   outer join's held rows that matched for the first time are marked
   ``matched``: the batch's state rows, appended in one idempotent commit.

The output (matched pairs, then the outer rows) is the two sides' columns,
parsed back from the JSON on the driver, in Arrow (``lowmark.batches.json_rows``),
when every column of both sides is of a type ``json_rows.parsed_on_driver``
takes (strings, booleans, numbers, decimals, dates, timestamps) and Arrow's
reader takes every row (not a NaN or infinite float: Spark writes those as
strings); otherwise by one Spark job over local data (``output_by_spark``),
collected as Arrow. The two give the same table. The sink writes it from the
driver (append), as a windowed pipeline's windows.
A replay reads the same input and the same held rows, so it computes the same
output, state rows and late rows, and each write lands once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from lowmark.batches.collect import arrow_schema, collect, to_frame
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.event_time.stage import (
    FUTURE,
    FUTURE_WHEN_INGESTED,
    LATE_RECORD,
    UNTIMED,
    late_table,
)
from lowmark.batches.json_rows import JSON_OPTIONS, parsed, parsed_on_driver
from lowmark.batches.records import (
    INGESTED_COLUMN,
    INTERNAL_COLUMNS,
    PARTITION_COLUMN,
    own_ingestion_clock,
)
from lowmark.batches.sources.union import SEPARATOR, UnionStreamSource
from lowmark.batches.stream_join import StreamJoin
from lowmark.batches.windows import EventTime
from lowmark.state.join_state import ROWS, JoinState

BEHIND = "event time below the watermark: a stream-stream join has passed it"
BEHIND_WHEN_INGESTED = (
    "event time below the clock when it was ingested: ingestion time - max_event_time_lag"
)
LEFT, RIGHT = "left", "right"
_NEW = pa.schema(
    [
        ("side", pa.string()),
        ("key", pa.string()),
        ("time_ms", pa.int64()),
        ("row", pa.string()),
        ("own_ms", pa.int64()),
        ("ingested_ms", pa.int64()),
    ]
)
_HELD = ["side", "key", "time_ms", "row"]
_PAIRS = StructType([StructField("left_row", StringType()), StructField("right_row", StringType())])


@dataclass(frozen=True)
class Joined:
    """What a batch's join gives; nothing is written yet."""

    output: pa.Table
    """The rows for the sink."""
    rows_out: int
    records: int
    """The records the join took (the batch's records that were not late)."""
    late: pa.Table | None
    """The late records, as rows of the late table."""
    state: pa.Table
    """The ``join_state`` rows to append (``ROWS``)."""
    evict_below: dict[str, int]
    """Per side, the event time below which its rows can match no row to come."""


class IntervalJoin:
    """The stream-stream join of a pipeline (``StreamJoin``) over its union's two sources."""

    def __init__(
        self,
        config: StreamJoin,
        event_time: EventTime,
        source: UnionStreamSource,
        state: JoinState,
        lags: Mapping[str, int],
    ) -> None:
        """``lags``: the maximum event-time lag of the partitions that follow ingestion time,
        by the prefix of their names (``IngestionLags.by_prefix``)."""
        self.config = config
        self.event_time = event_time
        self.source = source
        self.state = state
        self.lags = lags
        source.join_sides()

    def timed(self, records: DataFrame) -> DataFrame:
        """``records`` (the union's) with each side's event time in the event-time column
        (the left side's: ``event_time.column``), as the watermark reads it."""
        right = F.col(self.config.time.right)
        return records.withColumn(
            self.event_time.column,
            F.when(self._side() == RIGHT, right).otherwise(F.col(self.config.time.left)),
        )

    def records(self, records: DataFrame) -> DataFrame:
        """``records`` as the join takes them: ``side``, ``key`` (the keys as JSON; null when
        one is null), ``time_ms``, ``row`` (the side's columns as JSON) and ``own_ms`` (the
        record's own clock; null when it has none: its partition follows event time, its
        source cannot tell, or the transform dropped its ingestion time) and ``ingested_ms``
        (its ingestion time, null likewise)."""
        left, right = self.sides()
        side = self._side()
        keys = [F.col(k) for k in self.config.keys]
        null_key = F.lit(False)
        for k in keys:
            null_key = null_key | k.isNull()
        time = self.config.time
        carried = INGESTED_COLUMN in records.columns
        own = own_ingestion_clock(self.lags) if carried else None
        ingested = F.col(INGESTED_COLUMN) if carried else F.lit(None)

        def row(schema: StructType) -> Column:
            return F.to_json(
                F.struct(*[F.col(f"`{c}`") for c in schema.fieldNames()]), JSON_OPTIONS
            )

        return records.select(
            side.alias("side"),
            F.when(~null_key, F.to_json(F.struct(*keys))).alias("key"),
            F.when(side == LEFT, F.unix_millis(F.col(time.left)))
            .otherwise(F.unix_millis(F.col(time.right)))
            .alias("time_ms"),
            F.when(side == LEFT, row(left)).otherwise(row(right)).alias("row"),
            (own if own is not None else F.lit(None)).cast("long").alias("own_ms"),
            ingested.cast("long").alias("ingested_ms"),
        )

    def _side(self) -> Column:
        right = F.lit(self.config.right + SEPARATOR)
        return F.when(F.col(PARTITION_COLUMN).startswith(right), RIGHT).otherwise(LEFT)

    def sides(self) -> tuple[StructType, StructType]:
        """The left and the right side's columns (of the union's last read), checked: each
        has the keys and its time column, and no other column of the same name."""
        schemas = {
            name: StructType([f for f in s.fields if f.name not in INTERNAL_COLUMNS])
            for name, s in self.source.schemas.items()
        }
        config = self.config
        left, right = schemas[config.left], schemas[config.right]
        for name, schema, time in (
            (config.left, left, config.time.left),
            (config.right, right, config.time.right),
        ):
            missing = [c for c in (*config.keys, time) if c not in schema.fieldNames()]
            if missing:
                raise PipelineConfigInvalid(
                    f"the join's side {name} lacks {missing} (it has {schema.fieldNames()}): "
                    "fix `stream_join`, or give the side a transform in the union's `transforms`"
                )
        shared = sorted(set(left.fieldNames()) & set(right.fieldNames()) - set(config.keys))
        if shared:
            raise PipelineConfigInvalid(
                f"both sides of the join have {shared}, which are no join keys: rename them on "
                "one side (a transform in the union's `transforms`)"
            )
        return left, right

    def joined(
        self,
        spark: SparkSession,
        new: pa.Table,
        batch_id: int,
        watermark_ms: int | None,
        now_ms: int,
        version: int,
    ) -> Joined:
        """Steps 1-4 (the module's docstring) for batch ``batch_id`` over its records ``new``
        (``records``, collected), under ``watermark_ms``, at processing time ``now_ms``, with
        the held rows as of ``version`` of the state table."""
        new = new.select(_NEW.names).cast(_NEW)
        kept, late = self._late(new, watermark_ms, now_ms)
        kept = kept.sort_by([("side", "ascending"), ("key", "ascending"),
                             ("time_ms", "ascending"), ("row", "ascending")])  # fmt: skip
        n = kept.num_rows
        kept = pa.table(
            {
                **{c: kept.column(c) for c in _HELD},
                "row_id": pa.array([f"{batch_id}:{i}" for i in range(n)], pa.string()),
                "matched": pa.array([False] * n, pa.bool_()),
                "evicted": pa.array([False] * n, pa.bool_()),
                "batch_id": pa.array([batch_id] * n, pa.int64()),
            },
            schema=ROWS,
        )
        new_left = kept.filter(pc.equal(kept.column("side"), LEFT))
        new_right = kept.filter(pc.equal(kept.column("side"), RIGHT))
        time = self.config.time
        held_right = self._candidates(RIGHT, new_left, time.lower, time.upper, version)
        held_left = self._candidates(LEFT, new_right, -time.upper, -time.lower, version)
        pairs = pa.concat_tables(
            [
                self._matches(new_left, pa.concat_tables([held_right, new_right])),
                self._matches(held_left, new_right),
            ]
        )
        evict_below = (
            {}
            if watermark_ms is None
            else {LEFT: watermark_ms - time.upper, RIGHT: watermark_ms + time.lower}
        )

        def passed(rows: pa.Table, side: str) -> pa.Array:
            if side not in evict_below:
                return pa.array([False] * rows.num_rows, pa.bool_())
            return pc.less(rows.column("time_ms"), evict_below[side])

        stored = [
            rows.filter(pc.invert(passed(rows, side)))
            for rows, side in ((new_left, LEFT), (new_right, RIGHT))
        ]
        outer: list[pa.Table] = []
        how = self.config.how
        if how != "inner":
            kept_side = LEFT if how == "left" else RIGHT
            new_kept, held_kept = (
                (new_left, held_left) if how == "left" else (new_right, held_right)
            )
            matched_now = pc.unique(pairs.column(f"{kept_side}_id"))
            was_matched = pc.is_in(new_kept.column("row_id"), value_set=matched_now)
            new_kept = new_kept.set_column(
                new_kept.schema.get_field_index("matched"), "matched", was_matched
            ).cast(ROWS)
            unmatched_now = new_kept.filter(pc.invert(was_matched))
            outer.append(unmatched_now.filter(passed(unmatched_now, kept_side)))
            stored[0 if how == "left" else 1] = new_kept.filter(
                pc.invert(passed(new_kept, kept_side))
            )
            first_match = held_kept.filter(
                pc.and_(
                    pc.invert(held_kept.column("matched")),
                    pc.is_in(held_kept.column("row_id"), value_set=matched_now),
                )
            )
            stored.append(_versions(first_match, batch_id, matched=True))
            if kept_side in evict_below:
                gone = self.state.passed(kept_side, evict_below[kept_side], version)
                gone = gone.filter(
                    pc.invert(pc.is_in(gone.column("row_id"), value_set=matched_now))
                )
                outer.append(gone)
                stored.append(_versions(gone, batch_id, evicted=True))
        emitted = pa.concat_tables(outer) if outer else ROWS.empty_table()
        side_of_outer = how == "right"
        lone = pa.table(
            {
                "left_row": pa.nulls(emitted.num_rows, pa.string())
                if side_of_outer
                else emitted.column("row"),
                "right_row": emitted.column("row")
                if side_of_outer
                else pa.nulls(emitted.num_rows, pa.string()),
            }
        )
        out = pa.concat_tables(
            [pairs.select(["left_row", "right_row"]).cast(lone.schema), lone.cast(lone.schema)]
        )
        return Joined(
            self.output(spark, out),
            out.num_rows,
            kept.num_rows,
            late_table(late, batch_id, watermark_ms) if late is not None else None,
            pa.concat_tables([s.select(ROWS.names).cast(ROWS) for s in stored]),
            evict_below,
        )

    def _late(
        self, new: pa.Table, watermark_ms: int | None, now_ms: int
    ) -> tuple[pa.Table, pa.Table | None]:
        """``new`` split into the records the join takes and the late ones (``LATE_RECORD``s):
        no event time, from beyond ``max_future`` (after its own ingestion time where it has
        one, else after ``now_ms``: ``stage.future_of``), below the record's own clock, or
        below ``watermark_ms``, the first reason that holds."""
        times, ingested = new.column("time_ms"), new.column("ingested_ms")
        none = pa.array([False] * new.num_rows, pa.bool_())
        untimed = pc.is_null(times)
        judged_at = pc.fill_null(ingested, now_ms)
        future = pc.fill_null(
            pc.greater(times, pc.add(judged_at, self.event_time.max_future)), False
        )
        own = pc.fill_null(pc.less(times, new.column("own_ms")), False)
        behind = (
            pc.fill_null(pc.less(times, watermark_ms), False) if watermark_ms is not None else none
        )
        is_late = pc.or_(pc.or_(untimed, future), pc.or_(own, behind))
        if not pc.any(is_late).as_py():
            return new, None
        conditions = [untimed, pc.and_(future, pc.is_valid(ingested)), future, own]
        reason = pc.case_when(
            pc.make_struct(*conditions, field_names=["untimed", "ingested", "future", "own"]),
            UNTIMED,
            FUTURE_WHEN_INGESTED,
            FUTURE,
            BEHIND_WHEN_INGESTED,
            BEHIND,
        ).filter(is_late)
        late = new.filter(is_late)
        records = pa.table(
            {
                "event_us": pc.multiply(late.column("time_ms"), 1000),
                "reason": reason,
                "record": late.column("row"),
            },
            schema=LATE_RECORD,
        )
        return new.filter(pc.invert(is_late)), records

    def _candidates(
        self, side: str, new: pa.Table, after_ms: int, until_ms: int, version: int
    ) -> pa.Table:
        """The held rows of ``side`` that ``new`` rows of the other side can match: of their
        keys, within ``[min time + after_ms, max time + until_ms]``."""
        keys = pc.unique(new.column("key").drop_null())
        if not len(keys):
            return ROWS.empty_table()
        bounds = pc.min_max(new.column("time_ms"))
        lo, hi = bounds["min"].as_py() + after_ms, bounds["max"].as_py() + until_ms
        return self.state.candidates(side, keys, lo, hi, version)

    def _matches(self, left: pa.Table, right: pa.Table) -> pa.Table:
        """The pairs of ``left`` and ``right`` rows with equal keys within the time bound:
        ``left_id``, ``left_row``, ``right_id``, ``right_row``."""
        names = ["key", "time_ms", "row", "row_id"]
        lhs = left.select(names).rename_columns(["key", "left_ms", "left_row", "left_id"])
        rhs = right.select(names).rename_columns(["key", "right_ms", "right_row", "right_id"])
        lhs = lhs.filter(pc.is_valid(lhs.column("key")))
        rhs = rhs.filter(pc.is_valid(rhs.column("key")))
        if not lhs.num_rows or not rhs.num_rows:
            empty = pa.schema([("left_id", pa.string()), ("left_row", pa.string()),
                               ("right_id", pa.string()), ("right_row", pa.string())])  # fmt: skip
            return empty.empty_table()
        pairs = lhs.join(rhs, keys="key", join_type="inner")
        time = self.config.time
        lower = pc.add(pairs.column("left_ms"), time.lower)
        upper = pc.add(pairs.column("left_ms"), time.upper)
        within = pc.and_(
            pc.greater_equal(pairs.column("right_ms"), lower),
            pc.less_equal(pairs.column("right_ms"), upper),
        )
        return pairs.filter(within).select(["left_id", "left_row", "right_id", "right_row"])

    def output(self, spark: SparkSession, pairs: pa.Table) -> pa.Table:
        """``pairs`` (``left_row`` and ``right_row`` as JSON, null for an outer row's missing
        side) as the joined rows (``_columns``), parsed on the driver (``json_rows``) when
        both sides' columns are ``parsed_on_driver`` and Arrow's reader takes every row; else
        by one Spark job (``output_by_spark``)."""
        left, right = self.sides()
        if parsed_on_driver(left) and parsed_on_driver(right):
            lhs = parsed(pairs.column("left_row"), arrow_schema(spark, left))
            rhs = parsed(pairs.column("right_row"), arrow_schema(spark, right))
            if lhs is not None and rhs is not None:
                sides, columns = {"l": lhs, "r": rhs}, self._columns(left, right)
                return pa.table(
                    [sides[s].column(c) for s, c in columns], names=[c for _, c in columns]
                )
        return self.output_by_spark(spark, pairs)

    def output_by_spark(self, spark: SparkSession, pairs: pa.Table) -> pa.Table:
        """``output`` by one Spark job over ``pairs`` as local data: any column type, any row."""
        left, right = self.sides()
        # One chunk: a local frame of a table of several chunks was seen to hold only the
        # first one's rows (the pairs', not the outer rows' after them).
        frame = to_frame(spark, pairs.combine_chunks(), _PAIRS)
        rows = frame.select(
            F.from_json("left_row", left, JSON_OPTIONS).alias("l"),
            F.from_json("right_row", right, JSON_OPTIONS).alias("r"),
        ).select(*[F.col(f"{s}.`{c}`").alias(c) for s, c in self._columns(left, right)])
        return collect({"output": rows})["output"]

    def _columns(self, left: StructType, right: StructType) -> list[tuple[str, str]]:
        """The joined rows' columns, each as (side: ``l`` or ``r``, name): the keys (of the
        preserved side), the left's other columns, the right's."""
        on = self.config.keys
        keyed_by = "r" if self.config.how == "right" else "l"
        return [
            *[(keyed_by, k) for k in on],
            *[("l", c) for c in left.fieldNames() if c not in on],
            *[("r", c) for c in right.fieldNames() if c not in on],
        ]


def _versions(rows: pa.Table, batch_id: int, **flags: bool) -> pa.Table:
    """New versions of held ``rows``, written by batch ``batch_id``, with ``flags`` set."""
    for name, value in flags.items():
        rows = rows.set_column(
            rows.schema.get_field_index(name), name, pa.array([value] * rows.num_rows, pa.bool_())
        )
    batch = pa.array([batch_id] * rows.num_rows, pa.int64())
    return rows.set_column(rows.schema.get_field_index("batch_id"), "batch_id", batch).cast(ROWS)
