"""Driver tables: Delta tables the driver reads and writes with delta-rs.

Bookkeeping never costs a Spark job: every table of a checkpoint (the logs,
the file manifest, the source schema, watermarks, window state, the bad and
late records), the sink of a windowed pipeline (its rows are the few
windows a batch emits) and the appended sink of a deduplicating or keyed
pipeline (the files its tasks wrote) are read and written here, on the driver, with the
``deltalake`` package. They stay plain Delta tables that Spark SQL queries and
time-travels. Each table has exactly one writer engine, delta-rs: Spark never
writes them (mixed writers break Spark's checksum path, and delta-spark's
local log store only locks within one JVM, where delta-rs commits with an
atomic put-if-absent across processes).

One behaviour for every table:

- missing (its folder or ``_delta_log`` gone): ``CheckpointMissing`` naming it;
- unreadable (a damaged log or data file): ``CheckpointCorrupt`` naming it;
- every write is idempotent per (app id, batch id) with a Delta application
  transaction. delta-rs records the transaction but does not skip a repeated
  version by itself, so ``write_once`` checks ``transaction_version`` first.
  Two writers of one (app id, version) racing: delta-rs fails the loser's
  commit; it re-reads, finds the version landed, and skips.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from deltalake import (
    CommitProperties,
    DeltaTable,
    PostCommitHookProperties,
    QueryBuilder,
    Transaction,
    write_deltalake,
)
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.table import TableMerger

from lowmark.state.errors import CheckpointCorrupt, CheckpointMissing, WriteConflict, first_line
from lowmark.state.ownership import writer_metadata
from lowmark.state.storage import delta_rs_options, is_table, open_table

# Arrow compute and the files tasks write (Parquet) are imported where a write uses them:
# reading a checkpoint (``lowmark status``, ``plan``) needs neither (docs/cli.md, "Fast
# commands").
if TYPE_CHECKING:
    from lowmark.state.task_appends import WrittenFile

log = logging.getLogger(__name__)

UTC_MICROS = pa.timestamp("us", tz="UTC")
"""Every timestamp column: timezone-aware UTC (a naive one would become timestampNtz)."""

TABLE_CONFIGURATION = {
    "delta.checkpointInterval": "10",
    "delta.logRetentionDuration": "interval 1 minutes",
    "delta.enableExpiredLogCleanup": "false",
}
"""Checkpoint the Delta log every 10 commits (as Spark does): opening a table reads one
checkpoint and a few commits. Log files are deleted only by maintenance (``maintain``), which
first checkpoints the version the last commit recorded (what a replay reads), then deletes
log files below it older than a minute: the log folder holds what came since the last
maintenance, whatever the history's length. Deleting expired log files after every
automatic checkpoint (Delta's default) is off: after an idle stretch it would delete the
log of the very version a replay must read. Time travel to versions before the last
maintenance is given up for it."""

HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
"""Every driver commit: automatic checkpoints yes, log clean-up no (see TABLE_CONFIGURATION),
whatever the properties of a table created before this setting."""

ATTEMPTS = 5
PAUSE_S = 0.2
"""Pause before the first retry of a lost commit; doubled before each next one."""

OP = "_lowmark_op"
"""Column of a MERGE's changes: 'upsert' or 'delete'."""

Write = Callable[[DeltaTable | None, CommitProperties], None]
"""Writes to the table (None: it does not exist yet) committing with the properties given."""


class DriverTable:
    """One Delta table at ``path``, driven by delta-rs.

    ``schema`` fixes its columns; None lets the first write decide (window
    state, whose columns follow the pipeline's aggregates). The write that
    creates the table partitions it by ``partition_by``.
    """

    def __init__(
        self,
        path: str,
        schema: pa.Schema | None = None,
        what: str = "checkpoint table",
        properties: dict[str, str] | None = None,
        partition_by: tuple[str, ...] = (),
    ) -> None:
        """``properties`` None: a checkpoint table, created with ``TABLE_CONFIGURATION``,
        its commits running ``HOOKS``. A dict: a user's table (a sink), created with exactly
        those properties, everything else (log retention, log clean-up) Delta's defaults."""
        self.path = path.rstrip("/")
        self.schema = schema
        self.what = what
        self.configuration = TABLE_CONFIGURATION if properties is None else properties
        self.hooks = HOOKS if properties is None else None
        self.partition_by = partition_by
        self.storage = delta_rs_options(self.path)
        """delta-rs's storage options: None for a local table, the store's for one on
        object storage (``lowmark.state.storage``)."""
        self._handle: DeltaTable | None = None
        """The newest version this object read or wrote, brought up to date by ``open``:
        opening a table again reads its log from the last checkpoint (4-12 ms), bringing
        a handle up to date lists the log and reads the commits since (about 1 ms), and a
        delta-rs write or MERGE through a handle moves the handle to the version it
        committed (a commit of written files does not)."""
        self._log = None if "://" in self.path else os.path.join(self.path, "_delta_log")
        """A local table's log folder (None on object storage): where ``open`` asks
        whether a commit came after the handle's."""

    def exists(self) -> bool:
        return is_table(self.path)

    def create(self) -> None:
        """Create the table empty unless it exists (racing creators: one wins, none fails)."""
        if self.exists():
            return
        assert self.schema is not None, f"{self.path}: a table without a schema cannot be empty"
        try:
            write_deltalake(
                self.path,
                self.schema.empty_table(),
                mode="ignore",
                configuration=self.configuration,
                storage_options=self.storage,
                partition_by=list(self.partition_by) or None,
            )
        except (CommitFailedError, DeltaError):
            if not self.exists():
                raise

    def open(self, version: int | None = None) -> DeltaTable:
        """The table at its newest ``version`` (or the one given); raises if missing or damaged."""
        try:
            if version is not None:
                return open_table(self.path, version)
            if self._handle is None:
                self._handle = open_table(self.path)
            elif self._behind(self._handle):
                self._handle.update_incremental()
            return self._handle
        except Exception as exc:  # delta-rs raises plain exceptions for damaged logs
            self._handle = None
            # A table that is there but no longer has the version asked for (its log was
            # cleaned up) is "not found" to delta-rs: it is not missing, that version is.
            asked_for_version = version is not None and self.exists()
            if not asked_for_version and (isinstance(exc, TableNotFoundError) or not self.exists()):
                raise self.missing() from exc
            at = f" as of version {version}" if version is not None else ""
            raise CheckpointCorrupt(
                f"{self.what} {self.path} cannot be read{at} ({first_line(exc)}): restore it "
                "from backup, or start over with `lowmark reset`"
            ) from exc

    def _behind(self, handle: DeltaTable) -> bool:
        """Whether a commit may have landed after ``handle``'s version: its successor's log
        entry is there (a look at one file, where delta-rs lists the log), or the table is
        on object storage (delta-rs asks)."""
        if self._log is None:
            return True
        return os.path.exists(os.path.join(self._log, f"{handle.version() + 1:020d}.json"))

    def _current(self) -> DeltaTable | None:
        """The table at its newest version, or None if it does not exist (a held handle is
        brought up to date without asking first whether the table is there)."""
        if self._handle is not None:
            try:
                return self.open()
            except (CheckpointMissing, CheckpointCorrupt):
                pass  # gone or replaced since: asked below
        return self.open() if self.exists() else None

    def missing(self) -> CheckpointMissing:
        return CheckpointMissing(
            f"{self.what} {self.path} is missing: restore it from backup, or start over with "
            "`lowmark reset`"
        )

    def read(self, where: str | None = None, version: int | None = None) -> pa.Table:
        """Rows matching the SQL predicate ``where`` (all rows if None), as plain Arrow.

        Files whose statistics exclude ``where`` are not opened, so a read of a
        few batches' rows costs the same at batch 10 and at batch 100,000.
        Columns are quoted with double quotes in ``where`` (``"batch_id" = 3``).
        """
        return self.query("SELECT * FROM t" + (f" WHERE {where}" if where else ""), version)

    def query(self, sql: str, version: int | None = None) -> pa.Table:
        """The result of ``sql`` over the table (named ``t`` in it) as of ``version`` (None:
        the newest), as plain Arrow."""
        table = self.open(version)
        try:
            return query_rows(QueryBuilder().register("t", table).execute(sql))
        except Exception as exc:
            raise CheckpointCorrupt(
                f"{self.what} {self.path} cannot be read ({first_line(exc)}): restore it "
                "from backup, or start over with `lowmark reset`"
            ) from exc

    def version(self) -> int:
        return int(self.open().version())

    def landed(self, app_id: str, version: int) -> bool:
        """True if a write of (``app_id``, ``version``) or of a later version committed here."""
        return self.exists() and _landed(self.open(), app_id, version)

    def append_once(self, rows: pa.Table, app_id: str, version: int) -> bool:
        """Append ``rows`` unless (``app_id``, ``version``) landed; True if this call wrote.

        The rows go into a Parquet file written here, which one commit adds
        (``lowmark.state.task_appends``): delta-rs's own append costs more with every
        data file the table holds, a commit of written files does not. delta-rs's
        writer appends instead when it has more to do than write rows: creating the
        table, adding a column to it, or checking what a user's table asks of its rows
        (``_files_schema``).
        """
        data = rows if self.schema is None else rows.select(self.schema.names).cast(self.schema)
        writer = self._writer(data, "append")

        def append(table: DeltaTable | None, commit: CommitProperties) -> None:
            target = None if table is None else self._files_schema(table, data.schema)
            try:
                conformed = None if target is None else data.cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
                conformed = None  # delta-rs's writer says what does not fit
            if table is None or conformed is None:
                writer(table, commit)
                return
            from lowmark.state.task_appends import write_files

            columns = tuple(table.metadata().partition_columns)
            self._add(table, write_files(self.path, conformed, columns, version), commit)

        return self.write_once(append, app_id, version)

    def file_schema(self, rows: pa.Schema) -> pa.Schema | None:
        """The schema rows of schema ``rows`` are written in as a data file of this table (by
        the tasks that made them: ``lowmark.state.task_appends``, then ``commit_files``), or
        None when they must go through delta-rs's writer (``append_once``): the table does
        not exist, or see ``_files_schema``."""
        table = self._current()
        return None if table is None else self._files_schema(table, rows)

    def _files_schema(self, table: DeltaTable, rows: pa.Schema) -> pa.Schema | None:
        """The schema ``rows`` are written in as a file of ``table``, or None when
        delta-rs's writer must append them.

        A checkpoint table: the rows' own, when each of their columns is one of the
        table's, of the same type (a column they add, or one whose type changed, is
        delta-rs's to evolve or refuse). A user's table (a sink): the table's, when
        the rows have exactly its columns, each of a type ``_alike`` its column's, the table is not
        partitioned, and nothing is asked of a row: no constraint, invariant,
        generated or identity column, column mapping, or writer feature but
        append-only.
        """
        target = pa.schema(table.schema().to_arrow())
        if self.hooks is HOOKS:
            held = dict(zip(target.names, target.types, strict=True))
            return rows if all(held.get(f.name) == f.type for f in rows) else None
        protocol, metadata = table.protocol(), table.metadata()
        features = set(protocol.writer_features or ())
        if (
            not (protocol.min_writer_version <= 2 or features <= {"appendOnly"})
            or protocol.reader_features
            or metadata.partition_columns
            or any(k.startswith("delta.constraints.") for k in metadata.configuration)
        ):
            return None
        asked = ("delta.invariants", "delta.generationExpression", "delta.identity.")
        if any(k.startswith(asked) for f in table.schema().fields for k in f.metadata):
            return None
        if target.names != rows.names or not all(map(_alike, rows.types, target.types)):
            return None
        return target

    def commit_files(self, files: Sequence[WrittenFile], app_id: str, version: int) -> bool:
        """Add ``files`` (data files tasks wrote into this table's folder,
        ``lowmark.state.task_appends``) in one commit, unless (``app_id``, ``version``)
        landed; True if this call committed. The table must exist (it is never created
        from files) and its partition columns must be the files' partition values."""

        def add(table: DeltaTable | None, commit: CommitProperties) -> None:
            if table is None:
                raise self.missing()
            self._add(table, files, commit)

        return self.write_once(add, app_id, version)

    def _add(
        self, table: DeltaTable, files: Sequence[WrittenFile], commit: CommitProperties
    ) -> None:
        """Commit ``files``, written into ``table``'s folder, to it as ``commit``."""
        columns = list(table.metadata().partition_columns)
        strays = [f.path for f in files if sorted(f.partition_values) != sorted(columns)]
        if strays:
            raise CheckpointCorrupt(
                f"{self.what} {self.path} is partitioned by {columns}, not as its new "
                f"files {strays[:3]}: restore it from backup, or start over with "
                "`lowmark reset`"
            )
        table.create_write_transaction(
            [f.action() for f in files],
            mode="append",
            schema=table.schema(),
            partition_by=columns,
            commit_properties=commit,
            post_commithook_properties=self.hooks,
        )

    def replace_once(self, rows: pa.Table, where: str, app_id: str, version: int) -> bool:
        """Replace the rows matching the SQL predicate ``where`` with ``rows``, atomically and
        unless (``app_id``, ``version``) landed; True if this call wrote."""
        return self.write_once(self._writer(rows, "overwrite", where), app_id, version)

    def _writer(
        self, rows: pa.Table, mode: Literal["append", "overwrite"], where: str | None = None
    ) -> Write:
        """A ``Write`` of ``rows`` in ``mode`` (overwrite: the rows matching ``where``)."""

        options: dict[str, Any] = {"mode": mode}
        if where is not None:
            options["predicate"] = where
        else:  # a log entry's columns added since the table was created are added to it
            options["schema_mode"] = "merge"

        def write(table: DeltaTable | None, commit: CommitProperties) -> None:
            created: dict[str, Any] = {}
            if table is None and self.partition_by:  # the write that creates the table
                created["partition_by"] = list(self.partition_by)
            write_deltalake(
                table if table is not None else self.path,
                rows,
                configuration=self.configuration,
                storage_options=self.storage if table is None else None,
                commit_properties=commit,
                post_commithook_properties=self.hooks,
                **options,
                **created,
            )

        return write

    def append(self, rows: pa.Table) -> None:
        """Append ``rows`` with no idempotency key (records of events, where a repeat is
        harmless); creates the table if needed."""
        self._writer(rows, "append")(self._current(), CommitProperties())

    def insert_new_once(
        self, rows_for: Callable[[pa.Table], pa.Table], key: str, app_id: str, version: int
    ) -> bool:
        """Insert the rows ``rows_for(current rows)`` gives, once per (``app_id``,
        ``version``), as a MERGE that inserts only keys the table lacks.

        ``rows_for`` sees the rows of the very snapshot the commit is based on,
        so rows another writer committed since a caller last read the table are
        not inserted again; a commit that lands in between makes this one
        conflict and retry on the new snapshot (``write_once``).
        """

        def write(table: DeltaTable | None, commit: CommitProperties) -> None:
            assert self.schema is not None
            current = table.to_pyarrow_table() if table is not None else self.schema.empty_table()
            rows = rows_for(current)
            if not rows.num_rows:
                return
            if table is None:
                self._writer(rows, "append")(None, commit)
                return
            self._merge_on(key, table, rows, commit).when_not_matched_insert_all().execute()

        return self.write_once(write, app_id, version)

    def merge_once(
        self,
        upserts: pa.Table,
        deletes: pa.Table,
        identity: tuple[str, ...],
        app_id: str,
        version: int,
        target_where: str | None = None,
    ) -> bool:
        """One idempotent MERGE on ``identity``: upsert ``upserts``, delete ``deletes``' rows.

        ``deletes`` holds identity columns only and shares no identity with
        ``upserts``. Nulls in ``identity`` match nulls. ``target_where``, an
        SQL predicate over target columns (``t."window_start" >= ...``), must
        hold for every row a change can match: it lets delta-rs skip the
        target's other files by their statistics. A table that does not exist
        yet is created from ``upserts``.
        """
        columns = upserts.column_names
        changes = pa.concat_tables(
            [
                upserts.append_column(OP, pa.array(["upsert"] * upserts.num_rows)),
                deletes.append_column(OP, pa.array(["delete"] * deletes.num_rows)),
            ],
            promote_options="permissive",
        )
        on = " AND ".join(f'(t."{c}" IS NOT DISTINCT FROM s."{c}")' for c in identity)
        if target_where:
            on = f"({target_where}) AND {on}"
        values = {c: f's."{c}"' for c in columns}

        def merge(table: DeltaTable | None, commit: CommitProperties) -> None:
            if table is None:
                self._writer(upserts, "append")(None, commit)
                return
            (
                table.merge(
                    changes,
                    predicate=on,
                    source_alias="s",
                    target_alias="t",
                    merge_schema=True,  # a column added since (the window state's row counts)
                    commit_properties=commit,
                    post_commithook_properties=self.hooks,
                )
                .when_matched_delete(predicate=f"s.{OP} = 'delete'")
                .when_matched_update(updates=values, predicate=f"s.{OP} = 'upsert'")
                .when_not_matched_insert(updates=values, predicate=f"s.{OP} = 'upsert'")
                .execute()
            )

        return self.write_once(merge, app_id, version)

    def update(self, rows: pa.Table, key: str, batch_id: int) -> None:
        """Set the other columns of ``rows`` on the table's rows with the same ``key``, for
        batch ``batch_id``.

        No idempotency key: setting the same values again is harmless. A
        commit lost to another writer is retried on the new snapshot.
        """
        values = {c: f's."{c}"' for c in rows.column_names if c != key}

        def write(table: DeltaTable | None, commit: CommitProperties) -> None:
            assert table is not None, f"{self.path}: no rows to update"
            self._merge_on(key, table, rows, commit).when_matched_update(updates=values).execute()

        self._commit(write, None, batch_id)

    def delete(self, where: str, batch_id: int) -> None:
        """Delete the rows matching the SQL predicate ``where``, for batch ``batch_id``
        (no idempotency key: deleting again is harmless)."""

        def write(table: DeltaTable | None, commit: CommitProperties) -> None:
            assert table is not None, f"{self.path}: no rows to delete"
            table.delete(where, commit_properties=commit, post_commithook_properties=self.hooks)

        self._commit(write, None, batch_id)

    def maintain(
        self, drop_where: str | None, keep_hours: int, keep_version: int | None = None
    ) -> None:
        """Maintenance: checkpoint the log and delete expired log files, then delete the rows
        matching ``drop_where`` (if any), merge small files, and delete data files removed
        over ``keep_hours`` ago.

        ``keep_version`` (default: the current version) is the version a pending replay
        or a backfill reads: the one the last commit recorded. The log is checkpointed
        there and only log files below it and older than the log retention are deleted,
        before anything else commits; VACUUM keeps its data files however long ago a
        later version removed them. So it stays readable whatever committed since (a
        crashed batch's own write, an earlier maintenance's OPTIMIZE) and however long
        ago. Not a batch's write (no application transaction): repeating it is harmless.
        Readers of the current version are unaffected, and so are readers of any version
        since ``keep_version`` (data files: less than ``keep_hours`` old).
        """
        assert self.hooks is HOOKS, f"{self.path}: maintenance is for checkpoint tables only"
        table = self.open()
        kept = table if keep_version is None else self.open(keep_version)
        kept.create_checkpoint()
        kept.cleanup_metadata()
        quiet = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
        config = table.metadata().configuration
        if any(config.get(k) != v for k, v in TABLE_CONFIGURATION.items()):
            table.alter.set_table_properties(TABLE_CONFIGURATION, post_commithook_properties=quiet)
        if drop_where is not None:
            table.delete(drop_where, post_commithook_properties=quiet)
        table.optimize.compact(post_commithook_properties=quiet)
        table.vacuum(
            retention_hours=keep_hours,
            dry_run=False,
            enforce_retention_duration=False,
            post_commithook_properties=quiet,
            keep_versions=[int(kept.version())],
        )
        self._handle = None

    def _merge_on(
        self, key: str, table: DeltaTable, rows: pa.Table, commit: CommitProperties
    ) -> TableMerger:
        """A MERGE of ``rows`` into ``table`` matching on the column ``key`` (add the clauses)."""
        return table.merge(
            rows,
            predicate=f't."{key}" = s."{key}"',
            source_alias="s",
            target_alias="t",
            commit_properties=commit,
            post_commithook_properties=self.hooks,
            merge_schema=True,  # a column added since the table was created is added to it
        )

    def files(self) -> int:
        """Data files in the table's current version."""
        return len(self.open().file_uris())

    def write_once(self, write: Write, app_id: str, version: int) -> bool:
        """Run ``write`` unless (``app_id``, ``version``) landed; True if this call wrote.

        The check and the commit use one snapshot: ``write`` must commit on
        the handle it is given, so a commit that landed in between makes this
        one conflict instead of landing twice. A commit lost to another writer
        (a racing runner of the same batch, a maintenance job) is retried on
        the new snapshot, after checking again whether the batch landed.
        """
        return self._commit(write, app_id, version)

    def _commit(self, write: Write, app_id: str | None, version: int) -> bool:
        """``write_once``; with no ``app_id``, ``write`` always runs (retried when lost)."""
        pause = PAUSE_S
        for attempt in range(1, ATTEMPTS + 1):
            table = self._current()
            if table is not None and app_id is not None and _landed(table, app_id, version):
                return False
            commit = (
                CommitProperties(
                    custom_metadata={"userMetadata": writer_metadata(app_id, version)},
                    app_transactions=[Transaction(app_id, version)],
                )
                if app_id is not None
                else CommitProperties()
            )
            try:
                write(table, commit)
                return True
            except (CommitFailedError, DeltaError) as exc:
                self._handle = None
                # A table created meanwhile by a racing creator is a DeltaError too.
                if not isinstance(exc, CommitFailedError) and table is not None:
                    raise
                if attempt == ATTEMPTS:
                    raise WriteConflict(
                        f"batch {version} lost {ATTEMPTS} write conflicts on {self.path} "
                        f"({first_line(exc)}): pause whatever else writes it and run again; "
                        "the batch is replayed"
                    ) from exc
                log.warning(
                    "batch %d: commit to %s lost, retrying (%d)", version, self.path, attempt
                )
                time.sleep(pause)
                pause *= 2
        raise AssertionError("unreachable")


def _alike(given: pa.DataType, held: pa.DataType) -> bool:
    """True if values of type ``given`` go into a column of plain type ``held`` as they are,
    or widened or narrowed within one kind (integers, floats, decimals, strings, binary,
    timestamps); a nested type only as it is; a cast across kinds (a number into a string)
    is delta-rs's writer's to refuse or do."""
    if pa.types.is_nested(held):
        return given == held
    kinds = (
        pa.types.is_integer,
        pa.types.is_floating,
        pa.types.is_decimal,
        lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
        lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t),
        pa.types.is_timestamp,
    )
    return given == held or any(kind(given) and kind(held) for kind in kinds)


def _landed(table: DeltaTable, app_id: str, version: int) -> bool:
    """True if ``table`` recorded (``app_id``, ``version``) or a later version of it."""
    found = table.transaction_version(app_id)
    return found is not None and found >= version


def query_rows(result: Any) -> pa.Table:
    """A delta-rs query's ``result`` (an Arrow C stream) as a pyarrow table, view types
    (DataFusion's string_view, binary_view) as plain ones.

    The stream is asked for the plain types (its producer casts), and it is not
    ``pa.table(result)``: that first asks whether its argument is a pandas DataFrame, which
    imports pandas; with a cast of its own (pyarrow.compute), 0.9 s of a command that reads
    its table in 50 ms."""
    views = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    schema = pa.schema([f.with_type(views.get(f.type, f.type)) for f in pa.schema(result.schema)])
    return pa.RecordBatchReader.from_stream(result, schema=schema).read_all()


def micros_literal(micros: int) -> str:
    """An SQL timestamp literal (UTC) for delta-rs predicates, exact to the microsecond."""
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    return f"'{moment.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}'"


def floor_div(values: pa.Array, divisor: int) -> pa.Array:
    """``values // divisor`` as Python floors it (Arrow's integer division truncates)."""
    import pyarrow.compute as pc

    truncated = pc.divide(values, divisor)
    above = pc.greater(pc.multiply(truncated, divisor), values)
    return pc.subtract(truncated, pc.cast(above, pa.int64()))
