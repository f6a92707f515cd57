"""Step arithmetic of the run simulator: where saves fall, when a step count ends, and the
ledger of completed steps that a later failure may still roll back.

Why it exists: a trial (:mod:`goodlens.analysis.runsim.trial`) never walks steps one by one; it
counts them arithmetically between events. These are the pieces of that arithmetic, kept apart
from the trial's control flow so that each can be read (and checked) on its own:

- :class:`CheckpointSchedule`: saves at step counts that are multiples of ``memory_every``
  (a memory copy, tiered only) and ``durable_every`` (a durable save), each stalling the step
  after it; from it, the end time of any step count and the last count done by a given time;
- :data:`Piece`: a run of steps of one duration (it changes when the straggler wait does);
- :class:`Ledger`: completed steps, held until they are rolled back (recompute) or become final
  (productive and straggler wait);
- :func:`weighted_median`: ``np.median`` of an attempt's step durations, given as counts.
"""

from __future__ import annotations

Piece = tuple[int, float, float, float]
"""Steps of one duration within an attempt, from a reference step count on: ``(count, end_s,
step_s, wait_s)``, the reference ``count`` ending at ``end_s``, each step taking ``step_s`` of
which ``wait_s`` is straggler wait. A plain tuple, read by unpacking (a trial makes and reads
thousands: a class would cost the simulator ~5% of its speed), and the timeline's form too."""


class CheckpointSchedule:
    """Saves at step counts: a memory copy at every multiple of ``memory_every`` and a durable
    save at every multiple of ``durable_every`` (itself a multiple of ``memory_every``); each
    stalls the run for its own time before the next step starts. Without tiers both intervals
    are the same and the memory stall is never charged."""

    __slots__ = ("durable_every", "durable_stall_s", "memory_every", "memory_per_durable",
                 "memory_stall_s")

    def __init__(self, memory_every: int, durable_every: int, memory_stall_s: float,
                 durable_stall_s: float) -> None:
        self.memory_every, self.durable_every = memory_every, durable_every
        self.memory_stall_s, self.durable_stall_s = memory_stall_s, durable_stall_s
        self.memory_per_durable = durable_every // memory_every

    def stall_through(self, k: int) -> float:
        """Total stall of the saves at step counts 1..k."""
        q = k // self.durable_every
        return self.memory_stall_s * (k // self.memory_every - q) + self.durable_stall_s * q

    def stall_at(self, k: int) -> float:
        """Stall of the save (if any) at step count k."""
        if k % self.durable_every == 0:
            return self.durable_stall_s
        return self.memory_stall_s if k % self.memory_every == 0 else 0.0

    def end_offset(self, m: int, step_s: float) -> float:
        """End of step count m, from a common origin, in a piece of ``step_s`` steps."""
        k = m - 1
        q = k // self.durable_every
        return (m * step_s + self.memory_stall_s * (k // self.memory_every - q)
                + self.durable_stall_s * q)

    def end_of(self, m: int, piece: Piece) -> float:
        """When step count m ends within ``piece``."""
        count, end_s, step_s, _ = piece
        return end_s + self.end_offset(m, step_s) - self.end_offset(count, step_s)

    def count_at(self, piece: Piece, t: float) -> int:
        """Last step count completed by ``t`` within ``piece`` (its reference count at least)."""
        ref, end_s, d, _ = piece
        every_m, every_d = self.memory_every, self.durable_every
        end_offset = self.end_offset
        x_all = t - end_s + end_offset(ref, d)
        durable_cycle = every_d * d + (self.memory_per_durable - 1) * self.memory_stall_s \
            + self.durable_stall_s
        memory_cycle = every_m * d + self.memory_stall_s
        q = int((x_all - d) // durable_cycle)
        x = x_all - q * durable_cycle
        i = int((x - d) // memory_cycle)
        last = self.memory_per_durable - 1
        i = 0 if i < 0 else (last if i >= self.memory_per_durable else i)
        s = int((x - i * memory_cycle) // d)
        m = q * every_d + i * every_m + (every_m if s > every_m else s)
        while end_offset(m + 1, d) <= x_all:
            m += 1
        while m > ref and end_offset(m, d) > x_all:
            m -= 1
        return m if m > ref else ref


FIRST, END = 0, 1
"""Positions of the mutable fields of a ledger entry."""


class Ledger:
    """Completed steps not final yet: a later attempt's first step rolls back those after its
    restore point (recompute); those at or before a surviving checkpoint become final.

    An entry is a list ``[first, end, wait_s, compute_s, gpus]``: step counts ``first``
    (exclusive) to ``end`` (inclusive) of one duration, done on ``gpus`` GPUs, each step
    ``wait_s`` of straggler wait and ``compute_s`` of the rest (lists, like :data:`Piece`'s
    tuples, because a trial makes thousands)."""

    __slots__ = ("entries", "seconds")

    def __init__(self, seconds: dict[str, float]) -> None:
        self.entries: list[list] = []
        self.seconds = seconds
        """The trial's seconds per bucket (``gpu``: productive GPU-seconds), added to here,
        with the committed steps (``steps``) and GPU-steps (``gpu_steps``: a step's GPUs
        summed, for the sample view of a world that runs short)."""

    def rollback(self, count: int) -> None:
        """Steps after ``count`` are lost: their time becomes recompute."""
        seconds = self.seconds
        for e in self.entries:
            first, end, wait_s, compute_s, _ = e
            if end > count:
                lo = max(first, count)
                seconds["recompute"] += (end - lo) * (wait_s + compute_s)
                e[END] = lo

    def commit(self, upto: float) -> None:
        """Steps up to count ``upto`` are final: productive time and straggler wait."""
        seconds = self.seconds
        for e in self.entries:
            first, end, wait_s, compute_s, gpus = e
            if first < upto:
                k = min(end, upto) - first
                seconds["productive"] += k * compute_s
                seconds["straggler_wait"] += k * wait_s
                seconds["gpu"] += k * compute_s * gpus
                seconds["steps"] += k
                seconds["gpu_steps"] += k * gpus
                e[FIRST] = first + k
        self.entries[:] = [e for e in self.entries if e[END] > e[FIRST]]


def weighted_median(items: list[tuple[float, int]]) -> float:
    """np.median of values given as (value, count) pairs."""
    if len(items) == 1:
        return items[0][0]
    if len(items) == 2 and items[0][1] == 1 and items[1][1] >= 2:
        return items[1][0]  # first step + >= 2 equal steps: the median is the latter
    items = sorted(items)
    total = sum(k for _, k in items)

    def at(ix: int) -> float:
        pos = 0
        for v, k in items:
            pos += k
            if ix < pos:
                return v
        return items[-1][0]
    return (at((total - 1) // 2) + at(total // 2)) / 2
