"""The overview's per-step fault tolerance section (torchft runs), without a browser.

The figure builders are fed hand-written report sections and checked against hand
arithmetic; the overview of a recorded torchft run must carry its report's section
exactly (the same numbers ``/v1/report`` gives), and the page's callback must fill it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from goodlens.analysis.report import report_dict
from goodlens.dashboard import figures as fig
from goodlens.dashboard import pages
from goodlens.dashboard.app import create_app
from goodlens.dashboard.data import RunData
from goodlens.dashboard.ft import ft_section
from goodlens.model.batch import validate_batch
from goodlens.storage.store import Store
from tests.integration.test_dashboard import _by_id

T0 = 1_767_225_600.0


@pytest.fixture(scope="module")
def ft_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """The recorded torchft run (``tests/record/ft.py``) replayed into a store."""
    from tests.recorded import replay

    job = replay("torchft", tmp_path_factory.mktemp("ft"))
    store = Store(job.db, read_only=True)
    yield store
    store.close()


# ---------------------------------------------------------------------------- figures
def test_participation_is_a_step_plot_held_to_the_runs_end() -> None:
    ft = {"replica_groups": 3, "groups": [{"allocated_to": 150.0}],
          "participation": [{"step": 0, "time": 100.0, "groups": 3},
                            {"step": 5, "time": 110.0, "groups": 2},
                            {"step": 9, "time": 130.0, "groups": 3}]}
    f = fig.participation_figure(ft, end=160.0)
    part, full = f.data
    assert part.line.shape == "hv"  # a count holds until the next change point
    assert list(part.x) == list(fig._times([100.0, 110.0, 130.0, 160.0]))
    assert list(part.y) == [3, 2, 3, 3]
    assert list(part.text)[1] == "from step 5: 2 of 3 groups"
    assert (full.name, list(full.y)) == ("full world", [3, 3])
    assert list(full.x) == list(fig._times([100.0, 160.0]))
    # without the run's end: held to the last group's allocation
    assert list(fig.participation_figure(ft).data[0].x)[-1] == fig._times([150.0])[0]
    assert "no committed step" in fig.participation_figure(
        {"participation": []}).layout.annotations[0].text


def test_group_bars_stack_each_groups_gpu_time_by_state() -> None:
    # 8 GPUs a group; g0 100 + 20 s, g1 (a spare) 5 + 115 s: 960 GPU-s each, in minutes
    ft = {"gpus_per_group": 8, "groups": [
        {"group": "g0", "spare": False, "evicted": True, "attempts": 2,
         "seconds": {"progress": 100.0, "quorum": 0.0, "heal": 20.0}},
        {"group": "g1", "spare": True, "evicted": False, "attempts": 1,
         "seconds": {"progress": 5.0, "quorum": 0.0, "spare_idle": 115.0}}]}
    f = fig.group_seconds_figure(ft)
    bars = {t.name: list(t.x) for t in f.data}
    assert list(f.data[0].y) == ["g0 (evicted, 2 starts)", "g1 (spare)"]
    assert bars == {"progress": [800 / 60, 40 / 60], "heal": [160 / 60, 0.0],
                    "spare idle": [0.0, 920 / 60]}  # quorum: no GPU-time, no trace
    assert [sum(v[i] for v in bars.values()) for i in (0, 1)] == pytest.approx([16.0, 16.0])
    assert f.layout.xaxis.title.text == "GPU-minutes"
    heal = next(t for t in f.data if t.name == "heal")
    assert heal.text[0] == "g0 (evicted, 2 starts), heal: 2m 40s (16.7%)"
    assert "no replica group" in fig.group_seconds_figure({}).layout.annotations[0].text


def test_sample_bar_adds_up_to_the_full_world() -> None:
    ft = {"samples": {"full_world": 120.0, "committed": 80.0, "discarded": 8.0,
                      "missing_groups": 32.0, "goodput": 80 / 120}}
    f = fig.samples_figure(ft)
    assert [(t.name, t.x[0]) for t in f.data] == [
        ("committed", 80.0), ("discarded", 8.0), ("never trained (groups out)", 32.0)]
    assert "120" in f.layout.title.text
    assert "(26.7% of the full world)" in f.data[2].hovertemplate
    assert "no samples" in fig.samples_figure({"samples": {}}).layout.annotations[0].text


def test_timeline_draws_heals_discarded_steps_and_group_ends() -> None:
    attempts = pd.DataFrame({"attempt": [0], "start": [0.0], "end": [100.0],
                             "end_reason": ["completed"], "last_activity": [100.0]})
    events = pd.DataFrame({
        "time": [1.0, 2.0, 31.0, 33.0, 33.1, 80.0, 100.0], "attempt": [0] * 7,
        "kind": ["group_start", "group_start", "step_discarded", "group_end",
                 "group_start", "group_end", "group_end"],
        "cause": [None, None, None, "failed", None, "evicted", "completed"],
        "label": ["g0", "g1", "g0", "g1", "g1", "g1", "g0"],
        "step": [None, None, 12, 11, None, 40, 60]})
    ft = {"heals": [{"group": "g1", "start": 40.0, "end": 42.0, "seconds": 2.0, "step": 12,
                     "bytes": 1_000, "source": 0, "transport": "HTTPTransport",
                     "failed": False},
                    {"group": "g0", "start": 10.0, "end": 10.5, "seconds": 0.5, "step": 3,
                     "bytes": None, "source": 1, "transport": "pg", "failed": True}],
          "recoveries": [{"group": "g1", "attempt": 1, "last_step_end": 30.0,
                          "rejoined": 45.0, "out_s": 15.0}]}
    f = fig.timeline_figure(attempts, events, 100.0, ft=ft)
    rows = {t.name: t for t in f.data if t.name and not t.name.startswith("attempt")}
    marks = {n: len(t.x) for n, t in rows.items() if t.mode == "markers"}
    assert marks == {"group started": 3, "group failed": 1, "group evicted": 1,
                     "group ended": 1, "discarded step": 1}
    heal = rows["heal g1"]  # an interval: its start and end, then a gap
    assert list(heal.x) == [*fig._times([40.0, 42.0]), None]
    assert heal.text[0] == ("heal of g1 to step 12: 2.0s, 1,000 bytes from group 0 over "
                            "HTTPTransport")
    assert rows["heal g0"].text[0].endswith(", failed")
    assert list(rows["group out"].x) == [*fig._times([30.0, 45.0]), None]
    assert rows["group out"].text[0] == "g1 out of the quorum: 15.0s (restart 1)"
    # each row drawn adds one row's height; a run without them keeps the base height
    base = 120 + 28 * (1 + len(fig.EVENT_STYLE))
    assert f.layout.height == base + 28 * (5 + 3)
    assert fig.timeline_figure(attempts, events.iloc[:0], 100.0).layout.height == base


# ---------------------------------------------------------------------------- the page
def test_overview_of_a_torchft_run_carries_its_report_section(ft_store: Store) -> None:
    rep = report_dict(ft_store, "ft")
    ft = rep["fault_tolerance"]
    d = RunData(ft_store).overview("ft")
    assert d["ft"] == ft
    parts = pages.overview_parts(d)
    found = _by_id(pages.overview_skeleton(parts))
    for gid in ("ft-section", "ft-participation-graph", "ft-groups-graph", "ft-samples-graph"):
        assert gid in found
    s = ft["samples"]
    assert found["ft-samples-committed"].title == repr(float(s["committed"]))
    assert found["ft-samples-missing"].title == repr(float(s["missing_groups"]))
    assert found["ft-sample-goodput"].title == repr(float(s["goodput"]))
    assert found["ft-steps-discarded"].title == repr(float(ft["steps"]["discarded"]))
    assert found["ft-heals"].title == repr(float(sum(h["seconds"] for h in ft["heals"])))
    assert found["ft-recoveries"].title == repr(float(sum(r["out_s"] for r in ft["recoveries"])))
    # the headline's GPU-time goodput is the report's (the groups' view)
    assert found["headline-gpu-goodput"].title == f"{rep['gpu_time_goodput']:.6f}"
    groups = found["ft-groups-graph"].figure
    per_group = [sum(t.x[i] for t in groups.data) for i in range(len(ft["groups"]))]
    unit = {"GPU-seconds": 1.0, "GPU-minutes": 60.0, "GPU-hours": 3600.0}[
        groups.layout.xaxis.title.text]
    assert per_group == pytest.approx([ft["gpus_per_group"] * sum(g["seconds"].values()) / unit
                                       for g in ft["groups"]])
    steps = found["ft-participation-graph"].figure.data[0]
    assert list(steps.y[:-1]) == [p["groups"] for p in ft["participation"]]
    timeline = {t.name for t in parts["timeline-graph"].data}
    assert {f"heal {h['group']}" for h in ft["heals"]} <= timeline
    assert {"group started", "group evicted", "discarded step"} <= timeline
    assert ("group out" in timeline) == bool(ft["recoveries"])


def test_the_overview_callback_fills_the_section(ft_store: Store) -> None:
    """The overview's refresh callback (through Dash's HTTP endpoint) sends the section."""
    app = create_app(ft_store)
    key = next(k for k in app.callback_map if "ov-ft.children" in k)
    cb = app.callback_map[key]
    values = {"url.pathname": "/runs/ft", "tick.n_intervals": 0}
    inputs = [{**i, "value": values.get(f"{i['id']}.{i['property']}")} for i in cb["inputs"]]
    state = [{**i, "value": None} for i in cb["state"]]
    outputs = [{"id": o.split(".")[0], "property": o.split(".")[1]}
               for o in key.strip(".").split("...")]
    client = app.server.test_client()
    client.get("/")
    r = client.post("/_dash-update-component", json={
        "output": key, "outputs": outputs, "inputs": inputs, "state": state,
        "changedPropIds": ["url.pathname"]})
    assert r.status_code == 200
    section = r.get_json()["response"]["ov-ft"]["children"]
    assert section["props"]["id"] == "ft-section"


def test_other_runs_have_no_section(tmp_path: Path) -> None:
    assert ft_section(None) is None
    store = Store(tmp_path / "e.duckdb")
    try:
        store.write_group([validate_batch({
            "schema_version": 1, "run_id": "plain", "events": {
                "source": "t", "seq": [0], "kind": ["attempt_start"], "time": [T0],
                "attempt": 0}})])
        store.summarize_dirty()
        d = RunData(store).overview("plain")
        assert d["ft"] is None and pages.overview_parts(d)["ov-ft"] is None
    finally:
        store.close()
