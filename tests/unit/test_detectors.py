"""Detectors: planted stragglers (synthetic matrices and simulator traces) are found with the
right subject, early, with the slowdown estimated; noise, uniform slowdowns and missing ranks
flag nothing; a switch-wide slowdown is one finding; NVIDIA's 0.75 rule misses what the CUSUM
catches; the hang detector's adaptive timeout fires after, never before."""

from __future__ import annotations

import itertools
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


def emissions(x: np.ndarray, topology: Topology | None = None,
              config: StragglerConfig | None = None) -> list:
    """Every finding the streaming detector emits (new, update, resolved), in order."""
    det = StragglerDetector(config, x.shape[1], topology)
    out = []
    for s, row in enumerate(x):
        out += det.update(s, row)
    return out


def feed(x: np.ndarray, topology: Topology | None = None, config: StragglerConfig | None = None):
    """One entry per finding, its latest state (as ``detect_stragglers`` returns them)."""
    det = StragglerDetector(config, x.shape[1], topology)
    latest = {}
    for s, row in enumerate(x):
        for f in det.update(s, row):
            latest[f.id] = f
    for f in det.active():
        latest[f.id] = f
    return list(latest.values())


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


def test_a_rank_always_slower_than_its_peers_is_a_finding():
    """Scoring is against the siblings, not the rank's own history: a rank 6% slower from the
    first step delays every collective from the first step, so it is reported (its own
    history would call it normal)."""
    x = noise(300, 64, seed=15)
    x[:, 5] *= 1.06
    (f,) = feed(x)
    assert f.subject_id == 5 and f.first_step <= 5 and f.detected_step <= 30
    assert abs(f.slowdown - 0.06) <= 0.01


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
        fs = list({f.id: f for f in fs + det.active()}.values())  # latest state per finding
    assert [(f.subject_id, f.status) for f in fs] == [(7, "resolved"), (20, "update")]
    assert [f.id.split("/")[0] for f in fs] == ["0", "1"]  # first reported in attempts 0, 1
    f = fs[1]
    assert abs(f.first_step - 450) <= 5 and 0 <= f.detected_step - 450 <= 30


def test_a_rank_still_slow_after_a_restart_continues_its_finding():
    """Rank 7 slow in both attempts: one finding (new in attempt 0, updated in attempt 1 with
    the same id and its wait carried), not a duplicate; without the attempt given, the
    restored older step numbers are just more steps (one finding too)."""
    a0, a1 = two_attempts()
    a1 = a1.copy()
    a1[:, 7] *= 1.20
    det = StragglerDetector(None, 64)
    out = [f for s, row in enumerate(a0) for f in det.update(s, row, attempt=0)]
    wait0 = det.active()[0].straggler_wait_s
    out += [f for s, row in enumerate(a1) for f in det.update(300 + s, row, attempt=1)]
    sevens = [f for f in out if f.subject_id == 7]
    assert sevens[0].status == "new" and len({f.id for f in sevens}) == 1
    assert any(f.status == "update" and f.attempt == 1 for f in sevens)
    (now,) = [f for f in det.active() if f.subject_id == 7]
    assert now.straggler_wait_s > wait0 and now.first_step == sevens[0].first_step
    # the wait carried over is attempt 0's: attempt 1's own part is its excess since onset
    carried = next(f for f in out if f.subject_id == 7 and f.attempt == 1)
    assert carried.straggler_wait_s >= wait0
    assert [f.subject_id for f in out if f.status == "new"] == [7, 20]


def test_a_restart_resolves_a_finding_not_seen_again():
    a0, a1 = two_attempts()
    det = StragglerDetector(None, 64)
    for s, row in enumerate(a0):
        det.update(s, row, attempt=0)
    assert [f.subject_id for f in det.active()] == [7]
    out = [f for s, row in enumerate(a1[:60]) for f in det.update(300 + s, row, attempt=1)]
    (res,) = [f for f in out if f.status == "resolved"]
    assert res.subject_id == 7 and res.attempt == 1 and det.active() == []


def test_its_cost_is_reported_as_it_grows_and_flush_ends_the_record_at_the_last_step():
    """Rank 3 of 8 takes 1.5 s to reach the collective from step 50, the others 1.0 s, no
    noise: it costs the job 0.5 s a step, (s - 49) x 0.5 s through step s. Its estimate
    (50% slower) settles at once, so only its cost moves: it is reported again whenever
    the wait has grown 10% since its last report (checked every 10 steps), and ``flush``
    (the end of an attempt's data) reports its state at the last step fed: 150 x 0.5 =
    75 s through step 199. Nothing is left to flush after that."""
    x = np.ones((200, 8))
    x[50:, 3] = 1.5
    det = StragglerDetector(None, 8)
    out = [f for s, row in enumerate(x) for f in det.update(s, row)]
    assert {f.subject_id for f in out} == {3} and out[0].status == "new"
    reports = [(f.last_step, f.straggler_wait_s) for f in out]
    for (s0, w0), (s1, w1) in itertools.pairwise(reports):
        assert s1 - s0 >= 10 and w1 >= 1.1 * w0 - 1e-9, reports
    # the last report lags the cost by under 10% of it plus one check's 10 steps (5 s)
    s_last, w_last = reports[-1]
    assert w_last == pytest.approx((s_last - 49) * 0.5, rel=0.02)
    assert 1.1 * w_last + 5.0 + 1e-9 >= (199 - 49) * 0.5, reports
    (final,) = det.flush()
    assert (final.status, final.last_step) == ("update", 199)
    assert final.straggler_wait_s == pytest.approx(75.0, rel=0.02)
    assert det.flush() == []


@pytest.mark.parametrize("seed", range(12))
def test_a_large_shift_after_a_creep_is_dated_at_the_shift(seed):
    """Rank 2 of 4 is 1.2% slow from step 40 (a rank sharing a busy core, ~1% noise) and 30%
    slow from step 100. The finding is about the 30%: its onset is the shift (planted at
    100; within 5 steps), and its slowdown since then 0.30. At its first report the
    stricter CUSUM may have run too few steps to date it (seed 4: dated at step 56, read
    5.1%); the first update dates it again, the ``id`` keeping the first report's step."""
    rng = np.random.default_rng(seed)
    x = 0.04 * np.exp(0.01 * rng.standard_normal((250, 4)))
    x[40:, 2] *= 1.012
    x[100:, 2] *= 1.30 / 1.012
    det = StragglerDetector(None, 4)
    out = [f for s, row in enumerate(x) for f in det.update(s, row)] + det.flush()
    assert {f.subject_id for f in out} == {2} and len({f.id for f in out}) == 1
    last = out[-1]
    assert 95 <= last.first_step <= 101 and last.first_step <= last.detected_step
    assert last.slowdown == pytest.approx(0.30, abs=0.01)
    if seed == 4:
        assert (out[0].first_step, out[0].id) == (56, "None/rank/2/56")
        assert out[1].first_step == 100


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
    assert [(f.subject_kind, f.subject_id, sorted(f.ranks)) for f in found
            if f.status == "new"] == [("switch", "leaf-a", slow)]


# ---------------------------------------------------------------- subjects an operator acts on
def topo128() -> Topology:
    """16 hosts of 8 ranks, 4 hosts behind each of 4 switches."""
    return Topology.from_hosts([f"node-{r // 8:04d}" for r in range(128)], nodes_per_switch=4)


def test_transient_spikes_never_become_findings():
    """A 2x single-step slowdown once added 35-70 noise units against a threshold of 25.
    Here ten times the real-world rate of spikes (1e-3 per rank-step, 1.3-2x, 1-3 steps,
    two on one rank 20 steps apart) over a healthy run: no finding at all. (A rank slow on
    most steps for a dozen steps or more is no longer transient: that is a finding.)"""
    rng = np.random.default_rng(31)
    x = noise(3000, 128, sigma=0.02, seed=31)
    x *= np.exp(0.03 * rng.standard_normal(3000))[:, None]  # shared per-step jitter
    for s, r in zip(*np.nonzero(rng.random(x.shape) < 1e-3)):
        x[s:s + rng.integers(1, 4), r] *= rng.uniform(1.3, 2.0)
    for s in (500, 520):  # two 3-step 2x spikes on one rank, 20 steps apart
        x[s:s + 3, 77] *= 2.0
    assert emissions(x, topo128()) == []


def test_a_data_starved_rank_is_found_from_its_time_to_reach_the_collective():
    """Same compute on every rank; rank 9 waits 20% of a step for its data loader from step
    100. Scored on compute alone it was invisible; its time to reach the all-reduce (step
    minus collective wait) is 20% longer, and so is everyone's wait."""
    steps, ranks = 400, 32
    comp = noise(steps, ranks, seed=32, base=0.6)
    data = np.full((steps, ranks), 0.00006)
    data[100:, 9] = 0.12
    ready = comp + data
    dur = ready.max(axis=1, keepdims=True) + 0.05
    s, r = np.meshgrid(np.arange(steps), np.arange(ranks), indexing="ij")
    df = pd.DataFrame({"attempt": 0, "rank": r.ravel(), "step": s.ravel(),
                       "duration_s": np.broadcast_to(dur, ready.shape).ravel(),
                       "compute_s": comp.ravel(), "data_wait_s": data.ravel(),
                       "collective_wait_s": (dur - ready).ravel()})
    (f,) = detect_stragglers(df)
    assert (f.subject_kind, f.subject_id) == ("rank", 9)
    assert 0 <= f.detected_step - 100 <= 30 and abs(f.slowdown - 0.2) <= 0.02
    assert f.action == "evict"


def test_nested_subjects_each_reported_as_themselves():
    """Switch 1 (ranks 32-63) 5% slow from step 100, host node-0005 inside it 6% more from
    step 200, rank 43 on that host 10% more from step 300: three findings, each with its own
    slowdown against its siblings."""
    x = noise(600, 128, seed=33)
    x[100:, 32:64] *= 1.05
    x[200:, 40:48] *= 1.06
    x[300:, 43] *= 1.10
    fs = feed(x, topo128())
    got = {(f.subject_kind, f.subject_id): f for f in fs}
    assert set(got) == {("switch", 1), ("host", "node-0005"), ("rank", 43)}
    for key, onset, slow in [(("switch", 1), 100, 0.05), (("host", "node-0005"), 200, 0.06),
                             (("rank", 43), 300, 0.10)]:
        f = got[key]
        assert 0 <= f.detected_step - onset <= 30, f
        assert abs(f.slowdown - slow) <= 0.2 * slow, f
    assert got[("rank", 43)].relative_to == "the other ranks of host node-0005"
    assert got[("host", "node-0005")].relative_to == "the other hosts behind switch 1"


def test_a_slow_half_of_the_job_does_not_move_the_reference():
    """Switches 0 and 1 (half the job) 8% slow from step 100: the median rank is then in the
    gap and a cross-rank median read ~4%. The reference leaves suspect subjects out, so each
    switch is estimated at 8% and nothing on the healthy half is flagged."""
    x = noise(500, 128, seed=34)
    x[100:, :64] *= 1.08
    fs = feed(x, topo128())
    assert sorted((f.subject_kind, f.subject_id) for f in fs) == [("switch", 0), ("switch", 1)]
    for f in fs:
        assert abs(f.slowdown - 0.08) <= 0.1 * 0.08 and f.detected_step - 100 <= 30


def test_the_slowdown_estimate_converges():
    """A blip 9 steps before the onset once started the sum and froze a 24.6% rank at 3.7%.
    A 25% rank with such a blip is estimated within 20% 100 steps after its onset; an
    intermittent rank (30% slow on a random half of its steps) at its mean cost, 15%."""
    rng = np.random.default_rng(35)
    x = noise(500, 64, seed=35)
    x[91, 3] *= 1.04
    x[100:, 3] *= 1.25
    x[100:, 50] *= np.where(rng.random(400) < 0.5, 1.30, 1.0)
    det = StragglerDetector(None, 64)
    for s in range(201):
        det.update(s, x[s])
    now = {f.subject_id: f for f in det.active()}
    assert abs(now[3].slowdown - 0.25) <= 0.2 * 0.25
    assert abs(now[50].slowdown - 0.15) <= 0.2 * 0.15


def test_a_finding_is_updated_in_place_and_resolved():
    """Rank 7 10% slow from step 100, 30% from step 200, healthy from step 350: one id, a new
    report, updates as the estimate moves (upwards), then resolved, and gone from active()."""
    x = noise(700, 64, seed=36)
    x[100:200, 7] *= 1.10
    x[200:350, 7] *= 1.30
    out = emissions(x)
    assert {f.id for f in out} == {out[0].id} and out[0].status == "new"
    assert out[-1].status == "resolved" and out[-1].last_step >= 350
    ups = [f for f in out if f.status == "update"]
    assert ups and ups[-1].slowdown > out[0].slowdown + 0.05
    assert all(f.detected_step == out[0].detected_step for f in out)
    det = StragglerDetector(None, 64)
    for s, row in enumerate(x):
        det.update(s, row)
    assert det.active() == []


def test_batch_fast_path_emits_what_the_streaming_path_emits():
    """update_many advances quiet steps many at once (detectors/fastforward.py); every
    emission (new, updates as a rank's slowdown grows, a host finding, resolutions) equals
    the one-step-at-a-time path's, also across a row with missing ranks and a restart: the
    same subjects, steps and statuses, numbers within 1e-7 (a block's float32 logs and
    exps may round the last bit apart from a row's; the streaming path's numbers, the fast
    path's and the per-row batch path's are otherwise the same)."""
    x = noise(900, 256, sigma=0.015, seed=41)
    x[120:500, 9] *= 1.08
    x[300:700, 9] *= 1.15
    x[200:650, 64:72] *= 1.07
    x[400, 100:110] = np.nan
    topo = Topology.from_hosts([f"h{r // 8}" for r in range(256)], nodes_per_switch=4)
    stream = StragglerDetector(None, 256, topo)
    one = [f for s, row in enumerate(x) for f in stream.update(s, row, attempt=s // 600)]
    batch = StragglerDetector(None, 256, topo)
    many = batch.update_many(range(600), x[:600], attempt=0)
    many += batch.update_many(range(600, 900), x[600:], attempt=1)
    assert {(f.subject_kind, f.status) for f in one} >= {("rank", "new"), ("rank", "update"),
                                                         ("host", "new"), ("rank", "resolved")}
    for got, want in [(many, one), (batch.active(), stream.active())]:
        assert len(got) == len(want)
        for f, g in zip(got, want):
            for k, v in vars(g).items():
                assert getattr(f, k) == (pytest.approx(v, rel=1e-7) if isinstance(v, float)
                                         else v), (k, f, g)


def _rotate(values: list[float], steps: range, ranks: int) -> np.ndarray:
    """Rank r at step s takes ``values[(r + s) % len(values)]``: every rank the same median
    over time, each step the same set of values."""
    return np.array([[values[(r + s) % len(values)] for r in range(ranks)] for s in steps])


@pytest.mark.parametrize("with_step_time", [True, False])
def test_job_slowdown_is_the_excess_over_the_latest_of_the_other_ranks(with_step_time):
    """5 ranks; from step 20 ranks 0-3 reach the collective at 0.80, 0.82, 0.84 and 0.86 s
    (rotating among them), rank 4 at 0.95 s; the step ends 0.05 s after the latest. By hand:
    without rank 4 every step would end 0.86 + 0.05 = 0.91 s instead of 1.00 s, so the job
    loses 0.09 s a step: 0.09 / 0.91 = 0.0989 (over the others' median, 0.83, it would read
    0.12 / 0.88 = 0.136). Without step times the step is taken to end at the latest rank:
    0.09 / (0.95 - 0.09) = 0.1047. The first report (at step 28, onset estimated at step
    19, where rank 4 happened to be the latest at 0.86 s) already prices only the steps
    since the onset: the 19 quiet steps before it, still among the last 64, would have made
    the median loss 0."""
    x = np.vstack([_rotate([0.80, 0.82, 0.84, 0.86, 0.83], range(20), 5),
                   np.column_stack([_rotate([0.80, 0.82, 0.84, 0.86], range(20, 100), 4),
                                    np.full(80, 0.95)])])
    times = (x.max(axis=1) + 0.05).tolist() if with_step_time else None
    det = StragglerDetector(None, 5)
    out = det.update_many(range(100), x, times)
    want = 0.09 / 0.91 if with_step_time else 0.09 / 0.86
    assert out[0].status == "new" and out[0].subject_id == 4 and 19 <= out[0].first_step <= 20
    assert out[0].job_slowdown == pytest.approx(want, rel=1e-5)
    (f,) = det.active()
    assert f.job_slowdown == pytest.approx(want, rel=1e-5)


def test_a_findings_last_report_has_its_job_slowdown_now_not_when_its_slowdown_last_moved():
    """5 ranks, rank 4 at 0.95 s from step 20, each step ending 0.05 s after its latest rank.
    Steps 20-59: the others at 0.80, 0.82, 0.84 and 0.86 (rotating); from step 60 at 0.78,
    0.82, 0.84 and 0.90: the five ranks' median is 0.84 in both, so rank 4's slowdown does not
    move, but the job now waits for the 0.90 rank anyway. By hand: the job lost 0.09 s of a
    0.91 s step (0.0989), and loses 0.05 s of 0.95 s from step 60 (0.0526). The finding's last
    report (and its current state) must say 0.0526 once the last 64 steps are the new ones,
    although its slowdown alone never moved 10% (an update only on that would keep 0.0989).
    The batch path reports the same."""
    x = np.vstack([_rotate([0.80, 0.82, 0.84, 0.86, 0.83], range(20), 5),
                   np.column_stack([_rotate([0.80, 0.82, 0.84, 0.86], range(20, 60), 4),
                                    np.full(40, 0.95)]),
                   np.column_stack([_rotate([0.78, 0.82, 0.84, 0.90], range(60, 160), 4),
                                    np.full(100, 0.95)])])
    times = (x.max(axis=1) + 0.05).tolist()
    stream = StragglerDetector(None, 5)
    one = [f for s, row in enumerate(x) for f in stream.update(s, row, step_time_s=times[s])]
    many = StragglerDetector(None, 5).update_many(range(160), x, times)
    assert [(f.status, f.last_step, f.job_slowdown) for f in many] == \
        [(f.status, f.last_step, pytest.approx(f.job_slowdown, rel=1e-7)) for f in one]
    assert {f.subject_id for f in one} == {4} and one[0].status == "new"
    assert any(f.job_slowdown == pytest.approx(0.09 / 0.91, rel=1e-5) for f in one)
    assert one[-1].job_slowdown == pytest.approx(0.05 / 0.95, rel=1e-5), one[-1]
    assert stream.active()[0].job_slowdown == pytest.approx(0.05 / 0.95, rel=1e-5)
    # the slowdown itself stayed put: every update after the first came from the job's
    assert max(f.slowdown for f in one[1:]) - min(f.slowdown for f in one[1:]) < 0.1 * 0.13


def test_a_hosts_job_slowdown_is_its_latest_rank_over_the_latest_outside_it():
    """4 hosts of 3 ranks; from step 20 the 9 ranks of hosts h0, h1 and h3 reach the
    collective at 0.80-0.86 s (9 values 7.5 ms apart, rotating), host h2's 3 ranks at 0.91,
    0.93 and 0.95 s (rotating: no one of them is slower than the others); the step ends
    0.05 s after the latest. By hand: the host's latest rank is at 0.95 s, the latest
    outside it at 0.86 s: the job loses 0.09 s of each 1.00 s step, 0.09 / 0.91 = 0.0989
    (one of its ranks alone would lose 0.07 s; its median over the others' 0.10 s)."""
    others = [0.80 + 0.0075 * i for i in range(9)]
    x = np.empty((100, 12))
    x[:20] = _rotate([0.80 + 0.06 * i / 11 for i in range(12)], range(20), 12)
    x[20:, [0, 1, 2, 3, 4, 5, 9, 10, 11]] = _rotate(others, range(20, 100), 9)
    x[20:, 6:9] = _rotate([0.91, 0.93, 0.95], range(20, 100), 3)
    det = StragglerDetector(None, 12, Topology.from_hosts([f"h{r // 3}" for r in range(12)]))
    det.update_many(range(100), x, (x.max(axis=1) + 0.05).tolist())
    (f,) = det.active()
    assert (f.subject_kind, f.subject_id, f.ranks) == ("host", "h2", [6, 7, 8])
    assert f.job_slowdown == pytest.approx(0.09 / 0.91, rel=1e-5)
