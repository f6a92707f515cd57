"""What the dashboard says before it knows: the ranks page while the collector's live
detector has not read a run yet, and the checkpoints page's price box."""

from __future__ import annotations

from pathlib import Path

from goodlens.cli.serve import dashboard_root
from goodlens.collector.detection import DetectionService
from goodlens.collector.replay import import_trace
from goodlens.dashboard import pages
from goodlens.dashboard.data import DashConfig, RunData
from goodlens.storage.store import Store
from goodlens.storage.writer import Writer
from tests.harness import ROOT

SAMPLE = ROOT / "sample_data" / "demo"  # run demo-8x: rank 5 slow from step 150


def _findings_text(d: dict) -> str:
    parts = pages.ranks_parts(d)
    return str(parts["rk-findings"])


def test_the_ranks_page_says_detection_runs_until_the_first_pass_has_read_the_run(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    import_trace(store, SAMPLE)
    writer = Writer(store).start()
    svc = DetectionService(store, writer)
    try:
        data = RunData(store, DashConfig(live_detection=True, detection_read=svc.has_read))
        # a collector's start: the ended runs wait for a pass with time to spare, and a
        # pass with none left reads none of them
        svc.poll_once(budget_s=0.0)
        assert not svc.has_read("demo-8x")
        d = data.ranks("demo-8x")
        assert d["findings"] == [] and d["findings_source"] == "detecting"
        text = _findings_text(d)
        assert "Straggler detection is still running." in text
        assert "No persistent straggler." not in text
        assert "has not finished its first pass" in text

        svc.poll_once(budget_s=None)  # read to its end: the finding is stored
        assert svc.has_read("demo-8x")
        d = data.ranks("demo-8x")
        assert d["findings_source"] == "live"
        assert [(f["subject_kind"], str(f["subject_id"])) for f in d["findings"]] == \
            [("rank", "5")]
        assert "still running" not in _findings_text(d)
    finally:
        svc.stop()
        writer.stop()
        store.close()


def test_a_run_read_with_nothing_found_says_no_straggler(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    import_trace(store, SAMPLE)
    try:
        read: set[str] = set()
        data = RunData(store, DashConfig(live_detection=True, detection_read=read.__contains__))
        # stand-in for a pass that read the run and stored nothing (no writer here)
        assert data.findings("demo-8x") == ([], "detecting")
        read.add("demo-8x")
        assert data.findings("demo-8x") == ([], "live")
        d = data.ranks("demo-8x")
        assert "No persistent straggler." in _findings_text(d)
        # without a live detector's progress (goodlens dashboard, or a caller that cannot
        # tell) the stored findings are the answer, as before
        plain = RunData(store, DashConfig(live_detection=True))
        assert plain.findings("demo-8x") == ([], "live")
    finally:
        store.close()


def test_serve_hands_the_dashboard_its_detection_service(tmp_path: Path,
                                                         monkeypatch) -> None:
    import goodlens.dashboard.app as app_module
    seen: dict = {}
    create = app_module.create_app

    def recording(store, config=None, **kw):
        seen["config"] = config
        return create(store, config, **kw)
    monkeypatch.setattr(app_module, "create_app", recording)
    store = Store(tmp_path / "s.duckdb")
    try:
        svc = DetectionService(store, None)
        dashboard_root(None, True)(store, svc)
        assert seen["config"].detection_read == svc.has_read
        dashboard_root(None, False)(store)  # --no-detect: nothing to wait for
        assert seen["config"].detection_read is None
    finally:
        store.close()

