"""Where the Spark jars are taken from: the folder a user names, the clone's ``jvm/lib``, else
the per-user cache that an installed lowmark fills on first use (that fetch, with mvn, is
tests/package/test_wheel.py's, marked ``integration``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowmark.state import jars


@pytest.fixture
def no_clone_jars(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An installed lowmark: no ``jvm/lib`` beside the package, the cache under ``tmp_path``."""
    monkeypatch.setattr(jars, "SOURCE_TREE_JARS", tmp_path / "site-packages" / "jvm" / "lib")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(jars.JARS_ENV, raising=False)
    return tmp_path / "cache"


def test_the_folder_a_user_names_wins_and_is_never_fetched_into(
    no_clone_jars: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(jars.JARS_ENV, str(tmp_path / "mine"))
    assert jars.jars_dir() == tmp_path / "mine"
    with pytest.raises(jars.JarsMissing, match=f"no Delta jars in {tmp_path / 'mine'}: "):
        jars.delta_jars(jars.jars_dir())
    assert not (tmp_path / "mine").exists()


def test_the_clones_jars_come_before_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(jars.JARS_ENV, raising=False)
    assert jars.jars_dir() == jars.SOURCE_TREE_JARS
    assert any("delta-spark" in jar for jar in jars.delta_jars(jars.jars_dir()))


def test_an_installed_lowmark_uses_a_cache_per_pom(no_clone_jars: Path) -> None:
    folder = jars.jars_dir()
    assert folder.parent == no_clone_jars / "lowmark" / "jars"
    assert len(folder.name) == 12 and folder == jars.cache_dir()


def test_a_jar_pyspark_ships_under_any_version_is_left_out(tmp_path: Path) -> None:
    # pyspark ships commons-lang3 (another version) and jackson-datatype-jsr310, not -jdk8.
    kept = ["delta-spark_4.2_2.13-4.4.0.jar", "jackson-datatype-jdk8-2.13.5.jar"]
    for name in [*kept, "commons-lang3-3.12.0.jar"]:
        (tmp_path / name).write_bytes(b"")
    jars._drop_shipped_by_pyspark(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
