"""Serving the per-host relay (:mod:`goodlens.collector.relay`) over HTTP: its Starlette app
(``POST /v1/ingest``, ``GET /healthz``) and the uvicorn loop behind ``goodlens relay``, with
an idle exit for relays the exporters start themselves, on TCP or on a Unix socket of the
user's own (bound under an ``flock``, mode 0600, removed at exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket
import stat
import threading
import time
from typing import Any

from goodlens.collector.relay import (
    Answer,
    Relay,
    RelayConfig,
    answer,
)
from goodlens.collector.serving import json_response, serve_until_exit
from goodlens.exporter.private import UnsafePath, ensure_dir, open_private
from goodlens.model.batch import BatchError
from goodlens.model.batch_arrow import DECODERS

log = logging.getLogger("goodlens.relay")


def create_app(relay: Relay) -> Any:
    """The relay's ASGI app: ``POST /v1/ingest`` and ``GET /healthz``."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    cfg = relay.config

    def respond(ans: Answer) -> Response:
        return Response(ans[1], ans[0], headers=ans[2], media_type="application/json")

    def refuse(ans: Answer) -> Response:
        relay.stats.rejected += 1
        return respond(ans)

    async def ingest(request: Request) -> Response:
        header = request.headers.get("authorization", "")
        if (err := relay.check_token(header)) is not None:
            return refuse(err)
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
        decode = DECODERS.get(ctype)
        if decode is None:
            return refuse(answer(415, {"error": f"content type {ctype} not supported; send "
                                        f"{' or '.join(DECODERS)}", "field": "content-type"}))
        too_large = answer(413, {"error": f"batch larger than {cfg.max_body_bytes} bytes; "
                                  "send smaller batches", "field": None})
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cfg.max_body_bytes:
            return refuse(too_large)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > cfg.max_body_bytes:
                return refuse(too_large)
        data = bytes(body)
        try:
            batch = await run_in_threadpool(decode, data)
        except BatchError as exc:
            return refuse(answer(exc.status, exc.as_dict()))
        return respond(await relay.submit(batch, data, ctype, header))

    async def healthz(request: Request) -> Response:
        return json_response(relay.health())

    return Starlette(routes=[Route("/v1/ingest", ingest, methods=["POST"]),
                             Route("/healthz", healthz, methods=["GET"])])


def serve(config: RelayConfig, *, ready: Any = None, log_level: str = "warning") -> Relay:
    """Run the relay until SIGINT/SIGTERM (or ``idle_exit_s`` without a push); returns it.

    ``ready``, if given, is called with the bound port once the relay accepts connections.
    Pushes in flight at shutdown are still forwarded and answered.
    """
    import uvicorn

    from goodlens.collector.serving import Limits, RequestGuard, guarded_h11, raise_fd_limit

    relay = Relay(config)
    where: dict[str, Any] = {"host": config.host, "port": config.port}
    bound = bind_unix(config.socket) if config.socket else None
    if bound is not None:
        where = {"fd": bound[0].fileno()}
        if ready is not None:
            report = ready
            ready = lambda _name: report(config.port)  # noqa: E731 - the socket has no port
    # the collector's guards: header and body deadlines, a connection bound
    limits = Limits()
    raise_fd_limit(limits.max_connections + 256)
    app = RequestGuard(create_app(relay), allowed=None, body_timeout_s=limits.body_timeout_s)
    uconfig = uvicorn.Config(app, **where, http=guarded_h11(limits),
                             limit_concurrency=limits.max_connections,
                             timeout_keep_alive=limits.keep_alive_s,
                             h11_max_incomplete_event_size=limits.max_header_bytes,
                             log_level=log_level, access_log=False, lifespan="off",
                             timeout_graceful_shutdown=2 * config.timeout_s + 1)
    server = uvicorn.Server(uconfig)

    def idle_exit() -> None:
        if (config.idle_exit_s and relay.idle()
                and time.monotonic() - relay.last_push > config.idle_exit_s):
            log.info("relay: no push for %.0f s; exiting", config.idle_exit_s)
            server.should_exit = True

    # uvicorn shuts down on SIGINT/SIGTERM, then re-raises the signal with the handler that
    # was there before it: make that one ask for the same clean stop (it also covers a
    # signal arriving before uvicorn installed its own), so the caller gets the counters
    def _stop(signum: int, frame: Any) -> None:
        server.should_exit = True

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _stop)
    try:
        asyncio.run(serve_until_exit(server, ready, idle_exit))
    finally:
        relay.close()
        if bound is not None:
            unbind_unix(config.socket or "", *bound)
    return relay


def bind_unix(path: str) -> tuple[socket.socket, int]:
    """A listening Unix socket at ``path`` only this user can connect to (mode 0600, in a
    directory of this user that others cannot write to), and the ``flock`` on
    ``path.lock`` that says a relay serves it (keep it open). A stale socket left by a relay
    that died is replaced; a live relay's is not (RuntimeError)."""
    ensure_dir(os.path.dirname(os.path.abspath(path)))
    lock = open_private(path + ".lock", os.O_RDWR, create=True)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        raise RuntimeError(f"another relay serves {path}") from None
    try:
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
                raise UnsafePath(f"{path} exists and is not a socket of this user")
            os.unlink(path)  # no relay holds the lock: left by one that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(1024)
    except BaseException:
        os.close(lock)
        raise
    return sock, lock


def unbind_unix(path: str, sock: socket.socket, lock: int) -> None:
    """Remove the socket ``bind_unix`` made (ours while the lock is held) and release the
    lock."""
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    sock.close()
    os.close(lock)
