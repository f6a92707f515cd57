"""20,000 generated hostile pushes against a real collector on loopback: never a 5xx, never a
hang, the collector's memory stays bounded, nothing refused reaches the store, every refusal
is counted by reason on /metrics, and a good push afterwards is stored.

The requests come from :func:`tests.integration.test_hostile_ingest.hostile_requests`
(bombs, 64-bit overflow, invalid UTF-8 and offsets, out-of-range instants and durations,
missing, extra and mistyped fields, truncated and bit-flipped Arrow, random bytes), sent over
keep-alive ``http.client`` connections from several threads.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection, RemoteDisconnected
from pathlib import Path

import orjson
import pytest

from goodlens.model.wire import ARROW, JSON
from tests.harness import Collector, http, step_batch
from tests.integration.test_hostile_ingest import bombs, hostile_requests

REQUESTS = 20_000
THREADS = 4
RSS_GROWTH_LIMIT = 300 * 1024 * 1024


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc/<pid>/status."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) * 1024


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


@pytest.mark.slow
def test_twenty_thousand_hostile_pushes(tmp_path: Path) -> None:
    requests = [(c, t, b) for c, t, b in hostile_requests(REQUESTS, seed=2024)]
    heavy = [(label, t, b) for label, t, b in bombs() for _ in range(3)]
    c = Collector(tmp_path / "store.duckdb", "--no-detect").start()
    try:
        pid = c.proc.pid
        baseline = rss_bytes(pid)
        peak = [baseline]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2) and c.proc.poll() is None:
                peak[0] = max(peak[0], rss_bytes(pid))
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        statuses: Counter = Counter()
        inserted = Counter()
        worst: list = []

        def work(part: list) -> None:
            p = Pusher(c.port)
            try:
                for category, ctype, body in part:
                    status, answer = p.post(ctype, body)
                    statuses[status] += 1
                    if status >= 500:
                        worst.append((category, status, answer, body[:200]))
                    elif status == 200:
                        inserted["steps"] += answer["steps_inserted"]
                        inserted["events"] += answer["events_inserted"]
                    else:
                        assert answer.get("error"), (category, status, answer)
            finally:
                p.close()

        t0 = time.monotonic()
        work_items = heavy + requests
        # bombs from one thread, one at a time (what they declare must not be spent; bodies
        # in flight at once cost their size each, which is --max-body's business), while the
        # other threads send the small ones
        parts = [heavy] + [requests[k::THREADS - 1] for k in range(THREADS - 1)]
        try:
            with ThreadPoolExecutor(THREADS) as pool:
                for f in [pool.submit(work, part) for part in parts]:
                    f.result(timeout=600)  # a hang fails here
        finally:
            elapsed = time.monotonic() - t0
            done.set()
        # the HTTP edges: an unknown content type, a body over --max-body
        extra = [http("POST", c.url + "/v1/ingest", b"x", {"Content-Type": "text/plain"})[0],
                 declared_too_large(c.port)]
        sampler.join()
        assert not worst, worst[:5]
        assert extra == [415, 413]
        assert sum(statuses.values()) == len(work_items)
        assert statuses[200] < 0.1 * len(work_items), statuses
        assert peak[0] - baseline <= RSS_GROWTH_LIMIT, (baseline, peak[0])

        # nothing refused was stored: the store holds exactly what was acknowledged
        c.sync()
        text = http("GET", c.url + "/metrics")[1]
        assert _metric(text, "goodlens_ingest_rows_total", table="steps") == inserted["steps"]
        assert _metric(text, "goodlens_ingest_rows_total", table="events") == inserted["events"]
        rejected = {r: _metric(text, "goodlens_ingest_rejected_batches_total", reason=r)
                    for r in ("invalid", "too_large", "decoded_too_large", "write_error")}
        assert rejected["decoded_too_large"] >= len(heavy)
        assert rejected["too_large"] == 1 and rejected["write_error"] == 0
        assert sum(rejected.values()) == len(work_items) + len(extra) - statuses[200]

        # and the collector still works
        status, answer = http("POST", c.url + "/v1/ingest",
                              orjson.dumps(step_batch("good-after", 0, [0, 1, 2])),
                              {"Content-Type": JSON})
        assert status == 200 and answer["steps_inserted"] == 3, answer
        c.sync()
        status, run = http("GET", c.url + "/v1/runs/good-after")
        assert status == 200, run
        print(f"{len(work_items)} hostile pushes in {elapsed:.1f}s "
              f"({len(work_items) / elapsed:.0f}/s), statuses {dict(statuses)}, "
              f"RSS {baseline / 2**20:.0f} -> peak {peak[0] / 2**20:.0f} MiB")
    finally:
        c.stop()


def test_one_bomb_of_each_kind_gets_413(collector: Collector) -> None:
    """The fast tier's check of the bombs over HTTP (the slow test sends them all)."""
    for label, ctype, body in bombs():
        status, answer = http("POST", collector.url + "/v1/ingest", body,
                              {"Content-Type": ctype})
        assert status == 413, (label, answer)
    assert ctype in (ARROW, JSON)
