"""Keyed state and timers: the tables of a pipeline's keyed step.

``keyed_state`` holds, per (key, state name), the state's value: ``key`` (the
key columns as a JSON array), ``state``, ``value`` (JSON; null once the state
was cleared), ``expires_ms`` (the time, in ms, from which a state with a TTL reads
as absent, in its TTL's clock: processing time, or event time for a state with
event-time TTL, compared with the watermark; ``Expiry``; null: never), ``batch_id`` (the batch that
wrote it), partitioned by ``_lowmark_bucket`` (a hash of the key modulo the
table's bucket count, fixed when it is created). Timers are a state of their
own per key (``TIMERS``: the key's pending timers, a JSON list), so a batch
finds a touched key's timers where it finds its states.

``keyed_timers`` is the index of pending timers by time: ``timer_ms``,
``key``, ``_lowmark_bucket``, ``batch_id``, ``pending`` (false: a timer deleted
before it fired), partitioned by ``_lowmark_slot`` (``timer_ms`` in steps of
``slot_ms``). After a batch no pending timer is at or below the time it ran
at (every due timer fired in it), so whole slots below that time are deleted
(``purge``), and a batch reads only the slots up to its time.

Both tables are append-only: the newest row of a (key, state) or (key,
timer) wins (``latest``). A batch reads them as of the version the driver
pinned (the newest for a new batch, the one commit N-1 recorded for a replay
whose own append landed), so a replay sees what the first attempt saw. The
tasks write each batch's changes as data files of the two tables
(``Pinned.written``, ``lowmark.state.task_appends``), and the driver adds them
with ONE idempotent commit per table (``<pipeline id>:keyed_state`` /
``:keyed_timers``, batch id). Cost follows the keys a batch touches and the
timers due: reads filter by bucket and key, or by slot.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import write_deltalake

from lowmark.state import storage
from lowmark.state.errors import CheckpointCorrupt, first_line
from lowmark.state.state_table import StateTable
from lowmark.state.table import HOOKS, DriverTable
from lowmark.state.task_appends import WrittenFile, write_files

BUCKET = "_lowmark_bucket"
SLOT = "_lowmark_slot"
TIMERS = "_lowmark_timers"
"""The state that holds a key's pending timers."""
BUCKETS = 16
"""Buckets of a new state table: a task reads the buckets of the keys it holds."""
SLOT_MIN_MS = 60_000
NEVER = -(2**62)
"""Below every batch number, those ``lowmark reset --after-sink`` carries over (below 0)
included: the batch that deleted a timer never deleted."""
PENDING_PAGE = 1_000
"""Rows that set a timer read at a time when looking for the next pending one."""
STATE_TABLE, TIMER_TABLE = "keyed_state", "keyed_timers"
"""The tables' names in the checkpoint, and their roles in application transaction ids."""
STATE_PARTITIONS, TIMER_PARTITIONS = (BUCKET,), (SLOT,)

STATE = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("value", pa.string()),
        pa.field("expires_ms", pa.int64()),
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field(BUCKET, pa.int32(), nullable=False),
    ]
)
TIMER_INDEX = pa.schema(
    [
        pa.field("timer_ms", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field(BUCKET, pa.int32(), nullable=False),
        pa.field("pending", pa.bool_(), nullable=False),
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field(SLOT, pa.int64(), nullable=False),
    ]
)
TIMER_CHANGE = TIMER_INDEX.remove(TIMER_INDEX.get_field_index(SLOT))
"""A timer's row as a batch's task gives it (``Pinned.written`` adds the slot)."""
FILE_ROWS_BYTES = 64 * 2**20
"""The rows of the tables' data files a process keeps between batches (``FileRows``)."""


class FileRows:
    """The rows of the keyed tables' data files, each file read once per process while the
    rows kept fit in ``limit`` bytes (the least recently read go first).

    A data file is never changed once written: each writer (a task's ``write_files``,
    delta-rs's compaction and deletes) names every new file after a random uuid, and a
    table changes by adding and removing files. So a file's rows stay its rows for every
    version that lists it, and a batch reads only the files committed since the last read
    of its table in the same process (the driver's, for a batch that only fires timers; a
    Python worker's, for a task), not every file of the table again. Which files a version
    holds is always read from its Delta log."""

    def __init__(self, limit: int = FILE_ROWS_BYTES) -> None:
        self.limit = limit
        self._kept: OrderedDict[str, pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # the driver may run several pipelines' batches

    def rows(
        self,
        table: DriverTable,
        version: int,
        column: str,
        wanted: Callable[[pa.ChunkedArray], pa.ChunkedArray],
    ) -> pa.Table:
        """The rows of ``table`` as of ``version`` in the files whose value of the partition
        column ``column`` is ``wanted`` (a mask over those values): ``table``'s columns but
        ``column``."""
        assert table.schema is not None, f"{table.path}: only a table of fixed columns is read"
        schema = table.schema.remove(table.schema.get_field_index(column))
        delta = table.open(version)
        features = delta.protocol().reader_features
        if features:  # deletion vectors, column mapping: a file alone no longer says its rows
            raise CheckpointCorrupt(
                f"{table.what} {table.path} uses Delta reader features {sorted(features)}, "
                "which lowmark never writes to it: restore it from backup, or start over with "
                "`lowmark reset`"
            )
        files = pa.table(delta.get_add_actions(flatten=True))
        files = files.filter(wanted(files.column(f"partition.{column}")))
        filesystem, root = storage.filesystem(table.path)
        parts = []
        for path in files.column("path").to_pylist():
            location = f"{root}/{unquote(path)}"
            with self._lock:
                kept = self._kept.get(location)
                if kept is not None:
                    self._kept.move_to_end(location)
            if kept is None:
                try:
                    with filesystem.open_input_file(location) as source:
                        read = pq.ParquetFile(source).read(use_threads=False)
                except (OSError, pa.ArrowException) as exc:  # gone, or not Parquet
                    raise CheckpointCorrupt(
                        f"{table.what} {table.path} cannot be read as of version {version} "
                        f"({first_line(exc)}): restore it from backup, or start over with "
                        "`lowmark reset`"
                    ) from exc
                kept = _conformed(read, schema)
                self._keep(location, kept)
            parts.append(kept)
        return pa.concat_tables(parts) if parts else schema.empty_table()

    def _keep(self, location: str, rows: pa.Table) -> None:
        with self._lock:
            if location in self._kept or rows.nbytes > self.limit:
                return
            self._kept[location] = rows
            self._bytes += rows.nbytes
            while self._bytes > self.limit:
                _, gone = self._kept.popitem(last=False)
                self._bytes -= gone.nbytes


FILE_ROWS = FileRows()
"""This process's (``FileRows``): batches and tasks read the keyed tables through it."""


def _conformed(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """A data file's ``rows`` in ``schema`` (a column the file predates as nulls)."""
    if [(f.name, f.type) for f in rows.schema] == [(f.name, f.type) for f in schema]:
        return rows.cast(schema)
    return pa.table(
        {
            f.name: (
                rows.column(f.name).cast(f.type)
                if f.name in rows.column_names
                else pa.nulls(rows.num_rows, f.type)
            )
            for f in schema
        },
        schema=schema,
    )


@dataclass(frozen=True)
class Expiry:
    """What the states' TTLs have expired by: ``processing_ms`` (a processing time) for a
    state with processing-time TTL; ``watermark_ms`` for those named in ``by_event_time``
    (event-time TTL; no watermark yet: none of them has expired). A row's
    ``expires_ms`` at or below its clock's time has expired."""

    processing_ms: int
    watermark_ms: int | None = None
    by_event_time: frozenset[str] = frozenset()

    def expired(self, state: str, expires_ms: int | None) -> bool:
        """Whether a row of ``state`` that expires at ``expires_ms`` has expired."""
        if expires_ms is None:
            return False
        if state not in self.by_event_time:
            return expires_ms <= self.processing_ms
        return self.watermark_ms is not None and expires_ms <= self.watermark_ms

    def kept(self, rows: pa.Table) -> pa.ChunkedArray:
        """Of ``keyed_state`` ``rows``, which have not expired (``expired``, as a mask)."""
        expires, states = rows.column("expires_ms"), rows.column("state")
        by_event = pc.is_in(states, pa.array(sorted(self.by_event_time), pa.string()))
        unexpired = pc.or_kleene(pc.is_null(expires), pc.greater(expires, self.processing_ms))
        if self.watermark_ms is None:  # no watermark yet: none has expired
            by_watermark = pa.repeat(pa.scalar(True), rows.num_rows)
        else:
            by_watermark = pc.or_kleene(pc.is_null(expires), pc.greater(expires, self.watermark_ms))
        return pc.if_else(by_event, by_watermark, unexpired)

    def unexpired_sql(self) -> str:
        """``expired``'s negation as a SQL condition over ``keyed_state``'s columns."""
        names = (name.replace("'", "''") for name in sorted(self.by_event_time))
        by_event = ", ".join(f"'{name}'" for name in names) or "NULL"
        watermark = "NULL" if self.watermark_ms is None else str(int(self.watermark_ms))
        return (
            "(expires_ms IS NULL OR CASE WHEN state IN "
            f"({by_event}) THEN {watermark} IS NULL OR expires_ms > {watermark} "
            f"ELSE expires_ms > {int(self.processing_ms)} END)"
        )


@dataclass(frozen=True)
class Pinned:
    """Where a batch's tasks read keyed state and timers: the tables' paths and versions
    (None: the table has no rows yet), and its slot size. Picklable: tasks get it."""

    state_path: str
    state_version: int | None
    timers_path: str
    timers_version: int | None
    slot_ms: int
    writes: bool = True
    """False: the tasks write no files of their changes (``lowmark preview``)."""

    def states(self, buckets: Iterable[int], keys: Iterable[str]) -> pa.Table:
        """The newest row of each (key, state) of ``keys`` (in ``buckets``): ``STATE``'s
        columns but the bucket."""
        wanted = pa.array(sorted(set(keys)), pa.string())
        if self.state_version is None or not len(wanted):
            return STATE.empty_table().drop_columns([BUCKET])
        # The buckets' rows, then the keys' in Arrow: an SQL `key IN (...)` of thousands of
        # keys costs more than reading the buckets, and opens every file anew.
        table = DriverTable(self.state_path, STATE, "keyed state table")
        held = pa.array(sorted(set(buckets)), pa.int32())
        rows = FILE_ROWS.rows(
            table, self.state_version, BUCKET, lambda b: pc.is_in(b, value_set=held)
        )
        rows = rows.filter(pc.is_in(rows.column("key"), value_set=wanted))
        return latest(rows, ("key", "state"))

    def due(self, buckets: Iterable[int], now_ms: int) -> pa.Table:
        """The keys (``key``, ``timer_ms``, ``_lowmark_bucket``) with a pending timer at or below
        ``now_ms``: ``TIMER_INDEX``'s columns but the slot."""
        if self.timers_version is None:
            return TIMER_CHANGE.empty_table()
        table = DriverTable(self.timers_path, TIMER_INDEX, "keyed timer table")
        last = now_ms // self.slot_ms
        rows = FILE_ROWS.rows(table, self.timers_version, SLOT, lambda s: pc.less_equal(s, last))
        held = pa.array(sorted(set(buckets)), pa.int32())
        rows = rows.filter(
            pc.and_(
                pc.less_equal(rows.column("timer_ms"), now_ms),
                pc.is_in(rows.column(BUCKET), value_set=held),
            )
        )
        rows = latest(rows, ("key", "timer_ms"))
        return rows.filter(rows.column("pending"))

    def written(
        self, states: pa.Table, timers: pa.Table, batch_id: int
    ) -> dict[str, list[WrittenFile]]:
        """A task's changes of batch ``batch_id`` (``STATE`` rows, ``TIMER_CHANGE`` rows)
        written as new data files of the two tables, by table name
        (``lowmark.state.task_appends``); nothing is committed (``KeyedTables.write``).
        Without ``writes``, no file: no table has any."""
        if not self.writes:
            return {STATE_TABLE: [], TIMER_TABLE: []}
        slots = pc.divide(timers.column("timer_ms"), self.slot_ms)
        return {
            STATE_TABLE: write_files(
                self.state_path, states.cast(STATE), STATE_PARTITIONS, batch_id
            ),
            TIMER_TABLE: write_files(
                self.timers_path,
                timers.append_column(SLOT, slots).cast(TIMER_INDEX),
                TIMER_PARTITIONS,
                batch_id,
            ),
        }


class KeyedTables:
    """The ``keyed_state`` and ``keyed_timers`` tables of a checkpoint (see above)."""

    def __init__(self, state_path: str, timers_path: str, pipeline_id: str, slot_ms: int) -> None:
        """Writes carry the application transactions ``<pipeline_id>:keyed_state`` and
        ``<pipeline_id>:keyed_timers`` (as ``Checkpoint.txn_app_id`` names them)."""
        self.state = DriverTable(
            state_path, STATE, "keyed state table", partition_by=STATE_PARTITIONS
        )
        self.timers = DriverTable(
            timers_path, TIMER_INDEX, "keyed timer table", partition_by=TIMER_PARTITIONS
        )
        self.contracts = {
            name: StateTable(name, table, f"{pipeline_id}:{name}", base=0)
            for name, table in ((STATE_TABLE, self.state), (TIMER_TABLE, self.timers))
        }
        """How a batch reads, records and writes each (``lowmark.state.state_table``)."""
        self.slot_ms = max(slot_ms, SLOT_MIN_MS)

    def create(self) -> None:
        """Both tables, empty, unless they exist: version 0 is what a checkpoint's first
        batch reads on its replay (``pinned``)."""
        self.state.create()
        self.timers.create()

    def pinned(
        self, recorded: Mapping[str, int], replay: bool, batch_id: int, writes: bool = True
    ) -> Pinned:
        """The versions batch ``batch_id`` reads (``StateTable.read_version``; ``recorded``:
        commit N-1's versions); ``writes``: whether its tasks write their changes
        (``Pinned.writes``)."""
        state, timers = (
            self.contracts[name].read_version(recorded, replay, batch_id)
            for name in (STATE_TABLE, TIMER_TABLE)
        )
        return Pinned(self.state.path, state, self.timers.path, timers, self.slot_ms, writes)

    def write(
        self, files: Mapping[str, Sequence[WrittenFile]], batch_id: int, now_ms: int | None
    ) -> None:
        """Commit the data files batch ``batch_id``'s tasks wrote (``Pinned.written``, by
        table name) once per table, then delete the timer slots below ``now_ms`` (none of
        their timers is pending any more; None: no time yet)."""
        for name, contract in self.contracts.items():
            if files.get(name):
                contract.table.commit_files(files[name], contract.app_id, batch_id)
        if now_ms is None:
            return
        below = now_ms // self.slot_ms
        held = {int(p[SLOT]) for p in self.timers.open().partitions()}
        if any(slot < below for slot in held):
            self.timers.delete(f'"{SLOT}" < {below}', batch_id)

    def next_pending(self, after_ms: int | None) -> int | None:
        """The earliest pending timer after ``after_ms`` (None: no timer is pending): the
        slots from ``after_ms`` on, earliest first, until one holds a pending timer (every
        timer at or below the time a batch ran at fired in it)."""
        if not self.timers.exists():
            return None
        after = after_ms if after_ms is not None else -(2**62)
        slots = sorted(
            s
            for s in {int(p[SLOT]) for p in self.timers.open().partitions()}
            if s >= after // self.slot_ms
        )
        for slot in slots:
            found = self._first_pending(f'"{SLOT}" = {slot} AND "timer_ms" > {after}')
            if found is not None:
                return found
        return None

    def _first_pending(self, where: str) -> int | None:
        """The earliest pending timer of the rows ``where`` selects (None: none is pending).

        A timer is pending if a row set it and no later row deleted it (fired or
        cancelled). The deletions are read whole (a slot holds as many as timers fired
        or were cancelled in its span); the rows that set a timer, earliest first, a
        page at a time, until one has no later deletion: a slot of a million pending
        timers costs one page, not a million rows brought to Python."""
        deleted: dict[tuple[str, int], int] = {}
        gone = self.timers.query(
            "SELECT key, timer_ms, max(batch_id) AS batch_id FROM t "
            f'WHERE {where} AND NOT "pending" GROUP BY key, timer_ms'
        )
        for key, timer_ms, batch_id in zip(
            *(gone.column(c).to_pylist() for c in ("key", "timer_ms", "batch_id")), strict=True
        ):
            deleted[(key, timer_ms)] = batch_id
        offset, page_rows = 0, PENDING_PAGE
        while page_rows == PENDING_PAGE:  # a short page is the last
            page = self.timers.query(
                f'SELECT key, timer_ms, batch_id FROM t WHERE {where} AND "pending" '
                f"ORDER BY timer_ms, key, batch_id LIMIT {PENDING_PAGE} OFFSET {offset}"
            )
            for key, timer_ms, batch_id in zip(
                *(page.column(c).to_pylist() for c in ("key", "timer_ms", "batch_id")),
                strict=True,
            ):
                if deleted.get((key, timer_ms), NEVER) < batch_id:
                    return int(timer_ms)
            offset, page_rows = offset + PENDING_PAGE, page.num_rows
        return None


@dataclass(frozen=True)
class Held:
    """What a keyed step holds now: keys with state or timers, pending timers, the next."""

    keys: int
    timers: int
    next_timer_ms: int | None


def held(state_path: str, timers_path: str, expiry: Expiry | None = None) -> Held:
    """``Held`` of the tables at ``state_path`` and ``timers_path`` (one query each, over
    every row: for ``lowmark status`` and Dagster, not for a batch); with ``expiry``, a
    key whose every state expired by then is not held."""
    state = DriverTable(state_path, STATE, "keyed state table")
    timers = DriverTable(timers_path, TIMER_INDEX, "keyed timer table")
    keys = (
        state.query(
            "SELECT count(DISTINCT key) AS n FROM (SELECT key, state, value, expires_ms, "
            "row_number() OVER (PARTITION BY key, state ORDER BY batch_id DESC) AS rn FROM t) "
            f"WHERE rn = 1 AND value IS NOT NULL"
            f"{'' if expiry is None else ' AND ' + expiry.unexpired_sql()}"
        )
        if state.exists()
        else None
    )
    pending = (
        timers.query(
            "SELECT count(*) AS n, min(timer_ms) AS next FROM (SELECT pending, timer_ms, "
            "row_number() OVER (PARTITION BY key, timer_ms ORDER BY batch_id DESC) AS rn "
            "FROM t) WHERE rn = 1 AND pending"
        )
        if timers.exists()
        else None
    )
    return Held(
        int(keys.column("n")[0].as_py()) if keys is not None else 0,
        int(pending.column("n")[0].as_py()) if pending is not None else 0,
        pending.column("next")[0].as_py() if pending is not None else None,
    )


def latest(rows: pa.Table, identity: tuple[str, ...]) -> pa.Table:
    """The row with the highest ``batch_id`` of each ``identity``."""
    if rows.num_rows < 2:
        return rows
    order = [(c, "ascending") for c in identity] + [("batch_id", "descending")]
    rows = rows.sort_by(order)
    changed = pa.array([False] * (rows.num_rows - 1))
    for c in identity:
        values = rows.column(c).combine_chunks()
        changed = pc.or_(changed, pc.not_equal(values[1:], values[:-1]))
    return rows.filter(pa.concat_arrays([pa.array([True]), changed]))


def compact_latest(state: DriverTable, expiry: Expiry | None = None) -> None:
    """Rewrite the ``keyed_state`` table ``state`` with only the newest row of each (key,
    state), cleared ones and (with ``expiry``: the processing time and watermark of the
    last committed batch; later batches run at no earlier ones) those expired by then left
    out, when those are fewer than half its rows: the reads of a batch then open what is
    held, not its history.

    The rewrite removes only the files of the version it read: rows a batch appends
    meanwhile stay, and being newer they win (``latest``). Not a batch's write: repeating
    it is harmless, and readers of earlier versions (a pending replay) are unaffected.
    """
    table = state.open()
    rows = state.read(None, table.version())
    held = latest(rows, ("key", "state"))
    kept = pc.is_valid(held.column("value"))
    if expiry is not None:
        kept = pc.and_kleene(kept, expiry.kept(held))
    held = held.filter(kept)
    if held.num_rows * 2 > rows.num_rows:
        return
    write_deltalake(
        table,
        held,
        mode="overwrite",
        partition_by=list(STATE_PARTITIONS),
        post_commithook_properties=HOOKS,
    )


def key_json(values: Iterable[object]) -> str:
    """A key's values as the ``key`` column holds them."""
    return json.dumps(list(values), default=str, separators=(",", ":"))
