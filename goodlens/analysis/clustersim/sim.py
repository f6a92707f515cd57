"""Cluster scheduling what-if: many jobs on one cluster, under switchable scheduler policies.

Why it exists: scheduling is the fourth lever on wasted compute, after failures, checkpoints
and stragglers. :func:`simulate_cluster` runs a seeded stream of jobs (sizes, work,
priorities, owners) on nodes in racks in pods, with node failures, under a
:class:`~goodlens.analysis.clustersim.config.Policy` (gang or partial allocation,
topology-aware or random placement, preemption by kill or with a checkpoint, fair share or
FIFO, a shared hot-spare pool), and reports each job's breakdown in the buckets of
``goodlens report`` plus its queue wait and preemption loss, and the cluster's utilisation,
goodput-weighted utilisation, wait by owner and longest starvation. :func:`compare` runs two
policies on the same jobs and failures.

Event-driven (a heap of submits, failures, repairs, detections, spare swaps, saves, job ends
and hourly samples); steps and checkpoints between events are counted arithmetically, never
one by one. Reused, not copied: the run simulator's failure model (``SimConfig`` fields, the
cause table, hang probabilities and straggler noise via
``goodlens.analysis.runsim.trial.prepare``, its block random draws), ckptcost's checkpoint
stall and size, Young's interval.

Accounting rules (the run simulator's, docs/accounting.md), per job:

- wall-clock runs from the job's first start to its end (done, or the end of the simulation),
  as ``goodlens report`` does, and the buckets sum to it; the wait from submit to the first
  start is ``first_wait_s``, outside it (so turnaround = first_wait_s + wall_clock_s);
- an attempt: init (+ restore when there is a checkpoint), the first step's warm-up, then
  steps of step_s (1 + topology penalty) productive plus the straggler noise w0 each, with a
  save every K steps (stall C: the snapshot when async, the write when sync; durable
  ``write_s`` W after it starts); a failure rolls the steps since the last durable checkpoint
  into recompute, plus the partial step (up to one step), the rest until detection is
  restart.detection; no step completed: init/restore until detection;
- between attempts: restart.queue (the scheduler's real wait, a spare swap, a partial hold);
- preemption by kill: like a failure with no detection; with a checkpoint: the step in flight
  completes, then a durable save of ``write_s`` (checkpoint_stall) before the nodes go;
- the end of the simulation: a step in flight is ``other``, a save in progress a stall.

This module is the event loop and the job and node state changes every concern shares; the
concerns live beside it:

- :mod:`~goodlens.analysis.clustersim.jobs`: the job record, its attempt arithmetic and
  bucket settlement, and the named constants (events, phases, buckets);
- :mod:`~goodlens.analysis.clustersim.placement`: topology-aware or random node choice;
- :mod:`~goodlens.analysis.clustersim.scheduling`: queue order and gang/partial allocation;
- :mod:`~goodlens.analysis.clustersim.preemption`: victims, kills and preemption saves;
- :mod:`~goodlens.analysis.clustersim.failures`: node failures, repairs and hot spares;
- :mod:`~goodlens.analysis.clustersim.results`: the per-job, per-owner and cluster report.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from goodlens.analysis.clustersim.config import ClusterConfig, Policy, workload
from goodlens.analysis.clustersim.failures import FailureMixin
from goodlens.analysis.clustersim.jobs import (
    STRAGGLER_WAIT_CACHE,
    Bucket,
    Event,
    Job,
    Phase,
    Settle,
    new_job,
)
from goodlens.analysis.clustersim.placement import PlacementMixin, penalty_table, place_nodes
from goodlens.analysis.clustersim.preemption import PreemptionMixin
from goodlens.analysis.clustersim.results import HEADLINE, ClusterResult, build_result
from goodlens.analysis.clustersim.scheduling import SchedulingMixin
from goodlens.analysis.runsim.trial import Draws, prepare

__all__ = ["STRAGGLER_WAIT_CACHE", "ClusterResult", "ClusterSim", "compare", "place_nodes",
           "simulate_cluster"]

MAX_PASSES = 8
"""Scheduling passes after one event at most (a pass that preempts asks for another)."""

TIMELINE_KEYS = ("t", "allocated", "held", "free", "down", "spare_idle", "running_jobs",
                 "pending_jobs")
COUNTERS = ("failures", "wide_failures", "absorbed_failures", "hangs", "spare_swaps",
            "partial_grants", "partial_timeouts", "preemptions")
NODE_USES = ("allocated", "held_idle", "free_idle", "down", "spare_idle")


def simulate_cluster(config: ClusterConfig, policy: Policy | str | None = None,
                     seed: int = 0) -> ClusterResult:
    """One run of ``config``'s job stream under ``policy`` (a Policy or its string form; None:
    the defaults). Same seed, same result; the jobs and the node failures depend on the seed
    only, so two policies with one seed see the same workload and the same failures."""
    return ClusterSim(config, Policy.parse(policy), seed).run()


def compare(config: ClusterConfig, policy_a: Policy | str, policy_b: Policy | str,
            seed: int = 0) -> dict[str, Any]:
    """Both policies on the same jobs and failures: ``{"seed", "a", "b"}`` (each
    ``ClusterResult.to_dict()``) and ``metrics``: rows of ``{metric, a, b, delta}`` (b - a) for
    the cluster figures a side-by-side view shows first."""
    a = simulate_cluster(config, policy_a, seed)
    b = simulate_cluster(config, policy_b, seed)
    rows = []
    for key in HEADLINE:
        va, vb = a.cluster[key], b.cluster[key]
        rows.append({"metric": key, "a": va, "b": vb,
                     "delta": None if va is None or vb is None else vb - va})
    return {"seed": seed, "a": a.to_dict(), "b": b.to_dict(), "metrics": rows}


class ClusterSim(PlacementMixin, SchedulingMixin, PreemptionMixin, FailureMixin):
    """One cluster run (rules in the module docstring): the event loop, the node and job
    state, and the state changes every concern shares (take, release, start, requeue)."""

    def __init__(self, cfg: ClusterConfig, pol: Policy, seed: int) -> None:
        self.cfg, self.pol, self.seed = cfg, pol, seed
        f = cfg.failure
        self.f = f
        _, s_fail, s_cause, s_place, s_back = np.random.SeedSequence(seed).spawn(5)
        self.fail_draws = Draws(np.random.default_rng(s_fail))
        self.cause_draws = Draws(np.random.default_rng(s_cause))
        self.prng = np.random.default_rng(s_place)
        self.backoff_draws = Draws(np.random.default_rng(s_back))
        self.horizon = float(cfg.duration_s)
        self.n_nodes, self.n_racks, self.n_pods = cfg.nodes, cfg.racks, cfg.pods
        if pol.spares >= cfg.nodes:
            raise ValueError(f"spares={pol.spares} leaves no node of {cfg.nodes} to schedule")
        p = prepare(f)
        self.cause_cdf, self.hang_prob, self.wide_prob = p.cause_cdf, p.hang, p.wide
        self.weibull = f.failure_dist == "weibull"
        self.weibull_scale = f.node_mtbf_s / math.gamma(1 + 1 / f.weibull_shape)
        self._init_nodes()
        self._init_owners()
        oidx = {n: i for i, n in enumerate(self.owner_names)}
        self.jobs = [new_job(i, s, oidx[s.owner], cfg) for i, s in
                     enumerate(workload(cfg, seed))]
        self.pending: set[int] = set()
        self.running: set[int] = set()
        self.saving: set[int] = set()
        self.victims: tuple[list[int], list[int]] | None = None
        self.claimants: list[int] = []
        # cluster accumulators
        self.now = 0.0
        self.node_s = dict.fromkeys(NODE_USES, 0.0)
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.preempts: list[dict[str, Any]] = []
        self.attempts: list[list] = []
        self.timeline: dict[str, list] = {k: [] for k in TIMELINE_KEYS}
        self.timeline_owner: list[list[int]] = [[] for _ in self.owner_names]
        self.heap: list[tuple] = []
        self.seq = 0
        self.dirty = False
        self.events = 0
        for j in self.jobs:
            self.push(j.submit, Event.SUBMIT, j.id, 0)
        for m in range(cfg.nodes):
            self.push(self.time_to_failure(), Event.FAIL, m, 0)
        self.push(0.0, Event.TICK, 0, 0)

    def _init_nodes(self) -> None:
        """Topology arrays and node state; the spares are carved out spread over the racks
        (the highest node ids of each)."""
        cfg, n, npr = self.cfg, self.n_nodes, self.cfg.nodes_per_rack
        self.rack_of = np.arange(n) // npr
        self.pod_of_rack = np.arange(self.n_racks) // cfg.racks_per_pod
        self.pod_of = self.pod_of_rack[self.rack_of]
        self.rack_lo = np.arange(self.n_racks) * npr
        self.rack_hi = np.minimum(self.rack_lo + npr, n)
        self.penalty_tab = penalty_table(cfg)
        self.node_job = np.full(n, -1, np.int64)
        self.down = np.zeros(n, bool)
        self.down_until = np.zeros(n)
        self.spare = np.zeros(n, bool)
        self.free_mask = np.ones(n, bool)
        self.rack_free = (self.rack_hi - self.rack_lo).astype(np.int64)
        spares, racks = self.pol.spares, self.n_racks
        for i in range(spares):
            r, k = (i * racks // spares, 0) if spares <= racks else (i % racks, i // racks)
            m = int(self.rack_hi[r]) - 1 - k
            while self.spare[m]:
                m -= 1
            self.spare[m] = True
            self.free_mask[m] = False
            self.rack_free[self.rack_of[m]] -= 1
        self.n_free, self.n_alloc, self.n_held, self.n_down = n - spares, 0, 0, 0
        self.n_spare_idle = self.n_spare_role = spares

    def _init_owners(self) -> None:
        """Owners' shares (normalised), allocations and decayed usage (fair share)."""
        cfg = self.cfg
        self.owner_names = [o.name for o in cfg.owners]
        tot = sum(o.share for o in cfg.owners)
        self.share = [o.share / tot for o in cfg.owners]
        no = len(self.share)
        self.owner_alloc = [0] * no
        self.owner_ns = [0.0] * no
        self.usage = [0.0] * no
        self.decay_rate = math.log(2) / cfg.fair_half_life_s

    def push(self, t: float, kind: Event, a: int, ep: int) -> None:
        """Schedule an event: ``a`` is a job id or a node, ``ep`` the job's epoch (job
        events are dropped when it has moved on)."""
        heapq.heappush(self.heap, (float(t), self.seq, kind, a, ep))
        self.seq += 1

    # ------------------------------------------------------------------ the loop

    def run(self) -> ClusterResult:
        """Process events up to the horizon, then settle what is in flight."""
        horizon, heap, jobs = self.horizon, self.heap, self.jobs
        handlers: dict[Event, Callable[[int, float], None]] = {
            Event.SUBMIT: self.on_submit, Event.FAIL: self.on_fail,
            Event.REPAIR: self.on_repair, Event.TICK: self.on_tick, Event.WAKE: self.on_wake}
        job_handlers: dict[Event, Callable[[Job, float], None]] = {
            Event.DETECT: self.on_detect, Event.SWAP: self.on_swap, Event.END: self.on_end,
            Event.SAVED: self.on_saved, Event.HOLD_TIMEOUT: self.on_hold_timeout}
        while heap and heap[0][0] <= horizon:
            t, _, kind, a, ep = heapq.heappop(heap)
            if kind in job_handlers:
                j = jobs[a]
                if j.epoch != ep:
                    continue
                self.advance(t)
                job_handlers[kind](j, t)
            else:
                self.advance(t)
                handlers[kind](a, t)
            self.events += 1
            for _ in range(MAX_PASSES):
                if not self.dirty:
                    break
                self.schedule_pass(t)
        self.advance(horizon)
        self.finish()
        return build_result(self)

    def advance(self, t: float) -> None:
        """Accrue node-seconds by use and owners' usage (decayed) up to t."""
        dt = t - self.now
        if dt <= 0:
            return
        ns = self.node_s
        ns["allocated"] += self.n_alloc * dt
        ns["held_idle"] += self.n_held * dt
        ns["free_idle"] += self.n_free * dt
        ns["down"] += self.n_down * dt
        ns["spare_idle"] += self.n_spare_idle * dt
        dec = math.exp(-self.decay_rate * dt)
        g = (1 - dec) / self.decay_rate
        for o, a in enumerate(self.owner_alloc):
            self.usage[o] = self.usage[o] * dec + a * g
            self.owner_ns[o] += a * dt
        self.now = t

    def finish(self) -> None:
        """Close every job at the horizon: a step in flight is ``other``, a save in progress
        a stall, a wait after a first start restart.queue."""
        horizon = self.horizon
        for j in self.jobs:
            if j.phase == Phase.RUNNING:
                j.settle(horizon, Settle.ENDED, horizon)
                self.end_attempt(j, horizon, "end")
            elif j.phase == Phase.SAVING:
                if j.save_start > horizon:
                    j.settle(horizon, Settle.ENDED, horizon)
                else:
                    j.settle(j.save_start, Settle.SAVE, horizon, m=j.save_step)
                    j.buckets[Bucket.CHECKPOINT_STALL] += horizon - j.save_start
                self.end_attempt(j, min(horizon, j.save_start), "end")
            elif j.phase in (Phase.SWAPPING, Phase.PENDING, Phase.HOLDING) and \
                    j.first_start is not None:
                j.buckets[Bucket.QUEUE] += horizon - j.queue_since
            if j.phase in (Phase.PENDING, Phase.HOLDING, Phase.SWAPPING) and \
                    j.submit <= horizon:
                wait = horizon - j.queue_since
                j.queue_total += wait
                j.longest_wait = max(j.longest_wait, wait)

    # ------------------------------------------------------------------ events

    def on_submit(self, i: int, t: float) -> None:
        """Job i arrives: queued, or rejected when it cannot fit beside the spares."""
        j = self.jobs[i]
        if j.size > self.n_nodes - self.pol.spares:
            j.phase = Phase.REJECTED
            return
        self.enqueue(j, t)

    def on_tick(self, _: int, t: float) -> None:
        """An hourly sample of the timeline."""
        tl = self.timeline
        tl["t"].append(t)
        tl["allocated"].append(self.n_alloc)
        tl["held"].append(self.n_held)
        tl["free"].append(self.n_free)
        tl["down"].append(self.n_down)
        tl["spare_idle"].append(self.n_spare_idle)
        lo, hi = Phase.RUNNING, Phase.SWAPPING  # the phases of a live attempt
        tl["running_jobs"].append(sum(1 for j in self.jobs if lo <= j.phase <= hi))
        tl["pending_jobs"].append(len(self.pending))
        for o, a in enumerate(self.owner_alloc):
            self.timeline_owner[o].append(a)
        self.push(t + self.cfg.sample_every_s, Event.TICK, 0, 0)

    def on_wake(self, _: int, t: float) -> None:
        """A back-off or a preemption delay ended: schedule again."""
        self.dirty = True

    def on_end(self, j: Job, t: float) -> None:
        """j's work is complete."""
        j.settle(t, Settle.DONE, self.horizon, m=j.steps_left)
        self.end_attempt(j, t, "done")
        self.release(j)
        j.phase, j.end = Phase.DONE, t
        j.epoch += 1

    def on_hold_timeout(self, j: Job, t: float) -> None:
        """A partial allocation held too long: give the nodes back and retry after a random
        back-off."""
        if j.phase != Phase.HOLDING:
            return
        self.release(j)
        j.phase = Phase.PENDING
        j.epoch += 1
        j.backoff_until = t + self.cfg.partial_timeout_s * \
            -math.log(1.0 - self.backoff_draws.uni())
        self.counts["partial_timeouts"] += 1
        self.push(j.backoff_until, Event.WAKE, j.id, 0)

    # ------------------------------------------------------------------ job state

    def requeue(self, j: Job, t: float) -> None:
        """j's attempt is over (failure, preemption): back in the queue."""
        j.epoch += 1
        self.running.discard(j.id)
        self.enqueue(j, t)

    def enqueue(self, j: Job, t: float) -> None:
        """j waits for nodes from t."""
        j.phase, j.queue_since = Phase.PENDING, t
        self.pending.add(j.id)
        self.dirty = True
        if self.pol.preempt != "none" and self.cfg.preempt_after_s > 0:
            self.push(t + self.cfg.preempt_after_s, Event.WAKE, j.id, 0)  # may preempt then

    def release(self, j: Job) -> None:
        """Give back every node the job still holds (failed ones are down already)."""
        holding = j.phase == Phase.HOLDING
        for x in j.held if holding else j.nodes:
            if self.node_job[x] == j.id:
                self.free_node(x)
                self.n_alloc -= 1
                self.owner_alloc[j.owner] -= 1
                if holding:
                    self.n_held -= 1
        j.nodes, j.held = [], []
        self.running.discard(j.id)
        self.saving.discard(j.id)
        if j.claimed_by is not None:
            self.jobs[j.claimed_by].awaited_nodes -= j.size
            j.claimed_by = None
        self.dirty = True

    def free_node(self, x: int) -> None:
        """Node x is free (and up)."""
        self.node_job[x] = -1
        self.free_mask[x] = True
        self.rack_free[self.rack_of[x]] += 1
        self.n_free += 1

    def take(self, j: Job, nodes: Any) -> list[int]:
        """Free ``nodes`` go to j; returns them as ints."""
        nodes = [int(x) for x in nodes]
        for x in nodes:
            self.node_job[x] = j.id
            self.free_mask[x] = False
            self.rack_free[self.rack_of[x]] -= 1
        self.n_free -= len(nodes)
        self.n_alloc += len(nodes)
        self.owner_alloc[j.owner] += len(nodes)
        return nodes

    def start(self, j: Job, t: float, nodes: list[int]) -> None:
        """A new attempt on ``nodes`` (the whole job: gang or a completed partial hold)."""
        if len(nodes) != j.size:
            raise AssertionError(f"job {j.spec.name} started on {len(nodes)} of {j.size} nodes")
        f = self.f
        arr = np.asarray(nodes)
        racks = len(np.unique(self.rack_of[arr]))
        pods = len(np.unique(self.pod_of[arr]))
        j.penalty = float(self.penalty_tab[pods, racks])
        j.placed_step_s = j.step_s * (1 + j.penalty)
        j.step_wall_s = j.placed_step_s + j.straggler_wait_s
        j.ckpt_cycle_s = j.ckpt_every_steps * j.step_wall_s + j.ckpt_stall_s
        j.init_s = f.init_s
        j.restore_s = j.restore_full_s if j.saved_steps > 0 else 0.0
        j.warmup_s = f.warmup_s
        j.attempt_start, j.ready_at = t, t + j.init_s + j.restore_s
        j.steps_left = j.total_steps - j.saved_steps
        wait = t - j.queue_since
        if j.first_start is None:
            j.first_start, j.first_wait = t, wait
        else:
            j.buckets[Bucket.QUEUE] += wait
        j.queue_total += wait
        j.longest_wait = max(j.longest_wait, wait)
        if j.id in self.claimants:
            self.claimants.remove(j.id)
        j.claiming, j.awaited_nodes = False, 0
        j.nodes, j.held = list(nodes), []
        j.phase = Phase.RUNNING
        j.epoch += 1
        j.n_attempts += 1
        self.pending.discard(j.id)
        self.running.add(j.id)
        j.attempt_row = [j.spec.name, t, None, len(nodes), racks, pods, j.penalty, None]
        self.attempts.append(j.attempt_row)
        self.push(j.step_end(j.steps_left), Event.END, j.id, j.epoch)

    @staticmethod
    def end_attempt(j: Job, t: float, why: str) -> None:
        """Close j's attempt row (end time, how it ended)."""
        if j.attempt_row is not None:
            j.attempt_row[2], j.attempt_row[7] = t, why
            j.attempt_row = None
