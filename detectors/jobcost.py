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

import numpy as np

#: Steps a finding's job-level cost is priced over (the attempt's latest).
RECENT = 64


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

    def clear(self) -> None:
        """Forget every step (a new attempt)."""
        self.count = 0

    def add_one(self, step: int, ready: np.ndarray, step_time_s: float | None) -> None:
        at = self.count % RECENT
        self.ready[at] = ready
        self.step[at] = step
        self.time[at] = _known(step_time_s)
        self.count += 1

    def add(self, steps: Sequence[int], ready: np.ndarray,
            step_times: Sequence[float | None]) -> None:
        lo = max(0, len(steps) - RECENT)   # (at most a ring's worth: the last rows)
        at = (self.count + np.arange(lo, len(steps))) % RECENT
        self.ready[at] = ready[lo:]
        self.step[at] = steps[lo:]
        self.time[at] = [_known(t) for t in step_times[lo:]]
        self.count += len(steps)

    def job_slowdown(self, ranks: list[int], since: int | None) -> float | None:
        """What the subject covering ``ranks`` costs the job per step. Per step (from step
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

    def joint_job_slowdown(self, subjects: Sequence[Sequence[int]], since: int | None
                           ) -> tuple[float, list[float]] | None:
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
          negative (each removal can only lower every step's latest time)."""
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
        return (med[0] - med[-1]) / base, parts


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
