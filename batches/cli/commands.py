"""The ``lowmark`` command line.

User errors (LowmarkError) print one red line and exit 2, never a stack
trace; everything committed before the error stays committed. A batch that
fails prints one paragraph (the batch, its input, the error's first line,
the attempt, what to do: ``MicroBatchRunner.failure_report``); the details
(tracebacks, Spark's own logs) go to the log file (``lowmark.batches.cli.logs``), and
``--verbose`` prints them too. Ctrl-C while batches run cancels the batch in
progress (the next run replays it); a second Ctrl-C quits at once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

import typer
from rich.console import Console

from lowmark.batches.cli.display import (
    duration,
    iso_utc,
    moment,
    print_fields,
    print_json,
    print_table,
)
from lowmark.batches.cli.logs import (
    DETAILS,
    installed_log_file,
    jvm_output_to,
    log_file,
    send_logs,
    send_pyspark_logs,
    stop_logs,
)
from lowmark.batches.clock import Clock, SystemClock
from lowmark.batches.errors import BatchFailed, RunInFlight
from lowmark.batches.loop.metrics import TEXTFILE_ENV
from lowmark.batches.registry import get_pipeline, load_pipelines
from lowmark.state.errors import LowmarkError, first_line
from lowmark.state.spark_confs import key_value

# The engine (lowmark.batches.loop, the sources, lowmark.state.session) and PySpark are imported by
# the commands that run or plan batches, the pipeline definitions (pydantic, pyarrow) by those
# that load them, not with this module: `lowmark --help`, `show` and `sql` must not pay for
# importing them (docs/cli.md, "Fast commands").
if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lowmark.batches.admin.preview import PreviewedBatch
    from lowmark.batches.admin.status import BatchPlan, NextBatchStatus, PipelineStatus
    from lowmark.batches.loop.events import BatchResult
    from lowmark.batches.loop.microbatch import MicroBatchRunner
    from lowmark.batches.pipeline import Pipeline, SinkKind

app = typer.Typer(
    help="lowmark: exactly-once micro-batch streaming on Spark + Delta.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)
details_log = logging.getLogger(DETAILS)


if TYPE_CHECKING:
    BatchListener: TypeAlias = Callable[
        [MicroBatchRunner, Path], Callable[[BatchResult], None] | None
    ]
    """Given a runner and the data root, what to call with each batch it commits (None:
    nothing)."""

    ResetGuard: TypeAlias = Callable[[Pipeline], str | None]
    """Why a reset of a pipeline must not go on now (a run of it in flight elsewhere), or
    None."""

JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print JSON instead of text (keys in the README).")
]
ConfOption = Annotated[
    list[str] | None,
    typer.Option(
        "--conf",
        help="A Spark conf KEY=VALUE; repeatable. Wins over lowmark's defaults, "
        "spark-defaults.conf, lowmark.toml's [spark] and PYSPARK_SUBMIT_ARGS "
        "(docs/deploy.md, 'Spark settings').",
    ),
]


def given_confs(items: list[str] | None) -> dict[str, str]:
    """The confs of repeated ``--conf KEY=VALUE`` options, later ones winning."""
    return dict(key_value(item) for item in items or [])


class Context:
    """Options shared by every command, who hears of committed batches, and the clock
    that every "now" of a command is read from."""

    def __init__(
        self,
        pipelines: str | None,
        data_root: Path,
        master: str | None,
        listeners: Sequence[BatchListener] = (),
        clock: Clock | None = None,
        reset_guards: Sequence[ResetGuard] = (),
    ) -> None:
        self.pipelines = pipelines
        self.data_root = data_root.resolve()
        self.master = master
        self.listeners = listeners
        self.clock = clock or SystemClock()
        self.reset_guards = reset_guards
        self.confs: dict[str, str] = {}
        """The command's ``--conf`` settings: they win over every other layer."""

    def spark(self) -> SparkSession:
        from pyspark.sql import SparkSession

        from lowmark.state.jars import delta_jars
        from lowmark.state.session import SparkSettings, get_spark

        settings = SparkSettings(master=self.master) if self.master else SparkSettings()
        settings = settings.with_confs(self.confs)
        send_pyspark_logs()
        if settings.remote or SparkSession.getActiveSession() is not None:
            return get_spark(settings)  # no JVM starts here
        # Jars fetched on first use say so on the console, before the JVM's output goes to
        # the log file instead (lowmark.batches.cli.logs).
        delta_jars(settings.jars_dir)
        with err.status("starting Spark…"), jvm_output_to(log_file(self.data_root)):
            return get_spark(settings)

    def on_batch(
        self, runner: MicroBatchRunner, show: Callable[[BatchResult], None] | None
    ) -> Callable[[BatchResult], None]:
        """Shows each batch ``runner`` commits with ``show`` (None: not at all) and tells
        the listeners."""
        heard = [h for listen in self.listeners if (h := listen(runner, self.data_root))]

        def each(r: BatchResult) -> None:
            if show is not None:
                show(r)
            for hear in heard:
                hear(r)

        return each


def _print_version(asked: bool) -> None:
    if asked:
        from lowmark import __version__  # read only when asked

        out.print(f"lowmark {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def main_options(
    ctx: typer.Context,
    pipelines: Annotated[
        str | None,
        typer.Option(
            help="Where pipelines are defined: a module (pkg.mod), a .py file or a .yaml file. "
            "Env: LOWMARK_PIPELINES; default: the demo pipelines (lowmark.batches.demo).",
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
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            help="Print the details of an error (tracebacks, Spark's logs) too; they always "
            "go to <data root>/_lowmark/_logs/lowmark.log.",
        ),
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            callback=_print_version,
            is_eager=True,
            help="Print lowmark's version and exit.",
        ),
    ] = False,
) -> None:
    ctx.obj = Context(pipelines, data_root, master, **(ctx.obj or {}))
    send_logs(log_file(ctx.obj.data_root), verbose)


@app.command("list")
def list_pipelines(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List the registered pipelines."""
    pipelines = list(load_pipelines(ctx.obj.pipelines).values())
    if as_json:
        print_json(
            out,
            [
                {
                    "name": p.name,
                    "description": p.description,
                    "source": {"kind": p.source.kind, "label": p.source.label},
                    "sink": _sink_json(p, p.sink),
                }
                | _extra_sinks_json(p)
                | ({"joins": [j.semantics() for j in p.joins]} if p.joins else {})
                for p in pipelines
            ],
        )
        return
    rows = [
        (
            p.name,
            f"{p.source.kind}:{p.source.label}" + "".join(f", {w}" for w in _join_words(p)),
            _sink_words(p),
            p.description,
        )
        for p in pipelines
    ]
    print_table(out, ("pipeline", "source", "sink", "description"), rows)


def _join_words(p: Pipeline, versions: dict[str, int] | None = None) -> list[str]:
    """Each stream-table join in words (``left join devices on device_id``), at its
    version in ``versions`` if given."""
    return [
        f"{j.how} join {j.table} on {', '.join(j.keys)}"
        + (f" (version {versions[j.table]})" if versions and j.table in versions else "")
        for j in p.joins
    ]


def _sink_words(p: Pipeline) -> str:
    """The sinks as ``lowmark list`` shows them: ``delta:demo/orders (append)``, its mode the
    one batches write it with; extra sinks after a ``+``."""
    return " + ".join(_one_sink_words(p, sink) for sink in p.sinks().values())


def _one_sink_words(p: Pipeline, sink: SinkKind) -> str:
    from lowmark.batches.pipeline import DeltaSink, KafkaSink, PostgresSink

    where = sink.path if isinstance(sink, DeltaSink) else sink.label
    if isinstance(sink, PostgresSink):
        where = sink.table
    if isinstance(sink, KafkaSink):
        where = sink.topic
    mode = _sink_mode(p, sink)
    return f"{sink.kind}:{where}" + (f" ({mode})" if mode else "")


def _sink_mode(p: Pipeline, sink: SinkKind) -> str | None:
    """How batches write ``sink`` (``Pipeline.output_mode``, per sink): a windowed
    pipeline's output mode, else a Delta or Postgres sink's ``mode``; None for a custom
    sink's records."""
    from lowmark.batches.pipeline import DeltaSink, PostgresSink

    if p.aggregation is not None:
        return p.aggregation.output_mode
    return sink.mode if isinstance(sink, DeltaSink | PostgresSink) else None


def _extra_sinks_json(p: Pipeline) -> dict[str, Any]:
    """``extra_sinks`` as ``lowmark list --json`` shows them, by name (none: nothing)."""
    if not p.extra_sinks:
        return {}
    return {"extra_sinks": {n: _sink_json(p, s) for n, s in p.extra_sinks.items()}}


def _sink_json(p: Pipeline, sink: SinkKind) -> dict[str, Any]:
    """A sink as JSON: a Delta table, a Postgres table, a Kafka topic, or a custom factory;
    ``mode`` the one batches write it with (``_sink_mode``)."""
    from lowmark.batches.pipeline import DeltaSink, KafkaSink, PostgresSink

    mode = _sink_mode(p, sink)
    if isinstance(sink, DeltaSink):
        return {"kind": sink.kind, "path": sink.path, "mode": mode}
    if isinstance(sink, PostgresSink):
        return {"kind": sink.kind, "table": sink.table, "mode": mode}
    if isinstance(sink, KafkaSink):
        return {"kind": sink.kind, "topic": sink.topic, "mode": mode}
    shown: dict[str, Any] = {"kind": sink.kind, "factory": sink.label}
    return shown | ({"mode": mode} if mode else {})


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
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print each committed batch as one line of JSON (JSON Lines; keys in the README).",
        ),
    ] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Serve the run's metrics in the Prometheus text format on "
            "http://HOST:PORT/metrics while it runs (for --follow; 0: a free port, printed). "
            "Default: no endpoint.",
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(help="With --metrics-port: the address to listen on (0.0.0.0: all)."),
    ] = "127.0.0.1",
    metrics_textfile_dir: Annotated[
        Path | None,
        typer.Option(
            envvar=TEXTFILE_ENV,
            help="Write the run's metrics to lowmark_PIPELINE.prom in this folder after every "
            "batch, for node_exporter's textfile collector (replaced whole, atomically).",
        ),
    ] = None,
    conf: ConfOption = None,
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
    c.confs = given_confs(conf)
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
    from lowmark.batches.loop.microbatch import MicroBatchRunner
    from lowmark.batches.loop.preflight import check_source_folders

    p = get_pipeline(pipeline, c.pipelines)
    check_source_folders(p, c.data_root)  # before the runner opens or creates the checkpoint
    # Spark starts with the first batch that needs it: none if there is nothing to do.
    runner = MicroBatchRunner(c.spark, p, c.data_root, c.clock)
    show = _print_batch_json if as_json else _print_batch
    metrics = _metrics_exported(runner, metrics_port, metrics_host, metrics_textfile_dir)
    if follow_source:
        with runner, metrics, _reported(runner):
            _follow(runner, c.on_batch(runner, show), poll_s, limit_s, as_json)
        return
    limit = max_batches or (None if until_caught_up else 1)
    status = err.status(f"running {pipeline}…")
    with runner, metrics, status, _reported(runner), _interruptible(runner) as stopping:
        results = runner.run(
            max_batches=limit,
            on_batch=c.on_batch(runner, show),
            retry=retry,
            should_stop=stopping,
        )
    words = err if as_json else out
    if stopping():
        n = len(results)
        words.print(f"{pipeline}: stopped by SIGINT after {n} batch{'' if n == 1 else 'es'}")
    elif not results:
        words.print(f"{pipeline}: caught up, no new data")


@contextmanager
def _metrics_exported(
    runner: MicroBatchRunner, port: int | None, host: str, textfile_dir: Path | None
) -> Iterator[None]:
    """``runner``'s metrics on the endpoint and/or in the textfile asked for
    (``lowmark.batches.loop.metrics.exported_metrics``); a port that cannot be listened on is a
    bad ``--metrics-port``."""
    from lowmark.batches.loop.metrics import exported_metrics

    with ExitStack() as stack:
        try:
            bound = stack.enter_context(exported_metrics(runner, port, host, textfile_dir))
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                param_hint="--metrics-port",
            ) from exc
        if bound is not None:
            err.print(f"metrics on http://{host}:{bound}/metrics", soft_wrap=True)
        yield


@contextmanager
def _reported(runner: MicroBatchRunner) -> Iterator[None]:
    """An error that stopped one of ``runner``'s batches becomes ``BatchFailed``: one
    paragraph on the batch (``MicroBatchRunner.failure_report``)."""
    try:
        yield
    except Exception as exc:
        report = runner.failure_report(exc)
        if report is None:
            raise
        raise BatchFailed(report) from exc


@contextmanager
def _interruptible(runner: MicroBatchRunner) -> Iterator[Callable[[], bool]]:
    """Ctrl-C while ``runner``'s batches run: the first lets the batch in progress commit
    and starts no other (one line says so; the context gives whether it was pressed), a
    second cancels the batch in progress (``MicroBatchRunner.interrupt``: it is replayed by
    the next run) and quits at once, and any after that are ignored (a Ctrl-C inside
    Spark's calls only adds tracebacks) — also once the run stopped: the command is
    ending, and a press while it says why must not turn its one line into a death by
    signal."""
    presses = 0

    def handle(signum: int, frame: object) -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            planned = runner.attempting
            batch = "the batch in progress" if planned is None else f"batch {planned.batch_id}"
            said = f"stopping after {batch} commits (Ctrl-C again to cancel it; it is replayed"
            # To the stderr the run began with: while Spark starts, fd 2 is the log file's.
            os.write(terminal, f"{said} on the next run)\n".encode())
            return
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Not in this thread: it may be in the middle of a call to Spark.
        threading.Thread(target=runner.interrupt, daemon=True).start()
        raise KeyboardInterrupt

    def stopping() -> bool:
        return presses > 0

    if threading.current_thread() is not threading.main_thread():
        yield stopping
        return
    err.file.flush()
    terminal = os.dup(2)
    previous = signal.signal(signal.SIGINT, handle)
    try:
        yield stopping
    except KeyboardInterrupt:
        raise runner.interrupted() from None
    finally:
        signal.signal(signal.SIGINT, previous if presses == 0 else signal.SIG_IGN)
        os.close(terminal)


def _follow(
    runner: MicroBatchRunner,
    on_batch: Callable[[BatchResult], None],
    poll_s: float,
    max_seconds: float | None,
    as_json: bool,
) -> None:
    from lowmark.batches.loop.follow import follow

    pipeline = runner.pipeline.name
    limit = "until stopped" if max_seconds is None else f"for at most {max_seconds:g} s"
    err.print(
        f"following {pipeline} {limit}, polling every {poll_s:g} s once caught up; "
        "Ctrl-C or SIGTERM stops after the current batch",
        soft_wrap=True,
    )
    with err.status(f"following {pipeline}…"):
        result = follow(runner, poll_s, max_seconds, on_batch=on_batch)
    (err if as_json else out).print(f"{pipeline}: {result.describe()}", soft_wrap=True)


def _seconds(option: str, value: str) -> float:
    """A duration as batches/durations.py reads it; a bare number is seconds."""
    from lowmark.batches.durations import parse_duration_ms

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
    from lowmark.batches.expectations import PARSABLE
    from lowmark.batches.sources.base import describe_range

    what = "replayed" if r.replay else "committed"
    lag = f"; event-time lag {duration(r.lag_ms)}" if r.lag_ms is not None else ""
    starting = r.durations_ms.get("start_spark")
    start = f" ({duration(starting)} of it starting Spark)" if starting else ""
    violated = [f"{name} {n}" for name, n in r.violations.items() if n and name != PARSABLE]
    expected = f" (expectations violated: {', '.join(violated)})" if violated else ""
    twins = f", {r.rows_duplicate} duplicates" if r.rows_duplicate is not None else ""
    out.print(
        f"batch {r.batch_id} {what}: {r.rows_in} rows in, {r.rows_out} out, "
        f"{r.rows_bad} bad, {r.rows_late} late{twins}{expected}; "
        f"input: {describe_range(r.start, r.end)}"
        f"{lag}; took {duration(r.durations_ms['total'])}{start}",
        soft_wrap=True,
        highlight=False,
    )


def _batch_json(r: BatchResult) -> dict[str, Any]:
    """A committed batch as JSON: ``BatchResult``'s fields and ``input`` (the range in words)."""
    from lowmark.batches.sources.base import describe_range

    return r.to_json() | {"input": describe_range(r.start, r.end)}


def _print_batch_json(r: BatchResult) -> None:
    print_json(out, _batch_json(r), indent=None)


@app.command()
def status(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    as_json: JsonFlag = False,
) -> None:
    """Show PIPELINE's position: last committed batch, pending and next batch, watermark and
    event-time lag, backlog, and where every record read went (last batch and in total).

    Reads the checkpoint on the driver: no Spark is started. A rebuild under way (`lowmark
    rebuild`) is shown first: how far its shadow is.
    """
    from lowmark.batches.admin.rebuild import in_progress
    from lowmark.batches.admin.status import pipeline_status

    c: Context = ctx.obj
    p = get_pipeline(pipeline, c.pipelines)
    rebuilding = in_progress(p, c.data_root)
    if rebuilding is not None and not as_json:
        # Before the position: under the new definition the planner may refuse to plan.
        out.print(f"{p.name}: rebuild in progress: {rebuilding.describe()}", soft_wrap=True)
    s = pipeline_status(c.spark, p, c.data_root, c.clock)
    if as_json:
        rebuild = dataclasses.asdict(rebuilding) if rebuilding is not None else None
        print_json(out, s.to_json() | {"rebuild": rebuild})
        return
    now, last, pending = s.as_of_ms, s.last_batch, s.pending_batch
    checkpoint = (
        f"{s.checkpoint} (id {s.pipeline_id})"
        if s.checkpoint_exists
        else f"none yet: the first batch creates {s.checkpoint}"
    )
    fields = [
        ("pipeline", p.name),
        ("checkpoint", checkpoint),
        (
            "last committed",
            f"batch {last.batch_id}, {moment(last.committed_at_ms, now)}; input: {last.input}"
            if last
            else "none yet",
        ),
        (
            "pending batch",
            f"batch {pending} (uncommitted: a run replays it)" if pending is not None else "none",
        ),
        ("next batch", _next_words(s.next_batch)),
    ]
    if s.blocked:
        fields.append(("blocked", s.blocked))
    elif s.last_failure:
        failed = s.last_failure
        fields.append(
            ("last failure", f"{failed.kind}, {moment(failed.failed_at_ms, now)}: {failed.error}")
        )
    fields.append(("backlog", s.backlog_described))
    if p.event_time is not None:
        fields += _watermark_fields(s)
    if last:
        held = last.closed_windows_held
        closed = f"; the windows it closed held {held} records" if held is not None else ""
        fields.append((f"batch {last.batch_id}", _went(last.accounting, p.output_mode) + closed))
        if p.joins:
            joined = _join_words(p, last.dimension_versions)
            fields.append((f"batch {last.batch_id} joined", "\n".join(joined)))
    fields.append(("all batches", _went(s.accounting, p.output_mode)))
    if s.keyed is not None:
        due = s.keyed.next_timer_ms
        fields.append(
            (
                "keyed state",
                f"{s.keyed.keys} keys held, {s.keyed.timers} timers pending"
                + (f", the next due at {iso_utc(due)}" if due is not None else ""),
            )
        )
    if s.join_held is not None:
        sides = (f"{side}: {rows} rows" for side, rows in s.join_held.items())
        emitted = s.totals.get("rows_out", 0)
        fields.append(("join state", ", ".join(sides) + f" held; {emitted} joined rows emitted"))
    if last:
        fields.append(("expectations", _violated(p, last.violations, s.violations)))
    if len(s.definitions) > 1:
        ranges = (
            f"batches {r.first_batch}-{r.last_batch}: {r.fingerprint}"
            + (f" ({', '.join(c['field'] for c in r.changes)})" if r.changes else "")
            for r in s.definitions
        )
        fields.append(("definitions", "\n".join(ranges)))
    print_fields(out, fields)


def _violated(p: Pipeline, last: dict[str, int], totals: dict[str, int]) -> str:
    """Each expectation's violations in words, in the last batch and in all (``valid_amount
    (drop): 2 of the last batch, 7 in all``)."""
    from lowmark.batches.expectations import PARSABLE

    actions = {PARSABLE: "drop"} | {e.name: e.on_violation for e in p.expectations}
    return "; ".join(
        f"{name} ({action}): {last.get(name, 0)} in the last batch, {totals.get(name, 0)} in all"
        for name, action in actions.items()
    )


def _next_words(nxt: NextBatchStatus | None) -> str:
    """Status's ``next_batch`` in words."""
    if nxt is None:
        return "none: caught up"
    if nxt.replay:
        return f"batch {nxt.batch_id}, the replay of the uncommitted batch"
    return f"batch {nxt.batch_id}: {nxt.reason}"


def _watermark_fields(s: PipelineStatus) -> list[tuple[str, str]]:
    """The watermark, the event-time lag and each partition's times of status ``s``."""
    now, watermark = s.as_of_ms, s.watermark_ms
    if watermark is None:
        return [("watermark", "none yet: no event time committed")]
    fields = [("watermark", moment(watermark, now))]
    if s.event_time_lag_ms is not None:
        fields.append(("event-time lag", duration(s.event_time_lag_ms)))
    for part in s.partitions:
        ingested = (
            f"ingested up to {moment(part.ingestion_ms, now)}; "
            if part.ingestion_ms is not None
            else ""
        )
        fields.append(
            (
                f"partition {part.partition}",
                f"max event time {moment(part.max_event_time_ms, now)}; {ingested}watermark "
                f"{iso_utc(part.watermark_ms)}; last data {moment(part.last_seen_ms, now)}",
            )
        )
    return fields


_WENT = {
    "bad": "bad",
    "dropped_by_transform": "dropped by the transform",
    "duplicates": "duplicates",
    "late": "late",
    "in_sink": "in the sink",
    "into_processor": "into the keyed processor",
    "into_join": "into the join",
    "into_windows": "into windows",
    "in_closed_windows": "in closed windows (the sink)",
    "in_open_windows": "in open windows (the state)",
}

_WENT_UPDATING = _WENT | {
    "in_closed_windows": "in closed windows (final in the sink)",
    "in_open_windows": "in open windows (the state; in the sink as they stand)",
}
"""In update mode every window a batch changes is upserted into the sink: open ones too."""
EMITTED = "emitted_by_processor"


def _went(accounting: dict[str, int], output_mode: str | None) -> str:
    """An accounting of ``lowmark.batches.admin.status`` in words: ``read 80 = 2 bad + 9 dropped
    ...`` (records a transform added show as ``- 3 added by the transform``; a keyed step's rows
    that windows take, ``read 80 + 12 emitted by the keyed processor = ...``); where windows
    are as the pipeline's ``output_mode`` puts them."""
    words = _WENT_UPDATING if output_mode == "update" else _WENT
    text = f"read {accounting['read']}"
    # Behind a keyed step the windows count the processor's rows: they join what was read.
    emitted = accounting.get(EMITTED)
    text += f" + {emitted} emitted by the keyed processor =" if emitted is not None else " ="
    went = ((k, n) for k, n in accounting.items() if k not in ("read", EMITTED))
    for i, (key, n) in enumerate(went):
        if key == "dropped_by_transform" and n < 0:
            text += f" - {-n} added by the transform"
        else:
            text += f"{' +' if i else ''} {n} {words[key]}"
    return text


@app.command()
def plan(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    as_json: JsonFlag = False,
) -> None:
    """Show what PIPELINE's next batch would take, writing nothing (a dry run).

    Its input (offsets, and the files or offset ranges in them), the
    watermark it would run with, and what kind of batch it is: new input, a
    replay of an uncommitted batch (exactly the offsets and watermark in the
    offset log), or an emit-only batch (no input; the watermark moved and
    closes windows, or a keyed step's timer is due); or nothing to do. A keyed
    step is named with its processor, keys and timers. The runner's own planning rule, asked
    without recording anything; no Spark is started for local folders.

    Then the checks `lowmark run` makes before Spark starts (the files against
    `format` and the schema, the event-time column, the sink): a mistake is
    printed as `error: ...` and the exit code is 2.
    """
    from lowmark.batches.admin.status import pipeline_plan
    from lowmark.batches.evolution import DefinitionChanged
    from lowmark.batches.loop.preflight import check_source_folders

    c: Context = ctx.obj
    p = get_pipeline(pipeline, c.pipelines)
    check_source_folders(p, c.data_root)  # as `lowmark run` does: not "nothing to do"
    try:
        plan = pipeline_plan(c.spark, p, c.data_root, c.clock)
    except DefinitionChanged as refused:
        # The changes a run would refuse, each with its class, then the refusal itself.
        changes = [change.to_json() for change in refused.changes]
        if as_json:
            print_json(out, {"pipeline": p.name, "changes": changes, "problem": str(refused)})
            raise typer.Exit(2) from None
        out.print(f"{p.name}: its definition changed", soft_wrap=True, highlight=False)
        print_fields(out, [("  changes", _changes_in_words(changes))])
        raise
    if as_json:
        print_json(out, plan.to_json())
        if plan.problem is not None:
            raise typer.Exit(2)
        return
    now, batch_id = plan.as_of_ms, plan.batch_id
    if batch_id is None:
        out.print(f"{p.name}: {plan.reason}", soft_wrap=True, highlight=False)
        if plan.changes:
            print_fields(out, [("  changes", _changes_in_words(plan.changes))])
        return
    if plan.replay:
        assert plan.planned_at_ms is not None  # a planned batch has its planning time
        first = moment(plan.planned_at_ms, now)
        what = (
            f"batch {batch_id} replays: it is uncommitted, and runs again with the offsets and "
            f"watermark its offset-log entry holds (planned {first})"
        )
    elif plan.emit_only:
        what = f"batch {batch_id} takes no input: {plan.reason}"
    else:
        what = f"batch {batch_id} takes new input ({plan.reason})"
    out.print(f"{p.name}: {what}", soft_wrap=True, highlight=False)
    fields = [("  input", plan.input or "")]
    if plan.changes:
        fields.append(("  changes", _changes_in_words(plan.changes)))
    if plan.inputs:
        fields.append(("  inputs", "\n".join(plan.inputs)))
    if plan.bytes is not None:
        fields.append(("  bytes", f"{plan.bytes:,}"))
    if p.event_time is not None:
        watermark = plan.watermark_ms
        fields.append(
            (
                "  watermark",
                moment(watermark, now) if watermark is not None else "none yet (no event time)",
            )
        )
    if plan.ingestion_ms is not None:
        ingested = (f"{k} {moment(ms, now)}" for k, ms in sorted(plan.ingestion_ms.items()))
        fields.append(("  ingested up to", "\n".join(ingested)))
    if p.joins:
        fields.append(("  joins", "\n".join(_join_words(p, plan.dimension_versions))))
    if p.keyed is not None:
        processor = p.keyed.processor
        into = ""
        if p.aggregation is not None and p.event_time is not None:
            column = p.keyed.output_event_time or p.event_time.column
            into = f", its rows into the windows by {column}"
        fields.append(
            (
                "  keyed step",
                f"{processor.__module__}:{processor.__qualname__} per {', '.join(p.keyed.keys)}, "
                f"{p.keyed.time_mode.replace('_', '-')} timers{into}",
            )
        )
    if p.stream_join is not None:
        from lowmark.batches.stream_join import describe_join  # pydantic: not for fast commands

        fields.append(("  stream join", describe_join(p.stream_join)))
    if p.keyed is not None and p.aggregation is not None and plan.batch_id is not None:
        windows_at = plan.window_watermark_ms
        fields.append(
            (
                "  windows' watermark",
                moment(windows_at, now)
                if windows_at is not None
                else "none yet (the keyed step's of the batch before)",
            )
        )
    if plan.blocked:
        fields.append(("  blocked", plan.blocked))
    print_fields(out, fields)
    if plan.problem is not None:
        # What `lowmark run` would stop on, before Spark starts.
        err.print(f"[red]error:[/] {plan.problem}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)


def _changes_in_words(changes: list[dict[str, Any]]) -> str:
    """Definition changes (``Change.to_json``), one line each: the field, its class and
    kind."""
    return "\n".join(f"{c['field']} ({c['class']}: {c['kind']})" for c in changes)


@app.command()
def preview(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    limit: Annotated[
        int, typer.Option(min=0, help="Show at most this many of the sink's rows.")
    ] = 20,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print JSON: the plan, the counts, and the rows (keys in docs/cli.md).",
        ),
    ] = False,
) -> None:
    """Run PIPELINE's next batch and show what it would write, committing nothing.

    The batch `lowmark plan` shows (a replay's offsets and watermark when the
    last batch is uncommitted) is read, transformed and judged by its
    expectations, and its windows are merged with the window state as it
    stands. Printed: the first --limit rows its sink would get, and its
    counts: rows in and out, bad, late, each expectation's violations, and
    windows emitted, updated and closed.

    Nothing is written: no offsets, state, sink rows, late or bad records,
    watermarks or progress, and no file under the checkpoint or the sink; the
    next `lowmark run` writes the rows shown.
    """
    from lowmark.batches.admin.preview import preview_next
    from lowmark.batches.loop.preflight import check_source_folders

    c: Context = ctx.obj
    p = get_pipeline(pipeline, c.pipelines)
    check_source_folders(p, c.data_root)  # as `lowmark plan` does
    with err.status(f"previewing {pipeline}…"):
        shown = preview_next(c.spark, p, c.data_root, c.clock, limit)
    plan, batch = shown.plan, shown.batch
    if as_json:
        print_json(out, shown.to_json(), default=_json_value)
    elif plan.batch_id is None:
        out.print(f"{p.name}: {plan.reason}", soft_wrap=True, highlight=False)
    elif batch is not None:
        _print_preview(p, plan, batch)
    if plan.problem is not None:
        if not as_json:
            err.print(f"[red]error:[/] {plan.problem}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)


def _print_preview(p: Pipeline, plan: BatchPlan, batch: PreviewedBatch) -> None:
    """``lowmark preview``'s text: the batch, its counts, then the first sink rows."""
    from lowmark.batches.expectations import PARSABLE

    kind = " (a replay of the uncommitted batch)" if plan.replay else ""
    out.print(
        f"{p.name}: batch {plan.batch_id}{kind}, previewed: nothing was written",
        soft_wrap=True,
        highlight=False,
    )
    fields = [
        ("  input", plan.input or ""),
        (
            "  rows",
            f"{batch.rows_in} in, {batch.rows_out} out, {batch.rows_bad} bad, "
            f"{batch.rows_late} late",
        ),
    ]
    violated = [f"{n} {v}" for n, v in batch.violations.items() if n != PARSABLE]
    if violated:
        fields.append(("  expectations", ", ".join(violated)))
    if batch.windows is not None:
        w = batch.windows
        retracted = f", {w.retracted} retracted" if w.retracted else ""
        fields.append(
            (
                "  windows",
                f"{w.emitted} emitted, {w.updated} updated, {w.closed} closed{retracted}",
            )
        )
    if batch.stops is not None:
        fields.append(("  a run stops", batch.stops))
    print_fields(out, fields)
    if not batch.columns:
        return
    cells = [[_cell(row[c]) for c in batch.columns] for row in batch.rows]
    print_table(out, batch.columns, cells)
    if len(batch.rows) < batch.rows_out:
        out.print(f"(the first {len(batch.rows)} of {batch.rows_out} rows)", highlight=False)


def _cell(value: object) -> str:
    """A sink row's value in a text table: times in ISO 8601, nothing as empty."""
    if value is None:
        return ""
    return str(_json_value(value)) if isinstance(value, datetime) else str(value)


def _json_value(value: object) -> object:
    """What JSON has no type for, in a sink row: times as ISO 8601, the rest as text."""
    if isinstance(value, datetime):
        moment_utc = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return moment_utc.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return str(value)


@app.command()
def history(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    last: Annotated[int | None, typer.Option(min=1, help="Only the newest N batches.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Show PIPELINE's per-batch progress (the checkpoint's progress table)."""
    from lowmark.batches.admin.status import pipeline_history

    c: Context = ctx.obj
    p = get_pipeline(pipeline, c.pipelines)
    rows = pipeline_history(p, c.data_root, last)
    if as_json:
        print_json(out, rows)
        return
    now = c.clock.now_ms()
    lag = p.event_time is not None  # without event time there is no lag to show
    headers = ("batch", "committed", "rows in", "out", "bad", "late")
    shown = []
    for r in rows:
        committed = round(datetime.fromisoformat(r["created_at"]).timestamp() * 1000)
        cells = [
            f"{r['batch_id']}{' (replay)' if r['replayed'] else ''}",
            moment(committed, now),
            *(str(r[k]) for k in ("rows_in", "rows_out", "rows_bad", "rows_late")),
        ]
        if lag:
            cells.append(duration(r["lag_ms"]) if r["lag_ms"] is not None else "-")
        shown.append((*cells, duration(r["durations_ms"]["total"])))
    print_table(out, (*headers, *(["event-time lag"] if lag else []), "took"), shown)


@app.command()
def compact(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    as_json: JsonFlag = False,
) -> None:
    """Run maintenance of PIPELINE's checkpoint now: old log entries go, small files merge,
    old files and Delta log files are removed.

    What a batch does by itself every `maintenance.every_batches` batches,
    with the pipeline's `maintenance` settings. Starts no Spark over a local
    folder; safe while the pipeline runs (a table a batch is writing is left
    for next time) and between a crash and its replay (the window state the
    last commit recorded, which the replay and backfills read, is kept).
    """
    from lowmark.batches.loop.maintenance import maintain_checkpoint

    c: Context = ctx.obj
    p = get_pipeline(pipeline, c.pipelines)
    done = maintain_checkpoint(c.spark, p, c.data_root)
    if as_json:
        counts = (
            dataclasses.asdict(done)
            if done
            else dict.fromkeys(("tables", "first_kept", "last_committed"))
        )
        print_json(
            out,
            {
                "pipeline": p.name,
                "checkpoint": p.checkpoint_location(c.data_root),
                "compacted": done is not None,
            }
            | counts,
        )
        return
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
    as_json: JsonFlag = False,
) -> None:
    """Set aside the input of PIPELINE's uncommitted BATCH (a poison batch) and go on.

    Its files are recorded in the checkpoint's bad_records table with the
    reason, every state table it changed (windows, seen ids, keyed state and
    timers, join rows) is put back as the batch before left it, and an
    empty commit lets the next batch run. Reprocess the files once the
    transform is fixed (docs/guarantees.md, "Poison batches"). Starts no Spark.
    """
    from lowmark.batches.admin.skip_batch import set_aside

    c: Context = ctx.obj
    p = get_pipeline(pipeline, c.pipelines)
    done = set_aside(c.spark, p, c.data_root, batch, reason, c.clock)
    if as_json:
        print_json(
            out, {"pipeline": p.name} | dataclasses.asdict(done) | {"next_batch": done.batch_id + 1}
        )
        return
    restored = (
        "; put back as the batch before left it: "
        + ", ".join(
            f"{role} (version {version})" if version is not None else f"{role} (empty)"
            for role, version in done.restored.items()
        )
        if done.restored
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
            help="Start after the data the sink holds, its state and watermark carried over.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Start PIPELINE over on a new checkpoint without writing the sink's data twice.

    The old checkpoint is moved aside to <checkpoint>.reset-<UTC time>, never
    deleted. Choose one: --truncate-sink empties the sink (one Delta commit:
    time travel still reaches the old rows) and reads the source from its
    beginning; --after-sink starts right after the last batch the sink holds
    (its offsets, file manifest, state tables, watermark and timers come from
    the old checkpoint).
    """
    from lowmark.batches.admin.reset import reset as reset_pipeline

    if truncate_sink == after_sink:
        raise typer.BadParameter("choose one of --truncate-sink and --after-sink")
    c: Context = ctx.obj
    p = get_pipeline(pipeline, c.pipelines)
    for guard in c.reset_guards:
        if (why := guard(p)) is not None:
            raise RunInFlight(why)
    done = reset_pipeline(c.spark, p, c.data_root, "truncate" if truncate_sink else "after")
    if as_json:
        print_json(out, dataclasses.asdict(done))
        return
    if done.moved_to:
        out.print(f"{p.name}: old checkpoint moved to {done.moved_to}", soft_wrap=True)
    if done.mode == "truncate":
        out.print(
            f"{p.name}: sink emptied; new checkpoint {done.pipeline_id} starts from the "
            "beginning of the source",
            soft_wrap=True,
        )
        for line in done.not_emptied:
            out.print(f"{p.name}: {line}", soft_wrap=True)
    else:
        out.print(
            f"{p.name}: new checkpoint {done.pipeline_id} starts after {done.continues} "
            f"(offsets {done.start_offsets}; {done.files} files already taken)",
            soft_wrap=True,
        )


@app.command()
def rebuild(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Argument(help="Pipeline name.")],
    as_json: JsonFlag = False,
) -> None:
    """Recompute PIPELINE's output under its changed definition, then swap it in.

    For a change `lowmark plan` classes `rebuild` (a window size, a removed source column):
    each batch the live checkpoint committed is computed again under the definition now,
    over the same input range, into a shadow checkpoint <checkpoint>.rebuild and shadow
    sinks <sink path>.rebuild, while the live pipeline may keep running. Once the shadow
    has every live batch, the live checkpoint is moved aside to <checkpoint>.rebuilt-<UTC
    time> (a runner on it stops), each Delta sink's content is replaced by its shadow's in
    one commit (a reader sees the old table or the new one), and the shadow checkpoint
    takes the live one's place: `lowmark run` goes on under the new definition. Stopped
    anywhere, run it again: it finishes the job. Delta sinks only (docs/operations.md,
    "Rebuilding a pipeline").
    """
    from lowmark.batches.admin.rebuild import ShadowBatch
    from lowmark.batches.admin.rebuild import rebuild as rebuild_pipeline

    c: Context = ctx.obj
    p = get_pipeline(pipeline, c.pipelines)

    def told(b: ShadowBatch) -> None:
        if as_json:
            print_json(out, {"pipeline": p.name} | dataclasses.asdict(b), indent=None)
            return
        what = "replayed" if b.replay else "committed"
        out.print(
            f"{p.name}: shadow batch {b.shadow_batch} {what} (live batch {b.live_batch} of "
            f"{b.live_last}): {b.rows_out} rows out",
            soft_wrap=True,
        )

    done = rebuild_pipeline(c.spark, p, c.data_root, told)
    if as_json:
        print_json(out, dataclasses.asdict(done))
        return
    if done.nothing is not None:
        out.print(f"{p.name}: nothing rebuilt: {done.nothing}", soft_wrap=True)
        return
    sinks = ", ".join(done.sinks) or "none"
    out.print(
        f"{p.name}: rebuilt through live batch {done.last_batch} and swapped in (shadow "
        f"batches run now: {done.batches}); sinks replaced: {sinks}; old checkpoint moved to "
        f"{done.moved_to}; `lowmark run {p.name}` goes on under the new definition",
        soft_wrap=True,
    )


def _demo_table(pipeline: Pipeline, data_root: Path) -> str:
    """Where a demo pipeline's sink table lives."""
    from lowmark.batches.pipeline import DeltaSink, resolve

    assert isinstance(pipeline.sink, DeltaSink)  # the demo's pipelines write Delta tables
    return resolve(pipeline.sink.path, data_root)


@app.command()
def demo(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Write sample orders, run both demo pipelines until caught up, show what landed.

    `orders` cleans each order into a Delta table; `user_revenue` counts
    orders and sums revenue per user per minute (event-time windows), sending
    the straggler file's orders to its late table.
    """
    from lowmark.batches.admin.status import pipeline_status
    from lowmark.batches.demo import INCOMING, orders, user_revenue, write_sample_files
    from lowmark.batches.loop.microbatch import MicroBatchRunner

    c: Context = ctx.obj
    now = datetime.fromtimestamp(c.clock.now_ms() / 1000, UTC)
    written = write_sample_files(c.data_root, now=now)
    if not as_json:
        out.print(f"sample data: {len(written)} new files in {c.data_root / INCOMING}")
    spark = c.spark()
    ran = []
    for pipeline in (orders, user_revenue):
        if not as_json:
            out.print(f"[bold]{pipeline.name}[/]: {pipeline.description}", soft_wrap=True)
        with err.status(f"running {pipeline.name}…"):
            runner = MicroBatchRunner(spark, pipeline, c.data_root, c.clock)
            show = None if as_json else _print_batch
            results = runner.run(max_batches=None, on_batch=c.on_batch(runner, show))
        s = pipeline_status(spark, pipeline, c.data_root, c.clock)
        sink = _demo_table(pipeline, c.data_root)
        ran.append(
            {
                "pipeline": pipeline.name,
                "batches": [_batch_json(r) for r in results],
                "sink": sink,
                "sink_rows": spark.read.format("delta").load(sink).count(),
                "rows_bad": s.totals["rows_bad"],
                "rows_late": s.totals["rows_late"],
                "last_committed_batch": s.last_committed_batch,
            }
        )
        if not as_json:
            last = ran[-1]
            out.print(
                f"  sink {sink}: {last['sink_rows']} rows; {last['rows_bad']} bad records, "
                f"{last['rows_late']} late records; last committed batch "
                f"{last['last_committed_batch']}",
                soft_wrap=True,
            )
    windows = spark.read.format("delta").load(_demo_table(user_revenue, c.data_root))
    first = [
        {
            "user": row["user"],
            "window_start": iso_utc(round(row["window_start"].timestamp() * 1000)),
            "orders": row["orders"],
            "revenue": row["revenue"],
        }
        for row in windows.orderBy("window_start", "user").limit(10).collect()
    ]
    if as_json:
        written_paths = [str(path) for path in written]
        print_json(
            out,
            {"data_root": str(c.data_root), "sample_files_written": written_paths}
            | {"pipelines": ran, "first_windows": first},
        )
        return
    out.print("user_revenue, the first windows:")
    print_table(
        out,
        ("user", "window start", "orders", "revenue"),
        [(w["user"], w["window_start"], str(w["orders"]), f"{w['revenue']:.2f}") for w in first],
    )


def main(
    argv: list[str] | None = None,
    listeners: Sequence[BatchListener] = (),
    clock: Clock | None = None,
    reset_guards: Sequence[ResetGuard] = (),
) -> None:
    """Console entry point: run the app, turning user errors into one line. ``listeners``
    hear of every batch a command commits; ``clock`` (default: the wall clock) is what
    every command reads "now" from; ``reset_guards`` may refuse a ``lowmark reset``."""
    obj = {"listeners": listeners, "clock": clock, "reset_guards": reset_guards}
    try:
        app(args=argv, prog_name="lowmark", obj=obj)
    except BatchFailed as exc:
        # lowmark's own error says all there is; a Spark or transform error has more.
        _fail(str(exc), exc, 2, details=not isinstance(exc.__cause__, LowmarkError))
    except LowmarkError as exc:
        _fail(str(exc), exc, 2, details=False)
    except Exception as exc:
        if _analysis_error(exc):
            _fail(f"Spark rejected the pipeline: {first_line(exc)}", exc, 2, details=True)
        else:
            _fail(f"{type(exc).__name__}: {first_line(exc)}", exc, 1, details=True)
    finally:
        stop_logs()


def _analysis_error(exc: Exception) -> bool:
    """Whether ``exc`` is Spark's verdict on the pipeline's query (an AnalysisException);
    PySpark is not imported for it: an error of a command that never imported it is not."""
    errors = sys.modules.get("pyspark.errors")
    return errors is not None and isinstance(exc, errors.AnalysisException)


def _fail(message: str, exc: Exception, code: int, details: bool) -> None:
    """Print ``message``, log ``exc`` with its traceback (the log file; the console too
    with ``--verbose``), and exit with ``code``. ``details``: say where they are."""
    details_log.error("lowmark stopped: %s", message, exc_info=exc)
    where = installed_log_file()
    if details and where is not None:
        message += f"\n  details: {where} (or run again with --verbose)"
    err.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
    sys.exit(code)
