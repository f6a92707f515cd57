"""Figure builders: plain data in, Plotly figures out (no store, no Dash; unit-tested).

One colour per bucket everywhere (the breakdown, the rolling goodput, the what-if), so a
user learns it once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from goodlens.analysis.accounting import BUCKETS, RESTART_PARTS, STARTUP_PARTS
from goodlens.analysis.ft import GROUP_STATES
from goodlens.model.jsonable import is_missing
from goodlens.model.schema import EventKind
from goodlens.model.units import format_duration

BUCKET_COLORS = {"productive": "#2ca02c", "straggler_wait": "#ff7f0e",
                 "checkpoint_stall": "#1f77b4", "recompute": "#d62728", "startup": "#8c564b",
                 "restart": "#9467bd", "other": "#7f7f7f"}
# restart's parts: purple for the waiting, then distinct hues for the start-up steps, so
# warm-up and restore never look alike
RESTART_COLORS = {"detection": "#54278f", "queue": "#9e9ac8", "init": "#e7298a",
                  "restore": "#1b9e77", "warmup": "#e6ab02", "unattributed": "#dadaeb"}
#: startup's parts: browns, so the first start-up never reads as a restart
STARTUP_COLORS = {"init": "#8c564b", "restore": "#c49c94", "warmup": "#e7cb94"}
#: Shades of grey for the named parts of "other" (eval, a custom label, since the last step).
OTHER_SHADES = ("#525252", "#969696", "#bdbdbd", "#d9d9d9", "#737373", "#f0f0f0")
#: The timeline's rows for ``rank_evicted`` events whose ``cause`` is ``dry_run`` or
#: ``refused:<rail>`` (an eviction client's decision that evicted nothing).
EVICT_DRY_RUN, EVICT_REFUSED = "rank_evicted:dry_run", "rank_evicted:refused"
EVENT_STYLE = {  # kind: (label, colour, marker symbol)
    EventKind.FAILURE_DETECTED: ("failure", "#d62728", "x"),
    EventKind.ATTEMPT_END: ("attempt ended", "#d62728", "x-thin"),
    EventKind.PREEMPTED: ("preempted", "#e377c2", "diamond"),
    EventKind.CKPT_SAVE_START: ("checkpoint", "#1f77b4", "line-ns"),
    EventKind.RANK_EVICTED: ("eviction", "#ff7f0e", "triangle-down"),
    # decisions that evicted nothing (goodlens.exporter.elastic): rows of their own, so an
    # eviction marker always means a node left
    EVICT_DRY_RUN: ("eviction (dry run)", "#ff7f0e", "triangle-down-open"),
    EVICT_REFUSED: ("eviction refused", "#7f7f7f", "triangle-down-open"),
    EventKind.RANK_JOINED: ("rank joined", "#17becf", "triangle-up"),
    EventKind.WORLD_RESIZED: ("resize", "#8c564b", "square"),
    EventKind.STRAGGLER_FLAGGED: ("straggler flagged", "#ff7f0e", "star"),
}
#: Per-step fault tolerance (torchft) rows, drawn only for the events a run has: a replica
#: group's start, its end by cause, and a step a group ran and did not commit.
GROUP_FAILED, GROUP_EVICTED, GROUP_ENDED = "group_end:failed", "group_end:evicted", "group_end"
FT_EVENT_STYLE = {
    EventKind.GROUP_START: ("group started", "#17becf", "triangle-up-open"),
    GROUP_FAILED: ("group failed", "#d62728", "x-open"),
    GROUP_EVICTED: ("group evicted", "#ff7f0e", "triangle-down-open"),
    GROUP_ENDED: ("group ended", "#7f7f7f", "square-open"),
    EventKind.STEP_DISCARDED: ("discarded step", "#d62728", "circle-x-open"),
}
#: A replica group's states (``goodlens.analysis.ft.GROUP_STATES``): the buckets' colours
#: where a state is one (progress, recompute, startup), restart's parts for its recovery.
GROUP_STATE_COLORS = {"progress": "#2ca02c", "quorum": "#bcbd22", "recompute": "#d62728",
                      "startup": "#8c564b", "detection": "#54278f", "restart": "#9467bd",
                      "init": "#e7298a", "heal": "#1b9e77", "admission": "#9e9ac8",
                      "spare_idle": "#c6dbef", "other": "#7f7f7f"}
_LAYOUT = {"template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
           "font": {"size": 12},
           # a live redraw replaces the figure: keep the user's zoom and hidden traces
           "uirevision": "keep"}


def _figure(*traces: Any) -> go.Figure:
    """A figure with :data:`_LAYOUT` (and ``traces``)."""
    return go.Figure(list(traces) or None, layout=_LAYOUT)


def label(bucket: str) -> str:
    """``checkpoint_stall`` -> ``checkpoint stall``."""
    return bucket.replace("_", " ")


def _times(xs: Any) -> np.ndarray:
    """Epoch seconds as ISO strings to the millisecond (what Plotly parses fastest; its
    datetime path converts element by element)."""
    ms = np.round(np.asarray(xs, dtype=float) * 1000).astype("int64").astype("datetime64[ms]")
    return np.datetime_as_string(ms)


def empty_figure(message: str) -> go.Figure:
    """A blank figure that says why it is blank."""
    fig = _figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper",
                       yref="paper", font={"size": 14, "color": "#777"})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig.update_layout(height=220)


def _time_unit(seconds: float) -> tuple[str, float]:
    """The unit a bar of this length reads best in: hours, minutes or seconds."""
    if seconds >= 2 * 3600:
        return "hours", 3600.0
    if seconds >= 120:
        return "minutes", 60.0
    return "seconds", 1.0


def breakdown_figure(report: dict[str, Any]) -> go.Figure:
    """Where the wall-clock went: one stacked bar per bucket row, startup, restart and other split
    into their parts, in hours (minutes or seconds for short runs), each share of wall-clock
    on hover. The legend lists the rows top to bottom, as the bars are drawn."""
    wall = report.get("wall_clock_s") or 0.0
    if not wall > 0:
        return empty_figure("no wall-clock yet")
    unit, per = _time_unit(wall)
    fig = _figure()
    rows = [label(b) for b in BUCKETS]
    for b in BUCKETS:
        parts = _parts(report, b)
        if parts is None:
            v = report["buckets"].get(b)
            fig.add_bar(y=[label(b)], x=[(v or 0) / per], orientation="h", name=label(b),
                        marker_color=BUCKET_COLORS[b],
                        hovertemplate=f"{label(b)}: {_fmt(v)} ({_pct(v, wall)})<extra></extra>")
            continue
        for p, v, colour in parts:
            fig.add_bar(y=[label(b)], x=[v / per], orientation="h", name=f"{label(b)}: {p}",
                        marker_color=colour, hovertemplate=(
                            f"{label(b)}, {p}: {_fmt(v)} ({_pct(v, wall)})<extra></extra>"))
    fig.update_layout(barmode="stack", height=300, xaxis_title=unit,
                      yaxis={"categoryorder": "array", "categoryarray": rows[::-1]},
                      legend={"orientation": "h", "y": -0.25, "traceorder": "normal"},
                      title="Where the wall-clock went")
    return fig


def _parts(report: dict[str, Any], bucket: str) -> list[tuple[str, float, str]] | None:
    """The named parts a bucket's bar is split into (startup's, restart's and other's), with
    colours; None for a bucket drawn whole."""
    if bucket == "startup":
        return [(p, v, STARTUP_COLORS[p]) for p in STARTUP_PARTS
                if (v := report.get("startup_parts", {}).get(p, 0.0))]
    if bucket == "restart":
        return [(p, v, RESTART_COLORS[p]) for p in RESTART_PARTS
                if (v := report["restart_parts"].get(p, 0.0))]
    if bucket == "other" and report.get("other_parts"):
        return [(p, v, OTHER_SHADES[i % len(OTHER_SHADES)])
                for i, (p, v) in enumerate(report["other_parts"].items()) if v]
    return None


def time_range(lo: float, hi: float) -> list[str]:
    """An x-axis range of epoch seconds as the figures' time strings (the overview's rolling
    goodput and timeline share it, so they line up)."""
    return list(_times([lo, hi]))


def goodput_series_figure(series: pd.DataFrame, x_range: list[str] | None = None
                          ) -> go.Figure:
    """Rolling goodput over the run: each bucket's share of the trailing window, stacked,
    on the time axis ``x_range`` (the timeline's); zooming it sets the page's window."""
    if not len(series):
        return empty_figure("not enough data for a rolling goodput yet")
    fig = _figure()
    t = _times(series.time)
    for b in BUCKETS:
        fig.add_scatter(x=t, y=100 * series[b], name=label(b), stackgroup="one",
                        line={"width": 0.5, "color": BUCKET_COLORS[b]},
                        hovertemplate=f"{label(b)}: %{{y:.1f}}%<extra></extra>")
    fig.update_layout(height=300, yaxis={"title": "% of window", "range": [0, 100]},
                      title="Goodput over time (rolling window; drag to pick a window)",
                      hovermode="x unified",
                      legend={"orientation": "h", "y": -0.2, "traceorder": "normal"})
    if x_range:
        fig.update_xaxes(range=x_range, autorange=False)
    return fig


def timeline_figure(attempts: pd.DataFrame, events: pd.DataFrame, end: float,
                    x_range: list[str] | None = None, ft: dict[str, Any] | None = None
                    ) -> go.Figure:
    """Attempts as bars on a time axis (``x_range``: the rolling goodput's), and the job's
    events as markers above them: failures with their cause, checkpoints, evictions,
    resizes, flagged stragglers. Consecutive attempts alternate colours and each starts at a
    tick with its number, so attempts that touch still read as two. A torchft run (``ft``:
    its report's ``fault_tolerance``) adds its groups' starts and ends, discarded steps, each
    group's heals as intervals and each recovery's time out of the quorum."""
    if not len(attempts):
        return empty_figure("no attempt yet")
    fig = _figure()
    shades = {False: ("#9ecae1", "#4292c6"), True: ("#74c476", "#238b45")}
    for i, a in enumerate(attempts.itertuples()):
        a_end = a.end if a.end == a.end and a.end is not None else (
            a.last_activity if a.last_activity == a.last_activity else end)
        reason = a.end_reason if isinstance(a.end_reason, str) else "running"
        colour = shades[reason == "running"][i % 2]
        fig.add_scatter(x=_times([a.start, a_end]), y=["attempts", "attempts"],
                        mode="lines+markers+text", name=f"attempt {a.attempt}",
                        line={"width": 18, "color": colour},
                        marker={"symbol": "line-ns", "size": 26, "color": "#08306b",
                                "line": {"width": 2, "color": "#08306b"}, "opacity": [1, 0]},
                        text=[f"  {a.attempt}", ""], textposition="middle right",
                        textfont={"color": "#08306b"}, showlegend=False,
                        hovertemplate=(f"attempt {a.attempt}: {format_duration(a_end - a.start)}"
                                       f", {reason}<extra></extra>"))
    rows = _event_rows(events)
    extra = 0  # rows beyond the base layout's (a torchft run's), each one more row high
    for kind, (name, colour, symbol) in {**EVENT_STYLE, **FT_EVENT_STYLE}.items():
        ev = events[rows == kind] if len(events) else events
        if not len(ev):
            continue
        extra += kind in FT_EVENT_STYLE
        text = [_event_text(r) for r in ev.itertuples()]
        fig.add_scatter(x=_times(ev.time), y=[name] * len(ev), mode="markers", name=name,
                        marker={"color": colour, "symbol": symbol, "size": 10,
                                "line": {"width": 2, "color": colour}},
                        text=text, hovertemplate="%{text}<extra></extra>")
    extra += _ft_intervals(fig, ft or {})
    fig.update_layout(height=120 + 28 * (1 + len(EVENT_STYLE) + extra),
                      title="Attempts and events", showlegend=False,
                      yaxis={"type": "category"})
    if x_range:
        fig.update_xaxes(range=x_range, autorange=False)
    return fig


def _interval_row(fig: go.Figure, row: str, spans: list[tuple[float, float, str]],
                  colour: str) -> None:
    """``(start, end, hover text)`` spans as thick segments on one timeline row, each end
    marked (a heal of milliseconds on an hour's axis still shows as its mark)."""
    x: list[Any] = []
    text: list[str] = []
    for a, b, t in spans:
        x += [*_times([a, b]), None]
        text += [t, t, ""]
    fig.add_scatter(x=x, y=[row if v is not None else None for v in x], name=row,
                    mode="lines+markers", line={"width": 10, "color": colour},
                    marker={"symbol": "line-ns", "size": 16, "color": colour,
                            "line": {"width": 2, "color": colour}},
                    text=text, hovertemplate="%{text}<extra></extra>", connectgaps=False)


def _ft_intervals(fig: go.Figure, ft: dict[str, Any]) -> int:
    """A torchft run's heals (a row per group that healed) and recoveries (one row: each
    restarted group from its last step to its first step back in the quorum) on the
    timeline; how many rows were drawn."""
    heals: dict[str, list[tuple[float, float, str]]] = {}
    for h in ft.get("heals") or []:
        if is_missing(h.get("start")) or is_missing(h.get("end")):
            continue
        size = "" if is_missing(h.get("bytes")) else f", {h['bytes']:,} bytes"
        heals.setdefault(str(h["group"]), []).append((h["start"], h["end"], (
            f"heal of {h['group']} to step {h.get('step')}: {format_duration(h['seconds'])}"
            f"{size} from group {h.get('source')} over {h.get('transport')}"
            + (", failed" if h.get("failed") else ""))))
    for group in sorted(heals):
        _interval_row(fig, f"heal {group}", heals[group], "#1b9e77")
    out = [(r["last_step_end"], r["rejoined"], f"{r['group']} out of the quorum: "
            f"{format_duration(r['out_s'])} (restart {r.get('attempt')})")
           for r in ft.get("recoveries") or []
           if not (is_missing(r.get("last_step_end")) or is_missing(r.get("rejoined")))]
    if out:
        _interval_row(fig, "group out", out, "#9467bd")
    return len(heals) + bool(out)


def _event_rows(events: pd.DataFrame) -> pd.Series:
    """Each event's row on the timeline: its kind, but for an eviction decision that
    evicted nothing (:data:`EVICT_DRY_RUN`, :data:`EVICT_REFUSED`) and a replica group's
    end, which has a row per cause (failed, evicted, else ended)."""
    if not len(events) or "cause" not in events:
        return events.kind if len(events) else pd.Series([], dtype=object)
    rows = events.kind.astype(object).copy()
    cause = events.cause.fillna("").astype(str)
    evicted = events.kind == EventKind.RANK_EVICTED
    rows[evicted & (cause == "dry_run")] = EVICT_DRY_RUN
    rows[evicted & cause.str.startswith("refused")] = EVICT_REFUSED
    ended = events.kind == EventKind.GROUP_END
    rows[ended & (cause == "failed")] = GROUP_FAILED
    rows[ended & (cause == "evicted")] = GROUP_EVICTED
    return rows


def _event_text(r: Any) -> str:
    style = EVENT_STYLE.get(r.kind) or FT_EVENT_STYLE.get(r.kind) or (r.kind,)
    parts = [f"{style[0]} (attempt {r.attempt})"]
    for col in ("cause", "step", "rank", "host", "tier", "label", "world_size"):
        v = getattr(r, col, None)
        if v is not None and pd.notna(v):
            parts.append(f"{col} {int(v) if isinstance(v, float) else v}")
    return ", ".join(parts)


def participation_figure(ft: dict[str, Any], end: float | None = None,
                         x_range: list[str] | None = None) -> go.Figure:
    """The replica groups taking part in each committed step over time (a step plot of the
    report's ``participation`` change points, held to ``end``: the run's end, else the
    last group's), against the full world (the job's ``replica_groups``) as a dashed line."""
    changes = ft.get("participation") or []
    if not changes:
        return empty_figure("no committed step yet")
    full = int(ft.get("replica_groups") or 0)
    last = max([c["time"] for c in changes] + [g.get("allocated_to") or 0.0
                                                for g in ft.get("groups") or []])
    stop = end if end is not None and end >= changes[-1]["time"] else last
    xs = [c["time"] for c in changes] + [stop]
    ys = [c["groups"] for c in changes] + [changes[-1]["groups"]]
    text = [f"from step {c['step']}: {c['groups']} of {full} groups" for c in changes]
    fig = _figure()
    fig.add_scatter(x=_times(xs), y=ys, mode="lines", line_shape="hv", name="taking part",
                    line={"color": "#2ca02c", "width": 3}, fill="tozeroy",
                    text=[*text, text[-1]], hovertemplate="%{text}<extra></extra>")
    fig.add_scatter(x=_times([xs[0], xs[-1]]), y=[full, full], mode="lines",
                    name="full world", line={"color": "#7f7f7f", "dash": "dash"},
                    hovertemplate=f"full world: {full} groups<extra></extra>")
    top = max([full, *ys])
    fig.update_layout(height=260, title="Replica groups taking part in each step",
                      yaxis={"title": "groups", "range": [0, top + 0.5], "dtick": 1},
                      legend={"orientation": "h", "y": -0.3})
    if x_range:
        fig.update_xaxes(range=x_range, autorange=False)
    return fig


def _group_label(g: dict[str, Any]) -> str:
    notes = [n for n, on in (("spare", g.get("spare")), ("evicted", g.get("evicted")),
                             (f"{g.get('attempts')} starts", (g.get("attempts") or 1) > 1))
             if on]
    return f"{g['group']} ({', '.join(notes)})" if notes else str(g["group"])


def group_seconds_figure(ft: dict[str, Any]) -> go.Figure:
    """The reduced-capacity view: each replica group's allocated GPU-time by state (the
    report's ``groups[*].seconds`` times ``gpus_per_group``), one stacked bar per group,
    each state's share of the group on hover."""
    groups = ft.get("groups") or []
    if not groups:
        return empty_figure("no replica group yet")
    gpus = float(ft.get("gpus_per_group") or 1)
    states = list(GROUP_STATES) + sorted({k for g in groups for k in g["seconds"]}
                                         - set(GROUP_STATES))
    totals = [gpus * sum(g["seconds"].values()) for g in groups]
    unit, per = _time_unit(max(totals))
    names = [_group_label(g) for g in groups]
    fig = _figure()
    for state in states:
        v = [gpus * (g["seconds"].get(state) or 0.0) for g in groups]
        if not any(v):
            continue
        hover = [f"{n}, {label(state)}: {format_duration(x)} ({_pct(x, t)})"
                 for n, x, t in zip(names, v, totals)]
        fig.add_bar(y=names, x=[x / per for x in v], orientation="h", name=label(state),
                    marker_color=GROUP_STATE_COLORS.get(state, "#bdbdbd"), text=hover,
                    textposition="none", hovertemplate="%{text}<extra></extra>")
    fig.update_layout(barmode="stack", height=140 + 36 * len(groups),
                      xaxis_title=f"GPU-{unit}", title="Each replica group's GPU-time",
                      yaxis={"categoryorder": "array", "categoryarray": names[::-1]},
                      legend={"orientation": "h", "y": -0.3, "traceorder": "normal"})
    return fig


#: The sample view's parts, in the report's words, as the bar names them.
SAMPLE_PARTS = (("committed", "committed", "#2ca02c"), ("discarded", "discarded", "#d62728"),
                ("missing_groups", "never trained (groups out)", "#dadaeb"))


def samples_figure(ft: dict[str, Any]) -> go.Figure:
    """The sample view: samples committed, discarded and never trained (groups out of the
    quorum), one stacked bar that adds up to what the full world would have trained."""
    s = ft.get("samples") or {}
    full = s.get("full_world") or 0.0
    if not full > 0:
        return empty_figure("no samples known")
    fig = _figure()
    for key, name, colour in SAMPLE_PARTS:
        v = float(s.get(key) or 0.0)
        fig.add_bar(y=["samples"], x=[v], orientation="h", name=name, marker_color=colour,
                    hovertemplate=f"{name}: {v:,.0f} ({_pct(v, full)} of the full world)"
                    "<extra></extra>")
    fig.update_layout(barmode="stack", height=200, xaxis_title="samples",
                      title=f"Samples against the full world's {full:,.0f}",
                      yaxis={"visible": False},
                      legend={"orientation": "h", "y": -0.5, "traceorder": "normal"})
    return fig


def heatmap_figure(grid: pd.DataFrame, value: str = "max") -> go.Figure:
    """Rank x step heatmap of compute relative to each step bin's median rank bin, in %.

    ``grid`` is the store's pooled grid (``Store.heatmap``); ``value`` is ``max`` (the slowest
    rank in a cell: a single slow rank among hundreds stays visible) or ``mean``."""
    if grid is None or not len(grid):
        return empty_figure("no step records for this attempt")
    # the grid's rows into rank bin x step bin arrays (numpy: a pandas pivot per value
    # costs more than the figure)
    rbins, ri = np.unique(grid["rbin"].to_numpy(), return_inverse=True)
    sbins, si = np.unique(grid["sbin"].to_numpy(), return_inverse=True)

    def cells(col: str) -> np.ndarray:
        out = np.full((len(rbins), len(sbins)), np.nan)
        out[ri, si] = grid[col].to_numpy(dtype=float)
        return out
    z = cells(value)
    med = np.nanmedian(z, axis=0)
    rel = 100 * (z / med - 1)
    rank_lo = _per_bin(np.minimum, ri, grid["rank_lo"], len(rbins))
    rank_hi = _per_bin(np.maximum, ri, grid["rank_hi"], len(rbins))
    step_lo = _per_bin(np.minimum, si, grid["step_lo"], len(sbins))
    ylab = [f"{int(a)}" if a == b else f"{int(a)}-{int(b)}" for a, b in zip(rank_lo, rank_hi)]
    # float32: the response is rank_bins x step_bins x 3 numbers (base64 typed arrays), sent
    # on every redraw; ranks up to 2^24 and percentages are exact enough in 32 bits
    custom = np.dstack([cells("worst_rank").astype(np.float32),
                        cells("max").astype(np.float32)])
    fig = _figure(go.Heatmap(
        z=rel.astype(np.float32), x=step_lo, y=ylab,
        customdata=custom,
        colorscale="RdBu_r", zmid=0, zmin=-20, zmax=20,
        colorbar={"title": "% vs median"},
        hovertemplate=("ranks %{y}, from step %{x}<br>%{z:.1f}% vs the median"
                       "<br>slowest rank %{customdata[0]:.0f}: %{customdata[1]:.3f}s"
                       "<extra></extra>")))
    n_ranks = int(rank_hi.max()) + 1 if len(rank_hi) else 0
    pooled = "" if len(rbins) >= n_ranks else f", {len(rbins)} rank bins ({value})"
    fig.update_layout(height=520, xaxis_title="step", yaxis_title="rank",
                      title=f"Compute per rank and step, vs the median{pooled}",
                      yaxis={"type": "category", "autorange": "reversed"})
    return fig


def _per_bin(reduce: np.ufunc, bins: np.ndarray, values: pd.Series, n: int) -> np.ndarray:
    """``reduce`` (``np.minimum``, ``np.maximum``) of ``values`` per bin index."""
    v = values.to_numpy()
    lim = np.iinfo(v.dtype) if v.dtype.kind in "iu" else np.finfo(v.dtype)
    out = np.full(n, lim.max if reduce is np.minimum else lim.min, dtype=v.dtype)
    reduce.at(out, bins, v)
    return out


def host_figure(hosts: pd.DataFrame | None, top: int = 30) -> go.Figure:
    """The slowest hosts: mean compute vs the median host (and each one's slowest rank)."""
    if hosts is None or not len(hosts):
        return empty_figure("no host information in the step records")
    h = hosts.sort_values("worst_relative", ascending=False).head(top)
    fig = _figure()
    fig.add_bar(x=h.host, y=100 * h.relative, name="host mean", marker_color="#9467bd")
    fig.add_bar(x=h.host, y=100 * h.worst_relative, name="slowest rank",
                marker_color="#ff7f0e", text=[f"rank {int(r)}" for r in h.worst_rank],
                hovertemplate="%{x}: slowest rank %{text} %{y:.1f}%<extra></extra>")
    fig.update_layout(barmode="group", height=320, yaxis_title="% vs median host",
                      title=f"Host roll-up (slowest {len(h)} of {len(hosts)})",
                      legend={"orientation": "h", "y": -0.3})
    return fig


def switch_table_rows(hosts: pd.DataFrame | None) -> list[dict[str, Any]]:
    """Per switch: hosts, mean compute vs the median host, the worst host."""
    if hosts is None or "switch" not in hosts or not len(hosts):
        return []
    out = []
    for sw, g in hosts.groupby("switch", sort=False):
        worst = g.loc[g.relative.idxmax()]
        out.append({"switch": sw, "hosts": len(g), "relative": float(g.relative.mean()),
                    "worst_host": worst.host, "worst_relative": float(worst.relative)})
    return sorted(out, key=lambda r: -r["relative"])


def checkpoint_figure(table: pd.DataFrame) -> go.Figure:
    """Each checkpoint's stall and write time over the run, the stall's trend, and size."""
    if not len(table):
        return empty_figure("no checkpoint in this run")
    from goodlens.analysis.checkpoints import checkpoint_trend
    t = _times(table.start)
    fig = _figure()
    fig.add_bar(x=t, y=table.stall_s, name="stall (training blocked)", marker_color="#1f77b4")
    if table.write_s.notna().any():
        fig.add_scatter(x=t, y=table.write_s, mode="markers", name="write until durable",
                        marker={"color": "#17becf", "symbol": "circle-open", "size": 9})
    fig.add_scatter(x=t, y=checkpoint_trend(table), mode="lines", name="stall trend (median)",
                    line={"color": "#08306b", "dash": "dash"})
    if table["bytes"].notna().any():
        fig.add_scatter(x=t, y=table["bytes"] / 1e9, mode="lines+markers", name="size (GB)",
                        yaxis="y2", line={"color": "#bbb"})
        # from zero, so the ticks are round numbers (a narrow auto range gave 19.8, 20.415...)
        fig.update_layout(yaxis2={"title": "GB", "overlaying": "y", "side": "right",
                                  "showgrid": False, "rangemode": "tozero", "tickmode": "auto",
                                  "nticks": 6})
    fig.update_layout(height=340, yaxis_title="seconds", title="Checkpoints",
                      legend={"orientation": "h", "y": -0.25, "traceorder": "normal"})
    return fig


def interval_figure(measured: dict[str, Any]) -> go.Figure:
    """Expected goodput against the checkpoint interval, with the run's and the best."""
    from goodlens.analysis.planner import interval_plan
    c, m = measured.get("checkpoint_stall_s"), measured.get("mtbf_s")
    r = measured.get("restart_cost_s")
    if not (c and m and r is not None and c < m):
        return empty_figure("needs at least one failure and one checkpoint to plan")
    plan = interval_plan(c, m, restart_cost_s=min(r, m * 0.99))
    run_i = measured.get("interval_s")
    marks = [x for x in (run_i, plan.best_interval_s) if x]
    # around the two marks (a decade either way), not the whole feasible span: the curve
    # then fills the plot instead of a sliver of it
    lo_x = max(min(marks) / 8, c * 0.5, 1.0)
    hi_x = max(min(max(marks) * 8, max(2 * (m - r), c * 2)), lo_x * 10)
    xs = np.geomspace(lo_x, hi_x, 160)
    ys = np.array([100 * plan.expected_goodput(x) for x in xs])
    fig = _figure()
    fig.add_scatter(x=xs / 60, y=ys, mode="lines", name="expected goodput",
                    line={"color": "#2ca02c"},
                    hovertemplate="every %{x:.1f} min: %{y:.2f}%<extra></extra>")
    left = (run_i or 0) < plan.best_interval_s  # labels on the far sides: never overlap
    for name, x, colour, side in (
            ("this run", run_i, "#d62728", "left" if left else "right"),
            ("best", plan.best_interval_s, "#2ca02c", "right" if left else "left")):
        if x:
            fig.add_scatter(x=[x / 60], y=[100 * plan.expected_goodput(x)], mode="markers+text",
                            name=name, text=[f"{name}: {format_duration(x)}"],
                            textposition=f"top {side}", marker={"size": 12, "color": colour},
                            hovertemplate=f"{name}: every {format_duration(x)}, "
                            "%{y:.2f}%<extra></extra>")
    finite = ys[np.isfinite(ys)]
    top, bottom = float(finite.max()), float(max(finite.min(), 0.0))
    pad = max(top - bottom, 0.5)
    fig.update_layout(height=320, xaxis={"title": "interval (minutes)", "type": "log"},
                      yaxis={"title": "expected goodput %",
                             "range": [max(bottom - 0.05 * pad, 0), top + 0.25 * pad]},
                      title="Checkpoint interval: expected goodput", showlegend=False)
    return fig


def whatif_figure(result: dict[str, Any]) -> go.Figure:
    """Actual, simulated-as-was and simulated-with-the-change breakdowns, as shares."""
    fig = _figure()
    cols = [("actual", "actual"), ("baseline", "simulated, as run"),
            ("changed", "simulated, with the change")]
    for b in BUCKETS:
        ys, texts = [], []
        for key, _ in cols:
            part = result[key]
            wall = part["wall_clock_s"] or 1.0
            v = part["buckets"].get(b) or 0.0
            ys.append(100 * v / wall)
            texts.append(_fmt(v))
        fig.add_bar(x=[n for _, n in cols], y=ys, name=label(b), marker_color=BUCKET_COLORS[b],
                    text=texts, hovertemplate=f"{label(b)}: %{{y:.1f}}% (%{{text}})"
                    "<extra></extra>", textposition="none")
    fig.update_layout(barmode="stack", height=380, yaxis={"title": "% of wall-clock",
                                                          "range": [0, 100]},
                      title="What-if: where the wall-clock would go",
                      legend={"orientation": "h", "y": -0.2, "traceorder": "normal"})
    return fig


def _fmt(v: float | None) -> str:
    return "not measured" if v is None else format_duration(v)


def _pct(v: float | None, wall: float) -> str:
    return "n/a" if v is None or not wall else f"{100 * v / wall:.1f}%"


def pct(x: float | None, digits: int = 1) -> str:
    """``0.7623`` -> ``76.2%`` (``n/a`` for None/NaN)."""
    if is_missing(x):
        return "n/a"
    return f"{100 * x:.{digits}f}%"
