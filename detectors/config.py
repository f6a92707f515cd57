"""The straggler detector's tuning: every threshold, rate and floor in one frozen dataclass.

Why it exists apart: the CLI's ``--threshold``/``--min-slowdown``/``--evict-at``, the
collector's live detector, the dashboard's batch scans and the evaluation benchmarks all
build one; the detector (:mod:`~goodlens.detectors.stragglers`, which re-exports it) only
reads it. Each field's docstring says what it does and why it has its default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class StragglerConfig:
    """Tuning of :class:`StragglerDetector` (defaults suit 1-3% per-rank step-time noise)."""

    drift_k: float = 0.01
    """Excess ignored, as a relative slowdown: a subject under ~1% slower than its siblings
    is not a straggler. The effective value is ``max(drift_k, drift_k_sigmas x scale)``."""
    drift_k_sigmas: float = 0.4
    """...and at least this many noise units, so the CUSUM drifts down under noise alone."""
    threshold_h: float = 30.0
    """CUSUM decision threshold, in noise units. With ``drift_k_sigmas`` 0.4 the in-control
    run length is about that of 0.5 and 25 (both ~exp(2 k h)), and a 2% rank among ranks
    with 3% noise is found ~30% sooner (``bench/detector_eval.py``)."""
    step_cap: float = 3.0
    """Most one step may add to (or take from) a CUSUM, in noise units: a single 2x step adds
    3, not 70, so a transient spike of 1-3 steps stays far under the threshold."""
    persist_steps: int = 8
    """Steps over the reference value since the excursion began before it can be a finding."""
    scale_floor: float = 0.005
    """Floor of every noise scale (log units): sub-percent jitter in a quiet run is no finding."""
    scale_alpha: float = 0.05
    """EWMA weight of each step's cross-section spread in a level's noise scale."""
    own_alpha: float = 0.02
    """EWMA weight of a subject's own deviation in its own noise scale."""
    own_min_steps: int = 20
    """Steps of a subject's own history before its own scale counts."""
    min_steps: int = 5
    """Steps seen in an attempt before any flag."""
    min_ranks: int = 3
    """Fewest reporting ranks for a step to be scored at all."""
    min_group: int = 3
    """Fewest members for a host or switch to be scored against its siblings (with two, one
    slow member and a slow parent look the same)."""
    cusum_cap: float = 3.0
    """A CUSUM is capped at this many thresholds, so a recovered subject clears in bounded time."""
    suspect_fraction: float = 0.5
    """A subject past this share of the threshold is suspect: its ranks leave the reference."""
    evict_min_slowdown: float = 0.05
    """Recommend ``evict`` at this estimated slowdown or more (else ``watch``)..."""
    evict_min_steps: int = 20
    """...once the finding has lasted this many steps."""
    evict_hysteresis: float = 0.2
    """A finding recommended for eviction goes back to ``watch`` only when its estimate falls
    under ``(1 - evict_hysteresis) x evict_min_slowdown``: an estimate converging at the
    threshold (a rank 5% slow) does not flap between ``evict`` and ``watch`` in updates."""
    update_every: int = 10
    """Fewest steps between two updates of one finding."""
    update_change: float = 0.1
    """Relative change of the slowdown estimate, of the job slowdown, or of the wait the
    finding has cost, that makes an update (or the action changing). The job slowdown and
    the wait are compared once every ``update_every`` steps: a finding's last report is what
    it costs the job now, not when its slowdown last moved (the wait grows while the
    finding lasts: its reports thin out as 10% of it takes longer to add)."""
    resume_steps: int = 50
    """After a restart, a subject flagged again within this many steps continues its finding;
    one not flagged again by then is resolved."""

    def __post_init__(self) -> None:
        positive = ("threshold_h", "scale_floor", "cusum_cap", "step_cap", "scale_alpha",
                    "own_alpha", "suspect_fraction", "update_change")
        for name in positive:
            v = getattr(self, name)
            if not (isinstance(v, int | float) and np.isfinite(v) and v > 0):
                raise ValueError(f"StragglerConfig.{name} must be > 0, got {v!r}")
        for name in ("drift_k", "drift_k_sigmas", "evict_min_slowdown", "evict_hysteresis"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and np.isfinite(v) and v >= 0):
                raise ValueError(f"StragglerConfig.{name} must be >= 0, got {v!r}")
        for name in ("persist_steps", "own_min_steps", "min_steps", "evict_min_steps",
                     "update_every", "resume_steps", "min_group", "min_ranks"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"StragglerConfig.{name} must be an int >= 0, got {v!r}")
        for name in ("scale_alpha", "own_alpha", "suspect_fraction", "evict_hysteresis"):
            if not getattr(self, name) <= 1:
                raise ValueError(f"StragglerConfig.{name} must be <= 1")
        if self.cusum_cap <= 1:
            raise ValueError("StragglerConfig.cusum_cap must be > 1 (above the threshold)")
        if self.min_ranks < 3:
            raise ValueError("StragglerConfig.min_ranks must be >= 3 (a median needs peers)")
        if self.min_group < 2:
            raise ValueError("StragglerConfig.min_group must be >= 2")

    def evict_floor(self, action: str) -> float:
        """The estimate a finding whose action is ``action`` needs to be (or stay) ``evict``."""
        return self.evict_min_slowdown * ((1.0 - self.evict_hysteresis) if action == "evict"
                                          else 1.0)

    def moved(self, new: Any, old: float) -> Any:
        """Whether an estimate (a slowdown, a job slowdown; ``new`` a number or an array)
        moved far enough from its last report ``old`` to be reported again."""
        return abs(new - old) >= self.update_change * max(abs(old), self.drift_k)
