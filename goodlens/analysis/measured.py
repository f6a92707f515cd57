"""Measured mode: a run's own checkpoint, restart and failure costs, and what another
checkpoint interval would have saved.

Why it exists: planners need inputs (checkpoint stall, restart cost, MTBF) that users rarely
know; a stored run already holds them. Everything here comes from the run's accounting
(:mod:`goodlens.analysis.accounting`, so the costs are exactly the seconds `goodlens report` shows)
and its events; the "what if" uses the interval planner's first-order model
(:mod:`goodlens.analysis.planner`). No SQL: it reads through the store's read API.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from goodlens.analysis.accounting import account_run
from goodlens.model.schema import EventKind
from goodlens.model.units import format_duration
from goodlens.storage.reader import RunReader


@dataclass
class Measured:
    """A run's measured costs and the interval it should have used."""

    run: str
    wall_clock_s: float
    uptime_s: float
    """Wall-clock minus start-up and restart time: the exposure during which failures could
    strike."""
    failures: int
    """Attempts that ended in a failure (explicit or inferred), not clean ends or preemptions."""
    mtbf_s: float | None
    mtbf_ci_s: tuple[float, float] | None
    """90% confidence interval of the MTBF (chi-square, Poisson failures)."""
    checkpoints: int
    checkpoint_stall_s: float | None
    """Mean blocking time of one checkpoint."""
    interval_s: float | None
    """Median time between consecutive checkpoint starts."""
    restore_s: float | None
    """Mean restore time per attempt that restored (the first attempt's included)."""
    restart_cost_s: float | None
    """Mean restart time (detection, queue, init, restore, warm-up: the ``restart`` bucket,
    which holds no first start-up) per failure; recomputed work (the model adds interval/2
    for it) and the partial step in flight (recompute too) are not in it."""
    gpus: float
    goodput: float
    best_interval_s: float | None = None
    goodput_at_best: float | None = None
    goodput_at_measured: float | None = None
    gain_points: float | None = None
    """Goodput points (percent of wall-clock) the best interval would have recovered."""
    gain_gpu_hours: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    def sentence(self) -> str:
        """The answer in words (:func:`interval_advice`)."""
        return interval_advice(self.as_dict())


def interval_advice(m: dict[str, Any]) -> str:
    """What another checkpoint interval would have bought, in words, from a
    :class:`Measured`'s fields (its ``as_dict()``); ``goodlens plan --db --run`` and the
    dashboard's checkpoints page both say it this way, durations as
    :func:`~goodlens.model.units.format_duration` writes them (``1m 07s``)."""
    best, cur, gain = m.get("best_interval_s"), m.get("interval_s"), m.get("gain_points")
    if best is None or cur is None or gain is None:
        return ("not enough failures or checkpoints in this run to say which interval "
                "would have been better")
    verb = "recovered" if gain > 0 else "changed"
    gh = m.get("gain_gpu_hours") or 0.0
    return (f"checkpointing every {format_duration(best)} instead of {format_duration(cur)} "
            f"would have {verb} {gain:.1f} points of goodput, "
            f"{gh:,.{0 if gh >= 10 else 2}f} GPU-hours")


def mtbf_interval(exposure_s: float, failures: int, level: float = 0.9
                  ) -> tuple[float, float] | None:
    """Two-sided ``level`` confidence interval of the MTBF from ``failures`` in
    ``exposure_s`` (time-truncated Poisson: 2T/chi2(1-a/2; 2n+2), 2T/chi2(a/2; 2n)), with the
    Wilson-Hilferty approximation of chi-square quantiles (accurate to ~1% for n >= 1)."""
    if failures < 1 or exposure_s <= 0:
        return None
    a = 1 - level

    def chi2(p: float, k: int) -> float:
        z = NormalDist().inv_cdf(p)
        return k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3
    return 2 * exposure_s / chi2(1 - a / 2, 2 * failures + 2), \
        2 * exposure_s / chi2(a / 2, 2 * failures)


def measure_run(source: RunReader, run_id: str, now: float | None = None) -> Measured:
    """Measure a stored run and plan its interval (see :class:`Measured`)."""
    from goodlens.analysis.planner import interval_plan

    acc = account_run(source, run_id, now=now)
    b = acc.breakdown()
    attempts = source.attempts(run_id)
    ev = source.events(run_id, kinds=[EventKind.CKPT_SAVE_START, EventKind.CKPT_RESTORE_START])
    failures = int(attempts.end_reason.isin(["failed", "unknown"]).sum())
    restart = b.buckets["restart"] or 0.0
    uptime = max(0.0, b.wall_clock_s - restart - (b.buckets["startup"] or 0.0))
    saves = ev[ev.kind == EventKind.CKPT_SAVE_START].drop_duplicates(["attempt", "step", "tier"])
    n_ckpt = len(saves)
    stall = (b.buckets["checkpoint_stall"] / n_ckpt) if n_ckpt else None
    gaps = np.diff(np.sort(saves.drop_duplicates(["attempt", "step"]).time.to_numpy()))
    interval = float(np.median(gaps)) if len(gaps) else None
    restores = len(ev[ev.kind == EventKind.CKPT_RESTORE_START].drop_duplicates(["attempt"]))
    restore = ((b.startup_parts["restore"] + b.restart_parts["restore"]) / restores) \
        if restores else None
    # per failure: the restart bucket (the first start-up is startup's, not a failure's);
    # steps redone are the model's interval/2 and are not counted twice
    restart_cost = (restart / failures) if failures else None
    gpus = acc.gpus_allocated
    m = Measured(run=run_id, wall_clock_s=b.wall_clock_s, uptime_s=uptime, failures=failures,
                 mtbf_s=(uptime / failures) if failures else None,
                 mtbf_ci_s=mtbf_interval(uptime, failures), checkpoints=n_ckpt,
                 checkpoint_stall_s=stall, interval_s=interval, restore_s=restore,
                 restart_cost_s=restart_cost, gpus=gpus, goodput=b.goodput)
    if m.mtbf_s and stall and interval and restart_cost is not None and stall < m.mtbf_s:
        plan = interval_plan(stall, m.mtbf_s, restart_cost_s=restart_cost)
        m.best_interval_s = plan.best_interval_s
        m.goodput_at_best = plan.expected_goodput(plan.best_interval_s)
        m.goodput_at_measured = plan.expected_goodput(interval)
        gain = m.goodput_at_best - m.goodput_at_measured
        m.gain_points = 100 * gain
        m.gain_gpu_hours = gain * b.wall_clock_s * gpus / 3600
    return m
