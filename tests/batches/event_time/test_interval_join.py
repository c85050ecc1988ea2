"""The stream-stream join (``stream_join``): each batch's orders and payments meet each other
and the rows held from earlier batches. An inner join equals a plain Spark join over the
whole input; inner and left outer joins equal Structured Streaming's stream-stream join with
watermarks over the same batches; a run crashed at every step of a batch that matches, holds
and lets rows go ends like a run never crashed; held rows go once the watermark passes them."""

from __future__ import annotations

import math
import random
import re
import shutil
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pydantic import ValidationError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)
from pyspark.testing import assertDataFrameEqual

from lowmark.batches.collect import session_confs
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.event_time.interval_join import IntervalJoin
from lowmark.batches.json_rows import JSON_OPTIONS
from lowmark.batches.loop.faults import STEPS, KillPoint
from lowmark.batches.loop.maintenance import maintain_checkpoint
from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, DeltaSource, Pipeline, UnionSource
from lowmark.batches.sources.union import UnionStreamSource
from lowmark.batches.stream_join import JoinTime, StreamJoin
from lowmark.batches.windows import EventTime
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.join_state import JoinState
from tests.faults.harness import (
    Snapshot,
    an_hour_passes,
    differences,
    in_process_crash,
    run_with_crashes,
    snapshot,
)
from tests.helpers import JobCounter, counted_batch, delta_frame

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
ORDERS = pa.schema(
    [("order_id", pa.int64()), ("order_time", pa.timestamp("us", "UTC")), ("amount", pa.int64())]
)
PAYMENTS = pa.schema(
    [("order_id", pa.int64()), ("paid_at", pa.timestamp("us", "UTC")), ("paid", pa.int64())]
)


def at(minute: float) -> datetime:
    return T0 + timedelta(minutes=minute)


# Per batch: (orders, payments) as (order_id, minute, amount). Out of order within the
# 10 minutes' out-of-orderness, a payment before its order, one after the hour, a
# payment twice, keys on one side only (order 10, passed by the watermark before the end;
# order 11, not); nothing is behind the watermark.
BATCHES: list[tuple[list[tuple[int, float, int]], list[tuple[int, float, int]]]] = [
    ([(1, 0, 10), (2, 3, 20)], [(1, 5, 10)]),
    ([(3, 8, 30), (4, 2, 40)], [(2, 70, 20), (4, 9, 40), (9, 9, 90)]),
    ([(5, 20, 50)], [(3, 7, 30), (3, 30, 30), (5, 21, 50)]),
    ([(6, 40, 60), (1, 35, 11), (10, 50, 100)], [(1, 36, 11), (6, 95, 60)]),
    ([(7, 120, 70), (11, 150, 110)], [(7, 125, 70), (5, 118, 51)]),
    ([(8, 200, 80)], [(8, 201, 80)]),
]


def write_versions(input_root: Path) -> None:
    """The orders and payments tables, one Delta version per batch and side."""
    for orders, payments in BATCHES:
        for name, schema, rows in (("orders", ORDERS, orders), ("payments", PAYMENTS, payments)):
            table = pa.Table.from_pylist(
                [dict(zip(schema.names, (k, at(m), v), strict=True)) for k, m, v in rows],
                schema=schema,
            )
            write_deltalake(str(input_root / name), table, mode="append")


def joined(input_root: Path, how: str = "inner") -> Pipeline:
    def side(name: str) -> DeltaSource:
        path = str(input_root / name)
        return DeltaSource(path=path, starting_version="earliest", max_versions_per_batch=1)

    return Pipeline(
        name="orders_payments",
        source=UnionSource(sources={"orders": side("orders"), "payments": side("payments")}),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="order_time", max_out_of_orderness="10 minutes"),
        stream_join=StreamJoin(
            left="orders",
            right="payments",
            keys=("order_id",),
            how=how,
            time=JoinTime(left="order_time", right="paid_at", lower="0 s", upper="1 hour"),
        ),
    )


CONDITION = (
    "p.order_id = o.order_id AND p.paid_at BETWEEN o.order_time AND o.order_time + INTERVAL 1 HOUR"
)


def selected(joined: DataFrame, how: str) -> DataFrame:
    """The join's rows as lowmark writes them: the keys once, then each side's columns."""
    key = F.col("p.order_id") if how == "right" else F.col("o.order_id")
    return joined.select(key.alias("order_id"), "o.order_time", "o.amount", "p.paid_at", "p.paid")


def reference(spark: SparkSession, input_root: Path) -> DataFrame:
    """The inner join as one plain Spark batch over every record."""
    orders = spark.read.format("delta").load(str(input_root / "orders")).alias("o")
    payments = spark.read.format("delta").load(str(input_root / "payments")).alias("p")
    return selected(orders.join(payments, F.expr(CONDITION), "inner"), "inner")


def structured_streaming(spark: SparkSession, input_root: Path, out: Path, how: str) -> DataFrame:
    """The join as Structured Streaming runs it: each side a Delta stream taking one version
    per batch, with a 10 minutes' watermark on its event time, until both are drained (the
    batch with no data after the last one included)."""

    def side(name: str, column: str, alias: str) -> DataFrame:
        stream = spark.readStream.format("delta").option("maxFilesPerTrigger", 1)
        return stream.load(str(input_root / name)).withWatermark(column, "10 minutes").alias(alias)

    orders, payments = side("orders", "order_time", "o"), side("payments", "paid_at", "p")
    spark_how = {"left": "left_outer", "right": "right_outer"}.get(how, how)
    rows = selected(orders.join(payments, F.expr(CONDITION), spark_how), how)
    name = f"structured_streaming_{how}"
    query = (
        rows.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(out / "_checkpoint"))
        .start()
    )
    # Not `availableNow`, which ends without the batch with no data that a moved watermark
    # asks for; processAllAvailable may return before that batch ran: it is waited for.
    query.processAllAvailable()
    deadline = time.monotonic() + 120
    while not any(p["numInputRows"] == 0 and p["stateOperators"] for p in query.recentProgress):
        assert time.monotonic() < deadline, "Structured Streaming ran no batch without data"
        time.sleep(0.2)
    query.stop()
    return spark.table(name)


@dataclass(frozen=True)
class Run:
    root: Path
    results: list[BatchResult]
    tables: Snapshot


@pytest.fixture(scope="module")
def input_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("orders_payments")
    write_versions(root)
    return root


@pytest.fixture(scope="module")
def runs(
    spark: SparkSession, input_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Run]:
    """The fault-free run of each kind of join (``how``), run once."""
    done: dict[str, Run] = {}

    def run(how: str) -> Run:
        if how not in done:
            root = tmp_path_factory.mktemp(f"{how}_join")
            pipeline = joined(input_root, how)
            results = MicroBatchRunner(spark, pipeline, root).run(max_batches=None)
            done[how] = Run(root, results, snapshot(pipeline, root))
        return done[how]

    return run


def test_an_inner_join_over_several_batches_equals_one_spark_join_over_all_input(
    spark: SparkSession, input_root: Path, runs: Callable[[str], Run]
) -> None:
    run = runs("inner")
    # One batch per version of each side, then one with no input: the watermark moved.
    assert [r.rows_in for r in run.results][-1:] == [0]
    assert len(run.results) == len(BATCHES) + 1
    assert sum(r.rows_late for r in run.results) == 0
    assertDataFrameEqual(delta_frame(spark, run.root / "out"), reference(spark, input_root))


# `make test` compares the left outer join (the inner one is compared with a plain batch join
# above; the right outer join is the left one mirrored): both in `make test-integration`.
@pytest.mark.parametrize(
    "how",
    [
        pytest.param("inner", marks=pytest.mark.integration),
        "left",
        pytest.param("right", marks=pytest.mark.integration),
    ],
)
def test_a_join_equals_structured_streamings_stream_stream_join_with_watermarks(
    spark: SparkSession,
    input_root: Path,
    runs: Callable[[str], Run],
    tmp_path: Path,
    how: str,
) -> None:
    # An outer row is emitted once the watermark passes it, which both do in a batch of
    # their own when the input ends: the final results are compared.
    expected = structured_streaming(spark, input_root, tmp_path, how)
    got = delta_frame(spark, runs(how).root / "out")
    assertDataFrameEqual(got, expected)
    if how == "left":  # order 2 and 10 never paid in time; order 11 may still be
        lone = got.where(F.col("paid").isNull()).select("order_id")
        assertDataFrameEqual(lone, spark.createDataFrame([(2,), (10,)], "order_id LONG"))


def test_a_join_crashed_at_every_step_of_a_batch_ends_like_a_run_never_crashed(
    spark: SparkSession, input_root: Path, runs: Callable[[str], Run], data_root: Path
) -> None:
    # Batch 4 matches order 7 with its payment, holds rows and lets payments go (the
    # watermark is minute 30); batch 6 (no input) emits orders 2 and 10 with nulls.
    pipeline = joined(input_root, "left")
    schedule = [KillPoint(step, 4) for step in STEPS] + [KillPoint("after_sink", 6)]
    crashes = run_with_crashes(
        spark, pipeline, data_root, schedule, in_process_crash(spark, pipeline)
    )
    assert crashes == len(schedule)
    assert differences(runs("left").tables, snapshot(pipeline, data_root)) == []


def test_the_joined_rows_are_written_from_the_driver_and_a_batch_without_any_writes_none(
    runs: Callable[[str], Run],
) -> None:
    run = runs("inner")
    history = DeltaTable(str(run.root / "out")).history()
    # One delta-rs write per batch that joined rows (the first one creates the table), none
    # for the batch without input: no Spark write, whose job and commit a batch would pay.
    assert [r.rows_out > 0 for r in run.results] == [True] * len(BATCHES) + [False]
    assert len(history) == len(BATCHES)
    assert all(c.get("clientVersion", "").startswith("delta-rs") for c in history)


def test_held_rows_go_once_the_watermark_passes_them(runs: Callable[[str], Run]) -> None:
    path = runs("inner").root / "_lowmark/orders_payments/join_state"
    state = DeltaTable(str(path)).to_pyarrow_table()
    # The last batch (no input) has the watermark minute 200 - 10 = 190: orders before
    # minute 130 and payments before minute 190 can match nothing to come. Their slots are
    # deleted (ten minutes wide: the out-of-orderness); the rest are held.
    held = sorted((r["side"], (r["time_ms"] - T0_MS) / 60_000) for r in state.to_pylist())
    assert held == [("left", 150), ("left", 200), ("right", 201)]


def test_maintenance_vacuums_the_held_rows_the_watermark_passed(
    spark: SparkSession,
    input_root: Path,
    runs: Callable[[str], Run],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "maintained"
    shutil.copytree(runs("inner").root, root)
    checkpoint = root / "_lowmark/orders_payments"
    path = checkpoint / "join_state"
    done = Checkpoint(str(checkpoint), "orders_payments").commits.get_latest()
    assert done is not None
    held = DeltaTable(str(path)).to_pyarrow_table().sort_by("time_ms")
    files = len(list(path.rglob("*.parquet")))
    an_hour_passes(str(checkpoint), monkeypatch)

    assert maintain_checkpoint(spark, joined(input_root, "inner"), root) is not None

    # The files of the slots the watermark passed are gone from disk; the rows held, and
    # the version the last commit recorded, read as before.
    assert len(list(path.rglob("*.parquet"))) < files
    assert DeltaTable(str(path)).to_pyarrow_table().sort_by("time_ms") == held
    version = done.table_versions["join_state"]
    assert DeltaTable(str(path), version=version).to_pyarrow_table().sort_by("time_ms") == held


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"source": DeltaSource(path="orders")}, "make `source` a `kind: union`"),
        ({"stream_join": {"left": "orders", "right": "refunds"}}, "names ['refunds']"),
        ({"event_time": EventTime(column="paid_at")}, "`column: order_time`"),
        ({"transform": {"sql": "SELECT * FROM input"}}, "cannot have `transform`"),
    ],
)
def test_a_join_defined_wrong_is_refused_in_one_line_before_any_batch(
    tmp_path: Path, change: dict[str, Any], error: str
) -> None:
    pipeline = joined(tmp_path)
    assert pipeline.stream_join is not None
    definition = pipeline.model_dump() | change
    if "stream_join" in change:
        definition["stream_join"] = pipeline.stream_join.model_dump() | change["stream_join"]
    with pytest.raises(ValidationError, match=re.escape(error)) as refused:
        Pipeline.model_validate(definition)
    assert len(refused.value.errors()) == 1


def test_sides_with_another_column_of_the_same_name_are_refused_in_one_line(
    tmp_path: Path,
) -> None:
    source = UnionStreamSource({}, {})
    join = IntervalJoin(
        joined(tmp_path).stream_join,  # type: ignore[arg-type]
        EventTime(column="order_time"),
        source,
        JoinState(str(tmp_path / "state"), "app:join_state", 60_000),
        {},
    )

    def side(time: str) -> StructType:
        names = ("order_id", time, "amount")
        types = (LongType(), TimestampType(), LongType())
        return StructType([StructField(n, t) for n, t in zip(names, types, strict=True)])

    source.schemas = {"orders": side("order_time"), "payments": side("paid_at")}
    with pytest.raises(PipelineConfigInvalid, match=r"both sides of the join have \['amount'\]"):
        join.sides()


# Every column type the joined rows are parsed on the driver from (``json_rows``), with the
# values whose JSON text is the hardest to read back: extremes of each integer, floats and
# doubles of random bits (every decimal text Java writes for them), decimals of several
# scales (Java writes some as `0E-18`), timestamps to the microsecond before 1970, in year 1
# and 9999, local times, unicode and escaped text, a row longer than Arrow's JSON block.
EVERY_TYPE = StructType(
    [
        StructField("order_id", LongType(), nullable=False),  # nullable in the joined rows
        StructField("order_time", TimestampType()),
        StructField("note", StringType()),
        StructField("flag", BooleanType()),
        StructField("tiny", ByteType()),
        StructField("small", ShortType()),
        StructField("int", IntegerType()),
        StructField("ratio", FloatType()),
        StructField("share", DoubleType()),
        StructField("whole", DecimalType(10, 0)),
        StructField("cents", DecimalType(7, 5)),
        StructField("wide", DecimalType(38, 18)),
        StructField("day", DateType()),
        StructField("local", TimestampNTZType()),
    ]
)
PAID = StructType(
    [
        StructField("order_id", LongType(), nullable=False),
        StructField("paid_at", TimestampType()),
        StructField("paid", DecimalType(12, 2)),
        StructField("by", StringType()),
    ]
)


def every_type_rows(n: int) -> list[tuple[Any, ...]]:
    rng = random.Random(7)

    def finite(bits: int, fmt: str) -> float:
        while True:
            value: float = struct.unpack(fmt, rng.getrandbits(bits).to_bytes(bits // 8))[0]
            if math.isfinite(value):
                return value

    def micros(low: datetime, high: datetime) -> timedelta:
        return timedelta(microseconds=rng.randrange(int((high - low).total_seconds() * 1e6)))

    first = datetime(1, 1, 1)
    last = datetime(9999, 12, 31, 23, 59, 59, 999999)
    # The last instant every time zone writes in year 9999 (a later one is year 10000 east
    # of UTC, which Arrow does not read: the Spark job parses it).
    latest = datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=UTC)
    extremes = [
        (1, T0, "naïve \"quoted\" \\ tab\t new\nline \u2028 😀 漢字", True, -128, -32768,
         -(2**31), 1.1, 0.1, Decimal("-9999999999"), Decimal("0.00001"),
         Decimal("-12345678901234567890.123456789012345678"), date(1, 1, 1),
         first),
        (2, first.replace(tzinfo=UTC), "", False, 127, 32767, 2**31 - 1, -0.0,
         5e-324, Decimal("0"), Decimal("-0.00000"), Decimal("0E-18"), date(9999, 12, 31),
         last),
        (3, datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), "x" * (3 << 19), None,
         0, 0, 0, 3.4028235e38, 1.7976931348623157e308, Decimal("1"), Decimal("0.12345"),
         Decimal("1E-18"), date(1582, 10, 4), datetime(1900, 1, 1, 0, 0, 0, 1)),
        (4, latest, None, None, None, None, None, None, None, None, None,
         None, None, None),
    ]  # fmt: skip
    return extremes + [
        (
            i,
            first.replace(tzinfo=UTC) + micros(first, latest.replace(tzinfo=None)),
            "".join(
                chr(rng.choice([rng.randrange(32, 127), rng.randrange(160, 0x2FFF)]))
                for _ in range(rng.randrange(12))
            ),
            rng.random() < 0.5,
            rng.randrange(-128, 128),
            rng.randrange(-(2**15), 2**15),
            rng.randrange(-(2**31), 2**31),
            finite(32, ">f"),
            finite(64, ">d"),
            Decimal(rng.randrange(-(10**10) + 1, 10**10)),
            Decimal(rng.randrange(-(10**7) + 1, 10**7)).scaleb(-5),
            Decimal(rng.randrange(-(10**38) + 1, 10**38)).scaleb(-18),
            date(1, 1, 1) + timedelta(days=rng.randrange(3_652_059)),
            first + micros(first, last),
        )
        for i in range(5, n + 1)
    ]


def as_json(spark: SparkSession, rows: list[tuple[Any, ...]], schema: StructType) -> list[str]:
    """``rows`` of ``schema`` as the join holds them: Spark's JSON of each."""
    frame = spark.createDataFrame(rows, schema)
    text = F.to_json(F.struct(*[F.col(c) for c in schema.fieldNames()]), JSON_OPTIONS)
    return [r[0] for r in frame.select(text).collect()]


def join_of(tmp_path: Path, how: str, left: StructType, right: StructType) -> IntervalJoin:
    source = UnionStreamSource({}, {})
    join = IntervalJoin(
        joined(tmp_path, how).stream_join,  # type: ignore[arg-type]
        EventTime(column="order_time"),
        source,
        JoinState(str(tmp_path / "state"), "app:join_state", 60_000),
        {},
    )
    source.schemas = {"orders": left, "payments": right}
    return join


PAIRS = pa.schema([("left_row", pa.string()), ("right_row", pa.string())])


def pairs_of(lefts: Sequence[str | None], rights: Sequence[str | None]) -> pa.Table:
    return pa.table({"left_row": lefts, "right_row": rights}, schema=PAIRS)


# Under a session time zone other than UTC, Spark writes each timestamp with its offset
# (`+05:30`, or `-04:56` for New York before 1883).
@pytest.mark.parametrize(
    ("how", "zone"), [("inner", "UTC"), ("left", "America/New_York"), ("right", "Asia/Kolkata")]
)
def test_the_joined_rows_parsed_on_the_driver_are_the_spark_jobs_for_every_column_type(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, zone: str
) -> None:
    with session_confs(spark, {"spark.sql.session.timeZone": zone}):
        orders = as_json(spark, every_type_rows(400), EVERY_TYPE)
        paid = [
            (i, T0 + timedelta(microseconds=i), Decimal(i).scaleb(-2), "pé" * i) for i in range(300)
        ]
        payments = as_json(spark, paid, PAID)
        # Matched pairs, then outer rows of either side (a side missing: null).
        pairs = pairs_of(
            [*orders[:300], *orders[300:], *[None] * 20],
            [*payments, *[None] * 100, *payments[:20]],
        )
        join = join_of(tmp_path, how, EVERY_TYPE, PAID)

        counter = JobCounter(spark)
        with counter.counting(monkeypatch):
            got = join.output(spark, pairs)
        by_spark = join.output_by_spark(spark, pairs)
        none = pairs_of([], [])
        empty, empty_by_spark = join.output(spark, none), join.output_by_spark(spark, none)

    assert counter.jobs() == 0  # parsed on the driver
    assert got.schema == by_spark.schema
    assert got.equals(by_spark)
    assert got.num_rows == 420
    assert got.column_names == [
        "order_id", *EVERY_TYPE.fieldNames()[1:], *PAID.fieldNames()[1:]
    ]  # fmt: skip
    assert empty.equals(empty_by_spark)  # a batch that joins nothing: the same columns


def test_joined_rows_arrow_cannot_read_or_of_a_type_it_does_not_take_are_parsed_by_spark(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A NaN or an infinity Spark writes as a string; arrays and structs are not taken.
    nan = [(1, T0, None, None, None, None, None, None, math.nan, *[None] * 5),
           (2, T0, None, None, None, None, None, float("-inf"), math.inf, *[None] * 5)]  # fmt: skip
    nested = StructType(
        [
            *PAID.fields,
            StructField("tags", ArrayType(StringType())),
            StructField("card", StructType([StructField("last4", StringType())])),
        ]
    )
    paid = [(1, T0, Decimal("1.50"), "a", ["x", None], ("4242",)), (2, T0, None, None, [], None)]
    pairs = pairs_of(as_json(spark, nan, EVERY_TYPE), as_json(spark, paid, nested))
    for right in (PAID, nested):
        counter = JobCounter(spark)
        with counter.counting(monkeypatch):
            got = join_of(tmp_path, "inner", EVERY_TYPE, right).output(spark, pairs)
        assert counter.jobs() == 1
        share = got.column("share").to_pylist()
        assert got.column("ratio").to_pylist() == [None, -math.inf]
        assert math.isnan(share[0]) and share[1] == math.inf
        assert got.column("paid").to_pylist() == [Decimal("1.50"), None]
    got = join_of(tmp_path, "inner", EVERY_TYPE, nested).output(spark, pairs)
    assert got.column("tags").to_pylist() == [["x", None], []]
    assert got.column("card").to_pylist() == [{"last4": "4242"}, None]


def test_a_small_join_batch_runs_its_look_and_no_spark_job_to_parse_its_joined_rows(
    spark: SparkSession, input_root: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = MicroBatchRunner(spark, joined(input_root, "left"), data_root)
    runner.run_batch()  # the first batch creates the sink and the join state
    result, counter = counted_batch(spark, runner, monkeypatch)
    assert result.rows_out > 0  # order 2's payment joins in batch 1
    # The look over the batch's input (counts, max event times, the join's records), and
    # nothing else: the join, its state, its sink and the commit are on the driver.
    assert counter.jobs() == 1, counter.per_step
