"""Run simulator (breakdown only): where a large training run's wall-clock would go, by bucket.

Why it exists: users plan a checkpoint interval, a hot-spare count or an elastic policy before
the next run ("what if"), and the rest of goodlens needs runs whose true breakdown is known.
:func:`simulate` runs one trial (the rules, the same as ``goodlens.analysis.accounting``'s, are in
:mod:`goodlens.analysis.runsim.trial`), :func:`monte_carlo` many, :func:`sweep` one parameter over
values;
:func:`first_order_goodput` (with :func:`first_order_per_step` for the per-step policy's
sample and GPU-time views), :func:`young_interval_s` and :func:`daly_interval_s` are the
analytic references the Monte Carlo is checked against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

import numpy as np
import pandas as pd

from goodlens.analysis.accounting import BUCKETS, RESTART_PARTS, STARTUP_PARTS
from goodlens.analysis.perstep_model import per_step_goodput
from goodlens.analysis.runsim.config import DAY, FAILURE_CAUSES, SimConfig, SimResult
from goodlens.analysis.runsim.episodes import place_stream
from goodlens.analysis.runsim.trial import prepare, run_trial

__all__ = ["DAY", "SimConfig", "SimResult", "daly_interval_s", "first_order_goodput",
           "first_order_per_step", "monte_carlo", "simulate", "sweep", "young_interval_s"]


def simulate(config: SimConfig, seed: int = 0) -> SimResult:
    """One trial of ``config``: the run's ground-truth breakdown (same seed, same result; the
    episodes placed as the seed's trace places them)."""
    return run_trial(config, prepare(config), np.random.default_rng(seed),
                     place=place_stream(seed, config.nodes)[0])


def trial_rng(seed: int, index: int) -> np.random.Generator:
    """The random stream of trial ``index`` of a Monte Carlo with ``seed`` (seeds spawned
    from it): :func:`monte_carlo`'s, and the one ``goodlens simulate --out`` writes as a
    trace, so the trace is the trial whose numbers are printed."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))


def monte_carlo(config: SimConfig, trials: int = 100, seed: int = 0,
                first: SimResult | None = None) -> dict[str, Any]:
    """``trials`` independent trials (seeds spawned from ``seed``): mean and 5th/95th
    percentile goodput, mean GPU-time and sample goodput, mean seconds per bucket, startup
    part, restart part and other part, mean counts.
    ``first`` stands for the first trial when given (``goodlens simulate --out``: that trial
    as its trace has it, :meth:`~goodlens.analysis.runsim.tracegen.TraceResult.as_result`)."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1 (got {trials})")
    p = prepare(config)
    rs = [first if i == 0 and first is not None else run_trial(config, p, trial_rng(seed, i))
          for i in range(trials)]
    g = np.array([r.goodput for r in rs])

    def mean(get: Any, keys: Sequence[str]) -> dict[str, float]:
        return {k: float(np.mean([get(r).get(k, 0.0) for r in rs])) for k in keys}
    return {"trials": trials, "wall_clock_s": float(np.mean([r.wall_clock_s for r in rs])),
            "goodput_mean": float(g.mean()), "goodput_p5": float(np.percentile(g, 5)),
            "goodput_p95": float(np.percentile(g, 95)),
            "gpu_time_goodput_mean": float(np.mean([r.gpu_time_goodput for r in rs])),
            "sample_goodput_mean": float(np.mean([
                r.goodput if r.sample_goodput is None else r.sample_goodput for r in rs])),
            "buckets_mean": mean(lambda r: r.buckets, BUCKETS),
            "startup_parts_mean": mean(lambda r: r.startup_parts, STARTUP_PARTS),
            "restart_parts_mean": mean(lambda r: r.restart_parts, RESTART_PARTS),
            "other_parts_mean": mean(lambda r: r.other_parts, ["quorum"]),
            "counts_mean": mean(lambda r: r.counts, list(rs[0].counts))}


def sweep(config: SimConfig, field: str, values: Sequence[Any], trials: int = 100,
          seed: int = 0) -> pd.DataFrame:
    """One Monte Carlo per value of ``field`` (same seeds for every value: common random
    numbers, so differences are the policy's): value, goodput mean/p5/p95, GPU-time goodput
    and each bucket's mean share of wall-clock (``<bucket>_share``)."""
    if field not in {f.name for f in fields(SimConfig)}:
        raise ValueError(f"sweep: SimConfig has no field {field!r}")
    rows = []
    for v in values:
        cfg = replace(config, **{field: v})
        mc = monte_carlo(cfg, trials, seed)
        row = {"value": v, **{k: mc[k] for k in ("goodput_mean", "goodput_p5", "goodput_p95",
                                                 "gpu_time_goodput_mean")}}
        row.update({f"{b}_share": mc["buckets_mean"][b] / cfg.duration_s for b in BUCKETS})
        rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["field"] = field
    return df


def young_interval_s(c: float, m: float) -> float:
    """Young (1974): the checkpoint interval sqrt(2 C M) for stall C and run MTBF M."""
    if not (c >= 0 and m > 0):
        raise ValueError(f"need C >= 0 and M > 0 (got C={c!r}, M={m!r})")
    return math.sqrt(2 * c * m)


def daly_interval_s(c: float, m: float) -> float:
    """Daly (2006) higher-order optimum: sqrt(2CM) (1 + sqrt(C/2M)/3 + C/(18M)) - C, and M
    when C >= 2M."""
    young_interval_s(c, m)
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def first_order_goodput(config: SimConfig) -> float:
    """Kokolis et al.'s ETTR form with these costs, for exponential failures and a fixed
    synchronous checkpoint interval: (1 - lam L_f - lam_p L_p - startup/duration) /
    (1 + C / dt) x step/(step + w0), with lam = nodes/node MTBF, L_f = E[detection] + queue +
    init + restore + warm-up + dt/2 + a half step, L_p the same for planned interruptions
    (a save instead of detection and recompute), C the stall per save, dt the interval in
    wall-clock and w0 the noise straggler wait. Ignores stragglers, elastic policies and
    tiers (meaningful for ``sync``; ``async`` uses the snapshot as C). The ``per_step``
    policy has its own form (:func:`first_order_per_step`)."""
    if config.elastic == "per_step":
        return first_order_per_step(config)["goodput"]
    p = prepare(config)
    c = config
    d = c.step_s + p.w0
    dt = p.kd * d
    detect = _mean_detection(c)
    restart = c.queue_s + c.init_s + c.restore_s + c.warmup_s
    lost_f = detect + restart + dt / 2 + d / 2
    lost_p = c.write_s + restart
    lam, lam_p = c.nodes / c.node_mtbf_s, c.planned_per_day / DAY
    num = 1 - lam * lost_f - lam_p * lost_p - (c.init_s + c.warmup_s) / c.duration_s
    return num / (1 + p.cdd / dt) * c.step_s / d


def _mean_detection(c: SimConfig) -> float:
    """E[detection] of a failure: the hang share of the cause table at the hang timeout."""
    shares = np.array([n for _, n, _, _ in FAILURE_CAUSES], dtype=float)
    phang = float(np.dot(shares / shares.sum(), prepare(c).hang))
    return phang * c.detect_hang_s + (1 - phang) * c.detect_crash_s


def first_order_per_step(config: SimConfig) -> dict[str, float]:
    """First-order goodput of the ``per_step`` policy (rules in
    :mod:`goodlens.analysis.runsim.trial`) in three views, ``goodput``, ``sample_goodput`` and
    ``gpu_time_goodput``: :func:`goodlens.analysis.perstep_model.per_step_goodput` (the model
    is written out there) with this config's costs. The job's MTBF is node MTBF / nodes, the
    detection the cause table's mean, the step its noise straggler wait longer; a job
    restart (below ``min_replicas``) loses what :func:`first_order_goodput` charges a
    failure, and the first start-up is paid once. Ignores stragglers, as the restart form
    does, and the outages a job restart ends early."""
    c = config
    if c.elastic != "per_step":
        raise ValueError(f"first_order_per_step: elastic must be 'per_step' (got "
                         f"{c.elastic!r})")
    p = prepare(c)
    d = c.step_s + p.w0
    dt = p.kd * d
    detect = _mean_detection(c)
    restart = detect + c.queue_s + c.init_s + c.restore_s + c.warmup_s + dt / 2 + d / 2
    return per_step_goodput(
        mtbf_s=c.node_mtbf_s / c.nodes, step_s=c.step_s, wait_s=p.w0,
        replica_groups=c.replica_groups, min_replicas=c.min_replicas, quorum_s=c.quorum_s,
        detect_s=detect, group_restart_s=c.group_restart_s, heal_s=c.heal_s,
        restart_loss_s=restart, spare_groups=c.spares, checkpoint_overhead=p.cdd / dt,
        startup_share=(c.init_s + c.warmup_s) / c.duration_s)
