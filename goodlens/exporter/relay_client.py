"""The exporter's side of the per-host relay (the relay itself is ``goodlens.collector.relay``).

With ``host_relay`` (or ``GOODLENS_RELAY=1``), local rank 0 starts ``goodlens relay`` as a
detached process when nothing listens on the relay port, and every rank sends to it, straight
to the collector while no relay for that collector answers. Standard library only: a training
image without the server's dependencies can use a relay another process runs, and starting
one needs ``goodlens[server]`` (without it the ranks send directly, as they would without a
relay).
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
import tempfile
import time
from typing import Any
from urllib.parse import urlsplit

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



def relay_url(port: int) -> str:
    """The URL of the relay on this host."""
    return f"http://127.0.0.1:{port}"


def relay_health(port: int, timeout_s: float = 1.0) -> dict[str, Any] | None:
    """The ``/healthz`` of a goodlens relay on ``port`` of this host, or None if none answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        info = json.loads(resp.read()) if resp.status == 200 else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()
    return info if isinstance(info, dict) and info.get("relay") is True else None


def relay_serves(port: int, upstream: str) -> bool:
    """Whether a relay listens on ``port`` and forwards to ``upstream``."""
    info = relay_health(port)
    if info is None:
        return False
    try:
        return endpoint(str(info.get("upstream"))) == endpoint(upstream)
    except ValueError:
        return False


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_relay(upstream: str, port: int, wait_s: float = RELAY_WAIT_S) -> int | None:
    """Start ``goodlens relay`` as a detached process (its own session, so it outlives the
    caller and sends what is in flight after the ranks exit; it exits after
    :data:`AUTO_IDLE_EXIT_S` without a push) and wait up to ``wait_s`` for it to serve
    ``upstream``. Returns its pid, or None when it did not come up (the log is in the
    temporary folder: ``goodlens-relay-PORT.log``)."""
    if importlib.util.find_spec("uvicorn") is None:
        log.warning("goodlens: starting a host relay needs goodlens[server] in this environment "
                    "(pip install 'goodlens[server]'); sending directly")
        return None
    path = os.path.join(tempfile.gettempdir(), f"goodlens-relay-{port}.log")
    try:
        with open(path, "ab") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", "goodlens", "relay", "--upstream", upstream,
                 "--port", str(port), "--idle-exit", f"{AUTO_IDLE_EXIT_S:g}s",
                 "--log-level", "warning"],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                start_new_session=True, close_fds=True)
    except OSError as exc:
        log.warning("goodlens: could not start a host relay (%s); sending directly", exc)
        return None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if relay_serves(port, upstream):
            return proc.pid
        if proc.poll() is not None:  # lost a race for the port, or failed: see its log
            return proc.pid if relay_serves(port, upstream) else None
        time.sleep(0.05)
    log.warning("goodlens: the host relay on port %d did not answer within %.0f s (log: %s); "
                "sending directly meanwhile", port, wait_s, path)
    return None


class HostRelayTransport(Transport):
    """:class:`~goodlens.exporter.transport.Transport` through the host's relay, falling back to the
    collector directly while no relay for that collector answers on the port.

    Whether the relay is usable is checked (``GET /healthz``: a goodlens relay forwarding to
    this collector) before the first push and then, while it is not, again after 1 s,
    2 s, 4 s ... up to :data:`RELAY_RECHECK_S`; a relay that stops answering mid-run is left
    at once for the collector.
    A relay that answers 503 (the collector is away behind it) is not left: the batch
    spills, as it would have when sending directly.
    """

    def __init__(self, upstream: str, relay_port: int, token: str | None = None,
                 timeout_s: float = 5.0, spill_path: str | None = None,
                 max_spill_bytes: int = 1 << 30) -> None:
        super().__init__(relay_url(relay_port), token, timeout_s, spill_path, max_spill_bytes)
        self.upstream = upstream
        self.relay_port = relay_port
        self.via_relay: bool | None = None
        """True while sending through the relay, False while directly, None before a push."""
        self._direct = Transport(upstream, token, timeout_s)  # only its _post is used
        self._recheck_at = 0.0
        self._recheck_s = 1.0  # doubles up to RELAY_RECHECK_S while no relay answers

    def _post(self, body: bytes, content_type: str = "application/json") -> str:
        if not self.via_relay and time.monotonic() >= self._recheck_at:
            was = self.via_relay
            self.via_relay = relay_serves(self.relay_port, self.upstream)
            self._recheck_at = time.monotonic() + self._recheck_s
            self._recheck_s = min(RELAY_RECHECK_S, self._recheck_s * 2)
            if self.via_relay != was:
                log.info("goodlens: %s", f"sending through the host relay on port "
                         f"{self.relay_port}" if self.via_relay else
                         f"no host relay for {self.upstream} on port {self.relay_port}; "
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
            log.warning("goodlens: the host relay on port %d stopped answering (%s); sending "
                        "to the collector directly", self.relay_port, self.stats.last_error)
        outcome = self._direct._post(body, content_type)
        if outcome == "ok":
            self._backoff = 0.0
            self._next_try = 0.0
            self.stats.sent_batches += 1
        elif outcome == "retry":
            self._failed(self._direct.stats.last_error or "collector unreachable")
        else:
            self.stats.rejected_batches += 1
            self.stats.last_error = self._direct.stats.last_error
        return outcome

    def close(self) -> None:
        """Close both connections."""
        super().close()
        self._direct.close()


def host_relay_transport(upstream: str, relay_port: int = DEFAULT_RELAY_PORT,
                         local_rank: int | None = None, token: str | None = None,
                         timeout_s: float = 5.0, spill_path: str | None = None,
                         max_spill_bytes: int = 1 << 30) -> HostRelayTransport:
    """The exporter's transport with ``host_relay``: local rank 0 (or a process without a
    local rank) starts the relay when nothing listens on the port and waits for it (at most
    :data:`RELAY_WAIT_S`); the other ranks only look for it."""
    if local_rank in (0, None) and not _listening(relay_port):
        start_relay(upstream, relay_port)
    return HostRelayTransport(upstream, relay_port, token, timeout_s, spill_path,
                              max_spill_bytes)
