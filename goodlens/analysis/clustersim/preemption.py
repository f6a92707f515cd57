"""Preemption in the cluster simulator: which running jobs give way to a waiting one of higher
priority, and what giving way costs them (a kill, or a checkpoint first).

Why it exists: preemption is the scheduler lever with the sharpest trade-off (less waiting for
the important jobs against lost work for the others), and its rules are the subtlest: whom to
pick (cheapest first), what a notice during a save or a step in flight does, and when the
nodes are free. The scheduling passes (:mod:`goodlens.analysis.clustersim.scheduling`) call
:meth:`PreemptionMixin.preempt_for`.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from goodlens.analysis.clustersim.config import ClusterConfig, Policy
from goodlens.analysis.clustersim.jobs import Bucket, Event, Job, Phase, Settle


class PreemptionMixin:
    """Preemption for :class:`~goodlens.analysis.clustersim.sim.ClusterSim` (its job list,
    queue sets, claimants and the job-state methods)."""

    cfg: ClusterConfig
    pol: Policy
    horizon: float
    jobs: list[Job]
    running: set[int]
    saving: set[int]
    claimants: list[int]
    victims: tuple[list[int], list[int]] | None
    counts: dict[str, int]
    preempts: list[dict[str, Any]]
    push: Any
    end_attempt: Any
    release: Any
    requeue: Any

    def preempt_for(self, j: Job, t: float, need: int) -> bool:
        """Pick lower-priority running jobs covering ``need`` nodes (cheapest first: lowest
        priority, then least work lost or least save time, then the newest) and give notice.
        Returns True when a victim released its nodes at once (the pass must rerun)."""
        if need <= 0 or t - j.queue_since < self.cfg.preempt_after_s:
            return False
        exempt = t - self.cfg.preempt_exempt_s
        running = Phase.RUNNING
        if self.victims is None:  # nodes of the preemptible by priority, once per pass
            vs = sorted((v.priority, v.size) for v in (self.jobs[i] for i in self.running)
                        if v.claimed_by is None and v.phase == running
                        and v.attempt_start <= exempt)
            self.victims = ([p for p, _ in vs], [0, *np.cumsum([n for _, n in vs]).tolist()])
        prios, below = self.victims
        if below[bisect.bisect_left(prios, j.priority)] < need:
            return False
        self.victims = None
        cands = [v for v in (self.jobs[i] for i in self.running) if v.priority < j.priority
                 and v.claimed_by is None and v.phase == running and v.attempt_start <= exempt]
        kill = self.pol.preempt == "kill"

        def cost(v: Job) -> float:
            if kill:
                m = v.steps_done_at(t)
                lost = (m - v.durable_steps(t, m)) * v.step_wall_s if m else 0.0
            else:
                lost = v.ckpt_write_s
            return lost * v.size
        cands.sort(key=lambda v: (v.priority, cost(v), -v.attempt_start, v.id))
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
        j.awaited_nodes += got
        released = False
        for v in picked:
            v.claimed_by = j.id
            released |= self._notice(v, j, t, kill)
        return released

    def _notice(self, v: Job, by: Job, t: float, kill: bool) -> bool:
        """Preemption notice to v; True when its nodes are free at once."""
        self.counts["preemptions"] += 1
        v.n_preemptions += 1
        m = v.steps_done_at(t)
        rec = {"t_s": t, "victim": v.spec.name, "by": by.spec.name,
               "mode": "kill" if kill else "ckpt", "step": v.saved_steps + m,
               "checkpoint_step": v.saved_steps, "lost_s": 0.0, "stall_s": 0.0,
               "nodes": v.size, "outcome": "killed"}
        self.preempts.append(rec)
        if kill or m == 0:  # kill, or still starting up: nothing to save
            if m:
                rec["checkpoint_step"] = v.saved_steps + v.durable_steps(t, m)
            else:
                rec["outcome"] = "stopped in start-up"
            loss = v.settle(t, Settle.KILLED, self.horizon)
            rec["lost_s"] = loss
            v.preempt_loss += loss
            self.end_attempt(v, t, "preempted")
            self.release(v)
            self.requeue(v, t)
            return True
        em = v.step_end(m)
        if m % v.ckpt_every_steps == 0 and m < v.steps_left and t < em + v.ckpt_stall_s:
            sm, ts = m, em + v.ckpt_stall_s  # in a regular save: it completes, then the notice's
        elif t <= em:
            sm, ts = m, em
        else:
            sm, ts = m + 1, v.step_end(m + 1)  # the step in flight completes
        if sm >= v.steps_left:  # it finishes with that step: its end releases the nodes
            rec["outcome"] = "finished"
            return False
        rec["step"] = rec["checkpoint_step"] = v.saved_steps + sm
        rec["stall_s"] = v.ckpt_write_s
        rec["outcome"] = "saving"
        v.preempt_record = rec
        v.phase, v.save_step, v.save_start = Phase.SAVING, sm, ts
        v.epoch += 1
        self.running.discard(v.id)
        self.saving.add(v.id)
        self.push(ts + v.ckpt_write_s, Event.SAVED, v.id, v.epoch)
        return False

    def on_saved(self, j: Job, t: float) -> None:
        """A preemption save is durable: the attempt keeps all its steps, the save's time is
        a checkpoint stall (and preemption loss), and the job goes back to the queue."""
        j.settle(j.save_start, Settle.SAVE, self.horizon, m=j.save_step)
        j.buckets[Bucket.CHECKPOINT_STALL] += t - j.save_start
        j.preempt_loss += t - j.save_start
        if j.preempt_record is not None:
            j.preempt_record["outcome"], j.preempt_record = "saved", None
        self.end_attempt(j, j.save_start, "preempted")
        self.release(j)
        self.requeue(j, t)
