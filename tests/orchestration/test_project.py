"""A project's ``lowmark.toml``: found from the folders below it, filling in only what the
environment leaves unset, and refused in one line when broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lowmark.orchestration.cli import main
from lowmark.orchestration.errors import ProjectFileInvalid, ProjectUnsafe
from lowmark.orchestration.project import SAFE_DIRECTORIES_ENV, find_project, load_project
from lowmark.orchestration.scaffold import init_project
from lowmark.state.spark_confs import PROJECT_CONFS_ENV

REPO = Path(__file__).resolve().parents[2]


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
    assert path == ["/somewhere", str(project)]  # last: it stands in for nothing installed


def test_a_pipelines_file_is_relative_to_the_project_folder(project: Path) -> None:
    (project / "lowmark.toml").write_text('pipelines = "conf/pipelines.yaml"\n')
    loaded = load_project(project)
    assert loaded.pipelines == str(project / "conf/pipelines.yaml")
    assert loaded.data_root == project / "data"


def test_a_spark_master_in_the_file_is_every_run_s_unless_the_environment_says_another(
    project: Path,
) -> None:
    (project / "lowmark.toml").write_text(
        'pipelines = "pipelines"\nspark_master = "spark://spark-master:7077"\n'
    )
    environ: dict[str, str] = {}
    load_project(project).use(environ, [])
    assert environ["LOWMARK_SPARK_MASTER"] == "spark://spark-master:7077"
    environ = {"LOWMARK_SPARK_MASTER": "local[2]"}
    load_project(project).use(environ, [])
    assert environ["LOWMARK_SPARK_MASTER"] == "local[2]"


def test_an_s3_endpoint_in_the_file_is_every_run_s_unless_the_environment_says_another(
    project: Path,
) -> None:
    (project / "lowmark.toml").write_text(
        'pipelines = "pipelines"\ns3_endpoint = "http://127.0.0.1:9000"\n'
    )
    environ: dict[str, str] = {}
    load_project(project).use(environ, [])
    assert environ["LOWMARK_S3_ENDPOINT"] == "http://127.0.0.1:9000"
    environ = {"LOWMARK_S3_ENDPOINT": "https://s3.eu-west-1.amazonaws.com"}
    load_project(project).use(environ, [])
    assert environ["LOWMARK_S3_ENDPOINT"] == "https://s3.eu-west-1.amazonaws.com"


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
        ("pipelines = 3\n", "lowmark.toml: pipelines: Input should be a valid string"),
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


ANOTHER_USER = 12345


@pytest.mark.parametrize(("where", "mode"), [(".", 0o777), (".", 0o775), ("lowmark.toml", 0o646)])
def test_a_project_others_may_write_is_refused_in_one_line_naming_the_folder_and_the_fix(
    project: Path, where: str, mode: int
) -> None:
    (project / where).chmod(mode)
    with pytest.raises(ProjectUnsafe) as raised:
        find_project(project / "data", environ={})
    message = str(raised.value)
    assert f"project {project} may have been changed by others" in message
    assert f"chmod go-w {(project / where).resolve()}" in message
    assert f"{SAFE_DIRECTORIES_ENV}={project}" in message and "\n" not in message


def test_lowmark_list_in_a_world_writable_project_stops_before_importing_its_pipelines(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "pipelines.py").write_text("raise SystemExit('the project ran its code')\n")
    project.chmod(0o777)
    monkeypatch.chdir(project / "data")
    monkeypatch.delenv(SAFE_DIRECTORIES_ENV, raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["list"])
    assert exited.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: project {project} may have been changed by others")


def test_a_project_owned_by_another_user_is_refused(project: Path) -> None:
    os.chown(project, ANOTHER_USER, -1)
    with pytest.raises(ProjectUnsafe, match=f"owned by uid {ANOTHER_USER}"):
        find_project(project, environ={})


@pytest.mark.parametrize("listed", ["{project}", "/elsewhere:{project}/", "*"])
def test_a_project_listed_as_safe_is_used_whoever_owns_it(project: Path, listed: str) -> None:
    project.chmod(0o777)
    os.chown(project, ANOTHER_USER, -1)
    environ = {SAFE_DIRECTORIES_ENV: listed.format(project=project)}
    found = find_project(project / "data", environ=environ)
    assert found is not None and found.root == project


def test_a_projects_own_batches_and_state_modules_never_stand_in_for_lowmarks(
    project: Path,
) -> None:
    for name in ("batches", "state", "orchestration"):
        (project / f"{name}.py").write_text(f"raise ImportError('the project shadowed {name}')\n")
    # A fresh process, as a Dagster code server that loads the project's definitions:
    # lowmark's `batches` is not imported yet when the project is put to use.
    code = (
        "import sys; from pathlib import Path; from lowmark.orchestration.project import "
        "load_project; "
        "load_project(Path(sys.argv[1])).use(); "
        "import lowmark.batches.pipeline, lowmark.state.errors; "
        "print(lowmark.batches.pipeline.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(project)],
        cwd="/",
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.strip()).resolve() == REPO / "batches" / "pipeline.py"


def test_a_spark_table_of_strings_reaches_every_process_and_dotted_keys_are_joined_again(
    project: Path,
) -> None:
    (project / "lowmark.toml").write_text(
        'pipelines = "pipelines"\n[spark]\n"spark.sql.shuffle.partitions" = "8"\n'
        'spark.sql.adaptive.enabled = "true"\n'
    )
    environ: dict[str, str] = {}
    load_project(project).use(environ, [])
    assert json.loads(environ[PROJECT_CONFS_ENV]) == {
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
    }


def test_a_spark_conf_that_is_not_a_string_is_refused_with_the_quoted_value(
    project: Path,
) -> None:
    (project / "lowmark.toml").write_text(
        'pipelines = "pipelines"\n[spark]\n"spark.sql.shuffle.partitions" = 8\n'
    )
    with pytest.raises(
        ProjectFileInvalid,
        match=r'spark.sql.shuffle.partitions: give the value as a string \("8"\)',
    ):
        load_project(project)
