"""Time accounting: every second of a run's wall-clock in exactly one bucket.

The run's wall-clock (first attempt start to the run's end, or now while it runs) is cut
into contiguous, non-overlapping segments, each with one account (a bucket, or a part of
one), so the buckets sum to wall-clock for the run, for each attempt and for any window,
by construction. The rules of each bucket (productive, straggler_wait, checkpoint_stall,
recompute, startup, restart, other), the clocks and the GPU-time view are in
docs/accounting.md; this module is their implementation.

Pure computation over frames from the store's read API
(:class:`goodlens.storage.reader.RunReader`; no SQL, no I/O). The report built on it is
:func:`goodlens.analysis.report.report_dict`.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from goodlens.analysis.intervals import (
    covers,
    custom_intervals,
    ft_intervals,
    overlap,
    pair_intervals,
    subtract,
    union,
)
from goodlens.analysis.stepwaits import step_waits
from goodlens.analysis.window import as_known_at, run_span
from goodlens.model.jsonable import is_missing
from goodlens.model.schema import EventKind
from goodlens.storage.reader import RunReader

BUCKETS = ("productive", "straggler_wait", "checkpoint_stall", "recompute", "startup",
           "restart", "other")
STARTUP_PARTS = ("init", "restore", "warmup")
"""``startup``: the first attempt's start to its first step (docs/accounting.md)."""
RESTART_PARTS = ("detection", "queue", "init", "restore", "warmup", "unattributed")
"""``restart``: a failure (eviction, preemption, resize) to the next step."""
#: Bumped whenever a bucket's meaning changes, so that a collector recomputes the reports it
#: stored under an earlier one (2: the first attempt's start-up left ``restart`` for
#: ``startup``). Stored reports are keyed on the goodlens version and this.
ACCOUNTING_REVISION = 2
#: Event kinds accounting reads (heartbeats, the most numerous, are not among them).
ACCOUNTING_KINDS = (EventKind.ATTEMPT_START, EventKind.ATTEMPT_END, EventKind.FAILURE,
                    EventKind.FAILURE_DETECTED,
                    EventKind.PREEMPTED, EventKind.CKPT_SAVE_START,
                    EventKind.CKPT_SAVE_BLOCKING_END, EventKind.CKPT_SAVE_DURABLE_END,
                    EventKind.CKPT_RESTORE_START, EventKind.CKPT_RESTORE_END,
                    EventKind.CUSTOM_BEGIN, EventKind.CUSTOM_END, EventKind.WORLD_RESIZED,
                    EventKind.QUORUM, EventKind.STEP_DISCARDED)
_STEP_COLS = ["attempt", "step", "ref_start", "step_start", "duration_median",
              "compute_median", "compute_max", "compute_ranks", "ranks", "ready_median",
              "ready_max", "ready_ranks", "data_wait_min"]


@dataclass
class Breakdown:
    """Where the wall-clock of a run (or an attempt, or a window) went, in seconds."""

    run: str
    start: float
    end: float
    wall_clock_s: float
    goodput: float
    """Productive share of wall-clock (0 for an empty window)."""
    buckets: dict[str, float | None]
    """Seconds per bucket; ``straggler_wait`` is None when not measured."""
    startup_parts: dict[str, float]
    """``startup`` split as :data:`STARTUP_PARTS` (the first attempt's start-up)."""
    restart_parts: dict[str, float]
    other_parts: dict[str, float]
    gpu_time_goodput: float | None
    """Productive GPU-seconds over allocated GPU-seconds (None when no GPU count is known)."""
    gpu_seconds: dict[str, float]
    """GPU-seconds: ``allocated``, ``idle_allocated`` (shrunk world, spares) and each bucket."""
    straggler_wait_measured: float
    """Share of step time whose compute split was reported (1.0 fully measured, 0 not)."""
    in_progress: bool
    attempt: int | None = None
    steps: dict[str, int] = field(default_factory=dict)
    """Step counts: ``kept``, ``recomputed``, ``incomplete`` (fewer ranks than the attempt's
    most), only in whole-run and per-attempt breakdowns."""
    excluded: dict[str, float] = field(default_factory=dict)
    """Seconds taken out of the wall-clock by name (``--exclude``); not in any bucket."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``goodlens report --json`` prints)."""
        return _finite(asdict(self))


def _finite(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


class Accounting:
    """A run's wall-clock as contiguous single-account segments; query any window."""

    def __init__(self, run: str, seg_start: np.ndarray, seg_len: np.ndarray,
                 seg_key: np.ndarray, keys: list[str], seg_attempt: np.ndarray,
                 seg_gpus: np.ndarray, gpus_allocated: float, step_time: float,
                 measured_time: float, in_progress: bool,
                 attempt_spans: dict[int, tuple[float, float]],
                 step_counts: dict[int | None, dict[str, int]], measured: bool,
                 start: float = math.nan) -> None:
        self.run = run
        self.seg_start, self.seg_len, self.seg_key = seg_start, seg_len, seg_key
        self.seg_end = seg_start + seg_len
        self.keys = keys
        self.seg_attempt, self.seg_gpus = seg_attempt, seg_gpus
        self.gpus_allocated = gpus_allocated
        self.step_time, self.measured_time = step_time, measured_time
        self.in_progress = in_progress
        self.attempt_spans = attempt_spans
        self.step_counts = step_counts
        self.measured = measured
        self.failures: dict[str, int] = {"recorded": 0, "estimated": 0}
        """Failures whose step in flight ran to a recorded ``failure`` instant, and those
        where it was estimated as one median step (set by :func:`account`)."""
        # a run of zero length (or none at all) still has a start: its first attempt's
        self.start = float(seg_start[0]) if len(seg_start) else start
        self.end = float(self.seg_end[-1]) if len(seg_start) else start

    def excluded_keys(self, exclude: Iterable[str] = ()) -> np.ndarray:
        """Which account keys ``exclude`` names (a bool per key): a labelled interval
        (``eval``, ``maintenance``: ``other:<label>``) or a named part of startup, restart or
        other (``queue``, ``detection``, ``since_last_step``...), by its name alone (``init``
        names both startup's and restart's)."""
        names = {x.strip() for x in exclude if x and x.strip()}
        return np.array([k.split(":", 1)[-1] in names and ":" in k for k in self.keys],
                        dtype=bool)

    def breakdown(self, since: float | None = None, until: float | None = None,
                  attempt: int | None = None, exclude: Iterable[str] = ()) -> Breakdown:
        """The breakdown of ``[since, until]`` (clipped to the run), or of one attempt;
        the parts ``exclude`` names are taken out of the wall-clock entirely (their seconds
        in ``excluded``)."""
        if attempt is not None:
            if attempt not in self.attempt_spans:
                raise KeyError(f"run {self.run} has no attempt {attempt}")
            since, until = self.attempt_spans[attempt]
        lo = self.start if since is None else max(since, self.start)
        hi = self.end if until is None else min(until, self.end)
        if not hi > lo:
            lo = hi = lo if not math.isnan(lo) else 0.0
        overlap = np.clip(np.minimum(self.seg_end, hi) - np.maximum(self.seg_start, lo), 0, None)
        out = self.excluded_keys(exclude)
        per_key = np.bincount(self.seg_key, weights=overlap, minlength=len(self.keys))
        excluded: dict[str, float] = {}
        for k, v, x in zip(self.keys, per_key.tolist(), out):
            if x:  # startup's and restart's part of one name add up
                name = k.split(":", 1)[1]
                excluded[name] = excluded.get(name, 0.0) + float(v)
        for name in exclude:
            excluded.setdefault(name.strip(), 0.0)
        overlap = np.where(out[self.seg_key], 0.0, overlap) if out.any() else overlap
        per_key = np.where(out, 0.0, per_key)
        gpu_key = np.bincount(self.seg_key, weights=overlap * self.seg_gpus,
                              minlength=len(self.keys))
        acc = {k: v for k, v, x in zip(self.keys, per_key.tolist(), out) if not x}
        gacc = dict(zip(self.keys, gpu_key.tolist()))
        wall = float(hi - lo) - sum(excluded.values())
        buckets = {b: sum((v for k, v in acc.items() if k.split(":")[0] == b), 0.0)
                   for b in BUCKETS}
        if not self.measured:
            buckets["straggler_wait"] = None
        restart = {p: acc.get(f"restart:{p}", 0.0) for p in RESTART_PARTS}
        startup = {p: acc.get(f"startup:{p}", 0.0) for p in STARTUP_PARTS}
        other = {k.split(":", 1)[1]: v for k, v in acc.items() if k.startswith("other:") and v}
        gpu = {b: sum((v for k, v in gacc.items() if k.split(":")[0] == b), 0.0)
               for b in BUCKETS}
        allocated = self.gpus_allocated * wall
        gpu["idle_allocated"] = allocated - float(np.dot(overlap, self.seg_gpus))
        gpu["allocated"] = allocated
        counts = self.step_counts.get(attempt if attempt is not None else None, {}) \
            if (since is None and until is None) or attempt is not None else {}
        return Breakdown(
            run=self.run, start=float(lo), end=float(hi), wall_clock_s=wall,
            goodput=buckets["productive"] / wall if wall > 0 else 0.0,
            buckets=buckets, restart_parts=restart, other_parts=other, startup_parts=startup,
            gpu_time_goodput=(gpu["productive"] / allocated) if allocated > 0 else None,
            gpu_seconds=gpu,
            straggler_wait_measured=(self.measured_time / self.step_time
                                     if self.step_time > 0 else 0.0),
            in_progress=self.in_progress, attempt=attempt, steps=counts, excluded=excluded)

    def by_attempt(self, exclude: Iterable[str] = ()) -> list[Breakdown]:
        """One breakdown per attempt (each attempt owns the time until the next one starts)."""
        return [self.breakdown(attempt=a, exclude=exclude) for a in sorted(self.attempt_spans)]

    def cumulative(self, times: np.ndarray) -> np.ndarray:
        """Seconds per account key from the run's start up to each of ``times``: an array
        of shape ``(len(times), len(keys))``. Segments are contiguous and ordered, so this is
        a prefix sum over whole segments plus the part of the one ``t`` falls in."""
        t = np.asarray(times, dtype=float)
        n, k = len(self.seg_start), len(self.keys)
        if not n:
            return np.zeros((len(t), k))
        onehot = np.zeros((n, k))
        onehot[np.arange(n), self.seg_key] = self.seg_len
        prefix = np.vstack([np.zeros(k), np.cumsum(onehot, axis=0)])
        full = np.searchsorted(self.seg_end, t, side="right")  # segments ended by t
        out = prefix[np.minimum(full, n)]
        part = full < n
        i = full[part]
        out[np.flatnonzero(part), self.seg_key[i]] += np.clip(t[part] - self.seg_start[i], 0,
                                                              None)
        return out

    def goodput_series(self, window_s: float | None = None, points: int = 200,
                       exclude: Iterable[str] = ()) -> pd.DataFrame:
        """Rolling goodput: for ``points`` window ends across the run, the productive share
        (and every bucket's share) of the preceding ``window_s`` (default: 1/20 of the run),
        with the parts ``exclude`` names out of each window's wall-clock."""
        if not len(self.seg_start) or not self.end > self.start:
            return pd.DataFrame(columns=["time", "goodput", *BUCKETS])
        span = self.end - self.start
        w = window_s or span / 20
        ends = np.linspace(self.start + min(w, span), self.end, points)
        lo = np.maximum(self.start, ends - w)
        per_key = self.cumulative(ends) - self.cumulative(lo)
        out_keys = self.excluded_keys(exclude)
        wall = ends - lo - per_key[:, out_keys].sum(axis=1)
        per_key[:, out_keys] = 0.0
        share = np.divide(per_key, wall[:, None], out=np.zeros_like(per_key),
                          where=wall[:, None] > 0)
        out = {"time": ends}
        for b in BUCKETS:
            cols = [j for j, key in enumerate(self.keys) if key.split(":")[0] == b]
            out[b] = share[:, cols].sum(axis=1) if cols else np.zeros(len(ends))
        out["goodput"] = out["productive"]
        return pd.DataFrame(out)[["time", "goodput", *BUCKETS]]


# ---------------------------------------------------------------------------- building
def account_run(source: RunReader, run_id: str, now: float | None = None, *,
                attempts: pd.DataFrame | None = None,
                steps: pd.DataFrame | None = None, as_of: float | None = None) -> Accounting:
    """Account a stored run (``source``: a store's read API); ``attempts`` and ``steps``: the
    run's attempts and step summaries when the caller has read them; ``as_of``: the run as
    it was known at that instant (:func:`as_known_at`)."""
    info = source.run(run_id)
    if info is None:
        raise KeyError(f"no run {run_id!r}")
    tags = info.get("tags")
    try:
        tags = json.loads(tags) if isinstance(tags, str) else (tags or {})
    except ValueError:
        tags = {}
    ev = source.events(run_id, kinds=list(ACCOUNTING_KINDS))
    if attempts is None:
        attempts = source.attempts(run_id)
    if steps is None:
        steps = source.step_summaries(run_id)
    if as_of is not None:
        attempts, steps, ev = as_known_at(attempts, steps, ev, as_of)
        now = as_of
    world, per_rank = info.get("world_size"), info.get("gpus_per_rank")
    spare = tags.get("spare_gpus") if isinstance(tags, dict) else 0
    return account(run_id, attempts, steps, ev,
                   world_size=None if is_missing(world) else int(world),
                   gpus_per_rank=1 if is_missing(per_rank) else int(per_rank) or 1,
                   spare_gpus=0 if is_missing(spare) else int(spare), now=now)


def account(run_id: str, attempts: pd.DataFrame, steps: pd.DataFrame, events: pd.DataFrame,
            *, world_size: int | None = None, gpus_per_rank: int = 1, spare_gpus: int = 0,
            now: float | None = None) -> Accounting:
    """Build the segments of one run from its attempts, step summaries and events."""
    attempts = attempts.sort_values("attempt").reset_index(drop=True)
    # summaries without a column (an older goodlens's, a frame built by hand) read it as null
    steps = steps.reindex(columns=_STEP_COLS).sort_values(["attempt", "step"]) if len(steps) \
        else pd.DataFrame(columns=_STEP_COLS)
    if attempts.empty:
        return _Builder(run_id, events, gpus_per_rank, {}).finish(
            world_size, spare_gpus, in_progress=False, spans={}, counts={}, start=math.nan)
    by_attempt = {a: g for a, g in steps.groupby("attempt", sort=True)}
    firsts = {a: int(g.step.min()) for a, g in by_attempt.items()}
    last_row = attempts.iloc[-1]
    in_progress = is_missing(last_row["end"])
    run_end = run_span(attempts, now)[1]   # (a run in progress: now, or its last activity)
    # each attempt owns the time from its start to the next attempt's start
    spans: dict[int, tuple[float, float]] = {}
    prev_end = None
    n = len(attempts)
    for i in range(n):
        start = float(attempts.iloc[i]["start"])
        if prev_end is not None:
            start = max(start, prev_end)
        end = float(attempts.iloc[i + 1]["start"]) if i + 1 < n else run_end
        spans[int(attempts.iloc[i]["attempt"])] = (start, max(end, start))
        prev_end = max(end, start)
    b = _Builder(run_id, events, gpus_per_rank, {a: e for a, (_, e) in spans.items()})
    counts: dict[int | None, dict[str, int]] = {None: {"kept": 0, "recomputed": 0,
                                                       "incomplete": 0}}
    for i, row in attempts.iterrows():
        a = int(row["attempt"])
        later = [firsts[x] for x in attempts.attempt.iloc[i + 1:] if x in firsts]
        c = b.attempt(a, *spans[a], row, by_attempt.get(a), min(later) if later else None,
                      last=(i + 1 == n), in_progress=in_progress, first=(i == 0))
        counts[a] = c
        for k in counts[None]:
            counts[None][k] += c[k]
    acc = b.finish(world_size, spare_gpus, in_progress, spans, counts,
                   start=float(attempts.iloc[0]["start"]))
    acc.failures = dict(b.failures)
    return acc


def _num(v: Any, default: float) -> float:
    return default if is_missing(v) else float(v)


class _Builder:
    """Accumulates segments attempt by attempt."""

    def __init__(self, run: str, events: pd.DataFrame, gpus_per_rank: int,
                 attempt_ends: dict[int, float]) -> None:
        self.run = run
        self.attempt_ends = attempt_ends
        self.ev = events.sort_values("time") if len(events) else events
        ev = self.ev
        self.world_events = ev[ev.kind.isin([EventKind.ATTEMPT_START, EventKind.WORLD_RESIZED])
                               & ev.world_size.notna()] if len(ev) else ev
        """The events that set an attempt's world (time order), read per attempt."""
        self.gpr = gpus_per_rank
        self.keys: list[str] = []
        self.key_ix: dict[str, int] = {}
        self.starts: list[np.ndarray] = []
        self.lens: list[np.ndarray] = []
        self.kix: list[np.ndarray] = []
        self.att: list[np.ndarray] = []
        self.gpus: list[np.ndarray] = []
        self.step_time = 0.0
        self.measured_time = 0.0
        self.any_measured = False
        self.max_world = 0
        self.blocking = union(pair_intervals(
            self.ev, EventKind.CKPT_SAVE_START,
            (EventKind.CKPT_SAVE_BLOCKING_END, EventKind.CKPT_SAVE_DURABLE_END), attempt_ends))
        self.restores = union(pair_intervals(self.ev, EventKind.CKPT_RESTORE_START,
                                             (EventKind.CKPT_RESTORE_END,), attempt_ends))
        self.custom: dict[str, np.ndarray] = {}
        for label, ivs in custom_intervals(self.ev, attempt_ends).items():
            self.custom[label] = subtract(union(ivs), self.blocking)
        # per-step fault tolerance: a quorum wait is `other.quorum`; a discarded step (no
        # step row: it was not committed) is `recompute`, between the committed steps
        discarded, quorum = ft_intervals(self.ev)
        if quorum:
            self.custom["quorum"] = subtract(union(quorum), self.blocking)
        self.discarded = subtract(union(discarded), self.blocking) if discarded else \
            np.zeros((0, 2))
        self.failures = {"recorded": 0, "estimated": 0}
        """How the step in flight at each failure was measured: up to a recorded ``failure``
        instant, or estimated as one median step (no such event)."""

    def _key(self, name: str) -> int:
        if name not in self.key_ix:
            self.key_ix[name] = len(self.keys)
            self.keys.append(name)
        return self.key_ix[name]

    def _emit(self, starts: np.ndarray, lens: np.ndarray, keys: np.ndarray, attempt: int,
              gpus: tuple[np.ndarray, np.ndarray]) -> None:
        """Add segments; ``gpus`` is the attempt's (times, active GPUs) timeline, read at
        each segment's start."""
        keep = lens > 0
        st = starts[keep]
        self.starts.append(st)
        self.lens.append(lens[keep])
        self.kix.append(keys[keep])
        self.att.append(np.full(len(st), attempt))
        times, values = gpus
        self.gpus.append(values[np.clip(np.searchsorted(times, st, side="right") - 1, 0, None)])

    def _paint(self, a: float, b: float, attempt: int, gpus: tuple[np.ndarray, np.ndarray],
               layers: list[tuple[np.ndarray, str]], default: str) -> None:
        """Cover [a, b]: the first layer containing a piece names it, else ``default``."""
        if not b > a:
            return
        cuts = [a, b]
        for ivs, _ in layers:
            inside = ivs[(ivs[:, 1] > a) & (ivs[:, 0] < b)] if len(ivs) else ivs
            cuts.extend(float(x) for x in inside.ravel() if a < x < b)
        cuts = sorted(set(cuts))
        starts, lens, keys = [], [], []
        for lo, hi in itertools.pairwise(cuts):
            mid = (lo + hi) / 2
            name = default
            for ivs, key in layers:
                if covers(ivs, mid):
                    name = key
                    break
            starts.append(lo)
            lens.append(hi - lo)
            keys.append(self._key(name))
        self._emit(np.array(starts), np.array(lens), np.array(keys, dtype=np.int64), attempt,
                   gpus)

    def _world(self, attempt: int, steps: pd.DataFrame | None) -> tuple[np.ndarray, np.ndarray]:
        """The attempt's active GPUs over time: ``attempt_start`` and ``world_resized``
        events, else the most ranks that reported a step."""
        ev = self.world_events
        times, worlds = [-np.inf], [float(steps.ranks.max()) if steps is not None and
                                    len(steps) else 0.0]
        if len(ev):
            mine = ev[ev.attempt.to_numpy() == attempt].sort_values("time")
            if len(mine):
                worlds[0] = float(mine.world_size.iloc[0])
                times += list(mine.time.astype(float).iloc[1:])
                worlds += list(mine.world_size.astype(float).iloc[1:])
        values = np.array(worlds) * self.gpr
        self.max_world = max(self.max_world, max(worlds))
        return np.array(times), values

    # -- one attempt ------------------------------------------------------------
    def attempt(self, a: int, start: float, end: float, row: Any, steps: pd.DataFrame | None,
                rollback: int | None, last: bool, in_progress: bool,
                first: bool = False) -> dict[str, int]:
        """Paint one attempt's span; ``first``: the run's first attempt, whose start-up is
        ``startup`` (every later attempt's is ``restart``)."""
        gpus = self._world(a, steps)
        up = "startup" if first else "restart"  # whose start-up this attempt's is
        reason = row["end_reason"]
        end_ev = _num(row["end"], end)
        end_ev = min(max(end_ev, start), end)
        counts = {"kept": 0, "recomputed": 0, "incomplete": 0}
        restores = [(self.restores, f"{up}:restore")]
        if steps is None or not len(steps):
            # never reached a step: start-up until the end event, then queue
            self._paint(start, end_ev, a, gpus, restores, f"{up}:init")
            tail = "restart:queue" if not (last and in_progress) else f"{up}:init"
            self._paint(end_ev, end, a, gpus, [], tail)
            return counts
        s = steps.ref_start.to_numpy(dtype=float)
        s = np.where(np.isnan(s), steps.step_start.to_numpy(dtype=float), s)
        order = np.argsort(s, kind="stable")
        st = steps.iloc[order]
        s = np.clip(s[order], start, end)
        d = np.clip(st.duration_median.to_numpy(dtype=float), 0, None)
        e = np.minimum(s + d, end)
        e[:-1] = np.minimum(e[:-1], s[1:])  # trim overlaps (clock noise between ranks)
        e = np.maximum(e, s)
        dur = e - s
        med = float(np.median(dur)) if len(dur) else 0.0
        lost = (st.step.to_numpy() >= rollback) if rollback is not None else \
            np.zeros(len(st), dtype=bool)
        ranks = st.ranks.to_numpy()
        counts = {"kept": int((~lost).sum()), "recomputed": int(lost.sum()),
                  "incomplete": int((ranks < ranks.max()).sum())}
        # start-up: attempt start to first step
        self._paint(start, float(s[0]), a, gpus, restores, f"{up}:init")
        # inside steps: warm-up (first step), checkpoint stall, labelled intervals (eval,
        # ...), input stall, straggler wait, the rest
        parts = self._inside_steps(st, s, e, dur, lost, f"{up}:warmup")
        lo = s
        for k, (length, keys) in enumerate(parts):  # boundaries shared exactly, the last at
            hi = e if k + 1 == len(parts) else np.minimum(lo + length, e)  # the step's end
            self._emit(lo, hi - lo, keys, a, gpus)
            lo = hi
        # gaps between steps: checkpoint stall, custom labels, else unexplained
        layers = [(self.blocking, "checkpoint_stall")] + [
            (ivs, f"other:{label}") for label, ivs in self.custom.items()] + [
            (self.discarded, "recompute")]
        gap_s, gap_e = e[:-1], s[1:]
        has_gap = gap_e > gap_s
        touched = np.zeros(len(gap_s), dtype=bool)
        for ivs, _ in layers:
            touched |= overlap(ivs, gap_s, gap_e) > 0
        plain = has_gap & ~touched
        self._emit(gap_s[plain], (gap_e - gap_s)[plain],
                   np.full(int(plain.sum()), self._key("other:unexplained")), a, gpus)
        for i in np.flatnonzero(has_gap & touched):
            self._paint(float(gap_s[i]), float(gap_e[i]), a, gpus, layers, "other:unexplained")
        # after the last step
        last_end = float(e[-1])
        if is_missing(reason):  # still running: the step in flight, or a hang, shows here
            self._paint(last_end, end, a, gpus, layers, "other:since_last_step")
        elif reason in ("completed", "ended"):  # a clean end; a later attempt waits in queue
            self._paint(last_end, end_ev, a, gpus, layers, "other:shutdown")
            self._paint(max(end_ev, last_end), end, a, gpus, [], "restart:queue")
        elif reason == "resized":  # a graceful elastic reconfiguration: nothing lost
            self._paint(last_end, end, a, gpus, layers, "restart:init")
        elif reason == "unknown":  # inferred from the next attempt: no detection time known
            partial = self._partial(a, last_end, end, med)
            self._paint(last_end, last_end + partial, a, gpus, [], "recompute")
            self._paint(last_end + partial, end, a, gpus, [], "restart:unattributed")
        else:  # failed, preempted or another cause: partial step, detection, queue
            partial = self._partial(a, last_end, max(end_ev, last_end), med)
            self._paint(last_end, last_end + partial, a, gpus, [], "recompute")
            self._paint(last_end + partial, end_ev, a, gpus, [], "restart:detection")
            self._paint(max(end_ev, last_end), end, a, gpus, [], "restart:queue")
        return counts

    def _partial(self, attempt: int, last_end: float, limit: float, med: float) -> float:
        """The step in flight when ``attempt`` failed: from its last step's end to the
        earliest ``failure`` instant recorded for it (a failure before that end: nothing in
        flight), else estimated as one median step; never past ``limit``."""
        ev = self.ev
        room = max(0.0, limit - last_end)
        if len(ev):
            times = ev.time[(ev.kind == EventKind.FAILURE) & (ev.attempt == attempt)]
            if len(times):
                self.failures["recorded"] += 1
                return min(room, max(0.0, float(times.min()) - last_end))
        self.failures["estimated"] += 1
        return min(med, room)

    def _inside_steps(self, st: pd.DataFrame, s: np.ndarray, e: np.ndarray, dur: np.ndarray,
                      lost: np.ndarray, warmup: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each step's time as consecutive parts ``(lengths, account keys)``: checkpoint
        stall and labelled intervals (``other:<label>``) inside it, then the first step's
        warm-up (``warmup``: what is left of it beyond the attempt's other steps' median,
        startup's or restart's), input stall
        and straggler wait (:func:`~goodlens.analysis.stepwaits.step_waits`), and the rest
        (productive, or recompute for a step a later attempt redid, which keeps all of it)."""
        n = len(dur)
        stall = np.where(lost, 0.0, np.minimum(overlap(self.blocking, s, e), dur))
        left = dur - stall
        parts = [(stall, np.full(n, self._key("checkpoint_stall")))]
        for label, ivs in self.custom.items():
            inside = np.where(lost, 0.0, np.minimum(overlap(ivs, s, e), left))
            if inside.any():
                parts.append((inside, np.full(n, self._key(f"other:{label}"))))
                left = left - inside
        warm = np.zeros(n)
        warm[0] = max(0.0, left[0] - (float(np.median(dur[1:])) if n > 1 else left[0]))
        left = left - warm
        parts.insert(0, (warm, np.full(n, self._key(warmup))))
        sw, inp, measured = step_waits(st, left, lost)
        self.step_time += float(dur.sum())
        self.measured_time += float(dur[measured].sum())
        self.any_measured = self.any_measured or bool(measured.any())
        if inp.any():
            parts.append((inp, np.full(n, self._key("other:input_stall"))))
        parts.append((sw, np.full(n, self._key("straggler_wait"))))
        parts.append((left - sw - inp, np.where(lost, self._key("recompute"),
                                                self._key("productive"))))
        return parts

    def finish(self, world_size: int | None, spare_gpus: int, in_progress: bool,
               spans: dict, counts: dict, start: float) -> Accounting:
        def cat(xs, dt=float):
            return (np.concatenate(xs) if xs else np.zeros(0, dtype=dt))
        starts, lens = cat(self.starts), cat(self.lens)
        order = np.argsort(starts, kind="stable")
        world = max(self.max_world, float(world_size or 0))
        for k in ("productive", "straggler_wait", "checkpoint_stall", "recompute"):
            self._key(k)
        return Accounting(
            self.run, starts[order], lens[order], cat(self.kix, np.int64)[order], self.keys,
            cat(self.att, np.int64)[order], cat(self.gpus)[order],
            world * self.gpr + spare_gpus, self.step_time, self.measured_time, in_progress,
            spans, counts, self.any_measured, start)


# ---------------------------------------------------------------------------- intervals
