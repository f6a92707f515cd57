"""Per-step fault tolerance (torchft-style) in the run simulator and the planner: the Monte
Carlo agrees with its own first-order goodput within a point, a trial's buckets follow the
policy's rules, the analytic forms match hand arithmetic, ``plan elastic`` compares the four
policies, and a torchft run's ``fault_tolerance`` section gives the measured costs."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from goodlens.analysis.planner import elastic_plan, measured_per_step, per_step_goodput
from goodlens.analysis.runsim.config import SimConfig
from goodlens.analysis.runsim.montecarlo import (
    first_order_goodput,
    first_order_per_step,
    monte_carlo,
    simulate,
)
from goodlens.cli import main as cli

H, DAY = 3600.0, 86400.0

# 16 nodes in 4 groups, a node MTBF that gives the job a failure every 10 h, sync saves
PER_STEP = SimConfig(nodes=16, gpus_per_node=8, duration_s=30 * DAY, step_s=10.0,
                     node_mtbf_s=16 * 10 * H, ckpt_mode="sync", interval_s=1800, write_s=60,
                     restore_s=60, queue_s=300, init_s=120, warmup_s=30, detect_crash_s=60,
                     detect_hang_s=600, elastic="per_step", replica_groups=4, quorum_s=30,
                     group_restart_s=1800, heal_bytes=60e9, heal_bandwidth_Bps=1e9)


# ---------------------------------------------------------------------- the Target
@pytest.mark.parametrize("kw", [{}, {"spares": 1}, {"node_mtbf_s": 16 * 2 * H},
                                {"replica_groups": 2, "node_mtbf_s": 16 * 4 * H}])
def test_monte_carlo_agrees_with_first_order_per_step(kw):
    # the Target: within one percentage point of its own first-order goodput, as the
    # restart policy is (test_simulate.test_monte_carlo_agrees_with_first_order_theory);
    # the GPU-time and sample views too
    c = replace(PER_STEP, **kw)
    mc = monte_carlo(c, trials=30, seed=1)
    a = first_order_per_step(c)
    assert first_order_goodput(c) == a["goodput"]
    for view in ("goodput", "gpu_time_goodput", "sample_goodput"):
        assert mc[f"{view}_mean"] == pytest.approx(a[view], abs=0.01), view


# ---------------------------------------------------------------------- one trial's rules
def test_a_trial_follows_the_per_step_rules():
    # no noise, no stragglers, no planned interruptions, only crashes: every step is 10 s
    c = replace(PER_STEP, compute_noise_sigma=0.0, straggler_per_node_day=0.0,
                detect_hang_s=60.0, duration_s=10 * DAY)
    r = simulate(c, seed=3)
    n = r.counts
    assert n["group_failures"] > 10 and n["attempts"] == 1  # the job never restarted
    assert n["failures"] == n["group_failures"]
    assert sum(r.buckets.values()) == pytest.approx(r.wall_clock_s, rel=1e-12)
    # each failure: its in-flight step (10 s) is recompute; two quorum changes of 30 s
    assert r.buckets["recompute"] == pytest.approx(10.0 * n["group_failures"])
    assert n["quorum_changes"] == n["group_failures"] + n["rejoins"]
    assert r.other_parts["quorum"] == pytest.approx(30.0 * n["quorum_changes"])
    assert r.buckets["other"] >= r.other_parts["quorum"]
    assert r.buckets["restart"] == 0.0
    # the job ran short: fewer samples than its productive time would give a full world,
    # and the missing GPU-seconds are idle (no spares here, so GPU-time = samples)
    assert r.sample_goodput < r.goodput
    assert r.gpu_time_goodput == pytest.approx(r.sample_goodput)


def test_a_spare_group_costs_gpu_time_but_saves_samples():
    c = replace(PER_STEP, compute_noise_sigma=0.0, straggler_per_node_day=0.0)
    plain, spare = simulate(c, 2), simulate(replace(c, spares=1), 2)
    assert spare.counts["spare_swaps"] > 0
    assert spare.sample_goodput > plain.sample_goodput
    # allocated: 16 nodes + one spare group of 4
    assert spare.gpu_time_goodput == pytest.approx(spare.sample_goodput * 16 / 20)


def test_too_few_groups_left_restarts_the_job():
    # two groups, one must stay: a failure while the other is out restarts the job
    c = replace(PER_STEP, replica_groups=2, node_mtbf_s=16 * 2 * H, duration_s=10 * DAY)
    r = simulate(c, 4)
    assert r.counts["attempts"] > 1 and r.buckets["restart"] > 0
    assert r.counts["failures"] == r.counts["group_failures"] + r.counts["attempts"] - 1
    assert sum(r.buckets.values()) == pytest.approx(r.wall_clock_s, rel=1e-12)


def test_weibull_failures_keep_the_partition():
    r = simulate(replace(PER_STEP, failure_dist="weibull", duration_s=5 * DAY), 5)
    assert r.counts["group_failures"] > 0
    assert sum(r.buckets.values()) == pytest.approx(r.wall_clock_s, rel=1e-12)


@pytest.mark.parametrize("kw, name", [({"replica_groups": 1}, "replica_groups"),
                                      ({"replica_groups": 3}, "replica_groups"),
                                      ({"min_replicas": 4}, "min_replicas"),
                                      ({"heal_bandwidth_Bps": 0.0}, "heal_bandwidth_Bps"),
                                      ({"quorum_s": -1.0}, "quorum_s")])
def test_bad_per_step_configs_name_the_field(kw, name):
    with pytest.raises(ValueError, match=name):
        replace(PER_STEP, **kw)


# ---------------------------------------------------------------------- analytic, by hand
def test_per_step_goodput_by_hand():
    g = per_step_goodput(mtbf_s=36000.0, step_s=10.0, replica_groups=2, quorum_s=5.0,
                         detect_s=60.0, group_restart_s=300.0, heal_s=20.0,
                         restart_loss_s=1000.0)
    # out = 60 + 300 + 20 + 10/2 + 5 = 390 s; rho = 390 / 36000 / 2; pi = rho / (1 + rho)
    rho = 390 / 36000 / 2
    pi = rho / (1 + rho)
    # two groups, one must stay: a failure restarts the job exactly when the other group is
    # out: p_fb = 2 pi (1-pi) / (2 (1-pi)^2 + 2 pi (1-pi)) = pi
    lam = (1 - pi) / 36000
    lost = (1 - pi) * (10 + 2 * 5) + pi * 1000
    good = 1 - lam * lost
    assert g["restart_share"] == pytest.approx(pi, rel=1e-12)
    assert g["goodput"] == pytest.approx(good, rel=1e-12)
    # short: 390 - 10/2 - 2 x 5 = 375 s at half the samples, after each non-restart failure
    assert g["short_s"] == pytest.approx(375.0)
    sample = good * (1 - lam * (1 - pi) * 375 / 2)
    assert g["sample_goodput"] == pytest.approx(sample, rel=1e-12)
    assert g["gpu_time_goodput"] == pytest.approx(sample, rel=1e-12)
    # a free spare group skips the restart: P(Poisson(300/36000) <= 0) = exp(-1/120)
    s = per_step_goodput(mtbf_s=36000.0, step_s=10.0, replica_groups=2, quorum_s=5.0,
                         detect_s=60.0, group_restart_s=300.0, heal_s=20.0,
                         restart_loss_s=1000.0, spare_groups=1)
    assert s["p_spare_free"] == pytest.approx(math.exp(-1 / 120), rel=1e-12)
    assert s["gpu_time_goodput"] == pytest.approx(s["sample_goodput"] * 2 / 3, rel=1e-12)


def test_elastic_plan_compares_the_four_policies_by_hand():
    e = elastic_plan(16, 1, 2, 256, mtbf_s=36000.0, step_s=10.0, detect_s=60.0,
                     interval_s=1800.0, checkpoint_cost_s=60.0, restart_s=900.0,
                     spare_swap_s=300.0, reconfig_s=120.0, repair_s=4 * H, spares=1,
                     replica_groups=4, quorum_s=5.0, group_restart_s=300.0, heal_s=20.0)
    assert set(e.policies) == {"restart", "shrink", "spares", "per_step"}
    over = 1 + 60 / 1800
    # restart: detection 60 + half an interval 900 + half a step 5 + relaunch 900 = 1865 s
    r = e.policies["restart"]
    assert r.lost_s_per_failure == pytest.approx(1865.0)
    assert r.goodput == pytest.approx((1 - 1865 / 36000) / over)
    assert r.lost_gpu_hours_per_failure == pytest.approx(1865 * 128 / 3600)
    # spares: a spare is free with P(Poisson(4h / 10h) <= 0) = exp(-0.4)
    p = math.exp(-0.4)
    sp = e.policies["spares"]
    assert sp.lost_s_per_failure == pytest.approx(965 + p * 300 + (1 - p) * 900)
    assert sp.gpu_time_goodput == pytest.approx(sp.goodput * 16 / 17)
    # shrink: 120 s to shrink, 120 s to grow back; 15 nodes hold 120 replicas, but 256
    # samples at micro-batch 2 do not divide among them: 64 replicas (50%) for the 4 h repair
    sh = e.policies["shrink"]
    assert e.throughput_fraction == pytest.approx(0.5)
    assert sh.lost_s_per_failure == pytest.approx(965 + 240)
    assert sh.sample_goodput == pytest.approx(sh.goodput * (1 - 0.5 * 4 * H / 36000))
    # per-step: the formula of per_step_goodput with a job restart as its fallback
    ps = per_step_goodput(mtbf_s=36000.0, step_s=10.0, replica_groups=4, quorum_s=5.0,
                          detect_s=60.0, group_restart_s=300.0, heal_s=20.0,
                          restart_loss_s=1865.0, checkpoint_overhead=60 / 1800)
    assert e.policies["per_step"].goodput == pytest.approx(ps["goodput"], rel=1e-12)
    assert e.best_policy == "per_step"
    # without mtbf_s: the one-loss plan only, as before
    assert elastic_plan(16, 1, 2, 256).policies == {}


# ---------------------------------------------------------------------- measured
FT = {  # a torchft run's fault_tolerance section, written by hand
    "replica_groups": 3,
    "heals": [
        {"group": "g1", "start": 1000.0, "end": 1004.0, "seconds": 4.0, "bytes": 4e9,
         "source": "g0", "transport": "http", "step": 20},
        {"group": "g2", "start": 3000.0, "end": 3006.0, "seconds": 6.0, "bytes": 8e9,
         "source": "g0", "transport": "http", "step": 80},
        {"group": "g1", "start": 5000.0, "end": 5005.0, "bytes": None,
         "source": "g2", "transport": "http", "step": 140},
    ],
    "recoveries": [
        {"group": "g1", "failure": 900.0, "detected": 910.0, "restarted": 950.0,
         "heal_start": 1000.0, "heal_end": 1004.0, "rejoined": 1010.0},
        {"group": "g2", "failure": 2900.0, "detected": 2930.0, "restarted": 2960.0,
         "heal_start": 3000.0, "heal_end": 3006.0, "rejoined": 3012.0},
        {"group": "g1", "failure": None, "detected": 4950.0, "restarted": 4980.0,
         "heal_start": 5000.0, "heal_end": 5005.0, "rejoined": None},
    ],
    "quorum_s": 12.0, "quorum_changes": 6,
    "groups": [{"group": "g0", "allocated_from": 0.0, "allocated_to": 7200.0},
               {"group": "g1", "allocated_from": 0.0, "allocated_to": 7200.0}],
}


def test_measured_per_step_from_a_hand_written_section():
    m = measured_per_step(FT, wall_clock_s=10800.0)
    assert m.heals == 3
    assert m.heal_s == pytest.approx(5.0)  # median of 4, 6 and 5 (end - start)
    assert m.heal_bandwidth_Bps == pytest.approx(12e9 / 10.0)  # heals with bytes only
    assert m.quorum_s == pytest.approx(2.0) and m.quorum_changes == 6
    assert m.failures == 3
    assert m.failures_per_hour == pytest.approx(1.0) and m.mtbf_s == pytest.approx(3600.0)
    assert m.detect_s == pytest.approx(20.0)  # median of 10 and 30 (the third has none)
    assert m.group_restart_s == pytest.approx(70.0)  # median of 90, 70, 50
    # without the wall-clock: the groups' allocated span, 7200 s
    assert measured_per_step(FT).failures_per_hour == pytest.approx(1.5)
    empty = measured_per_step({})
    assert empty.heal_s is None and empty.quorum_s is None and empty.mtbf_s is None


def test_plan_elastic_reads_a_runs_measured_costs(tmp_path, monkeypatch):
    import goodlens.cli.remote as remote
    reports = {"ft": {"wall_clock_s": 10800.0, "fault_tolerance": FT},
               "plain": {"wall_clock_s": 100.0}}
    monkeypatch.setattr(remote, "read_run_at",
                        lambda db, url, token, run_id, read: reports[run_id])
    db = tmp_path / "s.duckdb"
    db.write_bytes(b"")
    args = ["plan", "elastic", "--nodes", "6", "--lost", "1", "--micro-batch", "1",
            "--global-batch", "48", "--db", str(db), "--json"]
    out = CliRunner().invoke(cli, [*args, "--run", "ft"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["measured"]["heal_s"] == pytest.approx(5.0)
    ps = per_step_goodput(mtbf_s=3600.0, step_s=10.0, replica_groups=3, quorum_s=2.0,
                          detect_s=20.0, group_restart_s=70.0, heal_s=5.0,
                          restart_loss_s=20.0 + 900 + 5 + 900)
    assert doc["policies"]["per_step"]["goodput"] == pytest.approx(ps["goodput"], rel=1e-12)
    # an option given on the command line wins over the measured value
    given = json.loads(CliRunner().invoke(cli, [*args, "--run", "ft", "--heal", "50s"]).output)
    assert given["policies"]["per_step"]["goodput"] < doc["policies"]["per_step"]["goodput"]
    bad = CliRunner().invoke(cli, [*args, "--run", "plain"])
    assert bad.exit_code == 2 and "fault_tolerance" in bad.output


def test_simulate_cli_per_step():
    r = CliRunner().invoke(cli, ["simulate", "--preset", "test-16", "--set", "elastic=per_step",
                                 "--set", "replica_groups=2", "--trials", "3", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert sum(doc["buckets_mean"].values()) == pytest.approx(doc["wall_clock_s"])
    assert doc["other_parts_mean"]["quorum"] <= doc["buckets_mean"]["other"]
    assert 0 < doc["sample_goodput_mean"] <= doc["goodput_mean"]
    r = CliRunner().invoke(cli, ["simulate", "--preset", "test-16", "--set", "elastic=per_step",
                                 "--set", "replica_groups=2", "--out", "x"])
    assert r.exit_code == 2 and "per_step" in r.output


def test_failures_faster_than_their_cost_make_no_progress_not_negative():
    # MTBF 30 s against a restart losing 60 + 900 + 5 + 900 s: no time is left for steps
    e = elastic_plan(16, 1, 2, 256, mtbf_s=30.0, step_s=10.0, detect_s=60.0,
                     interval_s=1800.0, checkpoint_cost_s=60.0, restart_s=900.0,
                     replica_groups=4, quorum_s=5.0, group_restart_s=300.0, heal_s=20.0)
    for name, p in e.policies.items():
        assert 0.0 <= p.goodput <= 1.0, name
        assert 0.0 <= p.sample_goodput <= p.goodput, name
    assert e.policies["restart"].goodput == 0.0
