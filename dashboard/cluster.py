"""The cluster what-if page: two scheduling policy sets side by side (issue 9)."""

from __future__ import annotations

from typing import Any

from dash import html


def cluster_layout() -> html.Div:
    """Placeholder until the cluster simulator lands."""
    return html.Div([html.H2("Cluster what-if"), html.P("not available yet", id="cluster-na")])


def register_cluster_callbacks(app: Any) -> None:
    """No callbacks yet."""
