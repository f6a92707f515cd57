"""Checkpoint cost model and planners: hand-worked references, validation, the simulator."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from goodlens.analysis.ckptcost import BYTES_PER_PARAM, CheckpointSpec, checkpoint_cost
from goodlens.analysis.planner import (
    elastic_plan,
    interval_plan,
    spares_plan,
    tiered_goodput,
    tiered_plan,
)
from goodlens.analysis.runsim.config import SimConfig
from goodlens.analysis.runsim.montecarlo import first_order_goodput, monte_carlo
from goodlens.analysis.runsim.presets import get_preset

DAY = 86400.0


# --------------------------------------------------------------------------- checkpoint cost


def _spec(**kw: object) -> CheckpointSpec:
    base = dict(params=70e9, gpus=1024, writer_ranks=128, writer_bw=2e9, storage_bw=100e9,
                d2h_bw=25e9, peer_bw=12.5e9, retained=3, price_per_gpu_hour=2.0)
    base.update(kw)
    return CheckpointSpec(**base)  # type: ignore[arg-type]


def test_checkpoint_cost_70b_by_hand() -> None:
    c = checkpoint_cost(_spec(), interval_s=1800.0)
    # REFERENCE.md: mixed-precision Adam ~16 B/param: 70e9 x 16 = 1.12e12 B (1.12 TB)
    assert c.size_bytes == pytest.approx(1.12e12)
    # writers 128 x 2 GB/s = 256 GB/s > storage 100 GB/s -> 100 GB/s; 1.12e12 / 1e11 = 11.2 s
    assert c.write_bw == pytest.approx(100e9)
    assert c.sync_stall_s == pytest.approx(11.2)
    assert c.background_write_s == pytest.approx(11.2)
    # shard 1.12e12 / 128 = 8.75e9 B; snapshot 8.75e9 / 25e9 = 0.35 s; peer 8.75e9/12.5e9 = 0.7 s
    assert c.shard_bytes == pytest.approx(8.75e9)
    assert c.async_stall_s == pytest.approx(0.35)
    assert c.peer_copy_stall_s == pytest.approx(0.7)
    # 3 retained: 3.36e12 B; sustained 1.12e12 / 1800 s = 622.2 MB/s
    assert c.storage_bytes == pytest.approx(3.36e12)
    assert c.sustained_bw == pytest.approx(1.12e12 / 1800)
    assert c.write_fits_interval is True
    # sync: 11.2 s x 1024 GPUs / 3600 = 3.1858 GPU-h; 86400/1800 = 48 a day -> 152.92 GPU-h
    assert c.checkpoints_per_day == pytest.approx(48)
    assert c.gpu_hours_per_checkpoint["sync"] == pytest.approx(11.2 * 1024 / 3600)
    assert c.gpu_hours_per_day is not None and c.money_per_day is not None
    assert c.gpu_hours_per_day["sync"] == pytest.approx(152.9173, rel=1e-5)
    # async: 0.35 x 1024 / 3600 = 0.099556 GPU-h; at $2/GPU-h $0.19911
    assert c.money_per_checkpoint is not None
    assert c.money_per_checkpoint["async"] == pytest.approx(0.35 * 1024 / 3600 * 2)
    assert c.money_per_day["sync"] == pytest.approx(2 * 152.9173, rel=1e-5)


def test_checkpoint_cost_writer_limited_and_presets() -> None:
    # 8 writers x 2 GB/s = 16 GB/s < 100 GB/s: (7e9 x 12 + 1e9 loader) / 16e9 = 85e9/16e9
    spec = CheckpointSpec.for_optimizer("fp32-adam", params=7e9, gpus=64, writer_ranks=8,
                                        writer_bw=2e9, storage_bw=100e9, dataloader_bytes=1e9)
    c = checkpoint_cost(spec)
    assert spec.bytes_per_param == 12.0
    assert c.size_bytes == pytest.approx(85e9)
    assert c.sync_stall_s == pytest.approx(85e9 / 16e9)
    assert c.gpu_hours_per_day is None and c.money_per_checkpoint is None
    assert BYTES_PER_PARAM["mixed-adam"] == 16.0 and BYTES_PER_PARAM["sgd"] == 8.0
    # a 5 s interval cannot absorb a 5.31 s background write
    assert checkpoint_cost(spec, 5.0).write_fits_interval is False


@pytest.mark.parametrize("field, value", [("params", -1.0), ("gpus", 0), ("writer_ranks", 1.5),
                                          ("storage_bw", 0.0), ("dataloader_bytes", -1.0),
                                          ("retained", 0), ("price_per_gpu_hour", -2.0),
                                          ("d2h_bw", math.inf)])
def test_checkpoint_spec_validation_names_input(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        _spec(**{field: value})


def test_checkpoint_cost_bad_interval_and_optimizer() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        checkpoint_cost(_spec(), interval_s=0.0)
    with pytest.raises(ValueError, match="optimizer"):
        CheckpointSpec.for_optimizer("lion", params=1e9, gpus=8, writer_ranks=1, writer_bw=1e9,
                                     storage_bw=1e9)


# --------------------------------------------------------------------------- interval


def test_interval_plan_by_hand() -> None:
    p = interval_plan(300.0, DAY)
    # Young: sqrt(2 x 300 x 86400) = sqrt(51,840,000) = 7200 s
    assert p.young_interval_s == pytest.approx(7200.0)
    # Daly: x = C/2M = 1/576, sqrt(x) = 1/24: 7200 (1 + 1/72 + 1/5184) - 300 = 7001.3889
    assert p.daly_interval_s == pytest.approx(7001.3889, abs=1e-3)
    # goodput(7200) = (1 - 3600/86400) / (1 + 300/7200) = (23/24) / (25/24) = 0.92
    assert p.expected_goodput(7200.0) == pytest.approx(0.92)
    assert p.expected_waste(7200.0) == pytest.approx(0.08)
    # dg/ddt = 0: dt^2 + 2C dt - 2C(M - R) = 0 -> sqrt(300^2 + 2 x 300 x 86400) - 300 = 6906.25
    assert p.best_interval_s == pytest.approx(math.sqrt(90000 + 51_840_000) - 300, rel=1e-6)
    assert p.best_goodput >= p.expected_goodput(7200.0)
    assert {r["interval_s"] for r in p.table} >= {p.young_interval_s, p.daly_interval_s}
    # restart 600 s: (1 - 4200/86400) x 24/25 = 0.951389 x 0.96 = 0.913333
    p2 = interval_plan(300.0, DAY, restart_cost_s=600.0)
    assert p2.expected_goodput(7200.0) == pytest.approx(0.9133333, abs=1e-6)
    # optimum shrinks with R: sqrt(300^2 + 2 x 300 x 85800) - 300
    assert p2.best_interval_s == pytest.approx(math.sqrt(90000 + 600 * 85800) - 300, rel=1e-6)
    t = interval_plan(300.0, DAY, intervals=[3600.0])
    assert t.table[0]["lost_s_per_day"] == pytest.approx((1 - t.expected_goodput(3600)) * DAY)


@pytest.mark.parametrize("args, name", [((DAY, DAY), "checkpoint_cost_s"),
                                        ((2 * DAY, DAY), "checkpoint_cost_s"),
                                        ((-1.0, DAY), "checkpoint_cost_s"),
                                        ((300.0, 0.0), "mtbf_s"),
                                        ((300.0, DAY, -5.0), "restart_cost_s"),
                                        ((300.0, DAY, DAY), "restart_cost_s")])
def test_interval_plan_validation(args: tuple, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        interval_plan(*args)
    with pytest.raises(ValueError, match="interval_s"):
        interval_plan(300.0, DAY).expected_goodput(-1.0)


def _sim_base() -> SimConfig:
    """kokolis-1k with only exponential failures and sync checkpoints (no noise, stragglers,
    planned interruptions; crash and hang detected alike so E[detection] is 60 s)."""
    return replace(get_preset("kokolis-1k"), compute_noise_sigma=0.0,
                   straggler_per_node_day=0.0, failure_dist="exponential", ckpt_mode="sync",
                   planned_per_day=0.0, detect_crash_s=60.0, detect_hang_s=60.0)


def _restart(cfg: SimConfig) -> float:
    # detection + queue + init + restore + warm-up + half a step (the partial step)
    return (cfg.detect_crash_s + cfg.queue_s + cfg.init_s + cfg.restore_s + cfg.warmup_s
            + cfg.step_s / 2)


def test_interval_plan_matches_first_order_goodput() -> None:
    cfg = replace(_sim_base(), interval_s=1800.0)
    p = interval_plan(cfg.write_s, cfg.node_mtbf_s / cfg.nodes, _restart(cfg))
    # first_order_goodput also charges the first attempt's start-up, once per run
    startup = (cfg.init_s + cfg.warmup_s) / cfg.duration_s / (1 + cfg.write_s / 1800.0)
    assert p.expected_goodput(1800.0) - startup == pytest.approx(first_order_goodput(cfg),
                                                                 abs=1e-12)


def test_interval_plan_agrees_with_simulator() -> None:
    base = _sim_base()
    p = interval_plan(base.write_s, base.node_mtbf_s / base.nodes, _restart(base))
    for iv in (p.best_interval_s, 3600.0):
        mc = monte_carlo(replace(base, interval_s=iv), trials=400, seed=7)
        assert abs(mc["goodput_mean"] - p.expected_goodput(iv)) < 0.01, iv


# --------------------------------------------------------------------------- tiered


def test_tiered_goodput_by_hand() -> None:
    g = tiered_goodput(600.0, 6, memory_stall_s=5.0, durable_stall_s=30.0, memory_restore_s=10.0,
                       durable_restore_s=120.0, mtbf_s=36000.0, memory_survivable=0.9)
    # loss = 0.9 (10 + 300) + 0.1 (120 + 1800) = 279 + 192 = 471 s; lam loss = 471/36000
    # overhead = 5/600 + (30 - 5)/3600 = 0.0083333 + 0.0069444 = 0.0152778
    assert g == pytest.approx((1 - 471 / 36000) / (1 + 5 / 600 + 25 / 3600))


def test_tiered_plan_beats_single_tier_when_failures_single_node() -> None:
    kw = dict(memory_stall_s=5.0, durable_stall_s=120.0, mtbf_s=8 * 3600.0,
              memory_restore_s=10.0, durable_restore_s=120.0, restart_cost_s=600.0)
    t = tiered_plan(memory_survivable=0.9, **kw)  # type: ignore[arg-type]
    assert t.gain > 0.02 and t.ratio > 1
    assert t.durable_interval_s == pytest.approx(t.ratio * t.memory_interval_s)
    # the optimum: no better point nearby (closed form per ratio, ratios searched)
    gkw = {k: v for k, v in kw.items()}
    for tm, j in ((t.memory_interval_s * 1.1, t.ratio), (t.memory_interval_s * 0.9, t.ratio),
                  (t.memory_interval_s, t.ratio + 1), (t.memory_interval_s, t.ratio - 1)):
        assert tiered_goodput(tm, j, memory_survivable=0.9, **gkw) <= t.goodput  # type: ignore
    # no failure survivable in memory: the memory tier is pure overhead, ratio 1, no gain
    t0 = tiered_plan(memory_survivable=0.0, **kw)  # type: ignore[arg-type]
    assert t0.ratio == 1 and t0.gain == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("kw, name", [(dict(memory_survivable=1.5), "memory_survivable"),
                                      (dict(memory_stall_s=200.0), "memory_stall_s"),
                                      (dict(mtbf_s=-1.0), "mtbf_s"),
                                      (dict(durable_stall_s=1e6), "durable_stall_s"),
                                      (dict(durable_restore_s=-1.0), "durable_restore_s")])
def test_tiered_plan_validation(kw: dict, name: str) -> None:
    args = dict(memory_stall_s=5.0, durable_stall_s=120.0, mtbf_s=8 * 3600.0,
                memory_survivable=0.9)
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        tiered_plan(**args)  # type: ignore[arg-type]


def test_tiered_plan_agrees_with_simulator() -> None:
    base = _sim_base()
    r0 = _restart(base) - base.restore_s
    t = tiered_plan(5.0, 30.0, base.node_mtbf_s / base.nodes, 0.9, memory_restore_s=10.0,
                    durable_restore_s=120.0, restart_cost_s=r0)
    # the simulator's tiered durable save blocks for the snapshot (30 s) and writes in the
    # background (60 s); a tenth of failures span nodes and need the durable copy
    cfg = replace(base, ckpt_mode="tiered", memory_interval_s=t.memory_interval_s,
                  interval_s=t.durable_interval_s, memory_stall_s=5.0, snapshot_s=30.0,
                  write_s=60.0, memory_restore_s=10.0, restore_s=120.0,
                  wide_failure_fraction=0.1)
    mc = monte_carlo(cfg, trials=400, seed=3)
    assert abs(mc["goodput_mean"] - t.goodput) < 0.01


# --------------------------------------------------------------------------- elastic


def test_elastic_exact_same_micro_batch_and_costs() -> None:
    # 16 nodes, one 8-GPU replica per node: dp 16, micro 2, batch 480 -> accumulation 15.
    # Lose 1: 15 replicas, 480/15 = 32 samples each = micro 2 x accumulation 16.
    e = elastic_plan(16, 1, 2, 480, model_parallel=8, restart_s=900.0, spare_swap_s=300.0,
                     reconfig_s=120.0, repair_s=14400.0)
    assert (e.data_parallel, e.data_parallel_after, e.data_parallel_used) == (16, 15, 15)
    assert (e.micro_batch, e.accumulation, e.global_batch, e.exact) == (2, 16, 480, True)
    assert e.reason == "same micro-batch"
    assert e.throughput_fraction == pytest.approx(15 / 16)
    assert e.step_time_factor == pytest.approx(16 / 15)
    # 128 GPUs. restart 900 x 128/3600 = 32 GPU-h; spare 300 x 128/3600 = 10.667;
    # shrink (120 + 120 grow back) + (1/16)(14400 - 120) = 1132.5 s -> 40.267 GPU-h
    assert e.lost_gpu_hours["restart"] == pytest.approx(32.0)
    assert e.lost_gpu_hours["spare"] == pytest.approx(300 * 128 / 3600)
    assert e.lost_gpu_hours["shrink"] == pytest.approx(1132.5 * 128 / 3600)
    assert e.recommendation == "spare"
    no_spare = elastic_plan(16, 1, 2, 480, model_parallel=8, restart_s=900.0,
                            reconfig_s=120.0, repair_s=14400.0, spare_available=False)
    assert no_spare.recommendation == "restart" and "spare" not in no_spare.lost_gpu_hours
    # a 1 h repair: shrink = 240 + (1/16)(3600 - 120) = 457.5 s = 16.27 GPU-h < 32: shrink
    quick = elastic_plan(16, 1, 2, 480, model_parallel=8, restart_s=900.0, reconfig_s=120.0,
                         repair_s=3600.0, spare_available=False)
    assert quick.recommendation == "shrink"
    assert quick.lost_gpu_hours["shrink"] == pytest.approx(457.5 * 128 / 3600)


def test_elastic_micro_batch_limit() -> None:
    # dp 16, micro 3, batch 240 (accumulation 5). Lose 1: 240/15 = 16 per replica, not a
    # multiple of 3; within a limit of 3 the largest divisor of 16 is 2 (x 8); with 4: 4 x 4
    e = elastic_plan(16, 1, 3, 240, model_parallel=8)
    assert (e.micro_batch, e.accumulation, e.exact) == (2, 8, True)
    assert e.reason.startswith("changed micro-batch")
    e4 = elastic_plan(16, 1, 3, 240, model_parallel=8, max_micro_per_rank=4)
    assert (e4.micro_batch, e4.accumulation) == (4, 4)


def test_elastic_indivisible_batch() -> None:
    # 16 nodes x 8 GPUs, pure data parallel: dp 128, micro 4, batch 1024 (accumulation 2).
    # Lose 1: 120 replicas; 1024 % 120 = 64: not exact on all. Keeping it exact idles
    # replicas down to 64 (largest divisor of 1024 <= 120): half the throughput.
    e = elastic_plan(16, 1, 4, 1024)
    assert e.exact and e.reason.startswith("idle replicas")
    assert e.data_parallel_used == 64 and e.throughput_fraction == pytest.approx(0.5)
    assert e.global_batch == 1024
    # closest on all 120 (micro <= 4): micro 1 x round(1024/120)=9 -> 1080 (off 56);
    # micro 2 x 4 -> 960 (off 64); micro 3 x 3 -> 1080; micro 4 x 2 -> 960: 1080
    assert e.closest_batch == 1080
    ei = elastic_plan(16, 1, 4, 1024, allow_inexact=True)
    assert not ei.exact and ei.reason.startswith("indivisible")
    assert ei.global_batch == 1080 and ei.data_parallel_used == 120
    assert ei.step_time_factor == pytest.approx((1080 / 1024) / (120 / 128))


@pytest.mark.parametrize("args, kw, name", [
    ((16, 16, 2, 480), {}, "lost"), ((16, 20, 2, 480), {}, "lost"),
    ((16, -1, 2, 480), {}, "lost"), ((16, 1, 0, 480), {}, "micro_batch"),
    ((16, 1, 2, 100), {"model_parallel": 8}, "global_batch"),
    ((16, 1, 2, 480), {"model_parallel": 7}, "model_parallel"),
    ((16, 1, 4, 512), {"max_micro_per_rank": 2}, "max_micro_per_rank"),
    ((16, 1, 2, 512), {"restart_s": -1.0}, "restart_s"),
    ((2, 1, 2, 512), {"horizon_s": 0.0}, "horizon_s")])
def test_elastic_validation(args: tuple, kw: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        elastic_plan(*args, **kw)


# --------------------------------------------------------------------------- spares


def test_spares_plan_by_hand() -> None:
    # 10 nodes x 8 GPUs, node MTBF 10 days: lam = 1/day; repair 1 day: mu = 1 in repair.
    s = spares_plan(10, 10 * DAY, DAY, 360.0, 3600.0)
    assert s.failures_per_day == pytest.approx(1.0) and s.mean_in_repair == pytest.approx(1.0)
    r0, r1 = s.table[0], s.table[1]
    # 0 spares: 1 x 3600 s x 80 GPUs / 3600 = 80 GPU-h/day
    assert r0["total_gpu_hours"] == pytest.approx(80.0)
    # 1 spare: P(free) = P(Poisson(1) = 0) = e^-1 = 0.367879;
    # (0.367879 x 360 + 0.632121 x 3600) x 80/3600 = 53.513 + idle 8 x 24 = 192
    assert r1["p_spare_free"] == pytest.approx(math.exp(-1))
    assert r1["failure_gpu_hours"] == pytest.approx(
        (math.exp(-1) * 360 + (1 - math.exp(-1)) * 3600) * 80 / 3600)
    assert r1["idle_gpu_hours"] == pytest.approx(192.0)
    assert s.best_spares == 0


def test_spares_optimum_grows_with_failure_rate() -> None:
    def best(mtbf_days: float) -> int:
        return spares_plan(128, mtbf_days * DAY, 4 * 3600.0, 120.0, 900.0).best_spares
    assert best(3650.0) == 0  # rare failures: a spare never pays its idle cost
    bs = [best(d) for d in (3650.0, 100.0, 42.0, 10.0, 2.0, 0.5)]
    assert bs == sorted(bs) and bs[-1] > bs[2] > 0
    # Kokolis-like 128 nodes, node MTBF 7.9 h x 128 (lam = 3.04/day), 4 h repair: one spare
    assert spares_plan(128, 128 * 7.9 * 3600, 4 * 3600.0, 300.0, 900.0).best_spares == 1


@pytest.mark.parametrize("kw, name", [(dict(nodes=0), "nodes"),
                                      (dict(node_mtbf_s=-1.0), "node_mtbf_s"),
                                      (dict(repair_s=-1.0), "repair_s"),
                                      (dict(swap_s=1000.0), "swap_s"),
                                      (dict(idle_cost_fraction=-0.1), "idle_cost_fraction")])
def test_spares_validation(kw: dict, name: str) -> None:
    args = dict(nodes=16, node_mtbf_s=30 * DAY, repair_s=3600.0, swap_s=120.0,
                restart_cost_s=900.0)
    args.update(kw)
    with pytest.raises(ValueError, match=name):
        spares_plan(**args)  # type: ignore[arg-type]
