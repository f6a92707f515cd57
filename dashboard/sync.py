"""Callbacks that keep a view and its URL in step, and the pieces every run page shares.

Why it exists: a link must reproduce what a page shows. Each page's controls are mirrored
into the URL's query as they change (:mod:`goodlens.dashboard.urlstate` names the keys), and
the page is seeded from it when opened. The range picker, its link to the rolling goodput's
zoom, the refresh period and the "last updated" mark are the same on every run page, and the
comparison page has one callback. Like every callback here: thin, no statistics.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import dash
from dash import Input, Output, State

from goodlens.dashboard import views
from goodlens.dashboard.urlstate import (
    make_query,
    parse_path,
    parse_query,
    window_choice,
    window_texts,
)

NO = dash.no_update

#: Per page: the controls mirrored into the URL, as ``(component id, query key)``.
MIRRORED: dict[str, tuple[tuple[str, str], ...]] = {
    "overview": (("overview-exclude", "exclude"),),
    "ranks": (("ranks-attempt", "attempt"), ("ranks-pool", "pool"), ("ranks-span", "span")),
    "checkpoints": (("ckpt-price", "price"), ("ckpt-retained", "retained")),
    "whatif": (("whatif-interval", "interval"), ("whatif-mode", "mode"),
               ("whatif-elastic", "elastic"), ("whatif-spares", "spares"),
               ("whatif-evict", "evict")),
    "cluster": (("cluster-preset", "preset"), ("cluster-seed", "seed")),
    "compare": (("compare-pick", "runs"),),
    "runs": (("runs-sort", "sort"), ("runs-order", "order"), ("runs-state", "state"),
             ("runs-q", "q"), ("runs-page", "page")),
}
#: Run pages that carry the range picker and the refresh control.
BAR_PAGES = ("overview", "ranks", "checkpoints")
#: Defaults left out of the URL (a plain link stays plain).
DEFAULTS = {"attempt": "latest", "pool": "max", "span": "latest", "retained": "2",
            "sort": "start", "order": "desc", "page": "1"}


def register_view_callbacks(app: dash.Dash, data: Any) -> None:
    """The range picker, zoom-to-window, refresh period, last-updated mark, the comparison,
    and the URL mirror of every page's controls."""
    @app.callback(Output("win-preset", "value"), Output("win-since", "value"),
                  Output("win-until", "value"), Input("win-preset", "value"),
                  Input("win-since", "value"), Input("win-until", "value"),
                  prevent_initial_call=True)
    def window(preset: str, since: str | None, until: str | None) -> tuple:
        """A preset fills the texts (``-1h``, ...); typed texts pick the preset they are."""
        if dash.ctx.triggered_id == "win-preset":
            if preset == "custom":
                return NO, NO, NO
            lo, hi = window_texts(preset, since, until)
            return NO, (lo if lo != (since or "") else NO), (hi if hi != (until or "") else NO)
        chosen = window_choice({"since": since or "", "until": until or ""})[0]
        return (chosen if chosen != preset else NO), NO, NO

    @app.callback(Output("win-since", "value", allow_duplicate=True),
                  Output("win-until", "value", allow_duplicate=True),
                  Input("series-graph", "relayoutData"), Input("timeline-graph", "relayoutData"),
                  prevent_initial_call=True)
    def zoom(series: dict | None, timeline: dict | None) -> tuple:
        """Zooming either time graph sets the window; a double-click (autorange) clears it."""
        r = series if dash.ctx.triggered_id == "series-graph" else timeline
        return zoom_window(r)

    @app.callback(Output("tick", "interval"), Output("tick", "disabled"),
                  Input("refresh", "value"))
    def refresh(period: Any) -> tuple:
        s = float(period or 0)
        return (int(s * 1000) if s > 0 else NO), not s > 0

    @app.callback(Output("last-updated", "children"), Input("tick", "n_intervals"),
                  Input("url", "pathname"))
    def updated(_: Any, pathname: str | None) -> Any:
        kind, run_id = parse_path(pathname)
        if kind not in BAR_PAGES or run_id is None:
            return NO
        info = data.store.run(run_id) or {}
        last = info.get("last_time")
        return views.last_updated(time.time(), None if last is None else float(last))

    @app.callback(Output("compare-body", "children"), Input("compare-pick", "value"))
    def compare(picked: list[str] | None) -> Any:
        return views.compare_body(data.compare(list(picked or [])))

    defaults = {**DEFAULTS, "refresh": _value_text("refresh", data.config.refresh_s)}
    for page, controls in MIRRORED.items():
        _mirror(app, page, controls, parse_path, defaults)
    # the bar's controls are on three pages: one mirror of their own (a callback whose
    # inputs are only partly on the page would be an error in the browser)
    _mirror(app, "bar", (("win-since", "since"), ("win-until", "until"),
                         ("refresh", "refresh")), parse_path, defaults)
    _mirror_cluster_sides(app)


def zoom_window(r: dict | None) -> tuple:
    """``(since, until)`` texts from a graph's ``relayoutData`` (ISO 8601 to the second);
    ``("", "")`` for an autorange; ``NO`` when the event is not an x zoom."""
    if not r:
        return NO, NO
    if r.get("xaxis.autorange"):
        return "", ""
    lo, hi = r.get("xaxis.range[0]"), r.get("xaxis.range[1]")
    if lo is None and isinstance(r.get("xaxis.range"), list):
        lo, hi = r["xaxis.range"][:2]
    if lo is None or hi is None:
        return NO, NO
    return _iso(lo), _iso(hi)


def _iso(t: Any) -> str:
    """A Plotly date (``2026-01-01 01:02:03.456``) as ISO 8601 UTC to the second."""
    when = dt.datetime.fromisoformat(str(t).strip().replace(" ", "T"))
    return when.replace(microsecond=0, tzinfo=None).isoformat()


def _value_text(key: str, v: Any) -> str:
    """A control's value as its query text (lists joined; the evict box as 1/0)."""
    if key == "evict":
        return "1" if v and "evict" in v else "0"
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return "" if v is None else str(v)


def _mirror(app: dash.Dash, page: str, pairs: tuple[tuple[str, str], ...],
            parse_path: Any, defaults: dict[str, str]) -> None:
    """One callback writing ``page``'s controls (``bar``: the window and refresh period of
    any run page) into the URL's query, keeping the keys others set."""

    @app.callback(Output("url", "search", allow_duplicate=True),
                  *[Input(cid, "value") for cid, _ in pairs],
                  State("url", "search"), State("url", "pathname"), prevent_initial_call=True)
    def mirror(*values: Any) -> Any:
        *vals, search, pathname = values
        if parse_path(pathname)[0] not in ((page,) if page != "bar" else BAR_PAGES):
            return NO
        q = parse_query(search)
        for (_, key), v in zip(pairs, vals):
            text = _value_text(key, v)
            if text == "" or defaults.get(key) == text:
                q.pop(key, None)
            else:
                q[key] = text
        new = make_query(q)
        return new if new != (search or "") else NO
    mirror.__name__ = f"mirror_{page}"


def _mirror_cluster_sides(app: dash.Dash) -> None:
    """The cluster page's two policy sets, as policy strings ``a`` and ``b``."""
    from goodlens.dashboard.cluster import policy_spec
    sides = [Input(f"cluster-{s}-{w}", "value") for s in "ab"
             for w in ("levers", "preempt", "spares")]

    @app.callback(Output("url", "search", allow_duplicate=True), *sides,
                  State("url", "search"), prevent_initial_call=True)
    def mirror_sides(a_lv: Any, a_pre: Any, a_sp: Any, b_lv: Any, b_pre: Any, b_sp: Any,
                     search: str | None) -> Any:
        q = parse_query(search)
        for key, lv, pre, sp in (("a", a_lv, a_pre, a_sp), ("b", b_lv, b_pre, b_sp)):
            try:
                n = max(int(float(sp or 0)), 0)
            except (TypeError, ValueError):
                n = 0
            q[key] = policy_spec({**{k: k in (lv or []) for k in ("gang", "topo", "fair")},
                                  "preempt": pre, "spares": n})
        new = make_query(q)
        return new if new != (search or "") else NO
