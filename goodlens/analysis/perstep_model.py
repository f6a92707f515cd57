"""Per-step fault tolerance (torchft) on paper and as a run measured it: the policy's
first-order goodput (:func:`per_step_goodput`) and its costs read from a torchft run's report
(:func:`measured_per_step`).

Why it exists: two callers need the same formula, the planner's policy comparison
(:func:`goodlens.analysis.planner.elastic_plan`) and the run simulator's analytic reference
(:func:`goodlens.analysis.runsim.montecarlo.first_order_per_step`), and the planner already
builds on the simulator, so the formula lives in this leaf module that imports neither. The
measured side sits beside it because it yields exactly this formula's inputs (heal, quorum,
detection, group restart, MTBF). Seconds throughout; pure computation, no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from goodlens.model.units import require_number

__all__ = ["MeasuredPerStep", "measured_per_step", "per_step_goodput", "poisson_cdf"]


def _num(fn: str, name: str, v: object, *, zero_ok: bool = False, integer: bool = False,
         upper: tuple[str, float] | None = None) -> None:
    require_number(f"{fn}: {name}", v, zero_ok=zero_ok, integer=integer, upper=upper)


def poisson_cdf(k: int, mu: float) -> float:
    """P(Poisson(mu) <= k) (0 for k < 0)."""
    return min(1.0, sum(math.exp(-mu) * mu ** i / math.factorial(i) for i in range(k + 1)))


def per_step_goodput(*, mtbf_s: float, step_s: float, replica_groups: int, quorum_s: float,
                     detect_s: float, group_restart_s: float, heal_s: float,
                     restart_loss_s: float, min_replicas: int = 1, spare_groups: int = 0,
                     groups_hit: int = 1, checkpoint_overhead: float = 0.0,
                     wait_s: float = 0.0, startup_share: float = 0.0) -> dict[str, float]:
    """First-order goodput of per-step fault tolerance (torchft): R = ``replica_groups``
    groups, each with its own local batch, a failure taking out ``groups_hit`` of them.

    A group up fails at lam/R (lam = 1/``mtbf_s``, the full job's rate) and is out for
    out = detection + restart + heal + d/2 + q: restart is ``group_restart_s`` unless a
    spare group is free (probability P(Poisson(lam group_restart_s) <= spares - hit): each
    covered failure keeps a spare busy that long), then the step in flight before its
    admission (d = ``step_s`` + ``wait_s``, half on average) and the admission's quorum
    q. Groups are out independently, each with probability pi = rho / (1 + rho), rho =
    lam out / R, so failures strike at lam (1 - pi), and a share p_fb of them leave fewer
    than ``min_replicas`` groups up and restart the job (each state of the Binomial(R, pi)
    count out weighted by the groups up in it), losing ``restart_loss_s``.

    A failure the job goes on through costs it the discarded step d and two quorum
    changes (drop, admission). goodput = (1 - lam (1 - pi) ((1 - p_fb) (d + 2q) + p_fb
    L_restart) - ``startup_share``) / (1 + ``checkpoint_overhead``) x step/d. The job runs
    short from the drop's quorum to the admission, short = out - d/2 - 2q, with
    ``groups_hit``/R of the samples missing: sample goodput = goodput (1 - lam (1 - pi)
    (1 - p_fb) short groups_hit / R); GPU-time goodput = sample goodput x R / (R + spares).
    Returns those three, ``failures_per_s``, ``restart_share`` (p_fb), ``lost_s_per_failure``
    (the job's, on average), ``short_s``, ``p_spare_free``."""
    fn = "per_step_goodput"
    _num(fn, "mtbf_s", mtbf_s)
    _num(fn, "step_s", step_s)
    _num(fn, "replica_groups", replica_groups, integer=True)
    if replica_groups < 2:
        raise ValueError(f"{fn}: replica_groups must be >= 2 (got {replica_groups!r})")
    _num(fn, "min_replicas", min_replicas, integer=True,
         upper=("replica_groups", replica_groups))
    _num(fn, "groups_hit", groups_hit, integer=True,
         upper=("replica_groups + 1", replica_groups + 1))
    _num(fn, "spare_groups", spare_groups, zero_ok=True, integer=True)
    for name, v in (("quorum_s", quorum_s), ("detect_s", detect_s),
                    ("group_restart_s", group_restart_s), ("heal_s", heal_s),
                    ("restart_loss_s", restart_loss_s), ("wait_s", wait_s),
                    ("checkpoint_overhead", checkpoint_overhead),
                    ("startup_share", startup_share)):
        _num(fn, name, v, zero_ok=True)
    R, q, kg = replica_groups, quorum_s, groups_hit
    d = step_s + wait_s
    lam = 1 / mtbf_s
    p_spare = poisson_cdf(spare_groups - kg, lam * group_restart_s)
    out = detect_s + (1 - p_spare) * group_restart_s + heal_s + d / 2 + q
    rho = lam * out / R
    pi = rho / (1 + rho)
    # groups out ~ Binomial(R, pi); a failure in state k comes from the R - k groups up
    pk = [math.comb(R, k) * pi ** k * (1 - pi) ** (R - k) for k in range(R + 1)]
    up = sum(pk[k] * (R - k) for k in range(R))
    p_fb = sum(pk[k] * (R - k) for k in range(max(0, R - min_replicas - kg + 1), R)) / up
    lam *= 1 - pi
    lost = (1 - p_fb) * (d + 2 * q) + p_fb * restart_loss_s
    # first order: a failure rate at which the losses outgrow the time makes no progress
    # (0), never a negative goodput
    goodput = max(0.0, (1 - lam * lost - startup_share) / (1 + checkpoint_overhead)
                  * step_s / d)
    short = max(0.0, out - d / 2 - 2 * q)
    sample = goodput * max(0.0, 1 - lam * (1 - p_fb) * short * kg / R)
    return {"goodput": goodput, "sample_goodput": sample,
            "gpu_time_goodput": sample * R / (R + spare_groups), "failures_per_s": lam,
            "restart_share": p_fb, "lost_s_per_failure": lost, "short_s": short,
            "p_spare_free": p_spare}

# --------------------------------------------------------------------------- measured


@dataclass(frozen=True)
class MeasuredPerStep:
    """Per-step fault tolerance's costs as a torchft run measured them (None: not known)."""

    heals: int
    heal_s: float | None
    """Median seconds of a heal."""
    heal_bandwidth_Bps: float | None
    """Bytes over seconds of the heals that say both (bytes/s)."""
    quorum_changes: int
    quorum_s: float | None
    """Blocked quorum seconds per membership change (the run's total over its changes)."""
    failures: int
    """Recoveries: a group's restarts (each a failure the job went on through)."""
    failures_per_hour: float | None
    mtbf_s: float | None
    """Wall-clock over failures."""
    detect_s: float | None
    """Median failure to detection, over the recoveries that say both (without a recorded
    failure instant, from the group's last step's end: the step in flight and detection)."""
    group_restart_s: float | None
    """Median detection to the heal's start (restart and init), where both are known."""


def _med(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def measured_per_step(ft: Mapping[str, Any], wall_clock_s: float | None = None
                      ) -> MeasuredPerStep:
    """A torchft run's per-step costs from its report's ``fault_tolerance`` section: ``heals``
    (``seconds``, ``bytes``, or ``start``/``end``), ``recoveries`` (epoch seconds
    ``failure``, ``detected``, ``restarted``, ``heal_start``, ...; missing ones are None),
    ``quorum_s`` (total blocked seconds) and ``quorum_changes``. The failure rate is
    recoveries over ``wall_clock_s`` (the report's; default: the span of the groups'
    ``allocated_from``/``allocated_to``). Missing inputs give None, never a guess."""
    def seconds(h: Mapping[str, Any]) -> float | None:
        v = h.get("seconds")
        if v is None and h.get("start") is not None and h.get("end") is not None:
            v = float(h["end"]) - float(h["start"])
        return None if v is None else float(v)
    heals = list(ft.get("heals") or [])
    hs = [x for x in (seconds(h) for h in heals) if x is not None]
    sized = [(float(h["bytes"]), seconds(h)) for h in heals if h.get("bytes") is not None]
    timed = [(b, t) for b, t in sized if t is not None and t > 0]
    bw = sum(b for b, _ in timed) / sum(t for _, t in timed) if timed else None
    changes = int(ft.get("quorum_changes") or 0)
    q = ft.get("quorum_s")
    quorum = float(q) / changes if changes and q is not None else None
    recs = list(ft.get("recoveries") or [])

    def gaps(a: str, b: str) -> list[float]:
        return [float(r[b]) - float(r[a]) for r in recs
                if r.get(a) is not None and r.get(b) is not None]
    wall = wall_clock_s
    if wall is None:
        spans = [(g.get("allocated_from"), g.get("allocated_to"))
                 for g in ft.get("groups") or []]
        known = [(float(a), float(b)) for a, b in spans if a is not None and b is not None]
        wall = (max(b for _, b in known) - min(a for a, _ in known)) if known else None
    n = len(recs)
    rate = n / (wall / 3600.0) if wall and wall > 0 else None
    return MeasuredPerStep(len(heals), _med(hs), bw, changes, quorum, n, rate,
                           (wall / n) if wall and n else None,
                           _med(gaps("failure", "detected") or
                                gaps("last_step_end", "detected")),
                           _med(gaps("detected", "heal_start")))
