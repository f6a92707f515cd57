"""Delivery of encoded batches from an exporter to the collector, surviving its absence.

The exporter's background thread hands each encoded batch to :class:`Transport.deliver`.
Batches are delivered strictly in order. When the collector is unreachable (connection
error, timeout, 5xx, 503) the batch goes to an append-only spill file (records of a 7-byte
header, ``GL``, the format and the length, then the body; a record torn by a crash is
ignored), and delivery is retried with exponential backoff; once the collector answers again
the spill file is replayed from the start and then removed. Replaying is safe because the
store ignores rows it already holds (keys: run, attempt, rank, step / source, seq). A
leftover spill file from an earlier process of the same run and rank is replayed too.

A 4xx other than 408/429 means the collector looked at the batch and refused it: sending it
again would not help, so it is dropped, counted and logged with the collector's reason.
Nothing here raises into the caller.
"""

from __future__ import annotations

import http.client
import ipaddress
import logging
import os
import random
import struct
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

log = logging.getLogger("goodlens.exporter")

RETRYABLE = {408, 429, 500, 502, 503, 504}
JSON = "application/json"
ARROW = "application/vnd.apache.arrow.stream"
_KINDS = (JSON, ARROW)
_HEADER = struct.Struct(">2sBI")  # magic, format (index in _KINDS), body length


@dataclass
class DeliveryStats:
    """Counters of what happened to batches (read by the exporter's ``stats``)."""

    sent_batches: int = 0
    rejected_batches: int = 0
    spilled_batches: int = 0
    dropped_batches: int = 0
    last_error: str | None = None


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def whole_records(data: bytes) -> int:
    """Length of the prefix of spill-file bytes made of whole records (a crash mid-write
    leaves a torn last record)."""
    pos = 0
    while pos + _HEADER.size <= len(data):
        magic, kind, length = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + length
        if magic != b"GL" or kind >= len(_KINDS) or end > len(data):
            break
        pos = end
    return pos


def claim_spill(folder: str, stem: str) -> tuple[str, int | None]:
    """A spill file for one process: ``folder/stem.jsonl`` when no live process holds it
    (an ``flock`` on its ``.lock``), else ``folder/stem-<pid>.jsonl``. The winner of the
    shared name also adopts what dead processes left in ``stem-<pid>.jsonl`` files (whole
    records appended to its own file), so a restarted rank delivers its predecessors'
    leftovers. Returns the path and the lock's file descriptor (keep it open)."""
    import fcntl
    import glob

    def lock(path: str) -> int | None:
        fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            os.close(fd)
            return None
    shared = os.path.join(folder, f"{stem}.jsonl")
    fd = lock(shared)
    if fd is None:  # another live process has this rank's file: use one of our own
        own = os.path.join(folder, f"{stem}-{os.getpid()}.jsonl")
        return own, lock(own)
    pattern = os.path.join(glob.escape(folder), f"{glob.escape(stem)}-*.jsonl")
    for orphan in sorted(glob.glob(pattern)):
        if not orphan[len(shared) - len(".jsonl") + 1:-len(".jsonl")].isdigit():
            continue  # another stem that starts like ours, not a pid
        ofd = lock(orphan)
        if ofd is None:
            continue  # still alive
        try:
            with open(orphan, "rb") as f:
                data = f.read()
            with open(shared, "ab") as f:
                f.write(data[:whole_records(data)])
                f.flush()
                os.fsync(f.fileno())
            os.remove(orphan)
            os.remove(orphan + ".lock")
        except OSError as exc:
            log.warning("goodlens: could not adopt spill file %s: %s", orphan, exc)
        finally:
            os.close(ofd)
    return shared, fd


class Transport:
    """HTTP delivery with backoff and a spill file. Used by one thread at a time."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 5.0,
                 spill_path: str | None = None, max_spill_bytes: int = 1 << 30,
                 backoff_max_s: float = 30.0) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"collector URL must be http(s)://host:port, got {url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path.rstrip("/") or "") + "/v1/ingest"
        self._headers: dict[str, str] = {}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self.timeout_s = timeout_s
        self.spill_path = spill_path
        self.max_spill_bytes = max_spill_bytes
        self.backoff_max_s = backoff_max_s
        self._backoff = 0.0
        self._next_try = 0.0
        self._conn: http.client.HTTPConnection | None = None
        self.stats = DeliveryStats()
        self._repair_spill()

    def _repair_spill(self) -> None:
        """Cut a record torn by a crash off an existing spill file, so batches appended
        from now on are not hidden behind it."""
        if not self.spill_path or not os.path.exists(self.spill_path):
            return
        try:
            with open(self.spill_path, "rb") as f:
                data = f.read()
            pos = whole_records(data)
            if pos < len(data):
                with open(self.spill_path, "r+b") as f:
                    f.truncate(pos)
                log.warning("goodlens: cut %d bytes of a torn record off %s", len(data) - pos,
                            self.spill_path)
        except OSError as exc:
            self.stats.last_error = f"repairing spill file: {exc}"

    # -- public -------------------------------------------------------------
    def deliver(self, body: bytes, rows: int = 0, content_type: str = JSON) -> int:
        """Send one batch now, or spill it behind earlier undelivered ones.

        Returns the number of rows lost: refused by the collector (4xx), or the spill file
        full or unwritable.
        """
        if self.has_spill():
            self.drain_spill()
        if not self.has_spill() and time.monotonic() >= self._next_try:
            outcome = self._post(body, content_type)
            if outcome == "ok":
                return 0
            if outcome == "rejected":  # the collector refused it for good: those rows are lost
                return rows
        return self._spill(body, rows, content_type)

    def drain_spill(self) -> bool:
        """Replay the spill file if the collector is reachable; True when nothing is left."""
        if not self.has_spill():
            return True
        if time.monotonic() < self._next_try:
            return False
        assert self.spill_path is not None
        try:
            with open(self.spill_path, "rb") as f:
                data = f.read()
        except OSError as exc:
            self.stats.last_error = f"reading spill file: {exc}"
            return False
        pos = 0
        while pos + _HEADER.size <= len(data):
            magic, kind, length = _HEADER.unpack_from(data, pos)
            end = pos + _HEADER.size + length
            if magic != b"GL" or kind >= len(_KINDS) or end > len(data):
                pos = len(data)  # torn or foreign tail (a crash mid-write): nothing more
                break
            if self._post(data[pos + _HEADER.size:end], _KINDS[kind]) == "retry":
                break
            pos = end
        try:
            if pos >= len(data):
                os.remove(self.spill_path)
                return True
            if pos:
                tmp = self.spill_path + ".tmp"
                with open(tmp, "wb") as f:
                    f.write(data[pos:])
                os.replace(tmp, self.spill_path)
        except OSError as exc:
            self.stats.last_error = f"rewriting spill file: {exc}"
        return False

    def has_spill(self) -> bool:
        """Whether undelivered batches wait in the spill file."""
        return bool(self.spill_path) and os.path.exists(self.spill_path) and \
            os.path.getsize(self.spill_path) > 0

    def close(self) -> None:
        """Close the HTTP connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- internals ----------------------------------------------------------
    def _post(self, body: bytes, content_type: str = JSON) -> str:
        """'ok', 'rejected' (dropped for good) or 'retry' (collector not taking it now)."""
        for fresh in (self._conn is None, True):
            try:
                if self._conn is None:
                    cls = (http.client.HTTPSConnection if self._https
                           else http.client.HTTPConnection)
                    self._conn = cls(self._host, self._port, timeout=self.timeout_s)
                self._conn.request("POST", self._path, body=body,
                                   headers={**self._headers, "Content-Type": content_type})
                resp = self._conn.getresponse()
                payload = resp.read()
                status = resp.status
                break
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if fresh:  # a new connection failed too: the collector is away
                    self._failed(f"collector unreachable: {exc}")
                    return "retry"
                # a kept-alive connection the server had closed: try once on a new one
        if status == 200:
            self._backoff = 0.0
            self._next_try = 0.0
            self.stats.sent_batches += 1
            return "ok"
        reason = payload[:300].decode("utf-8", "replace")
        if status in RETRYABLE:
            self._failed(f"collector answered {status}: {reason}")
            return "retry"
        self.stats.rejected_batches += 1
        self.stats.last_error = f"collector rejected a batch ({status}): {reason}"
        log.warning("goodlens: %s", self.stats.last_error)
        return "rejected"

    def _failed(self, why: str) -> None:
        self.stats.last_error = why
        self._backoff = min(self.backoff_max_s, max(0.25, self._backoff * 2))
        self._next_try = time.monotonic() + self._backoff * random.uniform(0.8, 1.2)

    def _spill(self, body: bytes, rows: int, content_type: str = JSON) -> int:
        if not self.spill_path:
            self.stats.dropped_batches += 1
            return rows
        try:
            size = os.path.getsize(self.spill_path) if os.path.exists(self.spill_path) else 0
            if size + len(body) + _HEADER.size > self.max_spill_bytes:
                raise OSError(f"spill file would exceed {self.max_spill_bytes} bytes")
            with open(self.spill_path, "ab") as f:
                f.write(_HEADER.pack(b"GL", _KINDS.index(content_type), len(body)) + body)
            self.stats.spilled_batches += 1
            return 0
        except OSError as exc:
            self.stats.dropped_batches += 1
            self.stats.last_error = f"could not spill a batch: {exc}"
            log.warning("goodlens: %s; %d rows dropped", self.stats.last_error, rows)
            return rows
