"""Hang and silent-failure detection with a timeout adapted to the observed step interval.

Why it exists: a hung collective produces no error, only silence; a fixed watchdog timeout is
either too short for runs with long steps or checkpoint stalls (false alarms) or far too long
for fast ones (lost minutes per hang, times every rank). Here the timeout is a safety factor
over the longest interval seen between a rank's consecutive reports, never below a floor.
Pure and clock-free: the caller passes times in (``observe``) and asks (``check``); no threads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HangConfig:
    """Tuning of :class:`HangDetector`."""

    min_timeout_s: float = 60.0
    """Floor of the timeout (also the timeout before any interval has been seen)."""
    safety_factor: float = 3.0
    """Timeout = this x the longest observed interval between a rank's reports."""
    max_timeout_s: float | None = None
    """Optional ceiling of the timeout (None: no ceiling)."""

    def __post_init__(self) -> None:
        if not (np.isfinite(self.min_timeout_s) and self.min_timeout_s > 0):
            raise ValueError("HangConfig.min_timeout_s must be > 0")
        if not (np.isfinite(self.safety_factor) and self.safety_factor >= 1):
            raise ValueError("HangConfig.safety_factor must be >= 1")
        if self.max_timeout_s is not None and not self.max_timeout_s >= self.min_timeout_s:
            raise ValueError("HangConfig.max_timeout_s must be >= min_timeout_s")

    def timeout(self, longest_interval_s: float) -> float:
        """The timeout after ``longest_interval_s`` between reports: max(floor, safety
        factor x interval), at most the ceiling."""
        t = max(self.min_timeout_s, self.safety_factor * longest_interval_s)
        return t if self.max_timeout_s is None else min(t, self.max_timeout_s)


@dataclass(frozen=True)
class Silence:
    """How long a run in progress has been quiet, against the timeout its own step rhythm
    gives (what the live hang detector would have used)."""

    last_activity: float
    """The latest step end or event of the run's current attempt (epoch s)."""
    silent_s: float
    """Seconds from then to now."""
    timeout_s: float
    """max(floor, safety factor x the longest interval between the attempt's step ends)."""

    @property
    def silent(self) -> bool:
        """Quiet for longer than the timeout: hung, or gone without an end event."""
        return self.silent_s > self.timeout_s


def silence(step_ends: np.ndarray, last_activity: float, now: float,
            config: HangConfig | None = None) -> Silence:
    """The :class:`Silence` of an attempt from its steps' end times (the latest rank's end
    of each step; the job-level rhythm the live detector tracks per rank)."""
    ends = np.sort(np.asarray(step_ends, dtype=float))
    ends = ends[np.isfinite(ends)]
    longest = float(np.diff(ends).max()) if len(ends) > 1 else 0.0
    return Silence(float(last_activity), max(0.0, float(now - last_activity)),
                   (config or HangConfig()).timeout(longest))


@dataclass(frozen=True)
class HangFinding:
    """A rank (or the whole job) silent for longer than the timeout."""

    subject_kind: str
    """``rank`` or ``job`` (every known rank silent)."""
    subject_id: int | None
    """The rank, or None for the job."""
    last_seen: float
    """Time of the subject's last report (the job's: its latest report from any rank)."""
    silent_s: float
    """Seconds of silence at the check."""
    timeout_s: float
    """The adaptive timeout that was exceeded."""


class HangDetector:
    """Track each rank's last report; ``check(now)`` returns ranks newly silent past the
    timeout (one ``job`` finding instead when every rank is). A subject is reported once
    until it reports again."""

    def __init__(self, config: HangConfig | None = None) -> None:
        self.config = config or HangConfig()
        self._last: dict[int, float] = {}
        self._max_interval = 0.0
        self._reported: set[int] = set()
        self._job_reported = False

    @property
    def timeout_s(self) -> float:
        """The current timeout: max(floor, safety factor x longest interval seen)."""
        return self.config.timeout(self._max_interval)

    @property
    def last_report(self) -> float | None:
        """The latest report from any rank (None before the first)."""
        return max(self._last.values(), default=None)

    def observe(self, rank: int, t: float) -> None:
        """Rank ``rank`` reported (a step end or heartbeat) at time ``t`` (seconds)."""
        prev = self._last.get(rank)
        if prev is not None and t <= prev:
            return   # an older step end (a late row, or one seen before) is no progress
        if prev is not None:
            gap = t - prev
            # a gap that was itself reported as a hang must not stretch the timeout
            if rank not in self._reported and not self._job_reported:
                self._max_interval = max(self._max_interval, gap)
        self._last[rank] = t
        self._reported.discard(rank)
        self._job_reported = False

    def forget(self, rank: int) -> None:
        """Stop tracking a rank (it left the world: evicted, or the job shrank)."""
        self._last.pop(rank, None)
        self._reported.discard(rank)

    def check(self, now: float) -> list[HangFinding]:
        """Subjects silent for longer than the timeout at ``now`` and not yet reported."""
        if not self._last:
            return []
        to = self.timeout_s
        silent = [(r, t) for r, t in self._last.items() if now - t > to]
        if len(silent) == len(self._last):
            if self._job_reported:
                return []
            self._job_reported = True
            self._reported.update(r for r, _ in silent)
            last = max(t for _, t in silent)
            return [HangFinding("job", None, last, now - last, to)]
        out = [HangFinding("rank", r, t, now - t, to) for r, t in silent
               if r not in self._reported]
        self._reported.update(f.subject_id for f in out)  # type: ignore[misc]
        return out
