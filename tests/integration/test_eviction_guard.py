"""The eviction client's guard rails hold whatever the collector says.

Why: automatic eviction acts on a job; a collector bug, a stale finding or a false alarm
must not be able to shrink the job below its minimum, evict more than the cap, act on a
doubtful finding or a node that is not in the world, or act twice on one finding; and a
dry run must act on nothing. The "collector" here is a real loopback HTTP server that
answers ``GET /v1/actions`` with whatever a test scripts (including garbage) and stores
what the exporter pushes to ``/v1/ingest`` (JSON wire), so the recorded events are checked
as the collector would receive them. The history file is shared between clients as it is
between the processes of a restarted job.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from goodlens.exporter import RankExporter
from goodlens.exporter.elastic import EvictionClient, EvictionPolicy
from goodlens.model.schema import SCHEMA_VERSION


class FakeCollector:
    """Scripted ``/v1/actions`` answers; pushed event rows kept in order."""

    def __init__(self) -> None:
        self.answer: tuple[int, bytes] = (200, b'{"evict": []}')
        self.events: list[dict[str, Any]] = []
        self.polls = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                owner.polls += 1
                status, body = owner.answer
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.take(doc.get("events") or {})
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, cols: dict[str, Any]) -> None:
        n = len(cols.get("kind") or [])
        for i in range(n):
            self.events.append({k: (v[i] if isinstance(v, list) else v)
                                for k, v in cols.items()})

    def evicted(self) -> list[tuple[str, str, Any]]:
        """(host, cause, rank) of every rank_evicted event received."""
        return [(e.get("host"), e.get("cause"), e.get("rank")) for e in self.events
                if e.get("kind") == "rank_evicted"]

    def say(self, *findings: dict[str, Any]) -> None:
        self.answer = (200, json.dumps({"evict": list(findings)}).encode())


@pytest.fixture
def fake() -> Iterator[FakeCollector]:
    f = FakeCollector()
    yield f
    f.server.shutdown()
    f.server.server_close()


def finding(fid: str, host: str, confidence: float = 0.95, ranks: list[int] | None = None,
            action: str = "evict") -> dict[str, Any]:
    return {"id": fid, "subject_kind": "host", "subject_id": host, "host": host,
            "ranks": ranks if ranks is not None else [0], "action": action,
            "confidence": confidence, "last_step": 40}


def client(fake: FakeCollector, tmp_path: Path, nodes: list[str], **policy: Any
           ) -> tuple[EvictionClient, RankExporter]:
    exp = RankExporter(run_id="guard", url=fake.url, wire="json", flush_interval_s=0.05,
                       hooks=False, host="node-a")
    pol = EvictionPolicy(**{"mode": "on", "min_confidence": 0.8, "max_per_hour": 1,
                            "min_nodes": 2, **policy})
    return EvictionClient(exp, fake.url, "guard", pol, nodes, tmp_path / "evictions.jsonl",
                          poll_s=0.05), exp


def flushed(exp: RankExporter) -> None:
    assert exp.flush(timeout=10)


def test_never_below_the_minimum_world(fake, tmp_path):
    c, exp = client(fake, tmp_path, ["node-a", "node-b"], min_nodes=2)
    fake.say(finding("f1", "node-b", ranks=[2, 3]))
    d = c.poll_once()
    assert d is not None and d.verdict == "refused:min_nodes"
    assert c.take() is None
    flushed(exp)
    # the refusal is recorded once per rank of the finding, with the finding
    assert fake.evicted() == [("node-b", "refused:min_nodes", 2),
                              ("node-b", "refused:min_nodes", 3)]
    detail = json.loads(next(e for e in fake.events if e["kind"] == "rank_evicted")["detail"])
    assert detail["finding"]["id"] == "f1" and detail["policy"]["min_nodes"] == 2
    # asked again and again, the same finding is decided once
    for _ in range(3):
        assert c.poll_once() is None
    flushed(exp)
    assert len(fake.evicted()) == 2
    exp.close()


def test_a_storm_of_false_evicts_is_capped_across_restarts(fake, tmp_path):
    nodes = ["node-a", "node-b", "node-c", "node-d"]
    c, exp = client(fake, tmp_path, nodes, max_per_hour=1, min_nodes=1)
    fake.say(finding("f1", "node-b"), finding("f2", "node-c"), finding("f3", "node-d"))
    t0 = 1_000_000.0
    d = c.poll_once(now=t0)
    assert d is not None and (d.host, d.verdict) == ("node-b", "evict")
    # one eviction at a time: nothing else is decided until it is taken
    assert c.poll_once(now=t0 + 1) is None
    assert c.take() == d and c.take() is None
    c.poll_once(now=t0 + 2)
    flushed(exp)
    assert [(h, cause) for h, cause, _ in fake.evicted()] == [
        ("node-b", "straggler"), ("node-c", "refused:cap"), ("node-d", "refused:cap")]
    exp.close()
    # the job restarted (a new process, the same history): still capped within the hour
    c2, exp2 = client(fake, tmp_path, ["node-a", "node-c", "node-d", "node-e"],
                      max_per_hour=1, min_nodes=1)
    fake.say(finding("f4", "node-c"))
    assert c2.poll_once(now=t0 + 3599).verdict == "refused:cap"
    fake.say(finding("f5", "node-d"))
    assert c2.poll_once(now=t0 + 3601).verdict == "evict"  # an hour after the first
    assert [p["verdict"] for p in c2.past()] == ["evict", "refused:cap", "refused:cap",
                                                 "refused:cap", "evict"]
    exp2.close()


def test_doubtful_unknown_and_watch_findings_are_refused(fake, tmp_path):
    c, exp = client(fake, tmp_path, ["node-a", "node-b", "node-c"], min_nodes=1)
    fake.say(finding("low", "node-b", confidence=0.5),
             finding("nan", "node-b", confidence=float("nan")),
             finding("stale", "node-z"),
             finding("watch", "node-c", action="watch"))
    c.poll_once()
    flushed(exp)
    assert [(h, cause) for h, cause, _ in fake.evicted()] == [
        ("node-b", "refused:confidence"), ("node-b", "refused:confidence"),
        ("node-z", "refused:not_in_world"), ("node-c", "refused:not_evict")]
    assert c.take() is None
    exp.close()


@pytest.mark.parametrize("status,body", [
    (200, b"not json"), (200, b'{"evict": "node-b"}'), (200, b'[1, 2]'),
    (200, b'{"evict": [1, "x", null, {"id": "no-host"}]}'), (500, b'{"evict": []}'),
    (200, b'{"evict": [{"id": "f", "host": 7, "action": "evict", "confidence": 1}]}'),
])
def test_garbage_answers_decide_nothing(fake, tmp_path, status, body):
    c, exp = client(fake, tmp_path, ["node-a", "node-b", "node-c"], min_nodes=1)
    fake.answer = (status, body)
    assert c.poll_once() is None and c.take() is None
    flushed(exp)
    assert fake.evicted() == []
    exp.close()


def test_dry_run_records_what_it_would_do_and_hands_nothing_over(fake, tmp_path):
    c, exp = client(fake, tmp_path, ["node-a", "node-b", "node-c"], mode="dry_run",
                    min_nodes=1)
    fake.say(finding("f1", "node-b", ranks=[2, 3]))
    c.start()
    deadline = time.monotonic() + 20
    while not c.past() and time.monotonic() < deadline:
        time.sleep(0.05)
    c.stop()
    assert [p["verdict"] for p in c.past()] == ["dry_run"]
    assert c.take() is None
    # the would-be eviction counts against the cap, as a real one would
    fake.say(finding("f2", "node-c", ranks=[4]))
    assert c.poll_once().verdict == "refused:cap"
    assert c.take() is None
    flushed(exp)
    assert fake.evicted() == [("node-b", "dry_run", 2), ("node-b", "dry_run", 3),
                              ("node-c", "refused:cap", 4)]
    exp.close()


def test_off_never_asks(fake, tmp_path):
    c, exp = client(fake, tmp_path, ["node-a", "node-b", "node-c"], mode="off")
    fake.say(finding("f1", "node-b"))
    c.start()
    time.sleep(0.3)
    c.stop()
    assert fake.polls == 0 and c.take() is None
    exp.close()


def test_the_policy_refuses_nonsense():
    for bad in ({"mode": "yes"}, {"min_confidence": 1.5}, {"max_per_hour": -1},
                {"min_nodes": 0}):
        with pytest.raises(ValueError):
            EvictionPolicy(**bad)


# ----------------------------------------------------------------------------- collector side

def _steps(run: str, attempt: int, hosts: list[str], steps: range, t0: float,
           slow: str | None = None, slow_from: int = 0) -> dict[str, Any]:
    """One push of every rank's steps: 100 ms each, 50 ms to reach the all-reduce (100 ms
    on ``slow`` from ``slow_from``), the rest waiting in it."""
    cols: dict[str, list] = {k: [] for k in ("rank", "host", "step", "start_time",
                                             "duration_s", "compute_s", "collective_wait_s")}
    for s in steps:
        for r, h in enumerate(hosts):
            ready = 0.1 if h == slow and s >= slow_from else 0.05
            cols["rank"].append(r)
            cols["host"].append(h)
            cols["step"].append(s)
            cols["start_time"].append(t0 + s * 0.2)
            cols["duration_s"].append(0.2)
            cols["compute_s"].append(ready)
            cols["collective_wait_s"].append(0.2 - ready)
    return {"schema_version": SCHEMA_VERSION, "run_id": run, "steps": {"attempt": attempt,
                                                                        **cols}}


def _event(run: str, seq: int, kind: str, attempt: int, t: float, **fields: Any) -> dict:
    return {"schema_version": SCHEMA_VERSION, "run_id": run, "events": {
        "source": "test", "seq": [seq], "kind": [kind], "time": [t], "attempt": attempt,
        **{k: [v] for k, v in fields.items()}}}


def _asgi_get(app: Any, path: str, query: str) -> tuple[int, dict]:
    """One GET through the collector's ASGI app (its Host guard, its routes)."""
    import asyncio
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: dict) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(),
             "query_string": query.encode(), "headers": [(b"host", b"127.0.0.1")],
             "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
             "root_path": "", "http_version": "1.1", "asgi": {"version": "3.0"}}
    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body)


def test_the_collector_offers_a_confirmed_evict_after_a_failure_and_a_new_world(tmp_path):
    """A failed attempt, then a restart on another world where a host is slow: the live
    detector reads the restarted attempt (a run between attempts reads as failed: it must
    not be dropped for good) with the new world's hosts (ranks 4-5 moved from node-c to
    node-d: the finding names node-d), and ``/v1/actions`` offers it."""
    from goodlens.collector.actions import evictions
    from goodlens.collector.detection import DetectionService
    from goodlens.collector.server import ServerConfig, create_app
    from goodlens.model.batch import validate_batch
    from goodlens.storage.store import Store
    from goodlens.storage.writer import Writer

    store = Store(tmp_path / "s.duckdb")
    writer = Writer(store).start()
    svc = DetectionService(store, writer)
    t0 = time.time() - 600
    first = ["node-a", "node-a", "node-b", "node-b", "node-c", "node-c"]
    second = ["node-a", "node-a", "node-b", "node-b", "node-d", "node-d"]
    try:
        for doc in (_event("r", 0, "attempt_start", 0, t0, world_size=6),
                    _steps("r", 0, first, range(0, 60), t0),
                    _event("r", 1, "failure_detected", 0, t0 + 12.5, cause="exit:1")):
            writer.submit(validate_batch(doc)).result(30)
        writer.sync()
        assert svc.poll_once(now=t0 + 13) == [] and evictions(svc, "r") == []
        assert store.runs().set_index("run_id").state["r"] == "failed"
        for doc in (_event("r", 2, "attempt_start", 1, t0 + 20, world_size=6),
                    _steps("r", 1, second, range(40, 160), t0 + 20, slow="node-d",
                           slow_from=80)):
            writer.submit(validate_batch(doc)).result(30)
        writer.sync()
        svc.poll_once(now=t0 + 60)
        offered = evictions(svc, "r")
        assert [(f["host"], f["subject_kind"], f["ranks"], f["action"], f["attempt"])
                for f in offered] == [("node-d", "host", [4, 5], "evict", 1)]
        assert 0.7 <= offered[0]["confidence"] <= 1.0
        assert 75 <= offered[0]["first_step"] <= 85
        app = create_app(store, writer, ServerConfig(db=str(tmp_path / "s.duckdb")), svc)
        status, body = _asgi_get(app, "/v1/actions", "run=r")
        assert status == 200 and body["detection"] is True
        assert body["evict"] == json.loads(json.dumps(offered))
        assert _asgi_get(app, "/v1/actions", "run=other")[1]["evict"] == []
        assert _asgi_get(app, "/v1/actions", "")[0] == 422
    finally:
        writer.stop()
        store.close()


def test_the_collector_serves_a_findings_state_now_not_at_its_last_emission(fake, tmp_path):
    """node-c takes 100 ms to reach the all-reduce from step 80, its siblings 50 ms: the job
    waits 50 ms a step on it. The detector emits the finding when it crosses the threshold
    (noise-free steps: its CUSUM climbs the most a step may add, 3 noise units, from step
    80; past the threshold of 30 at step 90) and once more, at the next update allowed
    (step 100), when it turns ``evict`` (CUSUM ~60: confidence 1 - 15 / 60 = 0.75); its
    estimate (100% slower) never moves after, but the wait it has cost does: (s - 79) x
    0.05 s through step s, 10% more or over in each 10 steps up to 5 s, so it is reported
    again at steps 110-150 and not yet at 159. ``/v1/actions`` must serve the state now:
    through step 100 the job has waited 21 x 0.05 = 1.05 s on it, through step 159
    80 x 0.05 = 4.0 s (the last report: 3.55 s), and its CUSUM has been at its cap
    (3 thresholds) since step 110: confidence 1 - 0.5 / 3 = 5/6. A job asking for 0.8
    refuses it at step 100 and evicts it once it is offered again: served as of the
    ``evict`` emission, with nothing emitted while the estimate stays, a refusal for
    confidence would be final."""
    from goodlens.collector.actions import evictions
    from goodlens.collector.detection import DetectionService
    from goodlens.model.batch import validate_batch
    from goodlens.storage.store import Store
    from goodlens.storage.writer import Writer

    store = Store(tmp_path / "s.duckdb")
    writer = Writer(store).start()
    svc = DetectionService(store, writer)
    c, exp = client(fake, tmp_path, ["node-a", "node-b", "node-c"], min_nodes=2)
    t0 = time.time() - 600
    hosts = ["node-a", "node-a", "node-b", "node-b", "node-c", "node-c"]
    served, verdicts = [], []
    try:
        writer.submit(validate_batch(_event("r", 0, "attempt_start", 0, t0,
                                            world_size=6))).result(30)
        for lo, hi in ((0, 101), (101, 160)):
            writer.submit(validate_batch(_steps("r", 0, hosts, range(lo, hi), t0,
                                                slow="node-c", slow_from=80))).result(30)
            writer.sync()
            svc.poll_once(now=t0 + 60)
            served.append(evictions(svc, "r"))
            fake.say(*served[-1])
            verdicts.append(getattr(c.poll_once(), "verdict", None))
        ev = store.events("r")
    finally:
        writer.stop()
        store.close()
    assert [[(f["host"], f["action"]) for f in s] for s in served] == [
        [("node-c", "evict")], [("node-c", "evict")]]
    then, now = served[0][0], served[1][0]
    assert then["id"] == now["id"] and (then["last_step"], now["last_step"]) == (100, 159)
    waits = [f["straggler_wait_s"] for f in (then, now)]
    assert waits == [pytest.approx(1.05, abs=0.11), pytest.approx(4.0, abs=0.11)], waits
    assert then["confidence"] == pytest.approx(0.75, abs=0.03)
    assert now["confidence"] == pytest.approx(5 / 6, abs=1e-6)
    assert verdicts == ["refused:confidence", "evict"], (then, now)
    # what was stored is what the detector emitted, no more: a refresh is not an event
    flagged = [json.loads(d) for d in ev[ev.kind == "straggler_flagged"].detail]
    assert [(f["status"], f["action"], f["last_step"]) for f in flagged] == [
        ("new", "watch", 90), ("update", "evict", 100),
        *[("update", "evict", s) for s in (110, 120, 130, 140, 150)]]
    assert flagged[-1]["straggler_wait_s"] == pytest.approx(3.55, abs=0.11)
    # its action and status are those on record: a job acts on a reported evict only
    assert (now["action"], now["status"]) == (flagged[-1]["action"], flagged[-1]["status"])
    # the default policy would act on it too (its minimum was once 0.9: never reached)
    assert now["confidence"] >= EvictionPolicy().min_confidence
    flushed(exp)
    assert [h for h, _, _ in fake.evicted()] == ["node-c"] * 4
    exp.close()


def test_a_doubtful_finding_is_refused_once_and_evicted_once_its_confidence_grows(fake,
                                                                                   tmp_path):
    c, exp = client(fake, tmp_path, ["node-a", "node-b", "node-c"], min_nodes=1)
    fake.say(finding("f1", "node-b", confidence=0.5, ranks=[2]))
    assert c.poll_once().verdict == "refused:confidence"
    # asked again while still doubtful: nothing new is recorded
    fake.say(finding("f1", "node-b", confidence=0.7, ranks=[2]))
    assert c.poll_once() is None and c.take() is None
    # the evidence grew past the minimum (0.8): the same finding is now evicted, once
    fake.say(finding("f1", "node-b", confidence=0.85, ranks=[2]))
    d = c.poll_once()
    assert d is not None and d.verdict == "evict" and c.take() == d
    assert c.poll_once() is None
    flushed(exp)
    assert fake.evicted() == [("node-b", "refused:confidence", 2), ("node-b", "straggler", 2)]
    assert [p["verdict"] for p in c.past()] == ["refused:confidence", "evict"]
    exp.close()
