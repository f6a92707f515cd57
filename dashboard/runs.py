"""The runs list page: sorted, filtered and paged by the store, its view in the URL.

Why a module of its own: a long-lived collector holds thousands of runs, so the list is
never read whole. The store answers one page (``RunReader.runs_page``: one query over the
stored reports), the page's controls (sort, order, state, text filter, page number) are
mirrored into the URL like every other page's (``?sort=goodput&state=failed&page=3``) so a
link reproduces the view, and the table itself is :func:`goodlens.dashboard.pages.runs_body`.
Callbacks stay thin: arguments in, one read, a layout out.
"""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html

from goodlens.dashboard import pages

#: Runs per page of the list.
PAGE_SIZE = 50
#: The sort keys offered, with their labels (the store's ``SORT_KEYS``, most useful first).
SORTS = (("start", "started"), ("goodput", "goodput"), ("duration", "duration"),
         ("last_activity", "last activity"), ("state", "state"), ("name", "name"),
         ("steps", "steps"))
STATES = ("running", "completed", "failed", "preempted")


def _page(query: dict[str, str]) -> int:
    try:
        return max(int(query.get("page", "1")), 1)
    except ValueError:
        return 1


def runs_layout(query: dict[str, str]) -> html.Div:
    """The list's controls, seeded from the URL's query, and an empty body."""
    sort = query.get("sort") if query.get("sort") in dict(SORTS) else "start"
    state = query.get("state") if query.get("state") in STATES else None
    controls = html.Div([
        html.Label(["sort ", dcc.Dropdown(id="runs-sort", value=sort, clearable=False,
                                          options=[{"label": lbl, "value": v}
                                                   for v, lbl in SORTS],
                                          style={"width": "10em"})]),
        dcc.RadioItems(id="runs-order", value="asc" if query.get("order") == "asc" else "desc",
                       options=[{"label": "descending", "value": "desc"},
                                {"label": "ascending", "value": "asc"}], inline=True),
        html.Label(["state ", dcc.Dropdown(id="runs-state", value=state, clearable=True,
                                           placeholder="any", options=list(STATES),
                                           style={"width": "9em"})]),
        dcc.Input(id="runs-q", value=query.get("q", ""), debounce=True, type="text",
                  placeholder="run id or name contains...", style={"width": "18em"}),
        html.Button("< previous", id="runs-prev", n_clicks=0),
        html.Label(["page ", dcc.Input(id="runs-page", type="number", min=1, step=1,
                                       value=_page(query), debounce=True,
                                       style={"width": "4em"})]),
        html.Button("next >", id="runs-next", n_clicks=0),
        html.Span(id="runs-count", className="gl-muted"),
        dcc.Store(id="runs-pages", data=1),
    ], className="gl-controls")
    return html.Div([html.H2("Runs"), controls, html.Div(id="runs-body")])


def register_runs_callbacks(app: dash.Dash, data: Any) -> None:
    """The list redrawn on the timer and on each control; the paging buttons; a changed
    filter or order starts again at page 1."""

    @app.callback(Output("runs-body", "children"), Output("runs-count", "children"),
                  Output("runs-pages", "data"), Input("tick", "n_intervals"),
                  Input("runs-sort", "value"), Input("runs-order", "value"),
                  Input("runs-state", "value"), Input("runs-q", "value"),
                  Input("runs-page", "value"))
    def runs_list(_: Any, sort: str, order: str, state: str | None, text: str | None,
                  page: Any) -> tuple:
        try:
            n = max(int(page or 1), 1)
        except (TypeError, ValueError):
            n = 1
        rows, total = data.runs(limit=PAGE_SIZE, offset=(n - 1) * PAGE_SIZE,
                                sort=sort or "start", descending=order != "asc",
                                state=state or None, text=(text or "").strip() or None)
        pages_n = max((total + PAGE_SIZE - 1) // PAGE_SIZE, 1)
        first = (n - 1) * PAGE_SIZE + 1
        count = (f"runs {first}-{first + len(rows) - 1} of {total}" if rows
                 else f"no runs on page {n} of {pages_n}" if total else "")
        return pages.runs_body(rows, filtered=bool(state or text)), count, pages_n

    @app.callback(Output("runs-page", "value"), Input("runs-prev", "n_clicks"),
                  Input("runs-next", "n_clicks"), Input("runs-sort", "value"),
                  Input("runs-order", "value"), Input("runs-state", "value"),
                  Input("runs-q", "value"), State("runs-page", "value"),
                  State("runs-pages", "data"), prevent_initial_call=True)
    def paging(_p: Any, _n: Any, _s: Any, _o: Any, _st: Any, _q: Any, page: Any,
               pages_n: Any) -> Any:
        trigger = dash.ctx.triggered_id
        try:
            n = max(int(page or 1), 1)
        except (TypeError, ValueError):
            n = 1
        if trigger == "runs-prev":
            return max(n - 1, 1)
        if trigger == "runs-next":
            return min(n + 1, int(pages_n or 1))
        return 1 if n != 1 else dash.no_update
