"""The Nodes page: which hosts fail or straggle in job after job, and which to drain.

The node table (:mod:`goodlens.analysis.nodes`, read by :mod:`goodlens.storage.nodeio`)
over the store's runs of the last ``window`` (the URL's ``?days=``, default 7): a plot of
each host's incidents against its hours with the fleet's rate as a line, the hosts to
drain in red, and the table of the hosts to drain and the next most significant. The
figure builder is pure (a frame in, a figure out); the page is built once per visit, in
the routing callback.
"""

from __future__ import annotations

import time
from typing import Any

import plotly.graph_objects as go
from dash import dcc, html

from goodlens.analysis.nodes import NodeInputs, NodeTable, node_table
from goodlens.storage import nodeio

_LAYOUT = {"template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 40, "b": 50}}
_SHOWN = [("host", "host"), ("verdict", "verdict"), ("hours", "hours"),
          ("incidents", "incidents"), ("failures", "failures"), ("stragglers", "stragglers"),
          ("exclusions", "exclusions"), ("rate_ratio", "x fleet"), ("q_value", "BH q"),
          ("evidence", "evidence")]


def nodes_figure(t: NodeTable) -> go.Figure:
    """Incidents against hours observed, one point per host; the line is the fleet's rate
    (where a host like the others falls), the hosts to drain in red."""
    rows = t.rows
    fig = go.Figure()
    for verdict, color in (("ok", "#7f8c8d"), ("drain", "#c0392b")):
        part = rows[rows.verdict == verdict]
        fig.add_trace(go.Scatter(
            x=part.hours, y=part.incidents, mode="markers", name=verdict,
            marker={"color": color, "size": 9 if verdict == "drain" else 6},
            text=part.host, hovertemplate="%{text}: %{y} incident(s) in %{x:.1f} h"
                                          "<extra></extra>"))
    if t.rate_per_hour is not None and len(rows):
        top = float(rows.hours.max())
        fig.add_trace(go.Scatter(x=[0, top], y=[0, top * t.rate_per_hour], mode="lines",
                                 name="the fleet's rate", line={"dash": "dash",
                                                                "color": "#34495e"}))
    fig.update_layout(**_LAYOUT, title="Incidents per host against hours observed",
                      xaxis_title="hours observed", yaxis_title="incidents")
    return fig


def _cells(r: dict[str, Any]) -> list[str]:
    out = []
    for key, _ in _SHOWN:
        v = r[key]
        if isinstance(v, float):
            v = "-" if v != v else (f"{v:.2g}" if key == "q_value" else f"{v:.1f}")
        out.append(str(v))
    return out


def nodes_body(t: NodeTable, days: float) -> html.Div:
    """The page for a computed table."""
    drain = t.drain()
    head = (f"{t.hosts} hosts, {t.hours:,.0f} host-hours and {t.incidents} incidents in the "
            f"last {days:g} days. Test: each host's incidents against the fleet's rate "
            f"(exact binomial), Benjamini-Hochberg at q = {t.q:g}.")
    shown = t.rows.head(max(20, len(drain)))
    table = html.Table([html.Thead(html.Tr([html.Th(h) for _, h in _SHOWN])),
                        html.Tbody([html.Tr([html.Td(c) for c in _cells(r)],
                                            className="gl-drain" if r["verdict"] == "drain"
                                            else "")
                                    for r in shown.to_dict("records")])],
                       id="nodes-table", className="gl-table")
    return html.Div([
        html.P(head, className="gl-note"),
        html.P("Drain: " + (", ".join(drain) if drain else "none"), id="nodes-drain"),
        dcc.Graph(id="nodes-graph", figure=nodes_figure(t)), table,
        html.P("goodlens nodes --drain-list prints these names for a scheduler's drain or "
               "cordon command (docs/nodes.md).", className="gl-note")])


def nodes_layout(store: Any, query: dict[str, str], now: float | None = None) -> html.Div:
    """The Nodes page over ``store`` (the routing callback calls it)."""
    try:
        days = float(query.get("days") or 7)
    except ValueError:
        days = 7.0
    now = time.time() if now is None else now
    t = node_table(NodeInputs(**nodeio.read_duckdb(store)), since=now - days * 86400,
                   until=now)
    return html.Div([html.H2("Nodes"), nodes_body(t, days)])


__all__ = ["nodes_body", "nodes_figure", "nodes_layout"]
