"""Page layouts: the data of :mod:`goodlens.dashboard.data` laid out as Dash components.

Pure functions of their arguments (no store, no callbacks), so every page renders the same
from a test as in the browser. Numbers a test compares carry their exact value in the
element's ``title`` (the hover text): the page shows ``1h 31m``, the title ``5489.06 s``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from dash import dcc, html

from goodlens.analysis.accounting import BUCKETS, RESTART_PARTS
from goodlens.dashboard import figures as fig
from goodlens.model.jsonable import is_missing
from goodlens.model.units import format_duration, format_instant

PAGES = (("overview", "Overview"), ("ranks", "Ranks"), ("checkpoints", "Checkpoints"),
         ("whatif", "What-if"))


def run_href(run_id: str, page: str = "overview") -> str:
    """The shareable URL path of one page of a run."""
    base = f"/runs/{quote(run_id, safe='')}"
    return base if page == "overview" else f"{base}/{page}"


def _utc(t: float | None) -> str:
    if is_missing(t):
        return ""
    return format_instant(t, seconds=False)


def _dur(v: float | None) -> str:
    return "" if is_missing(v) else format_duration(v)


def _table(header: list[str], rows: list[list[Any]], id: str | None = None,
           row_ids: list[str] | None = None) -> html.Table:
    body = [html.Tr([c if isinstance(c, html.Td) else html.Td(c) for c in r],
                    **({"id": row_ids[i]} if row_ids else {})) for i, r in enumerate(rows)]
    return html.Table([html.Thead(html.Tr([html.Th(h) for h in header])), html.Tbody(body)],
                      className="gl-table", **({"id": id} if id else {}))


def _card(title: str, value: str, id: str, exact: str = "") -> html.Div:
    return html.Div([html.Div(title, className="gl-card-title"),
                     html.Div(value, id=id, title=exact, className="gl-card-value")],
                    className="gl-card")


def nav(run_id: str | None, page: str) -> html.Div:
    """The top bar: the runs list, and the run's pages when a run is open."""
    links = [dcc.Link("Runs", href="/", className="gl-nav-link"
                      + (" active" if page == "runs" else ""))]
    if run_id is not None:
        links.append(html.Span(f"run {run_id}", className="gl-nav-run"))
        links += [dcc.Link(name, href=run_href(run_id, key), id=f"nav-{key}",
                           className="gl-nav-link" + (" active" if key == page else ""))
                  for key, name in PAGES]
    links.append(dcc.Link("Cluster what-if", href="/cluster", className="gl-nav-link"
                          + (" active" if page == "cluster" else "")))
    return html.Div(links, className="gl-nav")


def not_found(message: str) -> html.Div:
    """A page for a URL that names nothing we have."""
    return html.Div([html.H2("Not found"), html.P(message, id="not-found"),
                     dcc.Link("Back to the runs", href="/")])


# ---------------------------------------------------------------------------- runs
def runs_body(runs: list[dict[str, Any]]) -> html.Div:
    """The runs list: goodput, duration, GPUs, state, with a link to each run."""
    if not runs:
        return html.Div([html.P("No runs yet.", id="runs-empty"),
                         html.P("Point an exporter at this collector's /v1/ingest, or load a "
                                "trace with `goodlens import TRACE --db FILE`.")])
    rows = [[dcc.Link(r["run_id"], href=run_href(r["run_id"]), id=f"run-link-{i}"),
             r["state"], html.Td(fig.pct(r["goodput"]), title=str(r["goodput"])),
             _dur(r["duration_s"]), r["gpus"] or "", r["attempts"], f"{r['steps']:,}",
             _utc(r["start"])] for i, r in enumerate(runs)]
    return _table(["run", "state", "goodput", "duration", "GPUs", "attempts", "steps",
                   "started"], rows, id="runs-table")


# ---------------------------------------------------------------------------- overview
def _state_card(state: str, rep: dict[str, Any]) -> Any:
    """The run's state; a run in progress quiet past its hang timeout says so, and how to
    end it when its job is gone."""
    quiet = rep.get("silence") or {}
    if not quiet.get("silent"):
        return _card("State", f"{state}" + (" (live)" if rep["in_progress"] else ""),
                     "headline-state")
    return _card("State", f"silent for {_dur(quiet['silent_s'])}", "headline-state",
                 f"no data past its {_dur(quiet['timeout_s'])} hang timeout: hung, or gone "
                 f"without an end event (`goodlens end-run --run {rep['run']}` ends it)")


def overview_parts(d: dict[str, Any]) -> dict[str, Any]:
    """Headline goodput, the breakdown, attempts, goodput over time and the timeline, by
    the id of the element each fills (figures for the graphs)."""
    rep = d["report"]
    wall = rep["wall_clock_s"]
    state = d["info"].get("state") if d.get("info") else ""
    cards = html.Div([
        _card("Goodput (wall-clock)", fig.pct(rep["goodput"]), "headline-goodput",
              f"{rep['goodput']:.6f}"),
        _card("Goodput (GPU-time)", fig.pct(rep["gpu_time_goodput"]), "headline-gpu-goodput",
              "" if rep["gpu_time_goodput"] is None else f"{rep['gpu_time_goodput']:.6f}"),
        _card("Wall-clock", _dur(wall), "headline-wall", f"{wall:.2f} s"),
        _card("Attempts", str(len(rep["attempts"])), "headline-attempts"),
        _state_card(state, rep),
        *([_card("Excluded", _dur(sum(rep["excluded"].values())), "headline-excluded",
                 ", ".join(f"{k} {v:.2f} s" for k, v in rep["excluded"].items()))]
          if rep.get("excluded") else []),
    ], className="gl-cards")
    rows, ids = [], []
    for b in BUCKETS:
        v = rep["buckets"][b]
        rows.append([fig.label(b), html.Td(_dur(v) if v is not None else "not measured",
                                           title="" if v is None else f"{v:.2f} s",
                                           id=f"bucket-{b}"),
                     html.Td("" if v is None else fig.pct(v / wall if wall else 0.0),
                             id=f"bucket-{b}-share")])
        ids.append(f"row-{b}")
        if b == "restart":
            for p in RESTART_PARTS:
                pv = rep["restart_parts"][p]
                if pv:
                    rows.append([html.Span(f"  {p}", className="gl-sub"),
                                 html.Td(_dur(pv), title=f"{pv:.2f} s", id=f"restart-{p}"),
                                 fig.pct(pv / wall if wall else 0.0)])
                    ids.append(f"row-restart-{p}")
    buckets = _table(["bucket", "time", "share"], rows, id="bucket-table", row_ids=ids)
    att_rows = [[a["attempt"], _utc(a["start"]), _dur(a["wall_clock_s"]), fig.pct(a["goodput"]),
                 _dur(a["buckets"]["restart"]), _dur(a["buckets"]["recompute"]),
                 a["steps"].get("kept", ""), a["steps"].get("recomputed", "")]
                for a in rep["attempts"]]
    attempts = _table(["attempt", "start", "wall-clock", "goodput", "restart", "recompute",
                       "steps kept", "steps redone"], att_rows, id="attempt-table")
    end = rep["end"] if rep["end"] is not None else 0.0
    return {"ov-cards": cards, "ov-buckets": buckets, "ov-attempts": attempts,
            "overview-exclude": _exclude_options(rep),
            "breakdown-graph": fig.breakdown_figure(rep),
            "series-graph": fig.goodput_series_figure(d["series"]),
            "timeline-graph": fig.timeline_figure(d["attempts"], d["events"], end)}


def _exclude_options(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """The exclusion checklist's choices: each named part that holds time (with its time),
    and any part excluded now (so it stays there to be put back)."""
    held = {**rep.get("restart_parts", {}), **rep.get("other_parts", {})}
    names = list(dict.fromkeys([*rep.get("excludable", []), *rep.get("excluded", {})]))
    out = []
    for name in names:
        secs = rep.get("excluded", {}).get(name, held.get(name, 0.0))
        out.append({"label": f" {name} ({_dur(secs)})", "value": name})
    return out


def live_graph(gid: str, parts: dict[str, Any]) -> html.Div:
    """The graph ``gid`` (with its figure in ``parts``, if there) that a live refresh
    redraws: the server sends each new figure to the store
    ``<gid>-next`` as ``{"figure", "keep"}``, and a function in the browser
    (``assets/keep_view.js``) puts it on the graph, keeping the user's zoom and hidden
    traces when ``keep`` (a timer redraw). The shown figure never travels to the server."""
    return html.Div([dcc.Store(id=f"{gid}-next"),
                     dcc.Graph(id=gid, **({"figure": parts[gid]} if gid in parts else {}))])


#: The overview's parts: the Divs a refresh fills, and the graphs whose figure it replaces
#: (the graphs stay mounted, so a live redraw keeps the user's zoom).
OVERVIEW_DIVS = ("ov-cards", "ov-buckets", "ov-attempts")
OVERVIEW_GRAPHS = ("breakdown-graph", "series-graph", "timeline-graph")


def overview_skeleton(parts: dict[str, Any] | None = None) -> html.Div:
    """The overview's layout, empty or filled with :func:`overview_parts`."""
    p = parts or {}

    return html.Div([
        html.Div(p.get("ov-cards"), id="ov-cards"),
        html.Div([html.Span("Exclude from the wall-clock: ", className="gl-note"),
                  dcc.Checklist(id="overview-exclude", options=p.get("overview-exclude", []),
                                value=[], inline=True,
                                inputStyle={"margin-left": "1em"})],
                 id="ov-exclude", title="Take these parts out of the wall-clock entirely, "
                 "as `goodlens report --exclude` does (e.g. the scheduler's queue, a planned "
                 "maintenance window)"),
        html.Div([html.Div(p.get("ov-buckets"), id="ov-buckets", className="gl-col"),
                  html.Div(live_graph("breakdown-graph", p), className="gl-col-wide")],
                 className="gl-row"),
        live_graph("series-graph", p),
        live_graph("timeline-graph", p),
        html.H3("Attempts"), html.Div(p.get("ov-attempts"), id="ov-attempts"),
    ])


def overview_body(d: dict[str, Any]) -> html.Div:
    """The whole overview of one run (its skeleton filled)."""
    return overview_skeleton(overview_parts(d))


# ---------------------------------------------------------------------------- ranks
def attempt_options(attempts: list[int]) -> list[dict[str, Any]]:
    """The attempt picker's choices: the latest (follows a live run), then each attempt."""
    return [{"label": "latest", "value": "latest"},
            *({"label": str(a), "value": a} for a in attempts)]


def ranks_controls() -> html.Div:
    """Attempt picker, pooling and span of the heatmap (options filled by the callback)."""
    return html.Div([
        html.Label("attempt "), dcc.Dropdown(
            id="ranks-attempt", options=attempt_options([]), value="latest", clearable=False,
            style={"width": "8em", "display": "inline-block"}),
        html.Label(" cells show "), dcc.RadioItems(
            id="ranks-pool", options=[{"label": "the slowest rank", "value": "max"},
                                      {"label": "the mean", "value": "mean"}],
            value="max", inline=True, style={"display": "inline-block"}),
        html.Label(" steps "), dcc.RadioItems(
            id="ranks-span", options=[{"label": "latest", "value": "latest"},
                                      {"label": "whole attempt", "value": "all"}],
            value="latest", inline=True, style={"display": "inline-block"}),
    ], className="gl-controls")


_FINDINGS_SOURCE = {
    "live": "the collector's live detector watches this run; these are the subjects it "
            "flagged",
    "batch": "found by a batch pass over this run's step records (no live detector saw it)",
    "too-large": "this run is too large for a batch pass here and no live detector flagged "
                 "anything; run `goodlens detect --db FILE --run ID`",
    "pending": "scanning this run's step records for stragglers (no live detector saw it); "
               "the table fills in when the scan ends",
    "none": "",
}


def ranks_parts(d: dict[str, Any], pool: str = "max") -> dict[str, Any]:
    """Heatmap, flagged stragglers with slowdown, cost and action, host and switch roll-up,
    by the id of the element each fills."""
    f_rows = [[f"{f['subject_kind']} {f['subject_id']}", f.get("relative_to") or "",
               _na(f.get("attempt")), f["first_step"], f["detected_step"],
               html.Td(fig.pct(f["slowdown"]), title=f"{f['slowdown']:.4f}"),
               _dur(f["straggler_wait_s"]), _dur(f["wait_per_hour_s"]),
               html.Td(f["action"], className=f"gl-action-{f['action']}"),
               f"{f['confidence']:.2f}",
               "resolved" if f.get("status") == "resolved" else "open"]
              for f in sorted(d["findings"], key=lambda f: -(f["wait_per_hour_s"] or 0))]
    findings = (_table(["subject", "slower than", "attempt", "from step", "detected at",
                        "slowdown", "wait so far", "wait per hour", "action", "confidence",
                        "state"], f_rows, id="findings-table")
                if f_rows else html.P("" if d["findings_source"] == "pending"
                                      else "No persistent straggler.", id="findings-none"))
    window = d.get("window")
    note = (f"steps {window[0]:,}-{window[1]:,} of attempt {d['attempt']}, {window[2]:,} ranks"
            + (" (the latest steps; choose 'whole attempt' for all)" if d.get("clipped")
               else "") if window else "")
    sw = fig.switch_table_rows(d.get("hosts"))
    switches = _table(["switch", "hosts", "mean vs median host", "worst host", "its slowdown"],
                      [[r["switch"], r["hosts"], fig.pct(r["relative"]), r["worst_host"],
                        fig.pct(r["worst_relative"])] for r in sw], id="switch-table") \
        if sw else html.Div()
    return {"rk-note": note, "heatmap-graph": fig.heatmap_figure(d["grid"], pool),
            "rk-findings": html.Div([html.P(_FINDINGS_SOURCE[d["findings_source"]],
                                            className="gl-note", id="findings-source"),
                                     findings]),
            "host-graph": fig.host_figure(d.get("hosts")), "rk-switches": switches}


RANKS_DIVS = ("rk-note", "rk-findings", "rk-switches")
RANKS_GRAPHS = ("heatmap-graph", "host-graph")


def ranks_skeleton(parts: dict[str, Any] | None = None) -> html.Div:
    """The ranks page's layout, empty or filled with :func:`ranks_parts`."""
    p = parts or {}

    return html.Div([
        html.P(p.get("rk-note"), className="gl-note", id="rk-note"),
        live_graph("heatmap-graph", p),
        html.H3("Flagged stragglers"),
        html.Div(p.get("rk-findings"), id="rk-findings"),
        live_graph("host-graph", p),
        html.Div(p.get("rk-switches"), id="rk-switches"),
    ])


def ranks_body(d: dict[str, Any], pool: str = "max") -> html.Div:
    """The whole ranks page of one run (its skeleton filled)."""
    return ranks_skeleton(ranks_parts(d, pool))


# ---------------------------------------------------------------------------- checkpoints
def checkpoints_body(d: dict[str, Any]) -> html.Div:
    """Each checkpoint's stall, write time and size, the trend, and the interval plan."""
    t, m = d["table"], d["measured"]

    def med(c: str) -> float | None:
        return float(t[c].median()) if len(t) and t[c].notna().any() else None
    size = med("bytes")
    cards = html.Div([
        _card("Checkpoints", str(len(t)), "ckpt-count"),
        _card("Median stall", _dur(med("stall_s")) or "n/a", "ckpt-stall",
              "" if med("stall_s") is None else f"{med('stall_s'):.3f} s"),
        _card("Median write", _dur(med("write_s")) or "n/a", "ckpt-write"),
        _card("Median size", "n/a" if size is None else f"{size / 1e9:,.2f} GB", "ckpt-size"),
        _card("Interval", _dur(m.get("interval_s")) or "n/a", "ckpt-interval"),
        _card("Best interval", _dur(m.get("best_interval_s")) or "n/a", "ckpt-best"),
    ], className="gl-cards")
    last = t.tail(50).iloc[::-1]
    rows = [[r.attempt, "" if is_missing(r.step) else int(r.step),
             "" if is_missing(r.tier) else r.tier, _utc(r.start), _dur(r.stall_s), _dur(r.write_s),
             "" if is_missing(r.bytes) else f"{r.bytes / 1e9:,.2f} GB"]
            for r in last.itertuples()]
    gain = m.get("gain_points")
    return html.Div([
        cards,
        html.P(d["sentence"], id="ckpt-recommendation",
               className="gl-callout" + (" good" if gain and gain > 0.05 else "")),
        html.Div([html.Div(dcc.Graph(figure=fig.checkpoint_figure(t), id="ckpt-graph"),
                           className="gl-col-wide"),
                  html.Div(dcc.Graph(figure=fig.interval_figure(m), id="interval-graph"),
                           className="gl-col-wide")], className="gl-row"),
        html.H3(f"Latest checkpoints ({len(rows)} of {len(t)})"),
        _table(["attempt", "step", "tier", "started", "stall", "write", "size"], rows,
               id="ckpt-table"),
    ])


# ---------------------------------------------------------------------------- what-if
def whatif_controls(cal: Any) -> html.Div:
    """Controls seeded with the calibrated run's own values."""
    c = cal.config
    return html.Div([
        html.Div([html.Label("checkpoint interval (minutes) "),
                  dcc.Input(id="whatif-interval", type="number", min=0.1, step="any",
                            value=round(c.interval_s / 60, 2), debounce=True)]),
        html.Div([html.Label("saves "), dcc.RadioItems(
            id="whatif-mode", options=[{"label": "synchronous", "value": "sync"},
                                       {"label": "asynchronous", "value": "async"}],
            value=c.ckpt_mode if c.ckpt_mode in ("sync", "async") else "sync", inline=True)]),
        html.Div([html.Label("on a failure "), dcc.Dropdown(
            id="whatif-elastic", clearable=False, value=c.elastic,
            options=[{"label": "restart the whole job", "value": "restart"},
                     {"label": "shrink and go on", "value": "shrink"},
                     {"label": "swap in a hot spare", "value": "spares"}],
            style={"width": "16em", "display": "inline-block"})]),
        html.Div([html.Label("hot spare nodes "),
                  dcc.Input(id="whatif-spares", type="number", min=0, step=1, value=c.spares,
                            debounce=True)]),
        html.Div(dcc.Checklist(id="whatif-evict", options=[
            {"label": " evict flagged stragglers", "value": "evict"}],
            value=["evict"] if c.evict_stragglers else [])),
    ], className="gl-controls gl-whatif-controls")


def whatif_body(result: dict[str, Any], cal: Any) -> html.Div:
    """The comparison and the calibration it rests on."""
    d = result["delta_points"]
    sign = "+" if d >= 0 else ""
    summary = (f"Simulated goodput {fig.pct(result['baseline']['goodput'])} as run, "
               f"{fig.pct(result['changed']['goodput'])} with the change "
               f"({sign}{d:.1f} points; {result['trials']} trials each, same seeds). "
               f"Measured: {fig.pct(result['actual']['goodput'])}.")
    # measured values first, then what had to be assumed; plain defaults are left out
    prov = [[k, _value(getattr(cal.config, k)), v] for k, v in
            sorted(cal.provenance.items(), key=lambda kv: not kv[1].startswith("measured"))
            if v != "assumed: simulator default"]
    return html.Div([
        html.P(summary, id="whatif-summary", title=f"{d:.4f}", className="gl-callout"),
        dcc.Graph(figure=fig.whatif_figure(result), id="whatif-graph"),
        html.H3("Calibration (simulator fitted to this run)"),
        _table(["field", "value", "from"], prov, id="whatif-calibration"),
        html.P("Fields not listed keep the simulator's defaults (docs/simulator.md). The "
               "Checkpoints page's interval advice is the first-order formula (Young/Daly "
               "family); this page simulates, with restarts, stragglers and noise, so the two "
               "can differ for small gains.", className="gl-note"),
    ])


def _na(v: Any) -> Any:
    return "" if is_missing(v) else v


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}"
    return str(v)
