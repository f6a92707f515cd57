"""A slow switch is named as itself (or one of its hosts), never as a sibling switch or a
host outside it, whatever order the hosts got their ranks in and whatever their sizes.

The traces come from a small generator written here, independent of the detector and of
``bench/_evalgen.py``: per rank and step, a base time times a shared per-step jitter (CV 3%)
times per-rank noise (CV 1-3%, one per rank), transient spikes (1e-3 per rank-step, x1.3-2
for 1-3 steps), and one switch's ranks 3% slower from a random onset. The truth (the slow
switch's name, its ranks, its onset) is the generator's planted subject; no expected value
comes from the detector. Layouts: hosts of 8 ranks, 4 per switch, given their ranks in name
order or in a random order (an elastic rendezvous numbers nodes in arrival order), with the
topology as ``nodes_per_switch``; and a slow switch whose hosts have 8, 8 and 4 ranks beside
a switch of hosts of 8 and 4, with the topology as a ``switch_of_host`` map.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from goodlens.detectors.stragglers import StragglerDetector, Topology

SEEDS = range(8)
STEPS = 400
#: Steps after the onset by which the slow switch must be named (these seeds took 10-16;
#: the evaluation in docs/benchmarks.md at most 18 at 256 ranks).
WITHIN = 30


@dataclass
class Planted:
    """The generator's truth: the slow switch as a finding must name it, and its ranks."""

    switch: int | str
    ranks: set[int]
    onset: int


def _trace(seed: int, switches: list[list[int]], rendezvous: bool, by_map: bool,
           slow: int | None) -> tuple[np.ndarray, list[str], dict, Planted]:
    """(ready seconds steps x ranks, each rank's host, the run's tags, the truth) for hosts of
    ``switches[s]`` ranks behind switch s (hosts named ``node-%04d`` in switch order), switch
    ``slow`` slowed (None: one drawn)."""
    rng = np.random.default_rng([28, seed, len(switches), int(rendezvous), int(by_map)])
    sizes = [g for hosts in switches for g in hosts]
    host_sw = np.repeat(np.arange(len(switches)), [len(h) for h in switches])
    order = rng.permutation(len(sizes)) if rendezvous else np.arange(len(sizes))
    rank_host = np.repeat(order, np.asarray(sizes)[order])
    n = len(rank_host)
    cv = rng.uniform(0.01, 0.03, n)
    x = np.exp(0.03 * rng.standard_normal((STEPS, 1)) + cv * rng.standard_normal((STEPS, n)))
    for _ in range(rng.poisson(1e-3 * n * STEPS)):
        r, s0, length = rng.integers(0, n), rng.integers(0, STEPS), rng.integers(1, 4)
        x[s0:s0 + length, r] *= rng.uniform(1.3, 2.0)
    drawn, onset = int(rng.integers(0, len(switches))), int(rng.integers(100, 201))
    slow = drawn if slow is None else slow
    ranks = np.flatnonzero(host_sw[rank_host] == slow)
    x[onset:, ranks] *= 1.03
    hosts = [f"node-{h:04d}" for h in rank_host]
    if by_map:
        tags: dict = {"switch_of_host": {f"node-{h:04d}": f"leaf-{s}"
                                         for h, s in enumerate(host_sw)}}
        name: int | str = f"leaf-{slow}"
    else:
        tags, name = {"nodes_per_switch": len(switches[0])}, slow
    return x, hosts, tags, Planted(name, set(ranks.tolist()), onset)


def _new_findings(x: np.ndarray, hosts: list[str], tags: dict) -> list:
    det = StragglerDetector(None, x.shape[1], Topology.from_run(hosts, tags))
    return [f for f in det.update_many(list(range(len(x))), x) if f.status == "new"]


def _check(seed: int, switches: list[list[int]], rendezvous: bool, by_map: bool,
           slow: int | None = None) -> None:
    x, hosts, tags, truth = _trace(seed, switches, rendezvous, by_map, slow)
    found = _new_findings(x, hosts, tags)
    seen = [(f.subject_kind, f.subject_id, f.detected_step) for f in found]
    for f in found:   # nothing outside the slow switch, nothing before it slowed
        assert set(f.ranks) <= truth.ranks, (seed, truth, seen)
        assert f.subject_kind in ("switch", "host") and f.detected_step >= truth.onset, \
            (seed, truth, seen)
    named = [f.detected_step for f in found
             if f.subject_kind == "switch" and f.subject_id == truth.switch]
    assert named and named[0] - truth.onset <= WITHIN, (seed, truth, seen)


EVEN = [[8] * 4 for _ in range(8)]                      # 256 ranks, 8 switches of 4 hosts
UNEVEN = [[8, 8, 4], [8, 4, 8, 4, 8, 4, 8]] + [[8] * 4 for _ in range(6)]   # 256 ranks


@pytest.mark.parametrize("rendezvous", [False, True], ids=["name-order", "rendezvous"])
def test_slow_switch_named_with_nodes_per_switch(rendezvous: bool) -> None:
    """Hosts of 8 ranks, 4 per switch, topology as ``nodes_per_switch``: the switch named is
    the planted one on every seed, also when the ranks are not given in host-name order."""
    for seed in SEEDS:
        _check(seed, EVEN, rendezvous, by_map=False)


@pytest.mark.parametrize("slow", [0, 1, None], ids=["8-8-4", "7-hosts", "any"])
@pytest.mark.parametrize("rendezvous", [False, True], ids=["name-order", "rendezvous"])
def test_slow_switch_with_uneven_hosts_named(rendezvous: bool, slow: int | None) -> None:
    """Hosts of uneven size, the topology a ``switch_of_host`` map: the slow switch is the
    one of hosts of 8, 8 and 4 ranks (its siblings have 4 or 7 hosts), the one of 7 hosts of
    8 and 4, or one drawn per seed."""
    for seed in SEEDS:
        _check(seed, UNEVEN, rendezvous, by_map=True, slow=slow)


def test_nodes_per_switch_counts_hosts_in_name_order() -> None:
    """``nodes_per_switch``: hosts behind a switch are consecutive in the natural order of
    their names, whatever ranks they were given (values written out by hand)."""
    hosts = ["node-10"] * 2 + ["node-2"] * 2 + ["node-11"] * 2 + ["node-1"] * 2
    topo = Topology.from_hosts(hosts, nodes_per_switch=2)
    assert topo.host_names == ("node-10", "node-2", "node-11", "node-1")
    # name order node-1, node-2 | node-10, node-11
    assert topo.host_switch.tolist() == [1, 0, 1, 0]
    assert Topology.from_run(hosts, {"nodes_per_switch": 2}).host_switch.tolist() == [1, 0, 1, 0]
