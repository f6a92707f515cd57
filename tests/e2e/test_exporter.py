"""The per-rank exporter: what it records, that it never blocks or raises, and delivery."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from goodlens.exporter.recorder import ExporterConfig, RankExporter
from goodlens.storage.store import Store
from tests.harness import ROOT, Collector, free_port, http, wait_until


def test_bounded_buffer_drops_oldest_and_counts(tmp_path):
    exp = RankExporter(run_id="b", url="http://127.0.0.1:9", max_buffer_rows=100,
                       spill_dir=None, flush_interval_s=3600)
    for n in range(250):
        with exp.step(n):
            pass
    assert len(exp._steps) == 100  # memory stays bounded
    rows = exp._asm.assemble(list(exp._steps), [], 0.0, 0)
    assert exp._asm.dropped == 150 and rows[0][1] == 150
    exp.close(timeout=0.5)


def test_disabled_exporter_records_nothing_and_starts_no_thread():
    exp = RankExporter(run_id="d", url="http://127.0.0.1:9", enabled=False)
    with exp.step(1), exp.phase("collective"):
        pass
    exp.event("heartbeat")
    exp.count(tokens=5)
    assert exp._thread is None and not exp._steps and not exp._events and not exp._marks
    assert exp.flush() and exp.close()
    assert not RankExporter(run_id="d").enabled  # no URL: nowhere to send


def test_bad_calls_warn_and_never_raise(caplog):
    exp = RankExporter(run_id="w", url="http://127.0.0.1:9", spill_dir=None,
                       flush_interval_s=3600)
    exp.event("no_such_kind")
    exp.event("heartbeat", colour="red")
    with exp.step(1), exp.phase("bogus"):
        pass
    assert not exp._events
    assert "ignoring event" in caplog.text and "unknown phase" in caplog.text
    with pytest.raises(ZeroDivisionError), exp.step(2):
        raise ZeroDivisionError  # the user's exception propagates; the step is not recorded
    assert [r[1] for r in exp._steps] == [1]
    exp.close(timeout=0.5)


def test_config_from_torchrun_environment():
    env = {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "2",
           "TORCHELASTIC_RUN_ID": "job-7", "GOODLENS_URL": "http://c:8470",
           "GOODLENS_TOKEN": "t"}
    cfg = ExporterConfig.from_env(env)
    assert (cfg.rank, cfg.world_size, cfg.local_rank, cfg.attempt, cfg.run_id, cfg.url,
            cfg.token) == (5, 16, 1, 2, "job-7", "http://c:8470", "t")
    assert not ExporterConfig.from_env({"GOODLENS_DISABLED": "1"}).enabled
    assert ExporterConfig.from_env({"GOODLENS_RUN_ID": "x"}, rank=3).rank == 3
    with pytest.raises(ValueError):
        ExporterConfig(run_id="x", flush_interval_s=0)


def _loop(exp, n, work_s=0.002) -> None:
    for i in range(n):
        with exp.step(i):
            end = time.perf_counter() + work_s
            while time.perf_counter() < end:  # busy work, like a GPU launch loop
                pass


@pytest.mark.slow
def test_while_the_collector_is_down_steps_spill_then_everything_is_delivered(tmp_path):
    """Steps recorded while no collector listens are spilled, none dropped, and all arrive
    once it starts. (What they cost the loop meanwhile is a timing, which load moves: not
    asserted here.)"""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    exp = RankExporter(run_id="down", url=url, rank=0, flush_interval_s=0.05, batch_rows=100,
                       spill_dir=str(tmp_path / "spill"), heartbeat_interval_s=0)
    _loop(exp, 1500)
    # the transport spills once its retries give up, however long the loop took
    assert wait_until(lambda: exp.stats["spilled_batches"] > 0, timeout=60), exp.stats
    assert exp.stats["dropped_rows"] == 0
    c = Collector(tmp_path / "late.duckdb")
    c.port, c.url = port, url
    c.start()
    try:
        assert exp.flush(timeout=30)
        c.sync()
        _, body = http("GET", url + "/v1/runs/down")
        assert body["run"]["steps"] == 1500
    finally:
        exp.close()
        c.stop()
    s = Store(tmp_path / "late.duckdb", read_only=True)
    df = s.steps("down")
    s.close()
    assert list(df.step) == list(range(1500))
    assert (df.duration_s >= 0.002).all()


@pytest.mark.slow
def test_sixteen_ranks_exactly_once_through_a_collector_crash(tmp_path):
    """16 exporter processes; the collector is SIGKILLed and restarted mid-run; half the
    ranks send every batch twice; a quarter speak JSON, the rest Arrow. Every step row and
    event must be stored exactly once."""
    steps = 400
    c = Collector(tmp_path / "crash.duckdb").start()
    workers = [subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "e2e" / "rank_worker.py"), c.url, "crash", str(r),
         str(steps), *(["--resend"] if r % 2 else []), *(["--json"] if r % 4 == 3 else [])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(16)]
    try:
        time.sleep(1.0)
        c.kill()  # mid-run, no warning
        time.sleep(1.0)
        c.start()
        outs = [w.communicate(timeout=120) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    stats = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    assert all(s["ok"] and s["dropped_rows"] == 0 and s["rejected_batches"] == 0
               for s in stats), stats
    assert sum(s["spilled_batches"] for s in stats) > 0  # the crash was felt
    c.sync()
    c.stop()
    s = Store(tmp_path / "crash.duckdb", read_only=True)
    try:
        df = s.steps("crash")
        ev = s.events("crash")
        summaries = s.step_summaries("crash")
    finally:
        s.close()
    assert len(df) == 16 * steps
    assert not df.duplicated(["attempt", "rank", "step"]).any()
    assert sorted(df.groupby("rank").step.nunique().tolist()) == [steps] * 16
    assert not ev.duplicated(["source", "seq"]).any()
    assert (ev.kind == "attempt_start").sum() == 16
    assert (ev.kind == "ckpt_save_start").sum() == 16 * (steps // 100)
    assert (summaries.ranks == 16).all() and len(summaries) == steps
    # the phase split was measured and adds up
    assert df.compute_s.notna().all()
    np.testing.assert_allclose(df.compute_s + df.collective_wait_s + df.data_wait_s,
                               df.duration_s, rtol=1e-9, atol=1e-9)


def test_spill_file_survives_a_torn_record_and_mixed_formats(tmp_path):
    from goodlens.exporter.transport import ARROW, JSON, Transport
    spill = tmp_path / "s.bin"
    t = Transport("http://127.0.0.1:9", spill_path=str(spill), timeout_s=0.2)
    assert t.deliver(b'{"a": 1}', 1, JSON) == 0  # collector down: spilled
    t._next_try = 0
    assert t.deliver(b"\x00arrow\nbytes\n", 1, ARROW) == 0
    with open(spill, "ab") as f:
        f.write(b"GL\x00\x00\x00\x10{\"torn")  # a crash mid-write: header says 16 bytes
    sent = []
    t._post = lambda body, ctype: sent.append((body, ctype)) or "ok"
    t._next_try = 0
    assert t.drain_spill()
    assert sent == [(b'{"a": 1}', JSON), (b"\x00arrow\nbytes\n", ARROW)]
    assert not spill.exists()


def test_heartbeats_only_while_no_steps_arrive(collector):
    exp = RankExporter(run_id="hb", url=collector.url, flush_interval_s=0.05,
                       heartbeat_interval_s=0.2)
    end = time.monotonic() + 1.0
    n = 0
    while time.monotonic() < end:  # stepping: steps prove liveness, no heartbeat needed
        with exp.step(n):
            time.sleep(0.01)
        n += 1
    idle_from = time.time()
    time.sleep(1.0)  # idle (a hang, a long save): heartbeats carry the last step
    exp.close()
    collector.stop()
    st = Store(collector.db, read_only=True)
    try:
        hb = st.events("hb", kinds=["heartbeat"])
        steps = st.steps("hb")
    finally:
        st.close()
    assert len(steps) == n
    assert 2 <= len(hb) <= 6  # about one per 0.2 s of the idle second
    assert (hb.time >= idle_from).all() and (hb.step == n - 1).all()


def test_numpy_values_and_torn_spill_tails_lose_nothing(tmp_path):
    import numpy as np

    from goodlens.exporter.transport import Transport
    spill = tmp_path / "spill"
    exp = RankExporter(run_id="np", url="http://127.0.0.1:9", spill_dir=str(spill),
                       flush_interval_s=3600, timeout_s=0.2)
    for n in range(5):
        with exp.step(np.int64(n)):
            pass
    exp.event("ckpt_save_start", step=np.int64(5), bytes=np.int64(10))
    assert not exp.close(timeout=0.5)  # collector down: everything parked in the spill file
    assert exp.stats["dropped_rows"] == 0 and exp.stats["spilled_batches"] >= 1
    path = next(spill.glob("*.jsonl"))
    with open(path, "ab") as f:
        f.write(b"GL\x01\x00\x00\x10\x00torn")  # the process died mid-append
    t = Transport("http://127.0.0.1:9", spill_path=str(path))  # the next process's
    assert t.deliver(b"{}", 1) == 0  # appended after the repaired end, not after the tear
    sent = []
    t._post = lambda body, ctype: sent.append(ctype) or "ok"
    t._next_try = 0
    assert t.drain_spill()
    assert len(sent) >= 2 and sent[-1] == "application/json"


def test_a_refused_batch_counts_its_rows_as_dropped(collector):
    exp = RankExporter(run_id="x" * 300, url=collector.url, flush_interval_s=3600)  # too long
    for n in range(7):
        with exp.step(n):
            pass
    exp.flush(timeout=5)
    assert exp.stats["rejected_batches"] >= 1 and exp.stats["dropped_rows"] == 7
    exp.close(timeout=1)


def test_slow_pushes_do_not_split_into_one_batch_per_step(collector):
    """A push slower than a step must not make the flusher chase the buffer (one tiny batch
    per step): each flush sends what was buffered when it began."""
    exp = RankExporter(run_id="slow", url=collector.url, flush_interval_s=0.2)
    real = exp._transport.deliver
    calls = []

    def slow_deliver(body, rows, ctype):
        calls.append(rows)
        time.sleep(0.05)  # a push takes 50 ms; a step below takes 5 ms
        return real(body, rows, ctype)
    exp._transport.deliver = slow_deliver
    n, end = 0, time.monotonic() + 1.5
    while time.monotonic() < end:
        with exp.step(n):
            time.sleep(0.005)
        n += 1
    exp.close()
    collector.stop()
    st = Store(collector.db, read_only=True)
    try:
        assert len(st.steps("slow")) == n
    finally:
        st.close()
    # about one push per flush interval and push (1.5 s / 0.25 s), not back to back (~30)
    assert len(calls) <= 12, f"{len(calls)} pushes for {n} steps"


def test_new_attempt_before_the_first_send_keeps_earlier_rows_attempt(collector):
    exp = RankExporter(run_id="att", url=collector.url, flush_interval_s=3600, attempt=2)
    for s in range(3):
        with exp.step(s):
            pass
    exp.new_attempt()  # before anything was sent
    for s in range(3, 5):
        with exp.step(s):
            pass
    exp.close()
    collector.stop()
    st = Store(collector.db, read_only=True)
    try:
        got = dict(zip(st.steps("att").step, st.steps("att").attempt))
    finally:
        st.close()
    assert got == {0: 2, 1: 2, 2: 2, 3: 3, 4: 3}


def test_two_live_processes_of_one_rank_never_share_a_spill_file(tmp_path):
    """Two exporters of the same run and rank at once (an elastic double, a restart racing
    its predecessor's exit) spill to separate files; a later process of that rank adopts
    the leftovers of one that died, and everything arrives once."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spill = tmp_path / "spill"
    kw = dict(run_id="twin", url=url, rank=3, flush_interval_s=0.05, spill_dir=str(spill),
              heartbeat_interval_s=0)
    a, b = RankExporter(**kw), RankExporter(**kw)
    for exp, first in ((a, 0), (b, 1000)):
        for s in range(first, first + 200):
            with exp.step(s):
                pass
    assert a.flush(timeout=0.5) is False and b.flush(timeout=0.5) is False  # collector away
    files = sorted(p.name for p in spill.glob("*.jsonl"))
    assert len(files) == 2 and "twin-rank3.jsonl" in files, files
    b_file = next(p for p in spill.glob("twin-rank3-*.jsonl"))
    b.close(timeout=0.2)  # b dies with its batches in its own file (its lock released)
    a.close(timeout=0.2)
    assert b_file.exists()
    c = Collector(tmp_path / "twin.duckdb")
    c.port, c.url = port, url
    c.start()
    try:
        # the next process of rank 3 takes the shared file and adopts b's leftovers
        nxt = RankExporter(**kw)
        assert not b_file.exists()
        assert nxt.flush(timeout=30)
        nxt.close()
        c.sync()
    finally:
        c.stop()
    s = Store(tmp_path / "twin.duckdb", read_only=True)
    try:
        steps = sorted(s.steps("twin").step)
    finally:
        s.close()
    assert steps == list(range(200)) + list(range(1000, 1200))
