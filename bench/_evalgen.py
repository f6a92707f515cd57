"""The straggler evaluation's own trace generator (numpy only; see ``bench/detector_eval.py``).

Written for the evaluation and independent of the project's trace generator, so the detector
is not scored on the noise it was tuned on. One :class:`Trace` is one case at one size and
seed: its noise parameters, its planted subjects (the ground truth) and a stream of chunks of
per-step, per-rank *ready* times (seconds from the step's start until the rank reaches the
all-reduce: compute + data wait) and step durations.

Noise model (every parameter drawn per trace from a seeded ``numpy`` Generator):

- base compute per step ``B`` ~ U(0.5, 1.5) s;
- shared per-step jitter, the same for every rank: lognormal (mean 1), CV ~ U(2%, 5%);
- independent per-rank noise: lognormal (mean 1), CV ~ U(1%, 3%), either one CV for the
  trace or (half of the traces) one CV per rank drawn in that range;
- an evaluation step every ``P`` ~ U{200..500} steps (random phase) on ALL ranks, that
  step's compute x U(2, 4);
- transient single-rank spikes, 1e-4 per rank-step, x U(1.3, 2) for 1-3 steps; half of them
  in compute (compute x factor), half in data wait (``(factor - 1) B`` extra data wait);
- a small data wait on every rank: a per-rank level ~ U(0.1, 1) ms, lognormal CV 20%;
- clock noise on the measured ready time: N(0, sd) with sd ~ U(0.25, 0.75) ms per rank-step;
  a rank-step in a thousand rounded to 1 ms, and 0-2% of the ranks (coarse clocks) rounded
  to 1 ms always;
- step duration = the slowest rank's ready time + the all-reduce, ``B`` x U(0.05, 0.2) per
  trace with a lognormal CV of 3% per step.

Topology: 8 ranks per host (host ``h`` named ``node-%04d``), 4 hosts per switch (switch
index ``h // 4``), ranks laid out host by host in name order; the run's tags say
``nodes_per_switch: 4`` (:attr:`Trace.tags`). Two cases change the layout, to check that a
slow switch is named and never a sibling: ``switchrdzv`` gives the hosts their ranks in a
random order (as an elastic rendezvous numbers nodes in arrival order; a host's ranks stay
contiguous), with the same ``nodes_per_switch`` tag; ``switchuneven`` also does, and puts
hosts of 8, 8 and 4 ranks behind the slow switch (3 hosts, 20 ranks) and hosts of 8, 4, 8,
4, 8, 4 and 8 behind the next switch (7 hosts, 44 ranks), every other switch as usual, its
tags a ``switch_of_host`` map (``leaf-%d``). Slowdowns multiply the planted ranks' ready
time from the onset on (onset ~ U{100..300}); the data-starved cases add to the data wait
instead. See ``CASES``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

GPUS_PER_HOST = 8
HOSTS_PER_SWITCH = 4
RANKS_PER_SWITCH = GPUS_PER_HOST * HOSTS_PER_SWITCH
SPIKE_RATE = 1e-4

CASES: dict[str, str] = {
    "healthy": "nothing planted (noise, evaluation steps and spikes only)",
    "rank2": "one rank 2% slow",
    "rank5": "one rank 5% slow",
    "rank20": "one rank 20% slow",
    "host5": "one host's 8 ranks 5% slow",
    "switch3": "one switch's 32 ranks 3% slow",
    "intermittent": "one rank 30% slow on a random half of its steps (truth 15%)",
    "data5": "one rank's data wait + 5% of the base compute (data-starved)",
    "data20": "one rank's data wait + 20% of the base compute (data-starved)",
    "nested": "a switch 5% from A, a host in it +6% from B > A, a rank in it +10% from C > B",
    "halfswitch": "the switches holding half the ranks 8% slow (one subject per switch)",
    "switchrdzv": "one switch's 32 ranks 3% slow, hosts given their ranks in a random order",
    "switchuneven": "one switch 3% slow whose hosts have 8, 8 and 4 ranks, beside a switch "
                    "of 7 hosts of 8 and 4; hosts in a random rank order",
}
#: The hosts (their rank counts) behind the slow switch and the next one in ``switchuneven``.
UNEVEN_SLOW, UNEVEN_NEXT = (8, 8, 4), (8, 4, 8, 4, 8, 4, 8)
PLANTED = tuple(c for c in CASES if c != "healthy")


def host_name(h: int) -> str:
    return f"node-{h:04d}"


@dataclass(frozen=True)
class Subject:
    """One planted straggler: the ground truth a finding is matched against."""

    kind: str            # "rank" | "host" | "switch"
    id: int | str        # rank number, host name, switch index
    ranks: tuple[int, ...]
    onset: int
    slowdown: float      # its own extra factor (nested: relative to its parent)

    @property
    def key(self) -> tuple[str, int | str]:
        return (self.kind, self.id)


@dataclass
class _Effect:
    """How a subject changes its ranks from ``onset``: ``mult`` x ready time (``p`` < 1: on a
    random share ``p`` of the steps only) or ``add`` seconds of data wait."""

    ranks: np.ndarray
    onset: int
    mult: float = 1.0
    p: float = 1.0
    add: float = 0.0


@dataclass
class Params:
    """One trace's noise parameters."""

    base_s: float
    shared_cv: float
    rank_sigma: np.ndarray       # lognormal sigma of each rank's noise
    eval_period: int
    eval_phase: int
    data_wait_s: np.ndarray      # per-rank data wait level
    clock_sd_s: float
    coarse: np.ndarray           # ranks whose clock has 1 ms resolution
    comm_frac: float
    spikes: np.ndarray = field(default_factory=lambda: np.zeros((0, 5)))
    """One row per spike: rank, start step, length, factor, in data wait (0/1)."""


def _sigma(cv: float | np.ndarray) -> float | np.ndarray:
    """Lognormal sigma for a coefficient of variation."""
    return np.sqrt(np.log1p(np.square(cv)))


def _lognormal(rng: np.random.Generator, sigma: float | np.ndarray, shape: tuple) -> np.ndarray:
    """Mean-one lognormal factors."""
    sigma = np.asarray(sigma, float)
    return np.exp(sigma * rng.standard_normal(shape) - 0.5 * sigma * sigma)


def _draw_params(rng: np.random.Generator, n: int, steps: int) -> Params:
    cv = rng.uniform(0.01, 0.03, n) if rng.random() < 0.5 else np.full(n, rng.uniform(0.01, 0.03))
    period = int(rng.integers(200, 501))
    base = float(rng.uniform(0.5, 1.5))
    p = Params(base_s=base, shared_cv=float(rng.uniform(0.02, 0.05)), rank_sigma=_sigma(cv),
               eval_period=period, eval_phase=int(rng.integers(0, period)),
               data_wait_s=rng.uniform(1e-4, 1e-3, n), clock_sd_s=float(rng.uniform(2.5e-4,
                                                                                     7.5e-4)),
               coarse=np.flatnonzero(rng.random(n) < rng.uniform(0.0, 0.02)),
               comm_frac=float(rng.uniform(0.05, 0.2)))
    k = int(rng.poisson(SPIKE_RATE * n * steps))
    p.spikes = np.column_stack([rng.integers(0, n, k), rng.integers(0, steps, k),
                                rng.integers(1, 4, k), rng.uniform(1.3, 2.0, k),
                                rng.random(k) < 0.5]).astype(float)
    return p


def _onset(rng: np.random.Generator, steps: int) -> int:
    hi = max(100, min(300, steps // 3))
    return int(rng.integers(100, hi + 1))


@dataclass(frozen=True)
class Layout:
    """Where ranks run: ``rank_host[r]`` the host number of rank r (host ``h`` is named
    ``host_name(h)``), ``host_switch[h]`` its switch, ``tags`` the run's topology tags."""

    rank_host: np.ndarray
    host_switch: np.ndarray
    tags: dict

    def switch_ranks(self, s: int) -> tuple[int, ...]:
        return tuple(int(r) for r in np.flatnonzero(self.host_switch[self.rank_host] == s))


def _standard_layout(n: int) -> Layout:
    h = np.arange(n) // GPUS_PER_HOST
    return Layout(h, np.arange(n // GPUS_PER_HOST) // HOSTS_PER_SWITCH,
                  {"nodes_per_switch": HOSTS_PER_SWITCH})


def _shuffled_layout(rng: np.random.Generator, sizes: list[int], host_switch: np.ndarray,
                     tags: dict) -> Layout:
    """Hosts of ``sizes`` ranks (host h behind ``host_switch[h]``) given contiguous blocks
    of ranks in a random host order."""
    order = rng.permutation(len(sizes))
    rank_host = np.repeat(order, np.asarray(sizes)[order])
    return Layout(rank_host, host_switch, tags)


def _switch_layout(case: str, rng: np.random.Generator, n: int) -> tuple[Layout, int]:
    """``switchrdzv`` / ``switchuneven``: (the layout, the slow switch's number)."""
    n_sw = n // RANKS_PER_SWITCH
    slow = int(rng.integers(0, n_sw))
    per_switch = [[GPUS_PER_HOST] * HOSTS_PER_SWITCH for _ in range(n_sw)]
    if case == "switchuneven":
        per_switch[slow], per_switch[(slow + 1) % n_sw] = list(UNEVEN_SLOW), list(UNEVEN_NEXT)
    sizes = [g for hosts in per_switch for g in hosts]
    host_switch = np.repeat(np.arange(n_sw), [len(h) for h in per_switch])
    tags: dict = {"nodes_per_switch": HOSTS_PER_SWITCH}
    if case == "switchuneven":
        tags = {"switch_of_host": {host_name(h): f"leaf-{int(s)}"
                                   for h, s in enumerate(host_switch)}}
    return _shuffled_layout(rng, sizes, host_switch, tags), slow


def _plant(case: str, rng: np.random.Generator, n: int, steps: int, base_s: float
           ) -> tuple[list[Subject], list[_Effect], Layout]:
    """The case's subjects, the effects that make them (see ``CASES``) and the layout."""
    if case not in CASES:
        raise ValueError(f"unknown case {case!r}")
    if case == "healthy":
        return [], [], _standard_layout(n)
    n_hosts, n_sw = n // GPUS_PER_HOST, n // RANKS_PER_SWITCH
    onset = _onset(rng, steps)
    if case in ("switchrdzv", "switchuneven"):
        lay, s = _switch_layout(case, rng, n)
        sid = f"leaf-{s}" if "switch_of_host" in lay.tags else s
        sub = Subject("switch", sid, lay.switch_ranks(s), onset, 0.03)
        return [sub], [_Effect(np.array(sub.ranks), onset, mult=1.03)], lay
    subs, effects = _plant_standard(case, rng, n, n_hosts, n_sw, steps, onset, base_s)
    return subs, effects, _standard_layout(n)


def _plant_standard(case: str, rng: np.random.Generator, n: int, n_hosts: int, n_sw: int,
                    steps: int, onset: int, base_s: float
                    ) -> tuple[list[Subject], list[_Effect]]:
    """The cases on the standard layout."""
    simple = {"rank2": ("rank", 0.02), "rank5": ("rank", 0.05), "rank20": ("rank", 0.20),
              "host5": ("host", 0.05), "switch3": ("switch", 0.03)}
    if case in simple:
        kind, slow = simple[case]
        sub = _subject(kind, rng, n, n_hosts, n_sw, onset, slow)
        return [sub], [_Effect(np.array(sub.ranks), onset, mult=1.0 + slow)]
    if case == "intermittent":
        r = int(rng.integers(0, n))
        return ([Subject("rank", r, (r,), onset, 0.15)],
                [_Effect(np.array([r]), onset, mult=1.30, p=0.5)])
    if case in ("data5", "data20"):
        r, frac = int(rng.integers(0, n)), 0.05 if case == "data5" else 0.20
        return ([Subject("rank", r, (r,), onset, frac)],
                [_Effect(np.array([r]), onset, add=frac * base_s)])
    if case == "nested":
        return _nested(rng, n_sw, steps, onset)
    # halfswitch: a random half of the switches
    chosen = np.sort(rng.choice(n_sw, n_sw // 2, replace=False))
    subs = [_switch(int(s), onset, 0.08) for s in chosen]
    return subs, [_Effect(np.array(s.ranks), onset, mult=1.08) for s in subs]


def _switch(s: int, onset: int, slow: float) -> Subject:
    return Subject("switch", s, tuple(range(s * RANKS_PER_SWITCH, (s + 1) * RANKS_PER_SWITCH)),
                   onset, slow)


def _host(h: int, onset: int, slow: float) -> Subject:
    return Subject("host", host_name(h), tuple(range(h * GPUS_PER_HOST,
                                                     (h + 1) * GPUS_PER_HOST)), onset, slow)


def _subject(kind: str, rng: np.random.Generator, n: int, n_hosts: int, n_sw: int,
             onset: int, slow: float) -> Subject:
    if kind == "rank":
        r = int(rng.integers(0, n))
        return Subject("rank", r, (r,), onset, slow)
    if kind == "host":
        return _host(int(rng.integers(0, n_hosts)), onset, slow)
    return _switch(int(rng.integers(0, n_sw)), onset, slow)


def _nested(rng: np.random.Generator, n_sw: int, steps: int, a: int
            ) -> tuple[list[Subject], list[_Effect]]:
    """A switch 5% slow from A, a host inside it 6% more from B, a rank inside that host 10%
    more from C (gaps of 10-20% of the trace)."""
    b = a + int(rng.uniform(0.1, 0.2) * steps)
    c = b + int(rng.uniform(0.1, 0.2) * steps)
    s = int(rng.integers(0, n_sw))
    h = s * HOSTS_PER_SWITCH + int(rng.integers(0, HOSTS_PER_SWITCH))
    r = h * GPUS_PER_HOST + int(rng.integers(0, GPUS_PER_HOST))
    subs = [_switch(s, a, 0.05), _host(h, b, 0.06), Subject("rank", r, (r,), c, 0.10)]
    return subs, [_Effect(np.array(x.ranks), x.onset, mult=1.0 + x.slowdown) for x in subs]


class Trace:
    """One case at one size and seed: ``hosts`` per rank, ``tags`` (the topology as a run's
    tags give it), ``truth`` (planted subjects) and :meth:`chunks` of ready times.
    Deterministic in (case, n_ranks, steps, seed, chunk)."""

    def __init__(self, case: str, n_ranks: int, steps: int, seed: int) -> None:
        if n_ranks % RANKS_PER_SWITCH:
            raise ValueError(f"n_ranks must be a multiple of {RANKS_PER_SWITCH}")
        self.case, self.n, self.steps, self.seed = case, n_ranks, steps, seed
        rng = np.random.default_rng([seed, n_ranks, steps, list(CASES).index(case)])
        self.params = _draw_params(rng, n_ranks, steps)
        self.truth, self._effects, self.layout = _plant(case, rng, n_ranks, steps,
                                                        self.params.base_s)
        self._rng = rng
        self.hosts = [host_name(int(h)) for h in self.layout.rank_host]
        self.tags = self.layout.tags
        """The run's topology tags (``nodes_per_switch`` or ``switch_of_host``)."""

    def chunks(self, size: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(first step, ready seconds [k x n], step duration seconds [k]) for consecutive
        blocks of ``size`` steps (the last one shorter)."""
        for s0 in range(0, self.steps, size):
            yield (s0, *self._chunk(s0, min(size, self.steps - s0)))

    def _chunk(self, s0: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        p, rng, n = self.params, self._rng, self.n
        t = np.arange(s0, s0 + k)
        shared = _lognormal(rng, _sigma(p.shared_cv), (k,))
        is_eval = (t % p.eval_period == p.eval_phase) & (t > 0)
        shared[is_eval] *= rng.uniform(2.0, 4.0, int(is_eval.sum()))
        compute = _lognormal(rng, p.rank_sigma, (k, n))
        compute *= (p.base_s * shared)[:, None]
        data = _lognormal(rng, _sigma(0.2), (k, n))
        data *= p.data_wait_s
        self._spikes(s0, k, compute, data)
        ready = compute
        ready += data
        for e in self._effects:
            i0 = max(0, e.onset - s0)
            if i0 >= k:
                continue
            if e.add:
                ready[i0:, e.ranks] += e.add * _lognormal(rng, _sigma(0.1), (k - i0, len(e.ranks)))
            if e.mult != 1.0:
                f = np.full(k - i0, e.mult)
                if e.p < 1.0:
                    f = np.where(rng.random(k - i0) < e.p, e.mult, 1.0)
                ready[i0:, e.ranks] *= f[:, None]
        ready += rng.normal(0.0, p.clock_sd_s, (k, n))
        rnd = rng.random((k, n)) < 1e-3
        ready[rnd] = np.round(ready[rnd], 3)
        if p.coarse.size:
            ready[:, p.coarse] = np.round(ready[:, p.coarse], 3)
        np.maximum(ready, 1e-4, out=ready)
        comm = p.base_s * p.comm_frac * _lognormal(rng, _sigma(0.03), (k,))
        return ready, ready.max(axis=1) + comm

    def _spikes(self, s0: int, k: int, compute: np.ndarray, data: np.ndarray) -> None:
        """Apply the spikes that overlap steps [s0, s0 + k) (they may straddle chunks)."""
        sp = self.params.spikes
        if not len(sp):
            return
        start, length = sp[:, 1].astype(np.int64), sp[:, 2].astype(np.int64)
        sel = np.flatnonzero((start < s0 + k) & (start + length > s0))
        if not sel.size:
            return
        reps = length[sel]
        idx = np.repeat(sel, reps)
        off = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
        row = start[idx] + off - s0
        ok = (row >= 0) & (row < k)
        idx, row = idx[ok], row[ok]
        col, fac, in_data = sp[idx, 0].astype(np.int64), sp[idx, 3], sp[idx, 4] > 0
        c = ~in_data
        compute[row[c], col[c]] *= fac[c]
        data[row[in_data], col[in_data]] += (fac[in_data] - 1.0) * self.params.base_s
