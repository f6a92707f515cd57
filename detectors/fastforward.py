"""The straggler detector's batch fast path: many steps of a prepared block at once, while
nothing happens.

Why it exists: ``goodlens detect`` replays a whole run through the streaming detector, and a
step of it is ~60 numpy calls over every unit, whose per-call cost dominates at a few
thousand ranks. Most steps of a run change nothing an operator sees: no subject crosses the
threshold, the suspect set stays, no open finding's estimate moves enough to report. For a
run of such steps only the CUSUMs and the peak tracking need a step-by-step loop (a few
calls per step); the noise scales step only where they learn, and the running totals, the
excursions' starts and peaks are read off cumulative sums afterwards. The arithmetic is the
streaming path's, value for value (a cumulative sum adds in the same order as the streaming
``+=``), so the findings are the same. The first step where something could happen (a
conservative test: anything that might report, resolve or change the suspect set) and every
step after it go the streaming way (:meth:`StragglerDetector._advance`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from goodlens.detectors.scoring import LEARN_EVERY, Block, Units, capped_scores

#: :class:`~goodlens.detectors.stragglers.StragglerDetector` (not imported: it imports this)
StragglerDetector = Any

#: Most steps at once, and at most this many step x unit cells (the cumulative totals hold
#: 4 values per cell).
_MAX_ROWS = 64
_MAX_CELLS = 1 << 18


def fast_forward(det: StragglerDetector, blk: Block, j0: int, steps: Sequence[int],
                 step_times: Sequence[float | None], off: int) -> int:
    """Advance ``det`` over rows ``j0..`` of ``blk`` (steps ``steps[off + j]``) as far as no
    row can report, resolve or move the suspect set; return how many rows it did (0: row
    ``j0`` must go the streaming way)."""
    u = det.units
    n_units = len(u.s)
    rows = min(len(blk.ref) - j0, _MAX_ROWS, max(1, _MAX_CELLS // n_units))
    if blk.have is not None or rows < 2:
        return 0
    sc = blk.scored[j0:j0 + rows]
    if not sc.all():
        rows = int(np.argmin(sc))
    opens = list(det._open.items())
    if rows < 2 or any(o.carried_at is not None or o.members is not None or not u.flagged[i]
                       for i, o in opens):
        return 0
    cfg = det.config
    state = (list(det.scales), u.ticks, u.mean, u.dev, u.nobs, u.own)
    scales, snaps, sc_rows = _scales(det, blk, j0, rows)
    res = blk.res[j0:j0 + rows]
    z, k = capped_scores(res, sc_rows, cfg.drift_k_sigmas, det._k_floor, cfg.step_cap)
    cu, peaks, top, rise = _cusums(u, z, cfg.cusum_cap * cfg.threshold_h)
    contrib = np.empty((rows + 1, 4, n_units))
    contrib[0] = u.totals
    contrib[1:, 0] = blk.rel[j0:j0 + rows]
    contrib[1:, 1] = 1.0
    np.greater(res, k, out=contrib[1:, 2])
    contrib[1:, 3] = blk.wait[j0:j0 + rows]
    tot = contrib   # summed in place: tot[j], the totals before row j (np.cumsum over the
    for j in range(1, rows + 1):   # first axis adds in the same order, but ~20x slower)
        np.add(tot[j - 1], tot[j], out=tot[j])
    e = _first_event(det, cu, tot, top, rise, opens)
    if e == 0:   # nothing done: put the noise scales' state back
        det.scales, u.ticks, u.mean, u.dev, u.nobs, u.own = state
        return 0
    # the state after row e - 1
    det.scales = scales[e - 1]
    u.ticks = state[1] + e
    later = [sn for sn in snaps if sn[0] >= e]
    if later:
        u.mean, u.dev, u.nobs, u.own = later[0][1:]
    u.cusum = cu[e - 1].copy()
    u.s, u.s_hi = u.cusum
    u.peak = peaks[e - 1].copy()
    base = off + j0
    for which, start in ((0, u.start), (1, u.start_hi)):
        idx, last = _last(rise[:e, which])
        if len(idx):
            start[idx] = np.asarray(steps[base:base + e], np.int64)[last]
            if which == 0:
                u.begin[:, idx] = tot[last, :, idx].T
            else:
                u.h_cnt[idx] = tot[last, 1, idx]
    idx, last = _last(top[:e])
    if len(idx):
        u.at_peak[:, idx] = tot[last + 1, :2, idx].T
    u.totals[:] = tot[e]
    for j in range(e):
        det._track(blk.ref[j0 + j], step_times[base + j])
    det.updates += e
    det._last_step = int(steps[base + e - 1])
    det._hot = cu[e - 1, 0] > cfg.suspect_fraction * cfg.threshold_h
    return e


def _scales(det: StragglerDetector, blk: Block, j0: int, rows: int
            ) -> tuple[list[list[float]], list[tuple], np.ndarray]:
    """The noise scales of rows j0.. (as :meth:`StragglerDetector._advance` computes them):
    the levels' after each row, the own scales' state before each row where they learn, and
    rows x units of the scale each unit is scored with."""
    cfg, u = det.config, det.units
    levels = np.array([_levels(det, blk, j0 + j) for j in range(rows)])
    scales = [list(x) for x in levels[:, 3:]]
    lv = levels[:, :3].take(det._level, axis=1)
    s = np.empty_like(lv)
    snaps = []
    for j in range(rows):
        np.maximum(lv[j], u.own, out=s[j])
        u.ticks += 1
        if u.ticks % LEARN_EVERY and u.ticks > cfg.own_min_steps:
            continue
        snaps.append((j, u.mean, u.dev, u.nobs, u.own))
        u.learn(blk.res[j0 + j], None, cfg.own_alpha, cfg.own_min_steps, s[j])
    return scales, snaps, s


def _levels(det: StragglerDetector, blk: Block, j: int) -> list[float]:
    """One row's level scales, then the detector's level state after it."""
    return det._level_scales(blk.spread_rows[j]) + list(det.scales)


def _cusums(u: Units, z: np.ndarray, cap: float
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of both CUSUMs, of the peak after each row, whether the row is at its
    excursion's peak, and whether each CUSUM's excursion begins at the row."""
    rows, n = z.shape
    cu = np.empty((rows, 2, n))
    prev = u.cusum
    for j in range(rows):
        new = cu[j]
        np.add(prev, z[j], out=new)
        new[1] -= 1.0
        np.maximum(new, 0.0, out=new)
        np.minimum(new, cap, out=new)
        prev = new
    on = cu > 0
    rise = np.empty_like(on)
    np.equal(u.cusum, 0, out=rise[0])
    np.equal(cu[:-1], 0, out=rise[1:])
    rise &= on
    keep = ~rise[:, 0]
    peaks = np.empty((rows, n))
    top = np.empty((rows, n), bool)
    peak = u.peak
    for j in range(rows):
        p = peaks[j]
        np.multiply(peak, keep[j], out=p)   # (0 where an excursion begins: the peak is >= 0)
        np.greater_equal(cu[j, 0], p, out=top[j])
        np.maximum(p, cu[j, 0], out=p)
        peak = p
    top &= on[:, 0]
    return cu, peaks, top, rise


def _last(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(units with a True row, the last such row of each)."""
    idx = mask.any(axis=0).nonzero()[0]
    if not len(idx):
        return idx, idx
    sub = mask[::-1, idx]
    return idx, len(mask) - 1 - sub.argmax(axis=0)


def _first_event(det: StragglerDetector, cu: np.ndarray, tot: np.ndarray, top: np.ndarray,
                 rise: np.ndarray, opens: list) -> int:
    """The first row where the streaming path could do more than step the state: the suspect
    set moves, a subject not flagged is over the threshold, a flagged one is back to 0, or an
    open finding's estimate moved enough (or its action changed) to be reported."""
    cfg, u = det.config, det.units
    s = cu[:, 0]
    hot = s > cfg.suspect_fraction * cfg.threshold_h
    ev = ((hot | u.flagged) != det._sus).any(axis=1)
    fl = u.flagged.nonzero()[0]
    ev |= ((s > cfg.threshold_h) & ~u.flagged).any(axis=1)
    if len(fl):
        ev |= (s[:, fl] == 0).any(axis=1)
    rows = len(s)
    at = np.arange(rows)
    for i, o in opens:
        rb = np.maximum.accumulate(np.where(rise[:, 0, i], at, -1))
        b = np.where(rb >= 0, tot[np.maximum(rb, 0), :, i].T, u.begin[:, i, None])
        rp = np.maximum.accumulate(np.where(top[:, i], at, -1))
        p = np.where(rp >= 0, tot[np.maximum(rp, 0) + 1, :2, i].T, u.at_peak[:, i, None])
        slow = (p[0] - b[0]) / np.maximum(p[1] - b[1], 1.0)
        lasted = tot[1:, 1, i] - b[1]
        evict = (slow >= cfg.evict_min_slowdown) & (lasted >= cfg.evict_min_steps)
        moved = np.abs(slow - o.slow) >= cfg.update_change * max(abs(o.slow), cfg.drift_k)
        due = det.updates + at + 1 - o.emitted_at >= cfg.update_every
        ev |= due & (moved | (evict != (o.action == "evict")))
    return int(np.argmax(ev)) if ev.any() else rows
