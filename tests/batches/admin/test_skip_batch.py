"""``lowmark skip-batch`` over every sink: a batch that landed in any of a pipeline's sinks
is refused, naming the sinks that hold it, so none of its rows lands twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lowmark.batches.admin.skip_batch import set_aside
from lowmark.batches.errors import PipelineConfigInvalid
from lowmark.batches.loop.microbatch import MicroBatchRunner
from lowmark.batches.pipeline import PostgresSink
from lowmark.state.errors import LowmarkError
from tests.helpers import drop_file, pipeline, sink_ids
from tests.postgres_server import PostgresServer

ONE_FILE = pipeline().source.model_copy(update={"max_files_per_batch": 1})
SERVED = pipeline(source=ONE_FILE, extra_sinks={"serving": PostgresSink(table="served")})
"""Files into the Delta table ``out`` and, to serve, the Postgres table ``served``."""
EVERY_ID = sorted(f * 100 + i for f in range(3) for i in range(3))


def test_skip_batch_refuses_a_batch_the_delta_sink_landed_while_a_postgres_extra_sink_refused_it(
    spark: SparkSession, data_root: Path, postgres: PostgresServer, pg_database: str
) -> None:
    for i in range(3):
        drop_file(data_root, i)
    MicroBatchRunner(spark, SERVED, data_root).run(max_batches=1)
    # The serving table takes no id from 100 on: batch 1 lands in `out`, then Postgres
    # refuses it.
    with postgres.connect(pg_database) as conn:
        conn.execute("ALTER TABLE served ADD CONSTRAINT small_ids CHECK (id < 100)")
    with pytest.raises(LowmarkError, match="refused batch 1"):
        MicroBatchRunner(spark, SERVED, data_root).run(max_batches=None)

    with pytest.raises(PipelineConfigInvalid) as refused:
        set_aside(spark, SERVED, data_root, 1, "ids too large to serve")
    message = str(refused.value)
    assert "\n" not in message
    assert "batch 1 of t already landed in sink (out (append))" in message
    assert "serving" not in message and "`lowmark run t --retry`" in message

    # The way on: the table fixed, the batch finishes; every record is once in each sink.
    with postgres.connect(pg_database) as conn:
        conn.execute("ALTER TABLE served DROP CONSTRAINT small_ids")
    MicroBatchRunner(spark, SERVED, data_root).run(max_batches=None, retry=True)
    assert sink_ids(spark, data_root) == EVERY_ID
    assert sorted(i for (i,) in postgres.rows(pg_database, "SELECT id FROM served")) == EVERY_ID
