"""The `goodlens` command: help everywhere, JSON in seconds, durations, import/export."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from goodlens.cli import main
from goodlens.model.units import format_duration, parse_duration
from tests.harness import ROOT

SAMPLE = str(ROOT / "sample_data" / "demo")


def run(*args: str, ok: bool = True):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("cmd", [[], ["serve"], ["runs"], ["import"], ["export"], ["report"],
                                 ["detect"], ["replay"], ["simulate"], ["plan"],
                                 ["plan", "interval"], ["plan", "checkpoint"],
                                 ["plan", "elastic"], ["plan", "spares"], ["end-run"],
                                 ["relay"], ["dashboard"], ["simulate", "cluster"]])
def test_every_command_has_help(cmd):
    out = run(*cmd, "--help").output
    assert "Usage:" in out and len(out.splitlines()) > 4


def test_import_is_idempotent_and_runs_reports_in_seconds(tmp_path):
    db = str(tmp_path / "s.duckdb")
    first = json.loads(run("import", SAMPLE, "--db", db, "--json").output)
    assert first["steps_inserted"] == 5104 and first["events_inserted"] == 25
    again = json.loads(run("import", SAMPLE, "--db", db, "--json").output)
    assert again["steps_inserted"] == 0 and again["steps_duplicate"] == 5104
    runs = json.loads(run("runs", "--db", db, "--json").output)["runs"]
    assert [r["run_id"] for r in runs] == ["demo-8x"]
    r = runs[0]
    assert r["state"] == "completed" and r["attempts"] == 2 and r["last_step"] == 599
    assert r["duration_s"] == pytest.approx(r["last_time"] - r["start"])
    text = run("runs", "--db", db).output
    assert "demo-8x" in text and "completed" in text


def test_export_then_import_round_trips(tmp_path):
    db, db2, out = tmp_path / "a.duckdb", tmp_path / "b.duckdb", tmp_path / "trace"
    run("import", SAMPLE, "--db", str(db))
    run("export", "--db", str(db), "--run", "demo-8x", "--out", str(out))
    run("import", str(out), "--db", str(db2))
    from goodlens.storage.store import Store
    a, b = Store(db, read_only=True), Store(db2, read_only=True)
    try:
        assert a.steps("demo-8x").equals(b.steps("demo-8x"))
        assert a.events("demo-8x").equals(b.events("demo-8x"))
        assert a.step_summaries("demo-8x").equals(b.step_summaries("demo-8x"))
    finally:
        a.close()
        b.close()


def test_errors_tell_the_user_what_to_do(tmp_path):
    r = run("runs", ok=False)
    assert r.exit_code == 2 and "--db PATH or --url URL" in r.output
    r = run("runs", "--db", str(tmp_path / "none.duckdb"), ok=False)
    assert r.exit_code == 2 and "no goodlens store" in r.output  # a wrong argument
    r = run("runs", "--url", "http://127.0.0.1:9", ok=False)
    assert "is `goodlens serve` running?" in r.output
    r = run("import", str(tmp_path), "--db", str(tmp_path / "x.duckdb"), ok=False)
    assert "not a goodlens trace" in r.output
    db = tmp_path / "e.duckdb"
    run("import", SAMPLE, "--db", str(db))
    r = run("export", "--db", str(db), "--run", "nope", "--out", str(tmp_path / "o"), ok=False)
    assert "no run 'nope'" in r.output
    r = run("serve", "--db", str(db), "--max-body", "lots", ok=False)
    assert "not a size" in r.output
    r = run("serve", "--db", str(db), "--summarize-every", "soon", ok=False)
    assert r.exit_code == 2 and "90s, 5m, 24h" in r.output
    r = run("serve", "--db", str(db), "--summarize-every", "0s", ok=False)
    assert "summarize interval must be positive" in r.output


def test_runs_over_http(collector):
    import orjson

    from tests.harness import http, step_batch
    http("POST", collector.url + "/v1/ingest", orjson.dumps(step_batch("h", 0, [0, 1])))
    collector.sync()
    runs = json.loads(run("runs", "--url", collector.url, "--json").output)["runs"]
    assert runs[0]["run_id"] == "h" and runs[0]["steps"] == 2


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("5m", 300), ("24h", 86400),
                                           ("1h30m", 5400), ("250ms", 0.25), ("42", 42),
                                           ("2d", 172800), (" 1.5 h ", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "5 parsecs", "-3s", "h", "1h-5m"])
def test_bad_durations_say_how_to_write_one(bad):
    with pytest.raises(ValueError, match="90s, 5m, 24h"):
        parse_duration(bad)


def test_format_duration():
    assert [format_duration(x) for x in (0.45, 12.34, 185, 3725, 90000)] == \
        ["450ms", "12.3s", "3m 05s", "1h 02m", "1d 01h"]


def test_report_json_has_the_documented_fields(tmp_path):
    db = str(tmp_path / "r.duckdb")
    run("import", SAMPLE, "--db", db)
    rep = json.loads(run("report", "--db", db, "--run", "demo-8x", "--json").output)
    for key in ("run", "wall_clock_s", "goodput", "gpu_time_goodput", "buckets",
                "startup_parts", "restart_parts", "attempts"):
        assert key in rep
    assert set(rep["buckets"]) == {"productive", "straggler_wait", "checkpoint_stall",
                                   "recompute", "startup", "restart", "other"}
    assert set(rep["startup_parts"]) == {"init", "restore", "warmup"}
    assert set(rep["restart_parts"]) >= {"detection", "queue", "init", "restore", "warmup"}
    # the demo's recipe: 40 s of init before its first step, 40 s more after its failure
    assert rep["startup_parts"]["init"] == pytest.approx(40.0, abs=0.1)
    assert rep["restart_parts"]["init"] == pytest.approx(40.0, abs=0.1)
    assert sum(rep["buckets"].values()) == pytest.approx(rep["wall_clock_s"])
    assert rep["goodput"] == pytest.approx(rep["buckets"]["productive"] / rep["wall_clock_s"])
    assert [a["attempt"] for a in rep["attempts"]] == [0, 1]
    window = json.loads(run("report", "--db", db, "--since", "+10m", "--until", "-1m",
                            "--json").output)  # default run: the only one
    assert window["wall_clock_s"] == pytest.approx(rep["wall_clock_s"] - 660)
    text = run("report", "--db", db).output
    assert "goodput" in text and "queue" in text and "2m 00s" in text
    bad = run("report", "--db", db, "--since", "yesterday-ish", ok=False)
    assert bad.exit_code == 2 and "ISO time" in bad.output
    assert "no run 'x'" in run("report", "--db", db, "--run", "x", ok=False).output


def test_report_exclude_and_as_of_on_the_demo(tmp_path):
    db = str(tmp_path / "r.duckdb")
    run("import", SAMPLE, "--db", db)
    truth = json.loads((ROOT / "sample_data" / "demo" / "ground_truth.json").read_text())
    wall, queue = truth["truth"]["wall_clock_s"], 120.0  # the recipe's 2 min in the queue
    rep = json.loads(run("report", "--db", db, "--exclude", "queue,nothing", "--json").output)
    assert rep["excluded"] == {"queue": pytest.approx(queue), "nothing": 0.0}
    assert rep["wall_clock_s"] == pytest.approx(wall - queue, abs=0.01)
    # the sample's recipe against the report: within 0.1% of wall-clock, as in test_sample_data
    assert rep["goodput"] == pytest.approx(truth["truth"]["buckets"]["productive"]
                                           / (wall - queue), abs=0.001 * wall / (wall - queue))
    assert rep["goodput"] == pytest.approx(rep["buckets"]["productive"] / rep["wall_clock_s"])
    assert "excluded from the wall-clock: queue 2m 00s" in run(
        "report", "--db", db, "--exclude", "queue").output
    early = json.loads(run("report", "--db", db, "--as-of", "+5m", "--json").output)
    assert early["in_progress"] and early["wall_clock_s"] == pytest.approx(300.0)
    assert early["buckets"]["recompute"] == 0.0  # the failure had not happened yet
    assert "as of" in run("report", "--db", db, "--as-of", "+5m").output
    bad = run("report", "--db", db, "--as-of", "-2h", ok=False)
    assert bad.exit_code == 2 and "had not started" in bad.output


def test_report_over_http_matches_the_file(collector, tmp_path):
    import orjson

    from tests.harness import http, step_batch
    for r in range(3):
        http("POST", collector.url + "/v1/ingest", orjson.dumps(step_batch("h", r, [0, 1, 2])))
    collector.sync()
    rep = json.loads(run("report", "--url", collector.url, "--run", "h", "--json").output)
    assert rep["run"] == "h" and rep["in_progress"]
    # three 1 s steps; ranks reach the all-reduce at 0.62, 0.63, 0.64 s (straggler wait
    # 0.01 s) and every rank waits 0.02 s for data (input stall): 3 x (1 - 0.01 - 0.02)
    assert rep["buckets"]["productive"] == pytest.approx(2.91, abs=0.05)
    assert rep["other_parts"]["input_stall"] == pytest.approx(0.06)
    status, _body = http("GET", collector.url + "/v1/report?run=nope")
    assert status == 404
    status, ex = http("GET", collector.url + "/v1/report?run=h&exclude=queue,eval&as_of=%2B1s")
    assert status == 200 and ex["excluded"] == {"queue": 0.0, "eval": 0.0}
    assert ex["as_of"] == pytest.approx(1001.0) and ex["wall_clock_s"] == pytest.approx(1.0)


def test_instants():
    from goodlens.model.units import parse_instant
    assert parse_instant("+2h", start=100.0, end=10_000.0) == 7300.0
    assert parse_instant("-30", start=100.0, end=10_000.0) == 9970.0  # relative, not epoch
    assert parse_instant("1767225600") == 1767225600.0
    assert parse_instant("2026-01-01T00:00") == 1767225600.0  # UTC when no offset
    assert parse_instant("2026-01-01T01:00+01:00") == 1767225600.0
    for bad in ("nan", "inf", "soon", "", "  "):
        with pytest.raises(ValueError):
            parse_instant(bad)
    with pytest.raises(ValueError, match="relative to the run"):
        parse_instant("+1h")


def test_simulate_json_and_what_if_settings():
    out = json.loads(run("simulate", "--preset", "test-16", "--trials", "8", "--json").output)
    for key in ("goodput_mean", "goodput_p5", "goodput_p95", "buckets_mean"):
        assert key in out
    assert sum(out["buckets_mean"].values()) == pytest.approx(out["wall_clock_s"])
    assert out["goodput_p5"] <= out["goodput_mean"] <= out["goodput_p95"]
    again = json.loads(run("simulate", "--preset", "test-16", "--trials", "8", "--json").output)
    assert again == out  # same seed, same result
    slow_queue = ("--set", "queue_s=30m")  # a scheduler that takes half an hour
    spares = json.loads(run("simulate", "--preset", "demo-64", "--trials", "8", *slow_queue,
                            "--set", "elastic=spares", "--set", "spares=2", "--json").output)
    plain = json.loads(run("simulate", "--preset", "demo-64", "--trials", "8", *slow_queue,
                           "--json").output)
    assert spares["restart_parts_mean"]["queue"] < plain["restart_parts_mean"]["queue"]
    rows = json.loads(run("simulate", "--preset", "test-16", "--trials", "4", "--sweep",
                          "interval_s=2m,10m", "--json").output)["rows"]
    assert [r["value"] for r in rows] == [120.0, 600.0]


def test_simulate_errors_name_the_setting():
    r = run("simulate", "--preset", "nope", ok=False)
    assert r.exit_code == 2 and "llama3-16k" in r.output
    r = run("simulate", "--set", "colour=red", ok=False)
    assert r.exit_code == 2 and "FIELD=VALUE" in r.output
    r = run("simulate", "--set", "nodes=0", ok=False)
    assert r.exit_code == 2 and "nodes" in r.output
    r = run("simulate", "--set", "interval_s=soon", ok=False)
    assert r.exit_code == 2 and "interval_s" in r.output


def test_simulate_out_writes_a_trace_that_reports_its_ground_truth(tmp_path):
    out = tmp_path / "trace"
    doc = json.loads(run("simulate", "--preset", "test-16", "--trials", "2", "--seed", "3",
                         "--out", str(out), "--run-id", "t16", "--json").output)
    assert doc["trace"]["rows"] > 0 and (out / "ground_truth.json").exists()
    db = str(tmp_path / "s.duckdb")
    run("import", str(out), "--db", db)
    rep = json.loads(run("report", "--db", db, "--run", "t16", "--json").output)
    truth = doc["trace"]["truth"]
    for bucket, want in truth["buckets"].items():
        assert (rep["buckets"][bucket] or 0.0) == pytest.approx(want, abs=1e-3 * truth[
            "wall_clock_s"])
    r = run("simulate", "--preset", "llama3-16k", "--out", str(tmp_path / "big"), ok=False)
    assert r.exit_code == 2 and "--max-rows" in r.output


def test_detect_finds_the_planted_straggler_of_the_demo(tmp_path):
    db = str(tmp_path / "d.duckdb")
    run("import", SAMPLE, "--db", db)
    found = json.loads(run("detect", "--db", db, "--run", "demo-8x", "--json").output)
    [f] = found["findings"]  # rank 5, 10% slower from step 150, and nothing else
    assert (f["subject_kind"], f["subject_id"]) == ("rank", 5)
    assert 140 <= f["first_step"] <= 160 and f["detected_step"] <= 180
    assert f["slowdown"] == pytest.approx(0.10, abs=0.03) and f["action"] == "evict"
    assert "rank 5" in run("detect", "--db", db, "--run", "demo-8x").output
    assert "no run 'x'" in run("detect", "--db", db, "--run", "x", ok=False).output


def test_plan_interval_json_and_input_errors():
    p = json.loads(run("plan", "interval", "--checkpoint-cost", "5m", "--mtbf", "24h",
                       "--json").output)
    # Young: sqrt(2 x 300 s x 86,400 s) = 7,200 s
    assert p["young_interval_s"] == pytest.approx(7200.0)
    assert p["young_interval_s"] > p["daly_interval_s"] > 0
    t = json.loads(run("plan", "interval", "--checkpoint-cost", "5m", "--mtbf", "6h",
                       "--memory-stall", "5s", "--memory-survives", "0.9", "--json").output)
    assert t["tiered"]["goodput"] > t["tiered"]["single_tier_goodput"]  # the fast tier pays
    assert t["tiered"]["memory_interval_s"] < t["tiered"]["durable_interval_s"]
    r = run("plan", "interval", "--checkpoint-cost", "-5m", "--mtbf", "24h", ok=False)
    assert r.exit_code == 2 and "not a duration" in r.output
    r = run("plan", "interval", "--checkpoint-cost", "30h", "--mtbf", "24h", ok=False)
    assert r.exit_code == 2 and "checkpoint" in r.output


def test_plan_checkpoint_elastic_spares_and_measured(tmp_path):
    c = json.loads(run("plan", "checkpoint", "--params", "70e9", "--gpus", "1024",
                       "--storage-bw", "100GB/s", "--json").output)
    assert c["size_bytes"] == pytest.approx(70e9 * 16)  # mixed-precision Adam, 16 B/param
    assert c["sync_stall_s"] == pytest.approx(1.12e12 / 100e9)  # storage-bound: 11.2 s
    e = json.loads(run("plan", "elastic", "--nodes", "16", "--lost", "2", "--micro-batch",
                       "4", "--global-batch", "512", "--json").output)
    assert e["global_batch"] == 512 and e["recommendation"] in ("shrink", "spare", "restart")
    r = run("plan", "elastic", "--nodes", "4", "--lost", "4", "--micro-batch", "1",
            "--global-batch", "8", ok=False)
    assert r.exit_code == 2 and "lost" in r.output
    sp = json.loads(run("plan", "spares", "--nodes", "2048", "--node-mtbf", "250d",
                        "--json").output)
    assert sp["best_spares"] >= 1
    db = str(tmp_path / "m.duckdb")
    run("import", SAMPLE, "--db", db)
    m = json.loads(run("plan", "--db", db, "--run", "demo-8x", "--json").output)
    assert m["failures"] == 1 and m["checkpoints"] == 5
    assert m["checkpoint_stall_s"] == pytest.approx(6.0, abs=0.05)
    assert "instead of" in m["summary"]
    assert "measured mode needs both" in run("plan", "--db", db, ok=False).output


def test_dashboard_command_serves_a_store_file_read_only(tmp_path):
    """`goodlens dashboard --port 0` says where it listens, serves the app over the file,
    and stops cleanly on SIGTERM."""
    import re
    import signal
    import subprocess
    import time

    from tests.harness import GOODLENS, http
    db = str(tmp_path / "s.duckdb")
    run("import", SAMPLE, "--db", db)
    proc = subprocess.Popen([*GOODLENS, "dashboard", "--db", db, "--port", "0"], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        url = f"http://127.0.0.1:{m.group(1)}"
        status, body = http("GET", url + "/_dash-layout")
        assert status == 200 and "gl-page" in json.dumps(body)
        status, _ = http("GET", url + "/runs/demo-8x")
        assert status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        t = time.monotonic()
        assert proc.wait(30) == 0
        assert time.monotonic() - t < 15
