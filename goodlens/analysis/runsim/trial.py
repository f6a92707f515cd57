"""The simulator's trial loop: one run, attempt by attempt, in the buckets of accounting.

Why it exists: users plan a checkpoint interval, a hot-spare count or an elastic policy before
the next run ("what if"), and the rest of goodlens needs runs whose true breakdown is known.
One trial is event-driven at the granularity of failures, checkpoints and straggler episodes,
never per step (steps between events are counted arithmetically), so a 54-day, 16,384-GPU run
takes milliseconds. Every second lands in the buckets of ``goodlens.analysis.accounting``, by the
same
rules (docs/accounting.md), so a trace written from a trial reports the same breakdown:

- the first step of an attempt: its excess over the attempt's median step is restart.warmup;
- a failure: the steps since the checkpoint that survives it are recompute, as is the partial
  step (the time after the last step, up to one median step); the rest until detection is
  restart.detection (the tail is painted without layers, as accounting does, so a save at that
  boundary lands there too); then queue until the next attempt, its init, restore, warm-up;
- steps are rolled back only once a later attempt completes a step (a run that ends while
  restarting keeps them); blocking saves between steps are checkpoint_stall even when the steps
  around them are rolled back; a lost step's straggler wait is recompute;
- the run is stopped at ``duration_s``: a step in flight then is ``other`` (shutdown), a save
  in progress checkpoint_stall, a restart in progress its own part.

Model choices (one place): failures hit only while an attempt runs (start-up included); a
node's failure during downtime is absorbed by the scheduler. Causes follow the Llama 3 table
(``FAILURE_CAUSES``, with our hang probability: network and NCCL timeouts mostly hang, GPU
memory and power mostly crash). Queue waits are lognormal by default (heavy-tailed scheduler
waits; ``queue_dist``), with mean ``queue_s``. Checkpoints are taken every K = interval/step
steps at step counts that are multiples of K; a checkpoint survives a failure once its durable
write finished (``write_s`` after the save starts, in every mode), a memory copy once its stall
ended. Planned interruptions and evictions take effect at the next step end: a durable save
(``write_s``, shown in restart.queue because accounting paints the time after ``preempted``
so), then the queue (or a spare). A tiered restore comes from a peer's memory copy when the
failure is single-node and that copy is newer than the durable one. Elastic: ``shrink`` goes
on with n-1 nodes right after detection (``reconfig_s`` as init, the usual restore), step time
x N/n (same global batch), and grows back at a step end when the node returns after
``repair_s`` (the save due there, then ``reconfig_s`` as init; nothing lost, no restore);
``spares`` swap a free spare in (``spare_swap_s`` instead of the queue), the failed node
becoming a spare again after ``repair_s``; a wide failure counts as one node for both.
Straggler wait per step is max(noise, worst episode): noise is E[max - median] of the per-rank
lognormal compute over all ranks (a seeded Monte Carlo of >= 16 steps, cached per config), and
an episode slowing k ranks by s costs c0 ((1+s) E[max of k] - E[median]), c0 the median
compute; a degraded link slows every node behind its switch.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from goodlens.analysis.accounting import BUCKETS, RESTART_PARTS
from goodlens.analysis.runsim.config import (
    CAUSE_NAMES,
    DAY,
    FAILURE_CAUSES,
    INF,
    STRAGGLER_CAUSES,
    SimConfig,
    SimResult,
)


@dataclass
class _Prep:
    km: int
    kd: int
    cm: float
    cdd: float
    c0: float
    w0: float
    med: float
    cause_cdf: list[float]
    hang: list[float]
    wide: list[float]
    sc_cdf: np.ndarray
    sc_m: np.ndarray
    sc_nodes: np.ndarray


@functools.lru_cache(maxsize=32)
def _noise(ranks: int, sigma: float, node: int, switch: int) -> tuple[float, float, float, float]:
    """E[max - median], E[median], E[max of a node's ranks], E[max of a switch's ranks] of
    per-rank lognormal(0, sigma) compute factors: a seeded Monte Carlo over >= 16 steps."""
    if sigma == 0:
        return 0.0, 1.0, 1.0, 1.0
    rng = np.random.default_rng(0x5EED)
    steps = max(16, min(1024, (1 << 20) // ranks))
    x = np.exp(sigma * rng.standard_normal((steps, ranks)))
    med = np.median(x, axis=1)

    def group_max(g: int) -> float:
        k = max(g, ranks // g * g)
        xs = x if k <= ranks else np.exp(sigma * rng.standard_normal((steps, k)))
        return float(xs[:, :k].reshape(steps, -1, g).max(axis=2).mean())
    return float(np.mean(x.max(axis=1) - med)), float(med.mean()), group_max(node), \
        group_max(switch)


def _prepare(c: SimConfig) -> _Prep:
    k = max(1, round(c.interval_s / c.step_s))
    if c.ckpt_mode == "tiered":
        km = max(1, round(c.memory_interval_s / c.step_s))
        kd = km * max(1, round(k / km))
        cm, cdd = c.memory_stall_s, max(c.memory_stall_s, c.snapshot_s)
    else:
        km = kd = k
        cm, cdd = 0.0, (c.write_s if c.ckpt_mode == "sync" else c.snapshot_s)
    c0 = c.compute_fraction * c.step_s
    sw_nodes = min(c.nodes_per_switch, c.nodes)
    wait, med, m_node, m_sw = _noise(c.nodes * c.gpus_per_node, float(c.compute_noise_sigma),
                                     c.gpus_per_node, sw_nodes * c.gpus_per_node)
    counts = np.array([n for _, n, _, _ in FAILURE_CAUSES], dtype=float)
    hang = [(c.hang_prob or {}).get(name, h) for name, _, h, _ in FAILURE_CAUSES]
    wf = c.wide_failure_fraction
    wide = [float(w) if wf is None else float(wf) for _, _, _, w in FAILURE_CAUSES]
    names = list(STRAGGLER_CAUSES)
    sw = np.array([float(c.straggler_causes.get(s, 0.0)) for s in names])
    is_link = np.array([s == "link" for s in names])
    return _Prep(km, kd, cm, cdd, c0, c0 * wait, med,
                 (np.cumsum(counts) / counts.sum()).tolist()[:-1], hang, wide,
                 np.cumsum(sw / sw.sum())[:-1], np.where(is_link, m_sw, m_node),
                 np.where(is_link, sw_nodes, 1))


class _Draws:
    """Uniforms and normals drawn in blocks (scalar Generator calls are slow)."""

    __slots__ = ("iu", "iz", "rng", "u", "z")

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng, self.u, self.z, self.iu, self.iz = rng, [], [], 0, 0

    def uni(self) -> float:
        if self.iu >= len(self.u):
            self.u, self.iu = self.rng.random(512).tolist(), 0
        self.iu += 1
        return self.u[self.iu - 1]

    def exp(self) -> float:
        return -math.log(1.0 - self.uni())

    def norm(self) -> float:
        if self.iz >= len(self.z):
            self.z, self.iz = self.rng.standard_normal(256).tolist(), 0
        self.iz += 1
        return self.z[self.iz - 1]


def _wmedian(items: list[tuple[float, int]]) -> float:
    """np.median of values given as (value, count) pairs."""
    if len(items) == 2 and items[1][1] >= 2:
        return items[1][0]  # first step + >= 2 equal steps: the median is the latter
    items = sorted(items)
    total = sum(k for _, k in items)

    def at(ix: int) -> float:
        pos = 0
        for v, k in items:
            pos += k
            if ix < pos:
                return v
        return items[-1][0]
    return (at((total - 1) // 2) + at(total // 2)) / 2


def _trial(c: SimConfig, p: _Prep, rng: np.random.Generator,
           timeline: list | None = None) -> SimResult:
    """One run, attempt by attempt (rules in the module docstring). ``timeline`` (tests,
    :mod:`goodlens.analysis.runsim.tracegen`) receives each attempt's start-up, pieces and end,
    enough to
    rebuild its trace: also the failure (``fail``: cause, hang, wide), whether the restore
    read a memory copy (``from_mem``), the evicted episodes (``evicted``) and every
    straggler episode (``episodes``: onset, end, slowdown, cause, nodes)."""
    T, N, gpn, step_s, wb = c.duration_s, c.nodes, c.gpus_per_node, c.step_s, c.elastic
    km, kd, cm, cdd, w0 = p.km, p.kd, p.cm, p.cdd, p.w0
    j, tiered, evict, delay = kd // km, c.ckpt_mode == "tiered", c.evict_stragglers, \
        c.evict_delay_steps
    dr = _Draws(rng)
    a = dict.fromkeys((*BUCKETS, *RESTART_PARTS, "gpu"), 0.0)
    cnt = dict.fromkeys(("failures", "hangs", "wide_failures", "startup_failures", "planned",
                         "evictions", "evicted_nodes", "checkpoints", "memory_checkpoints",
                         "memory_restores", "attempts", "shrinks", "grows", "spare_swaps",
                         "straggler_episodes"), 0)
    by_cause = [0] * len(FAILURE_CAUSES)
    # straggler episodes and planned interruptions, drawn up front
    n_ep = int(rng.poisson(c.straggler_per_node_day * N / DAY * T))
    cnt["straggler_episodes"] = n_ep
    s0 = np.sort(rng.uniform(0, T, n_ep))
    dur = c.straggler_duration_median_s * np.exp(c.straggler_duration_sigma *
                                                 rng.standard_normal(n_ep))
    slow = c.straggler_slowdown_median * np.exp(c.straggler_slowdown_sigma *
                                                rng.standard_normal(n_ep))
    why = np.searchsorted(p.sc_cdf, rng.random(n_ep), side="right")
    ew = np.maximum(0.0, p.c0 * ((1 + slow) * p.sc_m[why] - p.med)).tolist()
    ep_nodes, ev_ok = p.sc_nodes[why].tolist(), (slow >= c.evict_min_slowdown).tolist()
    # for trace mode (goodlens.analysis.runsim.tracegen)
    episodes = None if timeline is None else dict(
        onset=s0.tolist(), end=(s0 + dur).tolist(), slowdown=slow.tolist(),
        cause=np.array(list(STRAGGLER_CAUSES))[why].tolist(), nodes=ep_nodes)
    fail_info: list = [None, False, False]  # the last failure's cause, hang, wide
    bt = np.concatenate([s0, s0 + dur])
    order = np.argsort(bt, kind="stable")
    bound_t = bt[order].tolist()
    bound_i = np.concatenate([np.arange(n_ep), -1 - np.arange(n_ep)])[order].tolist()
    planned = np.sort(rng.uniform(0, T, rng.poisson(c.planned_per_day / DAY * T))).tolist()
    nb, npl = len(bound_t), len(planned)
    if c.queue_dist == "lognormal" and c.queue_s > 0:
        mu, sig = math.log(c.queue_s) - c.queue_sigma ** 2 / 2, c.queue_sigma

        def qdraw() -> float:
            return math.exp(mu + sig * dr.norm())
    else:
        def qdraw() -> float:
            return c.queue_s * dr.exp()
    weib = c.failure_dist == "weibull"
    wscale = c.node_mtbf_s / math.gamma(1 + 1 / c.weibull_shape)

    def wdraw(k: int) -> np.ndarray:
        return wscale * (-np.log1p(-rng.random(k))) ** (1 / c.weibull_shape)
    node_next = wdraw(N) if weib else None
    slot = 0

    def G(k: int) -> float:  # total stall of the saves at counts 1..k
        q = k // kd
        return cm * (k // km - q) + cdd * q

    def fc(m: int, d: float) -> float:  # end of step count m, from a reference, in a piece
        k = m - 1
        q = k // kd
        return m * d + cm * (k // km - q) + cdd * q

    def stall(k: int) -> float:
        return cdd if k % kd == 0 else (cm if k % km == 0 else 0.0)

    def count_at(S: int, tau: float, d: float, t: float) -> int:
        """Last step count completed by t in a piece (reference count S ended at tau)."""
        X = t - tau + fc(S, d)
        ls, lm = kd * d + (j - 1) * cm + cdd, km * d + cm
        q = int((X - d) // ls)
        x = X - q * ls
        i = int((x - d) // lm)
        i = 0 if i < 0 else (j - 1 if i >= j else i)
        s = int((x - i * lm) // d)
        m = q * kd + i * km + (km if s > km else s)
        while fc(m + 1, d) <= X:
            m += 1
        while m > S and fc(m, d) > X:
            m -= 1
        return m if m > S else S

    def locate(t: float) -> tuple[int, tuple]:
        for pc in reversed(pieces):
            if pc[1] <= t:
                return count_at(pc[0], pc[1], pc[2], t), pc
        return R, (R, t, 1.0, 0.0)

    def span(part: str, lo: float, hi: float) -> None:
        hi = min(hi, T)
        if hi > lo:
            a[part] += hi - lo

    def startup(t0: float, e: float, tf: float = INF) -> None:
        """Init, then restore (until detection if the failure at tf cut it short)."""
        rs = t0 + init_c
        r = 0.0 if tf < rs or e <= rs else \
            (e if tf < rs + restore_c else min(e, rs + restore_c)) - rs
        a["restore"] += r
        a["init"] += e - t0 - r

    def boundary() -> int:
        nonlocal bi, cur_w
        i = bound_i[bi]
        bi += 1
        if i >= 0:
            active[i] = ew[i]
        else:
            i = -1 - i
            active.pop(i, None)
            dues.pop(i, None)
        cur_w = max(w0, max(active.values())) if active else w0
        return i

    def rollback(r: int) -> None:
        for e in ledger:
            if e[1] > r:
                lo = max(e[0], r)
                a["recompute"] += (e[1] - lo) * (e[2] + e[3])
                e[1] = lo

    def flush(upto: float) -> None:
        for e in ledger:
            if e[0] < upto:
                k = min(e[1], upto) - e[0]
                a["productive"] += k * e[3]
                a["straggler_wait"] += k * e[2]
                a["gpu"] += k * e[3] * e[4]
                e[0] += k
        ledger[:] = [e for e in ledger if e[1] > e[0]]

    def finalize(m_end: int, save_at_end: bool) -> float:
        """The attempt's steps into the ledger; warm-up and stalls; its median step."""
        items, ent = [(dur0, 1)], [[R, R + 1, 0.0, 0.0, gpus]]
        for i, pc in enumerate(pieces):
            hi = min(pieces[i + 1][0] if i + 1 < len(pieces) else m_end, m_end)
            if hi > pc[0]:
                items.append((pc[2], hi - pc[0]))
                ent.append([pc[0], hi, pc[3], pc[2] - pc[3], gpus])
        med = _wmedian(items)
        warm = max(0.0, dur0 - med)
        sw0 = min(w_first, dur0 - warm)
        ent[0][2:4] = sw0, dur0 - warm - sw0
        a["warmup"] += warm
        ledger.extend(ent)
        a["checkpoint_stall"] += G(m_end - 1) - G(R)
        last = m_end if save_at_end else m_end - 1
        cnt["checkpoints"] += last // kd - R // kd
        cnt["memory_checkpoints"] += (last // km - R // km) if tiered else 0
        return med

    def rec(kind: str, **kw: Any) -> None:
        if timeline is not None:
            timeline.append(dict(kind=kind, t=t, init=init_c, restore=restore_c, R=R, n=n,
                                 dur0=dur0, w_first=w_first, pieces=list(pieces),
                                 from_mem=rmem, episodes=episodes, **kw))

    def fail_draw() -> tuple[float, bool]:
        ci = bisect.bisect_right(p.cause_cdf, dr.uni())
        by_cause[ci] += 1
        hang, wide = dr.uni() < p.hang[ci], dr.uni() < p.wide[ci]
        cnt["failures"] += 1
        cnt["hangs"] += hang
        cnt["wide_failures"] += wide
        fail_info[:] = CAUSE_NAMES[ci], hang, wide
        return (c.detect_hang_s if hang else c.detect_crash_s), wide

    def take_spares(t: float, k: int) -> bool:
        free = [i for i, x in enumerate(spare_busy) if x <= t]
        if wb != "spares" or len(free) < k:
            return False
        for i in free[:k]:
            spare_busy[i] = t + c.repair_s
        cnt["spare_swaps"] += 1
        return True

    def full_world() -> None:
        nonlocal n
        if wb == "shrink":
            n = N
            grows.clear()
            if weib:
                node_next[np.isinf(node_next)] = -1.0

    def relaunch(t_fail: float, t_det: float, from_mem: bool) -> float:
        nonlocal n, init_c, restore_c, rmem
        if take_spares(t_fail, 1):
            gap, init_c = c.spare_swap_s, c.init_s
        elif wb == "shrink" and n > N - c.shrink_max_nodes:
            n -= 1
            bisect.insort(grows, t_fail + c.repair_s)
            gap, init_c = 0.0, c.reconfig_s
            cnt["shrinks"] += 1
        else:
            gap, init_c = qdraw(), c.init_s
            full_world()
        if weib:
            node_next[slot] = np.inf if n < N else -1.0  # shrunk: the slot waits for repair
        span("queue", t_det, t_det + gap)
        restore_c = 0.0 if R == 0 else (c.memory_restore_s if from_mem else c.restore_s)
        cnt["memory_restores"] += from_mem and R > 0
        rmem = from_mem and R > 0
        return t_det + gap

    t, R, D, Mm, n, bi, pli, cur_w = 0.0, 0, 0, 0, N, 0, 0, w0
    init_c, restore_c, dur0, w_first, gpus, rmem = c.init_s, 0.0, 0.0, 0.0, 0, False
    active: dict[int, float] = {}
    dues: dict[int, float] = {}
    grows: list[float] = []
    spare_busy = [0.0] * c.spares
    ledger: list[list] = []
    pieces: list[tuple] = []
    while t < T:
        cnt["attempts"] += 1
        gpus, base = n * gpn, step_s * N / n
        if weib:
            stale = node_next <= t
            if stale.any():
                node_next[stale] = t + wdraw(int(stale.sum()))
            slot = int(node_next.argmin())
            t_fail = float(node_next[slot])
        else:
            t_fail = t + dr.exp() * c.node_mtbf_s / n
        ts0 = t + init_c + restore_c
        while bi < nb and bound_t[bi] <= ts0:
            boundary()
        w_first, dur0 = cur_w, base + cur_w + c.warmup_s
        t1 = ts0 + dur0
        if t_fail < t1 or t1 > T:  # no step completed: start-up is init/restore, then queue
            pieces = []
            if t_fail >= T:
                startup(t, T)
                rec("end")
                break
            det_s, wide = fail_draw()
            cnt["startup_failures"] += 1
            startup(t, min(t_fail + det_s, T), t_fail)
            rec("failed", t_det=t_fail + det_s, t_fail=t_fail, fail=tuple(fail_info))
            Mm = D if wide else Mm
            R = Mm if tiered else D
            t = relaunch(t_fail, t_fail + det_s, tiered and Mm > D)
            continue
        a["init"] += init_c
        a["restore"] += restore_c
        rollback(R)  # a later attempt's first step rolls earlier ones back to it
        flush(D)
        while bi < nb and bound_t[bi] <= t1:
            boundary()
        pieces = [(R + 1, t1, base + cur_w, cur_w)]
        dues.clear()
        if evict:
            dues.update({i: t1 + delay * (base + cur_w) for i in active if ev_ok[i]})
        while pli < npl and planned[pli] < t:
            pli += 1  # fell in downtime: absorbed
        kind, m_end, t_end = "", 0, 0.0
        while True:
            tb = bound_t[bi] if bi < nb else INF
            tp = planned[pli] if pli < npl else INF
            te = min(dues.values()) if dues else INF
            tg = grows[0] if grows and n < N else INF
            ts = min(tp, te, tg)
            tx = min(t_fail, T)
            if tx <= tb and tx <= ts:
                break
            if tb < ts:  # straggler wait changes from the next step start on
                i = boundary()
                dn = base + cur_w
                if evict and i in active and ev_ok[i]:
                    dues[i] = tb + delay * dn
                last = pieces[-1]
                if dn != last[2]:
                    m, pc = locate(tb)
                    em = pc[1] + fc(m, pc[2]) - fc(pc[0], pc[2])
                    sk = stall(m)
                    ref, eref = (m, em) if em + sk > tb else (m + 1, em + sk + pc[2])
                    if ref == last[0]:
                        pieces[-1] = (ref, last[1], dn, cur_w)
                    else:
                        pieces.append((ref, eref, dn, cur_w))
                continue
            if ts < t1:
                m_end, t_end = R + 1, t1
            else:  # planned, eviction or grow-back: at the end of the step in flight
                m, pc = locate(ts)
                m_end = m + 1
                t_end = pc[1] + fc(m_end, pc[2]) - fc(pc[0], pc[2])
            kind = "planned" if ts == tp else ("evict" if ts == te else "grow")
            if tx < t_end + (stall(m_end) if kind == "grow" else 0.0):
                kind = ""
            break
        if not kind:  # failure, or the end of the run
            m, pc = locate(tx)
            em = pc[1] + fc(m, pc[2]) - fc(pc[0], pc[2])
            med = finalize(m, True)
            if t_fail >= T:
                sk = min(stall(m), T - em)
                a["checkpoint_stall"] += sk
                a["other"] += T - em - sk
                rec("end", m_end=m)
                break
            det_s, wide = fail_draw()
            t_det = t_fail + det_s
            tail = min(t_det, T) - em
            rec("failed", m_end=m, t_det=t_det, t_fail=t_fail, fail=tuple(fail_info))
            a["recompute"] += min(med, tail)
            a["detection"] += tail - min(med, tail)
            k = locate(t_fail - c.write_s)[0] // kd * kd
            D = max(D, k) if k > R else D
            if tiered:
                k = locate(t_fail - c.memory_stall_s)[0] // km * km
                Mm = max(Mm, k) if k > R else Mm
            Mm = D if wide else max(Mm, D)
            R = Mm if tiered else D
            flush(D)
            t = relaunch(t_fail, t_det, tiered and Mm > D)
            continue
        finalize(m_end, kind == "grow")
        rec(kind, m_end=m_end, t_end=t_end)
        if kind == "grow":  # graceful resize: the save at this step, then reconfiguration
            sk = stall(m_end)
            a["checkpoint_stall"] += sk
            D = max(D, m_end // kd * kd) if m_end // kd * kd > R else D
            Mm = max(Mm, D, m_end // km * km if tiered and m_end // km * km > R else 0)
            R = m_end
            flush(D)
            grows.pop(0)
            n += 1
            cnt["grows"] += 1
            if weib:
                node_next[int(np.argmax(np.isinf(node_next)))] = -1.0
            span("init", t_end + sk, t_end + sk + c.reconfig_s)
            t, init_c, restore_c, rmem = t_end + sk + c.reconfig_s, 0.0, 0.0, False
            continue
        D = Mm = R = m_end  # planned or eviction: a durable save on notice
        flush(D)
        cnt["checkpoints"] += 1
        if kind == "planned":
            pli += 1
            cnt["planned"] += 1
            gap = c.write_s + qdraw()
            full_world()
        else:
            ids = [i for i, x in dues.items() if x <= t_end]
            k = sum(ep_nodes[i] for i in ids)
            for i in ids:
                active.pop(i, None)
                dues.pop(i, None)
            cur_w = max(w0, max(active.values())) if active else w0
            cnt["evictions"] += 1
            cnt["evicted_nodes"] += k
            if timeline is not None:
                timeline[-1]["evicted"] = ids
            if take_spares(t_end, k):
                gap = c.write_s + c.spare_swap_s
            else:
                gap = c.write_s + qdraw()
                full_world()
        span("queue", t_end, t_end + gap)
        t, init_c, restore_c, rmem = t_end + gap, c.init_s, c.restore_s, False
    flush(INF)
    parts = {k: a[k] for k in RESTART_PARTS}
    a["restart"] = sum(parts.values())
    alloc = (N + (c.spares if wb == "spares" else 0)) * gpn * T
    return SimResult(T, a["productive"] / T, a["gpu"] / alloc, {b: a[b] for b in BUCKETS},
                     parts, cnt, dict(zip(CAUSE_NAMES, by_cause)))
