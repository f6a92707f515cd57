"""Dashboard pieces without a browser: figure builders, page layouts, the data layer's
cache, the store's pooled heatmap, the checkpoint table and the what-if calibration."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from goodlens.analysis.accounting import BUCKETS, account_run
from goodlens.analysis.checkpoints import checkpoint_table
from goodlens.analysis.report import report_dict
from goodlens.analysis.runsim.config import SimConfig
from goodlens.analysis.whatif import calibrate, what_if
from goodlens.collector.replay import import_trace
from goodlens.dashboard import figures as fig
from goodlens.dashboard import pages
from goodlens.dashboard.app import create_app, parse_path, whatif_changes
from goodlens.dashboard.data import DashConfig, RunData, _host_rollup
from goodlens.model.batch import Batch, validate_batch
from goodlens.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_767_225_600.0


@pytest.fixture(scope="module")
def sim64(tmp_path_factory: pytest.TempPathFactory) -> Store:
    store = Store(tmp_path_factory.mktemp("d") / "s.duckdb")
    import_trace(store, ROOT / "sample_data" / "sim-64")
    store.summarize_dirty()
    yield store
    store.close()


def _grid_store(tmp_path: Path, ranks: int, steps: int, slow_rank: int, slowdown: float
                ) -> Store:
    """One attempt, ``ranks`` x ``steps``, compute 1.0 s (+-0.5%) except one slow rank."""
    store = Store(tmp_path / "grid.duckdb")
    rng = np.random.default_rng(1)
    step = np.repeat(np.arange(steps, dtype=np.int64), ranks)
    rank = np.tile(np.arange(ranks, dtype=np.int64), steps)
    compute = 1.0 + 0.005 * rng.standard_normal(ranks * steps)
    compute[rank == slow_rank] *= 1 + slowdown
    store.write_group([validate_batch({
        "schema_version": 1, "run_id": "g", "run": {"world_size": ranks},
        "events": {"source": "t", "seq": [0], "kind": ["attempt_start"], "time": [T0],
                   "attempt": 0}})])
    store.write_group([Batch(run_id="g", steps=pa.table({
        "attempt": np.zeros(len(step), np.int64), "rank": rank,
        "host": pa.array([f"h{r // 8}" for r in range(ranks)]).take(pa.array(rank)),
        "step": step, "start_time": T0 + 10 + step * 1.2, "duration_s": np.full(len(step), 1.1),
        "compute_s": compute, "collective_wait_s": 1.1 - compute,
        "data_wait_s": pa.nulls(len(step), pa.float64()),
        "tokens": pa.nulls(len(step), pa.int64()), "samples": pa.nulls(len(step), pa.int64())}))])
    store.summarize_dirty()
    return store


# ---------------------------------------------------------------------------- pure
def test_parse_path_round_trips_run_ids_with_slashes() -> None:
    assert parse_path("/") == ("runs", None)
    assert parse_path(None) == ("runs", None)
    assert parse_path("/runs/") == ("runs", None)
    assert parse_path("/cluster") == ("cluster", None)
    for rid in ["plain", "team/job 7", "a%b"]:
        for page in ["overview", "ranks", "checkpoints", "whatif"]:
            assert parse_path(pages.run_href(rid, page)) == (page, rid)
    assert parse_path("/runs/x/nope") == ("unknown", None)
    assert parse_path("/elsewhere") == ("unknown", None)


def test_breakdown_figure_adds_up_to_the_wall_clock(sim64: Store) -> None:
    rep = report_dict(sim64, "sim-64")
    f = fig.breakdown_figure(rep)
    total_h = sum(float(t.x[0]) for t in f.data)
    assert total_h == pytest.approx(rep["wall_clock_s"] / 3600, rel=1e-9)
    restart_h = sum(float(t.x[0]) for t in f.data if t.y[0] == "restart")
    assert restart_h == pytest.approx(rep["buckets"]["restart"] / 3600, rel=1e-9)
    assert fig.breakdown_figure({"wall_clock_s": 0}).layout.annotations[0].text == \
        "no wall-clock yet"


def _by_id(component: object) -> dict[str, object]:
    """Every component with a string id under ``component`` (itself included), by id."""
    found: dict[str, object] = {}

    def walk(c: object) -> None:
        cid = getattr(c, "id", None)
        if isinstance(cid, str):
            found[cid] = c
        kids = getattr(c, "children", None)
        for k in kids if isinstance(kids, list) else [kids] if kids is not None else []:
            walk(k)
    walk(component)
    return found


def test_the_first_start_up_is_shown_apart_from_restarts(sim64: Store) -> None:
    """sim-64's config starts every attempt with 60 s of init (``init_s``): the first
    attempt's is its own bar row and table rows (``startup``), not part of ``restart``; the
    attempts table has a startup column; the exclusion choice ``init`` takes both."""
    cfg = json.loads((ROOT / "sample_data/sim-64/ground_truth.json").read_text())["config"]
    rep = report_dict(sim64, "sim-64")
    f = fig.breakdown_figure(rep)
    startup = {t.name: float(t.x[0]) * 3600 for t in f.data if t.y[0] == "startup"}
    assert startup["startup: init"] == pytest.approx(cfg["init_s"], abs=1e-6)
    assert sum(startup.values()) == pytest.approx(rep["buckets"]["startup"], rel=1e-9)
    restart = sum(float(t.x[0]) * 3600 for t in f.data if t.y[0] == "restart")
    assert restart == pytest.approx(rep["buckets"]["restart"], rel=1e-9)
    parts = pages.overview_parts(RunData(sim64).overview("sim-64"))
    found = _by_id(parts["ov-buckets"])
    assert "row-startup" in found and found["startup-init"].title == f"{cfg['init_s']:.2f} s"
    head = [th.children for th in parts["ov-attempts"].children[0].children.children]
    assert head[4:6] == ["startup", "restart"]
    rows = parts["ov-attempts"].children[1].children
    # attempt 0 holds the run's start-up (60 s init and its first step's warm-up)
    assert rows[0].children[4].children == pages._dur(rep["buckets"]["startup"])
    assert all(r.children[4].children == "0ms" for r in rows[1:])
    init = next(o for o in parts["overview-exclude"] if o["value"] == "init")
    both = rep["startup_parts"]["init"] + rep["restart_parts"]["init"]
    assert init["label"] == f" init ({pages._dur(both)})"


def test_goodput_series_shares_stack_to_100(sim64: Store) -> None:
    series = account_run(sim64, "sim-64").goodput_series(points=50)
    f = fig.goodput_series_figure(series)
    assert [t.name for t in f.data] == [fig.label(b) for b in BUCKETS]
    stacked = np.sum([np.asarray(t.y, float) for t in f.data], axis=0)
    assert np.allclose(stacked, 100, atol=1e-6)
    assert "not enough data" in fig.goodput_series_figure(
        series.iloc[:0]).layout.annotations[0].text


def test_timeline_marks_each_failure_once(sim64: Store) -> None:
    d = RunData(sim64).overview("sim-64")
    f = fig.timeline_figure(d["attempts"], d["events"], d["report"]["end"])
    attempts = [t for t in f.data if t.y[0] == "attempts"]
    assert len(attempts) == len(d["attempts"]) == 3
    failures = [t for t in f.data if t.name == "failure"]
    truth = json.loads((ROOT / "sample_data/sim-64/ground_truth.json").read_text())
    n_fail = sum(1 for a in d["attempts"].end_reason if a == "failed")
    assert len(failures[0].x) == n_fail == 2
    ckpts = [t for t in f.data if t.name == "checkpoint"]
    assert len(ckpts[0].x) == len(checkpoint_table(sim64.events("sim-64")))
    assert truth["run_id"] == "sim-64"


def test_overview_page_carries_the_report_exactly(sim64: Store) -> None:
    rep = report_dict(sim64, "sim-64")
    found = _by_id(pages.overview_body(RunData(sim64).overview("sim-64")))
    assert found["headline-goodput"].children == fig.pct(rep["goodput"])
    for b, v in rep["buckets"].items():
        assert found[f"bucket-{b}"].title == f"{v:.2f} s"


def test_heatmap_max_pooling_keeps_one_slow_rank_visible(tmp_path: Path) -> None:
    """512 ranks pooled into 32 bins (16 ranks each): max-pooling shows a 10% slow rank at
    about +10%; mean pooling dilutes it to about 10/16 %."""
    store = _grid_store(tmp_path, ranks=512, steps=40, slow_rank=300, slowdown=0.10)
    try:
        grid = store.heatmap("g", 0, 0, 39, rank_bins=32, step_bins=10)
        assert len(grid) == 32 * 10
        assert set(grid.rank_hi - grid.rank_lo) == {15}
        f = fig.heatmap_figure(grid, "max")
        z = np.asarray(f.data[0].z, float)
        slow_bin = 300 * 32 // 512
        assert z[slow_bin].min() > 7.0 and np.delete(z, slow_bin, axis=0).max() < 3.0
        assert set(grid[grid.rbin == slow_bin].worst_rank) == {300}
        zm = np.asarray(fig.heatmap_figure(grid, "mean").data[0].z, float)
        assert 0.3 < zm[slow_bin].mean() < 1.0
        # pandas over the raw rows agrees with the store's pooled grid
        raw = store.steps("g")
        raw["rbin"] = raw["rank"] * 32 // 512
        raw["sbin"] = raw["step"] * 10 // 40
        ref = raw.groupby(["rbin", "sbin"]).compute_s.agg(["mean", "max"]).reset_index()
        merged = grid.merge(ref, on=["rbin", "sbin"], suffixes=("", "_ref"))
        assert np.allclose(merged["mean"], merged.mean_ref)
        assert np.allclose(merged["max"], merged.max_ref)
        hosts = store.host_compute("g", 0, 0, 39)
        assert len(hosts) == 64 and hosts.loc[hosts.worst_rank == 300, "host"].item() == "h37"
    finally:
        store.close()


def test_ranks_data_finds_the_planted_rank_in_a_batch_pass(tmp_path: Path) -> None:
    store = _grid_store(tmp_path, ranks=64, steps=200, slow_rank=21, slowdown=0.15)
    try:
        data = RunData(store)
        first = data.ranks("g")  # the batch scan runs off the callback thread
        assert first["findings_source"] in ("pending", "batch")
        data.findings("g", wait=True)
        d = data.ranks("g")
        assert d["findings_source"] == "batch"
        subjects = {(f["subject_kind"], str(f["subject_id"])) for f in d["findings"]}
        assert ("rank", "21") in subjects
        h = d["hosts"]
        assert h.sort_values("relative").host.iloc[-1] == "h2"  # rank 21's host
        assert h.loc[h.host == "h2", "worst_relative"].item() == pytest.approx(0.15, abs=0.01)
        body = pages.ranks_body(d)
        assert body is not None
    finally:
        store.close()


def test_data_cache_follows_the_run_version(tmp_path: Path, monkeypatch) -> None:
    # the run has not ended, so its version also moves with the clock, one step per refresh
    # period (5 s): the clock is held still here, so a slow first read that ends past a
    # period's end cannot rightly make the second one new
    import goodlens.dashboard.data as dash_data
    clock = [T0 + 1e6 + 0.5]  # 0.5 s into a refresh period (T0 and 1e6 are multiples of 5)
    monkeypatch.setattr(dash_data, "time", SimpleNamespace(time=lambda: clock[0]))
    store = _grid_store(tmp_path, ranks=8, steps=20, slow_rank=0, slowdown=0.0)
    try:
        data = RunData(store)
        a = data.overview("g")
        assert data.overview("g") is a  # unchanged run: served from the cache
        clock[0] += 4.0
        assert data.overview("g") is a  # 4.5 s in: the same refresh period
        clock[0] += 5.0
        moved = data.overview("g")  # 9.5 s in: the next period, drawn anew
        assert moved is not a and data.overview("g") is moved
        a = moved
        step = np.repeat(np.arange(20, 30, dtype=np.int64), 8)
        rank = np.tile(np.arange(8, dtype=np.int64), 10)
        store.write_group([Batch(run_id="g", steps=pa.table({
            "attempt": np.zeros(80, np.int64), "rank": rank, "host": ["h0"] * 80,
            "step": step, "start_time": T0 + 10 + step * 1.2, "duration_s": np.full(80, 1.1),
            "compute_s": np.full(80, 1.0), "collective_wait_s": np.full(80, 0.1),
            "data_wait_s": pa.nulls(80, pa.float64()), "tokens": pa.nulls(80, pa.int64()),
            "samples": pa.nulls(80, pa.int64())}))])
        store.summarize_dirty()
        b = data.overview("g")
        assert b is not a and b["report"]["wall_clock_s"] > a["report"]["wall_clock_s"]
        assert data.overview("missing") is None
    finally:
        store.close()


def test_checkpoint_table_spans_first_start_to_last_end() -> None:
    rows = []
    for rank, lag in enumerate([0.0, 0.5, 1.5]):  # three ranks, the last one slowest
        for kind, t, b in [("ckpt_save_start", 100.0 + lag / 10, None),
                           ("ckpt_save_blocking_end", 102.0 + lag, None),
                           ("ckpt_save_durable_end", 130.0 + lag, 1_000_000)]:
            rows.append({"kind": kind, "time": t, "attempt": 0, "step": 500, "tier": "durable",
                         "source": f"r{rank}", "bytes": b})
    rows.append({"kind": "ckpt_save_start", "time": 200.0, "attempt": 0, "step": 600,
                 "tier": "durable", "source": "r0", "bytes": None})  # sync, not yet durable
    t = checkpoint_table(pd.DataFrame(rows))
    assert list(t.step) == [500, 600]
    first = t.iloc[0]
    assert first.stall_s == pytest.approx(3.5) and first.write_s == pytest.approx(31.5)
    assert first["bytes"] == 3_000_000 and first.ranks == 3
    assert np.isnan(t.iloc[1].stall_s) and np.isnan(t.iloc[1].write_s)
    assert checkpoint_table(pd.DataFrame(columns=["kind"])).empty


def test_calibration_recovers_the_simulated_runs_config(sim64: Store) -> None:
    truth = json.loads((ROOT / "sample_data/sim-64/ground_truth.json").read_text())["config"]
    cal = calibrate(sim64, "sim-64")
    c = cal.config
    assert (c.nodes, c.gpus_per_node) == (truth["nodes"], truth["gpus_per_node"])
    assert c.ckpt_mode == truth["ckpt_mode"] == "async"
    assert c.snapshot_s == pytest.approx(truth["snapshot_s"], rel=0.01)
    assert c.write_s == pytest.approx(truth["write_s"], rel=0.01)
    assert c.restore_s == pytest.approx(truth["restore_s"], rel=0.01)
    assert c.init_s == pytest.approx(truth["init_s"], rel=0.01)
    assert c.step_s == pytest.approx(truth["step_s"], rel=0.15)
    assert c.duration_s == pytest.approx(truth["duration_s"], rel=0.01)
    assert cal.provenance["node_mtbf_s"].startswith("measured")
    # no change, same seeds: the two simulated breakdowns are identical
    same = what_if(cal, {}, trials=10)
    assert same["delta_points"] == 0.0 and same["baseline"] == same["changed"]
    for part in ("baseline", "changed"):
        assert sum(same[part]["buckets"].values()) == pytest.approx(c.duration_s, rel=1e-9)
    with pytest.raises(ValueError, match="no simulator field"):
        what_if(cal, {"intervall_s": 60})


def test_whatif_form_validation() -> None:
    base = SimConfig(nodes=4, interval_s=600, ckpt_mode="sync")
    # the interval is a duration as the box shows it: "10m 00s", "10m", "600" (seconds)
    for same in ("10m 00s", "10m", "600", 600):
        assert whatif_changes(base, same, "sync", "restart", 0, []) == {}
    assert whatif_changes(base, "5m", "async", "restart", 0, ["evict"]) == {
        "interval_s": 300.0, "ckpt_mode": "async", "evict_stragglers": True}
    assert whatif_changes(base, "1h30m", "sync", "restart", 0, []) == {"interval_s": 5400.0}
    assert whatif_changes(base, "10m", "sync", "spares", 2, []) == {"elastic": "spares",
                                                                    "spares": 2}
    # picking the spares policy means at least one spare
    assert whatif_changes(base, "10m", "sync", "spares", 0, []) == {"elastic": "spares",
                                                                    "spares": 1}
    for bad, msg in [(("0s", "sync", "restart", 0, []), "at least 6s"),
                     (("5s", "sync", "restart", 0, []), "at least 6s"),
                     ((None, "sync", "restart", 0, []), "at least 6s"),
                     (("ten minutes", "sync", "restart", 0, []), "at least 6s"),
                     (("10m", "sync", "restart", -1, []), "whole number"),
                     (("10m", "sync", "restart", 1.5, []), "whole number"),
                     (("10m", "sync", "spares", 5, []), "at most 4 hot spares")]:
        with pytest.raises(ValueError, match=msg):
            whatif_changes(base, *bad)
    with pytest.raises(ValueError, match="cannot shrink"):
        whatif_changes(SimConfig(nodes=1), "30m", "sync", "shrink", 0, [])


def test_empty_and_tiny_runs_render(tmp_path: Path) -> None:
    store = Store(tmp_path / "e.duckdb")
    try:
        data = RunData(store, DashConfig())
        assert data.runs() == ([], 0)
        assert "No runs yet" in str(pages.runs_body([]))
        # a run that has only started: no steps, no wall-clock to speak of
        store.write_group([validate_batch({
            "schema_version": 1, "run_id": "new", "events": {
                "source": "t", "seq": [0], "kind": ["attempt_start"], "time": [T0],
                "attempt": 0}})])
        store.summarize_dirty()
        assert pages.overview_body(data.overview("new")) is not None
        rk = data.ranks("new")
        assert rk["grid"] is None and rk["findings"] == []
        assert pages.ranks_body(rk) is not None
        assert pages.checkpoints_body(data.checkpoints("new")) is not None
        # in progress since T0: the what-if simulates it as it stands, without step data
        cal = calibrate(store, "new")
        assert cal.provenance["step_s"].startswith("assumed")
        res = what_if(cal, {}, trials=2)
        assert sum(res["baseline"]["buckets"].values()) == pytest.approx(cal.config.duration_s)
        assert create_app(store) is not None
    finally:
        store.close()


def test_checkpoint_and_whatif_figures(sim64: Store) -> None:
    d = RunData(sim64).checkpoints("sim-64")
    f = fig.checkpoint_figure(d["table"])
    stall = next(t for t in f.data if t.name.startswith("stall ("))
    assert list(stall.y) == list(d["table"].stall_s)
    g = fig.interval_figure(d["measured"])
    best = next(t for t in g.data if t.name == "best")
    assert best.x[0] == pytest.approx(d["measured"]["best_interval_s"] / 60)
    cal = calibrate(sim64, "sim-64")
    res = what_if(cal, {"interval_s": cal.config.interval_s / 4}, trials=8)
    w = fig.whatif_figure(res)
    stacks = np.sum([np.asarray(t.y, float) for t in w.data], axis=0)
    assert np.allclose(stacks, 100, atol=1e-6)


# ---------------------------------------------------------------------------- cluster page
def test_cluster_page_pieces() -> None:
    from goodlens.analysis.clustersim.config import Policy
    from goodlens.dashboard import cluster
    for side in (cluster.DEFAULT_A, cluster.DEFAULT_B,
                 {"gang": False, "topo": True, "fair": False, "preempt": "kill", "spares": 3}):
        spec = cluster.policy_spec(side)
        p = Policy.parse(spec)
        assert (p.gang, p.topo, p.fair, p.preempt, p.spares) == (
            side["gang"], side["topo"], side["fair"], side["preempt"], side["spares"])
    a, b = cluster.policy_spec(cluster.DEFAULT_A), cluster.policy_spec(cluster.DEFAULT_B)
    cache = cluster.CompareCache()
    res = cache.run("test-64", a, b, 0)
    assert cache.run("test-64", a, b, 0) is res  # cached
    f = cluster.node_hours_figure(res)
    for i, side in enumerate(("a", "b")):
        left = sum(t.y[i] for t in f.data if t.xaxis == "x")
        assert left == pytest.approx(res[side]["cluster"]["node_seconds"]["total"] / 3600)
    rows = {r[0]: r for r in cluster.metric_rows(res)}
    m = {x["metric"]: x for x in res["metrics"]}
    assert rows["jobs done"][1:3] == [f"{m['jobs_done']['a']:,}", f"{m['jobs_done']['b']:,}"]
    assert rows["utilisation (allocated)"][1] == fig.pct(m["utilisation"]["a"])
    # the CLI's rows, names and order, job goodput among them
    from goodlens.analysis.clusterrows import CLUSTER_ROWS
    assert list(rows) == [label for _, label, _ in CLUSTER_ROWS]
    g = rows["job goodput (productive / job wall-clock)"]
    ga, gb = res["a"]["cluster"]["goodput"], res["b"]["cluster"]["goodput"]
    assert g[1:] == [fig.pct(ga), fig.pct(gb), f"{100 * (gb - ga):+.1f} pt"]
    own = cluster.owners_figure(res)
    target = next(t for t in own.data if t.name == "target share")
    assert sum(target.y) == pytest.approx(100.0)
    assert cluster.cluster_body(res) is not None and cluster.cluster_layout() is not None


def test_heatmap_scans_the_latest_steps_unless_asked_for_all(tmp_path: Path) -> None:
    store = _grid_store(tmp_path, ranks=64, steps=100, slow_rank=3, slowdown=0.1)
    try:
        data = RunData(store, DashConfig(heatmap_max_rows=64 * 30))
        latest = data.ranks("g")
        assert latest["window"] == (70, 99, 64) and latest["clipped"]
        assert "the latest steps" in str(pages.ranks_body(latest))
        whole = data.ranks("g", whole=True)
        assert whole["window"] == (0, 99, 64) and not whole["clipped"]
    finally:
        store.close()



def test_step_range_of_a_time_window(tmp_path: Path) -> None:
    """The store maps a window to the steps whose time overlaps it. The grid store's step n
    runs from T0 + 10 + 1.2 n to T0 + 11.1 + 1.2 n (1.1 s steps, 0.1 s apart), so by hand:
    from T0 + 21.95 (between step 9's end at 21.9 and step 10's start at 22.0) to T0 + 40.5
    (inside step 25, 40.0-41.1) is steps 10-25; from inside step 9 (21.85) to the gap after
    step 24 (39.95) is steps 9-24."""
    store = _grid_store(tmp_path, ranks=16, steps=40, slow_rank=3, slowdown=0.1)
    try:
        assert store.step_range("g", 0) == (0, 39, 16)
        assert store.step_range("g", 0, T0 + 21.95, T0 + 40.5) == (10, 25, 16)
        assert store.step_range("g", 0, T0 + 21.85, T0 + 39.95) == (9, 24, 16)
        assert store.step_range("g", 0, since=T0 + 50.0) == (33, 39, 16)  # 11.1 + 1.2 * 33
        assert store.step_range("g", 0, until=T0 + 12.0) == (0, 1, 16)  # 11.2: step 1 starts
        assert store.step_range("g", 0, T0 + 100.0, None) is None  # after the last step
        assert store.step_range("g", 0, None, T0 + 5.0) is None  # before the first
        assert store.step_range("g", 1) is None  # no such attempt
        # the ranks page over the same window: its grid and hosts cover steps 10-25 only
        data = RunData(store)
        rk = data.ranks("g", since=str(T0 + 21.95), until=str(T0 + 40.5))
        assert rk["window"] == (10, 25, 16) and not rk["clipped"]
        assert (rk["since"], rk["until"]) == (T0 + 21.95, T0 + 40.5)
        assert (int(rk["grid"].step_lo.min()), int(rk["grid"].step_hi.max())) == (10, 25)
        assert list(rk["hosts"].host) == ["h0", "h1"] and list(rk["hosts"].ranks) == [8, 8]
        note = pages.ranks_note(rk)
        assert note.title == "10 25 0"
        assert note.children == ("steps 10-25 of attempt 0, 16 ranks, in the window "
                                 "2026-01-01 00:00:21 UTC to 2026-01-01 00:00:40 UTC")
        # relative forms are read against the run (its attempt started at T0): +50s
        assert data.ranks("g", since="+50s")["window"] == (33, 39, 16)
        # a window with no steps says so, for the latest attempt or a picked one
        empty = data.ranks("g", since=str(T0 + 100.0))
        assert empty["grid"] is None and empty["hosts"] is None
        assert pages.ranks_note(empty).children == (
            "No steps of any attempt in the window 2026-01-01 00:01:40 UTC to the run's end.")
        picked = data.ranks("g", 0, since=str(T0 + 100.0))
        assert pages.ranks_note(picked).children.startswith("No steps of attempt 0 in the ")
        parts = pages.ranks_parts(picked)
        assert parts["heatmap-graph"].layout.annotations[0].text.startswith("No steps of ")
        # text that is not a time: the whole attempt, and why
        bad = data.ranks("g", since="yesterday-ish")
        assert bad["window"] == (0, 39, 16)
        assert pages.ranks_note(bad).children.startswith("Window not applied: ")
    finally:
        store.close()


def test_host_rollup_counts_a_rank_that_moved_on_each_host(tmp_path: Path) -> None:
    """4 ranks x 10 steps, compute 1.0 s except rank 3 at 2.0 s; ranks 0-1 on host a, 2-3
    on b, but rank 3 on c for steps 5-9. Over steps 0-9 rank 3 counts on b (steps 0-4) and
    on c (5-9): b's mean is (1 + 2) / 2, c holds rank 3 alone. Over steps 0-4 it is on b
    at both ends (the quick per-rank path); over 5-9 on c."""
    store = Store(tmp_path / "moved.duckdb")
    try:
        step = np.repeat(np.arange(10, dtype=np.int64), 4)
        rank = np.tile(np.arange(4, dtype=np.int64), 10)
        host = np.where(rank < 2, "a", np.where((rank == 3) & (step >= 5), "c", "b"))
        store.write_group([validate_batch({
            "schema_version": 1, "run_id": "m", "run": {"world_size": 4},
            "events": {"source": "t", "seq": [0], "kind": ["attempt_start"], "time": [T0],
                       "attempt": 0}})])
        store.write_group([Batch(run_id="m", steps=pa.table({
            "attempt": np.zeros(40, np.int64), "rank": rank, "host": host.tolist(),
            "step": step, "start_time": T0 + 10 + step * 3.0,
            "duration_s": np.full(40, 2.5), "compute_s": np.where(rank == 3, 2.0, 1.0),
            "collective_wait_s": pa.nulls(40, pa.float64()),
            "data_wait_s": pa.nulls(40, pa.float64()),
            "tokens": pa.nulls(40, pa.int64()), "samples": pa.nulls(40, pa.int64())}))])
        store.summarize_dirty()

        def rows(lo: int, hi: int) -> list[tuple]:
            """(host, ranks, mean, slowest rank's mean, slowest rank, first rank); host a's
            two ranks tie (1.0 s each), so its slowest is either: shown as -1."""
            h = store.host_compute("m", 0, lo, hi)
            return [(r.host, int(r.ranks), r.mean, r.worst_rank_mean,
                     -1 if r.host == "a" else int(r.worst_rank), int(r.first_rank))
                    for r in h.itertuples()]
        a = ("a", 2, 1.0, 1.0, -1, 0)
        assert rows(0, 9) == [a, ("b", 2, 1.5, 2.0, 3, 2), ("c", 1, 2.0, 2.0, 3, 3)]
        assert rows(0, 4) == [a, ("b", 2, 1.5, 2.0, 3, 2)]
        assert rows(5, 9) == [a, ("b", 1, 1.0, 1.0, 2, 2), ("c", 1, 2.0, 2.0, 3, 3)]
        assert rows(3, 6) == [a, ("b", 2, 1.5, 2.0, 3, 2), ("c", 1, 2.0, 2.0, 3, 3)]
    finally:
        store.close()

def test_fill_goodput_orders_a_goodput_sort_over_every_run() -> None:
    """The runs list's fallback (CLI ``runs --db`` and the dashboard): rows without a stored
    goodput are accounted; sorted by goodput, every matching run is, and the page is cut
    from the order known goodput (descending, ties by run id), then unknown."""
    from goodlens.analysis.report import fill_goodput
    computed = {"b": 0.9, "d": 0.5, "e": None}  # e cannot be accounted

    def every() -> list[dict]:
        return [{"run_id": "a", "goodput": 0.5, "start": 1.0},
                {"run_id": "c", "goodput": 0.7, "start": 1.0},
                {"run_id": "b", "goodput": None, "start": 1.0},
                {"run_id": "d", "goodput": float("nan"), "start": 1.0},
                {"run_id": "e", "goodput": None, "start": 1.0},
                {"run_id": "f", "goodput": None, "start": None}]  # never started: not tried
    asked: list[str] = []

    def account(r: dict) -> dict:
        asked.append(r["run_id"])
        return {"goodput": computed[r["run_id"]]}
    # the store's first page holds only stored goodputs (it sorts the unknown last): the
    # runs after it are asked about, and b's computed 0.9 comes first
    rows = fill_goodput(every()[:2], account, every=every, unknown_after=lambda: True,
                        by_goodput=True, offset=0, limit=3)
    assert [r["run_id"] for r in rows] == ["b", "c", "a"]
    assert sorted(asked) == ["b", "d", "e"]
    assert [r["run_id"] for r in fill_goodput(every()[:2], account, every=every,
                                              unknown_after=lambda: False, by_goodput=True,
                                              limit=2)] == ["a", "c"]  # all known: as is
    rows = fill_goodput(every()[3:], account, every=every, by_goodput=True, offset=3,
                        limit=3)  # the store's second page: unknowns on it
    assert [(r["run_id"], r["goodput"]) for r in rows] == [("d", 0.5), ("e", None),
                                                           ("f", None)]
    rows = fill_goodput(every()[:2], account, every=every, unknown_after=lambda: True,
                        by_goodput=True, descending=False)
    assert [r["run_id"] for r in rows] == ["a", "d", "c", "b", "e", "f"]
    # another sort: only the page's rows are accounted, in the store's order
    asked.clear()
    rows = fill_goodput(every()[2:4], account, every=every, by_goodput=False)
    assert [(r["run_id"], r["goodput"]) for r in rows] == [("b", 0.9), ("d", 0.5)]
    assert asked == ["b", "d"]

def test_overview_exclusions_equal_the_report_with_the_same_exclusions(sim64: Store) -> None:
    """The overview's exclusion checklist takes the same parts out as ``report --exclude``:
    queue (the scheduler's wait, 40.8 s in this run's ground truth) leaves the wall-clock,
    every bucket and each attempt's row agree with the report, and the rolling goodput
    is computed without it too."""
    data = RunData(sim64)
    plain = data.overview("sim-64")
    assert "queue" in plain["report"]["excludable"]
    d = data.overview("sim-64", ("queue",))
    rep = report_dict(sim64, "sim-64", exclude=["queue"])
    assert d["report"]["wall_clock_s"] == pytest.approx(rep["wall_clock_s"], abs=1e-9)
    assert d["report"]["wall_clock_s"] == pytest.approx(
        plain["report"]["wall_clock_s"] - plain["report"]["restart_parts"]["queue"], abs=1e-6)
    assert d["report"]["excluded"] == pytest.approx({"queue": 40.81499468971742}, abs=1e-6)
    assert d["report"]["buckets"] == pytest.approx(rep["buckets"], abs=1e-9)
    assert [a["goodput"] for a in d["report"]["attempts"]] == \
        pytest.approx([a["goodput"] for a in rep["attempts"]], abs=1e-12)
    assert d["series"].goodput.iloc[-1] >= plain["series"].goodput.iloc[-1]
    parts = pages.overview_parts(d)
    assert {o["value"] for o in parts["overview-exclude"]} >= {"queue"}


def test_timeline_draws_eviction_decisions_that_evicted_nothing_apart() -> None:
    """An eviction client's dry run and refusals are ``rank_evicted`` events too; only the
    one that evicted is drawn as an eviction."""
    attempts = pd.DataFrame({"attempt": [0], "start": [0.0], "end": [100.0],
                             "end_reason": ["completed"], "last_activity": [100.0]})
    events = pd.DataFrame({
        "time": [10.0, 20.0, 30.0, 40.0], "attempt": [0, 0, 0, 0],
        "kind": ["rank_evicted"] * 4,
        "cause": ["straggler", "dry_run", "refused:cap", "refused:confidence"],
        "rank": [2, 4, 6, 6], "host": ["n1", "n2", "n3", "n3"]})
    f = fig.timeline_figure(attempts, events, 100.0)
    rows = {t.name: len(t.x) for t in f.data if t.name and not t.name.startswith("attempt")}
    assert rows == {"eviction": 1, "eviction (dry run)": 1, "eviction refused": 2}
    refused = next(t for t in f.data if t.name == "eviction refused")
    assert list(refused.text) == ["eviction (attempt 0), cause refused:cap, rank 6, host n3",
                                  "eviction (attempt 0), cause refused:confidence, rank 6, "
                                  "host n3"]


def test_the_findings_table_shows_both_slowdowns_with_their_meaning() -> None:
    """The ranks page's findings table: ``slowdown`` and ``job_slowdown`` side by side, each
    cell's value and meaning on hover; a finding without ``job_slowdown`` (stored before
    it existed) has an empty cell and no hover, not an error."""
    from dash import html
    f = {"subject_kind": "rank", "subject_id": 21, "relative_to": "the other ranks of host n2",
         "id": "2/rank/21/2141", "attempt": 2, "first_step": 2141, "detected_step": 2152,
         "slowdown": 0.1004, "job_slowdown": 0.0712, "straggler_wait_s": 3.4,
         "wait_per_hour_s": 230.0, "action": "evict", "confidence": 0.751, "status": "update"}
    old = {**f, "id": "1/rank/3/10", "subject_id": 3, "job_slowdown": None,
           "wait_per_hour_s": 10.0}
    parts = pages.ranks_parts({"findings": [f, old], "findings_source": "live", "grid": None,
                               "hosts": None})
    cells: list[html.Td] = []

    def walk(c: object) -> None:
        if isinstance(c, html.Td):
            cells.append(c)
        kids = getattr(c, "children", None)
        for k in kids if isinstance(kids, list | tuple) else [kids]:
            if k is not None and not isinstance(k, str):
                walk(k)
    walk(parts["rk-findings"])
    titled = [(c.children, c.title.split(":")[0]) for c in cells if getattr(c, "title", None)]
    assert titled == [("10.0%", "0.1004"), ("7.1%", "0.0712"), ("10.0%", "0.1004")]
    assert "collective" in next(c.title for c in cells if c.children == "10.0%")
    assert "job's step" in next(c.title for c in cells if c.children == "7.1%")


def test_the_hosts_table_puts_a_host_behind_the_switch_its_findings_name():
    """With ``nodes_per_switch``, a host's switch comes from the natural order of host
    names (the detector's rule, docs/detectors.md), not from the order the hosts were given
    ranks in: hosts given ranks as node-10, node-2, node-11, node-1, two per switch, sit behind
    switches 1, 0, 1, 0 (node-1 and node-2 on 0, node-10 and node-11 on 1)."""
    hosts = pd.DataFrame({"host": ["node-10", "node-2", "node-11", "node-1"],
                          "mean": [1.0, 1.0, 1.1, 1.0], "worst_rank_mean": [1.0] * 4})
    by_count = _host_rollup(hosts, {"nodes_per_switch": 2})
    assert list(by_count.switch) == ["1", "0", "1", "0"]
    by_map = _host_rollup(hosts, {"switch_of_host": {"node-10": "leaf-a", "node-2": "leaf-b",
                                                     "node-11": "leaf-a", "node-1": "leaf-b"}})
    assert list(by_map.switch) == ["leaf-a", "leaf-b", "leaf-a", "leaf-b"]
    assert "switch" not in _host_rollup(hosts, {})
