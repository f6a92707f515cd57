"""The rows of a cluster comparison: which figures, under which names, in which order.

Why it exists: ``goodlens simulate cluster --compare`` and the dashboard's cluster what-if
page show the same side-by-side table; one definition of its rows (the key in
``ClusterResult.cluster``, the label, the kind of number) and of how each value and each
``B - A`` difference is written keeps the two from drifting (job goodput was missing from
the page while the command printed it). Pure formatting over plain dicts.
"""

from __future__ import annotations

from typing import Any

from goodlens.model.units import format_duration

#: ``(key in ClusterResult.cluster, label, kind)``; kind is ``share`` (a fraction, shown in
#: %, differences in percentage points), ``seconds``, ``node_s`` (node-seconds shown as
#: node-hours) or ``count``.
CLUSTER_ROWS: tuple[tuple[str, str, str], ...] = (
    ("utilisation", "utilisation (allocated)", "share"),
    ("goodput_weighted_utilisation", "goodput-weighted utilisation", "share"),
    ("useful_utilisation", "useful utilisation (no topology slowdown)", "share"),
    ("goodput", "job goodput (productive / job wall-clock)", "share"),
    ("jobs_done", "jobs done", "count"),
    ("jobs_waiting", "jobs still waiting", "count"),
    ("mean_wait_s", "mean wait to first start", "seconds"),
    ("p95_wait_s", "p95 wait to first start", "seconds"),
    ("longest_starvation_s", "longest starvation", "seconds"),
    ("mean_turnaround_s", "mean turnaround (done jobs)", "seconds"),
    ("mean_topology_penalty", "mean topology penalty (step time)", "share"),
    ("preemptions", "preemptions", "count"),
    ("preemption_loss_node_s", "preemption loss (node-hours)", "node_s"),
    ("held_idle_node_s", "partial holds idle (node-hours)", "node_s"),
    ("failures", "node failures", "count"),
    ("spare_swaps", "spare swaps", "count"),
)


def format_value(v: float | None, kind: str) -> str:
    """One value as the table writes it (``-`` when missing)."""
    if v is None:
        return "-"
    if kind == "share":
        return f"{100 * v:.1f}%"
    if kind == "seconds":
        return format_duration(v)
    if kind == "node_s":
        return f"{v / 3600:,.0f}"
    return f"{v:,.0f}"


def format_delta(a: float | None, b: float | None, kind: str) -> str:
    """``B - A`` as the table writes it: signed, ``0`` when equal at the shown precision,
    shares in percentage points (``+12.3 pt``)."""
    if a is None or b is None:
        return "-"
    d = b - a
    if abs(d) < 1e-12 or (kind == "share" and abs(100 * d) < 0.05) or (
            kind == "node_s" and abs(d) < 1800):
        return "0"
    sign = "+" if d > 0 else "-"
    if kind == "share":
        return f"{sign}{100 * abs(d):.1f} pt"
    if kind == "seconds":
        return sign + format_duration(abs(d))
    return sign + format_value(abs(d), kind)


def cluster_rows(a: dict[str, Any], b: dict[str, Any] | None = None) -> list[dict[str, str]]:
    """The table's rows for one result's ``cluster`` dict (``a``) or two: ``{"key", "label",
    "a", "b", "delta"}`` (``b`` and ``delta`` only with two), in :data:`CLUSTER_ROWS` order."""
    rows = []
    for key, label, kind in CLUSTER_ROWS:
        va = a.get(key)
        row = {"key": key, "label": label, "a": format_value(va, kind)}
        if b is not None:
            vb = b.get(key)
            row["b"] = format_value(vb, kind)
            row["delta"] = format_delta(va, vb, kind)
        rows.append(row)
    return rows
