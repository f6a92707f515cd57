"""What-if on a real run: calibrate the simulator to what a stored run measured, then change
one policy (interval, asynchronous saves, spares, elastic, evictions) and compare.

The planner answers "what interval?" with a formula; users also ask about policies no
formula covers well (spares against shrink, evicting stragglers), and want the answer in
the same buckets as their report. A calibrated :class:`~goodlens.analysis.runsim.config.SimConfig`
reproduces the run's scale, step time, failure rate, restart costs and checkpoint costs;
Monte Carlo trials of it with and without the change (common random numbers: the same
seeds, so the difference is the policy's) give the change's effect. Every calibrated
field records whether it was measured in the run or assumed, so a user can see how far to
trust the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from goodlens.analysis.accounting import BUCKETS, account_run
from goodlens.analysis.checkpoints import checkpoint_table
from goodlens.analysis.findings import stored_findings
from goodlens.analysis.measured import measure_run
from goodlens.analysis.runsim.config import DAY, SimConfig
from goodlens.analysis.runsim.montecarlo import monte_carlo
from goodlens.model.jsonable import is_missing
from goodlens.model.schema import EventKind
from goodlens.storage.reader import RunReader

#: The policies the dashboard exposes (any SimConfig field can be changed from Python).
WHATIF_FIELDS = ("interval_s", "ckpt_mode", "spares", "elastic", "evict_stragglers")


@dataclass
class Calibration:
    """A simulator config fitted to a stored run, and where each value came from."""

    run: str
    config: SimConfig
    actual: dict[str, Any]
    """The run's measured breakdown (``goodlens report --json`` form)."""
    provenance: dict[str, str] = field(default_factory=dict)
    """Field -> ``measured: ...`` or ``assumed: ...`` (why that value)."""


def calibrate(source: RunReader, run_id: str, now: float | None = None,
              findings: list[dict[str, Any]] | None = None) -> Calibration:
    """Fit a :class:`SimConfig` to run ``run_id`` of ``source`` (the store's read API).

    Straggler episodes come from ``findings`` (dicts of a Finding's fields), by default the
    ones the live collector stored; pass a batch pass's (``goodlens.analysis.findings.detect_run``)
    for a run no live detector saw."""
    acc = account_run(source, run_id, now=now)
    b = acc.breakdown()
    if not b.wall_clock_s > 0:
        raise ValueError(f"run {run_id} has no wall-clock yet: nothing to calibrate against")
    m = measure_run(source, run_id, now=now)
    info = source.run(run_id) or {}
    prov: dict[str, str] = {}
    kw: dict[str, Any] = {"duration_s": b.wall_clock_s}
    prov["duration_s"] = "measured: the run's wall-clock"

    sums = source.step_summaries(run_id)
    w = info.get("world_size")
    world = (None if is_missing(w) else int(w)) or (int(sums.ranks.max()) if len(sums) else 1)
    per_node, how = _ranks_per_node(source, run_id, world)
    kw["gpus_per_node"] = per_node
    kw["nodes"] = max(1, math.ceil(world / per_node))
    prov["nodes"] = f"{how}: {_count(world, 'rank')}, {per_node} per node"
    prov["gpus_per_node"] = f"{how}: ranks per host"
    if len(sums):
        kw["step_s"] = float(np.nanmedian(sums.duration_median))
        prov["step_s"] = "measured: median step time"
        frac = (sums.compute_median / sums.duration_median).to_numpy(dtype=float)
        if np.isfinite(frac).any():
            kw["compute_fraction"] = float(np.clip(np.nanmedian(frac), 0.05, 1.0))
            prov["compute_fraction"] = "measured: median compute / step time"
    attempts = max(len(acc.attempt_spans), 1)
    rp = b.restart_parts
    failures = m.failures
    if m.mtbf_s:
        kw["node_mtbf_s"] = m.mtbf_s * kw["nodes"]
        prov["node_mtbf_s"] = (f"measured: {_count(failures, 'failure')} in "
                               f"{m.uptime_s / 3600:.1f} h of uptime, times "
                               f"{_count(kw['nodes'], 'node')}")
    else:
        # no failure seen: the 90% lower bound of the MTBF after 0 failures is T / 2.3
        kw["node_mtbf_s"] = max(m.uptime_s / 2.3, 3600.0) * kw["nodes"] if m.uptime_s else \
            30 * DAY
        prov["node_mtbf_s"] = "assumed: no failure seen, the 90% lower bound of the MTBF"
    per_failure = max(failures, 1)
    if failures:
        kw["detect_crash_s"] = kw["detect_hang_s"] = rp["detection"] / per_failure
        kw["queue_s"] = max(rp["queue"] / per_failure, 0.0)
        prov["detect_crash_s"] = prov["queue_s"] = "measured: mean per failure"
        # a hot spare replaces the queue wait: never slower than the queue this run saw
        kw["spare_swap_s"] = min(SimConfig.spare_swap_s, kw["queue_s"])
        prov["spare_swap_s"] = ("assumed: the simulator's swap time, or the measured queue "
                                "if shorter")
    up = b.startup_parts  # the first attempt's start-up, then every restart's
    kw["init_s"] = (up["init"] + rp["init"]) / attempts
    kw["warmup_s"] = (up["warmup"] + rp["warmup"]) / attempts
    prov["init_s"] = prov["warmup_s"] = "measured: mean per attempt"
    if m.restore_s is not None:
        kw["restore_s"] = m.restore_s
        prov["restore_s"] = "measured: mean per restore"

    ck = checkpoint_table(source.events(run_id, kinds=[EventKind.CKPT_SAVE_START,
                                                       EventKind.CKPT_SAVE_BLOCKING_END,
                                                       EventKind.CKPT_SAVE_DURABLE_END]))
    if m.interval_s:
        kw["interval_s"] = m.interval_s
        prov["interval_s"] = "measured: median time between saves"
    else:
        kw["interval_s"] = b.wall_clock_s * 10
        prov["interval_s"] = "assumed: no checkpoint in the run (an interval past its end)"
    if len(ck):
        stall = float(np.nanmedian(ck.stall_s)) if ck.stall_s.notna().any() else 0.0
        write = float(np.nanmedian(ck.write_s)) if ck.write_s.notna().any() else stall
        if write > 1.5 * stall:
            kw.update(ckpt_mode="async", snapshot_s=stall, write_s=write)
            prov["ckpt_mode"] = "measured: saves block for less than they take to write"
        else:
            kw.update(ckpt_mode="sync", write_s=stall, snapshot_s=min(stall, 5.0))
            prov["ckpt_mode"] = "measured: saves block until written"
        prov["write_s"] = prov["snapshot_s"] = "measured: median per checkpoint"

    if findings is None:
        findings = stored_findings(source, run_id)
    kw.update(_stragglers(findings, b.wall_clock_s, kw["nodes"], prov))
    preempted = int(source.attempts(run_id).end_reason.eq("preempted").sum())
    kw["planned_per_day"] = preempted / (b.wall_clock_s / DAY)
    prov["planned_per_day"] = f"measured: {_count(preempted, 'preemption')}"
    cfg = SimConfig(**{k: v for k, v in kw.items() if k in {f.name for f in fields(SimConfig)}})
    for f in fields(SimConfig):
        prov.setdefault(f.name, "assumed: simulator default")
    return Calibration(run=run_id, config=cfg, actual=b.as_dict(), provenance=prov)


def what_if(cal: Calibration, changes: dict[str, Any], trials: int = 40,
            seed: int = 0) -> dict[str, Any]:
    """Simulate the calibrated run as it was and with ``changes`` (SimConfig fields), with
    the same seeds: ``actual`` (measured), ``baseline`` and ``changed`` (Monte Carlo mean
    goodput, 5th/95th percentile and seconds per bucket) and ``delta_points`` (goodput
    points the change adds)."""
    unknown = set(changes) - {f.name for f in fields(SimConfig)}
    if unknown:
        raise ValueError(f"what-if: no simulator field {', '.join(sorted(unknown))}")
    changed_cfg = replace(cal.config, **changes)
    base = monte_carlo(cal.config, trials, seed)
    new = monte_carlo(changed_cfg, trials, seed)

    def view(mc: dict[str, Any]) -> dict[str, Any]:
        return {"goodput": mc["goodput_mean"], "goodput_p5": mc["goodput_p5"],
                "goodput_p95": mc["goodput_p95"],
                "buckets": {k: mc["buckets_mean"][k] for k in BUCKETS},
                "wall_clock_s": mc["wall_clock_s"]}
    return {"run": cal.run, "trials": trials, "changes": changes,
            "actual": {"goodput": cal.actual["goodput"],
                       "buckets": {k: cal.actual["buckets"][k] or 0.0 for k in BUCKETS},
                       "wall_clock_s": cal.actual["wall_clock_s"]},
            "baseline": view(base), "changed": view(new),
            "delta_points": 100 * (new["goodput_mean"] - base["goodput_mean"])}


def _count(n: int, thing: str) -> str:
    """``1 failure``, ``2 failures``: a count and what it counts, singular for one."""
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def _ranks_per_node(source: RunReader, run_id: str, world: int) -> tuple[int, str]:
    hosts_of = getattr(source, "rank_hosts", None)
    if hosts_of is not None:
        hosts = hosts_of(run_id)
        if len(hosts) and hosts.host.notna().all():
            per = int(hosts.groupby("host").size().median())
            return max(per, 1), "measured"
    return min(8, max(world, 1)), "assumed: 8 ranks per node"


def _stragglers(findings: list[dict[str, Any]], wall_s: float, nodes: int,
                prov: dict[str, str]) -> dict[str, float]:
    if not findings:
        prov["straggler_per_node_day"] = "measured: no straggler flagged"
        return {"straggler_per_node_day": 0.0}
    # a host or switch finding is one episode of one or more nodes; a subject still slow
    # after a restart is found again in the next attempt: one episode
    episodes = len({(f.get("subject_kind"), str(f.get("subject_id"))) for f in findings})
    out = {"straggler_per_node_day": episodes / nodes / (wall_s / DAY)}
    prov["straggler_per_node_day"] = f"measured: {_count(episodes, 'flagged episode')}"
    slow = [float(f["slowdown"]) for f in findings
            if isinstance(f.get("slowdown"), int | float) and f["slowdown"] > 0]
    if slow:
        out["straggler_slowdown_median"] = float(np.median(slow))
        prov["straggler_slowdown_median"] = "measured: median flagged slowdown"
    return out
