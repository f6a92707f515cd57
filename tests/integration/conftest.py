"""Fixtures of the integration tier: a real DuckDB store in the test's temporary folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from goodlens.storage.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh store file, closed after the test."""
    s = Store(tmp_path / "store.duckdb")
    yield s
    s.close()


@pytest.fixture(scope="session")
def session() -> Iterator[object]:
    """One local Spark session (2 cores) for both Spark modules: a JVM costs ~9 s of CPU to
    start, and ``tests/conftest.py`` keeps the two modules on one xdist worker."""
    from goodlens.storage import spark
    with spark.spark_session("local[2]", {"spark.sql.shuffle.partitions": "2",
                                          "spark.driver.memory": "1g"}) as s:
        yield s
