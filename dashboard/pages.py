"""Page layouts: the data of :mod:`goodlens.dashboard.data` laid out as Dash components.

Pure functions of their arguments (no store, no callbacks), so every page renders the same
from a test as in the browser. Numbers a test compares carry their exact value in the
element's ``title`` (the hover text): the page shows ``1h 31m``, the title ``5489.06 s``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from dash import dcc, html

from goodlens.analysis.accounting import BUCKETS, RESTART_PARTS, STARTUP_PARTS
from goodlens.analysis.findings import FINDING_COLUMNS, SLOWDOWN_TITLES, finding_cells
from goodlens.analysis.measured import interval_advice
from goodlens.dashboard import figures as fig
from goodlens.dashboard.ft import ft_section
from goodlens.dashboard.urlstate import PAGES
from goodlens.model.jsonable import is_missing
from goodlens.model.units import format_duration, format_instant


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


def nav(run_id: str | None, page: str, query: dict[str, str] | None = None) -> html.Div:
    """The top bar: the runs list, and the run's pages when a run is open (their links keep
    the view's window, price and refresh period: ``query``)."""
    from goodlens.dashboard.urlstate import make_query, shared
    keep = make_query(shared(query or {}))
    links = [dcc.Link("Runs", href="/", className="gl-nav-link"
                      + (" active" if page == "runs" else ""))]
    if run_id is not None:
        links.append(html.Span(f"run {run_id}", className="gl-nav-run"))
        links += [dcc.Link(name, href=run_href(run_id, key) + keep, id=f"nav-{key}",
                           className="gl-nav-link" + (" active" if key == page else ""))
                  for key, name in PAGES]
    links.append(dcc.Link("Compare runs", href="/compare", id="nav-compare",
                          className="gl-nav-link" + (" active" if page == "compare" else "")))
    links.append(dcc.Link("Nodes", href="/nodes", id="nav-nodes", className="gl-nav-link"
                          + (" active" if page == "nodes" else "")))
    links.append(dcc.Link("Cluster what-if", href="/cluster", className="gl-nav-link"
                          + (" active" if page == "cluster" else "")))
    return html.Div(links, className="gl-nav")


def not_found(message: str) -> html.Div:
    """A page for a URL that names nothing we have."""
    return html.Div([html.H2("Not found"), html.P(message, id="not-found"),
                     dcc.Link("Back to the runs", href="/")])


# ---------------------------------------------------------------------------- runs
def runs_body(runs: list[dict[str, Any]], filtered: bool = False) -> html.Div:
    """The runs list: goodput, duration, GPUs, state, with a link to each run
    (``filtered``: the list is narrowed by a state or text filter)."""
    if not runs and filtered:
        return html.Div([html.P("No runs match these filters.", id="runs-empty")])
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
    win = rep.get("window") or {}
    state = d["info"].get("state") if d.get("info") else ""
    cards = html.Div([
        _card("Goodput (wall-clock)", fig.pct(rep["goodput"]), "headline-goodput",
              f"{rep['goodput']:.6f}"),
        _card("Goodput (GPU-time)", fig.pct(rep["gpu_time_goodput"]), "headline-gpu-goodput",
              "" if rep["gpu_time_goodput"] is None else f"{rep['gpu_time_goodput']:.6f}"),
        _card("Wall-clock", _dur(wall), "headline-wall", f"{wall:.2f} s"),
        _card("Window" if win.get("since") is not None or win.get("until") is not None
              else "Whole run", f"{_utc(rep['start'])} to {_utc(rep['end'])}",
              "headline-window", f"{rep['start']:.3f} {rep['end']:.3f}"),
        _card("Attempts", str(len(rep["attempts"])), "headline-attempts"),
        _state_card(state, rep),
        *([_card("Excluded", _dur(sum(rep["excluded"].values())), "headline-excluded",
                 ", ".join(f"{k} {v:.2f} s" for k, v in rep["excluded"].items()))]
          if rep.get("excluded") else []),
    ], className="gl-cards")
    if win.get("error"):
        cards = html.Div([html.P(f"Window not applied: {win['error']}.", className="gl-error",
                                 id="window-error"), cards])
    rows, ids = [], []
    for b in BUCKETS:
        v = rep["buckets"].get(b, 0.0)
        rows.append([fig.label(b), html.Td(_dur(v) if v is not None else "not measured",
                                           title="" if v is None else f"{v:.2f} s",
                                           id=f"bucket-{b}"),
                     html.Td("" if v is None else fig.pct(v / wall if wall else 0.0),
                             id=f"bucket-{b}-share")])
        ids.append(f"row-{b}")
        parts = {"startup": [(p, rep.get("startup_parts", {}).get(p, 0.0))
                             for p in STARTUP_PARTS],
                 "restart": [(p, rep["restart_parts"][p]) for p in RESTART_PARTS],
                 "other": list(rep.get("other_parts", {}).items())}.get(b, [])
        for p, pv in parts:
            if pv:
                rows.append([html.Span(f"  {p}", className="gl-sub"),
                             html.Td(_dur(pv), title=f"{pv:.2f} s", id=f"{b}-{p}"),
                             fig.pct(pv / wall if wall else 0.0)])
                ids.append(f"row-{b}-{p}")
    buckets = _table(["bucket", "time", "share"], rows, id="bucket-table", row_ids=ids)
    att_rows = [[a["attempt"], _utc(a["start"]), _dur(a["wall_clock_s"]), fig.pct(a["goodput"]),
                 _dur(a["buckets"].get("startup", 0.0)), _dur(a["buckets"]["restart"]),
                 _dur(a["buckets"]["recompute"]),
                 a["steps"].get("kept", ""), a["steps"].get("recomputed", "")]
                for a in rep["attempts"]]
    attempts = _table(["attempt", "start", "wall-clock", "goodput", "startup", "restart",
                       "recompute", "steps kept", "steps redone"], att_rows, id="attempt-table")
    end = rep["end"] if rep["end"] is not None else 0.0
    x_range = None
    if win.get("run_end") is not None and win["run_end"] > win["run_start"]:
        x_range = fig.time_range(win["since"] if win.get("since") is not None
                                 else win["run_start"],
                                 win["until"] if win.get("until") is not None
                                 else win["run_end"])
    return {"ov-cards": cards, "ov-buckets": buckets, "ov-attempts": attempts,
            "overview-exclude": _exclude_options(rep), "breakdown-graph": fig.breakdown_figure(rep),
            "ov-ft": ft_section(d.get("ft"), win.get("run_end"), x_range),
            "series-graph": fig.goodput_series_figure(d["series"], x_range),
            "timeline-graph": fig.timeline_figure(d["attempts"], d["events"], end, x_range,
                                                  d.get("ft"))}


def _exclude_options(rep: dict[str, Any]) -> list[dict[str, Any]]:
    """The exclusion checklist's choices: each named part that holds time (with its time),
    and any part excluded now (so it stays there to be put back)."""
    held: dict[str, float] = {}
    for part in ("startup_parts", "restart_parts", "other_parts"):  # init: both starts
        for name, v in (rep.get(part) or {}).items():
            held[name] = held.get(name, 0.0) + (v or 0.0)
    names = list(dict.fromkeys([*rep.get("excludable", []), *rep.get("excluded", {})]))
    out = []
    for name in names:
        secs = rep.get("excluded", {}).get(name, held.get(name, 0.0))
        out.append({"label": f" {name} ({_dur(secs)})", "value": name})
    return out


def live_graph(gid: str, parts: dict[str, Any], config: dict[str, Any] | None = None
               ) -> html.Div:
    """The graph ``gid`` (with its figure in ``parts``, if there) that a live refresh
    redraws: the server sends each new figure to the store
    ``<gid>-next`` as ``{"figure", "keep"}``, and a function in the browser
    (``assets/keep_view.js``) puts it on the graph, keeping the user's zoom and hidden
    traces when ``keep`` (a timer redraw). The shown figure never travels to the server.
    ``config``: Plotly's graph config."""
    return html.Div([dcc.Store(id=f"{gid}-next"),
                     dcc.Graph(id=gid, config=config or {},
                               **({"figure": parts[gid]} if gid in parts else {}))])


#: The time graphs' config: a double-click autoranges (the relayout says ``autorange``, which
#: clears the window). Plotly's default first resets to the range of the graph's first
#: drawing, which for these graphs is an explicit range (the run's span or the window
#: then shown): the window would be set to it rather than cleared.
TIME_GRAPH = {"doubleClick": "autosize"}


#: The overview's parts: the Divs a refresh fills, and the graphs whose figure it replaces
#: (the graphs stay mounted, so a live redraw keeps the user's zoom).
OVERVIEW_DIVS = ("ov-cards", "ov-buckets", "ov-attempts", "ov-ft")
OVERVIEW_GRAPHS = ("breakdown-graph", "series-graph", "timeline-graph")


def overview_skeleton(parts: dict[str, Any] | None = None, exclude: list[str] | None = None
                      ) -> html.Div:
    """The overview's layout, empty or filled with :func:`overview_parts`; ``exclude``: the
    parts ticked at first (a shared link's)."""
    p = parts or {}
    ticked = list(exclude or [])
    options = p.get("overview-exclude") or [{"label": f" {x}", "value": x} for x in ticked]

    return html.Div([
        html.Div(p.get("ov-cards"), id="ov-cards"),
        html.Div([html.Span("Exclude from the wall-clock: ", className="gl-note"),
                  dcc.Checklist(id="overview-exclude", options=options,
                                value=ticked, inline=True,
                                inputStyle={"margin-left": "1em"})],
                 id="ov-exclude", title="Take these parts out of the wall-clock entirely, "
                 "as `goodlens report --exclude` does (e.g. the scheduler's queue, a planned "
                 "maintenance window)"),
        html.Div([html.Div(p.get("ov-buckets"), id="ov-buckets", className="gl-col"),
                  html.Div(live_graph("breakdown-graph", p), className="gl-col-wide")],
                 className="gl-row"),
        live_graph("series-graph", p, TIME_GRAPH),
        live_graph("timeline-graph", p, TIME_GRAPH), html.Div(p.get("ov-ft"), id="ov-ft"),
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


def ranks_controls(query: dict[str, str] | None = None) -> html.Div:
    """Attempt picker, pooling and span of the heatmap (options filled by the callback),
    seeded from the URL's ``attempt``, ``pool`` and ``span``."""
    q = query or {}
    attempt: Any = q.get("attempt", "latest")
    attempt = int(attempt) if str(attempt).isdigit() else "latest"
    return html.Div([
        html.Label("attempt "), dcc.Dropdown(
            id="ranks-attempt", value=attempt, clearable=False,
            options=attempt_options([] if attempt == "latest" else [attempt]),
            style={"width": "8em", "display": "inline-block"}),
        html.Label(" cells show "), dcc.RadioItems(
            id="ranks-pool", options=[{"label": "the slowest rank", "value": "max"},
                                      {"label": "the mean", "value": "mean"}],
            value=q.get("pool") if q.get("pool") in ("max", "mean") else "max", inline=True,
            style={"display": "inline-block"}),
        html.Label(" steps "), dcc.RadioItems(
            id="ranks-span", options=[{"label": "latest", "value": "latest"},
                                      {"label": "whole attempt", "value": "all"}],
            value=q.get("span") if q.get("span") in ("latest", "all") else "latest",
            inline=True, style={"display": "inline-block"}),
    ], className="gl-controls")


_FINDINGS_SOURCE = {
    "live": "the collector's live detector watches this run; these are the subjects it "
            "flagged",
    "batch": "found by a batch pass over this run's step records (no live detector saw it)",
    "too-large": "this run is too large for a batch pass here and no live detector flagged "
                 "anything; run `goodlens detect --db FILE --run ID`",
    "pending": "scanning this run's step records for stragglers (no live detector saw it); "
               "the table fills in when the scan ends",
    "detecting": "the collector's live detector has not finished its first pass over this "
                 "run; the table fills in when it has",
    "none": "",
}



def ranks_parts(d: dict[str, Any], pool: str = "max") -> dict[str, Any]:
    """Heatmap, flagged stragglers with slowdown, cost and action, host and switch roll-up,
    by the id of the element each fills."""
    f_rows = []
    for f in sorted(d["findings"], key=lambda f: -(f["wait_per_hour_s"] or 0)):
        cells = finding_cells(f)
        f_rows.append([html.Td(cells[k], title=SLOWDOWN_TITLES[k].format(f[k]))
                       if k in SLOWDOWN_TITLES and f.get(k) is not None and cells[k] else
                       html.Td(cells[k], className=f"gl-action-{f['action']}")
                       if k == "action" else cells[k] for k, _ in FINDING_COLUMNS])
    running = d["findings_source"] in ("pending", "detecting")  # no pass has ended yet
    findings = (_table([h for _, h in FINDING_COLUMNS], f_rows, id="findings-table")
                if f_rows else html.P("Straggler detection is still running." if running
                                      else "No persistent straggler.", id="findings-none"))
    sw = fig.switch_table_rows(d.get("hosts"))
    switches = _table(["switch", "hosts", "mean vs median host", "worst host", "its slowdown"],
                      [[r["switch"], r["hosts"], fig.pct(r["relative"]), r["worst_host"],
                        fig.pct(r["worst_relative"])] for r in sw], id="switch-table") \
        if sw else html.Div()
    empty = ranks_empty(d)
    return {"rk-note": ranks_note(d),
            "heatmap-graph": fig.empty_figure(empty) if empty
            else fig.heatmap_figure(d["grid"], pool),
            "rk-findings": html.Div([html.P(_FINDINGS_SOURCE[d["findings_source"]],
                                            className="gl-note", id="findings-source"),
                                     findings]),
            "host-graph": fig.empty_figure(empty) if empty else fig.host_figure(d.get("hosts")),
            "rk-switches": switches}


def _span(d: dict[str, Any]) -> str:
    """The window the ranks page was asked for, in words (``""``: the whole run)."""
    lo, hi = d.get("since"), d.get("until")
    if lo is None and hi is None:
        return ""
    start = "the run's start" if lo is None else format_instant(lo)
    end = "the run's end" if hi is None else format_instant(hi)
    return f"{start} to {end}"


def ranks_empty(d: dict[str, Any]) -> str:
    """Why the heatmap and hosts are blank when a window holds none of the steps (``""``
    when they are not)."""
    if d.get("grid") is not None or not _span(d):
        return ""
    which = f"attempt {d['attempt']}" if d.get("picked") else "any attempt"
    return f"No steps of {which} in the window {_span(d)}."


def ranks_note(d: dict[str, Any]) -> html.Span:
    """What the heatmap shows: its steps, attempt and ranks, the window they were picked
    by, and whether the scan budget clipped them; the exact steps in the hover text
    (``first last attempt``)."""
    error = (f"Window not applied: {d['window_error']}. " if d.get("window_error") else "")
    window = d.get("window")
    if window is None:
        return html.Span(error + ranks_empty(d), id="rk-note-text")
    span = _span(d)
    text = (f"steps {window[0]:,}-{window[1]:,} of attempt {d['attempt']}, {window[2]:,} ranks"
            + (f", in the window {span}" if span else "")
            + (" (the latest steps; choose 'whole attempt' for all)" if d.get("clipped")
               else ""))
    return html.Span(error + text, id="rk-note-text",
                     title=f"{window[0]} {window[1]} {d['attempt']}")


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
def checkpoints_controls(query: dict[str, str], price: float | None = None) -> html.Div:
    """The price of a GPU-hour (the URL's, else ``price``: ``--gpu-hour-price`` of ``serve``
    or ``dashboard``) and the copies kept: the costs' inputs, kept in the URL."""
    from goodlens.dashboard.urlstate import number
    retained = number(query, "retained")
    given = number(query, "price")
    return html.Div([
        html.Label("price per GPU-hour "),
        dcc.Input(id="ckpt-price", type="number", min=0, step="any", debounce=True,
                  value=given if given is not None else price, placeholder="none",
                  style={"width": "7em"}),
        html.Label(" checkpoints kept on storage "),
        dcc.Input(id="ckpt-retained", type="number", min=1, step=1, debounce=True,
                  value=int(retained) if retained and retained >= 1 else 2,
                  style={"width": "5em"}),
    ], className="gl-controls")


def _gb(v: float | None, per: float = 1e9, unit: str = "GB") -> str:
    return "n/a" if is_missing(v) else f"{v / per:,.2f} {unit}"


def _money(v: float | None) -> str:
    return "n/a" if is_missing(v) else f"{v:,.2f}"


def _gpuh(v: float | None) -> str:
    return "n/a" if is_missing(v) else f"{v:,.{1 if v >= 10 else 3}f} GPU-h"


def _exact(v: float | None) -> str:
    return "" if is_missing(v) else repr(float(v))


def checkpoint_advice(m: dict[str, Any]) -> str:
    """The interval advice in words, as ``goodlens plan --db --run`` writes it (durations as
    the cards write them): :func:`goodlens.analysis.measured.interval_advice`."""
    return interval_advice(m)


def _cost_cards(c: dict[str, Any]) -> html.Div:
    """What the checkpoints cost: per checkpoint and per day, bandwidth, storage, and what
    the current interval loses against the best one (``goodlens plan checkpoint``'s
    arithmetic: :func:`goodlens.analysis.ckptcost.run_checkpoint_cost`)."""
    t = c.get("typical") or {}
    gph, day = t.get("gpu_hours_per_checkpoint") or {}, t.get("gpu_hours_per_day") or {}
    money, money_day = t.get("money_per_checkpoint") or {}, t.get("money_per_day") or {}
    priced = c.get("price_per_gpu_hour") is not None
    cards = [_card("Stall per checkpoint", _gpuh(gph.get("sync")), "ckpt-gpuh",
                   _exact(gph.get("sync"))),
             _card("Stall per day", _gpuh(day.get("sync")), "ckpt-gpuh-day",
                   _exact(day.get("sync"))),
             _card("Write bandwidth needed", _gb(c.get("write_bw_needed"), 1e9, "GB/s"),
                   "ckpt-write-bw", _exact(c.get("write_bw_needed"))),
             _card("Sustained (size / interval)", _gb(t.get("sustained_bw"), 1e9, "GB/s"),
                   "ckpt-sustained-bw", _exact(t.get("sustained_bw"))),
             _card(f"Storage for {c['retained']} copies", _gb(t.get("storage_bytes")),
                   "ckpt-storage", _exact(t.get("storage_bytes"))),
             _card("Current interval loses", _gpuh(c.get("loss_gpu_hours_per_day")) + "/day"
                   if c.get("loss_gpu_hours_per_day") is not None else "n/a",
                   "ckpt-loss-day", _exact(c.get("loss_gpu_hours_per_day")))]
    if priced:
        cards[1:1] = [_card("Cost per checkpoint", _money(money.get("sync")), "ckpt-money",
                            _exact(money.get("sync"))),
                      _card("Cost per day", _money(money_day.get("sync")), "ckpt-money-day",
                            _exact(money_day.get("sync")))]
        cards.append(_card("Loss per day (money)", _money(c.get("loss_money_per_day")),
                           "ckpt-loss-money-day", _exact(c.get("loss_money_per_day"))))
    return html.Div(cards, className="gl-cards", id="ckpt-costs")


def checkpoints_body(d: dict[str, Any]) -> html.Div:
    """Each checkpoint's stall, write time, size and cost, the trend, and the interval plan."""
    t, m, c = d["table"], d["measured"], d.get("cost") or {}

    def med(col: str) -> float | None:
        return float(t[col].median()) if len(t) and t[col].notna().any() else None
    size = med("bytes")
    cards = html.Div([
        _card("Checkpoints", str(len(t)), "ckpt-count"),
        _card("Median stall", _dur(med("stall_s")) or "n/a", "ckpt-stall",
              _exact(med("stall_s"))),
        _card("Median write", _dur(med("write_s")) or "n/a", "ckpt-write",
              _exact(med("write_s"))),
        _card("Median size", "n/a" if size is None else f"{size / 1e9:,.2f} GB", "ckpt-size",
              _exact(size)),
        _card("GPUs", f"{c.get('gpus', m.get('gpus')):,.0f}", "ckpt-gpus",
              _exact(c.get("gpus", m.get("gpus")))),
        _card("Interval", _dur(m.get("interval_s")) or "n/a", "ckpt-interval",
              _exact(m.get("interval_s"))),
        _card("Best interval", _dur(m.get("best_interval_s")) or "n/a", "ckpt-best",
              _exact(m.get("best_interval_s"))),
    ], className="gl-cards")
    durable = len(t) and t.write_s.notna().any()
    rows = []
    cost_rows = c.get("rows") or [{}] * len(t)
    for i in range(len(t) - 1, max(len(t) - 51, -1), -1):  # the latest 50, newest first
        r, k = t.iloc[i], cost_rows[i] if i < len(cost_rows) else {}
        write = (_dur(r.write_s) if not is_missing(r.write_s) else
                 "not durable yet" if durable else "not reported")
        rows.append([r.attempt, "" if is_missing(r.step) else int(r.step),
                     "" if is_missing(r.tier) else r.tier, _utc(r.start), _dur(r.stall_s),
                     write, "" if is_missing(r.bytes) else f"{r.bytes / 1e9:,.2f} GB",
                     _gpuh(k.get("gpu_hours")), _money(k.get("money")),
                     _gb(k.get("write_bw"), 1e9, "GB/s")])
    gain = m.get("gain_points")
    return html.Div([
        *([html.P(f"Window not applied: {d['window_error']}.", className="gl-error")]
          if d.get("window_error") else []),
        cards, _cost_cards(c),
        html.P(checkpoint_advice(m), id="ckpt-recommendation",
               className="gl-callout" + (" good" if gain and gain > 0.05 else "")),
        html.Div([html.Div(dcc.Graph(figure=fig.checkpoint_figure(t), id="ckpt-graph"),
                           className="gl-col-wide"),
                  html.Div(dcc.Graph(figure=fig.interval_figure(m), id="interval-graph"),
                           className="gl-col-wide")], className="gl-row"),
        html.H3(f"Latest checkpoints ({len(rows)} of {len(t)})"),
        _table(["attempt", "step", "tier", "started", "stall", "write", "size", "stall GPU-h",
                "stall cost", "write bandwidth"], rows, id="ckpt-table"),
    ])


# ---------------------------------------------------------------------------- what-if
def whatif_controls(cal: Any, query: dict[str, str] | None = None) -> html.Div:
    """Controls seeded with the calibrated run's own values, or the URL's (``interval`` in
    seconds, ``mode``, ``elastic``, ``spares``, ``evict``: a shared link's what-if)."""
    from goodlens.dashboard.urlstate import number
    c, q = cal.config, query or {}
    interval = _duration(q.get("interval")) or c.interval_s
    mode = q.get("mode") if q.get("mode") in ("sync", "async") else (
        c.ckpt_mode if c.ckpt_mode in ("sync", "async") else "sync")
    elastic = q.get("elastic") if q.get("elastic") in ("restart", "shrink", "spares") \
        else c.elastic
    spares = number(q, "spares")
    evict = q.get("evict") in ("1", "true", "yes") if "evict" in q else c.evict_stragglers
    return html.Div([
        html.Div([html.Label("checkpoint interval "),
                  dcc.Input(id="whatif-interval", type="text", debounce=True,
                            value=format_duration(interval), style={"width": "7em"}),
                  html.Span(" (e.g. 11m 04s, 90s, 1h30m)", className="gl-note")]),
        html.Div([html.Label("saves "), dcc.RadioItems(
            id="whatif-mode", options=[{"label": "synchronous", "value": "sync"},
                                       {"label": "asynchronous", "value": "async"}],
            value=mode, inline=True)]),
        html.Div([html.Label("on a failure "), dcc.Dropdown(
            id="whatif-elastic", clearable=False, value=elastic,
            options=[{"label": "restart the whole job", "value": "restart"},
                     {"label": "shrink and go on", "value": "shrink"},
                     {"label": "swap in a hot spare", "value": "spares"}],
            style={"width": "16em", "display": "inline-block"})]),
        html.Div([html.Label("hot spare nodes "),
                  dcc.Input(id="whatif-spares", type="number", min=0, step=1,
                            value=int(spares) if spares is not None else c.spares,
                            debounce=True)]),
        html.Div(dcc.Checklist(id="whatif-evict", options=[
            {"label": " evict flagged stragglers", "value": "evict"}],
            value=["evict"] if evict else [])),
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
    prov = [[k, _value(getattr(cal.config, k), k), v] for k, v in
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


def _duration(text: str | None) -> float | None:
    """A duration from a URL (``11m 04s``, ``664``), None when absent or unreadable."""
    from goodlens.model.units import parse_duration
    try:
        return parse_duration(text) if text else None
    except ValueError:
        return None


def _na(v: Any) -> Any:
    return "" if is_missing(v) else v


def _value(v: Any, name: str = "") -> str:
    """A calibrated field's value: durations (``*_s``) as durations, whole numbers without
    exponent, rates to 4 significant digits."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if name.endswith("_s") and v == v:
        return format_duration(float(v))
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
