"""The collector's read path: /metrics by Prometheus's conventions with every series the
example alerting rules read (a real collector, fed by a live replay), the runs list paged and
sorted by the server and a finished run's report served as it was stored when the run ended
(its app in this process), and ``goodlens runs`` over a store and over ``--url``."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from goodlens.collector.replay import stream_trace
from tests.harness import GOODLENS, ROOT, AppCollector, Collector, http, wait_until
from tests.integration.test_prometheus_rules import EXPORTED_METRICS


def _push(c: AppCollector | Collector, doc: dict) -> None:
    status, body = c.http("POST", "/v1/ingest", json.dumps(doc).encode())
    assert status == 200, body


def _live_run(c: AppCollector | Collector, run: str, t0: float, steps: int = 5) -> None:
    """A run in progress: attempt 0 started at t0, 4 ranks, ``steps`` steps of 1 s."""
    _push(c, {"schema_version": 1, "run_id": run, "run": {"world_size": 4},
              "events": {"source": "launcher", "seq": [0], "kind": ["attempt_start"],
                         "time": [t0], "attempt": 0}})
    for rank in range(4):
        _push(c, {"schema_version": 1, "run_id": run, "steps": {
            "attempt": 0, "rank": rank, "host": "h0", "step": list(range(steps)),
            "start_time": [t0 + 1 + s for s in range(steps)], "duration_s": [1.0] * steps,
            "compute_s": [0.9] * steps, "collective_wait_s": [0.1] * steps}})


def _scrape(c: Collector) -> tuple[dict, dict]:
    status, text = http("GET", c.url + "/metrics")
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in fams.values() for s in f.samples}
    return fams, samples


@pytest.mark.slow
def test_metrics_follow_the_conventions_and_carry_what_the_rules_read(tmp_path):
    c = Collector(tmp_path / "m.duckdb", "--metrics-retention", "all").start()
    try:
        stream_trace(ROOT / "sample_data" / "demo", c.url, speed=0)  # rank 5 slow: evict
        now = time.time()
        _live_run(c, "live", now - 10)
        c.sync()
        assert wait_until(lambda: ("goodlens_straggler_onset_timestamp_seconds", (
            ("kind", "rank"), ("run", "demo-8x"), ("subject", "5"))) in _scrape(c)[1], 60)
        fams, samples = _scrape(c)
        get = lambda name, **labels: samples.get((name, tuple(sorted(labels.items()))))  # noqa: E731
        names = {s[0] for s in samples}
        for name in EXPORTED_METRICS:  # every series the rules file reads is there
            if name.startswith("goodlens_node_"):  # hosts to drain only: none here, but
                assert name in fams, name        # the family is declared
                continue
            assert name in names, name
        for f in fams.values():
            if f.type == "counter":
                assert all(s.name.endswith(("_total", "_created")) for s in f.samples), f.name
            if f.type != "summary":
                assert all("quantile" not in s.labels for s in f.samples), f.name
        assert fams["goodlens_run_step_duration_seconds"].type == "summary"
        # states: one 1 per run, the rest 0
        assert get("goodlens_run_state", run="live", state="running") == 1
        assert get("goodlens_run_state", run="demo-8x", state="completed") == 1
        assert sum(v for (n, lab), v in samples.items()
                   if n == "goodlens_run_state" and ("run", "live") in lab) == 1
        assert get("goodlens_run_hang_timeout_seconds", run="live") == 60.0  # the floor
        assert get("goodlens_run_hang_timeout_seconds", run="demo-8x") is None  # ended
        assert get("goodlens_run_last_activity_timestamp_seconds", run="live") == \
            pytest.approx(now - 10 + 1 + 5)  # the end of step 4
        # 5 steps of 1 s: the summary's sum and count; every bucket, productive included,
        # sums to the wall-clock
        assert get("goodlens_run_step_duration_seconds_count", run="live") == 5
        assert get("goodlens_run_step_duration_seconds_sum", run="live") == pytest.approx(5.0)
        for run in ("live", "demo-8x"):
            buckets = [v for (n, lab), v in samples.items()
                       if n == "goodlens_run_time_seconds" and ("run", run) in lab]
            assert sum(buckets) == pytest.approx(get("goodlens_run_wall_clock_seconds",
                                                     run=run), rel=1e-9)
        assert get("goodlens_run_time_seconds", run="live", bucket="productive") == \
            pytest.approx(5.0)
        # the demo's restart is a failure; its finding's onset is inside the run
        assert get("goodlens_run_failures_total", run="demo-8x") == 1
        assert get("goodlens_run_hangs_total", run="demo-8x") == 0
        demo_last = get("goodlens_run_last_activity_timestamp_seconds", run="demo-8x")
        onset = get("goodlens_straggler_onset_timestamp_seconds", run="demo-8x", kind="rank",
                    subject="5")
        assert get("goodlens_run_start_timestamp_seconds", run="demo-8x") < onset < demo_last
        assert get("goodlens_exporter_dropped_rows_total") == 0
    finally:
        c.stop()


def test_the_runs_list_is_paged_sorted_and_filtered_by_the_server(app_collector):
    # recent data: the runs must still be running when filtered by state below. Steps that
    # ended ~96 s ago are past the collector's 60 s hang floor, so its next detection pass
    # (every 2 s) records them as hung and they read `failed`, and under load that pass
    # can come before the query
    t0 = time.time() - 10
    for i, run in enumerate(["run-c", "run-a", "job-b"]):
        _live_run(app_collector, run, t0 + i, steps=2 + i)
    app_collector.sync()
    status, body = app_collector.http("GET", "/v1/runs?limit=2&sort=run&order=asc")
    assert status == 200
    assert [r["run_id"] for r in body["runs"]] == ["job-b", "run-a"]
    assert (body["total"], body["next_offset"], body["limit"]) == (3, 2, 2)
    _, body = app_collector.http("GET", "/v1/runs?limit=2&offset=2&sort=run&order=asc")
    assert [r["run_id"] for r in body["runs"]] == ["run-c"] and body["next_offset"] is None
    _, body = app_collector.http("GET", "/v1/runs?sort=steps")  # 4, 3, 2 steps
    assert [r["run_id"] for r in body["runs"]] == ["job-b", "run-a", "run-c"]
    assert [r["steps"] for r in body["runs"]] == [4, 3, 2]
    _, body = app_collector.http("GET", "/v1/runs?q=RUN-&state=running")
    assert sorted(r["run_id"] for r in body["runs"]) == ["run-a", "run-c"]
    assert all(r["goodput"] is not None for r in body["runs"])  # accounted as rows came
    for query, field in (("sort=bogus", "sort"), ("limit=-1", "limit"), ("order=up", "order"),
                         ("limit=10001", "limit")):
        status, body = app_collector.http("GET", "/v1/runs?" + query)
        assert status == 422 and body["field"] == field, query


def test_a_finished_runs_report_is_served_as_stored_when_it_ended(app_collector):
    t0 = 2_000_000.0
    _live_run(app_collector, "done", t0, steps=8)
    _push(app_collector, {"schema_version": 1, "run_id": "done", "events": {
        "source": "launcher", "seq": [1], "kind": ["attempt_end"], "time": [t0 + 11],
        "attempt": 0, "cause": ["completed"]}})
    app_collector.sync()
    _, first = app_collector.http("GET", "/v1/report?run=done")
    time.sleep(1.2)
    _, again = app_collector.http("GET", "/v1/report?run=done")
    _, fresh = app_collector.http("GET", "/v1/report?run=done&fresh=1")
    # 8 steps of 1 s from t0 + 1, completed at t0 + 11: the same numbers stored and fresh
    assert first["computed_at"] == again["computed_at"]  # not recomputed
    assert "computed_at" not in fresh
    for rep in (first, fresh):
        assert rep["wall_clock_s"] == pytest.approx(11.0)
        assert rep["buckets"]["productive"] == pytest.approx(8.0)
        assert rep["in_progress"] is False


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*GOODLENS, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_goodlens_runs_pages_and_sorts_by_goodput_with_or_without_a_collector(tmp_path,
                                                                             collector):
    db = str(tmp_path / "imported.duckdb")
    for sample in ("demo", "sim-16"):
        assert _cli("import", str(ROOT / "sample_data" / sample), "--db", db).returncode == 0
    docs = [json.loads((ROOT / "sample_data" / s / "ground_truth.json").read_text())
            for s in ("demo", "sim-16")]
    truth = {d["run_id"]: d["truth"]["goodput"] for d in docs}  # the generators' own
    # no collector ever accounted these runs: the command does, for the order
    out = _cli("runs", "--db", db, "--sort", "goodput", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [r["run_id"] for r in doc["runs"]] == ["sim-16", "demo-8x"]  # 92.9% > 59.4%
    for r in doc["runs"]:
        assert r["goodput"] == pytest.approx(truth[r["run_id"]], abs=0.002)
    out = _cli("runs", "--db", db, "--sort", "goodput", "--asc", "--limit", "1")
    assert out.stdout.splitlines()[2].startswith("demo-8x")
    assert "59.4%" in out.stdout and "runs 1-1 of 2; next page: --offset 1" in out.stdout
    # over HTTP: the collector's stored rows, the same page
    t0 = time.time() - 50
    for i, run in enumerate(["a1", "a2", "b1"]):
        _live_run(collector, run, t0 + i, steps=3)
    collector.sync()
    out = _cli("runs", "--url", collector.url, "--filter", "a", "--sort", "run", "--asc",
               "--json")
    doc = json.loads(out.stdout)
    assert [r["run_id"] for r in doc["runs"]] == ["a1", "a2"] and doc["total"] == 2
    assert all(r["goodput"] is not None for r in doc["runs"])
