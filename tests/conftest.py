"""Shared fixtures: one SparkSession for the whole run, a temp data root per test."""

from __future__ import annotations

import gc
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from lowmark.state.session import SparkSettings, get_spark
from tests.faults.scenarios import KAFKA_ENV
from tests.helpers import INTERPRETED, FakeClock
from tests.kafka_broker import KafkaBroker
from tests.postgres_server import PostgresServer


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = get_spark(
        SparkSettings(
            master="local[2]",
            confs={
                "spark.sql.shuffle.partitions": "2",
                "spark.default.parallelism": "2",
                **INTERPRETED,
            },
        )
    )
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _no_dagster_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reports batches to the Dagster instance in ``DAGSTER_HOME`` (the Makefile sets
    one): a test that wants an instance sets its own."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)


COLLECT_EVERY = 10
"""Tests that use Spark between two full collections of Python's garbage (one takes about
0.2 s: after every test it cost the suite minutes)."""
_spark_tests = 0


@pytest.fixture(autouse=True)
def _release_memory(request: pytest.FixtureRequest) -> Iterator[None]:
    """Free what a test leaves in the session the whole suite shares.

    The suite runs hundreds of batches over hundreds of Delta tables: Python
    proxies caught in reference cycles keep their JVM objects alive until a
    collection, and Delta caches every table's log. Left to accumulate, they
    filled the driver's heap late in the suite. Delta's cache is emptied after
    every test, the cycles collected every ``COLLECT_EVERY`` tests.
    """
    global _spark_tests
    yield
    if "spark" in request.fixturenames:
        _spark_tests += 1
        if _spark_tests % COLLECT_EVERY == 0:
            gc.collect()
        jvm: Any = request.getfixturevalue("spark").sparkContext._jvm
        jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    return root


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One real Kafka broker (tests/kafka_broker.py) shared by the whole session: started by
    the first test that asks for it (a few seconds), stopped at the end of the session.
    Tests use topic and group names of their own."""
    broker = KafkaBroker.start(tmp_path_factory.mktemp("kafka"))
    # `lowmark` subprocesses of the crash tests find it here (tests.faults.scenarios).
    os.environ[KAFKA_ENV] = broker.bootstrap
    try:
        yield broker
    finally:
        broker.stop()
        os.environ.pop(KAFKA_ENV, None)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL server (tests/postgres_server.py) shared by the whole session:
    started by the first test that asks for it (2-3 s), stopped at the end. Its libpq
    variables (PGHOST, PGPORT, PGUSER) are in the environment meanwhile, so a sink with no
    connection settings, and a `lowmark` subprocess, reach it; tests take a database of their
    own (``pg_database``)."""
    server = PostgresServer.start()
    os.environ.update(server.env)
    try:
        yield server
    finally:
        for name in server.env:
            os.environ.pop(name, None)
        server.stop()


_databases = itertools.count()


@pytest.fixture
def pg_database(postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new, empty database of the session's server, the test's libpq default (PGDATABASE)."""
    name = f"test_{next(_databases)}"
    postgres.create_database(name)
    monkeypatch.setenv("PGDATABASE", name)
    return name


FIRST = (
    "tests/faults/",
    "tests/orchestration/test_dagster_dev.py",
    "tests/orchestration/test_dagster_postgres.py",
)
"""The longest groups of tests, started first when two workers share the suite."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The suite on two workers (``make unit``: ``pytest -n 2 --dist loadgroup``): a test
    module runs on one worker, so its module fixtures are built once; a crash test of one
    pipeline (``tests/faults``, the ``name`` parameter, or the module's ``REFERENCE``) runs
    with that pipeline's other crash tests, wherever they are, so its fault-free reference
    run is made once; the longest groups are handed out first."""
    for item in items:
        path = item.nodeid.split("::")[0]
        params = getattr(item, "callspec", None)
        name = params.params.get("name") if params is not None else None
        name = getattr(getattr(item, "module", None), "REFERENCE", name)
        if path.startswith(FIRST[0]) and isinstance(name, str):
            item.add_marker(pytest.mark.xdist_group(f"faults-{name}"))
        else:
            item.add_marker(pytest.mark.xdist_group(path))
    items.sort(
        key=lambda item: next(
            (i for i, f in enumerate(FIRST) if item.nodeid.startswith(f)), len(FIRST)
        )
    )
