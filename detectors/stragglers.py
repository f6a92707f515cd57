"""Persistent straggler detection: slow ranks, hosts and switches from per-rank compute time.

Why it exists: in synchronous training one rank running 5% slow makes the whole job 5% slow,
with no error anywhere, and NVIDIA's per-window rule (reference median / rank median < 0.75)
only sees slowdowns over about a third. Here each step's per-rank compute time becomes a robust
score (log ratio to the step's median, in units of the cross-rank spread), and a one-sided
CUSUM per rank accumulates it, so transient noise washes out and a small persistent excess
crosses the threshold within a few tens of steps. A second CUSUM against each rank's own EWMA
baseline catches drift (thermal onset) in a rank whose level differs from the rest. Flagged
ranks are rolled up to their host and switch, so a degraded link behind one switch is one
finding. Pure statistics: arrays or a frame in, :class:`Finding` dataclasses out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class StragglerConfig:
    """Tuning of :class:`StragglerDetector` (defaults suit 0.5-2% per-step compute noise)."""

    drift_k: float = 0.01
    """CUSUM reference value as a relative slowdown: excess under ~1% (beyond noise) is
    ignored. The effective value is ``max(drift_k, drift_k_sigmas x scale)``."""
    drift_k_sigmas: float = 0.5
    """Lower bound of the reference value in noise units, so noisy runs keep a negative drift
    under the null (false alarms stay rare when noise is several times ``drift_k``)."""
    threshold_h: float = 25.0
    """CUSUM decision threshold, in noise units (robust sigmas of the log ratio). 25 rather
    than 20: at 16,384 ranks, 20 let a rare cluster of tail spikes and a short burst on one
    rank cross about once per 10^8 rank-steps (``bench/detectors.py``)."""
    scale_floor: float = 0.005
    """Floor of the robust noise scale (log units), so near-noiseless runs do not flag
    sub-percent jitter."""
    scale_alpha: float = 0.05
    """EWMA weight of each step's cross-rank MAD in the running noise scale."""
    min_steps: int = 5
    """Steps seen before any flag (the noise scale is still settling)."""
    min_ranks: int = 3
    """Fewest reporting ranks for a step to be scored at all."""
    cusum_cap: float = 3.0
    """A CUSUM is capped at this many thresholds, so a recovered rank clears in bounded time."""
    baseline_alpha: float = 0.01
    """EWMA weight of a rank's own baseline (its log ratio to the median), for drift."""
    baseline_steps: int = 50
    """Steps of a rank's own history before its drift CUSUM may flag."""
    hold_steps: int = 3
    """Steps a crossing rank is held before it is reported, so its host/switch can roll up."""
    group_h_fraction: float = 0.5
    """A rank counts towards a host/switch roll-up once its CUSUM passes this share of h."""
    host_fraction: float = 0.75
    """Share of a host's ranks that must be suspect to report the host instead of ranks."""
    switch_fraction: float = 0.75
    """Share of the hosts behind a switch that must be suspect to report the switch."""
    evict_min_slowdown: float = 0.05
    """Recommend ``evict`` at this estimated slowdown or more (else ``watch``)."""
    evict_min_steps: int = 3
    """...and only when the excursion has lasted at least this many steps (persistent)."""
    history_steps: int = 64
    """Recent steps of per-rank scores kept to estimate a finding's slowdown (a median over
    the steps since onset, robust to the few noise steps a CUSUM often starts with)."""

    def __post_init__(self) -> None:
        positive = ("threshold_h", "scale_floor", "cusum_cap", "host_fraction",
                    "switch_fraction", "scale_alpha", "baseline_alpha")
        for name in positive:
            v = getattr(self, name)
            if not (isinstance(v, int | float) and np.isfinite(v) and v > 0):
                raise ValueError(f"StragglerConfig.{name} must be > 0, got {v!r}")
        for name in ("drift_k", "drift_k_sigmas", "evict_min_slowdown"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and np.isfinite(v) and v >= 0):
                raise ValueError(f"StragglerConfig.{name} must be >= 0, got {v!r}")
        for name in ("min_steps", "min_ranks", "baseline_steps", "hold_steps",
                     "evict_min_steps", "history_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"StragglerConfig.{name} must be an int >= 0, got {v!r}")
        for name in ("scale_alpha", "baseline_alpha", "group_h_fraction", "host_fraction",
                     "switch_fraction"):
            if not getattr(self, name) <= 1:
                raise ValueError(f"StragglerConfig.{name} must be <= 1")
        if self.cusum_cap <= 1:
            raise ValueError("StragglerConfig.cusum_cap must be > 1 (above the threshold)")
        if self.history_steps < 1:
            raise ValueError("StragglerConfig.history_steps must be >= 1")
        if self.min_ranks < 3:
            raise ValueError("StragglerConfig.min_ranks must be >= 3 (a median needs peers)")


@dataclass(frozen=True)
class Topology:
    """Where ranks run: ``rank_host[r]`` is a host index, ``host_switch[h]`` a switch index."""

    rank_host: np.ndarray
    """Host index of each rank (0..n_hosts-1)."""
    host_names: tuple[str, ...]
    """Name of each host index."""
    host_switch: np.ndarray | None = None
    """Switch index of each host, or None when switches are unknown."""

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
        ``{"nodes_per_switch": k}``, else hosts only (no switch roll-up)."""
        tags = tags or {}
        explicit = tags.get("switch_of_host")
        if isinstance(explicit, Mapping) and explicit:
            topo = cls.from_hosts(rank_hosts)
            switches: dict[str, int] = {}
            sw = np.array([switches.setdefault(str(explicit.get(h, f"?{h}")), len(switches))
                           for h in topo.host_names], np.int64)
            return cls(topo.rank_host, topo.host_names, sw)
        per = tags.get("nodes_per_switch")
        return cls.from_hosts(rank_hosts, int(per) if per else None)


@dataclass
class Finding:
    """A persistent straggler: one rank, or a host or switch whose ranks are slow together."""

    subject_kind: str
    """``rank``, ``host`` or ``switch``."""
    subject_id: int | str
    """Rank number, host name or switch index."""
    ranks: list[int]
    """The ranks the finding covers (the suspect ones, for a host or switch)."""
    first_step: int
    """Onset estimate: the step where the CUSUM last left zero."""
    detected_step: int
    """The step at which the finding was reported."""
    slowdown: float
    """Estimated relative slowdown since onset (0.1 = 10% slower than the median rank)."""
    straggler_wait_s: float
    """Wall-clock the job has waited on it since onset (its compute above the median)."""
    wait_per_hour_s: float
    """Wait it will cost per hour of training if left alone."""
    action: str
    """``evict`` (replace it) or ``watch``."""
    confidence: float
    """0-1, from how far the CUSUM is over the threshold."""
    kind: str = "cross"
    """``cross`` (slower than its peers) or ``drift`` (slower than its own history)."""
    attempt: int | None = None
    """The attempt the detection step belongs to, when known."""


class _Cusum:
    """One-sided CUSUM per rank with the excursion's onset, mean excess and wait since then."""

    def __init__(self, n: int) -> None:
        self.s = np.zeros(n)
        self.start = np.full(n, -1, np.int64)
        self.rel = np.zeros(n)    # sum of relative excess since the start
        self.cnt = np.zeros(n)    # steps since the start
        self.wait = np.zeros(n)   # seconds above the median since the start

    def step(self, inc: np.ndarray, rel: np.ndarray, excess_s: np.ndarray, valid: np.ndarray,
             step: int, cap: float) -> None:
        new = np.minimum(np.maximum(self.s + inc, 0.0), cap)
        new = np.where(valid, new, self.s)
        rising = (self.s == 0) & (new > 0)
        self.start = np.where(rising, step, self.start)
        on = new > 0
        keep = on & ~rising
        take = on & valid
        self.rel = np.where(keep, self.rel, 0.0) + np.where(take, rel, 0.0)
        self.cnt = np.where(keep, self.cnt, 0.0) + take
        self.wait = np.where(keep, self.wait, 0.0) + np.where(take, excess_s, 0.0)
        self.s = new

    def slowdown(self, i: np.ndarray | int) -> np.ndarray:
        return self.rel[i] / np.maximum(self.cnt[i], 1.0)


@dataclass
class _Groups:
    active_hosts: set[int] = field(default_factory=set)
    active_switches: set[int] = field(default_factory=set)


class StragglerDetector:
    """Streaming detector: feed one step's per-rank compute times, get new findings back.

    Per-rank state lives within one attempt: a step with a new ``attempt`` resets it (a restart
    changes the world and restarts the step numbering from a checkpoint).

    ``update`` costs a few O(n_ranks) numpy passes (two medians dominate); roll-up work runs
    only while some rank is over the threshold and not yet reported."""

    def __init__(self, config: StragglerConfig | None = None, n_ranks: int = 0,
                 topology: Topology | None = None) -> None:
        if n_ranks < 1:
            raise ValueError("n_ranks must be >= 1")
        if topology is not None and len(topology.rank_host) < n_ranks:
            raise ValueError("topology covers fewer ranks than n_ranks")
        self.config = config or StragglerConfig()
        self.n = n_ranks
        self.topology = topology
        if topology is not None:
            self._host = np.asarray(topology.rank_host[:n_ranks], np.int64)
            self._n_hosts = int(self._host.max()) + 1
            self._host_size = np.bincount(self._host, minlength=self._n_hosts)
            hs = topology.host_switch
            self._sw = None if hs is None else np.asarray(hs, np.int64)
        self.attempt: int | None = None
        self.reset()

    def reset(self, attempt: int | None = None) -> None:
        """Forget every rank's state (CUSUMs, baselines, flags, noise scale, history): a
        restart changes the world and restores an older step, so state from the previous
        attempt would be stale. ``update`` calls it when its ``attempt`` changes. Only which
        ranks were flagged is kept: one flagged again within ``baseline_steps`` of the new
        attempt continues its finding (no duplicate); a healthy one is forgotten."""
        n_ranks = self.n
        self.attempt = attempt
        # ranks still flagged at the restart: flagged again early in the new attempt, they
        # continue their finding rather than open a duplicate; healthy, they are forgotten
        old = getattr(self, "flagged", None)
        self._carried = np.zeros(n_ranks, bool) if old is None else old.copy()
        self.cross = _Cusum(n_ranks)
        self.drift = _Cusum(n_ranks)
        self.base = np.zeros(n_ranks)
        self.nobs = np.zeros(n_ranks, np.int64)
        self.flagged = np.zeros(n_ranks, bool)
        self.flag_at = np.zeros(n_ranks, np.int64)   # update index of the crossing
        self.reported = np.zeros(n_ranks, bool)
        self.scale: float | None = None
        self.med_compute = np.nan
        self.step_time = np.nan
        self.updates = 0
        self._hist = np.full((self.config.history_steps, n_ranks), np.nan)
        self._groups = _Groups()

    # ------------------------------------------------------------------ scoring
    def update(self, step: int, compute: np.ndarray, *, step_time_s: float | None = None,
               attempt: int | None = None) -> list[Finding]:
        """Score one step (``compute[r]`` seconds, NaN where rank r did not report) and return
        the findings that are new at this step. ``step_time_s`` (the step's duration) turns the
        wait into a per-hour figure; without it the median compute stands in for it. A new
        ``attempt`` (a restart) resets every rank's state first (see :meth:`reset`)."""
        cfg = self.config
        c = np.asarray(compute, dtype=float)
        if c.shape != (self.n,):
            raise ValueError(f"compute must have shape ({self.n},), got {c.shape}")
        if attempt is not None and attempt != self.attempt:
            if self.attempt is None:
                self.attempt = attempt   # the first attempt seen: nothing stale yet
            else:
                self.reset(attempt)
        valid = np.isfinite(c) & (c > 0)
        vc = c[valid]
        if vc.size < cfg.min_ranks:
            return []
        logc = np.log(np.where(valid, c, 1.0))
        lv = logc[valid]
        med = float(np.median(lv))
        r = np.where(valid, logc - med, 0.0)
        mad = _MAD_TO_SIGMA * float(np.median(np.abs(lv - med)))
        a = cfg.scale_alpha
        self.scale = mad if self.scale is None else (1 - a) * self.scale + a * mad
        s = max(self.scale, cfg.scale_floor)
        k = max(cfg.drift_k, cfg.drift_k_sigmas * s)
        med_c = float(np.exp(med))
        st = step_time_s if step_time_s and step_time_s > 0 else med_c
        self.med_compute = _ewma(self.med_compute, med_c)
        self.step_time = _ewma(self.step_time, st)
        cap = cfg.cusum_cap * cfg.threshold_h
        excess = np.where(valid, c - med_c, 0.0)
        self._hist[self.updates % len(self._hist)] = np.where(valid, r, np.nan)
        self.cross.step((r - k) / s, np.expm1(r), excess, valid, step, cap)
        # own-history drift: deviation from the rank's baseline (a running mean while it
        # settles, then an EWMA); no drift CUSUM until it has settled
        self.nobs += valid
        if self._carried.any():
            self._carried &= self.flagged | (self.nobs <= cfg.baseline_steps)
        dev = r - self.base
        settled = self.nobs > cfg.baseline_steps
        self.drift.step((dev - k) / s, np.expm1(dev), excess, valid & settled, step, cap)
        w = np.maximum(cfg.baseline_alpha, 1.0 / np.maximum(self.nobs, 1))
        # freeze only on strong evidence: freezing whenever the CUSUM is above zero would learn
        # from low samples only and bias the baseline down (a steady stream of false flags)
        learn = valid & ((self.drift.s <= cfg.group_h_fraction * cfg.threshold_h) | ~settled)
        self.base = np.where(learn, self.base + w * dev, self.base)
        self.updates += 1
        return self._decide(step, attempt)

    def _scores(self) -> np.ndarray:
        return np.maximum(self.cross.s, self.drift.s)

    # ------------------------------------------------------------------ flagging
    def _decide(self, step: int, attempt: int | None) -> list[Finding]:
        cfg, h = self.config, self.config.threshold_h
        # recovery: a flagged rank whose CUSUMs are both back at zero may be reported again
        rec = self.flagged & (self.cross.s == 0) & (self.drift.s == 0)
        if rec.any():
            self.flagged &= ~rec
            self.reported &= ~rec
            self._release_groups()
        if self.updates < cfg.min_steps:
            return []
        score = self._scores()
        cross_now = score > h
        new = cross_now & ~self.flagged
        if new.any():
            self.flagged |= new
            self.flag_at = np.where(new, self.updates, self.flag_at)
        ready = self.flagged & ~self.reported & (self.updates - self.flag_at >= cfg.hold_steps)
        cont = ready & self._carried   # the previous attempt's finding goes on: no duplicate
        if cont.any():
            self.reported |= cont
            ready &= ~cont
        if not ready.any():
            return []
        out: list[Finding] = []
        suspect = (score > cfg.group_h_fraction * h) | self.flagged
        host_is, sw_is = self._group_suspects(suspect)
        g = self._groups
        for i in np.flatnonzero(ready):
            if self.reported[i]:
                continue
            if self.topology is not None:
                hi = int(self._host[i])
                sw = int(self._sw[hi]) if self._sw is not None else -1
                if hi in g.active_hosts or sw in g.active_switches:
                    self.reported[i] = True   # already covered by a host/switch finding
                    continue
                if sw_is is not None and sw_is[sw]:
                    members = np.flatnonzero(suspect & (self._sw[self._host] == sw)
                                             & host_is[self._host])
                    g.active_switches.add(sw)
                    out.append(self._finding("switch", sw, members, step, attempt))
                    continue
                if host_is[hi]:
                    members = np.flatnonzero(suspect & (self._host == hi))
                    g.active_hosts.add(hi)
                    out.append(self._finding("host", self.topology.host_names[hi], members,
                                             step, attempt))
                    continue
            out.append(self._finding("rank", int(i), np.array([i]), step, attempt))
        return out

    def _group_suspects(self, suspect: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if self.topology is None:
            return np.zeros(0, bool), None
        cfg = self.config
        n_s = np.bincount(self._host, weights=suspect, minlength=self._n_hosts)
        host_is = (self._host_size >= 2) & (n_s >= cfg.host_fraction * self._host_size)
        if self._sw is None:
            return host_is, None
        n_sw = int(self._sw.max()) + 1
        hosts = np.bincount(self._sw, minlength=n_sw)
        sus = np.bincount(self._sw, weights=host_is, minlength=n_sw)
        return host_is, (hosts >= 2) & (sus >= cfg.switch_fraction * hosts)

    def _release_groups(self) -> None:
        g = self._groups
        if self.topology is None or not (g.active_hosts or g.active_switches):
            return
        fl = np.bincount(self._host, weights=self.flagged, minlength=self._n_hosts)
        g.active_hosts = {h for h in g.active_hosts if fl[h] > 0}
        if self._sw is not None:
            sw_fl = np.bincount(self._sw, weights=fl, minlength=int(self._sw.max()) + 1)
            g.active_switches = {s for s in g.active_switches if sw_fl[s] > 0}

    def _slowdown(self, cu: _Cusum, members: np.ndarray, drift: bool) -> float:
        """Median relative excess over the (recent) steps since onset, over the members."""
        w = len(self._hist)
        n = int(min(w, self.updates, max(1, np.median(cu.cnt[members]))))
        rows = (self.updates - 1 - np.arange(n)) % w
        r = self._hist[np.ix_(rows, members)]
        if drift:
            r = r - self.base[members]
        if np.isnan(r).all():
            return float(np.median(cu.slowdown(members)))
        return float(np.expm1(np.nanmedian(r)))

    def _finding(self, kind: str, sid: int | str, members: np.ndarray, step: int,
                 attempt: int | None) -> Finding:
        cfg = self.config
        members = np.asarray(members, np.int64)
        self.reported[members] = True
        # prefer the cross-rank estimate; drift only where the rank is not slow against its peers
        peers = self.cross.s[members] > cfg.group_h_fraction * cfg.threshold_h
        which = "cross" if peers.mean() >= 0.5 else "drift"
        cu = self.drift if which == "drift" else self.cross
        slow = self._slowdown(cu, members, which == "drift")
        starts = cu.start[members]
        first = int(starts[starts >= 0].min()) if (starts >= 0).any() else step
        wait = float(np.max(self.cross.wait[members]))
        per_hour = max(slow, 0.0) * self.med_compute * 3600.0 / self.step_time
        score = float(np.median(self._scores()[members]))
        conf = float(np.clip(1.0 - 0.5 * cfg.threshold_h / max(score, 1e-9), 0.0, 1.0))
        lasting = float(np.median(cu.cnt[members]))
        action = ("evict" if slow >= cfg.evict_min_slowdown and lasting >= cfg.evict_min_steps
                  else "watch")
        return Finding(kind, sid, [int(m) for m in members], first, int(step), slow,
                       max(wait, 0.0), per_hour, action, conf, which, attempt)


def _ewma(old: float, new: float, alpha: float = 0.1) -> float:
    return new if np.isnan(old) else (1 - alpha) * old + alpha * new


def _pivot(steps: pd.DataFrame, value: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(attempt, step) keys in order, a rows x ranks matrix of ``value`` and per-row duration."""
    att = steps["attempt"].to_numpy(np.int64) if "attempt" in steps else np.zeros(len(steps),
                                                                                   np.int64)
    stp = steps["step"].to_numpy(np.int64)
    rank = steps["rank"].to_numpy(np.int64)
    keys = np.stack([att, stp], axis=1)
    uniq, row = np.unique(keys, axis=0, return_inverse=True)
    row = row.reshape(-1)
    n = int(rank.max()) + 1 if len(rank) else 0
    m = np.full((len(uniq), n), np.nan)
    m[row, rank] = steps[value].to_numpy(float)
    dur = np.full(len(uniq), np.nan)
    if "duration_s" in steps:
        dur[row] = steps["duration_s"].to_numpy(float)
    return uniq, m, dur, n


def detect_stragglers(steps: pd.DataFrame, config: StragglerConfig | None = None,
                      topology: Topology | None = None) -> list[Finding]:
    """Batch use: per-rank step rows (attempt, rank, step, compute_s[, duration_s, host]) in,
    every finding the streaming detector reports over the run out, in step order. Without a
    topology, hosts come from the ``host`` column (no switch roll-up)."""
    if steps.empty:
        return []
    keys, m, dur, n = _pivot(steps, "compute_s")
    if topology is None and "host" in steps:
        hosts = steps.drop_duplicates("rank").set_index("rank")["host"]
        topology = Topology.from_hosts([str(hosts.get(r, f"rank-{r}")) for r in range(n)])
    det = StragglerDetector(config, n, topology)
    out: list[Finding] = []
    for (a, s), row, d in zip(keys, m, dur):
        out += det.update(int(s), row, step_time_s=None if np.isnan(d) else float(d),
                          attempt=int(a))
    return out


@dataclass(frozen=True)
class RuleFlag:
    """A rank NVIDIA's resiliency-extension rule flags in one report window."""

    rank: int
    attempt: int
    first_step: int
    last_step: int
    score: float
    """Reference median / the rank's median compute in the window (flagged below 0.75)."""


def nvidia_rule(steps: pd.DataFrame, window_steps: int, threshold: float = 0.75
                ) -> list[RuleFlag]:
    """Baseline for side-by-side evaluation: per window of ``window_steps`` steps, each rank's
    score is the median over ranks of the per-rank median compute divided by its own median;
    a score under ``threshold`` flags the rank for that window."""
    if window_steps < 1:
        raise ValueError("window_steps must be >= 1")
    if steps.empty:
        return []
    keys, m, _, _ = _pivot(steps, "compute_s")
    out: list[RuleFlag] = []
    for a in np.unique(keys[:, 0]):
        rows = np.flatnonzero(keys[:, 0] == a)
        out += nvidia_rule_matrix(m[rows], keys[rows, 1], window_steps, threshold, int(a))
    return out


def nvidia_rule_matrix(compute: np.ndarray, steps: np.ndarray, window_steps: int,
                       threshold: float = 0.75, attempt: int = 0) -> list[RuleFlag]:
    """:func:`nvidia_rule` on one attempt's steps x ranks matrix (NaN: no report), with
    ``steps[i]`` the step number of row i; windows are consecutive runs of rows."""
    if window_steps < 1:
        raise ValueError("window_steps must be >= 1")
    m = np.asarray(compute, dtype=float)
    out: list[RuleFlag] = []
    for w0 in range(0, len(m), window_steps):
        block = m[w0:w0 + window_steps]
        have = np.isfinite(block).any(axis=0)
        if have.sum() < 2:
            continue
        own = (np.median(block, axis=0) if have.all() and np.isfinite(block).all()
               else np.nanmedian(block[:, have], axis=0))
        ref = float(np.median(own))
        score = ref / own
        low = score < threshold
        for r, sc in zip(np.flatnonzero(have)[low], score[low]):
            out.append(RuleFlag(int(r), attempt, int(steps[w0]),
                                int(steps[min(w0 + window_steps, len(m)) - 1]), float(sc)))
    return out
