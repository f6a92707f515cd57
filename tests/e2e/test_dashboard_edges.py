"""Dashboard edge cases a review found by using it, each pinned by a test (all fixed).

Runs with no wall-clock, silent runs in progress, live runs entering a new attempt, a live
detector with nothing to flag, run ids that need encoding behind the token gate, absurd
what-if inputs, zoom kept across live redraws, honest labels on the cluster page.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from goodlens.analysis.report import report_dict
from goodlens.analysis.runsim.config import SimConfig
from goodlens.analysis.whatif import calibrate, what_if
from goodlens.collector.replay import import_trace
from goodlens.dashboard import figures as fig
from goodlens.dashboard import pages
from goodlens.dashboard.app import create_app, whatif_changes
from goodlens.dashboard.data import RunData
from goodlens.model.batch import Batch, validate_batch
from goodlens.storage.store import Store
from tests.harness import ROOT, Collector, http, push_steps, wait_until

T0 = 1_767_225_600.0


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Store:
    store = Store(tmp_path_factory.mktemp("rv") / "s.duckdb")
    for s in ("sim-64", "demo"):
        import_trace(store, ROOT / "sample_data" / s)
    store.summarize_dirty()
    yield store
    store.close()


def _steps(run: str, ranks: int, steps: range, attempt: int = 0) -> Batch:
    n = ranks * len(steps)
    step = np.repeat(np.asarray(steps, np.int64), ranks)
    rank = np.tile(np.arange(ranks, dtype=np.int64), len(steps))
    return Batch(run_id=run, steps=pa.table({
        "attempt": np.full(n, attempt, np.int64), "rank": rank,
        "host": pa.array([f"h{r // 8}" for r in range(ranks)]).take(pa.array(rank)),
        "step": step, "start_time": T0 + 10 + step * 1.2, "duration_s": np.full(n, 1.1),
        "compute_s": np.full(n, 1.0), "collective_wait_s": np.full(n, 0.1),
        "data_wait_s": pa.nulls(n, pa.float64()), "tokens": pa.nulls(n, pa.int64()),
        "samples": pa.nulls(n, pa.int64())}))


def _dash_post(app, output: str, outputs: list[dict], inputs: list[dict], state=()):
    """One Dash callback request through the Flask test client: (status, JSON or None)."""
    client = app.server.test_client()
    client.get("/")
    r = client.post("/_dash-update-component", json={
        "output": output, "outputs": outputs, "inputs": inputs, "state": list(state),
        "changedPropIds": [f"{i['id']}.{i['property']}" for i in inputs[:1]]})
    return r.status_code, (r.get_json(silent=True) if r.status_code == 200 else None)


def _route(app, path: str):
    return _dash_post(app, "page.children", {"id": "page", "property": "children"},
                      [{"id": "url", "property": "pathname", "value": path}],
                      [{"id": "url", "property": "search", "value": ""}])


# ---------------------------------------------------------------------------- what-if
# regression (found in review): app.route calls data.whatif_calibration unguarded: calibrate()
# raises ValueError for a run with no wall-clock (registered by an exporter, nothing yet), so
# /runs/ID/whatif answers 500, blank page
def test_whatif_page_of_a_run_without_wall_clock_renders(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    try:
        store.write_group([validate_batch({"schema_version": 1, "run_id": "meta",
                                           "run": {"world_size": 8}})])
        store.summarize_dirty()
        app = create_app(store)
        assert _route(app, "/runs/meta")[0] == 200  # the other pages cope
        status, _ = _route(app, "/runs/meta/whatif")
        assert status == 200
    finally:
        store.close()


# regression (found in review): whatif_changes bounds spares below only; the simulator allocates a
# list per spare per trial (1e6 spares: 3 s, 1e8: minutes and GBs inside the collector process)
def test_whatif_refuses_absurd_spare_counts() -> None:
    base = SimConfig(nodes=4, interval_s=600)
    with pytest.raises(ValueError):
        whatif_changes(base, 10, "sync", "spares", 10**9, [])


# regression (found in review): calibrate() leaves spare_swap_s at the simulator default (120 s)
# although the run measured a 20 s queue per failure, so 'swap in a hot spare' loses 2 points on
# sim-64, more with more spares
def test_hot_spares_do_not_cost_goodput_on_sim64(samples: Store) -> None:
    cal = calibrate(samples, "sim-64")
    res = what_if(cal, {"elastic": "spares", "spares": 8}, trials=40)
    assert res["delta_points"] > -0.5


# regression (found in review): whatif_body lists only provenance starting with 'measured', so the
# assumed MTBF (T/2.3, min 1 h) of a failure-free run is hidden while the note says unlisted
# fields keep the simulator's defaults
def test_whatif_lists_fitted_assumptions(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    try:
        store.write_group([validate_batch({
            "schema_version": 1, "run_id": "ok", "run": {"world_size": 8},
            "events": {"source": "t", "seq": [0, 1], "kind": ["attempt_start", "attempt_end"],
                       "time": [T0, T0 + 300], "attempt": 0, "cause": [None, "completed"]}})])
        store.write_group([_steps("ok", 8, range(200))])
        store.summarize_dirty()
        cal = calibrate(store, "ok")
        assert cal.provenance["node_mtbf_s"].startswith("assumed")
        assert cal.config.node_mtbf_s != SimConfig().node_mtbf_s  # fitted, not the default
        body = pages.whatif_body(what_if(cal, {}, trials=2), cal)
        assert "node_mtbf_s" in str(body)
    finally:
        store.close()


# ---------------------------------------------------------------------------- overview
# regression (found in review): RunData caches the overview per run version; a run in progress
# that sends nothing (a hang) keeps the wall-clock of the first render, while goodlens report
# counts to now
def test_overview_of_a_silent_running_run_follows_the_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(tmp_path / "s.duckdb")
    try:
        store.write_group([validate_batch({
            "schema_version": 1, "run_id": "r", "run": {"world_size": 4},
            "events": {"source": "t", "seq": [0], "kind": ["attempt_start"], "time": [T0],
                       "attempt": 0}})])
        store.write_group([_steps("r", 4, range(50))])
        store.summarize_dirty()
        import goodlens.analysis.window as win  # the accounting's clock (run_span)
        clock = {"now": T0 + 100.0}
        fake = types.SimpleNamespace(time=lambda: clock["now"])
        monkeypatch.setattr(win, "time", fake)
        import goodlens.dashboard.data as dd
        monkeypatch.setattr(dd, "time", fake)  # the page's clock is the report's
        data = RunData(store)
        data.overview("r")
        clock["now"] += 600.0  # ten minutes without a word from the job
        shown = data.overview("r")["report"]["wall_clock_s"]
        assert shown == pytest.approx(report_dict(store, "r")["wall_clock_s"])
    finally:
        store.close()


# regression (found in review): _timeline_events keeps attempt_end with any cause; a 'completed'
# end is drawn as the red failure x
def test_completed_attempt_is_not_drawn_as_a_failure(samples: Store) -> None:
    d = RunData(samples).overview("sim-64")
    f = fig.timeline_figure(d["attempts"], d["events"], d["report"]["end"])
    red = [t for t in f.data if getattr(t.marker, "color", None) == "#d62728"]
    assert not any("cause completed" in str(x) for t in red for x in (t.text or []))


# ---------------------------------------------------------------------------- ranks
# regression (found in review): heatmap_figure puts the pooled value (the mean in 'the mean' mode)
# in customdata[1], which hover labels 'slowest rank N: X s'
def test_heatmap_hover_in_mean_mode_shows_the_slowest_ranks_time(samples: Store) -> None:
    grid = samples.heatmap("sim-64", 2, 300, 2627, 16, 30)
    f = fig.heatmap_figure(grid, "mean")
    shown = np.asarray(f.data[0].customdata, float)[..., 1]
    truth = grid.pivot(index="rbin", columns="sbin", values="max").to_numpy(float)
    assert np.allclose(shown, truth, rtol=1e-5)


# regression (found in review): RunData.findings submits a new batch scan at every run version and
# never cancels superseded ones: a watched live run queues one full detect_run per refresh
def test_superseded_batch_scans_are_dropped(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(tmp_path / "s.duckdb")
    try:
        store.write_group([_steps("g", 8, range(20))])
        store.summarize_dirty()
        calls = []
        gate = threading.Event()

        def slow_detect(source, run_id, config=None):
            calls.append(run_id)
            gate.wait(30)   # a scan outlasting every refresh below, however loaded the box
            return []
        monkeypatch.setattr("goodlens.dashboard.data.detect_run", slow_detect)
        data = RunData(store)
        for i in range(1, 6):  # five refreshes of a live run while the first scan runs
            data.findings("g")
            store.write_group([_steps("g", 8, range(20 * i, 20 * i + 20))])
            store.summarize_dirty()
        gate.set()
        data.findings("g", wait=True)
        assert len(calls) <= 2, f"{len(calls)} scans of one run"
    finally:
        store.close()


# ---------------------------------------------------------------------------- token gate
# regression (found in review): dashboard_asgi's token redirect uses the decoded scope['path']:
# /runs/a%2Fb%20c/ranks?token=T redirects to '/runs/a/b c/ranks' (no page there)
def test_token_redirect_keeps_the_encoded_path(tmp_path: Path) -> None:
    from goodlens.dashboard.asgi import dashboard_asgi
    store = Store(tmp_path / "s.duckdb")
    try:
        gate = dashboard_asgi(create_app(store), token="t")
        sent = []

        async def receive():
            return {"type": "http.request", "body": b""}

        async def send(msg):
            sent.append(msg)
        asyncio.run(gate({"type": "http", "method": "GET", "path": "/runs/a/b c/ranks",
                          "raw_path": b"/runs/a%2Fb%20c/ranks", "query_string": b"token=t",
                          "headers": []}, receive, send))
        headers = dict(sent[0]["headers"])
        assert headers[b"location"] == b"/runs/a%2Fb%20c/ranks"
    finally:
        store.close()


# ---------------------------------------------------------------------------- cluster page
# regression (found in review): metric_rows prints '-0ms' for an unchanged seconds metric (the
# sign is '-' unless d > 0)
def test_cluster_delta_of_equal_waits_has_no_sign() -> None:
    from goodlens.dashboard import cluster
    spec = cluster.policy_spec(cluster.DEFAULT_A)
    result = cluster.CompareCache().run("test-64", spec, spec, 0)
    rows = {r[0]: r for r in cluster.metric_rows(result)}
    assert not rows["mean wait to first start"][3].startswith("-")
    assert {r[3] for r in rows.values()} == {"0"}  # the same policy twice: no difference


# regression (found in review): cluster_layout labelled presets with getattr(v,
# 'description'), which ClusterConfig lacks (it has describe()): bare names, no size
def test_cluster_preset_labels_say_what_the_cluster_is() -> None:
    from goodlens.dashboard import cluster
    dd = []

    def walk(c):
        if getattr(c, "id", None) == "cluster-preset":
            dd.append(c)
        kids = getattr(c, "children", None)
        for k in kids if isinstance(kids, list) else [kids] if kids is not None else []:
            walk(k)
    walk(cluster.cluster_layout())
    assert all(o["label"] != o["value"] for o in dd[0].options)


# ---------------------------------------------------------------------------- browser, live
@pytest.mark.slow
# regression (found in review): the attempt dropdown is built once by route(); a live run's new
# attempt never appears and the heatmap stays on the old one
def test_ranks_page_follows_a_new_attempt(tmp_path: Path, dash_br) -> None:
    c = Collector(tmp_path / "live.duckdb", "--no-detect").start()
    try:
        push_steps(c, "live", list(range(20)))
        dash_br.server_url = c.url + "/runs/live/ranks"
        dash_br.wait_for_contains_text("#rk-note", "of attempt 0", timeout=30)
        ev = {"schema_version": 1, "run_id": "live", "events": {
            "source": "launcher", "seq": [0, 1], "kind": ["attempt_end", "attempt_start"],
            "time": [1020.0, 1021.0], "attempt": [0, 1], "cause": ["failed", None]}}
        assert http("POST", c.url + "/v1/ingest", json.dumps(ev).encode())[0] == 200
        push_steps(c, "live", list(range(20, 40)), attempt=1)
        status, run = http("GET", c.url + "/v1/runs/live")
        assert status == 200 and [a["attempt"] for a in run["attempts"]] == [0, 1]
        assert wait_until(lambda: "of attempt 1" in dash_br.driver.execute_script(
            "var e=document.querySelector('#rk-note'); return e?e.innerText:''"))
    finally:
        c.stop()



@pytest.mark.slow
# regression (found in review): a live-detected run with nothing flagged has no stored findings;
# the ranks page then batch-scans it and says 'no live detector saw it' on a collector whose live
# detector is running
def test_ranks_page_does_not_deny_the_live_detector(tmp_path: Path, dash_br) -> None:
    c = Collector(tmp_path / "live.duckdb").start()  # --detect is the default
    try:
        push_steps(c, "healthy", list(range(60)))
        dash_br.server_url = c.url + "/runs/healthy/ranks"
        dash_br.wait_for_element("#findings-source", timeout=30)
        time.sleep(1)
        text = dash_br.find_element("#findings-source").text
        assert "no live detector saw it" not in text
    finally:
        c.stop()
