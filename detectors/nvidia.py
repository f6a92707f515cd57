"""NVIDIA's resiliency-extension straggler rule, kept as the baseline we compare against.

Why it exists: the benchmark and the docs claim the CUSUM detector finds what this rule
cannot (anything under about a third slower); the claim is only honest if the rule runs on
the same traces. Per window of steps, each rank's score is the median over ranks of the
per-rank median time divided by its own median; a score under 0.75 flags the rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # nvidia_rule's argument only: the detector runs without pandas
    import pandas as pd

from goodlens.detectors.matrix import frame_matrix


@dataclass(frozen=True)
class RuleFlag:
    """A rank NVIDIA's resiliency-extension rule flags in one report window."""

    rank: int
    attempt: int
    first_step: int
    last_step: int
    score: float
    """Reference median / the rank's median time in the window (flagged below 0.75)."""


def nvidia_rule(steps: pd.DataFrame, window_steps: int, threshold: float = 0.75,
                value: str = "compute_s") -> list[RuleFlag]:
    """Per window of ``window_steps`` steps of each attempt, the ranks whose score is under
    ``threshold`` (``value``: the per-rank time column to score)."""
    if window_steps < 1:
        raise ValueError("window_steps must be >= 1")
    if steps.empty:
        return []
    sm = frame_matrix(steps, value)
    out: list[RuleFlag] = []
    for a in np.unique(sm.attempts):
        rows = np.flatnonzero(sm.attempts == a)
        out += nvidia_rule_matrix(sm.values[rows], sm.steps[rows], window_steps, threshold,
                                  int(a))
    return out


def nvidia_rule_matrix(compute: np.ndarray, steps: np.ndarray, window_steps: int,
                       threshold: float = 0.75, attempt: int = 0) -> list[RuleFlag]:
    """:func:`nvidia_rule` on one attempt's steps x ranks matrix (NaN: no report), with
    ``steps[i]`` the step number of row i; windows are consecutive runs of rows."""
    if window_steps < 1:
        raise ValueError("window_steps must be >= 1")
    m = np.asarray(compute, dtype=float)
    out: list[RuleFlag] = []
    for w0 in range(0, len(m), window_steps):
        block = m[w0:w0 + window_steps]
        have = np.isfinite(block).any(axis=0)
        if have.sum() < 2:
            continue
        own = (np.median(block, axis=0) if have.all() and np.isfinite(block).all()
               else np.nanmedian(block[:, have], axis=0))
        ref = float(np.median(own))
        score = ref / own
        low = score < threshold
        for r, sc in zip(np.flatnonzero(have)[low], score[low]):
            out.append(RuleFlag(int(r), attempt, int(steps[w0]),
                                int(steps[min(w0 + window_steps, len(m)) - 1]), float(sc)))
    return out
