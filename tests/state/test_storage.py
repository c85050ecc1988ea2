"""Where a location is and how each writer reaches it (``lowmark.state.storage``); the
store itself is exercised in ``tests/faults/test_object_storage.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowmark.state.checkpoint import move_aside
from lowmark.state.storage import (
    NotOnObjectStorage,
    ObjectStoreNotConfigured,
    S3Settings,
    delta_rs_options,
)
from lowmark.state.table import DriverTable


def test_a_table_on_a_bucket_without_an_endpoint_fails_with_one_line_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LOWMARK_S3_ENDPOINT", raising=False)
    with pytest.raises(ObjectStoreNotConfigured, match="LOWMARK_S3_ENDPOINT is not set") as e:
        DriverTable("s3a://bucket/_lowmark/orders/offsets")
    assert "\n" not in str(e.value)
    assert delta_rs_options("/data/_lowmark/orders/offsets") is None


def test_delta_rs_commits_on_the_store_with_conditional_puts_and_the_aws_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOWMARK_S3_ENDPOINT", "http://127.0.0.1:9000/")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    assert delta_rs_options("s3://bucket/t") == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_CONDITIONAL_PUT": "etag",
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }


def test_spark_gets_s3a_and_delta_s_s3_log_store_and_never_the_credentials(
    tmp_path: Path,
) -> None:
    for jar in ("hadoop-aws-3.5.0.jar", "bundle-2.35.4.jar", "lowmark-delta-log-store.jar"):
        (tmp_path / jar).touch()
    env = {
        "LOWMARK_S3_ENDPOINT": "https://s3.eu-west-1.amazonaws.com",
        "LOWMARK_S3_PATH_STYLE": "false",
        "LOWMARK_S3_JARS_DIR": str(tmp_path),
        "AWS_REGION": "eu-west-1",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }
    settings = S3Settings.from_env(env)
    assert settings is not None
    confs = settings.spark_confs(["delta-spark.jar"])
    assert confs["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert confs["spark.hadoop.fs.s3a.path.style.access"] == "false"
    assert confs["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"
    assert confs["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert confs["spark.delta.logStore.s3a.impl"] == "dev.lowmark.delta.S3ConditionalLogStore"
    assert str(tmp_path / "hadoop-aws-3.5.0.jar") in confs["spark.driver.extraClassPath"]
    # The log store extends Delta's classes: it is loaded beside them, not from the class path.
    log_store = str(tmp_path / "lowmark-delta-log-store.jar")
    assert confs["spark.jars"].split(",") == ["delta-spark.jar", log_store]
    assert log_store not in confs["spark.driver.extraClassPath"]
    assert not any("secret" in value for value in confs.values())


def test_without_the_s3_jars_spark_s_settings_say_how_to_fetch_them(tmp_path: Path) -> None:
    env = {"LOWMARK_S3_ENDPOINT": "http://minio:9000", "LOWMARK_S3_JARS_DIR": str(tmp_path)}
    settings = S3Settings.from_env(env)
    assert settings is not None
    with pytest.raises(ObjectStoreNotConfigured, match="make integration-setup"):
        settings.spark_confs(["delta-spark.jar"])
    (tmp_path / "hadoop-aws-3.5.0.jar").touch()  # lowmark's log store still missing
    with pytest.raises(ObjectStoreNotConfigured, match=r"lowmark-delta-log-store\.jar"):
        settings.spark_confs(["delta-spark.jar"])
    with pytest.raises(ObjectStoreNotConfigured, match="not an http"):
        S3Settings.from_env({"LOWMARK_S3_ENDPOINT": "minio:9000"})
    assert S3Settings.from_env({}) is None


def test_a_checkpoint_on_a_bucket_is_not_moved_aside_and_the_error_says_what_to_do() -> None:
    with pytest.raises(NotOnObjectStorage, match="renaming its folder") as e:
        move_aside("s3a://bucket/_lowmark/orders", "reset")
    assert "\n" not in str(e.value) and "delete it with the store's own tools" in str(e.value)
