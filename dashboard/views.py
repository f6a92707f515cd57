"""Layouts shared by the pages of a run, and the comparison page.

Why a module of its own: :mod:`goodlens.dashboard.pages` lays out one page each; this holds
what sits above every page of a run (the range picker, the refresh period, the "last
updated" mark) and the page that puts several runs' or attempts' breakdowns side by side.
Pure functions of their arguments, like ``pages``.
"""

from __future__ import annotations

from typing import Any

from dash import dcc, html

from goodlens.analysis.accounting import BUCKETS, RESTART_PARTS, STARTUP_PARTS
from goodlens.dashboard import figures as fig
from goodlens.dashboard.urlstate import REFRESH_CHOICES, number, window_choice
from goodlens.model.jsonable import is_missing
from goodlens.model.units import format_duration, format_instant

WINDOW_CHOICES = (("1h", "last 1 h"), ("6h", "last 6 h"), ("24h", "last 24 h"),
                  ("all", "all"), ("custom", "custom"))


def run_bar(query: dict[str, str], refresh_s: float, live_page: bool = True) -> html.Div:
    """The range picker (last 1 h / 6 h / 24 h / all / custom, as ``report --since
    --until`` reads them), the refresh period and the "last updated" mark of a run's pages,
    seeded from the URL's query."""
    preset, since, until = window_choice(query)
    period = number(query, "refresh")
    period = refresh_s if period is None else period
    choices = sorted({*REFRESH_CHOICES, int(period)} if period == int(period)
                     else {*REFRESH_CHOICES})
    return html.Div([
        html.Label("window "),
        dcc.RadioItems(id="win-preset", value=preset, inline=True,
                       options=[{"label": lbl, "value": v} for v, lbl in WINDOW_CHOICES],
                       style={"display": "inline-block"}),
        dcc.Input(id="win-since", type="text", value=since, debounce=True,
                  placeholder="since: ISO time, epoch s, +2h, -30m",
                  style={"width": "17em"}),
        dcc.Input(id="win-until", type="text", value=until, debounce=True,
                  placeholder="until (empty: the run's end)", style={"width": "15em"}),
        *([html.Label(" refresh "), dcc.Dropdown(
            id="refresh", clearable=False, value=int(period),
            options=[{"label": "off" if s == 0 else f"every {s} s", "value": s}
                     for s in choices],
            style={"width": "9em", "display": "inline-block", "verticalAlign": "middle"}),
           html.Span(id="last-updated", className="gl-note")] if live_page else []),
    ], className="gl-controls gl-run-bar", id="run-bar")


def last_updated(now: float, data_until: float | None) -> str:
    """The "last updated" mark: when the page last checked, and the newest data it holds."""
    mark = f" last updated {format_instant(now)}"
    if data_until is not None and not is_missing(data_until):
        mark += f"; data until {format_instant(data_until)}"
    return mark


# ---------------------------------------------------------------------------- compare
def compare_layout(choices: list[tuple[str, str]], picked: list[str]) -> html.Div:
    """The comparison page: pick runs or attempts (two or more), see their breakdowns."""
    return html.Div([
        html.H2("Compare runs"),
        html.P("Pick two or more runs, or attempts of a run: their breakdowns side by side, "
               "each with its difference from the first.", className="gl-note"),
        dcc.Dropdown(id="compare-pick", multi=True, value=picked,
                     options=[{"label": lbl, "value": v} for v, lbl in choices],
                     placeholder="runs or attempts to compare"),
        dcc.Loading(html.Div(id="compare-body"), delay_show=600),
    ])


def _delta(v: float | None, base: float | None, share: bool) -> str:
    if v is None or base is None:
        return ""
    d = v - base
    if abs(d) < 1e-9:
        return "0"
    if share:
        return f"{100 * d:+.1f} pt"
    return ("+" if d >= 0 else "-") + format_duration(abs(d))


def compare_body(items: list[dict[str, Any]]) -> html.Div:
    """The breakdowns of ``items`` (:meth:`goodlens.dashboard.data.RunData.compare`) side
    by side: goodput, wall-clock, each bucket and startup and restart part, and each item's
    difference from the first (time in the row's unit, shares in percentage points)."""
    ok = [it for it in items if "error" not in it]
    errors = [html.P(f"{it['item']}: {it['error']}", className="gl-error")
              for it in items if "error" in it]
    if len(ok) < 2:
        return html.Div([*errors, html.P("Pick at least two runs or attempts.",
                                          id="compare-empty", className="gl-note")])
    base = ok[0]
    head = ["", *(it["item"] for it in ok), *(f"{it['item']} - {base['item']}"
                                              for it in ok[1:])]
    lines: list[tuple[str, str, Any, bool]] = [
        ("goodput", "goodput", lambda b: b["goodput"], True),
        ("gpu-goodput", "goodput (GPU-time)", lambda b: b["gpu_time_goodput"], True),
        ("wall", "wall-clock", lambda b: b["wall_clock_s"], False)]
    for b in BUCKETS:
        lines.append((f"bucket-{b}", fig.label(b), lambda r, b=b: r["buckets"].get(b, 0.0),
                      False))
        if b in ("startup", "restart"):
            key = f"{b}_parts"
            lines += [(f"{b}-{p}", f"  {p}", lambda r, p=p, key=key: r.get(key, {}).get(p, 0.0),
                       False)
                      for p in (STARTUP_PARTS if b == "startup" else RESTART_PARTS)
                      if any(it.get(key, {}).get(p) for it in ok)]
    rows = []
    for key, name, get, share in lines:
        vals = [get(it) for it in ok]
        cells = [html.Td(name)]
        for i, v in enumerate(vals):
            text = "n/a" if v is None else (fig.pct(v) if share else format_duration(v))
            cells.append(html.Td(text, id=f"cmp-{i}-{key}",
                                 title="" if v is None else repr(float(v))))
        for i, v in enumerate(vals[1:], start=1):
            d = None if v is None or vals[0] is None else v - vals[0]
            cells.append(html.Td(_delta(v, vals[0], share), id=f"cmp-d{i}-{key}",
                                 title="" if d is None else repr(float(d))))
        rows.append(html.Tr(cells, id=f"cmp-row-{key}"))
    table = html.Table([html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(rows)],
                       className="gl-table", id="compare-table")
    return html.Div([*errors, table,
                     dcc.Graph(figure=compare_figure(ok), id="compare-graph")])


def compare_figure(items: list[dict[str, Any]]) -> Any:
    """Each item's breakdown as shares of its wall-clock, one stacked bar per item."""
    import plotly.graph_objects as go
    f = go.Figure(layout={"template": "plotly_white", "height": 360,
                          "margin": {"l": 60, "r": 20, "t": 40, "b": 40}})
    for b in BUCKETS:
        ys = [100 * (it["buckets"][b] or 0.0) / it["wall_clock_s"] if it["wall_clock_s"]
              else 0.0 for it in items]
        f.add_bar(x=[it["item"] for it in items], y=ys, name=fig.label(b),
                  marker_color=fig.BUCKET_COLORS[b],
                  hovertemplate=f"{fig.label(b)}: %{{y:.1f}}%<extra></extra>")
    f.update_layout(barmode="stack", yaxis={"title": "% of wall-clock", "range": [0, 100]},
                    title="Where the wall-clock went",
                    legend={"orientation": "h", "y": -0.2, "traceorder": "normal"})
    return f
