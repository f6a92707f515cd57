"""/metrics: exposition parsed by prometheus_client (the registry, and the collector's app
in this process), and a real Prometheus scraping a real collector."""

from __future__ import annotations

import shutil

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from goodlens.collector.metrics import make_registry
from goodlens.model.batch import validate_batch
from goodlens.storage.store import Store
from goodlens.storage.writer import Writer
from tests.harness import Prometheus, http, step_batch


def test_registry_values_from_a_store(tmp_path):
    store = Store(tmp_path / "m.duckdb")
    writer = Writer(store).start()
    try:
        for r in range(4):
            doc = step_batch("m", r, list(range(150)))
            doc["steps"]["duration_s"] = [1.0 + 0.001 * s for s in range(150)]
            writer.submit(validate_batch(doc)).result(10)
        writer.submit(validate_batch(step_batch("m", 0, [0, 1]))).result(10)  # re-sent
        writer.sync()
        reg = make_registry(store, writer)
        get = reg.get_sample_value
        assert get("goodlens_run_steps_total", {"run": "m"}) == 150
        assert get("goodlens_run_last_step", {"run": "m"}) == 149
        assert get("goodlens_run_ranks_reporting", {"run": "m"}) == 4
        # quantiles over the latest 100 steps (50..149): durations 1.050..1.149
        assert get("goodlens_run_step_duration_seconds", {"run": "m", "quantile": "0.5"}) == \
            pytest.approx(1.0995)
        assert get("goodlens_ingest_rows_total", {"table": "steps"}) == 600
        assert get("goodlens_ingest_duplicate_rows_total", {"table": "steps"}) == 2
        assert get("goodlens_writer_commit_seconds_count") >= 1
        assert get("goodlens_writer_queue_rows") == 0
    finally:
        writer.stop()
        store.close()


def test_metrics_endpoint_parses_and_has_no_per_rank_series(app_collector):
    for r in range(32):
        app_collector.http("POST", "/v1/ingest", orjson.dumps(step_batch("p", r, [0, 1])))
    app_collector.http("POST", "/v1/ingest", b"garbage")
    app_collector.sync()
    status, text = app_collector.http("GET", "/metrics")
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in fams.values() for s in f.samples}
    assert samples[("goodlens_run_ranks_reporting", (("run", "p"),))] == 32
    assert samples[("goodlens_ingest_rejected_batches_total", (("reason", "invalid"),))] == 1
    assert not any("rank" in dict(labels) for _, labels in samples)
    assert all(name.startswith("goodlens_") for name in fams)


def _prometheus() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.fail("prometheus is not installed; `make test` installs Debian's package")
    return path


@pytest.mark.slow
def test_real_prometheus_scrapes_the_collector(collector, tmp_path):
    for r in range(4):
        http("POST", collector.url + "/v1/ingest", orjson.dumps(step_batch("prom", r, [0, 1, 2])))
    collector.sync()
    prom = Prometheus(tmp_path, collector.port)
    try:
        result = prom.query_until('goodlens_run_ranks_reporting{run="prom"}', lambda r: True,
                                  timeout=40)
        assert result, "Prometheus never returned the series"
        assert float(result[0]["value"][1]) == 4
        assert result[0]["metric"]["job"] == "goodlens"
        _, body = http("GET", f"http://127.0.0.1:{prom.port}/api/v1/targets", timeout=5)
        health = [t["health"] for t in body["data"]["activeTargets"]]
        assert health == ["up"]
    finally:
        prom.stop()


def test_goodput_and_badput_per_run_match_the_report(tmp_path):
    from goodlens.analysis.accounting import account_run
    from goodlens.collector.replay import import_trace
    from tests.harness import ROOT
    store = Store(tmp_path / "g.duckdb")
    try:
        import_trace(store, ROOT / "sample_data" / "demo")
        b = account_run(store, "demo-8x").breakdown()
        get = make_registry(store).get_sample_value
        assert get("goodlens_run_goodput_ratio", {"run": "demo-8x"}) == pytest.approx(b.goodput)
        assert get("goodlens_run_gpu_time_goodput_ratio", {"run": "demo-8x"}) == \
            pytest.approx(b.gpu_time_goodput)
        buckets = ("productive", "straggler_wait", "checkpoint_stall", "recompute", "startup",
                   "restart", "other")
        for bucket in buckets:
            assert get("goodlens_run_time_seconds", {"run": "demo-8x", "bucket": bucket}) == \
                pytest.approx(b.buckets[bucket])
        # productive is a bucket like the others: together they are the wall-clock
        assert sum(get("goodlens_run_time_seconds", {"run": "demo-8x", "bucket": x})
                   for x in buckets) == pytest.approx(
                       get("goodlens_run_wall_clock_seconds", {"run": "demo-8x"}))
        assert get("goodlens_run_badput_seconds", {"run": "demo-8x", "bucket": "restart"}) \
            is None  # renamed: goodlens_run_time_seconds
        assert get("goodlens_run_restart_seconds", {"run": "demo-8x", "part": "queue"}) == \
            pytest.approx(120.0, abs=0.1)
        # the recipe's 40 s of init before the first step, and 40 s after the failure
        assert get("goodlens_run_startup_seconds", {"run": "demo-8x", "part": "init"}) == \
            pytest.approx(40.0, abs=0.1)
        assert get("goodlens_run_restart_seconds", {"run": "demo-8x", "part": "init"}) == \
            pytest.approx(40.0, abs=0.1)
    finally:
        store.close()
