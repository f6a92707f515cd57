"""A new user's rough edges of the `goodlens` command, one test per point: the
commands that need a run's rows work against a running collector (--url), --url errors and
addresses, the checkpoint planner's prices, report windows, replay's options and clock,
end-run's clock, option names in messages, one exit code for a missing store, simulate's
trace, the demo store of `make run`, and the command saying what the dashboard says from one
source: detect's columns, cluster --compare's rows, --gpu-hour-price, the interval advice.

Expected values come from the demo sample's recipe (sample_data/generate.py: rank 5 10%
slow from step 150, one failure, 5 checkpoints of 6 s, 16 min 05.802 s from
2026-01-01T00:00:00Z) or are worked out by hand beside the assertion.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from goodlens.cli import main
from goodlens.storage.store import Store
from tests.harness import ROOT, Collector, free_port, http

SAMPLE = str(ROOT / "sample_data" / "demo")
TRUTH = json.loads((ROOT / "sample_data" / "demo" / "ground_truth.json").read_text())["truth"]


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, (args, result.output)
    return result


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory):
    """A collector holding a store with the demo run (no live detector: the run's events
    stay the sample's own)."""
    tmp = tmp_path_factory.mktemp("held")
    c = Collector(tmp / "held.duckdb", "--load", SAMPLE, "--no-dashboard", "--no-detect")
    c.start(timeout=120)
    yield c
    c.stop()


def _hostport(c: Collector) -> str:
    return f"127.0.0.1:{c.port}"  # no scheme: point 3


# 1. detect, plan --run and export read a store a collector holds, through --url

def test_detect_plan_and_export_work_over_url_on_a_held_store(held, tmp_path):
    r = run("detect", "--db", str(held.db), "--run", "demo-8x", code=1)
    assert "held by another process" in r.output and "--url" in r.output
    found = json.loads(run("detect", "--url", _hostport(held), "--run", "demo-8x",
                           "--json").output)
    [f] = found["findings"]  # the recipe's straggler: rank 5, 10% slower from step 150
    assert (f["subject_kind"], f["subject_id"]) == ("rank", 5)
    assert 140 <= f["first_step"] <= 160 and f["action"] == "evict"
    assert f["slowdown"] == pytest.approx(0.10, abs=0.03)
    assert "rank 5" in run("detect", "--url", held.url, "--run", "demo-8x").output
    m = json.loads(run("plan", "--url", _hostport(held), "--run", "demo-8x", "--json").output)
    assert m["failures"] == 1 and m["checkpoints"] == 5  # one GPU lost; saves at 100..500
    assert m["checkpoint_stall_s"] == pytest.approx(6.0, abs=0.05)  # 6 s synchronous stalls
    out = tmp_path / "exported"
    run("export", "--url", _hostport(held), "--run", "demo-8x", "--out", str(out))
    a, b = tmp_path / "direct.duckdb", tmp_path / "via-url.duckdb"
    run("import", SAMPLE, "--db", str(a))
    counts = json.loads(run("import", str(out), "--db", str(b), "--json").output)
    assert (counts["steps_inserted"], counts["events_inserted"]) == (5104, 25)  # the sample's
    sa, sb = Store(a, read_only=True), Store(b, read_only=True)
    try:
        assert sa.steps("demo-8x").equals(sb.steps("demo-8x"))
        assert sa.events("demo-8x").equals(sb.events("demo-8x"))
    finally:
        sa.close()
        sb.close()
    r = run("detect", "--url", held.url, "--run", "nope", code=1)
    assert f"no run 'nope' at {held.url}; see `goodlens runs --url {held.url}`" in r.output
    r = run("export", "--run", "demo-8x", "--out", str(tmp_path / "x"), code=2)
    assert "exactly one of --db PATH or --url URL" in r.output


def test_the_tables_route_serves_a_runs_rows_as_arrow(held):
    import urllib.request

    import pyarrow as pa
    with urllib.request.urlopen(held.url + "/v1/tables/steps?run=demo-8x", timeout=30) as resp:
        assert resp.headers["content-type"] == "application/vnd.apache.arrow.stream"
        steps = pa.ipc.open_stream(resp.read()).read_all()
    assert steps.num_rows == 5104  # 8 ranks x (600 + 38 recomputed) steps
    status, body = http("GET", held.url + "/v1/tables/secrets?run=demo-8x")
    assert status == 404 and "runs, steps, events, attempts" in body["error"]
    status, body = http("GET", held.url + "/v1/tables/steps")
    assert status == 422 and body["field"] == "run"
    status, body = http("GET", held.url + "/v1/tables/events?run=nope")
    assert status == 404 and "no run 'nope'" in body["error"]
    _, doc = http("GET", held.url + "/openapi.json")
    assert "/v1/tables/{name}" in doc["paths"]


# 2. --url errors print the collector's message, not its bytes

def test_url_errors_print_the_collectors_message(held):
    r = run("report", "--url", held.url, "--run", "nope", code=1)
    assert f"{held.url}/v1/report?run=nope answered 404: no run 'nope'" in r.output
    assert "b'" not in r.output and '{"error"' not in r.output
    r = run("report", "--url", held.url, "--since", "soon", code=1)
    assert "answered 422: not a time: 'soon'" in r.output


# 3. --url takes host:port

def test_url_without_a_scheme_is_http(held):
    from goodlens.cli.common import collector_url
    assert collector_url("127.0.0.1:8470/") == "http://127.0.0.1:8470"
    assert collector_url("https://c.example:8470") == "https://c.example:8470"
    rows = json.loads(run("runs", "--url", _hostport(held), "--json").output)["runs"]
    assert [r["run_id"] for r in rows] == ["demo-8x"]
    rep = json.loads(run("report", "--url", _hostport(held) + "/", "--run", "demo-8x",
                         "--json").output)
    assert rep["wall_clock_s"] == pytest.approx(TRUTH["wall_clock_s"], abs=0.01)
    r = run("end-run", "--url", _hostport(held), "--run", "demo-8x", code=1)
    assert "has already ended" in r.output  # it reached the collector
    first = run("report", "--url", _hostport(held), "--run", "demo-8x", "--since", "+10m",
                "--until", "-1m").output.splitlines()[0]  # point 5, from the collector
    assert first.endswith("in the window 2026-01-01T00:10:00Z to 2026-01-01T00:15:05.802Z")


# 4. plan checkpoint --price shows the money in the text too

def test_plan_checkpoint_price_is_in_the_text():
    out = run("plan", "checkpoint", "--params", "70e9", "--gpus", "1024", "--storage-bw",
              "100GB/s", "--price", "2.5", "--interval", "30m").output
    # 70e9 x 16 B (mixed-precision Adam) = 1.12 TB at 100 GB/s: 11.2 s of 1,024 GPUs
    # = 3.1858 GPU-hours, x 2.5 = 7.96 per synchronous checkpoint; 48 a day = 382.29
    assert "cost per checkpoint at 2.5 per GPU-hour: sync 7.96" in out
    assert "cost per day: sync 382.29" in out
    assert "cost" not in run("plan", "checkpoint", "--params", "70e9", "--gpus", "8").output


# 5. report prints its window and warns when the window holds none of the run

def test_report_prints_its_window_and_warns_outside_the_run(tmp_path):
    db = str(tmp_path / "w.duckdb")
    run("import", SAMPLE, "--db", db)
    first = run("report", "--db", db, "--since", "+10m", "--until", "-1m").output.splitlines()[0]
    # the run: 2026-01-01T00:00:00Z to 00:16:05.802Z; +10m and a minute before its end
    assert first == ("run demo-8x (ended): wall-clock 5m 05s in the window "
                     "2026-01-01T00:10:00Z to 2026-01-01T00:15:05.802Z")
    r = run("report", "--db", db, "--since", "+2h")
    assert "wall-clock 0ms in the window 2026-01-01T02:00:00Z to the run's end" in r.stdout
    assert r.stderr.startswith("warning: the window 2026-01-01T02:00:00Z to the run's end "
                               "holds none of run demo-8x (2026-01-01T00:00:00Z to "
                               "2026-01-01T00:16:05.802Z)")
    doc = json.loads(run("report", "--db", db, "--until", "2025-12-31T00:00", "--json").stdout)
    assert doc["window"]["until"] == 1767139200.0 and doc["window"]["overlaps_run"] is False
    assert "warning" not in run("report", "--db", db, "--since", "+1m").stderr
    assert "window" not in run("report", "--db", db).stdout


# 6. replay --db refuses --speed (it loads the whole trace at once)

def test_replay_into_a_store_refuses_a_speed(tmp_path):
    db = tmp_path / "r.duckdb"
    r = run("replay", SAMPLE, "--db", str(db), "--speed", "60", code=2)
    assert "--speed paces a live replay (--live URL)" in r.output
    assert not db.exists()  # refused before anything was written
    run("replay", SAMPLE, "--db", str(db))  # without --speed: an import


# 7. replay --live to a dead collector fails within seconds

def test_live_replay_to_no_collector_fails_fast():
    port = free_port()  # nothing listens there
    t = time.monotonic()
    r = run("replay", SAMPLE, "--live", f"127.0.0.1:{port}", code=1)
    assert time.monotonic() - t < 20  # 5 s of /healthz retries, not 60 s of pushes
    assert f"no goodlens collector answers at http://127.0.0.1:{port}" in r.output
    assert "`goodlens serve --db PATH`" in r.output


# 8. replay --as-now never stamps a row after the instant it is sent

def test_as_now_retiming_by_hand():
    from goodlens.collector.replay import Retime
    r = Retime.as_now(t0=1000.0, t_end=1960.0, speed=120.0, now=5000.0)
    assert (r.at(1000.0), r.at(1960.0)) == (5000.0, 5008.0)  # 960 s of trace in 8 s
    cols = r.steps({"start_time": [1120.0], "duration_s": [12.0], "compute_s": [6.0]})
    assert cols == {"start_time": [5001.0], "duration_s": [0.1], "compute_s": [0.05]}
    r0 = Retime.as_now(t0=1000.0, t_end=1960.0, speed=0.0, now=5000.0)
    assert (r0.at(1000.0), r0.at(1960.0)) == (4040.0, 5000.0)  # all at once: ends now
    assert Retime().events({"time": [1.5]}) == {"time": [1.5]}


def test_live_as_now_replay_stamps_nothing_after_it_is_sent(collector, monkeypatch):
    from goodlens.exporter.transport import Transport
    from goodlens.model.batch import Limits
    from goodlens.model.batch_arrow import DECODERS
    from goodlens.model.wire import ARROW

    sends: list[tuple[float, bytes]] = []
    post = Transport._post

    def spy(self, body, content_type):
        sends.append((time.time(), bytes(body)))
        return post(self, body, content_type)

    monkeypatch.setattr(Transport, "_post", spy)
    run("replay", SAMPLE, "--live", collector.url, "--speed", "120", "--as-now")
    late = []
    for sent_at, body in sends:
        batch = DECODERS[ARROW](body, Limits())
        if batch.steps is not None and batch.steps.num_rows:
            st = batch.steps
            ends = [s + d for s, d in zip(st.column("start_time").to_pylist(),
                                          st.column("duration_s").to_pylist())]
            late += [e - sent_at for e in ends if e > sent_at]
        if batch.events is not None and batch.events.num_rows:
            late += [t - sent_at for t in batch.events.column("time").to_pylist()
                     if t > sent_at]
    assert len(sends) > 20 and late == []
    collector.sync()
    rep = json.loads(run("report", "--url", collector.url, "--run", "demo-8x",
                         "--json").output)
    # compressed 120 times: 965.8 s of run in 8.05 s, every share the recorded one
    assert rep["wall_clock_s"] == pytest.approx(TRUTH["wall_clock_s"] / 120, rel=1e-3)
    assert rep["goodput"] == pytest.approx(TRUTH["goodput"], abs=1e-3)


# 9. end-run --force never records an end later than now

def _running_store(path: Path, last_step_ago_s: float) -> float:
    """A store with run `live`: 10 one-second steps of one rank, the last ending
    ``last_step_ago_s`` before now; the run's start."""
    from goodlens.model.batch import validate_batch
    end = time.time() - last_step_ago_s
    doc = {"schema_version": 1, "run_id": "live", "steps": {
        "attempt": 0, "rank": 0, "host": "h", "step": list(range(10)),
        "start_time": [end - 10 + i for i in range(10)], "duration_s": [1.0] * 10}}
    store = Store(path)
    try:
        store.write_group([validate_batch(doc)])
        store.summarize_dirty()
    finally:
        store.close()
    return end - 10


def test_end_run_force_ends_a_run_now_not_in_the_future(tmp_path):
    db = tmp_path / "live.duckdb"
    start = _running_store(db, last_step_ago_s=3.0)  # 3 s quiet: within its 60 s timeout
    r = run("end-run", "--db", str(db), "--run", "live", code=1)
    assert "--force ends it anyway" in r.output
    r = run("end-run", "--db", str(db), "--run", "live", "--force", "--at", "2099-01-01T00:00",
            code=2)
    assert "is in the future" in r.output
    before = time.time()
    out = json.loads(run("end-run", "--db", str(db), "--run", "live", "--force",
                         "--json").output)
    after = time.time()
    # before the fix: last activity + the 60 s timeout, 57 s from now
    assert before <= out["time"] <= after and out["stored"] and not out["in_progress"]
    assert out["wall_clock_s"] == pytest.approx(out["time"] - start, abs=1e-3)  # ends now


# 10. validation messages name the options, not the library's functions

@pytest.mark.parametrize(("args", "says"), [
    (["plan", "interval", "--checkpoint-cost", "30h", "--mtbf", "24h"],
     "--checkpoint-cost must be < --mtbf"),
    (["plan", "interval", "--checkpoint-cost", "5m", "--mtbf", "6h", "--memory-stall", "10m"],
     "--memory-stall must be <= --checkpoint-cost"),
    (["plan", "checkpoint", "--params", "1e9", "--gpus", "8", "--price", "-1"],
     "--price must be a finite number >= 0"),
    (["plan", "elastic", "--nodes", "4", "--lost", "4", "--micro-batch", "1",
      "--global-batch", "8"], "--lost must be < --nodes"),
    (["plan", "spares", "--nodes", "4", "--node-mtbf", "1d", "--swap", "1h",
      "--restart-cost", "5m"], "--swap must be <= --restart-cost"),
    (["simulate", "--set", "nodes=0"], "--set: nodes must be an integer >= 1"),
    (["simulate", "cluster", "--set", "nodes=0"], "--set: nodes must be an integer >= 1"),
])
def test_validation_messages_name_the_option(args, says):
    out = run(*args, code=2).output
    assert says in out
    assert not re.search(r"\w+_plan:|CheckpointSpec|SimConfig|ClusterConfig|_s\b", out), out


# 11. a missing --db: exit code 2 for every command that takes one

DB_COMMANDS = {  # each command's arguments besides --db
    "runs": [], "report": [], "detect": ["--run", "x"], "export": ["--run", "x", "--out", "o"],
    "end-run": ["--run", "x"], "plan": ["--run", "x"], "dashboard": ["--port", "0"],
    "import": [SAMPLE], "replay": [SAMPLE], "serve": ["--port", "0"]}
CREATES = {"import", "replay", "serve"}  # these make a new store at a path that has none


def test_the_exit_codes_are_documented():
    text = " ".join(run("--help").output.split())
    assert "2 a usage error, including a --db that is missing or not a goodlens store" in text


@pytest.mark.parametrize("cmd", sorted(DB_COMMANDS))
def test_a_missing_db_exits_2(cmd, tmp_path):
    r = run(cmd, *DB_COMMANDS[cmd], code=2)  # no --db (nor --url) at all
    assert "--db" in r.output
    if cmd in CREATES:
        return
    nowhere = tmp_path / "none.duckdb"
    r = run(cmd, "--db", str(nowhere), *DB_COMMANDS[cmd], code=2)
    assert f"no goodlens store at {nowhere}" in r.output and not nowhere.exists()


# 12. simulate --out writes the trial whose numbers it prints

def test_simulate_out_trace_is_the_printed_trial(tmp_path):
    out = tmp_path / "trace"
    text = run("simulate", "--preset", "test-16", "--trials", "1", "--seed", "3", "--out",
               str(out), "--run-id", "t16").output
    printed = re.search(r"^goodput (\d+\.\d)% \(p5", text, re.M).group(1)
    db = str(tmp_path / "t.duckdb")
    run("import", str(out), "--db", db)
    rep = json.loads(run("report", "--db", db, "--run", "t16", "--json").output)
    assert f"{100 * rep['goodput']:.1f}" == printed
    assert re.search(rf"trace of trial 1 of seed 3: .*goodput {printed}%", text)
    doc = json.loads(run("simulate", "--preset", "test-16", "--trials", "1", "--seed", "3",
                         "--out", str(tmp_path / "again"), "--json").output)
    assert doc["goodput_mean"] == pytest.approx(doc["trace"]["truth"]["goodput"], abs=1e-12)


# 13. the demo store: loading the samples again adds nothing; `make reset` removes it alone

def test_loading_the_samples_again_adds_nothing(tmp_path):
    db = tmp_path / "demo.duckdb"
    for _ in range(2):  # as two `make run`s: a collector loading the samples, stopped
        c = Collector(db, "--load", SAMPLE, "--no-dashboard", "--no-detect").start(timeout=120)
        c.stop()
    store = Store(db, read_only=True)
    try:
        assert list(store.runs().run_id) == ["demo-8x"]
        assert len(store.steps("demo-8x")) == 5104 and len(store.events("demo-8x")) == 25
    finally:
        store.close()


def test_make_reset_removes_the_demo_store_alone(tmp_path):
    folder = tmp_path / ".goodlens"
    folder.mkdir()
    db, other = folder / "demo.duckdb", folder / "keep.txt"
    other.write_text("mine")
    run("import", SAMPLE, "--db", str(db))
    c = Collector(db, "--no-dashboard", "--no-detect", log=tmp_path / "c.log").start()
    try:
        held = subprocess.run(["make", "-s", "reset", f"DB={db}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert held.returncode != 0 and "held by a running collector" in held.stdout
        assert db.exists()
    finally:
        c.stop()
    done = subprocess.run(["make", "-s", "reset", f"DB={db}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]


# 14-17: the command and the dashboard say the same things from one source

@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo sample imported into a store of its own (no collector holds it)."""
    db = str(tmp_path_factory.mktemp("demo") / "demo.duckdb")
    run("import", SAMPLE, "--db", db)
    return db


def _cells(line: str) -> list[str]:
    return re.split(r" {2,}", line.strip())


# 14. detect's text table has the ranks page's columns (attempt and confidence included)

def test_detect_text_has_the_ranks_pages_columns(demo_db):
    header, rule, *rows = run("detect", "--db", demo_db, "--run", "demo-8x").output.splitlines()
    assert _cells(header) == ["subject", "host", "slower than", "attempt", "from step",
                              "detected at", "slower to collective", "job slowdown",
                              "part of joint", "joint, all open", "wait so far",
                              "wait per hour", "action", "confidence", "state"]
    assert set(rule) == {"-", " "}
    # the recipe's straggler: rank 5 (on node-1 with ranks 4-7), slow from step 150 of
    # attempt 0 and still slow after the restart (the same finding, begun in attempt 0);
    # the detector's estimate of the 10% is 9.8% (8.9% while the host's median of 4 included
    # rank 5 itself); what it costs a step: without it the all-reduce would start when the
    # latest of the other 7 is ready, ~1.35 noise units (2% of 0.8 s) over their 0.8 s of
    # compute plus ~0.01 s of data, ~0.833 s, against rank 5's 0.88 s + 0.01 s: 0.057 s
    # lost, over the step without it (0.833 s + the 0.15 s all-reduce, ~0.983 s): ~5.8%,
    # 5.6% in the sample's last 64 steps (the generator's rows: 5.8% over the run); 39.5 s
    # waited, 4m 35s an hour, confidence 0.8333 written to two places. The only open
    # finding: the open findings' joint cost is its own, and all of it is its part
    # (the same medians: 5.6%); the line under the table says it too
    *rows, joint = rows
    assert [_cells(r) for r in rows] == [
        ["rank 5", "node-1", "the other ranks of host node-1", "0", "150", "161", "9.8%", "5.6%",
         "5.6%", "5.6%", "39.5s", "4m 35s", "evict", "0.83", "open"]]
    assert joint.startswith("open findings together: job slowdown 5.6%")
    from goodlens.analysis.findings import FINDING_COLUMNS
    assert _cells(header) == [h for _, h in FINDING_COLUMNS]  # the dashboard's, in order


# 15. simulate cluster --compare prints the cluster page's rows, job goodput among them

def test_cluster_compare_rows_are_the_cluster_pages(tmp_path):
    from goodlens.analysis.clusterrows import cluster_rows
    args = ["simulate", "cluster", "--preset", "test-64", "--compare", "topo,fair,ckpt-preempt"]
    doc = json.loads(run(*args, "--json").output)
    lines = run(*args).output.splitlines()
    start = lines.index(next(x for x in lines if x.startswith("cluster ")))
    assert _cells(lines[start]) == ["cluster", "A", "B", "B - A"]
    body = lines[start + 2:lines.index("", start)]
    want = cluster_rows(doc["a"]["cluster"], doc["b"]["cluster"])
    assert [_cells(x)[0] for x in body] == [r["label"] for r in want]
    assert [_cells(x)[1:] for x in body] == [[r["a"], r["b"], r["delta"]] for r in want]
    goodput = next(_cells(x) for x in body if x.startswith("job goodput"))
    a, b = doc["a"]["cluster"]["goodput"], doc["b"]["cluster"]["goodput"]
    assert goodput == ["job goodput (productive / job wall-clock)", f"{100 * a:.1f}%",
                       f"{100 * b:.1f}%", f"{100 * (b - a):+.1f} pt"]
    # counts and durations by hand: the same preset and seed print these (test-64, seed 0)
    rows = {_cells(x)[0]: _cells(x)[1:] for x in body}
    assert rows["node failures"] == ["4", "4", "0"]  # the same failures on both sides
    assert rows["jobs still waiting"] == ["1", "1", "0"]  # equal: "0", not "+0"
    assert rows["preemptions"][0] == "0" and rows["preemptions"][2] == "+" + rows[
        "preemptions"][1]


# 16. serve and dashboard --gpu-hour-price: the checkpoint page's money figures

def test_gpu_hour_price_reaches_the_checkpoints_page(demo_db, tmp_path, monkeypatch):
    import goodlens.cli.serve as cli_serve
    import goodlens.collector.server as server
    import goodlens.dashboard.app as app_module
    from goodlens.dashboard import pages
    from goodlens.dashboard.data import RunData

    seen: dict = {}
    monkeypatch.setattr(cli_serve, "serve_dashboard",
                        lambda db, host, port, **kw: seen.setdefault("dashboard", kw["config"]))
    run("dashboard", "--db", demo_db, "--port", "0", "--gpu-hour-price", "2.5")
    monkeypatch.setattr(server, "serve", lambda config, **kw: seen.setdefault("root", kw["root"]))
    run("serve", "--db", str(tmp_path / "s.duckdb"), "--port", "0", "--gpu-hour-price", "2.5")
    create = app_module.create_app

    def recording(store, config=None, **kw):
        seen["serve"] = config
        return create(store, config, **kw)
    monkeypatch.setattr(app_module, "create_app", recording)
    store = Store(demo_db, read_only=True)
    try:
        seen["root"](store)  # what serve mounts at /, over the collector's store
        for config in (seen["dashboard"], seen["serve"]):
            assert config.gpu_hour_price == 2.5
            d = RunData(store, config).checkpoints("demo-8x")
            # by hand: 6 s x 8 GPUs = 48 GPU-seconds a checkpoint, at 2.5 = 0.0333
            assert d["cost"]["price_per_gpu_hour"] == 2.5
            assert [r["money"] for r in d["cost"]["rows"]] == pytest.approx([2.5 * 48 / 3600] * 5)
            assert "Cost per checkpoint" in str(pages.checkpoints_body(d))
            assert pages.checkpoints_controls({}, config.gpu_hour_price).children[1].value == 2.5
        assert seen["serve"].live_detection  # serve's detector stays on
    finally:
        store.close()
    seen.clear()  # no flag: no price, GPU-hours only
    run("dashboard", "--db", demo_db, "--port", "0")
    assert seen["dashboard"].gpu_hour_price is None


@pytest.mark.parametrize("cmd", ["serve", "dashboard"])
def test_gpu_hour_price_must_be_a_price(cmd, demo_db):
    for bad in ("-1", "nan", "inf"):
        out = run(cmd, "--gpu-hour-price", bad, "--db", demo_db, "--port", "0", code=2).output
        assert "Invalid value for '--gpu-hour-price': must be a finite number >= 0" in out


# 17. plan --db --run says the interval advice in the dashboard's words

def test_plan_measured_advice_reads_like_the_dashboard(demo_db):
    from goodlens.dashboard import pages
    from goodlens.dashboard.data import RunData

    text = run("plan", "--db", demo_db, "--run", "demo-8x").output
    # by hand from `plan --json`: best 67.46 s, measured 110.12 s (the median gap of saves)
    said = ("checkpointing every 1m 07s instead of 1m 50s would have recovered 1.1 points of "
            "goodput, 0.02 GPU-hours")
    assert said in text.splitlines()
    store = Store(demo_db, read_only=True)
    try:
        m = RunData(store).checkpoints("demo-8x")["measured"]
        assert pages.checkpoint_advice(m) == said
        from goodlens.analysis.findings import detect_run, finding_dicts
        from goodlens.analysis.whatif import calibrate
        prov = calibrate(store, "demo-8x",
                         findings=finding_dicts(detect_run(store, "demo-8x"))).provenance
    finally:
        store.close()
    # the what-if page's calibration notes count in the singular for one
    assert prov["node_mtbf_s"] == "measured: 1 failure in 0.2 h of uptime, times 2 nodes"
    assert prov["straggler_per_node_day"] == "measured: 1 flagged episode"
    assert prov["planned_per_day"] == "measured: 0 preemptions"
    assert prov["nodes"] == "measured: 8 ranks, 4 per node"
