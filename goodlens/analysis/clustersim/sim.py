"""Cluster scheduling what-if: many jobs on one cluster, under switchable scheduler policies.

Why it exists: scheduling is the fourth lever on wasted compute, after failures, checkpoints
and stragglers. :func:`simulate_cluster` runs a seeded stream of jobs (sizes, work,
priorities, owners) on nodes in racks in pods, with node failures, under a
:class:`~goodlens.analysis.clustersim.config.Policy` (gang or partial allocation, topology-aware or
random
placement, preemption by kill or with a checkpoint, fair share or FIFO, a shared hot-spare
pool), and reports each job's breakdown in the buckets of ``goodlens report`` plus its queue
wait and preemption loss, and the cluster's utilisation, goodput-weighted utilisation, wait by
owner and longest starvation. :func:`compare` runs two policies on the same jobs and failures.

Event-driven (a heap of submits, failures, repairs, detections, spare swaps, saves, job ends
and hourly samples); steps and checkpoints between events are counted arithmetically, never
one by one. Reused, not copied: the run simulator's failure model (``SimConfig`` fields, the
cause table, hang probabilities and straggler noise via
``goodlens.analysis.runsim.trial._prepare``, its
block random draws), ckptcost's checkpoint stall and size, Young's interval.

Accounting rules (the run simulator's, docs/accounting.md), per job:

- wall-clock runs from the job's first start to its end (done, or the end of the simulation),
  as ``goodlens report`` does, and the buckets sum to it; the wait from submit to the first
  start is ``first_wait_s``, outside it (so turnaround = first_wait_s + wall_clock_s);
- an attempt: init (+ restore when there is a checkpoint), the first step's warm-up, then
  steps of step_s (1 + topology penalty) productive plus the straggler noise w0 each, with a
  save every K steps (stall C: the snapshot when async, the write when sync; durable
  ``write_s`` after it starts); a failure rolls the steps since the last durable checkpoint
  into recompute, plus the partial step (up to one step), the rest until detection is
  restart.detection; no step completed: init/restore until detection;
- between attempts: restart.queue (the scheduler's real wait, a spare swap, a partial hold);
- preemption by kill: like a failure with no detection; with a checkpoint: the step in flight
  completes, then a durable save of ``write_s`` (checkpoint_stall) before the nodes go;
- the end of the simulation: a step in flight is ``other``, a save in progress a stall.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from goodlens.analysis.accounting import BUCKETS
from goodlens.analysis.ckptcost import CheckpointSpec, checkpoint_cost
from goodlens.analysis.clustersim.config import ClusterConfig, JobSpec, Policy, workload
from goodlens.analysis.runsim.montecarlo import young_interval_s
from goodlens.analysis.runsim.trial import _Draws, _prepare

__all__ = ["ClusterResult", "compare", "place_nodes", "simulate_cluster"]

INF = math.inf
# a job's accumulator slots
_PROD, _STRAG, _STALL, _RECOMP, _OTHER, _DET, _QUEUE, _INIT, _RESTORE, _WARM = range(10)
# event kinds
_SUBMIT, _FAIL, _REPAIR, _DETECT, _SWAP, _END, _SAVED, _HOLD, _WAKE, _TICK = range(10)
# job phases
PENDING, HOLDING, RUN, SAVING, DETECTING, SWAPPING, DONE, REJECTED = range(8)
_PHASE = ("pending", "holding", "running", "saving", "detecting", "swapping", "done",
          "rejected")
# settle modes
_FAILED, _KILLED, _ENDED, _SAVE, _DONE = range(5)


class _Job:
    __slots__ = ("C", "K", "L", "S", "W", "attempt", "await_", "b", "backoff_until", "base",
                 "claimed_by", "claiming", "d", "end", "epoch", "first_start", "first_wait", "held",
                 "id", "init_c", "interval_s", "longest_wait", "n_attempts", "n_fail", "n_preempt",
                 "nodes", "owner", "pen", "phase", "prec", "preempt_loss", "prio", "pstep",
                 "queue_since", "queue_total", "rem", "restore_c", "restore_s", "save_m", "save_t",
                 "size", "spec", "step_s", "submit", "t_a", "t_r", "topo_slow", "w0", "warm")


@dataclass
class ClusterResult:
    """One simulated cluster: per job, per owner, per cluster, and a timeline.

    Seconds throughout. ``jobs`` rows: name, owner, priority, nodes, submit_s, first_start_s,
    end_s, status, wall_clock_s (first start to end), buckets (``accounting.BUCKETS``, summing
    to wall_clock_s), restart_parts, goodput, first_wait_s (submit to first start),
    queue_wait_s (every wait for nodes: first_wait_s plus restart.queue), longest_wait_s,
    preemption_loss_s, preemptions, failures, attempts, topology_slowdown_s (the part of
    productive lost to the topology penalty), work_s, progress (share of work done),
    turnaround_s."""

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
            r = {k: v for k, v in j.items() if k not in ("buckets", "restart_parts")}
            r.update(j["buckets"])
            r.update({f"restart.{k}": v for k, v in j["restart_parts"].items()})
            rows.append(r)
        return pd.DataFrame(rows)


def simulate_cluster(config: ClusterConfig, policy: Policy | str | None = None,
                     seed: int = 0) -> ClusterResult:
    """One run of ``config``'s job stream under ``policy`` (a Policy or its string form; None:
    the defaults). Same seed, same result; the jobs and the node failures depend on the seed
    only, so two policies with one seed see the same workload and the same failures."""
    return _Sim(config, Policy.parse(policy), seed).run()


def compare(config: ClusterConfig, policy_a: Policy | str, policy_b: Policy | str,
            seed: int = 0) -> dict[str, Any]:
    """Both policies on the same jobs and failures: ``{"seed", "a", "b"}`` (each
    ``ClusterResult.to_dict()``) and ``metrics``: rows of ``{metric, a, b, delta}`` (b - a) for
    the cluster figures a side-by-side view shows first."""
    a = simulate_cluster(config, policy_a, seed)
    b = simulate_cluster(config, policy_b, seed)
    rows = []
    for key in _HEADLINE:
        va, vb = a.cluster[key], b.cluster[key]
        rows.append({"metric": key, "a": va, "b": vb,
                     "delta": None if va is None or vb is None else vb - va})
    return {"seed": seed, "a": a.to_dict(), "b": b.to_dict(), "metrics": rows}


_HEADLINE = ("utilisation", "goodput_weighted_utilisation", "useful_utilisation",
             "jobs_done", "mean_wait_s", "p95_wait_s", "longest_starvation_s",
             "mean_turnaround_s", "preemptions", "preemption_loss_node_s",
             "mean_topology_penalty", "held_idle_node_s", "spare_swaps", "failures")


def place_nodes(config: ClusterConfig, free_mask: np.ndarray, n: int, topo: bool,
                rng: np.random.Generator | None = None) -> np.ndarray:
    """``n`` of the free nodes (``free_mask[i]``: node i is free): topology-aware (the least
    penalty ``config.penalty``: an exact search over pods and racks) or uniformly at random.
    Raises ValueError when fewer than ``n`` are free."""
    free_mask = np.asarray(free_mask, bool)
    if free_mask.sum() < n:
        raise ValueError(f"only {int(free_mask.sum())} free nodes for {n}")
    npr = config.nodes_per_rack
    rack_of = np.arange(config.nodes) // npr
    rack_free = np.bincount(rack_of[free_mask], minlength=config.racks)
    if not topo:
        return (rng or np.random.default_rng()).choice(np.flatnonzero(free_mask), n,
                                                       replace=False)
    pod_of_rack = np.arange(config.racks) // config.racks_per_pod
    pen = _penalty_table(config)
    picks = _topo_racks(rack_free, pod_of_rack, config.pods, n, pen)
    return np.concatenate([np.flatnonzero(free_mask[r * npr:(r + 1) * npr])[:k] + r * npr
                           for r, k in picks])


def _penalty_table(cfg: ClusterConfig) -> np.ndarray:
    """pen[pods, racks] of ``cfg.penalty`` (row and column 0 unused)."""
    r = np.maximum(np.arange(cfg.racks + 1), 1)
    p = np.maximum(np.arange(cfg.pods + 1), 1)
    return cfg.comm_fraction * (cfg.rack_cost * ((r - 1) / r)[None, :]
                                + cfg.pod_cost * ((p - 1) / p)[:, None])


def _topo_racks(rack_free: np.ndarray, pod_of_rack: np.ndarray, pods: int, n: int,
                pen: np.ndarray) -> list[tuple[int, int]]:
    """(rack, nodes) picks of least penalty for a job of ``n`` nodes.

    One rack if any fits (the fullest-fitting smallest: best fit, to keep big holes). Else a
    dynamic programme over pods: best[c, k] = most nodes coverable with c pods and k racks,
    a pod contributing its j fullest racks; the feasible (c, k) of least pen[c, k] is exact
    because the penalty depends on the counts only. The last, partly used rack is swapped for
    the smallest one in the chosen pods that still completes the job."""
    fits = np.flatnonzero(rack_free >= n)
    if len(fits):
        return [(int(fits[np.argmin(rack_free[fits])]), n)]
    R = len(rack_free)
    best = np.full((pods + 1, R + 1), -1, np.int64)
    best[0, 0] = 0
    stages: list[tuple[np.ndarray, np.ndarray] | None] = []
    for p in range(pods):
        rk = np.flatnonzero((pod_of_rack == p) & (rack_free > 0))
        if not len(rk):
            stages.append(None)
            continue
        rk = rk[np.argsort(-rack_free[rk], kind="stable")]
        cs = np.cumsum(rack_free[rk])
        new = best.copy()
        ch = np.zeros(best.shape, np.int64)
        for j in range(1, len(rk) + 1):
            src = best[:-1, :R + 1 - j]
            cand = src + cs[j - 1]
            dst = new[1:, j:]
            upd = (src >= 0) & (cand > dst)
            dst[upd] = cand[upd]
            ch[1:, j:][upd] = j
        stages.append((rk, ch))
        best = new
    ok = best >= n
    if not ok.any():
        return []
    score = np.where(ok, pen, INF)
    c, k = (int(x) for x in np.unravel_index(int(np.argmin(score)), score.shape))
    racks: list[int] = []
    for p in range(pods - 1, -1, -1):
        st = stages[p]
        if st is None:
            continue
        j = int(st[1][c, k])
        if j:
            racks.extend(int(r) for r in st[0][:j])
            c, k = c - 1, k - j
    racks.sort(key=lambda r: (-rack_free[r], r))
    out, need = [], n
    for r in racks:
        take = min(int(rack_free[r]), need)
        out.append((r, take))
        need -= take
        if not need:
            break
    r_last, take = out[-1]
    if take < rack_free[r_last]:  # best fit for the remainder, within the pods already used
        used = {r for r, _ in out}
        pods_used = {int(pod_of_rack[r]) for r in used}
        cand = [r for r in range(R) if r not in used and int(pod_of_rack[r]) in pods_used
                and take <= rack_free[r] < rack_free[r_last]]
        if cand:
            out[-1] = (min(cand, key=lambda r: (rack_free[r], r)), take)
    return out


class _Sim:
    """One cluster run (rules in the module docstring)."""

    def __init__(self, cfg: ClusterConfig, pol: Policy, seed: int) -> None:
        self.cfg, self.pol, self.seed = cfg, pol, seed
        f = cfg.failure
        self.f = f
        _, s_fail, s_cause, s_place, s_back = np.random.SeedSequence(seed).spawn(5)
        self.fd = _Draws(np.random.default_rng(s_fail))
        self.cd = _Draws(np.random.default_rng(s_cause))
        self.prng = np.random.default_rng(s_place)
        self.bd = _Draws(np.random.default_rng(s_back))
        self.T = float(cfg.duration_s)
        N, npr = cfg.nodes, cfg.nodes_per_rack
        self.N, self.R, self.P = N, cfg.racks, cfg.pods
        if pol.spares >= N:
            raise ValueError(f"spares={pol.spares} leaves no node of {N} to schedule")
        self.rack_of = np.arange(N) // npr
        self.pod_of_rack = np.arange(self.R) // cfg.racks_per_pod
        self.pod_of = self.pod_of_rack[self.rack_of]
        self.rack_lo = np.arange(self.R) * npr
        self.rack_hi = np.minimum(self.rack_lo + npr, N)
        self.pen_tab = _penalty_table(cfg)
        p = _prepare(f)
        self.cause_cdf, self.hang, self.wide = p.cause_cdf, p.hang, p.wide
        self.weib = f.failure_dist == "weibull"
        self.wscale = f.node_mtbf_s / math.gamma(1 + 1 / f.weibull_shape)
        # node state
        self.node_job = np.full(N, -1, np.int64)
        self.down = np.zeros(N, bool)
        self.down_until = np.zeros(N)
        self.spare = np.zeros(N, bool)
        self.free_mask = np.ones(N, bool)
        self.rack_free = (self.rack_hi - self.rack_lo).astype(np.int64)
        S = pol.spares
        for i in range(S):
            r, k = (i * self.R // S, 0) if S <= self.R else (i % self.R, i // self.R)
            m = int(self.rack_hi[r]) - 1 - k
            while self.spare[m]:
                m -= 1
            self.spare[m] = True
            self.free_mask[m] = False
            self.rack_free[self.rack_of[m]] -= 1
        self.n_free, self.n_alloc, self.n_held, self.n_down = N - S, 0, 0, 0
        self.n_spare_idle = self.n_spare_role = S
        # owners
        self.owner_names = [o.name for o in cfg.owners]
        tot = sum(o.share for o in cfg.owners)
        self.share = [o.share / tot for o in cfg.owners]
        no = len(self.share)
        self.owner_alloc = [0] * no
        self.owner_ns = [0.0] * no
        self.usage = [0.0] * no
        self.lam = math.log(2) / cfg.fair_half_life_s
        # jobs
        oidx = {n: i for i, n in enumerate(self.owner_names)}
        self.jobs = [self._make_job(i, s, oidx[s.owner]) for i, s in
                     enumerate(workload(cfg, seed))]
        self.pending: set[int] = set()
        self.running: set[int] = set()
        self.saving: set[int] = set()
        self._victims: tuple[list[int], list[int]] | None = None
        self.claimants: list[int] = []
        # cluster accumulators
        self.now = 0.0
        self.ns = dict.fromkeys(("allocated", "held_idle", "free_idle", "down",
                                 "spare_idle"), 0.0)
        self.counts = dict.fromkeys(("failures", "wide_failures", "absorbed_failures",
                                     "hangs", "spare_swaps", "partial_grants",
                                     "partial_timeouts", "preemptions"), 0)
        self.preempts: list[dict[str, Any]] = []
        self.attempts: list[list] = []
        self.tl: dict[str, list] = {k: [] for k in ("t", "allocated", "held", "free", "down",
                                                    "spare_idle", "running_jobs",
                                                    "pending_jobs")}
        self.tl_owner: list[list[int]] = [[] for _ in range(no)]
        self.heap: list[tuple] = []
        self.seq = 0
        self.dirty = False
        self.events = 0
        for j in self.jobs:
            self._push(j.submit, _SUBMIT, j.id, 0)
        for m in range(N):
            self._push(self._ttf(), _FAIL, m, 0)
        self._push(0.0, _TICK, 0, 0)

    # ------------------------------------------------------------------ set-up

    def _make_job(self, i: int, s: JobSpec, owner: int) -> _Job:
        cfg, f = self.cfg, self.f
        j = _Job()
        j.id, j.spec, j.owner, j.prio, j.size, j.submit = i, s, owner, int(s.priority), \
            int(s.nodes), float(s.submit_s)
        j.step_s = float(s.step_s)
        j.S = max(1, math.ceil(s.work_s / s.step_s - 1e-9))
        gpus = j.size * cfg.gpus_per_node
        cost = checkpoint_cost(CheckpointSpec(
            params=s.params, gpus=gpus, writer_ranks=gpus, writer_bw=cfg.writer_bw,
            storage_bw=cfg.storage_bw, bytes_per_param=cfg.bytes_per_param))
        j.C = cost.sync_stall_s if s.ckpt_mode == "sync" else cost.async_stall_s
        j.W = max(j.C, cost.background_write_s)
        j.restore_s = cost.size_bytes / cost.write_bw  # assumed: read at the write bandwidth
        if s.interval_s is not None:
            iv = float(s.interval_s)
        else:
            iv = young_interval_s(j.C, f.node_mtbf_s / j.size)
            iv = min(max(iv, cfg.min_interval_s, j.W), cfg.max_interval_s)
        j.interval_s = iv
        j.K = max(1, round(iv / j.step_s))
        j.w0 = _noise_wait(f, j.size, cfg.gpus_per_node, j.step_s, cfg.nodes_per_rack)
        j.phase, j.epoch, j.nodes, j.held, j.base = PENDING, 0, [], [], 0
        j.first_start = j.end = None
        j.t_a = j.t_r = j.init_c = j.restore_c = j.warm = 0.0
        j.rem, j.pen, j.pstep, j.d, j.L = 0, 0.0, 0.0, 0.0, 0.0
        j.b = [0.0] * 10
        j.topo_slow = 0.0
        j.queue_since = j.submit
        j.first_wait = None
        j.queue_total = j.longest_wait = j.preempt_loss = 0.0
        j.n_preempt = j.n_fail = j.n_attempts = 0
        j.backoff_until = 0.0
        j.claiming, j.await_, j.claimed_by = False, 0, None
        j.save_m, j.save_t = 0, 0.0
        j.attempt = j.prec = None
        return j

    def _push(self, t: float, kind: int, a: int, ep: int) -> None:
        heapq.heappush(self.heap, (float(t), self.seq, kind, a, ep))
        self.seq += 1

    def _ttf(self) -> float:
        e = -math.log(1.0 - self.fd.uni())
        return self.wscale * e ** (1 / self.f.weibull_shape) if self.weib \
            else e * self.f.node_mtbf_s

    # ------------------------------------------------------------------ the loop

    def run(self) -> ClusterResult:
        T, heap = self.T, self.heap
        handlers: dict[int, Callable[[int, float], None]] = {
            _SUBMIT: self._on_submit, _FAIL: self._on_fail, _REPAIR: self._on_repair,
            _TICK: self._on_tick, _WAKE: self._on_wake}
        job_handlers: dict[int, Callable[[_Job, float], None]] = {
            _DETECT: self._on_detect, _SWAP: self._on_swap, _END: self._on_end,
            _SAVED: self._on_saved, _HOLD: self._on_hold}
        while heap and heap[0][0] <= T:
            t, _, kind, a, ep = heapq.heappop(heap)
            if kind in job_handlers:
                j = self.jobs[a]
                if j.epoch != ep:
                    continue
                self._advance(t)
                job_handlers[kind](j, t)
            else:
                self._advance(t)
                handlers[kind](a, t)
            self.events += 1
            for _ in range(8):
                if not self.dirty:
                    break
                self._pass(t)
        self._advance(T)
        self._finish(T)
        return self._result()

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt <= 0:
            return
        ns = self.ns
        ns["allocated"] += self.n_alloc * dt
        ns["held_idle"] += self.n_held * dt
        ns["free_idle"] += self.n_free * dt
        ns["down"] += self.n_down * dt
        ns["spare_idle"] += self.n_spare_idle * dt
        dec = math.exp(-self.lam * dt)
        g = (1 - dec) / self.lam
        for o, a in enumerate(self.owner_alloc):
            self.usage[o] = self.usage[o] * dec + a * g
            self.owner_ns[o] += a * dt
        self.now = t

    # ------------------------------------------------------------------ events

    def _on_submit(self, i: int, t: float) -> None:
        j = self.jobs[i]
        if j.size > self.N - self.pol.spares:
            j.phase = REJECTED
            return
        self._enqueue(j, t)

    def _on_tick(self, _: int, t: float) -> None:
        tl = self.tl
        tl["t"].append(t)
        tl["allocated"].append(self.n_alloc)
        tl["held"].append(self.n_held)
        tl["free"].append(self.n_free)
        tl["down"].append(self.n_down)
        tl["spare_idle"].append(self.n_spare_idle)
        tl["running_jobs"].append(sum(1 for j in self.jobs if RUN <= j.phase <= SWAPPING))
        tl["pending_jobs"].append(len(self.pending))
        for o, a in enumerate(self.owner_alloc):
            self.tl_owner[o].append(a)
        self._push(t + self.cfg.sample_every_s, _TICK, 0, 0)

    def _on_wake(self, _: int, t: float) -> None:
        self.dirty = True

    def _on_fail(self, m: int, t: float) -> None:
        f = self.f
        if self.down[m]:  # down already (its rack's switch): absorbed, the clock restarts
            self.counts["absorbed_failures"] += 1
            self._push(self.down_until[m] + self._ttf(), _FAIL, m, 0)
            return
        cd = self.cd
        ci = bisect.bisect_right(self.cause_cdf, cd.uni())
        hang, wide = cd.uni() < self.hang[ci], cd.uni() < self.wide[ci]
        self.counts["failures"] += 1
        self.counts["hangs"] += hang
        self.counts["wide_failures"] += wide
        det = f.detect_hang_s if hang else f.detect_crash_s
        until = t + f.repair_s
        self._push(until + self._ttf(), _FAIL, m, 0)
        r = int(self.rack_of[m])
        targets = range(int(self.rack_lo[r]), int(self.rack_hi[r])) if wide else (m,)
        hit: dict[int, _Job] = {}
        for x in targets:
            if self.down[x]:
                if until > self.down_until[x]:
                    self.down_until[x] = until
                    self._push(until, _REPAIR, x, 0)
                continue
            j = self._node_down(x, until)
            if j is not None:
                hit[j.id] = j
        for j in hit.values():
            self._job_fail(j, t, det)

    def _node_down(self, x: int, until: float) -> _Job | None:
        self.down[x] = True
        self.down_until[x] = until
        self._push(until, _REPAIR, x, 0)
        self.n_down += 1
        jid = int(self.node_job[x])
        if jid >= 0:
            j = self.jobs[jid]
            self.node_job[x] = -1
            self.n_alloc -= 1
            self.owner_alloc[j.owner] -= 1
            if j.phase == HOLDING:
                j.held.remove(x)
                self.n_held -= 1
                return None
            return j
        if self.spare[x]:
            self.n_spare_idle -= 1
        else:
            self.free_mask[x] = False
            self.rack_free[self.rack_of[x]] -= 1
            self.n_free -= 1
        return None

    def _on_repair(self, x: int, t: float) -> None:
        if not self.down[x] or self.down_until[x] != t:
            return
        self.down[x] = False
        self.n_down -= 1
        if not self.spare[x] and self.n_spare_role < self.pol.spares:
            self.spare[x] = True
            self.n_spare_role += 1
        if self.spare[x]:
            self.n_spare_idle += 1
        else:
            self._free_node(x)
        self.dirty = True

    def _free_node(self, x: int) -> None:
        self.node_job[x] = -1
        self.free_mask[x] = True
        self.rack_free[self.rack_of[x]] += 1
        self.n_free += 1

    def _job_fail(self, j: _Job, t: float, det: float) -> None:
        tdet = t + det
        if j.phase in (RUN, SAVING):
            mcap = j.save_m if j.phase == SAVING else None
            self.saving.discard(j.id)
            if j.prec is not None:  # the notice save never completed
                j.prec["outcome"], j.prec["stall_s"], j.prec = "failed while saving", 0.0, None
            self._settle(j, t, _FAILED, tdet, mcap)
            self._end_attempt(j, t, "failure")
        elif j.phase == SWAPPING:
            j.b[_QUEUE] += t - j.queue_since
            j.b[_DET] += min(tdet, self.T) - t
        else:  # detecting already: the same detection covers it
            return
        j.n_fail += 1
        j.phase = DETECTING
        j.epoch += 1
        self._push(tdet, _DETECT, j.id, j.epoch)

    def _on_detect(self, j: _Job, t: float) -> None:
        mine = [x for x in j.nodes if self.node_job[x] == j.id]
        lost = j.size - len(mine)
        if self.pol.spares and 0 < lost <= self.n_spare_idle and j.claimed_by is None:
            picks = self._pick_spares(mine, lost)
            for x in picks:
                self.spare[x] = False
                self.n_spare_role -= 1
                self.n_spare_idle -= 1
                self.node_job[x] = j.id
                self.n_alloc += 1
                self.owner_alloc[j.owner] += 1
            j.nodes = mine + picks
            j.phase, j.queue_since = SWAPPING, t
            j.epoch += 1
            self.counts["spare_swaps"] += 1
            self._push(t + self.f.spare_swap_s, _SWAP, j.id, j.epoch)
            return
        self._release(j)
        self._requeue(j, t)

    def _on_swap(self, j: _Job, t: float) -> None:
        self._start(j, t, j.nodes)

    def _on_end(self, j: _Job, t: float) -> None:
        self._settle(j, t, _DONE, m=j.rem)
        self._end_attempt(j, t, "done")
        self._release(j)
        j.phase, j.end = DONE, t
        j.epoch += 1

    def _on_saved(self, j: _Job, t: float) -> None:
        self._settle(j, j.save_t, _SAVE, m=j.save_m)
        j.b[_STALL] += t - j.save_t
        j.preempt_loss += t - j.save_t
        if j.prec is not None:
            j.prec["outcome"], j.prec = "saved", None
        self._end_attempt(j, j.save_t, "preempted")
        self._release(j)
        self._requeue(j, t)

    def _on_hold(self, j: _Job, t: float) -> None:
        if j.phase != HOLDING:
            return
        self._release(j)
        j.phase = PENDING
        j.epoch += 1
        j.backoff_until = t + self.cfg.partial_timeout_s * -math.log(1.0 - self.bd.uni())
        self.counts["partial_timeouts"] += 1
        self._push(j.backoff_until, _WAKE, j.id, 0)

    # ------------------------------------------------------------------ job state

    def _requeue(self, j: _Job, t: float) -> None:
        j.epoch += 1
        self.running.discard(j.id)
        self._enqueue(j, t)

    def _enqueue(self, j: _Job, t: float) -> None:
        j.phase, j.queue_since = PENDING, t
        self.pending.add(j.id)
        self.dirty = True
        if self.pol.preempt != "none" and self.cfg.preempt_after_s > 0:
            self._push(t + self.cfg.preempt_after_s, _WAKE, j.id, 0)  # may preempt from then

    def _release(self, j: _Job) -> None:
        """Give back every node the job still holds (failed ones are down already)."""
        nodes = j.held if j.phase == HOLDING else j.nodes
        for x in nodes:
            if self.node_job[x] == j.id:
                self._free_node(x)
                self.n_alloc -= 1
                self.owner_alloc[j.owner] -= 1
                if j.phase == HOLDING:
                    self.n_held -= 1
        j.nodes, j.held = [], []
        self.running.discard(j.id)
        self.saving.discard(j.id)
        if j.claimed_by is not None:
            self.jobs[j.claimed_by].await_ -= j.size
            j.claimed_by = None
        self.dirty = True

    def _take(self, j: _Job, nodes: Any) -> list[int]:
        nodes = [int(x) for x in nodes]
        for x in nodes:
            self.node_job[x] = j.id
            self.free_mask[x] = False
            self.rack_free[self.rack_of[x]] -= 1
        self.n_free -= len(nodes)
        self.n_alloc += len(nodes)
        self.owner_alloc[j.owner] += len(nodes)
        return nodes

    def _start(self, j: _Job, t: float, nodes: list[int]) -> None:
        """A new attempt on ``nodes`` (the whole job: gang or a completed partial hold)."""
        if len(nodes) != j.size:
            raise AssertionError(f"job {j.spec.name} started on {len(nodes)} of {j.size} nodes")
        f = self.f
        arr = np.asarray(nodes)
        racks = len(np.unique(self.rack_of[arr]))
        pods = len(np.unique(self.pod_of[arr]))
        j.pen = float(self.pen_tab[pods, racks])
        j.pstep = j.step_s * (1 + j.pen)
        j.d = j.pstep + j.w0
        j.L = j.K * j.d + j.C
        j.init_c = f.init_s
        j.restore_c = j.restore_s if j.base > 0 else 0.0
        j.warm = f.warmup_s
        j.t_a, j.t_r = t, t + j.init_c + j.restore_c
        j.rem = j.S - j.base
        wait = t - j.queue_since
        if j.first_start is None:
            j.first_start, j.first_wait = t, wait
        else:
            j.b[_QUEUE] += wait
        j.queue_total += wait
        j.longest_wait = max(j.longest_wait, wait)
        if j.id in self.claimants:
            self.claimants.remove(j.id)
        j.claiming, j.await_ = False, 0
        j.nodes, j.held = list(nodes), []
        j.phase = RUN
        j.epoch += 1
        j.n_attempts += 1
        self.pending.discard(j.id)
        self.running.add(j.id)
        j.attempt = [j.spec.name, t, None, len(nodes), racks, pods, j.pen, None]
        self.attempts.append(j.attempt)
        self._push(self._E(j, j.rem), _END, j.id, j.epoch)

    def _end_attempt(self, j: _Job, t: float, why: str) -> None:
        if j.attempt is not None:
            j.attempt[2], j.attempt[7] = t, why
            j.attempt = None

    # ------------------------------------------------------------------ attempt arithmetic

    @staticmethod
    def _E(j: _Job, i: int) -> float:
        """End of the attempt's i-th step (i >= 1): saves stall C after steps K, 2K, ..."""
        return j.t_r + j.warm + i * j.d + ((i - 1) // j.K) * j.C

    def _m_at(self, j: _Job, x: float) -> int:
        """Steps of the attempt completed by x."""
        y = x - j.t_r - j.warm
        if y < j.d:
            return 0
        q = int(y // j.L)
        i = min(j.K, int((y - q * j.L) // j.d))
        m = min(q * j.K + i, j.rem)
        while m < j.rem and self._E(j, m + 1) <= x:
            m += 1
        while m > 0 and self._E(j, m) > x:
            m -= 1
        return m

    @staticmethod
    def _durable(j: _Job, x: float, m: int) -> int:
        """Steps of the attempt held by its last durable checkpoint at x (save j starts at
        jL - C after the first step's start and is durable W later)."""
        y = x - j.t_r - j.warm
        k = math.floor((y + j.C - j.W) / j.L)
        k = max(0, min(k, (j.rem - 1) // j.K, m // j.K))
        return k * j.K

    def _settle(self, j: _Job, x: float, mode: int, tdet: float = 0.0,
                m: int | None = None) -> float:
        """Put the attempt's time up to x (a failure: up to its detection) in buckets and
        advance the job's checkpointed progress; returns the work lost (recompute)."""
        b, T = j.b, self.T
        if m is None:
            m = self._m_at(j, x)
        elif mode == _FAILED:
            m = min(m, self._m_at(j, x))
        if m == 0:  # no step completed: init, restore, until detection (accounting's rule)
            e = min(tdet, T) if mode == _FAILED else min(x, T)
            tf = INF if mode == _ENDED else x
            rs = j.t_a + j.init_c
            r = 0.0 if tf < rs or e <= rs else \
                (e if tf < rs + j.restore_c else min(e, rs + j.restore_c)) - rs
            b[_RESTORE] += r
            b[_INIT] += e - j.t_a - r
            return 0.0
        b[_INIT] += j.init_c
        b[_RESTORE] += j.restore_c
        b[_WARM] += j.warm
        em = self._E(j, m)
        stall = ((m - 1) // j.K) * j.C
        loss = 0.0
        kept = m
        if mode in (_FAILED, _KILLED):
            kept = self._durable(j, x, m)
            tail = (min(tdet, T) if mode == _FAILED else x) - em
            rc = min(j.d, tail)
            loss = (m - kept) * j.d + tail
            b[_RECOMP] += (m - kept) * j.d + rc
            b[_DET] += tail - rc
        elif mode == _ENDED:
            sk = min(j.C if m % j.K == 0 and m < j.rem else 0.0, x - em)
            stall += sk
            b[_OTHER] += x - em - sk
        elif mode == _SAVE:
            stall += x - em  # 0, or the regular save the notice fell in
        b[_STALL] += stall
        b[_PROD] += kept * j.pstep
        b[_STRAG] += kept * j.w0
        j.topo_slow += kept * j.step_s * j.pen
        j.base += kept
        return loss

    # ------------------------------------------------------------------ scheduling

    def _order(self, t: float) -> Iterator[_Job]:
        """Eligible waiting jobs in queue order. FIFO: by priority, then submit time. Fair
        share: repeatedly the best-scoring owner's next job, score = usage/share - priority x
        priority_weight - age/aging_s, an owner's usage being its decayed node-seconds plus
        its current allocation times the decay's mean life (so a start within this pass
        counts at once, and one owner cannot take a whole pass's free nodes)."""
        elig = [self.jobs[i] for i in self.pending if self.jobs[i].backoff_until <= t]
        if not self.pol.fair:
            yield from sorted(elig, key=lambda j: (-j.prio, j.submit, j.id))
            return
        aging, pw, tau = self.cfg.aging_s, self.cfg.priority_weight, 1 / self.lam
        per: dict[int, list[_Job]] = {}
        for j in elig:
            per.setdefault(j.owner, []).append(j)
        for q in per.values():
            q.sort(key=lambda j: (-(pw * j.prio + (t - j.submit) / aging), j.submit, j.id))
        heads = dict.fromkeys(sorted(per), 0)
        usage, alloc, share = self.usage, self.owner_alloc, self.share
        while heads:
            tot = sum(usage) + tau * sum(alloc)
            best: tuple | None = None
            for o, k in heads.items():
                j = per[o][k]
                ratio = (usage[o] + tau * alloc[o]) / tot / share[o] if tot > 0 else 0.0
                key = (ratio - pw * j.prio - (t - j.submit) / aging, j.submit, j.id, o)
                if best is None or key < best:
                    best = key
            o = best[3]
            j = per[o][heads[o]]
            heads[o] += 1
            if heads[o] == len(per[o]):
                del heads[o]
            yield j

    def _claim(self, j: _Job) -> int:
        return max(0, j.size - j.await_) if j.claiming else 0

    def _pass(self, t: float) -> None:
        self.dirty = False
        self._victims = None
        if self.pol.gang:
            self._gang_pass(t, self._order(t))
        else:
            self._partial_pass(t, list(self._order(t)))

    def _gang_pass(self, t: float, order: Iterator[_Job]) -> None:
        """First fit in queue order with EASY backfilling (``reserve_after_s``)."""
        claims = sum(self._claim(self.jobs[i]) for i in self.claimants)
        free_for = self.n_free - claims
        shadow, extra = INF, 0  # the reservation: when, and the nodes it leaves spare
        for j in order:
            own = self._claim(j)
            if j.size <= free_for + own:
                if shadow < INF and not own and t + self._estimate(j) > shadow:
                    if j.size > extra:
                        continue  # would delay the reserved job
                    extra -= j.size
                free_for -= j.size - own
                self._start(j, t, self._take(j, self._place(j.size)))
                continue
            if self.pol.preempt != "none" and not (j.claiming and j.await_ > 0):
                if self._preempt_for(j, t, j.size - (free_for + own)):
                    return  # nodes changed: the pass runs again
                if j.claiming and j.await_ == 0:  # no victims left: drop the claim
                    j.claiming = False
                    self.claimants.remove(j.id)
                free_for -= self._claim(j) - own  # a new claim holds free nodes for it
            if shadow == INF and not j.claiming and \
                    t - j.queue_since >= self.cfg.reserve_after_s:
                shadow, extra = self._shadow(j, t, free_for)

    def _estimate(self, j: _Job) -> float:
        """The user's walltime estimate of a pending job's next attempt."""
        rem = j.S - j.base
        ideal = self.f.init_s + (j.restore_s if j.base else 0.0) + self.f.warmup_s + \
            rem * j.step_s + ((rem - 1) // j.K) * j.C
        return self.cfg.estimate_factor * ideal

    def _shadow(self, j: _Job, t: float, free_for: int) -> tuple[float, int]:
        """EASY: when j could start as running jobs end (by their estimates), and how many
        nodes beyond j's would be free then."""
        f = self.cfg.estimate_factor
        ends = []
        for i in self.running:
            v = self.jobs[i]
            ends.append((v.t_a + f * (self._E(v, v.rem) - v.t_a), v.size))
        for i in self.saving:
            v = self.jobs[i]
            ends.append((v.save_t + v.W, v.size))
        avail = free_for
        for e, n in sorted(ends):
            avail += n
            if avail >= j.size:
                return max(e, t), avail - j.size
        return INF, 0

    def _partial_pass(self, t: float, order: list[_Job]) -> None:
        """Nodes handed out one at a time, round-robin over the queue within the highest
        priority first (like pods of many jobs scheduled independently, by pod priority); a
        job runs once it holds all of its nodes."""
        F = self.n_free
        for j in [j for j in order if j.claiming]:
            g = min(F, j.size - len(j.held))
            if g:
                self._grant(j, g, t)
                F -= g
        cands = [j for j in order if not j.claiming]
        for prio in sorted({j.prio for j in cands}, reverse=True):  # higher classes first
            tier = [j for j in cands if j.prio == prio]
            need = [j.size - len(j.held) for j in tier]
            for j, g in zip(tier, _water_fill(need, F)):
                if g:
                    self._grant(j, g, t)
                    F -= g
        for j in order:
            if len(j.held) == j.size:
                held = j.held
                self.n_held -= len(held)
                self._start(j, t, held)
        if self.pol.preempt != "none":
            for j in order:
                if j.phase in (HOLDING, PENDING) and not (j.claiming and j.await_ > 0) and \
                        self._preempt_for(j, t, j.size - len(j.held) - self.n_free):
                    return

    def _grant(self, j: _Job, g: int, t: float) -> None:
        free = np.flatnonzero(self.free_mask)
        if self.pol.topo:
            held = np.asarray(j.held, np.int64)
            k1 = ~np.isin(self.rack_of[free], self.rack_of[held])
            k2 = ~np.isin(self.pod_of[free], self.pod_of[held])
            pick = free[np.lexsort((free, -self.rack_free[self.rack_of[free]], k2, k1))[:g]]
        else:
            pick = self.prng.choice(free, g, replace=False)
        first = not j.held
        j.held.extend(self._take(j, pick))
        self.n_held += g
        if len(j.held) < j.size:
            self.counts["partial_grants"] += 1
        if first:
            j.phase = HOLDING
            j.epoch += 1
            self._push(t + self.cfg.partial_timeout_s, _HOLD, j.id, j.epoch)

    def _place(self, n: int) -> np.ndarray:
        if not self.pol.topo:
            return self.prng.choice(np.flatnonzero(self.free_mask), n, replace=False)
        picks = _topo_racks(self.rack_free, self.pod_of_rack, self.P, n, self.pen_tab)
        return np.concatenate([np.flatnonzero(self.free_mask[self.rack_lo[r]:self.rack_hi[r]])
                               [:k] + self.rack_lo[r] for r, k in picks])

    def _pick_spares(self, mine: list[int], k: int) -> list[int]:
        idle = np.flatnonzero(self.spare & ~self.down)
        if not self.pol.topo:
            return [int(x) for x in self.prng.choice(idle, k, replace=False)]
        arr = np.asarray(mine, np.int64)
        k1 = ~np.isin(self.rack_of[idle], self.rack_of[arr])
        k2 = ~np.isin(self.pod_of[idle], self.pod_of[arr])
        return [int(x) for x in idle[np.lexsort((idle, k2, k1))[:k]]]

    def _preempt_for(self, j: _Job, t: float, need: int) -> bool:
        """Pick lower-priority running jobs covering ``need`` nodes (cheapest first: lowest
        priority, then least work lost or least save time, then the newest) and give notice.
        Returns True when a victim released its nodes at once (the pass must rerun)."""
        if need <= 0 or t - j.queue_since < self.cfg.preempt_after_s:
            return False
        exempt = t - self.cfg.preempt_exempt_s
        if self._victims is None:  # nodes of the preemptible by priority, once per pass
            vs = sorted((v.prio, v.size) for v in (self.jobs[i] for i in self.running)
                        if v.claimed_by is None and v.phase == RUN and v.t_a <= exempt)
            self._victims = ([p for p, _ in vs], [0, *np.cumsum([n for _, n in vs]).tolist()])
        prios, below = self._victims
        if below[bisect.bisect_left(prios, j.prio)] < need:
            return False
        self._victims = None
        cands = [v for v in (self.jobs[i] for i in self.running) if v.prio < j.prio
                 and v.claimed_by is None and v.phase == RUN and v.t_a <= exempt]
        kill = self.pol.preempt == "kill"

        def cost(v: _Job) -> float:
            if kill:
                m = self._m_at(v, t)
                lost = (m - self._durable(v, t, m)) * v.d if m else 0.0
            else:
                lost = v.W
            return lost * v.size
        cands.sort(key=lambda v: (v.prio, cost(v), -v.t_a, v.id))
        picked, got = [], 0
        for v in cands:
            if got >= need:
                break
            picked.append(v)
            got += v.size
        for v in sorted(picked, key=lambda v: -v.size):
            if got - v.size >= need:
                picked.remove(v)
                got -= v.size
        if not j.claiming:
            j.claiming = True
            self.claimants.append(j.id)
        j.await_ += got
        released = False
        for v in picked:
            v.claimed_by = j.id
            released |= self._notice(v, j, t, kill)
        return released

    def _notice(self, v: _Job, by: _Job, t: float, kill: bool) -> bool:
        """Preemption notice to v; True when its nodes are free at once."""
        self.counts["preemptions"] += 1
        v.n_preempt += 1
        m = self._m_at(v, t)
        rec = {"t_s": t, "victim": v.spec.name, "by": by.spec.name,
               "mode": "kill" if kill else "ckpt", "step": v.base + m,
               "checkpoint_step": v.base, "lost_s": 0.0, "stall_s": 0.0, "nodes": v.size,
               "outcome": "killed"}
        self.preempts.append(rec)
        if kill or m == 0:  # kill, or still starting up: nothing to save
            if m:
                rec["checkpoint_step"] = v.base + self._durable(v, t, m)
            else:
                rec["outcome"] = "stopped in start-up"
            loss = self._settle(v, t, _KILLED)
            rec["lost_s"] = loss
            v.preempt_loss += loss
            self._end_attempt(v, t, "preempted")
            self._release(v)
            self._requeue(v, t)
            return True
        em = self._E(v, m)
        if m % v.K == 0 and m < v.rem and t < em + v.C:
            sm, ts = m, em + v.C  # in a regular save: it completes, then the notice save
        elif t <= em:
            sm, ts = m, em
        else:
            sm, ts = m + 1, self._E(v, m + 1)  # the step in flight completes
        if sm >= v.rem:  # it finishes with that step: its end releases the nodes
            rec["outcome"] = "finished"
            return False
        rec["step"] = rec["checkpoint_step"] = v.base + sm
        rec["stall_s"] = v.W
        rec["outcome"] = "saving"
        v.prec = rec
        v.phase, v.save_m, v.save_t = SAVING, sm, ts
        v.epoch += 1
        self.running.discard(v.id)
        self.saving.add(v.id)
        self._push(ts + v.W, _SAVED, v.id, v.epoch)
        return False

    # ------------------------------------------------------------------ the end

    def _finish(self, T: float) -> None:
        for j in self.jobs:
            if j.phase == RUN:
                self._settle(j, T, _ENDED)
                self._end_attempt(j, T, "end")
            elif j.phase == SAVING:
                if j.save_t > T:
                    self._settle(j, T, _ENDED)
                else:
                    self._settle(j, j.save_t, _SAVE, m=j.save_m)
                    j.b[_STALL] += T - j.save_t
                self._end_attempt(j, min(T, j.save_t), "end")
            elif j.phase in (SWAPPING, PENDING, HOLDING) and j.first_start is not None:
                j.b[_QUEUE] += T - j.queue_since
            if j.phase in (PENDING, HOLDING, SWAPPING) and j.submit <= T:
                wait = T - j.queue_since
                j.queue_total += wait
                j.longest_wait = max(j.longest_wait, wait)

    def _result(self) -> ClusterResult:
        cfg, T, N = self.cfg, self.T, self.N
        rows = []
        tot_ns = dict.fromkeys(BUCKETS, 0.0)
        topo_ns = 0.0
        for j in self.jobs:
            b = j.b
            started = j.first_start is not None
            parts = {"detection": b[_DET], "queue": b[_QUEUE], "init": b[_INIT],
                     "restore": b[_RESTORE], "warmup": b[_WARM], "unattributed": 0.0}
            buckets = {"productive": b[_PROD], "straggler_wait": b[_STRAG],
                       "checkpoint_stall": b[_STALL], "recompute": b[_RECOMP],
                       "restart": sum(parts.values()), "other": b[_OTHER]}
            end = j.end if j.end is not None else (T if started else None)
            wall = (end - j.first_start) if started else 0.0
            for k in BUCKETS:
                tot_ns[k] += buckets[k] * j.size
            topo_ns += j.topo_slow * j.size
            submitted = j.submit <= T
            first_wait = j.first_wait if started else (T - j.submit if submitted else None)
            rows.append({
                "name": j.spec.name, "owner": self.owner_names[j.owner], "priority": j.prio,
                "nodes": j.size, "submit_s": j.submit, "first_start_s": j.first_start,
                "end_s": end, "status": _PHASE[j.phase] if submitted else "future",
                "wall_clock_s": wall, "goodput": buckets["productive"] / wall if wall else None,
                "buckets": buckets, "restart_parts": parts, "first_wait_s": first_wait,
                "queue_wait_s": (j.queue_total if started else first_wait),
                "longest_wait_s": j.longest_wait if started else first_wait,
                "preemption_loss_s": j.preempt_loss, "preemptions": j.n_preempt,
                "failures": j.n_fail, "attempts": j.n_attempts,
                "topology_slowdown_s": j.topo_slow, "work_s": j.spec.work_s,
                "progress": min(1.0, j.base / j.S), "checkpoint_interval_s": j.interval_s,
                "checkpoint_stall_each_s": j.C, "checkpoint_write_s": j.W,
                "turnaround_s": (end - j.submit) if j.end is not None else None})
        sub = [r for r in rows if r["status"] not in ("future", "rejected")]
        waits = np.array([r["first_wait_s"] for r in sub]) if sub else np.zeros(0)
        done = [r for r in sub if r["status"] == "done"]
        starve = max(sub, key=lambda r: (r["longest_wait_s"] or 0.0), default=None)
        cap = N * T
        ns = dict(self.ns)
        ns.update(total=cap, productive=tot_ns["productive"],
                  useful=tot_ns["productive"] - topo_ns,
                  **{f"job_{k}": v for k, v in tot_ns.items() if k != "productive"})
        owners = {}
        tot_own = sum(self.owner_ns) or 1.0
        for o, name in enumerate(self.owner_names):
            mine = [r for r in sub if r["owner"] == name]
            w = np.array([r["first_wait_s"] for r in mine]) if mine else np.zeros(0)
            owners[name] = {
                "share_target": self.share[o], "share_used": self.owner_ns[o] / tot_own,
                "node_s": self.owner_ns[o], "jobs": len(mine),
                "done": sum(r["status"] == "done" for r in mine),
                "mean_wait_s": float(w.mean()) if len(w) else None,
                "p95_wait_s": float(np.percentile(w, 95)) if len(w) else None,
                "max_wait_s": float(w.max()) if len(w) else None,
                "queue_wait_s": float(sum(r["queue_wait_s"] or 0.0 for r in mine))}
        alloc_run = sum(r["wall_clock_s"] * r["nodes"] for r in sub) or 1.0
        cluster = {
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
            "mean_topology_penalty": float(np.average(
                [a[6] for a in self.attempts], weights=[a[3] for a in self.attempts]))
            if self.attempts else 0.0,
            "held_idle_node_s": ns["held_idle"], "events": self.events, **self.counts}
        attempts = [dict(zip(("job", "start_s", "end_s", "nodes", "racks", "pods", "penalty",
                              "end"), a)) for a in self.attempts]
        tl = dict(self.tl)
        tl["owners"] = {n: self.tl_owner[o] for o, n in enumerate(self.owner_names)}
        conf = {"description": cfg.describe(), "nodes": N, "racks": self.R, "pods": self.P,
                "gpus_per_node": cfg.gpus_per_node, "nodes_per_rack": cfg.nodes_per_rack,
                "racks_per_pod": cfg.racks_per_pod, "duration_s": T, "jobs": len(rows)}
        return ClusterResult(self.pol.describe(), self.seed, conf, cluster, owners, rows,
                             self.preempts, attempts, tl)


def _water_fill(need: list[int], F: int) -> list[int]:
    """Hand F nodes out one per job per round, in order: equal grants capped by each need."""
    g = [0] * len(need)
    live = [i for i, n in enumerate(need) if n > 0]
    while F > 0 and live:
        share = F // len(live)
        if share == 0:
            for i in live[:F]:
                g[i] += 1
            break
        step = min(share, min(need[i] - g[i] for i in live))
        for i in live:
            g[i] += step
        F -= step * len(live)
        live = [i for i in live if g[i] < need[i]]
    return g


_W0: dict[tuple, float] = {}


def _noise_wait(f: Any, nodes: int, gpn: int, step_s: float, npr: int) -> float:
    """The run simulator's per-step straggler wait (w0) for a job of ``nodes`` nodes."""
    key = (nodes, gpn, step_s, npr, f.compute_fraction, f.compute_noise_sigma)
    if key not in _W0:
        c = replace(f, nodes=nodes, gpus_per_node=gpn, step_s=step_s, elastic="restart",
                    spares=0, nodes_per_switch=npr)
        _W0[key] = _prepare(c).w0
    return _W0[key]
