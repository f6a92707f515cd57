"""Trace mode of the simulator: a generated trace imports cleanly into a real store, and
``goodlens.analysis.accounting`` finds in it exactly the ground truth the generator claims (every
bucket
and restart part within 0.1% of wall-clock; in practice ~1e-9), for presets and stress configs
(sync/async/tiered, restart/shrink/spares, evictions, planned interruptions, clock skew); rows
are physically consistent; planted stragglers are where the findings say; same seed, same
trace."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from goodlens.analysis.accounting import BUCKETS, RESTART_PARTS, STARTUP_PARTS, account_run
from goodlens.analysis.runsim.montecarlo import SimConfig, simulate
from goodlens.analysis.runsim.presets import get_preset
from goodlens.analysis.runsim.tracegen import TraceResult, generate_trace
from goodlens.collector.replay import import_trace
from goodlens.model.schema import EVENT_COLUMNS, RUN_COLUMNS, STEP_COLUMNS
from goodlens.storage.store import Store
from tests.harness import STRESS

H = 3600.0
TOL = 1e-3  # of wall-clock, per bucket (the bar)
ERRORS: dict[str, float] = {}

#: several GPUs per node and switches of two nodes: rank, node and switch stragglers
WIDE = dict(STRESS, nodes=8, gpus_per_node=4, nodes_per_switch=2, duration_s=3 * H,
            straggler_slowdown_median=0.3)


@pytest.fixture(scope="module", autouse=True)
def _report_errors(request):
    yield
    if ERRORS:
        worst = max(ERRORS, key=ERRORS.get)
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled():
            print(f"\ntracegen: max |accounting - truth| / wall-clock over {len(ERRORS)} "
                  f"traces: {ERRORS[worst]:.1e} ({worst})")


def accounted(tmp_path, c: SimConfig, seed: int, **kw) -> tuple[TraceResult, dict, Store]:
    """Generate, import into a store (validated as live ingest is), account."""
    res = generate_trace(c, seed, tmp_path / "trace", **kw)
    store = Store(tmp_path / "store.duckdb")
    totals = import_trace(store, tmp_path / "trace")
    assert totals["steps_inserted"] == res.rows and totals["steps_duplicate"] == 0
    return res, account_run(store, "sim").breakdown().as_dict(), store


def assert_truth(name: str, res: TraceResult, b: dict) -> None:
    t = res.truth
    wall = t["wall_clock_s"]
    assert b["wall_clock_s"] == pytest.approx(wall, abs=TOL * wall)
    errs = [abs((b["buckets"][k] or 0.0) - t["buckets"][k]) for k in BUCKETS]
    errs += [abs(b["restart_parts"][k] - t["restart_parts"][k]) for k in RESTART_PARTS]
    errs += [abs(b["startup_parts"][k] - t["startup_parts"][k]) for k in STARTUP_PARTS]
    errs.append(abs(b["wall_clock_s"] - wall))
    ERRORS[name] = max(errs) / wall
    for k in BUCKETS:
        assert b["buckets"][k] == pytest.approx(t["buckets"][k], abs=TOL * wall), k
    for k in RESTART_PARTS:
        assert b["restart_parts"][k] == pytest.approx(t["restart_parts"][k], abs=TOL * wall), k
    for k in STARTUP_PARTS:
        assert b["startup_parts"][k] == pytest.approx(t["startup_parts"][k], abs=TOL * wall), k
    assert b["goodput"] == pytest.approx(t["goodput"], abs=TOL)
    assert b["gpu_time_goodput"] == pytest.approx(t["gpu_time_goodput"], abs=TOL)
    assert b["steps"] == t["steps"]
    assert b["start"] == t["start"] and b["end"] == pytest.approx(t["end"], abs=TOL * wall)
    assert b["other_parts"].get("input_stall", 0.0) == pytest.approx(
        t["other_parts"].get("input_stall", 0.0), abs=TOL * wall)
    # the truth is itself a partition, and differs from the simulator's breakdown only by the
    # realised straggler wait and the input stall (against productive) and downtime after
    # the last attempt
    assert math.isclose(sum(t["buckets"].values()), wall, rel_tol=1e-9)
    sim = res.sim.buckets
    moved = t["buckets"]["straggler_wait"] - sim["straggler_wait"]
    stalled = t["other_parts"].get("input_stall", 0.0)
    assert t["buckets"]["productive"] == pytest.approx(sim["productive"] - moved - stalled,
                                                       abs=1e-6)
    assert t["buckets"]["other"] == pytest.approx(sim["other"] + stalled, abs=1e-6)
    assert sum(t["other_parts"].values()) == pytest.approx(t["buckets"]["other"], abs=1e-6)
    down = res.sim.wall_clock_s - wall
    assert t["buckets"]["restart"] == pytest.approx(sim["restart"] - down, abs=1e-6)


# ---------------------------------------------------------------------- truth = accounting
@pytest.mark.parametrize("name,config,seed,skew", [
    ("test-16", get_preset("test-16"), 0, 0.0),
    ("test-16 skewed", get_preset("test-16"), 3, 0.05),
    ("demo-64 3h", replace(get_preset("demo-64"), duration_s=3 * H), 0, 0.0),
    ("demo-64 3h failures", replace(get_preset("demo-64"), duration_s=3 * H,
                                    node_mtbf_s=8 * H, planned_per_day=8), 2, 0.02),
])
def test_presets_truth_equals_accounting(tmp_path, name, config, seed, skew):
    res, b, _ = accounted(tmp_path, config, seed, clock_skew_s=skew)
    assert_truth(name, res, b)


@pytest.mark.parametrize("mode", ["sync", "async", "tiered"])
@pytest.mark.parametrize("elastic", ["restart", "shrink", "spares"])
def test_stress_truth_equals_accounting(tmp_path, mode, elastic):
    """Frequent failures (some in start-up, some undetected at the end), hangs, wide
    failures, tier rollbacks, planned interruptions, evictions, shrink and grow, Weibull."""
    for seed in range(3):
        c = SimConfig(**STRESS, ckpt_mode=mode, elastic=elastic, evict_stragglers=seed != 1,
                      failure_dist="weibull" if seed == 2 else "exponential")
        res, b, store = accounted(tmp_path / str(seed), c, seed)
        assert_truth(f"stress {mode}/{elastic}/{seed}", res, b)
        store.close()


def test_multi_gpu_nodes_shrink_and_evict(tmp_path):
    c = SimConfig(**WIDE, ckpt_mode="tiered", elastic="shrink", evict_stragglers=True)
    seen = set()
    for seed in range(3):
        res, b, store = accounted(tmp_path / str(seed), c, seed, clock_skew_s=0.1)
        assert_truth(f"wide tiered/shrink/{seed}", res, b)
        seen |= {f["subject"] for f in res.findings}
        ev = store.events("sim")
        if res.sim.counts["shrinks"]:
            assert (ev.kind == "world_resized").any()
        if res.sim.counts["evictions"]:
            assert (ev.kind == "rank_evicted").any()
        store.close()
    assert seen == {"rank", "node", "switch"}


# ---------------------------------------------------------------------- the trace itself
def test_rows_events_and_files_are_well_formed(tmp_path):
    c = SimConfig(**WIDE, ckpt_mode="async", elastic="spares")
    res = generate_trace(c, 1, tmp_path / "t", run_id="wide-1")
    types = {"int": pa.int64(), "float": pa.float64(), "str": pa.string()}
    for name, cols in (("runs", RUN_COLUMNS), ("steps", STEP_COLUMNS),
                       ("events", EVENT_COLUMNS)):
        schema = res.tables[name].schema
        assert schema.names == ["run_id", *(col.name for col in cols)], name
        assert [schema.field(col.name).type for col in cols] == [types[col.kind]
                                                                for col in cols], name
    run = res.tables["runs"].to_pylist()[0]
    assert run["world_size"] == 32 and json.loads(run["tags"])["nodes_per_switch"] == 2
    assert json.loads(run["tags"])["spare_gpus"] == 2 * 4
    s = res.tables["steps"].to_pandas()
    assert (s.host == s["rank"].map(lambda r: f"node-{r // 4:04d}")).all()
    # synchronous steps: one duration per step, made of compute, collective and data waits
    assert (s.groupby(["attempt", "step"]).duration_s.nunique() == 1).all()
    np.testing.assert_allclose(s.compute_s + s.collective_wait_s + s.data_wait_s,
                               s.duration_s, rtol=1e-12, atol=1e-9)
    assert (s.collective_wait_s >= 0).all() and (s.data_wait_s < 0.01 * s.duration_s).all()
    assert set(s.groupby(["attempt", "step"]).size()) == {32}  # spares keep the full world
    e = res.tables["events"].to_pandas()
    assert not e.duplicated(["source", "seq"]).any()
    for _, g in e.groupby("source"):
        assert list(g.sort_values("time", kind="stable").seq) == list(range(len(g)))
    assert e.time.max() <= res.truth["end"] + 1e-6
    fails = e[e.kind == "failure_detected"]
    assert fails.cause.notna().all() and fails.host.str.startswith("node-").all()
    assert set(e[e.kind == "attempt_start"].attempt) == set(s.attempt) | set(e.attempt)
    saved = e[e.kind == "ckpt_save_start"]
    assert saved.bytes.gt(0).all() and set(saved.tier) <= {"durable", "memory"}
    doc = json.loads((tmp_path / "t" / "ground_truth.json").read_text())
    assert doc["seed"] == 1 and doc["run_id"] == "wide-1" and doc["config"]["nodes"] == 8
    assert doc["truth"]["buckets"] == pytest.approx(res.truth["buckets"])
    assert doc["findings"] == json.loads(json.dumps(res.findings))
    assert res.rows == len(s) and res.rows_per_s > 0


def test_same_seed_same_trace_different_seed_different(tmp_path):
    c = get_preset("test-16")
    a = generate_trace(c, 5, tmp_path / "a")
    b = generate_trace(c, 5, tmp_path / "b")
    d = generate_trace(c, 6, None)
    for name in ("runs", "steps", "events"):
        assert a.tables[name].equals(b.tables[name]), name
        assert (tmp_path / "a" / f"{name}.parquet").read_bytes() == (
            tmp_path / "b" / f"{name}.parquet").read_bytes()
    assert a.truth == b.truth and a.findings == b.findings
    assert not a.tables["steps"].equals(d.tables["steps"]) and a.truth != d.truth
    # trace mode runs the simulator's own trial: the same breakdown before corrections
    assert a.sim.as_dict() == simulate(c, 5).as_dict()


def test_findings_locate_the_planted_stragglers(tmp_path):
    """Each planted episode slows its ranks' compute by its slowdown over exactly the steps
    the finding names, and the store's slowest rank is one of them."""
    c = SimConfig(**dict(WIDE, node_mtbf_s=1e9, planned_per_day=0, compute_noise_sigma=0.01,
                         straggler_per_node_day=3))
    res, _, store = accounted(tmp_path, c, 4)
    assert res.findings and len(res.findings) <= res.sim.counts["straggler_episodes"]
    s = res.tables["steps"].to_pandas()
    summ = store.step_summaries("sim")
    for f in res.findings:
        assert f["first_attempt"] == f["last_attempt"] == 0  # no failures: one attempt
        lo, hi = f["ranks"]
        others = [g for g in res.findings if g is not f and g["ranks"][0] <= hi
                  and lo <= g["ranks"][1] and g["first_step"] <= f["last_step"]
                  and f["first_step"] <= g["last_step"]]
        inside = s[s.step.between(f["first_step"], f["last_step"])]
        assert inside.step.nunique() == f["steps"]
        mine = inside["rank"].between(lo, hi)
        ratio = inside[mine].compute_s.median() / inside[~mine].compute_s.median()
        if not others:
            assert ratio == pytest.approx(1 + f["slowdown"], rel=0.01)
        else:
            assert ratio >= (1 + f["slowdown"]) * 0.99
        before = s[s.step == f["first_step"] - 1]
        if len(before) and not others:
            r = before[before["rank"].between(lo, hi)].compute_s.median() / \
                before[~before["rank"].between(lo, hi)].compute_s.median()
            assert r == pytest.approx(1.0, abs=0.05)
        if f["slowdown"] > 0.1 and not others:
            slow = summ[summ.step.between(f["first_step"], f["last_step"])].slowest_rank
            assert slow.between(lo, hi).mean() > 0.95
    store.close()


def test_diurnal_drift_moves_every_rank_together_and_keeps_the_truth(tmp_path):
    from goodlens.analysis.accounting import account_run
    from goodlens.analysis.runsim.tracegen import generate_trace
    from goodlens.collector.replay import import_trace
    from goodlens.storage.store import Store
    c = replace(get_preset("test-16"), diurnal_amplitude=0.2, duration_s=6 * 3600.0,
                straggler_per_node_day=0.0, node_mtbf_s=1e9)
    r = generate_trace(c, 0, tmp_path / "d", run_id="d")
    steps = r.tables["steps"].to_pandas()
    hourly = steps.groupby((steps.start_time - steps.start_time.min()) // 3600).compute_s.median()
    assert hourly.max() / hourly.min() > 1.1  # the day shows in compute time
    s = Store(tmp_path / "d.duckdb")
    try:
        import_trace(s, tmp_path / "d")
        got = account_run(s, "d").breakdown()
    finally:
        s.close()
    for k, v in r.truth["buckets"].items():
        assert (got.buckets[k] or 0.0) == pytest.approx(v, abs=1e-6 * r.truth["wall_clock_s"])


def test_a_step_lasts_as_long_as_its_latest_rank_with_nested_stragglers_compounded():
    """Without compute noise the step's straggler wait is exact: each step lasts the healthy
    step plus its latest rank's compute beyond the median's, c0 (1 + s_1)...(1 + s_j) - c0,
    whatever episodes nest on that rank (a rank fault in a slow node behind a slow switch).
    Some steps carry two or more nested episodes (the latest rank slower than any one
    factor alone would make it), and the breakdown is the seed's ``simulate``'s."""
    c = SimConfig(**dict(WIDE, node_mtbf_s=1e9, planned_per_day=0, compute_noise_sigma=0.0,
                         straggler_per_node_day=8, straggler_duration_median_s=2 * H,
                         evict_stragglers=False))
    res = generate_trace(c, 2, None)
    s = res.tables["steps"].to_pandas()
    s = s[s.step > s.step.min()]  # the first step carries the warm-up
    c0 = c.compute_fraction * c.step_s
    per_step = s.groupby("step").agg(dur=("duration_s", "first"), top=("compute_s", "max"))
    assert np.allclose(per_step.dur, c.step_s + (per_step.top - c0).clip(lower=0), atol=1e-9)
    single = pd.Series(1.0, per_step.index)  # the largest one factor on any rank, per step
    for f in res.findings:
        on = single.index.to_series().between(f["first_step"], f["last_step"])
        single[on] = np.maximum(single[on], 1 + f["slowdown"])
    assert (per_step.top > c0 * single * 1.0001).sum() > 100  # nested episodes compounded
    assert res.sim.as_dict() == simulate(c, 2).as_dict()
