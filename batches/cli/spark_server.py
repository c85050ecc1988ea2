"""``lowmark spark-connect``: a long-lived Spark with Delta that lowmark's processes share.

Runs ``lowmark.state.connect_server.ConnectServer`` in the foreground until
Ctrl-C or SIGTERM: a deployment's Spark for its Dagster runs (docs/deploy.md,
"A long-lived Spark"). ``lowmark ui`` starts one itself when no master is set.

Registered on the ``lowmark`` app of ``lowmark.batches.cli.commands`` when imported
(``lowmark.orchestration.cli``, the console entry point, does).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from lowmark.batches.cli.commands import Context, app, err, out
from lowmark.batches.cli.display import print_json
from lowmark.batches.cli.logs import log_file


@app.command("spark-connect")
def spark_connect(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option(help="Interface to serve on (0.0.0.0: every one; no auth).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to serve on (Spark Connect's own).")] = 15002,
    cores: Annotated[str, typer.Option(help="Local cores its tasks run on: a number or *.")] = "*",
    conf: Annotated[
        list[str] | None,
        typer.Option(
            help="A Spark conf KEY=VALUE for the server's JVM (memory, executors, ...); "
            "repeatable. They win over lowmark's.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Once up, print one line of JSON: url, log.")
    ] = False,
) -> None:
    """Run a Spark Connect server with Delta and lowmark's jars and confs until Ctrl-C.

    Point lowmark at it with --master sc://HOST:PORT (or LOWMARK_SPARK_MASTER): a run
    then starts no JVM of its own. Its log goes to <data root>/_lowmark/_logs/.
    """
    from lowmark.state.connect_server import ConnectServer

    c: Context = ctx.obj
    confs = dict(_key_value(item) for item in conf or [])
    log = log_file(c.data_root).with_name("spark-connect.log")
    server = ConnectServer.start(log, host, port, cores, confs, python_path=[Path.cwd()])
    stopping: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    err.print(f"starting Spark Connect on {server.url} (log {log})…")
    server.wait_until_up()
    if as_json:
        print_json(out, {"url": server.url, "log": str(log)}, indent=None)
    else:
        out.print(f"Spark Connect: {server.url} (lowmark --master {server.url}); Ctrl-C stops it")
    while not stopping and server.process.poll() is None:
        time.sleep(0.5)
    exited = server.process.poll()
    server.stop()
    if exited is not None and not stopping:
        err.print(f"the Spark Connect server exited ({exited}); see {log}")
        raise typer.Exit(1)
    err.print("stopped Spark Connect")


def _key_value(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"{item!r}: give KEY=VALUE, e.g. spark.driver.memory=8g")
    return key.strip(), value
