"""Smoke: one live DDP job (``examples/train_ddp.py``, 4 gloo ranks under torchrun) feeds a
real collector that a real Prometheus scrapes, with a slow rank, a crash and a restart from a
DCP checkpoint planted.

Only what the machine's load cannot change is asserted: the events are there, the
collector's numbers are consistent (the buckets sum to the wall-clock, each attempt keeps
the steps its checkpoint says), the planted rank is the one named (its slowdown is a 40 ms
sleep on a 20 ms step, unmistakable even on one core), Prometheus reads the run while it is
live, and the job, the collector and Prometheus end cleanly. How close each estimate comes
to the job's clock is asserted on recorded runs (``tests/integration/test_recorded_ddp.py``)
and measured live in ``bench/accuracy.py``.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.framework_jobs import torchrun_ddp
from tests.harness import Collector, Prometheus, kill_tree
from tests.jobclock import buckets_sum_to_wall_clock

pytest.importorskip("torch")

STEPS, CKPT, KILL_AT, SLOW_RANK, SLOW_FROM = 100, 20, 50, 2, 5


def test_a_ddp_job_with_a_slow_rank_and_a_crash_end_to_end(tmp_path):
    from goodlens.analysis.report import report_dict
    from goodlens.storage.store import Store

    c = Collector(tmp_path / "smoke.duckdb").start()
    prom = Prometheus(tmp_path, c.port)
    run = torchrun_ddp(tmp_path, c.url, "smoke", "--steps", str(STEPS), "--compute-ms", "20",
                       "--ckpt-every", str(CKPT), "--slow-rank", str(SLOW_RANK),
                       "--slow-pct", "200", "--slow-from", str(SLOW_FROM),
                       "--kill-rank", "1", "--kill-at", str(KILL_AT), restarts=1, wait=False)
    try:
        live = prom.query_until('goodlens_run_goodput_ratio{run="smoke"}',
                                lambda r: float(r[0]["value"][1]) > 0, timeout=90)
        assert live, "Prometheus never returned a positive goodput for the run"
        assert 0 < float(live[0]["value"][1]) <= 1 and live[0]["metric"]["job"] == "goodlens"
        assert run.wait(180) == 0, (tmp_path / "smoke.log").read_text()[-3000:]
        c.sync(detect=True)
    finally:
        kill_tree(run)
        prom.stop()
        assert c.stop() == 0, "the collector did not end cleanly"
    store = Store(c.db, read_only=True)
    try:
        ev, steps, rep = store.events("smoke"), store.steps("smoke"), report_dict(store, "smoke")
    finally:
        store.close()
    kinds = set(ev.kind)
    assert {"attempt_start", "ckpt_save_start", "ckpt_save_durable_end", "ckpt_restore_end",
            "failure_detected", "straggler_flagged"} <= kinds, kinds
    # the crash at step 50 rolls back to the save after step 39: attempt 1 resumes at 40
    resumed = KILL_AT // CKPT * CKPT
    assert set(ev[ev.kind == "ckpt_restore_end"].step) == {resumed - 1}
    assert steps[steps.attempt == 1].step.min() == resumed
    assert [a["steps"]["kept"] for a in rep["attempts"]] == [resumed, STEPS - resumed]
    buckets_sum_to_wall_clock(rep)
    assert rep["buckets"]["recompute"] > 0 and rep["buckets"]["restart"] > 0
    # the planted rank, and no other, is still flagged at the end (one finding per attempt
    # where the detector did not carry it over the restart)
    flagged = ev[ev.kind == "straggler_flagged"].sort_values("seq")
    last = {}
    for detail in flagged.detail:
        f = json.loads(detail)
        last[f["id"]] = f
    open_ = [f for f in last.values() if f["status"] != "resolved"]
    assert open_ and all(f["ranks"] == [SLOW_RANK] for f in open_), list(last.values())
