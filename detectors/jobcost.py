"""What a straggling subject costs the job per step: the last scored steps of an attempt,
and the job-level loss read off them (a finding's ``job_slowdown``, and the open findings'
joint loss with each one's part of it: ``joint_job_slowdown``, ``job_slowdown_part``).

Why it exists apart from the detector: detection scores each subject against its siblings'
median (how broken is it), but what a user pays for is the job's step, which waits for the
latest rank. That second number needs every rank's time to reach the collective in recent
steps, kept as they come in (:class:`RecentSteps`) and read only when a finding is
reported; docs/detectors.md ("slowdown and job slowdown") says what each number means.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Steps a finding's job-level cost is priced over (the attempt's latest).
RECENT = 64
#: Step times kept for the baseline before a finding's onset (its ``RECENT`` steps before
#: the onset, read while the finding is reported within this many steps of it).
HISTORY = 1024
#: Known step times a baseline (before the onset) and the steps since it need to be read.
MIN_BASE = 16
#: An attempt's first steps, left out of a baseline (warm-up: caches, allocators, JIT).
WARMUP = 10


@dataclass(frozen=True)
class JobCost:
    """A subject's cost to the job's step, two ways (0.1 = steps 10% longer than without
    it): ``ready`` from the ranks' ready times (how much later its latest rank reaches the
    collective than the latest rank outside it); ``seen`` the job's own step time since the
    onset against the ``RECENT`` steps before it (None where that baseline is not clean:
    fewer than ``MIN_BASE`` known steps on either side, in this attempt). ``value`` is the
    smaller: the ready times cannot see work the other ranks did while the subject was late
    (on ranks sharing cores it ran then instead of after), and the step time change takes
    in anything else that slowed the job since the onset, but a subject never costs the job
    more than its steps grew."""

    ready: float | None
    seen: float | None

    @property
    def value(self) -> float | None:
        if self.ready is None or self.seen is None:
            return self.ready
        return min(self.ready, self.seen)


class RecentSteps:
    """The last ``RECENT`` scored steps of the attempt as they came in: every rank's time to
    reach the collective, the step and its duration (NaN: not known). A ring: a step costs
    one row's copy (O(ranks)); a subject's cost is read off it only when a finding is
    reported (O(``RECENT`` x ranks), once per report)."""

    def __init__(self, n_ranks: int) -> None:
        self.ready = np.full((RECENT, n_ranks), np.nan, np.float32)
        self.step = np.zeros(RECENT, np.int64)
        self.time = np.full(RECENT, np.nan)
        self.count = 0   # steps added since the attempt began (rows: the last RECENT)
        self.h_first = 0   # the attempt's first step added
        self.h_step = np.zeros(HISTORY, np.int64)   # the last HISTORY steps' times
        self.h_time = np.full(HISTORY, np.nan)
        self.h_start = np.full(HISTORY, np.nan)     # and starts (NaN: not known)

    def clear(self) -> None:
        """Forget every step (a new attempt)."""
        self.count = 0

    def add_one(self, step: int, ready: np.ndarray, step_time_s: float | None,
                start_s: float | None = None) -> None:
        at = self.count % RECENT
        self.ready[at] = ready
        self.step[at] = step
        self.time[at] = _known(step_time_s)
        h = self.count % HISTORY
        self.h_step[h], self.h_time[h] = step, self.time[at]
        self.h_start[h] = math.nan if start_s is None else start_s
        self.h_first = step if self.count == 0 else self.h_first
        self.count += 1

    def add(self, steps: Sequence[int], ready: np.ndarray,
            step_times: Sequence[float | None],
            starts: Sequence[float | None] | None = None) -> None:
        lo = max(0, len(steps) - RECENT)   # (at most a ring's worth: the last rows)
        at = (self.count + np.arange(lo, len(steps))) % RECENT
        self.ready[at] = ready[lo:]
        self.step[at] = steps[lo:]
        self.time[at] = [_known(t) for t in step_times[lo:]]
        lo = max(0, len(steps) - HISTORY)
        h = (self.count + np.arange(lo, len(steps))) % HISTORY
        self.h_step[h] = steps[lo:]
        self.h_time[h] = [_known(t) for t in step_times[lo:]]
        self.h_start[h] = np.nan if starts is None else \
            [math.nan if t is None else t for t in starts[lo:]]
        self.h_first = int(steps[0]) if self.count == 0 and len(steps) else self.h_first
        self.count += len(steps)

    def seen(self, since: int | None, first: int | None = None) -> float | None:
        """The job's own step over the recent steps from ``since`` on against the ``RECENT``
        steps before ``first`` (``since`` when None; the attempt's first ``WARMUP`` steps
        left out), as a slowdown (0.1: 10% longer, never below 0): medians of the step
        period (from one step's start to the next one's, where both are known) or else of
        the step's duration; None where either side has fewer than ``MIN_BASE`` of them in
        this attempt (no onset, one too early in the attempt or older than the history)."""
        if since is None:
            return None
        first = since if first is None else first
        kh = min(self.count, HISTORY)
        order = np.argsort(self.h_step[:kh], kind="stable")
        step, start = self.h_step[:kh][order], self.h_start[:kh][order]
        period = np.full(kh, np.nan)
        nxt = np.flatnonzero(np.diff(step) == 1)
        period[nxt] = start[nxt + 1] - start[nxt]
        recent = self.step[:min(self.count, RECENT)]
        after = step >= max(since, int(recent.min()) if len(recent) else since)
        before = (step < first) & (step >= max(first - RECENT, self.h_first + WARMUP))
        for x in (period, self.h_time[:kh][order]):
            a, b = x[after & np.isfinite(x)], x[before & np.isfinite(x)]
            if len(a) >= MIN_BASE and len(b) >= MIN_BASE:
                base = float(np.median(b))
                return max(float(np.median(a)) / base - 1.0, 0.0) if base > 0 else None
        return None

    def job_slowdown(self, ranks: list[int], since: int | None) -> float | None:
        """What the subject covering ``ranks`` costs the job per step (:class:`JobCost`'s
        ``value``: the smaller of :meth:`ready_cost` and :meth:`seen`)."""
        return self.job_cost(ranks, since).value

    def job_cost(self, ranks: list[int], since: int | None) -> JobCost:
        """The subject's cost both ways (:class:`JobCost`)."""
        ready = self.ready_cost(ranks, since)
        return JobCost(ready, None if ready is None else self.seen(since))

    def ready_cost(self, ranks: list[int], since: int | None) -> float | None:
        """What the subject covering ``ranks`` costs the job per step by the ranks' ready
        times. Per step (from step
        ``since`` on, when given) the job loses the time its latest rank reaches the
        collective after the latest rank outside it (none where one outside is later): the
        collective waits for the slowest rank, so without the subject the step would end
        that much sooner. The median of that loss over the median step without it (the
        step's duration less the loss; unknown durations: the latest rank's time).
        Medians: what a persistent cause costs a typical step, which a single long step
        (a GC pause of the subject, a hiccup of any other rank) does not move."""
        k = min(self.count, RECENT)
        rows = np.arange(k) if since is None else np.flatnonzero(self.step[:k] >= since)
        if not len(rows) or len(ranks) >= self.ready.shape[1]:
            return None
        x = self.ready[:k]
        cols = sorted(set(ranks))
        inside = np.fmax.reduce(x[:, cols], axis=1)   # (fmax: NaN only where all are)
        outside = _latest_outside(x, cols)
        inside, outside = inside[rows].astype(float), outside[rows].astype(float)
        loss = np.maximum(inside - outside, 0.0)
        ok = np.isfinite(loss)
        if not ok.any():
            return None
        t = self.time[rows]
        t = np.where(np.isnan(t), np.fmax(inside, outside), t)[ok]
        lost = float(np.median(loss[ok]))
        base = float(np.median(t - loss[ok]))
        return lost / base if base > 0 else None

    def joint_job_slowdown(self, subjects: Sequence[Sequence[int]], since: int | None,
                           first: int | None = None) -> tuple[float, list[float]] | None:
        """What the subjects covering ``subjects`` (each a list of ranks: the open findings)
        cost the job together, and each one's part of it: ``(joint, parts)``, the parts in
        the order given, adding up to ``joint``. Over the steps from ``since`` on (all the
        ring holds when None); None where no step is known or the subjects cover every rank.

        - Nested subjects are counted once: each rank belongs to the smallest subject that
          covers it (a rank finding inside a flagged host keeps its rank; the host's part
          is priced on its other ranks).
        - Joint: the median step's latest ready time with every subject, less the median
          one with none of them (the latest rank outside all), over the median step the job
          would have without them (the step's duration less that loss).
        - Parts: the subjects ordered by their own lateness (the median of their latest
          rank's ready time), slowest first, are removed one at a time; each is charged the
          drop in the median latest ready time its removal causes, the others slower than
          it being gone already. The drops telescope to the joint loss, and none is
          negative (each removal can only lower every step's latest time).
        - Bounded as a finding's cost is (:class:`JobCost`), where ``first`` (the earliest
          onset among them) is given: where the job's own step since ``since`` against the
          steps before ``first`` grew by less (:meth:`seen`), the joint is that, and every
          part is scaled by the same factor (they still add up to it). Without ``first``
          (a subject slow since before this attempt: no step without it to compare
          with) it is not bounded."""
        k = min(self.count, RECENT)
        rows = np.arange(k) if since is None else np.flatnonzero(self.step[:k] >= since)
        own: list[list[int]] = [[] for _ in subjects]
        taken: set[int] = set()
        for i in sorted(range(len(subjects)), key=lambda i: len(set(subjects[i]))):
            own[i] = sorted(set(subjects[i]) - taken)   # (smallest subject first)
            taken |= set(own[i])
        if not len(rows) or not subjects or len(taken) >= self.ready.shape[1]:
            return None
        x = self.ready[:k]
        outside = _latest_outside(x, sorted(taken))[rows].astype(float)
        late = [np.fmax.reduce(x[:, c], axis=1)[rows].astype(float) if c
                else np.full(len(rows), np.nan) for c in own]
        ok = np.isfinite(outside)
        if not ok.any():
            return None
        outside, late = outside[ok], [m[ok] for m in late]
        # slowest first: a subject with no known step has no lateness and no part
        key = [float(np.nanmedian(m)) if np.isfinite(m).any() else -math.inf for m in late]
        order = sorted(range(len(subjects)), key=lambda i: -key[i])
        # level[j]: each step's latest ready time with the first j of ``order`` removed
        level = [outside]
        for i in reversed(order):
            level.append(np.fmax(level[-1], late[i]))
        level.reverse()
        med = [float(np.median(lv)) for lv in level]
        t = self.time[rows][ok]
        t = np.where(np.isnan(t), level[0], t)
        base = float(np.median(t - (level[0] - outside)))
        if base <= 0:
            return None
        parts = [0.0] * len(subjects)
        for j, i in enumerate(order):
            parts[i] = (med[j] - med[j + 1]) / base
        joint = (med[0] - med[-1]) / base
        seen = None if first is None else self.seen(since, first)
        if seen is not None and seen < joint:
            parts = [p * seen / joint for p in parts]
            joint = seen
        return joint, parts


def _latest_outside(x: np.ndarray, cols: list[int]) -> np.ndarray:
    """Per row of ``x`` the latest ready time among the columns not in ``cols`` (sorted),
    NaN where none is known: over the column runs between them, as views (no copy of the
    ring: read once every few steps per open finding, at 16k ranks)."""
    outside = np.full(x.shape[0], np.nan, np.float32)
    lo = 0
    for c in [*cols, x.shape[1]]:
        if c > lo:
            np.fmax(outside, np.fmax.reduce(x[:, lo:c], axis=1), out=outside)
        lo = c + 1
    return outside


def _known(step_time_s: float | None) -> float:
    """A step's duration, NaN where it is not known (None, 0 or negative)."""
    return step_time_s if step_time_s and step_time_s > 0 else math.nan
