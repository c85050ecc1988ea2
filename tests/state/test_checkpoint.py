from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lowmark.state.checkpoint import ID_FILE, Checkpoint
from lowmark.state.errors import CheckpointMissing, CheckpointReplaced
from tests.helpers import entry


def test_a_new_checkpoint_gets_a_random_pipeline_id_that_survives_reopening(
    tmp_path: Path,
) -> None:
    first = Checkpoint(str(tmp_path / "a"), "p")
    other = Checkpoint(str(tmp_path / "b"), "p")
    assert first.pipeline_id != other.pipeline_id
    assert Checkpoint(str(tmp_path / "a"), "p").pipeline_id == first.pipeline_id
    assert first.txn_app_id("sink") == f"{first.pipeline_id}:sink"


def test_checkpoint_holds_its_tables_as_delta_tables(tmp_path: Path) -> None:
    Checkpoint(str(tmp_path / "c"), "p")
    for name in ("checkpoint", "offsets", "commits", "progress"):
        assert (tmp_path / "c" / name / "_delta_log").is_dir(), name


def test_a_missing_log_table_is_refused_never_a_silent_restart(
    tmp_path: Path,
) -> None:
    ckpt = Checkpoint(str(tmp_path / "c"), "p")
    ckpt.offsets.add(entry(0))
    shutil.rmtree(tmp_path / "c" / "commits")
    with pytest.raises(CheckpointMissing, match="commits is missing"):
        Checkpoint(str(tmp_path / "c"), "p")


def test_logs_without_their_metadata_table_are_refused(tmp_path: Path) -> None:
    ckpt = Checkpoint(str(tmp_path / "c"), "p")
    ckpt.offsets.add(entry(0))
    shutil.rmtree(tmp_path / "c" / "checkpoint")
    with pytest.raises(CheckpointMissing, match="holds batches"):
        Checkpoint(str(tmp_path / "c"), "p")


def test_a_checkpoint_made_before_the_manifest_history_existed_opens_and_gains_it(
    tmp_path: Path,
) -> None:
    ckpt = Checkpoint(str(tmp_path / "c"), "p")
    ckpt.offsets.add(entry(0))
    shutil.rmtree(tmp_path / "c" / "files_history")  # as older lowmark versions made it
    reopened = Checkpoint(str(tmp_path / "c"), "p")
    assert reopened.pipeline_id == ckpt.pipeline_id and reopened.files.history.exists()
    shutil.rmtree(tmp_path / "c" / "files")
    with pytest.raises(CheckpointMissing, match="files is missing"):
        Checkpoint(str(tmp_path / "c"), "p")


def test_the_fence_stops_a_runner_whose_checkpoint_was_replaced_whichever_way_it_reads(
    tmp_path: Path,
) -> None:
    """The fence reads the id file when there is one, the metadata table when there is
    none (a checkpoint made before the file existed, or moved aside): either way, its own
    checkpoint passes and a replaced one stops it."""
    location = tmp_path / "c"
    runner = Checkpoint(str(location), "p")
    (location / ID_FILE).unlink(missing_ok=True)
    runner.fence()  # no id file: the metadata table's id is its own, and the file is written
    assert (location / ID_FILE).read_text() == runner.pipeline_id
    runner.fence()

    location.rename(tmp_path / "aside")
    with pytest.raises(CheckpointReplaced, match="holds no checkpoint"):
        runner.fence()
    new = Checkpoint(str(location), "p")
    with pytest.raises(CheckpointReplaced, match=f"holds checkpoint {new.pipeline_id}"):
        runner.fence()  # the new one's metadata table, before any fence wrote its file
    new.fence()
    with pytest.raises(CheckpointReplaced, match=f"holds checkpoint {new.pipeline_id}"):
        runner.fence()  # the new one's id file
