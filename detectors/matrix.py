"""Per-rank step rows to a steps x ranks matrix, without sorting millions of rows.

Why it exists: the batch detector and NVIDIA's rule both walk a run step by step over every
rank. Building that matrix with ``np.unique(axis=0)`` on (attempt, step) pairs sorted the
rows lexicographically and took most of ``goodlens detect``'s 7-8 s and 2.4 GB on 2,048 ranks
x 3,000 steps. Step numbers within an attempt are nearly dense, so a row index is the
attempt's offset plus the step's distance from the attempt's first step: one linear pass.
What fills it from step rows, each rank's time to reach the collective, is here too
(:func:`ready_column`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # frame_matrix's argument only: the detector runs without pandas
    import pandas as pd

#: Steps of an attempt's span with no row at all are kept as empty rows only while the span
#: stays within this factor of the rows present (else the steps are ranked instead).
_MAX_SPARSITY = 4


@dataclass(frozen=True)
class StepMatrix:
    """``values[i, r]``: the value of rank r at row i (NaN: no report); row i is step
    ``steps[i]`` of attempt ``attempts[i]``, rows in (attempt, step) order."""

    attempts: np.ndarray
    steps: np.ndarray
    values: np.ndarray
    duration: np.ndarray
    """Per row, a step duration (the last rank's row written wins; NaN when none)."""
    start: np.ndarray | None = None
    """Per row, when the step began on one reference clock (NaN or None: not known)."""

    @property
    def n_ranks(self) -> int:
        return self.values.shape[1]


def step_matrix(attempt: np.ndarray, step: np.ndarray, rank: np.ndarray, value: np.ndarray,
                duration: np.ndarray | None = None, start: np.ndarray | None = None
                ) -> StepMatrix:
    """The matrix of ``value`` from per-row arrays (any row order); ``start``: each row's
    start, a step's the lowest rank's (the reference clock)."""
    import pandas as pd  # here, not at the top: ``goodlens detect`` never builds one

    att = np.asarray(attempt, np.int64)
    stp = np.asarray(step, np.int64)
    rnk = np.asarray(rank, np.int64)
    n = int(rnk.max()) + 1 if len(rnk) else 0
    if not len(att):
        e = np.zeros(0, np.int64)
        return StepMatrix(e, e, np.zeros((0, n)), np.zeros(0))
    codes, uniq = pd.factorize(att, sort=True)
    lo = pd.Series(stp).groupby(codes).min().to_numpy()
    hi = pd.Series(stp).groupby(codes).max().to_numpy()
    span = hi - lo + 1
    if span.sum() <= _MAX_SPARSITY * max(len(att) // max(n, 1), 1) + 1024:
        offset = np.concatenate([[0], np.cumsum(span)[:-1]])
        row = offset[codes] + stp - lo[codes]
        rows = int(span.sum())
        r_att = np.repeat(np.asarray(uniq, np.int64), span)
        r_step = np.concatenate([np.arange(a, b + 1) for a, b in zip(lo, hi)])
    else:  # sparse step numbers: rank the (attempt, step) keys instead
        key = pd.MultiIndex.from_arrays([att, stp])
        row, keys = pd.factorize(key, sort=True)
        rows = len(keys)
        r_att = np.asarray(keys.get_level_values(0), np.int64)
        r_step = np.asarray(keys.get_level_values(1), np.int64)
    m = np.full((rows, n), np.nan)
    m[row, rnk] = np.asarray(value, float)
    dur = np.full(rows, np.nan)
    if duration is not None:
        dur[row] = np.asarray(duration, float)
    first = None
    if start is not None:   # each row's lowest rank's
        first = np.full(rows, np.nan)
        order = np.lexsort((rnk, row))
        lead = order[np.r_[True, np.diff(row[order]) != 0]]
        first[row[lead]] = np.asarray(start, float)[lead]
    return StepMatrix(r_att, r_step, m, dur, first)


def frame_matrix(steps: pd.DataFrame, value: str | np.ndarray) -> StepMatrix:
    """:func:`step_matrix` over a frame's ``attempt`` (0 when absent), ``step``, ``rank``,
    ``duration_s`` and ``start_time`` (when present) columns, of ``value``: a column's
    name, or one value per row (computed by the caller, so the frame is not copied)."""
    att = steps["attempt"].to_numpy() if "attempt" in steps else np.zeros(len(steps), np.int64)
    dur = steps["duration_s"].to_numpy(float) if "duration_s" in steps else None
    start = steps["start_time"].to_numpy(float) if "start_time" in steps else None
    return step_matrix(att, steps["step"].to_numpy(), steps["rank"].to_numpy(),
                       steps[value].to_numpy(float) if isinstance(value, str) else value, dur,
                       start)


def ready_column(steps: pd.DataFrame) -> pd.Series:
    """Each row's time to reach the collective: ``duration_s - collective_wait_s`` where the
    collective wait was reported, else ``compute_s + data_wait_s`` (data wait 0 if absent),
    else NaN (a ``ready_s`` column, when present, is taken as is)."""
    import pandas as pd

    if "ready_s" in steps:
        return steps["ready_s"]
    nan = pd.Series(np.nan, index=steps.index)
    comp = steps["compute_s"].astype(float) if "compute_s" in steps else nan
    data = steps["data_wait_s"].astype(float).fillna(0.0) if "data_wait_s" in steps else 0.0
    out = comp + data
    if "collective_wait_s" in steps and "duration_s" in steps:
        coll = steps["duration_s"].astype(float) - steps["collective_wait_s"].astype(float)
        out = coll.where(coll.notna(), out)
    return out
