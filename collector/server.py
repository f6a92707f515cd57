"""The collector service: one process that owns the store, serving ingest, /metrics and health.

Starlette on uvicorn (maintained, async, fast). Request handling never touches DuckDB's
write side: it validates a push (in a worker thread), hands it to the single
:class:`~goodlens.storage.writer.Writer`, and answers only after the writer committed it, so an
acknowledged batch survives a crash. Reads (``/metrics``, ``/v1/runs``) use the store's
read API in worker threads with their own cursors.

Endpoints:

- ``POST /v1/ingest``: one wire batch, JSON (:mod:`goodlens.model.batch`) or Arrow IPC
  (:mod:`goodlens.model.batch_arrow`); 200 with the rows
  inserted and recognised as duplicates; 400/413/415/422 naming what is wrong; 401/403 for
  a missing or wrong token; 503 with ``Retry-After`` when the write queue is full.
- ``GET /metrics``: Prometheus text format.
- ``GET /healthz``: liveness, version, queue depth and how many runs keep earlier step
  figures because rows they counted are gone (nothing about where the store is).
- ``GET /openapi.json``: this API as an OpenAPI document (:mod:`goodlens.collector.openapi`).
- ``GET /v1/runs``, ``GET /v1/runs/{run_id}``: the runs overview as JSON.
- ``GET /v1/report?run=ID&since=T&until=T``: the time accounting (as ``goodlens report``).
- ``GET /v1/tables/{name}?run=ID``: one table of a run as Arrow IPC (``--url`` of
  ``detect``, ``plan``, ``export``; :mod:`goodlens.collector.tables`).
- ``/`` and everything else: whatever ASGI app the caller mounts there (``goodlens serve``
  mounts the dashboard; the collector itself never imports it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from goodlens import __version__
from goodlens.analysis.report import report_dict
from goodlens.collector.actions import actions_route
from goodlens.collector.metrics import make_registry
from goodlens.collector.nodes import NodeCache
from goodlens.collector.openapi import openapi_document
from goodlens.collector.reports import KeeperConfig, ReportKeeper
from goodlens.collector.serving import (
    Limits,
    RequestGuard,
    json_response,
    serve_until_exit,
    uvicorn_config,
)
from goodlens.collector.tables import tables_route
from goodlens.exporter.transport import is_loopback
from goodlens.model.batch import BatchError
from goodlens.model.batch import Limits as PushLimits
from goodlens.model.batch_arrow import DECODERS
from goodlens.model.jsonable import plain, records
from goodlens.model.schema import SCHEMA_VERSION
from goodlens.storage.parquet import open_store
from goodlens.storage.reports import SORT_KEYS
from goodlens.storage.store import Store
from goodlens.storage.writer import Overloaded, Writer

if TYPE_CHECKING:
    from goodlens.detectors.stragglers import StragglerConfig

log = logging.getLogger("goodlens.server")


@dataclass
class ServerConfig:
    """How the collector listens and what it accepts."""

    db: str
    """Path of the DuckDB file the collector owns (created if missing), or ``parquet:DIR``
    for a Parquet dataset several collectors may share (:mod:`goodlens.storage.parquet`)."""
    host: str = "127.0.0.1"
    """Address to bind; anything but loopback requires ``token``."""
    port: int = 8470
    """TCP port (0 picks a free one)."""
    token: str | None = None
    """Bearer token required on ingest and the /v1 API when set."""
    max_body_bytes: int = 64 * 1024 * 1024
    """Largest accepted push; bigger ones get 413."""
    max_push_rows: int = PushLimits.max_rows
    """Most step plus event rows one push may hold; more get 413."""
    max_decoded_bytes: int = PushLimits.max_decoded_bytes
    """Most bytes one push may expand to once decoded (decompressed Arrow buffers,
    dictionaries expanded, JSON values parsed); more get 413 before the memory is spent."""
    max_duration_s: float = PushLimits.max_duration_s
    """Longest step duration or wait accepted (422 beyond)."""
    min_time_s: float = PushLimits.min_epoch_s
    """Earliest instant accepted, seconds since the epoch (422 before)."""
    max_time_s: float = PushLimits.max_epoch_s
    """Latest instant accepted (422 after)."""
    max_queue_rows: int = 4_000_000
    """Rows the write queue may hold before pushes get 503."""
    summarize_interval_s: float = 1.0
    """How often dirty step ranges are re-summarised."""
    memory_limit: str | None = "2GB"
    """DuckDB's memory limit (its buffer cache otherwise grows towards 80% of RAM)."""
    detect: bool = True
    """Run the straggler detector over live runs (findings as events and on /metrics)."""
    straggler: StragglerConfig | None = None
    """The straggler detector's settings (None: its defaults)."""
    webhook: str | None = None
    """URL that receives each straggler finding once, as a JSON POST (a launcher evicts)."""
    hang_floor_s: float = 60.0
    """Shortest hang timeout (the adaptive timeout is 3x the longest step interval seen)."""
    metrics_retention_s: float = 3600.0
    """/metrics exports runs live or active within this long (history stays on /v1)."""
    allow_hosts: tuple[str, ...] = ()
    """``Host`` names a token-less collector answers to besides loopback ones and the bound
    address (``*``: any; a token makes the check unnecessary)."""
    init: bool = False
    """Add goodlens's tables to an existing DuckDB file that does not have them."""
    limits: Limits = field(default_factory=Limits)
    """Header and body timeouts and the connection bound (see ``serving.Limits``)."""

    def allowed_hosts(self) -> frozenset[str] | None:
        """The Host names answered besides loopback ones; None: any (a token is set)."""
        if self.token or "*" in self.allow_hosts:
            return None
        names = {h.strip().lower().strip("[]") for h in self.allow_hosts if h.strip()}
        return frozenset({*names, self.host.lower().strip("[]")})

    def __post_init__(self) -> None:
        if not (0 <= self.port <= 65535):
            raise ValueError(f"port must be 0-65535, got {self.port}")
        if self.max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")
        if self.summarize_interval_s <= 0:
            raise ValueError("the summarize interval must be positive")
        if not self.metrics_retention_s >= 0:
            raise ValueError("the metrics retention must not be negative")
        if not is_loopback(self.host) and not self.token:
            raise ValueError(f"binding {self.host} exposes ingest beyond this machine; set "
                             "a token (GOODLENS_TOKEN or --token-file) so only your exporters "
                             "can push")


RootApp = Callable[[Store, Any], Any]
"""Builds the ASGI app served at ``/`` over the open store and the detection service (None
with ``--no-detect``): ``goodlens serve``'s dashboard."""


class CollectorApi:
    """The collector's endpoints over one store, writer and config: the state has names
    (the token, the metrics registry, when it started), each endpoint is a method."""

    def __init__(self, store: Store, writer: Writer, config: ServerConfig,
                 detection: Any = None, keeper: ReportKeeper | None = None) -> None:
        self.store = store
        self.writer = writer
        self.config = config
        self.keeper = keeper
        self.nodes = NodeCache(store)  # hosts to drain, computed beside the requests
        self.registry = make_registry(store, writer, detection, keeper, nodes=self.nodes)
        self.detection = detection  # GET /v1/actions reads its findings
        self.token = config.token.encode() if config.token else None
        self.started = time.time()

    def routes(self) -> list[Route]:
        """The collector's own routes (``/v1/...``, ``/metrics``, ``/healthz``)."""
        return [
            Route("/v1/ingest", self.ingest, methods=["POST"]),
            Route("/v1/sync", self.sync, methods=["POST"]),
            Route("/v1/runs", self.runs, methods=["GET"]),
            Route("/v1/report", self.report, methods=["GET"]),
            Route("/v1/runs/{run_id:path}", self.run, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
            actions_route(self),  # GET /v1/actions: evict findings a job may act on
            tables_route(self),  # GET /v1/tables/{name}?run=: a run's rows as Arrow
        ]

    def auth_error(self, request: Request) -> Response | None:
        """The 401/403 answer when a token is required and missing or wrong; else None."""
        if self.token is None:
            return None
        header = request.headers.get("authorization", "")
        if not header:
            self.writer.stats.reject("auth")
            return json_response({"error": "missing token: send 'Authorization: Bearer <token>'",
                                  "field": "authorization"}, 401, {"WWW-Authenticate": "Bearer"})
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(),
                                                                 self.token):
            self.writer.stats.reject("auth")
            return json_response({"error": "wrong token", "field": "authorization"}, 403)
        return None

    async def _body(self, request: Request) -> bytes | bytearray | Response:
        """The request body, or the 413 answer once it passes the size limit. A declared
        length is read into one growing buffer (a body costs its size once, not twice), never
        reserved up front: a slow client declaring 64 MiB holds only what it has sent."""
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isascii() and declared.isdigit():
            if int(declared) > limit:
                return _too_large(self.writer, self.config, _source(request))
            buf = bytearray()
            async for chunk in request.stream():
                if len(buf) + len(chunk) > int(declared):
                    return _too_large(self.writer, self.config, _source(request))
                buf += chunk
            return buf
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return _too_large(self.writer, self.config, _source(request))
            chunks.append(chunk)
        return b"".join(chunks)

    async def ingest(self, request: Request) -> Response:
        """``POST /v1/ingest``: validate, hand to the writer, answer after the commit. Every
        refusal is counted on /metrics by reason; nothing a client sends gets a 500."""
        if (err := self.auth_error(request)) is not None:
            return err
        writer = self.writer
        src = _source(request)
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
        decode = DECODERS.get(ctype)
        if decode is None:
            writer.stats.reject("invalid", src)
            return json_response({"error": f"content type {ctype} not supported; send "
                                  f"{' or '.join(DECODERS)}", "field": "content-type"}, 415)
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        try:
            batch = await run_in_threadpool(decode, body, _limits(self.config))
            if (refused := self.store.run_id_refused(batch.run_id)) is not None:
                raise BatchError(refused, "run_id")  # this store's limit, not the API's
        except BatchError as exc:
            writer.stats.reject(exc.reason, src)
            return json_response(exc.as_dict(), exc.status)
        except Exception as exc:  # the decoders raise BatchError only; a safety net
            log.exception("decoding a push failed")
            writer.stats.reject("invalid", src)
            return json_response({"error": f"batch could not be decoded: {type(exc).__name__}",
                                  "field": None}, 400)
        try:
            fut = writer.submit(batch)
        except Overloaded as exc:
            writer.stats.reject("overloaded", src)
            return json_response({"error": f"{exc}; retry later", "field": None}, 503,
                                 {"Retry-After": "1"})
        try:
            result = await asyncio.wrap_future(fut)
        except Exception as exc:
            log.exception("writing batch for run %s failed", batch.run_id)
            return json_response({"error": f"batch could not be stored: {exc}", "field": None}, 500)
        return json_response({"ok": True, **result.as_dict()})

    async def metrics(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus text, read at scrape time."""
        data = await run_in_threadpool(generate_latest, self.registry)
        return Response(data, media_type=CONTENT_TYPE_LATEST)

    async def healthz(self, request: Request) -> Response:
        """``GET /healthz``: liveness, version and queue depth (no token needed, so nothing
        about the machine: no paths)."""
        return json_response({"status": "ok", "version": __version__,
                              "schema_version": SCHEMA_VERSION,
                              "queue_rows": self.writer.queue_rows,
                              "store_warnings": len(self.store.warnings),
                              "uptime_s": time.time() - self.started})

    async def openapi(self, request: Request) -> Response:
        """``GET /openapi.json``: this API as an OpenAPI 3.0 document (no token needed)."""
        return json_response(openapi_document(__version__))

    async def runs(self, request: Request) -> Response:
        """``GET /v1/runs?limit=&offset=&sort=&order=&state=&q=``: a page of the runs list
        (``goodlens runs --json``), sorted and filtered on the server, with ``total``."""
        if (err := self.auth_error(request)) is not None:
            return err
        page = _page_params(request.query_params)
        if isinstance(page, Response):
            return page
        df, total = await run_in_threadpool(lambda: self.store.runs_page(**page))
        offset, limit = page["offset"], page["limit"]
        more = offset + len(df) < total
        return json_response({"runs": records(df), "total": total, "offset": offset,
                              "limit": limit, "sort": page["sort"],
                              "order": "desc" if page["descending"] else "asc",
                              "next_offset": offset + len(df) if more else None})

    async def run(self, request: Request) -> Response:
        """``GET /v1/runs/{run_id}``: one run and its attempts."""
        if (err := self.auth_error(request)) is not None:
            return err
        run_id = request.path_params["run_id"]

        def load() -> tuple[Any, Any]:
            return self.store.run(run_id), self.store.attempts(run_id)
        info, attempts = await run_in_threadpool(load)
        if info is None:
            return json_response({"error": f"no run {run_id!r}; list runs at /v1/runs",
                                  "field": "run_id"}, 404)
        return json_response({"run": plain(info), "attempts": records(attempts)})

    async def report(self, request: Request) -> Response:
        """``GET /v1/report?run=&since=&until=&exclude=&as_of=``: ``goodlens report``'s
        accounting."""
        if (err := self.auth_error(request)) is not None:
            return err
        q = request.query_params

        def build() -> dict:  # an empty parameter (?since=) is an absent one
            run, whole = q.get("run") or None, not any(
                q.get(k) for k in ("since", "until", "exclude", "as_of"))
            if run is not None and whole and q.get("fresh") not in ("1", "true"):
                kept = self.store.stored_report(run)  # an ended run: computed once
                if kept is None and self.keeper is not None:
                    kept = self.keeper.live_report(run, LIVE_REPORT_MAX_AGE_S)
                if kept is not None:
                    return kept
            return report_dict(self.store, q.get("run") or None, q.get("since") or None,
                               q.get("until") or None, hang_floor_s=self.config.hang_floor_s,
                               exclude=(q.get("exclude") or "").split(","),
                               as_of=q.get("as_of") or None)
        try:
            rep = await run_in_threadpool(build)
        except KeyError as exc:
            return json_response({"error": f"{exc.args[0]}; list runs at /v1/runs",
                                  "field": "run"}, 404)
        except ValueError as exc:
            return json_response({"error": str(exc), "field": "since/until/as_of"}, 422)
        return json_response(rep)

    async def sync(self, request: Request) -> Response:
        """``POST /v1/sync``: everything queued committed and summarised before it answers;
        with ``detect=1``, then a detection pass over it too (its findings stored)."""
        if (err := self.auth_error(request)) is not None:
            return err
        detect = request.query_params.get("detect", "0")
        if detect not in ("0", "1"):
            return json_response({"error": f"detect must be 0 or 1, not {detect!r}",
                                  "field": "detect"}, 422)
        if detect == "1" and self.detection is None:
            return json_response({"error": "detection is off (the collector runs with "
                                  "--no-detect): sync without detect=1", "field": "detect"},
                                 409)
        try:
            await run_in_threadpool(self.writer.sync)
        except TimeoutError as exc:
            return json_response({"error": f"{exc}; the collector is behind, try again",
                                  "field": None}, 504)
        if detect == "1":
            found = await run_in_threadpool(self.detection.run_pass)
            return json_response({"ok": True, "findings": len(found)})
        return json_response({"ok": True})


def create_app(store: Store, writer: Writer, config: ServerConfig,
               detection: Any = None, root: Any = None,
               keeper: ReportKeeper | None = None) -> RequestGuard:
    """The collector's ASGI app over an open store and a started writer; ``root``, an ASGI
    app, is mounted at ``/`` after the collector's own routes. Behind the Host allow-list
    (token-less) and the body deadline of :class:`~goodlens.collector.serving.RequestGuard`."""
    api = CollectorApi(store, writer, config, detection, keeper)
    routes: list[Any] = api.routes()
    if root is not None:
        routes.append(Mount("/", app=root))
    app = Starlette(routes=routes, exception_handlers={404: _http_error, 405: _http_error})
    return RequestGuard(app, allowed=config.allowed_hosts(),
                        body_timeout_s=config.limits.body_timeout_s, on_close=api.nodes.close)


async def _http_error(request: Request, exc: Any) -> Response:
    """404/405 as JSON, like every other answer of the API (see /openapi.json)."""
    return json_response({"error": f"{exc.detail}: {request.method} {request.url.path}; the "
                          "API is described at /openapi.json", "field": None},
                         exc.status_code, exc.headers)


#: A live run's report the keeper computed at most this long ago (longer for a run whose
#: accounting is slow: the keeper's pacing) is served as it is (it says when, in
#: ``computed_at``); ``?fresh=1`` computes one now.
LIVE_REPORT_MAX_AGE_S = 5.0
#: Runs per page of ``/v1/runs`` by default, and at most.
RUNS_PAGE, RUNS_PAGE_MAX = 1000, 10_000


def _page_params(q: Any) -> dict[str, Any] | Response:
    """``/v1/runs``'s paging, sort and filters, checked (422 naming the parameter)."""
    def bad(name: str, why: str) -> Response:
        return json_response({"error": f"{name}: {why}", "field": name}, 422)
    out: dict[str, Any] = {}
    for name, default, hi in (("limit", RUNS_PAGE, RUNS_PAGE_MAX), ("offset", 0, 2**62)):
        raw = q.get(name) or None
        if raw is not None and not (raw.isascii() and raw.isdigit() and len(raw) <= 19
                                    and int(raw) <= hi):
            return bad(name, f"a whole number from 0 to {hi}, got {raw[:40]!r}")
        out[name] = default if raw is None else int(raw)
    sort = q.get("sort") or "start"
    if sort not in SORT_KEYS:
        return bad("sort", f"one of {', '.join(SORT_KEYS)}, got {sort[:40]!r}")
    order = q.get("order") or "desc"
    if order not in ("asc", "desc"):
        return bad("order", f"asc or desc, got {order[:40]!r}")
    state, text = q.get("state") or None, q.get("q") or None
    if state is not None and len(state) > 64:
        return bad("state", "at most 64 characters")
    if text is not None and len(text) > 200:
        return bad("q", "at most 200 characters")
    out.update(sort=sort, descending=order == "desc", state=state, text=text)
    return out


def _limits(config: ServerConfig) -> PushLimits:
    """The decoders' limits of a collector's config."""
    return PushLimits(max_rows=config.max_push_rows, max_decoded_bytes=config.max_decoded_bytes,
                  max_duration_s=config.max_duration_s, min_epoch_s=config.min_time_s,
                  max_epoch_s=config.max_time_s)


_SOURCE_OK = re.compile(r"[A-Za-z0-9._:/@-]{1,80}")


def _source(request: Request) -> str | None:
    """The source a sender names (``X-Goodlens-Source``: its run and rank), when it is a
    short plain name; used only to count refusals per source."""
    src = request.headers.get("x-goodlens-source")
    return src if src is not None and _SOURCE_OK.fullmatch(src) else None


def _too_large(writer: Writer, config: ServerConfig, source: str | None = None) -> Response:
    """The 413 answer to a body over ``--max-body`` (counted as ``too_large``)."""
    writer.stats.reject("too_large", source)
    return json_response({"error": f"batch larger than {config.max_body_bytes} bytes; send smaller "
                          "batches or raise --max-body", "field": None}, 413)


def serve(config: ServerConfig, *, ready: Any = None, log_level: str = "info",
          root: RootApp | None = None) -> None:
    """Run the collector until SIGINT/SIGTERM; flushes and closes the store on the way out.

    ``ready``, if given, is called with the bound port once the server accepts connections;
    ``root``, if given, builds the app served at ``/`` over the opened store.
    """
    import signal

    import uvicorn

    # uvicorn shuts down on SIGINT/SIGTERM and then re-raises the signal with the handler
    # that was installed before it: make that one a clean exit so the writer drains its
    # queue, summarises and the store is closed (checkpointed) below.
    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit)
    store = open_store(config.db, memory_limit=config.memory_limit, init=config.init)
    keeper = ReportKeeper(store, KeeperConfig(retention_s=config.metrics_retention_s,
                                              hang_floor_s=config.hang_floor_s))
    writer = Writer(store, max_queue_rows=config.max_queue_rows,
                    summarize_interval_s=config.summarize_interval_s,
                    after_pass=keeper.after_pass).start()
    detection = None
    if config.detect:
        from goodlens.collector.detection import DetectionService
        from goodlens.detectors.hangs import HangConfig
        detection = DetectionService(store, writer, config=config.straggler,
                                     webhook=config.webhook,
                                     hang_config=HangConfig(min_timeout_s=config.hang_floor_s)
                                     ).start()
    app = create_app(store, writer, config, detection,
                     None if root is None else root(store, detection), keeper)
    uconfig = uvicorn_config(app, config.host, config.port, config.limits,
                             log_level=log_level, timeout_graceful_shutdown=10)
    server = uvicorn.Server(uconfig)
    try:
        if ready is None:
            server.run()
        else:
            asyncio.run(serve_until_exit(server, ready))
    finally:
        app.close()  # the node table's scan, if one is running, ends before the store closes
        if detection is not None:
            detection.stop()
        writer.stop()
        with contextlib.suppress(Exception):
            store.close()
