"""Runs whose job is gone without an end event: reported as silent, ended by `end-run`.

What must hold: the silence timeout follows the run's own step rhythm exactly as the live
hang detector's does; `goodlens report` flags a run quiet past it (JSON and text) and not one
within it; `goodlens end-run` records the failure the hang detector would have (last
activity + timeout), after which the run is ended, its wall-clock stops there with the tail
as restart detection, the buckets still sum to the wall-clock, and a second end-run stores
nothing; a run still reporting is refused without --force; the same through a collector.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from goodlens.cli import main
from goodlens.dashboard import pages
from goodlens.detectors.hangs import HangConfig, HangDetector, silence
from goodlens.model.batch import validate_batch
from goodlens.storage.store import Store
from tests.harness import Collector, http, step_batch


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def test_silence_timeout_is_the_live_detectors() -> None:
    ends = np.concatenate([np.arange(1.0, 101.0), [130.0], np.arange(131.0, 141.0)])
    s = silence(ends, last_activity=140.0, now=229.0)
    hd = HangDetector()
    for t in ends:
        hd.observe(0, float(t))
    assert s.timeout_s == hd.timeout_s == 90.0  # 3 x the 30 s gap of a checkpoint
    assert s.silent_s == 89.0 and not s.silent
    assert silence(ends, 140.0, 231.0).silent
    assert silence(np.zeros(0), 5.0, 70.0).timeout_s == 60.0  # no rhythm yet: the floor
    assert HangConfig(max_timeout_s=70.0).timeout(30.0) == 70.0


def _silent_store(path: Path, last_step: int = 20, t0: float = 1000.0) -> str:
    store = Store(path)
    docs = [step_batch("r", k, list(range(last_step))) for k in range(4)]
    for d in docs:
        d["steps"]["start_time"] = [t0 + s for s in d["steps"]["step"]]
    store.write_group([validate_batch(d) for d in docs])
    store.summarize_dirty()
    store.close()
    return str(path)


def test_report_flags_a_silent_run_and_end_run_stops_its_clock(tmp_path: Path) -> None:
    db = _silent_store(tmp_path / "s.duckdb")
    rep = json.loads(run("report", "--db", db, "--run", "r", "--json").output)
    assert rep["in_progress"] and rep["silence"]["silent"]
    assert rep["silence"]["last_activity"] == 1020.0 and rep["silence"]["timeout_s"] == 60.0
    assert "goodlens end-run --run r" in run("report", "--db", db, "--run", "r").output
    out = json.loads(run("end-run", "--db", db, "--run", "r", "--json").output)
    assert out["stored"] and not out["in_progress"]
    assert out["time"] == 1080.0 and out["wall_clock_s"] == 80.0  # first step 1000
    rep = json.loads(run("report", "--db", db, "--run", "r", "--json").output)
    assert not rep["in_progress"] and "silence" not in rep
    assert rep["wall_clock_s"] == 80.0
    # the partial step in flight is recompute, the rest of the timeout is detection
    assert rep["buckets"]["recompute"] == pytest.approx(1.0)
    assert rep["restart_parts"]["detection"] == pytest.approx(59.0)
    assert rep["other_parts"].get("since_last_step", 0.0) == 0.0
    assert sum(v or 0.0 for v in rep["buckets"].values()) == pytest.approx(80.0)
    again = run("end-run", "--db", db, "--run", "r", code=1)
    assert "already ended" in again.output
    store = Store(db, read_only=True)
    try:
        ev = store.events("r")
        assert list(ev.kind) == ["failure_detected"] and list(ev.cause) == ["lost"]
    finally:
        store.close()


def test_end_run_refuses_a_run_that_still_reports(tmp_path: Path) -> None:
    db = _silent_store(tmp_path / "s.duckdb", t0=time.time() - 25.0)
    refused = run("end-run", "--db", db, "--run", "r", code=1)
    assert "within its" in refused.output and "--force" in refused.output
    out = json.loads(run("end-run", "--db", db, "--run", "r", "--force", "--cause", "hang",
                         "--at", "+22s", "--json").output)  # 3 s ago: never in the future
    assert out["stored"] and out["wall_clock_s"] == pytest.approx(22.0)
    assert "no run 'x'" in run("end-run", "--db", db, "--run", "x", code=1).output


def test_end_run_uses_the_hang_floor_it_is_given(tmp_path: Path) -> None:
    db = _silent_store(tmp_path / "s.duckdb")
    out = json.loads(run("end-run", "--db", db, "--run", "r", "--hang-floor", "5m",
                         "--json").output)
    assert out["time"] == 1020.0 + 300.0 and out["wall_clock_s"] == 320.0


def test_end_run_through_a_collector(tmp_path: Path) -> None:
    c = Collector(tmp_path / "c.duckdb", "--no-detect").start()
    try:
        for k in range(4):
            assert http("POST", c.url + "/v1/ingest",
                        json.dumps(step_batch("r", k, list(range(20)))).encode())[0] == 200
        c.sync()
        # a detection pass asked of a collector without detection: 409 says so
        status, body = http("POST", c.url + "/v1/sync?detect=1", b"")
        assert status == 409 and "--no-detect" in body["error"], body
        status, body = http("POST", c.url + "/v1/sync?detect=yes", b"")
        assert status == 422 and body["field"] == "detect", body
        out = json.loads(run("end-run", "--url", c.url, "--run", "r", "--json").output)
        assert out["stored"] and not out["in_progress"] and out["wall_clock_s"] == 80.0
        status, rep = http("GET", c.url + "/v1/report?run=r")
        assert status == 200 and not rep["in_progress"] and rep["wall_clock_s"] == 80.0
    finally:
        c.stop()


def test_overview_state_card_says_the_run_is_silent() -> None:
    rep = {"run": "r", "in_progress": True, "silence": {
        "silent": True, "silent_s": 3 * 86400.0, "timeout_s": 60.0}}
    card = pages._state_card("running", rep)
    value = card.children[1]
    assert value.children.startswith("silent for 3") and "end-run --run r" in value.title
    rep["silence"]["silent"] = False
    assert pages._state_card("running", rep).children[1].children == "running (live)"
