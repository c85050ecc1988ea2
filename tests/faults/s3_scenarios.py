"""Crash scenarios' pipelines (``session_update``, ``dedup_append``, ``keyed_alerts``) with their
checkpoint and sink on an S3 bucket.

A `lowmark run` subprocess loads this module as its ``--pipelines``; the prefix
(``s3a://bucket/folder``) comes from ``PREFIX_ENV``, set per test. The input stays a local
folder beside the data root, as in ``tests.faults.scenarios``: only what lowmark writes is
on the bucket.
"""

from __future__ import annotations

import os

from lowmark.batches.pipeline import DeltaSink, Pipeline
from tests.faults import scenarios

PREFIX_ENV = "LOWMARK_TEST_S3_PREFIX"


def on_bucket(pipeline: Pipeline, prefix: str) -> Pipeline:
    """``pipeline`` with its checkpoint and its sink under ``prefix``."""
    return pipeline.model_copy(
        update={
            "checkpoint": f"{prefix}/_lowmark/{pipeline.name}",
            "sink": DeltaSink(path=f"{prefix}/{scenarios.SINK}"),
        }
    )


# The scenarios' pipelines are not imported by name: every pipeline in this module's
# namespace is one it defines.
if (_prefix := os.environ.get(PREFIX_ENV)) is not None:
    session_update = on_bucket(scenarios.session_update, _prefix)
    dedup_append = on_bucket(scenarios.dedup_append, _prefix)
    keyed_alerts = on_bucket(scenarios.keyed_alerts, _prefix)
