"""The read path at many runs: a finished run's report computed once and kept, recomputed
only when rows of it arrive; the runs list paged and sorted on the stored rows; /metrics
exporting only what is live. Expected numbers are written out from the hand-made timeline
below, never taken from the code under test."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from goodlens import __version__
from goodlens.collector.metrics import make_registry
from goodlens.collector.reports import KeeperConfig, ReportKeeper
from goodlens.model.batch import validate_batch
from goodlens.storage import reports
from goodlens.storage.reports import ReportRow
from goodlens.storage.store import Store
from goodlens.storage.writer import Writer

T0 = 1_000_000.0


def _steps(run: str, rank: int, steps: list[int], t0: float = T0) -> dict:
    """Rank ``rank``'s steps: step s runs from t0 + 1 + s for exactly 1 s, all compute."""
    return {"schema_version": 1, "run_id": run, "steps": {
        "attempt": 0, "rank": rank, "host": "h0", "step": steps,
        "start_time": [t0 + 1 + s for s in steps], "duration_s": [1.0] * len(steps),
        "compute_s": [1.0] * len(steps)}}


def _lifetime(run: str, t0: float = T0, end: float | None = 11.0) -> dict:
    """The launcher's events: attempt 0 starts at t0 and, unless ``end`` is None, completes
    at t0 + end."""
    kinds, times = ["attempt_start"], [t0]
    if end is not None:
        kinds.append("attempt_end")
        times.append(t0 + end)
    return {"schema_version": 1, "run_id": run, "run": {"world_size": 2, "gpus_per_rank": 1},
            "events": {"source": "launcher", "seq": list(range(len(kinds))), "kind": kinds,
                       "time": times, "attempt": 0,
                       "cause": [None, "completed"][:len(kinds)]}}


def _push(writer: Writer, *docs: dict) -> None:
    for doc in docs:
        writer.submit(validate_batch(doc)).result(10)
    writer.sync()


def _served(path: Path, **config: float) -> tuple[Store, ReportKeeper, Writer]:
    store = Store(path)
    keeper = ReportKeeper(store, KeeperConfig(**config))
    return store, keeper, Writer(store, after_pass=keeper.after_pass).start()


def test_a_finished_run_is_accounted_once_and_again_only_when_late_rows_arrive(tmp_path):
    store, _keeper, writer = _served(tmp_path / "s.duckdb")
    try:
        # two ranks, steps 0-7 (1 s each from t0 + 1), the attempt completes at t0 + 11:
        # wall-clock 11 s = 1 s start-up (startup) + 8 s productive + 2 s after the last step
        _push(writer, _lifetime("r"), _steps("r", 0, list(range(8))),
              _steps("r", 1, list(range(8))))
        (row,) = store.stored_reports(["r"])
        assert (row.final, row.state, row.steps, row.last_step) == (True, "completed", 8, 7)
        assert row.wall_clock_s == pytest.approx(11.0)
        assert row.report["buckets"]["productive"] == pytest.approx(8.0)
        assert row.report["buckets"]["startup"] == pytest.approx(1.0)
        assert row.report["buckets"]["restart"] == 0.0  # nothing failed
        assert row.goodput == pytest.approx(8 / 11)
        assert store.stored_report("r") == row.report
        # more passes and another run's rows: r's report is not computed again
        _push(writer, _steps("other", 0, [0, 1]))
        time.sleep(1.2)  # at least one idle pass of the summariser
        writer.sync()
        assert store.stored_reports(["r"])[0].computed_at == row.computed_at
        # late rows of the finished run (steps 8 and 9): recomputed, 10 s productive
        _push(writer, _steps("r", 0, [8, 9]), _steps("r", 1, [8, 9]))
        (late,) = store.stored_reports(["r"])
        assert late.computed_at > row.computed_at
        assert late.report["buckets"]["productive"] == pytest.approx(10.0)
        assert late.goodput == pytest.approx(10 / 11) and late.steps == 10
    finally:
        writer.stop()
        store.close()


def test_rows_summarised_before_a_crash_leave_the_report_stale_never_silently_old(tmp_path):
    path = tmp_path / "s.duckdb"
    store, _keeper, writer = _served(path)
    _push(writer, _lifetime("r"), _steps("r", 0, list(range(8))),
          _steps("r", 1, list(range(8))))
    writer.stop()
    # late rows, then a summarising pass, then the process dies before the report is redone
    store.write_group([validate_batch(_steps("r", 0, [8, 9])),
                       validate_batch(_steps("r", 1, [8, 9]))])
    changed: list[str] = []
    store.summarize_dirty(changed=changed)
    assert changed == ["r"]
    assert store.stored_report("r") is None  # stale: a reader computes it instead
    listed = store.runs_page()[0]  # listed from the rows, so its step count is current
    assert list(listed.steps) == [10] and math.isnan(listed.goodput.iloc[0])
    store.close()
    # the restarted collector redoes it on its first pass
    store, _keeper, writer = _served(path)
    try:
        writer.sync()
        assert store.stored_report("r")["buckets"]["productive"] == pytest.approx(10.0)
        assert list(store.runs_page()[0].goodput) == pytest.approx([10 / 11])
    finally:
        writer.stop()
        store.close()


def _row(run: str, goodput: float | None, state: str, start: float, wall: float | None,
         final: bool = True) -> ReportRow:
    return ReportRow(run, 0.0, final, state, start, start + (wall or 0), 1, 10, 9, wall,
                     goodput, {"goodput": goodput}, None)


def test_the_runs_list_is_sorted_filtered_and_paged_on_the_stored_rows(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    try:
        store.write_group([validate_batch({"schema_version": 1, "run_id": r, "run": {
            "name": n}, "events": {"source": "x", "seq": [0], "kind": ["attempt_start"],
                                   "time": [T0 + i], "attempt": 0}})
            for i, (r, n) in enumerate([("a", "llama-a"), ("b", "gpt-b"), ("c", "llama-c"),
                                        ("d", "other-d")])])
        store.summarize_dirty(changed=[])  # the pass that takes their rows
        con = store.cursor()
        # stored rows for a, b and c; d has none yet (listed from its rows, no goodput)
        reports.save(con, [_row("a", 0.5, "completed", T0, 100.0),
                           _row("b", 0.2, "failed", T0 + 1, 300.0),
                           _row("c", 0.9, "running", T0 + 2, 50.0, final=False)])
        page = lambda **kw: store.runs_page(**kw)  # noqa: E731
        df, total = page(sort="goodput")
        assert list(df.run_id) == ["c", "a", "b", "d"] and total == 4
        assert list(page(sort="goodput", descending=False)[0].run_id) == ["b", "a", "c", "d"]
        assert list(page(sort="duration")[0].run_id)[:3] == ["b", "a", "c"]
        assert list(page(sort="start")[0].run_id) == ["d", "c", "b", "a"]
        df, total = page(sort="run", descending=False, limit=2, offset=1)
        assert list(df.run_id) == ["b", "c"] and total == 4
        assert list(page(state="running")[0].run_id) == ["d", "c"]  # d: no end event
        df, total = page(text="LLAMA", sort="run", descending=False)
        assert list(df.run_id) == ["a", "c"] and total == 2
        df, total = page(text="nothing")
        assert len(df) == 0 and total == 0
        with pytest.raises(ValueError, match="unknown sort"):
            page(sort="bogus")
        # indexing gives d a row from its raw tables: listed the same, now from run_reports
        assert reports.index_missing(con) == 1 and reports.due(con, 10) == ["d"]
        assert list(page(state="running")[0].run_id) == ["d", "c"]
    finally:
        store.close()


def test_metrics_export_the_runs_active_within_the_retention(tmp_path):
    now = time.time()
    path = tmp_path / "s.duckdb"
    store, _keeper, writer = _served(path)
    # an old run that ended two hours ago (data time), accounted and stored back then
    _push(writer, _lifetime("old", now - 7200), _steps("old", 0, list(range(8)), now - 7200))
    writer.stop()
    store.close()
    # a restarted collector: the old run is not live any more; a new one is
    store, keeper, writer = _served(path, retention_s=3600.0)
    try:
        _push(writer, _lifetime("new", now - 5, end=None), _steps("new", 0, [0, 1, 2], now - 5))
        get = make_registry(store, writer, keeper=keeper).get_sample_value
        assert get("goodlens_run_state", {"run": "new", "state": "running"}) == 1
        assert get("goodlens_run_state", {"run": "new", "state": "completed"}) == 0
        assert get("goodlens_run_steps_total", {"run": "new"}) == 3
        assert get("goodlens_run_state", {"run": "old", "state": "completed"}) is None
        assert get("goodlens_run_hang_timeout_seconds", {"run": "new"}) == 60.0  # the floor
        # the history stays readable: the old run's stored report
        assert store.stored_report("old")["buckets"]["productive"] == pytest.approx(8.0)
        # a registry with no collector behind it (a tool over a store) exports every run
        everything = make_registry(store).get_sample_value
        assert everything("goodlens_run_state", {"run": "old", "state": "completed"}) == 1
    finally:
        writer.stop()
        store.close()


def test_an_end_event_alone_makes_the_run_final_within_a_pass(tmp_path):
    store, _keeper, writer = _served(tmp_path / "s.duckdb")
    try:
        _push(writer, _lifetime("r", end=None), _steps("r", 0, list(range(8))))
        assert store.stored_reports(["r"])[0].final is False
        end = {"schema_version": 1, "run_id": "r", "events": {
            "source": "launcher", "seq": [1], "kind": ["attempt_end"], "time": [T0 + 11],
            "attempt": 0, "cause": ["completed"]}}
        writer.submit(validate_batch(end)).result(10)  # no sync: the next pass picks it up
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not store.stored_reports(["r"])[0].final:
            time.sleep(0.1)
        (row,) = store.stored_reports(["r"])
        assert row.final and row.state == "completed" and row.wall_clock_s == 11.0
    finally:
        writer.stop()
        store.close()


def test_rows_written_without_a_collector_list_from_the_raw_tables(tmp_path):
    """A stored row is not current once rows of its run await a pass (``end-run --db``
    writes without a collector): the list takes that run from its rows."""
    store = Store(tmp_path / "s.duckdb")
    try:
        store.write_group([validate_batch(_lifetime("r", end=None)),
                           validate_batch(_steps("r", 0, [0, 1, 2]))])
        store.summarize_dirty(changed=[])
        reports.save(store.cursor(), [_row("r", 0.5, "running", T0, 4.0, final=False)])
        assert list(store.runs_page()[0].state) == ["running"]
        assert list(store.runs_page()[0].goodput) == [0.5]
        end = {"schema_version": 1, "run_id": "r", "events": {
            "source": "launcher", "seq": [1], "kind": ["attempt_end"], "time": [T0 + 11],
            "attempt": 0, "cause": ["completed"]}}
        store.write_group([validate_batch(end)])
        listed = store.runs_page()[0]
        assert list(listed.state) == ["completed"] and math.isnan(listed.goodput.iloc[0])
    finally:
        store.close()


def test_reports_stored_under_an_earlier_accounting_revision_are_recomputed(tmp_path):
    """A store written under accounting revision 1 (the first start-up counted in
    ``restart``): its stored report said restart 1 s and no startup; the next collector
    must not serve it as current."""
    path = tmp_path / "s.duckdb"
    store, _keeper, writer = _served(path)
    _push(writer, _lifetime("r"), _steps("r", 0, list(range(8))),
          _steps("r", 1, list(range(8))))
    writer.stop()
    con = store.cursor()  # what the previous revision stored: the same goodlens version
    old = store.stored_report("r")
    old["buckets"]["restart"], old["buckets"]["startup"] = 1.0, None
    con.execute("UPDATE run_reports SET report = ? WHERE run_id = 'r'", [json.dumps(old)])
    con.execute("UPDATE meta SET value = ? WHERE key = 'reports_version'", [__version__])
    store.close()
    store, _keeper, writer = _served(path)
    try:
        writer.sync()
        buckets = store.stored_report("r")["buckets"]
        assert (buckets["startup"], buckets["restart"]) == (pytest.approx(1.0), 0.0)
    finally:
        writer.stop()
        store.close()
