"""The straggler detector's per-step arithmetic, for one step or a block of steps at once.

Why it exists: ``goodlens detect`` replays a whole run (2,048 ranks x 3,000 steps) through the
same detector the collector runs live, and stepping it one step at a time cost ~100 numpy
calls per step. Everything that does not depend on the detector's state (logs, the
reference median, each level's medians, residuals, the cross-section spreads) depends only
on the step's times and on which subjects are suspect, and that set changes rarely. So a
block of steps is prepared with a few numpy calls over a steps x ranks matrix, and only the
recursions (the CUSUMs, the noise scales' EWMAs) run step by step; when the suspect set
changes, the rest of the block is prepared again. One step is a block of one, so live and
batch detection are the same computation and give the same findings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from goodlens.detectors.topology import Layout, group_median, row_median

_MAD_TO_SIGMA = 1.4826
_MEANDEV_TO_SIGMA = 1.2533   # sigma of a normal is sqrt(pi / 2) x its mean absolute deviation
#: A subject's own noise scale learns from every 4th step after the first ``own_min_steps``
#: (an EWMA of a slowly moving quantity; a quarter of the per-step cost at 16,384 ranks).
LEARN_EVERY = 4
#: A level's spread is measured on at most this many of its units (evenly strided): it only
#: feeds an EWMA over ~20 steps, and its medians over every rank were a third of the cost.
_MAD_SAMPLE = 512


@dataclass
class Block:
    """Rows of consecutive steps, prepared for a fixed set of suspect subjects."""

    scored: np.ndarray
    """Per row: enough ranks reported for the step to be scored."""
    ref: np.ndarray
    """Per row: the reference (log seconds), the median of the ranks no suspect covers."""
    res: np.ndarray
    """Rows x units: each unit's log excess over its siblings (0 where not scored)."""
    have: np.ndarray | None
    """Rows x units: whether the unit was scored (None: every unit of every row)."""
    base: np.ndarray
    """Rows x units: seconds one unit of relative excess costs (its parent's time)."""
    spread: np.ndarray
    """Rows x 3: the robust spread of the rank, host and switch residuals across the quiet
    units (NaN where fewer than 8 units: the detector then leans on the level below)."""

    @property
    def spread_rows(self) -> list[list[float]]:
        """:attr:`spread` as plain floats, one list per row (read once per block)."""
        rows = getattr(self, "_rows", None)
        if rows is None:
            rows = self._rows = self.spread.tolist()
        return rows


def prepare(lay: Layout, ready: np.ndarray, excl: np.ndarray, quiet: np.ndarray,
            min_ranks: int) -> Block:
    """A :class:`Block` from rows x ranks times to reach the collective (NaN: no report),
    with ``excl`` the ranks left out of the reference and ``quiet`` the units whose spread
    measures the noise."""
    c = np.asarray(ready, dtype=np.float32)   # log times to ~1e-7: far under any noise
    valid = np.isfinite(c) & (c > 0)
    nvalid = valid.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log(c)
    if not valid.all():
        x[~valid] = np.nan
    ref = _reference(x, valid, excl, min_ranks)
    t = x - ref[:, None]
    res, base = _residuals(lay, t, ref)
    have = np.isfinite(res)
    every = bool(have.all())
    r0 = res if every else np.where(have, res, 0.0)
    if every:
        spread = _spreads(lay, res, quiet)
    else:   # units missing on some rows: each row's spread over its own scored units
        spread = np.stack([_spreads(lay, res[i:i + 1], quiet & have[i])[0]
                           for i in range(len(res))])
    base = np.where(np.isfinite(base), base, np.exp(ref)[:, None])
    return Block(nvalid >= min_ranks, ref.astype(float), r0.astype(float),
                 None if every else have, base.astype(float), spread)


def _reference(x: np.ndarray, valid: np.ndarray, excl: np.ndarray, min_ranks: int
               ) -> np.ndarray:
    """Per row, the median log time of the ranks not excluded (all valid ranks when too
    few are left)."""
    if not excl.any():
        return row_median(x)
    kept = x[:, ~excl]
    ref = row_median(kept)
    few = np.isfinite(kept).sum(axis=1) < min_ranks
    if few.any():
        ref[few] = row_median(x[few])
    return ref


def _residuals(lay: Layout, t: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows x units: each unit's log excess over its siblings' median one level up (NaN
    where the unit is not scored), and the seconds one unit of relative excess costs."""
    rows = len(t)
    if lay.host is None:
        return t, np.broadcast_to(np.exp(ref)[:, None], t.shape)
    hm = group_median(t, lay.host_members, lay.host_full)          # rows x hosts
    parent_h = np.zeros((rows, lay.n_hosts), t.dtype)
    sw_res = np.zeros((rows, 0), t.dtype)
    if lay.sw is not None:
        sm = group_median(hm, lay.sw_members, lay.sw_full)         # rows x switches
        parent_h = np.where(lay.sw_split[lay.sw], sm[:, lay.sw], np.float32(0))
        sw_res = np.where(lay.sw_split, sm, np.float32(np.nan))
    host_res = np.where(lay.host_split, hm - parent_h, np.float32(np.nan))
    parent_r = np.where(lay.host_split[lay.host], hm[:, lay.host], parent_h[:, lay.host])
    res = np.concatenate([t - parent_r, host_res, sw_res], axis=1)
    up = np.concatenate([parent_r, parent_h, np.zeros((rows, lay.n_sw), t.dtype)], axis=1)
    # the parent's time: exp(ref + up), with exp(up) ~ 1 + up (up is a few percent: the
    # error is up^2 / 2 of the wait, and an exp over every unit of every row is costly)
    up += 1.0
    up *= np.exp(ref)[:, None]
    return res, up


def _spreads(lay: Layout, res: np.ndarray, quiet: np.ndarray) -> np.ndarray:
    """Rows x 3 robust spreads (1.4826 x MAD) of each level's quiet units' residuals."""
    n = lay.n
    bounds = (0, n, n + lay.n_hosts, n + lay.n_hosts + lay.n_sw)
    out = np.full((len(res), 3), np.nan)
    for lv in range(3):
        cols = np.flatnonzero(quiet[bounds[lv]:bounds[lv + 1]]) + bounds[lv]
        if len(cols) < 8:
            continue
        if len(cols) > _MAD_SAMPLE:
            cols = cols[::-(-len(cols) // _MAD_SAMPLE)]
        v = res[:, cols]
        out[:, lv] = _MAD_TO_SIGMA * row_median(np.abs(v - row_median(v)[:, None]))
    return out


class Units:
    """Per-unit CUSUM state and the unit's own noise scale. The sums of the current
    excursion (relative excess, steps, steps over k, wait in seconds) are running totals
    kept every step, with their values when the excursion began (and at its peak) set
    aside: an excursion's sum is a difference, so a step costs a few array operations."""

    def __init__(self, n: int) -> None:
        self.s = np.zeros(n)
        self.start = np.full(n, -1, np.int64)
        # a second CUSUM, one noise unit stricter: its excursion begins where a large shift
        # began, not at a noise blip tens of steps before it (a loaded host's jitter)
        self.s_hi = np.zeros(n)
        self.start_hi = np.full(n, -1, np.int64)
        self.h_cnt = np.zeros(n)   # the step count when it began
        self.c_rel, self.c_cnt, self.c_pos, self.c_wait = (np.zeros(n) for _ in range(4))
        self.b_rel, self.b_cnt, self.b_pos, self.b_wait = (np.zeros(n) for _ in range(4))
        self.p_rel, self.p_cnt = np.zeros(n), np.zeros(n)   # totals at the excursion's peak
        self.peak = np.zeros(n)       # the CUSUM's highest value in this excursion: the shift
        self.mean = np.zeros(n)       # ends where it peaks, so a recovered subject's
        self.dev = np.zeros(n)        # estimate is not diluted by its recovery
        self.nobs = np.zeros(n)
        self.flagged = np.zeros(n, bool)
        self.own = np.zeros(n)        # the unit's own noise scale (0 until settled)
        self.ticks = 0

    # the current excursion's sums, for a few units (a finding's members)
    def pos(self, m: np.ndarray | list[int]) -> np.ndarray:
        return self.c_pos[m] - self.b_pos[m]

    def cnt(self, m: np.ndarray | list[int]) -> np.ndarray:
        return self.c_cnt[m] - self.b_cnt[m]

    def wait(self, m: np.ndarray | list[int]) -> np.ndarray:
        return self.c_wait[m] - self.b_wait[m]

    def sharp(self, m: list[int]) -> np.ndarray:
        """Per unit of m: the stricter CUSUM's excursion began after the main one's, is still
        on and reached the peak over at least 8 steps (a large shift: its onset is known
        better; for a small one the stricter sum only flickers on and off)."""
        return (self.s_hi[m] > 0) & (self.start_hi[m] > self.start[m]) & \
            (self.p_cnt[m] - self.h_cnt[m] >= 8)

    def onset(self, m: list[int], step: int) -> int:
        """The first step of the slowdown of units m: where the stricter CUSUM's excursion
        began when it is sharper, else where the main one's began."""
        st = np.where(self.sharp(m), self.start_hi[m], self.start[m])
        return int(st[st >= 0].min()) if (st >= 0).any() else step

    def slowdown(self, m: list[int]) -> float:
        """Mean relative excess from the excursion's start to its peak, pooled over the units
        m (weighted by their steps: a member's fresh short excursion barely moves it). From
        the main CUSUM's start even when the stricter one gives the onset: averaging from
        where a selected run of high steps began would bias it upwards."""
        rel = float((self.p_rel[m] - self.b_rel[m]).sum())
        return rel / max(float((self.p_cnt[m] - self.b_cnt[m]).sum()), 1.0)

    def own_scale(self, res: np.ndarray, have: np.ndarray | None, alpha: float, settle: int,
                  level_s: np.ndarray) -> np.ndarray:
        """The scale to score ``res`` with: the level's, or the unit's own when noisier; then
        learn from this step (deviations winsorised, not while the unit is flagged)."""
        s = np.maximum(level_s, self.own)
        self.ticks += 1
        if self.ticks % LEARN_EVERY and self.ticks > settle:
            return s
        w = np.maximum(alpha * LEARN_EVERY, 1.0 / (self.nobs + 1))
        d = np.minimum(np.abs(res - self.mean), 3.0 * s)
        learn = ~self.flagged if have is None else have & ~self.flagged
        self.mean = np.where(learn, self.mean + w * (res - self.mean), self.mean)
        self.dev = np.where(learn, self.dev + w * (d - self.dev), self.dev)
        self.nobs += learn
        self.own = np.where(self.nobs >= settle, _MEANDEV_TO_SIGMA * self.dev, 0.0)
        return s

    def step(self, z: np.ndarray, res: np.ndarray, k: np.ndarray, base_s: np.ndarray,
             have: np.ndarray | None, step: int, cap: float) -> None:
        """One step of every unit's CUSUM and running totals (``res`` 0 where not scored)."""
        # (np.where, not np.copyto(where=): the latter is ~10x slower on 19k units here)
        new = self.s + z
        np.maximum(new, 0.0, out=new)
        np.minimum(new, cap, out=new)
        if have is not None:
            new = np.where(have, new, self.s)
        on = new > 0
        rising = on & (self.s == 0)
        if rising.any():   # an excursion begins: its sums count from the totals so far
            self.start[rising] = step
            self.b_rel = np.where(rising, self.c_rel, self.b_rel)
            self.b_cnt = np.where(rising, self.c_cnt, self.b_cnt)
            self.b_pos = np.where(rising, self.c_pos, self.b_pos)
            self.b_wait = np.where(rising, self.c_wait, self.b_wait)
            self.peak[rising] = 0.0
        hi = self.s_hi + z
        hi -= 1.0
        np.maximum(hi, 0.0, out=hi)
        np.minimum(hi, cap, out=hi)
        if have is not None:
            hi = np.where(have, hi, self.s_hi)
        rise_hi = (hi > 0) & (self.s_hi == 0)
        if rise_hi.any():
            self.start_hi[rise_hi] = step
            self.h_cnt = np.where(rise_hi, self.c_cnt, self.h_cnt)
        self.s_hi = hi
        exc = np.expm1(res)
        rel = np.minimum(exc, 1.0)
        np.maximum(rel, -0.5, out=rel)
        self.c_rel += rel
        self.c_cnt += 1.0 if have is None else have
        self.c_pos += res > k
        np.maximum(exc, 0.0, out=exc)
        exc *= base_s
        self.c_wait += exc
        top = new >= self.peak
        top &= on
        self.peak = np.where(top, new, self.peak)
        self.p_rel = np.where(top, self.c_rel, self.p_rel)
        self.p_cnt = np.where(top, self.c_cnt, self.p_cnt)
        self.s = new
