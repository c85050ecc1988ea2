"""A transform written as SQL over the batch's records (``input``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.loop import faults
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import DeltaSink, Pipeline
from lowmark.batches.registry import load_pipelines
from lowmark.batches.sql import SqlStep
from tests.helpers import delta_frame, drop_file, pipeline

DOUBLED_POSITIVE = "SELECT id, amount * 2 AS amount FROM input WHERE amount > 0"


def doubled_positive(df: DataFrame) -> DataFrame:
    """``DOUBLED_POSITIVE`` as a Python transform."""
    return df.where(F.col("amount") > 0).select("id", (F.col("amount") * 2).alias("amount"))


def one_file_a_batch(**overrides: object) -> Pipeline:
    source = pipeline().source.model_copy(update={"max_files_per_batch": 1})
    return pipeline(source=source, **overrides)


def rows(spark: SparkSession, table: Path) -> list[tuple[int, int]]:
    df = delta_frame(spark, str(table))
    return sorted((r["id"], r["amount"]) for r in df.collect())


def test_a_sql_transform_writes_what_the_same_python_transform_and_one_plain_spark_batch_give(
    spark: SparkSession, data_root: Path
) -> None:
    for i in range(2):
        drop_file(data_root, i)
    as_sql = one_file_a_batch(name="sql", transform=SqlStep(sql=f"  {DOUBLED_POSITIVE}\n"))
    as_python = one_file_a_batch(
        name="py", transform=doubled_positive, sink=DeltaSink(path="py_out")
    )
    for p in (as_sql, as_python):
        assert len(MicroBatchRunner(spark, p, data_root).run(max_batches=None)) == 2
    whole = doubled_positive(spark.read.schema("id LONG, amount LONG").json(str(data_root / "in")))
    expected = sorted((r["id"], r["amount"]) for r in whole.collect())
    assert len(expected) == 4
    assert rows(spark, data_root / "out") == rows(spark, data_root / "py_out") == expected


def test_a_sql_transform_replayed_after_a_crash_after_its_sink_write_lands_once(
    spark: SparkSession, data_root: Path
) -> None:
    drop_file(data_root, 0)
    p = one_file_a_batch(transform=SqlStep(sql=DOUBLED_POSITIVE))
    with faults.crash_at(faults.KillPoint("after_sink", 0)), pytest.raises(faults.InjectedCrash):
        MicroBatchRunner(spark, p, data_root).run()
    drop_file(data_root, 1)
    assert len(MicroBatchRunner(spark, p, data_root).run(max_batches=None)) == 2
    assert rows(spark, data_root / "out") == [(1, 2), (2, 4), (101, 2), (102, 4)]


def test_the_fingerprint_holds_the_query_without_surrounding_whitespace() -> None:
    plain = pipeline()
    spaced = pipeline(transform=SqlStep(sql=f"\n  {DOUBLED_POSITIVE}  \n"))
    assert spaced.definition()["transform"] == {"sql": DOUBLED_POSITIVE}
    assert spaced.fingerprint() == pipeline(transform=SqlStep(sql=DOUBLED_POSITIVE)).fingerprint()
    other = pipeline(transform=SqlStep(sql=DOUBLED_POSITIVE.replace("> 0", ">= 0")))
    assert len({plain.fingerprint(), spaced.fingerprint(), other.fingerprint()}) == 3


def test_yaml_names_a_sql_transform_as_a_mapping_with_sql(tmp_path: Path) -> None:
    (tmp_path / "pipelines.yaml").write_text(f"""
pipelines:
  - name: s
    source: {{path: in, format: json, schema_ddl: "id LONG, amount LONG"}}
    transform: {{sql: "{DOUBLED_POSITIVE}"}}
    sink: {{path: out}}
""")
    loaded = load_pipelines(str(tmp_path / "pipelines.yaml"))["s"]
    assert loaded.transform == SqlStep(sql=DOUBLED_POSITIVE)


@pytest.mark.parametrize(
    ("sql", "said"),
    [
        ("SELECT (id FROM input", "PARSE_SYNTAX_ERROR"),
        ("SELECT id, amont FROM input", "`amont` cannot be resolved"),
        ("SELECT id, rand() AS amount FROM input", "not deterministic"),
    ],
)
def test_a_bad_query_fails_in_one_line_naming_the_pipeline_before_any_spark_job(
    spark: SparkSession, data_root: Path, sql: str, said: str
) -> None:
    drop_file(data_root, 0)
    runner = MicroBatchRunner(spark, one_file_a_batch(transform=SqlStep(sql=sql)), data_root)
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup("bad-sql", "a bad SQL transform")
    try:
        with pytest.raises(PipelineConfigInvalid) as failed:
            runner.run()
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    message = str(failed.value)
    assert "\n" not in message and said in message, message
    assert message.startswith("the transform of t: its SQL ")
    assert tracker.getJobIdsForGroup("bad-sql") == []
    assert not (data_root / "out").exists()
