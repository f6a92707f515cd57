"""Straggler episodes of one trial, drawn up front: when each starts and ends, the ranks it
slows and by how much, and whether the detector could evict it.

Why it exists: a trial (:mod:`goodlens.analysis.runsim.trial`) needs the episodes as a sorted
stream of boundaries (an onset or an end), so that the straggler wait of a step is known at
its start; drawing and sorting them is its own step, done once per trial. The draws are made
here in a fixed order from the trial's generator (count, onsets, durations, slowdowns,
causes), so the same seed gives the same episodes. Where each episode strikes (which rank,
node or switch) comes from a second stream (:func:`place_stream`), so that placing them left
the trial's other draws as they were, and a trace and a breakdown of one seed place them
alike.

Nested episodes compound: a rank's compute is slowed by every active episode whose ranks
include it (a rank inside a slow node behind a slow switch runs at the product of their
factors), as the trace writer (:mod:`goodlens.analysis.runsim.tracegen`) slows it. A rank, a
node and a switch are sets of ranks that nest or are disjoint, so each set's factor is the
product of the active episodes on it and on the sets around it (its node's, its switch's),
and the step waits for the worst set (:meth:`Episodes.wait`). Two episodes on one set (two
faults on one switch) compound too; two on disjoint sets (two ranks of one node) do not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from goodlens.analysis.runsim.config import (
    DAY,
    INF,
    STRAGGLER_CAUSES,
    STRAGGLER_LEVELS,
    SimConfig,
)
from goodlens.analysis.runsim.prepared import Prepared

__all__ = ["PLACE_KEY", "Episodes", "draw_episodes", "place_stream"]

PLACE_KEY = 0x7ACE
"""Second word of the seed of a trial's placement stream (:func:`place_stream`)."""


@dataclass
class Episodes:
    """A trial's straggler episodes (index i in every per-episode list) and their boundaries
    in time order (an onset and an end each; ties kept onsets first, in index order)."""

    count: int
    wait_s: list[float]
    """Straggler wait per step while episode i is the only one active (noise aside)."""
    nodes: list[int]
    """Nodes slowed (and evicted) by episode i: one, or a whole switch for a degraded link."""
    evictable: list[bool]
    """Whether episode i's slowdown is large enough for the detector to see it."""
    factor: list[float]
    """1 + episode i's slowdown: what it multiplies its ranks' compute by."""
    top: list[float]
    """E[max] of the compute factors of episode i's ranks."""
    level: list[str]
    """What episode i slows: ``rank``, ``node`` or ``switch``."""
    shape: tuple[int, int, int]
    """The world: nodes, GPUs (ranks) per node, nodes per switch (at most ``nodes``)."""
    c0: float
    """Median compute per step."""
    med: float
    """E[median] of the per-rank compute factors."""
    boundary_s: list[float]
    """Times of the boundaries, sorted, then ``INF`` (a sentinel: no boundary left)."""
    boundary_episode: list[int]
    """The episode of each boundary."""
    boundary_onset: list[bool]
    """Whether each boundary is its episode's onset (else its end)."""
    place: np.random.Generator
    """Draws where the episodes strike (``where``), when first needed; or the trial's own
    generator, from which a stream is then spawned (its own draws stay as they are)."""
    spawn: bool
    """Whether ``place`` is the trial's own generator (spawn a stream off it)."""
    where: list[tuple[int, int, int]] | None = None
    """Per episode: its subject's id (a rank, node or switch number) and its ranks ``r0`` to
    ``r1`` (exclusive); None until :meth:`placed`."""
    record: dict[str, Any] | None = None
    """For trace mode: onset, end, slowdown, cause, nodes and subject (``subject``, ``id``,
    ranks ``r0`` to ``r1`` exclusive) of every episode."""
    active: dict[int, float] = field(default_factory=dict)
    """The episodes active now (:meth:`begin`, :meth:`end`): their factors."""
    on: dict[tuple[int, int], float] | None = None
    """Per set of ranks ``(r0, r1)`` with active episodes: the product of their factors
    (kept once two episodes were active at once; None before)."""
    members: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    """Per set in ``on``: its active episodes."""
    sets: dict[tuple[int, int], tuple] = field(default_factory=dict)
    """Per set met so far: E[max] of its ranks, and its node's and its switch's sets where
    those are larger sets around it (else None)."""

    def placed(self) -> list[tuple[int, int, int]]:
        """Where each episode strikes (``where``), drawn on first use: a trial whose episodes
        never overlap needs none. Uniformly a switch (one of the ``nodes // k`` whole ones),
        a node, or one rank of a node."""
        if self.where is None:
            n, place = self.count, self.place.spawn(1)[0] if self.spawn else self.place
            u1, u2 = place.random(n).tolist(), place.random(n).tolist()
            nodes, gpn, k = self.shape
            n_sw, out = max(1, nodes // k), []
            for level, a, b in zip(self.level, u1, u2, strict=True):
                if level == "switch":
                    sw = int(a * n_sw)
                    out.append((sw, sw * k * gpn, min(sw * k + k, nodes) * gpn))
                elif level == "node":
                    node = int(a * nodes)
                    out.append((node, node * gpn, node * gpn + gpn))
                else:
                    r = int(a * nodes) * gpn + int(b * gpn)
                    out.append((r, r, r + 1))
            self.where = out
        return self.where

    def begin(self, i: int) -> None:
        """Episode i's onset."""
        self.active[i] = self.factor[i]
        if self.on is not None:
            self._join(i)

    def end(self, i: int) -> None:
        """Episode i ends (or is evicted); nothing if it is not active."""
        if self.active.pop(i, None) is None or self.on is None:
            return
        key = self.where[i][1:]
        left = self.members[key]
        left.remove(i)
        if left:
            f = 1.0
            for j in left:
                f *= self.factor[j]
            self.on[key] = f
        else:
            del self.on[key], self.members[key]

    def wait(self, w0: float) -> float:
        """Straggler wait per step with the active episodes: the worst set's, each set's
        ranks slowed by the product of the factors on it and around it, or noise's ``w0``."""
        active = self.active
        if not active:
            return w0
        if len(active) == 1:
            for i in active:
                return max(w0, self.wait_s[i])
        if self.on is None:  # two at once for the first time: place them all
            self.placed()
            self.on = {}
            for i in active:
                self._join(i)
        on, sets, c0, med, w = self.on, self.sets, self.c0, self.med, w0
        for key, f in on.items():
            top, node, switch = sets[key]
            w = max(w, c0 * (f * on.get(node, 1.0) * on.get(switch, 1.0) * top - med))
        return w

    def _join(self, i: int) -> None:
        """Episode i into its set's product."""
        key = self.where[i][1:]
        self.on[key] = self.on.get(key, 1.0) * self.factor[i]
        self.members.setdefault(key, []).append(i)
        if key not in self.sets:
            nodes, gpn, k = self.shape
            r0, r1 = key
            node = r0 // gpn
            sw = node // k
            around = [s if s[0] <= r0 and r1 <= s[1] and s != key else None for s in (
                (node * gpn, node * gpn + gpn), (sw * k * gpn, min(sw * k + k, nodes) * gpn))]
            if around[1] == around[0]:
                around[1] = None  # a node that is a whole switch counts once
            self.sets[key] = (self.top[i], *around)


def place_stream(seed: int, nodes: int) -> tuple[np.random.Generator, np.ndarray]:
    """Trial ``seed``'s placement stream, after its first ``nodes`` draws (uniforms in
    [-1, 1), returned: a trace's host clock offsets). It then places the episodes
    (:meth:`Episodes.placed`) and draws a trace's per-rank noise."""
    rng = np.random.default_rng([seed, PLACE_KEY])
    return rng, rng.uniform(-1.0, 1.0, nodes)


def draw_episodes(c: SimConfig, p: Prepared, rng: np.random.Generator, record: bool,
                  place: np.random.Generator | None = None) -> Episodes:
    """Draw the episodes of a trial of ``c`` (``p``: its prepared constants); ``place``
    places them (by default a stream spawned from ``rng``, which leaves ``rng``'s own draws
    as they are); ``record`` keeps them for a trace (and places them now)."""
    n_ep = int(rng.poisson(c.straggler_per_node_day * c.nodes / DAY * c.duration_s))
    onset = np.sort(rng.uniform(0, c.duration_s, n_ep))
    dur = c.straggler_duration_median_s * np.exp(c.straggler_duration_sigma *
                                                 rng.standard_normal(n_ep))
    slow = c.straggler_slowdown_median * np.exp(c.straggler_slowdown_sigma *
                                                rng.standard_normal(n_ep))
    why = np.searchsorted(p.sc_cdf, rng.random(n_ep), side="right")
    top = p.sc_m[why]
    wait = np.maximum(0.0, p.c0 * ((1 + slow) * top - p.med)).tolist()
    nodes = p.sc_nodes[why].tolist()
    end = onset + dur
    times = np.concatenate([onset, end])
    order = np.argsort(times, kind="stable")
    causes = np.array(list(STRAGGLER_CAUSES))[why].tolist()
    episode = np.concatenate([np.arange(n_ep)] * 2)[order].tolist()
    ep = Episodes(n_ep, wait, nodes, (slow >= c.evict_min_slowdown).tolist(),
                  (1 + slow).tolist(), top.tolist(), [STRAGGLER_LEVELS[s] for s in causes],
                  (c.nodes, c.gpus_per_node, min(c.nodes_per_switch, c.nodes)), p.c0, p.med,
                  [*times[order].tolist(), INF], episode, (order < n_ep).tolist(),
                  rng if place is None else place, place is None)
    if record:
        where = ep.placed() if n_ep else []
        ep.record = dict(onset=onset.tolist(), end=end.tolist(), slowdown=slow.tolist(),
                         cause=causes, nodes=nodes, subject=ep.level,
                         id=[w[0] for w in where], r0=[w[1] for w in where],
                         r1=[w[2] for w in where])
    return ep
