"""The per-step fault tolerance part of ``goodlens report`` (a torchft run): what the job
committed against its full world, each replica group's GPU-time, and each recovery."""

from __future__ import annotations

from typing import Any

from goodlens.cli.common import table
from goodlens.model.units import format_duration

#: The group states as columns, in the order docs/accounting.md lists them.
_STATES = (("progress", "progress"), ("quorum", "quorum"), ("recompute", "recompute"),
           ("startup", "startup"), ("detection", "detect"), ("restart", "restart"),
           ("init", "init"), ("heal", "heal"), ("admission", "admit"),
           ("spare_idle", "spare idle"), ("other", "other"))


def _n(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def ft_text(ft: dict[str, Any]) -> str:
    """The human form of a report's ``fault_tolerance`` section."""
    st, sm = ft["steps"], ft["samples"]
    gpu = ft["gpu_seconds"]
    spares = ft.get("spare_groups") or 0
    lines = ["", f"per-step fault tolerance (torchft): {ft['replica_groups']} replica groups"
             + (f" and {spares} spare" if spares else "")
             + f", {ft['group_world_size']} rank(s) each",
             f"  steps: {st['committed']} committed, {st['short']} short of the full world "
             f"({format_duration(st['short_s'])}), {st['discarded']} discarded",
             f"  samples: {_n(sm['committed'])} committed of {_n(sm['full_world'])} the full "
             f"world would have"
             + (f" ({100 * sm['goodput']:.1f}%)" if sm.get("goodput") is not None else "")
             + f"; {_n(sm['missing_groups'])} never trained (groups out of the quorum), "
             f"{_n(sm['discarded'])} trained and discarded"]
    if gpu["allocated"] > 0:
        lines.append(f"  GPU-time: {100 * gpu['progress'] / gpu['allocated']:.1f}% progress "
                     f"of {format_duration(gpu['allocated'])} allocated GPU-seconds")
    used = [(k, h) for k, h in _STATES if any(g["seconds"].get(k) for g in ft["groups"])]
    rows = []
    for g in ft["groups"]:
        tags = [t for t, on in (("spare", g["spare"]), ("evicted", g["evicted"])) if on]
        row = {"g": g["group"] + (f" ({', '.join(tags)})" if tags else ""),
               "a": g["attempts"]}
        row.update({k: format_duration(g["seconds"].get(k, 0.0)) for k, _ in used})
        rows.append(row)
    if rows:
        lines.append("")
        lines.append(table(rows, [("g", "group"), ("a", "attempts"), *used]))
    for r in ft.get("recoveries") or []:
        parts = [("in flight + detection", r.get("last_step_end"), r.get("detected")),
                 ("restart", r.get("detected"), r.get("restarted")),
                 ("init", r.get("restarted"), r.get("heal_start")),
                 ("heal", r.get("heal_start"), r.get("heal_end")),
                 ("admission", r.get("heal_end"), r.get("rejoined"))]
        known = [f"{k} {format_duration(b - a)}" for k, a, b in parts
                 if a is not None and b is not None]
        out = "not back" if r.get("out_s") is None else format_duration(r["out_s"])
        lines.append(f"  {r['group']} attempt {r['attempt']}: out {out} "
                     f"({', '.join(known)})")
    return "\n".join(lines)
