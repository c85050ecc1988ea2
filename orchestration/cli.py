"""The ``lowmark`` command: the engine's commands (``lowmark.batches.cli.commands``) and the Dagster
ones.

- Batches the CLI commits are reported to the Dagster instance in
  ``DAGSTER_HOME`` when it is set (runless materializations, the same a run
  records), so the assets' history holds every batch however it ran.
- ``lowmark ui`` runs the Dagster UI with a clean start and stop
  (``lowmark.orchestration.ui``).
- ``lowmark init DIR`` makes a project of one's own (``lowmark.orchestration.scaffold``); run in
  a project, ``lowmark`` uses it (``lowmark.orchestration.project``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

# Imported for what they register: look `show` and `sql`, spark_server `spark-connect`.
from lowmark.batches.cli import commands, look, spark_server  # noqa: F401
from lowmark.batches.cli.display import print_json
from lowmark.batches.registry import load_pipelines
from lowmark.orchestration.errors import ProjectFileInvalid, ProjectUnsafe
from lowmark.orchestration.instance import POSTGRES_VARIABLES, DagsterStorage
from lowmark.orchestration.project import find_project
from lowmark.state.errors import LowmarkError
from lowmark.state.spark_confs import CONFS_ENV, confs_from_env

# Dagster (and, through the engine, PySpark) is imported by what needs it: reporting a
# batch, `lowmark ui`, `init`. `lowmark --help`, `list`, `show`, `sql`, `status` and
# `plan` never import Dagster (docs/cli.md, "Fast commands").
if TYPE_CHECKING:
    from lowmark.batches.loop.microbatch import BatchResult, MicroBatchRunner
    from lowmark.batches.pipeline import Pipeline


def report_to_dagster(
    runner: MicroBatchRunner, data_root: Path
) -> Callable[[BatchResult], None] | None:
    """With ``DAGSTER_HOME`` set: report each batch to that instance as runless events —
    the materializations a run records (event-time partitions by the sink as it stands,
    as the UI will derive them when it loads) and every check's evaluation after it, so
    the UI opened after `lowmark demo` shows what the demo did."""
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return None
    import dagster as dg

    from lowmark.orchestration.checks import check_evaluations, check_keys
    from lowmark.orchestration.partitions import event_time_partitions
    from lowmark.orchestration.reporting import BatchReports
    from lowmark.orchestration.ui import prepare_home

    prepare_home(Path(home))
    instance = dg.DagsterInstance.get()
    pipeline = runner.pipeline
    # No input observed: which inputs are other pipelines' sinks is the code location's to
    # say (`observed_inputs`); the sensor's next tick records what waits there.
    reports = BatchReports(
        instance,
        pipeline,
        runner,
        data_root,
        lambda: event_time_partitions(pipeline, data_root),
        inputs={},
    )

    def report(r: BatchResult) -> None:
        events: list[dg.AssetMaterialization | dg.AssetObservation | dg.AssetCheckEvaluation] = [
            *reports.of(r)
        ]
        events += check_evaluations(pipeline, data_root, check_keys(pipeline))
        for event in events:
            instance.report_runless_asset_event(event)

    return report


def runs_in_flight(pipeline: Pipeline) -> str | None:
    """With ``DAGSTER_HOME`` set: why ``pipeline`` must not be reset now, a run of it queued
    or in flight in that instance (its runner would stop at its checkpoint's fence in the
    middle of a batch, and a queued one start before the reset is done)."""
    home = os.environ.get("DAGSTER_HOME")
    if not home or not (Path(home) / "dagster.yaml").exists():
        return None
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    from lowmark.orchestration.runs import IN_FLIGHT, runs_of

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(home)) as instance:
        running = runs_of(instance, pipeline, IN_FLIGHT)
    if not running:
        return None
    run = running[0]
    return (
        f"run {run.run_id} of {pipeline.name} is {run.status.value} in the Dagster instance "
        f"{home}: wait for it to end, or terminate it (the UI's Runs page), then reset"
    )


@commands.app.command()
def ui(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(envvar="LOWMARK_UI_PORT", help="Port to serve on.")] = 3000,
    host: Annotated[str, typer.Option(help="Interface to serve on.")] = "127.0.0.1",
    workspace: Annotated[
        Path | None,
        typer.Option(
            help="Dagster workspace file that loads the pipelines. Default: the project's "
            "workspace.yaml in a lowmark project, else lowmark's own.",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Once the UI is up, print one line of JSON: url, dagster_home, pipelines, "
            "spark (the Spark master its runs use; null: the runner's, or each starts its "
            "own), runner (the runner's pid; null: a process per run).",
        ),
    ] = False,
    shared_spark: Annotated[
        bool | None,
        typer.Option(
            "--shared-spark/--no-shared-spark",
            help="Start one Spark (a Spark Connect server on loopback) that every run, tick "
            "and backfill uses, so a run's start costs no JVM. Default: on with --no-runner "
            "(with the runner, its Spark is the one the runs share), unless a Spark master is "
            "set (--master, LOWMARK_SPARK_MASTER, lowmark.toml): then the runs use that.",
            show_default=False,
        ),
    ] = None,
    runner: Annotated[
        bool,
        typer.Option(
            "--runner/--no-runner",
            help="Execute every pipeline's runs in one warm runner process (lowmark serve) "
            "on one Spark, started and warmed with the UI: a run pays no Python or Spark "
            "start. --no-runner: a process per run, as Dagster's default launcher does.",
        ),
    ] = True,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            help="Print all of Dagster's output here (every run event, every sensor tick, "
            "Dagster's warnings) instead of into DAGSTER_HOME/lowmark-ui.log.",
        ),
    ] = False,
    conf: commands.ConfOption = None,
) -> None:
    """Open the Dagster UI over the pipelines: webserver, daemon (sensors, schedules, run
    queue) and code server, with the instance in DAGSTER_HOME (default ./.dagster_home),
    and the warm runner that executes every pipeline's runs on one Spark (lowmark serve).

    It prints its address, each pipeline's runs as they start and end, a sensor's reason
    to skip when it changes, and errors; the rest of Dagster's output goes to
    DAGSTER_HOME/lowmark-ui.log (--verbose: here).

    Ctrl-C or SIGTERM stops all of it, runs and their Spark included, within
    about 10 s: a run following the source finishes its batch first.
    """
    from lowmark.orchestration.ui import PROJECT, UI_LOG, DagsterDev

    c: commands.Context = ctx.obj
    _hand_down_confs(conf)
    home = _dagster_home()
    env = {"LOWMARK_DATA_ROOT": str(c.data_root)}
    if c.pipelines:
        env["LOWMARK_PIPELINES"] = c.pipelines
    master = c.master or os.environ.get("LOWMARK_SPARK_MASTER")
    if master:
        env["LOWMARK_SPARK_MASTER"] = master
    if shared_spark and master:
        raise LowmarkError(
            f"--shared-spark: a Spark master is set ({master}); the runs use it. Unset it "
            "(--master, LOWMARK_SPARK_MASTER, lowmark.toml's spark_master) for a shared one"
        )
    names = list(load_pipelines(c.pipelines))
    if workspace is None:
        project = find_project(Path.cwd())
        workspace = project.workspace if project else PROJECT / "workspace.yaml"
    # The runner's Spark is the one the runs share: a Spark Connect server only when asked.
    share = master is None and (shared_spark if shared_spark is not None else not runner)
    spark_note = " and a shared Spark" if share else ""
    log = None if verbose else home / UI_LOG
    logged = f"; its log: {log}" if log else ""
    commands.err.print(
        f"starting the Dagster UI{spark_note} (instance {home}{logged})…", soft_wrap=True
    )
    dev = DagsterDev.start(
        home, port, host, workspace, env, shared_spark=share, log=log, runner=runner
    )
    stopping: list[str] = []

    def say(lines: list[str]) -> None:
        for line in lines:
            commands.err.print(line, highlight=False, markup=False, soft_wrap=True)

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    try:
        up = dev.wait_until_up()
    except LowmarkError:
        dev.stop()
        raise
    if not up and not stopping:
        dev.stop()
        if log is not None:
            with dev.feed() as last:
                say(last.poll())
        commands.err.print(f"the Dagster UI did not start{logged}", soft_wrap=True)
        raise typer.Exit(1)
    spark = dev.spark.url if dev.spark else master
    runner_pid = dev.runner.pid if dev.runner is not None else None
    if not stopping and as_json:
        ready = {
            "url": dev.url,
            "dagster_home": str(home),
            "pipelines": names,
            "spark": spark,
            "runner": runner_pid,
        }
        print_json(commands.out, ready, indent=None)
    elif not stopping:
        example = names[0] if names else "<pipeline>"
        commands.out.print(
            f"\n[bold]lowmark UI: {dev.url}[/]\n"
            f"  Catalog → lowmark/{example}: each batch's metadata and plots; Materialize runs "
            "batches (partitions: a backfill)\n"
            f"  Automation → {example}_sensor: starts a run when files land; the run follows "
            "the source\n"
            "  Runs: every batch, one log line each\n"
            f"Spark: {spark or ('the runner' if runner_pid else 'started by each run (local)')}"
            f"{' (shared: started with the UI)' if dev.spark else ''}\n"
            + (
                f"Runner (pid {runner_pid}): every pipeline's runs, on one Spark warmed now\n"
                if runner_pid
                else ""
            )
            + "Ctrl-C stops the UI, its runs and their Spark.\n",
            soft_wrap=True,
        )
    with dev.feed() if log else contextlib.nullcontext() as feed:
        while True:
            ended = stopping or dev.process.poll() is not None
            say(feed.poll() if feed else [])  # once more after the end: its last words
            if ended:
                break
            if dev.spark is not None and dev.spark.process.poll() is not None:
                commands.err.print(f"the shared Spark exited (its log: {dev.spark.log}): stopping")
                break
            runner_exited = dev.runner_exited()
            if runner_exited is not None:
                commands.err.print(runner_exited, soft_wrap=True)
            time.sleep(0.5)
    took = dev.stop()
    commands.err.print(f"stopped the Dagster UI and its runs in {took:.1f} s")


@commands.app.command()
def serve(
    ctx: typer.Context,
    conf: commands.ConfOption = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Once Spark is warm, print one line of JSON: pid, dagster_home, spark (the "
            "Spark master; null: a local one).",
        ),
    ] = False,
) -> None:
    """Execute the Dagster runs of every pipeline of the instance in DAGSTER_HOME (default
    ./.dagster_home) in this one process, on one Spark started and warmed now: the run
    launcher of lowmark's dagster.yaml hands them over while it serves. A run whose Spark
    settings this Spark cannot take at runtime gets a process of its own, and its log says
    why. `lowmark ui` starts one; run it yourself beside `dagster dev`.

    Ctrl-C or SIGTERM: every run ends after its batch in progress, then it exits. Its own
    log is every command's (the data root's _lowmark/_logs/lowmark.log); the runs' raw
    output is its stdout and stderr.
    """
    from lowmark.orchestration.runner import serve as serve_runs
    from lowmark.orchestration.ui import prepare_home

    c: commands.Context = ctx.obj
    _hand_down_confs(conf)
    # The runs' resources read these, as in the processes `dagster dev` starts.
    os.environ["LOWMARK_DATA_ROOT"] = str(c.data_root)
    if c.pipelines:
        os.environ["LOWMARK_PIPELINES"] = c.pipelines
    if c.master:
        os.environ["LOWMARK_SPARK_MASTER"] = c.master
    home = prepare_home(_dagster_home())

    def ready() -> None:
        if as_json:
            said = {"pid": os.getpid(), "dagster_home": str(home), "spark": c.master}
            print_json(commands.out, said, indent=None)
        else:
            commands.out.print(f"lowmark runner (pid {os.getpid()}): serving {home}, Spark warm")

    serve_runs(home, ready)


def _hand_down_confs(conf: list[str] | None) -> None:
    """The command's ``--conf`` settings, over those it was given, for every process and
    session it starts (they read them in ``CONFS_ENV``: ``SparkSettings``)."""
    confs = commands.given_confs(conf)
    if confs:
        given = {**confs_from_env(CONFS_ENV), **confs}
        os.environ[CONFS_ENV] = json.dumps(given, sort_keys=True)


def _dagster_home() -> Path:
    return Path(os.environ.get("DAGSTER_HOME", ".dagster_home")).resolve()


@commands.app.command()
def init(
    folder: Annotated[Path, typer.Argument(help="A new or empty folder for the project.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print what was created as JSON.")
    ] = False,
    dagster_storage: Annotated[
        DagsterStorage,
        typer.Option(
            help="Where the project's Dagster instance keeps runs, event logs and schedules: "
            "SQLite files in dagster_home/, or a Postgres database named by the environment "
            f"variables {', '.join(POSTGRES_VARIABLES)}.",
        ),
    ] = DagsterStorage.SQLITE,
) -> None:
    """Start a project of your own in FOLDER, ready to run: one example pipeline (JSON files
    of page views → views per page per minute, a Delta table) and a sample file to feed it,
    lowmark.toml, Dagster's workspace.yaml and instance, a data folder and a README.

    Run in FOLDER (or below it), `lowmark` uses the project's pipelines, data root and
    Dagster instance with no flags; a flag or an environment variable still wins (flag >
    LOWMARK_PIPELINES / LOWMARK_DATA_ROOT / DAGSTER_HOME > lowmark.toml > the demo).
    FOLDER must be new or empty: nothing is overwritten.
    """
    from lowmark.orchestration.scaffold import FILES, command_lines, init_project

    made = init_project(folder, datetime.now(UTC), dagster_storage)
    if as_json:
        print(made.to_json())
        return
    width = max(len(path) for path, _ in FILES)
    lines = [f"created a lowmark project in {made.root}:"]
    lines += [f"  {path:<{width}}  {what}" for path, what in FILES]
    lines += ["next:", f"  cd {shlex.quote(str(folder))}"]
    lines += [f"  {line}" for line in command_lines()]
    if shutil.which("lowmark") is None:
        lines.append(f"(lowmark is not on your PATH: add {Path(sys.executable).parent} to it)")
    commands.out.print("\n".join(lines), highlight=False, soft_wrap=True, markup=False)


def main(argv: list[str] | None = None) -> None:
    """The ``lowmark`` console entry point. Run in a lowmark project, its ``lowmark.toml``
    fills in the unset LOWMARK_PIPELINES, LOWMARK_DATA_ROOT and DAGSTER_HOME first."""
    try:
        project = find_project(Path.cwd())
    except (ProjectFileInvalid, ProjectUnsafe) as exc:
        commands.err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    if project is not None:
        project.use()
    commands.main(
        argv if argv is not None else sys.argv[1:],
        listeners=(report_to_dagster,),
        reset_guards=(runs_in_flight,),
    )
