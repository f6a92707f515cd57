"""The report of a run: its accounting as plain JSON-ready data, and how quiet it has gone.

Why a module of its own: :mod:`goodlens.analysis.accounting` builds the partition of a run's
wall-clock; this is what every reader of a report shares on top of it (the HTTP API, the
CLI's ``report``, ``end-run`` and the dashboard): pick the run, read its attempts and step
summaries once, apply a window, and add the silence of a run in progress. Pure computation
over the store's read API (:class:`goodlens.storage.reader.RunReader`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas as pd

from goodlens.analysis.accounting import account_run
from goodlens.analysis.loops import run_restart_loop
from goodlens.analysis.window import as_known_at
from goodlens.analysis.worlds import attempt_worlds
from goodlens.model.jsonable import is_missing
from goodlens.storage.reader import RunReader


def report_dict(source: RunReader, run_id: str | None = None, since: str | float | None = None,
                until: str | float | None = None, now: float | None = None,
                hang_floor_s: float = 60.0, exclude: Iterable[str] = (),
                as_of: str | float | None = None) -> dict[str, Any]:
    """The report of one run (default: the most recently started), optionally a window:
    the run's breakdown plus one per attempt, as plain JSON-ready data (a run in progress
    also gets its :func:`run_silence`, with the hang timeout's floor ``hang_floor_s``).
    ``exclude`` takes named parts out of the wall-clock (``queue``, a custom label);
    ``as_of`` reports the run as it was known at that instant."""
    from goodlens.model.units import parse_instant

    if run_id is None:
        runs = source.runs()
        if not len(runs):
            raise KeyError("the store holds no runs yet")
        run_id = str(runs.iloc[0].run_id)
    attempts, steps = source.attempts(run_id), source.step_summaries(run_id)
    t = None
    if as_of is not None:
        if not len(attempts):
            raise KeyError(f"no run {run_id!r}")
        first = float(attempts.start.min())
        last = float(np.nanmax(attempts[["start", "end", "last_activity"]].to_numpy(float)))
        t = parse_instant(as_of, first, last)
        now = t
    acc = account_run(source, run_id, now=now, attempts=attempts, steps=steps, as_of=t)
    lo = parse_instant(since, acc.start, acc.end) if since is not None else None
    hi = parse_instant(until, acc.start, acc.end) if until is not None else None
    if lo is not None and hi is not None and hi < lo:
        raise ValueError("--until is before --since")
    exclude = [x for x in exclude if x]
    rep = acc.breakdown(lo, hi, exclude=exclude).as_dict()
    rep["attempts"] = [b.as_dict() for b in acc.by_attempt(exclude)
                       if lo is None and hi is None]
    rep["partial_steps"] = {**acc.failures, "note": _PARTIAL_NOTE} if acc.failures[
        "estimated"] else dict(acc.failures)
    rep["worlds"] = attempt_worlds(steps)  # per attempt: world, samples per optimizer step
    if lo is not None or hi is not None:  # the window asked for, and whether it meets the run
        rep["window"] = {"since": lo, "until": hi, "run_start": acc.start, "run_end": acc.end,
                         "overlaps_run": bool((lo is None or lo < acc.end)
                                              and (hi is None or hi > acc.start))}
    if t is not None:
        rep["as_of"] = t
    ft = _fault_tolerance(source, run_id, acc.start if lo is None else max(lo, acc.start),
                          acc.end if hi is None else min(hi, acc.end), t)
    if ft is not None:
        ft["quorum_s"] = (rep.get("other_parts") or {}).get("quorum", 0.0)  # the job's wait
        rep["fault_tolerance"] = ft
        rep["gpu_time_goodput"] = ft["gpu_time_goodput"]  # the groups' view: see ft.py
    # a loop of restarts that commit nothing (goodlens.analysis.loops); not for a past instant
    rep["restart_loop"] = None if t is not None else run_restart_loop(
        source, run_id, attempts, steps)
    if rep["in_progress"]:
        if t is not None:
            attempts, steps, _ = as_known_at(attempts, steps, pd.DataFrame(), t)
        rep["silence"] = run_silence(attempts, steps, now, hang_floor_s)
    return rep


def _fault_tolerance(source: RunReader, run_id: str, start: float, end: float,
                     as_of: float | None) -> dict[str, Any] | None:
    """The per-step fault tolerance section of a torchft run (None for any other run):
    each replica group's GPU-time, heals, recoveries and the sample view
    (:func:`goodlens.analysis.ft.ft_report`) over ``[start, end]`` (the run, or a window
    cut from it)."""
    import json

    from goodlens.analysis.ft import FT_KINDS, ft_report, is_ft_run

    info = source.run(run_id) or {}
    tags = info.get("tags")
    try:
        tags = json.loads(tags) if isinstance(tags, str) else (tags or {})
    except ValueError:
        return None
    if not is_ft_run(tags):
        return None
    steps = source.steps(run_id)
    events = source.events(run_id, kinds=list(FT_KINDS))
    if as_of is not None:
        steps = steps[steps.start_time.astype(float) + steps.duration_s.astype(float)
                      <= as_of]
        events = events[events.time <= as_of]
    per_rank = info.get("gpus_per_rank")
    return ft_report(tags, steps, events, start, end,
                     gpus_per_rank=1 if is_missing(per_rank) else int(per_rank) or 1)


_PARTIAL_NOTE = ("no `failure` event says when these failures happened: the step in flight "
                 "at each is estimated as one median step of recompute, the rest detection")


def run_silence(attempts: pd.DataFrame, steps: pd.DataFrame, now: float | None = None,
                hang_floor_s: float = 60.0) -> dict[str, Any]:
    """For a run in progress (its attempts and step summaries): how long its current
    attempt has been quiet, the timeout its step rhythm gives, and whether it is past it
    (``silent``: hung, or gone without an end event; ``goodlens end-run`` ends it)."""
    from goodlens.detectors.hangs import HangConfig, silence

    last = attempts.sort_values("attempt").iloc[-1]
    steps = steps[steps.attempt == int(last["attempt"])] if len(steps) else steps
    clock = time.time() if now is None else now
    start, activity = last.get("start"), last.get("last_activity")
    if is_missing(activity):
        activity = clock if is_missing(start) else start
    s = silence(steps.step_end.to_numpy(dtype=float) if len(steps) else np.zeros(0),
                float(activity), clock, HangConfig(min_timeout_s=hang_floor_s))
    return {"attempt": int(last["attempt"]), "last_activity": s.last_activity,
            "silent_s": s.silent_s, "timeout_s": s.timeout_s, "silent": s.silent}


def run_goodput(source: RunReader, run_id: str) -> tuple[float | None, float | None]:
    """``(goodput, wall-clock s)`` of a run accounted from its rows (one no collector has
    accounted: an imported trace); ``(None, None)`` when it cannot be accounted or has no
    wall-clock yet."""
    try:
        b = account_run(source, run_id).breakdown()
    except (KeyError, ValueError):
        return None, None
    return (b.goodput, b.wall_clock_s) if b.wall_clock_s > 0 else (None, None)


def fill_goodput(rows: list[dict[str, Any]],
                 account: Callable[[dict[str, Any]], dict[str, Any]], *,
                 every: Callable[[], list[dict[str, Any]]] | None = None,
                 unknown_after: Callable[[], bool] | None = None,
                 by_goodput: bool = False, descending: bool = True, offset: int = 0,
                 limit: int | None = None,
                 progress: Callable[[list[dict[str, Any]]], Iterable[dict[str, Any]]] = iter
                 ) -> list[dict[str, Any]]:
    """A page of the runs list (``RunReader.runs_page``'s rows, as dicts) with a goodput
    for each run the store holds none for: ``account(row)`` gives the fields to set
    (``goodput``, and ``wall_clock_s`` if wanted), for the rows that have a start;
    ``progress`` wraps the rows being accounted (a progress bar).

    Sorted ``by_goodput`` with a run lacking one (on the page, or after it:
    ``unknown_after()``, e.g. whether the store's last row of the list has none, as it sorts
    them last), the store's order is not the answer: ``every()`` gives every matching row,
    each is filled, and they are ordered here as the store orders known ones (by goodput,
    ``descending`` or not, ties by run id, unknown last) before the page
    ``[offset:offset + limit]`` is cut. The CLI's ``runs --db`` and the dashboard's runs
    list share it."""
    unknown = any(is_missing(r.get("goodput")) for r in rows) or (
        unknown_after is not None and unknown_after())
    if by_goodput and every is not None and unknown:
        rows = _filled(every(), account, progress)
        rows.sort(key=lambda r: str(r["run_id"]))
        rows.sort(key=lambda r: r["goodput"] or 0.0, reverse=descending)  # stable
        rows.sort(key=lambda r: r["goodput"] is None)  # stable: unknown last
        return rows[offset:None if limit is None else offset + limit]
    return _filled(rows, account, progress)


def _filled(rows: list[dict[str, Any]], account: Callable[[dict[str, Any]], dict[str, Any]],
            progress: Callable[[list[dict[str, Any]]], Iterable[dict[str, Any]]]
            ) -> list[dict[str, Any]]:
    todo = [r for r in rows if is_missing(r.get("goodput")) and not is_missing(r.get("start"))]
    for r in rows:
        if is_missing(r.get("goodput")):
            r["goodput"] = None
    for r in progress(todo):
        r.update(account(r))
    return rows
