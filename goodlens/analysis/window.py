"""A time window of a run, as ``goodlens report --since --until`` reads one.

Why it exists: the report's window and the dashboard's range picker must pick the same
instants from the same text (epoch seconds, ISO 8601, ``+2h`` after the run's start, ``-30m``
before its end), or the numbers on the page and the command's would differ for the same
URL. The dashboard's presets ("last 1 h", ...) are the ``-1h`` form: the last hour of the
run, up to its end (now, for a run in progress). A page that does not account the run (the
ranks page) reads the run's start and end from its attempts (:func:`run_span`), as the
accounting does. A window read as it stood at an instant (``--as-of``, without the
hindsight of later rollbacks) takes the run's rows as they were then (:func:`as_known_at`).
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from goodlens.model.jsonable import is_missing
from goodlens.model.units import parse_instant

#: The range picker's presets: name -> ``since`` (no ``until``: up to the run's end).
PRESETS: dict[str, str] = {"1h": "-1h", "6h": "-6h", "24h": "-24h"}


def resolve_window(since: str | float | None, until: str | float | None, start: float,
                   end: float) -> tuple[float | None, float | None]:
    """``(lo, hi)`` epoch seconds of a window given as text (either None: that side open),
    relative forms read against the run's ``start`` and ``end``; ValueError for text that
    is not a time, or an end before the start."""
    lo = parse_instant(since, start, end) if since not in (None, "") else None
    hi = parse_instant(until, start, end) if until not in (None, "") else None
    if lo is not None and hi is not None and hi < lo:
        raise ValueError("the window's end (until) is before its start (since)")
    return lo, hi


def run_span(attempts: pd.DataFrame, now: float | None = None) -> tuple[float, float] | None:
    """``(start, end)`` of a run from its attempts (``RunReader.attempts``), as its
    accounting reads them (what a relative window is read against): the first attempt's
    start, and the last one's end, or for a run in progress the later of now and its last
    activity. None for a run with no attempt."""
    if not len(attempts):
        return None
    a = attempts.sort_values("attempt")
    last = a.iloc[-1]
    if is_missing(last["end"]):
        clock = time.time() if now is None else now
        end = clock if is_missing(last.get("last_activity")) else max(
            clock, float(last["last_activity"]))
    else:
        end = float(last["end"])
    return float(a.iloc[0]["start"]), end


def window_of(since: str | float | None, until: str | float | None,
              attempts: pd.DataFrame, now: float | None = None
              ) -> tuple[float | None, float | None]:
    """:func:`resolve_window` against the run of ``attempts`` (:func:`run_span`);
    ``(None, None)`` when no window is given. ValueError as :func:`resolve_window`."""
    if since in (None, "") and until in (None, ""):
        return None, None
    span = run_span(attempts, now)
    if span is None:
        raise ValueError("the run has no attempt to read the window against")
    return resolve_window(since, until, *span)


def as_known_at(attempts: pd.DataFrame, steps: pd.DataFrame, events: pd.DataFrame,
                t: float) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """A run's attempts, step summaries and events as they stood at instant ``t``: the
    steps that had ended and the events that had happened by then, attempts started by
    then, and an attempt that ended (or was found to have failed) after ``t`` still in
    progress. So a window reads as it did during an incident, without the hindsight of
    later rollbacks. Rows are taken as known when they happened (an exporter's delivery
    delay, seconds, is not modelled). ValueError if the run had not started by ``t``."""
    a = attempts[attempts.start.astype(float) <= t].copy() if len(attempts) else attempts
    if not len(a):
        raise ValueError("the run had not started at --as-of")
    a = a.sort_values("attempt").reset_index(drop=True)
    ended_later = a.end.isna().to_numpy() | (a.end.astype(float) > t).to_numpy()
    # a failure inferred from a later attempt is unknown until that attempt starts
    ended_later[-1] = ended_later[-1] or a.end_reason.iloc[-1] == "unknown"
    a.loc[ended_later, "end"] = np.nan
    a["end_reason"] = a.end_reason.astype(object)
    a.loc[ended_later, "end_reason"] = None
    a["last_activity"] = np.minimum(a.last_activity.astype(float).fillna(t), t)
    if len(steps):
        done = steps.step_end if "step_end" in steps else steps.step_start + \
            steps.duration_median
        steps = steps[(done.astype(float) <= t).to_numpy()
                      & steps.attempt.isin(a.attempt).to_numpy()]
    if len(events):
        events = events[events.time.astype(float) <= t]
    return a, steps, events
