"""The delivery contract: no batch blocks the ones behind it, nothing is lost uncounted, and
an exporter's files and token reach only its own user.

- a refused batch (4xx) is split until only the unstorable row is dropped, and counted;
- a batch the collector cannot store (5xx) is retried a bounded number of times, then set
  aside in a dead-letter file that ``goodlens deadletter`` lists and re-sends;
- the same rules hold for a spill file a new process adopts;
- the spill directory is private (a planted symlink is not followed) and the host relay
  is found through a Unix socket of the user's own, never by asking a TCP port.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pytest

from goodlens.exporter.recorder import RankExporter
from goodlens.exporter.spill import dead_letter_files
from goodlens.model.wire import ARROW, META_KEY, encode_batch
from goodlens.storage.store import Store
from tests.harness import GOODLENS, ROOT, Collector, Relay, free_port, http, step_batch

T0 = 1_767_225_600.0


class FakeServer:
    """A loopback HTTP server in a thread: ``answer(method, path, headers, body)`` gives
    (status, JSON body); every request is recorded."""

    def __init__(self, answer) -> None:
        self.requests: list[tuple[str, str, dict, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                outer.requests.append((self.command, self.path, headers, body))
                status, obj = answer(self.command, self.path, headers, body)
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _serve

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def rejected_invalid(c: Collector) -> float:
    status, text = http("GET", c.url + "/metrics")
    assert status == 200
    for line in text.splitlines():
        if line.startswith('goodlens_ingest_rejected_batches_total{reason="invalid"}'):
            return float(line.split()[-1])
    raise AssertionError("no invalid rejections counter on /metrics")


def stored_steps(c: Collector, run: str) -> int:
    c.sync()
    status, body = http("GET", f"{c.url}/v1/runs/{run}")
    return body["run"]["steps"] if status == 200 else 0


def record(exp: RankExporter, steps: range, bad: int | None = None) -> None:
    for s in steps:
        exp.record_step(s, T0 + s, -1.0 if s == bad else 0.5, compute_s=0.4,
                        collective_wait_s=0.05, data_wait_s=0.05, tokens=1024)


# ----------------------------------------------------------------------------- refused rows


def test_one_unstorable_row_among_4000_steps_loses_only_itself(collector):
    exp = RankExporter(run_id="one-bad", url=collector.url, flush_interval_s=0.05,
                       batch_rows=1000, heartbeat_interval_s=0)
    before = rejected_invalid(collector)
    record(exp, range(4000), bad=1234)
    assert exp.close(timeout=60)
    s = exp.stats
    assert s["dropped_rows"] == 1 and s["rejected_batches"] == 1, s
    assert s["rejected_by_status"] == {"422": 1} and s["split_batches"] >= 1, s
    assert s["dead_letter_batches"] == 0 and not s["spill_waiting"], s
    assert stored_steps(collector, "one-bad") == 3999
    assert rejected_invalid(collector) - before >= 1  # the collector counted it too
    _, text = http("GET", collector.url + "/metrics")  # ...and knows whose it was
    assert 'goodlens_ingest_rejected_source_batches_total{reason="invalid",' \
           'source="one-bad/rank-0"}' in text
    _, body = http("GET", collector.url + "/v1/runs/one-bad")
    assert body["run"]["steps"] == 3999


@pytest.mark.slow
def test_one_bad_rank_through_a_relay_fails_only_its_own_row(tmp_path, collector):
    relay = Relay(tmp_path, collector.url, "--window", "200ms").start()
    stats: dict[int, dict] = {}
    try:
        def rank(r: int) -> None:
            exp = RankExporter(run_id="relay-bad", url=relay.url, rank=r, world_size=8,
                               flush_interval_s=0.05, batch_rows=100, heartbeat_interval_s=0)
            for chunk in range(5):
                record(exp, range(chunk * 100, chunk * 100 + 100),
                       bad=250 if r == 3 else None)
                time.sleep(0.05)
            exp.close(timeout=60)
            stats[r] = exp.stats
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        health = relay.health()
    finally:
        relay.stop()
    assert stats[3]["dropped_rows"] == 1 and stats[3]["rejected_batches"] == 1, stats[3]
    for r in set(range(8)) - {3}:
        assert stats[r]["dropped_rows"] == 0 and stats[r]["rejected_batches"] == 0, stats[r]
    collector.stop()
    st = Store(collector.db, read_only=True)
    try:
        steps = st.steps("relay-bad")
    finally:
        st.close()
    assert len(steps) == 8 * 500 - 1 and not steps.duplicated(["rank", "step"]).any()
    assert 250 not in set(steps[steps["rank"] == 3].step)
    # refused by the relay's own check or by the collector behind it: counted there
    assert health["rejected"] + sum(health["upstream_rejected"].values()) >= 1, health
    assert health["failed"] == 0, health


def test_a_merged_batch_the_collector_cannot_store_fails_only_the_bad_rank(tmp_path):
    """The collector answers 500 to any batch holding rank 3's rows: the relay forwards the
    merged batch's pushes one by one, so the other 7 ranks are stored at once."""
    def answer(method, path, headers, body):
        if method == "GET":
            return 200, {"status": "ok"}
        table = pa.ipc.open_stream(pa.py_buffer(body)).read_all() \
            if headers.get("content-type") == ARROW else None
        ranks = set(table.column("rank").to_pylist()) if table is not None else set()
        if table is None:
            ranks = {json.loads(body)["steps"]["rank"]}
        return (500, {"error": "cannot store", "field": None}) if 3 in ranks else \
            (200, {"ok": True})
    up = FakeServer(answer)
    relay = Relay(tmp_path, up.url, "--window", "1s").start()
    try:
        results: dict[int, int] = {}

        def push(r: int) -> None:
            results[r] = http("POST", relay.url + "/v1/ingest",
                              encode_batch(step_batch("m500", r, [0, 1])))[0]
        threads = [threading.Thread(target=push, args=(r,)) for r in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        health = relay.health()
    finally:
        relay.stop()
        up.close()
    assert results == {r: 500 if r == 3 else 200 for r in range(8)}, results
    assert health["acked"] == 7 and health["upstream_rejected"].get("500", 0) >= 1, health


# ----------------------------------------------------------------------------- 5xx, dead letters


@pytest.mark.slow
def test_a_batch_that_keeps_failing_is_set_aside_and_deadletter_resends_it(tmp_path):
    """A collector that answers 500 for one batch: it is tried 3 times, set aside, and the
    batches behind it are delivered; `goodlens deadletter` lists it and re-sends it to a
    collector that stores it."""
    def answer(method, path, headers, body):
        if b"poison" in body:
            return 500, {"error": "batch could not be stored", "field": None}
        return 200, {"ok": True}
    up = FakeServer(answer)
    spill = tmp_path / "spill"
    exp = RankExporter(run_id="dl", url=up.url, spill_dir=str(spill), flush_interval_s=0.05,
                       heartbeat_interval_s=0, retry_attempts=3)
    exp._transport.backoff_max_s = 0.2
    record(exp, range(0, 50))
    exp.event("failure_detected", time_s=T0 + 60, cause="poison")
    assert exp.flush(timeout=30)  # the poisoned batch is set aside after 3 tries
    record(exp, range(50, 100))
    assert exp.close(timeout=30)
    up.close()
    s = exp.stats
    assert s["dead_letter_batches"] >= 1 and s["dead_letter_rows"] >= 1, s
    assert s["rejected_batches"] == 0 and not s["spill_waiting"], s
    poisoned = [r for r in up.requests if b"poison" in r[3]]
    assert len(poisoned) == 3
    delivered_after = [r for r in up.requests if r[0] == "POST" and b"poison" not in r[3]]
    assert delivered_after  # the batches behind it went

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*GOODLENS, "deadletter", *args, "--dir", str(spill)], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    listed = json.loads(cli("list", "--json").stdout)
    assert len(listed) == 1 and listed[0]["rows"] == s["dead_letter_rows"], listed
    assert listed[0]["statuses"] == [500] and "3 tries" in listed[0]["last_reason"]
    shown = json.loads(cli("show").stdout)
    assert shown[0]["run_id"] == "dl" and shown[0]["tries"] == 3
    assert "--url" in cli("resend", "--help").stdout
    c = Collector(tmp_path / "back.duckdb").start()
    try:
        out = cli("resend", "--url", c.url, "--json")
        assert out.returncode == 0, out.stderr
        counts = json.loads(out.stdout)
        assert counts["delivered_rows"] == s["dead_letter_rows"] and counts["kept_batches"] == 0
        c.sync()
        _, ev = http("GET", c.url + "/v1/runs/dl")
        assert ev["run"]["steps"] == s["dead_letter_rows"] - 1  # the event is the extra row
    finally:
        c.stop()
    assert json.loads(cli("list", "--json").stdout) == []
    assert not dead_letter_files(str(spill))


def test_a_poisoned_spill_file_adopted_by_a_new_process_does_not_block_it(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spill = tmp_path / "spill"
    kw = dict(run_id="adopt", url=url, rank=2, spill_dir=str(spill), flush_interval_s=0.05,
              heartbeat_interval_s=0, timeout_s=0.5)
    first = RankExporter(**kw, batch_rows=100)
    record(first, range(0, 300), bad=150)  # collector away: all of it spills, bad row too
    assert not first.close(timeout=0.5)
    path = spill / "adopt-rank2.jsonl"
    # a leftover of the first spill format at its head: one batch with one bad row
    head = encode_batch({**step_batch("adopt", 2, [1000, 1001]),
                         "steps": {**step_batch("adopt", 2, [1000, 1001])["steps"],
                                   "duration_s": [1.0, -5.0]}})
    path.write_bytes(b"GL\x00" + len(head).to_bytes(4, "big") + head + path.read_bytes())
    c = Collector(tmp_path / "adopt.duckdb")
    c.port, c.url = port, url
    c.start()
    try:
        nxt = RankExporter(**kw)
        record(nxt, range(300, 400))
        assert nxt.close(timeout=60)
        assert nxt.stats["dropped_rows"] == 2 and nxt.stats["rejected_batches"] == 2
        assert stored_steps(c, "adopt") == 400 - 1 + 1  # 1000 stored, 150 and 1001 refused
    finally:
        c.stop()
    assert not path.exists()


# ----------------------------------------------------------------------------- private files


@pytest.fixture
def shared_tmp(tmp_path, monkeypatch):
    """A fresh shared temporary folder and home, and no GOODLENS_SPILL_DIR: the defaults."""
    shared, home = tmp_path / "shared", tmp_path / "home"
    shared.mkdir(mode=0o777)
    home.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.setenv("HOME", str(home))
    for var in ("GOODLENS_SPILL_DIR", "XDG_RUNTIME_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    return shared, home


def test_a_planted_symlink_at_the_spill_path_is_not_followed(tmp_path, shared_tmp):
    shared, home = shared_tmp
    victim_dir = tmp_path / "victim"
    (victim_dir / "spill").mkdir(parents=True)
    victim = victim_dir / "spill" / "sym-rank0.jsonl"
    victim.write_bytes(b"precious\n")
    (shared / f"goodlens-{os.geteuid()}").symlink_to(victim_dir)  # planted by another user
    exp = RankExporter(run_id="sym", url="http://127.0.0.1:9", flush_interval_s=3600,
                       timeout_s=0.2)
    record(exp, range(10))
    assert not exp.close(timeout=0.5)
    assert victim.read_bytes() == b"precious\n" and sorted(os.listdir(victim_dir / "spill")) == \
        ["sym-rank0.jsonl"]
    spilled = home / ".cache" / "goodlens" / "spill" / "sym-rank0.jsonl"
    assert exp._transport.spill_path == str(spilled) and spilled.stat().st_size > 0
    assert (spilled.parent.stat().st_mode & 0o777) == 0o700
    assert (spilled.stat().st_mode & 0o777) == 0o600
    # a symlink inside a directory of one's own is not followed either
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (mine / "sym-rank0.jsonl").symlink_to(victim)
    exp = RankExporter(run_id="sym", url="http://127.0.0.1:9", flush_interval_s=3600,
                       timeout_s=0.2, spill_dir=str(mine))
    record(exp, range(10))
    assert not exp.close(timeout=0.5)
    assert victim.read_bytes() == b"precious\n"
    assert exp._transport.spill_path != str(mine / "sym-rank0.jsonl")
    assert exp.stats["spilled_batches"] >= 1 and exp.stats["dropped_rows"] == 0


def test_a_spill_directory_of_someone_else_or_open_to_others_is_not_used(shared_tmp):
    shared, home = shared_tmp
    first = shared / f"goodlens-{os.geteuid()}"
    first.mkdir(mode=0o777)
    os.chmod(first, 0o777)
    exp = RankExporter(run_id="own", url="http://127.0.0.1:9", flush_interval_s=3600)
    assert exp._transport.spill_path.startswith(str(first))
    assert (first.stat().st_mode & 0o777) == 0o700  # ours: made private again
    exp.close(timeout=0.2)
    if os.geteuid() != 0:
        pytest.skip("handing a directory to another user needs root")
    os.chown(first, 12345, 12345)  # another user made it first: not used, not a blocker
    exp = RankExporter(run_id="own", url="http://127.0.0.1:9", flush_interval_s=3600)
    assert exp._transport.spill_path.startswith(str(home / ".cache" / "goodlens" / "spill"))
    exp.close(timeout=0.2)
    os.chown(first, 0, 0)


def test_a_fake_relay_on_the_port_never_gets_the_token(tmp_path, shared_tmp):
    c = Collector(tmp_path / "tok.duckdb", "--token", "sesame").start()
    fake = FakeServer(lambda m, p, h, b: (200, {"status": "ok", "relay": True,
                                               "upstream": c.url}))
    try:
        exp = RankExporter(run_id="fake", url=c.url, token="sesame", rank=1, local_rank=1,
                           host_relay=True, relay_port=fake.port, flush_interval_s=0.05,
                           heartbeat_interval_s=0)
        record(exp, range(20))
        assert exp.close(timeout=20)
        assert exp._transport.via_relay is False
        assert exp._transport.socket_path.startswith(str(shared_tmp[0]))
    finally:
        fake.close()
        c.stop()
    st = Store(c.db, read_only=True)
    try:
        assert len(st.steps("fake")) == 20  # sent straight to the collector, with the token
    finally:
        st.close()
    assert not any("authorization" in r[2] for r in fake.requests), fake.requests
    assert not any(r[0] == "POST" for r in fake.requests)


def test_arrow_metadata_survives_splitting():
    from goodlens.exporter.spill import split_batch
    from goodlens.model.wire import encode_arrow_batch
    doc = {**step_batch("sp", 0, [0, 1, 2, 3]), "run": {"world_size": 8},
           "exporter": {"source": "s", "dropped_rows": 0},
           "events": {"source": "s", "seq": [0, 1], "kind": ["heartbeat", "heartbeat"],
                      "time": [T0, T0 + 1], "attempt": 0}}
    parts = split_batch(encode_arrow_batch(doc), ARROW, "steps")
    assert [rows for _, rows in parts] == [4, 2]
    halves = split_batch(parts[0][0], ARROW)
    assert [rows for _, rows in halves] == [2, 2]
    meta = json.loads(pa.ipc.open_stream(pa.py_buffer(halves[1][0])).read_all()
                      .schema.metadata[META_KEY])
    assert meta["run"] == {"world_size": 8} and meta["run_id"] == "sp"
    assert split_batch(encode_batch(step_batch("sp", 0, [0])), "application/json") == []


def test_default_spill_directory_is_private(shared_tmp):
    exp = RankExporter(run_id="p", url="http://127.0.0.1:9", flush_interval_s=3600)
    folder = Path(exp._transport.spill_path).parent
    assert folder == shared_tmp[0] / f"goodlens-{os.geteuid()}" / "spill"
    assert (folder.stat().st_mode & 0o777) == 0o700
    assert (folder.parent.stat().st_mode & 0o777) == 0o700
    exp.close(timeout=0.2)
