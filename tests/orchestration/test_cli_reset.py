"""`lowmark reset` asks the Dagster instance in ``DAGSTER_HOME`` first: not while a run of
the pipeline is queued or in flight there."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster._core.instance.ref import InstanceRef
from dagster._core.test_utils import create_run_for_test

from lowmark.orchestration.cli import main
from lowmark.orchestration.ui import prepare_home

ARGS = ["--pipelines", "tests.orchestration.pipelines"]


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTED])
def test_reset_is_refused_in_one_line_while_a_run_of_the_pipeline_is_in_flight(
    data_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    status: dg.DagsterRunStatus,
) -> None:
    home = tmp_path / "dagster_home"
    prepare_home(home)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        run = create_run_for_test(
            instance, job_name="slow_microbatches", tags={"lowmark/pipeline": "slow"}, status=status
        )
    with pytest.raises(SystemExit) as done:
        main([*ARGS, "--data-root", str(data_root), "reset", "slow", "--truncate-sink"])

    assert done.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: run {run.run_id} of slow is {status.value} in the Dagster")
    assert "then reset" in line
    # No checkpoint moved or made: the folder holds only the log (lowmark.log).
    assert [p.name for p in (data_root / "_lowmark").iterdir()] == ["_logs"]
