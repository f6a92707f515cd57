"""Per-step fault tolerance (torchft): where each replica group's GPU-time went, and the
samples the job committed against what its full world would have.

Why a module of its own: under torchft the job never stops, so the wall-clock partition
(:mod:`goodlens.analysis.accounting`) shows only what the *job* lost (a discarded step,
a quorum wait). What a failed group lost, its detection, restart, init, heal and wait to be
admitted, happens while the others train: it shows only per group, in GPU-time, and in the
samples the job did not train. The rules are in docs/accounting.md ("Per-step fault
tolerance"); this is their implementation, pure computation over frames from the store's
read API.

Each group's allocated time (a group of the job: the run's start to its end, or to its
eviction; a spare: its first start on) is painted into exactly one state at every
instant, so the states sum to the group's allocated GPU-seconds by construction.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from goodlens.analysis.intervals import details
from goodlens.model.jsonable import is_missing
from goodlens.model.schema import EventKind

#: A replica group's states, in the order reports list them.
GROUP_STATES = ("progress", "quorum", "recompute", "startup", "detection", "restart",
                "init", "heal", "admission", "spare_idle", "other")
#: Event kinds this module reads.
FT_KINDS = (EventKind.GROUP_START, EventKind.GROUP_END, EventKind.QUORUM,
            EventKind.STEP_DISCARDED, EventKind.HEAL_START, EventKind.HEAL_END)


def is_ft_run(tags: Any) -> bool:
    """Whether a run's tags say it ran under per-step fault tolerance."""
    return isinstance(tags, dict) and tags.get("fault_tolerance") == "torchft"


def _int(v: Any, default: int) -> int:
    try:
        return default if is_missing(v) else int(v)
    except (TypeError, ValueError):
        return default


class _Paint:
    """One group's allocated span cut into single-state pieces (first layer wins)."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, max(end, start)
        self.layers: list[tuple[list[tuple[float, float]], str]] = []

    def add(self, ivs: Iterable[tuple[float, float]], state: str) -> None:
        ivs = [(max(a, self.start), min(b, self.end)) for a, b in ivs]
        self.layers.append(([(a, b) for a, b in ivs if b > a], state))

    def totals(self, default: str = "other") -> dict[str, float]:
        cuts = {self.start, self.end}
        for ivs, _ in self.layers:
            for a, b in ivs:
                cuts.update((a, b))
        out = dict.fromkeys(GROUP_STATES, 0.0)
        for lo, hi in itertools.pairwise(sorted(cuts)):
            mid = (lo + hi) / 2
            name = default
            for ivs, state in self.layers:
                if any(a <= mid < b for a, b in ivs):
                    name = state
                    break
            out[name] += hi - lo
        return out


def _group_steps(steps: pd.DataFrame, width: int) -> pd.DataFrame:
    """Committed steps per (group index, step): first start, last end, samples, and
    whether the group took part (samples > 0, or not reported)."""
    if not len(steps):
        return pd.DataFrame({"group": pd.Series(dtype="int64"), "step": pd.Series(dtype="int64"),
                             "start": pd.Series(dtype=float), "end": pd.Series(dtype=float),
                             "samples": pd.Series(dtype=float),
                             "counted": pd.Series(dtype=bool)})
    s = steps.assign(group=steps["rank"].astype(int) // width,
                     end=steps.start_time.astype(float) + steps.duration_s.astype(float))
    s = s.assign(samples=s.samples.astype(float) if "samples" in s else np.nan)
    g = s.groupby(["group", "step"], sort=True).agg(
        start=("start_time", "min"), end=("end", "max"), samples=("samples", "sum"),
        reported=("samples", "count")).reset_index()
    g["counted"] = (g.samples > 0) | (g.reported == 0)
    g.loc[g.reported == 0, "samples"] = np.nan
    return g.drop(columns="reported")


def ft_report(tags: dict[str, Any], steps: pd.DataFrame, events: pd.DataFrame,
              start: float, end: float, gpus_per_rank: int = 1) -> dict[str, Any]:
    """The ``fault_tolerance`` section of a torchft run's report.

    ``steps``: the run's raw step rows (``rank``, ``step``, ``start_time``,
    ``duration_s``, ``samples``); ``events``: its events of :data:`FT_KINDS`; ``start``,
    ``end``: the run's wall-clock span (the report's)."""
    width = max(1, _int(tags.get("group_world_size"), 1))
    groups = max(1, _int(tags.get("replica_groups"), 1))
    ev = events[events.kind.isin(FT_KINDS)].sort_values("time") if len(events) else events
    ev = ev.assign(d=details(ev)) if len(ev) else ev.assign(d=[])
    gs = _group_steps(steps, width)
    # a window: every group's time is painted from the whole run, clipped to it; the
    # step and sample views count the steps that began in it
    inside = (gs.start >= start) & (gs.start < end) if len(gs) else gs.start.astype(bool)
    in_ev = (ev.time >= start) & (ev.time <= end) if len(ev) else ev.time.astype(bool)
    names = _group_names(ev, width)
    per_step = float(tags.get("samples_per_group_step") or 0) or (
        float(gs.samples[gs.counted].median()) if gs.samples.notna().any() else 0.0)
    label_of = {i: names.get(i, f"g{i}") for i in set(gs.group) | set(names)}
    index_of = {v: k for k, v in label_of.items()}
    out_groups, heals, recoveries = [], [], []
    for idx in sorted(label_of):
        label = label_of[idx]
        mine = ev[ev.label == label] if len(ev) else ev
        g = _one_group(label, idx, gs[gs.group == idx], mine, ev, start, end, groups)
        out_groups.append(g["summary"])
        heals += g["heals"]
        recoveries += g["recoveries"]
    alloc_gpus = width * gpus_per_rank
    gpu = dict.fromkeys(GROUP_STATES, 0.0)
    for g in out_groups:
        for k, v in g["seconds"].items():
            gpu[k] += v * alloc_gpus
    allocated = sum(gpu.values())
    return {
        "replica_groups": groups, "group_world_size": width, "gpus_per_group": alloc_gpus,
        "spare_groups": sum(1 for g in out_groups if g["spare"]),
        "steps": _steps_view(gs[inside], ev[in_ev], groups),
        "samples": _samples_view(gs[inside], ev[in_ev], groups, per_step),
        "gpu_seconds": {"allocated": allocated, **gpu},
        "gpu_time_goodput": gpu["progress"] / allocated if allocated > 0 else None,
        "groups": out_groups, "heals": heals, "recoveries": recoveries,
        "participation": _participation(gs[inside], ev, index_of),
        "quorum_group_s": gpu["quorum"] / alloc_gpus,
        "quorum_changes": _quorum_changes(ev[in_ev]),
    }


def _group_names(ev: pd.DataFrame, width: int) -> dict[int, str]:
    """Group index (rank // width) -> label, from the events its rank 0 emitted."""
    out: dict[int, str] = {}
    if not len(ev):
        return out
    sel = ev[ev.label.notna() & ev["rank"].notna()]
    for label, rank in zip(sel.label, sel["rank"]):
        out.setdefault(int(rank) // width, str(label))
    return out


def _incarnations(mine: pd.DataFrame) -> list[dict[str, Any]]:
    starts = mine[mine.kind == EventKind.GROUP_START]
    return [{"time": float(t), "attempt": _int(d.get("group_attempt"), i),
             "spare": bool(d.get("spare", False))}
            for i, (t, d) in enumerate(zip(starts.time, starts.d))]


def _pairs(mine: pd.DataFrame) -> list[dict[str, Any]]:
    """Heals: each ``heal_start`` with the next ``heal_end`` of the group."""
    out: list[dict[str, Any]] = []
    open_: dict[str, Any] | None = None
    for row in mine[mine.kind.isin([EventKind.HEAL_START, EventKind.HEAL_END])].itertuples():
        if row.kind == EventKind.HEAL_START:
            open_ = {"start": float(row.time), "step": _int(row.step, -1),
                     "source": row.d.get("source"), "transport": row.d.get("transport")}
        elif open_ is not None:
            open_.update(end=float(row.time), seconds=float(row.time) - open_["start"],
                         bytes=None if is_missing(row.bytes) else int(row.bytes),
                         failed=row.cause == "failed")
            out.append(open_)
            open_ = None
    return out


def _one_group(label: str, idx: int, gs: pd.DataFrame, mine: pd.DataFrame,
               ev: pd.DataFrame, start: float, end: float, groups: int) -> dict[str, Any]:
    incs = _incarnations(mine)
    spare = bool(incs and incs[0]["spare"])
    first = incs[0]["time"] if incs else (float(gs.start.min()) if len(gs) else start)
    a0 = max(first, start) if spare else start
    ends = mine[(mine.kind == EventKind.GROUP_END) & (mine.cause == "evicted")]
    a1 = min(float(ends.time.min()), end) if len(ends) else end
    paint = _Paint(a0, a1)
    # a heal runs on torchft's quorum thread while the training thread waits for the
    # quorum, inside a step: the heal is what that wait was for
    heals = _pairs(mine)
    paint.add([(h["start"], h["end"]) for h in heals], "heal")
    quorum = mine[mine.kind == EventKind.QUORUM]
    paint.add([(t - (d.get("blocked_s") or 0.0), t) for t, d in zip(quorum.time, quorum.d)],
              "quorum")
    paint.add(zip(gs.start[gs.counted], gs.end[gs.counted]), "progress")
    paint.add(zip(gs.start[~gs.counted], gs.end[~gs.counted]), "admission")
    disc = mine[mine.kind == EventKind.STEP_DISCARDED]
    paint.add([(float(d.get("start_time", t)), t) for t, d in zip(disc.time, disc.d)],
              "recompute")
    recoveries = _recoveries(label, incs, gs, disc, heals, ev, mine, paint, a1)
    if len(gs) or len(disc):
        firsts = [float(x) for x in gs.start] + [float(d.get("start_time", t))
                                                  for t, d in zip(disc.time, disc.d)]
        paint.add([(a0, min(firsts))], "spare_idle" if spare else "startup")
    seconds = paint.totals()
    summary = {"group": label, "index": idx, "spare": spare,
               "attempts": max(1, len(incs)), "evicted": bool(len(ends)),
               "allocated_from": a0, "allocated_to": a1,
               "steps_committed": int(gs.counted.sum()), "steps_discarded": len(disc),
               "seconds": seconds}
    return {"summary": summary, "heals": [{"group": label, **h} for h in heals],
            "recoveries": recoveries}


def _recoveries(label: str, incs: list[dict[str, Any]], gs: pd.DataFrame,
                disc: pd.DataFrame, heals: list[dict[str, Any]], ev: pd.DataFrame,
                mine: pd.DataFrame, paint: _Paint, a1: float) -> list[dict[str, Any]]:
    """Each restart of the group (an incarnation after the first): its last activity,
    when the others noticed, the new process, its heal and its first counted step; the
    pieces painted as ``recompute`` (the step in flight), ``detection``, ``restart``,
    ``init`` and ``admission``."""
    out = []
    acts = sorted([(float(s), float(e)) for s, e in zip(gs.start, gs.end)] +
                  [(float(d.get("start_time", t)), float(t)) for t, d in
                   zip(disc.time, disc.d)])
    spans = [(float(s), float(e)) for s, e in zip(gs.start, gs.end)]
    med = float(np.median([e - s for s, e in spans])) if spans else 0.0
    for k in range(1, len(incs)):
        restarted = incs[k]["time"]
        before = [a for a in acts if a[1] <= restarted]
        last = before[-1][1] if before else incs[k - 1]["time"]
        failed = mine[(mine.kind == EventKind.GROUP_END) & (mine.cause == "failed") &
                      (mine.time >= last) & (mine.time <= restarted)]
        detected = _noticed(ev, label, last, restarted)
        instant = float(failed.time.min()) if len(failed) else None
        partial = (instant - last) if instant is not None else min(med, detected - last)
        heal = next((h for h in heals if h["start"] >= restarted), None)
        after = gs[(gs.start >= restarted) & gs.counted]
        rejoined = float(after.start.min()) if len(after) else None
        paint.add([(last, last + max(0.0, partial))], "recompute")
        paint.add([(last + max(0.0, partial), detected)], "detection")
        paint.add([(detected, restarted)], "restart")
        paint.add([(restarted, heal["start"] if heal else (rejoined or a1))], "init")
        if heal is not None:
            paint.add([(heal["end"], rejoined or a1)], "admission")
        out.append({"group": label, "attempt": incs[k]["attempt"], "last_step_end": last,
                    "failure": instant, "detected": detected, "restarted": restarted,
                    "heal_start": heal["start"] if heal else None,
                    "heal_end": heal["end"] if heal else None, "rejoined": rejoined,
                    "out_s": (rejoined - last) if rejoined is not None else None})
    return out


def _noticed(ev: pd.DataFrame, label: str, last: float, limit: float) -> float:
    """When the other groups noticed a group gone after ``last``: the end of their first
    discarded step or quorum wait after it (else the new incarnation's start)."""
    others = ev[(ev.label != label) & ev.kind.isin([EventKind.STEP_DISCARDED,
                                                   EventKind.QUORUM]) &
                (ev.time > last) & (ev.time <= limit)] if len(ev) else ev
    return float(others.time.min()) if len(others) else limit


def _steps_view(gs: pd.DataFrame, ev: pd.DataFrame, groups: int) -> dict[str, Any]:
    per = gs[gs.counted].groupby("step").agg(groups=("group", "nunique"), start=("start", "min"),
                                             end=("end", "max"))
    short = per[per.groups < groups]
    disc = ev[ev.kind == EventKind.STEP_DISCARDED] if len(ev) else ev
    return {"committed": len(per), "short": len(short),
            "short_s": float((short.end - short.start).sum()),
            "discarded": int(disc.step.nunique()) if len(disc) else 0}


def _samples_view(gs: pd.DataFrame, ev: pd.DataFrame, groups: int,
                  per_step: float) -> dict[str, Any]:
    """Samples committed against the full world's, per step the job ran: every committed
    step, and every discarded run of a step, could have trained ``groups x per_step``.
    ``discarded``: what groups trained in steps that were thrown away; ``missing_groups``:
    what no group trained (groups out of the quorum). The three parts sum to the whole."""
    counted = gs[gs.counted]
    per = counted.groupby("step").agg(n=("group", "nunique"), s=("samples", "sum"))
    known = counted.samples.notna().any()
    committed = float(per.s.sum()) if known else float(per.n.sum() * per_step)
    disc = ev[ev.kind == EventKind.STEP_DISCARDED] if len(ev) else ev
    runs = 0  # how many times the job discarded a step: the most any one group did
    if len(disc):
        runs = int(disc.groupby(["step", "label"]).size().groupby(level=0).max().sum())
    discarded = float(len(disc)) * per_step
    full = (len(per) + runs) * groups * per_step
    missing = max(0.0, full - committed - discarded)
    return {"per_group_step": per_step, "full_world": committed + discarded + missing,
            "committed": committed, "discarded": discarded, "missing_groups": missing,
            "goodput": committed / full if full > 0 else None}


def _participation(gs: pd.DataFrame, ev: pd.DataFrame,
                   index_of: dict[str, int]) -> list[dict[str, Any]]:
    """Groups taking part per committed step, where it changes (for plots)."""
    per = gs[gs.counted].groupby("step").agg(groups=("group", "nunique"),
                                             time=("start", "min")).reset_index()
    out, prev = [], None
    for row in per.itertuples():
        if row.groups != prev:
            out.append({"step": int(row.step), "time": float(row.time),
                        "groups": int(row.groups)})
            prev = row.groups
    return out


def _quorum_changes(ev: pd.DataFrame) -> int:
    if not len(ev):
        return 0
    q = ev[ev.kind == EventKind.QUORUM]
    ids = {d.get("quorum_id") for d in q.d if d.get("quorum_id") is not None}
    return max(0, len(ids) - 1)
