"""Running a uvicorn server until it exits, for every server goodlens starts (the collector,
the relay, the dashboard alone), and the guards every one of them needs on a network.

Why this module: uvicorn bounds neither how long a client may take to send a request's
headers (h11 has no header timeout) nor how long it may trickle a body, and an ASGI app never
sees a connection whose headers have not arrived. So the guards sit at two levels:

- :func:`guarded_h11`, the HTTP protocol (uvicorn's h11 one, subclassed): each connection
  must deliver a request's headers within ``header_timeout_s`` of connecting or of its
  previous answer, and the body within ``body_timeout_s`` (plus a grace) of its headers;
  otherwise it is closed. At most a quarter of ``max_connections`` may wait for headers at
  once: a new one evicts the oldest, so slow-header sockets cannot crowd out real clients.
- :class:`RequestGuard`, ASGI middleware: the ``Host`` allow-list of a token-less server
  (DNS rebinding: a web page whose name resolves to 127.0.0.1 must not reach it; 421 for
  another name, 400 without one) and the body deadline an app reading its body sees: 408
  with ``Connection: close`` once ``body_timeout_s`` passed since the request arrived.

:func:`uvicorn_config` puts both, ``limit_concurrency`` (503 beyond ``max_connections``),
the keep-alive timeout and the header size limit together; :func:`serve_until_exit` runs it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import resource
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from goodlens.model.jsonable import plain


@dataclass(frozen=True)
class Limits:
    """How long a client may take and how many may connect."""

    header_timeout_s: float = 10.0
    """A request's headers must arrive within this of connecting (or of the last answer)."""
    body_timeout_s: float = 60.0
    """A request's body must arrive within this of its headers (408 otherwise)."""
    max_connections: int = 4096
    """Open connections beyond which requests get 503; a quarter may wait for headers."""
    keep_alive_s: int = 5
    """An idle keep-alive connection is closed after this."""
    max_header_bytes: int = 16 * 1024
    """Largest request line plus headers (h11 answers 400 beyond)."""

    def __post_init__(self) -> None:
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError("the header and body timeouts must be positive")
        if self.max_connections < 4:
            raise ValueError("max_connections must be at least 4")


def json_response(obj: Any, status: int = 200, headers: dict | None = None) -> Any:
    """``obj`` as a JSON response (numpy values and timestamps made plain), for every route
    of every goodlens server."""
    from starlette.responses import Response
    return Response(orjson.dumps(obj, default=plain, option=orjson.OPT_SERIALIZE_NUMPY),
                    status, headers=headers, media_type="application/json")


BODY_GRACE_S = 2.0
"""How much longer than the body deadline the protocol waits before it closes a connection
whose body is still incomplete (the app answers 408 first when it is reading)."""
_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def guarded_h11(limits: Limits) -> type:
    """uvicorn's h11 protocol with header and body deadlines and a bound on the connections
    waiting for headers (the oldest evicted); one class per server."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    waiting: OrderedDict[Any, None] = OrderedDict()  # oldest first
    max_waiting = max(1, limits.max_connections // 4)

    class GuardedH11(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _phase = ""
        _partial = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._progress()

        def data_received(self, data: bytes) -> None:
            self._partial = True
            super().data_received(data)
            self._progress()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._progress()

        def connection_lost(self, exc: Exception | None) -> None:
            self._arm(None)
            waiting.pop(self, None)
            super().connection_lost(exc)

        def _progress(self) -> None:
            """Arm the deadline of what the connection waits for now: headers, a body, or
            nothing (the request is in, the app answers)."""
            if self.transport.is_closing():
                return
            state = self.conn.their_state
            if state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
                if self._phase != "headers":
                    self._phase, self._partial = "headers", False
                    self._arm(limits.header_timeout_s)
                    waiting[self] = None
                    if len(waiting) > max_waiting:
                        oldest, _ = waiting.popitem(last=False)
                        oldest._expire()
            elif state is h11.SEND_BODY:
                if self._phase != "body":
                    self._phase = "body"
                    waiting.pop(self, None)
                    self._arm(limits.body_timeout_s + BODY_GRACE_S)
            elif self._phase != "done":
                self._phase = "done"
                waiting.pop(self, None)
                self._arm(None)

        def _arm(self, seconds: float | None) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if seconds is not None:
                self._timer = self.loop.call_later(seconds, self._expire)

        def _expire(self) -> None:
            """Too slow: a 408 if part of a request came and no answer started; closed."""
            self._timer = None
            waiting.pop(self, None)
            if self.transport.is_closing():
                return
            if (self._phase == "headers" and self._partial) or (
                    self._phase == "body" and self.cycle is not None
                    and not self.cycle.response_started):
                self.transport.write(_TIMEOUT)
            self.transport.close()

    return GuardedH11


def raise_fd_limit(wanted: int) -> None:
    """Raise this process's open-file limit towards ``wanted`` (up to the hard limit), so
    ``max_connections`` sockets fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def uvicorn_config(app: Any, host: str, port: int, limits: Limits | None = None,
                   **kw: Any) -> Any:
    """A ``uvicorn.Config`` for ``app`` with the guarded protocol, the concurrency bound,
    the keep-alive timeout and the header size limit of ``limits``."""
    import uvicorn

    limits = limits or Limits()
    raise_fd_limit(limits.max_connections + 256)
    kw.setdefault("access_log", False)
    kw.setdefault("lifespan", "off")
    return uvicorn.Config(app, host=host, port=port, http=guarded_h11(limits),
                          limit_concurrency=limits.max_connections,
                          timeout_keep_alive=limits.keep_alive_s,
                          h11_max_incomplete_event_size=limits.max_header_bytes, **kw)


LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without port, brackets or trailing dot, lower case."""
    text = header.strip().lower()
    if text.startswith("["):
        return text[1:text.find("]")] if "]" in text else text[1:]
    name, sep, port = text.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        text = name
    return text.rstrip(".")


def loopback_host(name: str) -> bool:
    """Whether a ``Host`` name can only mean this machine: ``localhost`` (and names under
    ``.localhost``), or a loopback address literal."""
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class RequestGuard:
    """ASGI middleware: the ``Host`` allow-list (``allowed`` names, or None for no check; a
    loopback name always passes) and the body deadline (408 after ``body_timeout_s``)."""

    def __init__(self, app: Any, *, allowed: frozenset[str] | None,
                 body_timeout_s: float, on_close: Any = None) -> None:
        self.app = app
        self.allowed = allowed
        self.body_timeout_s = body_timeout_s
        self._on_close = on_close

    def close(self) -> None:
        """Stop what the app runs beside requests (before its store is closed)."""
        if self._on_close is not None:
            self._on_close()

    def host_error(self, scope: dict) -> tuple[int, dict] | None:
        """The 400/421 answer for a request whose Host is missing or not allowed."""
        if self.allowed is None:
            return None
        values = [v for k, v in scope.get("headers", ()) if k == b"host"]
        if not values:
            return 400, {"error": "a Host header is required", "field": "host"}
        name = host_name(values[0].decode("latin-1"))
        if loopback_host(name) or name in self.allowed:
            return None
        return 421, {"error": f"Host {name!r} is not served here: without a token this "
                     "server answers only to loopback names (add one with --allow-host)",
                     "field": "host"}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if (err := self.host_error(scope)) is not None:
            await _answer(send, *err)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout_s
        state = {"started": False, "timed_out": False, "body_done": False}

        async def guarded_receive() -> dict:
            if state["timed_out"]:
                return {"type": "http.disconnect"}
            if state["body_done"]:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0))
            except TimeoutError:
                state["timed_out"] = True
                if not state["started"]:
                    state["started"] = True
                    await _answer(send, 408, {
                        "error": f"request body not received within {self.body_timeout_s:g} s",
                        "field": None}, close=True)
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body"):
                state["body_done"] = True
            return message

        async def guarded_send(message: dict) -> None:
            if state["timed_out"]:
                return  # the 408 went out; the app's own answer is dropped
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except Exception:
            if not state["timed_out"]:
                raise


async def _answer(send: Any, status: int, body: dict, close: bool = False) -> None:
    data = orjson.dumps(body)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(data)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def serve_until_exit(server: Any, ready: Any = None, tick: Any = None) -> None:
    """Serve a ``uvicorn.Server`` until it exits: ``ready(port)`` once it accepts
    connections (the bound port, for port 0), ``tick()`` about every second meanwhile."""
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task
            return
        await asyncio.sleep(0.02)
    if ready is not None:
        ready(server.servers[0].sockets[0].getsockname()[1])
    while tick is not None and not task.done():
        await asyncio.wait({task}, timeout=1.0)
        tick()
    # awaited directly: a SystemExit the server's signal handler raises inside the task
    # then counts as retrieved (no "Task exception was never retrieved" at exit)
    await task
