"""Serving the Dash (WSGI) app from the collector's ASGI server.

One process owns the DuckDB file, so the dashboard runs inside the collector: Dash's Flask
server is wrapped with ``a2wsgi`` and mounted at ``/`` after the collector's own routes.
When the collector requires a token, so does the dashboard: open it once as
``/?token=TOKEN``; the token is then kept in a cookie (HttpOnly, SameSite=Strict).
"""

from __future__ import annotations

import hmac
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs

from a2wsgi import WSGIMiddleware

COOKIE = "goodlens_token"


def dashboard_asgi(dash_app: Any, token: str | None = None) -> Any:
    """An ASGI app serving ``dash_app`` (behind the token gate when ``token`` is set)."""
    inner = WSGIMiddleware(dash_app.server, workers=4)
    if not token:
        return inner
    secret = token.encode()

    async def gate(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await inner(scope, receive, send)
        query = parse_qs(scope.get("query_string", b"").decode())
        given = (query.get("token") or [None])[0]
        if given is not None and hmac.compare_digest(given.encode(), secret):
            # the raw path keeps its percent-encoding (a run id with '/', ' ' or '%')
            raw = scope.get("raw_path") or scope["path"].encode()
            await send({"type": "http.response.start", "status": 303, "headers": [
                (b"location", raw or b"/"),
                (b"set-cookie", f"{COOKIE}={given}; Path=/; HttpOnly; SameSite=Strict"
                 .encode())]})
            return await send({"type": "http.response.body", "body": b""})
        cookie = SimpleCookie()
        for name, value in scope.get("headers", []):
            if name == b"cookie":
                cookie.load(value.decode("latin-1"))
        have = cookie.get(COOKIE)
        if have is not None and hmac.compare_digest(have.value.encode(), secret):
            return await inner(scope, receive, send)
        body = (b"This dashboard needs the collector's token: open it once as "
                b"/?token=YOUR_TOKEN (the token is then kept in a cookie).\n")
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
        await send({"type": "http.response.body", "body": body})
    return gate
