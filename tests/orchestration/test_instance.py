"""The Dagster instance lowmark prepares (``lowmark ui``) and the one ``lowmark init`` writes."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.instance.ref import InstanceRef

from lowmark.orchestration.instance import DagsterStorage, instance_settings
from lowmark.orchestration.ui import prepare_home


def test_lowmarks_instance_shows_no_dagster_community_dialog(tmp_path: Path) -> None:
    home = prepare_home(tmp_path / "home")
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        assert instance.nux_enabled is False


@pytest.mark.parametrize("storage", list(DagsterStorage))
def test_a_projects_instance_shows_no_dagster_community_dialog(
    tmp_path: Path, storage: DagsterStorage
) -> None:
    settings = instance_settings(storage)
    assert yaml.safe_load(settings)["nux"] == {"enabled": False}
    if storage is DagsterStorage.SQLITE:  # Postgres storage needs a server to load
        (tmp_path / "dagster.yaml").write_text(settings)
        with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path))) as instance:
            assert instance.nux_enabled is False
