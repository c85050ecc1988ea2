"""The built wheel installed in a scratch venv outside the repository: one package,
``lowmark``, that a project's own ``state.py``, ``batches.py`` or ``orchestration.py`` cannot
shadow, with no jars inside.

The scratch venv takes its dependencies from the test's own venv (a ``.pth`` file naming its
site-packages) and the wheel with ``--no-deps``, so nothing but the build backend is
downloaded. Building costs about 20 s; the ``lowmark run`` of an initialised project (a Spark
start) and the jars fetched on first use are ``integration``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHADOWS = ("state", "batches", "orchestration")
NOT_SOURCE = (
    ".git",
    ".venv",
    "data",
    ".dagster_home",
    "build",
    "*.egg-info",
    "site",
    ".*_cache",
    ".hypothesis",
    "__pycache__",
    "*.jar",
)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin folder of a scratch venv with the wheel installed."""
    root = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip"]
    # Built from a copy: setuptools builds in the source folder, and a build/ left there by an
    # earlier build would put its stale files in this wheel.
    source = root / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    subprocess.run([*pip, "wheel", "--no-deps", "-q", "-w", str(root), str(source)], check=True)
    (wheel,) = root.glob("lowmark-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {
        "lowmark",
        wheel.name.split("-py")[0] + ".dist-info",
    }
    assert not [name for name in names if name.endswith(".jar")]
    env = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            *pip,
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--ignore-installed",
            "-q",
            str(wheel),
        ],
        check=True,
    )
    return env / "bin"


@pytest.fixture
def shadowed(tmp_path: Path) -> Path:
    """A folder whose own modules carry lowmark's old top-level names and fail on import."""
    for name in SHADOWS:
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the project shadowed {name}')\n")
    return tmp_path


def outside(**env: str) -> dict[str, str]:
    """This process's environment less what would point the venv at the repository."""
    drop = ("PYTHONPATH", "LOWMARK_PIPELINES", "LOWMARK_JARS_DIR", "LOWMARK_DATA_ROOT")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **env}


def lowmark(bin_dir: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "lowmark"), *args],
        cwd=cwd,
        env=outside(**env),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.integration
def test_the_installed_wheel_prints_its_version_and_inits_a_project(
    venv: Path, shadowed: Path
) -> None:
    done = lowmark(venv, shadowed, "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "lowmark 0.1.0"
    done = lowmark(venv, shadowed, "init", "views")
    assert done.returncode == 0, done.stderr
    project = shadowed / "views"
    for name in SHADOWS:
        (project / f"{name}.py").write_text((shadowed / f"{name}.py").read_text())
    # Dagster loads the project's definitions with the project first on sys.path.
    code = "import definitions, lowmark; print(len(definitions.defs.assets), lowmark.__file__)"
    loaded = subprocess.run(
        [str(venv / "python"), "-c", code],
        cwd=project,
        env=outside(),
        capture_output=True,
        text=True,
    )
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split()[1].startswith(str(venv.parent))


@pytest.mark.integration
def test_the_installed_wheel_runs_a_project_fetching_the_jars_on_first_use_on_one_line(
    venv: Path, shadowed: Path
) -> None:
    assert lowmark(venv, shadowed, "init", "views").returncode == 0
    cache = shadowed / "cache"
    done = lowmark(venv, shadowed / "views", "run", "views_per_minute", XDG_CACHE_HOME=str(cache))
    assert done.returncode == 0, done.stderr
    # Update mode: one row out per (page, minute) of the sample's views, which `init` dates
    # in the last minutes (so 9 or 10 windows, by the clock).
    sample = (shadowed / "views" / "data" / "incoming" / "sample-views.json").read_text()
    views = [json.loads(line) for line in sample.splitlines()]
    windows = {(v["page"], v["ts"][:16]) for v in views}
    assert f"batch 0 committed: {len(views)} rows in, {len(windows)} out" in done.stdout
    # On the console, not only in the log file Spark's output goes to.
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("fetching")]
    assert line.startswith(f"fetching Spark's Delta and Kafka jars into {cache}/lowmark/jars/")
    assert " done in " in line
    fetched = sorted(p.name for p in (cache / "lowmark" / "jars").glob("*/*.jar"))
    assert fetched == sorted(p.name for p in (REPO / "jvm" / "lib").glob("*.jar"))
