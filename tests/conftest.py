"""Fixtures shared by the three tiers (``unit/``: no I/O; ``integration/``: stores and HTTP
in-process; ``e2e/``: processes, browsers, torchrun). Helpers live in ``harness.py``, which
the benchmarks share; each test is marked with its tier from its folder
(``pytest -m unit`` runs the fast tier alone).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import AppCollector, Collector

_TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = next((t for t in _TIERS if f"/tests/{t}/" in str(item.path)), None)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    """A real ``goodlens serve`` process on a loopback port."""
    c = Collector(tmp_path / "store.duckdb").start()
    yield c
    c.stop()


@pytest.fixture
def app_collector(tmp_path: Path) -> Iterator[AppCollector]:
    """The same collector in this process, through its ASGI app (no port, no process)."""
    c = AppCollector(tmp_path / "store.duckdb")
    yield c
    c.stop()


@pytest.fixture(autouse=True)
def _isolated_spill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODLENS_SPILL_DIR", str(tmp_path / "spill"))
