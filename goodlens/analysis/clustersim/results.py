"""What a cluster simulation reports: per job, per owner, per cluster, and a timeline.

Why it exists: the simulator's state (job accumulators, node-second counters, samples) is
shaped for speed; this module turns it into the documented result (:class:`ClusterResult`):
each job's breakdown in the buckets of ``goodlens report``, its waits and preemption loss,
each owner's share and waits, and the cluster's utilisation, goodput-weighted utilisation
and starvation. It only reads the finished simulation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from goodlens.analysis.accounting import BUCKETS
from goodlens.analysis.clustersim.config import ClusterConfig, Policy
from goodlens.analysis.clustersim.jobs import Bucket, Job

HEADLINE = ("utilisation", "goodput_weighted_utilisation", "useful_utilisation",
            "jobs_done", "mean_wait_s", "p95_wait_s", "longest_starvation_s",
            "mean_turnaround_s", "preemptions", "preemption_loss_node_s",
            "mean_topology_penalty", "held_idle_node_s", "spare_swaps", "failures")
"""The cluster figures a side-by-side comparison shows first (``compare``'s ``metrics``)."""

ATTEMPT_FIELDS = ("job", "start_s", "end_s", "nodes", "racks", "pods", "penalty", "end")
"""The columns of an attempt row (the simulator keeps each as a list, in this order)."""


@dataclass
class ClusterResult:
    """One simulated cluster: per job, per owner, per cluster, and a timeline.

    Seconds throughout. ``jobs`` rows: name, owner, priority, nodes, submit_s, first_start_s,
    end_s, status, wall_clock_s (first start to end), buckets (``accounting.BUCKETS``, summing
    to wall_clock_s), startup_parts (the first attempt's start-up), restart_parts, goodput,
    first_wait_s (submit to first start), queue_wait_s (every wait for nodes: first_wait_s
    plus restart.queue), longest_wait_s, preemption_loss_s, preemptions, failures, attempts,
    topology_slowdown_s (the part of productive lost to the topology penalty), work_s,
    progress (share of work done), turnaround_s."""

    policy: str
    seed: int
    config: dict[str, Any]
    cluster: dict[str, Any]
    owners: dict[str, dict[str, Any]]
    jobs: list[dict[str, Any]]
    preemptions: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    timeline: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (plain floats, ints, strings, lists and dicts)."""
        return asdict(self)

    def jobs_frame(self) -> Any:
        """The job rows as a pandas DataFrame, buckets flattened to columns."""
        import pandas as pd
        rows = []
        for j in self.jobs:
            r = {k: v for k, v in j.items()
                 if k not in ("buckets", "startup_parts", "restart_parts")}
            r.update(j["buckets"])
            r.update({f"startup.{k}": v for k, v in j["startup_parts"].items()})
            r.update({f"restart.{k}": v for k, v in j["restart_parts"].items()})
            rows.append(r)
        return pd.DataFrame(rows)


class FinishedSim(Protocol):
    """What :func:`build_result` reads of a finished simulation."""

    cfg: ClusterConfig
    pol: Policy
    seed: int
    horizon: float
    n_nodes: int
    n_racks: int
    n_pods: int
    jobs: list[Job]
    owner_names: list[str]
    share: list[float]
    owner_ns: list[float]
    node_s: dict[str, float]
    counts: dict[str, int]
    events: int
    preempts: list[dict[str, Any]]
    attempts: list[list]
    timeline: dict[str, list]
    timeline_owner: list[list[int]]


def build_result(sim: FinishedSim) -> ClusterResult:
    """The result of a simulation run to its horizon (every attempt settled)."""
    rows = [job_row(j, sim.owner_names[j.owner], sim.horizon) for j in sim.jobs]
    sub = [r for r in rows if r["status"] not in ("future", "rejected")]
    tot_ns = dict.fromkeys(BUCKETS, 0.0)
    topo_ns = 0.0
    for j, r in zip(sim.jobs, rows):
        for k in BUCKETS:
            tot_ns[k] += r["buckets"][k] * j.size
        topo_ns += j.topology_slowdown_s * j.size
    ns = dict(sim.node_s)
    ns.update(total=sim.n_nodes * sim.horizon, productive=tot_ns["productive"],
              useful=tot_ns["productive"] - topo_ns,
              **{f"job_{k}": v for k, v in tot_ns.items() if k != "productive"})
    owners = owner_summary(sim, sub)
    cluster = cluster_summary(sim, rows, sub, ns)
    attempts = [dict(zip(ATTEMPT_FIELDS, a)) for a in sim.attempts]
    tl = dict(sim.timeline)
    tl["owners"] = {n: sim.timeline_owner[o] for o, n in enumerate(sim.owner_names)}
    cfg = sim.cfg
    conf = {"description": cfg.describe(), "nodes": sim.n_nodes, "racks": sim.n_racks,
            "pods": sim.n_pods, "gpus_per_node": cfg.gpus_per_node,
            "nodes_per_rack": cfg.nodes_per_rack, "racks_per_pod": cfg.racks_per_pod,
            "duration_s": sim.horizon, "jobs": len(rows)}
    return ClusterResult(sim.pol.describe(), sim.seed, conf, cluster, owners, rows,
                         sim.preempts, attempts, tl)


def job_row(j: Job, owner: str, horizon: float) -> dict[str, Any]:
    """One job's row of :attr:`ClusterResult.jobs` (its buckets sum to its wall-clock)."""
    b = j.buckets
    started = j.first_start is not None
    parts = {"detection": b[Bucket.DETECTION], "queue": b[Bucket.QUEUE],
             "init": b[Bucket.INIT], "restore": b[Bucket.RESTORE],
             "warmup": b[Bucket.WARMUP], "unattributed": 0.0}
    startup = {"init": b[Bucket.STARTUP_INIT], "restore": b[Bucket.STARTUP_RESTORE],
               "warmup": b[Bucket.STARTUP_WARMUP]}
    buckets = {"productive": b[Bucket.PRODUCTIVE], "straggler_wait": b[Bucket.STRAGGLER_WAIT],
               "checkpoint_stall": b[Bucket.CHECKPOINT_STALL],
               "recompute": b[Bucket.RECOMPUTE], "startup": sum(startup.values()),
               "restart": sum(parts.values()), "other": b[Bucket.OTHER]}
    end = j.end if j.end is not None else (horizon if started else None)
    wall = (end - j.first_start) if started else 0.0
    submitted = j.submit <= horizon
    first_wait = j.first_wait if started else (horizon - j.submit if submitted else None)
    return {
        "name": j.spec.name, "owner": owner, "priority": j.priority,
        "nodes": j.size, "submit_s": j.submit, "first_start_s": j.first_start,
        "end_s": end, "status": j.phase.label if submitted else "future",
        "wall_clock_s": wall, "goodput": buckets["productive"] / wall if wall else None,
        "buckets": buckets, "startup_parts": startup, "restart_parts": parts,
        "first_wait_s": first_wait,
        "queue_wait_s": (j.queue_total if started else first_wait),
        "longest_wait_s": j.longest_wait if started else first_wait,
        "preemption_loss_s": j.preempt_loss, "preemptions": j.n_preemptions,
        "failures": j.n_failures, "attempts": j.n_attempts,
        "topology_slowdown_s": j.topology_slowdown_s, "work_s": j.spec.work_s,
        "progress": min(1.0, j.saved_steps / j.total_steps),
        "checkpoint_interval_s": j.interval_s,
        "checkpoint_stall_each_s": j.ckpt_stall_s, "checkpoint_write_s": j.ckpt_write_s,
        "turnaround_s": (end - j.submit) if j.end is not None else None}


def owner_summary(sim: FinishedSim, sub: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per owner: target and used share, node-seconds, jobs, waits (``sub``: the rows of
    the submitted jobs)."""
    owners = {}
    tot_own = sum(sim.owner_ns) or 1.0
    for o, name in enumerate(sim.owner_names):
        mine = [r for r in sub if r["owner"] == name]
        w = np.array([r["first_wait_s"] for r in mine]) if mine else np.zeros(0)
        owners[name] = {
            "share_target": sim.share[o], "share_used": sim.owner_ns[o] / tot_own,
            "node_s": sim.owner_ns[o], "jobs": len(mine),
            "done": sum(r["status"] == "done" for r in mine),
            "mean_wait_s": float(w.mean()) if len(w) else None,
            "p95_wait_s": float(np.percentile(w, 95)) if len(w) else None,
            "max_wait_s": float(w.max()) if len(w) else None,
            "queue_wait_s": float(sum(r["queue_wait_s"] or 0.0 for r in mine))}
    return owners


def cluster_summary(sim: FinishedSim, rows: list[dict[str, Any]], sub: list[dict[str, Any]],
                    ns: dict[str, float]) -> dict[str, Any]:
    """The cluster's figures: utilisations, job counts, waits, starvation, preemption loss,
    topology penalty, event and failure counts (``ns``: node-seconds by use)."""
    cap = ns["total"]
    waits = np.array([r["first_wait_s"] for r in sub]) if sub else np.zeros(0)
    done = [r for r in sub if r["status"] == "done"]
    starve = max(sub, key=lambda r: (r["longest_wait_s"] or 0.0), default=None)
    alloc_run = sum(r["wall_clock_s"] * r["nodes"] for r in sub) or 1.0
    att = sim.attempts
    return {
        "utilisation": ns["allocated"] / cap,
        "goodput_weighted_utilisation": ns["productive"] / cap,
        "useful_utilisation": ns["useful"] / cap,
        "goodput": ns["productive"] / alloc_run,
        "node_seconds": ns,
        "jobs_total": len(rows), "jobs_submitted": len(sub), "jobs_done": len(done),
        "jobs_running": sum(r["status"] in ("running", "saving", "detecting", "swapping")
                            for r in sub),
        "jobs_waiting": sum(r["status"] in ("pending", "holding") for r in sub),
        "jobs_rejected": sum(r["status"] == "rejected" for r in rows),
        "mean_wait_s": float(waits.mean()) if len(waits) else None,
        "p95_wait_s": float(np.percentile(waits, 95)) if len(waits) else None,
        "longest_starvation_s": starve["longest_wait_s"] if starve else None,
        "longest_starvation_job": starve["name"] if starve else None,
        "mean_turnaround_s": float(np.mean([r["turnaround_s"] for r in done]))
        if done else None,
        "preemption_loss_node_s": float(sum(r["preemption_loss_s"] * r["nodes"]
                                            for r in rows)),
        "mean_topology_penalty": float(np.average([a[6] for a in att],
                                                  weights=[a[3] for a in att]))
        if att else 0.0,
        "held_idle_node_s": ns["held_idle"], "events": sim.events, **sim.counts}
