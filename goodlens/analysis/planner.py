"""Planners: the best checkpoint interval (one tier or two), elastic shrink, hot spares and
per-step fault tolerance.

Why it exists: users ask how often to checkpoint and whether to shrink, wait for a spare or
restart when nodes die, and want numbers rather than rules of thumb. These are first-order
analytic models, cheap enough for a CLI or a dashboard; :mod:`goodlens.analysis.runsim.montecarlo`
is the
slower ground truth they are checked against (tests/unit/test_planner.py). Seconds throughout;
"lost GPU-time" is in GPU-hours. Pure computation, no I/O.

Interval (Kokolis et al.'s ETTR form, as
:func:`goodlens.analysis.runsim.montecarlo.first_order_goodput`):
with work interval dt between checkpoints, stall C, run MTBF M (exponential failures) and
restart cost R (detection, queue, init, restore, warm-up: accounting's ``restart`` per
failure; the first start-up, ``startup``, is paid once whatever the interval), each failure
loses R + dt/2 and each interval pays C, so goodput(dt) = (1 - (R + dt/2)/M) / (1 + C/dt).
Setting the derivative to zero gives dt* = sqrt(C^2 + 2 C (M - R)) - C; :func:`interval_plan`
finds it numerically (golden section) and reports Young's and Daly's intervals beside it.

Elastic policies (:func:`elastic_plan` with ``mtbf_s``): restart, shrink, spares and per-step
fault tolerance side by side, each failure's lost wall-clock and GPU-hours and the goodput in
three views (wall-clock, GPU-time, samples). The per-step policy's first-order form and its
measured inputs (:func:`per_step_goodput`, :func:`measured_per_step`) live in
:mod:`goodlens.analysis.perstep_model`, shared with the simulator; they are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from goodlens.analysis.perstep_model import (
    MeasuredPerStep,
    measured_per_step,
    per_step_goodput,
    poisson_cdf,
)
from goodlens.analysis.runsim.montecarlo import daly_interval_s, young_interval_s
from goodlens.model.elastic import choose_batch
from goodlens.model.units import require_number

DAY = 86400.0
__all__ = ["ElasticPlan", "IntervalPlan", "MeasuredPerStep", "PolicyOutlook", "SparesPlan",
           "TieredPlan", "elastic_plan", "interval_plan", "measured_per_step",
           "per_step_goodput", "spares_plan", "tiered_goodput", "tiered_plan"]


def _num(fn: str, name: str, v: object, *, zero_ok: bool = False, integer: bool = False,
         upper: tuple[str, float] | None = None) -> None:
    require_number(f"{fn}: {name}", v, zero_ok=zero_ok, integer=integer, upper=upper)


def _golden_max(f: Callable[[float], float], lo: float, hi: float, iters: int = 200) -> float:
    """The maximiser of a unimodal ``f`` on [lo, hi], searched in log space (golden section)."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    x1, x2 = b - g * (b - a), a + g * (b - a)
    f1, f2 = f(math.exp(x1)), f(math.exp(x2))
    for _ in range(iters):
        if b - a < 1e-12:
            break
        if f1 < f2:
            a, x1, f1 = x1, x2, f2
            x2 = a + g * (b - a)
            f2 = f(math.exp(x2))
        else:
            b, x2, f2 = x2, x1, f1
            x1 = b - g * (b - a)
            f1 = f(math.exp(x1))
    return math.exp((a + b) / 2)


# --------------------------------------------------------------------------- interval


@dataclass(frozen=True)
class IntervalPlan:
    """Single-tier interval plan; ``expected_goodput``/``expected_waste`` at any interval."""

    checkpoint_cost_s: float
    mtbf_s: float
    restart_cost_s: float
    young_interval_s: float
    daly_interval_s: float
    best_interval_s: float
    """Numerical maximiser of :meth:`expected_goodput` (golden section)."""
    best_goodput: float
    table: list[dict[str, float]] = field(default_factory=list)
    """Rows ``interval_s``, ``goodput``, ``waste``, ``lost_s_per_day``."""

    def expected_goodput(self, interval_s: float) -> float:
        """(1 - (R + dt/2)/M) / (1 + C/dt): the productive share of wall-clock (negative
        means no progress, to first order)."""
        _num("expected_goodput", "interval_s", interval_s)
        num = 1 - (self.restart_cost_s + interval_s / 2) / self.mtbf_s
        return num / (1 + self.checkpoint_cost_s / interval_s)

    def expected_waste(self, interval_s: float) -> float:
        """1 - goodput: checkpoint stalls, restarts and recomputed work, as a share."""
        return 1 - self.expected_goodput(interval_s)


def interval_plan(checkpoint_cost_s: float, mtbf_s: float, restart_cost_s: float = 0.0,
                  intervals: Sequence[float] | None = None) -> IntervalPlan:
    """Young's, Daly's and the numerically best checkpoint interval for stall
    ``checkpoint_cost_s``, run MTBF ``mtbf_s`` and per-failure ``restart_cost_s``; ``table``
    covers ``intervals`` (default: 1/4x to 4x the best, plus Young and Daly)."""
    fn = "interval_plan"
    _num(fn, "mtbf_s", mtbf_s)
    _num(fn, "checkpoint_cost_s", checkpoint_cost_s, upper=("mtbf_s", mtbf_s))
    _num(fn, "restart_cost_s", restart_cost_s, zero_ok=True, upper=("mtbf_s", mtbf_s))
    c, m, r = float(checkpoint_cost_s), float(mtbf_s), float(restart_cost_s)
    young, daly = young_interval_s(c, m), daly_interval_s(c, m)
    proto = IntervalPlan(c, m, r, young, daly, math.nan, math.nan)
    best = _golden_max(proto.expected_goodput, c * 1e-4, 2 * (m - r))
    plan = IntervalPlan(c, m, r, young, daly, best, proto.expected_goodput(best))
    xs = (sorted({best * f for f in (0.25, 0.5, 1.0, 2.0, 4.0)} | {young, daly})
          if intervals is None else list(intervals))
    for x in xs:
        g = plan.expected_goodput(x)
        plan.table.append({"interval_s": x, "goodput": g, "waste": 1 - g,
                           "lost_s_per_day": (1 - g) * DAY})
    return plan


# --------------------------------------------------------------------------- tiered


@dataclass(frozen=True)
class TieredPlan:
    """Best (memory, durable) interval pair; the durable interval is ``ratio`` memory ones."""

    memory_interval_s: float
    durable_interval_s: float
    ratio: int
    goodput: float
    single_tier_goodput: float
    """Best goodput with durable checkpoints only (every failure restores from storage)."""
    single_tier_interval_s: float
    table: list[dict[str, float]] = field(default_factory=list)
    """Best memory interval and goodput for each ratio tried."""

    @property
    def gain(self) -> float:
        """Goodput points won by adding the memory tier."""
        return self.goodput - self.single_tier_goodput


def tiered_goodput(memory_interval_s: float, ratio: int, *, memory_stall_s: float,
                   durable_stall_s: float, memory_restore_s: float, durable_restore_s: float,
                   mtbf_s: float, memory_survivable: float, restart_cost_s: float = 0.0) -> float:
    """First-order goodput of memory saves every tm and durable saves every ratio x tm (a
    durable save replaces that memory save): overhead Cm/tm + (Cd - Cm)/td per unit work; a
    failure loses R + Rm + tm/2 when the memory copy survives it (share p), else
    R + Rd + td/2. goodput = (1 - lam E[loss]) / (1 + overhead). The durable copy's
    background write is taken as instant (it must be short against td)."""
    tm, td, lam, p = memory_interval_s, ratio * memory_interval_s, 1 / mtbf_s, memory_survivable
    loss = (restart_cost_s + p * (memory_restore_s + tm / 2)
            + (1 - p) * (durable_restore_s + td / 2))
    over = memory_stall_s / tm + (durable_stall_s - memory_stall_s) / td
    return (1 - lam * loss) / (1 + over)


def tiered_plan(memory_stall_s: float, durable_stall_s: float, mtbf_s: float,
                memory_survivable: float, memory_restore_s: float = 0.0,
                durable_restore_s: float = 0.0, restart_cost_s: float = 0.0,
                max_ratio: int = 1000) -> TieredPlan:
    """The best pair of intervals for a fast in-memory tier (stall ``memory_stall_s``,
    restore ``memory_restore_s``, survives a share ``memory_survivable`` of failures: the
    single-node ones, restored from a peer's copy) and a durable tier (``durable_stall_s``,
    ``durable_restore_s``, survives all). ``restart_cost_s`` excludes restore.

    Search: for each integer ratio j = td/tm in 1..``max_ratio`` the goodput has the
    single-tier form with C_j = Cm + (Cd - Cm)/j, lam_j = lam (p + (1-p) j) and fixed loss
    a = lam (R + p Rm + (1-p) Rd), so the best tm is closed-form,
    sqrt(C_j^2 + 2 C_j (1-a)/lam_j) - C_j; j is searched exhaustively."""
    fn = "tiered_plan"
    _num(fn, "mtbf_s", mtbf_s)
    _num(fn, "memory_stall_s", memory_stall_s, upper=("mtbf_s", mtbf_s))
    _num(fn, "durable_stall_s", durable_stall_s, upper=("mtbf_s", mtbf_s))
    if memory_stall_s > durable_stall_s:
        raise ValueError(f"{fn}: memory_stall_s must be <= durable_stall_s "
                         f"(got {memory_stall_s!r} > {durable_stall_s!r})")
    if (isinstance(memory_survivable, bool) or not isinstance(memory_survivable, int | float)
            or not 0 <= memory_survivable <= 1):
        raise ValueError(f"{fn}: memory_survivable must be in [0, 1] (got {memory_survivable!r})")
    for name, v in (("memory_restore_s", memory_restore_s),
                    ("durable_restore_s", durable_restore_s), ("restart_cost_s", restart_cost_s)):
        _num(fn, name, v, zero_ok=True, upper=("mtbf_s", mtbf_s))
    _num(fn, "max_ratio", max_ratio, integer=True)
    p, lam = float(memory_survivable), 1 / mtbf_s
    a = lam * (restart_cost_s + p * memory_restore_s + (1 - p) * durable_restore_s)
    if a >= 1:
        raise ValueError(f"{fn}: restart_cost_s plus restores must be < mtbf_s (got {a:.3g} "
                         "of the MTBF lost per failure)")
    kw = dict(memory_stall_s=memory_stall_s, durable_stall_s=durable_stall_s,
              memory_restore_s=memory_restore_s, durable_restore_s=durable_restore_s,
              mtbf_s=mtbf_s, memory_survivable=p, restart_cost_s=restart_cost_s)
    best: tuple[float, float, int] = (-math.inf, math.nan, 1)
    rows = []
    for j in range(1, max_ratio + 1):
        cj = memory_stall_s + (durable_stall_s - memory_stall_s) / j
        lj = lam * (p + (1 - p) * j)
        tm = math.sqrt(cj * cj + 2 * cj * (1 - a) / lj) - cj
        g = tiered_goodput(tm, j, **kw)
        rows.append({"ratio": j, "memory_interval_s": tm, "durable_interval_s": j * tm,
                     "goodput": g})
        if g > best[0]:
            best = (g, tm, j)
        elif j > 2 * best[2] + 10:  # unimodal in j in practice: stop well past the peak
            break
    single = interval_plan(durable_stall_s, mtbf_s, restart_cost_s + durable_restore_s)
    return TieredPlan(best[1], best[1] * best[2], best[2], best[0], single.best_goodput,
                      single.best_interval_s, rows)


# --------------------------------------------------------------------------- elastic


@dataclass(frozen=True)
class PolicyOutlook:
    """One elastic policy under repeated failures, to first order."""

    lost_s_per_failure: float
    """Wall-clock the whole job loses per failure (every GPU idle or redoing work)."""
    lost_gpu_hours_per_failure: float
    """GPU-hours lost per failure: the job's lost wall-clock x its GPUs, plus the capacity
    it ran without (shrunk, or a replica group out) x the GPUs missing."""
    goodput: float
    """Productive share of wall-clock."""
    gpu_time_goodput: float
    """Productive GPU-seconds over allocated ones (spares included)."""
    sample_goodput: float
    """Samples committed over what the full world commits in the same wall-clock."""


def _policies(nodes: int, lost: int, gpus_per_node: int, frac: float, mtbf_s: float,
              step_s: float, detect_s: float, interval_s: float, checkpoint_cost_s: float,
              restart_s: float, spare_swap_s: float, reconfig_s: float, repair_s: float,
              spares: int, replica_groups: int | None, min_replicas: int, quorum_s: float,
              group_restart_s: float, heal_s: float,
              spare_groups: int) -> dict[str, PolicyOutlook]:
    """Each policy's :class:`PolicyOutlook` (rules in :func:`elastic_plan`)."""
    gpus, over = nodes * gpus_per_node, checkpoint_cost_s / interval_s
    # every restart-based policy detects, then redoes half an interval and the partial step
    redo = detect_s + interval_s / 2 + step_s / 2

    def outlook(lost_s: float, capacity_s: float, spare_nodes: int) -> PolicyOutlook:
        # capacity_s: seconds of the full world's capacity missing per failure
        g = max(0.0, (1 - lost_s / mtbf_s) / (1 + over))  # losses past the MTBF: none
        sample = g * max(0.0, 1 - capacity_s / mtbf_s)
        return PolicyOutlook(lost_s, (lost_s + capacity_s) * gpus / 3600.0, g,
                             sample * nodes / (nodes + spare_nodes), sample)
    out = {"restart": outlook(redo + restart_s, 0.0, 0)}
    grow = reconfig_s if repair_s < mtbf_s else 0.0
    out["shrink"] = outlook(redo + reconfig_s + grow, (1 - frac) * min(repair_s, mtbf_s), 0)
    if spares >= lost:
        p = poisson_cdf(spares - lost, repair_s / mtbf_s * lost)
        out["spares"] = outlook(redo + p * spare_swap_s + (1 - p) * restart_s, 0.0, spares)
    if replica_groups:
        if nodes % replica_groups:
            raise ValueError(f"elastic_plan: replica_groups must divide nodes ({nodes} % "
                             f"{replica_groups} != 0)")
        g_nodes = nodes // replica_groups
        hit = min(replica_groups, -(-lost // g_nodes))
        ps = per_step_goodput(
            mtbf_s=mtbf_s, step_s=step_s, replica_groups=replica_groups, quorum_s=quorum_s,
            detect_s=detect_s, group_restart_s=group_restart_s, heal_s=heal_s,
            restart_loss_s=redo + restart_s, min_replicas=min_replicas,
            spare_groups=spare_groups, groups_hit=hit, checkpoint_overhead=over)
        short_gpu_h = ps["short_s"] * (1 - ps["restart_share"]) * hit * g_nodes \
            * gpus_per_node / 3600.0
        out["per_step"] = PolicyOutlook(
            ps["lost_s_per_failure"], ps["lost_s_per_failure"] * gpus / 3600.0 + short_gpu_h,
            ps["goodput"], ps["gpu_time_goodput"], ps["sample_goodput"])
    return out


@dataclass(frozen=True)
class ElasticPlan:
    """What to do when ``lost`` of ``nodes`` nodes die: shrink, wait for a spare, restart."""

    nodes: int
    lost: int
    data_parallel: int
    """Data-parallel replicas before the loss."""
    data_parallel_after: int
    """Replicas the surviving nodes can hold."""
    data_parallel_used: int
    """Replicas used after shrinking (fewer than possible when that keeps the batch exact)."""
    micro_batch: int
    accumulation: int
    global_batch: int
    """The global batch after shrinking (== the original when ``exact``)."""
    exact: bool
    reason: str
    """Why the batch could or could not be kept, starting ``same micro-batch``, ``changed
    micro-batch`` (not a multiple of it; the largest divisor within the micro-batch limit),
    ``idle replicas`` (batch indivisible by the survivors: some replicas idle to keep it
    exact) or ``indivisible`` (``allow_inexact``: all replicas, the closest batch)."""
    closest_batch: int
    """The closest global batch achievable on all surviving replicas."""
    throughput_fraction: float
    """Throughput after shrinking over the full world's (per-replica rate unchanged)."""
    step_time_factor: float
    """Step time after shrinking over before (for the batch in ``global_batch``)."""
    lost_gpu_hours: dict[str, float]
    """Expected lost GPU-hours over the horizon: ``shrink``, ``spare``, ``restart``."""
    recommendation: str
    policies: dict[str, PolicyOutlook] = field(default_factory=dict)
    """With ``mtbf_s``: ``restart``, ``shrink``, ``spares`` (with spare nodes) and
    ``per_step`` (with replica groups) under repeated failures of ``lost`` nodes."""
    best_policy: str | None = None
    """The policy of ``policies`` with the highest GPU-time goodput (what the GPUs bought)."""


def elastic_plan(nodes: int, lost: int, micro_batch: int, global_batch: int, *,
                 gpus_per_node: int = 8, model_parallel: int = 1,
                 max_micro_per_rank: int | None = None, restart_s: float = 900.0,
                 spare_swap_s: float = 300.0, reconfig_s: float = 120.0,
                 repair_s: float = 4 * 3600.0, horizon_s: float | None = None,
                 spare_available: bool = True, allow_inexact: bool = False,
                 mtbf_s: float | None = None, step_s: float = 10.0, detect_s: float = 60.0,
                 interval_s: float = 1800.0, checkpoint_cost_s: float = 0.0, spares: int = 0,
                 replica_groups: int | None = None, min_replicas: int = 1,
                 quorum_s: float = 5.0, group_restart_s: float = 300.0, heal_s: float = 2.0,
                 spare_groups: int = 0) -> ElasticPlan:
    """Shrink to ``nodes - lost`` (gradient accumulation keeping ``global_batch`` samples per
    step of ``micro_batch`` per replica; ``model_parallel`` ranks a replica, at most
    ``max_micro_per_rank`` samples a micro-batch, default ``micro_batch``), against waiting
    ``spare_swap_s`` for a hot spare and a full restart of ``restart_s``.

    Lost GPU-time over ``horizon_s`` (default ``repair_s``), charged against the full world's
    GPUs: restart and spare lose their downtime x all GPUs; shrink loses ``reconfig_s`` (plus
    another to grow back when the nodes return within the horizon) x all GPUs, and
    (1 - throughput fraction) x all GPUs for the rest of the repair. Work since the last
    checkpoint and detection are lost in every option and left out.

    With ``mtbf_s`` (the whole job's MTBF, each failure losing ``lost`` nodes), also
    ``policies``: restart, shrink, spares (with ``spares`` >= ``lost`` hot spare nodes) and
    per-step fault tolerance (with ``replica_groups``), to first order. Every restart-based
    policy loses detection (``detect_s``), half a checkpoint interval (``interval_s``) and
    half a step (``step_s``) of work, plus its relaunch: ``restart_s``; ``spare_swap_s``
    when a spare is free (P(Poisson(lost repair_s / mtbf_s) <= spares - lost)), else
    ``restart_s``; ``reconfig_s`` to shrink and again to grow back, the world running at the
    throughput fraction for ``repair_s``. The per-step policy is :func:`per_step_goodput`
    (the failed groups restart and heal while the others go on; ``spare_groups`` hot spare
    groups). goodput = (1 - lost/M) / (1 + C/dt) with C = ``checkpoint_cost_s`` and dt =
    ``interval_s``; samples lose the missing capacity's share; GPU-time divides by the
    allocated GPUs, spares included."""
    fn = "elastic_plan"
    for name, v in (("nodes", nodes), ("micro_batch", micro_batch),
                    ("global_batch", global_batch), ("gpus_per_node", gpus_per_node),
                    ("model_parallel", model_parallel)):
        _num(fn, name, v, integer=True)
    _num(fn, "lost", lost, integer=True, upper=("nodes", nodes))
    mmax = micro_batch if max_micro_per_rank is None else max_micro_per_rank
    _num(fn, "max_micro_per_rank", mmax, integer=True)
    if mmax < micro_batch:
        raise ValueError(f"{fn}: max_micro_per_rank must be >= micro_batch ({mmax} < "
                         f"{micro_batch})")
    for name, v in (("restart_s", restart_s), ("spare_swap_s", spare_swap_s),
                    ("reconfig_s", reconfig_s), ("repair_s", repair_s)):
        _num(fn, name, v, zero_ok=True)
    h = repair_s if horizon_s is None else horizon_s
    _num(fn, "horizon_s", h)
    ranks = nodes * gpus_per_node
    if ranks % model_parallel:
        raise ValueError(f"{fn}: model_parallel must divide nodes x gpus_per_node "
                         f"({ranks} % {model_parallel} != 0)")
    dp0 = ranks // model_parallel
    if global_batch % (dp0 * micro_batch):
        raise ValueError(f"{fn}: global_batch must be a multiple of data-parallel replicas x "
                         f"micro_batch ({global_batch} % ({dp0} x {micro_batch}) != 0)")
    dp1 = (nodes - lost) * gpus_per_node // model_parallel
    if dp1 < 1:
        raise ValueError(f"{fn}: lost must leave room for one model replica "
                         f"({nodes - lost} nodes x {gpus_per_node} < {model_parallel} ranks)")
    choice = choose_batch(global_batch, dp1, micro_batch, mmax, allow_inexact)
    dp_used, m, acc = choice.replicas_used, choice.micro_batch, choice.accumulation
    exact, reason, closest_batch = choice.exact, choice.reason, choice.closest_batch
    b1 = dp_used * m * acc
    frac = dp_used / dp0
    step_factor = (b1 / global_batch) / frac
    gpus = ranks
    down = {"restart": restart_s, "spare": spare_swap_s}
    grow = reconfig_s if repair_s <= h else 0.0
    shrink_run = max(0.0, min(repair_s, h) - reconfig_s)
    lost_h = {k: min(v, h) * gpus / 3600.0 for k, v in down.items()}
    lost_h["shrink"] = (min(reconfig_s + grow, h) + (1 - frac) * shrink_run) * gpus / 3600.0
    if not spare_available:
        lost_h.pop("spare")
    rec = min(lost_h, key=lambda k: (lost_h[k], ["spare", "restart", "shrink"].index(k)))
    policies: dict[str, PolicyOutlook] = {}
    best = None
    if mtbf_s is not None:
        _num(fn, "mtbf_s", mtbf_s)
        _num(fn, "step_s", step_s)
        _num(fn, "interval_s", interval_s)
        for name, v in (("detect_s", detect_s), ("checkpoint_cost_s", checkpoint_cost_s),
                        ("quorum_s", quorum_s), ("group_restart_s", group_restart_s),
                        ("heal_s", heal_s)):
            _num(fn, name, v, zero_ok=True)
        _num(fn, "spares", spares, zero_ok=True, integer=True)
        _num(fn, "spare_groups", spare_groups, zero_ok=True, integer=True)
        if replica_groups is not None:
            _num(fn, "replica_groups", replica_groups, integer=True)
        policies = _policies(nodes, lost, gpus_per_node, frac, mtbf_s, step_s, detect_s,
                             interval_s, checkpoint_cost_s, restart_s, spare_swap_s,
                             reconfig_s, repair_s, spares if spare_available else 0,
                             replica_groups, min_replicas, quorum_s, group_restart_s, heal_s,
                             spare_groups)
        best = max(policies, key=lambda k: policies[k].gpu_time_goodput)
    return ElasticPlan(nodes, lost, dp0, dp1, dp_used, m, acc, b1, exact, reason,
                       closest_batch, frac, step_factor, lost_h, rec, policies, best)


# --------------------------------------------------------------------------- spares


@dataclass(frozen=True)
class SparesPlan:
    """Hot-spare count minimising expected lost GPU-hours per day (``table`` per count)."""

    best_spares: int
    best_lost_gpu_hours_per_day: float
    failures_per_day: float
    mean_in_repair: float
    """Expected nodes in repair (Poisson mean lam x repair_s)."""
    table: list[dict[str, float]]
    """Rows: ``spares``, ``p_spare_free``, ``failure_gpu_hours`` (per day),
    ``idle_gpu_hours`` (per day), ``total_gpu_hours`` (per day)."""


def spares_plan(nodes: int, node_mtbf_s: float, repair_s: float, swap_s: float,
                restart_cost_s: float, *, gpus_per_node: int = 8, idle_cost_fraction: float = 1.0,
                max_spares: int | None = None) -> SparesPlan:
    """How many hot spares minimise expected lost GPU-hours per day.

    Model: failures arrive at lam = nodes / node_mtbf_s (spares do not fail while idle); each
    failed node is in repair ``repair_s``, independently (an M/G/infinity repair queue), so
    the count in repair is Poisson(lam x repair_s) and, by PASTA, a failure finds a free
    spare with probability P(Poisson(lam r) <= c - 1). A failure then costs ``swap_s``
    instead of ``restart_cost_s`` (both x all job GPUs). Each spare idles the whole day at
    ``idle_cost_fraction`` of its GPUs (1: reserved and unused). Lost per day =
    lam DAY (P swap + (1-P) restart) nodes gpn / 3600 + c gpn 24 idle_cost_fraction."""
    fn = "spares_plan"
    _num(fn, "nodes", nodes, integer=True)
    _num(fn, "gpus_per_node", gpus_per_node, integer=True)
    _num(fn, "node_mtbf_s", node_mtbf_s)
    _num(fn, "repair_s", repair_s, zero_ok=True)
    _num(fn, "restart_cost_s", restart_cost_s, zero_ok=True)
    _num(fn, "swap_s", swap_s, zero_ok=True)
    if swap_s > restart_cost_s:
        raise ValueError(f"{fn}: swap_s must be <= restart_cost_s (got {swap_s!r} > "
                         f"{restart_cost_s!r}): a spare that is slower than a restart is moot")
    _num(fn, "idle_cost_fraction", idle_cost_fraction, zero_ok=True)
    lam = nodes / node_mtbf_s
    mu = lam * repair_s
    cmax = (max_spares if max_spares is not None
            else min(nodes, math.ceil(mu + 6 * math.sqrt(mu) + 3)))
    _num(fn, "max_spares", cmax, zero_ok=True, integer=True)
    fail_per_day = lam * DAY
    gpus = nodes * gpus_per_node
    rows: list[dict[str, float]] = []
    cdf, term = 0.0, math.exp(-mu)  # P(Poisson(mu) <= c - 1), built up term by term
    for c in range(cmax + 1):
        if c > 0:
            cdf += term
            term *= mu / c
        p = min(1.0, cdf)
        fail_h = fail_per_day * (p * swap_s + (1 - p) * restart_cost_s) * gpus / 3600.0
        idle_h = c * gpus_per_node * 24.0 * idle_cost_fraction
        rows.append({"spares": c, "p_spare_free": p, "failure_gpu_hours": fail_h,
                     "idle_gpu_hours": idle_h, "total_gpu_hours": fail_h + idle_h})
    best = min(rows, key=lambda r: (r["total_gpu_hours"], r["spares"]))
    return SparesPlan(int(best["spares"]), best["total_gpu_hours"], fail_per_day, mu, rows)
