"""Where a job's nodes go: topology-aware (least penalty) or uniformly random placement.

Why it exists: placement is one of the scheduler levers the cluster simulator compares, and
the exact least-penalty search (:func:`topo_racks`) is the most intricate piece of arithmetic
in it. :func:`place_nodes` is the stand-alone form (tests, notebooks); :class:`PlacementMixin`
is the simulator's, on its live free-node state. The random draws come from the simulator's
placement stream only, in the same order whatever the other levers.
"""

from __future__ import annotations

import math

import numpy as np

from goodlens.analysis.clustersim.config import ClusterConfig, Policy
from goodlens.analysis.clustersim.jobs import Job

INF = math.inf


def place_nodes(config: ClusterConfig, free_mask: np.ndarray, n: int, topo: bool,
                rng: np.random.Generator | None = None) -> np.ndarray:
    """``n`` of the free nodes (``free_mask[i]``: node i is free): topology-aware (the least
    penalty ``config.penalty``: an exact search over pods and racks) or uniformly at random.
    Raises ValueError when fewer than ``n`` are free."""
    free_mask = np.asarray(free_mask, bool)
    if free_mask.sum() < n:
        raise ValueError(f"only {int(free_mask.sum())} free nodes for {n}")
    npr = config.nodes_per_rack
    rack_of = np.arange(config.nodes) // npr
    rack_free = np.bincount(rack_of[free_mask], minlength=config.racks)
    if not topo:
        return (rng or np.random.default_rng()).choice(np.flatnonzero(free_mask), n,
                                                       replace=False)
    pod_of_rack = np.arange(config.racks) // config.racks_per_pod
    pen = penalty_table(config)
    picks = topo_racks(rack_free, pod_of_rack, config.pods, n, pen)
    return np.concatenate([np.flatnonzero(free_mask[r * npr:(r + 1) * npr])[:k] + r * npr
                           for r, k in picks])


def penalty_table(cfg: ClusterConfig) -> np.ndarray:
    """pen[pods, racks] of ``cfg.penalty`` (row and column 0 unused)."""
    r = np.maximum(np.arange(cfg.racks + 1), 1)
    p = np.maximum(np.arange(cfg.pods + 1), 1)
    return cfg.comm_fraction * (cfg.rack_cost * ((r - 1) / r)[None, :]
                                + cfg.pod_cost * ((p - 1) / p)[:, None])


def topo_racks(rack_free: np.ndarray, pod_of_rack: np.ndarray, pods: int, n: int,
                pen: np.ndarray) -> list[tuple[int, int]]:
    """(rack, nodes) picks of least penalty for a job of ``n`` nodes.

    One rack if any fits (the fullest-fitting smallest: best fit, to keep big holes). Else a
    dynamic programme over pods: best[c, k] = most nodes coverable with c pods and k racks,
    a pod contributing its j fullest racks; the feasible (c, k) of least pen[c, k] is exact
    because the penalty depends on the counts only. The last, partly used rack is swapped for
    the smallest one in the chosen pods that still completes the job."""
    fits = np.flatnonzero(rack_free >= n)
    if len(fits):
        return [(int(fits[np.argmin(rack_free[fits])]), n)]
    R = len(rack_free)
    best = np.full((pods + 1, R + 1), -1, np.int64)
    best[0, 0] = 0
    stages: list[tuple[np.ndarray, np.ndarray] | None] = []
    for p in range(pods):
        rk = np.flatnonzero((pod_of_rack == p) & (rack_free > 0))
        if not len(rk):
            stages.append(None)
            continue
        rk = rk[np.argsort(-rack_free[rk], kind="stable")]
        cs = np.cumsum(rack_free[rk])
        new = best.copy()
        ch = np.zeros(best.shape, np.int64)
        for j in range(1, len(rk) + 1):
            src = best[:-1, :R + 1 - j]
            cand = src + cs[j - 1]
            dst = new[1:, j:]
            upd = (src >= 0) & (cand > dst)
            dst[upd] = cand[upd]
            ch[1:, j:][upd] = j
        stages.append((rk, ch))
        best = new
    ok = best >= n
    if not ok.any():
        return []
    score = np.where(ok, pen, INF)
    c, k = (int(x) for x in np.unravel_index(int(np.argmin(score)), score.shape))
    racks: list[int] = []
    for p in range(pods - 1, -1, -1):
        st = stages[p]
        if st is None:
            continue
        j = int(st[1][c, k])
        if j:
            racks.extend(int(r) for r in st[0][:j])
            c, k = c - 1, k - j
    racks.sort(key=lambda r: (-rack_free[r], r))
    out, need = [], n
    for r in racks:
        take = min(int(rack_free[r]), need)
        out.append((r, take))
        need -= take
        if not need:
            break
    r_last, take = out[-1]
    if take < rack_free[r_last]:  # best fit for the remainder, within the pods already used
        used = {r for r, _ in out}
        pods_used = {int(pod_of_rack[r]) for r in used}
        cand = [r for r in range(R) if r not in used and int(pod_of_rack[r]) in pods_used
                and take <= rack_free[r] < rack_free[r_last]]
        if cand:
            out[-1] = (min(cand, key=lambda r: (rack_free[r], r)), take)
    return out


class PlacementMixin:
    """Node choice for :class:`~goodlens.analysis.clustersim.sim.ClusterSim` (its state:
    ``free_mask``, ``rack_free``, ``spare``, ``down`` and the topology arrays)."""

    pol: Policy
    prng: np.random.Generator
    free_mask: np.ndarray
    rack_free: np.ndarray
    spare: np.ndarray
    down: np.ndarray
    rack_of: np.ndarray
    pod_of: np.ndarray
    pod_of_rack: np.ndarray
    rack_lo: np.ndarray
    rack_hi: np.ndarray
    n_pods: int
    penalty_tab: np.ndarray

    def place(self, n: int) -> np.ndarray:
        """``n`` free nodes for a whole job (gang scheduling)."""
        if not self.pol.topo:
            return self.prng.choice(np.flatnonzero(self.free_mask), n, replace=False)
        picks = topo_racks(self.rack_free, self.pod_of_rack, self.n_pods, n, self.penalty_tab)
        return np.concatenate([np.flatnonzero(self.free_mask[self.rack_lo[r]:self.rack_hi[r]])
                               [:k] + self.rack_lo[r] for r, k in picks])

    def pick_partial(self, j: Job, g: int) -> np.ndarray:
        """``g`` more free nodes for a partial allocation: topology-aware, the racks and pods
        it holds first, then the fullest racks; else at random."""
        free = np.flatnonzero(self.free_mask)
        if self.pol.topo:
            held = np.asarray(j.held, np.int64)
            k1 = ~np.isin(self.rack_of[free], self.rack_of[held])
            k2 = ~np.isin(self.pod_of[free], self.pod_of[held])
            return free[np.lexsort((free, -self.rack_free[self.rack_of[free]], k2, k1))[:g]]
        return self.prng.choice(free, g, replace=False)

    def pick_spares(self, mine: list[int], k: int) -> list[int]:
        """``k`` idle hot spares to replace a job's failed nodes (``mine``: its live ones):
        topology-aware, in its racks and pods first; else at random."""
        idle = np.flatnonzero(self.spare & ~self.down)
        if not self.pol.topo:
            return [int(x) for x in self.prng.choice(idle, k, replace=False)]
        arr = np.asarray(mine, np.int64)
        k1 = ~np.isin(self.rack_of[idle], self.rack_of[arr])
        k2 = ~np.isin(self.pod_of[idle], self.pod_of[arr])
        return [int(x) for x in idle[np.lexsort((idle, k2, k1))[:k]]]
