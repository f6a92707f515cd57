"""What a run's job should act on: the live detector's confirmed ``evict`` findings, served
at ``GET /v1/actions?run=ID``.

Why it exists: the detector says "evict" into events, ``/metrics`` and a webhook, which a
launcher outside the job must be built to receive. A job can instead ask the collector it
already pushes to: rank 0's :class:`goodlens.exporter.elastic.EvictionClient` polls this
route and decides with its own guard rails (confidence, a cap per hour, the minimum world,
dry-run), so the collector only states findings and never decides for a job.

A finding is offered while it is open (not ``resolved``) with action ``evict``, for one
node: a host finding, or a rank finding whose host is known (a switch is not one node).
Each carries its stable ``id``, so a job decides once per finding however often it polls,
and its state as of the detector's last scored step (confidence and wait grow while the
finding lasts; see ``DetectionService._refresh``): what it costs the job with the others in
it (``job_slowdown``), its part of what the open findings cost together
(``job_slowdown_part``) and that whole (``joint_job_slowdown``, the same on each), so a job
that evicts by cost sees two overlapping stragglers' cost, not two zeros.

The run's restore in progress is served beside them (:mod:`goodlens.collector.restores`):
``slow_restore`` (ranks reading far slower than the median rank: leave them be) and
``stuck_restore`` (ranks whose read stopped for the hang timeout), and each evict finding
says ``restoring`` when one of its ranks (or its host) is in a restore that still moves,
which :class:`goodlens.exporter.elastic.EvictionClient` refuses to act on.

So is a restart loop going on (``restart_loop``, :mod:`goodlens.analysis.loops`): the run's
attempts fail without committing a step; its pattern (the same rank or host failing, the
same checkpoint restored) and advice (drain the host, restore the previous durable
checkpoint), for whatever restarts the job to act on.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from goodlens.analysis.loops import run_restart_loop
from goodlens.collector.serving import json_response
from goodlens.detectors.restore import SLOW, STUCK
from goodlens.model.jsonable import plain

__all__ = ["actions_route", "evictions"]


def evictions(detection: Any, run_id: str) -> list[dict[str, Any]]:
    """The open ``evict`` findings of ``run_id`` for one node each, oldest first (none
    without a detection service)."""
    if detection is None:
        return []
    out = []
    watch = getattr(detection, "restores", None)
    busy, busy_hosts = watch.restoring(run_id) if watch is not None else (set(), set())
    for f in detection.flagged().get(run_id, []):
        if f.action != "evict" or f.status == "resolved":
            continue
        if f.subject_kind == "host":
            host = str(f.subject_id)
        elif f.subject_kind == "rank" and f.host:
            host = str(f.host)
        else:
            continue
        out.append({"id": f.id, "subject_kind": f.subject_kind, "subject_id": f.subject_id,
                    "host": host, "ranks": [int(r) for r in f.ranks], "action": f.action,
                    "confidence": float(f.confidence), "slowdown": float(f.slowdown),
                    "job_slowdown": _ratio(f.job_slowdown),
                    "job_slowdown_ready": _ratio(f.job_slowdown_ready),
                    "job_slowdown_seen": _ratio(f.job_slowdown_seen),
                    "job_slowdown_part": _ratio(f.job_slowdown_part),
                    "joint_job_slowdown": _ratio(f.joint_job_slowdown),
                    "straggler_wait_s": float(f.straggler_wait_s),
                    "first_step": int(f.first_step), "detected_step": int(f.detected_step),
                    "last_step": int(f.last_step), "attempt": f.attempt,
                    "status": f.status,
                    "restoring": bool(busy & {int(r) for r in f.ranks}
                                      or host in busy_hosts)})
    return sorted(out, key=lambda x: (x["detected_step"], x["id"]))


def restart_loop(api: Any, run_id: str) -> dict[str, Any] | None:
    """The run's restart loop while it goes on (:mod:`goodlens.analysis.loops`): its
    attempts, pattern and advice; None when none goes on, or the run is unknown."""
    store = getattr(api, "store", None)
    if store is None:
        return None
    loop = run_restart_loop(store, run_id)
    return plain(loop) if loop is not None and loop["ongoing"] else None


def _ratio(v: float | None) -> float | None:
    return None if v is None else float(v)


def actions_route(api: Any) -> Route:
    """``GET /v1/actions?run=ID`` over a :class:`~goodlens.collector.server.CollectorApi`
    (its token check and its detection service): ``{"run", "detection", "evict": [...],
    "slow_restore": [...], "stuck_restore": [...], "restart_loop": {...} or null}``."""
    async def actions(request: Request) -> Response:
        if (err := api.auth_error(request)) is not None:
            return err
        run_id = request.query_params.get("run")
        if not run_id:
            return json_response({"error": "name the run: /v1/actions?run=ID", "field": "run"}, 422)
        detection = getattr(api, "detection", None)
        watch = getattr(detection, "restores", None)
        loop = await run_in_threadpool(restart_loop, api, run_id)
        return json_response({"run": run_id, "detection": detection is not None,
                      "evict": evictions(detection, run_id),
                      **{kind: watch.findings(run_id, kind) if watch is not None else []
                         for kind in (SLOW, STUCK)},
                      "restart_loop": loop})

    return Route("/v1/actions", actions, methods=["GET"])
