"""The run simulator (breakdown only): the partition holds for every preset and random
configs; a trial's timeline, rebuilt as attempts, step summaries and events, gives the same
breakdown under ``goodlens.analysis.accounting.account``; Monte Carlo agrees with first-order theory
and Young's interval; each policy moves the bucket it should; bad configs name the field."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goodlens.analysis.accounting import BUCKETS, RESTART_PARTS, STARTUP_PARTS, account
from goodlens.analysis.runsim.episodes import Episodes, draw_episodes
from goodlens.analysis.runsim.montecarlo import (
    SimConfig,
    SimResult,
    daly_interval_s,
    first_order_goodput,
    monte_carlo,
    simulate,
    sweep,
    young_interval_s,
)
from goodlens.analysis.runsim.presets import PRESETS, get_preset
from goodlens.analysis.runsim.trial import prepare as _prepare
from goodlens.analysis.runsim.trial import run_trial as _trial
from tests.harness import STRESS

H, DAY = 3600.0, 86400.0


def check_partition(r: SimResult) -> None:
    assert set(r.buckets) == set(BUCKETS) and set(r.restart_parts) == set(RESTART_PARTS)
    assert all(v >= -1e-9 for v in [*r.buckets.values(), *r.restart_parts.values()])
    assert math.isclose(sum(r.buckets.values()), r.wall_clock_s, rel_tol=1e-9)
    assert math.isclose(r.buckets["restart"], sum(r.restart_parts.values()), rel_tol=1e-9,
                        abs_tol=1e-9)
    assert set(r.startup_parts) == set(STARTUP_PARTS)
    assert math.isclose(r.buckets["startup"], sum(r.startup_parts.values()), rel_tol=1e-9,
                        abs_tol=1e-9)
    assert 0 <= r.gpu_time_goodput <= r.goodput + 1e-12 <= 1 + 1e-12
    assert math.isclose(r.goodput, r.buckets["productive"] / r.wall_clock_s)


# ---------------------------------------------------------------------- rebuilt trace
def accounted(c: SimConfig, seed: int) -> tuple[SimResult, dict, float]:
    """Run a trial, rebuild its trace (one summary row per step, events as an exporter would
    emit them) and account it; returns the result, accounting's breakdown, and the downtime
    after the last attempt's end (accounting's run ends there; the simulator's at duration)."""
    p, tl = _prepare(c), []
    res = _trial(c, p, np.random.default_rng(seed), tl)
    km, kd, cm, cdd, T = p.km, p.kd, p.cm, p.cdd, c.duration_s

    def fc(m: int, d: float) -> float:
        k = m - 1
        return m * d + cm * (k // km - k // kd) + cdd * (k // kd)

    def stall(k: int) -> float:
        return cdd if k % kd == 0 else (cm if k % km == 0 else 0.0)
    att, steps, ev = [], [], []

    def e(kind: str, time: float, a: int, **kw) -> None:
        ev.append(dict(time=time, kind=kind, source="sim", attempt=a, **kw))
    for a, r in enumerate(tl):
        ranks, t, kind, m_end = r["n"] * c.gpus_per_node, r["t"], r["kind"], r.get("m_end")
        e("attempt_start", t, a, world_size=ranks)
        tf = r.get("t_fail", math.inf) if m_end is None else math.inf
        rs, re_ = t + r["init"], t + r["init"] + r["restore"]
        if r["restore"] > 0 and rs <= min(tf, T):
            e("ckpt_restore_start", rs, a)
            if re_ <= min(tf, T):
                e("ckpt_restore_end", re_, a)
        if m_end is not None:
            R, pcs = r["R"], r["pieces"]
            rows = [(R, rs + r["restore"], r["dur0"], r["w_first"])]
            ends = {}
            for i, (S, tau, d, w) in enumerate(pcs):
                hi = min(pcs[i + 1][0] if i + 1 < len(pcs) else m_end, m_end)
                for k in range(S, hi + 1):
                    ends[k] = tau + fc(k, d) - fc(S, d)
                    if k > S:
                        rows.append((k - 1, ends[k] - d, d, w))
            for stp, s, d, w in rows:  # rank 0 computes w longer than the median rank
                steps.append(dict(attempt=a, step=stp, ref_start=s, step_start=s,
                                  duration_median=d, compute_median=1.0, compute_max=1.0 + w,
                                  compute_ranks=ranks, ranks=ranks))
            stop = {"failed": r.get("t_fail"), "end": T}.get(kind, math.inf)
            for k in range(R + 1, (m_end if kind in ("failed", "end", "grow") else m_end - 1) + 1):
                if k % km == 0:
                    e("ckpt_save_start", ends[k], a, step=k)
                    if ends[k] + stall(k) <= stop:
                        e("ckpt_save_blocking_end", ends[k] + stall(k), a, step=k)
        end = {"failed": r.get("t_det"), "planned": r.get("t_end"), "evict": r.get("t_end"),
               "grow": r.get("t_end", 0) + (stall(m_end) if m_end else 0), "end": T}[kind]
        reason = {"failed": "failed", "planned": "preempted", "evict": "preempted",
                  "grow": "resized", "end": "completed"}[kind]
        att.append((a, t, end, reason, end))
        e({"failed": "failure_detected", "preempted": "preempted"}.get(reason, "attempt_end"),
          end, a, cause=reason)
    events = pd.DataFrame(ev)
    for col in ("step", "tier", "label", "world_size", "cause"):
        events[col] = events.get(col)
    acc = account("sim", pd.DataFrame(att, columns=["attempt", "start", "end", "end_reason",
                                                     "last_activity"]),
                  pd.DataFrame(steps), events.sort_values("time", kind="stable"),
                  world_size=c.nodes * c.gpus_per_node,
                  spare_gpus=c.spares * c.gpus_per_node if c.elastic == "spares" else 0)
    b = acc.breakdown(until=T)
    return res, b.as_dict(), max(0.0, T - min(T, acc.end))


def assert_matches_accounting(c: SimConfig, seed: int) -> None:
    res, b, downtime = accounted(c, seed)
    tol = 1e-6 * c.duration_s
    for k in BUCKETS:
        assert res.buckets[k] - (downtime if k == "restart" else 0) == pytest.approx(
            b["buckets"][k] or 0.0, abs=tol), k
    for k in RESTART_PARTS:
        assert res.restart_parts[k] - (downtime if k == "queue" else 0) == pytest.approx(
            b["restart_parts"][k], abs=tol), k
    for k in STARTUP_PARTS:
        assert res.startup_parts[k] == pytest.approx(b["startup_parts"][k], abs=tol), k
    if downtime == 0:
        assert res.gpu_time_goodput == pytest.approx(b["gpu_time_goodput"], abs=1e-9)




@pytest.mark.parametrize("mode", ["sync", "async", "tiered"])
@pytest.mark.parametrize("elastic", ["restart", "shrink", "spares"])
def test_breakdown_equals_accounting_of_its_trace(mode, elastic):
    """Frequent failures (some during start-up), hangs, wide failures, tier rollbacks across
    attempts, planned interruptions, evictions, shrink and grow, Weibull ages."""
    for seed in range(3):
        c = SimConfig(**STRESS, ckpt_mode=mode, elastic=elastic, evict_stragglers=seed != 1,
                      failure_dist="weibull" if seed == 2 else "exponential")
        assert_matches_accounting(c, seed)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_configs_partition_and_match_accounting(data):
    c = random_config(data)
    seed = data.draw(st.integers(0, 2**31))
    check_partition(simulate(c, seed))
    assert_matches_accounting(c, seed)


def random_config(data) -> SimConfig:
    f = data.draw
    nodes, interval = f(st.integers(1, 8)), f(st.floats(1, 3 * H))
    return SimConfig(
        nodes=nodes, gpus_per_node=f(st.integers(1, 4)), duration_s=f(st.floats(600, 8 * H)),
        step_s=f(st.floats(0.5, 20)), compute_fraction=f(st.floats(0.1, 1.0)),
        node_mtbf_s=nodes * f(st.floats(0.2 * H, 20 * H)),
        failure_dist=f(st.sampled_from(["exponential", "weibull"])),
        detect_crash_s=f(st.floats(0, 120)), detect_hang_s=f(st.floats(0, 900)),
        planned_per_day=f(st.floats(0, 10)), queue_s=f(st.floats(0, 900)),
        queue_dist=f(st.sampled_from(["exponential", "lognormal"])),
        init_s=f(st.floats(0, 300)), warmup_s=f(st.floats(0, 120)),
        interval_s=interval, ckpt_mode=f(st.sampled_from(["sync", "async",
                                                                         "tiered"])),
        write_s=f(st.floats(0, 300)), snapshot_s=f(st.floats(0, 20)),
        restore_s=f(st.floats(0, 300)), memory_interval_s=interval * f(st.floats(0.01, 1)),
        memory_stall_s=f(st.floats(0, 5)), memory_restore_s=f(st.floats(0, 30)),
        compute_noise_sigma=f(st.floats(0, 0.1)), straggler_per_node_day=f(st.floats(0, 8)),
        straggler_slowdown_median=f(st.floats(0.01, 1.0)),
        straggler_duration_median_s=f(st.floats(10, 2 * H)),
        nodes_per_switch=f(st.integers(1, 4)),
        elastic=f(st.sampled_from(["restart", "shrink", "spares"])),
        spares=f(st.integers(0, 3)), spare_swap_s=f(st.floats(0, 300)),
        repair_s=f(st.floats(0, 4 * H)), reconfig_s=f(st.floats(0, 120)),
        shrink_max_nodes=f(st.integers(0, nodes - 1)), evict_stragglers=f(st.booleans()),
        evict_delay_steps=f(st.integers(1, 50)), wide_failure_fraction=f(st.floats(0, 1)))


# ---------------------------------------------------------------------- presets, seeds
@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_partition(name):
    for seed in range(2 if name == "llama3-16k" else 5):
        check_partition(simulate(get_preset(name), seed))


def test_same_seed_same_result_different_seed_different():
    c = get_preset("demo-64")
    assert simulate(c, 7).as_dict() == simulate(c, 7).as_dict()
    assert simulate(c, 7).buckets != simulate(c, 8).buckets
    assert monte_carlo(c, 5, seed=3) == monte_carlo(c, 5, seed=3)
    assert monte_carlo(c, 5, seed=3)["goodput_mean"] != monte_carlo(c, 5, seed=4)["goodput_mean"]


def test_llama3_interruption_counts_match_the_paper():
    mc = monte_carlo(get_preset("llama3-16k"), trials=20, seed=0)
    assert mc["counts_mean"]["failures"] == pytest.approx(419, rel=0.15)
    assert mc["counts_mean"]["planned"] == pytest.approx(47, rel=0.15)
    assert 0.88 < mc["goodput_mean"] < 0.95  # "higher than 90% effective training time"


def test_get_preset_lists_names():
    with pytest.raises(KeyError, match=r"llama3-16k.*kokolis-1k.*demo-64.*test-16"):
        get_preset("nope")


# ---------------------------------------------------------------------- theory
THEORY = SimConfig(nodes=16, gpus_per_node=8, duration_s=30 * DAY, step_s=10.0,
                   node_mtbf_s=16 * 10 * H, ckpt_mode="sync", write_s=60, restore_s=60,
                   queue_s=300, init_s=120, warmup_s=30, detect_crash_s=60, detect_hang_s=600)


@pytest.mark.parametrize("interval", [600, 1200, 2000, 3000, 4500])
def test_monte_carlo_agrees_with_first_order_theory(interval):
    c = replace(THEORY, interval_s=interval)
    assert monte_carlo(c, trials=60, seed=1)["goodput_mean"] == pytest.approx(
        first_order_goodput(c), abs=0.01)


def test_best_interval_of_a_sweep_is_near_young():
    young = young_interval_s(THEORY.write_s, THEORY.node_mtbf_s / THEORY.nodes)
    df = sweep(THEORY, "interval_s", [young * f for f in (0.25, 0.4, 0.6, 0.8, 1, 1.25, 1.6,
                                                          2.5, 4)], trials=60, seed=2)
    assert list(df.columns[:4]) == ["value", "goodput_mean", "goodput_p5", "goodput_p95"]
    assert {f"{b}_share" for b in BUCKETS} <= set(df.columns)
    np.testing.assert_allclose(df[[f"{b}_share" for b in BUCKETS]].sum(axis=1), 1.0)
    best = float(df.value[df.goodput_mean.idxmax()])
    assert young / 1.5 <= best <= young * 1.5


def test_young_and_daly():
    assert young_interval_s(60, 36000) == pytest.approx(math.sqrt(2 * 60 * 36000))
    assert daly_interval_s(60, 36000) == pytest.approx(
        math.sqrt(4.32e6) * (1 + math.sqrt(60 / 72000) / 3 + 60 / 72000 / 9) - 60)
    assert daly_interval_s(500, 200) == 200  # C >= 2M: capped at M
    with pytest.raises(ValueError):
        young_interval_s(60, 0)


# ---------------------------------------------------------------------- policies
POLICY = replace(get_preset("demo-64"), duration_s=2 * DAY, node_mtbf_s=8 * 3 * H,
                 straggler_per_node_day=0.0, planned_per_day=0.0)


def test_hot_spares_cut_queue_time():
    c = replace(POLICY, queue_s=900.0, spare_swap_s=120.0)  # rescheduling 15 min, a swap 2
    full = monte_carlo(c, 30, seed=5)
    spares = monte_carlo(replace(c, elastic="spares", spares=2), 30, seed=5)
    assert spares["restart_parts_mean"]["queue"] < 0.5 * full["restart_parts_mean"]["queue"]
    assert spares["counts_mean"]["spare_swaps"] > 0
    # spares are allocated: GPU-time goodput is below wall-clock goodput
    assert spares["gpu_time_goodput_mean"] < spares["goodput_mean"] * 8 / 10 + 1e-9


def test_shrink_loses_gpu_time():
    c = replace(POLICY, elastic="shrink", repair_s=6 * H)
    r = next(r for r in (simulate(c, s) for s in range(20)) if r.counts["shrinks"])
    assert r.gpu_time_goodput < r.goodput
    plain = simulate(replace(c, elastic="restart"), 0)
    assert plain.gpu_time_goodput == pytest.approx(plain.goodput)


def test_async_stalls_less_than_sync():
    sync = monte_carlo(replace(POLICY, ckpt_mode="sync"), 10, seed=1)
    asyn = monte_carlo(replace(POLICY, ckpt_mode="async"), 10, seed=1)
    assert asyn["buckets_mean"]["checkpoint_stall"] < 0.2 * sync["buckets_mean"][
        "checkpoint_stall"]


def test_tiered_restores_are_cheaper_on_single_node_failures():
    c = replace(POLICY, wide_failure_fraction=0.0, memory_interval_s=60, restore_s=120,
                memory_restore_s=10)
    durable = monte_carlo(replace(c, ckpt_mode="async"), 30, seed=2)
    tiered = monte_carlo(replace(c, ckpt_mode="tiered"), 30, seed=2)
    per = {k: m["restart_parts_mean"]["restore"] / m["counts_mean"]["failures"]
           for k, m in (("durable", durable), ("tiered", tiered))}
    assert per["tiered"] < 0.5 * per["durable"]
    assert tiered["counts_mean"]["memory_restores"] > 0
    assert tiered["buckets_mean"]["recompute"] < durable["buckets_mean"]["recompute"]
    # a wide failure needs the durable copy
    wide = monte_carlo(replace(c, ckpt_mode="tiered", wide_failure_fraction=1.0), 10, seed=2)
    assert wide["counts_mean"]["memory_restores"] == 0


def test_evicting_planted_stragglers_cuts_straggler_wait():
    c = replace(POLICY, node_mtbf_s=1e9, straggler_per_node_day=2.0,
                straggler_slowdown_median=0.3, straggler_duration_median_s=4 * H,
                straggler_duration_sigma=0.3, evict_delay_steps=50)
    kept = monte_carlo(c, 10, seed=3)
    evicted = monte_carlo(replace(c, evict_stragglers=True), 10, seed=3)
    assert evicted["counts_mean"]["evictions"] > 0
    assert evicted["buckets_mean"]["straggler_wait"] < 0.5 * kept["buckets_mean"][
        "straggler_wait"]


def test_noise_alone_costs_straggler_wait():
    quiet = simulate(replace(POLICY, node_mtbf_s=1e12, compute_noise_sigma=0.0), 0)
    noisy = simulate(replace(POLICY, node_mtbf_s=1e12, compute_noise_sigma=0.05), 0)
    assert quiet.buckets["straggler_wait"] == 0
    assert noisy.buckets["straggler_wait"] > 0.05 * noisy.wall_clock_s  # 64 ranks, z_max ~2.4


# ---------------------------------------------------------------------- validation
@pytest.mark.parametrize("field,value", [
    ("nodes", 0), ("gpus_per_node", 1.5), ("duration_s", 0), ("step_s", -1),
    ("compute_fraction", 1.5), ("node_mtbf_s", math.inf), ("failure_dist", "gamma"),
    ("ckpt_mode", "lazy"), ("queue_dist", "uniform"), ("elastic", "grow"),
    ("write_s", float("nan")), ("wide_failure_fraction", 2.0), ("hang_prob", {"GPU": 0.5}),
    ("straggler_causes", {"cosmic": 1.0}), ("spares", -1), ("evict_delay_steps", 0),
    ("memory_interval_s", 1e6)])
def test_validation_names_the_field(field, value):
    kw = {"ckpt_mode": "tiered"} if field == "memory_interval_s" else {}
    with pytest.raises(ValueError, match=rf"SimConfig\.{field} "):
        SimConfig(**kw, **{field: value})


def test_shrink_needs_room_and_sweep_needs_a_field():
    with pytest.raises(ValueError, match=r"SimConfig\.shrink_max_nodes"):
        SimConfig(nodes=2, elastic="shrink", shrink_max_nodes=2)
    with pytest.raises(ValueError, match="no field 'intervals'"):
        sweep(get_preset("test-16"), "intervals", [1], trials=1)


# ---------------------------------------------------------------------- nested stragglers
def _episodes(shape: tuple[int, int, int], where: list[tuple[int, int, int]],
              factor: list[float], top: list[float]) -> Episodes:
    """Episodes placed by hand (subject id, ranks r0..r1), c0 = 1.4 s, E[median] = 1."""
    n = len(where)
    wait = [max(0.0, 1.4 * (f * m - 1.0)) for f, m in zip(factor, top, strict=True)]
    return Episodes(n, wait, [1] * n, [False] * n, factor, top, ["?"] * n, shape, 1.4, 1.0,
                    [math.inf], [], [], np.random.default_rng(0), False, where=where)


def test_nested_stragglers_compound_in_the_step_and_disjoint_ones_do_not():
    """8 nodes of 8 ranks, 4 nodes a switch. The step waits for the worst set of ranks, each
    slowed by the product of the factors on it and around it: c0 (F x E[max] - E[median]),
    with E[max] 1.04 for a switch, 1.03 for a node, 1.0 for one rank, noise's wait 0.05."""
    sw0, r21, node0, r20, sw0b, node5 = range(6)
    shape = (8, 8, 4)
    where = [(0, 0, 32), (21, 21, 22), (0, 0, 8), (20, 20, 21), (0, 0, 32), (5, 40, 48)]
    factor = [1.10, 1.10, 1.088, 1.20, 1.05, 1.30]
    top = [1.04, 1.0, 1.03, 1.0, 1.04, 1.03]

    def wait(*ids: int) -> float:
        ep = _episodes(shape, where, factor, top)
        for i in ids:
            ep.begin(i)
        return ep.wait(0.05)
    assert wait() == 0.05
    assert wait(sw0) == pytest.approx(1.4 * (1.10 * 1.04 - 1))            # 0.2016
    # rank 21 behind the slow switch: 1.1 x 1.1 = 1.21, worse than the switch's 1.144
    assert wait(sw0, r21) == pytest.approx(1.4 * (1.21 - 1))              # 0.294
    # two ranks of one node: neither is inside the other (1.2 alone, not 1.1 x 1.2)
    assert wait(r21, r20) == pytest.approx(1.4 * 0.20)                     # 0.28
    # two faults on one switch: its ranks carry both
    assert wait(sw0, sw0b) == pytest.approx(1.4 * (1.10 * 1.05 * 1.04 - 1))  # 0.28168
    # node 0 and rank 21 behind switch 0: node 0's 1.1 x 1.088 x 1.03 beats rank 21's 1.21
    assert wait(sw0, node0, r21) == pytest.approx(1.4 * (1.10 * 1.088 * 1.03 - 1))
    # node 5 is behind switch 1: nothing of switch 0 compounds with it
    assert wait(sw0, node5) == pytest.approx(1.4 * (1.30 * 1.03 - 1))     # 0.4746
    assert wait(r21, node0, sw0) == wait(sw0, node0, r21)
    # episodes that end leave the others as if they had never been there
    ep = _episodes(shape, where, factor, top)
    for i in range(6):
        ep.begin(i)
    for i in (node5, sw0b, node0):
        ep.end(i)
    ep.end(node5)  # not active: nothing
    assert ep.wait(0.05) == pytest.approx(wait(sw0, r21, r20))             # 1.1 x 1.2
    assert ep.wait(0.05) == pytest.approx(1.4 * (1.10 * 1.20 - 1))


def test_a_node_that_is_a_whole_switch_compounds_once():
    """nodes_per_switch 1: a node's set and its switch's are the same ranks; a rank inside
    carries a node fault (1.1) and a link fault (1.2) once each: 1.5 x 1.1 x 1.2 = 1.98."""
    ep = _episodes((2, 4, 1), [(1, 4, 8), (1, 4, 8), (5, 5, 6)], [1.1, 1.2, 1.5],
                   [1.0, 1.0, 1.0])
    for i in range(3):
        ep.begin(i)
    assert ep.wait(0.0) == pytest.approx(1.4 * 0.98)
    ep.end(2)
    assert ep.wait(0.0) == pytest.approx(1.4 * 0.32)


def test_placing_the_episodes_draws_nothing_from_the_trials_stream():
    """Where the episodes strike comes from a second stream (spawned off the trial's, or
    given), so the trial's failures and queues are drawn as before; same seed, same places."""
    c = replace(POLICY, straggler_per_node_day=4.0)
    p = _prepare(c)
    r1, r2 = np.random.default_rng(9), np.random.default_rng(9)
    e1 = draw_episodes(c, p, r1, True)
    draw_episodes(c, p, r2, True, place=np.random.default_rng(1))
    assert e1.count > 2 and r1.random() == r2.random()
    assert e1.record["r0"] == draw_episodes(c, p, np.random.default_rng(9), True).record["r0"]
    assert simulate(c, 3).as_dict() == simulate(c, 3).as_dict()
