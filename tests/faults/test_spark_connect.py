"""The same pipelines through a real Spark Connect server (``tests.spark_connect``: Delta
in its JVM, on loopback): `lowmark --master sc://…` runs them as a Spark Connect client, whose
process is SIGKILLed in batch 3 and run again to completion through the server; every
table equals the fault-free local run's (the kill matrix's reference,
``tests.faults.conftest``).

A killed client leaves its server running: what the client had asked for may still
finish there. The stateless pipeline's client is killed while the server writes its sink
(Spark's write of batch 3: its data files landing, its commit not yet), and the server
commits that write after the client is dead; the replay's write of batch 3 carries the
same Delta transaction (``txnAppId``/``txnVersion``) and is skipped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable as RsDeltaTable

from lowmark.batches.loop.faults import KILL_AT_ENV, KillPoint
from lowmark.batches.pipeline import resolve
from tests.faults.conftest import KILL_BATCH, MATRIX, References
from tests.faults.harness import (
    ENGINE_CLI,
    KILLED,
    REPO,
    Snapshot,
    clock_env,
    copy_run,
    create_database,
    differences,
    lowmark_env,
    lowmark_run_args,
    postgres_env,
    snapshot,
)
from tests.faults.kafka_sink import at_root, kafka_sink_env
from tests.faults.scenarios import PIPELINES, SINK, plain_append, session_update
from tests.spark_connect import RunningServer, start_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    started = start_server(tmp_path_factory.mktemp("spark_connect"))
    yield started
    started.stop()


def _client(
    server: RunningServer, root: Path, name: str, *options: str, **env: str
) -> subprocess.Popen[str]:
    """`lowmark run name --until-caught-up` (or with ``options``) as a Spark Connect client
    of ``server`` (``LOWMARK_SPARK_MASTER=sc://…``): no JVM in its process."""
    client_env = lowmark_env(None, **server.client_env(), **env)
    args = lowmark_run_args(root, PIPELINES[name], *(options or ("--until-caught-up",)))
    return subprocess.Popen(
        args, env=client_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finished(client: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = client.communicate(timeout=900)
    return client.returncode, err[-3000:]


KILLED_THROUGH_CONNECT = ("tumbling_two_partitions", "session_update", "keyed_alerts")
RUN_THROUGH_CONNECT = tuple(p.name for p in MATRIX if p.name not in KILLED_THROUGH_CONNECT)
"""The kill matrix's other pipelines (every source, sink, join and step lowmark has): each run
through Connect once, with no kill (the Dagster runs ``lowmark ui`` starts are Connect
clients)."""


@pytest.mark.parametrize("name", KILLED_THROUGH_CONNECT)
def test_a_pipeline_through_spark_connect_killed_and_run_again_ends_like_a_local_run(
    references: References, server: RunningServer, name: str
) -> None:
    ref = references[name]
    root = ref.folder / "through_connect"  # beside the shared input folder
    point = KillPoint("after_sink", KILL_BATCH)
    assert _finished(_client(server, root, name, **{KILL_AT_ENV: str(point)}))[0] == KILLED
    code, err = _finished(_client(server, root, name))
    assert code == 0, err

    assert differences(ref.tables, snapshot(ref.pipeline, root)) == []


@pytest.mark.parametrize("name", RUN_THROUGH_CONNECT)
def test_every_other_matrix_pipeline_through_spark_connect_ends_like_a_local_run(
    references: References, server: RunningServer, name: str
) -> None:
    ref = references[name]
    root = ref.folder / "run_through_connect"
    create_database(root, ref.pipeline)
    at_root(ref.pipeline, root)  # a Kafka sink's topic for this run, created
    env = {
        **postgres_env(root, ref.pipeline),
        **kafka_sink_env(root, ref.pipeline),
        **clock_env(ref.pipeline),
    }
    code, err = _finished(_client(server, root, name, **env))
    assert code == 0, err

    expected, actual = ref.tables, snapshot(ref.pipeline, root)
    assert differences(_fence_anywhere(expected), _fence_anywhere(actual)) == []


def _fence_anywhere(tables: Snapshot) -> Snapshot:
    """``tables`` with a Postgres sink's fence rows not naming their checkpoint: a new run's
    checkpoint has a pipeline id of its own, which its fence rows' ``app_id`` holds."""
    fence = Counter(
        json.dumps({k: v for k, v in json.loads(row).items() if k != "app_id"}, sort_keys=True)
        for row in tables.get("sink fence", Counter()).elements()
    )
    return tables | {"sink fence": fence} if fence else tables


def test_a_client_killed_while_the_server_writes_its_sink_replays_exactly_once(
    references: References, server: RunningServer
) -> None:
    ref = references[plain_append.name]
    root = ref.folder / "through_connect"
    copy_run(ref.folder / "template", root, ref.pipeline)  # batches 0-2 done
    # Batch 3 (its malformed line fails a first write attempt, whose data files stay as
    # garbage), then batch 4: no malformed line, so its first data file is its one write's.
    code, err = _finished(_client(server, root, plain_append.name, "--max-batches", "1"))
    assert code == 0, err
    killed = KILL_BATCH + 1
    sink = Path(resolve(SINK, root))
    before = set(sink.glob("*.parquet"))

    client = _client(server, root, plain_append.name)
    while not set(sink.glob("*.parquet")) - before:  # batch 4's first data file landed
        assert client.poll() is None, client.communicate()[1][-3000:]
        time.sleep(0.002)
    os.kill(client.pid, signal.SIGKILL)
    assert _finished(client)[0] == KILLED
    committed_at_kill = _sink_batches(sink)

    # The server goes on with the dead client's write and commits it.
    deadline = time.monotonic() + 60
    while killed not in _sink_batches(sink) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert killed not in committed_at_kill
    assert killed in _sink_batches(sink)

    code, err = _finished(_client(server, root, plain_append.name))
    assert code == 0, err
    assert differences(ref.tables, snapshot(ref.pipeline, root)) == []


def test_a_catch_up_over_files_named_with_spaces_and_symbols_ends_like_a_local_run(
    references: References, server: RunningServer, tmp_path: Path
) -> None:
    """Spark names a record's file by its URI ("a b.json" is "a%20b.json"), which only the
    JVM's Hadoop computes; a catch-up over Connect reads each batch on its own and never
    needs it, whatever the files are called."""
    ref = references[session_update.name]
    folder = tmp_path / "odd_names"
    shutil.copytree(ref.folder / "input", folder / "input")
    for path in sorted((folder / "input").glob("*.json")):
        path.rename(path.with_name(f"{path.stem} #1 [ä%20b].json"))  # same order, same times
    root = folder / "run"
    code, err = _finished(_client(server, root, session_update.name))
    assert code == 0, err

    actual, expected = snapshot(ref.pipeline, root), ref.tables
    assert (
        actual["sink"]
        and differences(
            {"sink": expected["sink"], "sink history": expected["sink history"]},
            {"sink": actual["sink"], "sink history": actual["sink history"]},
        )
        == []
    )


def test_a_merge_sink_through_spark_connect_skips_a_replayed_batch(
    server: RunningServer, tmp_path: Path
) -> None:
    """A stateless pipeline's MERGE sink: SQL MERGE in a session of its own (a clone of the
    client's server-side session), its transaction skipping the replay, nothing left behind."""
    table = tmp_path / "merged"
    client_env = lowmark_env(None, **server.client_env())
    args = [sys.executable, "-m", "tests.faults.connect_merge", server.url, str(table)]
    done = subprocess.run(args, env=client_env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])

    assert found == {"rows": [[1, "a2"], [3, "c"]], "txn_conf_left": None, "views_left": []}
    assert RsDeltaTable(str(table)).version() == 2  # created, batch 0, batch 1


def test_reset_with_truncate_sink_through_spark_connect_then_a_run_ends_like_one_from_scratch(
    references: References, server: RunningServer
) -> None:
    """The reset's DELETE runs in a session of its own on the server (a clone of the
    client's); the run after it writes the sink as a new pipeline's first run would."""
    ref = references["plain_append"]
    root = ref.folder / "reset_through_connect"
    copy_run(ref.folder / "template", root, ref.pipeline)
    client_env = lowmark_env(None, **server.client_env())
    args = [*ENGINE_CLI, "--pipelines", "tests.faults.scenarios", "--data-root", str(root)]
    done = subprocess.run(
        [*args, "reset", "plain_append", "--truncate-sink"],
        env=client_env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(root.glob("_lowmark/plain_append.reset-*"))) == 1
    code, err = _finished(_client(server, root, "plain_append"))
    assert code == 0, err

    from_scratch = snapshot(ref.pipeline, ref.root, as_from_scratch=True)
    assert differences(from_scratch, snapshot(ref.pipeline, root, as_from_scratch=True)) == []


def _sink_batches(sink: Path) -> set[int]:
    """The batches whose writes the sink's Delta log holds, as each commit names its writer
    (``lowmark.state.ownership``: the batch id in its user metadata)."""
    batches = set()
    for commit in (sink / "_delta_log").glob("*.json"):
        for line in commit.read_text().splitlines():
            info = json.loads(line).get("commitInfo", {})
            if "userMetadata" in info:
                batches.add(int(json.loads(info["userMetadata"])["lowmark"]["batch_id"]))
    return batches
