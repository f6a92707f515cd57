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

from goodlens.detectors.scoring import LEARN_EVERY, Block, Units, _clip, capped_scores

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
    rows = min(len(blk.ref) - j0, _max_rows(n_units))
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
    tot = _buffer(det, rows + 1, n_units)
    tot[0] = u.totals
    tot[1:, 0] = blk.rel[j0:j0 + rows]
    tot[1:, 1] = 1.0
    np.greater(res, k, out=tot[1:, 2])
    tot[1:, 3] = blk.wait[j0:j0 + rows]
    # summed in place: tot[j], the totals before row j (np.cumsum over the first axis adds
    for j in range(1, rows + 1):   # in the same order, but ~20x slower)
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
                u.h[:, idx] = tot[last, :2, idx].T
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


def _max_rows(n_units: int) -> int:
    """The most rows one call advances over ``n_units`` units."""
    return min(_MAX_ROWS, max(1, _MAX_CELLS // n_units))


def _buffer(det: StragglerDetector, rows: int, n_units: int) -> np.ndarray:
    """rows x 4 x units of scratch for the running totals, kept by the detector (nothing
    holds a view of it after a call: the state takes copies) and sized for the most rows a
    call can take (<= ``_MAX_CELLS`` cells plus one row); a fresh one each call was
    page-faulted in again."""
    buf = det._ff_totals
    if buf is None or len(buf) < rows or buf.shape[2] != n_units:
        buf = det._ff_totals = np.empty((_max_rows(n_units) + 1, 4, n_units))
    return buf[:rows]


def _scales(det: StragglerDetector, blk: Block, j0: int, rows: int
            ) -> tuple[list[list[float]], list[tuple], np.ndarray]:
    """The noise scales of rows j0.. (as :meth:`StragglerDetector._advance` computes them):
    the levels' after each row, the own scales' state before each row where they learn, and
    rows x units of the scale each unit is scored with."""
    cfg, u = det.config, det.units
    levels = np.array([_levels(det, blk, j0 + j) for j in range(rows)])
    scales = [list(x) for x in levels[:, 3:]]
    s = np.empty((rows, len(u.s)))
    for lv, a, b in det._level_cols:   # (units grouped by level: no gather)
        s[:, a:b] = levels[:, lv:lv + 1]
    snaps = []
    lo = 0   # rows lo..j share the own scales: one maximum for them all
    for j in range(rows):
        u.ticks += 1
        if u.ticks % LEARN_EVERY and u.ticks > cfg.own_min_steps:
            continue
        np.maximum(s[lo:j + 1], u.own, out=s[lo:j + 1])
        lo = j + 1
        snaps.append((j, u.mean, u.dev, u.nobs, u.own))
        u.learn(blk.res[j0 + j], None, cfg.own_alpha, cfg.own_min_steps, s[j])
    np.maximum(s[lo:], u.own, out=s[lo:])
    return scales, snaps, s


def _levels(det: StragglerDetector, blk: Block, j: int) -> list[float]:
    """One row's level scales, then the detector's level state after it."""
    return det._level_scales(blk.spread_rows[j]) + list(det.scales)


def _cusums(u: Units, z: np.ndarray, cap: float
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of both CUSUMs, of the peak after each row, whether the row is at its
    excursion's peak, and whether each CUSUM's excursion begins at the row. (Three calls a
    row: ``clip`` is the streaming path's max then min, value for value, no NaN here.)"""
    rows, n = z.shape
    cu = np.empty((rows, 2, n))
    prev = u.cusum
    for j in range(rows):
        new = cu[j]
        np.add(prev, z[j], out=new)
        hi = new[1]
        np.subtract(hi, 1.0, out=hi)
        _clip(new, 0.0, cap, out=new)
        prev = new
    on = cu > 0
    rise = np.empty_like(on)
    np.equal(u.cusum, 0, out=rise[0])
    np.equal(cu[:-1], 0, out=rise[1:])
    rise &= on
    keep = np.logical_not(rise[:, 0]).astype(float)   # (1.0 or 0.0: the same product)
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
    at = np.arange(1, len(mask) + 1, dtype=np.int16 if len(mask) < 1 << 15 else np.int64)
    last = (mask * at[:, None]).max(axis=0, initial=0)   # (row + 1 where True, else 0)
    idx = last.nonzero()[0]
    return idx, last[idx].astype(np.int64) - 1


def _first_event(det: StragglerDetector, cu: np.ndarray, tot: np.ndarray, top: np.ndarray,
                 rise: np.ndarray, opens: list) -> int:
    """The first row where the streaming path could do more than step the state: the suspect
    set moves, a subject not flagged is over the threshold, a flagged one is back to 0, an
    open finding's estimate moved enough (or its action changed) to be reported, or its job
    slowdown and wait are due to be compared (once every ``update_every`` steps)."""
    cfg, u = det.config, det.units
    s, rows = cu[:, 0], len(cu)
    # per unit: one neither flagged nor suspect moves the set when hot (over the threshold
    # implies hot: the threshold's share is <= 1); a suspect one not flagged when no longer
    # hot or over the threshold; a flagged one not suspect at every row
    thr = cfg.suspect_fraction * cfg.threshold_h
    hot = s > thr
    special = u.flagged | det._sus
    if special.any():
        sp = special.nonzero()[0]
        hot[:, sp] = False
        ev = hot.any(axis=1)
        sus = (det._sus & ~u.flagged).nonzero()[0]
        if len(sus):
            ss = s[:, sus]
            ev |= ((ss <= thr) | (ss > cfg.threshold_h)).any(axis=1)
        if (u.flagged & ~det._sus).any():
            ev[:] = True
    else:
        ev = hot.any(axis=1)
    fl = u.flagged.nonzero()[0]
    if len(fl):
        ev |= (s[:, fl] == 0).any(axis=1)
    at = np.arange(rows)
    for i, o in opens:
        rb = np.maximum.accumulate(np.where(rise[:, 0, i], at, -1))
        b = np.where(rb >= 0, tot[np.maximum(rb, 0), :, i].T, u.begin[:, i, None])
        rp = np.maximum.accumulate(np.where(top[:, i], at, -1))
        p = np.where(rp >= 0, tot[np.maximum(rp, 0) + 1, :2, i].T, u.at_peak[:, i, None])
        sr, sc = (b[0], b[1]) if o.since is None else (o.since[0, 0], o.since[1, 0])
        slow = (p[0] - sr) / np.maximum(p[1] - sc, 1.0)
        lasted = tot[1:, 1, i] - b[1]
        evict = (slow >= cfg.evict_floor(o.action)) & (lasted >= cfg.evict_min_steps)
        moved = cfg.moved(slow, o.slow)
        due = det.updates + at + 1 - o.emitted_at >= cfg.update_every
        ev |= due & (moved | (evict != (o.action == "evict")))
        ev |= det.updates + at + 1 - o.job_checked >= cfg.update_every  # its job slowdown
    return int(np.argmax(ev)) if ev.any() else rows
