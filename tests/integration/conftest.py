"""Fixtures of the integration tier: a real DuckDB store in the test's temporary folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from goodlens.storage.store import Store
from tests.conftest import SPARK


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh store file, closed after the test."""
    s = Store(tmp_path / "store.duckdb")
    yield s
    s.close()


#: The one running Spark session, with the context that stops it: (context, session).
_SPARK: list[tuple[Any, Any]] = []


@pytest.fixture(scope="module")
def spark_session() -> object:
    """One local Spark session (2 cores) for both Spark modules: a JVM costs ~9 s of CPU to
    start, and ``tests/conftest.py`` keeps the two modules on one xdist worker, one after
    the other. It is stopped right after the last of their tests (below), not at the end
    of the worker's session: its JVM and py4j threads are not left beside the tests that
    follow on that worker."""
    if not _SPARK:
        from goodlens.storage import spark
        context = spark.spark_session("local[2]", {"spark.sql.shuffle.partitions": "2",
                                                   "spark.driver.memory": "1g"})
        _SPARK.append((context, context.__enter__()))
    return _SPARK[0][1]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test's own teardown (its module's fixtures included): stop Spark when the
    next test to run here is not one of the Spark modules'."""
    try:
        return (yield)
    finally:
        if _SPARK and (nextitem is None or nextitem.path.stem not in SPARK):
            _stop_spark()


def _stop_spark() -> None:
    """Stop the session, then its JVM: pyspark keeps the JVM (and its py4j threads here)
    for a next session until this process exits; closing the JVM's stdin ends it."""
    from pyspark import SparkContext
    context, _ = _SPARK.pop()
    context.__exit__(None, None, None)
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        gateway.proc.stdin.close()
        gateway.proc.wait(timeout=60)
        SparkContext._gateway = SparkContext._jvm = None
