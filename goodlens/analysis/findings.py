"""Straggler findings of a stored run: those the live collector flagged, or a batch pass.

``goodlens detect`` and the dashboard's ranks page ask the same question of a stored run;
this module answers it once: build the topology from each rank's host in each attempt
(:func:`attempt_rank_hosts`) and the run's tags (``switch_of_host`` or
``nodes_per_switch``), and run the detector over the step records, one detector per world
(a rank moved to another host starts a new one), or read back the ``straggler_flagged``
events the collector's live detector stored. Both also
lay the findings out the same way: :data:`FINDING_COLUMNS` and :func:`finding_cells` are the
one definition of the table's columns, their order and their text.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from goodlens.detectors.matrix import StepMatrix
from goodlens.detectors.stragglers import Finding, StragglerConfig, Topology, detect_matrix
from goodlens.detectors.topology import new_world
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


def attempt_rank_hosts(source: RunReader, run_id: str,
                       attempts: Iterable[int] | None = None
                       ) -> dict[int, dict[int, str | None]]:
    """Where each rank ran, per attempt: ``{attempt: {rank: host}}`` (None: the rank
    reported no host), as the ranks reported it at the attempt's first summarised step.
    A launcher places ranks when an attempt starts, so this is where each rank ran at every
    step of that attempt; across attempts a rank can move (an elastic restart gives a failed
    or evicted host's ranks to a spare). Anything that names the host of a finding, or of a
    step, reads it here for the attempt in question, never from the run's latest attempt.
    ``attempts``: those to read (default: every attempt of the run); an attempt without
    step records is left out."""
    if attempts is None:
        attempts = [int(a) for a in source.attempts(run_id).attempt]
    out = {}
    for a in sorted({int(a) for a in attempts}):
        hosts = source.rank_host_map(run_id, a)
        if hosts:
            out[a] = hosts
    return out


def finding_hosts(f: Mapping[str, Any], by_attempt: Mapping[int, Mapping[int, str | None]]
                  ) -> list[str]:
    """The hosts a finding's ranks ran on over the attempts it covers (from the one it began
    in to the one of its latest state), sorted by name; ``by_attempt`` is
    :func:`attempt_rank_hosts`'s answer. One host for a rank or host finding (a finding
    never spans two placements of its ranks: see :func:`end_world`), those of its ranks
    for a switch's; empty where no host is known."""
    first, last = finding_attempt(f), f.get("attempt")
    last = first if last is None or last != last else int(last)
    if first is None:
        return []
    ranks = [int(r) for r in f.get("ranks") or []]
    return sorted({h for a in range(first, last + 1) for r in ranks
                   if (h := by_attempt.get(a, {}).get(r)) is not None})


def finding_host(f: Mapping[str, Any]) -> str | None:
    """The one host a finding names: a host finding's subject, a rank finding's host
    (where it ran in the finding's attempts); None for a switch, or where not known."""
    if f.get("subject_kind") == "host":
        return str(f["subject_id"])
    if f.get("subject_kind") == "rank" and f.get("host") is not None:
        return str(f["host"])
    return None


def end_world(found: Iterable[Finding]) -> list[Finding]:
    """The findings of a world that ended (its ranks moved to other hosts, or more ranks
    joined: :func:`~goodlens.detectors.topology.new_world`), each one still open resolved
    in its state at the world's last step. A subject's finding never follows its ranks to
    another host: a spare that takes a slow host's ranks is another machine, and a rank
    still slow there is a new finding that names the new host. The live detector and a
    batch pass both end a world so, and so report the same findings."""
    return [f if f.status == "resolved" else dataclasses.replace(f, status="resolved")
            for f in found]


def detect_run(source: RunReader, run_id: str, config: StragglerConfig | None = None
               ) -> list[Finding]:
    """Every finding the streaming detector (``config``: its defaults when None) reports over
    the stored run, each in its latest state (batch pass over each rank's time to reach the
    collective; needs the store's raw step records). The topology is where each rank ran in
    each attempt (:func:`attempt_rank_hosts`): consecutive attempts in one world share a
    detector, and a new world (:func:`~goodlens.detectors.topology.new_world`) starts a new
    one, the old world's open findings resolved at its end (:func:`end_world`), as the
    collector's live detector does. Reads arrays and rows, never a frame: ``goodlens
    detect`` runs without importing pandas."""
    info = source.run_row(run_id)
    if info is None:
        raise KeyError(f"no run {run_id!r}")
    keys, values = source.ready_matrix(run_id)
    if not values.size:
        return []
    att = np.asarray(keys["attempt"], np.int64)
    steps = np.asarray(keys["step"], np.int64)
    dur = np.asarray(keys["duration_s"], float)
    start = np.asarray(keys["start_s"], float) if "start_s" in keys else np.full(len(dur), np.nan)
    worlds = _worlds(att, values, attempt_rank_hosts(source, run_id, np.unique(att).tolist()),
                     run_tags(info))
    found: list[Finding] = []
    for k, (rows, n, topology) in enumerate(worlds):
        sm = StepMatrix(att[rows], steps[rows], values[rows, :n], dur[rows], start[rows])
        got = detect_matrix(sm, config, topology)
        found += got if k == len(worlds) - 1 else end_world(got)
    return found


def _worlds(att: np.ndarray, values: np.ndarray, by_attempt: dict[int, dict[int, str | None]],
            tags: dict[str, Any]) -> list[tuple[slice | np.ndarray, int, Topology | None]]:
    """The matrix's rows (in attempt order) cut into worlds: ``(rows, ranks, topology)``, a
    world's ranks and topology those of its first attempt. An attempt with no time to reach
    the collective is left out, as the live detector leaves it."""
    bounds = [0, *(np.flatnonzero(np.diff(att)) + 1).tolist(), len(att)]
    out: list[tuple[list[tuple[int, int]], int, Topology | None]] = []
    for lo, hi in itertools.pairwise(bounds):
        seen = np.flatnonzero(~np.isnan(values[lo:hi]).all(axis=0))
        if not len(seen):
            continue
        hosts = by_attempt.get(int(att[lo]), {})
        n = max(int(seen.max()), max(hosts, default=-1)) + 1
        topo = None
        if all(hosts.get(r) is not None for r in range(n)):
            topo = Topology.from_run([str(hosts[r]) for r in range(n)], tags)
        if out and not new_world(out[-1][2], out[-1][1], topo, n):
            out[-1][0].append((lo, hi))
        else:
            out.append(([(lo, hi)], n, topo))
    return [(_rows(spans), n, topo) for spans, n, topo in out]


def _rows(spans: list[tuple[int, int]]) -> slice | np.ndarray:
    """Row spans as one index: a slice where they follow each other (no copy)."""
    if all(a[1] == b[0] for a, b in itertools.pairwise(spans)):
        return slice(spans[0][0], spans[-1][1])
    return np.concatenate([np.arange(lo, hi) for lo, hi in spans])


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
    ("subject", "subject"), ("host", "host"), ("relative_to", "slower than"),
    ("attempt", "attempt"),
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
    """One finding's text under each of :data:`FINDING_COLUMNS` (keyed like them): the
    host it names (:func:`finding_host`: where its ranks ran in its attempts; empty for a
    switch), then two
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
            "host": finding_host(f) or "",
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
