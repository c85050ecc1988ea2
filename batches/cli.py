"""The ``lowmark`` command line.

User errors (LowmarkError) print one red line and exit 2, never a stack
trace; everything committed before the error stays committed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from rich.console import Console
from rich.table import Table

from batches.compaction import compact_checkpoint
from batches.demo import INCOMING, orders, user_revenue, write_sample_files
from batches.durations import parse_duration_ms
from batches.follow import follow
from batches.microbatch import BatchResult, MicroBatchRunner
from batches.pipeline import resolve
from batches.poison import set_aside
from batches.registry import get_pipeline, load_pipelines
from batches.reset import reset as reset_pipeline
from batches.sources.base import describe_range
from batches.status import pipeline_history, pipeline_status
from state.errors import LowmarkError
from state.session import SparkSettings, get_spark

app = typer.Typer(
    help="lowmark: exactly-once micro-batch streaming on Spark + Delta.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)


BatchListener = Callable[[MicroBatchRunner, Path], Callable[[BatchResult], None] | None]
"""Given a runner and the data root, what to call with each batch it commits (None: nothing)."""


class Context:
    """Options shared by every command, and who hears of committed batches."""

    def __init__(
        self,
        pipelines: str | None,
        data_root: Path,
        master: str | None,
        listeners: Sequence[BatchListener] = (),
    ) -> None:
        self.pipelines = pipelines
        self.data_root = data_root.resolve()
        self.settings = SparkSettings(master=master) if master else SparkSettings()
        self.listeners = listeners

    def spark(self) -> SparkSession:
        with err.status("starting Spark…"):
            return get_spark(self.settings)

    def on_batch(self, runner: MicroBatchRunner) -> Callable[[BatchResult], None]:
        """Prints each batch ``runner`` commits and tells the listeners."""
        heard = [h for listen in self.listeners if (h := listen(runner, self.data_root))]

        def each(r: BatchResult) -> None:
            _print_batch(r)
            for hear in heard:
                hear(r)

        return each


@app.callback()
def main_options(
    ctx: typer.Context,
    pipelines: Annotated[
        str | None,
        typer.Option(
            help="Where pipelines are defined: a module (pkg.mod), a .py file or a .yaml file. "
            "Env: LOWMARK_PIPELINES; default: the demo pipelines (batches.demo).",
        ),
    ] = None,
    data_root: Annotated[
        Path,
        typer.Option(
            help="Folder relative pipeline paths live under. Env: LOWMARK_DATA_ROOT.",
            envvar="LOWMARK_DATA_ROOT",
        ),
    ] = Path("data"),
    master: Annotated[
        str | None,
        typer.Option(help="Spark master URL. Env: LOWMARK_SPARK_MASTER; default local[*]."),
    ] = None,
) -> None:
    ctx.obj = Context(pipelines, data_root, master, listeners=ctx.obj or ())


@app.command("list")
def list_pipelines(ctx: typer.Context) -> None:
    """List the registered pipelines."""
    table = Table()
    for name in ("pipeline", "source", "sink"):
        table.add_column(name, no_wrap=True)
    table.add_column("description")
    for p in load_pipelines(ctx.obj.pipelines).values():
        table.add_row(
            p.name,
            f"{p.source.kind}:{p.source.label}",
            f"{p.sink.kind}:{p.sink.path} ({p.sink.mode})",
            p.description,
        )
    out.print(table)


@app.command()
def run(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name (see `lowmark list`).")],
    max_batches: Annotated[
        int | None, typer.Option(min=1, help="Run at most this many batches.")
    ] = None,
    until_caught_up: Annotated[
        bool, typer.Option(help="Run batches until no new data is left (capped by --max-batches).")
    ] = False,
    follow_source: Annotated[
        bool,
        typer.Option(
            "--follow",
            help="Keep running: batches back to back while files wait, then poll every "
            "--poll-interval. Ctrl-C or SIGTERM stops after the current batch commits (exit 0).",
        ),
    ] = False,
    poll_interval: Annotated[
        str | None,
        typer.Option(
            help="With --follow: wait this long between polls once caught up, e.g. '1s', "
            "'500 ms', '2 seconds' (a bare number is seconds). Default 1s.",
        ),
    ] = None,
    max_seconds: Annotated[
        str | None,
        typer.Option(
            help="With --follow: start no batch after this long, e.g. 600 or '10 minutes'. "
            "Default: follow until stopped.",
        ),
    ] = None,
    retry: Annotated[
        bool,
        typer.Option(
            help="Run a batch that failed `max_failed_attempts` times once more (after "
            "fixing its transform).",
        ),
    ] = False,
) -> None:
    """Run micro-batches of PIPELINE: one by default, N, until caught up, or --follow.

    An uncommitted batch left by a crash is replayed first, with exactly the
    offsets it had. The checkpoint defaults to <data root>/_lowmark/PIPELINE;
    to start over, `lowmark reset PIPELINE` (it keeps the sink's data from landing twice).

    --follow keeps one Spark session and takes new files as they land (like
    Structured Streaming's processing-time trigger); on stop it prints how many
    batches ran and why it stopped.
    """
    c: Context = ctx.obj
    if follow_source and (max_batches is not None or until_caught_up):
        raise typer.BadParameter(
            "--follow runs until stopped: drop --max-batches and "
            "--until-caught-up (use --max-seconds to bound it)"
        )
    if not follow_source and (poll_interval is not None or max_seconds is not None):
        raise typer.BadParameter("--poll-interval and --max-seconds apply to --follow only")
    poll_s = _seconds("--poll-interval", poll_interval or "1s")
    limit_s = None if max_seconds is None else _seconds("--max-seconds", max_seconds)
    if poll_s <= 0:
        raise typer.BadParameter("--poll-interval must be more than 0")
    p = get_pipeline(pipeline, c.pipelines)
    runner = MicroBatchRunner(c.spark(), p, c.data_root)
    if follow_source:
        _follow(runner, c.on_batch(runner), poll_s, limit_s)
        return
    limit = max_batches or (None if until_caught_up else 1)
    with err.status(f"running {pipeline}…"):
        results = runner.run(max_batches=limit, on_batch=c.on_batch(runner), retry=retry)
    if not results:
        out.print(f"{pipeline}: caught up, no new data")


def _follow(
    runner: MicroBatchRunner,
    on_batch: Callable[[BatchResult], None],
    poll_s: float,
    max_seconds: float | None,
) -> None:
    pipeline = runner.pipeline.name
    limit = "until stopped" if max_seconds is None else f"for at most {max_seconds:g} s"
    err.print(
        f"following {pipeline} {limit}, polling every {poll_s:g} s once caught up; "
        "Ctrl-C or SIGTERM stops after the current batch",
        soft_wrap=True,
    )
    with err.status(f"following {pipeline}…"):
        result = follow(runner, poll_s, max_seconds, on_batch=on_batch)
    out.print(f"{pipeline}: {result.describe()}", soft_wrap=True)


def _seconds(option: str, value: str) -> float:
    """A duration as batches/durations.py reads it; a bare number is seconds."""
    try:
        return parse_duration_ms(float(value) if _is_number(value) else value) / 1000
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from exc


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _print_batch(r: BatchResult) -> None:
    what = "replayed" if r.replay else "committed"
    out.print(
        f"batch {r.batch_id} {what}: {r.rows_in} rows in, {r.rows_out} out, "
        f"{r.rows_bad} bad, {r.rows_late} late, input {describe_range(r.start, r.end)}, "
        f"{r.durations_ms['total'] / 1000:.2f} s",
        soft_wrap=True,
    )


@app.command()
def status(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (keys in README).")] = False,
) -> None:
    """Show PIPELINE's last committed batch, pending and next batch, offsets and backlog.

    Reads the checkpoint on the driver: no Spark is started.
    """
    c: Context = ctx.obj
    s = pipeline_status(c.spark, get_pipeline(pipeline, c.pipelines), c.data_root)
    if as_json:
        print(json.dumps(s, indent=2))
        return
    table = Table(show_header=False)
    for key, value in s.items():
        table.add_row(key, _show(value))
    out.print(table)


@app.command()
def history(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    last: Annotated[int | None, typer.Option(min=1, help="Only the newest N batches.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (keys in README).")] = False,
) -> None:
    """Show PIPELINE's per-batch progress (the checkpoint's progress table)."""
    c: Context = ctx.obj
    rows = pipeline_history(get_pipeline(pipeline, c.pipelines), c.data_root, last)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("batch", "at", "replayed", "rows in", "out", "bad", "total ms")
    for r in rows:
        table.add_row(
            str(r["batch_id"]),
            r["created_at"][:19],
            "yes" if r["replayed"] else "",
            str(r["rows_in"]),
            str(r["rows_out"]),
            str(r["rows_bad"]),
            str(r["durations_ms"].get("total", "")),
        )
    out.print(table)


@app.command()
def compact(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
) -> None:
    """Tidy PIPELINE's checkpoint now: old log entries go, small files merge, old files and
    Delta log files are removed.

    What a batch does by itself every `maintenance.every_batches` batches,
    with the pipeline's `maintenance` retention. Starts no Spark over a local
    folder; safe while the pipeline runs (a table a batch is writing is left
    for next time).
    """
    c: Context = ctx.obj
    p = get_pipeline(pipeline, c.pipelines)
    done = compact_checkpoint(c.spark, p, c.data_root)
    if done is None:
        out.print(f"{p.name}: no committed batch yet: nothing to compact")
        return
    out.print(
        f"{p.name}: compacted {done.tables} tables of {p.checkpoint_location(c.data_root)}; "
        f"the logs keep batches {done.first_kept} to {done.last_committed}"
    )


@app.command("skip-batch")
def skip_batch(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    batch: Annotated[int, typer.Argument(help="The uncommitted batch to set aside.")],
    reason: Annotated[str, typer.Option(help="Why (recorded with its input).")],
) -> None:
    """Set aside the input of PIPELINE's uncommitted BATCH (a poison batch) and go on.

    Its files are recorded in the checkpoint's bad_records table with the
    reason, its window state is put back as the batch before left it, and an
    empty commit lets the next batch run. Reprocess the files once the
    transform is fixed (docs/guarantees.md, "Poison batches"). Starts no Spark.
    """
    c: Context = ctx.obj
    p = get_pipeline(pipeline, c.pipelines)
    done = set_aside(MicroBatchRunner(c.spark, p, c.data_root), batch, reason)
    restored = (
        f"; window state put back to version {done.state_restored_to}"
        if done.state_restored_to is not None
        else ""
    )
    out.print(
        f"{p.name}: batch {done.batch_id} set aside ({len(done.inputs)} inputs recorded in "
        f"bad_records with the reason){restored}; the next run goes on at batch "
        f"{done.batch_id + 1}",
        soft_wrap=True,
    )
    for item in done.inputs:
        out.print(f"  {item}", soft_wrap=True, highlight=False)


@app.command()
def reset(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    truncate_sink: Annotated[
        bool,
        typer.Option(
            "--truncate-sink", help="Empty the sink; the new checkpoint starts from the beginning."
        ),
    ] = False,
    after_sink: Annotated[
        bool,
        typer.Option(
            "--after-sink",
            help="Start after the data the sink holds (pipelines without windows).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Start PIPELINE over on a new checkpoint without writing the sink's data twice.

    The old checkpoint is moved aside to <checkpoint>.reset-<UTC time>, never
    deleted. Choose one: --truncate-sink empties the sink (one Delta commit:
    time travel still reaches the old rows) and reads the source from its
    beginning; --after-sink starts right after the last batch the sink holds
    (its offsets and file manifest come from the old checkpoint).
    """
    if truncate_sink == after_sink:
        raise typer.BadParameter("choose one of --truncate-sink and --after-sink")
    c: Context = ctx.obj
    p = get_pipeline(pipeline, c.pipelines)
    done = reset_pipeline(c.spark, p, c.data_root, "truncate" if truncate_sink else "after")
    if as_json:
        print(json.dumps(dataclasses.asdict(done), indent=2))
        return
    if done.moved_to:
        out.print(f"{p.name}: old checkpoint moved to {done.moved_to}", soft_wrap=True)
    if done.mode == "truncate":
        out.print(
            f"{p.name}: sink emptied; new checkpoint {done.pipeline_id} starts from the "
            "beginning of the source",
            soft_wrap=True,
        )
    else:
        out.print(
            f"{p.name}: new checkpoint {done.pipeline_id} starts after {done.continues} "
            f"(offsets {done.start_offsets}; {done.files} files already taken)",
            soft_wrap=True,
        )


@app.command()
def demo(ctx: typer.Context) -> None:
    """Write sample orders, run both demo pipelines until caught up, show what landed.

    `orders` cleans each order into a Delta table; `user_revenue` counts
    orders and sums revenue per user per minute (event-time windows), sending
    the straggler file's orders to its late table.
    """
    c: Context = ctx.obj
    written = write_sample_files(c.data_root)
    out.print(f"sample data: {len(written)} new files in {c.data_root / INCOMING}")
    spark = c.spark()
    for pipeline in (orders, user_revenue):
        out.print(f"[bold]{pipeline.name}[/]: {pipeline.description}")
        with err.status(f"running {pipeline.name}…"):
            runner = MicroBatchRunner(spark, pipeline, c.data_root)
            runner.run(max_batches=None, on_batch=c.on_batch(runner))
        s = pipeline_status(spark, pipeline, c.data_root)
        sink = spark.read.format("delta").load(resolve(pipeline.sink.path, c.data_root))
        out.print(
            f"  sink {resolve(pipeline.sink.path, c.data_root)}: {sink.count()} rows; "
            f"{s['totals']['rows_bad']} bad records, {s['totals']['rows_late']} late records; "
            f"last committed batch {s['last_committed_batch']}"
        )
    table = Table("user", "minute", "orders", "revenue", title="user_revenue (first minutes)")
    windows = spark.read.format("delta").load(resolve(user_revenue.sink.path, c.data_root))
    for row in windows.orderBy("window_start", "user").limit(10).collect():
        table.add_row(
            row["user"],
            row["window_start"].strftime("%H:%M"),
            str(row["orders"]),
            f"{row['revenue']:.2f}",
        )
    out.print(table)


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, list):
        return "\n".join(_show(v) for v in value) or "-"
    if value is None:
        return "-"
    return str(value)


def main(argv: list[str] | None = None, listeners: Sequence[BatchListener] = ()) -> None:
    """Console entry point: run the app, turning user errors into one line. ``listeners``
    hear of every batch a command commits."""
    logging.basicConfig(level=os.environ.get("LOWMARK_LOG_LEVEL", "WARNING"))
    try:
        app(args=argv, prog_name="lowmark", obj=listeners)
    except LowmarkError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except AnalysisException as exc:
        first = str(exc).strip().splitlines()[0]
        err.print(f"[red]error:[/] Spark rejected the pipeline: {first}", soft_wrap=True)
        sys.exit(2)
