"""Straggler findings of a stored run: those the live collector flagged, or a batch pass.

``goodlens detect`` and the dashboard's ranks page ask the same question of a stored run;
this module answers it once: build the topology from each rank's host and the run's tags
(``switch_of_host`` or ``nodes_per_switch``), and run the detector over the step records,
or read back the ``straggler_flagged`` events the collector's live detector stored.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from goodlens.detectors.stragglers import Finding, Topology, detect_stragglers
from goodlens.model.schema import EventKind
from goodlens.storage.reader import RunReader


def run_tags(info: dict[str, Any] | None) -> dict[str, Any]:
    """A run's tags as a dict (they are stored as JSON text; bad JSON reads as none)."""
    tags = (info or {}).get("tags")
    if isinstance(tags, dict):
        return tags
    try:
        out = json.loads(tags) if isinstance(tags, str) else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def detect_run(source: RunReader, run_id: str) -> list[Finding]:
    """Every finding the streaming detector reports over the stored run (batch pass over
    ``source.steps``; needs the store's raw step records)."""
    info = source.run(run_id)
    if info is None:
        raise KeyError(f"no run {run_id!r}")
    steps = source.steps(run_id)
    if not len(steps):
        return []
    topology = None
    if steps.host.notna().all():
        hosts = steps.groupby("rank").host.first()
        full = [hosts.get(r, f"rank-{r}") for r in range(int(steps["rank"].max()) + 1)]
        topology = Topology.from_run(full, run_tags(info))
    return detect_stragglers(steps, topology=topology)


def stored_findings(source: RunReader, run_id: str) -> list[dict[str, Any]]:
    """The findings the collector's live detector stored as ``straggler_flagged`` events,
    as dicts with :class:`~goodlens.detectors.stragglers.Finding`'s fields (in detection order)."""
    ev = source.events(run_id, kinds=[EventKind.STRAGGLER_FLAGGED])
    out = []
    names = {f.name for f in dataclasses.fields(Finding)}
    for detail in ev.detail.dropna() if len(ev) else []:
        try:
            body = json.loads(detail)
        except ValueError:
            continue
        if isinstance(body, dict) and {"subject_kind", "subject_id", "slowdown"} <= set(body):
            out.append({k: body.get(k) for k in names})
    return out


def finding_dicts(found: list[Finding]) -> list[dict[str, Any]]:
    """Findings as plain dicts (JSON-ready)."""
    return [dataclasses.asdict(f) for f in found]
