"""The generated fault matrix: every stateful feature by every sink by every operator action by
the kill points that action is about, against the one state contract (DESIGN.md §4).

Nothing here names a case. Three registrations and one list of kill points generate them:

- ``FEATURES``: a pipeline (its sink a Delta table at ``SINK``) and its input, a batch an
  entry (windows tumbling and session, deduplication, keyed state with timers, a
  stream-stream join, a stream-table join);
- ``SINKS``: how to attach a sink kind to a feature's pipeline under a data root (Delta
  append, Delta MERGE on the feature's keys, Postgres, Kafka, Delta with a Postgres extra
  sink); what a sink holds is read per sink config kind (``READERS``), so a fan-out is read
  as its members are;
- ``ACTIONS``: what an operator does after a kill at one of its ``steps`` of batch
  ``KILL_BATCH`` (nothing, `lowmark skip-batch`, `lowmark reset --after-sink`, `lowmark
  reset --truncate-sink`, a backfill of a settled event-time partition, `lowmark compact`
  an hour later, `lowmark rebuild` under a later watermark), which input and definition its
  fault-free reference reads and runs, which tables its end state
  is compared on, and when it is refused by design (a stated reason: the case then asserts
  that the refusal is one line, and that the pipeline then runs on to the reference of no
  action at all).

Every case does the same (``run_case``): lay out the input, run in this process until
``crash_at`` the kill point, act, run to the end, and compare the contract tables (the
sink and every other sink's contents, ``late``, ``bad_records``, the live rows of every
state table) with a fault-free run of the same feature and sink, row for row. A new
feature or sink is one more registration; a combination the pipeline model rejects is
skipped with the model's own reason. The crashes raise ``InjectedCrash`` in process (the
SIGKILLs of ``test_kill_matrix`` stay the proof that a dying process recovers the same).

"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.compute as pc
import pytest
from psycopg.rows import dict_row
from pydantic import ValidationError
from pyspark.sql import SparkSession

from lowmark.batches.admin.rebuild import rebuild
from lowmark.batches.admin.reset import reset
from lowmark.batches.admin.skip_batch import set_aside
from lowmark.batches.errors import PartitionNotClosed
from lowmark.batches.loop.backfill import backfill_partition
from lowmark.batches.loop.faults import STEPS, InjectedCrash, KillPoint, crash_at
from lowmark.batches.loop.maintenance import maintain_checkpoint
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.loop.steps import STATE_TABLES as REGISTERED_STATE_TABLES
from lowmark.batches.pipeline import DeltaSink, KafkaSink, Pipeline, PostgresSink, resolve
from lowmark.state.errors import LowmarkError
from lowmark.state.keyed_state import STATE_TABLE, TIMER_TABLE, latest
from lowmark.state.state_table import BATCH_COLUMNS, ROW_ID
from lowmark.state.storage import is_table, open_table
from tests.faults.harness import (
    Snapshot,
    an_hour_passes,
    database_of,
    delta_rows,
    differences,
    rows_as_json,
)
from tests.faults.kafka_sink import PARTITIONS, topic_of
from tests.faults.scenarios import (
    CLICK_VERSIONS,
    FIXED_INPUT,
    KAFKA_ENV,
    POSTGRES_TABLE,
    RESENT_INPUT,
    SINK,
    T0,
    VIEWS,
    Event,
    File,
    dedup_tumbling,
    joined_tumbling,
    keyed_alerts,
    session_update,
    stream_joined,
    tumbling_append,
    write_click_version,
    write_dimension,
    write_file,
)
from tests.kafka_broker import CLIENT_TIMEOUT_S, read_records

KILL_BATCH = 3
"""The batch every case is killed in: late and bad rows, and windows, ids, keyed state,
timers and join rows held since earlier batches (``tests.faults.scenarios``' inputs)."""

STATE_TABLES = tuple(spec.folder for spec in REGISTERED_STATE_TABLES)
"""Every state table a stateful step registers (``lowmark.batches.loop.steps``)."""
CONTRACT_TABLES = ("late", "bad_records", *STATE_TABLES)
"""The checkpoint tables a batch writes besides its offsets and commit: their live rows are
compared (versions and history legitimately differ after an operator action)."""


# Features.


@dataclass(frozen=True, kw_only=True)
class Batch:
    """One batch's input: a file of the input folder, and (a stream join) a clicks version."""

    rows: File
    clicks: list[Event] | None = None


EMPTY = Batch(rows=[], clicks=[])
"""A batch of no input (an empty file, a version of no clicks)."""


@dataclass(frozen=True, kw_only=True)
class Feature:
    """A stateful feature: its pipeline (sink: a Delta table at ``SINK``) and its input."""

    name: str
    pipeline: Pipeline
    batches: tuple[Batch, ...]
    merge_keys: tuple[str, ...] = ()
    """What identifies an output row, for a MERGE sink (a windowed pipeline's sink is written
    as its output mode says: update-mode windows are MERGEd on their keys and bounds)."""
    fixed: Callable[[Path], None] | None = None
    """Lays out what every batch reads whole (a dimension table) under the case folder."""

    @property
    def windowed(self) -> bool:
        return self.pipeline.aggregation is not None

    def write_batch(self, folder: Path, index: int, batch: Batch) -> None:
        """Batch ``index`` of the input under case folder ``folder`` (written in order)."""
        write_file(folder / "input", index, batch.rows)
        if self.pipeline.stream_join is not None:
            write_click_version(folder / "clicks", batch.clicks or [])

    def lay_out(self, folder: Path, batches: tuple[Batch, ...]) -> None:
        if self.fixed is not None:
            self.fixed(folder)
        for i, batch in enumerate(batches):
            self.write_batch(folder, i, batch)


def _files(files: list[File]) -> tuple[Batch, ...]:
    return tuple(Batch(rows=rows) for rows in files)


FEATURES = (
    Feature(name="tumbling", pipeline=tumbling_append, batches=_files(FIXED_INPUT)),
    Feature(name="session", pipeline=session_update, batches=_files(FIXED_INPUT)),
    Feature(name="dedup", pipeline=dedup_tumbling, batches=_files(RESENT_INPUT)),
    Feature(
        name="keyed",
        pipeline=keyed_alerts,
        batches=_files(FIXED_INPUT),
        merge_keys=("user", "silent_since"),
    ),
    Feature(
        name="stream_join",
        pipeline=stream_joined,
        batches=tuple(Batch(rows=v, clicks=c) for v, c in zip(VIEWS, CLICK_VERSIONS, strict=True)),
        merge_keys=("user", "ts", "clicked_at"),
    ),
    Feature(
        name="table_join",
        pipeline=joined_tumbling,
        batches=_files(FIXED_INPUT),
        fixed=lambda folder: write_dimension(folder / "dimension"),
    ),
)


# Sinks.


@dataclass(frozen=True, kw_only=True)
class SinkKind:
    """A way to attach a sink kind to a feature's pipeline for a run under a data root.

    ``attach`` is pure (generation validates the combination with it); ``prepare``
    creates what the run's sink writes into (a database, a topic) once the servers run.
    """

    name: str
    attach: Callable[[Pipeline, Feature, Path], Pipeline]
    services: tuple[str, ...] = ()
    """The session fixtures of the servers it needs (``tests.conftest``)."""

    def prepare(self, pipeline: Pipeline) -> None:
        for sink in pipeline.sinks().values():
            if isinstance(sink, PostgresSink):
                _create_database(sink.dbname or "")
            if isinstance(sink, KafkaSink):
                _create_topic(sink.topic)


def _with(pipeline: Pipeline, **changes: Any) -> Pipeline:
    """``pipeline`` with ``changes``, validated as a definition is (``model_copy`` is not)."""
    return Pipeline(**(dict(pipeline) | changes))


def _postgres(root: Path) -> PostgresSink:
    return PostgresSink(table=POSTGRES_TABLE, dbname=database_of(root))


SINKS = (
    SinkKind(name="delta", attach=lambda p, f, root: p),
    SinkKind(
        name="delta_merge",
        attach=lambda p, f, root: _with(
            p, sink=DeltaSink(path=SINK, mode="merge", keys=f.merge_keys)
        ),
    ),
    SinkKind(
        name="postgres",
        attach=lambda p, f, root: _with(p, sink=_postgres(root)),
        services=("postgres",),
    ),
    SinkKind(
        name="kafka",
        attach=lambda p, f, root: _with(
            p,
            sink=KafkaSink(
                topic=topic_of(root),
                bootstrap_servers=os.environ.get(KAFKA_ENV, "127.0.0.1:9"),
                # Update-mode windows are keyed by their keys and bounds, by the sink itself.
                key="user" if p.window_identity is None else None,
            ),
        ),
        services=("kafka",),
    ),
    SinkKind(
        name="fan_out",
        attach=lambda p, f, root: _with(p, extra_sinks={"serving": _postgres(root)}),
        services=("postgres",),
    ),
)


def _create_database(name: str) -> None:
    with psycopg.connect(dbname="postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def _create_topic(topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": os.environ[KAFKA_ENV]})
    if topic not in admin.list_topics(timeout=CLIENT_TIMEOUT_S).topics:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(CLIENT_TIMEOUT_S)


def _read_delta(sink: Any, root: Path) -> Counter[str]:
    path = resolve(sink.path, root)
    return delta_rows(path) if is_table(path) else Counter()


def _read_postgres(sink: Any, root: Path) -> Counter[str]:
    with psycopg.connect(dbname=sink.dbname, row_factory=dict_row) as conn:
        if conn.execute("SELECT to_regclass(%s) AS t", (sink.table,)).fetchone() == {"t": None}:
            return Counter()
        return rows_as_json(conn.execute(f'SELECT * FROM "{sink.table}"').fetchall())


def _read_kafka(sink: Any, root: Path) -> Counter[str]:
    records = read_records(os.environ[KAFKA_ENV], sink.topic)
    return rows_as_json([{"partition": p, "key": k, "value": v} for p, k, v in records])


READERS: dict[str, Callable[[Any, Path], Counter[str]]] = {
    "delta": _read_delta,
    "postgres": _read_postgres,
    "kafka": _read_kafka,
}
"""What a sink of each config kind holds, as a multiset of rows (a new sink kind adds its
reader here)."""


def contract_tables(pipeline: Pipeline, root: Path) -> Snapshot:
    """Every sink's contents (``sink <name>``) and the live rows of ``CONTRACT_TABLES``, the
    case folder in their texts (an input file's path) named ``<case>``."""
    result: Snapshot = {}
    for name, sink in pipeline.sinks().items():
        result[f"sink {name}"] = READERS[sink.kind](sink, root)
    checkpoint = pipeline.checkpoint_location(root)
    for table in CONTRACT_TABLES:
        path = f"{checkpoint}/{table}"
        result[table] = _live_rows(table, path) if is_table(path) else Counter()
    folder = str(root.parent.resolve())
    return {
        table: Counter({row.replace(folder, "<case>"): n for row, n in rows.items()})
        for table, rows in result.items()
    }


def _live_rows(table: str, path: str) -> Counter[str]:
    """The rows of checkpoint table ``table`` (at ``path``) a batch reads. The keyed tables
    are append-only, and what a batch reads of them is the newest row of each (key, state)
    still set and of each (key, timer) still pending: their history differs after an action
    (``lowmark compact`` rewrites it away; skip-batch restores without it), what is held
    may not."""
    rows = open_table(path).to_pyarrow_table()
    if table == STATE_TABLE:
        rows = latest(rows, ("key", "state"))
        rows = rows.filter(pc.is_valid(rows.column("value")))
    elif table == TIMER_TABLE:
        rows = latest(rows, ("key", "timer_ms"))
        rows = rows.filter(rows.column("pending"))
    return rows_as_json(rows.to_pylist())


# Actions.


@dataclass
class Run:
    """One run of a case or reference: where it lives and what it runs."""

    spark: SparkSession
    feature: Feature
    pipeline: Pipeline
    folder: Path
    """Holds the input and the data root ``folder / "run"``."""
    monkeypatch: pytest.MonkeyPatch

    @property
    def root(self) -> Path:
        return self.folder / "run"

    def to_end(self) -> None:
        MicroBatchRunner(self.spark, self.pipeline, self.root, None).run(max_batches=None)

    def killed_at(self, point: KillPoint) -> None:
        with crash_at(point), pytest.raises(InjectedCrash):
            self.to_end()


def _nothing(run: Run) -> None:
    pass


SKIP_REASON = "matrix: set aside"


def _skip_batch(run: Run) -> None:
    """`lowmark skip-batch`, its input found in ``bad_records``, then that input fed again."""
    done = set_aside(run.spark, run.pipeline, run.root, KILL_BATCH, SKIP_REASON)
    bad = delta_rows(f"{run.pipeline.checkpoint_location(run.root)}/bad_records")
    recorded = sorted(
        json.loads(row)["source_file"] for row in bad.elements() if SKIP_REASON in row
    )
    assert done.inputs and recorded == sorted(done.inputs), (done.inputs, recorded)
    batches = run.feature.batches
    run.feature.write_batch(run.folder, len(batches), batches[KILL_BATCH])


def _set_aside_then_refed(batches: tuple[Batch, ...]) -> tuple[Batch, ...]:
    """The input as a skip-batch case ends up reading it: the killed batch's input nowhere in
    its place (an empty batch), and again after the last batch."""
    return (*batches[:KILL_BATCH], EMPTY, *batches[KILL_BATCH + 1 :], batches[KILL_BATCH])


def _without_set_aside(tables: Snapshot) -> Snapshot:
    """bad_records without the rows skip-batch recorded (checked by ``_skip_batch``)."""
    kept = Counter({r: n for r, n in tables["bad_records"].items() if SKIP_REASON not in r})
    return tables | {"bad_records": kept}


def _reset(mode: str) -> Callable[[Run], None]:
    def act(run: Run) -> None:
        reset(run.spark, run.pipeline, run.root, "after" if mode == "after" else "truncate")

    return act


def _sinks_and_state(tables: Snapshot) -> Snapshot:
    """A new checkpoint after ``reset --after-sink`` records its own batches' late and bad
    rows only (the old ones stay in the checkpoint moved aside), and numbers its batches
    afresh: the sinks, and the state it carried over without the batch that wrote it, are
    compared."""
    return {
        k: v if k.startswith("sink ") else _without_batch_ids(v)
        for k, v in tables.items()
        if k.startswith("sink ") or k in STATE_TABLES
    }


def _without_batch_ids(rows: Counter[str]) -> Counter[str]:
    """``rows`` without the batch numbers they hold (a row id's batch part included)."""
    kept: Counter[str] = Counter()
    for row, n in rows.items():
        fields = json.loads(row)
        for name in BATCH_COLUMNS:
            fields.pop(name, None)
        if fields.get(ROW_ID) is not None:
            fields[ROW_ID] = fields[ROW_ID].split(":", 1)[1]
        kept[json.dumps(fields, sort_keys=True)] += n
    return kept


SETTLED = (T0, T0 + timedelta(seconds=10))
"""An event-time partition every feature's stream has settled by its end."""


def _backfill_before_replay(run: Run) -> None:
    """A backfill between the kill and the replay: refused while the stream owns the slice."""
    with contextlib.suppress(PartitionNotClosed):
        backfill_partition(run.spark, run.pipeline, run.root, *SETTLED)


def _backfill_after_replay(run: Run) -> None:
    backfill_partition(run.spark, run.pipeline, run.root, *SETTLED)


def _compact(run: Run) -> None:
    """`lowmark compact` an hour after the kill (logs and removed files past retention)."""
    an_hour_passes(run.pipeline.checkpoint_location(run.root), run.monkeypatch)
    maintain_checkpoint(run.spark, run.pipeline, run.root)


def _later_watermark(pipeline: Pipeline) -> Pipeline:
    """``pipeline`` with a change only a rebuild applies: its watermark five seconds later (every
    feature's windows, horizons, timers or held rows follow it)."""
    event_time = pipeline.event_time
    assert event_time is not None, f"{pipeline.name} has no watermark to change"
    later = event_time.max_out_of_orderness + 5000
    return pipeline.model_copy(
        update={"event_time": event_time.model_copy(update={"max_out_of_orderness": later})}
    )


def _rebuild(run: Run) -> None:
    """`lowmark rebuild` under a later watermark before the killed batch's replay: the
    pipeline runs on under it, from the checkpoint the rebuild swapped in."""
    changed = _later_watermark(run.pipeline)
    rebuild(run.spark, changed, run.root)
    run.pipeline = changed


def _same(tables: Snapshot) -> Snapshot:
    return tables


def _unchanged(pipeline: Pipeline) -> Pipeline:
    return pipeline


def _same_input(batches: tuple[Batch, ...]) -> tuple[Batch, ...]:
    return batches


Refusal = Callable[[Feature, SinkKind, str], str | None]
View = Callable[[Snapshot], Snapshot]


def _never(feature: Feature, sink: SinkKind, step: str) -> None:
    return None


def _needs_delta_sink(what: str) -> Refusal:
    def refused(feature: Feature, sink: SinkKind, step: str) -> str | None:
        if sink.name in ("postgres", "kafka"):
            return f"{what} reads the sink's Delta table: another sink kind is refused"
        return None

    return refused


def _skip_refused(feature: Feature, sink: SinkKind, step: str) -> str | None:
    if STEPS.index(step) >= STEPS.index("after_sink"):
        return "skip-batch refuses a batch whose sink write landed"
    return None


def _reset_after_refused(feature: Feature, sink: SinkKind, step: str) -> str | None:
    if feature.pipeline.event_time is not None and step == "after_sink":
        return (
            "reset --after-sink of a stateful pipeline whose last sink write never committed: "
            "the state it left is not recorded (`lowmark run` finishes the batch first)"
        )
    return _needs_delta_sink("reset --after-sink")(feature, sink, step)


def _rebuild_refused(feature: Feature, sink: SinkKind, step: str) -> str | None:
    if feature.pipeline.joins:
        return "a rebuild cannot replay the table versions each batch joined"
    if sink.name in ("postgres", "kafka", "fan_out"):
        return "a rebuild swaps a Delta sink's content in one commit: another sink is refused"
    return None


def _backfill_refused(feature: Feature, sink: SinkKind, step: str) -> str | None:
    pipeline = feature.pipeline
    if not feature.windowed:
        return "a backfill recomputes windows: a pipeline without them is refused"
    if pipeline.joins or pipeline.keyed is not None or pipeline.stream_join is not None:
        return "a backfill cannot replay per-batch table versions, keyed state or join rows"
    return _needs_delta_sink("a backfill")(feature, sink, step)


@dataclass(frozen=True, kw_only=True)
class Action:
    """An operator action after a kill, and the end state it must reach."""

    name: str
    steps: tuple[str, ...]
    """The kill points (steps of ``KILL_BATCH``) it is tried after."""
    before_replay: Callable[[Run], None] = _nothing
    after_replay: Callable[[Run], None] = _nothing
    reference_input: Callable[[tuple[Batch, ...]], tuple[Batch, ...]] = _same_input
    """The input of the fault-free run its end state must equal."""
    compared: View = _same
    """What of the contract tables that equality covers."""
    reference_after: Callable[[Run], None] = _nothing
    """What the fault-free run does after its end (a backfill backfills it too)."""
    refused: Refusal = _never
    """Why it is refused by design for a feature, sink and kill point (None: it is not)."""
    changed: Callable[[Pipeline], Pipeline] = _unchanged
    """The definition the pipeline runs under once it acted, which its fault-free run runs
    under throughout."""


ACTIONS = (
    # A restart alone replays the batch: every table ends as the reference's.
    Action(name="restart", steps=("after_sink",)),
    # skip-batch restores every table to N-1 and records the batch's input in bad_records;
    # fed again, that input ends as a run that read it last. Refused once a sink landed.
    Action(
        name="skip_batch",
        steps=("after_state", "after_sink"),
        before_replay=_skip_batch,
        reference_input=_set_aside_then_refed,
        compared=_without_set_aside,
        refused=_skip_refused,
    ),
    # reset --after-sink carries every table over: the pipeline goes on, and the sinks and
    # state end as the reference's.
    Action(
        name="reset_after_sink",
        steps=("after_state", "after_sink"),
        before_replay=_reset("after"),
        compared=_sinks_and_state,
        refused=_reset_after_refused,
    ),
    # reset --truncate-sink leaves nothing half done: every table as a fresh run's.
    Action(
        name="reset_truncate_sink",
        steps=("after_sink",),
        before_replay=_reset("truncate"),
        refused=_needs_delta_sink("reset --truncate-sink"),
    ),
    # A backfill of a settled partition replays the stream's recorded verdicts (late records
    # included, as documented): a kill before it changes nothing, so every table ends as
    # the fault-free run's after the same backfill (one of a partition the stream still
    # owns is refused).
    Action(
        name="backfill",
        steps=("after_state",),
        before_replay=_backfill_before_replay,
        after_replay=_backfill_after_replay,
        reference_after=_backfill_after_replay,
        refused=_backfill_refused,
    ),
    # Maintenance keeps every version a pending replay needs.
    Action(name="compact", steps=("after_state",), before_replay=_compact),
    # A rebuild recomputes the committed batches under the new definition and swaps them in;
    # the killed batch then runs under it, and every table ends as a fault-free run's of the
    # new definition (the live's half-written batch leaves nothing behind).
    Action(
        name="rebuild",
        steps=("after_state", "after_sink"),
        before_replay=_rebuild,
        changed=_later_watermark,
        refused=_rebuild_refused,
    ),
)


# Cases.


@dataclass(frozen=True, kw_only=True)
class Case:
    feature: Feature
    sink: SinkKind
    action: Action
    step: str
    invalid: str | None = None
    """Why the pipeline model rejects this feature with this sink (the case is skipped)."""

    @property
    def id(self) -> str:
        return f"{self.feature.name}-{self.sink.name}-{self.action.name}-{self.step}"

    @property
    def refused(self) -> str | None:
        return self.action.refused(self.feature, self.sink, self.step)

    @property
    def reference_key(self) -> str:
        """The fault-free run it is compared with (cases sharing one share a test worker)."""
        ref_input = self.action.reference_input if self.refused is None else _same_input
        after = self.action.reference_after if self.refused is None else _nothing
        changed = self.action.changed if self.refused is None else _unchanged
        key = f"{self.feature.name}+{self.sink.name}+{ref_input.__name__.strip('_')}"
        for extra in (after, changed):
            if extra not in (_nothing, _unchanged):
                key += f"+{extra.__name__.strip('_')}"
        return key


def _invalid(feature: Feature, sink: SinkKind) -> str | None:
    try:
        sink.attach(feature.pipeline, feature, Path("/validate"))
    except ValidationError as exc:
        return "; ".join(str(e["msg"]) for e in exc.errors())
    return None


def generate() -> list[Case]:
    """Every feature, with every sink, after every action, at each of its kill points."""
    return [
        Case(feature=f, sink=s, action=a, step=step, invalid=_invalid(f, s))
        for f in FEATURES
        for s in SINKS
        for a in ACTIONS
        for step in a.steps
    ]


SLICE_SINKS = ("delta", "postgres", "fan_out")
"""The sinks the slice tries: the Delta table every action reads, a driver-written external
sink, and a fan-out. A Kafka topic and a MERGE sink cost a minute or more a case (a keyed
step is the cheapest feature a MERGE sink takes); they are tried by the full matrix, and
in `make test` by their own tests."""


def covering(cases: list[Case]) -> list[Case]:
    """A few cases that try every action, and every sink of ``SLICE_SINKS``, at least once,
    each action where it is not refused: greedily the case that covers most not yet
    covered, the first of equals (the cheap features first). Every feature goes through
    skip-batch in `make test` too (``tests/faults/test_state_contract.py``); the rest is
    the full matrix's, to keep `make test` within its budget."""
    runnable = [c for c in cases if c.invalid is None and c.refused is None]
    wanted = {("sink", s) for s in SLICE_SINKS} | {("action", a.name) for a in ACTIONS}
    chosen: list[Case] = []
    while wanted:
        best = max(runnable, key=lambda c: len(_covers(c) & wanted))
        if not _covers(best) & wanted:
            raise AssertionError(f"no runnable case covers {sorted(wanted)}")
        chosen.append(best)
        wanted -= _covers(best)
    return chosen


def _covers(case: Case) -> set[tuple[str, str]]:
    return {("feature", case.feature.name), ("sink", case.sink.name), ("action", case.action.name)}


# Running.


@dataclass
class References:
    """Fault-free runs, made when a case first asks for one, under ``folder``."""

    spark: SparkSession
    folder: Path
    made: dict[str, Snapshot] = field(default_factory=dict)

    def of(self, case: Case, monkeypatch: pytest.MonkeyPatch) -> Snapshot:
        key = case.reference_key
        if key not in self.made:
            ref_input = case.action.reference_input if case.refused is None else _same_input
            run = _run(self.spark, case, self.folder / key, monkeypatch)
            if case.refused is None:
                run.pipeline = case.action.changed(run.pipeline)
            case.feature.lay_out(run.folder, ref_input(case.feature.batches))
            run.to_end()
            if case.refused is None:
                case.action.reference_after(run)
            self.made[key] = contract_tables(run.pipeline, run.root)
        return self.made[key]


def _run(spark: SparkSession, case: Case, folder: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    pipeline = case.sink.attach(case.feature.pipeline, case.feature, folder / "run")
    case.sink.prepare(pipeline)
    return Run(spark, case.feature, pipeline, folder, monkeypatch)


def run_case(
    spark: SparkSession,
    case: Case,
    folder: Path,
    references: References,
    monkeypatch: pytest.MonkeyPatch,
) -> list[str]:
    """Kill, act, run to the end; the differences from the end state the action defines
    (empty: none). A refused action must be refused in one line and change nothing."""
    run = _run(spark, case, folder, monkeypatch)
    case.feature.lay_out(folder, case.feature.batches)
    run.killed_at(KillPoint(case.step, KILL_BATCH))
    refusal = _acted(case.action, run)
    if case.refused is not None:
        assert refusal is not None, f"not refused, though by design: {case.refused}"
        assert "\n" not in refusal.strip(), f"a refusal of more than one line: {refusal}"
        run.to_end()
        compared: View = _same
    else:
        assert refusal is None, f"refused: {refusal}"
        compared = case.action.compared
    expected = references.of(case, monkeypatch)
    return differences(compared(expected), compared(contract_tables(run.pipeline, run.root)))


def _acted(action: Action, run: Run) -> str | None:
    """Act before the replay, replay to the end, act after it; a refusal's message, if any."""
    try:
        action.before_replay(run)
        run.to_end()
        action.after_replay(run)
    except LowmarkError as exc:
        return str(exc)
    return None


def params() -> Iterator[Any]:
    """The generated cases as pytest parameters: the covering slice in `make test`, the rest
    marked ``integration``; a rejected combination skipped with its reason."""
    cases = generate()
    slice_ids = {c.id for c in covering(cases)}
    for case in cases:
        marks: list[Any] = [] if case.id in slice_ids else [pytest.mark.integration]
        if case.invalid is not None:
            marks.append(pytest.mark.skip(reason=f"the pipeline model rejects it: {case.invalid}"))
        yield pytest.param(case.reference_key, case, id=case.id, marks=marks)
