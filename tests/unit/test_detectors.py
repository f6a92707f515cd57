"""Detectors: planted stragglers (synthetic matrices and simulator traces) are found with the
right subject, early, with the slowdown estimated; noise, uniform slowdowns and missing ranks
flag nothing; a switch-wide slowdown is one finding; NVIDIA's 0.75 rule misses what the CUSUM
catches; the hang detector's adaptive timeout fires after, never before."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from goodlens.analysis.runsim.presets import get_preset
from goodlens.analysis.runsim.tracegen import generate_trace
from goodlens.detectors.hangs import HangConfig, HangDetector
from goodlens.detectors.stragglers import (
    StragglerConfig,
    StragglerDetector,
    Topology,
    detect_stragglers,
    nvidia_rule,
)


def noise(steps: int, ranks: int, sigma: float = 0.01, seed: int = 0, base: float = 0.7
          ) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return base * np.exp(sigma * rng.standard_normal((steps, ranks)))


def feed(x: np.ndarray, topology: Topology | None = None, config: StragglerConfig | None = None):
    det = StragglerDetector(config, x.shape[1], topology)
    out = []
    for s, row in enumerate(x):
        out += det.update(s, row)
    return out


def to_frame(x: np.ndarray, hosts_per: int = 8) -> pd.DataFrame:
    steps, ranks = x.shape
    s, r = np.meshgrid(np.arange(steps), np.arange(ranks), indexing="ij")
    return pd.DataFrame({"attempt": 0, "rank": r.ravel(), "step": s.ravel(),
                         "host": [f"node-{i // hosts_per:04d}" for i in r.ravel()],
                         "compute_s": x.ravel(), "duration_s": 1.0})


# rank, onset, slowdown, steps: one persistent slowdown on one rank
PLANTED = [(17, 100, 0.05, 300), (3, 80, 0.10, 300), (200, 150, 0.30, 300)]


@pytest.mark.parametrize("rank,onset,slowdown,steps", PLANTED)
def test_planted_rank_found_early_with_slowdown(rank, onset, slowdown, steps):
    x = noise(steps, 256, seed=rank)
    x[onset:, rank] *= 1 + slowdown
    (f,) = feed(x)
    assert (f.subject_kind, f.subject_id, f.ranks) == ("rank", rank, [rank])
    assert 0 <= f.detected_step - onset <= 30
    assert abs(f.first_step - onset) <= 5
    assert abs(f.slowdown - slowdown) <= 0.3 * slowdown
    assert f.action == "evict" and 0.5 <= f.confidence <= 1
    assert f.straggler_wait_s > 0 and f.wait_per_hour_s > 0


def test_two_percent_found_eventually():
    x = noise(1000, 256, seed=5)
    x[100:, 42] *= 1.02
    (f,) = feed(x)
    assert f.subject_id == 42 and f.detected_step - 100 <= 200
    assert f.action == "watch"  # under the eviction threshold


def test_noise_only_flags_nothing():
    x = noise(1000, 1000, seed=7)  # a million rank-steps, lognormal sigma 0.01
    topo = Topology.from_hosts([f"h{r // 8}" for r in range(1000)], nodes_per_switch=4)
    assert feed(x, topo) == []


@pytest.mark.parametrize("seed", range(4))
def test_slowing_every_rank_equally_flags_nothing(seed):
    rng = np.random.default_rng(seed)
    x = noise(600, 128, seed=seed)
    factor = np.exp(np.cumsum(0.02 * rng.standard_normal(600)))  # common drift
    factor[rng.integers(100, 500):] *= 1 + rng.uniform(0.05, 0.5)  # common jump
    assert feed(x * factor[:, None]) == []


def test_switch_wide_slowdown_is_one_switch_finding():
    topo = Topology.from_hosts([f"node-{r // 8:04d}" for r in range(128)], nodes_per_switch=4)
    x = noise(300, 128, seed=11)
    x[120:, 32:64] *= 1.10  # hosts 4-7, switch 1
    (f,) = feed(x, topo)
    assert (f.subject_kind, f.subject_id) == ("switch", 1)
    assert f.ranks == list(range(32, 64))
    assert f.detected_step - 120 <= 30 and abs(f.slowdown - 0.10) <= 0.03


def test_host_wide_slowdown_is_one_host_finding():
    topo = Topology.from_hosts([f"node-{r // 8:04d}" for r in range(128)], nodes_per_switch=4)
    x = noise(300, 128, seed=12)
    x[100:, 40:48] *= 1.08  # host 5
    (f,) = feed(x, topo)
    assert (f.subject_kind, f.subject_id, f.ranks) == ("host", "node-0005", list(range(40, 48)))


def test_missing_ranks_do_not_crash_or_flag():
    rng = np.random.default_rng(13)
    x = noise(400, 64, seed=13)
    x[rng.random(x.shape) < 0.05] = np.nan
    x[50:150, 9] = np.nan  # a rank silent for a while
    x[200:, 30] *= 1.10
    x[:, 63] = np.nan  # never reports
    assert [f.subject_id for f in feed(x)] == [30]
    assert feed(np.full((20, 8), np.nan)) == []


def test_finding_reported_once_until_recovery():
    x = noise(1200, 64, seed=14)
    x[100:500, 7] *= 1.3
    x[800:, 7] *= 1.3
    fs = feed(x)
    assert [(f.subject_id, f.first_step // 100) for f in fs] == [(7, 1), (7, 8)]


def test_individual_drift_of_a_fast_rank():
    x = noise(600, 64, seed=15)
    x[:, 5] *= 0.95  # always 5% fast
    x[300:, 5] *= 1.06  # thermal onset: barely above its peers now, well above itself
    (f,) = feed(x)
    assert (f.subject_id, f.kind) == (5, "drift")
    assert f.detected_step - 300 <= 30 and abs(f.slowdown - 0.06) <= 0.02


def test_nvidia_rule_misses_ten_percent_that_cusum_catches():
    x = noise(400, 64, seed=16)
    x[100:, 20] *= 1.10
    x[100:, 40] *= 1.50
    df = to_frame(x)
    flagged = {f.rank for f in nvidia_rule(df, window_steps=50)}
    assert flagged == {40}
    ours = detect_stragglers(df)
    assert sorted(f.subject_id for f in ours) == [20, 40]
    assert {f.attempt for f in ours} == {0}


def two_attempts() -> tuple[np.ndarray, np.ndarray]:
    """Attempt 0 runs steps 0-399; attempt 1 restarts from a checkpoint at step 300 and runs
    300-699. Rank 7 is 20% slow from step 100 of attempt 0 until the restart and healthy
    after; rank 5 is 6% fast in attempt 0 only (its GPU is replaced), so stale own-history
    state would see it 6% slower than itself; rank 20 is 10% slow from step 450 of attempt 1."""
    a0, a1 = noise(400, 64, seed=21), noise(400, 64, seed=22)
    a0[100:, 7] *= 1.20
    a0[:, 5] *= 0.94
    a1[150:, 20] *= 1.10
    return a0, a1


@pytest.mark.parametrize("batch", [False, True])
def test_new_attempt_resets_state(batch):
    a0, a1 = two_attempts()
    if batch:
        df = pd.concat([to_frame(a0), to_frame(a1).assign(attempt=1, step=lambda d: d.step + 300)])
        fs = detect_stragglers(df.sample(frac=1.0, random_state=0))  # row order must not matter
    else:
        det = StragglerDetector(None, 64)
        fs = [f for s, row in enumerate(a0) for f in det.update(s, row, attempt=0)]
        fs += [f for s, row in enumerate(a1) for f in det.update(300 + s, row, attempt=1)]
        assert det.attempt == 1
    assert [(f.subject_id, f.attempt, f.kind) for f in fs] == [(7, 0, "cross"), (20, 1, "cross")]
    f = fs[1]
    assert abs(f.first_step - 450) <= 5 and 0 <= f.detected_step - 450 <= 30


def test_without_reset_stale_state_would_flag():
    """The case above is a real test: carrying attempt 0's state into attempt 1 (no attempt
    given) flags the replaced rank 5 as drifting. With the reset, rank 7 still slow after the
    restart continues its attempt-0 finding (one finding, not a duplicate)."""
    a0, a1 = two_attempts()
    a1 = a1.copy()
    a1[:, 7] *= 1.20  # rank 7 slow again after the restart: a fresh finding with a reset
    det = StragglerDetector(None, 64)
    stale = [f for s, row in enumerate(np.vstack([a0, a1])) for f in det.update(s, row)]
    assert 5 in {f.subject_id for f in stale}
    assert [f.subject_id for f in stale].count(7) == 1
    det = StragglerDetector(None, 64)
    fresh = [f for s, row in enumerate(a0) for f in det.update(s, row, attempt=0)]
    fresh += [f for s, row in enumerate(a1) for f in det.update(300 + s, row, attempt=1)]
    assert [(f.subject_id, f.attempt) for f in fresh] == [(7, 0), (20, 1)]


def test_config_validation():
    with pytest.raises(ValueError):
        StragglerConfig(threshold_h=0)
    with pytest.raises(ValueError):
        StragglerConfig(min_steps=-1)
    with pytest.raises(ValueError):
        StragglerConfig(cusum_cap=1.0)
    with pytest.raises(ValueError):
        StragglerDetector(None, 8).update(0, np.ones(7))


def test_simulated_trace_planted_episodes():
    c = replace(get_preset("test-16"), nodes=8, gpus_per_node=4, nodes_per_switch=2,
                straggler_per_node_day=12.0, node_mtbf_s=1e9, straggler_slowdown_median=0.15,
                compute_noise_sigma=0.01)
    tr = generate_trace(c, 3, None)
    df = tr.tables["steps"].to_pandas()
    hosts = df.drop_duplicates("rank").sort_values("rank")["host"].tolist()
    found = detect_stragglers(df, topology=Topology.from_hosts(hosts, c.nodes_per_switch))
    planted = [p for p in tr.findings if p["slowdown"] >= 0.05 and p["steps"] >= 40]
    assert len(planted) >= 4
    kinds = {"node": "host"}
    for p in planted:
        sid = f"node-{p['id']:04d}" if p["subject"] == "node" else p["id"]
        match = [f for f in found if f.subject_kind == kinds.get(p["subject"], p["subject"])
                 and f.subject_id == sid]
        assert len(match) == 1, (p, found)
        f = match[0]
        assert f.ranks == list(range(p["ranks"][0], p["ranks"][1] + 1))
        assert 0 <= f.detected_step - p["first_step"] <= 30
        assert abs(f.slowdown - p["slowdown"]) <= 0.3 * p["slowdown"]
    assert len(found) == len(planted)  # no false flags


# ---------------------------------------------------------------- hangs
def test_hang_fires_after_adaptive_timeout_not_before():
    det = HangDetector(HangConfig(min_timeout_s=5.0, safety_factor=3.0))
    for t in range(0, 100):
        for r in range(4):
            det.observe(r, t * 2.0)  # 2 s steps
    det.observe(0, 210.0)  # a 12 s checkpoint stall: timeout becomes 36 s
    for r in (1, 2, 3):
        det.observe(r, 210.0)
    assert det.timeout_s == pytest.approx(36.0)
    for t in range(212, 246, 2):
        for r in (1, 2, 3):
            det.observe(r, float(t))
    assert det.check(245.9) == []  # rank 0 silent 35.9 s < 36 s
    (f,) = det.check(246.5)
    assert (f.subject_kind, f.subject_id) == ("rank", 0) and f.silent_s > 36
    assert det.check(250.0) == []  # reported once
    det.observe(0, 251.0)  # back; the long gap does not stretch the timeout
    assert det.timeout_s == pytest.approx(36.0)
    (job,) = det.check(300.0)
    assert job.subject_kind == "job" and det.check(301.0) == []


def test_hang_floor_and_validation():
    det = HangDetector(HangConfig(min_timeout_s=60.0))
    det.observe(0, 0.0)
    det.observe(0, 1.0)
    assert det.timeout_s == 60.0 and det.check(59.0) == []
    assert det.check(62.0)[0].subject_kind == "job"
    with pytest.raises(ValueError):
        HangConfig(safety_factor=0.5)


# ---------------------------------------------------------------- properties and topology map
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), ranks=st.integers(8, 256),
       sigma=st.floats(0.005, 0.02), factors=st.lists(st.floats(0.5, 2.0), min_size=1,
                                                      max_size=4))
def test_property_slowing_every_rank_equally_flags_nothing(seed, ranks, sigma, factors):
    from goodlens.detectors.stragglers import StragglerDetector
    rng = np.random.default_rng(seed)
    det = StragglerDetector(StragglerConfig(), ranks)
    steps = 300
    level = np.repeat(factors, -(-steps // len(factors)))[:steps]  # jumps shared by all ranks
    found = []
    for s in range(steps):
        compute = 0.8 * level[s] * np.exp(sigma * rng.standard_normal(ranks))
        found += det.update(s, compute)
    assert found == []


def test_an_explicit_topology_map_rolls_ranks_up_to_their_switch():
    from goodlens.detectors.stragglers import StragglerDetector, Topology
    hosts = [f"node-{r // 4}" for r in range(32)]  # 8 hosts of 4 ranks
    leaf = {f"node-{h}": ("leaf-a" if h in (1, 4, 6) else f"leaf-{h}") for h in range(8)}
    topo = Topology.from_run(hosts, {"switch_of_host": leaf})
    rng = np.random.default_rng(3)
    det = StragglerDetector(StragglerConfig(), 32, topo)
    slow = [r for r in range(32) if r // 4 in (1, 4, 6)]  # the ranks behind leaf-a
    found = []
    for s in range(200):
        compute = 0.8 * np.exp(0.01 * rng.standard_normal(32))
        if s >= 50:
            compute[slow] *= 1.15
        found += det.update(s, compute)
    assert [(f.subject_kind, sorted(f.ranks)) for f in found] == [("switch", slow)]
