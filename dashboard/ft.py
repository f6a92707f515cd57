"""The overview's per-step fault tolerance section (torchft runs only).

Why a module of its own: under torchft the job never stops, so what a failed or evicted
replica group cost shows only per group and in samples, not in the wall-clock breakdown
above it. This lays out the report's ``fault_tolerance`` section
(:mod:`goodlens.analysis.ft`): the groups taking part over time, each group's GPU-time by
state, and the samples committed, discarded and never trained against the full world.
Pure functions of their arguments, like :mod:`goodlens.dashboard.pages`.
"""

from __future__ import annotations

from typing import Any

from dash import dcc, html

from goodlens.dashboard import figures as fig
from goodlens.model.jsonable import is_missing
from goodlens.model.units import format_duration


def _card(title: str, value: str, id: str, exact: str = "") -> html.Div:
    """A headline card (the overview's look); ``exact``: the number a test compares."""
    return html.Div([html.Div(title, className="gl-card-title"),
                     html.Div(value, id=id, title=exact, className="gl-card-value")],
                    className="gl-card")


def _count(v: Any) -> str:
    return "n/a" if is_missing(v) else f"{v:,.0f}"


def _n(v: Any, noun: str) -> str:
    """``3 replica groups``, ``1 rank``."""
    return f"{v} {noun}{'' if v == 1 else 's'}"


def _exact(v: Any) -> str:
    return "" if is_missing(v) else repr(float(v))


def ft_cards(ft: dict[str, Any]) -> html.Div:
    """The section's numbers: the sample view (committed, discarded, never trained against
    the full world), steps run short and discarded, heals, and the recoveries that
    rejoined with their time out of the quorum; each card's exact value in its ``title``."""
    s, st = ft.get("samples") or {}, ft.get("steps") or {}
    heals = ft.get("heals") or []
    heal_s = sum(h.get("seconds") or 0.0 for h in heals)
    back = [r for r in ft.get("recoveries") or [] if not is_missing(r.get("out_s"))]
    out_s = sum(r["out_s"] for r in back)  # restarted groups' time out of the quorum
    return html.Div([
        _card("Samples committed", f"{_count(s.get('committed'))} of "
              f"{_count(s.get('full_world'))}", "ft-samples-committed",
              _exact(s.get("committed"))),
        _card("Sample goodput", fig.pct(s.get("goodput")), "ft-sample-goodput",
              _exact(s.get("goodput"))),
        _card("Samples discarded", _count(s.get("discarded")), "ft-samples-discarded",
              _exact(s.get("discarded"))),
        _card("Never trained (groups out)", _count(s.get("missing_groups")),
              "ft-samples-missing", _exact(s.get("missing_groups"))),
        _card("Steps run short", f"{_count(st.get('short'))} of {_count(st.get('committed'))}"
              + ("" if is_missing(st.get("short_s")) else f" ({format_duration(st['short_s'])})"),
              "ft-steps-short", _exact(st.get("short_s"))),
        _card("Steps discarded", _count(st.get("discarded")), "ft-steps-discarded",
              _exact(st.get("discarded"))),
        _card("Heals", f"{len(heals)} ({format_duration(heal_s)})", "ft-heals",
              _exact(heal_s)),
        _card("Recoveries", f"{len(back)} ({format_duration(out_s)} out)", "ft-recoveries",
              _exact(out_s)),
    ], className="gl-cards")


def ft_section(ft: dict[str, Any] | None, end: float | None = None,
               x_range: list[str] | None = None) -> html.Div | None:
    """The section for a torchft run's report section ``ft`` (None for any other run):
    its cards, the groups taking part over time (on the timeline's axis ``x_range``, held
    to the run's ``end``), each group's GPU-time by state and the sample bar."""
    if not ft:
        return None
    spares = ft.get("spare_groups") or 0
    note = (f"{_n(ft.get('replica_groups'), 'replica group')} of "
            f"{_n(ft.get('group_world_size'), 'rank')} ({_n(ft.get('gpus_per_group'), 'GPU')} "
            "each)" + (f", {_n(spares, 'spare')}" if spares else "")
            + f"; {_n(ft.get('quorum_changes') or 0, 'quorum change')}. A failed or evicted "
            "group leaves the others training: what it cost shows per group and in samples.")
    return html.Div([
        html.H3("Per-step fault tolerance"),
        html.P(note, className="gl-note", id="ft-note"),
        ft_cards(ft),
        dcc.Graph(figure=fig.participation_figure(ft, end, x_range),
                  id="ft-participation-graph", config={"doubleClick": "autosize"}),
        html.Div([html.Div(dcc.Graph(figure=fig.group_seconds_figure(ft),
                                     id="ft-groups-graph"), className="gl-col-wide"),
                  html.Div(dcc.Graph(figure=fig.samples_figure(ft), id="ft-samples-graph"),
                           className="gl-col-wide")], className="gl-row"),
    ], id="ft-section")
