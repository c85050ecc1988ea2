"""``lowmark spark-connect``: a long-lived Spark with Delta that lowmark's processes share.

Runs ``lowmark.state.connect_server.ConnectServer`` in the foreground until
Ctrl-C or SIGTERM: a deployment's Spark for its Dagster runs (docs/deploy.md,
"A long-lived Spark"). ``lowmark ui`` starts one itself when no master is set.
Its clients need its token, which it keeps in a file only its owner reads
(``--token-file``) and never prints.

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

from lowmark.batches.cli.commands import ConfOption, Context, app, err, given_confs, out
from lowmark.batches.cli.display import print_json
from lowmark.batches.cli.logs import log_file


@app.command("spark-connect")
def spark_connect(
    ctx: typer.Context,
    host: Annotated[
        str,
        typer.Option(
            help="Interface to serve on (0.0.0.0: every one). pyspark sends the token "
            "without TLS only to localhost: remote clients need a TLS proxy or a tunnel."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to serve on (Spark Connect's own).")] = 15002,
    cores: Annotated[
        str, typer.Option(help="Local cores its tasks run on: a number or *. Local only.")
    ] = "*",
    master: Annotated[
        str | None,
        typer.Option(
            "--master",
            help="A cluster's master (spark://host:7077, ...) whose executors run its tasks. "
            "Default: local, on --cores.",
        ),
    ] = None,
    conf: ConfOption = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="The file holding the token clients must present; a new random one is "
            "written there (mode 0600) when it does not exist. Default: "
            "<data root>/_lowmark/spark-connect.token.",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Once up, print one line of JSON: url, token_file, log."),
    ] = False,
) -> None:
    """Run a Spark Connect server with Delta and lowmark's jars and confs until Ctrl-C.

    Point lowmark at it with --master sc://HOST:PORT (or LOWMARK_SPARK_MASTER) and its
    token in SPARK_CONNECT_AUTHENTICATE_TOKEN (read from --token-file): a run then starts
    no JVM of its own. A client without the token is refused. Its log goes to
    <data root>/_lowmark/_logs/.
    """
    from lowmark.state.connect_server import ConnectServer, token_from_file

    c: Context = ctx.obj
    if master is not None and cores != "*":
        raise typer.BadParameter(
            "--cores is for a local server: a cluster's executors bring their cores "
            "(--conf spark.cores.max=N)"
        )
    confs = given_confs(conf)
    log = log_file(c.data_root).with_name("spark-connect.log")
    token_file = token_file or c.data_root / "_lowmark" / "spark-connect.token"
    token = token_from_file(token_file)
    server = ConnectServer.start(
        log, host, port, cores, confs, python_path=[Path.cwd()], token=token, master=master
    )
    stopping: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    on = f" against {master}" if master else ""
    err.print(f"starting Spark Connect on {server.url}{on} (log {log})…")
    server.wait_until_up()
    if as_json:
        ready = {"url": server.url, "token_file": str(token_file), "log": str(log)}
        print_json(out, ready, indent=None)
    else:
        out.print(
            f"Spark Connect: {server.url}; its clients need the token in {token_file}:\n"
            f"  export SPARK_CONNECT_AUTHENTICATE_TOKEN=$(cat {token_file})\n"
            f"  lowmark --master {server.url} …\n"
            "Ctrl-C stops it",
            soft_wrap=True,
        )
    while not stopping and server.process.poll() is None:
        time.sleep(0.5)
    exited = server.process.poll()
    server.stop()
    if exited is not None and not stopping:
        err.print(f"the Spark Connect server exited ({exited}); see {log}")
        raise typer.Exit(1)
    err.print("stopped Spark Connect")
