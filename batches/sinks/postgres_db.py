"""The database side of the Postgres sink: connecting, the output's table, the batch fence,
and one batch's rows written in one transaction.

Exactly once rests on one transaction per batch. It first inserts
``(app_id, batch_id)`` into the fence table ``lowmark_sink_batches`` of the
target's schema; if that row is there already, the batch landed before (a
replay) and nothing is written. Otherwise the rows go in, the fence row gets
their count, and the transaction commits: both land or neither does. The
fence's primary key also serialises two writers of the same batch: the
second waits on the first's row, then finds it.

A connection lost on the way (the backend terminated, the server shutting
down or failing over to a read-only standby, a serialization failure or a
deadlock: ``TRANSIENT_SQLSTATES``) raises ``SinkUnavailable``, and the
runner tries the batch again: the transaction did not commit, or, cut during
its COMMIT, did and fenced the batch, which the next attempt then finds.

Types (``PG_TYPES``, by the Arrow type of the output's column; a Spark
schema is read through its Arrow form): boolean → ``boolean``; 8- and
16-bit integers → ``smallint``; 32-bit → ``integer``; 64-bit → ``bigint``;
float → ``real``; double → ``double precision``; decimal(p, s) →
``numeric(p, s)``; string → ``text``; binary → ``bytea``; date → ``date``;
timestamp with a time zone (Spark's ``timestamp``) → ``timestamptz``;
without one (``timestamp_ntz``) → ``timestamp``. Nested types (arrays,
maps, structs) have no column type here: cast them (``to_json``) in the
transform.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from lowmark.batches.errors import (
    PipelineConfigInvalid,
    SinkUnavailable,
    SinkUnreachable,
    SinkWriteFailed,
)
from lowmark.batches.pipeline import Pipeline, PostgresSink
from lowmark.batches.sinks.owner import held_elsewhere, is_ours
from lowmark.state.checkpoint import Checkpoint

FENCE_TABLE = "lowmark_sink_batches"
"""The fence table, one per schema that lowmark sinks write: one row per batch written."""

_FENCE_COLUMNS = (
    "app_id text NOT NULL, batch_id bigint NOT NULL, table_name text NOT NULL, "
    "rows bigint NOT NULL, written_at timestamptz NOT NULL DEFAULT now(), "
    "PRIMARY KEY (app_id, batch_id)"
)


TRANSIENT_SQLSTATES = frozenset(
    {
        "25006",  # read_only_sql_transaction: the primary failed over, this is a standby now
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "53300",  # too_many_connections
        "57P01",  # admin_shutdown: pg_terminate_backend, a fast shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now: the server is starting
    }
)
"""SQLSTATEs of a write that a later try may not meet (with class ``08``, connection
exceptions); any other database error refuses the batch."""


PG_TYPES: tuple[tuple[Callable[[pa.DataType], bool], str], ...] = (
    (pa.types.is_boolean, "boolean"),
    (pa.types.is_int8, "smallint"),
    (pa.types.is_int16, "smallint"),
    (pa.types.is_int32, "integer"),
    (pa.types.is_int64, "bigint"),
    (pa.types.is_float32, "real"),
    (pa.types.is_float64, "double precision"),
    (pa.types.is_string, "text"),
    (pa.types.is_large_string, "text"),
    (pa.types.is_binary, "bytea"),
    (pa.types.is_large_binary, "bytea"),
    (pa.types.is_date, "date"),
)
"""Arrow type test → the Postgres type a new table's column gets (decimals and timestamps,
which carry parameters, in ``_pg_type``)."""


def _pg_type(column: pa.Field) -> str:
    """The Postgres type a column of Arrow type ``column.type`` is created with."""
    t = column.type
    if pa.types.is_decimal(t):
        return f"numeric({t.precision}, {t.scale})"
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz is not None else "timestamp"
    found = next((pg for test, pg in PG_TYPES if test(t)), None)
    if found is None:
        raise SinkWriteFailed(
            f"column {column.name} of type {t} has no Postgres column type in the sink: cast "
            "it in the transform (to_json for nested data, a string otherwise)"
        )
    return found


def connection_settings(config: PostgresSink) -> dict[str, Any]:
    """``psycopg.connect`` arguments of ``config``: what it sets (libpq takes the rest from
    its ``PG*`` environment variables), and the password from ``password_env`` if named."""
    settings: dict[str, Any] = {
        "host": config.host,
        "port": config.port,
        "dbname": config.dbname,
        "user": config.user,
        "connect_timeout": config.connect_timeout,
        "application_name": "lowmark",
    }
    if config.password_env is not None:
        password = os.environ.get(config.password_env)
        if password is None:
            raise PipelineConfigInvalid(
                f"sink postgres {config.table}: environment variable {config.password_env} "
                "(`password_env`) is not set: export it with the password, or leave "
                "`password_env` out to use PGPASSWORD or ~/.pgpass"
            )
        settings["password"] = password
    return {k: v for k, v in settings.items() if v is not None}


def connect(config: PostgresSink) -> psycopg.Connection[tuple[Any, ...]]:
    """A connection to ``config``'s database; ``SinkUnreachable`` naming the server and the
    settings to fix when there is none."""
    settings = connection_settings(config)
    try:
        return psycopg.connect(config.dsn or "", **settings)
    except psycopg.OperationalError as exc:
        first = _first(exc)
        raise SinkUnreachable(
            f"sink postgres {config.table}: cannot connect ({first}); fix the sink's `dsn`, "
            "`host`, `port`, `dbname`, `user` or its password (`password_env`, PGPASSWORD, "
            "~/.pgpass)"
        ) from exc


class PostgresTable:
    """A Postgres sink's target: ``config.table``, its fence table beside it, written by
    ``txn_app_id`` (the checkpoint's idempotency key, the fence rows' ``app_id``).

    Each method opens a connection of its own: batches are seconds apart, and a
    connection held across them would outlive a server restart.
    """

    def __init__(self, config: PostgresSink, txn_app_id: str) -> None:
        self.config = config
        self.txn_app_id = txn_app_id
        schema, _, name = config.table.rpartition(".")
        self._schema = schema or None
        self._name = name

    @contextmanager
    def _transaction(self) -> Iterator[tuple[psycopg.Cursor[tuple[Any, ...]], str]]:
        """A cursor in one transaction (committed when the block ends without error) and the
        target's schema (the given one, else the connection's current schema).
        ``SinkUnavailable`` when the connection is lost, in the block or at its commit."""
        try:
            with connect(self.config) as conn, conn.cursor() as cur:
                schema = self._schema
                if schema is None:
                    cur.execute("SELECT current_schema()")
                    found = cur.fetchone()
                    if found is None or found[0] is None:
                        raise SinkWriteFailed(
                            f"sink postgres {self.config.table}: the connection's search_path "
                            "names no schema that exists: qualify `table` as schema.name"
                        )
                    schema = str(found[0])
                yield cur, schema
        except psycopg.Error as exc:
            if _transient(exc):
                raise SinkUnavailable(f"sink postgres {self.config.table}", _first(exc)) from exc
            raise

    def _fence(self, schema: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(FENCE_TABLE))

    def _target(self, schema: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(self._name))

    def check(self) -> None:
        """Connect, and create the fence table (and its schema) if missing: a bad setting
        fails here, in one line, before the first batch writes anything."""
        with self._transaction() as (cur, schema):
            self._create_fence(cur, schema)

    def _create_fence(self, cur: psycopg.Cursor[tuple[Any, ...]], schema: str) -> None:
        """The target's schema and the fence table in it, if missing."""
        # Asked first: CREATE SCHEMA IF NOT EXISTS needs the right to create schemas even
        # when the schema exists, which a user writing into a given schema may lack.
        cur.execute("SELECT to_regnamespace(%s)", (sql.Identifier(schema).as_string(cur),))
        found = cur.fetchone()
        if found is None or found[0] is None:
            cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        cur.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} (" + _FENCE_COLUMNS + ")").format(
                self._fence(schema)
            )
        )

    def check_ours(self, pipeline: Pipeline, checkpoint: Checkpoint) -> None:
        """Before ``checkpoint``'s first batch: ``SinkHeldElsewhere`` when the newest fence row
        of this table is another checkpoint's (its input, read from the start again, would
        land twice), unless ``checkpoint`` continues it (``lowmark reset --after-sink``)."""
        with self._transaction() as (cur, schema):
            if not self._fenced(cur, schema):
                return
            table = f"{schema}.{self._name}"
            cur.execute(
                sql.SQL(
                    "SELECT app_id, max(batch_id) FROM {} WHERE table_name = %s AND app_id <> %s "
                    "GROUP BY app_id ORDER BY max(written_at) DESC LIMIT 1"
                ).format(self._fence(schema)),
                (table, self.txn_app_id),
            )
            other = cur.fetchone()
        if other is None:
            return
        writer = str(other[0]).split(":", 1)[0]
        if not is_ours(checkpoint, writer):
            sink = f"postgres {table}"
            location = checkpoint.location
            raise held_elsewhere(pipeline, location, sink, writer, other[1], "a table of its own")

    def last_writer(self) -> str | None:
        """The pipeline id of the checkpoint whose batch the fence recorded last for this
        table (None: none, or no fence table)."""
        with self._transaction() as (cur, schema):
            if not self._fenced(cur, schema):
                return None
            cur.execute(
                sql.SQL(
                    "SELECT app_id FROM {} WHERE table_name = %s ORDER BY written_at DESC LIMIT 1"
                ).format(self._fence(schema)),
                (f"{schema}.{self._name}",),
            )
            found = cur.fetchone()
        return str(found[0]).split(":", 1)[0] if found is not None else None

    def empty(self) -> None:
        """``lowmark reset --truncate-sink``: in one transaction, delete the table's rows
        (if it exists) and its fence rows, and fence batch -1 of ``app_id`` (the new
        checkpoint's): the new checkpoint then finds the table its own."""
        with self._transaction() as (cur, schema):
            cur.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} (" + _FENCE_COLUMNS + ")").format(
                    self._fence(schema)
                )
            )
            table = f"{schema}.{self._name}"
            cur.execute("SELECT to_regclass(%s)", (f'"{schema}"."{self._name}"',))
            found = cur.fetchone()
            if found is not None and found[0] is not None:
                cur.execute(sql.SQL("DELETE FROM {}").format(self._target(schema)))
            cur.execute(
                sql.SQL("DELETE FROM {} WHERE table_name = %s").format(self._fence(schema)),
                (table,),
            )
            cur.execute(
                sql.SQL(
                    "INSERT INTO {} (app_id, batch_id, table_name, rows) VALUES (%s, -1, %s, 0)"
                ).format(self._fence(schema)),
                (self.txn_app_id, table),
            )

    def _fenced(self, cur: psycopg.Cursor[tuple[Any, ...]], schema: str) -> bool:
        """Whether the fence table exists in ``schema``."""
        cur.execute("SELECT to_regclass(%s)", (f'"{schema}"."{FENCE_TABLE}"',))
        found = cur.fetchone()
        return found is not None and found[0] is not None

    def landed(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` of ``app_id`` is fenced (its rows are in the table)."""
        with self._transaction() as (cur, schema):
            if not self._fenced(cur, schema):
                return False
            cur.execute(
                sql.SQL("SELECT 1 FROM {} WHERE app_id = %s AND batch_id = %s").format(
                    self._fence(schema)
                ),
                (self.txn_app_id, batch_id),
            )
            return cur.fetchone() is not None

    def last_landed(self) -> int:
        """The newest batch of ``app_id`` fenced here; -1 when none is."""
        with self._transaction() as (cur, schema):
            if not self._fenced(cur, schema):
                return -1
            cur.execute(
                sql.SQL("SELECT max(batch_id) FROM {} WHERE app_id = %s").format(
                    self._fence(schema)
                ),
                (self.txn_app_id,),
            )
            found = cur.fetchone()
        return -1 if found is None or found[0] is None else int(found[0])

    def write(
        self,
        schema_of_rows: pa.Schema,
        batch_id: int,
        rows: Iterable[Sequence[Any]],
        retract: pa.Table | None = None,
    ) -> bool:
        """Write batch ``batch_id`` in one transaction: ``rows`` (tuples in the order of
        ``schema_of_rows``, streamed: never all in memory at once) appended or upserted on
        the keys, the identities in ``retract`` deleted first, the batch id fenced. False
        (and nothing written) when the batch is fenced already. Creates the table (from
        ``schema_of_rows``) and the fence table when missing."""
        config = self.config
        try:
            with self._transaction() as (cur, schema):
                self._create(cur, schema, schema_of_rows)
                cur.execute(
                    sql.SQL(
                        "INSERT INTO {} (app_id, batch_id, table_name, rows) "
                        "VALUES (%s, %s, %s, 0) ON CONFLICT DO NOTHING"
                    ).format(self._fence(schema)),
                    (self.txn_app_id, batch_id, f"{schema}.{self._name}"),
                )
                if cur.rowcount == 0:
                    return False
                target, columns = self._target(schema), schema_of_rows.names
                if retract is not None and retract.num_rows:
                    self._delete(cur, target, retract)
                if config.mode == "append":
                    written = _copy(cur, target, columns, rows)
                else:
                    written = self._upsert(cur, target, columns, rows)
                cur.execute(
                    sql.SQL("UPDATE {} SET rows = %s WHERE app_id = %s AND batch_id = %s").format(
                        self._fence(schema)
                    ),
                    (written, self.txn_app_id, batch_id),
                )
        except psycopg.Error as exc:
            raise SinkWriteFailed(_refusal(config, batch_id, exc)) from exc
        return True

    def _create(self, cur: psycopg.Cursor[tuple[Any, ...]], schema: str, of: pa.Schema) -> None:
        """The schema, the fence table and the target, if missing; an upserted target with a
        unique constraint on the keys (nulls equal, so a null key upserts too)."""
        self._create_fence(cur, schema)
        columns = [
            sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(_pg_type(f))) for f in of
        ]
        if self.config.mode == "upsert":
            columns.append(
                sql.SQL("UNIQUE NULLS NOT DISTINCT ({})").format(
                    sql.SQL(", ").join(map(sql.Identifier, self.config.keys))
                )
            )
        cur.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                self._target(schema), sql.SQL(", ").join(columns)
            )
        )

    def _upsert(
        self,
        cur: psycopg.Cursor[tuple[Any, ...]],
        target: sql.Composed,
        columns: list[str],
        rows: Iterable[Sequence[Any]],
    ) -> int:
        """``rows`` copied into a transaction's staging table, then inserted into ``target``,
        each row whose keys are there already updating it; the rows written."""
        stage = sql.Identifier("lowmark_stage")
        names = sql.SQL(", ").join(map(sql.Identifier, columns))
        cur.execute(
            sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
                stage, names, target
            )
        )
        written = _copy(cur, stage, columns, rows)
        keys = self.config.keys
        others = [c for c in columns if c not in keys]
        action = (
            sql.SQL("DO UPDATE SET {}").format(
                sql.SQL(", ").join(
                    sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
                    for c in others
                )
            )
            if others
            else sql.SQL("DO NOTHING")
        )
        cur.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) {}").format(
                target,
                names,
                names,
                stage,
                sql.SQL(", ").join(map(sql.Identifier, keys)),
                action,
            )
        )
        return written

    def _delete(
        self, cur: psycopg.Cursor[tuple[Any, ...]], target: sql.Composed, retract: pa.Table
    ) -> None:
        """Delete the rows whose identity (``retract``'s columns, the window's keys) is in
        ``retract`` (nulls equal)."""
        gone = sql.Identifier("lowmark_retract")
        names = sql.SQL(", ").join(map(sql.Identifier, retract.column_names))
        cur.execute(
            sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
                gone, names, target
            )
        )
        _copy(cur, gone, retract.column_names, arrow_rows(retract))
        matches = sql.SQL(" AND ").join(
            sql.SQL("t.{} IS NOT DISTINCT FROM g.{}").format(sql.Identifier(c), sql.Identifier(c))
            for c in retract.column_names
        )
        cur.execute(
            sql.SQL("DELETE FROM {} AS t USING {} AS g WHERE {}").format(target, gone, matches)
        )


def _copy(
    cur: psycopg.Cursor[tuple[Any, ...]],
    table: sql.Composable,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
) -> int:
    """Stream ``rows`` into ``table``'s ``columns`` with COPY; how many."""
    count = 0
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(table, names)) as copy:
        for row in rows:
            copy.write_row(row)
            count += 1
    return count


def arrow_rows(table: pa.Table) -> Iterator[tuple[Any, ...]]:
    """``table``'s rows as tuples, one record batch in Python at a time."""
    for batch in table.to_batches():
        columns = [column.to_pylist() for column in batch.columns]
        yield from zip(*columns, strict=True)


def _transient(exc: psycopg.Error) -> bool:
    """Whether ``exc`` is the connection or the server briefly away (see above), not a
    refusal of the batch: no answer at all (the connection broke), a connection exception,
    or one of ``TRANSIENT_SQLSTATES``."""
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError)
    return state.startswith("08") or state in TRANSIENT_SQLSTATES


def _first(exc: psycopg.Error) -> str:
    """The first line of ``exc``'s message (its type when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _refusal(config: PostgresSink, batch_id: int, exc: psycopg.Error) -> str:
    """The one line a database error of batch ``batch_id``'s write becomes, with the fix."""
    first = _first(exc)
    if isinstance(exc, psycopg.errors.InvalidColumnReference):  # no unique index on keys
        fix = f"give {config.table} a unique index on ({', '.join(config.keys)})"
    elif isinstance(exc, psycopg.errors.CardinalityViolation):  # two rows, one key
        fix = f"make `keys` ({', '.join(config.keys)}) unique within a batch in the transform"
    else:
        fix = "make the table's columns match the output, or point the sink at a new table"
    return f"sink postgres {config.table} refused batch {batch_id}: {first}; {fix}"
