"""Streaming detection in the collector: findings stored as events, on /metrics, pushed to a
webhook: once when new, then as updates of the same finding (same id), never again by a
restarted or second collector."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest

from goodlens.collector.detection import DetectionService
from goodlens.collector.metrics import make_registry
from goodlens.collector.replay import import_trace
from goodlens.storage.store import Store
from goodlens.storage.writer import Writer
from tests.harness import ROOT, Collector, free_port, http

SAMPLE = ROOT / "sample_data" / "demo"


def test_the_service_flags_the_demo_straggler_once_and_stores_it(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    import_trace(store, SAMPLE)
    writer = Writer(store).start()
    calls = []
    svc = DetectionService(store, writer, callback=lambda run, f: calls.append((run, f)))
    try:
        new = svc.poll_once()
        # rank 5 is slow from step 150; still slow after the restart, it is the same finding:
        # one new report, then updates of it (same id) as its estimate settles
        fs = [f for _, f in new]
        assert [(r, f.subject_kind, f.subject_id, f.attempt) for r, f in new
                if f.status == "new"] == [("demo-8x", "rank", 5, 0)]
        assert {f.id for f in fs} == {fs[0].id} and fs[0].status == "new"
        assert all(f.status == "update" for f in fs[1:]) and any(f.attempt == 1 for f in fs)
        assert 145 <= fs[0].first_step <= 160
        assert svc.poll_once() == []  # nothing new: no second report
        assert len(calls) == len(new)
        writer.sync()
        ev = store.events("demo-8x", kinds=["straggler_flagged"])
        assert len(ev) == len(new) and set(ev["rank"]) == {5} and set(ev.label) == {"rank:5"}
        assert sorted(ev.seq) == list(range(len(new))) and ev.source.nunique() == 1
        assert json.loads(ev.detail.iloc[-1])["action"] == "evict"
        get = make_registry(store, writer, svc).get_sample_value
        assert get("goodlens_run_ranks_flagged", {"run": "demo-8x"}) == 1
        labels = {"run": "demo-8x", "kind": "rank", "subject": "5", "action": "evict"}
        assert 0.05 < get("goodlens_straggler_slowdown_ratio", labels) < 0.15
        # beside it, what rank 5 costs the job's step (the same labels): by the sample's
        # recipe rank 5 is ready at 0.88 s of compute + ~0.01 s of data, the latest of the
        # other 7 at ~1.35 noise units (2% of 0.8 s) over 0.8 s + ~0.01 s, ~0.833 s: the
        # step would end 0.057 s sooner without it, at ~0.983 s with the 0.15 s all-reduce:
        # 0.057 / 0.983 = 0.058
        job = get("goodlens_straggler_job_slowdown_ratio", labels)
        assert 0.045 < job < 0.07
        # the wait so far, as of the sample's last step (599), not of the finding's last
        # emission (step 332 of attempt 1, 18 s: half of it): the sample's generator
        # recorded 38.6 s of straggler wait, all of it rank 5's
        truth = json.loads((SAMPLE / "ground_truth.json").read_text())["truth"]
        waited = get("goodlens_straggler_wait_seconds", {
            "run": "demo-8x", "kind": "rank", "subject": "5"})
        assert waited == pytest.approx(truth["buckets"]["straggler_wait"], rel=0.05)
        assert svc.flagged()["demo-8x"][0].last_step == 599
        # ...and the stored record of the ended run ends there too: what the dashboard's
        # ranks page and the what-if read, the same final state a batch pass reports
        from goodlens.analysis.findings import detect_run, stored_findings
        last = stored_findings(store, "demo-8x")
        batch = detect_run(store, "demo-8x")
        assert [(f["id"], f["last_step"]) for f in last] == [(fs[0].id, 599)]
        assert last[0]["straggler_wait_s"] == pytest.approx(waited, rel=1e-9)
        assert [(f.id, f.last_step) for f in batch] == [(fs[0].id, 599)]
        assert batch[0].straggler_wait_s == pytest.approx(waited, rel=1e-9)
        # a second service (a restarted collector) finds it again but stores nothing new,
        # and pushes nothing (its callback and webhook stay quiet)
        again = []
        second = DetectionService(store, writer, callback=lambda r, f: again.append(f))
        assert len(second.poll_once()) == len(new) and again == []
        writer.sync()
        assert len(store.events("demo-8x", kinds=["straggler_flagged"])) == len(new)
    finally:
        writer.stop()
        store.close()


def test_live_collector_pushes_each_finding_once_to_the_webhook(tmp_path):
    received: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    hook = HTTPServer(("127.0.0.1", free_port()), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    c = Collector(tmp_path / "live.duckdb", "--metrics-retention", "all", "--webhook",
                  f"http://127.0.0.1:{hook.server_port}/evict").start()
    try:
        from goodlens.collector.replay import stream_trace
        stream_trace(SAMPLE, c.url, speed=0)
        # everything stored, then a pass over it: its findings are pushed before the answer
        # (the webhook's POST is made in the pass); two more passes repeat nothing
        for _ in range(3):
            c.sync(detect=True)
        assert received, "no finding pushed after a detection pass over the whole run"
        assert [(r["run"], r["subject_kind"], r["subject_id"], r["attempt"])
                for r in received if r["status"] == "new"] == [("demo-8x", "rank", 5, 0)]
        assert len({r["id"] for r in received}) == 1  # the rest are updates of it
        pushed = len(received)
        _, text = http("GET", c.url + "/metrics")
        assert 'goodlens_straggler_slowdown_ratio{action="evict",kind="rank",run="demo-8x",' \
               'subject="5"}' in text
        # a restarted collector re-reads the run and re-finds rank 5: no second push
        c.stop()
        c = Collector(tmp_path / "live.duckdb", "--metrics-retention", "all", "--webhook",
                      f"http://127.0.0.1:{hook.server_port}/evict").start()
        c.sync(detect=True)  # the restarted collector's pass over the stored run
        c.sync(detect=True)
        _, text = http("GET", c.url + "/metrics")
        assert 'run="demo-8x",subject="5"' in text  # found again (its /metrics series)
        assert len(received) == pushed, received
    finally:
        c.stop()
        hook.shutdown()


def _live_run(writer, run_id, now, last_step_ago, ended=False):
    """40 steps of 4 ranks through the started writer, committed and summarised (a pass of
    the test's own beside the writer's summariser conflicts with it in DuckDB)."""
    from goodlens.model.batch import validate_batch
    steps = list(range(40))
    t0 = now - last_step_ago - 40
    for r in range(4):
        writer.submit(validate_batch({
            "schema_version": 1, "run_id": run_id,
            "steps": {"attempt": 0, "rank": r, "host": "h0", "step": steps,
                      "start_time": [t0 + s for s in steps], "duration_s": 1.0,
                      "compute_s": 0.8, "collective_wait_s": 0.2}}))
    if ended:
        writer.submit(validate_batch({
            "schema_version": 1, "run_id": run_id,
            "events": {"source": "l", "seq": [0], "kind": ["attempt_end"],
                       "time": [now - last_step_ago], "attempt": 0, "cause": ["completed"]}}))
    writer.sync()


def test_a_live_run_that_stops_stepping_is_recorded_as_a_hang_once(tmp_path):
    from goodlens.detectors.hangs import HangConfig
    store = Store(tmp_path / "h.duckdb")
    writer = Writer(store).start()
    now = time.time()
    _live_run(writer, "hung", now, last_step_ago=120)        # silent for 2 minutes
    _live_run(writer, "fine", now, last_step_ago=5)          # still stepping
    _live_run(writer, "done", now, last_step_ago=120, ended=True)  # finished cleanly
    _live_run(writer, "old", now - 10 * 86400, last_step_ago=0)    # a replay of old data
    seen = []
    svc = DetectionService(store, writer, hang_config=HangConfig(min_timeout_s=30.0),
                           callback=lambda run, f: seen.append((run, f.subject_kind)))
    try:
        svc.poll_once(now=now)
        assert seen == [("hung", "job")]
        svc.poll_once(now=now + 1)
        assert seen == [("hung", "job")]  # once
        writer.sync()
        ev = store.events("hung", kinds=["failure_detected"])
        assert list(ev.cause) == ["hang"]
        # recorded at the adaptive timeout after the last step, not at the check
        assert ev.time.iloc[0] < now - 120 + 60
        assert store.attempts("hung").end_reason.iloc[0] == "failed"
        for run in ("fine", "done", "old"):
            assert store.events(run, kinds=["failure_detected"]).empty
    finally:
        writer.stop()
        store.close()


def test_two_collectors_on_one_dataset_push_a_finding_once(tmp_path):
    """Each collector's detector sees the whole Parquet dataset and finds the straggler;
    the second to store it finds its event already there and pushes nothing."""
    from goodlens.storage.parquet import ParquetStore
    a = ParquetStore(tmp_path / "d", writer_id="a")
    import_trace(a, SAMPLE)
    b = ParquetStore(tmp_path / "d", writer_id="b")
    wa, wb = Writer(a).start(), Writer(b).start()
    pushed: list[tuple[str, int]] = []
    try:
        sa = DetectionService(a, wa, callback=lambda r, f: pushed.append(("a", f.subject_id)))
        sb = DetectionService(b, wb, callback=lambda r, f: pushed.append(("b", f.subject_id)))
        n = len(sa.poll_once())
        assert n >= 1 and len(sb.poll_once()) == n  # found by both
        assert pushed == [("a", 5)] * n  # pushed by the first only
        reader = ParquetStore(tmp_path / "d", read_only=True)
        assert len(reader.events("demo-8x", kinds=["straggler_flagged"])) == n
        reader.close()
    finally:
        wa.stop()
        wb.stop()
        a.close()
        b.close()


def test_a_huge_rank_id_does_not_size_the_detector(tmp_path):
    """A push from rank 16,777,215 beside 4 real ranks: the detector (sized by the largest
    rank id) is not built for that run, so memory follows the ranks that exist; a normal
    run in the same store is still watched."""
    store = Store(tmp_path / "h.duckdb")
    writer = Writer(store).start()
    now = time.time()
    try:
        _live_run(writer, "normal", now, last_step_ago=5)
        _live_run(writer, "sparse", now, last_step_ago=5)
        from goodlens.model.batch import validate_batch
        writer.submit(validate_batch({
            "schema_version": 1, "run_id": "sparse",
            "steps": {"attempt": 0, "rank": 16_777_215, "host": "h9", "step": [0, 1],
                      "start_time": [now - 45, now - 44], "duration_s": 1.0,
                      "compute_s": 0.8, "collective_wait_s": 0.2}}))
        writer.sync()
        svc = DetectionService(store, writer)
        svc.poll_once(now=now)
        assert "sparse" not in svc._detectors
        assert svc._detectors["normal"].n == 4
        # the batch pass (goodlens detect, the dashboard) refuses to lay it out, clearly
        from goodlens.analysis.findings import detect_run
        with pytest.raises(ValueError, match="rank ids up to 16777215 for 5 ranks"):
            detect_run(store, "sparse")
        assert detect_run(store, "normal") == []
    finally:
        writer.stop()
        store.close()


def test_old_ended_runs_wait_their_turn_behind_the_budget(tmp_path):
    """At a collector's start every stored run is unread: a pass reads ended runs only
    within its budget (live ones always, first), and the next passes catch up."""
    store = Store(tmp_path / "s.duckdb")
    import_trace(store, SAMPLE)
    assert list(store.runs().state) != ["running"]  # the demo run has ended
    svc = DetectionService(store, None)
    assert svc.poll_once(budget_s=0.0) == []  # no time left for ended runs this pass
    found = svc.poll_once(budget_s=60.0)
    assert [(r, f.subject_kind, f.subject_id) for r, f in found if f.status == "new"] == [
        ("demo-8x", "rank", 5)]
    assert svc.poll_once(budget_s=0.0) == []  # read to its end: not read again


def _lagging_push(writer, run_id, t0, ready, lo, hi, ranks):
    """Rows of steps [lo, hi) for ``ranks`` of a job whose ranks reach the collective at
    ``ready`` (steps x ranks, seconds); every rank's step ends 0.2 s after the slowest.
    Through the started writer, as a collector stores a push (a summarising pass of the
    test's own beside the writer's conflicts with it in DuckDB)."""
    from goodlens.model.batch import validate_batch
    steps = list(range(lo, hi))
    dur = ready[lo:hi].max(axis=1) + 0.2
    start = t0 + np.concatenate([[0.0], np.cumsum(ready.max(axis=1) + 0.2)])[lo:hi]
    for r in ranks:
        writer.submit(validate_batch({
            "schema_version": 1, "run_id": run_id,
            "steps": {"attempt": 0, "rank": r, "host": f"h{r}", "step": steps,
                      "start_time": start.tolist(), "duration_s": dur.tolist(),
                      "compute_s": ready[lo:hi, r].tolist(),
                      "collective_wait_s": (dur - ready[lo:hi, r]).tolist()}}))
    writer.sync()   # committed and summarised


def test_a_rank_whose_pushes_trail_the_others_is_still_scored(tmp_path):
    """Each rank's exporter flushes on its own timer, so at a pass some ranks' newest steps
    are stored and others' are on their way. Here rank 3, 25% slow from step 50, always
    pushes one 10-step round after ranks 0-2: the live service must score its rows when they
    come, and find what the batch pass over the same store finds. (Scoring each step as soon
    as a later one was stored saw rank 3 on one step in ten: it was found 100 steps late.)"""
    from goodlens.analysis.findings import detect_run
    rng = np.random.default_rng(7)
    n_steps = 200
    ready = 0.8 + rng.normal(0.0, 0.008, (n_steps, 4))   # the test's own noise model
    ready[50:, 3] += 0.2
    store = Store(tmp_path / "lag.duckdb")
    writer = Writer(store).start()
    t0 = time.time() - 2 * n_steps
    try:
        svc = DetectionService(store, writer)
        for lo in range(0, n_steps + 10, 10):
            if lo < n_steps:
                _lagging_push(writer, "lag", t0, ready, lo, lo + 10, ranks=[0, 1, 2])
            if lo >= 10:
                _lagging_push(writer, "lag", t0, ready, lo - 10, lo, ranks=[3])
            svc.poll_once(now=t0 + 1.02 * min(lo + 10, n_steps))   # live: no hang
        assert [(f.subject_kind, f.subject_id) for f in svc.findings["lag"].values()] == [
            ("rank", 3)]
        (f,) = svc._detectors["lag"].active()   # its state now, at the last step scored
        # every step scored: that is the last step, and the wait is rank 3's excess over
        # its siblings' median (0.2 s) on each of the ~150 steps since its onset
        assert f.last_step == n_steps - 1 and 45 <= f.first_step <= 52
        excess = ready[f.first_step:, 3] - np.median(ready[f.first_step:, :3], axis=1)
        assert f.straggler_wait_s == pytest.approx(float(excess.sum()), rel=0.02)
        assert 0.22 < f.slowdown < 0.28
        # the same numbers as the batch pass over the stored run
        (batch,) = detect_run(store, "lag")
        assert (batch.first_step, batch.detected_step) == (f.first_step, f.detected_step)
        assert batch.straggler_wait_s == pytest.approx(f.straggler_wait_s, rel=1e-9)
        assert batch.slowdown == pytest.approx(f.slowdown, rel=1e-9)
    finally:
        writer.stop()
        store.close()


def test_a_rank_that_stops_reporting_holds_scoring_back_only_for_the_grace(tmp_path):
    """Rank 3 reports steps 0-19 and then nothing (its exporter broke) while ranks 0-2 go
    on to step 119, rank 2 25% slow throughout: the steps rank 3 never reports are scored
    with it absent once the data is ``late_grace_s`` past them, so rank 2 is found, and the
    steps inside the grace wait. Its hang watch saw every step end at once."""
    rng = np.random.default_rng(11)
    ready = 0.8 + rng.normal(0.0, 0.008, (120, 4))
    ready[:, 2] += 0.2
    step_s = float((ready.max(axis=1) + 0.2).mean())   # ~1.02 s
    store = Store(tmp_path / "gone.duckdb")
    writer = Writer(store).start()
    try:
        _lagging_push(writer, "gone", time.time() - 200, ready, 0, 20, ranks=[0, 1, 2, 3])
        _lagging_push(writer, "gone", time.time() - 200, ready, 20, 120, ranks=[0, 1, 2])
        svc = DetectionService(store, writer, late_grace_s=30.0)
        svc.poll_once()
        assert {f.subject_id for f in svc.findings["gone"].values()} == {2}
        (f,) = svc._detectors["gone"].active()
        # scored through the last step ending more than 30 s before step 119's end
        assert 119 - 30 / step_s - 2 <= f.last_step <= 119 - 30 / step_s
        hd = svc._hangs[("gone", 0)]
        ends = store.steps("gone", step_min=119).eval("start_time + duration_s")
        assert hd.last_report == pytest.approx(float(ends.max()))
    finally:
        writer.stop()
        store.close()


def test_a_run_recorded_as_hung_whose_ranks_go_on_is_still_scored(tmp_path):
    """A pause longer than the hang timeout (a long checkpoint write) is recorded as a hang,
    which ends the attempt: its end, and so the run's last activity, stay where the hang
    was. When the ranks go on in that attempt, their steps are new data all the same: rank
    1, 25% slow from step 60, is found."""
    rng = np.random.default_rng(5)
    ready = 0.8 + rng.normal(0.0, 0.008, (160, 4))
    ready[60:, 1] += 0.2
    store = Store(tmp_path / "paused.duckdb")
    writer = Writer(store).start()
    t0 = time.time() - 400
    try:
        svc = DetectionService(store, writer)
        _lagging_push(writer, "paused", t0, ready, 0, 40, ranks=[0, 1, 2, 3])
        hung = svc.poll_once(now=t0 + 40 + 300)   # 300 s silent: a hang
        assert [f.subject_kind for _, f in hung] == ["job"]
        writer.sync()
        assert store.runs().state.tolist() == ["failed"]
        _lagging_push(writer, "paused", t0, ready, 40, 160, ranks=[0, 1, 2, 3])
        svc.poll_once(now=t0 + 170)
        assert [(f.subject_kind, f.subject_id) for f in svc.findings["paused"].values()] == [
            ("rank", 1)]
        (f,) = svc._detectors["paused"].active()
        assert f.last_step == 159 and 55 <= f.first_step <= 62
    finally:
        writer.stop()
        store.close()
