"""Where ranks run, and the tree of subjects a straggler finding can name.

Why it exists: a slow rank, a slow host and a slow switch all make every rank wait, and an
operator acts on each differently (replace a GPU, drain a node, call the network team). The
detector scores each subject against its siblings one level up (a rank against the other
ranks of its host, a host against the other hosts behind its switch, a switch against the
job), so a rank inside a slow host inside a slow switch is three findings that each explain
themselves. This module turns each rank's host and the run's tags into that tree and the
index arrays the detector needs to compute every level's medians with a few numpy calls.

A level is split only where it can be: a host with fewer than ``min_group`` ranks (or a
switch with fewer than ``min_group`` hosts) cannot tell one slow member from a slow parent,
so its members are scored directly against the level above (a one-rank host's rank is a
rank finding, a one-host switch's host a host finding).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Topology:
    """Where ranks run: ``rank_host[r]`` is a host index, ``host_switch[h]`` a switch index."""

    rank_host: np.ndarray
    """Host index of each rank (0..n_hosts-1)."""
    host_names: tuple[str, ...]
    """Name of each host index."""
    host_switch: np.ndarray | None = None
    """Switch index of each host, or None when switches are unknown."""
    switch_names: tuple[str, ...] | None = None
    """Name of each switch index (from an explicit map); None: switches are numbered."""

    @classmethod
    def from_hosts(cls, rank_hosts: Sequence[str], nodes_per_switch: int | None = None
                   ) -> Topology:
        """Build from each rank's host name; hosts are numbered by their lowest rank and host
        k sits behind switch ``k // nodes_per_switch`` (the simulator's and a rail layout's)."""
        names: dict[str, int] = {}
        idx = np.array([names.setdefault(str(h), len(names)) for h in rank_hosts], np.int64)
        sw = None
        if nodes_per_switch is not None:
            if nodes_per_switch < 1:
                raise ValueError("nodes_per_switch must be >= 1")
            sw = np.arange(len(names), dtype=np.int64) // nodes_per_switch
        return cls(idx, tuple(names), sw)

    @classmethod
    def from_run(cls, rank_hosts: Sequence[str], tags: Mapping[str, Any] | None) -> Topology:
        """From each rank's host and the run's tags: an explicit map
        ``{"switch_of_host": {"node-0007": "leaf-3", ...}}`` (the topology map), else
        ``{"nodes_per_switch": k}``, else hosts only (no switch level)."""
        tags = tags or {}
        explicit = tags.get("switch_of_host")
        if isinstance(explicit, Mapping) and explicit:
            topo = cls.from_hosts(rank_hosts)
            switches: dict[str, int] = {}
            sw = np.array([switches.setdefault(str(explicit.get(h, f"?{h}")), len(switches))
                           for h in topo.host_names], np.int64)
            return cls(topo.rank_host, topo.host_names, sw, tuple(switches))
        per = tags.get("nodes_per_switch")
        return cls.from_hosts(rank_hosts, int(per) if per else None)

    def switch_name(self, index: int) -> int | str:
        """How a switch is named in findings: its name from the map, else its index."""
        return self.switch_names[index] if self.switch_names else int(index)


def _groups(parent: np.ndarray, n_parents: int) -> tuple[np.ndarray, np.ndarray]:
    """(members, size): ``members[p]`` the children of parent p padded with -1."""
    size = np.bincount(parent, minlength=n_parents)
    width = int(size.max()) if len(size) else 0
    members = np.full((n_parents, max(width, 1)), -1, np.int64)
    order = np.argsort(parent, kind="stable")
    slot = np.arange(len(parent)) - np.repeat(np.cumsum(size) - size, size)
    members[parent[order], slot] = order
    return members, size


class Layout:
    """The subject tree as arrays: ranks, split hosts and split switches as one list of units
    (rank units first, then hosts, then switches), each with its kind, name and members."""

    def __init__(self, n_ranks: int, topology: Topology | None, min_group: int) -> None:
        self.n = n_ranks
        self.topology = topology
        if topology is None:
            self.host = None
            self.n_hosts = 0
            self.host_split = np.zeros(0, bool)
            self.sw = None
            self.n_sw = 0
            self.sw_split = np.zeros(0, bool)
            return
        self.host = np.asarray(topology.rank_host[:n_ranks], np.int64)
        self.n_hosts = int(self.host.max()) + 1 if n_ranks else 0
        self.host_members, self.host_size = _groups(self.host, self.n_hosts)
        self.host_full = bool((self.host_members >= 0).all())
        self.host_split = self.host_size >= min_group
        hs = topology.host_switch
        if hs is None:
            self.sw, self.n_sw, self.sw_split = None, 0, np.zeros(0, bool)
            return
        self.sw = np.asarray(hs[:self.n_hosts], np.int64)
        self.n_sw = int(self.sw.max()) + 1 if len(self.sw) else 0
        self.sw_members, self.sw_size = _groups(self.sw, self.n_sw)
        self.sw_full = bool((self.sw_members >= 0).all())
        self.sw_split = self.sw_size >= min_group

    def rank_units(self, kind: str, index: int) -> np.ndarray:
        """The ranks a host or switch covers."""
        if kind == "host":
            return np.flatnonzero(self.host == index)
        return np.flatnonzero(self.sw[self.host] == index)

    def name(self, kind: str, index: int) -> int | str:
        """How a subject is named in a finding."""
        if kind == "rank":
            return int(index)
        if kind == "host":
            return self.topology.host_names[index]
        return self.topology.switch_name(index)

    def context(self, kind: str, index: int) -> tuple[str | None, int | str | None, str]:
        """(host, switch, what the subject was compared with) for a finding."""
        host = sw = None
        if kind == "rank" and self.host is not None:
            h = int(self.host[index])
            host = self.topology.host_names[h]
            if self.sw is not None:
                sw = self.topology.switch_name(int(self.sw[h]))
            if self.host_split[h]:
                return host, sw, f"the other ranks of host {host}"
            kind, index = "host", h
        if kind == "host" and self.sw is not None:
            s = int(self.sw[index])
            sw = self.topology.switch_name(s)
            if self.sw_split[s]:
                return host, sw, f"the other hosts behind switch {sw}"
        return host, sw, "the rest of the job"


#: Up to this many values a median is taken by sorting: numpy's partition has a per-row
#: cost that dominates for the 4-16 ranks of a host (3-4x slower than a sort there).
_SORT_MEDIAN = 32


def row_median(a: np.ndarray) -> np.ndarray:
    """Median along the last axis, NaN ignored (NaN where a row has no value)."""
    if not np.isnan(a).any():
        w = a.shape[-1]
        if 0 < w <= _SORT_MEDIAN:
            s = np.sort(a, axis=-1)
            return s[..., w // 2] if w % 2 else 0.5 * (s[..., w // 2 - 1] + s[..., w // 2])
        return np.median(a, axis=-1)
    out = np.full(a.shape[:-1], np.nan)
    have = ~np.isnan(a).all(axis=-1)
    if have.any():
        out[have] = np.nanmedian(a[have], axis=-1)
    return out


def group_median(values: np.ndarray, members: np.ndarray, full: bool) -> np.ndarray:
    """Per group, the median of ``values`` (its last axis) over the group's members (-1
    padding and NaN ignored; NaN where a group has no value): ``(..., n) -> (..., groups)``."""
    if full:
        return row_median(values[..., members])
    g = np.where(members >= 0, values[..., np.maximum(members, 0)], np.nan)
    return row_median(g)
