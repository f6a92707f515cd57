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
