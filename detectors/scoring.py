"""The straggler detector's per-step arithmetic, for one step or a block of steps at once.

Why it exists: ``goodlens detect`` replays a whole run (2,048 ranks x 3,000 steps) through the
same detector the collector runs live, and stepping it one step at a time cost ~100 numpy
calls per step. Everything that does not depend on the detector's state (logs, the
reference median, each level's medians, residuals, the cross-section spreads, each unit's
relative excess and wait) depends only on the step's times and on which subjects are
suspect, and that set changes rarely. So a block of steps is prepared with a few numpy calls
over a steps x ranks matrix, and only the recursions (the CUSUMs, the noise scales' EWMAs)
run step by step (:mod:`~goodlens.detectors.fastforward` runs those for many quiet steps at
once); when the suspect set changes, the rest of the block is prepared again. One step is a
block of one, so live and batch detection are the same computation and give the same
findings. The live step at 16,384 ranks is ~1.1-1.5 ms: medians by partition or SIMD sort
instead of ``np.median``, host and switch medians by a sorting network over every group at
once, index arrays kept per suspect set, and indexed copies where few units change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from goodlens.detectors.topology import (
    _PARTITION_MEDIAN,
    Layout,
    group_median_loo,
    row_median,
)

#: ``np.clip``'s ufunc, without the wrapper's per-call cost.
_clip = getattr(getattr(np, "_core", None), "umath", np).clip
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
    rel: np.ndarray
    """Rows x units: each unit's relative excess over its siblings *without itself* (the
    median of the others: unbiased where a median of a few moves with the unit), exp(.) - 1
    clipped to [-0.5, 1] (the running totals' term, prepared for the block at once; the
    slowdown estimate's). The CUSUM scores ``res``, whose noise is lower."""
    wait: np.ndarray
    """Rows x units: seconds of wait the unit's excess cost (its positive relative excess,
    as in ``rel``, times its parent's time)."""
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


@dataclass
class Excluded:
    """What a suspect set leaves out, as the index arrays :func:`prepare` uses (built once per
    change of the set, which is rare, not once per step)."""

    keep: np.ndarray | None
    """Ranks in the reference (None: every rank)."""
    drop: np.ndarray
    """The ranks left out of it."""
    quiet: np.ndarray
    """Per unit: whether its spread measures the noise (no suspect)."""
    cols: list[np.ndarray | None]
    """Per level, the quiet units the spread is measured on (None: fewer than 8)."""


def capped_scores(res: np.ndarray, scale: np.ndarray, k_sigmas: float, k_floor: np.ndarray,
                  cap: float) -> tuple[np.ndarray, np.ndarray]:
    """``(z, k)``: each unit's CUSUM increment, its residual less the drift allowance ``k``
    (``k_sigmas`` noise units, at least ``k_floor``) in noise units, bounded to +-``cap`` so
    one step's excursion cannot make a finding (one row or a block of rows alike)."""
    k = scale * k_sigmas
    np.maximum(k, k_floor, out=k)
    z = res - k
    z /= scale
    _clip(z, -cap, cap, out=z)   # (max then min: no NaN, the same values)
    return z, k


def excluded(lay: Layout, excl: np.ndarray, quiet: np.ndarray) -> Excluded:
    """An :class:`Excluded` from ``excl`` (ranks left out of the reference) and ``quiet``."""
    return Excluded(np.flatnonzero(~excl) if excl.any() else None, np.flatnonzero(excl), quiet,
                    [_spread_cols(lay, quiet, lv) for lv in range(3)])


def _spread_cols(lay: Layout, quiet: np.ndarray, lv: int) -> np.ndarray | None:
    """The units of level ``lv`` a spread is measured on: the quiet ones, evenly strided down
    to at most ``_MAD_SAMPLE`` (None: fewer than 8)."""
    n = lay.n
    bounds = (0, n, n + lay.n_hosts, n + lay.n_hosts + lay.n_sw)
    cols = np.flatnonzero(quiet[bounds[lv]:bounds[lv + 1]]) + bounds[lv]
    if len(cols) < 8:
        return None
    if len(cols) > _MAD_SAMPLE:
        cols = cols[::-(-len(cols) // _MAD_SAMPLE)]
    return cols


def prepare(lay: Layout, ready: np.ndarray, ex: Excluded, min_ranks: int) -> Block:
    """A :class:`Block` from rows x ranks times to reach the collective (NaN: no report),
    with ``ex`` the ranks left out of the reference and the units whose spread measures the
    noise."""
    c = np.asarray(ready, dtype=np.float32)   # log times to ~1e-7: far under any noise
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log(c)
    valid = np.isfinite(x)   # (finite and > 0: the log of anything else is not finite)
    complete = bool(valid.all())
    if complete:
        nvalid = np.full(len(x), x.shape[1])
    else:
        nvalid = valid.sum(axis=1)
        x[~valid] = np.nan
    ref = _reference(x, complete, ex, min_ranks)
    t = x - ref[:, None]
    res, base, shift = _residuals(lay, t, ref)
    have = np.isfinite(res)
    every = bool(have.all())
    if every:
        rz = res
        spread = _spreads(res, ex.cols)
    else:   # units missing on some rows: each row's spread over its own scored units
        rz = np.where(have, res, np.float32(0))
        spread = np.stack([_spreads(res[i:i + 1], [
            _spread_cols(lay, ex.quiet & have[i], lv) for lv in range(3)])[0]
            for i in range(len(res))])
    r0 = rz.astype(float)
    if not complete:   # (a parent with no value: its time is the reference's)
        base = np.where(np.isfinite(base), base, np.exp(ref)[:, None])
    # the running totals' terms in res's precision (float32: expm1's SIMD loop; to ~1e-7 of
    # a few percent, and the totals add them in float64)
    exc = np.expm1(rz) if shift is None else np.expm1(np.add(rz, shift, out=shift), out=shift)
    rel = _clip(exc, -0.5, 1.0)   # (min then max: no NaN, the same values)
    np.maximum(exc, 0.0, out=exc)
    exc *= base
    return Block(nvalid >= min_ranks, ref.astype(float), r0, None if every else have,
                 rel, exc, spread)


def _reference(x: np.ndarray, complete: bool, ex: Excluded, min_ranks: int) -> np.ndarray:
    """Per row, the median log time of the ranks kept (all valid ranks when too few are
    left)."""
    keep = ex.keep
    if keep is None:
        return row_median(x)
    if complete and len(keep) >= max(min_ranks, _PARTITION_MEDIAN):
        return _median_kept(x, ex.drop)
    kept = x.take(keep, axis=1)
    ref = row_median(kept)
    few = np.isfinite(kept).sum(axis=1) < min_ranks if not complete else \
        np.full(len(x), len(keep) < min_ranks)
    if few.any():
        ref[few] = row_median(x[few])
    return ref


def _median_kept(x: np.ndarray, drop: np.ndarray) -> np.ndarray:
    """:func:`row_median` of the columns of ``x`` (finite) not in ``drop``, by partitioning
    (they are at least ``_PARTITION_MEDIAN``) without gathering them: the dropped ones set
    to -inf are the m smallest, so the kept ones' order statistic k is the row's m + k (the
    same values, and the same mean of the middle two)."""
    a = x.copy()
    a[:, drop] = -np.inf
    m, w = len(drop), x.shape[1] - len(drop)
    h = m + w // 2
    a.partition(h, axis=-1)
    hi = a[:, h]
    return hi if w % 2 else 0.5 * (a[:, :h].max(axis=-1) + hi)


def _residuals(lay: Layout, t: np.ndarray, ref: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Rows x units: each unit's log excess over its siblings' median one level up (NaN
    where the unit is not scored), the seconds one unit of relative excess costs, and what
    to add to the first for the excess over the siblings' median without the unit itself
    (None: no topology, nothing to add)."""
    rows, n = t.shape
    if lay.host is None:
        return t, np.broadcast_to(np.exp(ref)[:, None], t.shape), None
    hm, r_shift = group_median_loo(t, lay.host_members, lay.host_full, lay.host_contig)
    nh, nw = lay.n_hosts, lay.n_sw
    if lay.sw is not None:
        sm, h_shift = group_median_loo(hm, lay.sw_members, lay.sw_full, lay.sw_contig)
        if lay.sw_all_split:
            parent_h, sw_res = sm.take(lay.sw, axis=1), sm
        else:
            parent_h = np.where(lay.sw_split[lay.sw], sm[:, lay.sw], np.float32(0))
            sw_res = np.where(lay.sw_split, sm, np.float32(np.nan))
            h_shift = np.where(lay.sw_split[lay.sw], h_shift, np.float32(0))
    else:
        parent_h, sw_res = np.zeros((rows, nh), t.dtype), np.zeros((rows, 0), t.dtype)
        h_shift = np.zeros((rows, nh), t.dtype)
    if lay.host_all_split:
        host_res = hm - parent_h
        parent_r = hm.take(lay.host, axis=1)
    else:
        host_res = np.where(lay.host_split, hm - parent_h, np.float32(np.nan))
        parent_r = np.where(lay.host_split[lay.host], hm[:, lay.host], parent_h[:, lay.host])
        r_shift = np.where(lay.host_split[lay.host], r_shift, np.float32(0))
    dt = np.result_type(t, parent_r, host_res, sw_res)
    res = np.empty((rows, n + nh + nw), dt)
    np.subtract(t, parent_r, out=res[:, :n])
    res[:, n:n + nh] = host_res
    res[:, n + nh:] = sw_res
    shift = np.empty((rows, n + nh + nw), dt)
    shift[:, :n] = r_shift
    shift[:, n:n + nh] = h_shift
    shift[:, n + nh:] = 0
    up = np.empty((rows, n + nh + nw), np.result_type(parent_r, parent_h, t))
    up[:, :n] = parent_r
    up[:, n:n + nh] = parent_h
    up[:, n + nh:] = 0
    # the parent's time: exp(ref + up), with exp(up) ~ 1 + up (up is a few percent: the
    # error is up^2 / 2 of the wait, and an exp over every unit of every row is costly)
    up += 1.0
    up *= np.exp(ref)[:, None]
    return res, up, shift


def _spreads(res: np.ndarray, cols: list[np.ndarray | None]) -> np.ndarray:
    """Rows x 3 robust spreads (1.4826 x MAD) of each level's quiet units' residuals."""
    out = np.full((len(res), 3), np.nan)
    for lv, c in enumerate(cols):
        if c is None:
            continue
        v = res.take(c, axis=1)
        v -= row_median(v)[:, None]
        np.abs(v, out=v)
        out[:, lv] = _MAD_TO_SIGMA * row_median(v)
    return out


class Units:
    """Per-unit CUSUM state and the unit's own noise scale. The sums of the current
    excursion (relative excess, steps, steps over k, wait in seconds) are running totals
    kept every step, with their values when the excursion began (and at its peak) set
    aside: an excursion's sum is a difference, so a step costs a few array operations."""

    def __init__(self, n: int) -> None:
        # the CUSUM (row 0) and a second one, one noise unit stricter (row 1): its excursion
        # begins where a large shift began, not at a noise blip tens of steps before it (a
        # loaded host's jitter); both step together
        self.cusum = np.zeros((2, n))
        self.s, self.s_hi = self.cusum
        self.start = np.full(n, -1, np.int64)
        self.start_hi = np.full(n, -1, np.int64)
        self.h = np.zeros((2, n))   # the totals (relative excess, steps) when it began
        self.h_cnt = self.h[1]
        # running totals (relative excess, steps, steps over k, wait), their values where the
        # excursion began and (the first two) at its peak: rows of one array each, so a
        # step sets the rows of the units that rise or peak with one indexed copy
        self.totals, self.begin, self.at_peak = np.zeros((4, n)), np.zeros((4, n)), np.zeros((2, n))
        self.c_rel, self.c_cnt, self.c_pos, self.c_wait = self.totals
        self.b_rel, self.b_cnt, self.b_pos, self.b_wait = self.begin
        self.p_rel, self.p_cnt = self.at_peak
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

    def since(self, m: list[int]) -> np.ndarray:
        """The totals (relative excess, steps; 2 x len(m)) where the slowdown of units m
        began, as :meth:`onset` dates it: the stricter CUSUM's excursion start when it is
        sharp, else the main one's. Kept by a finding when it opens, so its slowdown is the
        mean since its ``first_step``: counted from the main start, a unit slightly slow for
        tens of steps before a large shift (a rank sharing a busy core) would read well under
        the shift."""
        return np.where(self.sharp(m), self.h[:, m], self.begin[:2, m])

    def slowdown(self, m: list[int], since: np.ndarray | None = None) -> float:
        """Mean relative excess from the excursion's start (or the totals ``since``, from
        :meth:`since`) to its peak, pooled over the units m (weighted by their steps: a
        member's fresh short excursion barely moves it)."""
        if since is None:
            since = self.begin[:2, m]
        if len(m) == 1:   # (checked every step while a finding lasts: plain floats)
            i = m[0]
            rel = float(self.p_rel[i]) - float(since[0, 0])
            return rel / max(float(self.p_cnt[i]) - float(since[1, 0]), 1.0)
        rel = float(self.p_rel[m].sum() - since[0].sum())
        return rel / max(float(self.p_cnt[m].sum() - since[1].sum()), 1.0)

    def own_scale(self, res: np.ndarray, have: np.ndarray | None, alpha: float, settle: int,
                  level_s: np.ndarray) -> np.ndarray:
        """The scale to score ``res`` with: the level's, or the unit's own when noisier; then
        learn from this step (deviations winsorised, not while the unit is flagged)."""
        s = np.maximum(level_s, self.own)
        self.ticks += 1
        if self.ticks % LEARN_EVERY and self.ticks > settle:
            return s
        self.learn(res, have, alpha, settle, s)
        return s

    def learn(self, res: np.ndarray, have: np.ndarray | None, alpha: float, settle: int,
              s: np.ndarray) -> None:
        """One step of the own scales' EWMAs (new arrays: a caller may keep the old ones)."""
        least = float(self.nobs.min()) if len(self.nobs) else 0.0
        w = alpha * LEARN_EVERY
        if 1.0 / (least + 1) > w:   # (else every unit's weight is the floor: one scalar)
            w = 1.0 / (self.nobs + 1)
            np.maximum(w, alpha * LEARN_EVERY, out=w)
        dif = res - self.mean
        d = np.abs(dif)
        np.minimum(d, 3.0 * s, out=d)
        mean = dif
        mean *= w
        mean += self.mean
        d -= self.dev
        d *= w
        d += self.dev
        # the units that learn: every scored one not flagged (flagged ones are few: their
        # old values are put back, the same as np.where over every unit)
        if have is None:
            keep = np.flatnonzero(self.flagged) if self.flagged.any() else None
        else:
            keep = np.flatnonzero(self.flagged | ~have)
        if keep is not None:
            mean[keep], d[keep] = self.mean[keep], self.dev[keep]
            nobs = self.nobs + 1.0   # (the kept ones' own: the same as adding 0.0)
            nobs[keep] = self.nobs[keep]
            self.nobs = nobs
        else:
            self.nobs = self.nobs + 1.0
        self.mean, self.dev = mean, d
        settled = least >= settle or bool((self.nobs >= settle).all())
        self.own = _MEANDEV_TO_SIGMA * d if settled else \
            np.where(self.nobs >= settle, _MEANDEV_TO_SIGMA * d, 0.0)

    def step(self, z: np.ndarray, res: np.ndarray, k: np.ndarray, blk: Block, j: int,
             step: int, cap: float) -> None:
        """One step of every unit's CUSUM and running totals: row ``j`` of ``blk``, scored
        ``z`` with drift ``k``. (Where few units change, their indices are set: np.where over
        every unit costs a branch per unit, ~80 us on 19k units when the mask is random.)"""
        have = None if blk.have is None else blk.have[j]
        new = self.cusum + z
        new[1] -= 1.0
        np.maximum(new, 0.0, out=new)
        np.minimum(new, cap, out=new)
        if have is not None:
            new = np.where(have, new, self.cusum)
        on = new > 0
        rising = self.cusum == 0
        rising &= on
        up = rising[0].nonzero()[0]
        if len(up):   # an excursion begins: its sums count from the totals so far
            self.start[up] = step
            self.begin[:, up] = self.totals.take(up, axis=1)
            self.peak[up] = 0.0
        up = rising[1].nonzero()[0]
        if len(up):
            self.start_hi[up] = step
            self.h[:, up] = self.totals[:2].take(up, axis=1)
        self.c_rel += blk.rel[j]
        self.c_cnt += 1.0 if have is None else have
        self.c_pos += res > k
        self.c_wait += blk.wait[j]
        s = new[0]
        top = s >= self.peak
        top &= on[0]
        np.maximum(self.peak, s, out=self.peak)   # (= s where top: the peak is >= 0)
        up = top.nonzero()[0]
        self.at_peak[:, up] = self.totals[:2].take(up, axis=1)
        self.cusum = new
        self.s, self.s_hi = new
