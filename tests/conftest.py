"""Fixtures shared by the three tiers (``unit/``: no I/O; ``integration/``: stores and HTTP
in-process; ``e2e/``: processes, browsers, torchrun). Helpers live in ``harness.py``, which
the benchmarks share; each test is marked with its tier from its folder
(``pytest -m unit`` runs the fast tier alone).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Collector

_TIERS = ("unit", "integration", "e2e")

# `make test` caps each pytest run (tests/run-part.sh) with `timeout -s USR1`: every pytest
# process (xdist's controller and workers) then writes where each of its threads is, into a
# file of its own in GOODLENS_TEST_STACKS (three processes writing to one stderr interleave
# their lines), which the script prints.
_STACKS_DIR = os.environ.get("GOODLENS_TEST_STACKS")
_STACKS = (open(Path(_STACKS_DIR) / f"{os.getpid()}.txt", "w")  # noqa: SIM115 (for life)
           if _STACKS_DIR else sys.__stderr__)
faulthandler.register(signal.SIGUSR1, file=_STACKS, all_threads=True)

#: Modules whose claims are timed against the job's own clock on a job that is alone on the
#: machine (torchrun jobs of 3-4 processes), marked ``heavy``. ``make test`` runs the rest on
#: two workers first, then these in one process: beside a second worker's browsers and
#: collectors the HF job's ``job_slowdown`` read 22% under its truth (docs/testing.md).
#: Under a plain ``pytest -n 2`` they run one after another on one worker while the other
#: worker runs the rest; two at once would queue 8-10 processes. The elastic scenario and
#: the 20,000 hostile pushes load both cores too, but claim nothing a loaded machine moves
#: (they passed beside two busy loops): they run with the light tests, first (:data:`FIRST`).
HEAVY = frozenset({
    "test_torch_e2e", "test_torch_restart", "test_torch_async",
    "test_torch_collective_modes", "test_integration_fsdp2", "test_integration_hf",
    "test_integration_lightning", "test_slowdown_share",
})

#: The longest modules (or module groups) of the light tests, started first and in this
#: order (longest first: the many short ones then even out the two workers' ends). xdist's
#: own order is by test count, which started the two-test elastic scenario last.
FIRST = ("test_elastic_scenario", "test_spark_summaries", "test_spark_fleet",
         "test_hostile_ingest_http", "test_dashboard_views", "test_dashboard_browser")

#: Modules that share one Spark session (``tests/integration/conftest.py``): on one worker,
#: so its JVM starts once.
SPARK = frozenset({"test_spark_summaries", "test_spark_fleet"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = next((t for t in _TIERS if f"/tests/{t}/" in str(item.path)), None)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
        if item.path.stem in HEAVY:
            item.add_marker(pytest.mark.heavy)
    rank = {m: i for i, m in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(FIRST)))  # stable: the rest


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under ``-n``: each module's tests on one worker (a module-scoped fixture, a torchrun
    job or a browser, is set up once), every :data:`HEAVY` module on the same one, and the
    :data:`SPARK` modules together.
    (``--dist loadgroup`` with ``xdist_group`` marks would say it, but xdist 3.8 groups by
    rewriting ``item._nodeid``, which pytest 9 no longer reads: the marks did nothing.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def schedule(self) -> None:
            self.config.option.loadscopereorder = False  # the collection's order (FIRST)
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            stem = Path(module).stem
            if stem in HEAVY:
                return "heavy"
            return "spark" if stem in SPARK else module

        def remove_node(self, node: object) -> str | None:
            return requeue_after_crash(self, node)

    return ByModule(config, log)


def requeue_after_crash(sched: object, node: object) -> str | None:
    """What xdist 3.8's ``LoadScopeScheduling.remove_node`` should do when a worker dies.

    Its own puts every unit the dead worker had back in the queue, finished ones too, and
    the test that crashed still pending. A replacement worker then gets a unit with nothing
    to run, is sent an empty batch, never reports, and is never shut down: the session waits
    forever (the CI run that a native abort in one worker turned into a 90-minute timeout;
    ``tests/integration/test_suite_scheduler.py`` shows it). Here the crashed test counts as
    done (xdist reports it failed, with the worker's crash), only units with tests left go
    back, at the front, and the live workers are offered them. What the dead worker had
    run, in order, is printed: a native crash may come from what an earlier test left
    behind in the process (a thread, a process group)."""
    workload = sched.assigned_work.pop(node)
    pending = [(scope, unit) for scope, unit in workload.items() if not all(unit.values())]
    if not pending:
        return None   # a worker shut down at the end
    ran = [scope for scope, unit in workload.items() if any(unit.values())]
    tr = sched.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        name = getattr(getattr(node, "gateway", None), "id", "a worker")
        tr.ensure_newline()
        tr.write_line(f"{name} died; what it had run, in order: {', '.join(ran) or 'nothing'}")
    crashed = next(nodeid for _, unit in pending for nodeid, done in unit.items() if not done)
    pending[0][1][crashed] = True
    for scope, unit in reversed(pending):
        if not all(unit.values()):
            sched.workqueue[scope] = unit
            sched.workqueue.move_to_end(scope, last=False)
    for live in list(sched.assigned_work):
        sched._reschedule(live)
    return crashed


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    c = Collector(tmp_path / "store.duckdb").start()
    yield c
    c.stop()


@pytest.fixture(autouse=True)
def _isolated_spill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOODLENS_SPILL_DIR", str(tmp_path / "spill"))
