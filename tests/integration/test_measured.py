"""Measured mode: a run's own costs, from a simulated trace whose truth is known."""

from __future__ import annotations

from dataclasses import replace

import pytest

from goodlens.analysis.measured import measure_run, mtbf_interval
from goodlens.analysis.runsim.presets import get_preset
from goodlens.analysis.runsim.tracegen import generate_trace
from goodlens.collector.replay import import_trace
from goodlens.storage.store import Store

H = 3600.0


def test_mtbf_interval_matches_chi_square_tables():
    # 10 failures in 1,000 h: 90% interval 2T/chi2(0.95; 22) .. 2T/chi2(0.05; 20)
    # chi2(0.95; 22) = 33.92, chi2(0.05; 20) = 10.85 -> 58.96 h .. 184.3 h
    lo, hi = mtbf_interval(1000 * H, 10)
    assert lo / H == pytest.approx(58.96, rel=0.01)
    assert hi / H == pytest.approx(184.3, rel=0.01)
    assert mtbf_interval(100.0, 0) is None


def test_measured_mode_recovers_the_simulators_mtbf_and_checkpoint_cost(tmp_path):
    # 16 nodes, a run MTBF of 2 h, synchronous 60 s checkpoints every 20 min, 2 days
    c = replace(get_preset("test-16"), nodes=16, gpus_per_node=1, duration_s=2 * 86400.0,
                step_s=5.0, node_mtbf_s=16 * 2 * H, ckpt_mode="sync", interval_s=1200.0,
                write_s=60.0, restore_s=120.0, queue_s=300.0, init_s=120.0, warmup_s=30.0,
                planned_per_day=0.0, straggler_per_node_day=0.0, compute_noise_sigma=0.0)
    generate_trace(c, 7, tmp_path / "t", run_id="m")
    s = Store(tmp_path / "m.duckdb")
    try:
        import_trace(s, tmp_path / "t")
        m = measure_run(s, "m")
    finally:
        s.close()
    assert m.failures >= 10
    lo, hi = m.mtbf_ci_s
    assert lo <= 2 * H <= hi  # the true run MTBF lies in the measured 90% interval
    assert m.checkpoint_stall_s == pytest.approx(60.0, rel=0.02)
    assert m.interval_s == pytest.approx(1200.0 + 60.0, rel=0.05)  # start to start
    assert m.restore_s == pytest.approx(120.0, rel=0.02)
    # Young: sqrt(2 x 60 s x 2 h) = 929 s; the planner's optimum is close to it
    assert 600 < m.best_interval_s < 1500
    assert m.gain_points >= 0
    assert "instead of" in m.sentence()
