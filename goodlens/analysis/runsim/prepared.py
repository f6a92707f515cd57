"""What every trial of one configuration shares, computed once, and the trials' random draws.

Why it exists: a Monte Carlo runs thousands of trials of one :class:`SimConfig`; the checkpoint
schedule in steps, the straggler-noise Monte Carlo (:func:`straggler_noise`, cached) and the
failure and straggler cause tables are the same for all of them, so :func:`prepare` computes
them once into a :class:`Prepared`. :class:`Draws` hands out uniforms and normals from a trial's
generator in blocks. Both are used by the trial loop (:mod:`goodlens.analysis.runsim.trial`, which
re-exports them) and by the cluster simulator.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from goodlens.analysis.runsim.config import (
    FAILURE_CAUSES,
    STRAGGLER_CAUSES,
    STRAGGLER_LEVELS,
    SimConfig,
)

__all__ = ["Draws", "Prepared", "prepare", "straggler_noise"]


@dataclass
class Prepared:
    """What a configuration's trials share, computed once (:func:`prepare`)."""

    km: int
    """Steps between memory saves (tiered; else the same as ``kd``)."""
    kd: int
    """Steps between durable saves (a multiple of ``km``)."""
    cm: float
    """Stall of a memory save (0 unless tiered)."""
    cdd: float
    """Stall of a durable save."""
    c0: float
    """Median compute per step."""
    w0: float
    """Straggler wait per step from noise alone."""
    med: float
    """E[median] of the per-rank compute factors."""
    cause_cdf: list[float]
    """Cumulative shares of the failure causes (``FAILURE_CAUSES``), the last left out."""
    hang: list[float]
    """Per cause: the probability a failure hangs."""
    wide: list[float]
    """Per cause: the probability a failure spans several nodes."""
    sc_cdf: np.ndarray
    """Cumulative weights of the straggler causes, the last left out."""
    sc_m: np.ndarray
    """Per straggler cause: E[max] of the compute factors of the ranks it slows (one rank's,
    one node's or one switch's)."""
    sc_nodes: np.ndarray
    """Per straggler cause: the nodes it slows (and an eviction takes)."""


@functools.lru_cache(maxsize=32)
def straggler_noise(ranks: int, sigma: float, node: int,
                    switch: int) -> tuple[float, float, float, float, float]:
    """E[max - median], E[median], E[one rank's], E[max of a node's ranks], E[max of a
    switch's ranks] of per-rank lognormal(0, sigma) compute factors: a seeded Monte Carlo
    over >= 16 steps."""
    if sigma == 0:
        return 0.0, 1.0, 1.0, 1.0, 1.0
    rng = np.random.default_rng(0x5EED)
    steps = max(16, min(1024, (1 << 20) // ranks))
    x = np.exp(sigma * rng.standard_normal((steps, ranks)))
    med = np.median(x, axis=1)

    def group_max(g: int) -> float:
        k = max(g, ranks // g * g)
        xs = x if k <= ranks else np.exp(sigma * rng.standard_normal((steps, k)))
        return float(xs[:, :k].reshape(steps, -1, g).max(axis=2).mean())
    return float(np.mean(x.max(axis=1) - med)), float(med.mean()), float(x.mean()), \
        group_max(node), group_max(switch)


def prepare(c: SimConfig) -> Prepared:
    """The constants of ``c``'s trials: checkpoint schedule, noise and cause tables."""
    k = max(1, round(c.interval_s / c.step_s))
    if c.ckpt_mode == "tiered":
        km = max(1, round(c.memory_interval_s / c.step_s))
        kd = km * max(1, round(k / km))
        cm, cdd = c.memory_stall_s, max(c.memory_stall_s, c.snapshot_s)
    else:
        km = kd = k
        cm, cdd = 0.0, (c.write_s if c.ckpt_mode == "sync" else c.snapshot_s)
    c0 = c.compute_fraction * c.step_s
    sw_nodes = min(c.nodes_per_switch, c.nodes)
    wait, med, m_rank, m_node, m_sw = straggler_noise(c.nodes * c.gpus_per_node,
                                                      float(c.compute_noise_sigma),
                                                      c.gpus_per_node, sw_nodes * c.gpus_per_node)
    counts = np.array([n for _, n, _, _ in FAILURE_CAUSES], dtype=float)
    hang = [(c.hang_prob or {}).get(name, h) for name, _, h, _ in FAILURE_CAUSES]
    wf = c.wide_failure_fraction
    wide = [float(w) if wf is None else float(wf) for _, _, _, w in FAILURE_CAUSES]
    names = list(STRAGGLER_CAUSES)
    sw = np.array([float(c.straggler_causes.get(s, 0.0)) for s in names])
    level = [STRAGGLER_LEVELS[s] for s in names]
    m_level = {"rank": m_rank, "node": m_node, "switch": m_sw}
    return Prepared(km, kd, cm, cdd, c0, c0 * wait, med,
                    (np.cumsum(counts) / counts.sum()).tolist()[:-1], hang, wide,
                    np.cumsum(sw / sw.sum())[:-1], np.array([m_level[v] for v in level]),
                    np.array([sw_nodes if v == "switch" else 1 for v in level]))


class Draws:
    """Uniforms and normals drawn in blocks (scalar Generator calls are slow)."""

    __slots__ = ("iu", "iz", "rng", "u", "z")

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.u, self.z, self.iu, self.iz = rng, [], [], 0, 0

    def uni(self) -> float:
        """A uniform in [0, 1)."""
        if self.iu >= len(self.u):
            self.u, self.iu = self.rng.random(512).tolist(), 0
        self.iu += 1
        return self.u[self.iu - 1]

    def exp(self) -> float:
        """A standard exponential (from one uniform)."""
        return -math.log(1.0 - self.uni())

    def norm(self) -> float:
        """A standard normal."""
        if self.iz >= len(self.z):
            self.z, self.iz = self.rng.standard_normal(256).tolist(), 0
        self.iz += 1
        return self.z[self.iz - 1]
