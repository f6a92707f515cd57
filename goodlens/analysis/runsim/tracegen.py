"""Trace mode of the run simulator: one trial written as a real goodlens trace, with its truth.

Why it exists: accounting, the detectors and the dashboard must be checked against runs whose
true breakdown and planted stragglers are known, and users want realistic traces to replay.
:func:`generate_trace` runs one trial of :mod:`goodlens.analysis.runsim.trial` with its
``timeline`` hook
and writes what an exporter and a launcher would have recorded (docs/trace-format.md): one
row per rank per step, and the events of each attempt. The trace is what happened; the truth
is the breakdown ``goodlens report`` must find in it.

Model (on top of the simulator's, which fixes every step's start and duration):

- ranks are ``n x gpus_per_node`` for an attempt on n nodes (a shrunk world keeps nodes
  0..n-1); rank r runs on host ``node-%04d`` % (r // gpus_per_node); node k sits behind switch
  k // nodes_per_switch (in the run's tags, with ``spare_gpus``);
- all ranks of a step report the step's duration (synchronous training); rank compute is the
  median compute (``compute_fraction`` of the healthy step, times N/n when shrunk) times
  per-rank lognormal noise (``compute_noise_sigma``), a slow diurnal drift of every rank
  (``diurnal_amplitude``), times (1 + slowdown) of every straggler episode that covers the
  rank (the step starts in [onset, end)): nested episodes compound, as the simulator
  compounds them in the step's duration; the first step of an attempt
  adds the warm-up to every rank; data wait is about 0.5% of the step; compute is capped so
  that collective wait (duration - compute - data wait) is never negative;
- a straggler episode slows one GPU (thermal, ECC: subject ``rank``), one node (noisy
  neighbour: ``node``) or every node behind one switch (degraded link: ``switch``), drawn
  uniformly by the simulator (:mod:`goodlens.analysis.runsim.episodes`; its placement stream
  then draws the noise here); an evicted episode ends at its eviction;
- events come from a ``launcher`` source (attempts, failures, preemptions, resizes,
  evictions), rank 0's exporter (init, checkpoints, restores) and a background checkpoint
  writer (durable ends of asynchronous saves); node 0 is the reference clock, other hosts'
  step rows are offset by up to ``clock_skew_s``; nothing recorded after ``duration_s`` is
  kept, and an attempt still running then ends there (``attempt_end``).

Ground truth: the simulator's breakdown, with three corrections that make it exactly what the
trace says. (1) Straggler wait is realised: per kept step, the latest rank's time to reach the
collective (compute + data wait) minus the median rank's (numpy's median, which is DuckDB's),
clipped to the step as accounting clips it; the difference from the simulator's expected wait
(its worst subject's, nested episodes compounded) moves to or from productive. (2) Input
stall: every rank's data wait has a floor (half the mean), so per kept step the smallest
rank's data wait, clipped to what is left of the step, moves from productive to
``other.input_stall``. (3) A run that ends while waiting to restart ends, in the trace, at its
last attempt's end: that downtime leaves the wall-clock (and restart.queue, or restart.init
after a grow).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from goodlens.analysis.runsim.config import SimConfig, SimResult
from goodlens.analysis.runsim.episodes import place_stream
from goodlens.analysis.runsim.trial import prepare, run_trial
from goodlens.model.jsonable import dumps
from goodlens.model.schema import EVENT_COLUMNS, RUN_COLUMNS, STEP_COLUMNS, EventKind
from goodlens.model.trace import write_trace

DEFAULT_EPOCH = 1_767_225_600.0
"""Sim time 0 on the trace's clock: 2026-01-01T00:00:00Z."""
DATA_WAIT_FRACTION = 0.005
"""Mean data-loader wait of a rank, as a share of the healthy step (uniform 0.5x-1.5x)."""
CKPT_BYTES_PER_GPU = 1_000_000_000
"""Checkpoint size per GPU of the full world (assumed: ~1 GB of training state per GPU)."""
LAUNCHER = "launcher"
_ARROW = {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}
_INTS = ("attempt", "rank", "step")


@dataclass
class TraceResult:
    """A generated trace: where it went, its ground truth and the planted stragglers."""

    run_id: str
    path: Path | None
    truth: dict[str, Any]
    """The breakdown the trace represents (``goodlens report --json``'s keys)."""
    findings: list[dict[str, Any]]
    """Planted stragglers: subject kind and id, cause, slowdown, first/last step and attempt."""
    tables: dict[str, pa.Table]
    sim: SimResult
    """The simulator's own (breakdown-mode) result for the same seed."""
    rows: int
    """Rank-step rows."""
    seconds: float
    """Time to build the tables (not counting the write)."""

    @property
    def rows_per_s(self) -> float:
        """Rank-step rows generated per second."""
        return self.rows / self.seconds if self.seconds > 0 else math.inf

    def as_result(self) -> SimResult:
        """The trial as the trace has it: the simulator's result with the trace's own
        breakdown (its per-rank noise realised), what ``goodlens report`` finds in it."""
        t = self.truth
        return SimResult(wall_clock_s=t["wall_clock_s"], goodput=t["goodput"],
                         gpu_time_goodput=t["gpu_time_goodput"], buckets=dict(t["buckets"]),
                         restart_parts=dict(t["restart_parts"]), counts=dict(self.sim.counts),
                         failures_by_cause=dict(self.sim.failures_by_cause),
                         startup_parts=dict(t["startup_parts"]),
                         other_parts=dict(self.sim.other_parts),
                         sample_goodput=self.sim.sample_goodput)


def generate_trace(config: SimConfig, seed: int, out: str | Path | None, run_id: str = "sim",
                   clock_skew_s: float = 0.0, *,
                   epoch: float = DEFAULT_EPOCH,
                   rng: np.random.Generator | None = None) -> TraceResult:
    """One trial of ``config`` (``simulate(config, seed)``'s) as a trace; written to ``out``
    (with ``ground_truth.json``) when given. Same seed, same tables. ``rng``, when given,
    draws the trial instead of ``seed``'s own stream (``goodlens simulate --out``: a Monte
    Carlo's first trial, :func:`~goodlens.analysis.runsim.montecarlo.trial_rng`); ``seed``
    still draws the per-rank noise. The ``per_step`` policy has no trace form: its
    replica groups' events are not written, so it is refused (ValueError)."""
    if config.elastic == "per_step":
        raise ValueError("trace mode does not write elastic='per_step' runs (no replica-group "
                         "events); simulate them without a trace")
    t_start = time.perf_counter()
    c, tl = config, []
    p = prepare(c)
    stream, clocks = place_stream(seed, c.nodes)  # places the episodes, then draws the noise
    res = run_trial(c, p, np.random.default_rng(seed) if rng is None else rng, tl, stream)
    g = _Gen(c, p, tl, stream, clock_skew_s * clocks, epoch)
    for a, r in enumerate(tl):
        g.attempt(a, r)
    truth = g.truth(res)
    tables = {"runs": g.runs_table(run_id), "steps": g.steps_table(run_id),
              "events": g.events_table(run_id)}
    seconds = time.perf_counter() - t_start
    path = None
    if out is not None:
        path = write_trace(out, tables, [run_id])
        doc = {"run_id": run_id, "seed": seed, "generator": "goodlens.analysis.runsim.tracegen",
               "clock_skew_s": clock_skew_s, "truth": truth, "findings": g.findings(),
               "config": asdict(c)}
        (path / "ground_truth.json").write_text(
            dumps(doc, indent=2) + "\n")
    return TraceResult(run_id, path, truth, g.findings(), tables, res, tables["steps"].num_rows,
                       seconds)


class _Gen:
    """Builds rows, events and the truth corrections attempt by attempt."""

    def __init__(self, c: SimConfig, p: Any, tl: list[dict], rng: np.random.Generator,
                 offset: np.ndarray, epoch: float) -> None:
        self.c, self.p, self.tl, self.rng, self.epoch = c, p, tl, rng, epoch
        self.gpn, self.T = c.gpus_per_node, c.duration_s
        self.offset = offset  # each host's clock against the trace's
        self.offset[0] = 0.0  # node 0 (rank 0, the launcher) is the reference clock
        self.bytes = CKPT_BYTES_PER_GPU * c.nodes * c.gpus_per_node
        self.cols: dict[str, list[np.ndarray]] = {k: [] for k in (
            "attempt", "rank", "step", "start", "dur", "compute", "coll", "data")}
        self.events: list[tuple] = []
        self.d_sw = self.d_gpu = self.input_stall = 0.0
        self.kept = self.lost = 0
        self.run_end = self.T
        firsts = [r["R"] if "m_end" in r else None for r in tl]
        self.rollback = [min((f for f in firsts[i + 1:] if f is not None), default=None)
                         for i in range(len(tl))]
        self._episodes(tl[0]["episodes"] if tl else None)

    # ---------------------------------------------------------------- stragglers
    def _episodes(self, ep: dict | None) -> None:
        """Every episode with the subject (a rank, a node or a switch) and the rank range
        the simulator placed it on, so that the ranks compounded here are the ones the
        simulator compounded."""
        n = len(ep["onset"]) if ep else 0
        self.ep: list[dict[str, Any]] = [
            dict(subject=ep["subject"][i], id=ep["id"][i], cause=ep["cause"][i],
                 slowdown=ep["slowdown"][i], onset=ep["onset"][i], end=ep["end"][i],
                 r0=ep["r0"][i], r1=ep["r1"][i], evicted=False, first=None, last=None, steps=0)
            for i in range(n)]
        for r in self.tl:  # an evicted episode ends at the eviction
            for i in r.get("evicted", ()):
                self.ep[i]["end"] = min(self.ep[i]["end"], r["t_end"])
                self.ep[i]["evicted"] = True

    def findings(self) -> list[dict[str, Any]]:
        """The episodes that slowed at least one step, in onset order."""
        out = []
        for e in self.ep:
            if e["steps"]:
                out.append({"subject": e["subject"], "id": e["id"], "cause": e["cause"],
                            "slowdown": e["slowdown"], "first_attempt": e["first"][0],
                            "first_step": e["first"][1], "last_attempt": e["last"][0],
                            "last_step": e["last"][1], "steps": e["steps"],
                            "ranks": [e["r0"], e["r1"] - 1], "evicted": e["evicted"],
                            "onset": self.epoch + e["onset"],
                            "end": self.epoch + min(e["end"], self.run_end)})
        return out

    # ---------------------------------------------------------------- one attempt
    def fc(self, m: np.ndarray | int, d: float) -> Any:
        """End of step count m from a piece's reference (as ``_simcore``)."""
        k = m - 1
        return m * d + self.p.cm * (k // self.p.km - k // self.p.kd) + self.p.cdd * (k // self.p.kd)

    def stall(self, k: int) -> float:
        p = self.p
        return p.cdd if k % p.kd == 0 else (p.cm if k % p.km == 0 else 0.0)

    def ev(self, source: str, kind: str, t: float, a: int, **kw: Any) -> None:
        if t <= self.T:  # nothing recorded after the run's end
            self.events.append((t, len(self.events), source, kind, a, kw))

    def attempt(self, a: int, r: dict) -> None:
        c, T, gpn = self.c, self.T, self.gpn
        kind, t, m_end, n = r["kind"], r["t"], r.get("m_end"), r["n"]
        src = f"node-0000/rank-0/attempt-{a}"
        self.ev(LAUNCHER, EventKind.ATTEMPT_START, t, a, world_size=n * gpn)
        if a and n != self.tl[a - 1]["n"]:
            self.ev(LAUNCHER, EventKind.WORLD_RESIZED, t, a, world_size=n * gpn)
        cut = min(r.get("t_fail", math.inf) if m_end is None else math.inf, T)
        rs, R = t + r["init"], r["R"]
        if r["init"] > 0:
            self.ev(src, EventKind.INIT_START, t, a)
            if rs <= cut:
                self.ev(src, EventKind.INIT_END, rs, a)
        tier = "memory" if r["from_mem"] else "durable"
        if r["restore"] > 0 and rs <= cut:
            self.ev(src, EventKind.CKPT_RESTORE_START, rs, a, step=R, tier=tier)
            if rs + r["restore"] <= cut:
                self.ev(src, EventKind.CKPT_RESTORE_END, rs + r["restore"], a, step=R, tier=tier,
                        bytes=self.bytes)
        if m_end is not None:
            ends = self.steps(a, r)
            stop = {"failed": r.get("t_fail"), "end": T}.get(kind, math.inf)
            last = m_end if kind in ("failed", "end", "grow") else m_end - 1
            for k in range(R + 1, last + 1):
                if k % self.p.km == 0:
                    self.save(src, a, k, float(ends[k - R]), stop)
        end = {"failed": r.get("t_det"), "planned": r.get("t_end"), "evict": r.get("t_end"),
               "end": T}.get(kind)
        if kind == "grow":
            end = r["t_end"] + self.stall(m_end)
        if kind == "failed":
            cause, hang, wide = r["fail"]
            node = int(self.rng.random() * n)
            info = {"hang": bool(hang), "wide": bool(wide),
                    "failed_at": self.epoch + r["t_fail"]}
            if end <= T:
                self.ev(LAUNCHER, EventKind.FAILURE_DETECTED, end, a, cause=cause, rank=node * gpn,
                        host=_host(node), detail=json.dumps(info))
            else:  # still undetected when the run ends: the attempt ends there
                end = T
                info.update(cause=cause, note="run ended before the failure was detected")
            self.ev(LAUNCHER, EventKind.ATTEMPT_END, end, a, cause="failed",
                    detail=json.dumps(info))
        elif kind in ("planned", "evict"):
            if kind == "planned":
                self.ev(LAUNCHER, EventKind.PREEMPTED, end, a, cause="planned")
            for i in r.get("evicted", ()):
                e = self.ep[i]
                for node in range(e["r0"] // gpn, (e["r1"] - 1) // gpn + 1):
                    self.ev(LAUNCHER, EventKind.RANK_EVICTED, end, a, rank=node * gpn,
                            host=_host(node), cause="straggler",
                            detail=json.dumps({"episode_cause": e["cause"]}))
            # a durable save on notice, then the job goes (accounting: restart.queue)
            self.ev(src, EventKind.CKPT_SAVE_START, end, a, step=m_end, tier="durable",
                    bytes=self.bytes)
            self.ev(src, EventKind.CKPT_SAVE_DURABLE_END, end + c.write_s, a, step=m_end,
                    tier="durable", bytes=self.bytes)
            self.ev(LAUNCHER, EventKind.ATTEMPT_END, end, a, cause="preempted",
                    detail=json.dumps({"reason": "planned" if kind == "planned"
                                       else "straggler eviction"}))
        else:
            self.ev(LAUNCHER, EventKind.ATTEMPT_END, end, a,
                    cause="resized" if kind == "grow" else "completed")
        self.run_end = end

    def save(self, src: str, a: int, k: int, t0: float, stop: float) -> None:
        """The events of the save after step count k (started at t0; cut at ``stop``)."""
        c, st = self.c, self.stall(k)
        tier = "durable" if k % self.p.kd == 0 else "memory"
        kw = dict(step=k, tier=tier, bytes=self.bytes)
        self.ev(src, EventKind.CKPT_SAVE_START, t0, a, **kw)
        if t0 + st > stop:
            return
        if c.ckpt_mode == "sync":  # blocks until durable
            self.ev(src, EventKind.CKPT_SAVE_DURABLE_END, t0 + st, a, **kw)
            return
        self.ev(src, EventKind.CKPT_SAVE_BLOCKING_END, t0 + st, a, **kw)
        if tier == "memory":  # the peer copy is usable when the blocking part ends
            self.ev(src, EventKind.CKPT_SAVE_DURABLE_END, t0 + st, a, **kw)
            return
        td = t0 + max(c.write_s, st)  # the background write, reported by the writer thread
        if td <= stop:
            self.ev(f"node-0000/ckpt-writer/attempt-{a}", EventKind.CKPT_SAVE_DURABLE_END, td,
                    a, **kw)

    def steps(self, a: int, r: dict) -> np.ndarray:
        """The attempt's rank-step rows; returns the end of each step count from R.

        A step starts where the previous one ended plus the stall of the save between them,
        and its duration is taken on the trace's clock (end - start, exact there), so step
        boundaries meet exactly and rounding does not pile up over many steps."""
        c, gpn, p = self.c, self.gpn, self.p
        R, pcs, m_end = r["R"], r["pieces"], r["m_end"]
        ends, w_k = np.full(m_end - R + 1, np.nan), np.full(m_end - R + 1, np.nan)
        ts0 = r["t"] + r["init"] + r["restore"]
        w_k[1] = r["w_first"]
        for i, (S, tau, d, w) in enumerate(pcs):
            hi = min(pcs[i + 1][0] if i + 1 < len(pcs) else m_end, m_end)
            if hi >= S:  # counts S..hi (a later piece redefines its reference count's end)
                k = np.arange(S, hi + 1)
                ends[S - R:hi - R + 1] = tau + self.fc(k, d) - self.fc(S, d)
                w_k[S - R + 1:hi - R + 1] = w
        prev = np.arange(R + 1, m_end)
        gap = np.where(prev % p.kd == 0, p.cdd, np.where(prev % p.km == 0, p.cm, 0.0))
        start = np.concatenate([[ts0], ends[1:-1] + gap])
        t_start = self.epoch + start
        dur = (self.epoch + ends[1:]) - t_start
        step, wsim = np.arange(R, m_end), w_k[1:]
        ns, ranks = len(step), r["n"] * gpn
        base = pcs[0][2] - pcs[0][3]
        # per-rank compute: median x lognormal noise x (1 + slowdown) in episodes
        rng = self.rng
        x = c.compute_fraction * base * (np.exp(c.compute_noise_sigma *
                                                rng.standard_normal((ns, ranks)))
                                         if c.compute_noise_sigma > 0 else np.ones((ns, ranks)))
        if c.diurnal_amplitude:  # every rank together, over the day of the trace clock
            x *= (1 + c.diurnal_amplitude * np.sin(2 * np.pi * t_start / 86400.0))[:, None]
        for e in self.ep:
            i0, i1 = np.searchsorted(start, [e["onset"], e["end"]], side="left")
            c0, c1 = e["r0"], min(e["r1"], ranks)
            if i1 > i0 and c1 > c0:
                x[i0:i1, c0:c1] *= 1 + e["slowdown"]
                e["first"] = e["first"] or (a, int(step[i0]))
                e["last"] = (a, int(step[i1 - 1]))
                e["steps"] += int(i1 - i0)
        x[0] += c.warmup_s
        data = base * DATA_WAIT_FRACTION * (0.5 + rng.random((ns, ranks)))
        room = dur[:, None] - data
        comp = np.minimum(x, room)
        coll = np.maximum(room - comp, 0.0)
        # ground truth: realised straggler wait of kept steps against the simulator's
        # (the step-time noise moves the warm-up the report sees: it is the first step's
        # excess over the attempt's other steps' median, as in the accounting's rules)
        warm = np.zeros(ns)
        warm[0] = max(0.0, dur[0] - (float(np.median(dur[1:])) if ns > 1 else dur[0]))
        wsim[0] = min(wsim[0], dur[0] - warm[0])
        ready = comp + data  # time to reach the collective (= duration - collective wait)
        sw = np.clip(ready.max(axis=1) - np.median(ready, axis=1), 0.0, dur - warm)
        inp = np.clip(data.min(axis=1), 0.0, dur - warm - sw)  # every rank waited on input
        kept = step < self.rollback[a] if self.rollback[a] is not None else np.ones(ns, bool)
        diff = float(np.sum((sw - wsim)[kept]))
        stalled = float(np.sum(inp[kept]))
        self.d_sw += diff
        self.input_stall += stalled
        self.d_gpu += (diff + stalled) * ranks
        self.kept += int(kept.sum())
        self.lost += int(ns - kept.sum())
        rank = np.tile(np.arange(ranks, dtype=np.int64), ns)
        cols = self.cols
        cols["attempt"].append(np.full(ns * ranks, a, np.int64))
        cols["rank"].append(rank)
        cols["step"].append(np.repeat(step, ranks))
        skew = self.offset[np.arange(ranks) // gpn]
        cols["start"].append((t_start[:, None] + skew[None, :]).ravel())
        cols["dur"].append(np.repeat(dur, ranks))
        cols["compute"].append(comp.ravel())
        cols["coll"].append(coll.ravel())
        cols["data"].append(data.ravel())
        return ends

    # ---------------------------------------------------------------- outputs
    def truth(self, res: SimResult) -> dict[str, Any]:
        """The simulator's breakdown, corrected as the module docstring says."""
        c, T = self.c, self.T
        buckets, parts = dict(res.buckets), dict(res.restart_parts)
        buckets["straggler_wait"] += self.d_sw
        buckets["productive"] -= self.d_sw + self.input_stall
        other = {"shutdown": buckets["other"]} if buckets["other"] > 0 else {}
        if self.input_stall > 0:
            other["input_stall"] = self.input_stall
        buckets["other"] += self.input_stall
        down = T - self.run_end
        if down > 0:
            parts["init" if self.tl[-1]["kind"] == "grow" else "queue"] -= down
        buckets["restart"] = sum(parts.values())
        wall = T - max(down, 0.0)
        alloc = (c.nodes + (c.spares if c.elastic == "spares" else 0)) * self.gpn
        gpu_productive = res.gpu_time_goodput * alloc * T - self.d_gpu
        return {"start": self.epoch, "end": self.epoch + wall, "wall_clock_s": wall,
                "goodput": buckets["productive"] / wall,
                "gpu_time_goodput": gpu_productive / (alloc * wall),
                "buckets": buckets, "startup_parts": dict(res.startup_parts),
                "restart_parts": parts,
                "other_parts": other,
                "steps": {"kept": self.kept, "recomputed": self.lost, "incomplete": 0}}

    def runs_table(self, run_id: str) -> pa.Table:
        c = self.c
        tags = {"nodes_per_switch": c.nodes_per_switch, "gpus_per_node": self.gpn,
                "spare_gpus": c.spares * self.gpn if c.elastic == "spares" else 0,
                "simulated": True}
        row = {"name": f"simulated {c.nodes}x{self.gpn}", "world_size": c.nodes * self.gpn,
               "gpus_per_rank": 1, "global_batch": None, "model_params": None,
               "tags": json.dumps(tags)}
        return _table(RUN_COLUMNS, run_id, {k: [v] for k, v in row.items()}, 1)

    def steps_table(self, run_id: str) -> pa.Table:
        cols = {k: np.concatenate(v) if v else np.zeros(0, np.int64 if k in _INTS else float)
                for k, v in self.cols.items()}
        n = len(cols["rank"])
        names = pa.array([_host(i) for i in range(self.c.nodes)], pa.string())
        data = {"attempt": cols["attempt"], "rank": cols["rank"],
                "host": names.take(cols["rank"] // self.gpn),
                "step": cols["step"], "start_time": cols["start"],
                "duration_s": cols["dur"], "compute_s": cols["compute"],
                "collective_wait_s": cols["coll"], "data_wait_s": cols["data"],
                "tokens": None, "samples": None}
        return _table(STEP_COLUMNS, run_id, data, n)

    def events_table(self, run_id: str) -> pa.Table:
        seq: dict[str, int] = {}
        rows: dict[str, list] = {col.name: [] for col in EVENT_COLUMNS}
        for t, _, src, kind, a, kw in sorted(self.events, key=lambda e: (e[0], e[1])):
            seq[src] = seq.get(src, -1) + 1
            base = {"source": src, "seq": seq[src], "kind": kind,
                    "time": self.epoch + t, "attempt": a}
            for col in EVENT_COLUMNS:
                rows[col.name].append(base[col.name] if col.name in base else
                                      kw.get(col.name))
        return _table(EVENT_COLUMNS, run_id, rows, len(self.events))


def _host(node: int) -> str:
    return f"node-{node:04d}"


def _table(columns: tuple, run_id: str, data: dict[str, Any], n: int) -> pa.Table:
    """``run_id`` plus ``columns`` in order, with the trace format's Arrow types."""
    arrays = [pa.array([run_id], pa.string()).take(np.zeros(n, np.int64))]
    names = ["run_id"]
    for col in columns:
        v = data.get(col.name)
        typ = _ARROW[col.kind]
        arrays.append(pa.nulls(n, typ) if v is None else
                      v.cast(typ) if isinstance(v, pa.Array) else pa.array(v, typ))
        names.append(col.name)
    return pa.Table.from_arrays(arrays, names=names)
