"""The collector on a hostile network: slow-header and slow-body connections are closed within
their bound while /healthz keeps answering, a token-less collector answers only to loopback
Host names, /healthz tells nothing about the machine, the token comes from the environment or
a file, and Schemathesis fuzzing its published OpenAPI document finds no 5xx and no answer
the document does not describe. Real `goodlens serve` processes on loopback.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import time
import urllib.request

import pytest

from tests.harness import Collector, http, step_batch

pytestmark = pytest.mark.slow


def _raise_fd_limit(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


def _healthz_seconds(c: Collector) -> float:
    t = time.monotonic()
    assert http("GET", c.url + "/healthz", timeout=20)[0] == 200
    return time.monotonic() - t


def _closed(sock: socket.socket, seen: dict) -> bool:
    """Whether the server closed ``sock`` (reading whatever it answered first)."""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
            seen[sock] = seen.get(sock, b"") + data
    except BlockingIOError:
        return False
    except OSError:
        return True


def _wait_closed(c: Collector, socks: list, bound: float, trickle: bytes | None = None
                 ) -> tuple[float, float, dict]:
    """Seconds until the server closed every socket (checking /healthz about every half
    second meanwhile), the slowest /healthz, and what each socket was answered."""
    t0, worst, seen = time.monotonic(), 0.0, {}
    open_ = list(socks)
    while open_ and time.monotonic() - t0 < bound:
        if trickle is not None:
            for s in open_:
                try:
                    s.send(trickle)
                except OSError:
                    pass
        open_ = [s for s in open_ if not _closed(s, seen)]
        worst = max(worst, _healthz_seconds(c))
        time.sleep(0.5)
    return (time.monotonic() - t0 if not open_ else float("inf")), worst, seen


def test_slow_header_connections_are_closed_and_healthz_keeps_answering(tmp_path):
    n = 1200
    _raise_fd_limit(n + 512)
    c = Collector(tmp_path / "s.duckdb", "--no-dashboard", "--no-detect",
                  "--header-timeout", "2s", "--max-connections", "800").start()
    socks = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", c.port), timeout=10)
            s.setblocking(False)
            s.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
            socks.append(s)
        took, worst, seen = _wait_closed(c, socks, bound=30, trickle=b"X-Slow: 1\r\n")
        # 2 s after connecting, or at once when 200 others wait (a quarter of 800)
        assert took < 15, f"slow-header sockets still open after {took:.1f} s"
        assert worst < 5, f"/healthz took {worst:.1f} s while slow clients were connected"
        assert any(b" 408 " in v for v in seen.values())
        assert _healthz_seconds(c) < 2
    finally:
        for s in socks:
            s.close()
        c.stop()


def _slow_post(c: Collector, ctype: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", c.port), timeout=10)
    s.sendall(f"POST /v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\n"
              "Content-Length: 10000000\r\n\r\n{".encode())
    s.setblocking(False)
    return s


def test_slow_bodies_get_408_and_are_closed(tmp_path):
    c = Collector(tmp_path / "b.duckdb", "--no-dashboard", "--no-detect",
                  "--body-timeout", "2s").start()
    try:
        reading = _slow_post(c, "application/json")  # the app reads it: 408 from the app
        ignored = _slow_post(c, "text/plain")  # answered 415 at once, the body trickles on
        took, worst, seen = _wait_closed(c, [reading, ignored], bound=30, trickle=b" ")
        assert took < 12, f"slow-body connections still open after {took:.1f} s"
        assert worst < 5
        assert b" 408 " in seen[reading] and b"not received within 2 s" in seen[reading]
        assert b" 415 " in seen[ignored] and b" 408 " not in seen[ignored]
        status, body = http("POST", c.url + "/v1/ingest", json.dumps(step_batch("r", 0, [1]))
                            .encode())
        assert status == 200, body  # a normal push is unaffected
    finally:
        c.stop()


def _get(url: str, host: str | None = None, token: str | None = None) -> tuple[int, str]:
    headers = {"Host": host} if host else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    status, body = http("GET", url, headers=headers)
    return status, body if isinstance(body, str) else json.dumps(body)


def test_token_less_collector_answers_only_to_loopback_host_names(tmp_path):
    c = Collector(tmp_path / "h.duckdb", "--no-detect", "--allow-host", "box.internal").start()
    try:
        for host in ("evil.example", f"evil.example:{c.port}", "127.0.0.1.evil.example"):
            for path in ("/healthz", "/v1/runs", "/", "/metrics"):
                status, body = _get(c.url + path, host)
                assert status == 421 and "--allow-host" in body, (host, path, status)
        for host in (f"127.0.0.1:{c.port}", f"localhost:{c.port}", "LOCALHOST.", "[::1]:80",
                     "box.internal", "app.localhost"):
            assert _get(c.url + "/v1/runs", host)[0] == 200, host
        with socket.create_connection(("127.0.0.1", c.port), timeout=10) as s:  # no Host
            s.sendall(b"GET /v1/runs HTTP/1.0\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 400 ")
    finally:
        c.stop()


def test_healthz_shows_no_path_and_the_token_comes_from_env_or_file(tmp_path):
    env = Collector(tmp_path / "e.duckdb", "--no-dashboard", "--no-detect")
    env.env = {**os.environ, "GOODLENS_TOKEN": "from-env"}
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    filed = Collector(tmp_path / "f.duckdb", "--no-dashboard", "--no-detect",
                      "--token-file", str(token_file))
    for c, token in ((env.start(), "from-env"), (filed.start(), "from-file")):
        try:
            status, body = http("GET", c.url + "/healthz")
            assert status == 200 and body["status"] == "ok" and body["version"]
            assert str(tmp_path) not in json.dumps(body) and "db" not in body
            assert _get(c.url + "/v1/runs")[0] == 401
            assert _get(c.url + "/v1/runs", token="wrong")[0] == 403
            assert _get(c.url + "/v1/runs", token=token)[0] == 200
            # a token makes the Host check unnecessary (a rebinding page has no token)
            assert _get(c.url + "/v1/runs", "collector.example", token)[0] == 200
        finally:
            c.stop()


def test_openapi_fuzzed_with_schemathesis_finds_no_5xx(tmp_path):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_headers_conformance, response_schema_conformance]
    c = Collector(tmp_path / "z.duckdb", "--no-dashboard", "--no-detect").start()
    try:
        body = json.dumps(step_batch("fuzz-run", 0, list(range(20)))).encode()
        assert http("POST", c.url + "/v1/ingest", body)[0] == 200  # something to report on
        with urllib.request.urlopen(c.url + "/openapi.json", timeout=10) as resp:
            assert resp.headers["content-type"].startswith("application/json")
        schema = schemathesis.openapi.from_url(c.url + "/openapi.json")
        ops = [r.ok() for r in schema.get_all_operations()]
        assert {op.path for op in ops} >= {"/v1/ingest", "/v1/runs", "/v1/report",
                                           "/metrics", "/healthz", "/v1/sync"}
        failures: list[str] = []
        calls = [0]
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            strategies = []
            for op in ops:
                if mode is schemathesis.GenerationMode.NEGATIVE and not (
                        op.path == "/v1/ingest" or op.path.startswith("/v1/r")):
                    continue  # nothing to negate: no parameters, no body
                kw = {"media_type": "application/json"} if op.path == "/v1/ingest" else {}
                strategies.append(op.as_strategy(generation_mode=mode, **kw))

            @settings(max_examples=150, deadline=None, database=None, derandomize=True,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=st.one_of(strategies))
            def fuzz(case):
                calls[0] += 1
                try:
                    case.call_and_validate(checks=checks, timeout=30)
                except Exception as exc:
                    failures.append(f"{case.method} {case.path}: {exc}"[:1500])

            fuzz()
        assert not failures, "\n\n".join(failures[:5])
        assert calls[0] >= 250  # derandomized: the same 300 cases every run
        assert http("GET", c.url + "/healthz")[0] == 200
    finally:
        c.stop()
