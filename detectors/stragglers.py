"""Persistent straggler detection: slow ranks, hosts and switches an operator can act on.

Why it exists: in synchronous training one rank running 5% slow makes the whole job 5% slow,
with no error anywhere, and NVIDIA's per-window rule (reference median / rank median < 0.75)
only sees slowdowns over about a third. What delays the collective is a rank's time to reach
it (its step minus its collective wait: compute, data wait, anything else), so that is what
is scored. Each subject is compared with its siblings one level up of the topology tree
(:mod:`~goodlens.detectors.topology`): a rank with the other ranks of its host, a host with
the other hosts behind its switch, a switch (or, without one, the top level) with a
reference that leaves out what is already suspect, so a switch holding half the job does not
move it. Per subject a one-sided CUSUM of the residual, in units of a robust noise scale
(the level's cross-section spread, or the subject's own when it is noisier), accumulates
evidence; one step's contribution is bounded and a finding needs several slow steps, so a
GC pause or a data-loader hiccup never becomes a finding. A finding's slowdown is the mean
excess since onset (it converges as the finding persists) and is re-estimated while it
lasts: the detector emits ``new``, then ``update`` when the estimate or the action moves,
then ``resolved``. Pure statistics: arrays or a frame in, :class:`Finding` dataclasses out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from goodlens.detectors.matrix import frame_matrix
from goodlens.detectors.nvidia import RuleFlag, nvidia_rule, nvidia_rule_matrix
from goodlens.detectors.topology import Layout, Topology, group_median

__all__ = ["Finding", "RuleFlag", "StragglerConfig", "StragglerDetector", "Topology",
           "detect_stragglers", "nvidia_rule", "nvidia_rule_matrix"]

_MAD_TO_SIGMA = 1.4826
_MEDIAN_SE = 1.2533   # the standard error of a median of m normal values is ~1.2533 s / sqrt(m)
_MEANDEV_TO_SIGMA = 1.2533   # sigma of a normal is sqrt(pi / 2) x its mean absolute deviation
#: A subject's own noise scale learns from every 4th step after the first ``own_min_steps``
#: (an EWMA of a slowly moving quantity; a quarter of the per-step cost at 16,384 ranks).
_LEARN_EVERY = 4


@dataclass(frozen=True)
class StragglerConfig:
    """Tuning of :class:`StragglerDetector` (defaults suit 1-3% per-rank step-time noise)."""

    drift_k: float = 0.01
    """Excess ignored, as a relative slowdown: a subject under ~1% slower than its siblings
    is not a straggler. The effective value is ``max(drift_k, drift_k_sigmas x scale)``."""
    drift_k_sigmas: float = 0.5
    """...and at least this many noise units, so the CUSUM drifts down under noise alone."""
    threshold_h: float = 25.0
    """CUSUM decision threshold, in noise units."""
    step_cap: float = 3.0
    """Most one step may add to (or take from) a CUSUM, in noise units: a single 2x step adds
    3, not 70, so a transient spike of 1-3 steps stays far under the threshold."""
    persist_steps: int = 8
    """Steps over the reference value since the excursion began before it can be a finding."""
    scale_floor: float = 0.005
    """Floor of every noise scale (log units): sub-percent jitter in a quiet run is no finding."""
    scale_alpha: float = 0.05
    """EWMA weight of each step's cross-section spread in a level's noise scale."""
    own_alpha: float = 0.02
    """EWMA weight of a subject's own deviation in its own noise scale."""
    own_min_steps: int = 20
    """Steps of a subject's own history before its own scale counts."""
    min_steps: int = 5
    """Steps seen in an attempt before any flag."""
    min_ranks: int = 3
    """Fewest reporting ranks for a step to be scored at all."""
    min_group: int = 3
    """Fewest members for a host or switch to be scored against its siblings (with two, one
    slow member and a slow parent look the same)."""
    cusum_cap: float = 3.0
    """A CUSUM is capped at this many thresholds, so a recovered subject clears in bounded time."""
    suspect_fraction: float = 0.5
    """A subject past this share of the threshold is suspect: its ranks leave the reference."""
    evict_min_slowdown: float = 0.05
    """Recommend ``evict`` at this estimated slowdown or more (else ``watch``)..."""
    evict_min_steps: int = 20
    """...once the finding has lasted this many steps."""
    update_every: int = 10
    """Fewest steps between two updates of one finding."""
    update_change: float = 0.1
    """Relative change of the slowdown estimate that makes an update (or the action changing)."""
    resume_steps: int = 50
    """After a restart, a subject flagged again within this many steps continues its finding;
    one not flagged again by then is resolved."""

    def __post_init__(self) -> None:
        positive = ("threshold_h", "scale_floor", "cusum_cap", "step_cap", "scale_alpha",
                    "own_alpha", "suspect_fraction", "update_change")
        for name in positive:
            v = getattr(self, name)
            if not (isinstance(v, int | float) and np.isfinite(v) and v > 0):
                raise ValueError(f"StragglerConfig.{name} must be > 0, got {v!r}")
        for name in ("drift_k", "drift_k_sigmas", "evict_min_slowdown"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and np.isfinite(v) and v >= 0):
                raise ValueError(f"StragglerConfig.{name} must be >= 0, got {v!r}")
        for name in ("persist_steps", "own_min_steps", "min_steps", "evict_min_steps",
                     "update_every", "resume_steps", "min_group", "min_ranks"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"StragglerConfig.{name} must be an int >= 0, got {v!r}")
        for name in ("scale_alpha", "own_alpha", "suspect_fraction"):
            if not getattr(self, name) <= 1:
                raise ValueError(f"StragglerConfig.{name} must be <= 1")
        if self.cusum_cap <= 1:
            raise ValueError("StragglerConfig.cusum_cap must be > 1 (above the threshold)")
        if self.min_ranks < 3:
            raise ValueError("StragglerConfig.min_ranks must be >= 3 (a median needs peers)")
        if self.min_group < 2:
            raise ValueError("StragglerConfig.min_group must be >= 2")


@dataclass
class Finding:
    """A persistent straggler: one rank, host or switch slower than its siblings."""

    subject_kind: str
    """``rank``, ``host`` or ``switch``."""
    subject_id: int | str
    """Rank number, host name, or switch name (its index when switches are numbered)."""
    ranks: list[int]
    """The ranks the subject covers."""
    first_step: int
    """Onset estimate: the step where the evidence began to accumulate."""
    detected_step: int
    """The step at which the finding was first reported."""
    slowdown: float
    """Estimated slowdown against its siblings since onset (0.1 = 10% slower to reach the
    collective), the mean over the steps since onset: it converges as the finding lasts."""
    straggler_wait_s: float
    """Wall-clock the job has waited on this subject since onset (its own excess only: a
    rank inside a slow host counts what it adds to the host's)."""
    wait_per_hour_s: float
    """Wait it will cost per hour of training if left alone."""
    action: str
    """``evict`` (replace it: >= 5% and lasting) or ``watch``."""
    confidence: float
    """0-1, from how far the evidence is over the threshold."""
    attempt: int | None = None
    """The attempt of the step this state was computed at, when known."""
    status: str = "new"
    """``new`` (first report), ``update`` (re-estimated), ``resolved`` (recovered: the
    subject is no slower than its siblings any more, or not seen again after a restart)."""
    id: str = ""
    """Stable across updates: ``<attempt>/<kind>/<subject>/<first step>`` at first report."""
    last_step: int = -1
    """The step this state was computed at."""
    host: str | None = None
    """The host of a rank finding (when known)."""
    switch: int | str | None = None
    """The switch of a rank or host finding (when known)."""
    relative_to: str = "the rest of the job"
    """What the subject was compared with (its siblings one level up)."""


@dataclass
class _Open:
    """A reported finding while it lasts."""

    id: str
    first_step: int
    detected_step: int
    seq: int = 0
    slow: float = 0.0
    action: str = "watch"
    emitted_at: int = 0
    wait_before: float = 0.0       # wait accumulated in earlier attempts
    carried_at: int | None = None  # update count when a restart carried it over
    members: list[int] | None = None  # for a roll-up: the member units it stands for


class _Units:
    """Per-unit CUSUM state: the excursion's start, its sums since then, the own scale."""

    def __init__(self, n: int) -> None:
        self.s = np.zeros(n)
        self.start = np.full(n, -1, np.int64)
        self.rel = np.zeros(n)
        self.cnt = np.zeros(n)
        self.pos = np.zeros(n)
        self.wait = np.zeros(n)
        self.mean = np.zeros(n)
        self.dev = np.zeros(n)
        self.nobs = np.zeros(n)
        self.flagged = np.zeros(n, bool)
        self.own = np.zeros(n)        # the unit's own noise scale (0 until settled)
        self.ticks = 0
        self.peak = np.zeros(n)       # the CUSUM's highest value in this excursion...
        self.rel_pk = np.zeros(n)     # ...and the sums then: the shift ends where it peaks,
        self.cnt_pk = np.zeros(n)     # so a recovered subject's estimate is not diluted

    def slowdown(self, m: list[int]) -> float:
        """Mean relative excess from the excursion's start to its peak, pooled over the units
        m (weighted by their steps: a member's fresh short excursion barely moves it)."""
        return float(self.rel_pk[m].sum() / max(float(self.cnt_pk[m].sum()), 1.0))

    def own_scale(self, res: np.ndarray, have: np.ndarray, alpha: float, settle: int,
                  level_s: np.ndarray) -> np.ndarray:
        """The scale to score ``res`` with: the level's, or the unit's own when noisier; then
        learn from this step (deviations winsorised, not while the unit is suspect)."""
        s = np.maximum(level_s, self.own)
        self.ticks += 1
        if self.ticks % _LEARN_EVERY and self.ticks > settle:
            return s
        w = np.maximum(alpha * _LEARN_EVERY, 1.0 / (self.nobs + 1))
        d = np.minimum(np.abs(res - self.mean), 3.0 * s)
        learn = have & ~self.flagged
        self.mean = np.where(learn, self.mean + w * (res - self.mean), self.mean)
        self.dev = np.where(learn, self.dev + w * (d - self.dev), self.dev)
        self.nobs += learn
        self.own = np.where(self.nobs >= settle, _MEANDEV_TO_SIGMA * self.dev, 0.0)
        return s

    def step(self, z: np.ndarray, res: np.ndarray, k: np.ndarray, base_s: np.ndarray,
             have: np.ndarray, step: int, cap: float) -> None:
        new = self.s + z
        np.clip(new, 0.0, cap, out=new)
        if not have.all():
            new[~have] = self.s[~have]
        rising = (self.s == 0) & (new > 0)
        if rising.any():
            self.start[rising] = step
            for a in (self.rel, self.cnt, self.pos, self.wait, self.peak):
                a[rising] = 0.0
        take = new > 0
        take &= have
        excess = np.expm1(res)
        excess *= take
        self.rel += np.clip(excess, -0.5, 1.0)
        self.cnt += take
        self.pos += take & (res > k)
        self.wait += np.maximum(excess, 0.0) * base_s
        top = take & (new >= self.peak)
        if top.any():
            self.peak[top] = new[top]
            self.rel_pk[top] = self.rel[top]
            self.cnt_pk[top] = self.cnt[top]
        self.s = new


#: A level's spread is measured on at most this many of its units (evenly strided): it only
#: feeds an EWMA, and two medians over 16,384 ranks were a third of a step's cost.
_MAD_SAMPLE = 2048


def _mad(v: np.ndarray) -> float:
    if len(v) > _MAD_SAMPLE:
        v = v[::-(-len(v) // _MAD_SAMPLE)]
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return 0.0
    return _MAD_TO_SIGMA * float(np.median(np.abs(v - np.median(v))))


class StragglerDetector:
    """Streaming detector: feed one step's per-rank times to reach the collective, get back
    the findings that are new, updated or resolved at that step.

    Per-subject state lives within one attempt: a step with a new ``attempt`` resets it (a
    restart changes the world and restarts the step numbering from a checkpoint); a subject
    flagged again soon after the restart continues its finding.

    ``update`` costs a few O(n_ranks) numpy passes (the medians dominate): about 1 ms per step
    at 16,384 ranks."""

    def __init__(self, config: StragglerConfig | None = None, n_ranks: int = 0,
                 topology: Topology | None = None) -> None:
        if n_ranks < 1:
            raise ValueError("n_ranks must be >= 1")
        if topology is not None and len(topology.rank_host) < n_ranks:
            raise ValueError("topology covers fewer ranks than n_ranks")
        self.config = config or StragglerConfig()
        self.n = n_ranks
        self.topology = topology
        self.layout = Layout(n_ranks, topology, self.config.min_group)
        lay = self.layout
        self._n_units = n_ranks + lay.n_hosts + lay.n_sw
        self._level = np.concatenate([np.zeros(n_ranks, np.int64), np.ones(lay.n_hosts, np.int64),
                                      np.full(lay.n_sw, 2, np.int64)])
        self.attempt: int | None = None
        self._open: dict[int, _Open] = {}
        self.reset()

    def reset(self, attempt: int | None = None) -> None:
        """Forget every subject's state (a restart changes the world and restores an older
        step); open findings are carried: flagged again within ``resume_steps`` of the new
        attempt they continue, else they are resolved. ``update`` calls it when its
        ``attempt`` changes."""
        self.attempt = attempt
        self.units = _Units(self._n_units)
        self.scales = np.full(3, np.nan)
        self.med_ready = np.nan
        self.step_time = np.nan
        self.updates = 0
        self._excl = np.zeros(self.n, bool)
        self._last_step = -1
        for o in self._open.values():
            o.carried_at = 0
        self._carry_wait = {u: self._wait(u, o) for u, o in self._open.items()}

    # ------------------------------------------------------------------ scoring
    def update(self, step: int, ready: np.ndarray, *, step_time_s: float | None = None,
               attempt: int | None = None) -> list[Finding]:
        """Score one step: ``ready[r]`` is rank r's time to reach the collective, in seconds
        (its step minus its collective wait; NaN where it did not report). ``step_time_s``
        (the step's duration) turns the wait into a per-hour figure; without it the median
        ready time stands in. A new ``attempt`` resets the state first (see :meth:`reset`).
        Returns the findings new, updated or resolved at this step."""
        cfg = self.config
        c = np.asarray(ready, dtype=float)
        if c.shape != (self.n,):
            raise ValueError(f"ready must have shape ({self.n},), got {c.shape}")
        if attempt is not None and attempt != self.attempt:
            if self.attempt is None:
                self.attempt = attempt   # the first attempt seen: nothing stale yet
            else:
                self.reset(attempt)
        valid = np.isfinite(c) & (c > 0)
        if valid.sum() < cfg.min_ranks:
            return []
        x = np.where(valid, np.log(np.where(valid, c, 1.0)), np.nan)
        use = valid & ~self._excl
        ref = float(np.median(x[use] if use.sum() >= cfg.min_ranks else x[valid]))
        res, base = self._residuals(x - ref, ref)
        have = np.isfinite(res)
        level_s = self._level_scales(res, have)[self._level]
        u = self.units
        s = u.own_scale(np.where(have, res, 0.0), have, cfg.own_alpha, cfg.own_min_steps,
                        level_s)
        k = np.maximum(np.log1p(cfg.drift_k), cfg.drift_k_sigmas * s)
        r0 = np.where(have, res, 0.0)
        z = np.clip((r0 - k) / s, -cfg.step_cap, cfg.step_cap)
        u.step(z, r0, k, base, have, step, cfg.cusum_cap * cfg.threshold_h)
        st = step_time_s if step_time_s and step_time_s > 0 else float(np.exp(ref))
        self.med_ready = _ewma(self.med_ready, float(np.exp(ref)))
        self.step_time = _ewma(self.step_time, st)
        self.updates += 1
        self._last_step = step
        self._excl = self._excluded()
        return self._decide(step, attempt)

    def _residuals(self, t: np.ndarray, ref: float) -> tuple[np.ndarray, np.ndarray]:
        """Every unit's log excess over its siblings' median one level up (NaN where the
        unit is not scored) and the seconds one unit of relative excess costs there."""
        lay = self.layout
        if lay.host is None:
            return t, np.full(self.n, np.exp(ref))
        hm = group_median(t, lay.host_members, lay.host_full)       # per host
        parent_h = np.zeros(lay.n_hosts)                            # each host's parent level
        sw_res = np.zeros(0)
        if lay.sw is not None:
            sm = group_median(hm, lay.sw_members, lay.sw_full)      # per switch
            parent_h = np.where(lay.sw_split[lay.sw], sm[lay.sw], 0.0)
            sw_res = np.where(lay.sw_split, sm, np.nan)
        host_res = np.where(lay.host_split, hm - parent_h, np.nan)
        parent_r = np.where(lay.host_split[lay.host], hm[lay.host], parent_h[lay.host])
        res = np.concatenate([t - parent_r, host_res, sw_res])
        base = np.exp(ref + np.concatenate([parent_r, parent_h, np.zeros(lay.n_sw)]))
        return res, np.where(np.isfinite(base), base, np.exp(ref))

    def _level_scales(self, res: np.ndarray, have: np.ndarray) -> np.ndarray:
        """Per level (rank, host, switch) the noise scale: the spread across the level's
        non-suspect units (EWMA), never under what the level below implies for a median of
        its size, and a half more where too few units make a spread unreliable."""
        cfg, lay = self.config, self.layout
        quiet = have & ~self.units.flagged & (self.units.s <= cfg.suspect_fraction
                                              * cfg.threshold_h)
        n = self.n
        out = np.empty(3)
        prev = cfg.scale_floor
        sizes = (1.0, float(np.median(lay.host_size)) if lay.n_hosts else 1.0,
                 float(np.median(lay.sw_size)) if lay.n_sw else 1.0)
        bounds = (0, n, n + lay.n_hosts, n + lay.n_hosts + lay.n_sw)
        for lv in range(3):
            sel = quiet[bounds[lv]:bounds[lv + 1]]
            v = res[bounds[lv]:bounds[lv + 1]][sel]
            floor = prev if lv == 0 else _MEDIAN_SE * prev / np.sqrt(sizes[lv])
            est = _mad(v) if len(v) >= 8 else 1.5 * floor
            now = max(est, floor, cfg.scale_floor)
            old = self.scales[lv]
            self.scales[lv] = now if np.isnan(old) else (
                (1 - cfg.scale_alpha) * old + cfg.scale_alpha * now)
            out[lv] = max(self.scales[lv], cfg.scale_floor)
            prev = out[lv]
        return out

    def _excluded(self) -> np.ndarray:
        """Ranks covered by a suspect or flagged subject: left out of the next reference."""
        cfg, lay, u = self.config, self.layout, self.units
        sus = u.flagged | (u.s > cfg.suspect_fraction * cfg.threshold_h)
        if not sus.any():
            return np.zeros(self.n, bool)
        ex = sus[:self.n].copy()
        if lay.host is not None:
            ex |= sus[self.n:self.n + lay.n_hosts][lay.host]
            if lay.sw is not None:
                ex |= sus[self.n + lay.n_hosts:][lay.sw[lay.host]]
        return ex

    # ------------------------------------------------------------------ findings
    def _decide(self, step: int, attempt: int | None) -> list[Finding]:
        cfg, u = self.config, self.units
        out: list[Finding] = []
        for i in np.flatnonzero(u.flagged & (u.s == 0)):
            u.flagged[i] = False
            if int(i) in self._open:
                out.append(self._emit(int(i), step, attempt, "resolved"))
        for g, o in list(self._open.items()):
            if o.members is not None and not u.flagged[o.members].any():
                out.append(self._emit(g, step, attempt, "resolved"))
        if self.updates >= cfg.min_steps:
            new = (u.s > cfg.threshold_h) & (u.pos >= cfg.persist_steps) & ~u.flagged
            for i in np.flatnonzero(new):
                if u.flagged[i]:   # taken into a roll-up at this step
                    continue
                i, members = self._rollup(int(i))
                u.flagged[members if members is not None else i] = True
                o = self._open.get(i)
                if o is not None and o.carried_at is None:   # a roll-up already open
                    continue
                if o is not None:   # a restart's survivor: its finding goes on
                    o.wait_before = self._carry_wait.pop(i, 0.0)
                    o.carried_at = None
                    o.members = members
                    out.append(self._emit(i, step, attempt, "update"))
                else:
                    out.append(self._emit(i, step, attempt, "new", members))
        out += self._updates(step, attempt)
        return out

    def _rollup(self, i: int) -> tuple[int, list[int] | None]:
        """A flagged rank of a host too small to split (or host of a switch too small) whose
        every sibling is suspect too is the parent's slowness: (parent unit, members);
        otherwise (i, None)."""
        lay, cfg, u, n = self.layout, self.config, self.units, self.n
        if lay.host is None:
            return i, None
        if i < n:
            h = int(lay.host[i])
            if lay.host_split[h] or lay.host_size[h] < 2:
                return i, None
            sib, parent = np.flatnonzero(lay.host == h), n + h
        elif i < n + lay.n_hosts and lay.sw is not None:
            w = int(lay.sw[i - n])
            if lay.sw_split[w] or lay.sw_size[w] < 2:
                return i, None
            sib, parent = n + np.flatnonzero(lay.sw == w), n + lay.n_hosts + w
        else:
            return i, None
        sus = u.flagged[sib] | (u.s[sib] > cfg.suspect_fraction * cfg.threshold_h)
        return (parent, [int(m) for m in sib]) if sus.all() else (i, None)

    def _updates(self, step: int, attempt: int | None) -> list[Finding]:
        """Re-estimates of open findings that moved; carried findings not seen again."""
        cfg, u = self.config, self.units
        out = []
        for i, o in list(self._open.items()):
            if o.carried_at is not None:
                if self.updates >= cfg.resume_steps:
                    out.append(self._emit(i, step, attempt, "resolved"))
                continue
            on = u.flagged[o.members].any() if o.members is not None else u.flagged[i]
            if not on or self.updates - o.emitted_at < cfg.update_every:
                continue
            f = self._finding(i, step, attempt, o)
            moved = abs(f.slowdown - o.slow) >= cfg.update_change * max(abs(o.slow),
                                                                        cfg.drift_k)
            if moved or f.action != o.action:
                out.append(self._emit(i, step, attempt, "update"))
        return out

    def _emit(self, i: int, step: int, attempt: int | None, status: str,
              members: list[int] | None = None) -> Finding:
        u = self.units
        o = self._open.get(i)
        if status == "new" or o is None:
            kind, sid = self._subject(i)
            starts = u.start[members if members is not None else [i]]
            first = int(starts[starts >= 0].min()) if (starts >= 0).any() else step
            o = self._open[i] = _Open(f"{attempt}/{kind}/{self.layout.name(kind, sid)}/"
                                      f"{first}", first, step, members=members)
        else:
            o.seq += 1
        f = self._finding(i, step, attempt, o)
        f.status = status
        o.slow, o.action, o.emitted_at = f.slowdown, f.action, self.updates
        if status == "resolved":
            del self._open[i]
            self._carry_wait.pop(i, None)
        return f

    def _subject(self, i: int) -> tuple[str, int]:
        n, lay = self.n, self.layout
        if i < n:
            return "rank", i
        if i < n + lay.n_hosts:
            return "host", i - n
        return "switch", i - n - lay.n_hosts

    def _wait(self, i: int, o: _Open) -> float:
        w = self.units.wait[o.members] if o.members is not None else self.units.wait[[i]]
        return o.wait_before + float(w.max())

    def _finding(self, i: int, step: int, attempt: int | None, o: _Open) -> Finding:
        cfg, u, lay = self.config, self.units, self.layout
        kind, idx = self._subject(i)
        members = [idx] if kind == "rank" else [int(r) for r in lay.rank_units(kind, idx)]
        m = o.members if o.members is not None else [i]
        slow = u.slowdown(m)
        wait = self._wait(i, o) if o.carried_at is None else o.wait_before + \
            self._carry_wait.get(i, 0.0)
        per_hour = max(slow, 0.0) * self.med_ready * 3600.0 / self.step_time
        score = float(np.median(u.s[m]))
        conf = float(np.clip(1.0 - 0.5 * cfg.threshold_h / max(score, 1e-9), 0.0, 1.0))
        action = ("evict" if slow >= cfg.evict_min_slowdown
                  and np.median(u.cnt[m]) >= cfg.evict_min_steps else "watch")
        host, sw, rel = lay.context(kind, idx) if lay.host is not None else (
            None, None, "the rest of the job")
        return Finding(kind, lay.name(kind, idx), members, o.first_step, o.detected_step, slow,
                       max(wait, 0.0), per_hour, action, conf, attempt, "update", o.id, step,
                       host, sw, rel)

    def active(self) -> list[Finding]:
        """The open findings with their current estimates (status ``update``), in order of
        first report; a finding carried over a restart and not seen again yet is included."""
        out = [self._finding(i, self._last_step, self.attempt, o)
               for i, o in self._open.items()]
        return sorted(out, key=lambda f: (f.detected_step, f.id))


def _ewma(old: float, new: float, alpha: float = 0.1) -> float:
    return new if np.isnan(old) else (1 - alpha) * old + alpha * new


def ready_column(steps: pd.DataFrame) -> pd.Series:
    """Each row's time to reach the collective: ``duration_s - collective_wait_s`` where the
    collective wait was reported, else ``compute_s + data_wait_s`` (data wait 0 if absent),
    else NaN (a ``ready_s`` column, when present, is taken as is)."""
    if "ready_s" in steps:
        return steps["ready_s"].astype(float)
    nan = pd.Series(np.nan, index=steps.index)
    comp = steps["compute_s"].astype(float) if "compute_s" in steps else nan
    data = steps["data_wait_s"].astype(float).fillna(0.0) if "data_wait_s" in steps else 0.0
    out = comp + data
    if "collective_wait_s" in steps and "duration_s" in steps:
        coll = steps["duration_s"].astype(float) - steps["collective_wait_s"].astype(float)
        out = coll.where(coll.notna(), out)
    return out


def detect_stragglers(steps: pd.DataFrame, config: StragglerConfig | None = None,
                      topology: Topology | None = None) -> list[Finding]:
    """Batch use: per-rank step rows (attempt, rank, step, and ``ready_s`` or the step-time
    split: duration_s, collective_wait_s, compute_s, data_wait_s; optional host) in, every
    finding over the run out, each once with its latest state (still open at the end:
    ``update`` with the estimate at the last step; else ``resolved``), in order of first
    report. Without a topology, hosts come from the ``host`` column (no switch level)."""
    if steps.empty:
        return []
    sm = frame_matrix(steps.assign(ready_s=ready_column(steps)), "ready_s")
    n = sm.n_ranks
    if topology is None and "host" in steps:
        hosts = steps.drop_duplicates("rank").set_index("rank")["host"]
        topology = Topology.from_hosts([str(hosts.get(r, f"rank-{r}")) for r in range(n)])
    det = StragglerDetector(config, n, topology)
    latest: dict[str, Finding] = {}   # insertion order: order of first report
    for a, s, row, d in zip(sm.attempts, sm.steps, sm.values, sm.duration):
        for f in det.update(int(s), row, step_time_s=None if np.isnan(d) else float(d),
                            attempt=int(a)):
            latest[f.id] = f
    for f in det.active():
        latest[f.id] = f
    return list(latest.values())


__all__ += ["ready_column"]
