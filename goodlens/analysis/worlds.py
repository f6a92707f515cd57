"""Per attempt: the world it ran on and the samples each optimizer step took.

Why: an elastic job changes its world mid-run (a node lost, a hot spare joining, a straggler
evicted) and should keep its global batch by changing gradient accumulation
(``goodlens plan elastic``, :func:`goodlens.exporter.elastic.batch_for_world`). Time
accounting says what each resize cost; this says whether the training itself stayed the
same: per attempt, the ranks that reported and the samples per optimizer step (the step
summaries' sum over ranks of what each rank counted with ``exporter.count(samples=...)``),
over the steps every rank reported. Pure computation over the step summaries.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

__all__ = ["attempt_worlds"]


def attempt_worlds(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per attempt: ``attempt``, ``world_size`` (most ranks reporting a step),
    ``steps``, ``full_steps`` (steps every rank reported) and, when ranks counted samples,
    ``samples_per_step`` (median over the full steps) with its ``_min`` and ``_max``."""
    if not len(steps) or "samples" not in steps or "ranks" not in steps:
        return []
    out = []
    for attempt, s in steps.groupby("attempt", sort=True):
        world = int(s.ranks.max())
        full = s[s.ranks == world]
        row: dict[str, Any] = {"attempt": int(attempt), "world_size": world,
                               "steps": len(s), "full_steps": len(full)}
        samples = full.samples.dropna().astype(float)
        if len(samples):
            row["samples_per_step"] = float(samples.median())
            row["samples_per_step_min"] = float(samples.min())
            row["samples_per_step_max"] = float(samples.max())
        out.append(row)
    return out
