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
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from goodlens.collector.serving import json_response

__all__ = ["actions_route", "evictions"]


def evictions(detection: Any, run_id: str) -> list[dict[str, Any]]:
    """The open ``evict`` findings of ``run_id`` for one node each, oldest first (none
    without a detection service)."""
    if detection is None:
        return []
    out = []
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
                    "job_slowdown_part": _ratio(f.job_slowdown_part),
                    "joint_job_slowdown": _ratio(f.joint_job_slowdown),
                    "straggler_wait_s": float(f.straggler_wait_s),
                    "first_step": int(f.first_step), "detected_step": int(f.detected_step),
                    "last_step": int(f.last_step), "attempt": f.attempt,
                    "status": f.status})
    return sorted(out, key=lambda x: (x["detected_step"], x["id"]))


def _ratio(v: float | None) -> float | None:
    return None if v is None else float(v)


def actions_route(api: Any) -> Route:
    """``GET /v1/actions?run=ID`` over a :class:`~goodlens.collector.server.CollectorApi`
    (its token check and its detection service): ``{"run", "detection", "evict": [...]}``."""
    async def actions(request: Request) -> Response:
        if (err := api.auth_error(request)) is not None:
            return err
        run_id = request.query_params.get("run")
        if not run_id:
            return json_response({"error": "name the run: /v1/actions?run=ID", "field": "run"}, 422)
        detection = getattr(api, "detection", None)
        return json_response({"run": run_id, "detection": detection is not None,
                      "evict": evictions(detection, run_id)})

    return Route("/v1/actions", actions, methods=["GET"])
