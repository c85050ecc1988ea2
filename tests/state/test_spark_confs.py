"""The Spark settings a user gives the standard ways win over lowmark's defaults, in one
order: lowmark < spark-defaults.conf < lowmark.toml's [spark] < PYSPARK_SUBMIT_ARGS <
--conf. Each session is started in a fresh Python (the suite's own process already has
one), as a ``lowmark`` command starts it: the project loaded, then ``Context.spark``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from lowmark.state.spark_confs import (
    CONFS_ENV,
    PROJECT_CONFS_ENV,
    SparkConfRefused,
    merge,
    parse_submit_args,
)

MB = 1 << 20
SHUFFLE = "spark.sql.shuffle.partitions"
TEST_KEYS = [f"spark.lowmark.test.{layer}" for layer in ("file", "toml", "submit", "cli")]
_SESSION = """
import json, sys
from pathlib import Path
from lowmark.orchestration.project import find_project
project = find_project(Path.cwd())
if project is not None:
    project.use()
from lowmark.batches.cli.commands import Context
c = Context(None, Path("data"), "local[1]")
c.confs = dict(arg.split("=", 1) for arg in sys.argv[2:])
spark = c.spark()
print(json.dumps({
    "confs": {key: spark.conf.get(key, None) for key in json.loads(sys.argv[1])},
    "max_memory": spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory(),
}))
"""


def _session(
    folder: Path,
    keys: list[str],
    given: dict[str, str] | None = None,
    *,
    toml: str = "",
    spark_defaults: str | None = None,
    submit_args: str | None = None,
) -> dict[str, Any]:
    """What a session started in ``folder`` (a project with ``toml``'s [spark] table) has
    for ``keys``, and its JVM's heap, with these layers set and no others."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lowmark.toml").write_text(f'pipelines = "pipelines"\n{toml}')
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR", CONFS_ENV, PROJECT_CONFS_ENV)
    }
    if spark_defaults is not None:
        (folder / "conf").mkdir()
        (folder / "conf" / "spark-defaults.conf").write_text(spark_defaults)
        env["SPARK_CONF_DIR"] = str(folder / "conf")
    if submit_args is not None:
        env["PYSPARK_SUBMIT_ARGS"] = submit_args
    given_args = [f"{k}={v}" for k, v in (given or {}).items()]
    done = subprocess.run(
        [sys.executable, "-c", _SESSION, json.dumps(keys), *given_args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_each_layer_wins_over_the_ones_before_it_and_the_jvm_has_the_memory_it_reports(
    tmp_path: Path,
) -> None:
    user_jar = tmp_path / "user.jar"
    with zipfile.ZipFile(user_jar, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
    spark_defaults = "".join(f"{key} file\n" for key in TEST_KEYS)
    spark_defaults += f"{SHUFFLE} 5\nspark.jars {user_jar}\n"
    toml = "[spark]\n" + "".join(f'"{key}" = "toml"\n' for key in TEST_KEYS[1:])
    toml += 'spark.sql.adaptive.enabled = "true"\n'  # dotted: TOML tables, joined again
    submit = " ".join(f"--conf {key}=submit" for key in TEST_KEYS[2:])
    submit += " --driver-memory 1g pyspark-shell"
    given = {TEST_KEYS[3]: "cli", "spark.driver.memory": "700m"}
    keys = [*TEST_KEYS, SHUFFLE, "spark.sql.adaptive.enabled", "spark.driver.memory"]

    found = _session(
        tmp_path / "project",
        [*keys, "spark.jars", "spark.sql.extensions"],
        given,
        toml=toml,
        spark_defaults=spark_defaults,
        submit_args=submit,
    )

    confs = found["confs"]
    assert {k: confs[k] for k in keys} == {
        "spark.lowmark.test.file": "file",
        "spark.lowmark.test.toml": "toml",
        "spark.lowmark.test.submit": "submit",
        "spark.lowmark.test.cli": "cli",
        SHUFFLE: "5",  # spark-defaults.conf over lowmark's 4
        "spark.sql.adaptive.enabled": "true",  # lowmark.toml over lowmark's false
        "spark.driver.memory": "700m",  # --conf over PYSPARK_SUBMIT_ARGS' --driver-memory 1g
    }
    assert 500 * MB < found["max_memory"] <= 700 * MB  # the heap is the one reported
    jars = confs["spark.jars"].split(",")
    assert str(user_jar) in jars and any("delta-spark" in jar for jar in jars)  # added to
    assert "io.delta.sql.DeltaSparkSessionExtension" in confs["spark.sql.extensions"]


@pytest.mark.integration
@pytest.mark.parametrize("layer", ["spark-defaults.conf", "lowmark.toml", "submit", "--conf"])
def test_shuffle_partitions_given_in_one_layer_win_over_lowmark_s(
    tmp_path: Path, layer: str
) -> None:
    found = _session(
        tmp_path,
        [SHUFFLE],
        {SHUFFLE: "7"} if layer == "--conf" else None,
        toml=f'[spark]\n"{SHUFFLE}" = "7"\n' if layer == "lowmark.toml" else "",
        spark_defaults=f"{SHUFFLE}=7\n" if layer == "spark-defaults.conf" else None,
        submit_args=f"--conf {SHUFFLE}=7 pyspark-shell" if layer == "submit" else None,
    )
    assert found["confs"][SHUFFLE] == "7"


def test_spark_submit_flags_that_stand_for_confs_are_taken_and_the_rest_left() -> None:
    submitted = parse_submit_args(
        "--conf a=1 -c b=2=3 --conf=c=4 --driver-memory 2g --jars=x.jar --verbose pyspark-shell"
    )
    confs, rest = submitted.confs, submitted.rest
    assert confs == {
        "a": "1",
        "b": "2=3",
        "c": "4",
        "spark.driver.memory": "2g",
        "spark.jars": "x.jar",
    }
    assert rest == "--verbose pyspark-shell"


def test_a_properties_file_replaces_spark_defaults_unless_it_is_loaded_too(tmp_path: Path) -> None:
    """As spark-submit reads them: ``--properties-file`` instead of spark-defaults.conf, or
    after it with ``--load-spark-defaults``; both below the project's [spark] table."""
    conf_dir, extra = tmp_path / "conf", tmp_path / "extra.properties"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(f"{SHUFFLE} 5\nspark.lowmark.test.file on\n")
    extra.write_text(f"{SHUFFLE}=7\n")
    environ = {"SPARK_CONF_DIR": str(conf_dir)}
    instead = merge(
        {SHUFFLE: "4"},
        {},
        {},
        environ={**environ, "PYSPARK_SUBMIT_ARGS": f"--properties-file {extra} pyspark-shell"},
    )
    assert (instead.values[SHUFFLE], instead.sources[SHUFFLE]) == ("7", str(extra))
    assert "spark.lowmark.test.file" not in instead.values
    assert instead.submit_args == f"--properties-file {extra} pyspark-shell"  # spark-submit
    both = merge(
        {SHUFFLE: "4"},
        {"spark.lowmark.test.file": "toml"},
        {},
        environ={
            **environ,
            "PYSPARK_SUBMIT_ARGS": f"--load-spark-defaults --properties-file={extra} pyspark-shell",
        },
    )
    assert both.values[SHUFFLE] == "7" and both.values["spark.lowmark.test.file"] == "toml"
    with pytest.raises(SparkConfRefused, match="--properties-file nope: no such file"):
        merge({}, {}, {}, environ={"PYSPARK_SUBMIT_ARGS": "--properties-file nope pyspark-shell"})


def test_a_conf_that_would_replace_delta_s_catalog_is_refused_naming_its_layer() -> None:
    catalog = "spark.sql.catalog.spark_catalog"
    with pytest.raises(SparkConfRefused, match=r"\(lowmark.toml\): lowmark's tables need Delta"):
        merge({catalog: "DeltaCatalog"}, {catalog: "Other"}, {}, environ={})


def test_each_conf_says_which_layer_it_came_from_with_secrets_hidden() -> None:
    confs = merge(
        {"spark.jars": "delta.jar", SHUFFLE: "4", "spark.ui.enabled": "false"},
        {SHUFFLE: "8", "spark.hadoop.fs.s3a.secret.key": "hush"},
        {"spark.jars": "mine.jar", "spark.master": "yarn"},
        environ={},
    )
    assert confs.given() == {
        SHUFFLE: "8 (lowmark.toml)",
        "spark.hadoop.fs.s3a.secret.key": "*** (lowmark.toml)",
        "spark.jars": "delta.jar,mine.jar (lowmark + --conf)",
    }  # spark.master is lowmark's --master, never a conf
