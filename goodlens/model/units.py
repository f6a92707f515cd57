"""Human durations, sizes and instants on the command line (``90s``, ``64MiB``, ``2GB/s``,
``2026-01-01T06:00``); seconds and bytes everywhere else. The one parser of each."""

from __future__ import annotations

import math
import re
import time

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min|h|d|w)?\s*$")


def parse_duration(text: str | float | int) -> float:
    """Seconds in ``text``: a bare number is seconds; units ms, s, m/min, h, d, w.

    Compound forms such as ``1h30m`` are accepted. Raises ``ValueError`` with an example of
    a valid value when the text is not a duration.
    """
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"duration must not be negative: {text}")
        return float(text)
    s = str(text).strip().lower()
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|min|s|m|h|d|w)", s)
    if parts and re.fullmatch(r"(?:\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|min|s|m|h|d|w))+\s*", s):
        return sum(float(n) * _UNITS[u] for n, u in parts)
    m = _RE.match(s)
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 5m, 24h, 1h30m or seconds)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str | float | int) -> float:
    """Bytes in ``text``: ``64MiB``, ``1GB``, ``1.5e9`` (decimal kB/MB/GB/TB, binary
    KiB/MiB/GiB/TiB); a trailing ``/s`` is ignored, so bandwidths parse too (``2GB/s``)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        t = str(text).strip().lower().removesuffix("/s").strip()
        m = re.fullmatch(r"(\d+(?:\.\d*)?(?:e[+-]?\d+)?|\.\d+)\s*([a-z]*)", t)
        if not m or m.group(2) not in _BYTE_UNITS:
            raise ValueError(f"not a size: {text!r} (use e.g. 64MiB, 1GB, 2GB/s or bytes)")
        value = float(m.group(1)) * _BYTE_UNITS[m.group(2)]
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"size must be a finite number of bytes >= 0, got {text!r}")
    return value


def format_duration(seconds: float) -> str:
    """A short human form: ``1h 02m``, ``3m 05s``, ``12.3s``, ``450ms``."""
    if seconds != seconds:  # NaN
        return "n/a"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 1:
        return f"{sign}{s * 1000:.0f}ms"
    if s < 60:
        return f"{sign}{s:.1f}s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m {int(s % 60):02d}s"
    if s < 86400:
        return f"{sign}{int(s // 3600)}h {int(s % 3600 // 60):02d}m"
    return f"{sign}{int(s // 86400)}d {int(s % 86400 // 3600):02d}h"


def format_instant(t: float, seconds: bool = True) -> str:
    """Epoch seconds as ``2026-01-01 06:00:00 UTC`` (to the minute without ``seconds``)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC" if seconds else "%Y-%m-%d %H:%M UTC",
                         time.gmtime(t))


def parse_instant(text: str | float, start: float | None = None, end: float | None = None) -> float:
    """An instant in epoch seconds from the command line.

    Accepts epoch seconds (``1767225600``), an ISO 8601 time (``2026-01-01T06:00``, UTC
    unless it carries an offset), ``+DURATION`` after ``start`` (``+2h``: two hours into the
    run) or ``-DURATION`` before ``end`` (``-30m``: the last half hour).
    """
    import datetime as dt

    if isinstance(text, (int, float)):
        if not math.isfinite(text):
            raise ValueError(f"not a time: {text!r}")
        return float(text)
    s = str(text).strip()
    if not s:
        raise ValueError("an empty time: give epoch seconds, an ISO 8601 time, +DURATION or "
                         "-DURATION")
    if s[0] in "+-":  # relative, always: "-30" is 30 s before the end, not epoch -30
        ref = start if s[0] == "+" else end
        if ref is None:
            raise ValueError(f"{text!r} is relative to the run, but the run has no "
                             f"{'start' if s[0] == '+' else 'end'} yet")
        delta = parse_duration(s[1:])
        return ref + delta if s[0] == "+" else ref - delta
    if _is_number(s):
        value = float(s)
        if not math.isfinite(value):
            raise ValueError(f"not a time: {text!r}")
        return value
    try:
        when = dt.datetime.fromisoformat(s)
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use epoch seconds, an ISO time such as "
                         "2026-01-01T06:00, +2h from the run's start or -30m before its end)"
                         ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def require_number(label: str, v: object, *, zero_ok: bool = False, integer: bool = False,
                   upper: tuple[str, float] | None = None) -> None:
    """Raise ValueError naming ``label`` (``"Spec.field"``, ``"fn: input"``) unless ``v`` is
    a finite number > 0 (>= 0 with ``zero_ok``), an int when ``integer``, and below
    ``upper``'s value if given. Shared by the planners' input checks."""
    ok = (not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)
          and (v >= 0 if zero_ok else v > 0) and (not integer or isinstance(v, int)))
    if not ok:
        what = "an integer" if integer else "a finite number"
        raise ValueError(f"{label} must be {what} {'>= 0' if zero_ok else '> 0'} (got {v!r})")
    if upper is not None and not v < upper[1]:  # type: ignore[operator]
        raise ValueError(f"{label} must be < {upper[0]} (got {v!r} >= {upper[1]!r})")
