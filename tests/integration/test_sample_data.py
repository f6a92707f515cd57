"""The bundled sample trace is what its seeded recipe says, and the docs match the model."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from goodlens.collector.replay import import_trace
from goodlens.model.schema import data_model_markdown
from goodlens.model.trace import read_trace
from goodlens.storage.store import Store
from tests.harness import ROOT


def _recipe():
    spec = importlib.util.spec_from_file_location("gen", ROOT / "sample_data" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_recipe_regenerates_the_shipped_traces(tmp_path):
    gen = _recipe()
    gen.generate(tmp_path / "demo")
    sims = gen.generate_sims(tmp_path)
    assert {p.name for p in sims} == {"sim-64", "sim-16"}
    for trace in ("demo", "sim-64", "sim-16"):
        for name in ("runs", "steps", "events"):
            fresh = pq.read_table(tmp_path / trace / f"{name}.parquet")
            shipped = pq.read_table(ROOT / "sample_data" / trace / f"{name}.parquet")
            _assert_same_trace_table(fresh, shipped, f"{trace}/{name}")


#: Every float in the traces is seconds (a Unix time or a duration derived from one). The
#: recipe's floats go through libm (exp, log, sin), whose last bit differs between CPUs and
#: glibc builds; such a difference moves a 2026 Unix time by an ulp (0.24 us) and a duration
#: subtracted from two of them by as much. 1 us is four of those ulps, and a thousand times
#: finer than anything the analysis or the report tests resolve (0.1% of wall-clock).
SECONDS_ATOL = 1e-6


def _assert_same_trace_table(fresh: pa.Table, shipped: pa.Table, what: str) -> None:
    """Same schema, rows and non-float values; floats (and the floats inside JSON text)
    within :data:`SECONDS_ATOL`."""
    assert fresh.schema == shipped.schema, what
    assert fresh.num_rows == shipped.num_rows, what
    for field in fresh.schema:
        a, b = fresh.column(field.name), shipped.column(field.name)
        where = f"{what}.{field.name}"
        if pa.types.is_floating(field.type):
            x, y = (c.to_numpy(zero_copy_only=False).astype(float) for c in (a, b))
            assert np.array_equal(np.isnan(x), np.isnan(y)), where
            worst = float(np.nanmax(np.abs(x - y), initial=0.0))
            assert worst <= SECONDS_ATOL, (where, worst)
        elif pa.types.is_string(field.type) and field.name in ("detail", "tags"):
            for i, (u, v) in enumerate(zip(a.to_pylist(), b.to_pylist(), strict=True)):
                _assert_same_json(u, v, f"{where}[{i}]")
        else:
            assert a.equals(b), where


def _assert_same_json(u: str | None, v: str | None, where: str) -> None:
    if u is None or v is None:
        assert u == v, where
        return
    _assert_same_value(json.loads(u), json.loads(v), where)


def _assert_same_value(x: object, y: object, where: str) -> None:
    if isinstance(x, float) or isinstance(y, float):
        assert isinstance(x, int | float) and isinstance(y, int | float), where
        assert not isinstance(x, bool) and not isinstance(y, bool), where
        assert math.isclose(x, y, rel_tol=0.0, abs_tol=SECONDS_ATOL), (where, x, y)
    elif isinstance(x, dict) and isinstance(y, dict):
        assert list(x) == list(y), where
        for k in x:
            _assert_same_value(x[k], y[k], f"{where}.{k}")
    elif isinstance(x, list) and isinstance(y, list):
        assert len(x) == len(y), where
        for k, (p, q) in enumerate(zip(x, y, strict=True)):
            _assert_same_value(p, q, f"{where}[{k}]")
    else:
        assert x == y and type(x) is type(y), (where, x, y)


def test_the_rich_sample_shows_every_feature_it_promises():
    import json
    doc = json.loads((ROOT / "sample_data" / "sim-64" / "ground_truth.json").read_text())
    subjects = {f["subject"] for f in doc["findings"]}
    assert "switch" in subjects and subjects & {"rank", "node"}
    assert doc["truth"]["buckets"]["recompute"] > 0 and doc["truth"]["buckets"]["restart"] > 0
    kinds = set(pq.read_table(ROOT / "sample_data" / "sim-64" / "events.parquet")
                .column("kind").to_pylist())
    assert {"failure_detected", "world_resized", "ckpt_save_blocking_end",
            "ckpt_save_durable_end"} <= kinds


def test_sample_trace_has_the_expected_facts(tmp_path):
    exp = _recipe().EXPECTED
    trace = read_trace(ROOT / "sample_data" / "demo")
    assert trace.run_ids == [exp["run_id"]]
    assert trace.tables["steps"].num_rows == exp["step_rows"]
    store = Store(tmp_path / "s.duckdb")
    try:
        import_trace(store, ROOT / "sample_data" / "demo")
        run = store.run(exp["run_id"])
        assert (run["attempts"], run["last_step"], run["state"]) == (exp["attempts"],
                                                                     exp["last_step"],
                                                                     "completed")
        s = store.step_summaries(exp["run_id"])
        late = s[s.step >= 200]
        assert (late.slowest_rank == exp["slow_rank"]).mean() > 0.95
        restore = store.events(exp["run_id"], kinds=["ckpt_restore_start"])
        assert list(restore.step) == [exp["restored_step"]]
        a = store.attempts(exp["run_id"])
        assert list(a.end_reason) == ["failed", "completed"]
    finally:
        store.close()


def test_data_model_doc_is_generated_from_the_model():
    doc = (ROOT / "docs" / "data-model.md").read_text()
    assert data_model_markdown() in doc, "regenerate with: python -m goodlens.model.schema > ..."


def _sample_traces() -> list:
    return sorted(p.parent for p in (ROOT / "sample_data").glob("*/ground_truth.json"))


@pytest.mark.parametrize("trace", _sample_traces(), ids=lambda p: p.name)
def test_report_matches_ground_truth_on_every_sample_trace(trace, tmp_path):
    """`goodlens report` on each shipped trace is within 0.1% of wall-clock of the
    breakdown its recipe says it represents, bucket by bucket and startup and restart part by
    part."""
    import json

    from goodlens.analysis.accounting import account_run
    doc = json.loads((trace / "ground_truth.json").read_text())
    truth = doc["truth"]
    store = Store(tmp_path / "t.duckdb")
    try:
        import_trace(store, trace)
        got = account_run(store, doc["run_id"]).breakdown()
    finally:
        store.close()
    tol = 0.001 * truth["wall_clock_s"]
    assert got.wall_clock_s == pytest.approx(truth["wall_clock_s"], abs=tol)
    for bucket, want in truth["buckets"].items():
        assert (got.buckets[bucket] or 0.0) == pytest.approx(want, abs=tol), bucket
    for part, want in truth["restart_parts"].items():
        assert got.restart_parts[part] == pytest.approx(want, abs=tol), part
    for part, want in truth["startup_parts"].items():
        assert got.startup_parts[part] == pytest.approx(want, abs=tol), part


def test_sample_traces_stay_small():
    total = sum(f.stat().st_size for f in (ROOT / "sample_data").rglob("*") if f.is_file())
    assert total < 20 * 2**20
