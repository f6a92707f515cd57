"""The collector's HTTP API as an OpenAPI 3.0 document, served at ``GET /openapi.json``.

Why a module of its own: the document is data, built once from the model's column
specifications (:mod:`goodlens.model.schema`), so a column added there is published here
with its type, bounds and meaning; the answers are the ones ``server.py`` gives. The
reference page docs/http-api.md is generated from it (``python -m goodlens.cli.docs``), and
tests/e2e/test_server_hardening.py fuzzes a running collector against it with Schemathesis:
no answer may be a 5xx or stray from this document.
"""

from __future__ import annotations

from typing import Any

from goodlens.model.batch import MAX_RUN_ID
from goodlens.model.schema import (
    EVENT_COLUMNS,
    EVENT_KINDS,
    RUN_COLUMNS,
    SCHEMA_VERSION,
    STEP_COLUMNS,
    Column,
)
from goodlens.model.wire import ARROW, JSON

_TYPES = {"int": "integer", "float": "number", "str": "string"}
_ERROR = {"$ref": "#/components/schemas/Error"}


def _scalar(col: Column, nullable: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"type": _TYPES[col.kind]}
    if col.nonnegative:
        out["minimum"] = 0
    if col.maximum is not None:
        out["maximum"] = col.maximum
    if col.name == "kind":
        out["enum"] = sorted(EVENT_KINDS)
    if nullable:
        out["nullable"] = True
    return out


def _table(columns: tuple[Column, ...], what: str) -> dict[str, Any]:
    """A columnar table: each column a list (nulls allowed in optional ones) or a scalar
    broadcast to every row."""
    props = {}
    for col in columns:
        item = _scalar(col, nullable=not col.required)
        props[col.name] = {"description": f"{col.doc}{f' ({col.unit})' if col.unit else ''}",
                           "oneOf": [_scalar(col), {"type": "array", "items": item}]}
    return {"type": "object", "description": f"{what}: lists of one length, or scalars "
            "applying to every row", "additionalProperties": False, "properties": props,
            "required": [c.name for c in columns if c.required]}


def _run() -> dict[str, Any]:
    props: dict[str, Any] = {c.name: _scalar(c, nullable=True) for c in RUN_COLUMNS}
    props["tags"] = {"description": "free-form tags: a JSON object, or its text",
                     "nullable": True, "oneOf": [{"type": "string"}, {"type": "object"}]}
    return {"type": "object", "additionalProperties": False, "properties": props}


def _batch() -> dict[str, Any]:
    return {
        "type": "object", "additionalProperties": False,
        "required": ["schema_version", "run_id"],
        "properties": {
            "schema_version": {"type": "integer", "enum": [SCHEMA_VERSION]},
            "run_id": {"type": "string", "minLength": 1, "maxLength": MAX_RUN_ID},
            "run": {**_run(), "nullable": True},
            "steps": {**_table(STEP_COLUMNS, "per-rank step records"), "nullable": True},
            "events": {**_table(EVENT_COLUMNS, "events"), "nullable": True},
            "exporter": {"type": "object", "nullable": True, "additionalProperties": False,
                         "properties": {"source": {"type": "string"},
                                        **{k: {"type": "integer"} for k in (
                                            "dropped_rows", "spilled_batches",
                                            "rejected_batches")}}},
        }}


def _answer(description: str, schema: Any = _ERROR, headers: dict | None = None) -> dict:
    out: dict[str, Any] = {"description": description,
                           "content": {"application/json": {"schema": schema}}}
    if headers:
        out["headers"] = headers
    return out


_RETRY = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}
_GUARDED = {
    "400": _answer("malformed request (a token-less collector: no Host header)"),
    "401": _answer("token missing (a collector started with a token)"),
    "403": _answer("wrong token"),
    "421": _answer("a token-less collector answers only to loopback Host names"),
}


def _ingest() -> dict[str, Any]:
    counts = {k: {"type": "integer", "minimum": 0} for k in (
        "steps_inserted", "steps_duplicate", "events_inserted", "events_duplicate")}
    return {"post": {
        "summary": "Push one wire batch (all or nothing; answered after the commit)",
        "security": [{}, {"bearer": []}],
        "requestBody": {"required": True, "content": {
            JSON: {"schema": {"$ref": "#/components/schemas/Batch"}},
            ARROW: {"schema": {"type": "string", "format": "binary",
                               "description": "an Arrow IPC stream of step rows; the rest of "
                               "the batch as JSON in the schema metadata key 'goodlens'"}}}},
        "responses": {
            "200": _answer("committed", {"type": "object", "required": ["ok", *counts],
                                         "properties": {"ok": {"type": "boolean"}, **counts}}),
            **_GUARDED,
            "400": _answer("not JSON / not an Arrow stream, not an object, or no Host"),
            "408": _answer("the body did not arrive within the collector's body timeout"),
            "413": _answer("larger than the collector's --max-body"),
            "415": _answer("content type other than JSON or Arrow IPC stream"),
            "422": _answer("a field missing, of the wrong type or out of range"),
            "429": _answer("too many requests: retry after Retry-After", headers=_RETRY),
            "503": _answer("write queue full: retry after Retry-After", headers=_RETRY),
        }}}


def _get(summary: str, schema: dict, params: list | None = None, extra: dict | None = None,
         secured: bool = True) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {
        "200": _answer("ok", schema), **(_GUARDED if secured else
                                        {"421": _GUARDED["421"], "400": _GUARDED["400"]}),
        **(extra or {})}}
    if secured:
        op["security"] = [{}, {"bearer": []}]
    if params:
        op["parameters"] = params
    return {"get": op}


def _query(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": {"type": "string"}}


def _tables() -> dict[str, Any]:
    """``GET /v1/tables/{name}?run=ID``: one table of a run as an Arrow IPC stream."""
    op = _get("One table of a run as an Arrow IPC stream (what --url of goodlens detect, "
              "plan and export read)", {}, [
                  {"name": "name", "in": "path", "required": True,
                   "schema": {"type": "string", "enum": ["runs", "steps", "events",
                                                         "attempts"]}},
                  {**_query("run", "run id"), "required": True}],
              {"404": _answer("no such run or table"), "422": _answer("no run given")})
    op["get"]["responses"]["200"] = {"description": "the table (columns of docs/data-model.md)",
                                     "content": {ARROW: {"schema": {"type": "string",
                                                                    "format": "binary"}}}}
    return op


def _sync() -> dict[str, Any]:
    """``POST /v1/sync?detect=``: what a script calls after a job ends instead of waiting."""
    ok = {"type": "object", "required": ["ok"],
          "properties": {"ok": {"type": "boolean"},
                         "findings": {"type": "integer", "minimum": 0}}}
    return {"post": {
        "summary": "Returns once everything received is committed and summarised; with "
                   "detect=1, after a detection pass over the new steps too (its findings "
                   "stored and pushed before the answer)",
        "security": [{}, {"bearer": []}],
        "parameters": [{"name": "detect", "in": "query", "required": False,
                        "description": "1: a detection pass too (default 0)",
                        "schema": {"type": "string", "enum": ["0", "1"]}}],
        "responses": {
            "200": _answer("committed (findings: the new ones of the pass, with detect=1)",
                           ok),
            **_GUARDED,
            "409": _answer("detect=1 on a collector started with --no-detect"),
            "422": _answer("detect other than 0 or 1"),
            "504": _answer("the collector is behind: try again"),
        }}}


def openapi_document(version: str) -> dict[str, Any]:
    """The OpenAPI 3.0 document of the collector's own endpoints."""
    obj = {"type": "object"}
    runs = {"type": "object", "required": ["runs", "total", "offset", "limit"],
            "properties": {"runs": {"type": "array", "items": obj},
                           "total": {"type": "integer"}, "offset": {"type": "integer"},
                           "limit": {"type": "integer"}, "sort": {"type": "string"},
                           "order": {"type": "string"},
                           "next_offset": {"type": "integer", "nullable": True}}}
    runs_params = [
        {**_query("limit", "runs per page, 0-10000 (default 1000)"),
         "schema": {"type": "string"}},
        _query("offset", "runs skipped (default 0)"),
        _query("sort", "start, goodput, duration, state, name, run, steps or last_activity "
                       "(default start)"),
        _query("order", "asc or desc (default desc)"),
        _query("state", "only runs in this state (running, completed, failed, ...)"),
        _query("q", "only runs whose id or name contains this text (any case)")]
    report_params = [_query("run", "run id (default: the most recently started run)"),
                     _query("since", "window start: epoch s, ISO time, +2h, -30m"),
                     _query("until", "window end, same forms"),
                     _query("exclude", "comma-separated labels or parts taken out"),
                     _query("as_of", "report the run as known at this instant"),
                     _query("fresh", "1: compute the report now (default: an ended run's "
                                     "stored report, a live run's kept one if recent; "
                                     "computed_at says when)")]
    text = {"description": "Prometheus text exposition",
            "content": {"text/plain": {"schema": {"type": "string"}}}}
    health = {"type": "object", "required": ["status", "version", "schema_version"],
              "properties": {"status": {"type": "string"}, "version": {"type": "string"},
                             "schema_version": {"type": "integer"},
                             "queue_rows": {"type": "integer"},
                             "store_warnings": {"type": "integer"},
                             "uptime_s": {"type": "number"}}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "goodlens collector", "version": version,
                 "description": "Ingest and read API of `goodlens serve` (docs/ingest-api.md)."},
        "paths": {
            "/v1/ingest": _ingest(),
            "/v1/runs": _get("A page of the runs list, sorted and filtered (as goodlens "
                             "runs --json)", runs, runs_params,
                             {"422": _answer("a paging, sort or filter parameter is wrong")}),
            "/v1/runs/{run_id}": _get(
                "One run and its attempts", {"type": "object", "required": ["run", "attempts"],
                                             "properties": {"run": obj, "attempts": {
                                                 "type": "array", "items": obj}}},
                [{"name": "run_id", "in": "path", "required": True,
                  "schema": {"type": "string", "minLength": 1}}],
                {"404": _answer("no such run")}),
            "/v1/report": _get("Where the wall-clock went (as goodlens report --json)", obj,
                               report_params, {"404": _answer("no such run"),
                                               "422": _answer("since/until/as_of unreadable")}),
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {
                "200": text, "421": _GUARDED["421"], "400": _GUARDED["400"]}}},
            "/v1/tables/{name}": _tables(),
            "/v1/actions": _get(
                "A run's open evict findings, one node each (what a job's eviction client "
                "polls; it decides with its own guard rails), the slow and stuck ranks "
                "of its restore in progress, and its restart loop going on (null: none)",
                {"type": "object", "required": ["run", "detection", "evict"],
                 "properties": {"run": {"type": "string"}, "detection": {"type": "boolean"},
                                "evict": {"type": "array", "items": obj},
                                "slow_restore": {"type": "array", "items": obj},
                                "stuck_restore": {"type": "array", "items": obj},
                                "restart_loop": {"type": "object", "nullable": True}}},
                [{**_query("run", "run id"), "required": True}],
                {"422": _answer("no run given")}),
            "/v1/sync": _sync(),
            "/healthz": _get("Liveness: status, version, queue depth", health, secured=False),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"],
                          "properties": {"error": {"type": "string"},
                                         "field": {"type": "string", "nullable": True}}},
                "Batch": _batch()}},
    }
