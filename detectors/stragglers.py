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
lasts: the detector emits ``new``, then ``update`` when the estimate, the action or the
wait it has cost moves (and at :meth:`StragglerDetector.flush`), then ``resolved``. Pure
statistics: arrays or a frame in, :class:`Finding` dataclasses out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from goodlens.detectors.config import StragglerConfig
from goodlens.detectors.fastforward import fast_forward
from goodlens.detectors.jobcost import JobCost, RecentSteps
from goodlens.detectors.matrix import StepMatrix, frame_matrix, ready_column
from goodlens.detectors.nvidia import RuleFlag, nvidia_rule, nvidia_rule_matrix
from goodlens.detectors.scoring import Block, Units, capped_scores, excluded, prepare
from goodlens.detectors.topology import Layout, Topology

if TYPE_CHECKING:  # the batch entry's frames only: detect_matrix runs without pandas
    import pandas as pd

__all__ = ["Finding", "RuleFlag", "StragglerConfig", "StragglerDetector", "Topology",
           "detect_matrix", "detect_stragglers", "nvidia_rule", "nvidia_rule_matrix",
           "ready_column"]

_MEDIAN_SE = 1.2533   # the standard error of a median of m normal values is ~1.2533 s / sqrt(m)
#: Steps prepared at once by :meth:`StragglerDetector.update_many`.
_BLOCK = 256


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
    """``evict`` (replace it: >= 5% and lasting; it stays so while the estimate is over 4%)
    or ``watch``."""
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
    job_slowdown: float | None = None
    """What the subject costs the job per step: the smaller of ``job_slowdown_ready`` and
    ``job_slowdown_seen`` (the ready times' estimate, bounded by how much the job's steps
    really grew since the onset, where that is known). ``job_slowdown_ready`` is smaller
    than ``slowdown`` where collectives are a real share of the step (under FSDP2 they can
    be most of it) or where the other ranks' times spread; None where no step of the
    subject's is known (or it covers every rank). The others stay in the job: where two
    stragglers overlap each hides the other's cost (see ``job_slowdown_part``)."""
    job_slowdown_part: float | None = None
    """This finding's part of ``joint_job_slowdown``: the open findings, slowest first,
    are removed one at a time and each is charged the drop in the job's latest ready time
    its own removal causes (a rank finding inside a flagged host keeps its rank; the host
    is charged for its other ranks). The parts of the open findings add up to the joint
    figure; None where it is not known."""
    joint_job_slowdown: float | None = None
    """What every finding open at ``last_step`` costs the job's step together (the run's
    figure, the same on each of them): the median step's latest ready time with them
    against without any of them, over the step the job would have without them; bounded,
    as ``job_slowdown`` is, by how much the job's steps grew since their onsets."""
    job_slowdown_ready: float | None = None
    """How much later the subject's latest rank reaches the collective than the latest
    rank outside it (what the collective would wait for without it; 0 where that one is
    later), over the step time the job would have without it (0.1 = steps 10% longer than
    without it): medians over the last 64 steps since onset. Overstates where the other
    ranks' work after the collective ran while the subject was late (ranks sharing cores)."""
    job_slowdown_seen: float | None = None
    """The job's own step time (each step's median duration) over those steps against the
    64 steps before the onset (0.1: 10% longer; never below 0). None where either side has
    fewer than 16 known steps in this attempt. Takes in anything else that changed the step
    since the onset."""


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
    attempt: int | None = None        # the detector's attempt at its first report
    since: np.ndarray | None = None   # the totals at its onset (Units.since), this attempt
    job: float | None = None          # its job slowdown as last reported
    job_checked: int = 0              # update count when that was last compared
    waited: float = 0.0               # the wait it had cost at its last report


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
        self._sqrt_size = [math.sqrt(x) for x in (
            1.0, float(np.median(lay.host_size)) if lay.n_hosts else 1.0,
            float(np.median(lay.sw_size)) if lay.n_sw else 1.0)]
        self._bounds = (n_ranks, n_ranks + lay.n_hosts)
        # (level, first unit, end) of each level present: units are grouped by level
        self._level_cols = [(lv, a, b) for lv, (a, b) in enumerate(itertools.pairwise(
            (0, *self._bounds, self._n_units))) if b > a]
        self._level_buf = np.empty(self._n_units)
        self._ff_totals: np.ndarray | None = None   # the fast path's scratch (fastforward)
        self._recent = RecentSteps(n_ranks)
        self._k_floor = float(np.log1p(self.config.drift_k))
        self.attempt: int | None = None
        self._open: dict[int, _Open] = {}
        # the open findings' joint cost, kept for the step it was read at (see _joint)
        self._joint_key: tuple | None = None
        self._joint_val: tuple[float | None, dict[int, float]] = (None, {})
        self.reset()

    def reset(self, attempt: int | None = None) -> None:
        """Forget every subject's state (a restart changes the world and restores an older
        step); open findings are carried: flagged again within ``resume_steps`` of the new
        attempt they continue, else they are resolved. ``update`` calls it when its
        ``attempt`` changes."""
        self.attempt = attempt
        # open findings are carried over with the wait they have cost so far
        old = getattr(self, "_carry_wait", {})
        self._carry_wait = {u: self._wait(u, o) if o.carried_at is None else old.get(u, 0.0)
                            for u, o in self._open.items()}
        for o in self._open.values():
            o.carried_at = 0
        self.units = Units(self._n_units)
        self._sus = np.zeros(self._n_units, bool)
        self._hot = self._sus
        self.scales = [math.nan, math.nan, math.nan]
        self.med_ready = np.nan
        self.step_time = np.nan
        self._recent.clear()
        self.updates = 0
        self._excl = np.zeros(self.n, bool)
        self._ex = excluded(self.layout, self._excl, ~self._sus)
        self._last_step = -1

    # ------------------------------------------------------------------ scoring
    def update(self, step: int, ready: np.ndarray, *, step_time_s: float | None = None,
               attempt: int | None = None, step_start_s: float | None = None
               ) -> list[Finding]:
        """Score one step: ``ready[r]`` is rank r's time to reach the collective, in seconds
        (its step minus its collective wait; NaN where it did not report). ``step_time_s``
        (the step's duration) turns the wait into a per-hour figure; without it the median
        ready time stands in. A new ``attempt`` resets the state first (see :meth:`reset`).
        ``step_start_s`` (when the step began on one reference clock, any epoch) gives the
        job's step period, which a finding's cost is bounded by (``job_slowdown_seen``).
        Returns the findings new, updated or resolved at this step."""
        c = np.asarray(ready, dtype=float)
        if c.shape != (self.n,):
            raise ValueError(f"ready must have shape ({self.n},), got {c.shape}")
        return self.update_many([step], c[None, :], [step_time_s], attempt=attempt,
                                step_starts=[step_start_s])

    def update_many(self, steps: Sequence[int], ready: np.ndarray,
                    step_times: Sequence[float | None] | None = None, *,
                    attempt: int | None = None,
                    step_starts: Sequence[float | None] | None = None) -> list[Finding]:
        """:meth:`update` for consecutive steps of one attempt at once (``ready`` rows x
        ranks): the same findings, prepared a block at a time (see
        :mod:`~goodlens.detectors.scoring`), quiet steps advanced many at once (see
        :mod:`~goodlens.detectors.fastforward`)."""
        m = np.asarray(ready)   # any float dtype: each block is prepared in float32
        if m.ndim != 2 or m.shape[1] != self.n:
            raise ValueError(f"ready must have shape (steps, {self.n}), got {m.shape}")
        if attempt is not None and attempt != self.attempt:
            if self.attempt is None:
                self.attempt = attempt   # the first attempt seen: nothing stale yet
            else:
                self.reset(attempt)
        times = [None] * len(m) if step_times is None else list(step_times)
        starts = [None] * len(m) if step_starts is None else list(step_starts)
        out: list[Finding] = []
        i = 0
        while i < len(m):
            rows = slice(i, min(i + _BLOCK, len(m)))
            blk = prepare(self.layout, m[rows], self._ex, self.config.min_ranks)
            j = 0
            while j < len(blk.ref):
                # steps where nothing can happen, many at once (the same state after them)
                done = fast_forward(self, blk, j, steps, times, rows.start) \
                    if len(blk.ref) - j > 1 else 0
                if done:
                    self._recent.add(steps[i:i + done], m[i:i + done], times[i:i + done],
                                     starts[i:i + done])
                    i, j = i + done, j + done
                    continue
                i, j = i + 1, j + 1
                if not blk.scored[j - 1]:
                    continue
                self._recent.add_one(steps[i - 1], m[i - 1], times[i - 1], starts[i - 1])
                out += self._advance(blk, j - 1, int(steps[i - 1]), times[i - 1], attempt)
                if self._suspects_moved():
                    break   # the rest of the block is prepared again for the new set
        return out

    def _advance(self, blk: Block, j: int, step: int, step_time_s: float | None,
                 attempt: int | None) -> list[Finding]:
        """The recursive part of one step: noise scales, CUSUMs, findings."""
        cfg, u = self.config, self.units
        a, b, c = self._level_scales(blk.spread_rows[j])
        level_s, (n, nh) = self._level_buf, self._bounds
        level_s[:n], level_s[n:nh], level_s[nh:] = a, b, c
        res = blk.res[j]
        have = None if blk.have is None else blk.have[j]
        s = u.own_scale(res, have, cfg.own_alpha, cfg.own_min_steps, level_s)
        z, k = capped_scores(res, s, cfg.drift_k_sigmas, self._k_floor, cfg.step_cap)
        u.step(z, res, k, blk, j, step, cfg.cusum_cap * cfg.threshold_h)
        self._hot = u.s > cfg.suspect_fraction * cfg.threshold_h
        self._track(blk.ref[j], step_time_s)
        self.updates += 1
        self._last_step = step
        return self._decide(step, attempt)

    def _track(self, ref_log: float, step_time_s: float | None) -> None:
        """Follow the typical time to reach the collective (``ref_log``: the step's reference,
        log seconds) and the step time, as moving averages (what a finding's wait is priced
        with)."""
        ref_s = float(np.exp(ref_log))
        st = step_time_s if step_time_s and step_time_s > 0 else ref_s
        self.med_ready = _ewma(self.med_ready, ref_s)
        self.step_time = _ewma(self.step_time, st)

    def _level_scales(self, spread: list[float]) -> list[float]:
        """Per level (rank, host, switch) the noise scale: the spread across the level's
        quiet subjects (EWMA), never under what the level below implies for a median of
        its size, and a half more where too few subjects make a spread unreliable. (Plain
        floats: three scalars per step, where numpy's per-call cost would dominate.)"""
        cfg = self.config
        out = []
        prev = floor0 = cfg.scale_floor
        alpha = cfg.scale_alpha
        for lv in range(3):
            floor = prev if lv == 0 else _MEDIAN_SE * prev / self._sqrt_size[lv]
            est = spread[lv] if math.isfinite(spread[lv]) else 1.5 * floor
            now = max(est, floor, floor0)
            old = self.scales[lv]
            new = now if math.isnan(old) else (1 - alpha) * old + alpha * now
            self.scales[lv] = new
            prev = max(new, floor0)
            out.append(prev)
        return out

    def _suspects_moved(self) -> bool:
        """Refresh the suspect set (flagged, or past a share of the threshold) and the ranks
        it leaves out of the reference; True when it changed."""
        lay, u = self.layout, self.units
        if not self._hot.any() and not self._sus.any():
            return False   # the common case: nothing suspect before or now
        sus = u.flagged | self._hot
        if np.array_equal(sus, self._sus):
            return False
        self._sus = sus
        ex = sus[:self.n].copy()
        if lay.host is not None:
            ex |= sus[self.n:self.n + lay.n_hosts][lay.host]
            if lay.sw is not None:
                ex |= sus[self.n + lay.n_hosts:][lay.sw[lay.host]]
        self._excl = ex
        self._ex = excluded(lay, ex, ~sus)
        return True

    # ------------------------------------------------------------------ findings
    def _decide(self, step: int, attempt: int | None) -> list[Finding]:
        cfg, u = self.config, self.units
        out: list[Finding] = []
        if self._sus.any():   # (flagged units are suspect: nothing to resolve otherwise)
            fl = u.flagged.nonzero()[0]   # (few: the small arrays are cheap, not n-sized)
            for i in fl[u.s[fl] == 0]:
                u.flagged[i] = False
                if int(i) in self._open:
                    out.append(self._emit(int(i), step, attempt, "resolved"))
        for g, o in list(self._open.items()):
            # a roll-up whose members are all cleared; one carried over a restart (the reset
            # cleared its members' flags) is left to _updates: found again, it goes on
            if o.carried_at is None and o.members is not None and \
                    not u.flagged[o.members].any():
                out.append(self._emit(g, step, attempt, "resolved"))
        hot = self._hot.nonzero()[0] if self.updates >= cfg.min_steps else ()
        if len(hot):   # (over the threshold implies hot: the threshold's share is <= 1)
            over = hot[(u.s[hot] > cfg.threshold_h) & ~u.flagged[hot]]
            for i in over[u.pos(over) >= cfg.persist_steps]:
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
                    o.since = u.since(members if members is not None else [i])
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
            slow, action = self._estimate(i, o)
            if cfg.moved(slow, o.slow) or action != o.action:
                out.append(self._emit(i, step, attempt, "update"))
            elif self.updates - o.job_checked >= cfg.update_every:
                # compared only as often as the job slowdown (the fast path's cadence)
                o.job_checked = self.updates
                job = self._job(self._ranks(i)[2], o).value
                if (job is not None and (o.job is None or cfg.moved(job, o.job))) or \
                        cfg.moved(self._wait(i, o), o.waited):
                    out.append(self._emit(i, step, attempt, "update"))
        return out

    def flush(self) -> list[Finding]:
        """An ``update`` of every open finding not reported at the last step fed, in its
        state there: what the end of an attempt's data emits, so that the last stored state
        of each finding is its final one (its wait, confidence and slowdown), as a batch
        pass over the same steps reports it. A finding carried over a restart and not seen
        again has nothing new to say."""
        out = []
        for i, o in list(self._open.items()):
            if o.carried_at is None and o.emitted_at != self.updates:
                out.append(self._emit(i, self._last_step, self.attempt, "update"))
        return out

    def _emit(self, i: int, step: int, attempt: int | None, status: str,
              members: list[int] | None = None) -> Finding:
        u = self.units
        o = self._open.get(i)
        if status == "new" or o is None:
            kind, sid = self._subject(i)
            m = members if members is not None else [i]
            first = u.onset(m, step)
            o = self._open[i] = _Open(f"{attempt}/{kind}/{self.layout.name(kind, sid)}/"
                                      f"{first}", first, step, members=members,
                                      attempt=self.attempt, since=u.since(m))
        else:
            o.seq += 1
            if status == "update" and o.carried_at is None and o.attempt == self.attempt:
                self._redate(i, o, step)
        f = self._finding(i, step, attempt, o)
        f.status = status
        o.slow, o.action, o.emitted_at = f.slowdown, f.action, self.updates
        o.waited = f.straggler_wait_s
        o.job, o.job_checked = f.job_slowdown, self.updates
        if status == "resolved":
            del self._open[i]
            self._carry_wait.pop(i, None)
        return f

    def _redate(self, i: int, o: _Open, step: int) -> None:
        """Date a finding's onset later when its evidence now says so: at its first report
        a large shift's stricter CUSUM has often run too few steps to be trusted, and the
        onset is then where the main one began, tens of steps early where the subject was
        already slightly slow (a rank sharing a busy core), and its slowdown is diluted by
        those steps. Once the stricter sum has dated it (``Units.sharp``), the onset and the
        totals its slowdown counts from move there: never earlier, and never past the step
        the finding was reported at (what was detected had begun by then, while a small
        shift's stricter sum can restart late in a long finding). The ``id`` keeps the first
        report's step."""
        m = o.members if o.members is not None else [i]
        first = self.units.onset(m, step)
        if o.first_step < first <= o.detected_step:
            o.first_step, o.since = first, self.units.since(m)

    def _subject(self, i: int) -> tuple[str, int]:
        n, lay = self.n, self.layout
        if i < n:
            return "rank", i
        if i < n + lay.n_hosts:
            return "host", i - n
        return "switch", i - n - lay.n_hosts

    def _wait(self, i: int, o: _Open) -> float:
        w = self.units.wait(o.members if o.members is not None else [i])
        return o.wait_before + float(w.max())

    def _estimate(self, i: int, o: _Open) -> tuple[float, str]:
        """(slowdown, action) of an open finding now: cheap, checked at every step (a
        finding carried over a restart and not seen again keeps its last estimate)."""
        cfg, u = self.config, self.units
        if o.carried_at is not None:
            return o.slow, o.action
        m = o.members if o.members is not None else [i]
        slow = u.slowdown(m, o.since)
        lasted = float(u.c_cnt[i] - u.b_cnt[i]) if o.members is None else \
            float(np.median(u.cnt(m)))
        return slow, ("evict" if slow >= cfg.evict_floor(o.action)
                      and lasted >= cfg.evict_min_steps else "watch")

    def _finding(self, i: int, step: int, attempt: int | None, o: _Open) -> Finding:
        cfg, u, lay = self.config, self.units, self.layout
        kind, idx, members = self._ranks(i)
        m = o.members if o.members is not None else [i]
        slow, action = self._estimate(i, o)
        wait = self._wait(i, o) if o.carried_at is None else o.wait_before + \
            self._carry_wait.get(i, 0.0)
        per_hour = max(slow, 0.0) * self.med_ready * 3600.0 / self.step_time
        score = float(np.median(u.s[m]))
        conf = float(np.clip(1.0 - 0.5 * cfg.threshold_h / max(score, 1e-9), 0.0, 1.0))
        host, sw, rel = lay.context(kind, idx) if lay.host is not None else (
            None, None, "the rest of the job")
        joint, parts = self._joint()
        cost = self._job(members, o)
        return Finding(kind, lay.name(kind, idx), members, o.first_step, o.detected_step, slow,
                       max(wait, 0.0), per_hour, action, conf, attempt, "update", o.id, step,
                       host, sw, rel, cost.value, parts.get(i), joint, cost.ready, cost.seen)

    def _ranks(self, i: int) -> tuple[str, int, list[int]]:
        """Unit ``i``'s kind, index among its kind, and the ranks it covers."""
        kind, idx = self._subject(i)
        return kind, idx, [idx] if kind == "rank" else [
            int(r) for r in self.layout.rank_units(kind, idx)]

    def _job(self, ranks: list[int], o: _Open) -> JobCost:
        """What the subject covering ``ranks`` costs the job now, over the attempt's recent
        steps since its onset (a finding from an earlier attempt: every step of this one,
        restored ones included, and no baseline before it)."""
        return self._recent.job_cost(ranks, o.first_step if o.attempt == self.attempt
                                     else None)

    def _joint(self) -> tuple[float | None, dict[int, float]]:
        """The open findings' joint job slowdown and each one's part (by unit), over the
        recent steps since the latest onset among them (every step of this attempt for a
        finding from an earlier one): all of them slow there. Computed once per scored step
        and set of open findings (every finding reported at a step shares it)."""
        key = (self.attempt, self.updates, self._recent.count,
               tuple((i, o.first_step, o.attempt) for i, o in self._open.items()))
        if self._joint_key == key:
            return self._joint_val
        units = list(self._open)
        onsets = [o.first_step for o in self._open.values() if o.attempt == self.attempt]
        # bounded by the steps before the earliest onset: where every one began in this
        # attempt (one carried over a restart has no steps without it here)
        first = min(onsets) if onsets and len(onsets) == len(units) else None
        got = self._recent.joint_job_slowdown([self._ranks(i)[2] for i in units],
                                              max(onsets) if onsets else None, first)
        val: tuple[float | None, dict[int, float]] = (None, {}) if got is None else \
            (got[0], dict(zip(units, got[1], strict=True)))
        self._joint_key, self._joint_val = key, val
        return val

    def active(self) -> list[Finding]:
        """The open findings with their current estimates (status ``update``), in order of
        first report; a finding carried over a restart and not seen again yet is included."""
        out = [self._finding(i, self._last_step, self.attempt, o)
               for i, o in self._open.items()]
        return sorted(out, key=lambda f: (f.detected_step, f.id))


def _ewma(old: float, new: float, alpha: float = 0.1) -> float:
    return new if math.isnan(old) else (1 - alpha) * old + alpha * new


def detect_stragglers(steps: pd.DataFrame, config: StragglerConfig | None = None,
                      topology: Topology | None = None) -> list[Finding]:
    """Batch use: per-rank step rows (attempt, rank, step, and ``ready_s`` or the step-time
    split: duration_s, collective_wait_s, compute_s, data_wait_s; optional host) in, every
    finding over the run out, each once with its latest state (still open at the end:
    ``update`` with the estimate at the last step; else ``resolved``), in order of first
    report. Without a topology, hosts come from the ``host`` column (no switch level)."""
    if steps.empty:
        return []
    sm = frame_matrix(steps, ready_column(steps).to_numpy(float))
    n = sm.n_ranks
    if topology is None and "host" in steps:
        hosts = steps.drop_duplicates("rank").set_index("rank")["host"]
        topology = Topology.from_hosts([str(hosts.get(r, f"rank-{r}")) for r in range(n)])
    return detect_matrix(sm, config, topology)


def detect_matrix(sm: StepMatrix, config: StragglerConfig | None = None,
                  topology: Topology | None = None) -> list[Finding]:
    """:func:`detect_stragglers` on a steps x ranks matrix of times to reach the collective
    (rows in attempt, step order), each attempt fed a block of steps at a time."""
    if not sm.values.size:
        return []
    det = StragglerDetector(config, sm.n_ranks, topology)
    latest: dict[str, Finding] = {}   # insertion order: order of first report
    bounds = [0, *(np.flatnonzero(np.diff(sm.attempts)) + 1).tolist(), len(sm.attempts)]
    for lo, hi in itertools.pairwise(bounds):   # each attempt's rows
        # (a NaN duration: none known, the median ready time stands in)
        starts = None if sm.start is None else sm.start[lo:hi].tolist()
        for f in det.update_many(sm.steps[lo:hi], sm.values[lo:hi],
                                 sm.duration[lo:hi].tolist(), attempt=int(sm.attempts[lo]),
                                 step_starts=starts):
            latest[f.id] = f
    for f in det.active():
        latest[f.id] = f
    return list(latest.values())

