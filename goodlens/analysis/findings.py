"""Straggler findings of a stored run: those the live collector flagged, or a batch pass.

``goodlens detect`` and the dashboard's ranks page ask the same question of a stored run;
this module answers it once: build the topology from each rank's host and the run's tags
(``switch_of_host`` or ``nodes_per_switch``), and run the detector over the step records,
or read back the ``straggler_flagged`` events the collector's live detector stored. Both also
lay the findings out the same way: :data:`FINDING_COLUMNS` and :func:`finding_cells` are the
one definition of the table's columns, their order and their text.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from goodlens.detectors.matrix import StepMatrix
from goodlens.detectors.stragglers import Finding, StragglerConfig, Topology, detect_matrix
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


def detect_run(source: RunReader, run_id: str, config: StragglerConfig | None = None
               ) -> list[Finding]:
    """Every finding the streaming detector (``config``: its defaults when None) reports over
    the stored run, each in its latest state (batch pass over each rank's time to reach the
    collective; needs the store's raw step records). The topology is where each rank ran in
    the latest attempt. Reads arrays and rows, never a frame: ``goodlens detect`` runs
    without importing pandas."""
    info = source.run_row(run_id)
    if info is None:
        raise KeyError(f"no run {run_id!r}")
    keys, values = source.ready_matrix(run_id)
    if not values.size:
        return []
    n = values.shape[1]
    topology = None
    by_rank = source.rank_host_map(run_id)
    if by_rank and all(h is not None for h in by_rank.values()) \
            and all(r in by_rank for r in range(n)):
        topology = Topology.from_run([by_rank[r] for r in range(n)], run_tags(info))
    sm = StepMatrix(np.asarray(keys["attempt"], np.int64), np.asarray(keys["step"], np.int64),
                    values, np.asarray(keys["duration_s"], float))
    return detect_matrix(sm, config, topology)


def stored_findings(source: RunReader, run_id: str) -> list[dict[str, Any]]:
    """The findings the collector's live detector stored as ``straggler_flagged`` events,
    as dicts with :class:`~goodlens.detectors.stragglers.Finding`'s fields: each finding once,
    in its latest state (the detector stores its first report, its updates and its
    resolution as events of one source), in order of first report."""
    ev = source.events(run_id, kinds=[EventKind.STRAGGLER_FLAGGED])
    latest: dict[str, tuple[int, dict[str, Any]]] = {}
    names = [f.name for f in dataclasses.fields(Finding)]
    if not len(ev):
        return []
    for src, seq, detail in zip(ev.source, ev.seq, ev.detail):
        try:
            body = json.loads(detail) if isinstance(detail, str) else None
        except ValueError:
            continue
        if not (isinstance(body, dict) and {"subject_kind", "subject_id", "slowdown"}
                <= set(body)):
            continue
        if src not in latest or int(seq) >= latest[src][0]:  # keeps first-report order
            latest[src] = (int(seq), {k: body.get(k) for k in names})
    return [row for _, row in latest.values()]


def finding_dicts(found: list[Finding]) -> list[dict[str, Any]]:
    """Findings as plain dicts (JSON-ready)."""
    return [dataclasses.asdict(f) for f in found]


#: The columns of a findings table, ``(key, header)`` in order: ``goodlens detect``'s text
#: table and the dashboard's ranks page both lay findings out with these (one definition, so
#: the two cannot drift); :func:`finding_cells` gives each column's text for one finding.
FINDING_COLUMNS: tuple[tuple[str, str], ...] = (
    ("subject", "subject"), ("relative_to", "slower than"), ("attempt", "attempt"),
    ("first_step", "from step"), ("detected_step", "detected at"),
    ("slowdown", "slower to collective"), ("job_slowdown", "job slowdown"),
    ("job_slowdown_part", "part of joint"), ("joint_job_slowdown", "joint, all open"),
    ("straggler_wait", "wait so far"), ("wait_per_hour", "wait per hour"),
    ("action", "action"), ("confidence", "confidence"), ("state", "state"))


#: The findings table's slowdowns, what each means on hover (docs/detectors.md).
SLOWDOWN_TITLES = {
    "slowdown": "{:.4f}: its excess time to reach the collective, over its siblings' "
                "(what the detector scores and --evict-at compares)",
    "job_slowdown": "{:.4f}: what it costs the job's step, over the step the job would "
                    "have without it (the other stragglers still in it)",
    "job_slowdown_part": "{:.4f}: its part of what the open findings cost together "
                         "(slowest first, each charged the drop its removal causes)",
    "joint_job_slowdown": "{:.4f}: what the open findings cost the job's step together, "
                          "over the step the job would have without any of them",
}


def finding_attempt(f: dict[str, Any]) -> int | None:
    """The attempt a finding began in, the one its ``first_step`` counts in: the first part
    of its ``id`` (``<attempt>/<kind>/<subject>/<first step>``), else its ``attempt`` field
    (which is the attempt of its latest state: a straggler still slow after a restart is
    the same finding, begun in the attempt before)."""
    head = str(f.get("id") or "").split("/", 1)[0]
    if head.isdigit():
        return int(head)
    a = f.get("attempt")
    return int(a) if a is not None and a == a else None


def finding_cells(f: dict[str, Any]) -> dict[str, str]:
    """One finding's text under each of :data:`FINDING_COLUMNS` (keyed like them). Two
    slowdowns, both as percentages: ``slowdown`` ("slower to collective", the subject's
    excess time to reach the collective over its siblings', what the detector scores) and
    ``job_slowdown`` ("job slowdown", what it costs the job's step with the other
    stragglers still in it; empty where not known, e.g. an event stored before it existed);
    then ``job_slowdown_part`` ("part of joint", its share of what the open findings cost
    together) and ``joint_job_slowdown`` ("joint, all open", that whole): both empty for a
    resolved finding, no longer one of the open ones."""
    from goodlens.model.units import format_duration

    def dur(v: Any) -> str:
        return "" if v is None or v != v else format_duration(float(v))
    a = finding_attempt(f)
    resolved = f.get("status") == "resolved"
    job = f.get("job_slowdown")
    part, joint = (None, None) if resolved else (f.get("job_slowdown_part"),
                                                 f.get("joint_job_slowdown"))
    return {"subject": f"{f['subject_kind']} {f['subject_id']}",
            "relative_to": str(f.get("relative_to") or ""),
            "attempt": "" if a is None else str(a),
            "first_step": str(f.get("first_step", "")),
            "detected_step": str(f.get("detected_step", "")),
            "slowdown": f"{100 * float(f['slowdown']):.1f}%",
            "job_slowdown": _pct(job), "job_slowdown_part": _pct(part),
            "joint_job_slowdown": _pct(joint),
            "straggler_wait": dur(f.get("straggler_wait_s")),
            "wait_per_hour": dur(f.get("wait_per_hour_s")),
            "action": str(f.get("action") or ""),
            # a resolved finding has no evidence left: its confidence reads 0, not a doubt
            "confidence": "-" if resolved else f"{float(f.get('confidence') or 0.0):.2f}",
            "state": "resolved" if resolved else "open"}


def joint_job_slowdown(found: list[dict[str, Any]]) -> float | None:
    """The run's joint job slowdown: what its open findings cost the job's step together,
    as the open finding reported last states it (every finding reported at one step carries
    the same figure); None without an open finding or where it is not known."""
    live = [f for f in found if f.get("status") != "resolved"
            and f.get("joint_job_slowdown") is not None]
    if not live:
        return None
    return float(max(live, key=lambda f: f.get("last_step") or -1)["joint_job_slowdown"])


def _pct(v: Any) -> str:
    """A ratio as a percentage with one decimal; empty where not known (None or NaN)."""
    return "" if v is None or v != v else f"{100 * float(v):.1f}%"
