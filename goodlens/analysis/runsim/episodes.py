"""Straggler episodes of one trial, drawn up front: when each starts and ends, the wait it adds
to every step while it lasts, and whether the detector could evict it.

Why it exists: a trial (:mod:`goodlens.analysis.runsim.trial`) needs the episodes as a sorted
stream of boundaries (an onset or an end), so that the straggler wait of a step is the worst
episode active at its start; drawing and sorting them is its own step, done once per trial.
The draws are made here in a fixed order from the trial's generator (count, onsets, durations,
slowdowns, causes), so the same seed gives the same episodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from goodlens.analysis.runsim.config import DAY, INF, STRAGGLER_CAUSES, SimConfig
from goodlens.analysis.runsim.prepared import Prepared

__all__ = ["Episodes", "draw_episodes"]


@dataclass
class Episodes:
    """A trial's straggler episodes (index i in every per-episode list) and their boundaries
    in time order (an onset and an end each; ties kept onsets first, in index order)."""

    count: int
    wait_s: list[float]
    """Straggler wait per step while episode i is the worst active one."""
    nodes: list[int]
    """Nodes slowed (and evicted) by episode i: one, or a whole switch for a degraded link."""
    evictable: list[bool]
    """Whether episode i's slowdown is large enough for the detector to see it."""
    boundary_s: list[float]
    """Times of the boundaries, sorted, then ``INF`` (a sentinel: no boundary left)."""
    boundary_episode: list[int]
    """The episode of each boundary."""
    boundary_onset: list[bool]
    """Whether each boundary is its episode's onset (else its end)."""
    record: dict[str, Any] | None
    """For trace mode: onset, end, slowdown, cause and nodes of every episode."""


def draw_episodes(c: SimConfig, p: Prepared, rng: np.random.Generator, record: bool) -> Episodes:
    """Draw the episodes of a trial of ``c`` (``p``: its prepared constants); ``record``
    keeps them for a trace."""
    n_ep = int(rng.poisson(c.straggler_per_node_day * c.nodes / DAY * c.duration_s))
    onset = np.sort(rng.uniform(0, c.duration_s, n_ep))
    dur = c.straggler_duration_median_s * np.exp(c.straggler_duration_sigma *
                                                 rng.standard_normal(n_ep))
    slow = c.straggler_slowdown_median * np.exp(c.straggler_slowdown_sigma *
                                                rng.standard_normal(n_ep))
    why = np.searchsorted(p.sc_cdf, rng.random(n_ep), side="right")
    wait = np.maximum(0.0, p.c0 * ((1 + slow) * p.sc_m[why] - p.med)).tolist()
    nodes = p.sc_nodes[why].tolist()
    end = onset + dur
    times = np.concatenate([onset, end])
    order = np.argsort(times, kind="stable")
    rec = None if not record else dict(
        onset=onset.tolist(), end=end.tolist(), slowdown=slow.tolist(),
        cause=np.array(list(STRAGGLER_CAUSES))[why].tolist(), nodes=nodes)
    episode = np.concatenate([np.arange(n_ep)] * 2)[order].tolist()
    return Episodes(n_ep, wait, nodes, (slow >= c.evict_min_slowdown).tolist(),
                    [*times[order].tolist(), INF], episode, (order < n_ep).tolist(), rec)
