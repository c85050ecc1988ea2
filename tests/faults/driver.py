"""`lowmark` as the crash tests run it: the engine's commands, in a driver process that may
share the test process's JVM.

Run as ``python -m tests.faults.driver ARGS`` (``harness.ENGINE_CLI``). With the
test process's gateway in the environment (``attached_env``), the driver
attaches to that running JVM instead of starting one: a Python process of
about 1.5 s of CPU time instead of a JVM start and a cold JIT's first batch
(11-12 s), so every kill case of the matrix fits in `make test`.

What a kill of an attached driver covers, and what it does not: the driver
process dies at the step (SIGKILL; ``lowmark.batches.loop.faults``), and with it
every write lowmark makes from Python (the offset and commit logs, window
state, a windowed sink, all through delta-rs) and every Spark action it was
waiting for; the recovery then runs in the test process, as before. The JVM
lives on: Spark writes that had completed stay, as they do when a JVM dies
(a step is reached only after its writes returned), but an in-flight Spark
job of the dead driver is not cut short, and the JVM's caches (Delta's log
cache, cached DataFrames) outlive the driver. So a kill at a step is the same
on disk either way; what only a dying JVM shows is left to the cases that
start a JVM of their own (``own_jvm_env``: the kill matrix's own-JVM cases in
`make test-integration`, and `make soak`).

The attached driver gets a Spark session of its own (``newSession``: its own
SQL configuration and temporary views) and leaves the test process's session
the JVM's default.
"""

from __future__ import annotations

import os
import sys

from pyspark import SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from lowmark.batches.cli.commands import main as lowmark

GATEWAY_PORT_ENV = "PYSPARK_GATEWAY_PORT"
"""PySpark's own: a gateway to connect to instead of launching a JVM (with the secret)."""
GATEWAY_SECRET_ENV = "PYSPARK_GATEWAY_SECRET"


def attached_env(spark: SparkSession) -> dict[str, str]:
    """The environment that attaches a driver to ``spark``'s JVM."""
    gateway = spark.sparkContext._gateway
    assert gateway is not None
    parameters = gateway.gateway_parameters
    return {GATEWAY_PORT_ENV: str(parameters.port), GATEWAY_SECRET_ENV: parameters.auth_token}


def attach() -> SparkSession:
    """This process's Spark session, on the running JVM that ``attached_env`` names.

    The JVM already runs a SparkContext (one per JVM): it is wrapped, not
    created, and a new session over it becomes this process's active one, so
    ``lowmark.state.session.get_spark`` returns it.
    """
    gateway = launch_gateway()  # connects: GATEWAY_PORT_ENV is set
    jvm = gateway.jvm
    context = jvm.org.apache.spark.SparkContext.getOrCreate()
    sc = SparkContext(gateway=gateway, jsc=jvm.org.apache.spark.api.java.JavaSparkContext(context))
    sessions = getattr(jvm, "org.apache.spark.sql.classic.SparkSession")
    shared = sessions.getDefaultSession().get()
    session = SparkSession(sc, jsparkSession=shared.newSession())
    sessions.setDefaultSession(shared)  # the test process's session stays the default
    return session


def main() -> None:
    if GATEWAY_PORT_ENV in os.environ:
        attach()
    lowmark(sys.argv[1:])


if __name__ == "__main__":
    main()
