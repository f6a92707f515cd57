"""The collector service: acknowledgement, refusals, tokens (its ASGI app in this process,
:class:`~tests.harness.AppCollector`), and a real ``goodlens serve`` process's start and
stop: the loopback-only bind, SIGTERM's clean exit with everything stored."""

from __future__ import annotations

import orjson
import pytest

from goodlens.cli.common import ByteSize
from goodlens.storage.store import Store
from tests.harness import AppCollector, Collector, step_batch


def push(c: AppCollector | Collector, doc, headers=None):
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return c.http("POST", "/v1/ingest", body, headers)


def stored_steps(c: AppCollector) -> int:
    status, body = c.http("GET", "/v1/runs")
    assert status == 200
    return sum(r["steps"] for r in body["runs"])


def test_good_batch_is_acknowledged_with_counts(app_collector):
    status, body = push(app_collector, step_batch("r1", 0, [0, 1, 2]))
    assert status == 200
    assert body == {"ok": True, "steps_inserted": 3, "steps_duplicate": 0,
                    "events_inserted": 0, "events_duplicate": 0}
    status, body = push(app_collector, step_batch("r1", 0, [0, 1, 2]))
    assert body["steps_inserted"] == 0 and body["steps_duplicate"] == 3


@pytest.mark.parametrize("body, status, field", [
    (b"this is not json", 400, None),
    (orjson.dumps({**step_batch("r1", 0, [5]), "steps": {**step_batch("r1", 0, [5])["steps"],
                                                          "rank": "x"}}), 422, "steps.rank"),
    (orjson.dumps({k: v for k, v in step_batch("r1", 0, [5]).items() if k != "run_id"}), 422,
     "run_id"),
    (orjson.dumps({**step_batch("r1", 0, [5]), "steps": {**step_batch("r1", 0, [5])["steps"],
                                                          "duration_s": "slow"}}), 422,
     "steps.duration_s"),
])
def test_malformed_pushes_get_4xx_with_reason_and_change_nothing(app_collector, body, status,
                                                                field):
    assert push(app_collector, step_batch("r1", 0, [0, 1]))[0] == 200
    got, reply = push(app_collector, body)
    assert got == status
    assert reply["field"] == field and reply["error"]
    # the stream goes on: a good batch after the bad one is stored
    assert push(app_collector, step_batch("r1", 0, [2, 3]))[0] == 200
    app_collector.sync()
    assert stored_steps(app_collector) == 4


def test_wrong_content_type_is_415(app_collector):
    status, reply = push(app_collector, orjson.dumps(step_batch("r", 0, [1])),
                             {"Content-Type": "text/plain"})
    assert status == 415 and reply["field"] == "content-type"


def test_oversized_push_is_413_and_changes_nothing(tmp_path):
    # --max-body 2KiB, as `goodlens serve` reads it
    c = AppCollector(tmp_path / "small.duckdb", max_body_bytes=ByteSize().convert("2KiB", None,
                                                                                  None))
    try:
        big = step_batch("r", 0, list(range(200)))
        status, reply = push(c, big)
        assert status == 413 and "larger than 2048 bytes" in reply["error"]
        assert push(c, step_batch("r", 0, [1]))[0] == 200
        c.sync()
        assert stored_steps(c) == 1
    finally:
        c.stop()


def test_token_is_required_and_checked(tmp_path):
    c = AppCollector(tmp_path / "tok.duckdb", token="s3cret")
    try:
        doc = step_batch("r", 0, [1])
        status, reply = push(c, doc)
        assert status == 401 and "missing token" in reply["error"]
        status, reply = push(c, doc, {"Authorization": "Bearer nope",
                                      "Content-Type": "application/json"})
        assert status == 403 and reply["error"] == "wrong token"
        assert c.http("GET", "/v1/runs")[0] == 401
        ok = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
        assert push(c, doc, ok)[0] == 200
        assert c.http("GET", "/v1/runs", headers=ok)[1]["runs"][0]["run_id"] == "r"
        assert c.http("GET", "/healthz")[0] == 200  # health stays open
    finally:
        c.stop()


def test_binding_beyond_loopback_without_token_is_refused(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "goodlens", "serve", "--db",
                          str(tmp_path / "x.duckdb"), "--host", "0.0.0.0", "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--token" in out.stderr


def test_run_endpoint_and_unknown_run(app_collector):
    push(app_collector, step_batch("r9", 0, [0, 1]))
    app_collector.sync()
    status, body = app_collector.http("GET", "/v1/runs/r9")
    assert status == 200 and body["run"]["steps"] == 2 and body["attempts"][0]["attempt"] == 0
    status, body = app_collector.http("GET", "/v1/runs/nope")
    assert status == 404 and "/v1/runs" in body["error"]


def test_graceful_stop_keeps_everything_and_file_reopens(tmp_path):
    c = Collector(tmp_path / "g.duckdb").start()
    for r in range(4):
        assert push(c, step_batch("g", r, list(range(50))))[0] == 200
    c.stop()  # SIGTERM right after the last push
    assert c.proc.returncode == 0  # a clean exit, not death by signal
    wal = tmp_path / "g.duckdb.wal"
    assert not wal.exists() or wal.stat().st_size == 0  # the store was closed (checkpointed)
    s = Store(tmp_path / "g.duckdb", read_only=True)
    try:
        assert s.row_counts()["steps"] == 200
        assert s.row_counts()["step_summaries"] == 50  # summarised on the way out
    finally:
        s.close()


def test_arrow_pushes_are_stored_like_json_ones(app_collector):
    from goodlens.model.wire import ARROW as CONTENT_TYPE
    from goodlens.model.wire import encode_arrow_batch
    body = encode_arrow_batch(step_batch("a", 0, [0, 1, 2]))
    status, reply = push(app_collector, body, {"Content-Type": CONTENT_TYPE})
    assert status == 200 and reply["steps_inserted"] == 3
    status, reply = push(app_collector, b"garbage", {"Content-Type": CONTENT_TYPE})
    assert status == 400 and "Arrow IPC" in reply["error"]
    assert push(app_collector, step_batch("a", 1, [0, 1, 2]))[0] == 200  # JSON beside it
    app_collector.sync()
    assert stored_steps(app_collector) == 3  # 3 steps, each with 2 ranks


def test_a_stopped_collector_exits_cleanly(tmp_path):
    """SIGTERM: exit status 0 and nothing alarming in the log (a serve loop that left the
    server task's SystemExit unretrieved printed a traceback at every stop)."""
    c = Collector(tmp_path / "s.duckdb").start()
    c.stop()
    assert c.proc.returncode == 0
    log = c.log.read_text()
    assert "Traceback" not in log and "never retrieved" not in log, log
