"""The per-host relay: merged pushes arrive exactly once, acknowledged only after the
collector acknowledged them, bad pushes refused alone, and exporters find it by themselves."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from goodlens.collector.relay import merge_batches
from goodlens.exporter.private import relay_socket
from goodlens.exporter.recorder import RankExporter
from goodlens.exporter.relay_client import HostRelayTransport, relay_health
from goodlens.model.batch import decode_batch
from goodlens.model.batch_arrow import decode_arrow_batch
from goodlens.model.wire import ARROW as ARROW
from goodlens.model.wire import encode_arrow_batch, encode_batch
from goodlens.storage.store import Store
from tests.harness import GOODLENS, ROOT, Collector, Relay, free_port, http, step_batch

T0 = 1_767_225_600.0
RANKS = 8


def ingest_batches(url: str) -> float:
    """Batches the collector committed (``goodlens_ingest_batches_total`` on /metrics)."""
    status, text = http("GET", url + "/metrics")
    assert status == 200
    for line in text.splitlines():
        if line.startswith("goodlens_ingest_batches_total"):
            return float(line.split()[-1])
    raise AssertionError("no goodlens_ingest_batches_total on /metrics")


def drive(exp: RankExporter, rank: int, flush_s: float = 5.0) -> None:
    """The same deterministic run for every exporter of a rank: two attempts, a checkpoint,
    a failure, explicit times (so the data, and the report, depend on nothing else)."""
    if rank == 0:
        exp.event("attempt_start", time_s=T0, world_size=RANKS)
    for s in range(200):
        coll = 0.10 + 0.01 * rank
        exp.record_step(s, T0 + 10 + s, 0.95 + 0.001 * rank, compute_s=0.80 + 0.001 * rank,
                        collective_wait_s=coll, data_wait_s=0.05 - 0.01 * rank / RANKS,
                        tokens=4096)
        if s % 25 == 24:
            time.sleep(0.05)  # training takes time: the exporters push as it goes
        if rank == 0 and s == 100:
            exp.event("ckpt_save_start", time_s=T0 + 110.2, step=100, tier="durable")
            exp.event("ckpt_save_blocking_end", time_s=T0 + 112.0, step=100, tier="durable")
    if rank == 0:
        exp.event("failure_detected", time_s=T0 + 230.0, cause="hang")
    exp.flush(timeout=flush_s)  # (the exporter stamps rows not yet assembled with the new attempt)
    exp.new_attempt(1)
    if rank == 0:
        exp.event("attempt_start", time_s=T0 + 300.0, world_size=RANKS)
    for s in range(100, 250):
        exp.record_step(s, T0 + 310 + s, 0.95, compute_s=0.8, collective_wait_s=0.1,
                        data_wait_s=0.05, tokens=4096)
        if s % 25 == 24:
            time.sleep(0.05)
    if rank == 0:
        exp.event("attempt_end", time_s=T0 + 600.0, cause="completed")


def run_ranks(url: str, run_id: str) -> list[dict]:
    """RANKS exporter threads of one run, each pushing its rows in batches of 50."""
    stats: list[dict] = [{} for _ in range(RANKS)]
    started = threading.Barrier(RANKS)

    def rank(r: int) -> None:
        exp = RankExporter(run_id=run_id, url=url, rank=r, world_size=RANKS, host=f"n{r // 4}",
                           flush_interval_s=0.05, batch_rows=50, heartbeat_interval_s=0)
        started.wait(30)  # the ranks of a job start together (init_process_group)
        drive(exp, r)
        ok = exp.close(timeout=60)
        stats[r] = {"ok": ok, **exp.stats}
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return stats


def assert_same(a, b, path="report"):
    """Equal nested JSON, floats to 1e-9 (summation order may differ)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-9), \
            (path, a, b)
    else:
        assert a == b, (path, a, b)


def stored(c: Collector, run_id: str):
    st = Store(c.db, read_only=True)
    try:
        return st.steps(run_id), st.events(run_id)
    finally:
        st.close()


# ----------------------------------------------------------------------------- merging


def test_merged_batch_decodes_to_the_pushes_concatenated():
    a = decode_batch(encode_batch({**step_batch("m", 0, [1, 2]), "run": {"world_size": 8,
                                                                        "name": None},
                                   "events": {"source": "s0", "seq": [0], "kind": ["heartbeat"],
                                              "time": [T0], "attempt": 0, "step": [2]},
                                   "exporter": {"source": "s0", "dropped_rows": 3}}))
    b = decode_arrow_batch(encode_arrow_batch(
        {**step_batch("m", 1, [1, 2, 3]), "run": {"name": "job", "world_size": None},
         "events": {"source": "s1", "seq": [0, 1], "kind": ["ckpt_save_start", "heartbeat"],
                    "time": [T0 + 1, T0 + 2.5], "attempt": 0, "tier": ["durable", None]}}))
    merged = decode_arrow_batch(merge_batches("m", [a, b], {"source": "relay", "dropped_rows": 3}))
    assert merged.run_id == "m" and merged.run == {"world_size": 8, "name": "job"}
    assert merged.steps.equals(pa.concat_tables([a.steps, b.steps]))
    assert merged.events.equals(pa.concat_tables([a.events, b.events]))
    assert merged.exporter == {"source": "relay", "dropped_rows": 3}


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_eight_ranks_through_one_relay_arrive_once_in_far_fewer_requests(tmp_path):
    # no detector: its findings are batches too (these ranks differ by 1% per rank in their
    # time to reach the collective, which it rightly reports), and only pushes are counted
    via = Collector(tmp_path / "via.duckdb", "--no-detect").start()
    direct = Collector(tmp_path / "direct.duckdb", "--no-detect").start()
    relay = Relay(tmp_path, via.url).start()
    try:
        relayed = run_ranks(relay.url, "r")
        straight = run_ranks(direct.url, "r")
        for s in relayed + straight:
            assert s["ok"] and s["dropped_rows"] == 0 and s["rejected_batches"] == 0, s
            assert s["spilled_batches"] == 0, s
        health = relay.health()
        pushes = sum(s["sent_batches"] for s in relayed)
        assert health["pushes"] == health["acked"] == pushes >= RANKS * 8
        assert health["upstream_errors"] == health["failed"] == health["singles"] == 0
        via.sync()
        direct.sync()
        requests_via, requests_direct = ingest_batches(via.url), ingest_batches(direct.url)
        assert requests_via == health["forwarded"]
        assert requests_direct == sum(s["sent_batches"] for s in straight)
        # the collector behind the relay saw at least 3x fewer requests (about 6x here)
        assert requests_via * 3 <= pushes, (requests_via, pushes)
        assert requests_via * 3 <= requests_direct, (requests_via, requests_direct)
        rep_via = http("GET", via.url + "/v1/report?run=r")
        rep_direct = http("GET", direct.url + "/v1/report?run=r")
        assert rep_via[0] == rep_direct[0] == 200
        assert_same(rep_via[1], rep_direct[1])
    finally:
        relay.stop()
        via.stop()
        direct.stop()
    (sv, ev), (sd, ed) = stored(via, "r"), stored(direct, "r")
    keys = ["attempt", "rank", "step"]
    assert len(sv) == RANKS * 350 and not sv.duplicated(keys).any()
    sv = sv.sort_values(keys).reset_index(drop=True)
    sd = sd.sort_values(keys).reset_index(drop=True)
    assert sv.equals(sd)  # every row exactly once, and exactly the rows sent directly
    assert not ev.duplicated(["source", "seq"]).any()
    assert sorted(ev.kind) == sorted(ed.kind) and len(ev) == 6


@pytest.mark.slow
def test_upstream_down_the_exporter_spills_and_everything_arrives_once_later(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    relay = Relay(tmp_path, url).start()
    c = Collector(tmp_path / "late.duckdb")
    c.port, c.url = port, url
    try:
        status, body = http("POST", relay.url + "/v1/ingest",
                            encode_batch(step_batch("down", 9, [0])))
        assert status == 503 and "unreachable" in body["error"]
        exp = RankExporter(run_id="down", url=relay.url, rank=0, flush_interval_s=0.05,
                           batch_rows=30, heartbeat_interval_s=0, timeout_s=2.0)
        exp._transport.backoff_max_s = 0.5  # retry often: keeps the test short
        drive(exp, 0, flush_s=0.2)
        assert not exp.flush(timeout=1.0)  # nothing acknowledged while the collector is away
        assert exp.stats["spilled_batches"] > 0 and exp.stats["dropped_rows"] == 0
        health = relay.health()
        assert health["acked"] == 0 and health["upstream_errors"] > 0
        c.start()
        assert exp.flush(timeout=30)
        assert exp.close(timeout=10)
        assert exp.stats["dropped_rows"] == 0
        c.sync()
    finally:
        relay.stop()
        c.stop()
    steps, events = stored(c, "down")
    assert len(steps) == 350 and not steps.duplicated(["attempt", "rank", "step"]).any()
    assert len(events) == 6 and not events.duplicated(["source", "seq"]).any()
    assert "9" not in set(steps["rank"].astype(str))  # the push answered 503 was not stored


def test_a_bad_push_gets_the_collectors_answer_and_a_good_one_beside_it_is_stored(
        collector, tmp_path):
    relay = Relay(tmp_path, collector.url, "--window", "500ms").start()
    try:
        bad_doc = step_batch("mix", 1, [0, 1])
        bad_doc["steps"]["duration_s"] = [1.0, -2.0]
        bad = encode_batch(bad_doc)
        good = encode_batch(step_batch("mix", 0, [0, 1, 2]))
        answers: dict = {}
        t = threading.Thread(target=lambda: answers.update(
            good=http("POST", relay.url + "/v1/ingest", good)))
        t.start()
        time.sleep(0.1)  # inside the good push's window
        via = http("POST", relay.url + "/v1/ingest", bad)
        t.join(30)
        direct = http("POST", collector.url + "/v1/ingest", bad)
        assert via == direct and via[0] == 422 and via[1]["field"] == "steps.duration_s"
        assert answers["good"][0] == 200 and answers["good"][1]["steps"] == 3
        assert answers["good"][1]["upstream"]["steps_inserted"] == 3
        for body, ctype in ((b"\x00not arrow", ARROW), (b"{", "application/json"),
                            (b"{}", "text/plain")):
            via = http("POST", relay.url + "/v1/ingest", body, {"Content-Type": ctype})
            assert via == http("POST", collector.url + "/v1/ingest", body,
                               {"Content-Type": ctype})
            assert via[0] in (400, 415)
        health = relay.health()
        assert health["rejected"] == 4 and health["acked"] == 1 and health["forwarded"] == 1
        collector.sync()
        _, run = http("GET", collector.url + "/v1/runs/mix")
        assert run["run"]["steps"] == 3
    finally:
        relay.stop()


def test_relay_token_is_required_and_sent_upstream(tmp_path):
    c = Collector(tmp_path / "tok.duckdb", "--token", "sesame").start()
    relay = Relay(tmp_path, c.url, "--token", "sesame").start()
    passthrough = Relay(tmp_path, c.url).start()
    try:
        body = encode_batch(step_batch("tok", 0, [0]))
        assert http("POST", relay.url + "/v1/ingest", body)[0] == 401
        assert http("POST", relay.url + "/v1/ingest", body,
                    {"Content-Type": "application/json",
                     "Authorization": "Bearer nope"})[0] == 403
        auth = {"Content-Type": "application/json", "Authorization": "Bearer sesame"}
        assert http("POST", relay.url + "/v1/ingest", body, auth)[0] == 200
        # without --token the pusher's own header goes upstream, and so does the refusal
        status, answer = http("POST", passthrough.url + "/v1/ingest",
                              encode_batch(step_batch("tok", 1, [0])))
        assert status == 401 and answer["field"] == "authorization"
        assert http("POST", passthrough.url + "/v1/ingest",
                    encode_batch(step_batch("tok", 1, [0])), auth)[0] == 200
    finally:
        relay.stop()
        passthrough.stop()
        c.stop()


@pytest.mark.slow
def test_goodlens_relay_env_starts_the_relay_on_local_rank_0_and_others_use_it(
        collector, tmp_path, monkeypatch):
    port = free_port()
    for var, value in (("GOODLENS_URL", collector.url), ("GOODLENS_RELAY", "1"),
                       ("GOODLENS_RELAY_PORT", str(port)), ("GOODLENS_RUN_ID", "auto"),
                       ("WORLD_SIZE", "2")):
        monkeypatch.setenv(var, value)
    pid = None
    try:
        exps = []
        for rank in (0, 1):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("LOCAL_RANK", str(rank))
            exps.append(RankExporter.from_env(flush_interval_s=0.05, heartbeat_interval_s=0))
            if rank == 0:
                health = relay_health(port)  # on this user's Unix socket for the port
                assert health is not None and health["upstream"] == collector.url
                pid = health["pid"]
                assert pid != os.getpid()
                assert (os.stat(relay_socket(port)).st_mode & 0o777) == 0o600
        for exp in exps:
            assert isinstance(exp._transport, HostRelayTransport)
            for s in range(20):
                exp.record_step(s, T0 + s, 1.0)
        assert all(exp.flush(timeout=20) for exp in exps)
        assert all(exp._transport.via_relay is True for exp in exps)
        health = relay_health(port)
        assert health["acked"] >= 2 and health["push_rows"] >= 40
        # the relay goes away mid-run: the ranks send straight to the collector
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while relay_health(port, 0.2) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        for s in range(20, 30):
            exps[1].record_step(s, T0 + s, 1.0)
        assert exps[1].close(timeout=20) and exps[0].close(timeout=20)
        assert exps[1]._transport.via_relay is False
        assert exps[1].stats["dropped_rows"] == 0
        collector.sync()
        _, run = http("GET", collector.url + "/v1/runs/auto")
        assert run["run"]["steps"] == 30
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        sock = relay_socket(port)  # the relay listened there, logged beside it
        for leftover in (sock, sock + ".lock", sock.removesuffix(".sock") + ".log"):
            Path(leftover).unlink(missing_ok=True)
    collector.stop()
    steps, _ = stored(collector, "auto")
    assert sorted(steps.groupby("rank").step.count()) == [20, 30]


def test_without_a_relay_a_non_zero_local_rank_sends_directly(collector, monkeypatch):
    port = free_port()  # nothing listens there and local rank 1 starts nothing
    exp = RankExporter(run_id="solo", url=collector.url, rank=1, local_rank=1, host_relay=True,
                       relay_port=port, flush_interval_s=0.05, heartbeat_interval_s=0)
    for s in range(5):
        exp.record_step(s, T0 + s, 1.0)
    assert exp.close(timeout=10)
    assert exp._transport.via_relay is False and relay_health(port, 0.2) is None
    collector.sync()
    _, run = http("GET", collector.url + "/v1/runs/solo")
    assert run["run"]["steps"] == 5


def test_healthz_counts_and_json_cli_output(collector, tmp_path):
    port = free_port()
    proc = subprocess.Popen([*GOODLENS, "relay", "--upstream", collector.url, "--port",
                             str(port), "--window", "0", "--json"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(proc.stdout.readline())
        assert first["port"] == port and first["upstream"] == collector.url
        body = encode_arrow_batch(step_batch("h", 0, [0, 1]))
        assert http("POST", f"http://127.0.0.1:{port}/v1/ingest", body,
                    {"Content-Type": ARROW})[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    last = orjson.loads(out.strip().splitlines()[-1])
    assert (last["pushes"], last["forwarded"], last["forwarded_rows"], last["rejected"]) == \
        (1, 1, 2, 0)
