"""Intervals from events, and the arithmetic accounting does on them.

Why a module of its own: checkpoint saves, restores and user-labelled intervals reach
accounting as start and end events from many emitters (every rank of a 16k-rank job may
emit its own); pairing them and merging, subtracting and measuring the result is the same
work for each, and is tested and read apart from the rules that use it
(:mod:`goodlens.analysis.accounting`). Intervals are ``(n, 2)`` arrays, sorted and merged.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from goodlens.model.schema import EventKind


def pair_intervals(events: pd.DataFrame, start_kind: str, end_kinds: tuple[str, ...],
                   attempt_ends: dict[int, float]) -> list[tuple[float, float]]:
    """Each start paired with the first end after it from the same emitter and attempt,
    matching ``step`` and ``tier`` when both carry them (strictest match first; the
    first end kind preferred); an unmatched start lasts until its attempt ends.
    Vectorised: every rank of a 16k-rank job may emit its own checkpoint events."""
    ev = events
    kinds = ev.kind.to_numpy() if len(ev) else np.array([], dtype=object)
    if not (kinds == start_kind).any():  # most runs save no checkpoint of some kind
        return []
    cols = ["time", "source", "attempt", "step", "tier"]
    ev = ev[cols].assign(step=ev.step.fillna(-1).astype("int64"),
                         tier=ev.tier.fillna("").astype(str))
    starts = ev[kinds == start_kind].sort_values("time")
    starts = starts.reset_index(drop=True).assign(end=np.inf)
    keysets = (["source", "attempt", "step", "tier"], ["source", "attempt", "tier"],
               ["source", "attempt"])
    # strictest keys first over every end kind (the preferred kind first within a key
    # set), so a loose match never steals the end that a strict one would have found
    for by in keysets:
        for kind in end_kinds:
            ends = ev[kinds == kind]
            todo = np.isinf(starts.end.to_numpy())
            if not len(ends) or not todo.any():
                continue
            right = ends[["time", *by]].rename(columns={"time": "t_end"})
            m = pd.merge_asof(starts.loc[todo, ["time", *by]], right.sort_values("t_end"),
                              left_on="time", right_on="t_end", by=by,
                              direction="forward")
            found = m.t_end.notna().to_numpy()
            idx = starts.index[todo][found]
            starts.loc[idx, "end"] = m.t_end.to_numpy()[found]
    # a start never matched (a crash mid-save) lasts until its attempt ends, no longer
    ends = starts.attempt.map(attempt_ends).astype(float).fillna(np.inf).to_numpy()
    end = np.where(np.isinf(starts.end.to_numpy()), ends, starts.end.to_numpy())
    return list(zip(starts.time.astype(float), end.astype(float)))

def custom_intervals(events: pd.DataFrame, attempt_ends: dict[int, float]
                     ) -> dict[str, list[tuple[float, float]]]:
    """Each label's ``custom_begin``/``custom_end`` intervals (an unlabelled one is
    ``custom``), paired like :func:`pair_intervals`."""
    ev = events
    if not len(ev) or not ev.kind.isin([EventKind.CUSTOM_BEGIN, EventKind.CUSTOM_END]).any():
        return {}
    labelled = ev.assign(label=ev.label.where(ev.label.notna() & (ev.label != ""),
                                              "custom"))
    pairs = {}
    for label in labelled[labelled.kind == EventKind.CUSTOM_BEGIN].label.unique():
        pairs[str(label)] = pair_intervals(labelled[labelled.label == label],
                                           EventKind.CUSTOM_BEGIN, (EventKind.CUSTOM_END,),
                                           attempt_ends)
    return pairs


def details(events: pd.DataFrame) -> list[dict]:
    """Each event's ``detail`` JSON as a dict (``{}`` where absent or not an object)."""
    out = []
    for text in (events.detail if "detail" in events else [None] * len(events)):
        try:
            d = json.loads(text) if isinstance(text, str) else {}
        except ValueError:
            d = {}
        out.append(d if isinstance(d, dict) else {})
    return out


def _seconds(v: object) -> float:
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return x if math.isfinite(x) and x > 0 else 0.0


def ft_intervals(events: pd.DataFrame) -> tuple[list[tuple[float, float]],
                                                 list[tuple[float, float]]]:
    """Per-step fault tolerance (torchft) in the wall-clock: the discarded steps
    (``step_discarded``: ``detail.start_time`` to the event) and the quorum waits of the
    groups taking part in the quorum (``quorum`` with ``detail.participating`` true:
    ``detail.blocked_s`` before the event). A group not taking part (healing, joining)
    waits alone while the others train, so its wait is not the job's."""
    ev = events
    if not len(ev) or not ev.kind.isin([EventKind.STEP_DISCARDED, EventKind.QUORUM]).any():
        return [], []
    discarded, quorum = [], []
    sel = ev[ev.kind == EventKind.STEP_DISCARDED]
    for t, d in zip(sel.time.astype(float), details(sel)):
        length = _seconds(d.get("duration_s"))
        start = d.get("start_time")
        start = t - length if not isinstance(start, (int, float)) else float(start)
        if t > start:
            discarded.append((start, t))
    sel = ev[ev.kind == EventKind.QUORUM]
    for t, d in zip(sel.time.astype(float), details(sel)):
        blocked = _seconds(d.get("blocked_s"))
        if blocked > 0 and d.get("participating", True) is not False:
            quorum.append((t - blocked, t))
    return discarded, quorum


def union(ivs: list[tuple[float, float]]) -> np.ndarray:
    """Sorted, merged intervals as an (n, 2) array."""
    if not ivs:
        return np.zeros((0, 2))
    arr = sorted((a, b) for a, b in ivs if b > a)
    out: list[list[float]] = []
    for a, b in arr:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return np.array(out) if out else np.zeros((0, 2))


def subtract(ivs: np.ndarray, minus: np.ndarray) -> np.ndarray:
    """``ivs`` with the parts covered by ``minus`` removed (both merged and sorted)."""
    out = []
    for a, b in ivs:
        cur = a
        for c, d in minus:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return np.array(out) if out else np.zeros((0, 2))


def covers(ivs: np.ndarray, t: float) -> bool:
    """Whether the merged intervals ``ivs`` contain instant ``t``."""
    if not len(ivs):
        return False
    i = int(np.searchsorted(ivs[:, 0], t, side="right")) - 1
    return i >= 0 and ivs[i, 1] > t


def overlap(ivs: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of ``[a_i, b_i]`` covered by the merged intervals ``ivs`` (vectorised)."""
    if not len(ivs) or not len(a):
        return np.zeros(len(a))
    finite = np.where(np.isinf(ivs[:, 1]), np.maximum(ivs[:, 0], np.max(b)), ivs[:, 1])
    bounds = np.column_stack([ivs[:, 0], finite]).ravel()
    cum = np.concatenate([[0.0], np.cumsum(np.where(np.arange(len(bounds) - 1) % 2 == 0,
                                                     np.diff(bounds), 0.0))])

    def covered_until(t: np.ndarray) -> np.ndarray:
        return np.interp(t, bounds, cum, left=0.0, right=cum[-1])
    return np.clip(covered_until(b) - covered_until(a), 0, None)
