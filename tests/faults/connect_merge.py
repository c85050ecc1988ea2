"""A Spark Connect client that MERGEs into a Delta table the way a stateless pipeline's MERGE
sink does (``lowmark.state.delta.upsert_once``, in a session of its own), replays the first
MERGE, and prints what the table and the server hold after, as JSON.

Run as ``python -m tests.faults.connect_merge sc://host:port PATH``: a process of its own,
as the test process's own session is a local one.
"""

from __future__ import annotations

import json
import sys

from lowmark.state.delta import TXN_APP_ID_CONF, upsert_once
from lowmark.state.session import SparkSettings, get_spark, own_session


def main(url: str, path: str) -> None:
    spark = get_spark(SparkSettings(master=url))
    sink = own_session(spark)
    first = spark.createDataFrame([(1, "a"), (2, "b")], "id long, s string")
    upsert_once(sink, path, first, None, ("id",), "merge:sink", 0)
    replayed = first.selectExpr("id", "'replayed' AS s")
    upsert_once(sink, path, replayed, None, ("id",), "merge:sink", 0)
    second = spark.createDataFrame([(3, "c"), (1, "a2")], "id long, s string")
    deleted = spark.createDataFrame([(2,)], "id long")
    upsert_once(sink, path, second, deleted, ("id",), "merge:sink", 1)
    rows = spark.read.format("delta").load(path).orderBy("id").collect()
    print(
        json.dumps(
            {
                "rows": [[r.id, r.s] for r in rows],
                "txn_conf_left": spark.conf.get(TXN_APP_ID_CONF, None),
                "views_left": [t.name for t in spark.catalog.listTables("global_temp")],
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
