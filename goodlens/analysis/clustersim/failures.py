"""Node failures in the cluster simulator: when nodes fail, what a failure takes down, how a
job notices, and how it comes back (hot spares, or the queue).

Why it exists: failures are the run simulator's model applied to a shared cluster, and the
rules that join the two (a rack-wide failure hits every job on the rack; a node down already
absorbs a failure; a job detects after the crash or hang delay; a hot spare, if one is idle,
swaps in instead of a requeue) are separate from scheduling. The failure clock and the cause
draws come from their own random streams, so every policy sees the same failures.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

from goodlens.analysis.clustersim.config import Policy
from goodlens.analysis.clustersim.jobs import Bucket, Event, Job, Phase, Settle
from goodlens.analysis.runsim.config import SimConfig
from goodlens.analysis.runsim.trial import Draws


class FailureMixin:
    """Failure and repair events of :class:`~goodlens.analysis.clustersim.sim.ClusterSim`
    (its node state, job list, counters and the job-state methods it defines)."""

    f: SimConfig
    pol: Policy
    fail_draws: Draws
    cause_draws: Draws
    weibull: bool
    weibull_scale: float
    cause_cdf: list[float]
    hang_prob: list[float]
    wide_prob: list[float]
    horizon: float
    jobs: list[Job]
    counts: dict[str, int]
    node_job: np.ndarray
    down: np.ndarray
    down_until: np.ndarray
    spare: np.ndarray
    free_mask: np.ndarray
    rack_free: np.ndarray
    rack_of: np.ndarray
    rack_lo: np.ndarray
    rack_hi: np.ndarray
    saving: set[int]
    owner_alloc: list[int]
    n_alloc: int
    n_held: int
    n_free: int
    n_down: int
    n_spare_idle: int
    n_spare_role: int
    dirty: bool
    push: Any
    free_node: Any
    release: Any
    requeue: Any
    start: Any
    end_attempt: Any
    pick_spares: Any

    def time_to_failure(self) -> float:
        """A node's next time to failure (exponential or Weibull of mean ``node_mtbf_s``)."""
        e = -math.log(1.0 - self.fail_draws.uni())
        return self.weibull_scale * e ** (1 / self.f.weibull_shape) if self.weibull \
            else e * self.f.node_mtbf_s

    def on_fail(self, m: int, t: float) -> None:
        """Node m fails: draw the cause (hang? rack-wide?), take the nodes down until the
        repair, and fail the jobs on them."""
        f = self.f
        if self.down[m]:  # down already (its rack's switch): absorbed, the clock restarts
            self.counts["absorbed_failures"] += 1
            self.push(self.down_until[m] + self.time_to_failure(), Event.FAIL, m, 0)
            return
        cd = self.cause_draws
        ci = bisect.bisect_right(self.cause_cdf, cd.uni())
        hang, wide = cd.uni() < self.hang_prob[ci], cd.uni() < self.wide_prob[ci]
        self.counts["failures"] += 1
        self.counts["hangs"] += hang
        self.counts["wide_failures"] += wide
        det = f.detect_hang_s if hang else f.detect_crash_s
        until = t + f.repair_s
        self.push(until + self.time_to_failure(), Event.FAIL, m, 0)
        r = int(self.rack_of[m])
        targets = range(int(self.rack_lo[r]), int(self.rack_hi[r])) if wide else (m,)
        hit: dict[int, Job] = {}
        for x in targets:
            if self.down[x]:
                if until > self.down_until[x]:
                    self.down_until[x] = until
                    self.push(until, Event.REPAIR, x, 0)
                continue
            j = self.node_down(x, until)
            if j is not None:
                hit[j.id] = j
        for j in hit.values():
            self.job_fail(j, t, det)

    def node_down(self, x: int, until: float) -> Job | None:
        """Node x goes down until ``until``; returns the job whose attempt it breaks (None:
        it was free, a spare, or part of a partial hold, which just shrinks)."""
        self.down[x] = True
        self.down_until[x] = until
        self.push(until, Event.REPAIR, x, 0)
        self.n_down += 1
        jid = int(self.node_job[x])
        if jid >= 0:
            j = self.jobs[jid]
            self.node_job[x] = -1
            self.n_alloc -= 1
            self.owner_alloc[j.owner] -= 1
            if j.phase == Phase.HOLDING:
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

    def on_repair(self, x: int, t: float) -> None:
        """Node x is back (unless a later failure extended its repair): it refills the spare
        pool first, else it is free."""
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
            self.free_node(x)
        self.dirty = True

    def job_fail(self, j: Job, t: float, det: float) -> None:
        """A failure at t breaks j's attempt; it is detected ``det`` later."""
        tdet = t + det
        if j.phase in (Phase.RUNNING, Phase.SAVING):
            mcap = j.save_step if j.phase == Phase.SAVING else None
            self.saving.discard(j.id)
            if j.preempt_record is not None:  # the notice save never completed
                rec = j.preempt_record
                rec["outcome"], rec["stall_s"] = "failed while saving", 0.0
                j.preempt_record = None
            j.settle(t, Settle.FAILED, self.horizon, tdet, mcap)
            self.end_attempt(j, t, "failure")
        elif j.phase == Phase.SWAPPING:
            j.buckets[Bucket.QUEUE] += t - j.queue_since
            j.buckets[Bucket.DETECTION] += min(tdet, self.horizon) - t
        else:  # detecting already: the same detection covers it
            return
        j.n_failures += 1
        j.phase = Phase.DETECTING
        j.epoch += 1
        self.push(tdet, Event.DETECT, j.id, j.epoch)

    def on_detect(self, j: Job, t: float) -> None:
        """j's failure is detected: swap in idle hot spares for its lost nodes when there are
        enough (and it is not being preempted), else release it to the queue."""
        mine = [x for x in j.nodes if self.node_job[x] == j.id]
        lost = j.size - len(mine)
        if self.pol.spares and 0 < lost <= self.n_spare_idle and j.claimed_by is None:
            picks = self.pick_spares(mine, lost)
            for x in picks:
                self.spare[x] = False
                self.n_spare_role -= 1
                self.n_spare_idle -= 1
                self.node_job[x] = j.id
                self.n_alloc += 1
                self.owner_alloc[j.owner] += 1
            j.nodes = mine + picks
            j.phase, j.queue_since = Phase.SWAPPING, t
            j.epoch += 1
            self.counts["spare_swaps"] += 1
            self.push(t + self.f.spare_swap_s, Event.SWAP, j.id, j.epoch)
            return
        self.release(j)
        self.requeue(j, t)

    def on_swap(self, j: Job, t: float) -> None:
        """The spares are in: a new attempt on the same job's nodes."""
        self.start(j, t, j.nodes)
