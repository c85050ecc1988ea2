"""Fault-free reference runs shared by the crash tests, and the kill matrix's subprocesses.

One reference run per pipeline of ``MATRIX`` over ``FIXED_INPUT``. Its data
root after ``KILL_BATCH`` batches is kept as a template: a kill case copies
it and lets a `lowmark run` subprocess die in batch ``KILL_BATCH``, so no
subprocess pays for the batches before. The subprocesses run two at a time
in the background while the test process replays the cases already killed;
their drivers attach to the test process's JVM (``tests.faults.driver``), or,
in the own-JVM cases, start one of their own.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.loop.faults import KillPoint
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import Pipeline
from tests.faults.class_archive import ARCHIVE_ENV, make_archive
from tests.faults.harness import (
    REPO,
    Snapshot,
    copy_run,
    create_database,
    kill_run,
    lowmark_env,
    postgres_database,
    snapshot,
)
from tests.faults.kafka_sink import at_root
from tests.faults.scenarios import (
    FIXED_INPUT,
    KAFKA_TOPIC,
    PIPELINES,
    RESENT_INPUT,
    VIEWS,
    clock_of,
    dedup_append,
    dedup_tumbling,
    delta_update,
    ingestion_tumbling,
    joined_tumbling,
    kafka_append,
    kafka_lines,
    kafka_update,
    keyed_alerts,
    outbox_update,
    plain_append,
    postgres_append,
    postgres_update,
    session_update,
    stream_joined,
    synthetic_append,
    synthetic_idle,
    tumbling_two_partitions,
    union_append,
    write_clicks,
    write_dimension,
    write_input,
    write_outbox,
    write_table,
)
from tests.kafka_broker import KafkaBroker

MATRIX = (
    tumbling_two_partitions,
    session_update,
    plain_append,
    dedup_tumbling,
    dedup_append,
    keyed_alerts,
    kafka_update,
    synthetic_append,
    synthetic_idle,
    outbox_update,
    delta_update,
    union_append,
    postgres_append,
    postgres_update,
    ingestion_tumbling,
    kafka_append,
    joined_tumbling,
    stream_joined,
)
OTHER_SOURCES = (
    "kafka_update",
    "synthetic_append",
    "synthetic_idle",
    "outbox_update",
    "delta_update",
    "union_append",
    "postgres_append",
    "postgres_update",
    "ingestion_tumbling",
    "kafka_append",
)
"""Matrix pipelines over the other sources, and into the other sinks: killed at every step in
``make test-integration`` only, with the driver attached to the test process's JVM (their
sources' replays are tested on their own in ``tests/batches/sources``, the sinks' in
``tests/batches/sinks``, the ingestion clock's in
``tests/batches/loop/test_ingestion_watermarks.py``)."""
KILLED_IN_MAKE_TEST = {
    "tumbling_two_partitions": ("after_offset_log", "after_state", "after_sink", "before_commit"),
    "plain_append": ("after_sink",),
}
"""The kills ``make test`` runs (the rest run in ``make test-integration``): tumbling windows
on each side of each kind of write between the batch's offsets and its commit (after the
offsets, nothing else written; after the state; after the sink; every write done but the
commit. A kill after the read writes no more than one after the offsets, one after the
late rows no less than one after the sink; those, and the kills before the offsets and
after the commit, run in ``make test-integration``), and the stateless pipeline after
Spark's sink write landed uncommitted.
Deduplication's, a keyed step's and the Postgres and Kafka sinks' SIGKILLs are all in
``make test-integration`` (each costs its own reference run; deduplication's ids are a
state table written as the windows' are, ``lowmark.state.state_table``, so its kills fall on
the same sides of the same writes as the windows'); ``make test`` crashes them in process
instead (``tests/batches/loop/test_dedup.py``, ``tests/batches/loop/test_one_job.py``,
``tests/batches/keyed/test_keyed_windows.py``, ``tests/batches/sinks/test_postgres.py``,
``tests/batches/sinks/test_kafka.py``)."""
NO_BAD_ROWS = ("delta_update",)
"""Pipelines whose source has no malformed rows (a Delta table's rows are typed)."""
"""Windows (every write driver-side; tumbling over two source partitions with an idle
timeout shorter than any batch, each partition left out of the watermark only once its
files are all read) and a stateless pipeline (its sink written by Spark), so kills fall
between driver-side log commits and Spark writes, both ways round; then the same over the
other sources: sessions over a Kafka topic, tumbling windows over two synthetic partitions
(also with an idle timeout shorter than any batch), sessions over a user-written source (an
outbox table, ``examples.outbox_source``), sessions over a Delta table, tumbling windows
over a union of the folder and the table, tumbling windows on the ingestion clock of the
files' modification times (a fake, frozen processing time for the tail), tumbling windows
per region, a column a stream-table join brings, and a left outer stream-stream join of the
folder's views with a Delta table's clicks (the last two ``make test-integration`` only)."""
KILL_BATCH = 3
"""A middle batch, with late and bad rows: windows and sessions from batches 0-2 are open
across the kill, and batches after it close them."""


@dataclass(frozen=True)
class Reference:
    """A fault-free run: where its input and template live, what it wrote."""

    pipeline: Pipeline
    folder: Path
    """Holds ``input/``, ``reference/``, ``template/``; crash runs go beside them."""
    tables: Snapshot
    batches: int

    @property
    def root(self) -> Path:
        """The fault-free run's data root."""
        return self.folder / "reference"


@dataclass(frozen=True)
class KillCase:
    root: Path
    process: subprocess.CompletedProcess[str]


def with_input(pipeline: Pipeline, folder: Path, request: pytest.FixtureRequest) -> Pipeline:
    """Lay out ``pipeline``'s input (files under ``folder``, or the Kafka topic) and return
    it as this process runs it (a Kafka pipeline pointed at the test broker)."""
    if pipeline in (synthetic_append, synthetic_idle):
        return pipeline
    if pipeline is outbox_update:
        write_outbox(folder / "input.db")
        return pipeline
    if pipeline in (delta_update, union_append):
        write_table(request.getfixturevalue("spark"), folder / "input_table")
    if pipeline is delta_update:
        return pipeline
    if pipeline in (postgres_append, postgres_update):
        request.getfixturevalue("postgres")  # the server, its libpq variables set
    if pipeline is kafka_append:
        request.getfixturevalue("kafka")  # the broker, its address in KAFKA_ENV
    if pipeline in (dedup_tumbling, dedup_append):
        write_input(folder / "input", RESENT_INPUT, pipeline)
        return pipeline
    if pipeline is joined_tumbling:
        write_dimension(folder / "dimension")
    if pipeline is stream_joined:
        write_input(folder / "input", VIEWS, pipeline)
        write_clicks(folder / "clicks")
        return pipeline
    if pipeline is not kafka_update:
        write_input(folder / "input", FIXED_INPUT, pipeline)
        return pipeline
    kafka: KafkaBroker = request.getfixturevalue("kafka")
    kafka.create_topic(KAFKA_TOPIC)
    kafka.produce(KAFKA_TOPIC, kafka_lines())
    source = pipeline.source.model_copy(update={"bootstrap_servers": kafka.bootstrap})
    return pipeline.model_copy(update={"source": source})


@pytest.fixture(scope="session")
def class_archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    """The class-data sharing archive the session's `lowmark` subprocesses map
    (``tests.faults.class_archive``), made once; None if it could not be made."""
    archive = make_archive(tmp_path_factory.mktemp("class_archive"), lowmark_env(), REPO)
    if archive is None:
        warnings.warn("no class archive: lowmark subprocesses start without one", stacklevel=1)
    else:
        os.environ[ARCHIVE_ENV] = str(archive)
    yield archive
    os.environ.pop(ARCHIVE_ENV, None)


class References(Mapping[str, Reference]):
    """The fault-free run of each pipeline of ``MATRIX``, made when a test first asks for it:
    a worker that runs the crash tests of a few pipelines makes only theirs."""

    def __init__(
        self,
        spark: SparkSession,
        tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest,
    ) -> None:
        self._spark = spark
        self._tmp_path_factory = tmp_path_factory
        self._request = request
        self._made: dict[str, Reference] = {}

    def __getitem__(self, name: str) -> Reference:
        if name not in self._made:
            self._made[name] = self._make(PIPELINES[name])
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter(p.name for p in MATRIX)

    def __len__(self) -> int:
        return len(MATRIX)

    def _make(self, defined: Pipeline) -> Reference:
        folder = self._tmp_path_factory.mktemp(defined.name)
        pipeline = with_input(defined, folder, self._request)
        root = folder / "reference"  # Reference.root
        create_database(root, pipeline)
        with postgres_database(root, pipeline):
            runner = MicroBatchRunner(
                self._spark, at_root(pipeline, root), root, clock_of(pipeline)
            )
            runner.run(max_batches=KILL_BATCH)
            copy_run(root, folder / "template", pipeline)
            rest = runner.run(max_batches=None)
        # What the kill matrix relies on: the killed batch has output, bad rows and
        # (windowed, deduplicated, keyed or joined) late records, with windows, ids, timers
        # or join rows held, and batches come after it.
        steps = (pipeline.aggregation, pipeline.dedup, pipeline.keyed, pipeline.stream_join)
        held = steps != (None,) * 4
        killed = rest[0]
        assert (
            killed.batch_id,
            killed.rows_late > 0,
            killed.rows_bad > 0,
            killed.rows_out > 0,
        ) == (KILL_BATCH, held, pipeline.name not in NO_BAD_ROWS, True)
        assert len(rest) > 1
        batches = KILL_BATCH + len(rest)
        return Reference(pipeline, folder, snapshot(pipeline, root), batches)


@pytest.fixture(scope="session")
def references(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> References:
    return References(spark, tmp_path_factory, request)


CaseKey = tuple[str, str, str]
"""(pipeline, step, jvm): ``jvm`` is ``shared`` (the driver attached to the test process's
JVM) or ``own`` (a JVM of its own, which dies with it)."""


class KillCases:
    """Kill cases run in the background, two at a time, in the order tests ask for them.

    Asking for one case also starts the next, so a subprocess starts up while
    the test process replays the case before it.
    """

    def __init__(
        self,
        spark: SparkSession,
        references: References,
        pool: ThreadPoolExecutor,
        order: list[CaseKey],
    ) -> None:
        self.spark = spark
        self.references = references
        self.pool = pool
        self.order = order
        """The kill cases this session runs, in the order it runs them."""
        self.started: dict[CaseKey, Future[KillCase]] = {}

    def get(self, key: CaseKey) -> KillCase:
        at = self.order.index(key)
        for name, step, jvm in self.order[at : at + 2]:
            # The next case of the same pipeline: a test worker runs one pipeline's cases
            # (``tests.conftest``), another worker the next pipeline's.
            if name == key[0] and (name, step, jvm) not in self.started:
                self.started[(name, step, jvm)] = self.pool.submit(
                    _kill, self.references[name], step, self.spark if jvm == "shared" else None
                )
        return self.started[key].result()


@pytest.fixture(scope="session")
def kill_cases(
    spark: SparkSession, references: References, request: pytest.FixtureRequest
) -> Iterator[KillCases]:
    # Only the kill matrix's cases selected (`make test` leaves the integration ones out),
    # so no subprocess is started for a case no test asks for.
    order = [
        (item.callspec.params["name"], item.callspec.params["step"], item.callspec.params["jvm"])
        for item in request.session.items
        if hasattr(item, "callspec") and "jvm" in item.callspec.params
    ]
    if any(jvm == "own" for _, _, jvm in order):
        request.getfixturevalue("class_archive")
    pool = ThreadPoolExecutor(max_workers=2)
    yield KillCases(spark, references, pool, order)
    pool.shutdown(cancel_futures=True)


def _kill(ref: Reference, step: str, jvm: SparkSession | None) -> KillCase:
    """A copy of the template after `lowmark run` was killed at ``step`` of KILL_BATCH, its
    driver attached to ``jvm``'s JVM or (None) with a JVM of its own."""
    root = ref.folder / f"killed_{step}_{'shared' if jvm else 'own'}_jvm"
    copy_run(ref.folder / "template", root, ref.pipeline)
    return KillCase(root, kill_run(root, ref.pipeline, KillPoint(step, KILL_BATCH), jvm=jvm))
