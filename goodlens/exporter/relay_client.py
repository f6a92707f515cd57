"""The exporter's side of the per-host relay (the relay itself is ``goodlens.collector.relay``).

With ``host_relay`` (or ``GOODLENS_RELAY=1``), local rank 0 starts ``goodlens relay`` as a
detached process when none runs, and every rank sends to it, straight to the collector
while no relay for that collector answers. The relay is found through a Unix socket in the
user's private directory (:func:`goodlens.exporter.private.relay_socket`): only this user
can connect to it, so the token the ranks send reaches no one else. Nothing is sent to
whatever answers on a TCP port (a relay at a URL the user gives as ``GOODLENS_URL`` is
used as a collector). Standard library only: a training image without the server's
dependencies can use a relay another process runs, and starting one needs
``goodlens[server]`` (without it the ranks send directly, as they would without a relay).
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import logging
import os
import socket
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from goodlens.exporter.private import UnsafePath, check_socket, open_private, relay_socket
from goodlens.exporter.transport import Transport

log = logging.getLogger("goodlens.relay")

DEFAULT_RELAY_PORT = 8472
"""Port of the per-host relay unless ``GOODLENS_RELAY_PORT`` / ``--port`` says otherwise."""
RELAY_WAIT_S = 10.0
"""How long local rank 0 waits for a relay it started to answer before sending directly."""
RELAY_RECHECK_S = 30.0
"""How long an exporter sends straight to the collector before trying the relay again."""
AUTO_IDLE_EXIT_S = 600.0
"""A relay started by an exporter exits after this long without a push."""


def endpoint(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of a collector URL, normalised for comparison."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"upstream URL must be http(s)://host:port, got {url!r}")
    host = (parts.hostname or "127.0.0.1").lower()
    host = "127.0.0.1" if host == "localhost" else host
    return (parts.scheme, host, parts.port or (443 if parts.scheme == "https" else 80),
            parts.path.rstrip("/"))


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket that must belong to this user (see :func:`check_socket`)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        check_socket(self.socket_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _socket_of(where: int | str) -> str | None:
    try:
        return relay_socket(where) if isinstance(where, int) else where
    except UnsafePath as exc:
        log.warning("goodlens: no host relay: %s", exc)
        return None


def relay_health(where: int | str, timeout_s: float = 1.0) -> dict[str, Any] | None:
    """The ``/healthz`` of the goodlens relay at a Unix socket (a path, or the port it
    serves: :func:`relay_socket`), or None if none of this user answers there."""
    path = _socket_of(where)
    if path is None:
        return None
    conn = UnixHTTPConnection(path, timeout_s)
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        info = json.loads(resp.read()) if resp.status == 200 else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()
    return info if isinstance(info, dict) and info.get("relay") is True else None


def relay_serves(where: int | str, upstream: str) -> bool:
    """Whether a relay of this user listens at ``where`` and forwards to ``upstream``."""
    info = relay_health(where)
    if info is None:
        return False
    try:
        return endpoint(str(info.get("upstream"))) == endpoint(upstream)
    except ValueError:
        return False


def _listening(path: str) -> bool:
    try:
        check_socket(path)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            s.connect(path)
        return True
    except OSError:
        return False


def start_relay(upstream: str, port: int, wait_s: float = RELAY_WAIT_S) -> int | None:
    """Start ``goodlens relay`` on this user's socket for ``port`` as a detached process
    (its own session, so it outlives the caller and sends what is in flight after the
    ranks exit; it exits after :data:`AUTO_IDLE_EXIT_S` without a push) and wait up to
    ``wait_s`` for it to serve ``upstream``. Returns its pid, or None when it did not come
    up (its log is ``relay-PORT.log`` beside the socket)."""
    if importlib.util.find_spec("uvicorn") is None:
        log.warning("goodlens: starting a host relay needs goodlens[server] in this environment "
                    "(pip install 'goodlens[server]'); sending directly")
        return None
    path = _socket_of(port)
    if path is None:
        return None
    logpath = path.removesuffix(".sock") + ".log"
    try:
        fd = open_private(logpath, os.O_WRONLY | os.O_APPEND, create=True)
        with os.fdopen(fd, "ab") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", "goodlens", "relay", "--upstream", upstream,
                 "--socket", path, "--port", str(port),
                 "--idle-exit", f"{AUTO_IDLE_EXIT_S:g}s", "--log-level", "warning"],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                start_new_session=True, close_fds=True)
    except OSError as exc:
        log.warning("goodlens: could not start a host relay (%s); sending directly", exc)
        return None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if relay_serves(path, upstream):
            return proc.pid
        if proc.poll() is not None:  # lost a race for the socket, or failed: see its log
            return proc.pid if relay_serves(path, upstream) else None
        time.sleep(0.05)
    log.warning("goodlens: the host relay at %s did not answer within %.0f s (log: %s); "
                "sending directly meanwhile", path, wait_s, logpath)
    return None


class HostRelayTransport(Transport):
    """:class:`~goodlens.exporter.transport.Transport` through the host's relay (HTTP over
    this user's Unix socket), falling back to the collector directly while no relay for
    that collector answers there.

    Whether the relay is usable is checked (``GET /healthz``: a goodlens relay forwarding to
    this collector) before the first push and then, while it is not, again after 1 s,
    2 s, 4 s ... up to :data:`RELAY_RECHECK_S`; a relay that stops answering mid-run is left
    at once for the collector.
    A relay that answers 503 (the collector is away behind it) is not left: the batch
    spills, as it would have when sending directly.
    """

    def __init__(self, upstream: str, relay_port: int, token: str | None = None,
                 timeout_s: float = 5.0, spill_path: str | None = None,
                 max_spill_bytes: int = 1 << 30, **policy: Any) -> None:
        super().__init__("http://localhost", token, timeout_s, spill_path, max_spill_bytes,
                         **policy)
        self.upstream = upstream
        self.relay_port = relay_port
        self.socket_path = _socket_of(relay_port)
        self.via_relay: bool | None = None
        """True while sending through the relay, False while directly, None before a push."""
        self._direct = Transport(upstream, token, timeout_s)  # only its _post is used
        self._recheck_at = 0.0
        self._recheck_s = 1.0  # doubles up to RELAY_RECHECK_S while no relay answers

    def _connection(self) -> http.client.HTTPConnection:
        assert self.socket_path is not None
        return UnixHTTPConnection(self.socket_path, self.timeout_s)

    def _post(self, body: bytes, content_type: str = "application/json") -> str:
        if not self.via_relay and time.monotonic() >= self._recheck_at:
            was = self.via_relay
            self.via_relay = bool(self.socket_path) and relay_serves(
                self.socket_path or "", self.upstream)
            self._recheck_at = time.monotonic() + self._recheck_s
            self._recheck_s = min(RELAY_RECHECK_S, self._recheck_s * 2)
            if self.via_relay != was:
                log.info("goodlens: %s", f"sending through the host relay at "
                         f"{self.socket_path}" if self.via_relay else
                         f"no host relay for {self.upstream} at {self.socket_path}; "
                         "sending to the collector directly")
        if self.via_relay:
            backoff, next_try = self._backoff, self._next_try
            outcome = super()._post(body, content_type)
            # Transport drops its connection only when nothing answered: the relay is away
            if outcome != "retry" or self._conn is not None:
                return outcome
            self._backoff, self._next_try = backoff, next_try
            self.via_relay = False
            self._recheck_s = 1.0
            self._recheck_at = time.monotonic() + self._recheck_s
            log.warning("goodlens: the host relay at %s stopped answering (%s); sending "
                        "to the collector directly", self.socket_path, self.stats.last_error)
        outcome = self._direct._post(body, content_type)
        self._last_status = self._direct._last_status
        self._last_answer = self._direct._last_answer
        self.stats.last_error = self._direct.stats.last_error
        if outcome == "ok":
            self._backoff = 0.0
            self._next_try = 0.0
            self.stats.sent_batches += 1
        elif outcome == "retry":
            self._failed(self._direct.stats.last_error or "collector unreachable")
        return outcome

    def close(self) -> None:
        """Close both connections."""
        super().close()
        self._direct.close()


def host_relay_transport(upstream: str, relay_port: int = DEFAULT_RELAY_PORT,
                         local_rank: int | None = None, token: str | None = None,
                         timeout_s: float = 5.0, spill_path: str | None = None,
                         max_spill_bytes: int = 1 << 30, **policy: Any) -> HostRelayTransport:
    """The exporter's transport with ``host_relay``: local rank 0 (or a process without a
    local rank) starts the relay when none runs on this user's socket for ``relay_port``
    and waits for it (at most :data:`RELAY_WAIT_S`); the other ranks only look for it."""
    path = _socket_of(relay_port)
    if local_rank in (0, None) and path is not None and not _listening(path):
        start_relay(upstream, relay_port)
    return HostRelayTransport(upstream, relay_port, token, timeout_s, spill_path,
                              max_spill_bytes, **policy)
