"""``lowmark init``: a project of one's own, end to end with the installed ``lowmark``.

The slow test runs what the project's README says, each as a subprocess in the
project's folder with no flags and none of LOWMARK_PIPELINES, LOWMARK_DATA_ROOT
or DAGSTER_HOME set: init, a file dropped into its incoming folder, ``lowmark
run`` (one Spark start; the sink read back with delta-rs) while ``lowmark ui``
(``dagster dev`` up once) starts, then asked over GraphQL what it serves.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from lowmark.orchestration.cli import main
from lowmark.state.connect_server import free_port
from tests.helpers import write_json_lines

LOWMARK = Path(sys.executable).parent / "lowmark"
PROJECT_SETTINGS = ("LOWMARK_PIPELINES", "LOWMARK_DATA_ROOT", "DAGSTER_HOME")
"""What would win over the project's lowmark.toml: unset for the subprocesses."""


def environment(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k not in PROJECT_SETTINGS}, **extra}


def lowmark(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # The run's JVM is short-lived: faster without C2 (timing is not asserted).
    env = environment(JAVA_TOOL_OPTIONS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    done = subprocess.run(
        [str(LOWMARK), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"lowmark {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


def graphql(url: str, query: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.load(response)
    assert "errors" not in answer, answer
    return answer["data"]


def wait_for(what: str, ready: Callable[[], bool], log: Path, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            tail = "\n".join(log.read_text().splitlines()[-40:])
            pytest.fail(f"timed out after {seconds:.0f} s waiting for {what}; log:\n{tail}")
        time.sleep(0.5)


def windows_of(folder: Path) -> Counter[tuple[str, datetime]]:
    """Views per (page, minute) in every JSON file of ``folder``, counted here in Python."""
    counts: Counter[tuple[str, datetime]] = Counter()
    for path in folder.glob("*.json"):
        for line in path.read_text().splitlines():
            view = json.loads(line)
            ts = datetime.fromisoformat(view["ts"])
            counts[(view["page"], ts.replace(second=0, microsecond=0))] += 1
    return counts


@pytest.mark.integration
@pytest.mark.slow
def test_an_initialized_project_runs_its_own_pipeline_and_dagster_serves_it_not_the_demo(
    tmp_path: Path,
) -> None:
    # Step 1. init, from another folder; --json lists what it wrote.
    made = json.loads(lowmark("init", "proj", "--json", cwd=tmp_path).stdout)
    project = tmp_path / "proj"
    assert made["project"] == str(project)
    assert all((project / f["path"]).is_file() for f in made["created"])
    assert made["pipelines"] == ["views_per_minute"]

    # Step 2. A file of our own lands beside the sample.
    incoming = project / "data/incoming"
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=2)
    mine = [
        {"user": user, "page": page, "ts": (start + timedelta(seconds=s)).isoformat()}
        for user, page, s in [("ann", "/a", 1), ("ben", "/a", 59), ("ann", "/b", 61)]
    ]
    write_json_lines(incoming, "mine.json", mine, int(time.time()))
    expected = windows_of(incoming)

    # Step 3. `lowmark ui` in the project starts (its sensor stopped: the CLI runs the batch).
    log = tmp_path / "lowmark-ui.log"
    port = free_port()
    with log.open("w") as out:
        ui = subprocess.Popen(
            [str(LOWMARK), "ui", "--port", str(port)],
            cwd=project,
            env=environment(LOWMARK_SENSORS="stopped"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        # Step 4. `lowmark run` in the project: its pipelines and data root, no flags.
        ran = lowmark("run", "views_per_minute", cwd=project)
        assert "batch 0 committed" in ran.stdout
        # Spark started with the batch, and the batch says how long that took.
        assert re.search(r"took [^;]+ \([^)]+ of it starting Spark\)$", ran.stdout.strip())
        sink = DeltaTable(str(project / "data/views_per_minute")).to_pyarrow_table().to_pylist()
        assert Counter({(r["page"], r["window_start"]): r["views"] for r in sink}) == expected
        assert all(r["window_end"] - r["window_start"] == timedelta(minutes=1) for r in sink)

        # Step 5. The UI serves the project's code location, not the demo.
        wait_for("the UI's address", lambda: url in log.read_text(), log)
        served = graphql(
            url,
            """{
              repositoriesOrError { ... on RepositoryConnection { nodes { location { name } } } }
              assetNodes { assetKey { path } }
              assetOrError(assetKey: {path: ["lowmark", "views_per_minute"]}) {
                ... on Asset { assetMaterializations(limit: 10) { runId } }
              }
            }""",
        )
    finally:
        ui.send_signal(signal.SIGTERM)
        ui.wait(60)
    assert [n["location"]["name"] for n in served["repositoriesOrError"]["nodes"]] == ["proj"]
    assert {"/".join(n["assetKey"]["path"]) for n in served["assetNodes"]} == {
        "lowmark/views_per_minute",
        "lowmark/views_per_minute_late",
        "lowmark/views_per_minute_bad_records",
        "lowmark/sources/files_incoming",
    }  # no lowmark/orders, lowmark/user_revenue: the demo is not loaded
    # The CLI's batch was reported to the project's instance (DAGSTER_HOME from lowmark.toml).
    assert served["assetOrError"]["assetMaterializations"] == [{"runId": ""}]
    assert "stopped the Dagster UI" in log.read_text()


def test_init_refuses_a_folder_that_holds_anything_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "taken"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as done:
        main(["init", str(folder)])
    assert done.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert str(folder) in line and "new or empty folder" in line
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
