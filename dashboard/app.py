"""The Dash app: URL routing and thin callbacks over :mod:`goodlens.dashboard.data` and the layouts.

The run id is in the URL (``/runs/<id>``, ``/runs/<id>/ranks``, ...), so a view can be
shared. Each page's body re-renders on a timer only when its run's data changed (the
version kept beside it), so a live run refreshes and a finished one costs one small query
per tick. Callbacks hold no logic of their own: parse the URL, ask the data layer, hand the
result to a layout function.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import dash
from dash import Input, Output, State, dcc, html

from goodlens.dashboard import pages, views
from goodlens.dashboard import runs as runs_view
from goodlens.dashboard.data import DashConfig, RunData
from goodlens.dashboard.urlstate import parse_path, parse_query

log = logging.getLogger("goodlens.dashboard")
NO = dash.no_update


def create_app(store: Any, config: DashConfig | None = None, **dash_kwargs: Any) -> dash.Dash:
    """The dashboard over an open store (a :class:`~goodlens.storage.reader.RunReader`, live or
    read-only)."""
    config = config or DashConfig()
    data = RunData(store, config)
    app = dash.Dash(__name__, title=config.title, suppress_callback_exceptions=True,
                    assets_folder=str(Path(__file__).with_name("assets")),
                    update_title=None, **dash_kwargs)
    app.layout = html.Div([
        # refresh=False: a control mirrored into the URL's query (urlstate) updates the
        # address bar and history without reloading the page
        dcc.Location(id="url", refresh=False),
        dcc.Interval(id="tick", interval=int(config.refresh_s * 1000)),
        html.Div(id="nav"),
        html.Div(id="page", className="gl-page"),
    ])
    app._goodlens_data = data  # for tests and the benchmark
    _register_routing(app, data)
    _register_run_pages(app, data)
    _register_ranks(app, data)
    _register_whatif(app, data)
    from goodlens.dashboard.cluster import register_cluster_callbacks
    from goodlens.dashboard.sync import register_view_callbacks
    register_cluster_callbacks(app)
    register_view_callbacks(app, data)
    return app


def _register_routing(app: dash.Dash, data: RunData) -> None:
    """The URL picks the page: navigation and the page's skeleton; the runs list."""
    @app.callback(Output("nav", "children"), Input("url", "pathname"),
                  Input("url", "search"))
    def navigation(pathname: str | None, search: str | None) -> Any:
        page, run_id = parse_path(pathname)
        return pages.nav(run_id, page, parse_query(search))

    # the page is built from the path, and its controls seeded from the query (a shared
    # link's view); a control's change rewrites the query, which does not rebuild the page
    @app.callback(Output("page", "children"), Input("url", "pathname"),
                  State("url", "search"))
    def route(pathname: str | None, search: str | None) -> Any:
        page, run_id = parse_path(pathname)
        query = parse_query(search)
        if page == "unknown":
            return pages.not_found(f"no page at {pathname}")
        if page == "runs":
            return runs_view.runs_layout(query)
        if page == "cluster":
            from goodlens.dashboard.cluster import cluster_layout
            return cluster_layout(query)
        if page == "nodes":
            from goodlens.dashboard.nodes import nodes_layout
            return nodes_layout(data.store, query)
        if page == "compare":
            picked = [x for x in query.get("runs", "").split(",") if x]
            return views.compare_layout(data.compare_choices(), picked)
        if data.version(run_id) is None:
            return pages.not_found(f"no run {run_id!r} in this store")
        head = html.H2(f"{dict(pages.PAGES)[page]}: {run_id}")
        store_id = dcc.Store(id=f"{page}-version")
        bar = views.run_bar(query, data.config.refresh_s, live_page=page != "whatif")
        if page == "ranks":
            return html.Div([head, bar, pages.ranks_controls(query), store_id,
                             _loading(pages.ranks_skeleton())])
        if page == "overview":
            return html.Div([head, bar, store_id, _loading(pages.overview_skeleton(
                exclude=[x for x in query.get("exclude", "").split(",") if x]))])
        if page == "whatif":
            # the form needs the calibration (its values seed the controls): it is built in
            # a callback of its own, behind a spinner, so the page shows at once
            return html.Div([head, html.P(
                "The simulator is fitted to this run (below); change a policy and compare. "
                "Differences between the two simulated bars are the policy's; the first bar "
                "is what the run measured.", className="gl-note"),
                _loading(html.Div(id="whatif-form")), _loading(html.Div(id="whatif-body"))])
        return html.Div([head, bar, pages.checkpoints_controls(
            query, data.config.gpu_hour_price), store_id,
                         _loading(html.Div(id=f"{page}-body"))])

    runs_view.register_runs_callbacks(app, data)


def _register_run_pages(app: dash.Dash, data: RunData) -> None:
    """Overview and checkpoints: redrawn on the timer only when the run's version moved."""
    def refreshing(page: str, outputs: list[Output], build: Any, controls: tuple = ()) -> None:
        """A page that redraws on the timer only when its run's version moved: ``build``
        gives the values of ``outputs`` for a run id and the values of the ``controls``
        inputs (the first output says when the run is gone)."""
        @app.callback(*outputs, Output(f"{page}-version", "data"),
                      Input("tick", "n_intervals"), Input("url", "pathname"), *controls,
                      State(f"{page}-version", "data"))
        def refresh(_: Any, pathname: str | None, *rest: Any) -> tuple:
            *values, shown = rest
            n = len(outputs)
            kind, run_id = parse_path(pathname)
            if kind != page or run_id is None:
                return (NO,) * (n + 1)
            v = data.version(run_id)
            if v is None:
                return (pages.not_found(f"run {run_id!r} is gone"), *(NO,) * n)
            # what is shown: the run's version and the controls it was drawn for (a redraw
            # for a control that the browser dropped, superseded by a timer tick, is then
            # made by the next tick instead of never)
            key = [list(v), list(values)]
            keep = redraw(key, shown, dash.ctx.triggered_id == "tick")
            if keep is None:
                return (NO,) * (n + 1)
            return (*_to_graphs(outputs, build(run_id, *values), keep), key)

    def checkpoints(run_id: str, since: str | None, until: str | None, price: Any,
                    retained: Any) -> tuple:
        keep = int(retained) if retained is not None and float(retained) >= 1 else 2
        return (pages.checkpoints_body(data.checkpoints(
            run_id, since or "", until or "", None if price is None else float(price),
            keep)),)
    refreshing("checkpoints", [Output("checkpoints-body", "children")], checkpoints,
               (Input("win-since", "value"), Input("win-until", "value"),
                Input("ckpt-price", "value"), Input("ckpt-retained", "value")))

    # the overview's graphs stay mounted and get new figures (a live redraw keeps zoom);
    # its exclusion checklist takes named parts out of the wall-clock (report --exclude)
    def overview(run_id: str, exclude: list[str] | None, since: str | None,
                 until: str | None) -> tuple:
        parts = pages.overview_parts(data.overview(run_id, tuple(exclude or ()),
                                                   since or "", until or ""))
        return tuple(parts[i] for i in (*pages.OVERVIEW_DIVS, *pages.OVERVIEW_GRAPHS,
                                        "overview-exclude"))
    refreshing("overview", [Output(i, "children") for i in pages.OVERVIEW_DIVS]
               + [Output(f"{i}-next", "data") for i in pages.OVERVIEW_GRAPHS]
               + [Output("overview-exclude", "options")], overview,
               (Input("overview-exclude", "value"), Input("win-since", "value"),
                Input("win-until", "value")))


def _register_ranks(app: dash.Dash, data: RunData) -> None:
    """The ranks page (attempt, pooling and span controls), and the browser-side redraw of
    every live graph that keeps the user's zoom (``assets/keep_view.js``)."""
    rk_outputs = [Output(i, "children") for i in pages.RANKS_DIVS] + \
        [Output(f"{i}-next", "data") for i in pages.RANKS_GRAPHS]
    for gid in (*pages.OVERVIEW_GRAPHS, *pages.RANKS_GRAPHS):
        app.clientside_callback(
            dash.ClientsideFunction(namespace="goodlens", function_name="keepView"),
            Output(gid, "figure"), Input(f"{gid}-next", "data"), State(gid, "figure"))

    @app.callback(*rk_outputs, Output("ranks-version", "data"),
                  Output("ranks-attempt", "options"),
                  Input("tick", "n_intervals"), Input("url", "pathname"),
                  Input("ranks-attempt", "value"), Input("ranks-pool", "value"),
                  Input("ranks-span", "value"), Input("win-since", "value"),
                  Input("win-until", "value"), State("ranks-version", "data"))
    def ranks_page(_: Any, pathname: str | None, attempt: Any, pool: str, span: str,
                   since: str | None, until: str | None, shown: Any) -> tuple:
        n = len(rk_outputs)
        kind, run_id = parse_path(pathname)
        if kind != "ranks" or run_id is None:
            return (NO,) * (n + 2)
        pick = None if attempt in (None, "latest") else int(attempt)
        # cached per data version: a timer tick of an unchanged run reads one row
        rk = data.ranks(run_id, pick, span == "all", since or "", until or "")
        if rk is None:
            return (f"run {run_id!r} is gone", *(NO,) * (n + 1))
        key = [list(rk["version"]), [attempt, pool, span, since or "", until or ""],
               rk["findings_source"]]  # a pass ending redraws the findings
        keep = redraw(key, shown, dash.ctx.triggered_id == "tick")
        if keep is None:
            return (NO,) * (n + 2)
        parts = pages.ranks_parts(rk, pool or "max")
        values = [parts[i] for i in (*pages.RANKS_DIVS, *pages.RANKS_GRAPHS)]
        # "latest" follows a live run into its next attempt; the list grows with it
        return (*_to_graphs(rk_outputs, values, keep), key,
                pages.attempt_options(rk["attempts"]))


def _register_whatif(app: dash.Dash, data: RunData) -> None:
    """What-if: the form seeded from the run's calibration, and the comparison it asks for."""
    @app.callback(Output("whatif-form", "children"), Input("url", "pathname"),
                  State("url", "search"))
    def whatif_form(pathname: str | None, search: str | None) -> Any:
        kind, run_id = parse_path(pathname)
        if kind != "whatif" or run_id is None:
            return NO
        try:
            cal = data.whatif_calibration(run_id)
        except ValueError as exc:  # e.g. a run with no wall-clock yet
            return html.P(f"Nothing to simulate yet: {exc}.", className="gl-note",
                          id="whatif-unavailable")
        if cal is None:
            return pages.not_found(f"run {run_id!r} is gone")
        return pages.whatif_controls(cal, parse_query(search))

    # every Input is a form control (they exist once the form is drawn; the URL is a State,
    # so the renderer never fires this with half its inputs missing)
    @app.callback(Output("whatif-body", "children"),
                  Input("whatif-interval", "value"), Input("whatif-mode", "value"),
                  Input("whatif-elastic", "value"), Input("whatif-spares", "value"),
                  Input("whatif-evict", "value"), State("url", "pathname"))
    def whatif_page(interval: Any, mode: str, elastic: str, spares: Any,
                    evict: list[str] | None, pathname: str | None) -> Any:
        kind, run_id = parse_path(pathname)
        if kind != "whatif" or run_id is None:
            return NO
        try:
            cal = data.whatif_calibration(run_id)
        except ValueError:
            return NO  # the form says why
        if cal is None:
            return pages.not_found(f"run {run_id!r} is gone")
        try:
            changes = whatif_changes(cal.config, interval, mode, elastic, spares, evict)
        except ValueError as exc:
            return html.P(str(exc), className="gl-error", id="whatif-error")
        return pages.whatif_body(data.whatif(run_id, changes), cal)


def redraw(key: list[Any], shown: Any, tick: bool) -> bool | None:
    """How a page redraws, given ``key`` (``[version, controls, ...]``: what it would draw)
    and ``shown`` (the key of what it shows, or None): ``None``, not at all (a timer tick,
    nothing moved); ``True``, as a timer redraw of the controls shown (the browser keeps the
    user's zoom and hidden traces); ``False``, afresh. A tick that finds other controls than
    the ones shown draws afresh: the browser drops a control's answer that a tick's request
    superseded, and keeping the view would keep the axes drawn for the old controls (a
    zoomed window everywhere but a graph still on the whole run)."""
    if shown is None:
        return False
    shown = list(shown)
    if tick and shown == key:
        return None
    return tick and len(shown) > 1 and shown[1] == key[1]


def _to_graphs(outputs: list[Output], values: Any, keep: bool) -> list[Any]:
    """``values`` for ``outputs``; a figure bound for a graph's ``-next`` store is wrapped
    with whether the browser should keep the user's view (``keep``: :func:`redraw`)."""
    return [{"figure": v, "keep": keep} if o.component_id.endswith("-next") else v
            for o, v in zip(outputs, values)]


def _loading(child: Any) -> Any:
    """A spinner only for slow redraws (a quick timer refresh does not blink)."""
    return dcc.Loading(child, delay_show=600)


def whatif_changes(base: Any, interval: Any, mode: str | None, elastic: str | None,
                   spares: Any, evict: list[str] | None) -> dict[str, Any]:
    """The what-if form as SimConfig changes (only fields that differ from ``base``);
    ValueError with what to fix for a value the simulator would refuse. ``interval`` is a
    duration (``11m 04s``, ``90s``, ``1h30m``; a bare number is seconds)."""
    from goodlens.model.units import format_duration, parse_duration
    changes: dict[str, Any] = {}
    try:
        seconds = parse_duration(interval) if interval not in (None, "") else None
    except ValueError:
        seconds = None
    if seconds is None or not seconds >= 6:
        raise ValueError("enter a checkpoint interval of at least 6s (e.g. 11m 04s, 90s)")
    interval_s = round(seconds, 3)
    # the box shows the interval to the second: a value shown unchanged is no change
    if format_duration(interval_s) != format_duration(base.interval_s) and \
            abs(interval_s - base.interval_s) > 0.5:
        changes["interval_s"] = interval_s
    if mode and mode != base.ckpt_mode:
        changes["ckpt_mode"] = mode
    if elastic and elastic != base.elastic:
        if elastic == "shrink" and base.nodes < 2:
            raise ValueError("a one-node job cannot shrink; pick another policy")
        changes["elastic"] = elastic
    if spares is not None and (float(spares) < 0 or float(spares) != int(float(spares))):
        raise ValueError("hot spares must be a whole number, 0 or more")
    n = int(float(spares or 0))
    if n > base.nodes:
        raise ValueError(f"at most {base.nodes} hot spares (as many as the job's nodes)")
    if (elastic or base.elastic) == "spares" and n == 0:
        n = 1  # picking the policy means at least one spare
    if n != base.spares:
        changes["spares"] = n
    ev = bool(evict and "evict" in evict)
    if ev != base.evict_stragglers:
        changes["evict_stragglers"] = ev
    return changes
