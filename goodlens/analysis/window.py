"""A time window of a run, as ``goodlens report --since --until`` reads one.

Why it exists: the report's window and the dashboard's range picker must pick the same
instants from the same text (epoch seconds, ISO 8601, ``+2h`` after the run's start, ``-30m``
before its end), or the numbers on the page and the command's would differ for the same
URL. The dashboard's presets ("last 1 h", ...) are the ``-1h`` form: the last hour of the
run, up to its end (now, for a run in progress).
"""

from __future__ import annotations

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
