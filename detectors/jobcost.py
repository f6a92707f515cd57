"""What a straggling subject costs the job per step: the last scored steps of an attempt,
and the job-level loss read off them (a finding's ``job_slowdown``).

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
        # the latest rank outside: over the column runs between the subject's, as views
        # (no copy of the ring: compared once every few steps per open finding, at 16k ranks)
        outside = np.full(k, np.nan, np.float32)
        lo = 0
        for c in [*cols, x.shape[1]]:
            if c > lo:
                np.fmax(outside, np.fmax.reduce(x[:, lo:c], axis=1), out=outside)
            lo = c + 1
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


def _known(step_time_s: float | None) -> float:
    """A step's duration, NaN where it is not known (None, 0 or negative)."""
    return step_time_s if step_time_s and step_time_s > 0 else math.nan
