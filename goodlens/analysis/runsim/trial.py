"""The simulator's trial loop: one run, attempt by attempt, in the buckets of accounting.

Why it exists: users plan a checkpoint interval, a hot-spare count or an elastic policy before
the next run ("what if"), and the rest of goodlens needs runs whose true breakdown is known.
One trial is event-driven at the granularity of failures, checkpoints and straggler episodes,
never per step (steps between events are counted arithmetically), so a 54-day, 16,384-GPU run
takes milliseconds. Every second lands in the buckets of ``goodlens.analysis.accounting``, by the
same rules
(docs/accounting.md), so a trace written from a trial reports the same breakdown:

- the first attempt's start-up (init, restore, its first step's warm-up) is startup; every
  later attempt's is restart's (init, restore, warmup);
- the first step of an attempt: its excess over the attempt's other steps' median is
  warm-up (startup.warmup for the first attempt, restart.warmup after);
- a failure: the steps since the checkpoint that survives it are recompute, as is the partial
  step (the time after the last step, up to one median step); the rest until detection is
  restart.detection (the tail is painted without layers, as accounting does, so a save at that
  boundary lands there too); then queue until the next attempt, its init, restore, warm-up;
- steps are rolled back only once a later attempt completes a step (a run that ends while
  restarting keeps them); blocking saves between steps are checkpoint_stall even when the steps
  around them are rolled back; a lost step's straggler wait is recompute;
- the run is stopped at ``duration_s``: a step in flight then is ``other`` (shutdown), a save
  in progress checkpoint_stall, a restart in progress its own part.

Model choices (one place): failures hit only while an attempt runs (start-up included); a
node's failure during downtime is absorbed by the scheduler. Causes follow the Llama 3 table
(``FAILURE_CAUSES``, with our hang probability: network and NCCL timeouts mostly hang, GPU
memory and power mostly crash). Queue waits are lognormal by default (heavy-tailed scheduler
waits; ``queue_dist``), with mean ``queue_s``. Checkpoints are taken every K = interval/step
steps at step counts that are multiples of K; a checkpoint survives a failure once its durable
write finished (``write_s`` after the save starts, in every mode), a memory copy once its stall
ended. Planned interruptions and evictions take effect at the next step end: a durable save
(``write_s``, shown in restart.queue because accounting paints the time after ``preempted``
so), then the queue (or a spare). A tiered restore comes from a peer's memory copy when the
failure is single-node and that copy is newer than the durable one. Elastic: ``shrink`` goes
on with n-1 nodes right after detection (``reconfig_s`` as init, the usual restore), step time
x N/n (same global batch), and grows back at a step end when the node returns after
``repair_s`` (the save due there, then ``reconfig_s`` as init; nothing lost, no restore);
``spares`` swap a free spare in (``spare_swap_s`` instead of the queue), the failed node
becoming a spare again after ``repair_s``; a wide failure counts as one node for both.
Elastic ``per_step`` (a failed replica group drops out and rejoins while the job goes on) has
its rules in :mod:`goodlens.analysis.runsim.perstep`, whose methods :class:`Trial` inherits.
Straggler wait per step is max(noise, worst slowed subject): noise is E[max - median] of the
per-rank lognormal compute over all ranks (a seeded Monte Carlo of >= 16 steps, cached per
config); a subject of k ranks (a GPU's rank, a node, or every node behind a switch for a
degraded link) slowed by the active episodes on it and around it, s_1..s_j, costs
c0 ((1+s_1)...(1+s_j) E[max of k] - E[median]), c0 the median compute. Nested episodes
compound (a slow rank in a slow node behind a slow switch runs at the product of the three
factors, as its trace does); two episodes on the same subject compound too; disjoint ones do
not (:mod:`goodlens.analysis.runsim.episodes`).
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

from goodlens.analysis.accounting import BUCKETS, RESTART_PARTS, STARTUP_PARTS
from goodlens.analysis.runsim.config import (
    CAUSE_NAMES,
    DAY,
    FAILURE_CAUSES,
    INF,
    Elastic,
    SimConfig,
    SimResult,
    Stop,
)
from goodlens.analysis.runsim.episodes import draw_episodes
from goodlens.analysis.runsim.perstep import PerStepPolicy
from goodlens.analysis.runsim.prepared import Draws, Prepared, prepare, straggler_noise
from goodlens.analysis.runsim.steps import (
    CheckpointSchedule,
    Ledger,
    Piece,
    weighted_median,
)

__all__ = ["Draws", "Elastic", "Prepared", "Stop", "Trial", "prepare", "run_trial",
           "straggler_noise"]

COUNTS = ("failures", "hangs", "wide_failures", "startup_failures", "planned", "evictions",
          "evicted_nodes", "checkpoints", "memory_checkpoints", "memory_restores", "attempts",
          "shrinks", "grows", "spare_swaps", "straggler_episodes", "group_failures",
          "rejoins", "quorum_changes")
"""The counts of a :class:`SimResult`, in its order."""
STARTUP_KEYS = tuple(f"startup.{p}" for p in STARTUP_PARTS)
"""The ``seconds`` keys of the first attempt's start-up parts (restart's are plain names)."""


# Python 3.11 finds an enum member through ``EnumType.__getattr__`` (~0.3 us a lookup, a few per
# attempt): the trial's code compares against these module-level references to the members.
FAILURE, RUN_END, PLANNED, EVICTION, GROW = \
    Stop.FAILURE, Stop.RUN_END, Stop.PLANNED, Stop.EVICTION, Stop.GROW
SHRINK, SPARES, PER_STEP = Elastic.SHRINK, Elastic.SPARES, Elastic.PER_STEP


def run_trial(c: SimConfig, p: Prepared, rng: np.random.Generator,
              timeline: list | None = None,
              place: np.random.Generator | None = None) -> SimResult:
    """One run, attempt by attempt (rules in the module docstring). ``timeline`` (tests,
    :mod:`goodlens.analysis.runsim.tracegen`) receives each attempt's start-up, pieces and end,
    enough to rebuild its trace: also the failure (``fail``: cause, hang, wide), whether the
    restore read a memory copy (``from_mem``), the evicted episodes (``evicted``) and every
    straggler episode (``episodes``: onset, end, slowdown, cause, nodes, subject, ranks).
    ``place`` places the episodes (:func:`~goodlens.analysis.runsim.episodes.draw_episodes`;
    by default a stream spawned from ``rng``)."""
    return Trial(c, p, rng, timeline, place).run()


class Trial(PerStepPolicy):
    """One trial's state and its steps: :meth:`run` loops over attempts (:meth:`attempt`).

    An attempt starts (init, restore, a first step with warm-up) and either fails before its
    first step ends (:meth:`fail_in_startup`) or runs steps, in :data:`Piece` s, until the
    next :class:`Stop` (:meth:`run_steps`): a failure or the run's end
    (:meth:`fail_in_steps`), a planned interruption or eviction (:meth:`save_on_notice`) or a
    grow-back (:meth:`grow_back`); under ``per_step`` a failure the job goes on through and a
    group's rejoin are :class:`PerStepPolicy`'s. Step counts are the run's own: the attempt
    resumes after ``restart_count`` and the newest checkpoints are at ``durable_count`` and
    ``memory_count``. Seconds go to ``seconds`` (the accounting's buckets, restart parts,
    startup parts as ``startup.<part>``, plus ``gpu``: productive GPU-seconds), completed
    steps through the :class:`Ledger`.
    """

    __slots__ = (
        "active", "by_cause", "config", "counts", "draws", "dues", "durable_count", "elastic",
        "episodes", "failing_slot", "first_step_s", "first_wait_s", "from_memory", "gpus",
        "grow_at", "init_s", "last_failure", "ledger", "memory_count", "next_boundary",
        "next_planned", "node_fail_at", "now", "pieces", "planned", "prep", "queue_mu",
        "restart_count", "restore_s", "rng", "schedule", "seconds", "spare_free_at",
        "tiered", "timeline", "wait_s", "weibull_scale", "world")

    def __init__(self, c: SimConfig, p: Prepared, rng: np.random.Generator,
                 timeline: list | None = None,
                 place: np.random.Generator | None = None) -> None:
        self.config, self.prep, self.rng, self.timeline = c, p, rng, timeline
        self.draws = Draws(rng)
        self.schedule = CheckpointSchedule(p.km, p.kd, p.cm, p.cdd)
        self.elastic = Elastic(c.elastic)
        self.tiered = c.ckpt_mode == "tiered"
        self.seconds = dict.fromkeys((*BUCKETS, *RESTART_PARTS, *STARTUP_KEYS, "gpu", "steps",
                                      "gpu_steps", "quorum"), 0.0)
        self.counts = dict.fromkeys(COUNTS, 0)
        self.by_cause = [0] * len(FAILURE_CAUSES)
        self.last_failure: tuple[str | None, bool, bool] = (None, False, False)
        """The last failure's cause, whether it hung, whether it was wide."""
        # drawn up front, in this order: straggler episodes, planned interruptions, failures
        self.episodes = draw_episodes(c, p, rng, timeline is not None, place)
        self.counts["straggler_episodes"] = self.episodes.count
        T = c.duration_s
        self.planned: list[float] = [*np.sort(
            rng.uniform(0, T, rng.poisson(c.planned_per_day / DAY * T))).tolist(), INF]
        """Planned interruptions, sorted, then ``INF`` (a sentinel: none left)."""
        self.queue_mu = None
        """Lognormal queue waits: the log-space mean (None: exponential waits)."""
        if c.queue_dist == "lognormal" and c.queue_s > 0:
            self.queue_mu = math.log(c.queue_s) - c.queue_sigma ** 2 / 2
        self.weibull_scale = c.node_mtbf_s / math.gamma(1 + 1 / c.weibull_shape)
        self.node_fail_at = None
        """Weibull failures: each node slot's next failure (-1 stale, inf awaiting repair)."""
        if c.failure_dist == "weibull":
            self.node_fail_at = self.weibull_draw(c.nodes)
        # the current attempt: its start, world (nodes) and GPUs, the step count it resumes
        # after, its init and restore (from a memory copy?), its first step and that step's
        # straggler wait; the newest surviving checkpoints (step counts)
        self.now, self.world, self.gpus = 0.0, c.nodes, 0
        self.restart_count = self.durable_count = self.memory_count = 0
        self.init_s, self.restore_s, self.from_memory = c.init_s, 0.0, False
        self.first_step_s = self.first_wait_s = 0.0
        # the next episode boundary and planned interruption (indices); the failing node slot
        self.next_boundary = self.next_planned = self.failing_slot = 0
        self.wait_s = p.w0
        """Straggler wait per step now: the worst subject's with the active episodes
        compounded where they nest (:meth:`Episodes.wait`), or noise's."""
        self.active: dict[int, float] = self.episodes.active
        """Active episodes: their factors (1 + slowdown); kept by :attr:`episodes`."""
        self.dues: dict[int, float] = {}
        """Evictable episodes of this attempt: when the detector flags them."""
        self.grow_at: list[float] = []
        """Shrunk: when each missing node is back (sorted); ``per_step``: each missing group."""
        self.init_groups(c)
        self.spare_free_at = [0.0] * c.spares
        self.ledger = Ledger(self.seconds)
        self.pieces: list[Piece] = []

    # ------------------------------------------------------------------ the run
    def run(self) -> SimResult:
        """Every attempt until the run's end; the result."""
        T = self.config.duration_s
        while self.now < T:
            if not self.attempt():
                break
        return self.result()

    def result(self) -> SimResult:
        """What is left of the ledger becomes final; the breakdown, counts and causes."""
        c, a = self.config, self.seconds
        self.ledger.commit(INF)
        parts = {k: a[k] for k in RESTART_PARTS}
        a["restart"] = sum(parts.values())
        startup = {k: a[f"startup.{k}"] for k in STARTUP_PARTS}
        a["startup"] = sum(startup.values())
        a["other"] += a["quorum"]
        T = c.duration_s
        spare_nodes = {SPARES: c.spares, PER_STEP: c.spares * self.group_nodes}
        alloc = (c.nodes + spare_nodes.get(self.elastic, 0)) * c.gpus_per_node * T
        # samples in full-world global batches: a short per-step world commits its share
        batches = (a["gpu_steps"] / (c.nodes * c.gpus_per_node) if self.elastic is PER_STEP
                   else a["steps"])
        return SimResult(T, a["productive"] / T, a["gpu"] / alloc, {b: a[b] for b in BUCKETS},
                         parts, self.counts, dict(zip(CAUSE_NAMES, self.by_cause)), startup,
                         {"quorum": a["quorum"]}, batches * c.step_s / T)

    def up(self, part: str) -> str:
        """The ``seconds`` key of a start-up part (init, restore, warmup) of the attempt in
        progress: startup's for the run's first attempt, restart's for every later one."""
        return f"startup.{part}" if self.counts["attempts"] == 1 else part

    def attempt(self) -> bool:
        """One attempt from its start; False when the run ended in it."""
        c = self.config
        cont, self.continuing = self.continuing, False
        if not cont:
            self.counts["attempts"] += 1
        n = self.world
        # per_step: each group keeps its local batch, so a short world's step is no longer
        base = c.step_s if self.elastic is PER_STEP else c.step_s * c.nodes / n
        self.gpus = n * c.gpus_per_node
        t_fail = self.next_failure()
        times, ts0 = self.episodes.boundary_s, self.now + self.init_s + self.restore_s
        while times[self.next_boundary] <= ts0:
            self.cross_boundary()
        self.first_wait_s = self.wait_s
        self.first_step_s = base + self.wait_s + (0.0 if cont else c.warmup_s)
        t1 = ts0 + self.first_step_s
        if t_fail < t1 or t1 > c.duration_s:
            if cont:
                return self.fail_in_first_step(t_fail)
            return self.fail_in_startup(t_fail)
        self.start_steps(t1, base)
        stop, m_end, t_end, tx = self.run_steps(t_fail, t1, base)
        if stop is FAILURE:
            return self.fail_in_steps(tx, t_fail)
        self.finalize(m_end, stop is GROW)
        self.record(stop, m_end=m_end, t_end=t_end)
        if stop is GROW and self.elastic is PER_STEP:
            self.rejoin(m_end, t_end)
        elif stop is GROW:
            self.grow_back(m_end, t_end)
        else:
            self.save_on_notice(stop, m_end, t_end)
        return True

    # ------------------------------------------------------------------ random draws
    def weibull_draw(self, k: int) -> np.ndarray:
        """k Weibull times to failure (mean: the node MTBF)."""
        return self.weibull_scale * (-np.log1p(-self.rng.random(k))) \
            ** (1 / self.config.weibull_shape)

    def next_failure(self) -> float:
        """When this attempt's next failure strikes (a node's, exponential or Weibull)."""
        nf = self.node_fail_at
        if nf is None:
            return self.now + self.draws.exp() * self.config.node_mtbf_s / self.world
        stale = nf <= self.now
        if stale.any():
            nf[stale] = self.now + self.weibull_draw(int(stale.sum()))
        self.failing_slot = int(nf.argmin())
        return float(nf[self.failing_slot])

    def queue_wait(self) -> float:
        """A scheduler queue wait."""
        c = self.config
        if self.queue_mu is not None:
            return math.exp(self.queue_mu + c.queue_sigma * self.draws.norm())
        return c.queue_s * self.draws.exp()

    def draw_failure(self) -> tuple[float, bool]:
        """The failure's cause, whether it hangs, whether it is wide; its detection time."""
        p, dr, cnt = self.prep, self.draws, self.counts
        ci = bisect.bisect_right(p.cause_cdf, dr.uni())
        self.by_cause[ci] += 1
        hang, wide = dr.uni() < p.hang[ci], dr.uni() < p.wide[ci]
        cnt["failures"] += 1
        cnt["hangs"] += hang
        cnt["wide_failures"] += wide
        self.last_failure = CAUSE_NAMES[ci], hang, wide
        return (self.config.detect_hang_s if hang else self.config.detect_crash_s), wide

    # ------------------------------------------------------------------ straggler episodes
    def cross_boundary(self) -> int:
        """The next episode boundary (onset or end) takes effect; its episode."""
        ep, bi = self.episodes, self.next_boundary
        self.next_boundary = bi + 1
        i = ep.boundary_episode[bi]
        if ep.boundary_onset[bi]:
            ep.begin(i)
        else:
            ep.end(i)
            self.dues.pop(i, None)
        self.wait_s = ep.wait(self.prep.w0)
        return i

    def change_wait(self, tb: float, base: float) -> None:
        """An episode boundary at ``tb`` in the steps: the wait changes from the next step
        start on (a new piece), and an evictable onset is due for the detector."""
        c = self.config
        i = self.cross_boundary()
        dn = base + self.wait_s
        if c.evict_stragglers and i in self.active and self.episodes.evictable[i]:
            self.dues[i] = tb + c.evict_delay_steps * dn
        pieces = self.pieces
        last_count, last_end_s, last_step_s, _ = pieces[-1]
        if dn != last_step_s:
            m, pc = self.locate(tb)
            _, _, step_s, _ = pc
            em = self.schedule.end_of(m, pc)
            sk = self.schedule.stall_at(m)
            ref, eref = (m, em) if em + sk > tb else (m + 1, em + sk + step_s)
            if ref == last_count:
                pieces[-1] = (ref, last_end_s, dn, self.wait_s)
            else:
                pieces.append((ref, eref, dn, self.wait_s))

    # ------------------------------------------------------------------ steps
    def locate(self, t: float) -> tuple[int, Piece]:
        """The last step count done by ``t``, and its piece."""
        for pc in reversed(self.pieces):
            if pc[1] <= t:  # its reference step ended by t
                return self.schedule.count_at(pc, t), pc
        return self.restart_count, (self.restart_count, t, 1.0, 0.0)

    def start_steps(self, t1: float, base: float) -> None:
        """The attempt's first step ended at ``t1``: its start-up counts, earlier attempts'
        later steps roll back, its first piece begins."""
        c, a = self.config, self.seconds
        a[self.up("init")] += self.init_s
        a[self.up("restore")] += self.restore_s
        self.ledger.rollback(self.restart_count)
        self.ledger.commit(self.durable_count)
        times = self.episodes.boundary_s
        while times[self.next_boundary] <= t1:
            self.cross_boundary()
        self.pieces = [(self.restart_count + 1, t1, base + self.wait_s, self.wait_s)]
        self.dues.clear()
        if c.evict_stragglers:
            due = t1 + c.evict_delay_steps * (base + self.wait_s)
            evictable = self.episodes.evictable
            self.dues.update({i: due for i in self.active if evictable[i]})
        planned, pli = self.planned, self.next_planned
        while planned[pli] < self.now:
            pli += 1  # fell in downtime: absorbed
        self.next_planned = pli

    def run_steps(self, t_fail: float, t1: float,
                  base: float) -> tuple[Stop, int, float, float]:
        """Steps until the next stop: a failure or the run's end (``Stop.FAILURE``), a
        planned interruption, an eviction or a grow-back. Returns the stop, the last step
        count and its end (those three at the end of the step in flight), and the failure's
        time or the run's end."""
        c, ep = self.config, self.episodes
        times, planned, dues, grow_at = ep.boundary_s, self.planned, self.dues, self.grow_at
        tx = min(t_fail, c.duration_s)
        while True:
            tb, tp = times[self.next_boundary], planned[self.next_planned]
            te = min(dues.values()) if dues else INF
            tg = grow_at[0] if grow_at and self.world < c.nodes else INF
            ts = min(tp, te, tg)
            if tx <= tb and tx <= ts:
                return FAILURE, 0, 0.0, tx
            if tb < ts:  # straggler wait changes from the next step start on
                self.change_wait(tb, base)
                continue
            if ts < t1:
                m_end, t_end = self.restart_count + 1, t1
            else:  # planned, eviction or grow-back: at the end of the step in flight
                m, pc = self.locate(ts)
                m_end = m + 1
                t_end = self.schedule.end_of(m_end, pc)
            stop = PLANNED if ts == tp else (EVICTION if ts == te else GROW)
            if tx < t_end + (self.schedule.stall_at(m_end) if stop is GROW else 0.0):
                stop = FAILURE
            return stop, m_end, t_end, tx

    def finalize(self, m_end: int, save_at_end: bool) -> float:
        """The attempt's steps into the ledger; warm-up and stalls; its median step."""
        R, dur0, gpus, pieces = self.restart_count, self.first_step_s, self.gpus, self.pieces
        items, ent = [(dur0, 1)], []
        for i, (count, _, step_s, wait_s) in enumerate(pieces):
            hi = min(pieces[i + 1][0] if i + 1 < len(pieces) else m_end, m_end)
            if hi > count:
                items.append((step_s, hi - count))
                ent.append([count, hi, wait_s, step_s - wait_s, gpus])
        med = weighted_median(items)
        # warm-up: the first step's excess over the attempt's other steps (accounting's rule)
        warm = max(0.0, dur0 - weighted_median(items[1:])) if len(items) > 1 else 0.0
        sw0 = min(self.first_wait_s, dur0 - warm)
        a, cnt, sched = self.seconds, self.counts, self.schedule
        a[self.up("warmup")] += warm
        self.ledger.entries.append([R, R + 1, sw0, dur0 - warm - sw0, gpus])  # the first step
        self.ledger.entries.extend(ent)
        a["checkpoint_stall"] += sched.stall_through(m_end - 1) - sched.stall_through(R)
        last = m_end if save_at_end else m_end - 1
        kd, km = sched.durable_every, sched.memory_every
        cnt["checkpoints"] += last // kd - R // kd
        cnt["memory_checkpoints"] += (last // km - R // km) if self.tiered else 0
        return med

    def record(self, stop: Stop, **kw: Any) -> None:
        """The attempt into the timeline (trace mode)."""
        if self.timeline is not None:
            self.timeline.append(dict(
                kind=stop.value, t=self.now, init=self.init_s, restore=self.restore_s,
                R=self.restart_count, n=self.world, dur0=self.first_step_s,
                w_first=self.first_wait_s, pieces=list(self.pieces), from_mem=self.from_memory,
                episodes=self.episodes.record, **kw))

    # ------------------------------------------------------------------ downtime
    def add_span(self, part: str, lo: float, hi: float) -> None:
        """``lo``..``hi`` (cut at the run's end) to a restart part."""
        hi = min(hi, self.config.duration_s)
        if hi > lo:
            self.seconds[part] += hi - lo

    def add_startup(self, t0: float, e: float, tf: float = INF) -> None:
        """Init, then restore (until detection if the failure at tf cut it short)."""
        rs = t0 + self.init_s
        r = 0.0 if tf < rs or e <= rs else \
            (e if tf < rs + self.restore_s else min(e, rs + self.restore_s)) - rs
        self.seconds[self.up("restore")] += r
        self.seconds[self.up("init")] += e - t0 - r

    def take_spares(self, t: float, k: int) -> bool:
        """Swap k free spares in at ``t`` (spares policy), busy until repaired; False when
        there are not enough."""
        if self.elastic is not SPARES:
            return False
        free = [i for i, x in enumerate(self.spare_free_at) if x <= t]
        if len(free) < k:
            return False
        for i in free[:k]:
            self.spare_free_at[i] = t + self.config.repair_s
        self.counts["spare_swaps"] += 1
        return True

    def full_world(self) -> None:
        """A restart from the queue gets a full world (shrink, per_step: no grow-back or
        rejoin pending)."""
        if self.elastic is SHRINK or self.elastic is PER_STEP:
            self.world = self.config.nodes
            self.grow_at.clear()
            self.grow_pos.clear()
            if self.node_fail_at is not None:
                self.node_fail_at[np.isinf(self.node_fail_at)] = -1.0

    def relaunch(self, t_fail: float, t_det: float, from_mem: bool) -> float:
        """After a failure at ``t_fail``, detected at ``t_det``: a spare, a smaller world or
        the queue; the next attempt's init and restore. Returns its start."""
        c, cnt = self.config, self.counts
        if self.take_spares(t_fail, 1):
            gap, self.init_s = c.spare_swap_s, c.init_s
        elif self.elastic is SHRINK and self.world > c.nodes - c.shrink_max_nodes:
            self.world -= 1
            bisect.insort(self.grow_at, t_fail + c.repair_s)
            gap, self.init_s = 0.0, c.reconfig_s
            cnt["shrinks"] += 1
        else:
            gap, self.init_s = self.queue_wait(), c.init_s
            self.full_world()
        if self.node_fail_at is not None:  # shrunk: the slot waits for repair
            self.node_fail_at[self.failing_slot] = np.inf if self.world < c.nodes else -1.0
        self.add_span("queue", t_det, t_det + gap)
        R = self.restart_count
        self.restore_s = 0.0 if R == 0 else (c.memory_restore_s if from_mem else c.restore_s)
        cnt["memory_restores"] += from_mem and R > 0
        self.from_memory = from_mem and R > 0
        return t_det + gap

    def fail_in_startup(self, t_fail: float) -> bool:
        """No step completed: start-up is init/restore, then a failure or the run's end."""
        c = self.config
        self.pieces = []
        if t_fail >= c.duration_s:
            self.add_startup(self.now, c.duration_s)
            self.record(RUN_END)
            return False
        det_s, wide = self.draw_failure()
        self.counts["startup_failures"] += 1
        self.add_startup(self.now, min(t_fail + det_s, c.duration_s), t_fail)
        self.record(FAILURE, t_det=t_fail + det_s, t_fail=t_fail, fail=self.last_failure)
        if wide:
            self.memory_count = self.durable_count
        self.restart_count = self.memory_count if self.tiered else self.durable_count
        self.now = self.relaunch(t_fail, t_fail + det_s,
                                 self.tiered and self.memory_count > self.durable_count)
        return True

    def fail_in_steps(self, tx: float, t_fail: float) -> bool:
        """A failure (or the run's end) at ``tx`` with steps done: the partial step and the
        rest until detection, the checkpoints that survive, the relaunch."""
        c, a, sched = self.config, self.seconds, self.schedule
        T = c.duration_s
        m, pc = self.locate(tx)
        em = sched.end_of(m, pc)
        if t_fail < T and self.can_absorb():
            # per_step: the job goes on; the step after m's save is the one discarded
            self.finalize(m, True)
            sk = sched.stall_at(m)
            self.add_span("checkpoint_stall", em, em + sk)
            return self.drop_group(t_fail, m, em + sk, pc[2])
        med = self.finalize(m, True)
        if t_fail >= T:
            sk = min(sched.stall_at(m), T - em)
            a["checkpoint_stall"] += sk
            a["other"] += T - em - sk
            self.record(RUN_END, m_end=m)
            return False
        det_s, wide = self.draw_failure()
        t_det = t_fail + det_s
        tail = min(t_det, T) - em
        self.record(FAILURE, m_end=m, t_det=t_det, t_fail=t_fail, fail=self.last_failure)
        a["recompute"] += min(med, tail)
        a["detection"] += tail - min(med, tail)
        R, D, Mm = self.restart_count, self.durable_count, self.memory_count
        k = self.locate(t_fail - c.write_s)[0] // sched.durable_every * sched.durable_every
        D = max(D, k) if k > R else D
        if self.tiered:
            k = self.locate(t_fail - c.memory_stall_s)[0] // sched.memory_every \
                * sched.memory_every
            Mm = max(Mm, k) if k > R else Mm
        Mm = D if wide else max(Mm, D)
        self.durable_count, self.memory_count = D, Mm
        self.restart_count = Mm if self.tiered else D
        self.ledger.commit(D)
        self.now = self.relaunch(t_fail, t_det, self.tiered and Mm > D)
        return True

    def grow_back(self, m_end: int, t_end: float) -> None:
        """Graceful resize at the end of step ``m_end``: the save due there, then
        reconfiguration as the next attempt's init (nothing lost, no restore)."""
        c, sched = self.config, self.schedule
        kd, km, R = sched.durable_every, sched.memory_every, self.restart_count
        sk = sched.stall_at(m_end)
        self.seconds["checkpoint_stall"] += sk
        D = self.durable_count
        D = max(D, m_end // kd * kd) if m_end // kd * kd > R else D
        self.memory_count = max(self.memory_count, D,
                                m_end // km * km if self.tiered and m_end // km * km > R else 0)
        self.durable_count, self.restart_count = D, m_end
        self.ledger.commit(D)
        self.grow_at.pop(0)
        self.world += 1
        self.counts["grows"] += 1
        if self.node_fail_at is not None:
            self.node_fail_at[int(np.argmax(np.isinf(self.node_fail_at)))] = -1.0
        self.add_span("init", t_end + sk, t_end + sk + c.reconfig_s)
        self.now = t_end + sk + c.reconfig_s
        self.init_s, self.restore_s, self.from_memory = 0.0, 0.0, False

    def save_on_notice(self, stop: Stop, m_end: int, t_end: float) -> None:
        """Planned interruption or eviction at the end of step ``m_end``: a durable save,
        then a spare (evictions only) or the queue."""
        c, cnt = self.config, self.counts
        self.durable_count = self.memory_count = self.restart_count = m_end
        self.ledger.commit(m_end)
        cnt["checkpoints"] += 1
        if stop is PLANNED:
            self.next_planned += 1
            cnt["planned"] += 1
            gap = c.write_s + self.queue_wait()
            self.full_world()
        else:
            gap = c.write_s + self.evict(t_end)
        self.add_span("queue", t_end, t_end + gap)
        self.now = t_end + gap
        self.init_s, self.restore_s, self.from_memory = c.init_s, c.restore_s, False

    def evict(self, t_end: float) -> float:
        """The episodes due by ``t_end`` end with their nodes' eviction; the wait for their
        replacement (spares, else the queue)."""
        ep, cnt = self.episodes, self.counts
        ids = [i for i, x in self.dues.items() if x <= t_end]
        k = sum(ep.nodes[i] for i in ids)
        for i in ids:
            ep.end(i)
            self.dues.pop(i, None)
        self.wait_s = ep.wait(self.prep.w0)
        cnt["evictions"] += 1
        cnt["evicted_nodes"] += k
        if self.timeline is not None:
            self.timeline[-1]["evicted"] = ids
        if self.take_spares(t_end, k):
            return self.config.spare_swap_s
        wait = self.queue_wait()
        self.full_world()
        return wait
