"""The run simulator's per-step fault tolerance (torchft-style): a failed replica group drops
out and rejoins while the rest of the job goes on.

Why it exists: this policy is a second path through a trial beside the restart path, which
:mod:`goodlens.analysis.runsim.trial` is the home of: no queue and no start-up, the job's step
counts running on across group changes. Its rules are kept here, as the methods of
:class:`PerStepPolicy` that :class:`~goodlens.analysis.runsim.trial.Trial` inherits (they read
and write the trial's state), and the trial calls them where its own path would stop the job.

Rules: the world is ``replica_groups`` groups of ``nodes / replica_groups`` nodes, each with
its own local batch, so a step without a group takes as long and commits fewer samples. A
failure takes out one group (a wide one too, as for shrink and spares) and the job never
stops: the step in flight is discarded (its whole duration recompute, the others learn of the
loss at its end), then one quorum membership change (``quorum_s``, ``other``'s part
``quorum``), and the steps go on short. The group's way back starts at detection:
``group_restart_s`` then a heal from a peer (``heal_bytes / heal_bandwidth_Bps``), or only the
heal when a hot spare group is free (the restarted group becomes the spare); it is admitted at
the end of the step in flight, after that step's save, with another quorum change. Its absent
GPU-seconds show only in the GPU-time view (idle allocated) and the sample view. A failure
that would leave fewer than ``min_replicas`` groups, or any failure during a start-up,
restarts the whole job (the restart path, all groups back). Planned interruptions and
evictions take the restart path.
"""

from __future__ import annotations

import bisect

import numpy as np

from goodlens.analysis.runsim.config import Elastic, SimConfig, Stop

__all__ = ["PerStepPolicy"]

# module-level references to the members, as in the trial loop (enum lookups are slow in 3.11)
FAILURE, RUN_END, DROP, PER_STEP = Stop.FAILURE, Stop.RUN_END, Stop.DROP, Elastic.PER_STEP


class PerStepPolicy:
    """The ``per_step`` policy's part of a trial: its state (which groups are out, whether
    the next attempt goes on rather than starts) and the methods that drop, replace and
    readmit a group. Only :class:`~goodlens.analysis.runsim.trial.Trial` uses it, which
    provides everything else ``self`` reads here (config, counts, ledger, schedule, ...)."""

    __slots__ = ("continuing", "group_nodes", "grow_pos")

    def init_groups(self, c: SimConfig) -> None:
        """The policy's state at the run's start: every group up."""
        self.grow_pos: list[int] = []
        """The position of each missing group (``grow_at``'s order); its nodes are Weibull
        slots ``pos * group_nodes`` on."""
        self.group_nodes = c.nodes // c.replica_groups
        self.continuing = False
        """The next attempt goes on after a group dropped out or rejoined (no start-up, no
        warm-up, not an attempt of its own)."""

    def can_absorb(self) -> bool:
        """``per_step``: whether the job goes on without one more group (at least
        ``min_replicas`` groups left)."""
        return (self.elastic is PER_STEP
                and self.world // self.group_nodes - 1 >= self.config.min_replicas)

    def fail_in_first_step(self, t_fail: float) -> bool:
        """``per_step``, going on after a group change: a failure (or the run's end) before
        the first step ends. No start-up to charge: the step in flight is the only loss."""
        c, a = self.config, self.seconds
        T, R = c.duration_s, self.restart_count
        self.pieces = []
        if t_fail >= T:  # the run ends in the step: shutdown, as any step in flight then
            a["other"] += T - self.now
            self.record(RUN_END, m_end=R)
            return False
        if self.can_absorb():
            return self.drop_group(t_fail, R, self.now, self.first_step_s)
        det_s, wide = self.draw_failure()
        t_det = t_fail + det_s
        tail = min(t_det, T) - self.now
        a["recompute"] += min(self.first_step_s, tail)
        a["detection"] += tail - min(self.first_step_s, tail)
        self.record(FAILURE, m_end=R, t_det=t_det, t_fail=t_fail, fail=self.last_failure)
        D = self.durable_count
        Mm = D if wide else max(self.memory_count, D)
        self.memory_count = Mm
        self.restart_count = Mm if self.tiered else D
        self.ledger.commit(D)
        self.now = self.relaunch(t_fail, t_det, self.tiered and Mm > D)
        return True

    def keep_saves(self, m: int) -> None:
        """The job goes on after step ``m`` (``per_step``): saves up to it stand as a later
        job restart's restore points, its steps are final up to the durable one."""
        sched, R = self.schedule, self.restart_count
        kd, km = sched.durable_every, sched.memory_every
        D = self.durable_count
        D = max(D, m // kd * kd) if m // kd * kd > R else D
        self.memory_count = max(self.memory_count, D,
                                m // km * km if self.tiered and m // km * km > R else 0)
        self.durable_count, self.restart_count = D, m
        self.ledger.commit(D)
        self.init_s, self.restore_s, self.from_memory = 0.0, 0.0, False
        self.continuing = True

    def drop_group(self, t_fail: float, m: int, ts: float, d: float) -> bool:
        """``per_step``: a group failed at ``t_fail`` after step ``m``; the others' step in
        flight (from ``ts``, ``d`` long) is discarded, a quorum forms without the group, and
        the job goes on short. The group is back after its restart and heal (a free spare
        group: the heal only)."""
        c, cnt, g = self.config, self.counts, self.group_nodes
        det_s, _ = self.draw_failure()
        cnt["group_failures"] += 1
        cnt["quorum_changes"] += 1
        e = ts + d
        self.add_span("recompute", ts, e)
        self.add_span("quorum", e, e + c.quorum_s)
        t_det = t_fail + det_s
        self.record(DROP, m_end=m, t_det=t_det, t_fail=t_fail, fail=self.last_failure)
        spare = self.take_spare_group(t_det)
        back = t_det + (0.0 if spare else c.group_restart_s) + c.heal_s
        nf = self.node_fail_at
        if nf is not None:  # the failed node's group: its slots wait for the rejoin
            pos = self.failing_slot // g
            nf[pos * g:(pos + 1) * g] = np.inf
        else:  # exponential failures: which group is immaterial, the lowest one up
            out = set(self.grow_pos)
            pos = next(i for i in range(c.replica_groups) if i not in out)
        i = bisect.bisect_right(self.grow_at, back)
        self.grow_at.insert(i, back)
        self.grow_pos.insert(i, pos)
        self.world -= g
        self.keep_saves(m)
        self.now = e + c.quorum_s
        return True

    def take_spare_group(self, t: float) -> bool:
        """``per_step``: a free hot spare group fills in from ``t``; the failed group,
        restarted, is the spare from ``group_restart_s`` later. False when none is free."""
        free = [i for i, x in enumerate(self.spare_free_at) if x <= t]
        if not free:
            return False
        self.spare_free_at[free[0]] = t + self.config.group_restart_s
        self.counts["spare_swaps"] += 1
        return True

    def rejoin(self, m_end: int, t_end: float) -> None:
        """``per_step``: a healed group is admitted at the end of step ``m_end`` (after the
        save due there): one quorum change, and the job goes on with it."""
        c, g = self.config, self.group_nodes
        sk = self.schedule.stall_at(m_end)
        self.seconds["checkpoint_stall"] += sk
        self.grow_at.pop(0)
        pos = self.grow_pos.pop(0)
        if self.node_fail_at is not None:  # fresh nodes: their ages start over
            self.node_fail_at[pos * g:(pos + 1) * g] = -1.0
        self.world += g
        self.counts["rejoins"] += 1
        self.counts["quorum_changes"] += 1
        self.keep_saves(m_end)
        self.add_span("quorum", t_end + sk, t_end + sk + c.quorum_s)
        self.now = t_end + sk + c.quorum_s
