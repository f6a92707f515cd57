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

import re
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
        """Build from each rank's host name (hosts are indexed by their lowest rank). With
        ``nodes_per_switch``, the k-th host in the natural order of the host *names*
        (``node-2`` before ``node-10``) sits behind switch ``k // nodes_per_switch`` (the
        simulator's and a rail layout's): where a host sits is in its name, not in which
        ranks it was given. A launcher need not hand out ranks in host-name order (an
        elastic rendezvous numbers nodes in arrival order); counting hosts by their lowest
        rank then put hosts of different switches behind one, and a slow switch was named
        as another switch holding some of its hosts."""
        names: dict[str, int] = {}
        idx = np.array([names.setdefault(str(h), len(names)) for h in rank_hosts], np.int64)
        sw = None
        if nodes_per_switch is not None:
            if nodes_per_switch < 1:
                raise ValueError("nodes_per_switch must be >= 1")
            hosts = list(names)
            by_name = sorted(range(len(hosts)), key=lambda h: _natural_key(hosts[h]))
            sw = np.empty(len(names), np.int64)
            sw[by_name] = np.arange(len(names), dtype=np.int64) // nodes_per_switch
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


def moved(old: Topology | None, new: Topology | None) -> bool:
    """Whether a rank of ``new`` runs on another host than in ``old`` (by name, over the
    ranks both cover), or hosts became known or unknown."""
    if old is None or new is None:
        return (old is None) != (new is None)
    n = min(len(old.rank_host), len(new.rank_host))
    return any(old.host_names[old.rank_host[r]] != new.host_names[new.rank_host[r]]
               for r in range(n))


def new_world(old: Topology | None, old_ranks: int, new: Topology | None,
              new_ranks: int) -> bool:
    """Whether an attempt (``new``, ``new_ranks`` ranks) runs in another world than the one
    a detector follows (``old``, sized for ``old_ranks``): a rank on another host, or more
    ranks than it holds. A detector's subjects, and so its findings, belong to one world:
    a rank moved to a spare is another machine, so the live detector and a batch pass both
    start a new detector there and end the old world's findings at its last step (see
    ``goodlens.analysis.findings.end_world``). A restart on the same hosts, or on fewer
    of them, is the same world: a finding still slow after it goes on."""
    return new_ranks > old_ranks or moved(old, new)


def _natural_key(name: str) -> tuple[str | int, ...]:
    """Sort key of a host name with its digit runs as numbers (``node-2`` before
    ``node-10``, ``10.0.1.2`` before ``10.0.1.12``)."""
    return tuple(int(p) if i % 2 else p for i, p in enumerate(re.split(r"(\d+)", name)))


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
        self.host_contig = _contiguous(self.host_members) and len(self.host) == n_ranks
        self.host_split = self.host_size >= min_group
        self.host_all_split = bool(self.host_split.all())
        hs = topology.host_switch
        if hs is None:
            self.sw, self.n_sw, self.sw_split = None, 0, np.zeros(0, bool)
            return
        self.sw = np.asarray(hs[:self.n_hosts], np.int64)
        self.n_sw = int(self.sw.max()) + 1 if len(self.sw) else 0
        self.sw_members, self.sw_size = _groups(self.sw, self.n_sw)
        self.sw_full = bool((self.sw_members >= 0).all())
        self.sw_contig = _contiguous(self.sw_members)
        self.sw_split = self.sw_size >= min_group
        self.sw_all_split = bool(self.sw_split.all())

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


#: From this many values on, a median is found by partitioning (one order statistic, then the
#: largest of the lower half); under it by sorting, which numpy does with SIMD for float32 and
#: which beats ``np.median``'s generic path 3-10x on the 512-2,048 values of a level's spread.
_PARTITION_MEDIAN = 1024


def _median_clean(a: np.ndarray) -> np.ndarray:
    """Median along the last axis of NaN-free values: the same order statistics and the same
    mean of the middle two (in ``a``'s dtype) as ``np.median``, without its per-call cost."""
    w = a.shape[-1]
    h = w // 2
    if w >= _PARTITION_MEDIAN:
        p = np.partition(a, h, axis=-1)
        hi = p[..., h]
        return hi if w % 2 else 0.5 * (p[..., :h].max(axis=-1) + hi)
    s = np.sort(a, axis=-1)
    return s[..., h] if w % 2 else 0.5 * (s[..., h - 1] + s[..., h])


def row_median(a: np.ndarray) -> np.ndarray:
    """Median along the last axis, NaN ignored (NaN where a row has no value)."""
    if a.shape[-1] and not np.isnan(a).any():
        return _median_clean(a)
    out = np.full(a.shape[:-1], np.nan)
    have = ~np.isnan(a).all(axis=-1)
    if have.any():
        out[have] = np.nanmedian(a[have], axis=-1)
    return out


def _oddeven_pairs(n: int) -> list[tuple[int, int]]:
    """Batcher's odd-even merge sort network for ``n`` (a power of two) inputs."""
    pairs = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return pairs


#: Groups per pass of :func:`_network_median`: its vectors stay in cache (and out of mmap).
_NET_CHUNK = 4096


def _network_median(g: np.ndarray, half: np.ndarray) -> np.ndarray:
    """Median of each row of ``g`` (groups x 2h, NaN-free, h <= 16), equal to
    :func:`row_median`'s: each half sorted by a sorting network run on every group at once,
    then the two middle values of the whole from the halves (Batcher's bitonic split: with
    both halves ascending, min(a_i, b_{h-1-i}) are the h smallest, their max the h-th, and
    the min of the max(a_i, b_{h-1-i}) the (h+1)-th). A few dozen vector operations instead
    of a sort call per group. ``half`` (rows,) receives half the gap between the two middle
    values (what one member's leaving moves the median by)."""
    rows, w = g.shape
    h = w // 2
    p2 = 1 << max(h - 1, 0).bit_length()
    pairs = _oddeven_pairs(p2)
    out = np.empty(rows, g.dtype)
    for lo0 in range(0, rows, _NET_CHUNK):
        part = g[lo0:lo0 + _NET_CHUNK]
        k = len(part)
        # column c of half 0 and of half 1 of every group, as one contiguous (2, k) vector
        lanes = np.empty((p2 + 1, 2, k), g.dtype)
        lanes[:h] = part.reshape(k, 2, h).transpose(2, 1, 0)
        lanes[h:p2] = np.inf   # padding sorts last: the h real values' order is kept
        v, tmp = list(lanes[:p2]), lanes[p2]
        for i, j in pairs:
            lo = np.minimum(v[i], v[j], out=tmp)
            tmp = v[i]
            v[j] = np.maximum(tmp, v[j], out=v[j])
            v[i] = lo
        a = np.stack(v[:h])          # h x 2 x k, ascending along the first axis
        m_lo = np.minimum(a[:, 0], a[::-1, 1]).max(axis=0)
        m_hi = np.maximum(a[:, 0], a[::-1, 1]).min(axis=0)
        np.subtract(m_hi, m_lo, out=half[lo0:lo0 + k])
        half[lo0:lo0 + k] *= 0.5
        m_lo += m_hi
        np.multiply(m_lo, 0.5, out=out[lo0:lo0 + k])
    return out


def group_median_loo(values: np.ndarray, members: np.ndarray, full: bool,
                     contiguous: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per group, the median of ``values`` (its last axis) over the group's members (-1
    padding and NaN ignored; NaN where a group has no value): ``(..., n) -> (..., groups)``;
    and, per member (``values``' shape), how far the median of the group's *other* members
    lies under the group's median, so that a member's excess over its siblings without
    itself is ``(x - median) + shift`` (0 where the member has no value or no sibling). A
    median that includes the member moves with it: a rank 2% slow among 8 with 2-3% noise
    reads ~1.8% over its host's median, and ~2.0% over the other seven's. ``contiguous``:
    group g is members ``g*w .. g*w + w - 1`` (no gather needed)."""
    lead, n_groups = values.shape[:-1], members.shape[0]
    if full:
        w = members.shape[1]
        if w % 2 == 0 and 2 <= w <= 32 and not np.isnan(values).any():
            g = (values if contiguous else values[..., members]).reshape(-1, w)
            half = np.empty(len(g), g.dtype)
            med = _network_median(g, half)
            # an even group: a member over the median leaves the lower middle value as the
            # others' median (half the gap under it), one under it the upper one
            d = g - med[:, None]
            np.copysign(half[:, None], d, out=d)
            return med.reshape(*lead, n_groups), _to_members(d, values, members, contiguous)
        g = values[..., members]
    else:
        g = np.where(members >= 0, values[..., np.maximum(members, 0)], np.nan)
    med = row_median(g)
    return med, _loo_shift(g, med, values, members)


def _loo_shift(g: np.ndarray, med: np.ndarray, values: np.ndarray, members: np.ndarray
               ) -> np.ndarray:
    """:func:`group_median_loo`'s shift for any groups (``g``: ``(..., groups, w)`` member
    values, NaN for padding or no value): the others' median from the group's sorted values,
    skipping the member's own place (ties: any equal member's place gives the same)."""
    w = g.shape[-1]
    order = np.argsort(g, axis=-1)   # (NaN last)
    s = np.take_along_axis(g, order, axis=-1)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.broadcast_to(np.arange(w), order.shape), axis=-1)
    valid = np.isfinite(g)
    m = valid.sum(axis=-1, keepdims=True) - 1   # the others' count
    q1, q2 = (m - 1) // 2, m // 2                # their middle places (one when m is odd)
    i1 = np.clip(q1 + (q1 >= pos), 0, w - 1)
    i2 = np.clip(q2 + (q2 >= pos), 0, w - 1)
    others = 0.5 * (np.take_along_axis(s, i1, axis=-1) + np.take_along_axis(s, i2, axis=-1))
    with np.errstate(invalid="ignore"):
        d = med[..., None] - others
    d = np.where(valid & (m >= 1), d, 0.0)
    return _to_members(d, values, members, False)


def _to_members(d: np.ndarray, values: np.ndarray, members: np.ndarray, contiguous: bool
                ) -> np.ndarray:
    """Per-member values laid out as groups x slots back in ``values``' member order (0 for
    a value no group holds)."""
    lead = values.shape[:-1]
    if contiguous:
        return d.reshape(*lead, values.shape[-1])
    out = np.zeros(values.shape, np.result_type(d, values))
    flat = d.reshape(*lead, -1)
    slot = members.ravel()
    keep = slot >= 0
    out[..., slot[keep]] = flat[..., np.flatnonzero(keep)]
    return out


def _contiguous(members: np.ndarray) -> bool:
    """Whether group g's members are ``g*w .. g*w + w - 1`` (no -1 padding)."""
    return bool((members.ravel() == np.arange(members.size)).all())
