"""The ``lowmark`` command: the engine's commands (``batches.cli``) and the Dagster ones.

- Batches the CLI commits are reported to the Dagster instance in
  ``DAGSTER_HOME`` when it is set (runless materializations, the same a run
  records), so the assets' history holds every batch however it ran.
- ``lowmark ui`` runs the Dagster UI with a clean start and stop
  (``orchestration.ui``).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Annotated

import dagster as dg
import typer

from batches import cli
from batches.microbatch import BatchResult, MicroBatchRunner
from batches.registry import load_pipelines
from orchestration.partitions import event_time_partitions
from orchestration.reporting import BatchReports
from orchestration.ui import PROJECT, DagsterDev, prepare_home


def report_to_dagster(
    runner: MicroBatchRunner, data_root: Path
) -> Callable[[BatchResult], None] | None:
    """With ``DAGSTER_HOME`` set: report each batch to that instance as runless events."""
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        return None
    prepare_home(Path(home))
    instance = dg.DagsterInstance.get()
    pipeline = runner.pipeline
    reports = BatchReports(instance, pipeline, runner, event_time_partitions(pipeline, data_root))

    def report(r: BatchResult) -> None:
        for event in reports.of(r):
            instance.report_runless_asset_event(event)

    return report


@cli.app.command()
def ui(
    ctx: typer.Context,
    port: Annotated[int, typer.Option(envvar="LOWMARK_UI_PORT", help="Port to serve on.")] = 3000,
    host: Annotated[str, typer.Option(help="Interface to serve on.")] = "127.0.0.1",
    workspace: Annotated[
        Path, typer.Option(help="Dagster workspace file that loads the pipelines.")
    ] = PROJECT / "workspace.yaml",
) -> None:
    """Open the Dagster UI over the pipelines: webserver, daemon (sensors, schedules, run
    queue) and code server, with the instance in DAGSTER_HOME (default ./.dagster_home).

    Ctrl-C or SIGTERM stops all of it, runs and their Spark included, within
    about 10 s: a run following the source finishes its batch first.
    """
    c: cli.Context = ctx.obj
    home = Path(os.environ.get("DAGSTER_HOME", ".dagster_home")).resolve()
    env = {"LOWMARK_DATA_ROOT": str(c.data_root)}
    if c.pipelines:
        env["LOWMARK_PIPELINES"] = c.pipelines
    names = list(load_pipelines(c.pipelines))
    cli.err.print(f"starting the Dagster UI (instance {home})…")
    dev = DagsterDev.start(home, port, host, workspace, env)
    stopping: list[str] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    if not dev.wait_until_up() and not stopping:
        dev.stop()
        raise typer.Exit(1)
    if not stopping:
        example = names[0] if names else "<pipeline>"
        cli.out.print(
            f"\n[bold]lowmark UI: {dev.url}[/]\n"
            f"  Catalog → lowmark/{example}: each batch's metadata and plots; Materialize runs "
            "batches (partitions: a backfill)\n"
            f"  Automation → {example}_sensor: starts a run when files land; the run follows "
            "the source\n"
            "  Runs: every batch, one log line each\n"
            "Ctrl-C stops the UI, its runs and their Spark.\n",
            soft_wrap=True,
        )
    while not stopping and dev.process.poll() is None:
        time.sleep(0.5)
    took = dev.stop()
    cli.err.print(f"stopped the Dagster UI and its runs in {took:.1f} s")


def main(argv: list[str] | None = None) -> None:
    """The ``lowmark`` console entry point."""
    cli.main(argv if argv is not None else sys.argv[1:], listeners=(report_to_dagster,))
