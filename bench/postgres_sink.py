"""Rows per second into Postgres: lowmark's Postgres sink next to Structured Streaming's
``foreachBatch`` with Spark's JDBC writer, on the same files, in the same run.

A real PostgreSQL server (``tests.postgres_server``, started here on loopback)
takes ``--files`` JSON-lines files of ``--file-records`` events each (the
benchmark's events: user, ts, amount), ``--files-per-batch`` files a batch:

- lowmark: a stateless pipeline, files source → ``sink: {kind: postgres}``
  (append: one transaction a batch, rows by COPY, the batch id fenced in the
  same transaction: exactly once), batch by batch with ``MicroBatchRunner``;
  then the same in ``mode: upsert`` on (user, ts) (COPY into a temporary table,
  then ``INSERT … ON CONFLICT DO UPDATE``), which has no peer below.
- Structured Streaming (SSS): the files source with ``maxFilesPerTrigger``,
  ``foreachBatch`` writing each batch with ``df.write.jdbc(mode="append")``
  (PostgreSQL's JDBC driver, ``jvm/bench``, with ``reWriteBatchedInserts``:
  Spark's batched INSERTs sent as multi-row INSERTs, one connection a
  partition), available-now. At least once: nothing fences a replayed
  batch, which is the usual way and the one to beat.

Both engines run in this one process's Spark session, one after the other,
each first warmed by an unreported run over two files, all before any is
measured. Measured: rows/s from start to caught up, and seconds per batch
(median). Checked (raises if not):
each table holds every input row once. No other assertions; run it on a quiet
machine.

    .venv/bin/python -m bench.postgres_sink            # about 3 minutes
    .venv/bin/python -m bench.postgres_sink --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from bench.side_by_side import lowmark_batches, session
from bench.streaming import SCHEMA, _say, event_lines
from lowmark.batches.pipeline import FileSource, Pipeline, PostgresSink
from tests.postgres_server import PostgresServer

DATABASE = "bench"
JDBC_JARS = Path(__file__).resolve().parents[1] / "jvm" / "bench" / "lib"
"""PostgreSQL's JDBC driver (``jvm/bench/pom.xml``; ``make bench`` fetches it)."""


def write_files(folder: Path, files: int, records: int, first: int = 0) -> int:
    """``files`` files of ``records`` events each (deterministic); how many events."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + files):
        (folder / f"f{i:05d}.json").write_text(event_lines(11, "postgres", i, records, 5000))
    return files * records


def lowmark_run(
    spark: SparkSession, source: Path, root: Path, table: str, files_per_batch: int, mode: str
) -> dict[str, Any]:
    """lowmark over ``source`` into Postgres ``table`` until caught up: seconds per batch,
    in all, and rows."""
    pipeline = Pipeline(
        name=f"bench_{table}",
        source=FileSource(
            path=str(source), format="json", schema_ddl=SCHEMA, max_files_per_batch=files_per_batch
        ),
        sink=PostgresSink(table=table, mode=mode, keys=("user", "ts") if mode == "upsert" else ()),
    )
    started = time.perf_counter()
    results, seconds = lowmark_batches(spark, pipeline, root, table)
    took = time.perf_counter() - started
    measured = [s for r, s in zip(results, seconds, strict=True) if r.rows_in]
    return {"batch_s": measured, "seconds": took, "rows": sum(r.rows_out for r in results)}


def sss_run(
    spark: SparkSession,
    server: PostgresServer,
    source: Path,
    root: Path,
    table: str,
    files_per_batch: int,
) -> dict[str, Any]:
    """SSS over ``source`` into Postgres ``table`` through ``foreachBatch`` + JDBC."""
    # reWriteBatchedInserts: the driver folds each JDBC batch into multi-row INSERTs, the
    # setting a tuned Spark-to-Postgres job runs with.
    host, port = server.env["PGHOST"], server.env["PGPORT"]
    url = f"jdbc:postgresql://{host}:{port}/{DATABASE}?reWriteBatchedInserts=true"
    props = {"user": server.env["PGUSER"], "driver": "org.postgresql.Driver"}

    def write(df: DataFrame, batch_id: int) -> None:
        df.write.jdbc(url, table, mode="append", properties=props)

    started = time.perf_counter()
    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", files_per_batch)
        .json(str(source))
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(root / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    progress = [p for p in query.recentProgress if int(p["numInputRows"])]
    return {
        "batch_s": [p["durationMs"]["triggerExecution"] / 1000 for p in progress],
        "seconds": seconds,
        "rows": sum(int(p["numInputRows"]) for p in progress),
    }


def _count(server: PostgresServer, table: str) -> tuple[int, int]:
    """Rows of ``table``, and distinct (user, ts, amount) rows."""
    query = f'SELECT count(*), count(DISTINCT ("user", ts, amount)) FROM "{table}"'
    [(rows, distinct)] = server.rows(DATABASE, query)
    return int(rows), int(distinct)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=40)
    parser.add_argument("--file-records", type=int, default=5000)
    parser.add_argument("--files-per-batch", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="4 files of 500 events.")
    parser.add_argument("--work-dir", type=Path, help="Where data goes (default: a temp dir).")
    args = parser.parse_args(argv)
    if args.quick:
        args.files, args.file_records, args.files_per_batch = 4, 500, 2
    if not any(JDBC_JARS.glob("postgresql-*.jar")):
        raise SystemExit(f"no JDBC driver in {JDBC_JARS}: run `jvm/fetch-jars jvm/bench`")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="lowmark-bench-postgres-"))
    events = write_files(work / "input", args.files, args.file_records)
    write_files(work / "warm", 2, args.file_records, first=args.files)
    jars = ":".join(str(j) for j in sorted(JDBC_JARS.glob("*.jar")))
    spark = session("lowmark-bench-postgres", {"spark.driver.extraClassPath": jars})
    server = PostgresServer.start()
    # What lowmark's Postgres sink, with no connection settings, reaches (as libpq's).
    os.environ.update(server.env | {"PGDATABASE": DATABASE})
    results: dict[str, dict[str, Any]] = {}
    try:
        server.create_database(DATABASE)
        engines = {
            "lowmark append": "append",
            "SSS foreachBatch + JDBC": "jdbc",
            "lowmark upsert": "upsert",
        }
        # Every engine warms first, then every engine is measured: none runs colder.
        for data, label in (("warm", "warm"), ("input", "run")):
            for name, engine in engines.items():
                table = f"{engine}_{label}"
                root = work / engine / label
                if engine == "jdbc":
                    run = sss_run(spark, server, work / data, root, table, args.files_per_batch)
                else:
                    run = lowmark_run(spark, work / data, root, table, args.files_per_batch, engine)
                if label == "run":
                    rows, distinct = _count(server, table)
                    if rows != events or distinct != events:
                        raise RuntimeError(f"{name}: {rows} rows ({distinct} distinct) of {events}")
                    results[name] = run
                    _say(
                        f"  {name}: {events / run['seconds']:,.0f} rows/s, "
                        f"{statistics.median(run['batch_s']):.2f} s a batch (median)"
                    )
    finally:
        server.stop()
    low, peer = results["lowmark append"], results["SSS foreachBatch + JDBC"]
    ratio = (events / low["seconds"]) / (events / peer["seconds"])
    lines = [
        f"Postgres sink: {events:,} rows in {args.files} files, {args.files_per_batch} files "
        "a batch, catch-up from start to caught up",
        *(
            f"  {name:<26} {events / r['seconds']:>10,.0f} rows/s   "
            f"median batch {statistics.median(r['batch_s']):.2f} s"
            for name, r in results.items()
        ),
        f"  ratio rows/s lowmark append / SSS foreachBatch + JDBC: {ratio:.2f} "
        "(exactly once vs at least once)",
    ]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
