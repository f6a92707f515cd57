"""A stored run's tables as Arrow IPC, served at ``GET /v1/tables/{name}?run=ID``.

Why it exists: while a collector runs it holds its DuckDB file and no other process may
open it, so the offline commands that need a run's rows (``goodlens detect``, ``goodlens
plan --run``, ``goodlens export``) could not read a run the collector holds. This route
hands them the rows as the store reads them (:meth:`~goodlens.storage.reader.RunReader.table`,
the same read ``export`` makes): with ``--url`` they fetch a run's tables and compute
exactly as over the file. Arrow IPC keeps the types and costs no per-value conversion.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from goodlens.collector.serving import json_response
from goodlens.model.wire import ARROW

__all__ = ["TABLES", "table_bytes", "tables_route"]

#: The tables a client may ask for: a trace's (docs/trace-format.md).
TABLES = ("runs", "steps", "events", "attempts")


def table_bytes(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as out:
        out.write_table(table)
    return sink.getvalue().to_pybytes()


def tables_route(api: Any) -> Route:
    """``GET /v1/tables/{name}?run=ID`` over a :class:`~goodlens.collector.server.CollectorApi`
    (its token check and its store): one table of one run as an Arrow IPC stream; 404 for
    an unknown run or table, 422 without ``run``."""
    def _error(text: str, field: str, status: int) -> Response:
        return json_response({"error": text, "field": field}, status)

    async def table(request: Request) -> Response:
        if (err := api.auth_error(request)) is not None:
            return err
        name = request.path_params["name"]
        run_id = request.query_params.get("run")
        if name not in TABLES:
            return _error(f"no table {name!r}; ask for one of {', '.join(TABLES)}", "name",
                          404)
        if not run_id:
            return _error("give the run: ?run=ID (list runs at /v1/runs)", "run", 422)

        def read() -> bytes | None:
            if api.store.run(run_id) is None:
                return None
            return table_bytes(api.store.table(name, run_id))
        body = await run_in_threadpool(read)
        if body is None:
            return _error(f"no run {run_id!r}; list runs at /v1/runs", "run", 404)
        return Response(body, media_type=ARROW)

    return Route("/v1/tables/{name}", table, methods=["GET"])
