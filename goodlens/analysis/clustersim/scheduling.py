"""The scheduler of the cluster simulator: queue order (FIFO or fair share) and allocation
(gang with EASY backfilling, or partial, node by node).

Why it exists: queue order and allocation are the scheduler levers the simulator compares;
they decide who waits and how long, and they are policy, not mechanics. A scheduling pass runs
whenever the cluster changed (a submit, a release, a repair, a wake-up); it starts jobs,
grants partial nodes, and asks :mod:`goodlens.analysis.clustersim.preemption` for victims
when a job cannot start.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from goodlens.analysis.clustersim.config import ClusterConfig, Policy
from goodlens.analysis.clustersim.jobs import INF, Event, Job, Phase
from goodlens.analysis.runsim.config import SimConfig


class SchedulingMixin:
    """Scheduling passes of :class:`~goodlens.analysis.clustersim.sim.ClusterSim` (its queue
    sets, owners' usage, counters and the job-state and placement methods)."""

    cfg: ClusterConfig
    f: SimConfig
    pol: Policy
    jobs: list[Job]
    pending: set[int]
    running: set[int]
    saving: set[int]
    claimants: list[int]
    victims: tuple[list[int], list[int]] | None
    usage: list[float]
    owner_alloc: list[int]
    share: list[float]
    decay_rate: float
    counts: dict[str, int]
    n_free: int
    n_held: int
    dirty: bool
    push: Any
    start: Any
    take: Any
    place: Any
    pick_partial: Any
    preempt_for: Any

    def queue_order(self, t: float) -> Iterator[Job]:
        """Eligible waiting jobs in queue order. FIFO: by priority, then submit time. Fair
        share: repeatedly the best-scoring owner's next job, score = usage/share - priority x
        priority_weight - age/aging_s, an owner's usage being its decayed node-seconds plus
        its current allocation times the decay's mean life (so a start within this pass
        counts at once, and one owner cannot take a whole pass's free nodes)."""
        elig = [self.jobs[i] for i in self.pending if self.jobs[i].backoff_until <= t]
        if not self.pol.fair:
            yield from sorted(elig, key=lambda j: (-j.priority, j.submit, j.id))
            return
        aging, pw, tau = self.cfg.aging_s, self.cfg.priority_weight, 1 / self.decay_rate
        per: dict[int, list[Job]] = {}
        for j in elig:
            per.setdefault(j.owner, []).append(j)
        for q in per.values():
            q.sort(key=lambda j: (-(pw * j.priority + (t - j.submit) / aging), j.submit, j.id))
        heads = dict.fromkeys(sorted(per), 0)
        usage, alloc, share = self.usage, self.owner_alloc, self.share
        while heads:
            tot = sum(usage) + tau * sum(alloc)
            best: tuple | None = None
            for o, k in heads.items():
                j = per[o][k]
                ratio = (usage[o] + tau * alloc[o]) / tot / share[o] if tot > 0 else 0.0
                key = (ratio - pw * j.priority - (t - j.submit) / aging, j.submit, j.id, o)
                if best is None or key < best:
                    best = key
            o = best[3]
            j = per[o][heads[o]]
            heads[o] += 1
            if heads[o] == len(per[o]):
                del heads[o]
            yield j

    @staticmethod
    def claim(j: Job) -> int:
        """Free nodes reserved for j's preemption claim (its size less what its victims will
        hand over)."""
        return max(0, j.size - j.awaited_nodes) if j.claiming else 0

    def schedule_pass(self, t: float) -> None:
        """One pass over the queue under the policy's allocation mode."""
        self.dirty = False
        self.victims = None
        if self.pol.gang:
            self._gang_pass(t, self.queue_order(t))
        else:
            self._partial_pass(t, list(self.queue_order(t)))

    def _gang_pass(self, t: float, order: Iterator[Job]) -> None:
        """First fit in queue order with EASY backfilling (``reserve_after_s``)."""
        claims = sum(self.claim(self.jobs[i]) for i in self.claimants)
        free_for = self.n_free - claims
        shadow, extra = INF, 0  # the reservation: when, and the nodes it leaves spare
        f = self.f
        for j in order:
            own = self.claim(j)
            if j.size <= free_for + own:
                if shadow < INF and not own and \
                        t + j.estimate_s(self.cfg.estimate_factor, f.init_s, f.warmup_s) > shadow:
                    if j.size > extra:
                        continue  # would delay the reserved job
                    extra -= j.size
                free_for -= j.size - own
                self.start(j, t, self.take(j, self.place(j.size)))
                continue
            if self.pol.preempt != "none" and not (j.claiming and j.awaited_nodes > 0):
                if self.preempt_for(j, t, j.size - (free_for + own)):
                    return  # nodes changed: the pass runs again
                if j.claiming and j.awaited_nodes == 0:  # no victims left: drop the claim
                    j.claiming = False
                    self.claimants.remove(j.id)
                free_for -= self.claim(j) - own  # a new claim holds free nodes for it
            if shadow == INF and not j.claiming and \
                    t - j.queue_since >= self.cfg.reserve_after_s:
                shadow, extra = self._shadow(j, t, free_for)

    def _shadow(self, j: Job, t: float, free_for: int) -> tuple[float, int]:
        """EASY: when j could start as running jobs end (by their estimates), and how many
        nodes beyond j's would be free then."""
        f = self.cfg.estimate_factor
        ends = []
        for i in self.running:
            v = self.jobs[i]
            ends.append((v.attempt_start + f * (v.step_end(v.steps_left) - v.attempt_start),
                         v.size))
        for i in self.saving:
            v = self.jobs[i]
            ends.append((v.save_start + v.ckpt_write_s, v.size))
        avail = free_for
        for e, n in sorted(ends):
            avail += n
            if avail >= j.size:
                return max(e, t), avail - j.size
        return INF, 0

    def _partial_pass(self, t: float, order: list[Job]) -> None:
        """Nodes handed out one at a time, round-robin over the queue within the highest
        priority first (like pods of many jobs scheduled independently, by pod priority); a
        job runs once it holds all of its nodes."""
        free = self.n_free
        for j in [j for j in order if j.claiming]:
            g = min(free, j.size - len(j.held))
            if g:
                self._grant(j, g, t)
                free -= g
        cands = [j for j in order if not j.claiming]
        for prio in sorted({j.priority for j in cands}, reverse=True):  # higher classes first
            tier = [j for j in cands if j.priority == prio]
            need = [j.size - len(j.held) for j in tier]
            for j, g in zip(tier, water_fill(need, free)):
                if g:
                    self._grant(j, g, t)
                    free -= g
        for j in order:
            if len(j.held) == j.size:
                held = j.held
                self.n_held -= len(held)
                self.start(j, t, held)
        if self.pol.preempt != "none":
            waiting = (Phase.HOLDING, Phase.PENDING)
            for j in order:
                if j.phase in waiting and not (j.claiming and j.awaited_nodes > 0) and \
                        self.preempt_for(j, t, j.size - len(j.held) - self.n_free):
                    return

    def _grant(self, j: Job, g: int, t: float) -> None:
        """``g`` more nodes to j's partial allocation; its first grant starts the hold's
        timeout."""
        pick = self.pick_partial(j, g)
        first = not j.held
        j.held.extend(self.take(j, pick))
        self.n_held += g
        if len(j.held) < j.size:
            self.counts["partial_grants"] += 1
        if first:
            j.phase = Phase.HOLDING
            j.epoch += 1
            self.push(t + self.cfg.partial_timeout_s, Event.HOLD_TIMEOUT, j.id, j.epoch)


def water_fill(need: list[int], free: int) -> list[int]:
    """Hand ``free`` nodes out one per job per round, in order: equal grants capped by each
    need."""
    g = [0] * len(need)
    live = [i for i, n in enumerate(need) if n > 0]
    while free > 0 and live:
        share = free // len(live)
        if share == 0:
            for i in live[:free]:
                g[i] += 1
            break
        step = min(share, min(need[i] - g[i] for i in live))
        for i in live:
            g[i] += step
        free -= step * len(live)
        live = [i for i in live if g[i] < need[i]]
    return g

