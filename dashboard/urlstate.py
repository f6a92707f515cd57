"""What a page shows, as its URL's query string, and back.

Why it exists: a link must reproduce a view. Every control of a page (the time window,
the exclusions, the attempt, the what-if inputs, the cluster policies, the runs compared,
the GPU-hour price, the refresh period) is mirrored into ``?key=value&...`` as it changes,
and a page opened from a URL seeds its controls from it. One module reads and writes the
query, so the names stay the same everywhere (docs/dashboard.md lists them).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

from goodlens.analysis.window import PRESETS

#: The pages of a run: path segment and title.
PAGES = (("overview", "Overview"), ("ranks", "Ranks"), ("checkpoints", "Checkpoints"),
         ("whatif", "What-if"))

#: Query keys a run page keeps when the user moves to another page of the run (the window,
#: the price and the refresh period are the view's, not one page's).
SHARED_KEYS = ("since", "until", "price", "refresh")

#: Refresh periods the live pages offer, seconds (0: off).
REFRESH_CHOICES = (0, 5, 15, 60)


def parse_query(search: str | None) -> dict[str, str]:
    """``?since=-1h&runs=a,b`` -> ``{"since": "-1h", "runs": "a,b"}`` (the last of a repeated
    key wins; empty values are dropped)."""
    return {k: v for k, v in parse_qsl((search or "").lstrip("?"), keep_blank_values=False)}


def make_query(values: dict[str, Any]) -> str:
    """The query string of ``values`` (None, empty strings and empty lists left out), with a
    leading ``?`` (or ``""`` when nothing is left). Lists are joined with commas."""
    items = []
    for k, v in values.items():
        if isinstance(v, (list, tuple)):
            v = ",".join(str(x) for x in v)
        if v is None or v == "":
            continue
        items.append((k, str(v)))
    return "?" + urlencode(items, safe=",:@") if items else ""


def shared(query: dict[str, str]) -> dict[str, str]:
    """The part of a run page's query that follows the user to the run's other pages."""
    return {k: query[k] for k in SHARED_KEYS if k in query}


def window_choice(query: dict[str, str]) -> tuple[str, str, str]:
    """``(preset, since, until)`` of the range picker from a query: a preset when ``since`` is
    one of :data:`goodlens.analysis.window.PRESETS` and there is no ``until``, ``all`` when
    neither is given, else ``custom`` with the texts as given."""
    since, until = query.get("since", ""), query.get("until", "")
    if not since and not until:
        return "all", "", ""
    for name, text in PRESETS.items():
        if since == text and not until:
            return name, since, ""
    return "custom", since, until


def window_texts(preset: str | None, since: str | None, until: str | None
                 ) -> tuple[str, str]:
    """The ``(since, until)`` texts the picker's state means (``""``: open)."""
    if preset in PRESETS:
        return PRESETS[preset], ""
    if preset == "custom":
        return (since or "").strip(), (until or "").strip()
    return "", ""


def number(query: dict[str, str], key: str) -> float | None:
    """A query value as a float (None when missing or not a number)."""
    try:
        v = float(query[key])
    except (KeyError, ValueError):
        return None
    return v if v == v else None


def href(path: str, query: dict[str, Any]) -> str:
    """``path`` with ``query`` (see :func:`make_query`)."""
    return quote(path, safe="/%") + make_query(query)


def parse_path(pathname: str | None) -> tuple[str, str | None]:
    """``/runs/a%2Fb/ranks`` -> ``("ranks", "a/b")``; ``/`` -> ``("runs", None)``;
    ``/cluster``, ``/compare`` and ``/nodes`` -> their page; anything else
    ``("unknown", None)``."""
    parts = [p for p in (pathname or "/").split("/") if p]
    if not parts:
        return "runs", None
    if parts[0] in ("cluster", "compare", "nodes") and len(parts) == 1:
        return parts[0], None
    if parts[0] != "runs" or len(parts) > 3:
        return "unknown", None
    if len(parts) == 1:
        return "runs", None
    page = parts[2] if len(parts) == 3 else "overview"
    if page not in dict(PAGES):
        return "unknown", None
    return page, unquote(parts[1])
