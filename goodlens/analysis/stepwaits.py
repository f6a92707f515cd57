"""The waits inside a kept step that are not forward progress: straggler wait and input stall.

Why a module of its own: accounting (:mod:`goodlens.analysis.accounting`) cuts each step
into consecutive parts; these two come from the step summaries alone (per-rank ready times
and data waits, aggregated by storage), and their rules are the ones most open to argument,
so they live, and are documented, in one place:

- **straggler wait** = the slowest rank's time to reach the collective minus the median
  rank's (``ready_max - ready_median``). A rank's *ready* time is its step time minus its
  collective wait (else its compute plus data wait): a rank starved by its data loader holds
  the all-reduce up as a slow GPU does, and compute alone would not show it. Summaries
  without ready times (rows of an older goodlens, frames built by hand) fall back to
  ``compute_max - compute_median``; a step with neither is *not measured*.
- **input stall** = ``data_wait_min``, the data wait every rank of the step had (null unless
  every rank reported one): the whole job was waiting on input, not on one rank, so it is
  ``other.input_stall`` (data-loading badput, as ml-goodput-measurement calls loading that
  blocks training). It lies inside every rank's ready time, so inside the median's, and does
  not overlap the straggler wait.

Both are clipped so that, with the checkpoint stall, labelled intervals and warm-up already
taken out, the parts of one step never exceed its duration; a step a later attempt redid
keeps all of its time in ``recompute``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def _col(st: pd.DataFrame, name: str) -> np.ndarray:
    """Column ``name`` of ``st`` as floats (NaN where null, all NaN when absent)."""
    if name not in st:
        return np.full(len(st), np.nan)
    return pd.to_numeric(st[name], errors="coerce").to_numpy(dtype=float)


def step_waits(st: pd.DataFrame, left: np.ndarray, lost: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step of the step summaries ``st``: ``(straggler wait, input stall, measured)``.
    ``left`` is what is left of each step once its checkpoint stall, labelled intervals and
    warm-up are out; ``lost`` marks steps a later attempt redid (no waits: all recompute);
    ``measured`` marks steps whose straggler wait was measured (ready times or compute)."""
    by_ready = np.nan_to_num(_col(st, "ready_ranks")) > 0
    by_compute = ~by_ready & (np.nan_to_num(_col(st, "compute_ranks")) > 0)
    sw = np.where(by_ready, _col(st, "ready_max") - _col(st, "ready_median"),
                  np.where(by_compute, _col(st, "compute_max") - _col(st, "compute_median"),
                           0.0))
    sw = np.where(lost, 0.0, np.clip(np.nan_to_num(sw, nan=0.0), 0.0, left))
    stall = np.nan_to_num(_col(st, "data_wait_min"), nan=0.0)
    stall = np.where(lost, 0.0, np.clip(stall, 0.0, left - sw))
    return sw, stall, by_ready | by_compute
