"""Generated hostile pushes against a real collector on loopback: never a 5xx, never a hang,
the collector's memory stays bounded under the bombs, an unknown content type gets 415 and a
body declared over ``--max-body`` 413 before it is read, nothing refused reaches the store,
every refusal is counted by reason on /metrics, and a good push afterwards is stored.

The requests come from :func:`tests.integration.test_hostile_ingest.hostile_requests`
(bombs, 64-bit overflow, invalid UTF-8 and offsets, out-of-range instants and durations,
missing, extra and mistyped fields, truncated and bit-flipped Arrow, random bytes), sent over
keep-alive ``http.client`` connections from several threads. The real server is the point
(its connections, its memory, its counters); 2,000 requests and every bomb make each of
those claims. The same generator's 20,000 are a recorded run (``hostile``,
``tests/record/elastic.py``): what that collector stored, answered and counted is checked,
and its good rows replayed in-process, by ``tests/integration/test_recorded_hostile.py``.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.client import HTTPConnection, RemoteDisconnected
from pathlib import Path

import orjson
import pytest

from goodlens.model.wire import ARROW, JSON
from tests.harness import Collector, http, step_batch
from tests.integration.test_hostile_ingest import bombs, hostile_requests

REQUESTS = 2_000
SEED = 2024
BOMB_REPEATS = 3
THREADS = 4
RSS_GROWTH_LIMIT = 300 * 1024 * 1024
"""Most the collector's resident memory's high-water mark may rise over the pushes."""


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident memory of a process, from /proc/<pid>/status: now (``VmRSS``) or its
    high-water mark (``VmHWM``, the kernel's exact peak: no sampling can miss it)."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+) kB", text).group(1)) * 1024


class Pusher:
    """One keep-alive connection; a request the server closed the connection on is sent
    again once on a fresh one (a 413 may close it before the body was read)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: HTTPConnection | None = None

    def post(self, ctype: str, body: bytes) -> tuple[int, dict]:
        for attempt in range(2):
            if self.conn is None:
                self.conn = HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                self.conn.request("POST", "/v1/ingest", body, {"Content-Type": ctype})
                resp = self.conn.getresponse()
                raw = resp.read()
                if resp.will_close:
                    self.close()
                return resp.status, (json.loads(raw) if raw else {})
            except (ConnectionError, RemoteDisconnected, BrokenPipeError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def declared_too_large(port: int) -> int:
    """The status answered to a push declaring a body over --max-body (none is sent)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 999999999\r\n\r\n")
        return int(s.recv(100).split(b" ")[1])


def _metric(text: str, name: str, **labels: str) -> float:
    sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}{{{re.escape(sel)}}} (\S+)$" if sel else rf"^{name} (\S+)$",
                  text, re.M)
    return float(m.group(1)) if m else 0.0


@dataclass
class Pushed:
    """What a collector answered to a series of pushes, and its memory meanwhile."""

    statuses: Counter = field(default_factory=Counter)
    inserted: Counter = field(default_factory=Counter)
    """Rows the collector acknowledged inserting (``steps``, ``events``)."""
    worst: list = field(default_factory=list)
    """(category, status, answer, body's start) of every 5xx."""
    baseline: int = 0
    """The collector's resident memory before the pushes."""
    peak: int = 0
    """Its resident memory's high-water mark after them."""
    elapsed: float = 0.0
    sent: int = 0


def push_hostile(c: Collector, heavy: list, requests: list, threads: int = THREADS) -> Pushed:
    """Send ``heavy`` (the bombs, one at a time from one thread: what they declare must not
    be spent; bodies in flight at once cost their size each, which is --max-body's
    business) while ``threads - 1`` threads send ``requests``, over keep-alive
    connections; read the collector's resident memory before and its high-water mark
    after. A hang fails here."""
    out = Pushed(sent=len(heavy) + len(requests))
    pid = c.proc.pid
    out.baseline = rss_bytes(pid)

    def work(part: list) -> None:
        p = Pusher(c.port)
        try:
            for category, ctype, body in part:
                status, answer = p.post(ctype, body)
                out.statuses[status] += 1
                if status >= 500:
                    out.worst.append((category, status, answer, body[:200]))
                elif status == 200:
                    out.inserted["steps"] += answer["steps_inserted"]
                    out.inserted["events"] += answer["events_inserted"]
                else:
                    assert answer.get("error"), (category, status, answer)
        finally:
            p.close()

    t0 = time.monotonic()
    parts = [heavy] + [requests[k::threads - 1] for k in range(threads - 1)]
    try:
        with ThreadPoolExecutor(threads) as pool:
            for f in [pool.submit(work, part) for part in parts]:
                f.result(timeout=600)
    finally:
        out.elapsed = time.monotonic() - t0
    out.peak = rss_bytes(pid, "VmHWM")
    return out


def bomb_rounds(repeats: int) -> list[tuple[str, str, bytes]]:
    """Every bomb once per round, ``repeats`` rounds. The order matters to the memory the
    collector keeps (freed bodies stay in the allocator's heap): the same bomb several
    times in a row raises the high-water mark over :data:`RSS_GROWTH_LIMIT`, rounds
    level off under it."""
    return [b for _ in range(repeats) for b in bombs()]


def rejected_by_reason(text: str) -> dict[str, float]:
    """``goodlens_ingest_rejected_batches_total`` of ``/metrics``, by reason."""
    return {r: _metric(text, "goodlens_ingest_rejected_batches_total", reason=r)
            for r in ("invalid", "too_large", "decoded_too_large", "write_error")}


@pytest.mark.slow
def test_hostile_pushes_to_a_real_collector(tmp_path: Path) -> None:
    """The real server's part: its HTTP edges, its memory under the bombs, and its books.
    The 20,000 pushes' run (``python -m tests.record hostile``) is recorded and checked in
    ``tests/integration/test_recorded_hostile.py``."""
    requests = list(hostile_requests(REQUESTS, seed=SEED))
    heavy = bomb_rounds(BOMB_REPEATS)
    c = Collector(tmp_path / "store.duckdb", "--no-detect").start()
    try:
        got = push_hostile(c, heavy, requests)
        # the HTTP edges: an unknown content type, a body over --max-body
        extra = [http("POST", c.url + "/v1/ingest", b"x", {"Content-Type": "text/plain"})[0],
                 declared_too_large(c.port)]
        assert not got.worst, got.worst[:5]
        assert extra == [415, 413]
        assert sum(got.statuses.values()) == got.sent
        assert got.statuses[200] < 0.1 * got.sent, got.statuses
        assert got.peak - got.baseline <= RSS_GROWTH_LIMIT, (got.baseline, got.peak)

        # nothing refused was stored: the store holds exactly what was acknowledged
        c.sync()
        text = http("GET", c.url + "/metrics")[1]
        assert _metric(text, "goodlens_ingest_rows_total", table="steps") == got.inserted["steps"]
        assert _metric(text, "goodlens_ingest_rows_total", table="events") == \
            got.inserted["events"]
        rejected = rejected_by_reason(text)
        assert rejected["decoded_too_large"] >= len(heavy)
        assert rejected["too_large"] == 1 and rejected["write_error"] == 0
        assert sum(rejected.values()) == got.sent + len(extra) - got.statuses[200]

        # and the collector still works
        status, answer = http("POST", c.url + "/v1/ingest",
                              orjson.dumps(step_batch("good-after", 0, [0, 1, 2])),
                              {"Content-Type": JSON})
        assert status == 200 and answer["steps_inserted"] == 3, answer
        c.sync()
        status, run = http("GET", c.url + "/v1/runs/good-after")
        assert status == 200, run
        print(f"{got.sent} hostile pushes in {got.elapsed:.1f}s "
              f"({got.sent / got.elapsed:.0f}/s), statuses {dict(got.statuses)}, "
              f"RSS {got.baseline / 2**20:.0f} -> peak {got.peak / 2**20:.0f} MiB")
        assert c.stop() == 0   # a clean end: SIGTERM drains the writer and closes the store
    finally:
        c.stop()


def test_one_bomb_of_each_kind_gets_413(collector: Collector) -> None:
    """The fast tier's check of the bombs over HTTP (the slow test sends them all)."""
    for label, ctype, body in bombs():
        status, answer = http("POST", collector.url + "/v1/ingest", body,
                              {"Content-Type": ctype})
        assert status == 413, (label, answer)
    assert ctype in (ARROW, JSON)
