"""The cluster what-if page: two scheduling policy sets on the same simulated cluster.

Operators ask what gang scheduling, topology-aware placement, checkpoint-on-preempt, fair
share and a shared spare pool would buy them. The page runs
:func:`goodlens.analysis.clustersim.sim.compare` (same seed, same jobs and failures for both sides)
and
shows the cluster numbers side by side, where the node-hours went, each owner's share and
wait, and the allocation over time. Figure builders here are pure (plain dicts in, Plotly
figures out); the callback only parses the form and asks the app's :class:`CompareCache`.
"""

from __future__ import annotations

import functools
from typing import Any

import plotly.graph_objects as go
from dash import Input, Output, dcc, html
from plotly.subplots import make_subplots

from goodlens.analysis.clusterrows import cluster_rows, format_delta, format_value
from goodlens.dashboard.figures import BUCKET_COLORS, label

DEFAULT_A = {"gang": True, "topo": False, "fair": False, "preempt": "none", "spares": 0}
DEFAULT_B = {"gang": True, "topo": True, "fair": True, "preempt": "ckpt", "spares": 8}
_LAYOUT = {"template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 40, "b": 40}}


def policy_spec(side: dict[str, Any]) -> str:
    """The form's levers as a policy string (``gang,topo,ckpt-preempt,fair,spares=8``)."""
    return ",".join([
        "gang" if side.get("gang") else "partial", "topo" if side.get("topo") else "random",
        {"ckpt": "ckpt-preempt", "kill": "kill-preempt"}.get(side.get("preempt") or "none",
                                                             "no-preempt"),
        "fair" if side.get("fair") else "fifo", f"spares={int(side.get('spares') or 0)}"])


class CompareCache:
    """``compare`` for the page, remembered per app (a preset, two specs and a seed always
    give one answer; the 16 most recent are kept). No module state: each app has its own."""

    def __init__(self, size: int = 16) -> None:
        self.run = functools.lru_cache(maxsize=size)(self._compare)

    @staticmethod
    def _compare(preset: str, spec_a: str, spec_b: str, seed: int) -> dict[str, Any]:
        from goodlens.analysis.clustersim.config import get_cluster_preset
        from goodlens.analysis.clustersim.sim import compare
        return compare(get_cluster_preset(preset), spec_a, spec_b, seed)


def fmt_metric(value: float | None, kind: str) -> str:
    """A metric as the table shows it (the CLI's way: :mod:`goodlens.analysis.clusterrows`)."""
    return format_value(value, kind)


def metric_rows(result: dict[str, Any]) -> list[list[str]]:
    """Rows of the side-by-side table: metric, A, B, B - A; the same rows, names and order
    as ``goodlens simulate cluster --compare`` (:data:`CLUSTER_ROWS`)."""
    return [[r["label"], r["a"], r["b"], r["delta"]]
            for r in cluster_rows(result["a"]["cluster"], result["b"]["cluster"])]


def fmt_delta(d: float | None, kind: str) -> str:
    """B - A: signed, ``0`` when equal, shares in percentage points."""
    return "-" if d is None else format_delta(0.0, d, kind)


def side_from_spec(spec: str | None, default: dict[str, Any]) -> dict[str, Any]:
    """The form's levers from a policy string (:func:`policy_spec`'s form, as a shared
    link carries it); ``default`` for a missing or unreadable one."""
    if not spec:
        return dict(default)
    parts = {p.strip() for p in spec.split(",") if p.strip()}
    spares = next((p.split("=", 1)[1] for p in parts if p.startswith("spares=")), "0")
    return {"gang": "partial" not in parts, "topo": "topo" in parts, "fair": "fair" in parts,
            "preempt": "ckpt" if "ckpt-preempt" in parts else
            "kill" if "kill-preempt" in parts else "none",
            "spares": int(spares) if spares.isascii() and spares.isdigit()
            and len(spares) <= 6 else 0}


def node_hours_figure(result: dict[str, Any]) -> go.Figure:
    """Left: the cluster's node-hours (allocated, held idle, spare pool, free, down; they sum
    to nodes x duration). Right: the jobs' node-hours in ``goodlens report``'s buckets (job
    wall-clock x nodes; a restart's queue wait holds no node, so the two totals differ)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "cluster node-hours", "job node-hours by bucket"))
    sides = [("a", "A"), ("b", "B")]
    xs = [n for _, n in sides]
    cluster = [("allocated", "allocated to jobs", "#98df8a"),
               ("held_idle", "held idle (partial grants)", "#c7c7c7"),
               ("spare_idle", "spare pool idle", "#dbdb8d"), ("free_idle", "free", "#e8e8e8"),
               ("down", "down (failed)", "#525252")]
    for key, name, colour in cluster:
        ys = [result[s]["cluster"]["node_seconds"].get(key, 0.0) / 3600 for s, _ in sides]
        fig.add_bar(x=xs, y=ys, name=name, marker_color=colour, row=1, col=1,
                    hovertemplate=f"{name}: %{{y:,.0f}} node-h<extra></extra>")
    for b in BUCKET_COLORS:
        key = "productive" if b == "productive" else f"job_{b}"
        ys = [result[s]["cluster"]["node_seconds"].get(key, 0.0) / 3600 for s, _ in sides]
        fig.add_bar(x=xs, y=ys, name=label(b), marker_color=BUCKET_COLORS[b], row=1, col=2,
                    hovertemplate=f"{label(b)}: %{{y:,.0f}} node-h<extra></extra>")
    fig.update_layout(barmode="stack", height=440, template="plotly_white",
                      margin={**_LAYOUT["margin"], "t": 70}, uirevision="keep",
                      legend={"orientation": "h", "y": -0.15},
                      title={"text": f"A: {result['a']['policy']}   B: "
                             f"{result['b']['policy']}", "y": 0.97})
    fig.update_yaxes(title_text="node-hours", row=1, col=1)
    return fig


def owners_figure(result: dict[str, Any]) -> go.Figure:
    """Each owner's share of the allocated nodes (against its target) and mean wait."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("share used vs target",
                                                        "mean queue wait (hours)"))
    owners = list(result["a"]["owners"])
    for s, name, colour in (("a", "A", "#1f77b4"), ("b", "B", "#ff7f0e")):
        o = result[s]["owners"]
        fig.add_bar(x=owners, y=[100 * o[w]["share_used"] for w in owners], name=name,
                    marker_color=colour, row=1, col=1, legendgroup=name)
        fig.add_bar(x=owners, y=[o[w]["mean_wait_s"] / 3600 for w in owners], name=name,
                    marker_color=colour, row=1, col=2, legendgroup=name, showlegend=False)
    fig.add_scatter(x=owners, y=[100 * result["a"]["owners"][w]["share_target"]
                                 for w in owners], mode="markers", name="target share",
                    marker={"symbol": "line-ew-open", "size": 30, "color": "#222"},
                    row=1, col=1)
    fig.update_layout(template="plotly_white", height=340, barmode="group",
                      margin=_LAYOUT["margin"], legend={"orientation": "h", "y": -0.2})
    fig.update_yaxes(title_text="% of allocated node-time", row=1, col=1)
    return fig


def timeline_figure(result: dict[str, Any]) -> go.Figure:
    """Nodes allocated and jobs waiting over simulated time, A against B."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("nodes allocated", "jobs waiting"))
    for s, name, colour in (("a", "A", "#1f77b4"), ("b", "B", "#ff7f0e")):
        tl = result[s]["timeline"]
        days = [t / 86400 for t in tl["t"]]
        fig.add_scatter(x=days, y=tl["allocated"], name=name, line={"color": colour},
                        row=1, col=1, legendgroup=name)
        fig.add_scatter(x=days, y=tl["pending_jobs"], name=name, line={"color": colour},
                        row=2, col=1, legendgroup=name, showlegend=False)
    fig.update_layout(template="plotly_white", height=420, margin=_LAYOUT["margin"],
                      hovermode="x unified")
    fig.update_xaxes(title_text="day", row=2, col=1)
    return fig


def _side(prefix: str, title: str, d: dict[str, Any]) -> html.Div:
    levers = [v for v in ("gang", "topo", "fair") if d[v]]
    return html.Div([
        html.H4(title),
        dcc.Checklist(id=f"{prefix}-levers", value=levers, options=[
            {"label": " gang scheduling (all or nothing)", "value": "gang"},
            {"label": " topology-aware placement", "value": "topo"},
            {"label": " fair share (with aging)", "value": "fair"}]),
        html.Div([html.Label("preemption "), dcc.RadioItems(
            id=f"{prefix}-preempt", value=d["preempt"], inline=True, options=[
                {"label": "none", "value": "none"}, {"label": "kill", "value": "kill"},
                {"label": "checkpoint first", "value": "ckpt"}])]),
        html.Div([html.Label("shared hot spares "), dcc.Input(
            id=f"{prefix}-spares", type="number", min=0, step=1, value=d["spares"],
            debounce=True)]),
    ], className="gl-card")


def cluster_layout(query: dict[str, str] | None = None) -> html.Div:
    """The form (preset, seed, two policy sets: from the URL's ``preset``, ``seed``, ``a``
    and ``b`` when given) and the result area."""
    from goodlens.analysis.clustersim.config import CLUSTER_PRESETS
    q = query or {}
    preset = q.get("preset") if q.get("preset") in CLUSTER_PRESETS else "demo-256"
    text = q.get("seed", "")
    seed = int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else 0
    return html.Div([
        html.H2("Cluster what-if: two scheduling policy sets"),
        html.P("The same simulated cluster, jobs and node failures under two policy sets "
               "(docs/cluster.md). Job time is in goodlens report's buckets; queue wait "
               "is outside a job's wall-clock.", className="gl-note"),
        html.Div([
            html.Div([html.Label("cluster "), dcc.Dropdown(
                id="cluster-preset", value=preset, clearable=False,
                options=[{"label": f"{k}: {v.describe()}", "value": k}
                         for k, v in CLUSTER_PRESETS.items()],
                style={"width": "48em"})]),
            html.Div([html.Label("seed "), dcc.Input(id="cluster-seed", type="number",
                                                    value=seed, step=1, debounce=True)]),
        ], className="gl-controls"),
        html.Div([_side("cluster-a", "A", side_from_spec(q.get("a"), DEFAULT_A)),
                  _side("cluster-b", "B", side_from_spec(q.get("b"), DEFAULT_B))],
                 className="gl-compare"),
        dcc.Loading(html.Div(id="cluster-body")),
    ])


def cluster_body(result: dict[str, Any]) -> html.Div:
    """The comparison: table, node-hours, owners, timeline."""
    rows = metric_rows(result)
    table = html.Table([
        html.Thead(html.Tr([html.Th(h) for h in ("", f"A: {result['a']['policy']}",
                                                 f"B: {result['b']['policy']}", "B - A")])),
        html.Tbody([html.Tr([html.Td(c) for c in r]) for r in rows])],
        className="gl-table", id="cluster-metrics")
    return html.Div([
        table,
        dcc.Graph(figure=node_hours_figure(result), id="cluster-graph"),
        dcc.Graph(figure=owners_figure(result), id="cluster-owners-graph"),
        dcc.Graph(figure=timeline_figure(result), id="cluster-timeline-graph"),
    ])


def register_cluster_callbacks(app: Any) -> None:
    """The page's one callback: form in, comparison out (cached per app)."""
    cache = CompareCache()
    @app.callback(Output("cluster-body", "children"), Input("cluster-preset", "value"),
                  Input("cluster-seed", "value"),
                  Input("cluster-a-levers", "value"), Input("cluster-a-preempt", "value"),
                  Input("cluster-a-spares", "value"), Input("cluster-b-levers", "value"),
                  Input("cluster-b-preempt", "value"), Input("cluster-b-spares", "value"))
    def update(preset: str, seed: Any, a_levers: list[str], a_pre: str, a_sp: Any,
               b_levers: list[str], b_pre: str, b_sp: Any) -> Any:
        try:
            specs = [policy_spec({**{k: k in (lv or []) for k in ("gang", "topo", "fair")},
                                  "preempt": pre, "spares": _count(sp)})
                     for lv, pre, sp in ((a_levers, a_pre, a_sp), (b_levers, b_pre, b_sp))]
            result = cache.run(preset, specs[0], specs[1], int(seed or 0))
        except ValueError as exc:
            return html.P(str(exc), className="gl-error", id="cluster-error")
        return cluster_body(result)


def _count(v: Any) -> int:
    n = int(v or 0)
    if n < 0:
        raise ValueError("spares cannot be negative")
    return n
