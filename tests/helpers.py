"""Builders shared by the tests: pipelines, input files, a fake clock, reference results.

Also the CLI run in-process. Test modules import them from here, never from each other.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsDeltaTable
from hypothesis import HealthCheck, settings
from prometheus_client.parser import text_string_to_metric_families
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from lowmark.batches.cli import commands
from lowmark.batches.clock import Clock
from lowmark.batches.loop import faults
from lowmark.batches.loop.events import BatchFailure, BatchStarted, RunTerminated
from lowmark.batches.loop.listeners import PipelineListener
from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
from lowmark.batches.pipeline import CustomSink, DeltaSink, FileSource, Pipeline
from lowmark.batches.sources.base import Range, Source, SourceRead
from lowmark.batches.windows import (
    Aggregate,
    EventTime,
    Session,
    Sliding,
    Tumbling,
    WindowedAggregation,
)
from lowmark.orchestration.cli import report_to_dagster
from lowmark.state.checkpoint import Checkpoint
from lowmark.state.delta import STATE_JOB_GROUP
from lowmark.state.offset_log import OffsetEntry, Offsets

if TYPE_CHECKING:
    from lowmark.batches.loop.listeners import Event

T0_MS = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)


INTERPRETED = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
"""Spark confs of the suite's session and of the crash tests' `lowmark` processes: queries
are evaluated without generating code. For batches of a few rows, compiling generated code
costs more than it saves (about a fifth of the tests' Spark time); results do not depend on
it. Spark's defaults run in the demo, the benchmarks, the Dagster tests' runs and the other
`lowmark` processes tests start."""


AGGREGATES = (
    Aggregate(fn="count"),
    Aggregate(fn="sum", column="amount"),
    Aggregate(fn="min", column="amount"),
    Aggregate(fn="max", column="amount"),
    Aggregate(fn="avg", column="amount"),
)


_groups = itertools.count()


class JobCounter:
    """Spark jobs started by this thread while counting, in total and per batch step."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.group = f"count-{next(_groups)}"
        self.per_step: dict[str, int] = {}

    def jobs(self) -> int:
        tracker = self.spark.sparkContext.statusTracker()
        return len(tracker.getJobIdsForGroup(self.group))

    def stages(self) -> int:
        """The stages of the jobs counted (a shuffle is one stage more)."""
        tracker = self.spark.sparkContext.statusTracker()
        infos = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(self.group)]
        return sum(len(info.stageIds) for info in infos if info is not None)

    @contextmanager
    def counting(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        """Count the jobs of the block; ``faults.reached`` marks where each step ends."""
        self.per_step = {}
        last = [0]

        def reached(step: str, batch_id: int) -> None:
            now = self.jobs()
            self.per_step[step] = now - last[0]
            last[0] = now

        self.spark.sparkContext.setJobGroup(self.group, "a counted batch")
        monkeypatch.setattr(faults, "reached", reached)
        try:
            yield
        finally:
            monkeypatch.undo()
            self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        self.per_step["rest"] = self.jobs() - last[0]


def per_unit(df: DataFrame) -> DataFrame:
    """Fails a batch with a record whose amount is 0 (ANSI division by zero)."""
    return df.withColumn("per_unit", F.lit(100) / F.col("amount"))


def double_amount(df: DataFrame) -> DataFrame:
    return df.withColumn("amount", F.col("amount") * 2)


def pipeline(**overrides: Any) -> Pipeline:
    fields: dict[str, Any] = {
        "name": "t",
        "source": FileSource(path="in", format="json", schema_ddl="id LONG, amount LONG"),
        "sink": DeltaSink(path="out"),
    }
    fields.update(overrides)
    return Pipeline(**fields)


def amount_as_seconds(df: DataFrame) -> DataFrame:
    """``drop_file``'s records with an event time: ``amount`` seconds after the epoch."""
    return df.withColumn("ts", F.timestamp_seconds("amount"))


def counted_per_window(**overrides: Any) -> Pipeline:
    """``pipeline`` with windows: records per id in 10-second windows of ``ts``, upserted
    (update mode: every window a batch changes is written at once)."""
    windows: dict[str, Any] = {
        "transform": amount_as_seconds,
        "event_time": EventTime(column="ts"),
        "aggregation": WindowedAggregation(
            keys=("id",),
            window=Tumbling(size="10 seconds"),
            aggregates=(Aggregate(fn="count"),),
            output_mode="update",
        ),
    }
    return pipeline(**(windows | overrides))


def drop_file(root: Path, index: int, rows: int = 3) -> Path:
    """File ``index`` holds ids index*100 .. index*100+rows-1; mtimes follow ``index``."""
    records = [{"id": index * 100 + i, "amount": i} for i in range(rows)]
    return write_json_lines(root / "in", f"f{index:03d}.json", records, 1_700_000_000 + index)


def delta_frame(spark: SparkSession, path: str | Path) -> DataFrame:
    """The Delta table at ``path`` as a Spark DataFrame, read by delta-rs (an independent
    reader of the Delta protocol): a Spark read of a table new to the session replays its
    log in Spark jobs, about 1 s, and every test's tables are new (the suite read hundreds)."""
    return spark.createDataFrame(RsDeltaTable(str(path)).to_pyarrow_table())


def sink_ids(spark: SparkSession, root: Path, table: str = "out") -> list[int]:
    df = delta_frame(spark, str(root / table))
    return sorted(r["id"] for r in df.select("id").collect())


def per_window(df: DataFrame, key: str, window: Column, *aggregates: Column) -> DataFrame:
    """A plain Spark batch's windowed aggregation of ``df``, shaped as lowmark's sink:
    ``key``, ``window_start``, ``window_end``, then the (aliased) ``aggregates``."""
    out = df.groupBy(key, window.alias("w")).agg(*aggregates)
    return out.select(
        key,
        F.col("w.start").alias("window_start"),
        F.col("w.end").alias("window_end"),
        *[c for c in out.columns if c not in (key, "w")],
    )


def append_events(spark: SparkSession, table: Path, events: list[dict[str, Any]]) -> None:
    """Append ``events`` (``user``, ``ts`` as ISO text, ``amount``) to the Delta table
    ``table`` as one version."""
    rows = [(e["user"], datetime.fromisoformat(e["ts"]), e["amount"]) for e in events]
    df = spark.createDataFrame(rows, "user STRING, ts TIMESTAMP, amount LONG")
    df.write.format("delta").mode("append").save(str(table))


def vacuum_every_version(spark: SparkSession, table: Path) -> None:
    """OPTIMIZE the Delta table ``table`` into new files, then VACUUM with no retention: the
    files every earlier version added are gone."""
    spark.sql(f"OPTIMIZE delta.`{table}`")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{table}` RETAIN 0 HOURS")
    finally:
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "true")


def forget_start_offsets(checkpoint: Checkpoint) -> None:
    """Make ``checkpoint`` look as one written before it recorded where batch 0 started."""
    rows = pa.Table.from_pylist(
        [{"pipeline_id": checkpoint.pipeline_id, "start_offsets": None}],
        schema=pa.schema([("pipeline_id", pa.string()), ("start_offsets", pa.string())]),
    )
    checkpoint.metadata.update(rows, "pipeline_id", 0)


class FlakyReads(Source):
    """``inner``, whose first ``failures`` reads raise ``error`` (a broker away for a
    while); everything else is ``inner``'s."""

    def __init__(self, inner: Source, failures: int, error: Exception) -> None:
        self.inner = inner
        self.failures = failures
        self.error = error
        self.reads = 0

    def read(
        self,
        start: Offsets,
        end: Offsets,
        batch_id: int,
        cache: bool = False,
        strict: bool = False,
    ) -> SourceRead:
        self.reads += 1
        if self.reads <= self.failures:
            raise self.error
        return self.inner.read(start, end, batch_id, cache, strict)

    def initial_offsets(self) -> Offsets:
        return self.inner.initial_offsets()

    def plan(
        self, start: Offsets, batch_id: int, record: bool = True, discover: bool = True
    ) -> Offsets:
        return self.inner.plan(start, batch_id, record, discover)

    def backlog(self, committed_end: Offsets) -> dict[str, int]:
        return self.inner.backlog(committed_end)

    def read_batches(self, batches: Sequence[Range]) -> SourceRead | None:
        return None  # every read goes through ``read``, so each counts

    def partitions(self, start: Offsets, end: Offsets) -> tuple[str, ...]:
        return self.inner.partitions(start, end)

    def inputs(self, start: Offsets, end: Offsets) -> list[str]:
        return self.inner.inputs(start, end)

    def confirm(self, batch: Range) -> None:
        self.inner.confirm(batch)

    def commit(self, end: Offsets) -> None:
        self.inner.commit(end)


def parse_times(df: DataFrame) -> DataFrame:
    """Parses ``ts``; under ANSI mode a value that is no time fails the batch."""
    return df.withColumn("at", F.to_timestamp("ts"))


def slowly(df: DataFrame) -> DataFrame:
    """Half a second per record: a batch long enough to be interrupted."""

    # Nested, so it is pickled by value: Spark's Python workers need not import this
    # module (and what it imports). No type hints: PySpark would look for a pandas UDF.
    def after_half_a_second(value):
        time.sleep(0.5)
        return value

    slow_id = F.udf(after_half_a_second, LongType(), useArrow=False)
    return df.withColumn("id", slow_id("id"))


FIRST_CONTACT_YAML = """
pipelines:
  - name: times
    source: {kind: files, path: in, format: json, schema_ddl: "id LONG, ts STRING"}
    transform: tests.helpers:parse_times
    sink: {kind: delta, path: out}
  - name: into_a_file
    source: {kind: files, path: in, format: json, schema_ddl: "id LONG, ts STRING"}
    sink: {kind: delta, path: a_file}
  - name: string_time
    source: {kind: files, path: in, format: json, schema_ddl: "id LONG, ts STRING"}
    transform: {sql: "SELECT * FROM input"}
    sink: {kind: delta, path: out}
    event_time: {column: ts, max_out_of_orderness: 10 seconds}
    aggregation:
      keys: [id]
      window: {kind: tumbling, size: 1 minute}
      aggregates: [{fn: count}]
  - name: slow
    source: {kind: files, path: in, format: json, schema_ddl: "id LONG, ts STRING"}
    transform: tests.helpers:slowly
    sink: {kind: delta, path: out}
"""
"""Pipelines a new user gets wrong: a transform that fails on a record, a sink path that
is a file, an event-time column that a transform leaves a string (without one, it is caught
before Spark starts: ``lowmark.batches.loop.preflight``); and one slow enough to interrupt."""


TICKS = dg.AssetKey(["lowmark", "ticks"])


def tick(user: str, second: int, amount: int) -> dict[str, Any]:
    return {"user": user, "ts": (T0 + timedelta(seconds=second)).isoformat(), "amount": amount}


def drop_order_files(root: Path, index: int, rows: list[dict[str, Any]]) -> None:
    write_json_lines(root / "ticks/in", f"f{index}.json", rows, 1_700_000_000 + index)


SPARK_ERRORS = (PySparkException, Py4JJavaError)


dividing = pipeline(
    name="dividing",
    transform=per_unit,
    source=pipeline().source.model_copy(update={"max_files_per_batch": 1}),
    max_failed_attempts=2,
)


def at(second: float) -> int:
    return T0_MS + int(second * 1000)


def drop(root: Path, partition: str, name: str, rows: list[dict[str, Any]], mtime: int) -> None:
    write_json_lines(root / "in" / partition, name, rows, 1_700_000_000 + mtime)


def partitioned(mode: str = "append", **event_time: Any) -> Pipeline:
    return Pipeline(
        name="p",
        source=FileSource(path="in", format="json", schema_ddl=SCHEMA, partition_by_folder=True),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts", **event_time),
        aggregation=WindowedAggregation(
            keys=("user",),
            window=Tumbling(size="10 seconds"),
            aggregates=(Aggregate(fn="count"), Aggregate(fn="sum", column="amount")),
            output_mode=mode,
        ),
    )


def lowmark(
    capsys: pytest.CaptureFixture[str], root: Path, *args: str, clock: Clock | None = None
) -> tuple[int, str, str]:
    """Run ``lowmark --data-root root args`` in process (with ``clock`` as its clock):
    exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as exit_info:
        commands.main(["--data-root", str(root), *args], (report_to_dagster,), clock)
    captured = capsys.readouterr()
    return int(exit_info.value.code or 0), captured.out, captured.err


SPARK_EXAMPLES = settings(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
"""Hypothesis settings for examples that each run a pipeline: no deadline, reproducible."""


def counted_batch(
    spark: SparkSession, runner: MicroBatchRunner, monkeypatch: pytest.MonkeyPatch
) -> tuple[BatchResult, JobCounter]:
    """The next batch of ``runner`` and its jobs, counted once the sink state the write
    before builds for this batch's check is built (``lowmark.state.delta``): as when a
    batch follows another's write by more than that job."""
    for thread in threading.enumerate():
        if thread.name.startswith(STATE_JOB_GROUP):
            thread.join()
    counter = JobCounter(spark)
    with counter.counting(monkeypatch):
        result = runner.run_batch()
    assert result is not None
    print(f"batch {result.batch_id}: {counter.jobs()} jobs {counter.per_step}")
    return result, counter


T0 = datetime(2026, 1, 1, tzinfo=UTC)


SCHEMA = "user STRING, ts TIMESTAMP, amount LONG"


def event(user: str, second: float, amount: int) -> dict[str, Any]:
    return {"user": user, "ts": (T0 + timedelta(seconds=second)).isoformat(), "amount": amount}


def drop_batches(root: Path, batches: list[list[dict[str, Any]]]) -> None:
    for i, rows in enumerate(batches):
        write_json_lines(root / "in", f"b{i:03d}.json", rows, 1_700_000_000 + i)


def run_replaying(
    spark: SparkSession,
    p: Pipeline,
    root: Path,
    batches: list[list[dict[str, Any]]],
    crash: faults.KillPoint | None = None,
    after_crash: Callable[[], object] = lambda: None,
) -> list[int]:
    """Run ``p`` over ``batches`` (``drop_batches``) under ``root`` to the end: after
    ``crash``, if given, in an earlier run, then ``after_crash``; the batches replayed."""
    drop_batches(root, batches)
    if crash is not None:
        with faults.crash_at(crash), pytest.raises(faults.InjectedCrash):
            MicroBatchRunner(spark, p, root).run(max_batches=None)
        after_crash()
    results = MicroBatchRunner(spark, p, root).run(max_batches=None)
    return [r.batch_id for r in results if r.replay]


def timed(**fields: Any) -> Pipeline:
    """A stateless pipeline over ``drop_batches``' files (one a batch) with event time ``ts``,
    into a Delta sink, with ``fields`` (``dedup``, ``keyed``, ``expectations``...)."""
    source = FileSource(path="in", format="json", schema_ddl=SCHEMA, max_files_per_batch=1)
    defined: dict[str, Any] = {
        "name": "timed",
        "source": source,
        "sink": DeltaSink(path="out"),
        "event_time": EventTime(column="ts"),
    }
    return Pipeline(**{**defined, **fields})


def windowed(
    window: Tumbling | Sliding | Session,
    mode: str = "append",
    aggregates: tuple[Aggregate, ...] = AGGREGATES,
    schema: str = SCHEMA,
    **event_time: Any,
) -> Pipeline:
    """Per ``user``, ``aggregates`` over ``window`` of ``ts``; one input file per batch."""
    return Pipeline(
        name="w",
        source=FileSource(path="in", format="json", schema_ddl=schema, max_files_per_batch=1),
        sink=DeltaSink(path="out"),
        event_time=EventTime(column="ts", **event_time),
        aggregation=WindowedAggregation(
            keys=("user",),
            window=window,
            aggregates=aggregates,
            output_mode=mode,
        ),
    )


def spark_window(window: Tumbling | Sliding | Session) -> Column:
    """Spark's own window of ``ts`` that ``window`` stands for (a plain batch's grouping)."""
    if isinstance(window, Session):
        return F.session_window("ts", f"{window.gap} milliseconds")
    if isinstance(window, Tumbling):
        return F.window("ts", f"{window.size} milliseconds")
    return F.window("ts", f"{window.size} milliseconds", f"{window.slide} milliseconds")


def reference(spark: SparkSession, root: Path, window: Tumbling | Sliding | Session) -> DataFrame:
    """The same aggregation as one plain Spark batch over every file."""
    return reference_of(spark.read.schema(SCHEMA).json(str(root / "in")), window)


def reference_of(df: DataFrame, window: Tumbling | Sliding | Session) -> DataFrame:
    """``windowed``'s aggregation of the records ``df``, as one plain Spark batch."""
    return per_window(
        df,
        "user",
        spark_window(window),
        F.count(F.lit(1)).alias("count"),
        F.sum("amount").alias("sum_amount"),
        F.min("amount").alias("min_amount"),
        F.max("amount").alias("max_amount"),
        F.avg("amount").alias("avg_amount"),
    )


def sink(spark: SparkSession, root: Path) -> DataFrame:
    return delta_frame(spark, str(root / "out"))


class FakeClock:
    """A clock tests move by hand; ``step_ms`` > 0 makes every reading advance it."""

    def __init__(self, now_ms: int = 1_767_225_600_000, step_ms: int = 0) -> None:
        self.now = now_ms
        self.step_ms = step_ms

    def now_ms(self) -> int:
        self.now += self.step_ms
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def write_json_lines(folder: Path, name: str, rows: list[dict[str, Any]], mtime_s: int) -> Path:
    """Write ``rows`` as JSON lines to ``folder/name`` with a fixed modification time."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.utime(path, (mtime_s, mtime_s))
    return path


def entry(batch_id: int, runner: str = "r1", end: int = 0) -> OffsetEntry:
    """An offset-log entry of batch ``batch_id`` reading partition "0" up to ``end``."""
    return OffsetEntry(
        batch_id=batch_id,
        runner_id=runner,
        start_offsets={"0": 0},
        end_offsets={"0": end},
        batch_watermark_ms=batch_id * 1000,
        pipeline_fingerprint="fp",
    )


def json_lines_sink(folder: str = "exported") -> CustomSink:
    """The example user sink (examples/json_lines_sink.py), writing under ``folder``."""
    return CustomSink.model_validate(
        {"factory": "examples.json_lines_sink:build", "options": {"folder": folder}}
    )


def exported(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """The rows ``json_lines_sink`` wrote to ``folder``, by batch id (hidden files left out:
    a write that never finished)."""
    batches: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("[!.]*.jsonl")):
        batch_id = int(path.stem.rsplit("-", 1)[1])
        assert batch_id not in batches, f"batch {batch_id} landed twice in {folder}"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        batches[batch_id] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))
    return batches


def not_a_sink(spark: Any, options: dict[str, Any], data_root: Path, app_id: str) -> object:
    """A sink factory that returns something else (its options)."""
    return options


LOWMARK = str(Path(sys.executable).parent / "lowmark")
REPO = Path(__file__).resolve().parents[1]


def lowmark_killed_at(
    point: faults.KillPoint, root: Path, pipelines: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """``lowmark --pipelines pipelines --data-root root args`` in a subprocess that SIGKILLs
    itself (and its JVM) at ``point``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        faults.KILL_AT_ENV: str(point),
        # A process that lives one batch gains more from a fast JVM start than from C2.
        "JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    }
    command = [LOWMARK, "--pipelines", str(pipelines), "--data-root", str(root), *args]
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)


class HeardListener(PipelineListener):
    """A listener that keeps what it hears, as ``(hook, batch_id or None)`` pairs and the
    events themselves (``raises``: each hook raises after noting the event)."""

    def __init__(self, raises: bool = False) -> None:
        self.raises = raises
        self.heard: list[tuple[str, int | None]] = []
        self.events: list[Event] = []

    def _note(self, hook: str, event: Event) -> None:
        self.heard.append((hook, getattr(event, "batch_id", None)))
        self.events.append(event)
        if self.raises:
            raise RuntimeError(f"{hook} fails on purpose")

    def on_batch_started(self, event: BatchStarted) -> None:
        self._note("started", event)

    def on_batch_progress(self, progress: BatchResult) -> None:
        self._note("progress", progress)

    def on_batch_failed(self, event: BatchFailure) -> None:
        self._note("failed", event)

    def on_run_terminated(self, event: RunTerminated) -> None:
        self._note("terminated", event)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""Samples of a Prometheus exposition, by name and labels."""


def samples(text: str, pipeline: str) -> Samples:
    """Every sample of a Prometheus exposition, by name and labels (``pipeline`` checked,
    then left out), parsed by the client's own parser."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert s.labels.pop("pipeline") == pipeline, s
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def value(found: Samples, name: str, **labels: str) -> float:
    """The sample ``name`` with ``labels`` of ``samples``' result."""
    return found[(name, frozenset(labels.items()))]


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``: its children, theirs, and so on."""
    found, frontier = [], [pid]
    while frontier:
        below = children(frontier.pop())
        found += below
        frontier += below
    return found


def command_line(pid: int) -> str:
    """Process ``pid``'s command line ("" once it is gone)."""
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
