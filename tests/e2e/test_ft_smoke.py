"""End-to-end smoke: a real torchft job loses a replica group and heals it live, recorded by
a real collector.

Why: only a live run shows the torchft integration on torchft's own processes: a lighthouse
(``torchft_lighthouse``), one torchrun per replica group restarting it, a group killed
mid-step, the survivor discarding the step and going on alone, the restarted group healing
from the survivor's memory and rejoining. ``examples/ft/scenario.py --quick`` runs it: two
groups of two gloo ranks each (the recording has one rank per group), ``g1`` killed after
20 steps, the job ending ten steps after ``g1`` is back.

A smoke test: it asserts only what a loaded machine cannot change (the events are there in
their causal order, the killed group is the one that restarted and healed, the wall-clock
buckets and each group's GPU-time sum, everything ends cleanly). The full scenario (an
eviction and a spare too) is recorded (``tests/record/ft.py``, recording ``torchft``) and
its numbers are checked against the job's clock in
``tests/integration/test_recorded_ft.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobclock import buckets_sum_to_wall_clock

pytest.importorskip("torchft")
pytestmark = pytest.mark.slow


def test_a_killed_replica_group_heals_while_the_other_trains(tmp_path: Path) -> None:
    from goodlens.analysis.report import report_dict
    from goodlens.storage.store import Store
    from tests.record.ft import ft_scenario

    sc = ft_scenario().FTScenario(tmp_path, "ft", nproc=2, steps=1000, timeout_s=240)
    try:
        summary = sc.run(quick=True)
    finally:
        sc.stop()
    assert summary["exit_codes"]["g0"] == 0 and summary["exit_codes"]["g1"] == 0
    assert sc.procs["collector"].returncode == 0
    store = Store(Path(summary["db"]), read_only=True)
    try:
        rep = report_dict(store, "ft")
        ev = store.events("ft")
    finally:
        store.close()
    buckets_sum_to_wall_clock(rep)
    ft = rep["fault_tolerance"]
    for g in ft["groups"]:
        held = g["allocated_to"] - g["allocated_from"]
        assert sum(g["seconds"].values()) == pytest.approx(held, abs=1e-6), g["group"]
    by = {g["group"]: g for g in ft["groups"]}
    assert by["g0"]["attempts"] == 1 and by["g1"]["attempts"] == 2
    assert by["g0"]["steps_discarded"] >= 1       # the step g1 died in
    (rec,) = ft["recoveries"]
    assert rec["group"] == "g1" and rec["rejoined"] is not None
    assert rec["last_step_end"] < rec["detected"] <= rec["restarted"] < rec["heal_start"] \
        < rec["heal_end"] <= rec["rejoined"]
    starts = ev[(ev.kind == "group_start") & (ev.label == "g1")]
    assert len(starts) == 2
    heals = ev[(ev.kind == "heal_end") & (ev.label == "g1") & (ev.time > starts.time.max())]
    assert len(heals) >= 1 and (heals.bytes > 0).all()
    ends = ev[ev.kind == "group_end"]
    assert set(ends.label) == {"g0", "g1"} and set(ends.cause) == {"completed"}
    stop = int((tmp_path / "state" / "stop").read_text())
    assert ft["steps"]["committed"] == stop and ft["steps"]["short"] >= 1
    assert ft["group_world_size"] == 2
