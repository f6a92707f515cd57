"""A simulated job's state, and the arithmetic of its attempts.

Why it exists: every other part of the cluster simulator (placement, scheduling, failures,
preemption, results) reads and writes the same per-job record, and the attempt arithmetic
(when step i ends, how many steps are done or durable at a time, how an attempt's time splits
into the accounting buckets) is the one place where the accounting rules of
:mod:`goodlens.analysis.clustersim.sim` are turned into numbers. Steps and checkpoints are
counted arithmetically here, never one by one.

The named constants (:class:`Bucket`, :class:`Event`, :class:`Phase`, :class:`Settle`) are
``IntEnum`` members: plain ints to the heap and to list indexing, names to a reader. Enum
attribute lookups are slow on the hot paths, so loops bind the members they need to locals.
"""

from __future__ import annotations

import enum
import math
from dataclasses import replace

from goodlens.analysis.ckptcost import CheckpointSpec, checkpoint_cost
from goodlens.analysis.clustersim.config import ClusterConfig, JobSpec
from goodlens.analysis.runsim.config import SimConfig
from goodlens.analysis.runsim.montecarlo import young_interval_s
from goodlens.analysis.runsim.trial import prepare

INF = math.inf


class Bucket(enum.IntEnum):
    """Slots of a job's time accumulator (``Job.buckets``): the ``goodlens report`` buckets,
    with restart and startup (the first attempt's start-up) split into their parts."""

    PRODUCTIVE = 0
    STRAGGLER_WAIT = 1
    CHECKPOINT_STALL = 2
    RECOMPUTE = 3
    OTHER = 4
    DETECTION = 5
    QUEUE = 6
    INIT = 7
    RESTORE = 8
    WARMUP = 9
    STARTUP_INIT = 10
    STARTUP_RESTORE = 11
    STARTUP_WARMUP = 12


class Event(enum.IntEnum):
    """Kinds of event on the simulator's heap."""

    SUBMIT = 0  # a job arrives (payload: job id)
    FAIL = 1  # a node fails (payload: node)
    REPAIR = 2  # a node comes back (payload: node)
    DETECT = 3  # a job's failure is detected (job event)
    SWAP = 4  # hot spares swapped into a job (job event)
    END = 5  # a job's attempt completes its work (job event)
    SAVED = 6  # a preemption save is durable (job event)
    HOLD_TIMEOUT = 7  # a partial allocation held too long (job event)
    WAKE = 8  # rerun the scheduler (a back-off or a preemption delay ends)
    TICK = 9  # an hourly sample of the timeline


class Phase(enum.IntEnum):
    """A job's state. RUNNING..SWAPPING are the phases of a live attempt (running jobs)."""

    PENDING = 0
    HOLDING = 1  # partial allocation: some of its nodes, waiting for the rest
    RUNNING = 2
    SAVING = 3  # preempted with a checkpoint: saving before the nodes go
    DETECTING = 4
    SWAPPING = 5
    DONE = 6
    REJECTED = 7  # bigger than the schedulable cluster

    @property
    def label(self) -> str:
        """The status string of the result rows."""
        return self.name.lower()


class Settle(enum.IntEnum):
    """How an attempt's time is closed by :meth:`Job.settle`."""

    FAILED = 0  # a node failure: work since the last durable checkpoint is lost
    KILLED = 1  # preempted by kill: the same, with no detection
    ENDED = 2  # the end of the simulation cuts it
    SAVE = 3  # a preemption save: everything done so far is kept
    DONE = 4  # the job's work is complete


class Job:
    """One job of the stream: its spec, its checkpoint costs, its queue and attempt state
    and its time accumulators. Plain slotted attributes (the event loop's hot path)."""

    __slots__ = (
        "attempt_row",
        "attempt_start",
        "awaited_nodes",
        "backoff_until",
        "buckets",
        "ckpt_cycle_s",
        "ckpt_every_steps",
        "ckpt_stall_s",
        "ckpt_write_s",
        "claimed_by",
        "claiming",
        "end",
        "epoch",
        "first_start",
        "first_wait",
        "held",
        "id",
        "init_s",
        "interval_s",
        "longest_wait",
        "n_attempts",
        "n_failures",
        "n_preemptions",
        "nodes",
        "owner",
        "penalty",
        "phase",
        "placed_step_s",
        "preempt_loss",
        "preempt_record",
        "priority",
        "queue_since",
        "queue_total",
        "ready_at",
        "restore_full_s",
        "restore_s",
        "save_start",
        "save_step",
        "saved_steps",
        "size",
        "spec",
        "step_s",
        "step_wall_s",
        "steps_left",
        "straggler_wait_s",
        "submit",
        "topology_slowdown_s",
        "total_steps",
        "warmup_s",
    )

    # the attempt's arithmetic ------------------------------------------------------------

    def step_end(self, i: int) -> float:
        """End of the attempt's i-th step (i >= 1): saves stall ckpt_stall_s after steps K,
        2K, ... (K = ckpt_every_steps)."""
        return self.ready_at + self.warmup_s + i * self.step_wall_s + \
            ((i - 1) // self.ckpt_every_steps) * self.ckpt_stall_s

    def steps_done_at(self, x: float) -> int:
        """Steps of the attempt completed by x."""
        y = x - self.ready_at - self.warmup_s
        d = self.step_wall_s
        if y < d:
            return 0
        q = int(y // self.ckpt_cycle_s)
        i = min(self.ckpt_every_steps, int((y - q * self.ckpt_cycle_s) // d))
        left = self.steps_left
        m = min(q * self.ckpt_every_steps + i, left)
        while m < left and self.step_end(m + 1) <= x:
            m += 1
        while m > 0 and self.step_end(m) > x:
            m -= 1
        return m

    def durable_steps(self, x: float, m: int) -> int:
        """Steps of the attempt held by its last durable checkpoint at x, m of them done
        (save k starts at k L - C after the first step's start and is durable W later)."""
        y = x - self.ready_at - self.warmup_s
        k = math.floor((y + self.ckpt_stall_s - self.ckpt_write_s) / self.ckpt_cycle_s)
        every = self.ckpt_every_steps
        k = max(0, min(k, (self.steps_left - 1) // every, m // every))
        return k * every

    def estimate_s(self, factor: float, init_s: float, warmup_s: float) -> float:
        """The user's walltime estimate of a pending job's next attempt (``factor`` times
        the ideal: no failure, no straggler, no topology penalty)."""
        rem = self.total_steps - self.saved_steps
        ideal = init_s + (self.restore_full_s if self.saved_steps else 0.0) + warmup_s + \
            rem * self.step_s + ((rem - 1) // self.ckpt_every_steps) * self.ckpt_stall_s
        return factor * ideal

    def settle(self, x: float, mode: Settle, horizon: float, tdet: float = 0.0,
               m: int | None = None) -> float:
        """Put the attempt's time up to x (a failure: up to its detection ``tdet``; nothing
        past ``horizon``, the simulation's end) in buckets and advance the job's checkpointed
        progress; returns the work lost (recompute)."""
        b = self.buckets
        if m is None:
            m = self.steps_done_at(x)
        elif mode == Settle.FAILED:
            m = min(m, self.steps_done_at(x))
        if m == 0:  # no step completed: init, restore, until detection (accounting's rule)
            self._settle_startup(x, mode, horizon, tdet)
            return 0.0
        init, restore, warmup = self.startup_slots()
        b[init] += self.init_s
        b[restore] += self.restore_s
        b[warmup] += self.warmup_s
        em = self.step_end(m)
        d, every, stall_each = self.step_wall_s, self.ckpt_every_steps, self.ckpt_stall_s
        stall = ((m - 1) // every) * stall_each
        loss = 0.0
        kept = m
        if mode in (Settle.FAILED, Settle.KILLED):
            kept = self.durable_steps(x, m)
            tail = (min(tdet, horizon) if mode == Settle.FAILED else x) - em
            rc = min(d, tail)
            loss = (m - kept) * d + tail
            b[Bucket.RECOMPUTE] += (m - kept) * d + rc
            b[Bucket.DETECTION] += tail - rc
        elif mode == Settle.ENDED:
            sk = min(stall_each if m % every == 0 and m < self.steps_left else 0.0, x - em)
            stall += sk
            b[Bucket.OTHER] += x - em - sk
        elif mode == Settle.SAVE:
            stall += x - em  # 0, or the regular save the notice fell in
        b[Bucket.CHECKPOINT_STALL] += stall
        b[Bucket.PRODUCTIVE] += kept * self.placed_step_s
        b[Bucket.STRAGGLER_WAIT] += kept * self.straggler_wait_s
        self.topology_slowdown_s += kept * self.step_s * self.penalty
        self.saved_steps += kept
        return loss

    def startup_slots(self) -> tuple[Bucket, Bucket, Bucket]:
        """Where this attempt's init, restore and warm-up go: startup's for the job's first
        attempt, restart's for every later one (accounting's rule)."""
        if self.n_attempts <= 1:
            return Bucket.STARTUP_INIT, Bucket.STARTUP_RESTORE, Bucket.STARTUP_WARMUP
        return Bucket.INIT, Bucket.RESTORE, Bucket.WARMUP

    def _settle_startup(self, x: float, mode: Settle, horizon: float, tdet: float) -> None:
        """An attempt cut before its first step: init, then restore, until x (a failure:
        until its detection)."""
        e = min(tdet, horizon) if mode == Settle.FAILED else min(x, horizon)
        tf = INF if mode == Settle.ENDED else x
        rs = self.attempt_start + self.init_s
        r = 0.0 if tf < rs or e <= rs else \
            (e if tf < rs + self.restore_s else min(e, rs + self.restore_s)) - rs
        init, restore, _ = self.startup_slots()
        self.buckets[restore] += r
        self.buckets[init] += e - self.attempt_start - r


def new_job(i: int, s: JobSpec, owner: int, cfg: ClusterConfig) -> Job:
    """Job ``i`` of the stream, owned by owner index ``owner``: its checkpoint stall, write
    and restore times (ckptcost), its interval (Young's, clipped, unless the spec sets one)
    and its straggler wait, in the queue from its submit time."""
    f = cfg.failure
    j = Job()
    j.id, j.spec, j.owner = i, s, owner
    j.priority, j.size, j.submit = int(s.priority), int(s.nodes), float(s.submit_s)
    j.step_s = float(s.step_s)
    j.total_steps = max(1, math.ceil(s.work_s / s.step_s - 1e-9))
    gpus = j.size * cfg.gpus_per_node
    cost = checkpoint_cost(CheckpointSpec(
        params=s.params, gpus=gpus, writer_ranks=gpus, writer_bw=cfg.writer_bw,
        storage_bw=cfg.storage_bw, bytes_per_param=cfg.bytes_per_param))
    j.ckpt_stall_s = cost.sync_stall_s if s.ckpt_mode == "sync" else cost.async_stall_s
    j.ckpt_write_s = max(j.ckpt_stall_s, cost.background_write_s)
    j.restore_full_s = cost.size_bytes / cost.write_bw  # assumed: read at the write bandwidth
    if s.interval_s is not None:
        iv = float(s.interval_s)
    else:
        iv = young_interval_s(j.ckpt_stall_s, f.node_mtbf_s / j.size)
        iv = min(max(iv, cfg.min_interval_s, j.ckpt_write_s), cfg.max_interval_s)
    j.interval_s = iv
    j.ckpt_every_steps = max(1, round(iv / j.step_s))
    j.straggler_wait_s = straggler_wait_s(f, j.size, cfg.gpus_per_node, j.step_s,
                                          cfg.nodes_per_rack)
    j.phase, j.epoch, j.nodes, j.held, j.saved_steps = Phase.PENDING, 0, [], [], 0
    j.first_start = j.end = None
    j.attempt_start = j.ready_at = j.init_s = j.restore_s = j.warmup_s = 0.0
    j.steps_left, j.penalty, j.placed_step_s, j.step_wall_s, j.ckpt_cycle_s = \
        0, 0.0, 0.0, 0.0, 0.0
    j.buckets = [0.0] * len(Bucket)
    j.topology_slowdown_s = 0.0
    j.queue_since = j.submit
    j.first_wait = None
    j.queue_total = j.longest_wait = j.preempt_loss = 0.0
    j.n_preemptions = j.n_failures = j.n_attempts = 0
    j.backoff_until = 0.0
    j.claiming, j.awaited_nodes, j.claimed_by = False, 0, None
    j.save_step, j.save_start = 0, 0.0
    j.attempt_row = j.preempt_record = None
    return j


STRAGGLER_WAIT_CACHE: dict[tuple, float] = {}
"""Per-step straggler wait (w0) by (nodes, gpus_per_node, step_s, nodes_per_rack,
compute_fraction, compute_noise_sigma): the run simulator's Monte Carlo is the slow part of
setting up a job, and a job stream repeats a few sizes. Clear it (with
``goodlens.analysis.runsim.trial.straggler_noise.cache_clear()``) to time a cold start."""


def straggler_wait_s(f: SimConfig, nodes: int, gpn: int, step_s: float, npr: int) -> float:
    """The run simulator's per-step straggler wait (w0) for a job of ``nodes`` nodes
    (memoised in :data:`STRAGGLER_WAIT_CACHE`)."""
    key = (nodes, gpn, step_s, npr, f.compute_fraction, f.compute_noise_sigma)
    if key not in STRAGGLER_WAIT_CACHE:
        c = replace(f, nodes=nodes, gpus_per_node=gpn, step_s=step_s, elastic="restart",
                    spares=0, nodes_per_switch=npr)
        STRAGGLER_WAIT_CACHE[key] = prepare(c).w0
    return STRAGGLER_WAIT_CACHE[key]
