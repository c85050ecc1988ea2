"""A project's ``lowmark.toml``: found from the folders below it, filling in only what the
environment leaves unset, and refused in one line when broken."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestration.errors import ProjectFileInvalid
from orchestration.project import find_project, load_project
from orchestration.scaffold import init_project


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return init_project(tmp_path / "proj", datetime(2026, 1, 1, tzinfo=UTC)).root


def test_lowmark_toml_fills_in_only_the_unset_variables_with_its_paths_made_absolute(
    project: Path,
) -> None:
    environ = {"LOWMARK_DATA_ROOT": "/set/by/hand"}
    path = ["/somewhere"]
    load_project(project).use(environ, path)
    assert environ == {
        "LOWMARK_PIPELINES": "pipelines",  # a module: pipelines.py, the folder being on path
        "LOWMARK_DATA_ROOT": "/set/by/hand",  # the environment wins over the file
        "DAGSTER_HOME": str(project / "dagster_home"),
    }
    assert path == [str(project), "/somewhere"]


def test_a_pipelines_file_is_relative_to_the_project_folder(project: Path) -> None:
    (project / "lowmark.toml").write_text('pipelines = "conf/pipelines.yaml"\n')
    loaded = load_project(project)
    assert loaded.pipelines == str(project / "conf/pipelines.yaml")
    assert loaded.data_root == project / "data"


def test_a_project_is_found_from_any_folder_below_it_and_not_beside_it(
    project: Path, tmp_path: Path
) -> None:
    found = find_project(project / "data/incoming")
    assert found is not None and found.root == project
    assert find_project(tmp_path) is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('pipelines = "pipelines"\ndata_rot = "d"\n', "lowmark.toml: data_rot: Extra inputs"),
        ("data_root = 'data'\n", "lowmark.toml: pipelines: Field required"),
        ("pipelines = pipelines\n", "lowmark.toml is not valid TOML: Invalid value (at line 1"),
    ],
)
def test_a_broken_lowmark_toml_is_one_line_naming_the_file_and_the_field(
    project: Path, text: str, says: str
) -> None:
    (project / "lowmark.toml").write_text(text)
    with pytest.raises(ProjectFileInvalid) as raised:
        find_project(project / "data")
    assert says in str(raised.value) and "\n" not in str(raised.value)
