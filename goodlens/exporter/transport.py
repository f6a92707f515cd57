"""Delivery of encoded batches from an exporter to the collector, surviving its absence.

The exporter's background thread hands each encoded batch to :class:`Transport.deliver`.
Batches go in order; what cannot go now waits in an append-only spill file
(:mod:`goodlens.exporter.spill`) and is replayed from the start once the collector answers.
Replaying is safe because the store ignores rows it already holds (keys: run, attempt,
rank, step / source, seq). A leftover spill file from an earlier process of the same run
and rank is replayed too, by the same rules. The contract, so that no batch blocks the
ones behind it:

- **200**: delivered.
- **4xx other than 401/403/408/429**: the collector looked at the batch and refused it;
  sending it again would not help. A 413, or a 422 naming a step or event column, splits
  the batch in two and sends each half (so one unstorable row loses only itself); what is
  refused as a whole is dropped, counted (``rejected_batches``, ``rejected_by_status``,
  its rows in ``lost_rows``) and logged (rate-limited), and the next batch goes.
- **500 and other 5xx answers** (the collector is up but could not store this batch):
  retried after a backoff; after ``max_attempts`` such answers the batch is set aside in
  the dead-letter file beside the spill file (``goodlens deadletter`` lists and re-sends
  it), counted, and the next batch goes.
- **No answer, 502/503/504, 408/429, 401/403** (the collector is away, busy, or the token
  is wrong): the batch spills and is retried with exponential backoff; a batch that has
  waited longer than ``max_age_s`` is set aside while the collector stays away.

Nothing here raises into the caller.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import os
import random
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from goodlens.exporter import spill as sp
from goodlens.exporter.spill import Record, claim_spill, whole_records
from goodlens.model.wire import ARROW, JSON

log = logging.getLogger("goodlens.exporter")

RETRY_LATER = {401, 403, 408, 429, 502, 503, 504}
"""Answers meaning "not now" (away, busy, token): bounded by age, not by tries."""
SPLIT = {413, 422}
"""Refusals a smaller batch may escape (too large; one bad value among good rows)."""
LOG_EVERY_S = 60.0

__all__ = ["ARROW", "JSON", "DeliveryStats", "Transport", "claim_spill", "is_loopback",
           "whole_records"]


@dataclass
class DeliveryStats:
    """Counters of what happened to batches (read by the exporter's ``stats``)."""

    sent_batches: int = 0
    rejected_batches: int = 0
    """Batches the collector refused for good (4xx): dropped."""
    rejected_by_status: dict[str, int] = field(default_factory=dict)
    split_batches: int = 0
    """Refused batches split in two to keep their good rows."""
    spilled_batches: int = 0
    dropped_batches: int = 0
    """Batches that could not wait: no spill file, or it is full or unwritable."""
    dead_letter_batches: int = 0
    """Batches set aside after too many failed tries (in the dead-letter file)."""
    dead_letter_rows: int = 0
    lost_rows: int = 0
    """Rows not delivered: refused, dropped, or set aside."""
    last_error: str | None = None


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _counts_try(status: int | None) -> bool:
    """Whether an answer says this batch (not the collector's absence) failed."""
    return status is not None and status >= 500 and status not in RETRY_LATER


class _Throttled:
    """Warnings once per kind, then at most once a minute with the number held back."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warn(self, key: str, message: str) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -LOG_EVERY_S) < LOG_EVERY_S:
            self._held[key] = self._held.get(key, 0) + 1
            return
        held = self._held.pop(key, 0)
        self._last[key] = now
        log.warning("goodlens: %s%s", message,
                    f" ({held} more like it in the last minute)" if held else "")


class Transport:
    """HTTP delivery with backoff, a spill file and a dead-letter file. Used by one thread
    at a time."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 5.0,
                 spill_path: str | None = None, max_spill_bytes: int = 1 << 30,
                 backoff_max_s: float = 30.0, max_attempts: int = 8,
                 max_age_s: float = 86_400.0, source: str | None = None) -> None:
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
        if source and re.fullmatch(r"[A-Za-z0-9._:/@-]{1,80}", source):
            # who this is (run and rank), so the collector can count refusals per source;
            # a name a header cannot carry plainly is not sent
            self._headers["X-Goodlens-Source"] = source
        self.timeout_s = timeout_s
        self.spill_path = spill_path
        self.dead_path = sp.dead_letter_path(spill_path) if spill_path else None
        self.max_spill_bytes = max_spill_bytes
        self.backoff_max_s = backoff_max_s
        self.max_attempts = max(1, max_attempts)
        self.max_age_s = max_age_s
        self._backoff = 0.0
        self._next_try = 0.0
        self._last_status: int | None = None
        self._last_answer = b""
        self._conn: http.client.HTTPConnection | None = None
        self._log = _Throttled()
        self.stats = DeliveryStats()
        self._repair_spill()

    def _repair_spill(self) -> None:
        """Cut a record torn by a crash off an existing spill file, so batches appended
        from now on are not hidden behind it."""
        if not self.spill_path or not os.path.lexists(self.spill_path):
            return
        try:
            data = sp.read_private(self.spill_path)
            pos = whole_records(data)
            if pos < len(data):
                fd = sp.open_private(self.spill_path, os.O_WRONLY)
                try:
                    os.ftruncate(fd, pos)
                finally:
                    os.close(fd)
                log.warning("goodlens: cut %d bytes of a torn record off %s", len(data) - pos,
                            self.spill_path)
        except OSError as exc:
            self.stats.last_error = f"repairing spill file: {exc}"
            log.warning("goodlens: %s", self.stats.last_error)

    # -- public -------------------------------------------------------------
    def deliver(self, body: bytes, rows: int = 0, content_type: str = JSON) -> int:
        """Send one batch now, or spill it behind earlier undelivered ones.

        Returns the number of rows lost meanwhile (also those of replayed batches):
        refused by the collector, set aside, or the spill file full or unwritable.
        """
        before = self.stats.lost_rows
        if self.has_spill():
            self.drain_spill()
        rec = Record(content_type, body, rows)
        if not self.has_spill() and time.monotonic() >= self._next_try:
            left = self._attempt(rec)
        else:
            left = [rec]
        for r in left:
            self._spill(r)
        return self.stats.lost_rows - before

    def drain_spill(self) -> bool:
        """Replay the spill file if the collector is reachable; True when nothing is left."""
        if not self.has_spill():
            return True
        if time.monotonic() < self._next_try:
            return False
        assert self.spill_path is not None
        try:
            data = sp.read_private(self.spill_path)
        except OSError as exc:
            self.stats.last_error = f"reading spill file: {exc}"
            return False
        records, end = sp.parse(data)
        i, kept = 0, []
        while i < len(records) and not kept and time.monotonic() >= self._next_try:
            kept = self._attempt(records[i])
            i += 1
        rest, aged = records[i:], False
        if kept and self._backoff and self.max_age_s:  # away: the too old wait no longer
            now = time.time()
            old = [r for r in rest if r.born and now - r.born >= self.max_age_s]
            for r in old:
                self._set_aside(r, f"waited over {self.max_age_s:g} s: {self.stats.last_error}")
            gone = {id(r) for r in old}
            rest, aged = [r for r in rest if id(r) not in gone], bool(old)
        try:
            if not kept and not rest:
                os.remove(self.spill_path)
                return True
            if i == 1 and len(kept) == 1 and kept[0] is records[0] and kept[0].v2 and not aged:
                sp.update_header(self.spill_path, records[0])  # only its tries changed
            elif aged:
                sp.rewrite(self.spill_path, [r.encode() for r in kept + rest])
            elif i:
                tail = data[rest[0].offset:end] if rest else b""
                sp.rewrite(self.spill_path, [r.encode() for r in kept] + [tail])
        except OSError as exc:
            self.stats.last_error = f"rewriting spill file: {exc}"
        return False

    def has_spill(self) -> bool:
        """Whether undelivered batches wait in the spill file."""
        return bool(self.spill_path) and sp.size_of(self.spill_path) > 0

    def close(self) -> None:
        """Close the HTTP connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the contract ---------------------------------------------------------
    def _attempt(self, rec: Record) -> list[Record]:
        """Send one batch by the module's rules; what must wait for a later try (nothing
        when it was delivered, refused for good or set aside)."""
        outcome = self._post(rec.body, rec.kind)
        if outcome == "ok":
            return []
        status = self._last_status
        if outcome == "rejected":
            parts = self._split(rec, status)
            if not parts:
                self._refuse(rec, status)
                return []
            self.stats.split_batches += 1
            left: list[Record] = []
            for body, rows in parts:
                part = Record(rec.kind, body, rows, rec.tries, rec.born, rec.status)
                left.extend([part] if left else self._attempt(part))
            return left
        now = time.time()
        rec.born = rec.born or now
        rec.status = status or 0
        if _counts_try(status):
            rec.tries += 1
            if rec.tries >= self.max_attempts:
                self._set_aside(rec, f"{rec.tries} tries failed: {self.stats.last_error}")
                self._next_try = 0.0  # the collector answers: the next batch may go now
                return []
        if self.max_age_s and now - rec.born >= self.max_age_s:
            self._set_aside(rec, f"waited over {self.max_age_s:g} s: {self.stats.last_error}")
            return []
        return [rec]

    def _split(self, rec: Record, status: int | None) -> list[tuple[bytes, int]]:
        """The halves of a refused batch worth sending apart, else nothing."""
        if status not in SPLIT or rec.rows == 1:
            return []
        table = None
        if status == 422:
            try:
                where = str(json.loads(self._last_answer).get("field") or "")
            except (ValueError, AttributeError):
                where = ""
            table = where.split(".")[0]
            if table not in ("steps", "events"):
                return []  # about the batch as a whole (run_id, run, exporter): no help
        return sp.split_batch(rec.body, rec.kind, table)

    def _refuse(self, rec: Record, status: int | None) -> None:
        rows = sp.rows_of(rec)
        key = str(status)
        self.stats.rejected_batches += 1
        self.stats.rejected_by_status[key] = self.stats.rejected_by_status.get(key, 0) + 1
        self.stats.lost_rows += rows
        self._log.warn(f"rejected:{key}", f"{self.stats.last_error}; {rows} rows dropped")

    def _set_aside(self, rec: Record, why: str) -> None:
        """Move a batch that failed too often to the dead-letter file (or drop it)."""
        rows = sp.rows_of(rec)
        rec.note = why
        self.stats.lost_rows += rows
        try:
            if not self.dead_path:
                raise OSError("no spill directory")
            if sp.size_of(self.dead_path) + len(rec.body) > self.max_spill_bytes:
                raise OSError(f"dead-letter file would exceed {self.max_spill_bytes} bytes")
            sp.append(self.dead_path, rec.encode(), lock=True)
        except OSError as exc:
            self.stats.dropped_batches += 1
            self._log.warn("dead", f"could not set a failing batch aside ({exc}); {rows} rows "
                           f"dropped: {why}")
            return
        self.stats.dead_letter_batches += 1
        self.stats.dead_letter_rows += rows
        self._log.warn("dead", f"set a batch of {rows} rows aside in {self.dead_path} ({why}); "
                       "see `goodlens deadletter list`")

    def _spill(self, rec: Record) -> None:
        if not self.spill_path:
            self.stats.dropped_batches += 1
            self.stats.lost_rows += rec.rows
            return
        try:
            data = rec.encode()
            if sp.size_of(self.spill_path) + len(data) > self.max_spill_bytes:
                raise OSError(f"spill file would exceed {self.max_spill_bytes} bytes")
            sp.append(self.spill_path, data)
            self.stats.spilled_batches += 1
        except OSError as exc:
            self.stats.dropped_batches += 1
            self.stats.lost_rows += rec.rows
            self.stats.last_error = f"could not spill a batch: {exc}"
            self._log.warn("spill", f"{self.stats.last_error}; {rec.rows} rows dropped")

    # -- HTTP -----------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self.timeout_s)

    def _post(self, body: bytes, content_type: str = JSON) -> str:
        """'ok', 'rejected' (refused for good: 4xx) or 'retry' (see ``_last_status``:
        None when nothing answered)."""
        self._last_status = None
        for fresh in (self._conn is None, True):
            try:
                if self._conn is None:
                    self._conn = self._connection()
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
        self._last_status, self._last_answer = status, payload[:2000]
        if status == 200:
            self._backoff = 0.0
            self._next_try = 0.0
            self.stats.sent_batches += 1
            return "ok"
        reason = payload[:300].decode("utf-8", "replace")
        if status in RETRY_LATER or status >= 500:
            self._failed(f"collector answered {status}: {reason}")
            return "retry"
        self.stats.last_error = f"collector refused a batch ({status}): {reason}"
        return "rejected"

    def _failed(self, why: str) -> None:
        self.stats.last_error = why
        self._backoff = min(self.backoff_max_s, max(0.25, self._backoff * 2))
        self._next_try = time.monotonic() + self._backoff * random.uniform(0.8, 1.2)
